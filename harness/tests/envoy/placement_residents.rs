//! `affinity.resident_keys: per_slot` through the real filter in Envoy, on engines whose slots each remember only
//! the prompt they last served (`llama-server -np 2 -cram 0`): with 12 tenants for 6 slots, the wasm build places
//! every request where the native core predicts, five tenants hold resident places, the seven others are
//! concentrated on the host with the spare slot, and the residents of the other two hosts find their prompt
//! warm on every repeat, where the plain live-key bound (4, 4 and 4) leaves every host thrashing.

use std::time::Duration;

use llmroute_harness::emulator::cost::{self, CostModel};
use llmroute_harness::emulator::Dialect;
use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::placement::Predictor;
use crate::support::*;

const TENANTS: usize = 12;
const ROUNDS: usize = 4;

fn config(fleet: &Fleet, resident_keys: &str) -> Value {
    let mut backend = fleet.backend_entry(150);
    backend["health"] = json!({"interval_ms": 300, "timeout_ms": 250, "unhealthy": 2, "healthy": 1});
    backend["slots"] = json!([2, 2, 2]);
    json!({
        "version": 1,
        "backends": [backend],
        "models": [{"name": ALIAS, "routes": [{"backend": fleet.backend, "upstream_model": UPSTREAM}]}],
        "affinity": {"placement": "bounded_keys", "resident_keys": resident_keys},
    })
}

fn body(t: usize, round: usize) -> Value {
    let system = format!(
        "You are the assistant of tenant {t}. {}",
        "Answer briefly and politely. ".repeat(40)
    );
    chat(Some(&system), &format!("question {round}"))
}

/// What one run of `ROUNDS` × `TENANTS` sequential requests did.
struct Run {
    /// Each tenant's engine, per round.
    engines: Vec<Vec<usize>>,
    /// Each tenant's warm repeats (rounds after the first with its system prompt cached).
    warm: Vec<usize>,
}

async fn run(resident_keys: &str) -> Run {
    let fleet = Fleet::start_with("llama-a", 3, |o| {
        o.cost = Some(CostModel {
            prefill_ms_per_token: 0.0,
            decode_ms_per_token: 0.0,
            slots: 2,
            slot_cache: true,
        });
    })
    .await
    .unwrap();
    let doc = config(&fleet, resident_keys);
    let envoy = Envoy::start(doc.clone()).await.unwrap();
    let ready = wait_for(Duration::from_secs(10), || async {
        let status = client().get(envoy.url("/llmroute/status")).send().await;
        let status: Option<Value> = match status {
            Ok(r) => r.json().await.ok(),
            Err(_) => None,
        };
        status.and_then(|s| s["backends"][0]["healthy_hosts"].as_u64()) == Some(3)
    })
    .await;
    assert!(ready.is_some(), "hosts never became healthy in the filter's snapshot");
    fleet.reset();
    let mut predict = Predictor::with(&doc, ALIAS, fleet.endpoints(), &[2, 2, 2]);
    let c = client();
    let mut engines = vec![Vec::new(); TENANTS];
    let mut warm = vec![0; TENANTS];
    for round in 0..ROUNDS {
        for t in 0..TENANTS {
            let body = body(t, round);
            let want = predict.next_for(&body);
            let (status, backend, answer) = post(&c, &envoy, &body, &[]).await;
            assert_eq!(status, 200);
            let engine = fleet.engines.iter().position(|e| e.name() == backend).unwrap();
            assert_eq!(engine, want.host, "round {round}, tenant {t}: the core predicts {want:?}");
            engines[t].push(engine);
            let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
            let (_, blocks) = cost::prompt_blocks(Dialect::Chat, &body);
            // The system prompt alone spans this many whole blocks: a warm repeat caches at least those.
            let system_blocks = blocks.len().saturating_sub(1) as u64;
            if round > 0 && cached >= system_blocks * cost::BLOCK_TOKENS {
                warm[t] += 1;
            }
        }
    }
    Run { engines, warm }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_tenants_on_six_slots_keep_two_hosts_warm_with_resident_keys() {
    let per_slot = run("per_slot").await;
    // Nobody moved: every tenant stayed on its first engine.
    for (t, e) in per_slot.engines.iter().enumerate() {
        assert!(e.iter().all(|x| *x == e[0]), "tenant {t} moved: {e:?}");
    }
    let home: Vec<usize> = per_slot.engines.iter().map(|e| e[0]).collect();
    let mut per_engine = [0usize; 3];
    for h in &home {
        per_engine[*h] += 1;
    }
    // The first five tenants took the resident places (2, 2, 1); the other seven joined the host with one.
    let cold = (0..3).find(|e| home[5..].iter().all(|h| h == e)).expect("cold tenants concentrated");
    assert_eq!(per_engine[cold], 8, "{home:?}");
    let resident_hosts: Vec<usize> = (0..3).filter(|e| *e != cold).collect();
    for t in 0..TENANTS {
        if resident_hosts.contains(&home[t]) {
            assert_eq!(per_slot.warm[t], ROUNDS - 1, "resident tenant {t} on engine {} went cold", home[t]);
        }
    }
    let per_slot_warm: usize = per_slot.warm.iter().sum();
    // The plain live-key bound, same traffic: 4, 4 and 4, and every repeat evicted by the next tenant.
    let off = run("off").await;
    let off_warm: usize = off.warm.iter().sum();
    assert!(
        per_slot_warm >= 4 * (ROUNDS - 1) && per_slot_warm > off_warm,
        "warm repeats: per_slot {per_slot_warm} ({:?}), off {off_warm} ({:?})",
        per_slot.warm,
        off.warm
    );
}
