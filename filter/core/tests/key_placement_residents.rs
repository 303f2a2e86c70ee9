//! Resident and cold keys (`affinity.resident_keys: per_slot`, `key_placement::residents`): residents never
//! exceed the slots, cold keys are concentrated, decisions are deterministic, class changes are bounded.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::config::ResidentKeys;
use llmroute_core::key_placement::residents::{capacity, cold_host, resident_counts, residents_up};
use llmroute_core::key_placement::store::proposal;
use llmroute_core::key_placement::{choose, live_keys, Bounds, HostView, KeyTable, PlacementReason};
use proptest::prelude::*;

mod common;

use common::PLACEMENT_TTL as TTL;

/// Hosts of these slot counts, all up and idle.
fn hosts(weights: &[u32]) -> Vec<HostView> {
    let mut h = common::hosts(weights.len());
    for (h, w) in h.iter_mut().zip(weights) {
        h.weight = *w;
    }
    h
}

fn per_slot() -> Bounds {
    Bounds {
        resident_keys: ResidentKeys::PerSlot,
        ..common::bounds(125)
    }
}

fn tenant(i: u64) -> u64 {
    (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

#[test]
fn twelve_tenants_on_six_slots_keep_five_residents_and_one_cold_host() {
    let h = hosts(&[2, 2, 2]);
    let b = per_slot();
    let mut t = KeyTable::default();
    let mut first = Vec::new();
    for i in 0..12 {
        let c = choose(&mut t, &h, tenant(i), 1000 + i, &b).unwrap();
        assert_eq!(c.reason, PlacementReason::Placed);
        first.push(c.host);
    }
    let residents = resident_counts(&t, &h);
    assert_eq!(residents.iter().sum::<u64>(), 5, "{residents:?}");
    let mut sorted = residents.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [1, 2, 2], "residents fill the slots evenly, one slot kept back");
    let cold = cold_host(&h, &residents).unwrap();
    assert_eq!(residents[cold], 1, "cold keys go to the host with the spare slot");
    for (i, host) in first.iter().enumerate().skip(5) {
        assert_eq!(*host, cold, "cold tenant {i} is concentrated");
    }
    // Four more rounds: every tenant stays where it was (no room frees up, so no class changes).
    for round in 1..5u64 {
        for i in 0..12 {
            let c = choose(&mut t, &h, tenant(i), 2000 * round + i, &b).unwrap();
            assert_eq!((c.host, c.reason), (first[i as usize], PlacementReason::Pinned));
        }
    }
    assert_eq!(live_keys(&t, &h).iter().sum::<u64>(), 12);
}

#[test]
fn six_tenants_on_six_slots_are_two_two_two() {
    let h = hosts(&[2, 2, 2]);
    let b = per_slot();
    let mut t = KeyTable::default();
    for i in 0..6 {
        choose(&mut t, &h, tenant(i), 1000, &b).unwrap();
    }
    assert_eq!(live_keys(&t, &h), [2, 2, 2]);
    assert_eq!(residents_up(&h, &resident_counts(&t, &h)), 5);
}

#[test]
fn an_established_cold_key_takes_a_freed_place_on_its_own_host() {
    let h = hosts(&[2, 2, 2]);
    let b = per_slot();
    let mut t = KeyTable::default();
    for i in 0..7 {
        choose(&mut t, &h, tenant(i), 1000, &b).unwrap();
    }
    let cold_key = tenant(6);
    assert!(!t.get(cold_key).unwrap().resident);
    let cold = t.get(cold_key).unwrap().host;
    // The resident sharing the cold host idles out while the cold key keeps coming.
    let neighbour = (0..5)
        .map(tenant)
        .find(|k| t.get(*k).unwrap().host == cold)
        .unwrap();
    let later = 1000 + TTL;
    for i in (0..7).map(tenant).filter(|k| *k != neighbour) {
        choose(&mut t, &h, i, later - 1, &b).unwrap();
    }
    let c = choose(&mut t, &h, cold_key, later + 10, &b).unwrap();
    assert!(t.get(neighbour).is_none(), "the idle resident was forgotten");
    assert_eq!(c.reason, PlacementReason::Pinned, "promoted in place, not moved");
    assert!(t.get(cold_key).unwrap().resident);
    assert_eq!(t.get(cold_key).unwrap().host, cold);
}

#[test]
fn a_freed_place_goes_to_the_next_cold_key_seen_again() {
    let h = hosts(&[1, 1]);
    let b = per_slot();
    let mut t = KeyTable::default();
    let one = choose(&mut t, &h, 1, 1000, &b).unwrap().host;
    let two = choose(&mut t, &h, 2, 1000, &b).unwrap().host;
    assert!(t.get(1).unwrap().resident && !t.get(2).unwrap().resident);
    assert_ne!(one, two, "the cold key goes to the host with the spare slot");
    // Seen again with no free place: established, still cold, still there.
    assert_eq!(choose(&mut t, &h, 2, 2000, &b).unwrap().host, two);
    assert!(t.get(2).unwrap().established && !t.get(2).unwrap().resident);
    // Key 1 idles out; key 2's next request takes the freed place, in place.
    let c = choose(&mut t, &h, 2, 1000 + TTL, &b).unwrap();
    assert!(t.get(1).is_none());
    assert_eq!((c.host, c.reason), (two, PlacementReason::Pinned));
    assert!(t.get(2).unwrap().resident);
    // A new key is now cold, on the other host (the one with the slot to spare).
    assert_eq!(choose(&mut t, &h, 3, 1000 + TTL, &b).unwrap().host, one);
    assert!(!t.get(3).unwrap().resident);
}

#[test]
fn off_places_as_before() {
    let h = hosts(&[2, 2, 2]);
    let mut t = KeyTable::default();
    for i in 0..12 {
        choose(&mut t, &h, tenant(i), 1000, &common::bounds(100)).unwrap();
    }
    assert_eq!(live_keys(&t, &h), [4, 4, 4]);
    assert!(t.entries().iter().all(|e| !e.resident));
}

#[test]
fn the_store_proposes_the_host_the_table_would_choose() {
    let h = hosts(&[2, 2, 2]);
    let b = per_slot();
    let mut t = KeyTable::default();
    for i in 0..20 {
        let proposed = proposal(&t, &h, tenant(i), 1000, &b);
        let chosen = choose(&mut t, &h, tenant(i), 1000, &b).map(|c| c.host);
        assert_eq!(proposed, chosen);
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// A request for key `0..keys`, after `advance` ms.
    Request { key: u64, advance: u64 },
    /// Host `i` goes down or comes back.
    Flip(usize),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            12 => (0u64..30, 0u64..4000).prop_map(|(key, advance)| Step::Request { key, advance }),
            1 => (0usize..4).prop_map(Step::Flip),
        ],
        1..200,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the traffic, the slots and the hosts' health: a host never holds more residents than its slots;
    /// a decision never raises the residents above the capacity; a resident on an up host never moves; and
    /// while every host stays up and nothing idles out, a key changes class at most once (cold to resident), and
    /// there are at most `capacity` such changes.
    #[test]
    fn residents_stay_within_the_slots_and_class_changes_are_bounded(
        weights in prop::collection::vec(1u32..4, 1..5),
        script in steps(),
        ttl_s in prop_oneof![Just(300u64), 1u64..10],
    ) {
        let mut h = hosts(&weights);
        let b = Bounds { idle_ttl_ms: ttl_s * 1000, ..per_slot() };
        let mut t = KeyTable::default();
        let mut replica = KeyTable::default();
        let mut now = 1000u64;
        let mut calm_changes = 0u64;
        let mut calm = true;
        for step in script {
            match step {
                Step::Flip(i) => {
                    if let Some(host) = h.get_mut(i) {
                        host.up = !host.up;
                        calm = false;
                    }
                }
                Step::Request { key, advance } => {
                    now += advance;
                    let before = t.clone();
                    let before_up = residents_up(&h, &resident_counts(&before, &h));
                    let c = choose(&mut t, &h, key, now, &b);
                    // Deterministic: a replica fed the same steps decides the same.
                    prop_assert_eq!(c, choose(&mut replica, &h, key, now, &b));
                    prop_assert_eq!(&t, &replica);
                    let Some(c) = c else {
                        prop_assert!(h.iter().all(|x| !x.up));
                        continue;
                    };
                    prop_assert!(h[c.host].up || h.iter().all(|x| !x.up));
                    let counts = resident_counts(&t, &h);
                    for (host, n) in h.iter().zip(&counts) {
                        prop_assert!(*n <= u64::from(host.weight), "{:?} {:?}", counts, weights);
                    }
                    let up = residents_up(&h, &counts);
                    prop_assert!(up <= capacity(&h).max(before_up), "{} > {}", up, capacity(&h));
                    let was = before.get(key);
                    let is = t.get(key).unwrap();
                    if let Some(was) = was.filter(|w| w.resident) {
                        let host_up = h.iter().any(|x| x.id() == was.host && x.up);
                        let expired = now.saturating_sub(was.last_ms) >= b.idle_ttl_ms;
                        if host_up && !expired {
                            prop_assert_eq!(is.host, was.host, "a resident never moves while its host is up");
                            prop_assert!(is.resident);
                        }
                    }
                    // Keys forgotten for idleness end the calm stretch too.
                    if before.entries().iter().any(|e| now.saturating_sub(e.last_ms) >= b.idle_ttl_ms) {
                        calm = false;
                    }
                    if calm {
                        for e in before.entries().iter().filter(|e| e.resident) {
                            prop_assert!(t.get(e.key).is_some_and(|x| x.resident), "no demotion while calm");
                        }
                        if was.is_some_and(|w| !w.resident) && is.resident {
                            calm_changes += 1;
                        }
                        prop_assert!(calm_changes <= capacity(&h));
                    }
                }
            }
        }
    }
}
