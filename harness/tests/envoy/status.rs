//! Status for operators through the real filter: `/healthz`, `/readyz` and `/llmroute/status`, fed by the filter's
//! own polls of Envoy's admin `/clusters` and by Envoy's active health checks on the emulators' `/health`.

use std::time::{Duration, Instant};

use llmroute_harness::envoy::{wasm_module, Envoy, EnvoyOptions};
use llmroute_harness::fleet::Fleet;
use llmroute_harness::render::{bootstrap, RenderOptions};
use serde_json::{json, Value};

use crate::support::*;

/// Long enough for a health check interval or two, a poll and a loaded machine.
const DEADLINE: Duration = Duration::from_secs(20);

async fn get(c: &reqwest::Client, envoy: &Envoy, path: &str) -> (u16, Value) {
    let r = get_json(c, envoy.url(path), &[]).await;
    let text = &r.text;
    assert_eq!(r.header("content-type"), Some("application/json"), "{path}: {text}");
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert!(
        r.headers.get("x-emu-backend").is_none(),
        "{path} must be answered by the filter"
    );
    let body = serde_json::from_str(text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
    (r.status, body)
}

/// Polls `path` until `done` holds for its answer; returns that answer.
async fn poll_page(
    c: &reqwest::Client,
    envoy: &Envoy,
    path: &str,
    what: &str,
    done: impl Fn(u16, &Value) -> bool,
) -> (u16, Value) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (status, body) = get(c, envoy, path).await;
        if done(status, &body) {
            return (status, body);
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {DEADLINE:?}; last {path}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_ready(c: &reqwest::Client, envoy: &Envoy) {
    poll_page(c, envoy, "/readyz", "ready", |s, _| s == 200).await;
}

fn backend<'v>(status: &'v Value, name: &str) -> &'v Value {
    status["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .unwrap_or_else(|| panic!("no backend {name} in {status}"))
}

fn model_ready(status: &Value, name: &str) -> bool {
    let models = status["models"].as_array().unwrap();
    let m = models
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no alias {name} in {status}"));
    m["ready"].as_bool().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_is_200_and_readyz_turns_200_once_hosts_are_healthy() {
    let (_fleet, envoy) = one_fleet(150).await;
    let c = client();
    let (status, body) = get(&c, &envoy, "/healthz").await;
    assert_eq!((status, body), (200, json!({"alive": true})));
    let (_, body) = poll_page(&c, &envoy, "/readyz", "ready", |s, _| s == 200).await;
    assert_eq!(body, json!({"ready": true, "reason": null}));
    // A query string is ignored, and no authentication is asked for.
    assert_eq!(get(&c, &envoy, "/healthz?probe=1").await.0, 200);
    assert_eq!(get(&c, &envoy, "/readyz?probe=1").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_backends_and_aliases_without_addresses_or_upstream_models() {
    let a = Fleet::start("llama-a", 3).await.unwrap();
    let b = Fleet::start("vllm-b", 1).await.unwrap();
    let mut b_entry = b.backend_entry(150);
    b_entry["kind"] = json!("vllm");
    b_entry["lb"] = json!("least_request");
    b_entry.as_object_mut().unwrap().remove("balance_factor");
    let config = json!({
        "version": 1,
        "backends": [a.backend_entry(150), b_entry],
        "models": [
            {"name": ALIAS, "routes": [{"backend": "llama-a", "upstream_model": "hidden-upstream-qwen"}]},
            {"name": "big", "routes": [{"backend": "vllm-b", "upstream_model": "hidden-upstream-32b"}]},
        ],
    });
    let envoy = Envoy::start(config).await.unwrap();
    let c = client();
    wait_ready(&c, &envoy).await;
    let (status, body) = poll_page(&c, &envoy, "/llmroute/status", "all hosts healthy", |_, v| {
        v["backends"][0]["healthy_hosts"] == 3 && v["backends"][1]["healthy_hosts"] == 1
    })
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["object"], "llmroute.status");
    assert_eq!(body["ready"], true);
    assert!(body["source"].as_str().unwrap().contains("/clusters"));
    let age = body["snapshot"]["age_ms"].as_u64().unwrap();
    assert!(age < 5000, "snapshot age {age} ms");
    let la = backend(&body, "llama-a");
    assert_eq!(
        (
            la["kind"].as_str(),
            la["healthy_hosts"].as_u64(),
            la["total_hosts"].as_u64()
        ),
        (Some("llamacpp"), Some(3), Some(3))
    );
    assert_eq!(la["in_flight"], 0);
    let vb = backend(&body, "vllm-b");
    assert_eq!(
        (
            vb["kind"].as_str(),
            vb["healthy_hosts"].as_u64(),
            vb["total_hosts"].as_u64()
        ),
        (Some("vllm"), Some(1), Some(1))
    );
    assert_eq!(
        body["backends"].as_array().unwrap().len(),
        2,
        "the admin cluster is not a backend: {body}"
    );
    assert!(model_ready(&body, ALIAS) && model_ready(&body, "big"));

    let text = body.to_string();
    let mut secrets = vec![
        "127.0.0.1".to_string(),
        "hidden-upstream".to_string(),
        envoy.admin.port().to_string(),
    ];
    for e in a.engines.iter().chain(&b.engines) {
        secrets.push(e.addr().port().to_string());
    }
    for s in &secrets {
        assert!(!text.contains(s.as_str()), "{s} leaked in {text}");
    }

    // Requests in flight show up on the next poll.
    let slow = chat(None, "take your time");
    let mut calls = Vec::new();
    for i in 0..4 {
        let (c, envoy_url, body) = (c.clone(), envoy.url("/v1/chat/completions"), slow.to_string());
        calls.push(tokio::spawn(async move {
            c.post(envoy_url)
                .header("content-type", "application/json")
                .header("x-emu-delay-ms", "4000")
                .header("x-session-id", format!("s{i}"))
                .body(body)
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
    }
    let (_, busy) = poll_page(&c, &envoy, "/llmroute/status", "4 requests in flight", |_, v| {
        v["backends"][0]["in_flight"] == 4
    })
    .await;
    assert_eq!(backend(&busy, "vllm-b")["in_flight"], 0);
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_when_every_host_fails_its_health_check_and_recovers() {
    let (fleet, envoy) = one_fleet(150).await;
    let c = client();
    wait_ready(&c, &envoy).await;
    for e in &fleet.engines {
        e.set_health_status(503);
    }
    let (_, body) = poll_page(&c, &envoy, "/readyz", "503 once all hosts fail", |s, _| s == 503).await;
    assert_eq!(body["ready"], false);
    assert!(body["reason"].as_str().unwrap().contains(ALIAS), "{body}");
    let (status, st) = get(&c, &envoy, "/llmroute/status").await;
    assert_eq!(status, 200, "the status page itself always answers 200");
    assert_eq!(st["ready"], false);
    assert!(!model_ready(&st, ALIAS));
    let b = backend(&st, "llama-a");
    assert_eq!(
        (b["healthy_hosts"].as_u64(), b["total_hosts"].as_u64()),
        (Some(0), Some(3))
    );
    assert_eq!(get(&c, &envoy, "/healthz").await.0, 200, "alive while not ready");

    // One host back is enough for the alias.
    fleet.engines[1].set_health_status(200);
    wait_ready(&c, &envoy).await;
    let (_, st) = get(&c, &envoy, "/llmroute/status").await;
    assert!(model_ready(&st, ALIAS));
    assert_eq!(backend(&st, "llama-a")["healthy_hosts"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_pages_answer_get_only() {
    let (fleet, envoy) = one_fleet(150).await;
    let c = client();
    for path in ["/llmroute/status", "/healthz", "/readyz"] {
        for method in [
            reqwest::Method::POST,
            reqwest::Method::PUT,
            reqwest::Method::DELETE,
            reqwest::Method::HEAD,
        ] {
            let resp = c
                .request(method.clone(), envoy.url(path))
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 405, "{method} {path}");
            assert_eq!(resp.headers().get("allow").and_then(|v| v.to_str().ok()), Some("GET"));
        }
        let resp = c.get(envoy.url(&format!("{path}/x"))).send().await.unwrap();
        assert_eq!(resp.status(), 404, "{path}/x");
    }
    assert_eq!(fleet.chat_counts(), vec![0, 0, 0]);
    assert!(fleet
        .engines
        .iter()
        .all(|e| e.requests().iter().all(|r| r.path == "/health" || r.path == "/props")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_polls_the_admin_api_about_once_a_second_whatever_its_workers() {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let opts = EnvoyOptions {
        concurrency: 4,
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start_with(
        llmroute_harness::fleet::single_backend_config(&fleet, ALIAS, UPSTREAM, 150),
        opts,
    )
    .await
    .unwrap();
    let c = client();
    wait_ready(&c, &envoy).await;
    // Admin requests counted over a fixed window: the window is the measurement, not a wait for a condition.
    let admin_requests = || envoy.stat("http.admin.downstream_rq_total");
    let before = admin_requests().await.unwrap();
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = admin_requests().await.unwrap();
    let secs = start.elapsed().as_secs_f64();
    let polls = after - before - 1; // less this test's own first stat request
    eprintln!("{polls} admin polls in {secs:.1} s with 4 workers");
    assert!(
        (secs * 0.5) as u64 <= polls && polls as f64 <= secs + 2.0,
        "{polls} admin polls in {secs:.1} s with 4 workers"
    );
    // Every worker answers from the same recent snapshot.
    for _ in 0..20 {
        let (_, st) = get(&c, &envoy, "/llmroute/status").await;
        let age = st["snapshot"]["age_ms"].as_u64().unwrap();
        assert!(age < 3000, "snapshot age {age} ms: {st}");
    }
}

/// `admin:` in llmroute.yaml names a port where nothing listens, while the Envoy's own admin interface is elsewhere
/// (as when the rendered pieces go into an Envoy whose admin listens on another port). `/readyz` stays 503 and says
/// which address fails and why, `/llmroute/status` shows it, and Envoy's log names it in one line, not one per poll
/// or worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_admin_address_is_named_by_readyz_the_status_page_and_one_log_line() {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    // Bound but never listening: held for the test, so every connection to it is refused.
    let closed = tokio::net::TcpSocket::new_v4().unwrap();
    closed.bind(([127, 0, 0, 1], 0).into()).unwrap();
    let wrong = closed.local_addr().unwrap().to_string();
    let mut doc = llmroute_harness::fleet::single_backend_config(&fleet, ALIAS, UPSTREAM, 150);
    doc["admin"] = json!(wrong);
    let wasm = wasm_module().display().to_string();
    let envoy = Envoy::start_bootstrap(
        |listen, admin| {
            let mut doc = doc.clone();
            doc["listen"] = json!(format!("127.0.0.1:{listen}"));
            let text = doc.to_string();
            let cfg = llmroute_core::load_document(&text).unwrap();
            let mut v = bootstrap(&cfg, &text, &RenderOptions::new(wasm.clone())).unwrap();
            v["admin"]["address"]["socket_address"]["port_value"] = json!(admin);
            v.to_string()
        },
        EnvoyOptions::default(),
    )
    .await
    .unwrap();
    let c = client();

    let (_, st) = poll_page(&c, &envoy, "/llmroute/status", "the admin named", |_, v| {
        v["admin"]["failing_for_ms"].as_u64().is_some_and(|ms| ms >= 3000)
    })
    .await;
    assert_eq!(st["admin"]["address"], wrong.as_str(), "{st}");
    let error = st["admin"]["error"].as_str().unwrap();
    assert!(
        error.contains("upstream connect error"),
        "Envoy's own reply is quoted: {st}"
    );
    assert_eq!(st["ready"], false);
    assert!(st["reason"].as_str().unwrap().contains(&wrong), "{st}");

    let (status, readyz) = get(&c, &envoy, "/readyz").await;
    let reason = readyz["reason"].as_str().unwrap_or_default();
    assert_eq!(status, 503, "{readyz}");
    assert!(
        reason.contains(&format!("admin API at {wrong} (`admin:` in llmroute.yaml)")) && reason.contains(error),
        "{readyz}"
    );
    assert_eq!(get(&c, &envoy, "/healthz").await.0, 200);

    // Three polls or more have failed by now, on any of the three root contexts: one line names the address.
    let log = envoy.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&wrong)).collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("polls of Envoy's admin API at") && lines[0].contains("must be the address"),
        "{}",
        lines[0]
    );
    assert!(!log.contains("work again"), "{log}");
}
