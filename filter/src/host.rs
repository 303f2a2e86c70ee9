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
