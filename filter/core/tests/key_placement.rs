//! Bounded-keys placement: stickiness, the key bound, determinism, expiry, moves and spills.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::config::BoundedKeys;
use llmroute_core::key_placement::in_flight::{Ledger, SharedStore, CAS_ATTEMPTS};
use llmroute_core::key_placement::table::established_cap;
use llmroute_core::key_placement::table::{
    decode_down_hosts, decode_host_counts, encode_down_hosts, encode_host_counts,
};
use llmroute_core::key_placement::{
    bound, choose, host_id, host_weight, key_bound, live_keys, rendezvous_order, session_header_value, weights_at,
    Bounds, HostView, KeyTable, PlacementReason, MAX_SLOTS, TOUCH_GRANULARITY_MS,
};
use proptest::prelude::*;

mod common;

use common::{bounds, hosts, PLACEMENT_TTL as TTL};

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
    let second = choose(&mut t, &h, 7, 1200, &b).unwrap();
    assert_eq!((second.host, second.reason), (first.host, PlacementReason::Pinned));
    assert!(second.table_changed, "the second sighting establishes the key");
    assert!(t.get(7).unwrap().established);
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
    let (a, b) = bytes[1..].split_at_mut(21);
    a.swap_with_slice(b);
    assert!(KeyTable::decode(&bytes).is_empty());
    // The flag byte holds two bits, established and shared; any other bit is refused.
    t.promote(5, 2, 10);
    t.mark_shared(3);
    let flags = t.encode();
    assert_eq!((flags[21], flags[42]), (2, 1), "key 3 shared, key 5 established");
    assert_eq!(KeyTable::decode(&flags), t);
    let mut odd = t.encode();
    odd[21] = 4;
    assert!(KeyTable::decode(&odd).is_empty());
    // A table of the encoding before the shared flag (version 3) starts afresh.
    let mut old = t.encode();
    old[0] = 3;
    assert!(KeyTable::decode(&old).is_empty());
    assert_eq!(decode_host_counts(&encode_host_counts(&[3, 0, 7]), 3), vec![3, 0, 7]);
    assert_eq!(decode_host_counts(&[1, 2, 3], 3), vec![0, 0, 0]);
    assert_eq!(decode_host_counts(&encode_host_counts(&[1, 2]), 3), vec![0, 0, 0]);
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
    assert_eq!(decode_down_hosts(&encode_down_hosts(1234, &down)), Some((1234, down)));
    assert_eq!(decode_down_hosts(&encode_down_hosts(7, &[])), Some((7, vec![])));
    assert_eq!(decode_down_hosts(b""), None);
    assert_eq!(decode_down_hosts(b"soon\n127.0.0.1:1"), None);
    assert_eq!(decode_down_hosts(&[0xff, b'\n']), None);
}

#[test]
fn bounds_come_from_the_config() {
    let b = Bounds::new(&BoundedKeys::default(), 175);
    assert_eq!(
        (b.key_factor, b.in_flight_factor, b.idle_ttl_ms, b.max_keys),
        (125, 175, 300_000, 4096)
    );
}

#[test]
fn a_flood_of_one_off_keys_leaves_established_tenants_in_place() {
    let h = hosts(3);
    let b = Bounds {
        max_keys: 16,
        ..bounds(125)
    };
    let mut t = KeyTable::default();
    let tenants: Vec<u64> = (1..=6).map(|i: u64| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
    let mut home = Vec::new();
    for (n, k) in tenants.iter().enumerate() {
        home.push(host_of(&mut t, &h, *k, 1000 + n as u64, &b).0);
    }
    for (n, k) in tenants.iter().enumerate() {
        assert_eq!(
            host_of(&mut t, &h, *k, 2000 + n as u64, &b),
            (home[n], PlacementReason::Pinned)
        );
    }
    assert_eq!(t.established(), 6);
    // Ten thousand random session ids, each seen once, each newer than every tenant.
    let mut rng = 0x1234_5678_u64;
    for n in 0..10_000u64 {
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let c = choose(&mut t, &h, rng, 3000 + n, &b).unwrap();
        assert_eq!(c.reason, PlacementReason::Placed);
        assert!(t.len() <= 16);
    }
    for (n, k) in tenants.iter().enumerate() {
        assert_eq!(
            host_of(&mut t, &h, *k, 20_000, &b),
            (home[n], PlacementReason::Pinned),
            "tenant {n} lost its host to the flood"
        );
    }
}

#[test]
fn established_keys_keep_room_for_probation() {
    assert_eq!(established_cap(16), 13);
    assert_eq!(established_cap(4096), 4096 - 819);
    assert_eq!(established_cap(1), 0);
    let mut t = KeyTable::default();
    // Twenty keys, each seen twice: only 13 stay established, the rest are demoted, and the table holds 16.
    for k in 0..20u64 {
        t.insert(k, 0, k * 10, 16);
        assert!(t.promote(k, k * 10 + 1, 16));
        assert!(t.established() <= 13 && t.len() <= 16);
    }
    assert_eq!(t.established(), 13);
    // The 13 established are the most recently promoted ones.
    let est: Vec<u64> = t.entries().iter().filter(|e| e.established).map(|e| e.key).collect();
    assert_eq!(est, (7..20).collect::<Vec<_>>());
    // A key seen once displaces only a key on probation.
    t.insert(100, 0, 10_000, 16);
    assert_eq!(t.established(), 13);
    assert!(t.get(100).is_some());
}

#[test]
fn slots_are_capped_wherever_they_weigh() {
    assert_eq!(MAX_SLOTS, 256);
    assert_eq!(host_weight(Some(4), 0, 9), 4);
    assert_eq!(host_weight(None, 0, 4), 4);
    assert_eq!(host_weight(None, 0, 0), 1);
    assert_eq!(host_weight(None, 0, u32::MAX), MAX_SLOTS);
    assert_eq!(host_weight(Some(u32::MAX), 0, 0), MAX_SLOTS);
    // A server that reports u32::MAX slots next to two of 4 takes at most 256/264 of new keys, not all of them.
    let mut h = hosts(3);
    for (x, w) in h.iter_mut().zip([host_weight(None, 0, u32::MAX), 4, 4]) {
        x.weight = w;
    }
    let mut t = KeyTable::default();
    for key in 0..2640u64 {
        choose(&mut t, &h, key.wrapping_mul(0x9e37_79b9_7f4a_7c15), 1000, &bounds(100)).unwrap();
    }
    let counts = live_keys(&t, &h);
    assert!(counts[1] >= 35 && counts[2] >= 35, "{counts:?}");
}

#[test]
fn weights_come_from_config_then_registration_then_props_then_one() {
    // Config `slots` win over everything.
    assert_eq!(host_weight(Some(2), 6, 4), 2);
    // A discovered host's Envoy weight (the registration's `slots`) wins over what `/props` reported.
    assert_eq!(host_weight(None, 6, 4), 6);
    // Weight 1 is every unweighted host's: it reads as unset, and `/props` decides.
    assert_eq!(host_weight(None, 1, 4), 4);
    assert_eq!(host_weight(None, 0, 4), 4);
    assert_eq!(host_weight(None, 1, 0), 1);
    assert_eq!(host_weight(None, 1000, 0), MAX_SLOTS);
    let addrs: Vec<String> = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"].map(String::from).to_vec();
    let listed = [("10.0.0.3:80".to_string(), 6), ("10.0.0.9:80".to_string(), 8)];
    assert_eq!(weights_at(&addrs, &listed), [0, 0, 6]);
}

/// Shared data whose compare-and-swap fails while `mismatches` lasts (as when other workers keep writing the
/// entry between each read and write), then behaves.
#[derive(Default)]
struct RacyStore {
    value: Vec<u8>,
    version: u32,
    mismatches: usize,
    writes: usize,
}

impl SharedStore for RacyStore {
    fn get(&self, _key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        (Some(self.value.clone()), Some(self.version))
    }

    fn set(&mut self, _key: &str, value: &[u8], cas: Option<u32>) -> bool {
        if self.mismatches > 0 {
            self.mismatches -= 1;
            return false;
        }
        if cas.is_some_and(|c| c != self.version) {
            return false;
        }
        self.value = value.to_vec();
        self.version += 1;
        self.writes += 1;
        true
    }
}

#[test]
fn a_decrement_that_loses_every_race_is_owed_not_dropped() {
    let key = "llmroute.inflight.a";
    let mut store = RacyStore {
        value: encode_host_counts(&[0, 0, 0]),
        ..RacyStore::default()
    };
    let mut ledger = Ledger::default();
    assert!(ledger.adjust(&mut store, key, 3, 1, true));
    assert!(ledger.adjust(&mut store, key, 3, 1, true));
    assert_eq!(decode_host_counts(&store.value, 3), vec![0, 2, 0]);
    // Both requests end while other workers win every race, for longer than one call's tries.
    store.mismatches = CAS_ATTEMPTS * 3;
    assert!(!ledger.adjust(&mut store, key, 3, 1, false));
    assert!(!ledger.adjust(&mut store, key, 3, 1, false));
    assert_eq!(ledger.owed(key), Some(&[0, -2, 0][..]));
    assert_eq!(
        decode_host_counts(&store.value, 3),
        vec![0, 2, 0],
        "nothing was written yet"
    );
    assert!(!ledger.settle(&mut store), "still racing");
    // The races stop: the next tick writes the whole debt in one swap, and the host is idle again.
    assert!(ledger.settle(&mut store));
    assert!(ledger.is_settled());
    assert_eq!(decode_host_counts(&store.value, 3), vec![0, 0, 0]);
    // Settling again writes nothing twice.
    let writes = store.writes;
    assert!(ledger.settle(&mut store));
    assert_eq!(store.writes, writes);
}

#[test]
fn owed_updates_ride_along_with_the_next_one() {
    let key = "k";
    let mut store = RacyStore {
        value: encode_host_counts(&[5, 5]),
        mismatches: CAS_ATTEMPTS,
        ..RacyStore::default()
    };
    let mut ledger = Ledger::default();
    assert!(!ledger.adjust(&mut store, key, 2, 0, false));
    // The next request's increment on the other host carries the owed decrement with it.
    assert!(ledger.adjust(&mut store, key, 2, 1, true));
    assert_eq!(decode_host_counts(&store.value, 2), vec![4, 6]);
    assert!(ledger.is_settled());
    // Counts saturate at zero; an index past the hosts changes nothing.
    store.value = encode_host_counts(&[0, 0]);
    assert!(ledger.adjust(&mut store, key, 2, 0, false));
    assert!(ledger.adjust(&mut store, key, 2, 7, false));
    assert_eq!(decode_host_counts(&store.value, 2), vec![0, 0]);
}

proptest! {
    #[test]
    fn in_flight_counts_return_to_zero_whatever_the_races(
        ops in prop::collection::vec((0usize..3, 0usize..(CAS_ATTEMPTS * 2)), 1..60),
    ) {
        // Every request raises then lowers its host, each update facing some run of lost races; once the races
        // stop and the tick settles, every count is back to zero.
        let key = "k";
        let mut store = RacyStore { value: encode_host_counts(&[0, 0, 0]), ..RacyStore::default() };
        let mut ledger = Ledger::default();
        for &(host, races) in &ops {
            store.mismatches = races;
            ledger.adjust(&mut store, key, 3, host, true);
        }
        for &(host, races) in ops.iter().rev() {
            store.mismatches = races;
            ledger.adjust(&mut store, key, 3, host, false);
        }
        store.mismatches = 0;
        prop_assert!(ledger.settle(&mut store));
        prop_assert_eq!(decode_host_counts(&store.value, 3), vec![0, 0, 0]);
    }
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
        // When the table last wrote each key's time, and whether the key is established: the table writes the time
        // when it places or promotes a key, and otherwise only once it has moved by TOUCH_GRANULARITY_MS, so a key
        // expires TTL after that write, not after its latest request.
        let mut written: std::collections::HashMap<u64, (u64, bool)> = std::collections::HashMap::new();
        let mut now = 0;
        for (key, step) in reqs {
            now += step;
            let c = choose(&mut t, &h, key, now, &b).unwrap();
            match written.get(&key).copied().filter(|&(at, _)| now - at < TTL) {
                None => {
                    prop_assert_eq!(c.reason, PlacementReason::Placed);
                    home.insert(key, c.host);
                    written.insert(key, (now, false));
                }
                Some((at, established)) => {
                    prop_assert_eq!(c.reason, PlacementReason::Pinned);
                    prop_assert_eq!(Some(&c.host), home.get(&key));
                    if !established || now - at >= TOUCH_GRANULARITY_MS {
                        written.insert(key, (now, true));
                    }
                }
            }
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
        prop_assert_eq!(decode_host_counts(&bytes, hosts_n).len(), hosts_n);
    }

    #[test]
    fn one_off_keys_never_evict_a_key_seen_repeatedly(
        max_keys in 16usize..64,
        repeated in prop::collection::btree_set(0u64..1_000, 1..8),
        flood in prop::collection::vec(1_000u64..u64::MAX, 1..600),
        every in 1usize..50,
    ) {
        // Tenants (seen twice, then again now and then) among a flood of distinct one-off keys, all well inside
        // the TTL. No tenant may ever leave the table or change host.
        let h = hosts(3);
        let b = Bounds { max_keys, ..bounds(125) };
        let mut t = KeyTable::default();
        let mut now = 1_000;
        let mut home = std::collections::HashMap::new();
        for _ in 0..2 {
            for &k in &repeated {
                now += 1;
                let c = choose(&mut t, &h, k, now, &b).unwrap();
                prop_assert_eq!(*home.entry(k).or_insert(c.host), c.host);
            }
        }
        let tenants: Vec<u64> = repeated.iter().copied().collect();
        for (n, &key) in flood.iter().enumerate() {
            now += 1;
            choose(&mut t, &h, key, now, &b).unwrap();
            prop_assert!(t.len() <= max_keys);
            for &k in &tenants {
                prop_assert!(t.get(k).is_some_and(|e| e.established), "tenant {} evicted after {} one-off keys", k, n + 1);
            }
            if n % every == 0 {
                let k = tenants[n % tenants.len()];
                let c = choose(&mut t, &h, k, now, &b).unwrap();
                prop_assert_eq!(c.reason, PlacementReason::Pinned);
                prop_assert_eq!(Some(&c.host), home.get(&k));
            }
        }
    }
}
