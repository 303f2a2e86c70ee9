//! Header hygiene: which client headers the gateway removes, and the names of the headers it sets.
//!
//! The `x-llmroute-*` namespace belongs to the gateway: a client-sent copy could steer the route, so every one
//! is removed before the gateway sets its own, and so are client copies of the token-estimate headers. Client
//! credentials and cookies are removed too, so they never reach an engine; a backend that needs a credential
//! gets the gateway's own. Everything else, `anthropic-version`, `anthropic-beta` and W3C trace headers
//! included, passes through.

pub use crate::envoy_contract::{
    AFFINITY, AFFINITY_SOURCE, ALIAS, CLUSTER, ERROR, INPUT_TOKENS, LOCAL_REPLY, PLACEMENT, REQUEST_ID, SESSION_ECHO,
    TOKEN_ESTIMATE, UPSTREAM,
};

/// Debug response headers: the fewest requests and tokens left, right after admission, in the limit buckets
/// the request was charged to.
pub const REQUESTS_REMAINING: &str = "x-llmroute-requests-remaining";
pub const TOKENS_REMAINING: &str = "x-llmroute-tokens-remaining";
/// Upstream request header with the hash of the client's explicit session key (16 hex digits, never the raw
/// value), for a cache-aware router behind the gateway. The NVCF LLM Gateway sets the same header.
pub const CACHE_AFFINITY_KEY: &str = "x-cache-affinity-key";
/// Control headers of the NVCF LLM Gateway that only the gateway may set upstream: a client's copy could jump a
/// queue (`x-max-wait-ms`, `x-request-slo-ms`) or steer a cache-aware router (`x-cache-affinity-key`).
pub const GATEWAY_CONTROL: [&str; 3] = ["x-max-wait-ms", "x-request-slo-ms", CACHE_AFFINITY_KEY];

const OWNED_PREFIX: &str = "x-llmroute-";
/// Headers only the gateway may set upstream.
const OWNED: [&str; 2] = [INPUT_TOKENS, TOKEN_ESTIMATE];
/// Client credentials and cookies never reach an engine.
pub const CREDENTIALS: [&str; 5] = ["authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"];

/// True for a request header that must not travel upstream as the client sent it.
pub fn must_strip(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.starts_with(OWNED_PREFIX)
        || OWNED.contains(&name.as_str())
        || CREDENTIALS.contains(&name.as_str())
        || GATEWAY_CONTROL.contains(&name.as_str())
}

/// The names among `names` that the gateway removes, in order.
pub fn to_strip<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    names.into_iter().filter(|n| must_strip(n)).collect()
}

/// The `content-length` to send upstream with a body of `len` bytes, given the value the client sent: `None`
/// when the client's already says `len` (the body went through unedited), which spares the host call that would
/// set it again. A chunked request (no length), or an edited body, gets its length.
pub fn content_length_update(sent: Option<&[u8]>, len: usize) -> Option<String> {
    let same = sent
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.trim().parse::<usize>().ok())
        == Some(len);
    (!same).then(|| len.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_our_namespace_in_any_case() {
        assert!(must_strip("x-llmroute-cluster"));
        assert!(must_strip("X-LLMRoute-Affinity"));
        assert!(must_strip("x-llmroute-anything"));
        assert!(!must_strip("x-llmroutex"));
    }

    #[test]
    fn strips_credentials() {
        for h in [
            "authorization",
            "Authorization",
            "x-api-key",
            "proxy-authorization",
            "api-key",
        ] {
            assert!(must_strip(h), "{h}");
        }
    }

    #[test]
    fn strips_client_copies_of_our_token_headers() {
        assert!(must_strip("X-Token-Estimate"));
        assert!(must_strip("x-input-tokens"));
    }

    #[test]
    fn strips_client_copies_of_the_gateway_control_headers() {
        for h in [
            "x-max-wait-ms",
            "X-Request-SLO-ms",
            "x-cache-affinity-key",
            "X-Cache-Affinity-Key",
        ] {
            assert!(must_strip(h), "{h}");
        }
        assert!(!must_strip("x-max-wait"));
    }

    #[test]
    fn keeps_everything_else() {
        for h in [
            "content-type",
            "x-session-id",
            "anthropic-version",
            "x-stainless-os",
            "accept",
            ":path",
        ] {
            assert!(!must_strip(h), "{h}");
        }
    }

    #[test]
    fn to_strip_keeps_order() {
        let names = ["a", "x-llmroute-b", "authorization", "c"];
        assert_eq!(to_strip(names), vec!["x-llmroute-b", "authorization"]);
    }

    #[test]
    fn content_length_is_set_only_when_the_clients_does_not_say_it() {
        assert_eq!(content_length_update(Some(b"120"), 120), None);
        assert_eq!(content_length_update(Some(b"120"), 131).as_deref(), Some("131"));
        assert_eq!(content_length_update(None, 120).as_deref(), Some("120"));
        assert_eq!(content_length_update(Some(b"x"), 0).as_deref(), Some("0"));
        assert_eq!(content_length_update(Some(b""), 0).as_deref(), Some("0"));
    }
}
