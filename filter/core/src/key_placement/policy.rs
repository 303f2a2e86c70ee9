//! Placement policies, and the signals they weigh: where one request with an affinity key goes, and why.
//!
//! A [`Policy`] takes the key table, the hosts' view, the key, the host the shared store settled (if any) and
//! the clock, and returns a [`HostChoice`] that names its reason. `bounded_keys` ([`BoundedKeysPolicy`]) is the
//! policy the config offers today: keys are placed by count, then pinned (see the parent module's doc).
//!
//! A [`Signal`] is one thing known about a host that can hold it back, in two ways:
//! - from **taking new keys** ([`Signal::takes_keys`]): the key shares are computed over the hosts that every
//!   signal lets take keys, and new keys go there; when no up host passes every signal, all up hosts take keys,
//!   so a signal ranks hosts but never leaves a key without one;
//! - from **serving this request now** ([`Signal::holds_back`]): a known key's request then goes to the next host
//!   in the key's rendezvous order that no signal holds back, with the first holding signal's reason, while the
//!   key itself stays.
//!
//! `bounded_keys` weighs, in this order: [`Health`] (Envoy's view: down hosts neither take keys nor serve),
//! [`EngineQueue`] (the engine's own queue from its `/metrics`: a queued host takes no new key, and one past
//! `spill_queue` passes its requests on as [`PlacementReason::Queued`]), [`HostLimit`] (a host carrying
//! `host_max_inflight` of this Envoy's requests takes no new key) and [`InFlight`] (this Envoy's requests in
//! flight, over the backend's `balance_factor` bound: [`PlacementReason::Spilled`]).
//!
//! **Adding a signal** (KV-cache use, say): implement [`Signal`] over a new [`HostView`] field that the views
//! fill, add it to [`BoundedKeysPolicy::signals`], and give it a [`PlacementReason`] if it holds requests back.
//! **Adding a scorer** that orders hosts in another way: implement [`Policy`]. Either way the decision stays a
//! pure function of its inputs, so replicas that share the store and see the same hosts agree: a signal must read
//! only the views it is given, never a clock or a per-worker count of its own.

use super::{
    bound, key_bound, live_keys, rendezvous_order, Bounds, HostChoice, HostView, KeyTable, PlacementReason,
    TOUCH_GRANULARITY_MS,
};

/// Decides the host of one request.
pub trait Policy {
    /// The host for `key` at `now_ms`, updating `table`; `stored` is the id of the host the shared placement store
    /// settled for the key, if it did. `None` when no host is up: the filter then leaves the choice to Envoy.
    fn choose(
        &self,
        table: &mut KeyTable,
        hosts: &[HostView],
        key: u64,
        stored: Option<u32>,
        now_ms: u64,
    ) -> Option<HostChoice>;
}

/// One reading about the hosts that can hold one of them back. Both methods default to holding nothing back.
pub trait Signal {
    /// The signal's name, for tests and docs.
    fn name(&self) -> &'static str;

    /// True when host `i` may take a new key.
    fn takes_keys(&self, hosts: &[HostView], i: usize) -> bool {
        let _ = (hosts, i);
        true
    }

    /// Why host `i` should not serve this request now; `None` when it may.
    fn holds_back(&self, hosts: &[HostView], i: usize) -> Option<PlacementReason> {
        let _ = (hosts, i);
        None
    }
}

/// Envoy's view of the host's health: a host Envoy would not route to takes no key and serves nothing.
pub struct Health;

impl Signal for Health {
    fn name(&self) -> &'static str {
        "health"
    }

    fn takes_keys(&self, hosts: &[HostView], i: usize) -> bool {
        hosts.get(i).is_some_and(|h| h.up)
    }

    fn holds_back(&self, hosts: &[HostView], i: usize) -> Option<PlacementReason> {
        (!self.takes_keys(hosts, i)).then_some(PlacementReason::Moved)
    }
}

/// The engine's own queue, from a fresh load reading (a host without one counts as not queued): a queued host
/// takes no new key, and a host queued past `spill` passes requests on.
pub struct EngineQueue {
    pub spill: Option<u32>,
}

impl Signal for EngineQueue {
    fn name(&self) -> &'static str {
        "engine_queue"
    }

    fn takes_keys(&self, hosts: &[HostView], i: usize) -> bool {
        hosts.get(i).and_then(|h| h.queued).unwrap_or(0) == 0
    }

    fn holds_back(&self, hosts: &[HostView], i: usize) -> Option<PlacementReason> {
        let queued = hosts.get(i).and_then(|h| h.queued).unwrap_or(0);
        self.spill
            .is_some_and(|bound| queued > bound)
            .then_some(PlacementReason::Queued)
    }
}

/// This Envoy's requests in flight: a host over its share times `factor` percent (Envoy's own
/// `hash_balance_factor` rule, [`bound`]) passes requests on. It never keeps a host from taking keys: in-flight
/// counts are per Envoy, and key placement must not depend on them for replicas to agree.
pub struct InFlight {
    pub factor: u32,
}

impl Signal for InFlight {
    fn name(&self) -> &'static str {
        "in_flight"
    }

    fn holds_back(&self, hosts: &[HostView], i: usize) -> Option<PlacementReason> {
        let total: u64 = hosts.iter().filter(|h| h.up).map(|h| u64::from(h.in_flight)).sum();
        let total_weight: u64 = hosts.iter().filter(|h| h.up).map(|h| u64::from(h.weight.max(1))).sum();
        let within = hosts
            .get(i)
            .is_some_and(|h| u64::from(h.in_flight) <= bound(self.factor, total, h.weight.max(1), total_weight));
        (!within).then_some(PlacementReason::Spilled)
    }
}

/// A host's absolute bound on this Envoy's requests in flight (`backends[].host_max_inflight`, kept by the fair
/// queue): a host at it takes no new key while another up host has room, so a new key does not land behind a flood
/// that fills its host before any engine poll shows a queue. It holds no request back: a known key's request stays
/// with its cache and waits in the fair queue for its host. Like engine load, it is an input of this Envoy's view;
/// with a placement store, replicas' proposals are settled in commit order.
pub struct HostLimit {
    pub max: Option<u32>,
}

impl Signal for HostLimit {
    fn name(&self) -> &'static str {
        "host_limit"
    }

    fn takes_keys(&self, hosts: &[HostView], i: usize) -> bool {
        let in_flight = hosts.get(i).map_or(0, |h| h.in_flight);
        self.max.is_none_or(|m| in_flight < m)
    }
}

/// `affinity.placement: bounded_keys`.
pub struct BoundedKeysPolicy {
    bounds: Bounds,
    queue: EngineQueue,
    host_limit: HostLimit,
    in_flight: InFlight,
}

impl BoundedKeysPolicy {
    pub fn new(bounds: Bounds) -> BoundedKeysPolicy {
        BoundedKeysPolicy {
            bounds,
            queue: EngineQueue {
                spill: bounds.spill_queue,
            },
            host_limit: HostLimit {
                max: bounds.host_max_inflight,
            },
            in_flight: InFlight {
                factor: bounds.in_flight_factor,
            },
        }
    }

    /// The signals weighed, in the order their reasons are given.
    pub fn signals(&self) -> [&dyn Signal; 4] {
        [&Health, &self.queue, &self.host_limit, &self.in_flight]
    }

    /// The first signal's reason for holding host `i` back from this request.
    fn held_back(&self, hosts: &[HostView], i: usize) -> Option<PlacementReason> {
        self.signals().iter().find_map(|s| s.holds_back(hosts, i))
    }

    /// The first host in `order` that can take keys under its live-key bound, the bound computed over the hosts
    /// that can take keys; failing that (only possible when weights or the table are odd), such a host with the
    /// fewest keys per weight. `None` only when no host in `order` is up.
    fn place_new(&self, table: &KeyTable, hosts: &[HostView], order: &[usize]) -> Option<usize> {
        let counts = live_keys(table, hosts);
        let signals = self.signals();
        let passes_all = |i: &usize| signals.iter().all(|s| s.takes_keys(hosts, *i));
        let any_passes = (0..hosts.len()).any(|i| passes_all(&i));
        let taker = |i: &usize| {
            if any_passes {
                passes_all(i)
            } else {
                Health.takes_keys(hosts, *i)
            }
        };
        let count = |i: usize| counts.get(i).copied().unwrap_or(0);
        let weight = |i: usize| hosts.get(i).map_or(1, |h| h.weight.max(1));
        let takers: Vec<usize> = (0..hosts.len()).filter(taker).collect();
        let total: u64 = takers.iter().map(|&i| count(i)).sum();
        let total_weight: u64 = takers.iter().map(|&i| u64::from(weight(i))).sum();
        let under = |i: &usize| count(*i) < key_bound(self.bounds.key_factor, total, weight(*i), total_weight);
        order.iter().copied().filter(taker).find(under).or_else(|| {
            // Weights are at least 1, so the division never fails; counts are bounded by the table size.
            let per_weight = |i: usize| {
                count(i)
                    .saturating_mul(1_000_000)
                    .checked_div(u64::from(weight(i)))
                    .unwrap_or(u64::MAX)
            };
            order.iter().copied().filter(taker).min_by_key(|&i| per_weight(i))
        })
    }
}

impl Policy for BoundedKeysPolicy {
    fn choose(
        &self,
        table: &mut KeyTable,
        hosts: &[HostView],
        key: u64,
        stored: Option<u32>,
        now_ms: u64,
    ) -> Option<HostChoice> {
        let b = &self.bounds;
        let mut changed = table.expire(now_ms, b.idle_ttl_ms);
        if !hosts.iter().any(|h| h.up) {
            return None;
        }
        let order = rendezvous_order(key, hosts);
        let known = table.get(key);
        let pinned = known
            .and_then(|e| hosts.iter().position(|h| h.id() == e.host))
            .filter(|&i| hosts.get(i).is_some_and(|h| h.up));
        let stored = stored.and_then(|id| hosts.iter().position(|h| h.id() == id && h.up));
        let (home, reason) = match (known, pinned, stored) {
            (_, pinned, Some(home)) if pinned != Some(home) => {
                table.insert(key, hosts.get(home)?.id(), now_ms, b.max_keys);
                table.mark_shared(key);
                changed = true;
                let reason = match (known, pinned) {
                    (Some(_), None) => PlacementReason::Moved,
                    _ => PlacementReason::Placed,
                };
                (home, reason)
            }
            (Some(e), Some(home), _) => {
                if table.promote(key, now_ms, b.max_keys) {
                    changed = true;
                } else if now_ms.saturating_sub(e.last_ms) >= TOUCH_GRANULARITY_MS {
                    table.touch(key, now_ms);
                    changed = true;
                }
                if stored.is_some() && table.mark_shared(key) {
                    changed = true;
                }
                (home, PlacementReason::Pinned)
            }
            _ => {
                // Some host is up, so `place_new` finds one; `None` (leave it to Envoy) only guards the index.
                let home = self.place_new(table, hosts, &order)?;
                table.insert(key, hosts.get(home)?.id(), now_ms, b.max_keys);
                changed = true;
                let reason = match known {
                    Some(_) => PlacementReason::Moved,
                    None => PlacementReason::Placed,
                };
                (home, reason)
            }
        };
        // The key stays on `home`; only this request goes on when a signal holds `home` back.
        let (host, reason) = match self.held_back(hosts, home) {
            None => (home, reason),
            Some(why) => order
                .iter()
                .copied()
                .find(|&i| i != home && self.held_back(hosts, i).is_none())
                .map_or((home, reason), |i| (i, why)),
        };
        Some(HostChoice {
            host,
            reason,
            table_changed: changed,
        })
    }
}
