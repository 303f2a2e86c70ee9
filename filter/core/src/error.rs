//! Every way the gateway refuses a request, and how each refusal is written back to the client.
//!
//! A refusal is answered by the filter itself (an Envoy local reply), so the upstream never sees the request.
//! Each variant knows its HTTP status and its OpenAI `type`/`code`, so the envelope is derived, never written by
//! hand at the call site. Messages never quote prompt text; a client-sent model name is quoted, bounded.

use std::fmt;

use serde_json::json;

use crate::api_kind::{Api, Envelope};
use crate::auth::AuthRefusal;
use crate::json::JsonError;
use crate::limits::{Kind, Scope};

/// The longest client-sent string quoted back in an error message.
const QUOTE_MAX: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayError {
    /// The body is not one valid JSON object.
    InvalidJson(JsonError),
    /// The body exceeds `limits.max_body_bytes`.
    BodyTooLarge { limit: usize },
    /// `content-type` is not JSON, or `content-encoding` is not identity.
    UnsupportedMediaType { header: &'static str, value: String },
    /// A required field is absent.
    MissingField { field: &'static str },
    /// A field has the wrong type or value.
    InvalidField { field: &'static str, reason: String },
    /// A field the gateway reads appears more than once (in any letter case).
    DuplicateField { field: &'static str },
    /// The alias is not configured.
    UnknownModel { model: String },
    /// The alias exists but does not serve this API.
    EndpointNotServed { model: String, api: Api },
    /// A configured session header holds an unusable value.
    InvalidSessionHeader { header: String, reason: &'static str },
    /// The request cannot fit the context window of any route.
    ContextLengthExceeded { needed: u64, limit: u32 },
    /// A query parameter is out of range.
    InvalidQuery { param: &'static str, reason: &'static str },
    /// The path exists but not for this method.
    MethodNotAllowed {
        method: String,
        path: String,
        allow: &'static str,
    },
    /// No such endpoint.
    NotFound { method: String, path: String },
    /// `auth` is on and the request has no valid key.
    Unauthorized(AuthRefusal),
    /// A request or token limit is spent: whose (`scope`, `name`), which (`kind`), and when to retry.
    RateLimited {
        scope: Scope,
        name: String,
        kind: Kind,
        retry_after_s: u64,
    },
    /// The limit buckets could not be updated (compare-and-swap lost too often); refused, fail closed.
    LimitContention,
    /// The host failed a read of a limit bucket; refused, fail closed.
    LimitUnavailable,
    /// The backend stayed full for as long as the request could wait in the fair queue (`fairness.max_wait_ms`, or
    /// the client's shorter `x-max-wait-ms`; `waited_ms` 0 when the client asked not to wait at all).
    QueueTimeout { waited_ms: u64 },
    /// The backend's fair queue holds `fairness.max_queue` waiting requests already.
    QueueFull,
}

impl GatewayError {
    pub fn status(&self) -> u32 {
        match self {
            Self::InvalidJson(_)
            | Self::MissingField { .. }
            | Self::InvalidField { .. }
            | Self::DuplicateField { .. }
            | Self::InvalidSessionHeader { .. }
            | Self::InvalidQuery { .. }
            | Self::ContextLengthExceeded { .. } => 400,
            Self::UnknownModel { .. } | Self::EndpointNotServed { .. } | Self::NotFound { .. } => 404,
            Self::MethodNotAllowed { .. } => 405,
            Self::BodyTooLarge { .. } => 413,
            Self::UnsupportedMediaType { .. } => 415,
            Self::Unauthorized(_) => 401,
            Self::RateLimited { .. } | Self::QueueTimeout { .. } | Self::QueueFull => 429,
            Self::LimitContention | Self::LimitUnavailable => 503,
        }
    }

    /// The `reason` label of `llmroute_rejections_total`: the body's `code`, except that a missing, malformed and
    /// unknown API key (one code, `invalid_api_key`, for clients) are told apart for operators. A closed set.
    pub fn metric_reason(&self) -> &'static str {
        match self {
            Self::Unauthorized(AuthRefusal::Missing) => "api_key_missing",
            Self::Unauthorized(AuthRefusal::Malformed) => "api_key_malformed",
            Self::Unauthorized(AuthRefusal::Unknown) => "api_key_unknown",
            _ => self.code(),
        }
    }

    /// The OpenAI `code` field; also the `x-llmroute-error` header and, mostly, the rejection metric reason.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidJson(JsonError::TooDeep { .. }) => "json_too_deep",
            Self::InvalidJson(JsonError::NotAnObject { .. }) => "body_not_object",
            Self::InvalidJson(_) => "invalid_json",
            Self::BodyTooLarge { .. } => "body_too_large",
            Self::UnsupportedMediaType { .. } => "unsupported_media_type",
            Self::MissingField { .. } => "missing_field",
            Self::InvalidField { .. } => "invalid_field",
            Self::DuplicateField { .. } => "duplicate_field",
            Self::UnknownModel { .. } => "model_not_found",
            Self::EndpointNotServed { .. } => "endpoint_not_served",
            Self::InvalidSessionHeader { .. } => "invalid_session_header",
            Self::InvalidQuery { .. } => "invalid_query",
            Self::ContextLengthExceeded { .. } => "context_length_exceeded",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::NotFound { .. } => "unknown_url",
            Self::Unauthorized(_) => "invalid_api_key",
            Self::RateLimited { .. } => "rate_limit_exceeded",
            Self::LimitContention => "limit_contention",
            Self::LimitUnavailable => "limit_unavailable",
            Self::QueueTimeout { .. } => "queue_timeout",
            Self::QueueFull => "queue_full",
        }
    }

    /// The OpenAI `param` field: the request field at fault, when there is one.
    pub fn param(&self) -> Option<&str> {
        match self {
            Self::MissingField { field } | Self::InvalidField { field, .. } | Self::DuplicateField { field } => {
                Some(field)
            }
            Self::UnknownModel { .. } | Self::EndpointNotServed { .. } => Some("model"),
            Self::InvalidSessionHeader { header, .. } => Some(header),
            Self::InvalidQuery { param, .. } => Some(param),
            Self::UnsupportedMediaType { header, .. } => Some(header),
            _ => None,
        }
    }

    /// The Anthropic `error.type` for this refusal.
    pub fn anthropic_type(&self) -> &'static str {
        match self.status() {
            401 => "authentication_error",
            429 => "rate_limit_error",
            503 => "api_error",
            404 => "not_found_error",
            413 => "request_too_large",
            _ => "invalid_request_error",
        }
    }

    /// Extra response headers a refusal carries.
    pub fn headers(&self) -> Vec<(&'static str, &'static str)> {
        match self {
            Self::MethodNotAllowed { allow, .. } => vec![("allow", allow)],
            Self::Unauthorized(_) => vec![("www-authenticate", "Bearer")],
            _ => Vec::new(),
        }
    }

    /// The `Retry-After` a refusal carries, in seconds.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::RateLimited { retry_after_s, .. } => Some(*retry_after_s),
            Self::LimitContention | Self::LimitUnavailable | Self::QueueTimeout { .. } | Self::QueueFull => Some(1),
            _ => None,
        }
    }

    /// The OpenAI `type` field.
    pub fn openai_type(&self) -> &'static str {
        match self {
            Self::RateLimited { kind, .. } => kind.as_str(),
            Self::QueueTimeout { .. } | Self::QueueFull => "requests",
            Self::LimitContention | Self::LimitUnavailable => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The refusal's body in the route's dialect. `request_id` is echoed so a client can quote it.
    pub fn body(&self, envelope: Envelope, request_id: Option<&str>) -> Vec<u8> {
        let body = match envelope {
            Envelope::OpenAi => json!({
                "error": {
                    "message": self.to_string(),
                    "type": self.openai_type(),
                    "param": self.param(),
                    "code": self.code(),
                },
                "request_id": request_id,
            }),
            Envelope::Anthropic => json!({
                "type": "error",
                "error": { "type": self.anthropic_type(), "message": self.to_string() },
                "request_id": request_id,
            }),
            Envelope::SystemOne => system_one(self.code(), &self.to_string(), request_id),
        };
        body.to_string().into_bytes()
    }

    /// The body in the OpenAI envelope, without a request id.
    pub fn openai_body(&self) -> Vec<u8> {
        self.body(Envelope::OpenAi, None)
    }
}

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidJson(e) => write!(f, "We could not parse the JSON body of your request: {e}."),
            Self::BodyTooLarge { limit } => write!(f, "The request body exceeds the gateway limit of {limit} bytes."),
            Self::UnsupportedMediaType { header, value } => {
                write!(
                    f,
                    "Unsupported {header} `{}`; send `application/json` without content encoding.",
                    quote(value)
                )
            }
            Self::MissingField { field } => write!(f, "The request is missing the required field `{field}`."),
            Self::InvalidField { field, reason } => write!(f, "Invalid value for `{field}`: {reason}."),
            Self::DuplicateField { field } => write!(
                f,
                "The field `{field}` appears more than once (in some letter case); send it exactly once."
            ),
            Self::UnknownModel { model } => {
                write!(
                    f,
                    "The model `{}` does not exist or is not served by this gateway.",
                    quote(model)
                )
            }
            Self::EndpointNotServed { model, api } => {
                write!(f, "The model `{}` is not served on {}.", quote(model), api.path())
            }
            Self::InvalidSessionHeader { header, reason } => write!(f, "Invalid `{header}` header: {reason}."),
            Self::InvalidQuery { param, reason } => write!(f, "Invalid query parameter `{param}`: {reason}."),
            Self::ContextLengthExceeded { needed, limit } => write!(
                f,
                "This request needs about {needed} tokens (input estimate plus requested output), more than the \
                 largest context window of this model's backends ({limit} tokens)."
            ),
            Self::MethodNotAllowed { method, path, allow } => {
                write!(
                    f,
                    "Method {} is not allowed on {}; use {allow}.",
                    quote(method),
                    quote(path)
                )
            }
            Self::NotFound { method, path } => write!(f, "Invalid URL ({} {}).", quote(method), quote(path)),
            Self::Unauthorized(AuthRefusal::Missing) => write!(
                f,
                "Missing API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`."
            ),
            Self::Unauthorized(AuthRefusal::Malformed) => write!(
                f,
                "Malformed credential: send exactly one `Authorization: Bearer <key>` header."
            ),
            Self::Unauthorized(AuthRefusal::Unknown) => write!(f, "Invalid API key."),
            Self::RateLimited {
                scope,
                name,
                kind,
                retry_after_s,
            } => write!(
                f,
                "The {} limit of {} `{name}` is reached; retry after {retry_after_s} s.",
                kind.as_str().trim_end_matches('s'),
                match scope {
                    Scope::Alias => "model",
                    Scope::Key => "API key",
                }
            ),
            Self::LimitContention => write!(f, "The gateway could not update its rate limits; retry after a second."),
            Self::LimitUnavailable => write!(f, "The gateway could not read its rate limits; retry after a second."),
            Self::QueueTimeout { waited_ms: 0 } => write!(
                f,
                "The backend is at capacity and this request asked not to wait (x-max-wait-ms: 0); retry after a \
                 second."
            ),
            Self::QueueTimeout { waited_ms } => write!(
                f,
                "The backend stayed at capacity for the {waited_ms} ms this request could wait; retry after a second."
            ),
            Self::QueueFull => write!(
                f,
                "The backend is at capacity and its queue is full; retry after a second."
            ),
        }
    }
}

/// The message of a request shed by a backend's circuit breaker.
const OVERFLOW_MESSAGE: &str = "The backend is at capacity; retry after a second.";

/// The body of a request Envoy shed at a backend's circuit breaker: OpenAI `server_error` (code `overloaded`) or
/// Anthropic `overloaded_error`, with the request id. It goes out as a 503 with `Retry-After: 1`.
pub fn overloaded_body(envelope: Envelope, request_id: Option<&str>) -> Vec<u8> {
    let body = match envelope {
        Envelope::OpenAi => json!({
            "error": {"message": OVERFLOW_MESSAGE, "type": "server_error", "param": null, "code": "overloaded"},
            "request_id": request_id,
        }),
        Envelope::Anthropic => json!({
            "type": "error",
            "error": {"type": "overloaded_error", "message": OVERFLOW_MESSAGE},
            "request_id": request_id,
        }),
        Envelope::SystemOne => system_one("overloaded", OVERFLOW_MESSAGE, request_id),
    };
    body.to_string().into_bytes()
}

/// The message of the gateway's own 503 when a host call failed under a request.
const UNAVAILABLE_MESSAGE: &str = "The gateway could not process the request.";

/// The body of the gateway's own 503 (code `gateway_error`) when it cannot process a request because a host call
/// failed: in the route's envelope, with the request id, like every other refusal.
pub fn unavailable_body(envelope: Envelope, request_id: Option<&str>) -> Vec<u8> {
    let body = match envelope {
        Envelope::OpenAi => json!({
            "error": {"message": UNAVAILABLE_MESSAGE, "type": "server_error", "param": null, "code": "gateway_error"},
            "request_id": request_id,
        }),
        Envelope::Anthropic => json!({
            "type": "error",
            "error": {"type": "api_error", "message": UNAVAILABLE_MESSAGE},
            "request_id": request_id,
        }),
        Envelope::SystemOne => system_one("gateway_error", UNAVAILABLE_MESSAGE, request_id),
    };
    body.to_string().into_bytes()
}

/// One kind of Envoy's own local reply (a dead or slow backend, a timeout, a codec error), as the gateway has
/// Envoy rewrite it: the renderer turns each into a `local_reply_config` mapper with a JSON body in the route's
/// envelope, the request id, and `code` in `x-llmroute-error`. The filter's own replies are never rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvoyReply {
    /// The status it matches, also kept on the reply.
    pub status: u16,
    /// Matches only replies with this Envoy response flag (`UO`: circuit-breaker overflow), when set.
    pub response_flag: Option<&'static str>,
    /// OpenAI `code`, and the `x-llmroute-error` header.
    pub code: &'static str,
    pub openai_type: &'static str,
    pub anthropic_type: &'static str,
    pub message: &'static str,
}

const fn reply(status: u16, code: &'static str, anthropic_type: &'static str, message: &'static str) -> EnvoyReply {
    EnvoyReply {
        status,
        response_flag: None,
        code,
        openai_type: if status >= 500 {
            "server_error"
        } else {
            "invalid_request_error"
        },
        anthropic_type,
        message,
    }
}

/// Envoy's local replies, most specific first. A reply that matches none takes [`envoy_fallback`].
pub const ENVOY_REPLIES: [EnvoyReply; 12] = [
    EnvoyReply {
        response_flag: Some("UO"),
        ..reply(503, "overloaded", "overloaded_error", OVERFLOW_MESSAGE)
    },
    // The overload manager refuses requests near the heap limit (`limits.max_heap_bytes`).
    EnvoyReply {
        response_flag: Some("OM"),
        ..reply(
            503,
            "gateway_overloaded",
            "overloaded_error",
            "The gateway is overloaded; retry later.",
        )
    },
    // Envoy's rate-limit filter (`global_limits`): the service answered OVER_LIMIT. The filter adds Retry-After.
    EnvoyReply {
        response_flag: Some(crate::envoy_contract::global::FLAG_LIMITED),
        openai_type: "rate_limit_error",
        ..reply(
            429,
            "rate_limit_exceeded",
            "rate_limit_error",
            "Rate limit exceeded; retry after the time in Retry-After.",
        )
    },
    // The rate-limit service could not answer and `global_limits.failure_mode` is `deny`.
    EnvoyReply {
        response_flag: Some(crate::envoy_contract::global::FLAG_SERVICE_ERROR),
        ..reply(
            503,
            "rate_limit_unavailable",
            "api_error",
            "The rate-limit service could not be reached; retry later.",
        )
    },
    reply(
        400,
        "bad_request",
        "invalid_request_error",
        "The gateway could not parse the HTTP request.",
    ),
    reply(
        408,
        "request_timeout",
        "invalid_request_error",
        "The request was not received in time.",
    ),
    reply(
        413,
        "body_too_large",
        "request_too_large",
        "The request body exceeds the gateway's buffer.",
    ),
    reply(
        431,
        "headers_too_large",
        "invalid_request_error",
        "The request headers are too large.",
    ),
    // Envoy's HTTP/1 codec answers a transfer coding it does not implement (`chunked, identity`, `xchunked`, two
    // `transfer-encoding` headers) with a 501. The client framed the request wrongly: an invalid request, not a
    // gateway fault.
    EnvoyReply {
        openai_type: "invalid_request_error",
        ..reply(
            501,
            "unsupported_framing",
            "invalid_request_error",
            "The gateway does not implement this request's framing (its transfer-encoding); send content-length or plain chunked.",
        )
    },
    reply(
        502,
        "upstream_error",
        "api_error",
        "The backend sent an invalid response.",
    ),
    reply(
        503,
        "upstream_unavailable",
        "api_error",
        "No backend could take the request; retry later.",
    ),
    reply(
        504,
        "upstream_timeout",
        "api_error",
        "The backend did not answer in time.",
    ),
];

/// The reply for an Envoy local reply no entry of [`ENVOY_REPLIES`] matches: `client` for 4xx, else 5xx.
pub const fn envoy_fallback(client: bool) -> EnvoyReply {
    if client {
        reply(
            400,
            "invalid_request",
            "invalid_request_error",
            "The gateway refused the request.",
        )
    } else {
        reply(
            500,
            "gateway_error",
            "api_error",
            "The gateway could not process the request.",
        )
    }
}

/// The TypeSafe System One error: `{"error":{"code","message","request_id"},"request_id"}`, where `code` is the
/// gateway's reason code (as in `x-llmroute-error`) and both ids are the `x-request-id` response header.
pub fn system_one(code: &str, message: &str, request_id: Option<&str>) -> serde_json::Value {
    json!({
        "error": { "code": code, "message": message, "request_id": request_id },
        "request_id": request_id,
    })
}

/// Bounds a client-sent string for quoting in a message, cut on a character boundary.
fn quote(s: &str) -> &str {
    crate::text::prefix_on_char_boundary(s, QUOTE_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn envelope(e: &GatewayError) -> Value {
        serde_json::from_slice(&e.openai_body()).unwrap()
    }

    #[test]
    fn unknown_model_is_404_model_not_found() {
        let e = GatewayError::UnknownModel { model: "gpt-9".into() };
        assert_eq!(e.status(), 404);
        let v = envelope(&e);
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        assert!(v["error"]["message"].as_str().unwrap().contains("gpt-9"));
    }

    #[test]
    fn envelope_has_exactly_the_four_openai_fields() {
        let e = GatewayError::InvalidJson(JsonError::Empty);
        let v = envelope(&e);
        let obj = v["error"].as_object().unwrap();
        let mut keys: Vec<_> = obj.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["code", "message", "param", "type"]);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], Value::Null);
    }

    #[test]
    fn long_client_strings_are_bounded_in_messages() {
        let e = GatewayError::UnknownModel {
            model: "é".repeat(1000),
        };
        let msg = e.to_string();
        assert!(msg.len() < 400, "{}", msg.len());
    }

    #[test]
    fn statuses() {
        let cases: Vec<(GatewayError, u32, &str)> = vec![
            (GatewayError::BodyTooLarge { limit: 10 }, 413, "body_too_large"),
            (
                GatewayError::InvalidJson(JsonError::TooDeep { limit: 64 }),
                400,
                "json_too_deep",
            ),
            (
                GatewayError::MethodNotAllowed {
                    method: "GET".into(),
                    path: "/v1/chat/completions".into(),
                    allow: "POST",
                },
                405,
                "method_not_allowed",
            ),
            (
                GatewayError::NotFound {
                    method: "GET".into(),
                    path: "/x".into(),
                },
                404,
                "unknown_url",
            ),
            (GatewayError::MissingField { field: "model" }, 400, "missing_field"),
            (GatewayError::DuplicateField { field: "model" }, 400, "duplicate_field"),
        ];
        for (e, status, code) in cases {
            assert_eq!((e.status(), e.code()), (status, code), "{e:?}");
        }
    }

    #[test]
    fn envoys_501_for_an_unsupported_transfer_coding_is_the_clients_error() {
        let r = ENVOY_REPLIES.iter().find(|r| r.status == 501).unwrap();
        assert_eq!(
            (r.code, r.openai_type, r.anthropic_type),
            ("unsupported_framing", "invalid_request_error", "invalid_request_error")
        );
    }

    #[test]
    fn the_gateways_own_503_speaks_the_routes_envelope_and_names_the_request() {
        let v: Value = serde_json::from_slice(&unavailable_body(Envelope::OpenAi, Some("r2"))).unwrap();
        assert_eq!(
            (
                v["error"]["code"].as_str(),
                v["error"]["type"].as_str(),
                v["request_id"].as_str()
            ),
            (Some("gateway_error"), Some("server_error"), Some("r2"))
        );
        let v: Value = serde_json::from_slice(&unavailable_body(Envelope::Anthropic, Some("r3"))).unwrap();
        assert_eq!(
            (
                v["type"].as_str(),
                v["error"]["type"].as_str(),
                v["request_id"].as_str()
            ),
            (Some("error"), Some("api_error"), Some("r3"))
        );
    }

    #[test]
    fn overloaded_bodies_in_both_dialects() {
        let v: Value = serde_json::from_slice(&overloaded_body(Envelope::OpenAi, Some("r1"))).unwrap();
        assert_eq!(
            (v["error"]["code"].as_str(), v["request_id"].as_str()),
            (Some("overloaded"), Some("r1"))
        );
        let v: Value = serde_json::from_slice(&overloaded_body(Envelope::Anthropic, None)).unwrap();
        assert_eq!(v["error"]["type"], "overloaded_error");
        assert_eq!(v["type"], "error");
    }

    #[test]
    fn anthropic_envelope_shape() {
        let e = GatewayError::UnknownModel { model: "x".into() };
        let v: Value = serde_json::from_slice(&e.body(Envelope::Anthropic, Some("rid"))).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "not_found_error");
        assert_eq!(v["request_id"], "rid");
    }

    #[test]
    fn method_not_allowed_names_the_allowed_method() {
        let e = GatewayError::MethodNotAllowed {
            method: "GET".into(),
            path: "/p".into(),
            allow: "POST",
        };
        assert_eq!(e.headers(), vec![("allow", "POST")]);
    }
}
