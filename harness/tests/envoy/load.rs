//! Engine load through the real filter in Envoy (`backends[].load`), in front of emulated engines whose
//! `/metrics` report the queues a test sets: a queued engine takes no new key while others have room and takes
//! keys again once idle; a known key whose engine's queue passes `spill_queue` is served by the next engine,
//! counted as `queued`, and comes back; a reading that goes stale falls back to request counts and the status
//! page says why; vLLM's ORCA report is asked for, refreshes the reading between polls and never reaches the
//! client; the hosts of a discovered (EDS) backend are polled too.

use std::collections::HashMap;
use std::time::Duration;

use llmroute_core::envoy_contract::metrics::{ENGINE_LOAD_STALE, ENGINE_QUEUE, PLACEMENTS};
use llmroute_harness::emulator::load::{LoadFormat, ReportedLoad};
use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::*;

const DEADLINE: Duration = Duration::from_secs(15);

fn config(fleet: &Fleet, kind: &str, load: Value) -> Value {
    let mut backend = fleet.backend_entry(150);
    backend["kind"] = json!(kind);
    backend["load"] = load;
    backend["health"] = json!({"interval_ms": 300, "timeout_ms": 250, "unhealthy": 2, "healthy": 1});
    json!({
        "version": 1,
        "backends": [backend],
        "models": [{"name": ALIAS, "routes": [{"backend": fleet.backend, "upstream_model": UPSTREAM}]}],
        "affinity": {"placement": "bounded_keys"},
        "debug_headers": true,
    })
}

async fn start(kind: &str, format: LoadFormat, orca: bool, load: Value) -> (Fleet, Envoy) {
    let fleet = Fleet::start_with("llama-l", 3, |o| {
        o.load_format = Some(format);
        o.orca = orca;
    })
    .await
    .unwrap();
    let envoy = Envoy::start(config(&fleet, kind, load)).await.unwrap();
    envoy
        .wait_snapshot_healthy(&fleet.backend, 3, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", envoy.log()));
    (fleet, envoy)
}

async fn status(envoy: &Envoy) -> Value {
    let r = get_json(&client(), envoy.url("/llmroute/status"), &[]).await;
    r.body
}

/// Each engine's `load` object on the status page, by engine index. The page names hosts by id only; its host
/// list is in address order, which the test can sort too.
async fn loads(envoy: &Envoy, fleet: &Fleet) -> Vec<Value> {
    let page = status(envoy).await;
    let hosts = page["backends"][0]["hosts"].as_array().cloned().unwrap_or_default();
    let mut sorted = fleet.endpoints();
    sorted.sort();
    let by_address: HashMap<String, Value> = sorted
        .into_iter()
        .zip(hosts)
        .map(|(a, h)| (a, h["load"].clone()))
        .collect();
    fleet
        .endpoints()
        .iter()
        .map(|a| by_address.get(a).cloned().unwrap_or(Value::Null))
        .collect()
}

/// Waits until the status page shows each engine's fresh queue as `queues`.
async fn wait_queues(envoy: &Envoy, fleet: &Fleet, queues: [u64; 3]) {
    let seen = wait_for(DEADLINE, || async {
        let l = loads(envoy, fleet).await;
        l.iter()
            .zip(queues)
            .all(|(l, q)| l["queued"] == q && l["stale"] == false)
    })
    .await;
    assert!(
        seen.is_some(),
        "the status page never showed queues {queues:?}: {:#}\n{}",
        status(envoy).await,
        envoy.log()
    );
}

fn set_queue(fleet: &Fleet, engine: usize, queued: u32) {
    fleet.engines[engine].set_load(ReportedLoad {
        queued,
        ..ReportedLoad::default()
    });
}

fn tenant_body(t: usize) -> Value {
    chat(
        Some(&format!("You are the load-aware assistant of tenant {t}.")),
        "hello",
    )
}

/// One request for tenant `t`: (engine index, placement reason, the whole reply).
async fn send(envoy: &Envoy, fleet: &Fleet, t: usize) -> (usize, String, Reply) {
    let r = post_json(
        &client(),
        envoy.url("/v1/chat/completions"),
        tenant_body(t).to_string(),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "tenant {t}: {}", r.text);
    let name = r.header("x-emu-backend").unwrap_or_default().to_string();
    let engine = fleet
        .engines
        .iter()
        .position(|e| e.name() == name)
        .unwrap_or_else(|| panic!("no engine named {name:?}"));
    let reason = r.header("x-llmroute-placement").unwrap_or_default().to_string();
    (engine, reason, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_engine_takes_no_new_key_while_others_have_room_and_takes_keys_again_when_idle() {
    let (fleet, envoy) = start("llamacpp", LoadFormat::LlamaCpp, false, json!({"poll_ms": 100})).await;
    set_queue(&fleet, 0, 5);
    wait_queues(&envoy, &fleet, [5, 0, 0]).await;
    // The engine's queue is also a metric, per backend and host.
    let page = status(&envoy).await;
    let mut sorted = fleet.endpoints();
    sorted.sort();
    let at = sorted.iter().position(|a| *a == fleet.endpoints()[0]).unwrap();
    let id = page["backends"][0]["hosts"][at]["id"].as_str().unwrap().to_string();
    let gauge = stat_name(ENGINE_QUEUE, &[("backend", &fleet.backend), ("host", &id)]);
    assert_eq!(envoy.stat(&gauge).await, Some(5), "{gauge}");
    let lines = crate::discovery::prometheus(&envoy, ENGINE_QUEUE).await;
    let labelled = format!("backend=\"{}\"", fleet.backend);
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&labelled) && l.contains(&format!("host=\"{id}\"")) && l.ends_with(" 5")),
        "{lines:?}"
    );
    for t in 0..6 {
        let (engine, reason, _) = send(&envoy, &fleet, t).await;
        assert_eq!(reason, "placed", "tenant {t}");
        assert_ne!(engine, 0, "tenant {t} went to the queued engine");
    }
    set_queue(&fleet, 0, 0);
    wait_queues(&envoy, &fleet, [0, 0, 0]).await;
    let mut homes = Vec::new();
    for t in 6..9 {
        let (engine, reason, _) = send(&envoy, &fleet, t).await;
        assert_eq!(reason, "placed", "tenant {t}");
        homes.push(engine);
    }
    assert_eq!(
        homes,
        vec![0, 0, 0],
        "the idle engine, holding no key, takes the new ones"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_key_leaves_an_engine_over_spill_queue_per_request_and_a_stale_reading_falls_back() {
    let (fleet, envoy) = start(
        "llamacpp",
        LoadFormat::LlamaCpp,
        false,
        json!({"poll_ms": 100, "spill_queue": 2}),
    )
    .await;
    wait_queues(&envoy, &fleet, [0, 0, 0]).await;
    let (home, reason, _) = send(&envoy, &fleet, 0).await;
    assert_eq!(reason, "placed");
    let mut queues = [0u64; 3];
    queues[home] = 3;
    set_queue(&fleet, home, 3);
    wait_queues(&envoy, &fleet, queues).await;
    let (engine, reason, _) = send(&envoy, &fleet, 0).await;
    assert_eq!(reason, "queued");
    assert_ne!(engine, home, "the request went to the next engine");
    assert_eq!(
        envoy.stat(&stat_name(PLACEMENTS, &[("reason", "queued")])).await,
        Some(1)
    );
    set_queue(&fleet, home, 0);
    wait_queues(&envoy, &fleet, [0, 0, 0]).await;
    let (engine, reason, _) = send(&envoy, &fleet, 0).await;
    assert_eq!((engine, reason.as_str()), (home, "pinned"), "the key never moved");

    // The engine's queue passes the bound again, then its /metrics fails (501: llama-server without
    // --metrics): after three polls its reading is stale and the key's requests stay home.
    queues[home] = 3;
    set_queue(&fleet, home, 3);
    wait_queues(&envoy, &fleet, queues).await;
    fleet.engines[home].set_metrics_status(Some(501));
    let stale = wait_for(DEADLINE, || async {
        let l = loads(&envoy, &fleet).await;
        l[home]["stale"] == true && l[home]["problem"].as_str().is_some_and(|p| p.contains("--metrics"))
    })
    .await;
    assert!(stale.is_some(), "never stale: {:#}", status(&envoy).await);
    let (engine, reason, _) = send(&envoy, &fleet, 0).await;
    assert_eq!(
        (engine, reason.as_str()),
        (home, "pinned"),
        "a stale queue counts as none"
    );
    // The next poll counts the stale reading.
    let name = stat_name(ENGINE_LOAD_STALE, &[("backend", &fleet.backend)]);
    let counted = wait_for(DEADLINE, || async { envoy.stat(&name).await.is_some_and(|n| n >= 1) }).await;
    assert!(counted.is_some(), "{name}: {:?}", envoy.stat(&name).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_orca_report_refreshes_the_reading_between_polls_and_never_reaches_the_client() {
    // One poll a minute: the first poll reads 0 queued; what changes after it comes from ORCA reports.
    let (fleet, envoy) = start("vllm", LoadFormat::Vllm, true, json!({"poll_ms": 60000})).await;
    wait_queues(&envoy, &fleet, [0, 0, 0]).await;
    for e in &fleet.engines {
        e.set_load(ReportedLoad {
            queued: 4,
            running: Some(1),
            kv_usage: Some(0.5),
        });
    }
    let (engine, _, reply) = send(&envoy, &fleet, 0).await;
    assert!(
        reply.header("endpoint-load-metrics").is_none(),
        "the report reached the client"
    );
    let asked = fleet.engines[engine].chat_requests().last().cloned().unwrap();
    assert_eq!(asked.header("endpoint-load-metrics-format"), Some("JSON"));
    let l = loads(&envoy, &fleet).await;
    assert_eq!(l[engine]["queued"], 4, "{:#}", status(&envoy).await);
    assert_eq!(l[engine]["kv_cache_usage"], 0.5);
    for (i, other) in l.iter().enumerate().filter(|(i, _)| *i != engine) {
        assert_eq!(other["queued"], 0, "engine {i} was only polled");
    }
    assert!(
        fleet.engines.iter().all(|e| e.metrics_reads() == 1),
        "one poll each so far"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_of_a_discovered_backend_are_polled_too() {
    let fleet = Fleet::start_with("llama-de", 2, |o| o.load_format = Some(LoadFormat::Sglang))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let eds = dir.path().join("eds.json");
    crate::discovery::write_eds(&eds, &fleet.backend, 1, &fleet.endpoints());
    let doc = json!({
        "version": 1,
        "backends": [{
            "name": fleet.backend,
            "kind": "sglang",
            "discovery": {"eds_path": eds.display().to_string()},
            "load": {"poll_ms": 100},
            "health": {"interval_ms": 300, "timeout_ms": 250, "unhealthy": 2, "healthy": 1},
        }],
        "models": [{"name": ALIAS, "routes": [{"backend": fleet.backend, "upstream_model": UPSTREAM}]}],
        "affinity": {"placement": "bounded_keys"},
    });
    let envoy = Envoy::start(doc).await.unwrap();
    fleet.engines[1].set_load(ReportedLoad {
        queued: 7,
        running: Some(2),
        kv_usage: Some(0.25),
    });
    let seen = wait_for(DEADLINE, || async {
        let l = loads(&envoy, &fleet).await;
        l[0]["queued"] == 0 && l[1]["queued"] == 7 && l[1]["running"] == 2
    })
    .await;
    assert!(seen.is_some(), "{:#}\n{}", status(&envoy).await, envoy.log());
}
