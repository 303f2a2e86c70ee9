//! The event hooks Envoy calls (`envoy_dynamic_module_on_*`), each a thin shim onto the filter's own contexts.
//!
//! The glue in `filter/src` is written against proxy-wasm's `RootContext` and `HttpContext` traits; those are
//! plain Rust traits, so this module drives the very same `Root` and `Http` values the wasm build runs, through
//! the same methods, with the host swapped (`host.rs`). Nothing of the filter's logic is copied here.
//!
//! - One filter configuration (`config_new`, main thread) is validated once; Envoy refuses it when it is bad.
//! - Each worker thread builds its own `Root` for a configuration the first time a stream needs it, like the
//!   per-worker VM of the wasm build: the glue's `Rc` values never cross threads.
//! - Each stream is a `Stream`: the glue's `HttpContext` plus what the host needs to know between hooks
//!   (whether this filter is buffering each body).
//!
//! Panic safety: every hook runs the glue inside `catch_unwind` (the native profile unwinds). A panic fails that
//! stream closed, with a JSON 503 in its API's envelope, and the stream's context is dropped; Envoy carries on.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use llmroute_core::{headers, Envelope};
use proxy_wasm::traits::{HttpContext, RootContext};
use proxy_wasm::types::Action;

use crate::abi::{self, EnvoyBuffer, EnvoyHeader, FilterConfigEnvoyPtr, FilterConfigModulePtr, FilterEnvoyPtr};
use crate::host::{self, CalloutAnswer, Current};

/// One filter configuration: the filter name (`plugin_root_id`) and the plugin configuration bytes.
pub struct FilterConfig {
    pub id: u64,
    pub name: String,
    pub config: Vec<u8>,
}

static NEXT_CONFIG: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This worker's root context per configuration (`None` when it refused the configuration).
    static ROOTS: RefCell<HashMap<u64, Option<Box<llmroute_filter::Root>>>> = RefCell::new(HashMap::new());
    static NEXT_CONTEXT: Cell<u32> = const { Cell::new(1) };
}

/// One stream.
struct Stream {
    config: *const FilterConfig,
    /// `None` after a panic: the stream already failed, later hooks let it be.
    ctx: Option<Box<dyn HttpContext>>,
    buffering_request: bool,
    buffering_response: bool,
    /// The envelope of a failure reply (from the request path).
    envelope: Envelope,
}

impl Stream {
    fn current(&self, filter: FilterEnvoyPtr) -> Current {
        Current {
            filter,
            config: self.config,
            buffering_request: self.buffering_request,
            buffering_response: self.buffering_response,
            ..Current::NONE
        }
    }
}

/// Logs through Envoy (the filter's logger may not be installed yet).
fn log_error(message: &str) {
    // SAFETY: the buffer describes `message`, alive for the call.
    unsafe { abi::envoy_dynamic_module_callback_log(4, abi::ModuleBuffer::of(message.as_bytes())) };
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    let ok = catch_unwind(|| {
        llmroute_filter::init_logging(log::LevelFilter::Info, |level, message| {
            let _ = llmroute_filter::Host::log(&host::HOST, level, message);
        });
        // After init_logging's hook: a panic is caught, so it costs one request, not a VM.
        std::panic::set_hook(Box::new(|info| {
            log::error!("llmroute: panic, the request fails closed with a 503: {info}");
        }));
    });
    match ok {
        Ok(()) => abi::ABI_VERSION.as_ptr(),
        Err(_) => std::ptr::null(),
    }
}

/// Reads an Envoy buffer as owned bytes.
fn owned(b: EnvoyBuffer) -> Vec<u8> {
    // SAFETY: Envoy's buffer, alive for the hook.
    unsafe { b.bytes() }.map(<[u8]>::to_vec).unwrap_or_default()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _config_envoy: FilterConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> FilterConfigModulePtr {
    let made = catch_unwind(|| {
        let cfg = FilterConfig {
            id: NEXT_CONFIG.fetch_add(1, Ordering::Relaxed),
            name: String::from_utf8_lossy(&owned(name)).into_owned(),
            config: owned(config),
        };
        let Ok(text) = std::str::from_utf8(&cfg.config) else {
            log_error("llmroute: the filter_config is not UTF-8");
            return std::ptr::null();
        };
        if let Err(errs) = llmroute_core::load_config(text) {
            for e in &errs.0 {
                log_error(&format!("llmroute config: {e}"));
            }
            return std::ptr::null();
        }
        Box::into_raw(Box::new(cfg)).cast_const().cast::<c_void>()
    });
    made.unwrap_or(std::ptr::null())
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: FilterConfigModulePtr) {
    if config.is_null() {
        return;
    }
    // SAFETY: made by `Box::into_raw` in `config_new`, destroyed once by Envoy.
    let cfg = unsafe { Box::from_raw(config.cast::<FilterConfig>().cast_mut()) };
    let _ = catch_unwind(AssertUnwindSafe(|| drop(cfg)));
}

/// This worker's root context for `cfg`, made and configured on first use.
fn with_root<T>(cfg: &FilterConfig, f: impl FnOnce(Option<&llmroute_filter::Root>) -> T) -> T {
    ROOTS.with(|roots| {
        let mut roots = roots.borrow_mut();
        let root = roots.entry(cfg.id).or_insert_with(|| {
            let current = Current {
                config: cfg,
                ..Current::NONE
            };
            host::with_current(current, || {
                let envoy = llmroute_filter::Envoy::new(std::rc::Rc::new(host::NativeHost));
                let mut root = Box::new(llmroute_filter::Root::new(envoy));
                (root.on_vm_start(0) && root.on_configure(cfg.config.len())).then_some(root)
            })
        });
        f(root.as_deref())
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: FilterConfigModulePtr,
    _filter: FilterEnvoyPtr,
) -> *const c_void {
    // SAFETY: made by `config_new`; Envoy keeps it alive while any of its streams lives.
    let Some(cfg) = (unsafe { config.cast::<FilterConfig>().as_ref() }) else {
        return std::ptr::null();
    };
    let made = catch_unwind(AssertUnwindSafe(|| {
        let context_id = NEXT_CONTEXT.with(|n| {
            let id = n.get();
            n.set(id.wrapping_add(1).max(1));
            id
        });
        let current = Current {
            config: cfg,
            ..Current::NONE
        };
        let ctx = with_root(cfg, |root| {
            host::with_current(current, || root.and_then(|r| r.create_http_context(context_id)))
        });
        Stream {
            config: cfg,
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
unsafe fn stream_of<'a>(module: *const c_void) -> Option<&'a mut Stream> {
    // SAFETY: the caller's contract.
    unsafe { module.cast::<Stream>().cast_mut().as_mut() }
}

/// Runs one glue callback for a stream, with the stream's host context; a panic fails the stream closed.
/// `None` when the stream has no context (it failed before, or the worker refused the configuration).
fn run<T>(
    filter: FilterEnvoyPtr,
    stream: &mut Stream,
    current: Current,
    f: impl FnOnce(&mut dyn HttpContext) -> T,
) -> Option<T> {
    let ctx = stream.ctx.as_deref_mut()?;
    let out = host::with_current(current, || catch_unwind(AssertUnwindSafe(|| f(ctx))));
    match out {
        Ok(v) => Some(v),
        Err(_) => {
            fail_closed(filter, stream);
            None
        }
    }
}

/// After a panic: drops the stream's context (inside its own guard) and answers 503 in the API's envelope.
fn fail_closed(filter: FilterEnvoyPtr, stream: &mut Stream) {
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

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy's stream, see `stream_of`.
    let Some(stream) = (unsafe { stream_of(module) }) else {
        return abi::HEADERS_CONTINUE;
    };
    if stream.ctx.is_none() {
        // The worker refused the configuration (logged when it did): fail closed, as the wasm build's Http does.
        fail_closed(filter, stream);
        return abi::HEADERS_STOP_ITERATION;
    }
    stream.envelope = catch_unwind(|| envelope_of(filter)).unwrap_or(Envelope::OpenAi);
    let current = stream.current(filter);
    match run(filter, stream, current, |c| c.on_http_request_headers(0, end_of_stream)) {
        Some(Action::Continue) => abi::HEADERS_CONTINUE,
        Some(_) | None => abi::HEADERS_STOP_ITERATION,
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy's stream, see `stream_of`.
    let Some(stream) = (unsafe { stream_of(module) }) else {
        return abi::BODY_CONTINUE;
    };
    let current = Current {
        in_request_body: true,
        ..stream.current(filter)
    };
    let size = host::with_current(current, || body_size(true));
    match run(filter, stream, current, |c| c.on_http_request_body(size, end_of_stream)) {
        Some(Action::Pause) => {
            stream.buffering_request = true;
            abi::BODY_STOP_ITERATION_AND_BUFFER
        }
        Some(_) => {
            stream.buffering_request = false;
            abi::BODY_CONTINUE
        }
        // The stream failed (answered with a 503): nothing more goes upstream.
        None => abi::BODY_STOP_ITERATION_NO_BUFFER,
    }
}

/// The size of the body the glue would read now (see `host::get_buffer`).
fn body_size(request: bool) -> usize {
    use llmroute_filter::Host;
    let buffer = if request {
        proxy_wasm::types::BufferType::HttpRequestBody
    } else {
        proxy_wasm::types::BufferType::HttpResponseBody
    };
    host::HOST
        .get_buffer(buffer, 0, usize::MAX)
        .ok()
        .flatten()
        .map_or(0, |b| b.len())
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
) -> u32 {
    // SAFETY: Envoy's stream, see `stream_of`.
    let Some(stream) = (unsafe { stream_of(module) }) else {
        return abi::TRAILERS_CONTINUE;
    };
    let current = stream.current(filter);
    match run(filter, stream, current, |c| c.on_http_request_trailers(0)) {
        Some(Action::Continue) => abi::TRAILERS_CONTINUE,
        Some(_) => abi::TRAILERS_STOP_ITERATION,
        None => abi::TRAILERS_CONTINUE,
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy's stream, see `stream_of`.
    let Some(stream) = (unsafe { stream_of(module) }) else {
        return abi::HEADERS_CONTINUE;
    };
    let current = stream.current(filter);
    match run(filter, stream, current, |c| {
        c.on_http_response_headers(0, end_of_stream)
    }) {
        Some(Action::Pause) => abi::HEADERS_STOP_ITERATION,
        Some(_) | None => abi::HEADERS_CONTINUE,
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    filter: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy's stream, see `stream_of`.
    let Some(stream) = (unsafe { stream_of(module) }) else {
        return abi::BODY_CONTINUE;
    };
    let current = Current {
        in_response_body: true,
        ..stream.current(filter)
    };
    let size = host::with_current(current, || body_size(false));
    match run(filter, stream, current, |c| {
        c.on_http_response_body(size, end_of_stream)
    }) {
        Some(Action::Pause) => {
            stream.buffering_response = true;
            abi::BODY_STOP_ITERATION_AND_BUFFER
        }
        Some(_) | None => {
            stream.buffering_response = false;
            abi::BODY_CONTINUE
        }
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    filter: FilterEnvoyPtr,
    module: *const c_void,
) -> u32 {
    // SAFETY: Envoy's stream, see `stream_of`.
    let Some(stream) = (unsafe { stream_of(module) }) else {
        return abi::TRAILERS_CONTINUE;
    };
    let current = stream.current(filter);
    match run(filter, stream, current, |c| c.on_http_response_trailers(0)) {
        Some(Action::Pause) => abi::TRAILERS_STOP_ITERATION,
        Some(_) | None => abi::TRAILERS_CONTINUE,
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(filter: FilterEnvoyPtr, module: *const c_void) {
    // SAFETY: Envoy's stream, see `stream_of`.
    let Some(stream) = (unsafe { stream_of(module) }) else {
        return;
    };
    let current = stream.current(filter);
    let ctx = stream.ctx.as_deref_mut();
    let _ = host::with_current(current, || {
        catch_unwind(AssertUnwindSafe(|| {
            if let Some(c) = ctx {
                c.on_log();
            }
        }))
    });
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    if module.is_null() {
        return;
    }
    // SAFETY: made by `Box::into_raw` in `filter_new`, destroyed once by Envoy.
    let stream = unsafe { Box::from_raw(module.cast::<Stream>().cast_mut()) };
    let _ = catch_unwind(AssertUnwindSafe(|| drop(stream)));
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
    let mut answer = CalloutAnswer::default();
    if result == abi::CALLOUT_SUCCESS {
        if !headers.is_null() {
            // SAFETY: Envoy's array of `headers_size` headers, alive for this hook.
            for h in unsafe { std::slice::from_raw_parts(headers, headers_size) } {
                // SAFETY: as above.
                let (k, v) = unsafe { h.pair() };
                answer
                    .headers
                    .push((String::from_utf8_lossy(k).into_owned(), v.to_vec()));
            }
        }
        if !body_chunks.is_null() {
            // SAFETY: Envoy's array of `body_chunks_size` buffers, alive for this hook.
            for c in unsafe { std::slice::from_raw_parts(body_chunks, body_chunks_size) } {
                // SAFETY: as above.
                answer.body.extend_from_slice(unsafe { c.bytes() }.unwrap_or_default());
            }
        }
    }
    let (n, size) = (answer.headers.len(), answer.body.len());
    let current = stream.current(filter);
    host::with_answer(answer, || {
        run(filter, stream, current, |c| c.on_http_call_response(token, n, size, 0));
    });
}

// The hooks Envoy requires that this filter does not use: streamed callouts, scheduling and watermarks.

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    std::ptr::null()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(_config: *const c_void) {}

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

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
    _stream_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
    _stream_id: u64,
    _reason: u32,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
    _event_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _filter: FilterEnvoyPtr,
    _module: *const c_void,
) {
}
