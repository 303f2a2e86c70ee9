//! Periodic work: the main thread's root context of each configuration, and its ticker.
//!
//! The wasm build ticks a root context in every worker VM; the periodic jobs (status poll, `/props` fleet check,
//! placement store refresh, engine load poll) are each claimed by one of them through a lease in shared data.
//! An HTTP filter of Envoy's dynamic-module ABI has no timer, but its configuration has a scheduler whose events
//! run on the main thread, and a callout of its own. So here one root context per configuration lives on the
//! main thread (made in `config_new`), and a ticker thread commits a tick event to the configuration's scheduler
//! every period the root asked for (`set_tick_period`); the event runs the root's `on_tick` on the main thread,
//! and its callouts are the configuration's (answered in `config_http_callout_done`). Shared data is
//! process-wide (`shared.rs`), so what it writes (status snapshot, engine load, key table) every worker reads.
//!
//! The same thread ticks the workers that hold a waiting stream (see `streams`): the fair queue's release and
//! the key table's settling are each worker's own.
//!
//! An event not yet run is not committed again, so a busy main thread is never flooded. The thread stops, and
//! the scheduler is deleted, when Envoy destroys the configuration.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use crate::abi::{self, FilterConfigEnvoyPtr, SchedulerPtr};

/// The main thread's tick event.
pub const EVENT_TICK: u64 = 1;

/// The ticker's wake-up when the root asked for no tick (it still ticks waiting workers then).
const IDLE_MS: u32 = 1000;
/// The shortest tick the ticker honours.
const MIN_MS: u32 = 5;

/// A scheduler pointer that crosses to the ticker thread: committing is safe from any thread, and the owner
/// deletes it only after the ticker let go of it.
#[derive(Clone, Copy)]
struct Sched(usize);

impl Sched {
    fn commit(self, event: u64) {
        // SAFETY: a live scheduler (see the type); commit posts to its dispatcher.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_config_scheduler_commit(self.0 as SchedulerPtr, event) }
    }
    fn commit_stream(self, event: u64) {
        // SAFETY: as above, a stream's scheduler.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_commit(self.0 as SchedulerPtr, event) }
    }
}

/// Waiting streams by worker and context id, with their schedulers.
type Waiting = HashMap<(ThreadId, u32), Sched>;

#[derive(Default)]
struct Shared {
    /// The main root's tick period (ms, 0 = none).
    period_ms: AtomicU32,
    /// A main-thread tick event is committed and has not run yet.
    pending: AtomicBool,
    waiting: Mutex<Waiting>,
}

/// The running ticker: its stop signal, its thread, and the configuration's scheduler.
type Running = (Sender<()>, JoinHandle<()>, Sched);

/// A configuration's ticker (see the module doc).
#[derive(Default)]
pub struct Periodic {
    shared: Arc<Shared>,
    running: Mutex<Option<Running>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Periodic {
    /// The main root's tick period (from its `set_tick_period`).
    pub fn set_period(&self, ms: u32) {
        self.shared.period_ms.store(ms, Ordering::Relaxed);
    }

    /// True when the main root asked for a tick.
    pub fn asked(&self) -> bool {
        self.shared.period_ms.load(Ordering::Relaxed) != 0
    }

    /// Starts the ticker for Envoy's configuration `envoy` (main thread, once).
    pub fn start(&self, envoy: FilterConfigEnvoyPtr) {
        // SAFETY: Envoy's live configuration, on the main thread.
        let sched = unsafe { abi::envoy_dynamic_module_callback_http_filter_config_scheduler_new(envoy) };
        if sched.is_null() {
            log::error!("llmroute: Envoy made no scheduler for the configuration; nothing runs periodically");
            return;
        }
        let sched = Sched(sched as usize);
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("llmroute-tick".into())
            .spawn(move || loop {
                let period = shared.period_ms.load(Ordering::Relaxed);
                let wait = if period == 0 { IDLE_MS } else { period.max(MIN_MS) };
                match stopped.recv_timeout(Duration::from_millis(u64::from(wait))) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => break,
                }
                if period != 0 && !shared.pending.swap(true, Ordering::AcqRel) {
                    sched.commit(EVENT_TICK);
                }
                let waiting = lock(&shared.waiting);
                let mut ticked: Vec<ThreadId> = Vec::new();
                for ((worker, _), s) in waiting.iter() {
                    if !ticked.contains(worker) {
                        ticked.push(*worker);
                        s.commit_stream(crate::streams::EVENT_TICK);
                    }
                }
            });
        match spawned {
            Ok(thread) => *lock(&self.running) = Some((stop, thread, sched)),
            Err(e) => {
                log::error!("llmroute: the tick thread did not start ({e}); nothing runs periodically");
                // SAFETY: made above, never shared.
                unsafe {
                    abi::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(sched.0 as SchedulerPtr)
                };
            }
        }
    }

    /// The tick event ran (main thread): the next one may be committed.
    pub fn ticked(&self) {
        self.shared.pending.store(false, Ordering::Release);
    }

    /// Stops the ticker and deletes the scheduler (main thread, when Envoy destroys the configuration).
    pub fn stop(&self) {
        let running = lock(&self.running).take();
        if let Some((stop, thread, sched)) = running {
            drop(stop);
            let _ = thread.join();
            // SAFETY: made in `start`; the ticker, its only other user, has ended.
            unsafe { abi::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(sched.0 as SchedulerPtr) };
        }
    }

    /// A stream of this worker waits: tick the worker through its scheduler.
    pub fn tick_worker(&self, context: u32, scheduler: SchedulerPtr) {
        let key = (std::thread::current().id(), context);
        lock(&self.shared.waiting).insert(key, Sched(scheduler as usize));
    }

    /// The stream no longer waits (or is going away): the ticker lets go of its scheduler.
    pub fn untick_worker(&self, context: u32) {
        lock(&self.shared.waiting).remove(&(std::thread::current().id(), context));
    }
}
