//! Fair queuing: when a backend is full, which waiting request goes next.
//!
//! A backend is full when it has reached its own in-flight limit, or when every host is over its bound. A request
//! that arrives then waits, paused in the filter, instead of getting an instant 503. When a slot frees, the
//! waiting request of the tenant with the least *weighted attained service* goes next: the virtual token counter
//! rule ("Fairness in Serving Large Language Models", OSDI 2024).
//!
//! - Each tenant has a counter of the service it has received, in tokens divided by its weight: its input tokens
//!   when it is admitted, twice its output tokens when it completes ([`FairQueue::complete`]). Weights default to
//!   1; a tenant of weight 2 may receive twice the tokens of a tenant of weight 1 before it yields.
//! - A tenant that becomes active again (its first request waiting or running, after none) is lifted to the
//!   least counter among the other active tenants, or, when none is active, to the counter of the last tenant
//!   that went idle: idleness banks no credit, and a new tenant starts level, not at zero.
//! - Among the waiters of the least-served tenant, the earliest goes first; ties between tenants go to the
//!   earlier waiter.
//! - A waiter whose deadline passes is removed and refused ([`Grant::expired`]); a waiter whose client leaves is
//!   removed and charged nothing ([`FairQueue::leave`]).
//!
//! - A request that arrives ([`arrive`]) goes at once when a slot is free and nobody waits (or it is the one that
//!   goes next); the requests in flight are those admitted and not complete ([`FairQueue::running`]).
//! - **Hosts.** With a per-host bound (`backends[].host_max_inflight`, [`Capacity::per_host`]), a slot is a place
//!   on the backend *and* on the host placement chose for the request ([`Waiter::host`]). A waiter whose host is at
//!   its bound is passed over, not waited behind: the least-served tenant among the waiters whose host has room
//!   goes next, so a flood held at its own host never holds back a quiet tenant whose host is free. Placement
//!   gives a new key a host with room whenever one has (`key_placement::policy::HostLimit`), so a request waits for
//!   a host only when every host is at its bound, or when its key is known on a full host.
//!
//! The queue is plain data, kept by the filter as one shared-data value per backend ([`encode`], [`decode`]) so
//! every worker sees one order; each worker resumes only its own paused requests ([`FairQueue::grant_own`]
//! admits a worker's waiters while one of them goes next and a slot is free). Every operation is a pure
//! function of the queue and its arguments, tested natively with property tests. The cost of a decision is one
//! pass over the waiters and the active tenants, both bounded ([`MAX_TENANTS`], the config's `max_queue`).

/// The request header in which a client may shorten its own wait (milliseconds; `0`: never wait). The gateway
/// strips it before the engine (`crate::headers::GATEWAY_CONTROL`).
pub const MAX_WAIT_HEADER: &str = "x-max-wait-ms";

/// Counters are kept in thousandths of a token per unit of weight, so a weight of up to 1000 still counts one
/// token.
pub const SCALE: u64 = 1000;

pub use crate::config::MAX_TENANTS;

mod codec;
mod view;
pub use codec::{decode, encode};
pub use view::{add_to_status, QueueView};

/// What a backend runs at once: its `max_inflight`, and with `host_max_inflight` the bound on each host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub backend: u64,
    pub per_host: Option<u32>,
}

impl From<u64> for Capacity {
    /// A backend bounded as a whole only.
    fn from(backend: u64) -> Capacity {
        Capacity {
            backend,
            per_host: None,
        }
    }
}

/// The requests admitted and not complete on one host, for a backend with a per-host bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRunning {
    /// The host's id in the key table (`key_placement::host_id`).
    pub id: u32,
    pub running: u32,
}

/// One tenant's standing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant {
    /// The tenant's id: a hash of its API key name or of its tenant header (never the raw value).
    pub id: u64,
    /// Service received, in thousandths of a token per unit of weight.
    pub counter: u64,
    /// Requests of this tenant waiting or running.
    pub active: u32,
}

/// One request waiting for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    /// Which paused request this is: the worker that holds it and its context, as the filter names them.
    pub id: u64,
    pub tenant: u64,
    /// The tenant's weight (its share), at least 1.
    pub weight: u32,
    /// The request's estimated input tokens, charged when it is admitted.
    pub input_tokens: u32,
    pub arrived_ms: u64,
    /// When it stops waiting and is refused.
    pub deadline_ms: u64,
    /// The host placement chose for it (its id in the key table); [`NO_HOST`] when placement chose none (Envoy
    /// picks the host), and then only the backend's bound applies.
    pub host: u32,
}

/// [`Waiter::host`] of a request whose host Envoy picks.
pub const NO_HOST: u32 = 0;

/// Why a request could not join the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The queue holds `max_queue` waiters already.
    QueueFull,
    /// The request's deadline is already past (its allowed wait is 0).
    NoWait,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::QueueFull => "queue_full",
            Refusal::NoWait => "no_wait",
        }
    }
}

/// `tokens` over `weight`, in thousandths ([`SCALE`]).
fn scaled(tokens: u64, weight: u32) -> u64 {
    tokens
        .saturating_mul(SCALE)
        .checked_div(u64::from(weight.max(1)))
        .unwrap_or(0)
}

/// What a freed slot does: the waiter it admits, if any, and the waiters whose deadline had passed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    pub admitted: Option<Waiter>,
    pub expired: Vec<Waiter>,
}

/// One backend's fair queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FairQueue {
    /// Known tenants, sorted by id.
    pub tenants: Vec<Tenant>,
    /// Waiting requests, in arrival order.
    pub waiters: Vec<Waiter>,
    /// The counter of the last tenant that went idle: where a tenant returning to an idle backend starts.
    pub floor: u64,
    /// Requests running per host, sorted by id; only hosts with one running.
    pub hosts: Vec<HostRunning>,
}

impl FairQueue {
    /// The tenant's standing, if known.
    pub fn tenant(&self, id: u64) -> Option<Tenant> {
        self.tenants
            .binary_search_by_key(&id, |t| t.id)
            .ok()
            .and_then(|i| self.tenants.get(i).copied())
    }

    /// The tenant `id`, added if unknown, and activated: a tenant with nothing waiting or running is lifted to
    /// the least counter of the active tenants (or to [`FairQueue::floor`] when none is active).
    fn activate(&mut self, id: u64) {
        let lift = self
            .tenants
            .iter()
            .filter(|t| t.active > 0 && t.id != id)
            .map(|t| t.counter)
            .min();
        let lift = lift.unwrap_or(self.floor);
        let i = match self.tenants.binary_search_by_key(&id, |t| t.id) {
            Ok(i) => i,
            Err(i) => {
                self.tenants.insert(
                    i,
                    Tenant {
                        id,
                        counter: lift,
                        active: 0,
                    },
                );
                i
            }
        };
        if let Some(t) = self.tenants.get_mut(i) {
            if t.active == 0 {
                t.counter = t.counter.max(lift);
            }
            t.active = t.active.saturating_add(1);
        }
        self.forget_idle();
    }

    /// One request of tenant `id` is no longer waiting or running.
    fn deactivate(&mut self, id: u64) {
        if let Ok(i) = self.tenants.binary_search_by_key(&id, |t| t.id) {
            if let Some(t) = self.tenants.get_mut(i) {
                t.active = t.active.saturating_sub(1);
                if t.active == 0 {
                    self.floor = t.counter;
                }
            }
        }
    }

    /// Adds `tokens` of service, over `weight`, to tenant `id`'s counter.
    fn charge(&mut self, id: u64, weight: u32, tokens: u64) {
        self.adjust(id, |c| c.saturating_add(scaled(tokens, weight)));
    }

    /// Takes `tokens` of service, over `weight`, back from tenant `id`'s counter (never below 0).
    fn refund(&mut self, id: u64, weight: u32, tokens: u64) {
        self.adjust(id, |c| c.saturating_sub(scaled(tokens, weight)));
    }

    /// Replaces tenant `id`'s counter `c` with `f(c)`, if the tenant is known.
    fn adjust(&mut self, id: u64, f: impl FnOnce(u64) -> u64) {
        if let Ok(i) = self.tenants.binary_search_by_key(&id, |t| t.id) {
            if let Some(t) = self.tenants.get_mut(i) {
                t.counter = f(t.counter);
            }
        }
    }

    /// Past [`MAX_TENANTS`], forgets idle tenants, least served first.
    fn forget_idle(&mut self) {
        while self.tenants.len() > MAX_TENANTS {
            let Some(i) = self
                .tenants
                .iter()
                .enumerate()
                .filter(|(_, t)| t.active == 0)
                .min_by_key(|(_, t)| t.counter)
                .map(|(i, _)| i)
            else {
                return;
            };
            self.tenants.remove(i);
        }
    }

    /// A request arrives at a full backend: it joins the queue, or is refused. It is admitted later by
    /// [`FairQueue::grant`].
    pub fn arrive(&mut self, w: Waiter, now_ms: u64, max_queue: usize) -> Result<(), Refusal> {
        if w.deadline_ms <= now_ms {
            return Err(Refusal::NoWait);
        }
        if self.waiters.len() >= max_queue {
            return Err(Refusal::QueueFull);
        }
        self.activate(w.tenant);
        self.waiters.push(w);
        Ok(())
    }

    /// A request is admitted at once (its backend and its host had a free slot and no one who could go was
    /// waiting): its tenant becomes active and is charged its input, and it runs on `host`.
    pub fn admit_now(&mut self, tenant: u64, weight: u32, input_tokens: u32, host: u32) {
        self.activate(tenant);
        self.charge(tenant, weight, u64::from(input_tokens));
        self.take_host(host);
    }

    /// A slot is free at `now_ms`, whatever the hosts carry: removes the waiters whose deadline has passed, then
    /// admits the waiter of the least-served tenant (the earliest of that tenant's), charging its input.
    pub fn grant(&mut self, now_ms: u64) -> Grant {
        let expired = self.expire(now_ms);
        let admitted = self.next(Capacity::from(u64::MAX)).map(|i| self.admit(i));
        Grant { admitted, expired }
    }

    /// Requests running on `host`.
    pub fn host_running(&self, host: u32) -> u32 {
        self.hosts
            .binary_search_by_key(&host, |h| h.id)
            .ok()
            .and_then(|i| self.hosts.get(i))
            .map_or(0, |h| h.running)
    }

    /// True when `host` may take one more request under `cap` (always for [`NO_HOST`], or without a per-host
    /// bound).
    pub fn host_has_room(&self, host: u32, cap: Capacity) -> bool {
        host == NO_HOST || cap.per_host.is_none_or(|m| self.host_running(host) < m)
    }

    /// One request more runs on `host`.
    fn take_host(&mut self, host: u32) {
        if host == NO_HOST {
            return;
        }
        match self.hosts.binary_search_by_key(&host, |h| h.id) {
            Ok(i) => {
                if let Some(h) = self.hosts.get_mut(i) {
                    h.running = h.running.saturating_add(1);
                }
            }
            Err(i) => self.hosts.insert(i, HostRunning { id: host, running: 1 }),
        }
    }

    /// One request less runs on `host`; a host with none is forgotten.
    fn free_host(&mut self, host: u32) {
        if let Ok(i) = self.hosts.binary_search_by_key(&host, |h| h.id) {
            if let Some(h) = self.hosts.get_mut(i) {
                h.running = h.running.saturating_sub(1);
                if h.running == 0 {
                    self.hosts.remove(i);
                }
            }
        }
    }

    /// The slots free at `now_ms` (`capacity` less [`FairQueue::running`]) go to the waiters one worker holds
    /// (`owns`), in the order [`FairQueue::grant`] would admit them, while the waiter that goes next is one of
    /// them: at the first that another worker holds, it stops, and that worker admits it on its own turn. Waiters
    /// whose deadline has passed are removed first, whoever holds them.
    pub fn grant_own(&mut self, now_ms: u64, capacity: impl Into<Capacity>, owns: impl Fn(u64) -> bool) -> Grants {
        let cap = capacity.into();
        let expired = self.expire(now_ms);
        let mut admitted = Vec::new();
        while self.running() < cap.backend {
            match self.next(cap) {
                Some(i) if self.waiters.get(i).is_some_and(|w| owns(w.id)) => admitted.push(self.admit(i)),
                _ => break,
            }
        }
        Grants { admitted, expired }
    }

    /// Removes and returns the waiters whose deadline has passed at `now_ms`; their tenants are charged nothing.
    pub fn expire(&mut self, now_ms: u64) -> Vec<Waiter> {
        let mut expired = Vec::new();
        let mut i = 0;
        while let Some(w) = self.waiters.get(i).copied() {
            if w.deadline_ms <= now_ms {
                self.waiters.remove(i);
                self.deactivate(w.tenant);
                expired.push(w);
            } else {
                i = i.saturating_add(1);
            }
        }
        expired
    }

    /// The index of the waiter that goes next under `cap`: among the waiters whose host has room, the earliest
    /// of the tenant with the least counter.
    fn next(&self, cap: Capacity) -> Option<usize> {
        let counter = |t: u64| self.tenant(t).map_or(0, |t| t.counter);
        // `min_by_key` keeps the first of equal keys, and waiters are in arrival order.
        self.waiters
            .iter()
            .enumerate()
            .filter(|(_, w)| self.host_has_room(w.host, cap))
            .min_by_key(|(_, w)| counter(w.tenant))
            .map(|(i, _)| i)
    }

    /// True when some waiter could go now under `cap`, its host having room.
    fn any_could_go(&self, cap: Capacity) -> bool {
        self.waiters.iter().any(|w| self.host_has_room(w.host, cap))
    }

    /// Admits the waiter at `i` (which must exist), charging its input; it runs on its host.
    fn admit(&mut self, i: usize) -> Waiter {
        let w = self.waiters.remove(i);
        self.charge(w.tenant, w.weight, u64::from(w.input_tokens));
        self.take_host(w.host);
        w
    }

    /// Requests admitted and not yet complete: every active request that is not waiting.
    pub fn running(&self) -> u64 {
        let active = self.tenants.iter().map(|t| u64::from(t.active)).sum::<u64>();
        active.saturating_sub(self.waiters.len() as u64)
    }

    /// The waiter `id` left (its client disconnected): removed, and charged nothing. False when it was not
    /// waiting (already admitted or expired).
    pub fn leave(&mut self, id: u64) -> bool {
        let Some(i) = self.waiters.iter().position(|w| w.id == id) else {
            return false;
        };
        let w = self.waiters.remove(i);
        self.deactivate(w.tenant);
        true
    }

    /// An admitted request of `tenant` ended with `output_tokens` generated: charged twice them, over `weight`.
    pub fn complete(&mut self, tenant: u64, weight: u32, output_tokens: u64) {
        self.charge(tenant, weight, output_tokens.saturating_mul(2));
        self.deactivate(tenant);
    }

    /// [`FairQueue::complete`], with the input measured, for a request that ran on `host`: a request charged
    /// `charged_input` tokens at admission (the gateway's estimate) whose engine reported `measured_input` is
    /// charged, or refunded, the difference, so the counter holds the input as measured plus twice the output; its
    /// host carries one request less.
    pub fn complete_measured(
        &mut self,
        tenant: u64,
        weight: u32,
        host: u32,
        charged_input: u32,
        measured_input: Option<u64>,
        output_tokens: u64,
    ) {
        self.free_host(host);
        if let Some(measured) = measured_input {
            let charged = u64::from(charged_input);
            self.charge(tenant, weight, measured.saturating_sub(charged));
            self.refund(tenant, weight, charged.saturating_sub(measured));
        }
        self.complete(tenant, weight, output_tokens);
    }

    /// The waiters placed on each of the hosts `ids` (their ids in the key table, in placement's order): requests
    /// pinned there that Envoy does not count as active yet, since they have not gone upstream.
    pub fn waiting_on(&self, ids: &[u32]) -> Vec<u32> {
        ids.iter()
            .map(|id| {
                let n = self
                    .waiters
                    .iter()
                    .filter(|w| w.host != NO_HOST && w.host == *id)
                    .count();
                u32::try_from(n).unwrap_or(u32::MAX)
            })
            .collect()
    }

    /// Requests waiting, for the status page and the depth gauge.
    pub fn depth(&self) -> usize {
        self.waiters.len()
    }

    /// Tenants with a request waiting.
    pub fn tenants_waiting(&self) -> usize {
        self.tenants
            .iter()
            .filter(|t| self.waiters.iter().any(|w| w.tenant == t.id))
            .count()
    }
}

/// Whatever [`FairQueue::grant_own`] admitted and expired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    pub admitted: Vec<Waiter>,
    pub expired: Vec<Waiter>,
}

/// What becomes of a request that arrives at a backend with a fair queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Admitted at once: its tenant is active and charged its input.
    Admitted,
    /// Waiting, until [`FairQueue::grant_own`] admits it or its deadline passes.
    Queued,
    /// Refused, and its tenant untouched.
    Refused(Refusal),
    /// Admitted at once on another host than its own, this one (see [`arrive_around`]).
    Moved(u32),
}

/// A request `w` arrives at a backend of `capacity` (requests in flight, and per host), at `now_ms`. Waiters whose
/// deadline has passed are removed first (whoever holds them; each worker notices its own are gone). Then:
///
/// - with a free slot on the backend and on its host, and no waiter that could go now (nobody waiting, or only
///   waiters whose hosts are full), it is admitted;
/// - else it must wait: refused when its deadline is already past ([`Refusal::NoWait`], a client that asked to
///   wait 0 ms) or the queue holds `max_queue` ([`Refusal::QueueFull`]); otherwise it joins the queue, and is
///   admitted at once if a slot is free and it is the waiter that goes next (its tenant is the least served).
pub fn arrive(q: &mut FairQueue, w: Waiter, now_ms: u64, capacity: impl Into<Capacity>, max_queue: usize) -> Arrival {
    let cap = capacity.into();
    q.expire(now_ms);
    if q.running() < cap.backend && q.host_has_room(w.host, cap) && !q.any_could_go(cap) {
        q.admit_now(w.tenant, w.weight, w.input_tokens, w.host);
        return Arrival::Admitted;
    }
    if let Err(r) = q.arrive(w, now_ms, max_queue) {
        return Arrival::Refused(r);
    }
    let grants = q.grant_own(now_ms, cap, |id| id == w.id);
    match grants.admitted.is_empty() {
        true => Arrival::Queued,
        false => Arrival::Admitted,
    }
}

/// [`arrive`], for a request that may go around its host. A tenant with nothing waiting or running does not wait
/// behind a host that other tenants fill: when the request would not go at once on its own host (the host is full,
/// or others wait for it), and the backend has room, it is admitted at once on the first of `alternates` (the other
/// hosts, in its key's order) that has room and that nobody waits for, and [`Arrival::Moved`] names that host. Its
/// key stays where it is. Otherwise, as [`arrive`].
///
/// Why only an idle tenant: a tenant that fills its host itself (a flood) must wait for that host, or its backlog
/// would spread over every host and hold back the tenants there; a tenant returning from idle holds nothing
/// anywhere, so moving one request costs only that request's cache hit. Why also when its host has room but others
/// wait for it: a slot that has just freed on a flooded host goes, in virtual-token order, to the flood's earliest
/// waiter as often as not (a returning tenant starts level with it), and the quiet request would then wait for a
/// whole request of the flood.
pub fn arrive_around(
    q: &mut FairQueue,
    w: Waiter,
    now_ms: u64,
    capacity: impl Into<Capacity>,
    max_queue: usize,
    alternates: &[u32],
) -> Arrival {
    let cap = capacity.into();
    q.expire(now_ms);
    let idle = q.tenant(w.tenant).is_none_or(|t| t.active == 0);
    let backend_room = q.running() < cap.backend;
    let goes_now = backend_room && q.host_has_room(w.host, cap) && !q.any_could_go(cap);
    if idle && backend_room && !goes_now {
        let free = |h: u32| {
            h != w.host
                && h != NO_HOST
                && q.host_has_room(h, cap)
                && !q.waiters.iter().any(|x| x.host == h || x.host == NO_HOST)
        };
        if let Some(h) = alternates.iter().copied().find(|h| free(*h)) {
            q.admit_now(w.tenant, w.weight, w.input_tokens, h);
            return Arrival::Moved(h);
        }
    }
    arrive(q, w, now_ms, cap, max_queue)
}

/// A tenant's id: the xxh3 of its name (an API key's name, or a tenant header's value), so the queue never holds
/// the name itself.
pub fn tenant_id(name: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name)
}
