//! Shared set-up for the real-Envoy tests: fleets, clients, request helpers.

use std::collections::HashMap;
use std::time::Duration;

use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::{single_backend_config, Fleet};
use serde_json::{json, Value};

pub const ALIAS: &str = "local-chat";
pub const UPSTREAM: &str = "qwen3-0.6b";

/// One 3-engine llama.cpp fleet behind Envoy with one alias.
pub async fn one_fleet(balance_factor: u32) -> (Fleet, Envoy) {
    let fleet = Fleet::start("llama-a", 3).await.unwrap();
    let envoy = Envoy::start(single_backend_config(&fleet, ALIAS, UPSTREAM, balance_factor))
        .await
        .unwrap();
    (fleet, envoy)
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

pub fn h2_client() -> reqwest::Client {
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

pub fn chat(system: Option<&str>, user: &str) -> Value {
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(json!({"role": "system", "content": s}));
    }
    messages.push(json!({"role": "user", "content": user}));
    json!({"model": ALIAS, "messages": messages})
}

/// Posts a chat body, returns (status, answering backend, body).
pub async fn post(c: &reqwest::Client, envoy: &Envoy, body: &Value, headers: &[(&str, &str)]) -> (u16, String, Value) {
    let mut req = c
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let backend = resp
        .headers()
        .get("x-emu-backend")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    (status, backend, body)
}

pub fn tally(backends: impl IntoIterator<Item = String>) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for b in backends {
        *m.entry(b).or_insert(0) += 1;
    }
    m
}

/// Polls `check` every 20 ms until it holds or `limit` passes; returns how long it took, or `None`.
pub async fn wait_for<F, Fut>(limit: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The `/stats` name of a filter metric with labels (`wasmcustom.<metric>;<label>=<value>...`).
pub fn stat_name(metric: &str, labels: &[(&str, &str)]) -> String {
    format!(
        "wasmcustom.{}",
        llmroute_core::envoy_contract::metrics::labelled(metric, labels)
    )
}
