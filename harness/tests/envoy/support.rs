//! Shared set-up for the real-Envoy tests: fleets, clients, request helpers.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use llmroute_harness::emulator::RecordedRequest;
use llmroute_harness::envoy::{Envoy, EnvoyOptions};
use llmroute_harness::fleet::{single_backend_config, Fleet};
use llmroute_harness::render::{bootstrap_yaml, ecds, RenderOptions};
use serde_json::{json, Value};

pub const ALIAS: &str = "local-chat";
pub const UPSTREAM: &str = "qwen3-0.6b";

/// The exact body a client sends to [`ALIAS`] in the rewrite tests: unusual spacing, unknown fields and `model` in
/// the middle.
pub const RAW_BODY: &str = "{ \"temperature\" :0.25,\n  \"model\":   \"local-chat\" ,\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},{\"role\":\"user\",\"content\":\"Hi \\u00e9\"}],\"x_custom\":{\"a\":[1,2,{\"b\":null}]}  }";

/// What the `vllm-b` engine got for [`RAW_BODY`]: one request, the same bytes with only the model's value made
/// [`UPSTREAM`], its new length, none of the client's credentials, and the cluster the filter chose.
pub fn assert_only_model_rewritten(got: &[RecordedRequest]) {
    assert_eq!(got.len(), 1);
    let expected = RAW_BODY.replacen("\"local-chat\"", "\"qwen3-0.6b\"", 1);
    assert_eq!(
        std::str::from_utf8(&got[0].body).unwrap(),
        expected,
        "only the model value may change"
    );
    assert_eq!(
        got[0].header("content-length"),
        Some(expected.len().to_string().as_str())
    );
    assert_eq!(
        got[0].header("authorization"),
        None,
        "client credentials must not reach the engine"
    );
    assert_eq!(got[0].header("x-llmroute-cluster"), Some("vllm-b"));
}

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

/// A response, read whole: status, headers, the body as text and as JSON (`Null` when it is not JSON).
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Reply {
    pub async fn of(resp: reqwest::Response) -> Reply {
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap_or_default();
        Reply {
            status,
            headers,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    /// A response header as text; `None` when absent or not visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Sends `req` with `headers` added and reads the whole answer. Panics when no answer comes at all.
async fn reply(mut req: reqwest::RequestBuilder, headers: &[(&str, &str)]) -> Reply {
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    Reply::of(req.send().await.unwrap()).await
}

/// Posts `body` to `url` as `content-type: application/json`, with `headers`.
pub async fn post_json(
    c: &reqwest::Client,
    url: impl reqwest::IntoUrl,
    body: impl Into<reqwest::Body>,
    headers: &[(&str, &str)],
) -> Reply {
    let req = c.post(url).header("content-type", "application/json").body(body);
    reply(req, headers).await
}

/// Gets `url` with `headers`.
pub async fn get_json(c: &reqwest::Client, url: impl reqwest::IntoUrl, headers: &[(&str, &str)]) -> Reply {
    reply(c.get(url), headers).await
}

/// Posts a chat body, returns (status, answering backend, body).
pub async fn post(c: &reqwest::Client, envoy: &Envoy, body: &Value, headers: &[(&str, &str)]) -> (u16, String, Value) {
    let r = post_json(c, envoy.url("/v1/chat/completions"), body.to_string(), headers).await;
    let backend = r.header("x-emu-backend").unwrap_or("").to_string();
    (r.status, backend, r.body)
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

/// Waits until `n` hosts of `cluster` pass their health checks. Envoy's first round can time out while the
/// wasm module compiles at start-up; the next round, one interval later, passes.
pub async fn all_healthy(envoy: &Envoy, cluster: &str, n: usize) {
    let ok = wait_for(Duration::from_secs(10), || async {
        let h = envoy.host_health(cluster).await;
        h.len() == n && h.values().all(|f| f == "healthy")
    })
    .await;
    assert!(
        ok.is_some(),
        "hosts never became healthy: {:?}",
        envoy.host_health(cluster).await
    );
}

/// The filter's status page, `/llmroute/status`; `None` while it cannot be read.
pub async fn status_page(envoy: &Envoy) -> Option<Value> {
    let r = client().get(envoy.url("/llmroute/status")).send().await.ok()?;
    r.json::<Value>().await.ok()
}

/// Writes the discovery response to `path` the way an operator should: a temporary file, then a rename.
pub fn push(path: &Path, response: &Value) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_yaml_ng::to_string(response).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// One ECDS counter, whatever prefix Envoy gives it: the first `/stats` line ending in `.llmroute.<name>`.
pub async fn ecds_stat(envoy: &Envoy, name: &str) -> Option<u64> {
    let text = reqwest::get(envoy.admin_url("/stats?filter=extension_config_discovery"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let suffix = format!(".{}.{name}: ", llmroute_core::envoy_contract::ROOT_ID);
    text.lines()
        .find_map(|l| l.split_once(&suffix).map(|(_, v)| v))
        .and_then(|v| v.trim().parse().ok())
}

/// The `model` of the last chat request `engine` got; the engine must have got one.
pub fn last_model(engine: &llmroute_harness::emulator::Emulator) -> String {
    let reqs = engine.chat_requests();
    let body: Value = serde_json::from_slice(&reqs.last().expect("the engine got a request").body).unwrap();
    body["model"].as_str().unwrap_or_default().to_string()
}

/// The text of the admin page `path` (e.g. `/stats?filter=...`).
pub async fn admin_text(envoy: &Envoy, path: &str) -> String {
    reqwest::get(envoy.admin_url(path)).await.unwrap().text().await.unwrap()
}

/// Starts Envoy with the filter delivered through ECDS from `ecds_path`, rendered with `opts`: `doc(admin_port)` is
/// the first llmroute document (its `listen` is filled in here), pushed before Envoy starts. Returns Envoy and its
/// admin port, which every later push must name again.
pub async fn start_ecds(ecds_path: &Path, opts: &RenderOptions, doc: impl Fn(u16) -> Value) -> (Envoy, u16) {
    let admin_port = std::sync::Mutex::new(0u16);
    let envoy = Envoy::start_bootstrap(
        |listen, admin| {
            let mut first = doc(admin);
            first["listen"] = Value::from(format!("127.0.0.1:{listen}"));
            let text = first.to_string();
            push(ecds_path, &ecds::discovery_response(&text, opts).unwrap());
            *admin_port.lock().unwrap() = admin;
            let cfg = llmroute_core::load_document(&text).unwrap();
            bootstrap_yaml(&cfg, &text, opts).unwrap()
        },
        EnvoyOptions::default(),
    )
    .await
    .unwrap();
    let admin = *admin_port.lock().unwrap();
    (envoy, admin)
}
