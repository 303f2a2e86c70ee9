//! The filter's [`Host`] over Envoy's dynamic-module callbacks.
//!
//! The glue (`filter/src`) asks its host for "the request headers", "the request body", and so on, without
//! naming a stream: proxy-wasm knows which stream a VM is serving. Here each event hook names its stream in a
//! thread-local [`Current`] before it calls into the glue (see `hooks.rs`), and every call below reads it. A call
//! made with no stream (a worker's root context configuring itself) fails like a proxy-wasm call in the wrong
//! phase, and the glue logs it.
//!
//! Bodies: proxy-wasm hands the filter the whole body buffered so far; Envoy's dynamic-module ABI splits it
//! into the chunks buffered earlier and the chunk just received. [`Current`] says which to join: the buffered
//! ones only while this filter is the one buffering (it answered "stop and buffer" before), as Envoy's wasm
//! host does, then the received ones. A write (the request's `model` edit) is applied to the joined bytes and
//! put back whole.
//!
//! A request-header change clears Envoy's cached route, as Envoy's wasm host does: the route reads the headers
//! the filter sets.
//!
//! Properties are the few paths the glue reads, mapped to Envoy attributes and metadata; a property the glue
//! writes (an access-log field) is filter state `wasm.<name>`, the name the rendered access log reads for both
//! builds. Shared data and metrics are process-wide Rust state (`shared.rs`).

use std::cell::{Cell, RefCell};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use llmroute_filter::{Host, HostError, HostResult, HostStatus};
use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType};

use crate::abi::{self, EnvoyBuffer, EnvoyHeader, FilterEnvoyPtr, ModuleBuffer, ModuleHeader};
use crate::shared;

/// What the running event hook is serving.
#[derive(Clone, Copy)]
pub struct Current {
    /// The stream, or null for a root context.
    pub filter: FilterEnvoyPtr,
    /// The plugin configuration (`filter_config`) and the filter name (`plugin_root_id`), owned by the config.
    pub config: *const crate::config::FilterConfig,
    /// The stream's context id on this worker (0 for a root context).
    pub context: u32,
    /// The context id of the stream whose hook is running (0 in a root context's hook): a call for another
    /// stream (after `set_effective_context`) that must run in that stream's own hook is deferred to it.
    pub hook_context: u32,
    /// The main thread's root context of the configuration: it ticks and calls out through the configuration.
    pub main: bool,
    /// Inside the request (response) body hook: the received chunk is readable.
    pub in_request_body: bool,
    pub in_response_body: bool,
    /// This filter answered "stop and buffer" to the previous request (response) body chunk.
    pub buffering_request: bool,
    pub buffering_response: bool,
}

impl Current {
    pub const NONE: Current = Current {
        filter: std::ptr::null_mut(),
        config: std::ptr::null(),
        context: 0,
        hook_context: 0,
        main: false,
        in_request_body: false,
        in_response_body: false,
        buffering_request: false,
        buffering_response: false,
    };

    /// True when the effective stream is not the one whose hook is running.
    fn other(&self) -> bool {
        self.context != self.hook_context
    }
}

/// An HTTP callout's answer, while `on_http_call_response` reads it.
#[derive(Default)]
pub struct CalloutAnswer {
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl CalloutAnswer {
    /// The answer Envoy hands a callout-done hook (empty unless the callout succeeded).
    ///
    /// # Safety
    /// `headers` and `body_chunks` are null or Envoy's arrays of `headers_size` and `body_chunks_size` entries,
    /// alive for the running hook.
    pub unsafe fn of(
        result: u32,
        headers: *const EnvoyHeader,
        headers_size: usize,
        body_chunks: *const EnvoyBuffer,
        body_chunks_size: usize,
    ) -> CalloutAnswer {
        let mut answer = CalloutAnswer::default();
        if result != abi::CALLOUT_SUCCESS {
            return answer;
        }
        if !headers.is_null() {
            // SAFETY: the caller's contract.
            for h in unsafe { std::slice::from_raw_parts(headers, headers_size) } {
                // SAFETY: as above.
                let (k, v) = unsafe { h.pair() };
                answer
                    .headers
                    .push((String::from_utf8_lossy(k).into_owned(), v.to_vec()));
            }
        }
        if !body_chunks.is_null() {
            // SAFETY: the caller's contract.
            for c in unsafe { std::slice::from_raw_parts(body_chunks, body_chunks_size) } {
                // SAFETY: as above.
                answer.body.extend_from_slice(unsafe { c.bytes() }.unwrap_or_default());
            }
        }
        answer
    }
}

thread_local! {
    static CURRENT: Cell<Current> = const { Cell::new(Current::NONE) };
    static ANSWER: RefCell<Option<CalloutAnswer>> = const { RefCell::new(None) };
}

/// Runs `f` with `current` as this thread's stream, restoring the previous one after (hooks do not nest, but a
/// local reply sent from a hook may run another filter's hooks on the same thread).
pub fn with_current<T>(current: Current, f: impl FnOnce() -> T) -> T {
    let previous = CURRENT.with(|c| c.replace(current));
    let out = f();
    CURRENT.with(|c| c.set(previous));
    out
}

/// Runs `f` with `answer` readable as the callout response.
pub fn with_answer<T>(answer: CalloutAnswer, f: impl FnOnce() -> T) -> T {
    let previous = ANSWER.with(|a| a.replace(Some(answer)));
    let out = f();
    ANSWER.with(|a| *a.borrow_mut() = previous);
    out
}

pub fn current() -> Current {
    CURRENT.with(Cell::get)
}

/// Runs `f` on the running hook's configuration, if it names one.
fn with_config(f: impl FnOnce(&crate::config::FilterConfig)) {
    // SAFETY: the config outlives every hook that names it.
    if let Some(cfg) = unsafe { current().config.as_ref() } {
        f(cfg);
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

fn err<T>(call: &'static str, status: HostStatus) -> HostResult<T> {
    Err(HostError { call, status })
}

/// The running hook's stream, or `BadArgument` when it has none.
fn stream(call: &'static str) -> HostResult<FilterEnvoyPtr> {
    let f = current().filter;
    if f.is_null() {
        return err(call, HostStatus::BadArgument);
    }
    Ok(f)
}

fn header_type(map: MapType) -> Option<u32> {
    match map {
        MapType::HttpRequestHeaders => Some(abi::HEADER_REQUEST),
        MapType::HttpRequestTrailers => Some(abi::HEADER_REQUEST_TRAILER),
        MapType::HttpResponseHeaders => Some(abi::HEADER_RESPONSE),
        MapType::HttpResponseTrailers => Some(abi::HEADER_RESPONSE_TRAILER),
        _ => None,
    }
}

/// The body chunk types to join for `buffer`: (buffered, received), each when it applies now.
fn body_parts(buffer: BufferType) -> Option<(Option<u32>, Option<u32>, bool)> {
    let c = current();
    match buffer {
        BufferType::HttpRequestBody => Some((
            c.buffering_request.then_some(abi::BODY_BUFFERED_REQUEST),
            c.in_request_body.then_some(abi::BODY_RECEIVED_REQUEST),
            true,
        )),
        BufferType::HttpResponseBody => Some((
            c.buffering_response.then_some(abi::BODY_BUFFERED_RESPONSE),
            c.in_response_body.then_some(abi::BODY_RECEIVED_RESPONSE),
            false,
        )),
        _ => None,
    }
}

/// Appends the chunks of `body_type` to `out`.
fn read_chunks(filter: FilterEnvoyPtr, body_type: u32, out: &mut Vec<u8>) -> bool {
    // SAFETY: `filter` is the running hook's stream.
    let n = unsafe { abi::envoy_dynamic_module_callback_http_get_body_chunks_size(filter, body_type) };
    if n == 0 {
        return false;
    }
    let mut chunks = vec![EnvoyBuffer::NULL; n];
    // SAFETY: `chunks` has room for the `n` buffers Envoy reported.
    if !unsafe { abi::envoy_dynamic_module_callback_http_get_body_chunks(filter, body_type, chunks.as_mut_ptr()) } {
        return false;
    }
    for chunk in chunks {
        // SAFETY: filled by Envoy in this hook.
        if let Some(bytes) = unsafe { chunk.bytes() } {
            out.extend_from_slice(bytes);
        }
    }
    true
}

/// The whole body the glue sees for `buffer`: the buffered chunks (while buffering) then the received ones,
/// unless Envoy says the received chunk is the buffered body itself.
fn joined_body(filter: FilterEnvoyPtr, buffered: Option<u32>, received: Option<u32>, request: bool) -> Vec<u8> {
    let mut body = Vec::new();
    let same = match (buffered, received) {
        // SAFETY: `filter` is the running hook's stream.
        (Some(_), Some(_)) if request => unsafe {
            abi::envoy_dynamic_module_callback_http_received_buffered_request_body(filter)
        },
        // SAFETY: as above.
        (Some(_), Some(_)) => unsafe {
            abi::envoy_dynamic_module_callback_http_received_buffered_response_body(filter)
        },
        _ => false,
    };
    if let Some(t) = buffered {
        read_chunks(filter, t, &mut body);
    }
    if let Some(t) = received.filter(|_| !same) {
        read_chunks(filter, t, &mut body);
    }
    body
}

fn header_pairs(filter: FilterEnvoyPtr, header_type: u32) -> Vec<(String, Vec<u8>)> {
    // SAFETY: `filter` is the running hook's stream.
    let n = unsafe { abi::envoy_dynamic_module_callback_http_get_headers_size(filter, header_type) };
    if n == 0 {
        return Vec::new();
    }
    let mut headers = vec![EnvoyHeader::NULL; n];
    // SAFETY: `headers` has room for the `n` headers Envoy reported.
    if !unsafe { abi::envoy_dynamic_module_callback_http_get_headers(filter, header_type, headers.as_mut_ptr()) } {
        return Vec::new();
    }
    headers
        .into_iter()
        .map(|h| {
            // SAFETY: filled by Envoy in this hook.
            let (k, v) = unsafe { h.pair() };
            (String::from_utf8_lossy(k).into_owned(), v.to_vec())
        })
        .collect()
}

fn attribute_string(filter: FilterEnvoyPtr, id: u32) -> Option<Vec<u8>> {
    let mut out = EnvoyBuffer::NULL;
    // SAFETY: `out` outlives the call; `filter` is the running hook's stream.
    let ok = unsafe { abi::envoy_dynamic_module_callback_http_filter_get_attribute_string(filter, id, &mut out) };
    // SAFETY: filled by Envoy in this hook.
    ok.then(|| unsafe { out.bytes() }.map(<[u8]>::to_vec)).flatten()
}

/// Replaces `start..start + size` of `body` with `value` (bounded to the body).
fn splice(body: &mut Vec<u8>, start: usize, size: usize, value: &[u8]) {
    let start = start.min(body.len());
    let end = start.saturating_add(size).min(body.len());
    body.splice(start..end, value.iter().copied());
}

/// The host: unit struct, all state in the thread-local [`Current`] and in `shared`.
pub struct NativeHost;

pub static HOST: NativeHost = NativeHost;

impl Host for NativeHost {
    fn log(&self, level: LogLevel, message: &str) -> HostResult<()> {
        // SAFETY: the buffer describes `message`, alive for the call.
        unsafe { abi::envoy_dynamic_module_callback_log(level as u32, ModuleBuffer::of(message.as_bytes())) };
        Ok(())
    }

    fn now_nanos(&self) -> HostResult<u64> {
        let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Ok(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    fn set_tick_period_ms(&self, period: u32) -> HostResult<()> {
        let c = current();
        // SAFETY: the config outlives every hook that names it.
        match unsafe { c.config.as_ref() } {
            // The main thread's root ticks (see `periodic`); a worker's root ticks only for its own share, while
            // one of its streams waits (see `streams`).
            Some(cfg) if c.main => cfg.periodic.set_period(period),
            Some(_) => {}
            None => return err("set_tick_period", HostStatus::BadArgument),
        }
        Ok(())
    }

    fn get_buffer(&self, buffer: BufferType, start: usize, max: usize) -> HostResult<Option<Vec<u8>>> {
        let bytes = match buffer {
            BufferType::PluginConfiguration => {
                let cfg = current().config;
                // SAFETY: the config outlives every hook that names it.
                match unsafe { cfg.as_ref() } {
                    Some(c) => c.config.clone(),
                    None => return Ok(None),
                }
            }
            BufferType::HttpCallResponseBody => match ANSWER.with(|a| a.borrow().as_ref().map(|a| a.body.clone())) {
                Some(b) => b,
                None => return Ok(None),
            },
            _ => {
                let Some((buffered, received, request)) = body_parts(buffer) else {
                    return Ok(None);
                };
                let filter = stream("get_buffer")?;
                joined_body(filter, buffered, received, request)
            }
        };
        let from = start.min(bytes.len());
        let to = from.saturating_add(max).min(bytes.len());
        Ok(bytes.get(from..to).map(<[u8]>::to_vec))
    }

    fn set_buffer(&self, buffer: BufferType, start: usize, size: usize, value: &[u8]) -> HostResult<()> {
        let Some((buffered, received, request)) = body_parts(buffer) else {
            return err("set_buffer", HostStatus::BadArgument);
        };
        let filter = stream("set_buffer")?;
        let mut body = joined_body(filter, buffered, received, request);
        splice(&mut body, start, size, value);
        // Drain every chunk the glue saw, then put the edited body where Envoy continues from: the received
        // chunk inside a body hook (Envoy moves it behind the buffered ones), else the buffered body.
        let (buffered_type, received_type) = if request {
            (abi::BODY_BUFFERED_REQUEST, abi::BODY_RECEIVED_REQUEST)
        } else {
            (abi::BODY_BUFFERED_RESPONSE, abi::BODY_RECEIVED_RESPONSE)
        };
        // SAFETY: `filter` is the running hook's stream; the buffers live for each call.
        unsafe {
            if buffered.is_some() {
                abi::envoy_dynamic_module_callback_http_drain_body(filter, buffered_type, usize::MAX);
            }
            if received.is_some() {
                abi::envoy_dynamic_module_callback_http_drain_body(filter, received_type, usize::MAX);
            }
            let target = if received.is_some() {
                received_type
            } else {
                buffered_type
            };
            if !abi::envoy_dynamic_module_callback_http_append_body(filter, target, ModuleBuffer::of(&body)) {
                return err("set_buffer", HostStatus::NotFound);
            }
        }
        Ok(())
    }

    fn get_map(&self, map: MapType) -> HostResult<Vec<(String, Vec<u8>)>> {
        if let MapType::HttpCallResponseHeaders = map {
            return Ok(ANSWER.with(|a| a.borrow().as_ref().map(|a| a.headers.clone()).unwrap_or_default()));
        }
        let Some(t) = header_type(map) else {
            return err("get_map", HostStatus::BadArgument);
        };
        Ok(header_pairs(stream("get_map")?, t))
    }

    fn get_map_value(&self, map: MapType, key: &str) -> HostResult<Option<Vec<u8>>> {
        if let MapType::HttpCallResponseHeaders = map {
            return Ok(ANSWER.with(|a| {
                let a = a.borrow();
                let found = a.as_ref()?.headers.iter().find(|(n, _)| n == key);
                found.map(|(_, v)| v.clone())
            }));
        }
        let Some(t) = header_type(map) else {
            return err("get_map_value", HostStatus::BadArgument);
        };
        let filter = stream("get_map_value")?;
        let mut out = EnvoyBuffer::NULL;
        // SAFETY: `out` outlives the call; the key buffer describes `key`.
        let ok = unsafe {
            abi::envoy_dynamic_module_callback_http_get_header(
                filter,
                t,
                ModuleBuffer::of(key.as_bytes()),
                &mut out,
                0,
                std::ptr::null_mut(),
            )
        };
        // SAFETY: filled by Envoy in this hook.
        Ok(ok.then(|| unsafe { out.bytes() }.map(<[u8]>::to_vec)).flatten())
    }

    fn set_map_value(&self, map: MapType, key: &str, value: Option<&str>) -> HostResult<()> {
        let Some(t) = header_type(map) else {
            return err("set_map_value", HostStatus::BadArgument);
        };
        let filter = stream("set_map_value")?;
        let value = value.map_or(ModuleBuffer::NULL, |v| ModuleBuffer::of(v.as_bytes()));
        // SAFETY: the buffers describe `key` and `value`, alive for the call.
        let ok = unsafe {
            abi::envoy_dynamic_module_callback_http_set_header(filter, t, ModuleBuffer::of(key.as_bytes()), value)
        };
        if ok && t == abi::HEADER_REQUEST {
            // The route reads the cluster and hash headers the filter sets: as Envoy's wasm host does on every
            // request-header change, drop the route Envoy picked before the filter ran.
            // SAFETY: `filter` is the running hook's stream.
            unsafe { abi::envoy_dynamic_module_callback_http_clear_route_cache(filter) };
        }
        if ok {
            Ok(())
        } else {
            err("set_map_value", HostStatus::NotFound)
        }
    }

    fn get_property(&self, path: &[&str]) -> HostResult<Option<Vec<u8>>> {
        if path == ["plugin_root_id"] {
            // SAFETY: the config outlives every hook that names it.
            return Ok(unsafe { current().config.as_ref() }.map(|c| c.name.clone().into_bytes()));
        }
        let filter = stream("get_property")?;
        Ok(match path {
            ["upstream", "address"] => attribute_string(filter, abi::ATTRIBUTE_UPSTREAM_ADDRESS),
            ["response", "code_details"] => attribute_string(filter, abi::ATTRIBUTE_RESPONSE_CODE_DETAILS),
            ["response", "code"] => {
                let mut code = 0u64;
                // SAFETY: `code` outlives the call.
                let ok = unsafe {
                    abi::envoy_dynamic_module_callback_http_filter_get_attribute_int(
                        filter,
                        abi::ATTRIBUTE_RESPONSE_CODE,
                        &mut code,
                    )
                };
                // proxy-wasm serialises an integer property as 8 little-endian bytes.
                ok.then(|| code.to_le_bytes().to_vec())
            }
            ["xds", "upstream_host_metadata", "filter_metadata", ns, key] => {
                let mut out = EnvoyBuffer::NULL;
                // SAFETY: `out` outlives the call; the buffers describe `ns` and `key`.
                let ok = unsafe {
                    abi::envoy_dynamic_module_callback_http_get_metadata_string(
                        filter,
                        abi::METADATA_HOST,
                        ModuleBuffer::of(ns.as_bytes()),
                        ModuleBuffer::of(key.as_bytes()),
                        &mut out,
                    )
                };
                // SAFETY: filled by Envoy in this hook.
                ok.then(|| unsafe { out.bytes() }.map(<[u8]>::to_vec)).flatten()
            }
            _ => None,
        })
    }

    fn set_property(&self, path: &[&str], value: &[u8]) -> HostResult<()> {
        let filter = stream("set_property")?;
        let key = format!("wasm.{}", path.join("."));
        // SAFETY: the buffers describe `key` and `value`, alive for the call.
        let ok = unsafe {
            abi::envoy_dynamic_module_callback_http_set_filter_state_bytes(
                filter,
                ModuleBuffer::of(key.as_bytes()),
                ModuleBuffer::of(value),
            )
        };
        if ok {
            Ok(())
        } else {
            err("set_property", HostStatus::NotFound)
        }
    }

    fn get_shared_data(&self, key: &str) -> HostResult<(Option<Vec<u8>>, Option<u32>)> {
        Ok(shared::get(key))
    }

    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> HostResult<()> {
        shared::set(key, value, cas)
    }

    fn send_local_response(&self, status: u32, headers: &[(&str, &str)], body: &[u8]) -> HostResult<()> {
        let filter = stream("send_local_response")?;
        let c = current();
        if c.other() {
            let reply = crate::streams::Deferred::Reply {
                status,
                headers: headers
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                    .collect(),
                body: body.to_vec(),
            };
            return crate::streams::defer(c.context, reply).then_some(()).ok_or(HostError {
                call: "send_local_response",
                status: HostStatus::NotFound,
            });
        }
        send_response(filter, status, headers, body);
        Ok(())
    }

    fn http_call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> HostResult<u32> {
        let c = current();
        let hdrs: Vec<ModuleHeader> = headers.iter().map(|(k, v)| ModuleHeader::of(k, v)).collect();
        let (cluster, body) = (
            ModuleBuffer::of(cluster.as_bytes()),
            body.map_or(ModuleBuffer::NULL, ModuleBuffer::of),
        );
        let mut id = 0u64;
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        // SAFETY: the config outlives every hook that names it.
        let result = match unsafe { c.config.as_ref() } {
            // The main thread's root calls out through its configuration; a worker's root has no callout of its
            // own in this ABI (its periodic jobs run on the main thread's root).
            Some(cfg) if c.main && c.filter.is_null() => {
                // SAFETY: `id` and every buffer outlive the call; `cfg.envoy` is Envoy's live configuration.
                unsafe {
                    abi::envoy_dynamic_module_callback_http_filter_config_http_callout(
                        cfg.envoy,
                        &mut id,
                        cluster,
                        hdrs.as_ptr(),
                        hdrs.len(),
                        body,
                        timeout_ms,
                    )
                }
            }
            _ => {
                let filter = stream("http_call")?;
                // SAFETY: `id` and every buffer outlive the call.
                unsafe {
                    abi::envoy_dynamic_module_callback_http_filter_http_callout(
                        filter,
                        &mut id,
                        cluster,
                        hdrs.as_ptr(),
                        hdrs.len(),
                        body,
                        timeout_ms,
                    )
                }
            }
        };
        if result != abi::CALLOUT_INIT_SUCCESS {
            return err("http_call", HostStatus::Other(result));
        }
        u32::try_from(id).or(err("http_call", HostStatus::InternalFailure))
    }

    fn define_metric(&self, _kind: MetricType, name: &str) -> HostResult<u32> {
        let id = shared::define_metric(name)?;
        with_config(|cfg| crate::metrics::defined(id, name, &cfg.families, cfg.envoy));
        Ok(id)
    }

    fn increment_metric(&self, id: u32, by: i64) -> HostResult<()> {
        shared::increment_metric(id, by)?;
        with_config(|cfg| crate::metrics::update(id, crate::metrics::Op::Add(by), &cfg.families, cfg.envoy));
        Ok(())
    }

    fn record_metric(&self, id: u32, value: u64) -> HostResult<()> {
        shared::record_metric(id, value)?;
        with_config(|cfg| crate::metrics::update(id, crate::metrics::Op::Record(value), &cfg.families, cfg.envoy));
        Ok(())
    }

    fn get_metric(&self, id: u32) -> HostResult<u64> {
        shared::get_metric(id)
    }

    fn resume_request(&self) -> HostResult<()> {
        let filter = stream("resume_request")?;
        let c = current();
        if c.other() {
            // Another stream (a fair-queue waiter this worker releases): it resumes in its own hook.
            return crate::streams::defer(c.context, crate::streams::Deferred::Resume)
                .then_some(())
                .ok_or(HostError {
                    call: "resume_request",
                    status: HostStatus::NotFound,
                });
        }
        crate::streams::resumed(c.context);
        // SAFETY: `filter` is the running hook's stream.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_continue_decoding(filter) };
        Ok(())
    }

    /// Makes a live stream of this worker the effective one (the fair queue releasing a waiter): header and
    /// filter-state writes apply to it at once; a resume or a reply is deferred to its own hook (`streams`).
    fn set_effective_context(&self, context_id: u32) -> HostResult<()> {
        let c = current();
        let Some((filter, config)) = crate::streams::live(context_id) else {
            return err("set_effective_context", HostStatus::NotFound);
        };
        let next = Current {
            filter,
            config,
            context: context_id,
            hook_context: c.hook_context,
            ..Current::NONE
        };
        CURRENT.with(|cur| cur.set(next));
        Ok(())
    }
}

/// Sends a local reply on `filter`.
pub fn send_response(filter: FilterEnvoyPtr, status: u32, headers: &[(&str, &str)], body: &[u8]) {
    let hdrs: Vec<ModuleHeader> = headers.iter().map(|(k, v)| ModuleHeader::of(k, v)).collect();
    // SAFETY: every buffer outlives the call; `filter` is the running hook's stream.
    unsafe {
        abi::envoy_dynamic_module_callback_http_send_response(
            filter,
            status,
            hdrs.as_ptr(),
            hdrs.len(),
            ModuleBuffer::of(body),
            ModuleBuffer::NULL,
        );
    }
}
