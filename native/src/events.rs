//! A stream's events besides its HTTP phases (`hooks.rs`): an event scheduled for it (a resume or a reply another
//! hook deferred to it, or its worker's tick, see `streams.rs`), its callout answered, and the hooks Envoy
//! requires that this filter does not use (streamed callouts, watermarks). Each runs inside the same guards as
//! the phases.

use std::ffi::c_void;

use crate::abi::{self, EnvoyBuffer, EnvoyHeader, FilterEnvoyPtr};
use crate::config;
use crate::hooks::{guarded, run, stream_of};
use crate::host::{self, Current};
use crate::streams::{self, Deferred};

/// A stream's scheduled event: what another hook deferred to it (a fair-queue release: resume, or a 429), or its
/// worker's tick while it waits (see `streams`).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    event_id: u64,
) {
    guarded(filter, module, |stream, current| match event_id {
        streams::EVENT_DEFERRED => {
            for action in streams::take_deferred(stream.context) {
                match action {
                    Deferred::Resume => {
                        streams::resumed(stream.context);
                        // SAFETY: this hook's own stream.
                        unsafe { abi::envoy_dynamic_module_callback_http_filter_continue_decoding(filter) };
                    }
                    Deferred::Reply { status, headers, body } => {
                        let hdrs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                        host::send_response(filter, status, &hdrs, &body);
                    }
                }
            }
        }
        streams::EVENT_TICK => {
            // SAFETY: Envoy keeps the configuration alive while any of its streams lives.
            let Some(cfg) = (unsafe { stream.config.as_ref() }) else {
                return;
            };
            // The root context ticks, from this stream's hook.
            let root = Current {
                filter: std::ptr::null_mut(),
                context: 0,
                ..current
            };
            host::with_current(root, || {
                config::with_root(cfg, false, |r| r.map(|r| r.on_worker_tick()))
            });
        }
        _ => {}
    });
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    callout_id: u64,
    result: u32,
    headers: *const EnvoyHeader,
    headers_size: usize,
    body_chunks: *const EnvoyBuffer,
    body_chunks_size: usize,
) {
    // SAFETY: Envoy's stream, see `stream_of`.
    let Some(stream) = (unsafe { stream_of(module) }) else {
        return;
    };
    let Ok(token) = u32::try_from(callout_id) else {
        return;
    };
    // SAFETY: Envoy's arrays of the sizes given, alive for this hook.
    let answer = unsafe { host::CalloutAnswer::of(result, headers, headers_size, body_chunks, body_chunks_size) };
    let (n, size) = (answer.headers.len(), answer.body.len());
    let current = stream.current(filter);
    host::with_answer(answer, || {
        run(filter, stream, current, |c| c.on_http_call_response(token, n, size, 0));
    });
}

// The hooks Envoy requires that this filter does not use: streamed callouts and watermarks.

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
    _stream_id: u64,
    _headers: *const EnvoyHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
    _stream_id: u64,
    _trailers: *const EnvoyHeader,
    _trailers_size: usize,
) {
}

/// Streamed callouts' completion and reset, and the downstream watermarks: nothing to do.
macro_rules! unused_stream_hooks {
    ($($name:ident ( $($arg:ident : $ty:ty),* );)*) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name(_filter: FilterEnvoyPtr, _module: *const c_void $(, $arg: $ty)*) {
                $(let _ = $arg;)*
            }
        )*
    };
}

unused_stream_hooks! {
    envoy_dynamic_module_on_http_filter_http_stream_complete(stream_id: u64);
    envoy_dynamic_module_on_http_filter_http_stream_reset(stream_id: u64, reason: u32);
    envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark();
    envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark();
}
