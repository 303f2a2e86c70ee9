//! The fair queue (`fairness`) through the real filter in a real Envoy (`--concurrency 2`), in front of one engine
//! that takes one request at a time (`max_inflight: 1`):
//! - a flooding tenant's backlog waits behind a quiet tenant's requests, which arrived later;
//! - `x-max-wait-ms` cuts a wait short with a 429 `queue_timeout` and `Retry-After`, in the OpenAI and the
//!   Anthropic envelopes, and `0` refuses at once; a full queue refuses at once with `queue_full`; none of them
//!   reaches the engine, and the wait is in the access log;
//! - a client that leaves while it waits is removed (its request never reaches the engine), the next waiter goes,
//!   and the queue ends empty with nothing in flight.

use std::time::{Duration, Instant};

use llmroute_core::envoy_contract::metrics::{QUEUE_ABANDONED, QUEUE_DEPTH, QUEUE_REFUSALS, QUEUE_TIMEOUTS};
use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::*;

const TENANT: &str = "x-tenant-id";

/// One engine behind `max_inflight: 1`, tenants by `x-tenant-id`, and the access log in `dir`.
async fn queued_fleet(fairness: Value, dir: &std::path::Path) -> (Fleet, Envoy) {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let mut backend = fleet.backend_entry(150);
    backend["max_inflight"] = json!(1);
    let mut fairness = fairness;
    fairness["by"] = json!({ "header": TENANT });
    let cfg = json!({
        "version": 1,
        "backends": [backend],
        "models": [{ "name": ALIAS, "routes": [{ "backend": fleet.backend, "upstream_model": UPSTREAM }] }],
        "fairness": fairness,
        "access_log": { "path": dir.join("access.json").display().to_string() },
    });
    let envoy = Envoy::start(cfg).await.unwrap();
    (fleet, envoy)
}

/// [`queued_fleet`], with the engine's one slot taken by a chat of `tenant` saying `text`, held `hold_ms`.
async fn holding(
    fairness: Value,
    tenant: &str,
    text: &str,
    hold_ms: u64,
) -> (tempfile::TempDir, Fleet, Envoy, tokio::task::JoinHandle<(u16, Value)>) {
    let dir = tempfile::tempdir().unwrap();
    let (fleet, envoy) = queued_fleet(fairness, dir.path()).await;
    let holder = spawn_chat(&envoy, tenant, text, hold_ms);
    let held = wait_for(Duration::from_secs(5), || async { fleet.engines[0].inflight() == 1 }).await;
    assert!(
        held.is_some(),
        "the engine never got the first request\n{}",
        envoy.log()
    );
    (dir, fleet, envoy, holder)
}

/// The backend's queue as the status page shows it.
async fn queue(envoy: &Envoy) -> Value {
    let r = get_json(&client(), envoy.url("/llmroute/status"), &[]).await;
    r.body["backends"][0]["queue"].clone()
}

async fn wait_queue(envoy: &Envoy, waiting: u64) {
    let ok = wait_for(Duration::from_secs(10), || async {
        queue(envoy).await["waiting"] == waiting
    })
    .await;
    assert!(
        ok.is_some(),
        "not {waiting} waiting: {}\n{}",
        queue(envoy).await,
        envoy.log()
    );
}

/// Sends a chat of `tenant` saying `text` on its own connection (so the workers share the load), in the
/// background; the engine holds it `hold_ms`.
fn spawn_chat(envoy: &Envoy, tenant: &str, text: &str, hold_ms: u64) -> tokio::task::JoinHandle<(u16, Value)> {
    let url = envoy.url("/v1/chat/completions");
    let (tenant, body) = (tenant.to_string(), chat(None, text).to_string());
    tokio::spawn(async move {
        let c = client();
        let hold = hold_ms.to_string();
        let headers = [(TENANT, tenant.as_str()), ("x-emu-delay-ms", hold.as_str())];
        let r = post_json(&c, url, body, &headers).await;
        (r.status, r.body)
    })
}

/// The user text of each chat the engine received, in order.
fn served(fleet: &Fleet) -> Vec<String> {
    fleet.engines[0]
        .chat_requests()
        .iter()
        .map(|r| {
            let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
            v["messages"][0]["content"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

/// The access log's lines so far (`access.json` in `dir`).
fn access_log(dir: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("access.json"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

fn stat(metric: &str, labels: &[(&str, &str)]) -> String {
    stat_name(metric, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_tenant_is_served_ahead_of_a_floods_backlog() {
    let (dir, fleet, envoy, holder) = holding(json!({ "max_wait_ms": 20000 }), "flood", "flood-0", 400).await;
    let mut floods = Vec::new();
    for i in 1..=6 {
        floods.push(spawn_chat(&envoy, "flood", &format!("flood-{i}"), 100));
        wait_queue(&envoy, i).await;
    }
    let mut quiet = Vec::new();
    for i in 0..2 {
        quiet.push(spawn_chat(&envoy, "quiet", &format!("quiet-{i}"), 100));
        wait_queue(&envoy, 7 + i).await;
    }
    assert_eq!(holder.await.unwrap().0, 200);
    for t in floods.into_iter().chain(quiet) {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, 200, "{body}\n{}", envoy.log());
    }
    let order = served(&fleet);
    assert_eq!(order.len(), 9, "{order:?}");
    assert_eq!(order[0], "flood-0");
    // The flood queued six before the quiet tenant queued its first: first come, first served would serve the
    // quiet ones last. The quiet tenant starts level with the flood, which is then charged for what it was served.
    let at = |text: &str| order.iter().position(|t| t == text).unwrap();
    assert!(at("quiet-0") <= 2 && at("quiet-1") <= 4, "served in {order:?}");
    assert!(
        max_engine_inflight_is_one(&fleet),
        "the queue kept one request in flight"
    );
    let q = queue(&envoy).await;
    assert_eq!(
        (q["waiting"].as_u64(), q["in_flight"].as_u64()),
        (Some(0), Some(0)),
        "{q}"
    );
    assert_eq!(envoy.stat(&stat(QUEUE_DEPTH, &[("backend", "llama-a")])).await, Some(0));
    // The wait of each queued request is in the access log.
    let waits = || {
        access_log(dir.path())
            .iter()
            .filter_map(|v| v["llmroute.queue_wait_ms"].as_str().and_then(|w| w.parse::<u64>().ok()))
            .collect::<Vec<_>>()
    };
    let logged = wait_for(Duration::from_secs(15), || async { waits().len() >= 8 }).await;
    assert!(logged.is_some(), "waits in the access log: {:?}", waits());
    assert!(waits().iter().all(|w| *w > 0), "{:?}", waits());
}

fn max_engine_inflight_is_one(fleet: &Fleet) -> bool {
    fleet.engines[0].max_inflight() == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_wait_and_a_full_queue_get_a_429_in_the_routes_envelope() {
    let (dir, fleet, envoy, holder) = holding(json!({ "max_wait_ms": 20000, "max_queue": 1 }), "a", "hold", 3000).await;
    let c = client();

    // The client's own wait, shorter than max_wait_ms: a 429 when it runs out, in the OpenAI envelope.
    let start = Instant::now();
    let body = chat(None, "short").to_string();
    let r = post_json(
        &c,
        envoy.url("/v1/chat/completions"),
        body,
        &[(TENANT, "b"), ("x-max-wait-ms", "300")],
    )
    .await;
    let waited = start.elapsed();
    assert_eq!(r.status, 429, "{}", r.text);
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("x-llmroute-error"), Some("queue_timeout"));
    assert_eq!(r.body["error"]["code"], "queue_timeout", "{}", r.text);
    assert_eq!(r.body["request_id"].as_str(), r.header("x-request-id"));

    // The same on /v1/messages, in the Anthropic envelope.
    let msg = json!({"model": ALIAS, "max_tokens": 16, "messages": [{"role": "user", "content": "short"}]});
    let headers = [
        (TENANT, "c"),
        ("x-max-wait-ms", "200"),
        ("anthropic-version", "2023-06-01"),
    ];
    let r = post_json(&c, envoy.url("/v1/messages"), msg.to_string(), &headers).await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(
        (r.body["type"].as_str(), r.body["error"]["type"].as_str()),
        (Some("error"), Some("rate_limit_error")),
        "{}",
        r.text
    );
    assert_eq!(r.header("request-id"), r.header("x-request-id"));

    // Not willing to wait at all: refused at once.
    let start = Instant::now();
    let body = chat(None, "now").to_string();
    let r = post_json(
        &c,
        envoy.url("/v1/chat/completions"),
        body,
        &[(TENANT, "d"), ("x-max-wait-ms", "0")],
    )
    .await;
    assert_eq!(
        (r.status, r.header("x-llmroute-error")),
        (429, Some("queue_timeout")),
        "{}",
        r.text
    );
    assert!(start.elapsed() < Duration::from_secs(1));

    // One waiter fills the queue (max_queue 1): the next is refused at once.
    let waiter = spawn_chat(&envoy, "e", "waiter", 0);
    wait_queue(&envoy, 1).await;
    let start = Instant::now();
    let body = chat(None, "full").to_string();
    let r = post_json(&c, envoy.url("/v1/chat/completions"), body, &[(TENANT, "f")]).await;
    assert_eq!(
        (r.status, r.header("x-llmroute-error")),
        (429, Some("queue_full")),
        "{}",
        r.text
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(start.elapsed() < Duration::from_secs(1));

    assert_eq!(holder.await.unwrap().0, 200);
    assert_eq!(waiter.await.unwrap().0, 200, "the waiter went when the slot freed");
    assert_eq!(
        served(&fleet),
        ["hold", "waiter"],
        "no refused request reached the engine"
    );
    let backend = [("backend", "llama-a")];
    assert_eq!(envoy.stat(&stat(QUEUE_TIMEOUTS, &backend)).await, Some(2));
    let refusals = |reason: &'static str| stat(QUEUE_REFUSALS, &[("backend", "llama-a"), ("reason", reason)]);
    assert_eq!(envoy.stat(&refusals("no_wait")).await, Some(1));
    assert_eq!(envoy.stat(&refusals("queue_full")).await, Some(1));
    // The timed-out request's line has its wait and its error code.
    let line = || {
        access_log(dir.path())
            .into_iter()
            .find(|v| v["llmroute.error"] == "queue_timeout" && v["llmroute.queue_wait_ms"].is_string())
    };
    assert!(wait_for(Duration::from_secs(15), || async { line().is_some() })
        .await
        .is_some());
    let wait: u64 = line().unwrap()["llmroute.queue_wait_ms"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(wait >= 200, "{:?}", line());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_queued_is_removed_and_the_next_waiter_goes() {
    let (_dir, fleet, envoy, holder) = holding(json!({ "max_wait_ms": 20000 }), "a", "hold", 1500).await;
    // This client gives up after 300 ms, while it waits.
    let leaver = {
        let url = envoy.url("/v1/chat/completions");
        tokio::spawn(async move {
            let c = reqwest::Client::builder()
                .timeout(Duration::from_millis(300))
                .build()
                .unwrap();
            c.post(url)
                .header("content-type", "application/json")
                .header(TENANT, "b")
                .body(chat(None, "leaver").to_string())
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    wait_queue(&envoy, 1).await;
    let next = spawn_chat(&envoy, "c", "next", 0);
    wait_queue(&envoy, 2).await;
    assert!(leaver.await.unwrap().is_err(), "the client timed out");
    wait_queue(&envoy, 1).await;
    assert!(wait_for(Duration::from_secs(5), || async {
        envoy.stat(&stat(QUEUE_ABANDONED, &[("backend", "llama-a")])).await == Some(1)
    })
    .await
    .is_some());
    assert_eq!(holder.await.unwrap().0, 200);
    assert_eq!(next.await.unwrap().0, 200);
    assert_eq!(served(&fleet), ["hold", "next"], "the leaver never reached the engine");
    let q = queue(&envoy).await;
    assert_eq!(
        (q["waiting"].as_u64(), q["in_flight"].as_u64()),
        (Some(0), Some(0)),
        "{q}"
    );
}
