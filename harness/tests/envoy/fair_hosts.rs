//! The fair queue's per-host bound (`backends[].host_max_inflight`) through the real filter in a real Envoy, in
//! front of two engines with `bounded_keys` placement: a flooding key's second request waits for its own host,
//! which runs one already, while a quiet tenant's new key goes to the other engine at once and is answered while
//! the flood still holds its host; the flood's waiter then goes to its key's host when it frees. A quiet tenant
//! whose key is on the host the flood fills goes around it to the other engine (`host_full`), while the flood's
//! own waiter stays for its host.

use std::time::Duration;

use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::*;

/// Sends a chat of `tenant`, with session `key`, saying `text`, in the background; the engine holds it `hold_ms`.
fn spawn_keyed(envoy: &Envoy, tenant: &str, key: &str, text: &str, hold_ms: u64) -> tokio::task::JoinHandle<Reply> {
    let url = envoy.url("/v1/chat/completions");
    let (tenant, key, body) = (tenant.to_string(), key.to_string(), chat(None, text).to_string());
    tokio::spawn(async move {
        let hold = hold_ms.to_string();
        let headers = [
            ("x-tenant-id", tenant.as_str()),
            ("x-session-id", key.as_str()),
            ("x-emu-delay-ms", hold.as_str()),
        ];
        post_json(&client(), url, body, &headers).await
    })
}

async fn queue(envoy: &Envoy) -> Value {
    let r = get_json(&client(), envoy.url("/llmroute/status"), &[]).await;
    r.body["backends"][0]["queue"].clone()
}

/// Two engines with `bounded_keys`, `max_inflight: 8` and `host_max_inflight: 1`, tenants by `x-tenant-id`, debug
/// headers on; returned once the filter's snapshot lists both hosts up (placement pins only then).
async fn per_host_fleet() -> (Fleet, Envoy) {
    let fleet = Fleet::start("llama-a", 2).await.unwrap();
    let mut backend = fleet.backend_entry(100_000);
    backend["max_inflight"] = json!(8);
    backend["host_max_inflight"] = json!(1);
    let cfg = json!({
        "version": 1,
        "backends": [backend],
        "models": [{ "name": ALIAS, "routes": [{ "backend": fleet.backend, "upstream_model": UPSTREAM }] }],
        "affinity": { "session_headers": ["x-session-id"], "placement": "bounded_keys" },
        "fairness": { "by": { "header": "x-tenant-id" }, "max_wait_ms": 20000 },
        "debug_headers": true,
    });
    let envoy = Envoy::start(cfg).await.unwrap();
    let up = wait_for(Duration::from_secs(10), || async {
        let r = get_json(&client(), envoy.url("/llmroute/status"), &[]).await;
        r.body["backends"][0]["healthy_hosts"] == 2
    })
    .await;
    assert!(
        up.is_some(),
        "the hosts never came up in the filter's snapshot\n{}",
        envoy.log()
    );
    (fleet, envoy)
}

/// The engine running a request, if one is.
fn busy(fleet: &Fleet) -> Option<usize> {
    fleet.engines.iter().position(|e| e.inflight() == 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_waits_for_its_full_host_while_a_quiet_key_is_served_on_the_other() {
    let (fleet, envoy) = per_host_fleet().await;
    let holder = spawn_keyed(&envoy, "flood", "flood-doc", "flood-0", 5000);
    let got = wait_for(Duration::from_secs(5), || async { busy(&fleet).is_some() }).await;
    let (Some(_), Some(flood_host)) = (got, busy(&fleet)) else {
        panic!("no engine got the flood's first request\n{}", envoy.log());
    };
    let waiter = spawn_keyed(&envoy, "flood", "flood-doc", "flood-1", 10);
    let waiting = wait_for(Duration::from_secs(5), || async { queue(&envoy).await["waiting"] == 1 }).await;
    assert!(
        waiting.is_some(),
        "the flood's second request did not wait: {}\n{}",
        queue(&envoy).await,
        envoy.log()
    );

    let quiet = spawn_keyed(&envoy, "quiet", "quiet-chat", "quiet-0", 10).await.unwrap();
    assert_eq!(quiet.status, 200, "{}\n{}", quiet.text, envoy.log());
    let other = 1 - flood_host;
    assert_eq!(
        fleet.chat_counts()[other],
        1,
        "the quiet key went to the host with room"
    );
    assert_eq!(
        fleet.engines[flood_host].inflight(),
        1,
        "the flood still holds its host"
    );
    assert_eq!(
        queue(&envoy).await["waiting"],
        1,
        "the flood's waiter still waits for its host"
    );
    assert!(!holder.is_finished() && !waiter.is_finished(), "{}", envoy.log());

    assert_eq!(holder.await.unwrap().status, 200);
    let second = waiter.await.unwrap();
    assert_eq!(second.status, 200, "{}\n{}", second.text, envoy.log());
    let mut want = vec![0, 0];
    want[flood_host] = 2;
    want[other] = 1;
    assert_eq!(fleet.chat_counts(), want, "the flood's waiter went to its key's host");
    let q = queue(&envoy).await;
    assert_eq!(
        (q["waiting"].as_u64(), q["in_flight"].as_u64()),
        (Some(0), Some(0)),
        "{q}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tenant_goes_around_the_host_a_flood_fills() {
    let (fleet, envoy) = per_host_fleet().await;
    let holder = spawn_keyed(&envoy, "flood", "shared-doc", "flood-0", 5000);
    let got = wait_for(Duration::from_secs(5), || async { busy(&fleet).is_some() }).await;
    let (Some(_), Some(home)) = (got, busy(&fleet)) else {
        panic!("no engine got the flood's first request\n{}", envoy.log());
    };
    let waiter = spawn_keyed(&envoy, "flood", "shared-doc", "flood-1", 10);
    let waiting = wait_for(Duration::from_secs(5), || async { queue(&envoy).await["waiting"] == 1 }).await;
    assert!(
        waiting.is_some(),
        "the flood's second request did not wait\n{}",
        envoy.log()
    );

    // The quiet tenant's key is the flood's, on the full host: its request goes around it.
    let quiet = spawn_keyed(&envoy, "quiet", "shared-doc", "quiet-0", 10).await.unwrap();
    assert_eq!(quiet.status, 200, "{}\n{}", quiet.text, envoy.log());
    assert_eq!(fleet.chat_counts()[1 - home], 1, "served by the other engine");
    assert_eq!(
        quiet
            .headers
            .get("x-llmroute-placement")
            .map(|v| v.to_str().unwrap_or_default()),
        Some("host_full")
    );
    assert_eq!(
        queue(&envoy).await["waiting"],
        1,
        "the flood's waiter still waits for its host"
    );
    assert!(!holder.is_finished(), "{}", envoy.log());
    assert_eq!(holder.await.unwrap().status, 200);
    assert_eq!(waiter.await.unwrap().status, 200);
    assert_eq!(fleet.chat_counts()[home], 2, "the flood stayed on its host");
}
