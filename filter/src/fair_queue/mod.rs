//! The fair queue, host side (`fairness`): a request to a full backend waits, paused in the filter, and the
//! waiting request of the least-served tenant goes next. What the queue decides is `llmroute_core::fairness`; this
//! module keeps it in Envoy shared data and pauses, resumes and refuses requests.
//!
//! - **One queue per backend, shared by every worker.** Each backend's queue (its tenants' counters, its waiters,
//!   and through them the requests in flight) is one shared-data value ([`shared::fair_queue`]), updated with
//!   compare-and-swap, at most `CAS_ATTEMPTS` tries. A request whose route has a failover cluster queues on its
//!   alias' first backend.
//! - **Arrival** ([`enter`], once the request is routed and placed): with a free slot and nobody waiting it goes
//!   on; else it joins the queue and pauses, unless the queue is full or the client asked not to wait (a 429 at
//!   once). It is admitted at once if a slot is free and its tenant is the least served. With
//!   `host_max_inflight`, a slot is a place on the backend and on the host its pin names ([`capacity`]), and
//!   waiters whose host is full are passed over; a request of an idle tenant whose host is full goes at once to
//!   one of its pin's alternates with room ([`Gate::Moved`]; see `llmroute_core::fairness::arrive_around`).
//! - **Release.** A waiter is named by the worker that holds it (a number each worker VM draws once at random)
//!   and its context id. Each worker releases only its own: on the root context's tick (every [`TICK_MS`] while
//!   this worker holds a waiter) and when one of its requests ends, it admits its waiters while one of them goes
//!   next and a slot is free, and resumes each with `set_effective_context` and `continue_stream`; a waiter whose deadline passed (removed by whichever worker saw it first) gets a 429
//!   `queue_timeout` with `Retry-After: 1`, in its API's envelope. A waiter another worker holds and that goes next
//!   waits for that worker's turn, at most a tick; one a vanished worker held leaves at its deadline.
//! - **End** ([`end`], in the log phase): a request that was admitted frees its slot and is charged its output
//!   (and its input as the engine measured it); one that was still waiting (its client left) is removed and charged
//!   nothing; either way this worker then releases its own waiters. An update that loses every compare-and-swap
//!   race is kept and tried again on the next tick, never dropped.
//! - **Failure.** When the queue cannot be read or written, a request goes on unqueued and uncounted: Envoy's
//!   circuit breaker at `max_inflight` still bounds the backend.
//!
//! Cost: a request that does not wait reads and writes its backend's queue once when it arrives and once when it
//! ends (2 shared-data reads, 2 writes, 2 clock reads); nothing without `fairness`. The tick costs nothing while
//! this worker holds no waiter. The wait goes to the access log (`llmroute.queue_wait_ms`) and to
//! `llmroute_queue_wait_milliseconds`; the depth to `llmroute_queue_depth` and the status page.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use llmroute_core::config::Backend;
use llmroute_core::envoy_contract::{log_fields, metrics as names, shared};
use llmroute_core::fairness::{self, Arrival, Capacity, FairQueue, QueueView, Refusal, Waiter};
use llmroute_core::key_placement::in_flight::CAS_ATTEMPTS;
use llmroute_core::request_plan::{headers::Tenant, LocalReply};
use llmroute_core::stream::Usage;
use llmroute_core::{Config, Envelope, GatewayError, RouteDecision};

use crate::host::Envoy;
use crate::metrics::Metrics;

mod updates;
use updates::{owe, release, update, waiter_id, worker, Op};

/// The root context's tick while `fairness` is on: how late, at most, a worker admits a waiter whose slot freed on
/// another worker.
pub const TICK_MS: u64 = 25;

/// Most updates a worker keeps for a later tick when they lost every compare-and-swap race.
const MAX_OWED: usize = 4096;

thread_local! {
    /// This worker VM's number in waiter ids, once taken.
    static WORKER: Cell<Option<u32>> = const { Cell::new(None) };
    /// This worker's waiting requests and owed updates.
    static LOCAL: RefCell<Local> = RefCell::new(Local::default());
}

#[derive(Default)]
struct Local {
    /// The requests this worker holds paused, in arrival order. A request context that went away without its log
    /// phase leaves a dead entry, whose waiter the next update removes.
    waiting: Vec<Entry>,
    /// Completions that lost every compare-and-swap race, by backend, tried again on each tick.
    owed: Vec<(String, Op)>,
}

struct Entry {
    backend: String,
    id: u64,
    held: Weak<Held>,
}

/// A request's place in its backend's queue, held by its request context until its log phase.
pub struct Ticket(Rc<Held>);

struct Held {
    backend: String,
    waiter: Waiter,
    context_id: u32,
    envelope: Envelope,
    request_id: Option<String>,
    state: Cell<State>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Paused in the queue.
    Waiting,
    /// Admitted: it holds a slot until it ends.
    Running,
    /// Refused with a 429 after waiting as long as it could.
    TimedOut,
}

impl Ticket {
    /// True when the request was refused after waiting (the root context answered it).
    pub fn timed_out(&self) -> bool {
        self.0.state.get() == State::TimedOut
    }
}

/// What a routed request does at its backend's queue.
pub enum Gate {
    /// Go on; the ticket, when the queue counted the request, is given back in the log phase.
    Go(Option<Ticket>),
    /// Pause: the root context's tick resumes or refuses it.
    Wait(Ticket),
    /// Go on, to this other host (its key's host was full of other tenants' requests).
    Moved(Ticket, u32),
    /// Answer with this 429.
    Refuse(GatewayError),
}

/// Who a routed request is, at its backend's queue.
pub struct Queued<'a> {
    pub tenant: Option<Tenant>,
    /// The host placement pinned it to (`fairness::NO_HOST` when Envoy picks).
    pub host: u32,
    pub context_id: u32,
    pub request_id: Option<&'a str>,
    /// The hosts it may go to instead of its own, when its tenant is idle and its host full (its pin's
    /// alternates).
    pub alternates: &'a [u32],
}

/// What one backend runs at once: its `max_inflight`, and its `host_max_inflight`.
pub(crate) fn capacity(b: &Backend) -> Capacity {
    Capacity {
        backend: u64::from(b.max_inflight),
        per_host: b.host_max_inflight,
    }
}

/// A routed request (decision `d`) arrives at its backend's queue. See the module doc.
pub fn enter(envoy: &Envoy, cfg: &Config, d: &RouteDecision, r: Queued, metrics: &Metrics) -> Gate {
    let Queued {
        tenant,
        host,
        context_id,
        request_id,
        alternates,
    } = r;
    let (Some(f), Some(t)) = (&cfg.fairness, tenant) else {
        return Gate::Go(None);
    };
    let Some(b) = queue_backend(cfg, d) else {
        return Gate::Go(None);
    };
    let now = envoy.now_ms();
    let w = Waiter {
        id: waiter_id(worker(envoy), context_id),
        tenant: t.id,
        weight: t.weight,
        input_tokens: u32::try_from(d.input_tokens).unwrap_or(u32::MAX),
        arrived_ms: now,
        deadline_ms: now.saturating_add(t.wait_ms),
        host,
    };
    let capacity = capacity(b);
    let Some(arrival) = update(envoy, b, metrics, |q| {
        fairness::arrive_around(q, w, now, capacity, f.max_queue, alternates)
    }) else {
        log::warn!(
            "llmroute: the fair queue of {} could not be updated; the request goes on unqueued",
            b.name
        );
        return Gate::Go(None);
    };
    let ticket = |state, host| {
        Ticket(Rc::new(Held {
            backend: b.name.clone(),
            waiter: Waiter { host, ..w },
            context_id,
            envelope: d.api.envelope(),
            request_id: request_id.map(str::to_string),
            state: Cell::new(state),
        }))
    };
    match arrival {
        Arrival::Admitted => Gate::Go(Some(ticket(State::Running, host))),
        Arrival::Moved(to) => Gate::Moved(ticket(State::Running, to), to),
        Arrival::Queued => {
            let t = ticket(State::Waiting, host);
            let entry = Entry {
                backend: b.name.clone(),
                id: w.id,
                held: Rc::downgrade(&t.0),
            };
            let _ = LOCAL.with(|l| l.try_borrow_mut().map(|mut l| l.waiting.push(entry)));
            Gate::Wait(t)
        }
        Arrival::Refused(r) => {
            metrics.add(
                names::QUEUE_REFUSALS,
                &[("backend", &b.name), ("reason", r.as_str())],
                1,
            );
            Gate::Refuse(match r {
                Refusal::QueueFull => GatewayError::QueueFull,
                Refusal::NoWait => GatewayError::QueueTimeout { waited_ms: 0 },
            })
        }
    }
}

/// The request that held `ticket` is over (its log phase), with the engine's `usage`. True when it was served;
/// false when it never got a slot (it timed out, or its client left while it waited), so it took nothing.
pub fn end(envoy: &Envoy, cfg: &Config, ticket: Ticket, usage: &Usage, metrics: &Metrics) -> bool {
    let h = &ticket.0;
    let _ = LOCAL.with(|l| {
        l.try_borrow_mut()
            .map(|mut l| l.waiting.retain(|e| e.id != h.waiter.id))
    });
    let Some(b) = cfg.backends.iter().find(|b| b.name == h.backend) else {
        return h.state.get() == State::Running;
    };
    let op = match h.state.get() {
        State::TimedOut => return false,
        State::Waiting => {
            metrics.add(names::QUEUE_ABANDONED, &[("backend", &b.name)], 1);
            Op::Leave(h.waiter.id)
        }
        State::Running => Op::Complete {
            tenant: h.waiter.tenant,
            weight: h.waiter.weight,
            host: h.waiter.host,
            input: h.waiter.input_tokens,
            measured_input: usage.prompt_tokens,
            output: usage.completion_tokens.unwrap_or(0),
        },
    };
    if !release(envoy, b, metrics, Some(op)) {
        owe(&b.name, op);
    }
    h.state.get() == State::Running
}

/// The root context's tick: each backend with a waiter this worker holds, or an update it owes, releases this
/// worker's waiters (see the module doc). Nothing to do, no host call.
pub fn tick(envoy: &Envoy, cfg: &Config, metrics: &Metrics) {
    if cfg.fairness.is_none() {
        return;
    }
    let (owed, waiting) = LOCAL
        .with(|l| {
            l.try_borrow_mut().map(|mut l| {
                let names: Vec<String> = l.waiting.iter().map(|e| e.backend.clone()).collect();
                (std::mem::take(&mut l.owed), names)
            })
        })
        .unwrap_or_default();
    let mut done: Vec<&str> = Vec::new();
    for (backend, op) in owed {
        match cfg.backends.iter().find(|b| b.name == backend) {
            Some(b) if release(envoy, b, metrics, Some(op)) => done.push(&b.name),
            Some(_) => owe(&backend, op),
            None => {}
        }
    }
    for b in &cfg.backends {
        if waiting.contains(&b.name) && !done.contains(&b.name.as_str()) {
            release(envoy, b, metrics, None);
        }
    }
}

/// Takes this worker's number, seeds each backend's queue, defines the queue's series, and ticks every
/// [`TICK_MS`]; from `on_configure`, with `fairness` on. The number is kept across configurations.
pub fn start(envoy: &Envoy, cfg: &Config, metrics: &Metrics) {
    if cfg.fairness.is_none() {
        return;
    }
    worker(envoy);
    for b in &cfg.backends {
        let key = shared::fair_queue(&b.name);
        let (bytes, _) = envoy.shared_data(&key);
        let q = match bytes {
            Some(bytes) => fairness::decode(&bytes),
            None => {
                envoy.set_shared_data(&key, &fairness::encode(&FairQueue::default()), None);
                FairQueue::default()
            }
        };
        let labels = [("backend", b.name.as_str())];
        metrics.set(names::QUEUE_DEPTH, &labels, q.depth() as u64);
        metrics.add(names::QUEUE_TIMEOUTS, &labels, 0);
    }
    envoy.set_tick_period(TICK_MS);
}

/// The status page's body with each backend's queue added, with `fairness` on.
pub fn with_queues(envoy: &Envoy, cfg: &Config, body: Vec<u8>) -> Vec<u8> {
    if cfg.fairness.is_none() {
        return body;
    }
    let views: Vec<(&str, QueueView)> = cfg
        .backends
        .iter()
        .map(|b| {
            let q = envoy
                .shared_data(&shared::fair_queue(&b.name))
                .0
                .map(|bytes| fairness::decode(&bytes))
                .unwrap_or_default();
            (b.name.as_str(), QueueView::of(&q, capacity(b)))
        })
        .collect();
    fairness::add_to_status(body, &views)
}

/// The requests waiting in `backend`'s queue for each of the hosts at `addresses` (placement's order); `None`
/// without `fairness` or when the queue cannot be read. The in-flight rebuild adds them to Envoy's counts, which
/// see only requests that went upstream.
pub fn waiting_per_host(envoy: &Envoy, cfg: &Config, backend: &str, addresses: &[String]) -> Option<Vec<u32>> {
    cfg.fairness.as_ref()?;
    let (bytes, _) = envoy.try_shared_data(&shared::fair_queue(backend))?;
    let q = fairness::decode(&bytes?);
    let ids: Vec<u32> = addresses
        .iter()
        .map(|a| llmroute_core::key_placement::host_id(a))
        .collect();
    Some(q.waiting_on(&ids))
}

/// The backend whose queue a routed request joins: its cluster's, or on a failover cluster its alias' first
/// backend (the one Envoy sends to while it is up).
fn queue_backend<'c>(cfg: &'c Config, d: &RouteDecision) -> Option<&'c Backend> {
    match d.known_backend() {
        Some(name) => cfg.backends.iter().find(|b| b.name == name),
        None => cfg.backend(cfg.alias(&d.alias)?.routes.first()?.backend),
    }
}
