//! Host calls the filter makes, wrapped so that a host error is a value, never a trap.
//!
//! The proxy-wasm SDK's context convenience methods unwrap host results; a panic under `panic = "abort"` kills
//! the VM for every request on that worker. These wrappers call `hostcalls` directly and log failures instead.

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};

/// All request headers, lower-case names, values as bytes.
pub fn request_headers() -> Vec<(String, Vec<u8>)> {
    hostcalls::get_map_bytes(MapType::HttpRequestHeaders).unwrap_or_else(|s| {
        log::warn!("llmroute: reading request headers failed: {s:?}");
        Vec::new()
    })
}

pub fn set_request_header(name: &str, value: Option<&str>) {
    if let Err(s) = hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value) {
        log::warn!("llmroute: setting request header {name} failed: {s:?}");
    }
}

pub fn set_response_header(name: &str, value: &str) {
    if let Err(s) = hostcalls::set_map_value(MapType::HttpResponseHeaders, name, Some(value)) {
        log::warn!("llmroute: setting response header {name} failed: {s:?}");
    }
}

/// The first `size` bytes of the buffered request body.
pub fn request_body(size: usize) -> Option<Vec<u8>> {
    match hostcalls::get_buffer(BufferType::HttpRequestBody, 0, size) {
        Ok(body) => Some(body.unwrap_or_default()),
        Err(s) => {
            log::warn!("llmroute: reading the request body failed: {s:?}");
            None
        }
    }
}

/// Replaces the whole buffered request body (`size` is its current length).
pub fn replace_request_body(size: usize, body: &[u8]) -> bool {
    hostcalls::set_buffer(BufferType::HttpRequestBody, 0, size, body)
        .map_err(|s| log::warn!("llmroute: replacing the request body failed: {s:?}"))
        .is_ok()
}

pub fn plugin_configuration() -> Option<Vec<u8>> {
    hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
        .map_err(|s| log::error!("llmroute: reading the plugin configuration failed: {s:?}"))
        .ok()
        .flatten()
}

/// A property as a UTF-8 string, such as `["upstream", "address"]`.
pub fn property_string(path: &[&str]) -> Option<String> {
    let bytes = hostcalls::get_property(path.to_vec()).ok().flatten()?;
    String::from_utf8(bytes).ok()
}

/// Sends a local reply; the upstream is never contacted.
pub fn send_reply(status: u32, headers: &[(&str, &str)], body: &[u8]) {
    // Marks the reply as the filter's own, so Envoy's local_reply_config leaves its body alone.
    set_request_header(llmroute_core::headers::LOCAL_REPLY, Some("1"));
    if let Err(s) = hostcalls::send_http_response(status, headers.to_vec(), Some(body)) {
        log::warn!("llmroute: sending a local reply failed: {s:?}");
    }
}

/// A request id for a request that came without a usable one: unique per time and context, hex.
pub fn fresh_request_id(context_id: u32) -> String {
    let nanos = hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let mut seed = nanos.to_le_bytes().to_vec();
    seed.extend_from_slice(&context_id.to_le_bytes());
    format!("llmroute-{:016x}", xxhash_rust::xxh3::xxh3_64(&seed))
}

/// Milliseconds since the Unix epoch, by the host's clock; 0 when the host cannot tell.
pub fn now_ms() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Asks the host to call the root context's `on_tick` every `period_ms`.
pub fn set_tick_period(period_ms: u64) -> bool {
    hostcalls::set_tick_period(std::time::Duration::from_millis(period_ms))
        .map_err(|s| log::warn!("llmroute: setting the tick period failed: {s:?}"))
        .is_ok()
}

/// Starts a body-less `GET path` to the Envoy cluster `cluster`; the answer arrives in `on_http_call_response`
/// with the returned token.
pub fn dispatch_get(cluster: &str, path: &str, timeout_ms: u64) -> Option<u32> {
    let headers = vec![(":method", "GET"), (":path", path), (":authority", cluster)];
    let timeout = std::time::Duration::from_millis(timeout_ms);
    hostcalls::dispatch_http_call(cluster, headers, None, Vec::new(), timeout)
        .map_err(|s| log::debug!("llmroute: calling cluster {cluster} failed: {s:?}"))
        .ok()
}

/// The `:status` of the answer being delivered to `on_http_call_response`, if there is one.
pub fn http_call_status() -> Option<u32> {
    let value = hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status").ok()??;
    std::str::from_utf8(&value).ok()?.parse().ok()
}

/// The body of the answer being delivered to `on_http_call_response` (`size` is its length).
pub fn http_call_body(size: usize) -> Option<Vec<u8>> {
    match hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size) {
        Ok(body) => Some(body.unwrap_or_default()),
        Err(s) => {
            log::warn!("llmroute: reading an http call's answer failed: {s:?}");
            None
        }
    }
}

/// A value in the VM-wide shared data, with its compare-and-swap token.
pub fn shared_data(key: &str) -> (Option<Vec<u8>>, Option<u32>) {
    hostcalls::get_shared_data(key).unwrap_or_else(|s| {
        log::warn!("llmroute: reading shared data {key} failed: {s:?}");
        (None, None)
    })
}

/// Writes shared data; with `cas`, only if nobody wrote since it was read. False when it was not written.
pub fn set_shared_data(key: &str, value: &[u8], cas: Option<u32>) -> bool {
    match hostcalls::set_shared_data(key, Some(value), cas) {
        Ok(()) => true,
        Err(proxy_wasm::types::Status::CasMismatch) => false,
        Err(s) => {
            log::warn!("llmroute: writing shared data {key} failed: {s:?}");
            false
        }
    }
}

/// One response header, as text.
pub fn response_header(name: &str) -> Option<String> {
    hostcalls::get_map_value(proxy_wasm::types::MapType::HttpResponseHeaders, name)
        .ok()
        .flatten()
}

pub fn remove_response_header(name: &str) {
    if let Err(s) = hostcalls::set_map_value(proxy_wasm::types::MapType::HttpResponseHeaders, name, None) {
        log::warn!("llmroute: removing response header {name} failed: {s:?}");
    }
}

/// Replaces the whole buffered response body (`size` is its current length).
pub fn replace_response_body(size: usize, body: &[u8]) {
    if let Err(s) = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, size, body) {
        log::warn!("llmroute: replacing the response body failed: {s:?}");
    }
}

/// One request header, as text.
pub fn request_header(name: &str) -> Option<String> {
    hostcalls::get_map_value(MapType::HttpRequestHeaders, name)
        .ok()
        .flatten()
}

/// A counter, defined once per VM; `None` when the host refuses (metrics are then skipped).
pub fn define_counter(name: &str) -> Option<u32> {
    hostcalls::define_metric(proxy_wasm::types::MetricType::Counter, name)
        .map_err(|s| log::warn!("llmroute: defining metric {name} failed: {s:?}"))
        .ok()
}

pub fn increment(metric: Option<u32>) {
    add(metric, 1);
}

pub fn add(metric: Option<u32>, n: u64) {
    if let (Some(id), Ok(n)) = (metric, i64::try_from(n)) {
        let _ = hostcalls::increment_metric(id, n);
    }
}

/// A gauge, defined once per VM.
pub fn define_gauge(name: &str) -> Option<u32> {
    hostcalls::define_metric(proxy_wasm::types::MetricType::Gauge, name)
        .map_err(|s| log::warn!("llmroute: defining metric {name} failed: {s:?}"))
        .ok()
}

pub fn metric_value(metric: Option<u32>) -> Option<u64> {
    hostcalls::get_metric(metric?).ok()
}

pub fn set_gauge(metric: Option<u32>, v: u64) {
    if let Some(id) = metric {
        let _ = hostcalls::record_metric(id, v);
    }
}

/// Appends bytes at the end of the response body buffer.
pub fn append_response_body(size: usize, bytes: &[u8]) {
    if let Err(s) = hostcalls::set_buffer(BufferType::HttpResponseBody, size, 0, bytes) {
        log::warn!("llmroute: appending to the response body failed: {s:?}");
    }
}

/// The first `size` bytes of the response body buffer (the chunk being delivered).
pub fn response_body(size: usize) -> Option<Vec<u8>> {
    hostcalls::get_buffer(BufferType::HttpResponseBody, 0, size)
        .ok()
        .map(Option::unwrap_or_default)
}

/// The backend of the upstream host Envoy picked, from its endpoint metadata (`llmroute.backend`).
pub fn upstream_backend() -> Option<String> {
    property_string(&[
        "xds",
        "upstream_host_metadata",
        "filter_metadata",
        "llmroute",
        "backend",
    ])
}
