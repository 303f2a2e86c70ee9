//! The hosts placement sees (`key_placement::views`), from the values the filter keeps in shared data: addresses
//! of fixed and discovered backends, stale and fresh down lists, in-flight counts, configured and reported slots.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::cell::RefCell;
use std::collections::HashMap;

use llmroute_core::envoy_contract::shared;
use llmroute_core::fleet_check::encode_reported_slots;
use llmroute_core::key_placement::in_flight::SharedStore;
use llmroute_core::key_placement::table::{encode_down_hosts, encode_host_counts};
use llmroute_core::key_placement::{views, HostView};
use llmroute_core::status::STALE_AFTER_MS;
use llmroute_core::Config;

/// Shared data in a map, which remembers every key read.
#[derive(Default)]
struct Store {
    values: HashMap<String, Vec<u8>>,
    read: RefCell<Vec<String>>,
}

impl Store {
    fn with(mut self, key: String, value: Vec<u8>) -> Store {
        self.values.insert(key, value);
        self
    }
}

impl SharedStore for Store {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.read.borrow_mut().push(key.to_string());
        (self.values.get(key).cloned(), Some(1))
    }
    fn set(&mut self, _: &str, _: &[u8], _: Option<u32>) -> bool {
        unreachable!("views only reads")
    }
}

const NOW: u64 = 1_000_000;

fn cfg(backend: &str) -> Config {
    common::config(&format!(
        r#"{{ "version": 1, "backends": [{backend}],
            "models": [{{ "name": "m", "routes": [{{ "backend": "b", "upstream_model": "x" }}] }}],
            "affinity": {{ "placement": "bounded_keys" }} }}"#
    ))
}

fn fixed(extra: &str) -> Config {
    cfg(&format!(
        r#"{{ "name": "b", "kind": "llamacpp", "endpoints": ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]{extra} }}"#
    ))
}

fn discovered() -> Config {
    cfg(r#"{ "name": "b", "kind": "llamacpp", "discovery": {} }"#)
}

fn summary(v: &[HostView]) -> Vec<(&str, bool, u32, u32)> {
    v.iter()
        .map(|h| (h.address.as_str(), h.up, h.weight, h.in_flight))
        .collect()
}

#[test]
fn a_fixed_backend_with_nothing_stored_is_every_endpoint_up_weight_one() {
    let c = fixed("");
    let store = Store::default();
    let v = views(&c.backends[0], NOW, &store).unwrap();
    assert_eq!(
        summary(&v),
        vec![
            ("10.0.0.1:80", true, 1, 0),
            ("10.0.0.2:80", true, 1, 0),
            ("10.0.0.3:80", true, 1, 0)
        ]
    );
    // A fixed backend never reads the discovered host list.
    assert_eq!(
        *store.read.borrow(),
        vec![shared::down("b"), shared::in_flight("b"), shared::slots("b")]
    );
}

#[test]
fn a_fresh_down_list_marks_hosts_down_and_a_stale_one_is_ignored() {
    let c = fixed("");
    let down = vec!["10.0.0.2:80".to_string()];
    let fresh = Store::default().with(shared::down("b"), encode_down_hosts(NOW - STALE_AFTER_MS, &down));
    let v = views(&c.backends[0], NOW, &fresh).unwrap();
    assert_eq!(v.iter().map(|h| h.up).collect::<Vec<_>>(), vec![true, false, true]);
    let stale = Store::default().with(shared::down("b"), encode_down_hosts(NOW - STALE_AFTER_MS - 1, &down));
    let v = views(&c.backends[0], NOW, &stale).unwrap();
    assert!(v.iter().all(|h| h.up));
}

#[test]
fn in_flight_counts_are_read_by_position_and_a_ragged_list_reads_as_zeros() {
    let c = fixed("");
    let store = Store::default().with(shared::in_flight("b"), encode_host_counts(&[4, 0, 7]));
    let v = views(&c.backends[0], NOW, &store).unwrap();
    assert_eq!(v.iter().map(|h| h.in_flight).collect::<Vec<_>>(), vec![4, 0, 7]);
    let ragged = Store::default().with(shared::in_flight("b"), encode_host_counts(&[4, 0]));
    let v = views(&c.backends[0], NOW, &ragged).unwrap();
    assert!(v.iter().all(|h| h.in_flight == 0));
}

#[test]
fn configured_slots_win_over_reported_ones_which_win_over_one() {
    let configured = fixed(r#", "slots": [2, 2, 4]"#);
    let store = Store::default().with(shared::slots("b"), encode_host_counts(&[9, 9, 9]));
    let v = views(&configured.backends[0], NOW, &store).unwrap();
    assert_eq!(v.iter().map(|h| h.weight).collect::<Vec<_>>(), vec![2, 2, 4]);
    assert!(
        !store.read.borrow().contains(&shared::slots("b")),
        "configured slots need no read"
    );

    let reported = fixed("");
    let store = Store::default().with(shared::slots("b"), encode_host_counts(&[3, 0, 100_000]));
    let v = views(&reported.backends[0], NOW, &store).unwrap();
    assert_eq!(v.iter().map(|h| h.weight).collect::<Vec<_>>(), vec![3, 1, 256]);
}

#[test]
fn a_discovered_backend_places_on_the_fresh_polled_list_weighed_by_address() {
    let c = discovered();
    let hosts = vec!["10.1.0.1:80".to_string(), "10.1.0.2:80".to_string()];
    let store = Store::default()
        .with(shared::hosts("b"), encode_down_hosts(NOW - 10, &hosts))
        .with(
            shared::slots_by_address("b"),
            encode_reported_slots(&[("10.1.0.2:80".into(), 4)]),
        );
    let v = views(&c.backends[0], NOW, &store).unwrap();
    assert_eq!(
        summary(&v),
        vec![("10.1.0.1:80", true, 4, 0), ("10.1.0.2:80", true, 4, 0)],
        "a host the check did not read gets the figure most hosts reported"
    );
    // No list yet, an empty one, or a stale one: placement does not apply.
    assert_eq!(views(&c.backends[0], NOW, &Store::default()), None);
    let empty = Store::default().with(shared::hosts("b"), encode_down_hosts(NOW, &[]));
    assert_eq!(views(&c.backends[0], NOW, &empty), None);
    let stale = Store::default().with(shared::hosts("b"), encode_down_hosts(NOW - STALE_AFTER_MS - 1, &hosts));
    assert_eq!(views(&c.backends[0], NOW, &stale), None);
}

#[test]
fn placement_does_not_apply_to_dns_endpoints_or_other_policies() {
    let dns = cfg(r#"{ "name": "b", "kind": "vllm", "endpoints": ["engine.local:80"] }"#);
    assert_eq!(views(&dns.backends[0], NOW, &Store::default()), None);
    let rr = cfg(r#"{ "name": "b", "kind": "vllm", "lb": "round_robin", "endpoints": ["10.0.0.1:80"] }"#);
    let store = Store::default();
    assert_eq!(views(&rr.backends[0], NOW, &store), None);
    assert!(
        store.read.borrow().is_empty(),
        "nothing is read for a backend placement skips"
    );
}

fn reading(queued: u32, at_ms: u64) -> llmroute_core::load::EngineLoad {
    llmroute_core::load::EngineLoad {
        running: 1,
        queued,
        kv_permille: None,
        at_ms,
    }
}

#[test]
fn with_load_the_fresh_readings_queues_are_read_by_address_and_a_stale_one_reads_as_none() {
    let c = fixed(r#", "load": { "poll_ms": 100, "spill_queue": 2 }"#);
    let readings = vec![
        ("10.0.0.1:80".to_string(), reading(4, NOW - 300)),
        ("10.0.0.3:80".to_string(), reading(9, NOW - 301)),
        ("10.9.9.9:80".to_string(), reading(7, NOW)),
    ];
    let store = Store::default().with(shared::load("b"), llmroute_core::load::encode(&readings));
    let v = views(&c.backends[0], NOW, &store).unwrap();
    assert_eq!(
        v.iter().map(|h| h.queued).collect::<Vec<_>>(),
        vec![Some(4), None, None],
        "3 polls old is fresh, a moment more is stale; no reading, none"
    );
    assert!(store.read.borrow().contains(&shared::load("b")));
}

#[test]
fn without_load_no_reading_is_read_and_no_host_is_queued() {
    let c = fixed("");
    let readings = vec![("10.0.0.1:80".to_string(), reading(4, NOW))];
    let store = Store::default().with(shared::load("b"), llmroute_core::load::encode(&readings));
    let v = views(&c.backends[0], NOW, &store).unwrap();
    assert!(v.iter().all(|h| h.queued.is_none()));
    assert!(
        !store.read.borrow().contains(&shared::load("b")),
        "one read fewer per request"
    );
}

#[test]
fn the_backends_spill_queue_reaches_the_bounds() {
    use llmroute_core::config::BoundedKeys;
    use llmroute_core::key_placement::{self, Bounds, KeyTable, PlacementReason};
    let c = fixed(r#", "load": { "poll_ms": 100, "spill_queue": 2 }"#);
    let b = Bounds::for_backend(&BoundedKeys::default(), &c.backends[0]);
    assert_eq!(b.spill_queue, Some(2));
    assert_eq!(
        Bounds::for_backend(&BoundedKeys::default(), &fixed("").backends[0]).spill_queue,
        None
    );
    // A known key's host reports 3 queued, over the bound: this request goes elsewhere, counted as queued.
    let mut t = KeyTable::default();
    let idle = Store::default();
    let hosts = views(&c.backends[0], NOW, &idle).unwrap();
    let home = key_placement::choose(&mut t, &hosts, 42, NOW, &b).unwrap().host;
    let readings = vec![(hosts[home].address.clone(), reading(3, NOW))];
    let busy = Store::default().with(shared::load("b"), llmroute_core::load::encode(&readings));
    let hosts = views(&c.backends[0], NOW, &busy).unwrap();
    let c2 = key_placement::choose(&mut t, &hosts, 42, NOW, &b).unwrap();
    assert_eq!(c2.reason, PlacementReason::Queued);
    assert_ne!(c2.host, home);
    assert_eq!(t.get(42).unwrap().host, hosts[home].id(), "the key stays");
}
