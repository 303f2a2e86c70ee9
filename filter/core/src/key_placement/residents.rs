//! Resident and cold keys (`affinity.resident_keys: per_slot`): placement for engines whose every slot caches
//! only the prompt it last served (llama.cpp `-np N -cram 0`), when there may be more prompt families than slots.
//!
//! The live-key bound alone spreads keys evenly: 12 families on 3 servers of 2 slots are 4, 4 and 4, so each
//! server keeps evicting. With this option the fleet's cache is counted in keys instead:
//!
//! - **Capacity.** One resident place per slot of the up hosts (a host's weight: config `slots`, else its
//!   `/props` `total_slots`), less one slot kept back for the cold keys ([`capacity`]).
//! - **A new key** takes a resident place while one is free ([`place`]), on the up host with the most places
//!   left (ties in the key's rendezvous order), so residents fill the slots evenly. Once the places are taken it
//!   is *cold*.
//! - **Cold keys are concentrated** on one host, [`cold_host`]: the up host with the most slots left over after
//!   its residents, which is the one holding the slot kept back (ties: the smaller host id, so every cold key
//!   picks the same). A cold key follows that host when it changes, which happens only when residents come or
//!   go. The other hosts serve their residents alone, and their slots stay warm.
//! - **Class changes are bounded.** A resident stays resident until it idles out, is forgotten, or its host goes
//!   down; it is never demoted for another key. A cold key becomes resident ([`promotion`]) only when it is
//!   established (seen twice) and a place is free, on its own host when that host has a place, so it does not
//!   move. While every host stays up and no key is forgotten, the residents only grow, to at most [`capacity`],
//!   so there are at most that many class changes in all.
//!
//! Why not the "hottest" keys by request rate: with tenants of equal traffic, the rate seen so far is noise,
//! and every swap between classes costs a cold prefill on the swapped key; first come, kept while it keeps
//! coming back, was the better rule on the routing bench (docs/placement.md). Everything here is a pure
//! function of the table and the hosts' view, so replicas with the same table decide alike; its cost is one
//! pass over the table per new or cold key, as the live-key bound already makes.

use std::cmp::Reverse;

use super::{HostView, KeyTable};

/// Resident places the fleet offers: one per slot of the up hosts, less one kept for the cold keys (none kept
/// when the up hosts have a single slot between them).
pub fn capacity(hosts: &[HostView]) -> u64 {
    let slots: u64 = hosts.iter().filter(|h| h.up).map(|h| u64::from(h.weight.max(1))).sum();
    slots.saturating_sub(u64::from(slots > 1))
}

/// Resident keys per host, in `hosts` order.
pub fn resident_counts(table: &KeyTable, hosts: &[HostView]) -> Vec<u64> {
    let ids: Vec<u32> = hosts.iter().map(HostView::id).collect();
    table.resident_counts(&ids)
}

/// Resident keys on up hosts: what [`capacity`] bounds.
pub fn residents_up(hosts: &[HostView], counts: &[u64]) -> u64 {
    hosts.iter().zip(counts).filter(|(h, _)| h.up).map(|(_, c)| *c).sum()
}

/// Slots of host `i` not held by a resident; 0 for a down or unknown host.
fn room(hosts: &[HostView], counts: &[u64], i: usize) -> u64 {
    match hosts.get(i) {
        Some(h) if h.up => u64::from(h.weight.max(1)).saturating_sub(counts.get(i).copied().unwrap_or(0)),
        _ => 0,
    }
}

/// True when a resident place is free.
fn place_free(hosts: &[HostView], counts: &[u64]) -> bool {
    residents_up(hosts, counts) < capacity(hosts)
}

/// The up host, among `order`, with the most room; ties go to the earlier one in `order`.
fn roomiest(hosts: &[HostView], counts: &[u64], order: &[usize]) -> Option<usize> {
    order
        .iter()
        .enumerate()
        .filter(|(_, &i)| hosts.get(i).is_some_and(|h| h.up))
        .max_by_key(|(rank, &i)| (room(hosts, counts, i), Reverse(*rank)))
        .map(|(_, &i)| i)
}

/// The host every cold key goes to: the up host with the most slots left over after its residents; ties go to
/// the smaller host id, so the choice does not depend on the key. `None` when no host is up.
pub fn cold_host(hosts: &[HostView], counts: &[u64]) -> Option<usize> {
    hosts
        .iter()
        .enumerate()
        .filter(|(_, h)| h.up)
        .max_by_key(|(i, h)| (room(hosts, counts, *i), Reverse(h.id())))
        .map(|(i, _)| i)
}

/// Where a key placed afresh goes (its `order` is its rendezvous order), and whether it is resident: a resident
/// place on the roomiest up host while one is free, else the [`cold_host`]. `None` when no host is up.
pub fn place(table: &KeyTable, hosts: &[HostView], order: &[usize]) -> Option<(usize, bool)> {
    let counts = resident_counts(table, hosts);
    if place_free(hosts, &counts) {
        return roomiest(hosts, &counts, order).map(|i| (i, true));
    }
    cold_host(hosts, &counts).map(|i| (i, false))
}

/// Where an established cold key now on host `current` becomes resident, if a place is free: `current` itself
/// when it is up with a slot to spare (the key does not move), else the roomiest up host in `order`. `None`: it
/// stays cold.
pub fn promotion(table: &KeyTable, hosts: &[HostView], current: usize, order: &[usize]) -> Option<usize> {
    let counts = resident_counts(table, hosts);
    if !place_free(hosts, &counts) {
        return None;
    }
    if room(hosts, &counts, current) > 0 {
        return Some(current);
    }
    roomiest(hosts, &counts, order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(weights: &[u32]) -> Vec<HostView> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| HostView {
                address: format!("10.0.0.{}:8080", i + 1),
                up: true,
                weight,
                in_flight: 0,
            })
            .collect()
    }

    #[test]
    fn capacity_keeps_one_slot_back() {
        assert_eq!(capacity(&hosts(&[2, 2, 2])), 5);
        assert_eq!(capacity(&hosts(&[1])), 1);
        let mut h = hosts(&[4, 2]);
        assert_eq!(capacity(&h), 5);
        h[0].up = false;
        assert_eq!(capacity(&h), 1);
    }

    #[test]
    fn room_is_zero_on_a_down_host_and_never_negative() {
        let mut h = hosts(&[2, 2]);
        assert_eq!(room(&h, &[3, 0], 0), 0);
        assert_eq!(room(&h, &[1, 0], 0), 1);
        h[1].up = false;
        assert_eq!(room(&h, &[0, 0], 1), 0);
        assert_eq!(room(&h, &[0, 0], 7), 0);
    }
}
