//! The VM failure policy through the real filter in a real Envoy, with the test-only module that traps on a
//! request header (`make build-trap`, cargo feature `test-trap`):
//! - the request that traps the VM gets a 503 from Envoy, and reaches no engine;
//! - the VM is reloaded (`failure_policy: FAIL_RELOAD`): later requests on the same worker are routed again;
//! - Envoy counts the failure and the reload in its wasm stats;
//! - each filter role has its own VM, so the downstream role's trap does not take the upstream role down;
//! - the bounded-keys in-flight counts of the requests the dead VM had pinned, which it never releases, come back
//!   to Envoy's own figures at the next status poll;
//! - the release module does not contain the trap.

use std::time::Duration;

use llmroute_harness::envoy::{trap_wasm_module, wasm_module, Envoy, EnvoyOptions};
use llmroute_harness::fleet::{single_backend_config, Fleet};
use serde_json::json;

use crate::support::*;

const TRAP_HEADER: &str = "x-llmroute-test-trap";

async fn trap_envoy(concurrency: u32) -> (Fleet, Envoy) {
    let module = trap_wasm_module();
    assert!(
        module.exists(),
        "{} is missing: run `make build-trap`",
        module.display()
    );
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let opts = EnvoyOptions {
        concurrency,
        wasm: Some(module),
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start_with(single_backend_config(&fleet, ALIAS, UPSTREAM, 150), opts)
        .await
        .unwrap();
    (fleet, envoy)
}

async fn stats(envoy: &Envoy, filter: &str) -> String {
    let url = envoy.admin_url(&format!("/stats?filter={filter}"));
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

async fn trap_request(envoy: &Envoy) -> reqwest::Response {
    client()
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header(TRAP_HEADER, "1")
        .body(chat(None, "trap").to_string())
        .send()
        .await
        .unwrap()
}

/// One worker, so the request after the trap meets the trapped VM (with two, the other worker's could answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapped_vm_is_reloaded_and_routes_again() {
    let (fleet, envoy) = trap_envoy(1).await;
    let c = client();
    let (status, backend, _) = post(&c, &envoy, &chat(None, "before"), &[]).await;
    assert_eq!((status, backend.as_str()), (200, "llama-a-0"));

    let resp = trap_request(&envoy).await;
    // Envoy answers the trapping request itself with a 503, which its local_reply_config puts in the envelope.
    assert_eq!(resp.status(), 503);
    let request_id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    let body: serde_json::Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "upstream_unavailable", "{body}");
    assert_eq!(body["request_id"], request_id.as_str(), "{body}");
    assert_eq!(fleet.chat_counts(), vec![1], "the trapping request reaches no engine");

    // FAIL_RELOAD: after a short backoff (503s meanwhile), a fresh VM routes again, on the same worker.
    let start = std::time::Instant::now();
    let mut refused = 0;
    let healed = loop {
        let (status, backend, _) = post(&c, &envoy, &chat(None, "after"), &[]).await;
        if status == 200 && backend == "llama-a-0" {
            break Some(start.elapsed());
        }
        assert_eq!(status, 503, "while the VM is down, Envoy fails closed");
        refused += 1;
        if start.elapsed() > Duration::from_secs(10) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("reloaded after {healed:?}; {refused} request(s) refused meanwhile");
    assert!(healed.is_some(), "the VM was not reloaded within 10 s");
    assert!(
        healed.unwrap() < Duration::from_secs(3),
        "reloading took {healed:?}, {refused} requests were refused meanwhile"
    );
    for _ in 0..5 {
        let (status, _, body) = post(&c, &envoy, &chat(None, "steady"), &[]).await;
        assert_eq!(status, 200, "{body}");
    }
    let wasm = stats(&envoy, "^wasm\\.llmroute\\.vm_reload").await;
    assert!(
        envoy.stat("wasm.llmroute.vm_reload_success").await.unwrap_or(0) >= 1,
        "{wasm}"
    );
    assert_eq!(envoy.stat("wasm.llmroute.vm_reload_failure").await, Some(0), "{wasm}");
    assert!(envoy.log().contains("test trap triggered") || flushed(&envoy).await.contains("test trap triggered"));
}

/// One worker (so the trap kills the VM that pinned the slow requests), two hosts, `bounded_keys`, factor 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_trap_the_in_flight_counts_of_the_dead_vms_requests_come_back() {
    let module = trap_wasm_module();
    assert!(
        module.exists(),
        "{} is missing: run `make build-trap`",
        module.display()
    );
    let fleet = Fleet::start("llama-a", 2).await.unwrap();
    let mut backend = fleet.backend_entry(100);
    backend["health"] = json!({"interval_ms": 300, "timeout_ms": 250, "unhealthy": 2, "healthy": 1});
    let config = json!({
        "version": 1,
        "backends": [backend],
        "models": [{"name": ALIAS, "routes": [{"backend": fleet.backend, "upstream_model": UPSTREAM}]}],
        "affinity": {"placement": "bounded_keys"},
        "debug_headers": true,
    });
    let opts = EnvoyOptions {
        concurrency: 1,
        wasm: Some(module),
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start_with(config, opts).await.unwrap();
    let c = client();
    let status = || status_page(&envoy);
    let up = wait_for(Duration::from_secs(10), || async {
        status().await.is_some_and(|s| s["backends"][0]["healthy_hosts"] == 2)
    })
    .await;
    assert!(up.is_some(), "both hosts never became healthy in the filter's snapshot");

    let body = chat(Some("One tenant whose host the dead VM leaves looking busy."), "hi").to_string();
    let url = envoy.url("/v1/chat/completions");
    let first = post_json(&c, url.clone(), body.clone(), &[]).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let home = first.header("x-emu-backend").unwrap().to_string();
    // Three slow requests for the key: with factor 100 over two idle hosts all three are pinned to its host.
    let slow = futures_util::future::join_all((0..3).map(|_| {
        let req = c.post(url.clone()).header("content-type", "application/json");
        req.header("x-emu-delay-ms", "3000").body(body.clone()).send()
    }));
    let slow = tokio::spawn(slow);
    let busy = wait_for(Duration::from_secs(5), || async {
        status()
            .await
            .is_some_and(|s| s["backends"][0]["in_flight"].as_u64() >= Some(3))
    })
    .await;
    assert!(busy.is_some(), "the slow requests never showed in Envoy's figures");
    // The VM that pinned them traps: nothing will release their counts.
    assert_eq!(trap_request(&envoy).await.status(), 503);
    let _ = slow.await;

    // Left at 3 on the key's host (0 elsewhere), the counts would spill every later request for the key; rebuilt
    // from Envoy's figures at the next poll, the key is pinned to its host again.
    let seen = std::cell::RefCell::new(Vec::new());
    let pinned = wait_for(Duration::from_secs(10), || async {
        let r = post_json(&c, url.clone(), body.clone(), &[]).await;
        let at = (
            r.header("x-emu-backend").map(str::to_string),
            r.header("x-llmroute-placement").map(str::to_string),
        );
        let ok = r.status == 200 && at == (Some(home.clone()), Some("pinned".to_string()));
        seen.borrow_mut().push((r.status, at));
        ok
    })
    .await;
    let seen = seen.into_inner();
    let last = &seen[seen.len().saturating_sub(3)..];
    assert!(
        pinned.is_some(),
        "home {home}; never pinned again after the trap in {} requests, the last: {last:?}",
        seen.len()
    );
}

/// The log once its last lines are on disk (the launcher has Envoy flush every 100 ms).
async fn flushed(envoy: &Envoy) -> String {
    tokio::time::sleep(Duration::from_millis(300)).await;
    envoy.log()
}

#[test]
fn the_release_module_has_no_trap() {
    let trap = std::fs::read(trap_wasm_module()).expect("run `make build-trap`");
    let release = std::fs::read(wasm_module()).expect("run `make build`");
    let needle = b"llmroute test trap triggered";
    let has = |m: &[u8]| m.windows(needle.len()).any(|w| w == needle);
    assert!(has(&trap), "the test module carries the trap, so this check can see it");
    assert!(!has(&release), "the release module must never contain the test trap");
    let header = TRAP_HEADER.as_bytes();
    assert!(!release.windows(header.len()).any(|w| w == header));
}
