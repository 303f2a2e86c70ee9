//! The fair queue's updates: a backend's queue read, changed and written back with compare-and-swap; the
//! release of this worker's waiters (resumed, or refused once past their deadline); the completions owed after
//! lost races; and the waiter ids that name the worker holding each waiter.

use super::*;

/// An update to a backend's queue besides releasing waiters.
#[derive(Debug, Clone, Copy)]
pub(super) enum Op {
    /// A waiter's client left: removed, charged nothing.
    Leave(u64),
    /// An admitted request ended.
    Complete {
        tenant: u64,
        weight: u32,
        host: u32,
        input: u32,
        measured_input: Option<u64>,
        output: u64,
    },
}

impl Op {
    fn apply(self, q: &mut FairQueue) {
        match self {
            Op::Leave(id) => {
                q.leave(id);
            }
            Op::Complete {
                tenant,
                weight,
                host,
                input,
                measured_input,
                output,
            } => q.complete_measured(tenant, weight, host, input, measured_input, output),
        }
    }
}

pub(super) fn owe(backend: &str, op: Op) {
    log::debug!("llmroute: the fair queue of {backend} owes an update until the next tick");
    let _ = LOCAL.with(|l| {
        l.try_borrow_mut().map(|mut l| {
            if l.owed.len() >= MAX_OWED {
                log::warn!("llmroute: the fair queue's owed updates are full; the oldest is dropped");
                l.owed.remove(0);
            }
            l.owed.push((backend.to_string(), op));
        })
    });
}

/// Applies `op` to backend `b`'s queue, then releases this worker's waiters there: admits those that go next while
/// a slot is free (and resumes them), answers those whose deadline passed, and removes those whose request context
/// is gone. False when the queue could not be updated (nothing was applied).
pub(super) fn release(envoy: &Envoy, b: &Backend, metrics: &Metrics, op: Option<Op>) -> bool {
    let me = worker(envoy);
    let mine: Vec<u64> = LOCAL
        .with(|l| {
            l.try_borrow_mut().map(|mut l| {
                l.waiting.retain(|e| e.held.strong_count() > 0);
                l.waiting.iter().filter(|e| e.backend == b.name).map(|e| e.id).collect()
            })
        })
        .unwrap_or_default();
    let now = envoy.now_ms();
    let capacity = capacity(b);
    let outcome = update(envoy, b, metrics, |q| {
        if let Some(op) = op {
            op.apply(q);
        }
        // This worker's waiters that no request context holds any more.
        let stale: Vec<u64> = q
            .waiters
            .iter()
            .filter(|w| worker_of(w.id) == me && !mine.contains(&w.id))
            .map(|w| w.id)
            .collect();
        for id in stale {
            q.leave(id);
        }
        let g = q.grant_own(now, capacity, |id| mine.contains(&id));
        let gone: Vec<u64> = mine
            .iter()
            .copied()
            .filter(|id| !q.waiters.iter().any(|w| w.id == *id) && !g.admitted.iter().any(|w| w.id == *id))
            .collect();
        (g.admitted, gone)
    });
    let Some((admitted, gone)) = outcome else {
        return false;
    };
    let taken: Vec<u64> = admitted.iter().map(|w| w.id).chain(gone.iter().copied()).collect();
    if taken.is_empty() {
        return true;
    }
    let held: Vec<Rc<Held>> = LOCAL
        .with(|l| {
            l.try_borrow_mut().map(|mut l| {
                let mut held = Vec::new();
                l.waiting.retain(|e| match taken.contains(&e.id) {
                    true => {
                        held.extend(e.held.upgrade());
                        false
                    }
                    false => true,
                });
                held
            })
        })
        .unwrap_or_default();
    let labels = [("backend", b.name.as_str())];
    for h in held {
        let waited = now.saturating_sub(h.waiter.arrived_ms);
        if !envoy.set_effective_context(h.context_id) {
            // Its context is gone after all: it will never run, so it gives its slot back.
            if admitted.iter().any(|w| w.id == h.waiter.id) {
                h.state.set(State::TimedOut);
                owe(
                    &b.name,
                    Op::Complete {
                        tenant: h.waiter.tenant,
                        weight: h.waiter.weight,
                        host: h.waiter.host,
                        input: h.waiter.input_tokens,
                        measured_input: None,
                        output: 0,
                    },
                );
            }
            continue;
        }
        envoy.set_log_field(log_fields::QUEUE_WAIT_MS, &waited.to_string());
        if admitted.iter().any(|w| w.id == h.waiter.id) {
            h.state.set(State::Running);
            metrics.observe(names::QUEUE_WAIT_MS, &labels, waited);
            envoy.resume_request();
        } else {
            h.state.set(State::TimedOut);
            let e = GatewayError::QueueTimeout { waited_ms: waited };
            metrics.add(names::QUEUE_TIMEOUTS, &labels, 1);
            metrics.rejected(e.metric_reason());
            envoy.send_local_reply(&LocalReply::refusal(&e, h.envelope, h.request_id.as_deref()));
        }
    }
    true
}

/// Runs `f` on backend `b`'s queue and writes the result with compare-and-swap, at most `CAS_ATTEMPTS` tries;
/// `f` runs again on a fresh read after a lost race. An unchanged queue is not written. Sets the depth gauge when
/// the depth changed. `None` when the queue could not be read or written.
pub(super) fn update<R>(
    envoy: &Envoy,
    b: &Backend,
    metrics: &Metrics,
    mut f: impl FnMut(&mut FairQueue) -> R,
) -> Option<R> {
    let key = shared::fair_queue(&b.name);
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = envoy.try_shared_data(&key)?;
        let bytes = bytes.unwrap_or_default();
        let mut q = fairness::decode(&bytes);
        let before = q.depth();
        let r = f(&mut q);
        let encoded = fairness::encode(&q);
        if encoded == bytes || envoy.set_shared_data(&key, &encoded, cas) {
            if q.depth() != before {
                metrics.set(names::QUEUE_DEPTH, &[("backend", &b.name)], q.depth() as u64);
            }
            return Some(r);
        }
    }
    None
}

/// A waiter's id: the worker that holds it in the high 32 bits, its request context in the low.
pub(super) fn waiter_id(worker: u32, context_id: u32) -> u64 {
    (u64::from(worker) << 32) | u64::from(context_id)
}

pub(super) fn worker_of(id: u64) -> u32 {
    (id >> 32) as u32
}

/// This worker VM's number, drawn once from the VM's random source (std's `RandomState` keys come from WASI
/// `random_get`, which Envoy serves from its CSPRNG): two VMs of one process share a number with odds of about
/// `workers² / 2³³`.
pub(super) fn worker(envoy: &Envoy) -> u32 {
    if let Some(n) = WORKER.with(Cell::get) {
        return n;
    }
    use std::hash::BuildHasher;
    let n = std::hash::RandomState::new().hash_one(envoy.now_ms()) as u32;
    WORKER.with(|w| w.set(Some(n)));
    n
}
