//! The placement policy's signals, one by one: what each holds back, and the order `bounded_keys` weighs them in.
//! The policy's decisions as a whole are tested through `choose` and `choose_stored` (`key_placement.rs`,
//! `key_placement_load.rs`).

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::key_placement::policy::{EngineQueue, Health, HostLimit, InFlight};
use llmroute_core::key_placement::{BoundedKeysPolicy, PlacementReason, Signal};

mod common;

use common::{bounds, hosts};

#[test]
fn bounded_keys_weighs_health_then_the_engine_queue_then_the_host_bound_then_requests_in_flight() {
    let policy = BoundedKeysPolicy::new(bounds(150));
    let names: Vec<&str> = policy.signals().iter().map(|s| s.name()).collect();
    assert_eq!(names, ["health", "engine_queue", "host_limit", "in_flight"]);
}

#[test]
fn a_host_at_its_bound_takes_no_key_and_holds_no_request_back() {
    let mut h = hosts(2);
    h[0].in_flight = 2;
    h[1].in_flight = 1;
    let limit = HostLimit { max: Some(2) };
    assert!(!limit.takes_keys(&h, 0));
    assert!(limit.takes_keys(&h, 1));
    assert_eq!(
        limit.holds_back(&h, 0),
        None,
        "a known key's request waits for its host in the fair queue"
    );
    assert!(HostLimit { max: None }.takes_keys(&h, 0));
}

#[test]
fn a_down_host_takes_no_key_and_serves_nothing() {
    let mut h = hosts(2);
    h[1].up = false;
    assert!(Health.takes_keys(&h, 0));
    assert!(!Health.takes_keys(&h, 1));
    assert_eq!(Health.holds_back(&h, 1), Some(PlacementReason::Moved));
    assert!(!Health.takes_keys(&h, 7), "a host index out of range is never taken");
}

#[test]
fn a_queued_engine_takes_no_key_and_past_its_bound_passes_requests_on() {
    let mut h = hosts(3);
    h[0].queued = Some(3);
    h[1].queued = Some(0);
    h[2].queued = None;
    let q = EngineQueue { spill: Some(2) };
    assert!(!q.takes_keys(&h, 0));
    assert!(q.takes_keys(&h, 1));
    assert!(q.takes_keys(&h, 2), "no fresh reading counts as not queued");
    assert_eq!(q.holds_back(&h, 0), Some(PlacementReason::Queued));
    assert_eq!(q.holds_back(&h, 1), None);
    let never = EngineQueue { spill: None };
    assert_eq!(
        never.holds_back(&h, 0),
        None,
        "without spill_queue, requests are never passed on"
    );
}

#[test]
fn requests_in_flight_pass_requests_on_but_never_keep_a_host_from_keys() {
    let mut h = hosts(2);
    h[0].in_flight = 10;
    let f = InFlight { factor: 125 };
    assert!(f.takes_keys(&h, 0));
    assert_eq!(f.holds_back(&h, 0), Some(PlacementReason::Spilled));
    assert_eq!(f.holds_back(&h, 1), None);
}
