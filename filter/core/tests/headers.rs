//! Header hygiene: the gateway's own header names, and what is stripped from clients before the upstream.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{sdk_headers, SDK_NAMES};
use llmroute_core::headers::{
    must_strip, to_strip, AFFINITY, AFFINITY_SOURCE, CLUSTER, ERROR, INPUT_TOKENS, REQUEST_ID, SESSION_ECHO,
    TOKEN_ESTIMATE, UPSTREAM,
};

// ---------------------------------------------------------------------------------------------------------------
// Headers

#[test]
fn gateway_header_names() {
    assert_eq!(CLUSTER, "x-llmroute-cluster");
    assert_eq!(AFFINITY, "x-llmroute-affinity");
    assert_eq!(AFFINITY_SOURCE, "x-llmroute-affinity-source");
    assert_eq!(UPSTREAM, "x-llmroute-upstream");
    assert_eq!(ERROR, "x-llmroute-error");
    assert_eq!(INPUT_TOKENS, "x-input-tokens");
    assert_eq!(TOKEN_ESTIMATE, "x-token-estimate");
    assert_eq!(SESSION_ECHO, "x-multi-turn-session-id");
    assert_eq!(REQUEST_ID, "x-request-id");
}

#[test]
fn client_copies_of_the_token_headers_are_stripped() {
    for name in [INPUT_TOKENS, TOKEN_ESTIMATE, "X-Input-Tokens", "X-TOKEN-ESTIMATE"] {
        assert!(must_strip(name), "{name}");
    }
    for name in ["x-input-token", "x-token-estimates", "x-output-tokens"] {
        assert!(!must_strip(name), "{name}");
    }
}

#[test]
fn cookies_are_stripped() {
    for name in ["cookie", "Cookie", "COOKIE"] {
        assert!(must_strip(name), "{name}");
    }
    assert!(!must_strip("set-cookie"));
    assert!(!must_strip("cookie2x"));
}

#[test]
fn the_session_echo_and_request_id_headers_are_not_stripped() {
    // Clients send these; they are read (session) or kept (request id), never removed.
    assert!(!must_strip(SESSION_ECHO));
    assert!(!must_strip(REQUEST_ID));
}

#[test]
fn anthropic_and_trace_headers_are_kept() {
    for name in [
        "anthropic-version",
        "anthropic-beta",
        "traceparent",
        "tracestate",
        "baggage",
        "Traceparent",
    ] {
        assert!(!must_strip(name), "{name}");
    }
}

#[test]
fn every_gateway_header_is_stripped_from_clients() {
    for name in [CLUSTER, AFFINITY, AFFINITY_SOURCE, UPSTREAM, ERROR] {
        assert!(must_strip(name), "{name}");
        assert!(must_strip(&name.to_ascii_uppercase()), "{name}");
    }
}

#[test]
fn the_whole_x_llmroute_namespace_is_stripped() {
    for name in [
        "x-llmroute-",
        "x-llmroute-anything",
        "X-LLMROUTE-Cluster",
        "x-LlmRoute-future-header",
    ] {
        assert!(must_strip(name), "{name}");
    }
    for name in [
        "x-llmroute",
        "x-llmroutex-cluster",
        "llmroute-cluster",
        "x-llm-route-cluster",
        "xx-llmroute-a",
    ] {
        assert!(!must_strip(name), "{name}");
    }
}

#[test]
fn client_credentials_are_stripped() {
    for name in [
        "authorization",
        "Authorization",
        "AUTHORIZATION",
        "proxy-authorization",
        "Proxy-Authorization",
        "x-api-key",
        "X-Api-Key",
        "api-key",
        "Api-Key",
    ] {
        assert!(must_strip(name), "{name}");
    }
}

#[test]
fn other_headers_are_kept() {
    for name in [
        "content-type",
        "accept",
        "x-session-id",
        "x-claude-code-session-id",
        "anthropic-version",
        "anthropic-beta",
        "openai-organization",
        "x-stainless-os",
        "user-agent",
        ":path",
        ":authority",
        "authorization-extra",
        "x-authorization",
        "x-api-keys",
        "",
    ] {
        assert!(!must_strip(name), "{name}");
    }
}

#[test]
fn to_strip_keeps_request_order_and_duplicates() {
    let names = [
        "content-type",
        "X-LLMRoute-Cluster",
        "authorization",
        "accept",
        "x-llmroute-cluster",
        "api-key",
    ];
    assert_eq!(
        to_strip(names),
        vec!["X-LLMRoute-Cluster", "authorization", "x-llmroute-cluster", "api-key"]
    );
    assert!(to_strip(["a", "b"]).is_empty());
    assert!(to_strip(Vec::<&str>::new()).is_empty());
}

#[test]
fn captured_headers_lose_only_the_credentials() {
    assert_eq!(SDK_NAMES.len(), 10);
    for name in SDK_NAMES {
        let headers = sdk_headers(name);
        let stripped = to_strip(headers.iter().map(|(n, _)| n.as_str()));
        assert_eq!(stripped, ["authorization"], "{name}");
        // What stays includes every SDK telemetry and Anthropic header.
        let kept: Vec<&str> = headers
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| !must_strip(n))
            .collect();
        assert_eq!(kept.len(), headers.len() - 1, "{name}");
        assert!(kept.contains(&"x-stainless-lang"), "{name}");
    }
}

#[test]
fn claude_code_capture_keeps_its_session_and_beta_headers() {
    let headers = sdk_headers("messages-tools-image-thinking-cache-control-claude-code");
    for wanted in ["x-claude-code-session-id", "anthropic-beta", "anthropic-version"] {
        assert!(headers.iter().any(|(n, _)| n == wanted), "{wanted}");
        assert!(!must_strip(wanted), "{wanted}");
    }
}
