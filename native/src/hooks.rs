//! The event hooks Envoy calls for a stream (`envoy_dynamic_module_on_http_filter_*`), each a thin shim onto the
//! filter's own contexts.
//!
//! The glue in `filter/src` is written against proxy-wasm's `RootContext` and `HttpContext` traits; those are
//! plain Rust traits, so this module drives the very same `Root` and `Http` values the wasm build runs, through
//! the same methods, with the host swapped (`host.rs`). Nothing of the filter's logic is copied here.
//!
//! - Each worker thread builds its own `Root` for a configuration the first time a stream needs it, like the
//!   per-worker VM of the wasm build: the glue's `Rc` values never cross threads. The configuration's own hooks,
//!   and the main thread's root, are in `config.rs`.
//! - Each stream is a `Stream`: the glue's `HttpContext` plus what the host needs to know between hooks
//!   (whether this filter is buffering each body), registered by context id for other hooks (`streams.rs`).
//!
//! Panic safety: every hook runs the glue inside `catch_unwind` (the native profile unwinds). A panic fails that
//! stream closed, with a JSON 503 in its API's envelope, and the stream's context is dropped; Envoy carries on.

use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use llmroute_core::{headers, Envelope};
use proxy_wasm::traits::{HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType};

use crate::abi::{self, EnvoyBuffer, FilterConfigModulePtr, FilterEnvoyPtr};
use crate::body::View;
use crate::config::{self, FilterConfig};
use crate::head_edit;
use crate::host::{self, Current};
use crate::streams;

thread_local! {
    static NEXT_CONTEXT: Cell<u32> = const { Cell::new(1) };
    /// When this worker last ran its share of the tick from a new stream (ms).
    static LAST_TICK: Cell<u64> = const { Cell::new(0) };
}

/// How often, at most, a new stream runs its worker's share of the tick (the key table's settling), so that a
/// worker with traffic but no waiting stream settles too.
const TRAFFIC_TICK_MS: u64 = 1000;

/// One stream.
pub(crate) struct Stream {
    pub(crate) config: *const FilterConfig,
    /// This worker's id for the stream's context (`set_effective_context`, `streams`).
    pub(crate) context: u32,
    /// `None` after a panic: the stream already failed, later hooks let it be.
    ctx: Option<Box<dyn HttpContext>>,
    buffering_request: bool,
    buffering_response: bool,
    /// The envelope of a failure reply (from the request path).
    envelope: Envelope,
}

impl Stream {
    pub(crate) fn current(&self, filter: FilterEnvoyPtr) -> Current {
        Current {
            filter,
            config: self.config,
            context: self.context,
            hook_context: self.context,
            buffering_request: self.buffering_request,
            buffering_response: self.buffering_response,
            ..Current::NONE
        }
    }

    fn fairness(&self) -> bool {
        // SAFETY: Envoy keeps the configuration alive while any of its streams lives.
        unsafe { self.config.as_ref() }.is_some_and(|c| c.fairness)
    }
}

/// Which part of the stream a hook serves: a body hook reads the chunk just received.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Other,
    RequestBody,
    ResponseBody,
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: FilterConfigModulePtr,
    filter: FilterEnvoyPtr,
) -> *const c_void {
    // SAFETY: made by `config_new`; Envoy keeps it alive while any of its streams lives.
    let Some(cfg) = (unsafe { config.cast::<FilterConfig>().as_ref() }) else {
        return std::ptr::null();
    };
    let made = catch_unwind(AssertUnwindSafe(|| {
        let context = NEXT_CONTEXT.with(|n| {
            let id = n.get();
            n.set(id.wrapping_add(1).max(1));
            id
        });
        let current = Current {
            config: cfg,
            ..Current::NONE
        };
        let now = host::now_ms();
        let tick = LAST_TICK.with(|t| now.saturating_sub(t.get()) >= TRAFFIC_TICK_MS && (t.replace(now), true).1);
        let ctx = config::with_root(cfg, false, |root| {
            host::with_current(current, || {
                let root = root?;
                if tick {
                    root.on_worker_tick();
                }
                root.create_http_context(context)
            })
        });
        streams::register(context, filter, cfg);
        Stream {
            config: cfg,
            context,
            ctx,
            buffering_request: false,
            buffering_response: false,
            envelope: Envelope::OpenAi,
        }
    }));
    match made {
        Ok(stream) => Box::into_raw(Box::new(stream)).cast_const().cast::<c_void>(),
        Err(_) => std::ptr::null(),
    }
}

/// The stream behind Envoy's module pointer.
///
/// # Safety
/// `module` was returned by `filter_new` and not yet destroyed; Envoy calls a stream's hooks one at a time.
pub(crate) unsafe fn stream_of<'a>(module: *const c_void) -> Option<&'a mut Stream> {
    // SAFETY: the caller's contract.
    unsafe { module.cast::<Stream>().cast_mut().as_mut() }
}

/// Runs one glue callback for a stream, with the stream's host context; a panic fails the stream closed.
/// `None` when the stream has no context (it failed before, or the worker refused the configuration).
pub(crate) fn run<T>(
    filter: FilterEnvoyPtr,
    stream: &mut Stream,
    current: Current,
    f: impl FnOnce(&mut dyn HttpContext) -> T,
) -> Option<T> {
    let ctx = stream.ctx.as_deref_mut()?;
    // A body edit the glue left for Envoy is applied before the hook ends (see `head_edit`).
    let out = host::with_current(current, || {
        catch_unwind(AssertUnwindSafe(|| (f(ctx), head_edit::flush())))
    });
    match out {
        Ok((v, true)) => Some(v),
        Ok((_, false)) => {
            log::error!("llmroute: Envoy refused a body edit; the request fails closed with a 503");
            fail_closed(filter, stream);
            None
        }
        Err(_) => {
            fail_closed(filter, stream);
            None
        }
    }
}

/// One hook of the stream behind `module`: runs `f` (given the body size, in a body hook) on its context, then
/// `answer` with the outcome (`None` when the stream failed). `missing` when Envoy names no stream.
fn hook(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    part: Part,
    missing: u32,
    f: impl FnOnce(&mut dyn HttpContext, usize) -> Action,
    answer: impl FnOnce(&mut Stream, Option<Action>) -> u32,
) -> u32 {
    // SAFETY: Envoy's stream, see `stream_of`.
    let Some(stream) = (unsafe { stream_of(module) }) else {
        return missing;
    };
    let current = Current {
        in_request_body: part == Part::RequestBody,
        in_response_body: part == Part::ResponseBody,
        ..stream.current(filter)
    };
    let size = match part {
        Part::Other => 0,
        Part::RequestBody => host::with_current(current, || body_size(filter, BufferType::HttpRequestBody)),
        Part::ResponseBody => host::with_current(current, || body_size(filter, BufferType::HttpResponseBody)),
    };
    let out = run(filter, stream, current, |c| f(c, size));
    answer(stream, out)
}

/// After a panic: drops the stream's context (inside its own guard) and answers 503 in the API's envelope.
fn fail_closed(filter: FilterEnvoyPtr, stream: &mut Stream) {
    head_edit::discard();
    let ctx = stream.ctx.take();
    let _ = catch_unwind(AssertUnwindSafe(|| drop(ctx)));
    let body = llmroute_core::error::unavailable_body(stream.envelope, None);
    let reply = [("content-type", "application/json"), (headers::ERROR, "gateway_error")];
    let _ = catch_unwind(|| {
        // Marks the reply as the filter's own, so Envoy's local_reply_config leaves its body alone (as
        // `host::send_reply` does for every other reply of the filter).
        // SAFETY: `filter` is the failing hook's stream; the buffers are static.
        unsafe {
            abi::envoy_dynamic_module_callback_http_set_header(
                filter,
                abi::HEADER_REQUEST,
                abi::ModuleBuffer::of(headers::LOCAL_REPLY.as_bytes()),
                abi::ModuleBuffer::of(b"1"),
            );
        }
        host::send_response(filter, 503, &reply, &body);
    });
}

/// The envelope of the request's path: Anthropic for `/v1/messages`, else OpenAI.
fn envelope_of(filter: FilterEnvoyPtr) -> Envelope {
    let mut path = EnvoyBuffer::NULL;
    // SAFETY: `path` outlives the call; the key is a static string.
    let ok = unsafe {
        abi::envoy_dynamic_module_callback_http_get_header(
            filter,
            abi::HEADER_REQUEST,
            abi::ModuleBuffer::of(b":path"),
            &mut path,
            0,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: filled by Envoy in this hook.
    let path = if ok { unsafe { path.bytes() } } else { None };
    match path {
        Some(p) if p.starts_with(b"/v1/messages") => Envelope::Anthropic,
        _ => Envelope::OpenAi,
    }
}

/// The size of the body the glue would read now (see `host::get_buffer`), from its chunks' lengths: a hook that
/// only counts the body copies none of it.
fn body_size(filter: FilterEnvoyPtr, buffer: BufferType) -> usize {
    View::of(filter, buffer).map_or(0, |b| b.len())
}

/// A request hook's answer `status`, noted: Envoy holds the request at this filter after any answer but "continue"
/// (each phase's continue is 0), until it resumes (see `body`, `streams::held`).
fn held(stream: &Stream, status: u32) -> u32 {
    streams::hold(stream.context, status != abi::HEADERS_CONTINUE);
    status
}

/// A request that pauses once it is whole waits (in the fair queue, or for a callout): with `fairness`, its
/// worker ticks while it does.
fn waits(stream: &Stream, action: Option<Action>, end_of_stream: bool) {
    if end_of_stream && action == Some(Action::Pause) && stream.fairness() {
        streams::want_ticks(stream.context);
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy's stream, see `stream_of`.
    if let Some(stream) = unsafe { stream_of(module) } {
        if stream.ctx.is_none() {
            // The worker refused the configuration (logged when it did): fail closed, as the wasm build's Http does.
            fail_closed(filter, stream);
            return abi::HEADERS_STOP_ITERATION;
        }
        stream.envelope = catch_unwind(|| envelope_of(filter)).unwrap_or(Envelope::OpenAi);
    }
    let f = |c: &mut dyn HttpContext, _| c.on_http_request_headers(0, end_of_stream);
    hook(filter, module, Part::Other, abi::HEADERS_CONTINUE, f, |stream, out| {
        waits(stream, out, end_of_stream);
        held(
            stream,
            match out {
                Some(Action::Continue) => abi::HEADERS_CONTINUE,
                Some(_) | None => abi::HEADERS_STOP_ITERATION,
            },
        )
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    let f = |c: &mut dyn HttpContext, size| c.on_http_request_body(size, end_of_stream);
    hook(
        filter,
        module,
        Part::RequestBody,
        abi::BODY_CONTINUE,
        f,
        |stream, out| {
            waits(stream, out, end_of_stream);
            stream.buffering_request = out == Some(Action::Pause);
            held(
                stream,
                match out {
                    Some(Action::Pause) => abi::BODY_STOP_ITERATION_AND_BUFFER,
                    Some(_) => abi::BODY_CONTINUE,
                    // The stream failed (answered with a 503): nothing more goes upstream.
                    None => abi::BODY_STOP_ITERATION_NO_BUFFER,
                },
            )
        },
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
) -> u32 {
    let f = |c: &mut dyn HttpContext, _| c.on_http_request_trailers(0);
    hook(filter, module, Part::Other, abi::TRAILERS_CONTINUE, f, |stream, out| {
        waits(stream, out, true);
        held(
            stream,
            match out {
                Some(Action::Continue) | None => abi::TRAILERS_CONTINUE,
                Some(_) => abi::TRAILERS_STOP_ITERATION,
            },
        )
    })
}

/// A response hook's answer: stop on `Pause`, else go on (also after a failure, whose 503 is on its way).
fn response_status(out: Option<Action>, stop: u32, go: u32) -> u32 {
    if out == Some(Action::Pause) {
        stop
    } else {
        go
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    let f = |c: &mut dyn HttpContext, _| c.on_http_response_headers(0, end_of_stream);
    hook(filter, module, Part::Other, abi::HEADERS_CONTINUE, f, |_, out| {
        response_status(out, abi::HEADERS_STOP_ITERATION, abi::HEADERS_CONTINUE)
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    let f = |c: &mut dyn HttpContext, size| c.on_http_response_body(size, end_of_stream);
    hook(
        filter,
        module,
        Part::ResponseBody,
        abi::BODY_CONTINUE,
        f,
        |stream, out| {
            stream.buffering_response = out == Some(Action::Pause);
            response_status(out, abi::BODY_STOP_ITERATION_AND_BUFFER, abi::BODY_CONTINUE)
        },
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
) -> u32 {
    let f = |c: &mut dyn HttpContext, _| c.on_http_response_trailers(0);
    hook(filter, module, Part::Other, abi::TRAILERS_CONTINUE, f, |_, out| {
        response_status(out, abi::TRAILERS_STOP_ITERATION, abi::TRAILERS_CONTINUE)
    })
}

/// Runs `f` on the stream behind `module` with its host context, inside a guard whose panic fails nothing more
/// (the stream is complete, or the hook has no reply to give).
pub(crate) fn guarded(filter: FilterEnvoyPtr, module: *const c_void, f: impl FnOnce(&mut Stream, Current)) {
    // SAFETY: Envoy's stream, see `stream_of`.
    let Some(stream) = (unsafe { stream_of(module) }) else {
        return;
    };
    let current = stream.current(filter);
    let _ = host::with_current(current, || {
        catch_unwind(AssertUnwindSafe(|| {
            f(stream, current);
            head_edit::flush()
        }))
    });
    head_edit::discard();
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(filter: FilterEnvoyPtr, module: *const c_void) {
    guarded(filter, module, |stream, _| {
        if let Some(c) = stream.ctx.as_deref_mut() {
            c.on_log();
        }
    });
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    if module.is_null() {
        return;
    }
    // SAFETY: made by `Box::into_raw` in `filter_new`, destroyed once by Envoy.
    let stream = unsafe { Box::from_raw(module.cast::<Stream>().cast_mut()) };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        streams::unregister(stream.context);
        drop(stream);
    }));
}
