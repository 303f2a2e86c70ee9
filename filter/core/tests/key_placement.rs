//! Bounded-keys placement: stickiness, the key bound, determinism, expiry, moves and spills.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::config::BoundedKeys;
use llmroute_core::key_placement::table::{decode_down, decode_in_flight, encode_down, encode_in_flight};
use llmroute_core::key_placement::{
    bound, choose, host_id, key_bound, live_keys, rendezvous_order, session_header_value, Bounds, HostView, KeyTable,
    PlacementReason,
};
use proptest::prelude::*;

const TTL: u64 = 300_000;

fn hosts(n: usize) -> Vec<HostView> {
    (0..n)
        .map(|i| HostView {
            address: format!("127.0.0.1:{}", 8001 + i),
            up: true,
            weight: 1,
            in_flight: 0,
        })
        .collect()
}

fn bounds(key_factor: u32) -> Bounds {
    Bounds {
        key_factor,
        in_flight_factor: 150,
        idle_ttl_ms: TTL,
        max_keys: 4096,
    }
}

fn host_of(t: &mut KeyTable, h: &[HostView], key: u64, now: u64, b: &Bounds) -> (usize, PlacementReason) {
    let c = choose(t, h, key, now, b).unwrap();
    (c.host, c.reason)
}

#[test]
fn six_keys_on_three_hosts_get_two_each() {
    let h = hosts(3);
    let mut t = KeyTable::default();
    for key in 0..6u64 {
        let (_, reason) = host_of(&mut t, &h, key.wrapping_mul(0x9e37_79b9_7f4a_7c15), 1000, &bounds(100));
        assert_eq!(reason, PlacementReason::Placed);
    }
    assert_eq!(live_keys(&t, &h), vec![2, 2, 2]);
}

#[test]
fn twelve_keys_on_three_hosts_get_four_each() {
    let h = hosts(3);
    let mut t = KeyTable::default();
    for key in 100..112u64 {
        host_of(&mut t, &h, key, 1000, &bounds(100));
    }
    assert_eq!(live_keys(&t, &h), vec![4, 4, 4]);
}

#[test]
fn slots_weight_the_shares() {
    let mut h = hosts(3);
    h[2].weight = 2;
    let mut t = KeyTable::default();
    for key in 0..8u64 {
        host_of(&mut t, &h, key, 1000, &bounds(100));
    }
    assert_eq!(live_keys(&t, &h), vec![2, 2, 4]);
}

#[test]
fn a_known_key_is_pinned_and_touched_coarsely() {
    let h = hosts(3);
    let mut t = KeyTable::default();
    let b = bounds(100);
    let first = choose(&mut t, &h, 7, 1000, &b).unwrap();
    assert!(first.table_changed);
    let again = choose(&mut t, &h, 7, 1500, &b).unwrap();
    assert_eq!((again.host, again.reason), (first.host, PlacementReason::Pinned));
    assert!(!again.table_changed, "a touch within a second is not written");
    let later = choose(&mut t, &h, 7, 2500, &b).unwrap();
    assert!(later.table_changed);
    assert_eq!(t.get(7).unwrap().last_ms, 2500);
}

#[test]
fn a_key_on_a_down_host_moves_and_stays_moved() {
    let mut h = hosts(3);
    let mut t = KeyTable::default();
    let b = bounds(100);
    let (home, _) = host_of(&mut t, &h, 42, 1000, &b);
    h[home].up = false;
    let (moved, reason) = host_of(&mut t, &h, 42, 2000, &b);
    assert_eq!(reason, PlacementReason::Moved);
    assert_ne!(moved, home);
    h[home].up = true;
    assert_eq!(host_of(&mut t, &h, 42, 3000, &b), (moved, PlacementReason::Pinned));
}

#[test]
fn new_keys_avoid_down_hosts() {
    let mut h = hosts(3);
    h[1].up = false;
    let mut t = KeyTable::default();
    for key in 0..10u64 {
        let (host, _) = host_of(&mut t, &h, key, 1000, &bounds(100));
        assert_ne!(host, 1);
    }
    assert_eq!(live_keys(&t, &h), vec![5, 0, 5]);
}

#[test]
fn no_host_up_leaves_it_to_envoy() {
    let mut h = hosts(2);
    h[0].up = false;
    h[1].up = false;
    assert_eq!(choose(&mut KeyTable::default(), &h, 1, 1000, &bounds(100)), None);
}

#[test]
fn a_busy_host_spills_the_request_but_keeps_the_key() {
    let mut h = hosts(3);
    let mut t = KeyTable::default();
    let b = bounds(100);
    let (home, _) = host_of(&mut t, &h, 9, 1000, &b);
    // 4 in flight on the home host, none elsewhere: Envoy's rule gives it ceil(ceil(5 × 1.5) / 3) = 3 slots.
    h[home].in_flight = 4;
    let (spill, reason) = host_of(&mut t, &h, 9, 1100, &b);
    assert_eq!(reason, PlacementReason::Spilled);
    assert_ne!(spill, home);
    assert_eq!(spill, rendezvous_order(9, &h).into_iter().find(|&i| i != home).unwrap());
    assert_eq!(t.get(9).unwrap().host, h[home].id());
    h[home].in_flight = 0;
    assert_eq!(host_of(&mut t, &h, 9, 1200, &b), (home, PlacementReason::Pinned));
}

#[test]
fn every_host_over_its_bound_keeps_the_home() {
    let mut h = hosts(2);
    let mut t = KeyTable::default();
    let b = bounds(100);
    let (home, _) = host_of(&mut t, &h, 5, 1000, &b);
    h[home].in_flight = 10;
    h[1 - home].up = false;
    assert_eq!(host_of(&mut t, &h, 5, 1100, &b).0, home);
}

#[test]
fn idle_keys_expire_and_free_their_share() {
    let h = hosts(2);
    let mut t = KeyTable::default();
    let b = bounds(100);
    host_of(&mut t, &h, 1, 0, &b);
    host_of(&mut t, &h, 2, 0, &b);
    host_of(&mut t, &h, 3, TTL - 1, &b);
    assert_eq!(t.len(), 3);
    // At TTL, keys 1 and 2 (last seen at 0) are gone; key 3 stays.
    let (_, reason) = host_of(&mut t, &h, 1, TTL, &b);
    assert_eq!(reason, PlacementReason::Placed);
    assert_eq!(t.len(), 2);
    assert!(t.get(2).is_none() && t.get(3).is_some());
}

#[test]
fn max_keys_forgets_the_least_recently_seen() {
    let h = hosts(2);
    let mut t = KeyTable::default();
    let b = Bounds {
        max_keys: 3,
        ..bounds(100)
    };
    for (key, now) in [(10u64, 1000u64), (11, 5000), (12, 3000), (13, 9000)] {
        host_of(&mut t, &h, key, now, &b);
    }
    let kept: Vec<u64> = t.entries().iter().map(|e| e.key).collect();
    assert_eq!(kept, vec![11, 12, 13]);
}

#[test]
fn bound_is_envoys_slot_count() {
    // Envoy: slots = max(1, ceil(ceil((active + 1) × factor / 100) × weight / total weight)).
    assert_eq!(bound(100, 0, 1, 3), 1);
    assert_eq!(bound(100, 5, 1, 3), 2);
    assert_eq!(bound(100, 6, 1, 3), 3);
    assert_eq!(bound(125, 5, 1, 3), 3);
    assert_eq!(bound(150, 2, 1, 3), 2);
    assert_eq!(bound(150, 3, 1, 3), 2);
    assert_eq!(bound(175, 3, 1, 3), 3);
    assert_eq!(bound(100, 7, 2, 4), 4);
    assert_eq!(bound(100, 0, 1, 0), 1);
    assert_eq!(bound(1000, u64::MAX - 1, u32::MAX, 1), u64::MAX);
}

#[test]
fn key_bound_keeps_few_keys_even_and_gives_many_keys_room() {
    assert_eq!(key_bound(100, 5, 1, 3), 2);
    assert_eq!(key_bound(125, 5, 1, 3), 2);
    assert_eq!(key_bound(149, 5, 1, 3), 2);
    assert_eq!(key_bound(150, 5, 1, 3), 3);
    assert_eq!(key_bound(100, 0, 1, 3), 1);
    assert_eq!(key_bound(125, 1999, 1, 3), 667 + 166);
    assert_eq!(key_bound(100, 7, 2, 4), 4);
    assert_eq!(key_bound(1000, u64::MAX - 1, u32::MAX, 1), u64::MAX);
}

#[test]
fn rendezvous_order_is_pinned() {
    // Golden values: the order must not change between builds, targets or releases, or every replica
    // would reshuffle its keys on upgrade. The wasm build is checked against these same functions in the
    // Envoy harness test `placement::envoy_places_keys_as_the_core_predicts`.
    let h = hosts(4);
    assert_eq!(rendezvous_order(0, &h), vec![0, 3, 1, 2]);
    assert_eq!(rendezvous_order(0xdead_beef, &h), vec![1, 2, 0, 3]);
    assert_eq!(session_header_value("127.0.0.1:8001"), "MTI3LjAuMC4xOjgwMDE=");
}

#[test]
fn malformed_tables_decode_empty() {
    assert!(KeyTable::decode(&[]).is_empty());
    assert!(KeyTable::decode(&[2]).is_empty());
    assert!(KeyTable::decode(&[1, 0, 0]).is_empty());
    let mut t = KeyTable::default();
    t.insert(5, 0, 1, 10);
    t.insert(3, 1, 1, 10);
    let mut bytes = t.encode();
    assert_eq!(KeyTable::decode(&bytes), t);
    // Swap the two entries: unsorted input is refused.
    let (a, b) = bytes[1..].split_at_mut(20);
    a.swap_with_slice(b);
    assert!(KeyTable::decode(&bytes).is_empty());
    assert_eq!(decode_in_flight(&encode_in_flight(&[3, 0, 7]), 3), vec![3, 0, 7]);
    assert_eq!(decode_in_flight(&[1, 2, 3], 3), vec![0, 0, 0]);
    assert_eq!(decode_in_flight(&encode_in_flight(&[1, 2]), 3), vec![0, 0, 0]);
}

#[test]
fn keys_follow_addresses_when_endpoints_are_reordered_or_added() {
    let h = hosts(3);
    let mut t = KeyTable::default();
    let b = bounds(125);
    let homes: Vec<String> = (0..6u64)
        .map(|k| h[host_of(&mut t, &h, k, 1000, &b).0].address.clone())
        .collect();
    // The operator lists the endpoints in another order and adds a fourth: every key stays on its address.
    let mut moved = vec![h[2].clone(), h[0].clone(), h[1].clone()];
    moved.push(HostView {
        address: "127.0.0.1:9999".into(),
        ..h[0].clone()
    });
    for (k, home) in homes.iter().enumerate() {
        let (i, reason) = host_of(&mut t, &moved, k as u64, 2000, &b);
        assert_eq!((&moved[i].address, reason), (home, PlacementReason::Pinned));
    }
    assert_ne!(host_id("127.0.0.1:8001"), host_id("127.0.0.1:8002"));
}

#[test]
fn down_lists_round_trip_and_refuse_odd_bytes() {
    let down = vec!["127.0.0.1:8001".to_string(), "[::1]:8002".to_string()];
    assert_eq!(decode_down(&encode_down(1234, &down)), Some((1234, down)));
    assert_eq!(decode_down(&encode_down(7, &[])), Some((7, vec![])));
    assert_eq!(decode_down(b""), None);
    assert_eq!(decode_down(b"soon\n127.0.0.1:1"), None);
    assert_eq!(decode_down(&[0xff, b'\n']), None);
}

#[test]
fn bounds_come_from_the_config() {
    let b = Bounds::new(&BoundedKeys::default(), 175);
    assert_eq!(
        (b.key_factor, b.in_flight_factor, b.idle_ttl_ms, b.max_keys),
        (125, 175, 300_000, 4096)
    );
}

/// One request: a key (from a small family, so keys repeat) and the time step before it.
fn requests() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..40, 0u64..20_000), 1..200)
}

proptest! {
    #[test]
    fn keys_stay_on_their_host_while_it_is_up_and_not_busy(reqs in requests(), n in 1usize..6, factor in 100u32..300) {
        let h = hosts(n);
        let b = bounds(factor);
        let mut t = KeyTable::default();
        let mut home = std::collections::HashMap::new();
        let mut last_seen = std::collections::HashMap::new();
        let mut now = 0;
        for (key, step) in reqs {
            now += step;
            let c = choose(&mut t, &h, key, now, &b).unwrap();
            let fresh = last_seen.get(&key).is_none_or(|&l| now - l >= TTL);
            if fresh {
                prop_assert_eq!(c.reason, PlacementReason::Placed);
                home.insert(key, c.host);
            } else {
                prop_assert_eq!(c.reason, PlacementReason::Pinned);
                prop_assert_eq!(Some(&c.host), home.get(&key));
            }
            last_seen.insert(key, now);
        }
    }

    #[test]
    fn a_new_key_never_lands_over_the_bound(reqs in requests(), n in 1usize..6, factor in 100u32..300,
                                            weights in prop::collection::vec(1u32..5, 6)) {
        let mut h = hosts(n);
        for (host, w) in h.iter_mut().zip(&weights) {
            host.weight = *w;
        }
        let total_weight: u64 = h.iter().map(|x| u64::from(x.weight)).sum();
        let b = bounds(factor);
        let mut t = KeyTable::default();
        let mut now = 0;
        for (key, step) in reqs {
            now += step;
            t.expire(now, TTL);
            let before = live_keys(&t, &h);
            let total: u64 = before.iter().sum();
            let c = choose(&mut t, &h, key, now, &b).unwrap();
            if c.reason == PlacementReason::Placed {
                prop_assert!(before[c.host] < key_bound(factor, total, h[c.host].weight, total_weight));
            }
        }
    }

    #[test]
    fn with_factor_100_and_no_expiry_the_spread_is_within_one(keys in prop::collection::btree_set(any::<u64>(), 1..100), n in 1usize..8) {
        let h = hosts(n);
        let mut t = KeyTable::default();
        for key in keys {
            choose(&mut t, &h, key, 1000, &bounds(100)).unwrap();
        }
        let counts = live_keys(&t, &h);
        prop_assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1, "{:?}", counts);
    }

    #[test]
    fn two_replicas_with_the_same_traffic_agree(reqs in requests(), n in 1usize..6) {
        let h = hosts(n);
        let b = bounds(100);
        let (mut a, mut z) = (KeyTable::default(), KeyTable::default());
        let mut now = 0;
        for (key, step) in reqs {
            now += step;
            let ca = choose(&mut a, &h, key, now, &b);
            // The second replica keeps its table in shared data: it decodes what it encoded each time.
            let mut zz = KeyTable::decode(&z.encode());
            let cz = choose(&mut zz, &h, key, now, &b);
            z = zz;
            prop_assert_eq!(ca, cz);
        }
        prop_assert_eq!(a.encode(), z.encode());
    }

    #[test]
    fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200), hosts_n in 0usize..8) {
        let t = KeyTable::decode(&bytes);
        if !t.is_empty() {
            prop_assert_eq!(KeyTable::decode(&t.encode()), t);
        }
        prop_assert_eq!(decode_in_flight(&bytes, hosts_n).len(), hosts_n);
    }
}
