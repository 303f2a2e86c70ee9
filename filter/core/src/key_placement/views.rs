//! The hosts of one backend as bounded-keys placement sees them ([`HostView`]s): which addresses it places keys
//! on, which of them the status poll found down, their weights (config `slots`, else a discovered host's Envoy
//! weight, else `/props`), their requests in flight and, with `load`, their engines' fresh queues, all decoded
//! from the values the filter keeps in Envoy shared data (see `envoy_contract::shared`).
//!
//! The values are read through a [`SharedStore`], so only the ones this backend needs are read (each read is a
//! host call per request): the host list only for a discovered backend, reported slots only when the config
//! names none, load readings only when the backend polls them. Everything else is a pure function of those
//! values and the clock, tested natively. The load view is an input like the down hosts: replicas sharing a
//! placement store propose new keys from it, and etcd's commit order settles them (see [`super::store`]).
//!
//! A discovered backend's list changes as hosts join and leave. Keys follow addresses (the key table names a
//! host by the hash of its `IP:PORT`, and the rendezvous order depends only on the key and the addresses), so a
//! change moves only the keys of a removed host, and a new host takes new keys. The in-flight counts are kept
//! by position in the list; when its length changes they restart from zero, which only loosens the spill bound
//! for the requests already in flight, until the next status poll rebuilds them by address from Envoy's figures
//! (see [`super::in_flight`]).

use super::in_flight::SharedStore;
use super::{host_weight, table, weights_at, HostView};
use crate::config::{Backend, LbPolicy};
use crate::envoy_contract::shared;
use crate::fleet_check;
use crate::host_poll::{MAX_HOSTS, STALE_AFTER_MS};

/// The value stored under `key`, empty when absent.
fn read(store: &impl SharedStore, key: &str) -> Vec<u8> {
    store.get(key).0.unwrap_or_default()
}

/// The addresses placement works on: the configured endpoints, or for a discovered backend the hosts of the
/// latest fresh poll (sorted, so every worker indexes them alike). `None` when placement cannot apply: an
/// endpoint named by DNS (Envoy names such hosts by their resolved address), or no fresh host list yet.
pub fn addresses(backend: &Backend, now_ms: u64, store: &impl SharedStore) -> Option<Vec<String>> {
    if !backend.discovered() {
        if backend.endpoints.iter().any(|e| !e.is_ip) {
            return None;
        }
        return Some(backend.endpoints.iter().map(|e| e.to_string()).collect());
    }
    let (at, list) = table::decode_down_hosts(&read(store, &shared::hosts(&backend.name)))?;
    let fresh = now_ms.saturating_sub(at) <= STALE_AFTER_MS;
    (fresh && !list.is_empty() && list.len() < MAX_HOSTS).then_some(list)
}

/// The backend's hosts as the placement sees them at `now_ms`, or `None` when placement does not apply to it:
/// not `chwbl`, or no usable address list (see [`addresses`]). A down list older than
/// [`STALE_AFTER_MS`] is ignored (every host counts as up).
pub fn views(backend: &Backend, now_ms: u64, store: &impl SharedStore) -> Option<Vec<HostView>> {
    if backend.lb != LbPolicy::Chwbl {
        return None;
    }
    let addresses = addresses(backend, now_ms, store)?;
    let down = table::decode_down_hosts(&read(store, &shared::down(&backend.name)))
        .filter(|(at, _)| now_ms.saturating_sub(*at) <= STALE_AFTER_MS)
        .map(|(_, down)| down);
    let in_flight = table::decode_host_counts(&read(store, &shared::in_flight(&backend.name)), addresses.len());
    // Capacity: the config's `slots`, else a discovered host's Envoy weight (its registered `slots`), else what
    // each llama.cpp server reported in `/props` (by address for a discovered backend, whose list changes), else
    // all equal (see `host_weight`).
    let by_address = |key: String| fleet_check::decode_reported_slots(&read(store, &key));
    let (registered, reported) = match (&backend.slots, backend.discovered()) {
        (Some(_), _) => (Vec::new(), Vec::new()),
        (None, true) => (
            weights_at(&addresses, &by_address(shared::weights(&backend.name))),
            fleet_check::slots_at(&addresses, &by_address(shared::slots_by_address(&backend.name))),
        ),
        (None, false) => (
            Vec::new(),
            table::decode_host_counts(&read(store, &shared::slots(&backend.name)), backend.endpoints.len()),
        ),
    };
    // Engine load, when the backend polls it: the fresh readings' queues (a stale or missing one reads as none).
    let queued: Vec<Option<u32>> = match backend.load {
        Some(l) => {
            let readings = crate::load::decode(&read(store, &shared::load(&backend.name)));
            crate::load::fresh_at(&addresses, &readings, now_ms, l.poll_ms)
                .into_iter()
                .map(|r| r.map(|l| l.queued))
                .collect()
        }
        None => Vec::new(),
    };
    Some(
        addresses
            .into_iter()
            .enumerate()
            .map(|(i, address)| HostView {
                up: !down.as_ref().is_some_and(|d| d.contains(&address)),
                weight: host_weight(
                    backend.slots.as_ref().and_then(|s| s.get(i).copied()),
                    registered.get(i).copied().unwrap_or(0),
                    reported.get(i).copied().unwrap_or(0),
                ),
                in_flight: in_flight.get(i).copied().unwrap_or(0),
                queued: queued.get(i).copied().flatten(),
                address,
            })
            .collect(),
    )
}
