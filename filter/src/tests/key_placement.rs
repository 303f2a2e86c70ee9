//! Bounded-keys placement, host side (`key_placement.rs`): the key table's compare-and-swap loop, the in-flight
//! ledger, and host errors at every call of a pin and its release.

use llmroute_core::envoy_contract::{shared, SESSION_HEADER};
use llmroute_core::key_placement::in_flight::CAS_ATTEMPTS;
use llmroute_core::key_placement::table::decode_host_counts;
use llmroute_core::key_placement::{session_header_value, KeyTable, PlacementReason};
use llmroute_core::{load_config, Config};
use proxy_wasm::types::MapType;

use super::*;
use crate::host::fake::Kind;
use crate::host::HostStatus;
use crate::key_placement::{pin, seed, settle};

const KEY: u64 = 0x0123_4567_89ab_cdef;

fn setup() -> (Rc<FakeHost>, Config) {
    let fake = FakeHost::new();
    let cfg = load_config(&bounded_config()).unwrap();
    seed(&fake.envoy(), &cfg);
    settle(&fake.envoy());
    fake.reset_calls();
    (fake, cfg)
}

fn in_flight(fake: &Rc<FakeHost>) -> Vec<u32> {
    decode_host_counts(&fake.shared(&shared::in_flight("llama-a")).unwrap().0, 2)
}

fn table(fake: &Rc<FakeHost>) -> KeyTable {
    KeyTable::decode(&fake.shared(&shared::keys("llama-a")).unwrap().0)
}

#[test]
fn a_new_key_is_placed_pinned_and_its_count_released() {
    let (fake, cfg) = setup();
    let first = pin(&fake.envoy(), &cfg, &cfg.affinity.placement, "llama-a", KEY).unwrap();
    assert_eq!(first.choice.reason, PlacementReason::Placed);
    let address = ["127.0.0.1:8081", "127.0.0.1:8082"][first.choice.host];
    let session = fake.header(MapType::HttpRequestHeaders, SESSION_HEADER);
    assert_eq!(session, Some(session_header_value(address)));
    assert!(table(&fake).get(KEY).is_some(), "the key is in the shared table");
    let second = pin(&fake.envoy(), &cfg, &cfg.affinity.placement, "llama-a", KEY).unwrap();
    assert_eq!(
        (second.choice.reason, second.choice.host),
        (PlacementReason::Pinned, first.choice.host)
    );
    let mut counts = vec![0, 0];
    counts[first.choice.host] = 2;
    assert_eq!(in_flight(&fake), counts);
    first.release(&fake.envoy());
    second.release(&fake.envoy());
    assert_eq!(in_flight(&fake), vec![0, 0]);
    // Not placed at all: another placement, an unknown backend.
    let cfg = load_config(CONFIG).unwrap();
    assert!(pin(&fake.envoy(), &cfg, &cfg.affinity.placement, "llama-a", KEY).is_none());
    assert!(pin(&fake.envoy(), &cfg, &cfg.affinity.placement, "nowhere", KEY).is_none());
}

#[test]
fn a_lost_compare_and_swap_is_retried_on_a_fresh_read() {
    let (fake, cfg) = setup();
    fake.race(&shared::keys("llama-a"), 1);
    let p = pin(&fake.envoy(), &cfg, &cfg.affinity.placement, "llama-a", KEY).unwrap();
    assert_eq!(p.choice.reason, PlacementReason::Placed);
    assert!(table(&fake).get(KEY).is_some(), "the second try wrote the key");
    let table_reads = fake
        .counts()
        .iter()
        .find(|(k, _)| *k == Kind::GetShared)
        .map(|(_, n)| *n);
    // views: down, in-flight, slots; the table twice; the ledger's read of the counts.
    assert_eq!(table_reads, Some(6));
}

#[test]
fn a_table_that_loses_every_race_still_routes_the_request() {
    let (fake, cfg) = setup();
    fake.race(&shared::keys("llama-a"), CAS_ATTEMPTS);
    let p = pin(&fake.envoy(), &cfg, &cfg.affinity.placement, "llama-a", KEY).unwrap();
    assert_eq!(p.choice.reason, PlacementReason::Placed);
    assert!(fake.header(MapType::HttpRequestHeaders, SESSION_HEADER).is_some());
    assert!(
        table(&fake).get(KEY).is_none(),
        "not written: a later request places the key again"
    );
}

#[test]
fn an_in_flight_update_that_loses_its_races_is_owed_until_the_tick() {
    let (fake, cfg) = setup();
    fake.race(&shared::in_flight("llama-a"), CAS_ATTEMPTS);
    let p = pin(&fake.envoy(), &cfg, &cfg.affinity.placement, "llama-a", KEY).unwrap();
    assert_eq!(in_flight(&fake), vec![0, 0], "owed, not written");
    settle(&fake.envoy());
    assert_eq!(in_flight(&fake).iter().sum::<u32>(), 1, "the tick writes what was owed");
    fake.race(&shared::in_flight("llama-a"), CAS_ATTEMPTS);
    p.release(&fake.envoy());
    assert_eq!(in_flight(&fake).iter().sum::<u32>(), 1);
    settle(&fake.envoy());
    assert_eq!(in_flight(&fake), vec![0, 0]);
}

#[test]
fn a_host_error_at_any_call_of_a_pin_and_its_release_leaves_no_count_behind() {
    let (clean, cfg) = setup();
    pin(&clean.envoy(), &cfg, &cfg.affinity.placement, "llama-a", KEY)
        .unwrap()
        .release(&clean.envoy());
    let n = clean.calls().len();
    for status in [
        HostStatus::InternalFailure,
        HostStatus::CasMismatch,
        HostStatus::Other(77),
    ] {
        for i in 0..n {
            let (fake, cfg) = setup();
            fake.fail_nth(i, status);
            if let Some(p) = pin(&fake.envoy(), &cfg, &cfg.affinity.placement, "llama-a", KEY) {
                p.release(&fake.envoy());
            }
            fake.heal();
            settle(&fake.envoy());
            assert_eq!(in_flight(&fake), vec![0, 0], "call {i} failing with {status:?}");
        }
    }
}

/// Envoy's admin `/clusters` answer for `llama-a`, with `rq_active` per host (8081, 8082).
fn admin_answer(fake: &Rc<FakeHost>, active: [u32; 2]) -> usize {
    let hosts: Vec<serde_json::Value> = [8081, 8082]
        .iter()
        .zip(active)
        .map(|(port, n)| {
            serde_json::json!({
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "stats": [{"name": "rq_active", "type": "GAUGE", "value": n.to_string()}],
            })
        })
        .collect();
    let body = serde_json::json!({"cluster_statuses": [{"name": "llama-a", "host_statuses": hosts}]}).to_string();
    fake.set_map(MapType::HttpCallResponseHeaders, &[(":status", "200")]);
    fake.set_buffer_bytes(proxy_wasm::types::BufferType::HttpCallResponseBody, body.as_bytes());
    body.len()
}

#[test]
fn the_status_poll_rebuilds_the_counts_a_trapped_worker_never_released() {
    let (fake, cfg) = setup();
    let cfg = Rc::new(cfg);
    // Three requests pinned by a worker whose VM then trapped: nothing will ever release them.
    let pins: Vec<_> = (0..3)
        .map(|k| pin(&fake.envoy(), &cfg, &cfg.affinity.placement, "llama-a", KEY + k).unwrap())
        .collect();
    assert_eq!(in_flight(&fake).iter().sum::<u32>(), 3);
    // Envoy itself has one request in flight, on the second host.
    let mut poller = crate::status::Poller::default();
    poller.start(&fake.envoy(), cfg.clone());
    poller.on_tick(&fake.envoy());
    let token = fake.callouts().last().unwrap().token;
    poller.on_response(&fake.envoy(), token, admin_answer(&fake, [0, 1]));
    assert_eq!(
        in_flight(&fake),
        vec![0, 1],
        "Envoy's own figures, not the leaked counts"
    );
    // Placement weighs them at once: a new key's request counts on top of them.
    let next = pin(&fake.envoy(), &cfg, &cfg.affinity.placement, "llama-a", KEY + 100).unwrap();
    let mut expected = vec![0, 1];
    expected[next.choice.host] += 1;
    assert_eq!(in_flight(&fake), expected);
    // A failed poll rebuilds nothing.
    fake.advance_ms(llmroute_core::status::POLL_INTERVAL_MS + 1);
    poller.on_tick(&fake.envoy());
    let token = fake.callouts().last().unwrap().token;
    fake.set_map(MapType::HttpCallResponseHeaders, &[(":status", "503")]);
    poller.on_response(&fake.envoy(), token, 0);
    assert_eq!(in_flight(&fake), expected);
    drop(pins);
}
