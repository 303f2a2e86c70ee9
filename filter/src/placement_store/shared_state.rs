//! What the placement store's two sides share through Envoy's shared data: the backend's key table (merged from
//! etcd's answers), the keys placed locally while etcd failed (pending settlement), and the revision the table is
//! known complete up to.

use llmroute_core::envoy_contract::shared;
use llmroute_core::etcd_json;
use llmroute_core::key_placement::in_flight::CAS_ATTEMPTS;
use llmroute_core::key_placement::store::{self, Pending};
use llmroute_core::key_placement::{HostView, KeyTable};
use llmroute_core::Config;

use crate::host::{self, Envoy};

/// Merges stored placements into `backend`'s shared table with compare-and-swap. False when every try lost its
/// race (the same keys are read again next round).
pub(super) fn merge(
    envoy: &Envoy,
    backend: &str,
    prefix: &str,
    kvs: &[etcd_json::Kv],
    now: u64,
    max_keys: usize,
) -> bool {
    let key = shared::keys(backend);
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = envoy.shared_data(&key);
        let mut t = KeyTable::decode(&bytes.unwrap_or_default());
        if !store::merge(&mut t, prefix, kvs, now, max_keys) || envoy.set_shared_data(&key, &t.encode(), cas) {
            return true;
        }
    }
    false
}

/// The placement's view of `backend`'s hosts now; empty when it has none.
pub(super) fn hosts_of(envoy: &Envoy, cfg: &Config, backend: &str) -> Vec<HostView> {
    cfg.backends
        .iter()
        .find(|b| b.name == backend)
        .and_then(|b| llmroute_core::key_placement::views(b, envoy.now_ms(), &host::SharedData(envoy)))
        .unwrap_or_default()
}

/// Remembers a key placed locally because the store failed, for the root to settle later.
pub(super) fn note_pending(envoy: &Envoy, backend: &str, key: u64) {
    update_pending(envoy, backend, |p| p.add(key));
}

/// Changes `backend`'s pending list with compare-and-swap; `change` says whether it changed anything.
pub(super) fn update_pending(envoy: &Envoy, backend: &str, change: impl Fn(&mut Pending) -> bool) {
    let key = shared::store_pending(backend);
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = envoy.shared_data(&key);
        let mut p = Pending::decode(&bytes.unwrap_or_default());
        if !change(&mut p) || envoy.set_shared_data(&key, &p.encode(), cas) {
            return;
        }
    }
}

pub(super) fn read_revision(envoy: &Envoy, backend: &str) -> i64 {
    let bytes = envoy
        .shared_data(&shared::store_revision(backend))
        .0
        .unwrap_or_default();
    bytes
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, i64::from_le_bytes)
}

/// Raises `backend`'s view revision to `revision` (never lowers it: the root's refresh does that, when the store
/// was replaced). Not a compare-and-swap: a lost race leaves a lower revision, which only makes a view look older
/// than it is (one stale retry more), never newer.
pub(super) fn advance_revision(envoy: &Envoy, backend: &str, revision: i64) {
    if revision > read_revision(envoy, backend) {
        write_revision(envoy, backend, revision);
    }
}

pub(super) fn write_revision(envoy: &Envoy, backend: &str, revision: i64) {
    envoy.set_shared_data(&shared::store_revision(backend), &revision.to_le_bytes(), None);
}
