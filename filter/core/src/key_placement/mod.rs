//! Bounded-keys placement: which host of a `chwbl` backend serves an affinity key, when the config asks for
//! `affinity.placement: bounded_keys`.
//!
//! Envoy's ring hash bounds the *requests in flight* on a host, not the number of *keys* a host must keep warm.
//! With a few prompt families and a few cache slots, random ring positions put three families on a host with two
//! slots and one on another, and the crowded host keeps evicting. This module places keys instead:
//!
//! - **A known key stays put** ([`PlacementReason::Pinned`]) while its host is up and within the in-flight bound.
//! - **A new key** ([`PlacementReason::Placed`]) goes to the first host, in the key's own rendezvous order, that
//!   holds fewer live keys than its bound ([`key_bound`]: its share of all live keys, weighted by `slots`,
//!   rounded up, plus `key_balance_factor − 100` percent of that share, rounded down). A few keys spread as
//!   evenly as the slots allow; many keys get room to stay on their first-choice host.
//! - **A key whose host is down** is placed again ([`PlacementReason::Moved`]).
//! - **A request whose host is over the in-flight bound** (the backend's `balance_factor`, the same bound Envoy's
//!   ring applies) goes to the next host in the key's rendezvous order that is within it
//!   ([`PlacementReason::Spilled`]); the key itself does not move.
//! - Keys idle for `key_idle_ttl_s` are forgotten, and at most `max_keys` are remembered. A key seen once is on
//!   probation; seen again it is established, and established keys hold at most four fifths of `max_keys`.
//!   When the table is full, the least recently seen key *on probation* goes first, so a flood of one-off keys
//!   (random session ids) only ever displaces other one-off keys, never an established tenant (see [`table`]
//!   and `docs/placement-bounds.md`).
//! - **Engine load**, when the backend polls it (`backends[].load`; [`HostView::queued`] holds the fresh readings
//!   of [`crate::load`]): a host whose engine reports queued requests takes no new key while another up host
//!   reports none (the key shares are then computed over the hosts that can take keys); and a request for a
//!   known key whose host's queue is over
//!   [`Bounds::spill_queue`] goes to the next host in the key's rendezvous order whose queue is within it
//!   ([`PlacementReason::Queued`]), while the key stays. A host with no fresh reading counts as not queued, so a
//!   stale poll falls back to the in-flight counts alone.
//! - **A host at `host_max_inflight`** (with `fairness`; [`Bounds::host_max_inflight`]) takes no new key while
//!   another up host has room, so a new key is not placed behind a flood that fills its host. A known key's
//!   request stays on its full host and waits in the fair queue for it (see [`crate::fairness`]).
//! - A host weighs its `slots` (config, or the server's `/props` `total_slots`), at most [`MAX_SLOTS`].
//!
//! Everything here is a pure function of the table, the hosts' view and the clock, so two replicas that saw the
//! same traffic in the same order place keys the same way; the rendezvous order depends only on the key and
//! the endpoint addresses. The filter keeps the table and the in-flight counts in Envoy shared data
//! ([`table`] encodes them) and pins the chosen host with Envoy's stateful-session header, so Envoy's health
//! checks, outlier ejection and retries still pick another host when the pinned one fails.

pub mod in_flight;
pub mod policy;
pub mod store;
pub mod table;
pub mod views;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

pub use crate::config::MAX_SLOTS;
use crate::config::{Backend, BoundedKeys};
pub use policy::{BoundedKeysPolicy, Policy, Signal};
pub use table::{Entry, KeyTable};
pub use views::views;

/// A host's placement weight, first found wins: the config's `slots` for it; the weight Envoy gives a
/// discovered host (its EDS `load_balancing_weight`, which `llmroute discover` sets from the etcd registration's
/// `weight`, else `slots`; 0 or 1 reads as unset, since 1 is also every unweighted host's); the `total_slots` the
/// server last reported to the `/props` check (0 when unknown); else 1. Never more than [`MAX_SLOTS`].
pub fn host_weight(configured: Option<u32>, registered: u32, reported: u32) -> u32 {
    configured
        .or(Some(registered).filter(|n| *n > 1))
        .or(Some(reported).filter(|n| *n > 0))
        .unwrap_or(1)
        .clamp(1, MAX_SLOTS)
}

/// The weight of each of `addresses` in `weights` (`IP:PORT`, weight pairs), 0 for a host not listed.
pub fn weights_at(addresses: &[String], weights: &[(String, u32)]) -> Vec<u32> {
    addresses
        .iter()
        .map(|a| weights.iter().find(|(w, _)| w == a).map_or(0, |(_, n)| *n))
        .collect()
}

/// A touch that moves `last_ms` by less than this is not written back, to spare shared-data writes.
pub const TOUCH_GRANULARITY_MS: u64 = 1000;

/// What the placement knows about one endpoint of the backend, in config order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    /// `IP:PORT` as Envoy names the host.
    pub address: String,
    /// False when Envoy's last known health says it would not route there.
    pub up: bool,
    /// Relative capacity (cache slots); at least 1.
    pub weight: u32,
    /// Requests this gateway has in flight to it.
    pub in_flight: u32,
    /// Requests waiting in the engine's own queue, from a fresh load reading; `None` without one.
    pub queued: Option<u32>,
}

impl HostView {
    /// The host's id in the key table.
    pub fn id(&self) -> u32 {
        host_id(&self.address)
    }
}

/// A host's id in the key table: the low 32 bits of the xxh3 of its `IP:PORT`. It follows the address, not the
/// endpoint's place in the config.
pub fn host_id(address: &str) -> u32 {
    xxh3_64(address.as_bytes()) as u32
}

/// Live keys per host in `table`, in `hosts` order.
pub fn live_keys(table: &KeyTable, hosts: &[HostView]) -> Vec<u64> {
    let ids: Vec<u32> = hosts.iter().map(HostView::id).collect();
    table.counts(&ids)
}

/// Why a request goes where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementReason {
    /// The key was known and its host is up and within its in-flight bound.
    Pinned,
    /// A new (or forgotten) key was placed.
    Placed,
    /// The key's host is down, so the key was placed again.
    Moved,
    /// The key's host is over its in-flight bound; this request goes to the next host, the key stays.
    Spilled,
    /// The key's host reports more queued requests than [`Bounds::spill_queue`]; this request goes to the next
    /// host whose queue is within it, the key stays.
    Queued,
    /// The key's host runs `host_max_inflight` requests, none of them this tenant's: this request, of a tenant with
    /// nothing waiting or running, goes to the next host in the key's order with room instead of waiting behind
    /// others (see `crate::fairness::arrive_around`); the key stays.
    HostFull,
}

impl PlacementReason {
    pub const ALL: [PlacementReason; 6] = [
        PlacementReason::Pinned,
        PlacementReason::Placed,
        PlacementReason::Moved,
        PlacementReason::Spilled,
        PlacementReason::Queued,
        PlacementReason::HostFull,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PlacementReason::Pinned => "pinned",
            PlacementReason::Placed => "placed",
            PlacementReason::Moved => "moved",
            PlacementReason::Spilled => "spilled",
            PlacementReason::Queued => "queued",
            PlacementReason::HostFull => "host_full",
        }
    }
}

/// The placement's answer for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostChoice {
    /// Index into the hosts (and the backend's endpoints).
    pub host: usize,
    pub reason: PlacementReason,
    /// The table changed and must be written back.
    pub table_changed: bool,
}

/// The bounds in force, from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Percent of a host's share of live keys it may hold when it takes a new key.
    pub key_factor: u32,
    /// Percent of a host's share of requests in flight it may carry (the backend's `balance_factor`).
    pub in_flight_factor: u32,
    pub idle_ttl_ms: u64,
    pub max_keys: usize,
    /// The engine queue past which a known key's request goes to another host (`backends[].load.spill_queue`);
    /// `None`: never.
    pub spill_queue: Option<u32>,
    /// Most of this Envoy's requests in flight on one host before it takes no new key
    /// (`backends[].host_max_inflight`); `None`: no such bound.
    pub host_max_inflight: Option<u32>,
}

impl Bounds {
    pub fn new(keys: &BoundedKeys, balance_factor: u32) -> Bounds {
        Bounds {
            key_factor: keys.key_balance_factor,
            in_flight_factor: balance_factor,
            idle_ttl_ms: keys.idle_ttl_ms,
            max_keys: keys.max_keys,
            spill_queue: None,
            host_max_inflight: None,
        }
    }

    /// The bounds of `backend`: its `balance_factor`, its `load.spill_queue` when it polls engine load, and its
    /// `host_max_inflight`.
    pub fn for_backend(keys: &BoundedKeys, backend: &Backend) -> Bounds {
        Bounds {
            spill_queue: backend.load.and_then(|l| l.spill_queue),
            host_max_inflight: backend.host_max_inflight,
            ..Bounds::new(keys, backend.balance_factor)
        }
    }
}

/// The key's preference order over the hosts: highest rendezvous score first, ties by index. It depends only on
/// the key and the addresses, so every replica and every worker computes the same order.
pub fn rendezvous_order(key: u64, hosts: &[HostView]) -> Vec<usize> {
    let mut scored: Vec<(u64, usize)> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| (xxh3_64_with_seed(h.address.as_bytes(), key), i))
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().map(|(_, i)| i).collect()
}

/// Envoy's bounded-load rule for its ring, as in `hash_balance_factor`: with `total` requests in flight over
/// hosts of `total_weight`, a host of `weight` has `max(1, ceil(ceil((total + 1) × factor%) × weight /
/// total_weight))` slots, and may take another request while it carries no more than that many.
pub fn bound(factor: u32, total: u64, weight: u32, total_weight: u64) -> u64 {
    // In u128 none of these can overflow (at most 2^65 × 2^32 × 2^32 / 100); saturating only satisfies the lint.
    let total_slots = u128::from(total).saturating_add(1).saturating_mul(u128::from(factor));
    let total_slots = total_slots.div_ceil(100);
    let slots = total_slots
        .saturating_mul(u128::from(weight))
        .div_ceil(u128::from(total_weight.max(1)));
    u64::try_from(slots).unwrap_or(u64::MAX).max(1)
}

/// The most live keys a host may hold after taking a new one, when `total` are live over hosts of
/// `total_weight`: its share `s = (total + 1) × weight / total_weight`, rounded up, plus `(factor − 100)% × s`
/// rounded down. Unlike Envoy's in-flight [`bound`], the slack is never rounded up, so a few keys still spread exactly evenly (6
/// keys on 3 hosts are 2, 2, 2 at any factor below 150), while many keys get room to stay on their own
/// rendezvous host, which is what keeps replicas agreeing.
pub fn key_bound(factor: u32, total: u64, weight: u32, total_weight: u64) -> u64 {
    // In u128 (`total + 1` no longer overflows at `u64::MAX`); products saturate only for factors far beyond any
    // config, where the bound is `u64::MAX` either way. `den` is at least 1, so the division is by at least 100.
    let share_num = u128::from(total).saturating_add(1).saturating_mul(u128::from(weight));
    let den = u128::from(total_weight.max(1));
    let ceil_share = share_num.div_ceil(den);
    let slack = share_num
        .saturating_mul(u128::from(factor.saturating_sub(100)))
        .checked_div(den.saturating_mul(100))
        .unwrap_or(0);
    u64::try_from(ceil_share.saturating_add(slack))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Decides the host for `key` at `now_ms`, updating `table`. `None` when no host is up: the filter then leaves
/// the choice to Envoy's ring.
pub fn choose(table: &mut KeyTable, hosts: &[HostView], key: u64, now_ms: u64, b: &Bounds) -> Option<HostChoice> {
    choose_stored(table, hosts, key, None, now_ms, b)
}

/// [`choose`], for a key whose host the shared placement store (see [`store`]) just settled as the host with id
/// `stored`: the key goes there (if that host is up) instead of where the table or the bounds would put it, and
/// is marked shared. A key the table knew on another up host (a key placed locally on its first sighting, which
/// another replica stored first) moves there as [`PlacementReason::Placed`]; one whose host is down, as
/// [`PlacementReason::Moved`]. A stored host that is down or not listed here is not used: the table decides as in
/// [`choose`]. This is the [`policy::BoundedKeysPolicy`].
pub fn choose_stored(
    table: &mut KeyTable,
    hosts: &[HostView],
    key: u64,
    stored: Option<u32>,
    now_ms: u64,
    b: &Bounds,
) -> Option<HostChoice> {
    BoundedKeysPolicy::new(*b).choose(table, hosts, key, stored, now_ms)
}

/// The value of the stateful-session header that pins a request to `address`: Envoy's header-based session
/// state carries the host's `IP:PORT` in base64.
pub fn session_header_value(address: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(address.as_bytes())
}
