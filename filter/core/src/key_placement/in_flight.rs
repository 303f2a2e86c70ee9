//! The in-flight counts placement weighs hosts by, kept in one shared-data entry per backend that every worker
//! updates with compare-and-swap, and the ledger that makes sure no update is ever lost.
//!
//! A worker raises a host's count when it pins a request there and lowers it in the log phase. Before this
//! ledger, an update that lost [`CAS_ATTEMPTS`] races in a row was dropped, and a dropped decrement left the host
//! looking busy for the life of the process. Now an update is first recorded in this worker's [`Ledger`] as a
//! signed delta per host, and the ledger writes *everything the worker owes* for that backend in one
//! compare-and-swap: read the counts, add the deltas, write with the version read. On success the debt is
//! cleared; on a mismatch it is kept, and retried by the next update to that backend and by the worker's next
//! tick ([`Ledger::settle`]).
//!
//! Why this terminates and cannot leak: each call makes at most [`CAS_ATTEMPTS`] tries, so a request never waits
//! on others. Nothing owed is ever dropped; it only waits in the ledger. A compare-and-swap fails only when
//! another write to the same entry landed between this worker's read and write, so every failure is some other
//! worker's success, and once the burst of writes to the entry pauses (at the latest when traffic does), the
//! next tick's first try succeeds and the counts are exact again. The deltas are summed, so a debt is one
//! number per host however many updates it gathers, and writes never apply the same delta twice: the debt is
//! cleared only by the write that carried it. Counts saturate at 0 and `u32::MAX`.
//!
//! What the ledger cannot see is a worker that dies: when its VM traps, the requests it pinned are never
//! released and its debt is lost, so those hosts would look busy for the life of the process. So the counts are
//! also rebuilt from Envoy's own figures: at each status poll (about once a second), the root context that polled
//! writes each host's `rq_active` from the admin `/clusters` answer over the backend's counts ([`from_envoy`]).
//! A request's count thus outlives the request by at most one poll interval plus the poll itself, whether or not
//! its worker released it. A request paused in the fair queue is pinned but not yet upstream, so Envoy does not
//! count it: the rebuild adds each host's waiters from the queue (else their later releases would drive the count
//! below the requests really there). In between polls the ledger keeps the counts exact for the requests placed since;
//! the rebuild itself is exact up to the requests that start or end while the poll is under way, which the next
//! poll corrects. Envoy's figure counts every request this Envoy has in flight to the host, whichever alias or
//! placement sent it.

use super::table::{decode_host_counts, encode_host_counts};

/// Compare-and-swap tries per call before the update is left in the ledger for later.
pub const CAS_ATTEMPTS: usize = 8;

/// Envoy shared data, as far as the ledger needs it: read a value with its version, write one if the version
/// still matches (`None`: unconditionally).
pub trait SharedStore {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>);
    fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> bool;
}

/// What one worker owes the shared in-flight counts: per shared-data key, a signed delta per host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    owed: Vec<(String, Vec<i64>)>,
}

impl Ledger {
    /// Records one request more (`up`) or less on host `i` of the `hosts` endpoints counted under `key`, then tries
    /// to write everything owed under `key`. True when nothing is owed there any more.
    pub fn adjust(&mut self, store: &mut impl SharedStore, key: &str, hosts: usize, i: usize, up: bool) -> bool {
        self.add(store, key, hosts, i, if up { 1 } else { -1 })
    }

    /// [`Ledger::adjust`] by `delta` (a request's tokens, for the work in flight kept the same way).
    pub fn add(&mut self, store: &mut impl SharedStore, key: &str, hosts: usize, i: usize, delta: i64) -> bool {
        if i >= hosts {
            return self.settle_key(store, key, hosts);
        }
        let pos = match self.owed.iter().position(|(k, _)| k == key) {
            Some(p) => p,
            None => {
                self.owed.push((key.to_string(), vec![0; hosts]));
                self.owed.len().saturating_sub(1)
            }
        };
        if let Some((_, deltas)) = self.owed.get_mut(pos) {
            deltas.resize(hosts, 0);
            if let Some(d) = deltas.get_mut(i) {
                *d = d.saturating_add(delta);
            }
        }
        self.settle_key(store, key, hosts)
    }

    /// Tries to write everything owed, for every key. True when nothing is owed any more.
    pub fn settle(&mut self, store: &mut impl SharedStore) -> bool {
        let keys: Vec<(String, usize)> = self.owed.iter().map(|(k, d)| (k.clone(), d.len())).collect();
        let mut all = true;
        for (key, hosts) in keys {
            all &= self.settle_key(store, &key, hosts);
        }
        all
    }

    /// True when this worker owes nothing.
    pub fn is_settled(&self) -> bool {
        self.owed.is_empty()
    }

    /// The deltas owed under `key`, if any.
    pub fn owed(&self, key: &str) -> Option<&[i64]> {
        self.owed.iter().find(|(k, _)| k == key).map(|(_, d)| d.as_slice())
    }

    fn settle_key(&mut self, store: &mut impl SharedStore, key: &str, hosts: usize) -> bool {
        let Some(pos) = self.owed.iter().position(|(k, _)| k == key) else {
            return true;
        };
        let deltas = self.owed.get(pos).map(|(_, d)| d.clone()).unwrap_or_default();
        if deltas.iter().all(|d| *d == 0) {
            self.owed.remove(pos);
            return true;
        }
        for _ in 0..CAS_ATTEMPTS {
            let (bytes, cas) = store.get(key);
            let mut counts = decode_host_counts(&bytes.unwrap_or_default(), hosts);
            for (c, d) in counts.iter_mut().zip(&deltas) {
                let v = i64::from(*c).saturating_add(*d).clamp(0, i64::from(u32::MAX));
                *c = u32::try_from(v).unwrap_or(u32::MAX);
            }
            if store.set(key, &encode_host_counts(&counts), cas) {
                self.owed.remove(pos);
                return true;
            }
        }
        false
    }
}

/// The in-flight counts of the hosts at `addresses` (placement's order), rebuilt from Envoy's `rq_active` of each
/// host at the status poll (`active`: `IP:PORT` and count, hosts without requests left out).
pub fn from_envoy(addresses: &[String], active: &[(String, u32)]) -> Vec<u32> {
    addresses
        .iter()
        .map(|a| active.iter().find(|(at, _)| at == a).map_or(0, |(_, n)| *n))
        .collect()
}
