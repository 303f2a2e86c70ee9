//! The response-header plan: when a response's headers arrive, which headers the filter sets and removes, and
//! what it then does with the body ([`BodyPlan`]). The filter reads what Envoy knows, calls [`plan`] and applies
//! the answer; nothing else in the response-headers phase decides.
//!
//! - Every response: without `debug_headers`, the stateful-session header Envoy's session filter adds with
//!   `bounded_keys` placement (the upstream host, base64) is removed when present; clients need not know it.
//!   A vLLM engine's ORCA load report (`endpoint-load-metrics`) is removed when present, always.
//! - A routed response: the affinity source, the echoed explicit session key, Anthropic's `request-id` on
//!   `/v1/messages`, and with `debug_headers` the placement reason, cluster, limits left and upstream address.
//! - Then the body: Envoy's circuit breaker shed the request (a 503 with `x-envoy-overloaded: true`, the marker
//!   read only on a 503): the body is replaced with the route's overloaded envelope and `retry-after: 1`; a
//!   backend error (status 400 or more) on `/v1/messages` is rewritten into the Anthropic envelope; decision
//!   routes are relayed unwatched; SSE bodies are watched for their end and usage, JSON ones for their usage
//!   when the status is a success (an error carries none) ([`Media`]); anything else is relayed. A watched stream loses `content-length`, since the gateway may append a closing event or
//!   cut the usage chunk.
//!
//! Response headers are read through a closure; the filter reads the map whole, once, on its first use (one
//! host call, where a read per name made two or three, and a blind removal of the session header one more).

use crate::affinity::AffinitySource;
use crate::api_kind::Api;
use crate::envoy_contract::SESSION_HEADER;
use crate::key_placement::PlacementReason;
use crate::load::orca;
use crate::{anthropic, headers};

/// The status of the reply Envoy sends for a request it shed, marked `x-envoy-overloaded: true`.
pub const OVERLOADED_STATUS: u32 = 503;

/// A response body the filter knows how to watch, by its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Media {
    /// `text/event-stream`: an SSE stream.
    EventStream,
    /// `application/json`: one document.
    Json,
}

impl Media {
    /// The media type of a `content-type` value, parameters and case ignored; `None` for any other type.
    pub fn of(content_type: &str) -> Option<Media> {
        let media = content_type.split(';').next().unwrap_or_default().trim();
        if media.eq_ignore_ascii_case("text/event-stream") {
            Some(Media::EventStream)
        } else if media.eq_ignore_ascii_case("application/json") {
            Some(Media::Json)
        } else {
            None
        }
    }
}

/// What the filter does with the response body after the headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyPlan {
    /// Relay it untouched and unwatched.
    Relay,
    /// Relay it as it comes and watch a copy.
    Watch(Media),
    /// Buffer it and rewrite the backend's error (this status) into the Anthropic envelope.
    RewriteError(u32),
    /// Envoy shed the request: replace the body with the route's overloaded envelope.
    ReplaceOverflow,
    /// The gateway streamed a request the client did not (`stream_upstream: always`): hold the headers and
    /// rebuild one JSON answer from the stream.
    Assemble,
}

/// The response headers to set and remove, and the body's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponsePlan {
    pub set: Vec<(&'static str, String)>,
    pub remove: Vec<&'static str>,
    pub body: BodyPlan,
    /// The `:status` the plan read (a routed response only): the log phase's status label, which spares it a
    /// read of `response.code`.
    pub status: Option<u32>,
}

/// What the request phase decided, as far as the response headers need it.
#[derive(Debug, Clone, Copy)]
pub struct Routed<'a> {
    pub api: Api,
    pub cluster: &'a str,
    pub affinity: Option<AffinitySource>,
    /// The explicit session key to echo.
    pub echo_session: Option<&'a str>,
    /// Why bounded-keys placement chose the host, when it did.
    pub placement: Option<PlacementReason>,
    /// The fewest requests and tokens left in the limit buckets charged.
    pub requests_remaining: Option<u64>,
    pub tokens_remaining: Option<u64>,
    /// The gateway streamed a request the client did not (`stream_upstream: always`).
    pub assemble: bool,
}

/// The config and request facts the plan depends on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Settings<'a> {
    pub debug_headers: bool,
    pub request_id: Option<&'a str>,
}

/// The plan for a response. `response_header` reads a response header (lower-case name); `upstream_address`
/// Envoy's `upstream.address`, read only with `debug_headers`.
pub fn plan(
    s: &Settings,
    routed: Option<&Routed>,
    response_header: &dyn Fn(&str) -> Option<String>,
    upstream_address: &dyn Fn() -> Option<String>,
) -> ResponsePlan {
    let mut p = ResponsePlan {
        set: Vec::new(),
        remove: Vec::new(),
        body: BodyPlan::Relay,
        status: None,
    };
    // Envoy's stateful-session filter names the upstream host (base64 `IP:PORT`) on every response it relays,
    // pinned or not; clients need not know it. Removed whatever the config in force says (a live (ECDS) change
    // may have turned every alias to `hash` while the bootstrap still has that filter), when it is there.
    if !s.debug_headers && response_header(SESSION_HEADER).is_some() {
        p.remove.push(SESSION_HEADER);
    }
    // A vLLM engine's ORCA load report is the gateway's (it folds it into the host's load reading), never the
    // client's, debug headers or not.
    if response_header(orca::RESPONSE_HEADER).is_some() {
        p.remove.push(orca::RESPONSE_HEADER);
    }
    let Some(r) = routed else {
        return p;
    };
    if let (Api::Messages, Some(id)) = (r.api, s.request_id) {
        p.set.push((anthropic::REQUEST_ID_HEADER, id.to_string()));
    }
    let source = r.affinity.map_or("none", AffinitySource::header_value);
    p.set.push((headers::AFFINITY_SOURCE, source.to_string()));
    if let Some(session) = r.echo_session {
        p.set.push((headers::SESSION_ECHO, session.to_string()));
    }
    if s.debug_headers {
        if let Some(reason) = r.placement {
            p.set.push((headers::PLACEMENT, reason.as_str().to_string()));
        }
        p.set.push((headers::CLUSTER, r.cluster.to_string()));
        for (name, left) in [
            (headers::REQUESTS_REMAINING, r.requests_remaining),
            (headers::TOKENS_REMAINING, r.tokens_remaining),
        ] {
            if let Some(n) = left {
                p.set.push((name, n.to_string()));
            }
        }
        if let Some(addr) = upstream_address() {
            p.set.push((headers::UPSTREAM, addr));
        }
    }
    let status = response_header(":status").and_then(|s| s.parse::<u32>().ok());
    p.status = status;
    // Envoy marks a request it shed (circuit breaker, overload) on its own 503 only, so a response of any other
    // status costs no read of the marker.
    if status == Some(OVERLOADED_STATUS) && response_header("x-envoy-overloaded").as_deref() == Some("true") {
        // Envoy's circuit breaker shed this request: say when to come back, in the route's dialect.
        p.set.push(("retry-after", "1".to_string()));
        p.set.push(("content-type", "application/json".to_string()));
        p.remove.push("content-length");
        p.body = BodyPlan::ReplaceOverflow;
        return p;
    }
    if let (Api::Messages, Some(status @ 400..)) = (r.api, status) {
        // A backend error on Messages goes out in the Anthropic envelope, with the gateway's request id.
        p.set.push(("content-type", "application/json".to_string()));
        p.remove.push("content-length");
        p.body = BodyPlan::RewriteError(status);
        return p;
    }
    let content_type = response_header("content-type").unwrap_or_default();
    let media = Media::of(&content_type);
    if r.api.is_decision() {
        // Decision routes are opaque beyond `model`: a JSON success is copied only for its usage, which settles
        // the token limits as on the other APIs; anything else (a stream in a format the gateway does not know,
        // an error) is relayed unwatched.
        if media == Some(Media::Json) && status.is_some_and(|s| (200..300).contains(&s)) {
            p.body = BodyPlan::Watch(Media::Json);
        }
        return p;
    }
    if r.assemble && status == Some(200) && media == Some(Media::EventStream) {
        // The client asked for one JSON answer: it is rebuilt from the stream, its length known only then.
        p.set.push(("content-type", "application/json".to_string()));
        p.remove.push("content-length");
        p.body = BodyPlan::Assemble;
        return p;
    }
    p.body = match media {
        // A JSON answer is copied into the VM only for its usage, which only a success carries: an error's is
        // relayed unwatched (nothing in the metrics or the access log changes).
        Some(Media::Json) if status.is_some_and(|s| !(200..300).contains(&s)) => BodyPlan::Relay,
        _ => media.map_or(BodyPlan::Relay, BodyPlan::Watch),
    };
    if p.body == BodyPlan::Watch(Media::EventStream) {
        p.remove.push("content-length");
    }
    p
}
