//! This worker's live streams by context id, for what one stream's hook does to another: the fair queue releasing
//! a waiter (`set_effective_context`, then a resume or a 429), and a waiting stream asking for its worker's tick.
//!
//! proxy-wasm lets a root context switch to any request context of its VM and resume it or answer it there and
//! then. Envoy's dynamic-module ABI acts on a stream from that stream's own hooks: so a header or filter-state
//! write for another stream is applied at once (a plain write on a paused stream of the same thread), while a
//! resume or a local reply is *deferred*: kept here and run from the stream's own scheduled hook
//! (`envoy_dynamic_module_on_http_filter_scheduled`), which Envoy runs on the stream's worker, never after the
//! stream is gone.
//!
//! Ticks: a worker has no timer of its own in this ABI. A stream paused with its request complete (waiting in the
//! fair queue, or for a callout) asks for ticks; the configuration's ticker thread (`periodic`) commits a tick
//! event to one such stream per worker, and that stream's scheduled hook runs the worker root's share of the tick
//! (`Root::on_worker_tick`). A worker with no waiting stream is not ticked, as the wasm build's queue tick costs
//! nothing without a waiter.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::abi::{self, FilterEnvoyPtr, SchedulerPtr};
use crate::config::FilterConfig;

/// The scheduled event that runs a stream's deferred resume or reply.
pub const EVENT_DEFERRED: u64 = 1;
/// The scheduled event that runs the worker's tick.
pub const EVENT_TICK: u64 = 2;

/// The most deferred actions one stream keeps (a resume and a reply at most, in practice).
const MAX_DEFERRED: usize = 8;

/// What another stream's hook left for a stream to do in its own hook.
pub enum Deferred {
    Resume,
    Reply {
        status: u32,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
}

struct Live {
    filter: FilterEnvoyPtr,
    config: *const FilterConfig,
    /// Made on first need, deleted when the stream is.
    scheduler: SchedulerPtr,
    deferred: Vec<Deferred>,
    ticking: bool,
    /// Envoy holds the request at this filter: its last request hook answered "stop" and it has not resumed since.
    /// Only then does Envoy send the buffered body before the received chunk (see `body`).
    held: bool,
}

thread_local! {
    static LIVE: RefCell<HashMap<u32, Live>> = RefCell::new(HashMap::new());
}

/// A new stream of this worker.
pub fn register(context: u32, filter: FilterEnvoyPtr, config: *const FilterConfig) {
    let live = Live {
        filter,
        config,
        scheduler: std::ptr::null_mut(),
        deferred: Vec::new(),
        ticking: false,
        held: false,
    };
    let _ = LIVE.with(|l| l.try_borrow_mut().map(|mut l| l.insert(context, live)));
}

/// The stream is going away: it stops ticking and its scheduler is deleted (pending events with it).
pub fn unregister(context: u32) {
    let gone = LIVE.with(|l| l.try_borrow_mut().ok().and_then(|mut l| l.remove(&context)));
    if let Some(live) = gone {
        stop_ticking(context, &live);
        if !live.scheduler.is_null() {
            // SAFETY: made by `scheduler_new` for this stream, deleted once, after the ticker let go of it.
            unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_delete(live.scheduler) };
        }
    }
}

/// The stream and configuration of a live stream of this worker.
pub fn live(context: u32) -> Option<(FilterEnvoyPtr, *const FilterConfig)> {
    LIVE.with(|l| l.try_borrow().ok()?.get(&context).map(|s| (s.filter, s.config)))
}

/// Runs `f` on a live stream with its scheduler made.
fn with_scheduler<T>(context: u32, f: impl FnOnce(&mut Live) -> T) -> Option<T> {
    LIVE.with(|l| {
        let mut l = l.try_borrow_mut().ok()?;
        let live = l.get_mut(&context)?;
        if live.scheduler.is_null() {
            // SAFETY: `live.filter` is a live stream of this thread.
            live.scheduler = unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_new(live.filter) };
        }
        (!live.scheduler.is_null()).then(|| f(live))
    })
}

/// Leaves `action` for the stream's own hook and schedules it. False when the stream is gone.
pub fn defer(context: u32, action: Deferred) -> bool {
    with_scheduler(context, |live| {
        if live.deferred.len() >= MAX_DEFERRED {
            return false;
        }
        live.deferred.push(action);
        // SAFETY: the stream's own scheduler, alive while the stream is registered.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_commit(live.scheduler, EVENT_DEFERRED) };
        true
    })
    .unwrap_or(false)
}

/// What other hooks left for the stream, in order.
pub fn take_deferred(context: u32) -> Vec<Deferred> {
    LIVE.with(|l| {
        let mut l = l.try_borrow_mut().ok();
        l.as_mut()
            .and_then(|l| l.get_mut(&context))
            .map(|s| std::mem::take(&mut s.deferred))
            .unwrap_or_default()
    })
}

/// The stream waits with its request complete: its worker ticks while it does.
pub fn want_ticks(context: u32) {
    with_scheduler(context, |live| {
        // SAFETY: the config outlives its streams.
        if let (false, Some(cfg)) = (live.ticking, unsafe { live.config.as_ref() }) {
            cfg.periodic.tick_worker(context, live.scheduler);
            live.ticking = true;
        }
    });
}

/// The stream resumed: it no longer asks for ticks, and Envoy no longer holds its request here.
pub fn resumed(context: u32) {
    let _ = LIVE.with(|l| {
        l.try_borrow_mut().map(|mut l| {
            if let Some(live) = l.get_mut(&context) {
                stop_ticking(context, live);
                live.ticking = false;
                live.held = false;
            }
        })
    });
}

/// A request hook of the stream answered: `stop` when it stopped the request there.
pub fn hold(context: u32, stop: bool) {
    let _ = LIVE.with(|l| {
        l.try_borrow_mut().map(|mut l| {
            if let Some(live) = l.get_mut(&context) {
                live.held = stop;
            }
        })
    });
}

/// Whether Envoy holds the stream's request at this filter (see [`hold`], [`resumed`]).
pub fn held(context: u32) -> bool {
    LIVE.with(|l| l.try_borrow().ok()?.get(&context).map(|s| s.held))
        .unwrap_or(false)
}

fn stop_ticking(context: u32, live: &Live) {
    // SAFETY: the config outlives its streams.
    if let (true, Some(cfg)) = (live.ticking, unsafe { live.config.as_ref() }) {
        cfg.periodic.untick_worker(context);
    }
}
