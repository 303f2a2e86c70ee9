//! The filter's [`Host`] over Envoy's dynamic-module callbacks.
//!
//! The glue (`filter/src`) asks its host for "the request headers", "the request body", and so on, without
//! naming a stream: proxy-wasm knows which stream a VM is serving. Here each event hook names its stream in a
//! thread-local [`Current`] before it calls into the glue (see `current.rs`, `hooks.rs`), and every call below
//! reads it. A call made with no stream (a worker's root context configuring itself) fails like a proxy-wasm call
//! in the wrong phase, and the glue logs it. Bodies are presented as proxy-wasm presents them, read in place and
//! edited at their ends (`body.rs`).
//!
//! A request-header change clears Envoy's cached route, as Envoy's wasm host does: the route reads the headers
//! the filter sets.
//!
//! Properties are the few paths the glue reads, mapped to Envoy attributes and metadata; a property the glue
//! writes (an access-log field) is filter state `wasm.<name>`, the name the rendered access log reads for both
//! builds. Shared data is process-wide Rust state (`shared.rs`); metrics are Envoy's stats too (`metrics.rs`).
//!
//! After `set_effective_context` (the fair queue releasing a waiter) the effective stream is another one of this
//! worker: a resume or a local reply for it is deferred to its own hook (`streams.rs`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use llmroute_filter::{Host, HostError, HostResult, HostStatus};
use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType};

use crate::abi::{self, EnvoyBuffer, EnvoyHeader, FilterEnvoyPtr, ModuleBuffer, ModuleHeader};
use crate::body::View;
use crate::head_edit;
use crate::shared;

pub use crate::current::{current, now_ms, with_answer, with_current, CalloutAnswer, Current};
use crate::current::{switch_to, with_answer_read};

/// Runs `f` on the running hook's configuration, if it names one.
fn with_config(f: impl FnOnce(&crate::config::FilterConfig)) {
    // SAFETY: the config outlives every hook that names it.
    if let Some(cfg) = unsafe { current().config.as_ref() } {
        f(cfg);
    }
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
            (text(k), v.to_vec())
        })
        .collect()
}

/// A header name as text: one copy when it is UTF-8 (a name always is: Envoy accepts only token characters).
fn text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(t) => t.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

fn attribute_string(filter: FilterEnvoyPtr, id: u32) -> Option<Vec<u8>> {
    let mut out = EnvoyBuffer::NULL;
    // SAFETY: `out` outlives the call; `filter` is the running hook's stream.
    let ok = unsafe { abi::envoy_dynamic_module_callback_http_filter_get_attribute_string(filter, id, &mut out) };
    // SAFETY: filled by Envoy in this hook.
    ok.then(|| unsafe { out.bytes() }.map(<[u8]>::to_vec)).flatten()
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
        // Only the asked range is copied, once.
        let range = |bytes: &[u8]| crate::body::copy_range(&[bytes], start, max);
        match buffer {
            BufferType::PluginConfiguration => {
                let cfg = current().config;
                // SAFETY: the config outlives every hook that names it.
                Ok(unsafe { cfg.as_ref() }.map(|c| range(&c.config)))
            }
            BufferType::HttpCallResponseBody => Ok(with_answer_read(|a| a.map(|a| range(&a.body)))),
            // Bench builds only (`make native-phases`): a dynamic module has no VM configuration, so the last phase
            // to run (see `llmroute_filter::phases`) comes from the Envoy process's environment.
            #[cfg(feature = "bench-phases")]
            BufferType::VmConfiguration => Ok(std::env::var(llmroute_core::envoy_contract::BENCH_PHASE_ENV)
                .ok()
                .map(|v| range(v.as_bytes()))),
            BufferType::HttpRequestBody | BufferType::HttpResponseBody => {
                let filter = stream("get_buffer")?;
                if !head_edit::flush() {
                    return err("get_buffer", HostStatus::NotFound);
                }
                Ok(View::of(filter, buffer).map(|body| body.read(start, max)))
            }
            _ => Ok(None),
        }
    }

    fn set_buffer(&self, buffer: BufferType, start: usize, size: usize, value: &[u8]) -> HostResult<()> {
        let filter = stream("set_buffer")?;
        if !matches!(buffer, BufferType::HttpRequestBody | BufferType::HttpResponseBody) {
            return err("set_buffer", HostStatus::BadArgument);
        }
        let done = if start == 0 {
            head_edit::set_prefix(filter, buffer, size, value)
        } else {
            head_edit::flush() && View::of(filter, buffer).is_some_and(|body| body.write(start, size, value))
        };
        if !done {
            return err("set_buffer", HostStatus::NotFound);
        }
        Ok(())
    }

    fn get_map(&self, map: MapType) -> HostResult<Vec<(String, Vec<u8>)>> {
        if let MapType::HttpCallResponseHeaders = map {
            return Ok(with_answer_read(|a| a.map(|a| a.headers.clone()).unwrap_or_default()));
        }
        let Some(t) = header_type(map) else {
            return err("get_map", HostStatus::BadArgument);
        };
        Ok(header_pairs(stream("get_map")?, t))
    }

    fn get_map_value(&self, map: MapType, key: &str) -> HostResult<Option<Vec<u8>>> {
        if let MapType::HttpCallResponseHeaders = map {
            return Ok(with_answer_read(|a| {
                let found = a?.headers.iter().find(|(n, _)| n == key);
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
        let size = path
            .iter()
            .fold(4usize, |n, p| n.saturating_add(p.len()).saturating_add(1));
        let mut key = Vec::with_capacity(size);
        key.extend_from_slice(b"wasm");
        for p in path {
            key.push(b'.');
            key.extend_from_slice(p.as_bytes());
        }
        // SAFETY: the buffers describe `key` and `value`, alive for the call.
        let ok = unsafe {
            abi::envoy_dynamic_module_callback_http_set_filter_state_bytes(
                filter,
                ModuleBuffer::of(&key),
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
        // A body edit not yet given to Envoy goes first: the reply may run other hooks before this one ends.
        head_edit::flush();
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
        if !head_edit::flush() {
            return err("http_call", HostStatus::NotFound);
        }
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
        if !head_edit::flush() {
            return err("resume_request", HostStatus::NotFound);
        }
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
        if !head_edit::flush() {
            return err("set_effective_context", HostStatus::NotFound);
        }
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
        switch_to(next);
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
