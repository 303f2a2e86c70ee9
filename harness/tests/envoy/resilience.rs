//! Resilience through Envoy's own machinery, as rendered from `llmroute.yaml`: health checks, 5xx ejection,
//! retries before the first byte (never after), circuit breakers with `Retry-After`, context-length placement,
//! and failover across an alias's priority routes with per-backend model names.

use std::time::Duration;

use futures_util::StreamExt;
use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::*;

/// A 3-engine llama.cpp fleet with fast health checks and quick ejection, plus `extra` merged into the backend.
async fn resilient_fleet(extra: Value) -> (Fleet, Envoy) {
    let fleet = Fleet::start("llama-a", 3).await.unwrap();
    let mut backend = fleet.backend_entry(150);
    backend["health"] = json!({"interval_ms": 300, "timeout_ms": 250, "unhealthy": 2, "healthy": 1});
    backend["outlier"] = json!({"consecutive_5xx": 3, "base_ejection_ms": 1000, "max_ejection_percent": 50});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        backend[k] = v;
    }
    let config = json!({
        "version": 1,
        "backends": [backend],
        "models": [{"name": ALIAS, "routes": [{"backend": "llama-a", "upstream_model": UPSTREAM}]}],
        "retries": {"attempts": 2},
    });
    let envoy = Envoy::start(config).await.unwrap();
    all_healthy(&envoy, "llama-a", 3).await;
    (fleet, envoy)
}

fn host(fleet: &Fleet, i: usize) -> String {
    fleet.engines[i].addr().to_string()
}

async fn flags(envoy: &Envoy, fleet: &Fleet, i: usize) -> String {
    envoy
        .host_health("llama-a")
        .await
        .get(&host(fleet, i))
        .cloned()
        .unwrap_or_default()
}

/// Index of the engine that answers a session key.
async fn owner_of(envoy: &Envoy, fleet: &Fleet, session: &str) -> usize {
    let (status, backend, _) = post(&client(), envoy, &chat(None, "x"), &[("x-session-id", session)]).await;
    assert_eq!(status, 200);
    fleet.engines.iter().position(|e| e.name() == backend).unwrap()
}

/// Sends 30 requests with distinct keys; returns how many each engine answered.
async fn spread(envoy: &Envoy, fleet: &Fleet) -> Vec<usize> {
    fleet.reset();
    let c = client();
    for i in 0..30 {
        let (status, _, _) = post(&c, envoy, &chat(Some(&format!("tenant {i}")), "hi"), &[]).await;
        assert_eq!(status, 200);
    }
    fleet.inference_counts()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_health_check_takes_a_host_out_within_two_intervals_and_back() {
    let (fleet, envoy) = resilient_fleet(json!({})).await;
    assert!(wait_for(Duration::from_secs(5), || async {
        flags(&envoy, &fleet, 1).await == "healthy"
    })
    .await
    .is_some());
    fleet.engines[1].set_health_status(503);
    let took = wait_for(Duration::from_secs(5), || async {
        flags(&envoy, &fleet, 1).await.contains("failed_active_hc")
    })
    .await
    .expect("the host never left rotation");
    // Two failed checks at a 300 ms interval, plus scheduling slack on a busy machine.
    assert!(took <= Duration::from_millis(1000), "left rotation after {took:?}");
    assert_eq!(spread(&envoy, &fleet).await[1], 0, "an unhealthy host got traffic");
    fleet.engines[1].set_health_status(200);
    wait_for(Duration::from_secs(5), || async {
        flags(&envoy, &fleet, 1).await == "healthy"
    })
    .await
    .expect("the host never came back");
    assert!(spread(&envoy, &fleet).await[1] > 0, "the recovered host got no traffic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llamacpp_server_still_loading_gets_no_traffic() {
    let fleet = Fleet::start("llama-a", 3).await.unwrap();
    fleet.engines[0].set_health_status(503); // llama-server answers 503 while its model loads
    let mut backend = fleet.backend_entry(150);
    backend["health"] = json!({"interval_ms": 300, "timeout_ms": 250});
    let config = json!({
        "version": 1,
        "backends": [backend],
        "models": [{"name": ALIAS, "routes": [{"backend": "llama-a"}]}],
    });
    let envoy = Envoy::start(config).await.unwrap();
    let ready = wait_for(Duration::from_secs(10), || async {
        let h = envoy.host_health("llama-a").await;
        h.get(&host(&fleet, 1)).is_some_and(|f| f == "healthy")
            && h.get(&host(&fleet, 2)).is_some_and(|f| f == "healthy")
    })
    .await;
    assert!(ready.is_some(), "the loaded servers never became healthy");
    assert_ne!(
        flags(&envoy, &fleet, 0).await,
        "healthy",
        "a loading server must not pass its health check"
    );
    let counts = spread(&envoy, &fleet).await;
    assert_eq!(counts[0], 0, "a loading server got traffic: {counts:?}");
    fleet.engines[0].set_health_status(200);
    wait_for(Duration::from_secs(5), || async {
        flags(&envoy, &fleet, 0).await == "healthy"
    })
    .await
    .expect("the loaded server never joined");
    assert!(spread(&envoy, &fleet).await[0] > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_consecutive_5xx_eject_a_host_of_three_and_it_returns_after_the_ejection_time() {
    let (fleet, envoy) = resilient_fleet(json!({})).await;
    let c = client();
    let owner = owner_of(&envoy, &fleet, "pinned").await;
    fleet.engines[owner].set_fault_status(Some(500));
    let pinned = [("x-session-id", "pinned")];
    for _ in 0..2 {
        let (status, _, _) = post(&c, &envoy, &chat(None, "x"), &pinned).await;
        assert_eq!(status, 500, "a 500 is relayed as is, not retried");
    }
    assert_eq!(flags(&envoy, &fleet, owner).await, "healthy", "two 5xx must not eject");
    let (status, _, _) = post(&c, &envoy, &chat(None, "x"), &pinned).await;
    assert_eq!(status, 500);
    wait_for(Duration::from_secs(2), || async {
        flags(&envoy, &fleet, owner).await.contains("failed_outlier_check")
    })
    .await
    .expect("three consecutive 5xx did not eject the host");
    // While ejected, the pinned key is served elsewhere.
    let (status, backend, _) = post(&c, &envoy, &chat(None, "x"), &pinned).await;
    assert_eq!(status, 200);
    assert_ne!(backend, fleet.engines[owner].name());
    // After the ejection time the host is re-admitted and serves its key again.
    fleet.engines[owner].set_fault_status(None);
    wait_for(Duration::from_secs(5), || async {
        flags(&envoy, &fleet, owner).await == "healthy"
    })
    .await
    .expect("the host was never re-admitted");
    let (status, backend, _) = post(&c, &envoy, &chat(None, "x"), &pinned).await;
    assert_eq!((status, backend.as_str()), (200, fleet.engines[owner].name()));
}

/// Envoy's consecutive-5xx counter is reset by any non-5xx answer, 4xx included (its outlier detector counts
/// every response code). This test pins down that behaviour, which the README documents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_between_5xx_resets_envoys_streak() {
    let (fleet, envoy) = resilient_fleet(json!({})).await;
    let c = client();
    let owner = owner_of(&envoy, &fleet, "pinned").await;
    fleet.engines[owner].set_fault_status(Some(500));
    let pinned = [("x-session-id", "pinned")];
    for status in ["500", "500", "404", "500", "500"] {
        let (got, _, _) = post(&c, &envoy, &chat(None, "x"), &[pinned[0], ("x-emu-status", status)]).await;
        assert_eq!(got.to_string(), status);
    }
    assert_eq!(
        flags(&envoy, &fleet, owner).await,
        "healthy",
        "a 4xx reset the streak, so no ejection yet"
    );
    let (got, _, _) = post(&c, &envoy, &chat(None, "x"), &pinned).await;
    assert_eq!(got, 500);
    wait_for(Duration::from_secs(2), || async {
        flags(&envoy, &fleet, owner).await.contains("failed_outlier_check")
    })
    .await
    .expect("three 5xx in a row after the 4xx must eject");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_client_json_never_demotes_a_backend() {
    let (fleet, envoy) = resilient_fleet(json!({})).await;
    let c = client();
    for i in 0..100 {
        let body = format!("{{\"model\": \"local-chat\", \"messages\": [{i}");
        let resp = post_json(
            &c,
            envoy.url("/v1/chat/completions"),
            body,
            &[("x-session-id", "pinned")],
        )
        .await;
        assert_eq!(resp.status, 400);
    }
    let health = envoy.host_health("llama-a").await;
    assert!(health.values().all(|f| f == "healthy"), "{health:?}");
    assert_eq!(
        envoy
            .stat("cluster.llama-a.outlier_detection.ejections_enforced_total")
            .await,
        Some(0)
    );
    assert_eq!(fleet.inference_counts().iter().sum::<usize>(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retriable_statuses_are_retried_once_on_another_host_and_others_are_relayed() {
    let (fleet, envoy) = resilient_fleet(json!({"outlier": {"consecutive_5xx": 0}})).await;
    let c = client();
    let owner = owner_of(&envoy, &fleet, "pinned").await;
    let pinned = [("x-session-id", "pinned")];
    for status in [429u16, 502, 503, 504] {
        fleet.reset();
        fleet.engines[owner].set_fault_status(Some(status));
        let (got, backend, _) = post(&c, &envoy, &chat(None, "x"), &pinned).await;
        assert_eq!(got, 200, "{status} must be retried");
        assert_ne!(
            backend,
            fleet.engines[owner].name(),
            "{status}: the retry must go to another host"
        );
        let counts = fleet.inference_counts();
        assert_eq!(
            (counts[owner], counts.iter().sum::<usize>()),
            (1, 2),
            "{status}: {counts:?}"
        );
    }
    for status in [500u16, 400, 404] {
        fleet.reset();
        fleet.engines[owner].set_fault_status(Some(status));
        let (got, _, _) = post(&c, &envoy, &chat(None, "x"), &pinned).await;
        assert_eq!(got, status, "{status} is relayed");
        assert_eq!(
            fleet.inference_counts().iter().sum::<usize>(),
            1,
            "{status} must not be retried"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_retried_on_another_host() {
    let (mut fleet, envoy) = resilient_fleet(json!({"health": {"path": "off"}})).await;
    let owner = owner_of(&envoy, &fleet, "pinned").await;
    drop(fleet.engines.remove(owner)); // its port now refuses connections
    let (status, backend, _) = post(&client(), &envoy, &chat(None, "x"), &[("x-session-id", "pinned")]).await;
    assert_eq!(status, 200);
    assert!(fleet.engines.iter().any(|e| e.name() == backend));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_its_first_byte_is_never_retried() {
    let (fleet, envoy) = resilient_fleet(json!({})).await;
    let mut body = chat(None, "stream");
    body["stream"] = json!(true);
    let resp = client()
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-emu-cut-after", "1")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let (mut text, mut broke) = (Vec::new(), false);
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(b) => text.extend_from_slice(&b),
            Err(_) => {
                broke = true;
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&text);
    assert!(
        broke || !text.contains("[DONE]"),
        "the client must see the stream end early: {text}"
    );
    assert_eq!(
        fleet.inference_counts().iter().sum::<usize>(),
        1,
        "a started stream must never be retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_backend_sheds_at_once_with_retry_after_and_nothing_below_the_limit() {
    let (fleet, envoy) = resilient_fleet(json!({"max_inflight": 2})).await;
    let c = client();
    let slow = |session: &'static str| {
        let c = c.clone();
        let url = envoy.url("/v1/chat/completions");
        tokio::spawn(async move {
            c.post(url)
                .header("content-type", "application/json")
                .header("x-emu-delay-ms", "4000")
                .header("x-session-id", session)
                .body(chat(None, "slow").to_string())
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    let holders = [slow("a"), slow("b")];
    wait_for(Duration::from_secs(3), || async {
        fleet.engines.iter().map(|e| e.inflight()).sum::<usize>() == 2
    })
    .await
    .expect("the two slow requests never started");
    for _ in 0..4 {
        let resp = c
            .post(envoy.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(chat(None, "one more").to_string())
            .send()
            .await
            .unwrap();
        // Shed while the backend is still full: the answer did not wait behind the slow requests.
        let busy: usize = fleet.engines.iter().map(|e| e.inflight()).sum();
        assert_eq!(
            busy, 2,
            "the refusal must come while the slow requests still run, not after them"
        );
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()["retry-after"], "1");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "overloaded", "{v}");
    }
    for h in holders {
        assert_eq!(h.await.unwrap(), 200, "requests below the limit are never refused");
    }
    assert!(envoy.stat("wasmcustom.llmroute_overflow_total").await.unwrap_or(0) >= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_only_where_they_fit_and_are_refused_when_nothing_fits() {
    let small = Fleet::start("small", 1).await.unwrap();
    let big = Fleet::start("big", 1).await.unwrap();
    let mut small_entry = small.backend_entry(150);
    small_entry["max_context"] = json!(200);
    let mut big_entry = big.backend_entry(150);
    big_entry["max_context"] = json!(5000);
    big_entry["kind"] = json!("vllm");
    let config = json!({
        "version": 1,
        "backends": [small_entry, big_entry],
        "models": [{"name": ALIAS, "routes": [
            {"backend": "small", "upstream_model": "small-model", "priority": 1},
            {"backend": "big", "upstream_model": "big-model", "priority": 2}]}],
    });
    let envoy = Envoy::start(config).await.unwrap();
    let c = client();
    let mut short = chat(None, "short question");
    short["max_tokens"] = json!(50);
    let (status, backend, _) = post(&c, &envoy, &short, &[]).await;
    assert_eq!((status, backend.as_str()), (200, "small-0"));
    let mut long = chat(None, &"word ".repeat(400)); // about 500 tokens
    long["max_tokens"] = json!(100);
    let (status, backend, _) = post(&c, &envoy, &long, &[]).await;
    assert_eq!(
        (status, backend.as_str()),
        (200, "big-0"),
        "only the route that fits is used"
    );
    let sent: Value = serde_json::from_slice(&big.engines[0].inference_requests()[0].body).unwrap();
    assert_eq!(sent["model"], "big-model");
    long["max_tokens"] = json!(10_000);
    let resp = post_json(&c, envoy.url("/v1/chat/completions"), long.to_string(), &[]).await;
    assert_eq!(resp.status, 400);
    assert_eq!(resp.body["error"]["code"], "context_length_exceeded");
    assert_eq!(
        big.engines[0].inference_requests().len(),
        1,
        "a refused request never reaches an engine"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_first_priority_fails_over_with_the_next_backends_own_model() {
    let first = Fleet::start("llama-a", 2).await.unwrap();
    let second = Fleet::start("vllm-b", 2).await.unwrap();
    let mut b = second.backend_entry(150);
    b["kind"] = json!("vllm");
    let config = json!({
        "version": 1,
        "backends": [first.backend_entry(150), b],
        "models": [{"name": ALIAS, "routes": [
            {"backend": "llama-a", "upstream_model": "qwen-gguf", "priority": 1},
            {"backend": "vllm-b", "upstream_model": "Qwen/Qwen3-0.6B", "priority": 2}]}],
    });
    let envoy = Envoy::start(config).await.unwrap();
    all_healthy(&envoy, "llama-a", 2).await;
    all_healthy(&envoy, "vllm-b", 2).await;
    let c = client();
    // Healthy first priority: it serves, with its own model, and CHWBL keeps a key on one host.
    let mut answered = Vec::new();
    for _ in 0..6 {
        let (status, backend, _) = post(&c, &envoy, &chat(Some("sticky tenant"), "hi"), &[]).await;
        assert_eq!(status, 200);
        answered.push(backend);
    }
    assert!(
        answered.iter().all(|b| b == &answered[0] && b.starts_with("llama-a")),
        "{answered:?}"
    );
    let sent: Value = serde_json::from_slice(
        &first
            .engines
            .iter()
            .flat_map(|e| e.inference_requests())
            .next()
            .unwrap()
            .body,
    )
    .unwrap();
    assert_eq!(sent["model"], "qwen-gguf");
    // The whole first priority goes down: requests move to the second, rewritten for it.
    for e in &first.engines {
        e.set_fault_status(Some(503));
        e.set_health_status(503);
    }
    let mut landed = Vec::new();
    for i in 0..6 {
        let (status, backend, _) = post(&c, &envoy, &chat(Some(&format!("tenant {i}")), "hi"), &[]).await;
        assert_eq!(status, 200, "request {i} failed instead of failing over");
        landed.push(backend);
    }
    assert!(landed.iter().all(|b| b.starts_with("vllm-b")), "{landed:?}");
    for r in second.engines.iter().flat_map(|e| e.inference_requests()) {
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            v["model"], "Qwen/Qwen3-0.6B",
            "the second backend must get its own model name"
        );
        assert_eq!(r.header("content-length"), Some(r.body.len().to_string().as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_routed_model_survives_the_failover_clusters_rewrite() {
    // `<alias>/<model>` names the engine's model explicitly. On an alias with two priorities (a failover cluster)
    // the upstream filter rewrites `model` per backend; it must leave the client's choice alone.
    let first = Fleet::start("llama-a", 1).await.unwrap();
    let second = Fleet::start("vllm-b", 1).await.unwrap();
    let mut b = second.backend_entry(150);
    b["kind"] = json!("vllm");
    let config = json!({
        "version": 1,
        "backends": [first.backend_entry(150), b],
        "models": [{"name": ALIAS, "model_prefix_routing": true, "routes": [
            {"backend": "llama-a", "upstream_model": "qwen-gguf", "priority": 1},
            {"backend": "vllm-b", "upstream_model": "Qwen/Qwen3-0.6B", "priority": 2}]}],
    });
    let envoy = Envoy::start(config).await.unwrap();
    all_healthy(&envoy, "llama-a", 1).await;
    all_healthy(&envoy, "vllm-b", 1).await;
    let c = client();
    let mut body = chat(None, "hi");
    body["model"] = json!(format!("{ALIAS}/my-finetune-q4"));
    let (status, backend, _) = post(&c, &envoy, &body, &[]).await;
    assert_eq!(status, 200);
    assert!(backend.starts_with("llama-a"), "{backend}");
    // The plain alias still gets the backend's own model through the same cluster.
    let (status, _, _) = post(&c, &envoy, &chat(None, "hi"), &[]).await;
    assert_eq!(status, 200);
    let sent: Vec<Value> = first.engines[0]
        .inference_requests()
        .iter()
        .map(|r| {
            assert_eq!(r.header("content-length"), Some(r.body.len().to_string().as_str()));
            serde_json::from_slice(&r.body).unwrap()
        })
        .collect();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0]["model"], "my-finetune-q4", "the client's model was overwritten");
    assert_eq!(sent[1]["model"], "qwen-gguf");
}
