//! One stream's hook acting on another (the fair queue releasing a waiter): after `set_effective_context`, a
//! resume or a reply for the other stream runs in that stream's own scheduled hook, never in the caller's; a
//! stream that is gone cannot be switched to.

use std::ffi::c_void;

use llmroute_filter::{Host, HostStatus};

use super::budget::CONFIG;
use super::fake_envoy::{self, ENVOY};
use crate::events::*;
use crate::hooks::*;
use crate::host::{self, Current, HOST};
use crate::streams::EVENT_DEFERRED;

/// A new stream of a fresh worker (each test runs on its own thread): its context id is 1.
fn new_stream() -> (*mut c_void, *const c_void) {
    let cfg = super::config(CONFIG);
    let filter = std::ptr::NonNull::<c_void>::dangling().as_ptr();
    let module = envoy_dynamic_module_on_http_filter_new(cfg, filter);
    assert!(!module.is_null());
    fake_envoy::take_calls();
    (filter, module)
}

/// Runs `f` as another stream's hook (context 99) would.
fn from_another_hook<T>(f: impl FnOnce() -> T) -> T {
    let other = Current {
        context: 99,
        hook_context: 99,
        filter: std::ptr::NonNull::<c_void>::dangling().as_ptr(),
        ..Current::NONE
    };
    host::with_current(other, f)
}

fn calls(name: &str) -> usize {
    ENVOY.with(|e| e.borrow().calls.get(name).copied().unwrap_or(0))
}

#[test]
fn a_resume_for_another_stream_runs_in_that_streams_own_hook() {
    let (filter, module) = new_stream();
    from_another_hook(|| {
        HOST.set_effective_context(1).unwrap();
        HOST.resume_request().unwrap();
    });
    assert_eq!(calls("http_filter_continue_decoding"), 0, "not from the caller's hook");
    assert_eq!(calls("http_filter_scheduler_commit"), 1);
    envoy_dynamic_module_on_http_filter_scheduled(filter, module, EVENT_DEFERRED);
    assert_eq!(calls("http_filter_continue_decoding"), 1);
    // Run once: a second event finds nothing left.
    envoy_dynamic_module_on_http_filter_scheduled(filter, module, EVENT_DEFERRED);
    assert_eq!(calls("http_filter_continue_decoding"), 1);
    envoy_dynamic_module_on_http_filter_destroy(module);
    assert_eq!(
        calls("http_filter_scheduler_delete"),
        1,
        "the stream's scheduler goes with it"
    );
}

#[test]
fn a_reply_for_another_stream_is_sent_from_that_streams_own_hook() {
    let (filter, module) = new_stream();
    from_another_hook(|| {
        HOST.set_effective_context(1).unwrap();
        HOST.send_local_response(429, &[("retry-after", "1")], b"{}").unwrap();
    });
    assert!(ENVOY.with(|e| e.borrow().replies.is_empty()));
    envoy_dynamic_module_on_http_filter_scheduled(filter, module, EVENT_DEFERRED);
    assert_eq!(ENVOY.with(|e| e.borrow().replies.clone()), [429]);
    envoy_dynamic_module_on_http_filter_destroy(module);
}

#[test]
fn a_stream_that_is_gone_cannot_be_switched_to() {
    let (_, module) = new_stream();
    envoy_dynamic_module_on_http_filter_destroy(module);
    let e = from_another_hook(|| HOST.set_effective_context(1)).unwrap_err();
    assert_eq!(e.status, HostStatus::NotFound);
}
