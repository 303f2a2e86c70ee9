//! Limits shared by several Envoys (`global_limits`): what the filter tells Envoy's rate-limit filter, what it
//! charges when the stream is done, and how it reads the rate-limit filter's own replies.
//!
//! The in-filter buckets (`limits`) are exact inside one Envoy. Across Envoys, Envoy's `envoy.filters.http.ratelimit`
//! asks a rate-limit service (envoyproxy/ratelimit, Redis-backed) with descriptors that the renderer builds from two
//! request headers the filter sets after admission: the alias and the API key's name. Both are config-defined
//! names, so the service sees a bounded set of values and never a prompt, a token or a client-chosen string.
//!
//! Tokens are known only when the response is over, so the renderer adds `apply_on_stream_done` rate limits whose
//! `hits_addend` reads filter state the filter writes here: the input estimate as soon as the request is admitted
//! (a client that leaves before any answer still cost the engine its prompt), the reservation (input estimate
//! plus the output bound) as soon as an engine answers, then the reported usage when the response ends. Envoy
//! evaluates it when the stream is done, so the last value written is the one charged. A request refused by the
//! rate-limit filter itself charges nothing: the filter then overwrites the value with [`NOT_CHARGED`], and Envoy
//! drops a descriptor whose `hits_addend` is not a number. Cost: two header writes and one property write per
//! request, and one or two property writes per response.

use crate::config::GlobalLimits;
use crate::envoy_contract::global;

/// Envoy drops a descriptor whose `hits_addend` is above this (`MAX_HITS_ADDEND` in Envoy 1.40).
pub const MAX_HITS: u64 = 1_000_000_000;
/// The longest `Retry-After` the gateway derives from the service's reset time: one day.
pub const MAX_RETRY_AFTER_S: u64 = 86_400;

/// The request headers the route's rate-limit descriptors read, for a request the filter admitted. Without a
/// key (no `auth`), the key descriptors are left out: Envoy drops a descriptor whose header is missing.
pub fn descriptor_headers<'a>(alias: &'a str, key: Option<&'a str>) -> Vec<(&'static str, &'a str)> {
    let mut out = vec![(global::ALIAS_HEADER, alias)];
    if let Some(k) = key {
        out.push((global::KEY_HEADER, k));
    }
    out
}

/// The tokens a request is charged when its engine reports no usage: the input estimate plus `max_output` (or
/// the block's `default_max_tokens`), at most [`MAX_HITS`].
pub fn reservation(g: &GlobalLimits, input: u64, max_output: Option<u64>) -> u64 {
    input
        .saturating_add(max_output.unwrap_or(g.default_max_tokens))
        .min(MAX_HITS)
}

/// The value written for a request the rate-limit filter refused: not a number, so Envoy sends no stream-done
/// charge for it.
pub const NOT_CHARGED: &str = "";

/// The tokens to charge when the stream is done, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// Admitted and sent on, no engine answer yet: the input estimate, what the prompt costs an engine even when
    /// the client leaves before the answer.
    Input(u64),
    /// The engine reported its usage (prompt plus completion).
    Used(u64),
    /// No usage (yet, or ever: a cut stream, an error body): the reservation stands, as in-filter limits keep it.
    Reserved(u64),
}

impl Charge {
    pub fn tokens(self) -> u64 {
        match self {
            Charge::Input(n) | Charge::Used(n) | Charge::Reserved(n) => n.min(MAX_HITS),
        }
    }
}

/// The charge for a response the rate-limit filter did not refuse.
pub fn charge(reserved: u64, used: Option<u64>) -> Charge {
    match used {
        Some(n) => Charge::Used(n),
        None => Charge::Reserved(reserved),
    }
}

/// A reply Envoy's rate-limit filter sent itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The service answered OVER_LIMIT: 429.
    OverLimit,
    /// The service could not answer and `failure_mode` is `deny`: 503.
    ServiceError,
}

impl Refusal {
    /// The `llmroute_rejections_total` reason.
    pub fn metric_reason(self) -> &'static str {
        match self {
            Refusal::OverLimit => "rate_limit_exceeded",
            Refusal::ServiceError => "rate_limit_unavailable",
        }
    }
}

/// Whether a response is the rate-limit filter's own reply, from Envoy's `response.code_details`.
pub fn refusal(code_details: &str) -> Option<Refusal> {
    match code_details {
        global::DETAILS_LIMITED => Some(Refusal::OverLimit),
        global::DETAILS_SERVICE_ERROR => Some(Refusal::ServiceError),
        _ => None,
    }
}

/// `Retry-After` for an over-limit reply: the service's reset time (`x-ratelimit-reset`, whole seconds) when it
/// sent one, within 1 s to a day; else 1 s.
pub fn retry_after_s(reset: Option<&str>) -> u64 {
    reset
        .and_then(|r| r.trim().parse::<u64>().ok())
        .map_or(1, |s| s.clamp(1, MAX_RETRY_AFTER_S))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_endpoint;

    fn g(default_max_tokens: u64) -> GlobalLimits {
        GlobalLimits {
            address: parse_endpoint("127.0.0.1:8081").unwrap(),
            domain: "llmroute".into(),
            timeout_ms: 100,
            failure_mode_allow: true,
            default_max_tokens,
        }
    }

    #[test]
    fn headers_carry_the_alias_and_only_a_configured_key() {
        assert_eq!(
            descriptor_headers("chat", Some("alice")),
            [(global::ALIAS_HEADER, "chat"), (global::KEY_HEADER, "alice")]
        );
        assert_eq!(descriptor_headers("chat", None), [(global::ALIAS_HEADER, "chat")]);
        for (name, _) in descriptor_headers("a", Some("k")) {
            assert!(crate::headers::must_strip(name), "{name} must be stripped from clients");
        }
    }

    #[test]
    fn the_reservation_uses_the_output_bound_or_the_default() {
        assert_eq!(reservation(&g(1024), 10, Some(20)), 30);
        assert_eq!(reservation(&g(1024), 10, None), 1034);
        assert_eq!(reservation(&g(5), u64::MAX, None), MAX_HITS);
    }

    #[test]
    fn usage_replaces_the_reservation() {
        assert_eq!(charge(100, None), Charge::Reserved(100));
        assert_eq!(charge(100, Some(7)), Charge::Used(7));
        // An overrun is charged in full, never capped at the reservation.
        assert_eq!(charge(100, Some(5000)).tokens(), 5000);
        assert_eq!(charge(100, Some(0)).tokens(), 0);
        assert_eq!(charge(100, Some(u64::MAX)).tokens(), MAX_HITS);
    }

    #[test]
    fn only_the_rate_limit_filters_details_are_refusals() {
        assert_eq!(refusal("request_rate_limited"), Some(Refusal::OverLimit));
        assert_eq!(refusal("rate_limiter_error"), Some(Refusal::ServiceError));
        assert_eq!(refusal("via_upstream"), None);
        assert_eq!(refusal(""), None);
        assert_eq!(Refusal::OverLimit.metric_reason(), "rate_limit_exceeded");
    }

    #[test]
    fn retry_after_follows_the_reset_within_bounds() {
        assert_eq!(retry_after_s(Some("7")), 7);
        assert_eq!(retry_after_s(Some("0")), 1);
        assert_eq!(retry_after_s(Some("99999999")), MAX_RETRY_AFTER_S);
        assert_eq!(retry_after_s(Some("-3")), 1);
        assert_eq!(retry_after_s(Some("soon")), 1);
        assert_eq!(retry_after_s(None), 1);
    }
}
