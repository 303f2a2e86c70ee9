//! HTTP calls to Envoy clusters (the admin poll, the engine-load poll, the `/props` check, the placement store's
//! etcd), their answers, and the calls that resume a paused request or act on another request context.

use super::*;
use proxy_wasm::types::{BufferType, MapType};
use std::time::Duration;

impl Envoy {
    /// Starts a body-less `GET path` to the Envoy cluster `cluster`; the answer arrives in `on_http_call_response`
    /// with the returned token. Through the SDK, whose dispatcher must know the token (see the module doc).
    pub fn dispatch_get(&self, cluster: &str, path: &str, timeout_ms: u64) -> Option<u32> {
        self.dispatch_get_with(cluster, path, cluster, &[], timeout_ms)
    }

    /// As [`Self::dispatch_get`], with the `:authority` and `extra` request headers given (the caller's own values,
    /// never a client's).
    pub fn dispatch_get_with(
        &self,
        cluster: &str,
        path: &str,
        authority: &str,
        extra: &[(&str, &str)],
        timeout_ms: u64,
    ) -> Option<u32> {
        let mut headers = vec![(":method", "GET"), (":path", path), (":authority", authority)];
        headers.extend_from_slice(extra);
        let timeout = Duration::from_millis(timeout_ms);
        self.host()
            .http_call(cluster, &headers, None, timeout)
            .map_err(|e| log::debug!("llmroute: calling cluster {cluster} failed: {e}"))
            .ok()
    }

    /// Starts a `POST path` with a JSON `body` to the Envoy cluster `cluster` (the placement store's etcd), with
    /// `authorization` when given (etcd's token); as [`Self::dispatch_get`] otherwise.
    pub fn dispatch_post(
        &self,
        cluster: &str,
        path: &str,
        body: &[u8],
        authorization: Option<&str>,
        timeout_ms: u64,
    ) -> Option<u32> {
        let mut headers = vec![
            (":method", "POST"),
            (":path", path),
            (":authority", cluster),
            ("content-type", "application/json"),
        ];
        if let Some(token) = authorization {
            headers.push(("authorization", token));
        }
        let timeout = Duration::from_millis(timeout_ms);
        self.host()
            .http_call(cluster, &headers, Some(body), timeout)
            .map_err(|e| log::debug!("llmroute: calling cluster {cluster} failed: {e}"))
            .ok()
    }

    /// Makes the calls that follow act on the request context `context_id`, until the current callback returns. False
    /// when the host refuses (the context is gone).
    pub fn set_effective_context(&self, context_id: u32) -> bool {
        logged(
            self.host().set_effective_context(context_id),
            format_args!("switching to request context {context_id}"),
        )
        .is_some()
    }

    /// Resumes the request the filter paused (after an HTTP callout answered).
    pub fn resume_request(&self) {
        logged(self.host().resume_request(), "resuming the request");
    }

    /// The `:status` of the answer being delivered to `on_http_call_response`, if there is one.
    pub fn http_call_status(&self) -> Option<u32> {
        self.header(MapType::HttpCallResponseHeaders, ":status")?.parse().ok()
    }

    /// The body of the answer being delivered to `on_http_call_response` (`size` is its length).
    pub fn http_call_body(&self, size: usize) -> Option<Vec<u8>> {
        let body = self.host().get_buffer(BufferType::HttpCallResponseBody, 0, size);
        logged(body, "reading an http call's answer").map(Option::unwrap_or_default)
    }
}
