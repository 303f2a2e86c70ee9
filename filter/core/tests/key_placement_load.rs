//! Load-aware bounded-keys placement: queued hosts take no new keys while another has room, a known key's
//! request leaves a host whose queue is over the bound while the key stays, and without load readings placement
//! is what it was.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::key_placement::{
    choose, choose_stored, live_keys, rendezvous_order, Bounds, HostView, KeyTable, PlacementReason,
};
use proptest::prelude::*;

mod common;

use common::{bounds, hosts};

fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn load_bounds(spill_queue: u32) -> Bounds {
    Bounds {
        spill_queue: Some(spill_queue),
        ..bounds(100)
    }
}

fn queued(mut h: Vec<HostView>, q: &[Option<u32>]) -> Vec<HostView> {
    for (h, q) in h.iter_mut().zip(q) {
        h.queued = *q;
    }
    h
}

#[test]
fn a_queued_host_takes_no_new_key_and_the_shares_are_over_the_others() {
    let h = queued(hosts(3), &[Some(4), Some(0), Some(0)]);
    let mut t = KeyTable::default();
    for i in 0..6 {
        let c = choose(&mut t, &h, key(i), 1000, &load_bounds(8)).unwrap();
        assert_eq!(c.reason, PlacementReason::Placed);
        assert_ne!(c.host, 0, "key {i} went to the queued host");
    }
    assert_eq!(live_keys(&t, &h), vec![0, 3, 3]);
}

#[test]
fn a_host_idle_again_takes_keys_again() {
    let busy = queued(hosts(3), &[Some(4), Some(0), Some(0)]);
    let mut t = KeyTable::default();
    for i in 0..6 {
        choose(&mut t, &busy, key(i), 1000, &load_bounds(8));
    }
    let idle = queued(hosts(3), &[Some(0), Some(0), Some(0)]);
    let placed: Vec<usize> = (6..9)
        .map(|i| choose(&mut t, &idle, key(i), 1000, &load_bounds(8)).unwrap().host)
        .collect();
    assert_eq!(placed, vec![0, 0, 0], "the host with no keys takes the next new keys");
}

#[test]
fn every_host_queued_places_as_without_load() {
    let all = queued(hosts(3), &[Some(2), Some(5), Some(1)]);
    let (mut a, mut b) = (KeyTable::default(), KeyTable::default());
    for i in 0..12 {
        let with = choose(&mut a, &all, key(i), 1000, &load_bounds(100)).unwrap();
        let without = choose(&mut b, &hosts(3), key(i), 1000, &bounds(100)).unwrap();
        assert_eq!(with, without);
    }
}

#[test]
fn a_known_keys_request_leaves_a_host_over_the_queue_bound_and_the_key_stays() {
    let mut t = KeyTable::default();
    let k = key(1);
    let home = choose(&mut t, &hosts(3), k, 1000, &load_bounds(4)).unwrap().host;
    let order = rendezvous_order(k, &hosts(3));
    let mut q = vec![Some(0); 3];
    q[home] = Some(5);
    let h = queued(hosts(3), &q);
    let c = choose(&mut t, &h, k, 2000, &load_bounds(4)).unwrap();
    assert_eq!(c.reason, PlacementReason::Queued);
    assert_eq!(
        c.host,
        *order.iter().find(|&&i| i != home).unwrap(),
        "the next host in the key's order"
    );
    // At the bound it stays; and once the queue drains the key is served at home again.
    q[home] = Some(4);
    let c = choose(&mut t, &queued(hosts(3), &q), k, 3000, &load_bounds(4)).unwrap();
    assert_eq!((c.host, c.reason), (home, PlacementReason::Pinned));
}

#[test]
fn a_stale_or_missing_reading_counts_as_not_queued() {
    let mut t = KeyTable::default();
    let k = key(2);
    let home = choose(&mut t, &hosts(3), k, 1000, &load_bounds(0)).unwrap().host;
    let c = choose(&mut t, &queued(hosts(3), &[None, None, None]), k, 2000, &load_bounds(0)).unwrap();
    assert_eq!((c.host, c.reason), (home, PlacementReason::Pinned));
}

#[test]
fn the_stored_host_wins_over_the_load_view_for_a_new_key() {
    // Replicas sharing the store follow the host the store settled, whatever their own load view says.
    let h = queued(hosts(3), &[Some(9), Some(0), Some(0)]);
    let stored = h[0].id();
    let c = choose_stored(
        &mut KeyTable::default(),
        &h,
        key(3),
        Some(stored),
        1000,
        &load_bounds(100),
    )
    .unwrap();
    assert_eq!((c.host, c.reason), (0, PlacementReason::Placed));
}

fn view() -> impl Strategy<Value = Vec<HostView>> {
    proptest::collection::vec((any::<bool>(), 1u32..4, 0u32..6, proptest::option::of(0u32..6)), 2..6).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (up, weight, in_flight, queued))| HostView {
                address: format!("10.0.0.{}:8000", i + 1),
                up,
                weight,
                in_flight,
                queued,
            })
            .collect()
    })
}

proptest! {
    /// A new key never lands on a queued host while an up host reports no queue.
    #[test]
    fn new_keys_avoid_queued_hosts(h in view(), keys in proptest::collection::vec(any::<u64>(), 1..40)) {
        let mut t = KeyTable::default();
        let any_idle = h.iter().any(|x| x.up && x.queued.unwrap_or(0) == 0);
        for k in keys {
            let known = t.get(k).is_some();
            if let Some(c) = choose(&mut t, &h, k, 1000, &load_bounds(100)) {
                if !known && c.reason == PlacementReason::Placed && any_idle {
                    let home = t.get(k).unwrap().host;
                    let home = h.iter().find(|x| x.id() == home).unwrap();
                    prop_assert_eq!(home.queued.unwrap_or(0), 0);
                }
            }
        }
    }

    /// Two replicas that see the same traffic and the same load views, in the same order, place alike.
    #[test]
    fn replicas_with_the_same_views_agree(
        views in proptest::collection::vec(view(), 1..4),
        keys in proptest::collection::vec(0u64..30, 1..60),
    ) {
        let (mut a, mut b) = (KeyTable::default(), KeyTable::default());
        let n = views[0].len();
        for (step, k) in keys.into_iter().enumerate() {
            let mut h = views[step % views.len()].clone();
            h.truncate(n);
            let now = 1000 + step as u64;
            prop_assert_eq!(choose(&mut a, &h, key(k), now, &load_bounds(2)), choose(&mut b, &h, key(k), now, &load_bounds(2)));
        }
        prop_assert_eq!(a, b);
    }

    /// With every host reporting an empty queue, placement is exactly what it is without load readings.
    #[test]
    fn empty_queues_change_nothing(h in view(), keys in proptest::collection::vec(0u64..30, 1..60)) {
        let zero: Vec<HostView> = h.iter().cloned().map(|mut x| { x.queued = Some(0); x }).collect();
        let none: Vec<HostView> = h.iter().cloned().map(|mut x| { x.queued = None; x }).collect();
        let (mut a, mut b) = (KeyTable::default(), KeyTable::default());
        for k in keys {
            prop_assert_eq!(choose(&mut a, &zero, key(k), 1000, &load_bounds(3)), choose(&mut b, &none, key(k), 1000, &bounds(100)));
        }
    }
}

fn in_flight(mut h: Vec<HostView>, n: &[u32]) -> Vec<HostView> {
    for (h, n) in h.iter_mut().zip(n) {
        h.in_flight = *n;
    }
    h
}

fn host_bound(max: u32) -> Bounds {
    Bounds {
        host_max_inflight: Some(max),
        in_flight_factor: 100_000,
        ..bounds(100)
    }
}

/// `host_max_inflight`: a host at its bound takes no new key while another has room (the shares are over the
/// others), a known key on it stays there (its request waits in the fair queue), and when every host is at its
/// bound keys are placed as without it.
#[test]
fn a_host_at_its_in_flight_bound_takes_no_new_key_and_its_keys_stay() {
    let full = in_flight(hosts(3), &[2, 0, 1]);
    let mut t = KeyTable::default();
    for i in 0..6 {
        let c = choose(&mut t, &full, key(i), 1000, &host_bound(2)).unwrap();
        assert_eq!(c.reason, PlacementReason::Placed);
        assert_ne!(c.host, 0, "key {i} went to the full host");
    }
    assert_eq!(live_keys(&t, &full), vec![0, 3, 3]);

    let mut t = KeyTable::default();
    let k = key(1);
    let home = choose(&mut t, &hosts(3), k, 1000, &host_bound(2)).unwrap().host;
    let mut n = vec![0; 3];
    n[home] = 9;
    let c = choose(&mut t, &in_flight(hosts(3), &n), k, 1001, &host_bound(2)).unwrap();
    assert_eq!((c.host, c.reason), (home, PlacementReason::Pinned));

    let all = in_flight(hosts(3), &[2, 3, 2]);
    let (mut a, mut b) = (KeyTable::default(), KeyTable::default());
    let without = Bounds {
        host_max_inflight: None,
        ..host_bound(2)
    };
    for i in 0..12 {
        assert_eq!(
            choose(&mut a, &all, key(i), 1000, &host_bound(2)),
            choose(&mut b, &all, key(i), 1000, &without)
        );
    }
}
