//! Bounded-keys placement, host side: reads the backend's key table, and through the core's
//! `key_placement::views` its in-flight counts, host health and weights, from Envoy shared data, asks the core
//! (`llmroute_core::key_placement::choose`) for a host, writes the table back
//! with compare-and-swap, and names the host in the stateful-session header that Envoy's
//! `envoy.filters.http.stateful_session` filter (added by `llmroute render`) turns into the upstream host.
//!
//! Hosts are weighed by the backend's `slots`; else, for a discovered host, by the weight Envoy gives it (the
//! `slots` it registered in etcd, read from the status poll); else by the `total_slots` each llama.cpp server last
//! reported to the `/props` check (see `fleet_check`); at most `MAX_SLOTS` (256) each.
//!
//! If Envoy finds the named host unhealthy it falls back to the backend's ring hash, and retries never reuse it,
//! so placement never overrides Envoy's view of health. The in-flight count of the chosen host is raised here
//! and lowered in the log phase, through this worker's ledger: an update that loses its compare-and-swap races is
//! kept and written by a later update or the next tick, never dropped. At each status poll the counts are rebuilt
//! from Envoy's own `rq_active` per host ([`rebuild_in_flight`]), so the requests of a worker whose VM trapped,
//! which nothing will release, stop counting at the next poll.

use llmroute_core::config::KeyPlacement;
use llmroute_core::envoy_contract::shared;
use llmroute_core::fleet_check;
use std::cell::RefCell;

use llmroute_core::key_placement::in_flight::{self, Ledger, CAS_ATTEMPTS};
use llmroute_core::key_placement::{self, table, Bounds, HostChoice, KeyTable, PlacementReason};
use llmroute_core::status::BackendHealth;
use llmroute_core::Config;

use crate::host::{self, Envoy};

pub use llmroute_core::envoy_contract::SESSION_HEADER;
thread_local! {
    /// What this worker owes the shared in-flight counts (see `llmroute_core::key_placement::in_flight`).
    static LEDGER: RefCell<Ledger> = RefCell::new(Ledger::default());
}

/// A request pinned to a host, remembered until the log phase lowers the host's in-flight count.
#[derive(Debug, Clone)]
pub struct Pin {
    backend: String,
    host: usize,
    hosts: usize,
    /// The chosen host's id in the key table (the fair queue's per-host count names it so).
    pub host_id: u32,
    pub choice: HostChoice,
    /// With `host_max_inflight`: the other up hosts, in the key's rendezvous order, that the fair queue may send
    /// this request to instead (see `llmroute_core::fairness::arrive_around`); empty otherwise.
    alternates: Vec<Alternate>,
}

/// A host a pinned request may go to instead of its own.
#[derive(Debug, Clone)]
struct Alternate {
    id: u32,
    index: usize,
    address: String,
}

/// Keeps the hosts of `backend` that the status poll taken at `taken_at_ms` found down.
pub fn store_down(envoy: &Envoy, backend: &str, taken_at_ms: u64, down: &[String]) {
    envoy.set_shared_data(
        &shared::down(backend),
        &table::encode_down_hosts(taken_at_ms, down),
        None,
    );
}

/// Keeps every host Envoy listed for a discovered `backend` at the poll taken at `taken_at_ms` (sorted
/// `IP:PORT`s, in the same form as the down list).
pub fn store_hosts(envoy: &Envoy, backend: &str, taken_at_ms: u64, hosts: &[String]) {
    envoy.set_shared_data(
        &shared::hosts(backend),
        &table::encode_down_hosts(taken_at_ms, hosts),
        None,
    );
}

/// Keeps Envoy's weight of each host of the discovered `backend` that weighs more than 1, by `IP:PORT`.
pub fn store_weights(envoy: &Envoy, backend: &str, weights: &[(String, u32)]) {
    envoy.set_shared_data(
        &shared::weights(backend),
        &fleet_check::encode_reported_slots(weights),
        None,
    );
}

/// Keeps the `total_slots` the `/props` check read from each server of `backend` (0 where unknown).
pub fn store_reported_slots(envoy: &Envoy, backend: &str, slots: &[u32]) {
    envoy.set_shared_data(&shared::slots(backend), &table::encode_host_counts(slots), None);
}

/// Keeps the `total_slots` the `/props` check read from each host of the discovered `backend`, by `IP:PORT`.
pub fn store_reported_slots_by_address(envoy: &Envoy, backend: &str, slots: &[(String, u32)]) {
    envoy.set_shared_data(
        &shared::slots_by_address(backend),
        &fleet_check::encode_reported_slots(slots),
        None,
    );
}

/// Chooses the host for `key` in the backend named `cluster` and sets the session header. `None` when the
/// request's placement (its alias' own, else the top-level one) is `hash`, placement does not apply, or no host is
/// up (Envoy's ring decides).
pub fn pin(envoy: &Envoy, cfg: &Config, placement: &KeyPlacement, cluster: &str, key: u64) -> Option<Pin> {
    pin_stored(envoy, cfg, placement, cluster, key, None, false)
}

/// [`pin`], for a key the placement store was `asked` about (see `placement_store`): it settled it on the host
/// with id `stored`, or (`None`) the request fell back to local placement, the key waiting to be settled. Either
/// way the table marks the key shared, so its next request does not ask again.
pub fn pin_stored(
    envoy: &Envoy,
    cfg: &Config,
    placement: &KeyPlacement,
    cluster: &str,
    key: u64,
    stored: Option<u32>,
    asked: bool,
) -> Option<Pin> {
    let keys = placement.bounded()?;
    let backend = cfg.backends.iter().find(|b| b.name == cluster)?;
    let now = envoy.now_ms();
    let hosts = key_placement::views(backend, now, &host::SharedData(envoy))?;
    let bounds = Bounds::for_backend(keys, backend);
    let table_key = shared::keys(cluster);
    let mut choice = None;
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = envoy.shared_data(&table_key);
        let mut t = KeyTable::decode(&bytes.unwrap_or_default());
        let c = key_placement::choose_stored(&mut t, &hosts, key, stored, now, &bounds)?;
        choice = Some(c);
        let marked = asked && t.mark_shared(key);
        if !(c.table_changed || marked) || envoy.set_shared_data(&table_key, &t.encode(), cas) {
            break;
        }
    }
    let choice = choice?;
    let chosen = hosts.get(choice.host)?;
    let address = &chosen.address;
    envoy.set_request_header(SESSION_HEADER, Some(&key_placement::session_header_value(address)));
    adjust_in_flight(envoy, cluster, hosts.len(), choice.host, true);
    let alternates = match backend.host_max_inflight {
        Some(_) => key_placement::rendezvous_order(key, &hosts)
            .into_iter()
            .filter(|&i| i != choice.host)
            .filter_map(|i| {
                let h = hosts.get(i).filter(|h| h.up)?;
                Some(Alternate {
                    id: h.id(),
                    index: i,
                    address: h.address.clone(),
                })
            })
            .collect(),
        None => Vec::new(),
    };
    Some(Pin {
        backend: cluster.to_string(),
        host: choice.host,
        hosts: hosts.len(),
        host_id: chosen.id(),
        choice,
        alternates,
    })
}

impl Pin {
    /// The request is over: its host carries one request less.
    pub fn release(&self, envoy: &Envoy) {
        adjust_in_flight(envoy, &self.backend, self.hosts, self.host, false);
    }

    /// The ids of the hosts this request may go to instead of its own, in its key's order.
    pub fn alternate_ids(&self) -> Vec<u32> {
        self.alternates.iter().map(|a| a.id).collect()
    }

    /// Moves this request (not its key) to the alternate host `id`, which the fair queue admitted it on: the session
    /// header names that host, the in-flight counts move with it, and its reason is
    /// [`PlacementReason::HostFull`]. False when `id` is not one of its alternates (nothing changes).
    pub fn move_to(&mut self, envoy: &Envoy, id: u32) -> bool {
        let Some(a) = self.alternates.iter().find(|a| a.id == id) else {
            return false;
        };
        envoy.set_request_header(SESSION_HEADER, Some(&key_placement::session_header_value(&a.address)));
        adjust_in_flight(envoy, &self.backend, self.hosts, self.host, false);
        adjust_in_flight(envoy, &self.backend, self.hosts, a.index, true);
        self.host = a.index;
        self.host_id = a.id;
        self.choice.host = a.index;
        self.choice.reason = PlacementReason::HostFull;
        true
    }

    /// The backend, the chosen host's index and the number of hosts it was chosen among.
    pub fn place(&self) -> (&str, usize, usize) {
        (&self.backend, self.host, self.hosts)
    }
}

/// Adds `delta` to host `i` (of `hosts`) in the per-host counts kept under the shared-data `key`, through this
/// worker's ledger, as the in-flight counts are (see `llmroute_core::key_placement::in_flight`).
pub fn add_through_ledger(envoy: &Envoy, key: &str, hosts: usize, i: usize, delta: i64) {
    let settled = LEDGER.with(|l| {
        l.try_borrow_mut()
            .map(|mut l| l.add(&mut host::SharedData(envoy), key, hosts, i, delta))
    });
    if matches!(settled, Ok(false)) {
        log::debug!("llmroute: count {key} owed until the next tick");
    }
}

fn adjust_in_flight(envoy: &Envoy, backend: &str, hosts: usize, i: usize, up: bool) {
    add_through_ledger(envoy, &shared::in_flight(backend), hosts, i, if up { 1 } else { -1 });
}

/// Writes whatever in-flight updates this worker still owes; the root calls it on every tick.
pub fn settle(envoy: &Envoy) {
    let _ = LEDGER.with(|l| l.try_borrow_mut().map(|mut l| l.settle(&mut host::SharedData(envoy))));
}

/// Overwrites the in-flight counts of the backend `health` describes with Envoy's `rq_active` per host, as the
/// status poll read them, plus the requests waiting for each host in the fair queue (see `llmroute_core::key_placement::in_flight`). Only for a backend that bounded-keys
/// placement can use, and whose host list placement has at `now_ms` (for a discovered backend, store its hosts
/// first). An update a worker still owes is applied on top later, as it would have been.
pub fn rebuild_in_flight(envoy: &Envoy, cfg: &Config, health: &BackendHealth, now_ms: u64) {
    if !cfg.any_bounded_keys() {
        return;
    }
    let Some(backend) = cfg.backends.iter().find(|b| b.name == health.name) else {
        return;
    };
    if backend.lb != llmroute_core::config::LbPolicy::Chwbl {
        return;
    }
    let Some(addresses) = key_placement::views::addresses(backend, now_ms, &host::SharedData(envoy)) else {
        return;
    };
    let mut counts = in_flight::from_envoy(&addresses, &health.active);
    // Requests paused in the fair queue are pinned here but not yet upstream, so Envoy does not count them.
    if let Some(waiting) = crate::fair_queue::waiting_per_host(envoy, cfg, &backend.name, &addresses) {
        for (c, w) in counts.iter_mut().zip(waiting) {
            *c = c.saturating_add(w);
        }
    }
    envoy.set_shared_data(
        &shared::in_flight(&backend.name),
        &table::encode_host_counts(&counts),
        None,
    );
}

/// Seeds the backends' shared entries once per process, so later writes can all use compare-and-swap.
pub fn seed(envoy: &Envoy, cfg: &Config) {
    if !cfg.any_bounded_keys() {
        return;
    }
    for b in &cfg.backends {
        let keys = shared::keys(&b.name);
        if envoy.shared_data(&keys).0.is_none() {
            envoy.set_shared_data(&keys, &KeyTable::default().encode(), None);
        }
        let flights = shared::in_flight(&b.name);
        // A discovered backend's count list is sized by its first placement (an empty list reads as zeros).
        if envoy.shared_data(&flights).0.is_none() {
            envoy.set_shared_data(&flights, &table::encode_host_counts(&vec![0; b.endpoints.len()]), None);
        }
    }
}
