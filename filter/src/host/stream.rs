//! The stream's own host calls: its request and response headers, bodies and properties, the plugin and VM
//! configuration, local replies, and the access-log fields.

use super::*;
use proxy_wasm::types::{BufferType, MapType};

impl Envoy {
    /// All request headers, lower-case names, values as bytes; `None` when the host cannot say (Envoy always has
    /// `:method` and `:path`, so an empty map would be refused as an unknown path: a host error must be a 503).
    pub fn request_headers(&self) -> Option<Vec<(String, Vec<u8>)>> {
        let all = logged(
            self.host().get_map(MapType::HttpRequestHeaders),
            "reading request headers",
        )?;
        #[cfg(feature = "test-trap")]
        crate::trap::maybe_trap(&all);
        Some(all)
    }

    pub fn set_request_header(&self, name: &str, value: Option<&str>) {
        logged(
            self.host().set_map_value(MapType::HttpRequestHeaders, name, value),
            format_args!("setting request header {name}"),
        );
    }

    pub fn set_response_header(&self, name: &str, value: &str) {
        logged(
            self.host()
                .set_map_value(MapType::HttpResponseHeaders, name, Some(value)),
            format_args!("setting response header {name}"),
        );
    }

    pub fn remove_response_header(&self, name: &str) {
        logged(
            self.host().set_map_value(MapType::HttpResponseHeaders, name, None),
            format_args!("removing response header {name}"),
        );
    }

    /// One request header, as text.
    pub fn request_header(&self, name: &str) -> Option<String> {
        self.header(MapType::HttpRequestHeaders, name)
    }

    pub(super) fn header(&self, map: MapType, name: &str) -> Option<String> {
        let bytes = logged(
            self.host().get_map_value(map, name),
            format_args!("reading header {name}"),
        )??;
        String::from_utf8(bytes).ok()
    }

    /// The first `size` bytes of the buffered request body.
    pub fn request_body(&self, size: usize) -> Option<Vec<u8>> {
        let body = self.host().get_buffer(BufferType::HttpRequestBody, 0, size);
        logged(body, "reading the request body").map(Option::unwrap_or_default)
    }

    /// Replaces the first `size` bytes of the buffered request body with `body` (Envoy drains them and prepends
    /// `body`): the whole body when `size` is its current length.
    pub fn replace_request_body(&self, size: usize, body: &[u8]) -> bool {
        let r = self.host().set_buffer(BufferType::HttpRequestBody, 0, size, body);
        logged(r, "replacing the request body").is_some()
    }

    /// The first `size` bytes of the response body buffer (the chunk being delivered).
    pub fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        let body = self.host().get_buffer(BufferType::HttpResponseBody, 0, size);
        logged(body, "reading the response body").map(Option::unwrap_or_default)
    }

    /// Replaces the whole buffered response body (`size` is its current length). False when the host refused.
    pub fn replace_response_body(&self, size: usize, body: &[u8]) -> bool {
        let r = self.host().set_buffer(BufferType::HttpResponseBody, 0, size, body);
        logged(r, "replacing the response body").is_some()
    }

    /// Appends bytes at the end of the response body buffer.
    pub fn append_response_body(&self, size: usize, bytes: &[u8]) {
        let r = self.host().set_buffer(BufferType::HttpResponseBody, size, 0, bytes);
        logged(r, "appending to the response body");
    }

    pub fn plugin_configuration(&self) -> Option<Vec<u8>> {
        self.host()
            .get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .map_err(|e| log::error!("llmroute: reading the plugin configuration: {e}"))
            .ok()
            .flatten()
    }

    /// The VM configuration (`vm_config.configuration`); bench builds read their last phase from it (see `phases`).
    #[cfg(feature = "bench-phases")]
    pub fn vm_configuration(&self) -> Option<Vec<u8>> {
        logged(
            self.host().get_buffer(BufferType::VmConfiguration, 0, usize::MAX),
            "reading the VM configuration",
        )
        .flatten()
    }

    /// A property as a UTF-8 string, such as `["upstream", "address"]`. A property the host cannot serialise (such
    /// as the metadata of a host without any) is `None`, like a missing one.
    pub fn property_string(&self, path: &[&str]) -> Option<String> {
        let bytes = self
            .host()
            .get_property(path)
            .map_err(|e| log::debug!("llmroute: reading property {}: {e}", path.join(".")))
            .ok()??;
        String::from_utf8(bytes).ok()
    }

    /// Sends a local reply; the upstream is never contacted.
    pub fn send_reply(&self, status: u32, headers: &[(&str, &str)], body: &[u8]) {
        // Marks the reply as the filter's own, so Envoy's local_reply_config leaves its body alone.
        self.set_request_header(llmroute_core::headers::LOCAL_REPLY, Some("1"));
        logged(
            self.host().send_local_response(status, headers, body),
            "sending a local reply",
        );
    }

    /// Sends the core's local reply as it is.
    pub fn send_local_reply(&self, reply: &llmroute_core::request_plan::LocalReply) {
        let headers: Vec<(&str, &str)> = reply.headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.send_reply(reply.status, &headers, &reply.body);
    }

    /// Writes an access-log field: filter state `wasm.<key>`, which the rendered access log reads. `key` comes from
    /// `envoy_contract::log_fields`; the value must carry no prompt text and no credential.
    pub fn set_log_field(&self, key: &str, value: &str) {
        let _ = logged(
            self.host().set_property(&[key], value.as_bytes()),
            "setting an access-log field",
        );
    }

    /// The response's status code (`response.code`), once Envoy has one.
    pub fn response_code(&self) -> Option<u32> {
        let bytes = logged(self.host().get_property(&["response", "code"]), "reading response.code")??;
        let raw: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
        u32::try_from(u64::from_le_bytes(raw)).ok()
    }

    /// The backend of the upstream host Envoy picked, from its endpoint metadata (`llmroute.backend`).
    pub fn upstream_backend(&self) -> Option<String> {
        self.property_string(&[
            "xds",
            "upstream_host_metadata",
            "filter_metadata",
            llmroute_core::envoy_contract::METADATA_NAMESPACE,
            llmroute_core::envoy_contract::METADATA_BACKEND,
        ])
    }
}

/// The response headers, read whole on the first lookup: one host call however many names the response-header
/// plan looks up (a read per name made two or three). A failed read is logged once and reads as no headers.
pub struct ResponseHeaders<'e>(&'e Envoy, std::cell::OnceCell<Vec<(String, Vec<u8>)>>);

impl<'e> ResponseHeaders<'e> {
    /// The response headers of the stream `envoy` acts on, not read yet.
    pub fn new(envoy: &'e Envoy) -> Self {
        ResponseHeaders(envoy, std::cell::OnceCell::new())
    }

    /// The first value of `name` (lower-case), as text.
    pub fn get(&self, name: &str) -> Option<String> {
        let all = self.1.get_or_init(|| {
            let all = self.0.host().get_map(MapType::HttpResponseHeaders);
            logged(all, "reading response headers").unwrap_or_default()
        });
        let (_, value) = all.iter().find(|(n, _)| n == name)?;
        String::from_utf8(value.clone()).ok()
    }
}
