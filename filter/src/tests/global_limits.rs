//! Limits shared by several Envoys, host side (`global_limits.rs`): the descriptor headers set after admission,
//! the tokens the stream-done rate limit charges (the input from admission, the reservation once an engine
//! answers, the reported usage at the end, nothing when Envoy's rate-limit filter refused), and a host error at
//! every call of such a request.

use llmroute_core::envoy_contract::global;
use proxy_wasm::types::Action;

use super::*;
use crate::host::HostStatus;

const DEFAULT_MAX_TOKENS: u64 = 2048;

fn global_config() -> String {
    CONFIG.replace(
        r#""version": 1,"#,
        r#""version": 1, "global_limits": { "address": "127.0.0.1:8081", "default_max_tokens": 2048 },"#,
    )
}

/// The tokens the stream-done call charges: the filter state when it is a number (Envoy drops the descriptor
/// otherwise).
fn charged(fake: &Rc<FakeHost>) -> Option<String> {
    fake.log_field(global::TOKENS_CHARGED)
        .filter(|v| v.parse::<u64>().is_ok())
}

/// A routed request, up to the end of its body; returns its input-token estimate.
fn admitted(fake: &Rc<FakeHost>, root: &Root, stream: bool) -> (Exchange, u64) {
    let mut x = Exchange::new(fake, root, 1);
    x.request_headers(&REQUEST_HEADERS, false);
    assert_eq!(x.request_body(chat(stream).as_bytes(), true), Action::Continue);
    let input: u64 = x
        .request_header(llmroute_core::headers::INPUT_TOKENS)
        .unwrap()
        .parse()
        .unwrap();
    (x, input)
}

#[test]
fn an_admitted_request_names_its_alias_and_is_charged_its_reservation_then_its_usage() {
    for stream in [false, true] {
        let fake = FakeHost::new();
        let root = root(&fake, &global_config());
        let (mut x, input) = admitted(&fake, &root, stream);
        assert_eq!(x.request_header(global::ALIAS_HEADER).as_deref(), Some("chat"));
        assert_eq!(x.request_header(global::KEY_HEADER), None, "no key without auth");
        assert_eq!(
            charged(&fake),
            Some(input.to_string()),
            "the input until an engine answers"
        );
        let media = if stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        x.response_headers(&[(":status", "200"), ("content-type", media)], false);
        let reserved = (input + DEFAULT_MAX_TOKENS).to_string();
        assert_eq!(
            charged(&fake),
            Some(reserved.clone()),
            "stream={stream}: the reservation"
        );
        if stream {
            x.response_body(SSE[0].as_bytes(), false);
            assert_eq!(charged(&fake), Some(reserved), "no usage yet");
            x.response_body(SSE[1].as_bytes(), false);
            x.response_body(SSE[2].as_bytes(), true);
        } else {
            x.response_body(JSON_ANSWER.as_bytes(), true);
        }
        // 12 prompt + 3 completion tokens, as the engine reported.
        assert_eq!(charged(&fake).as_deref(), Some("15"), "stream={stream}: the usage");
        x.log();
        assert_eq!(charged(&fake).as_deref(), Some("15"));
    }
}

#[test]
fn with_auth_the_key_descriptor_names_the_key_never_its_value() {
    const KEYS_ENV: &str = "LLMROUTE_TEST_GLOBAL_KEYS";
    const TOKEN: &str = "sk-global-0123456789abcdef0123";
    std::env::set_var(KEYS_ENV, format!("team-g:{TOKEN}"));
    let config = global_config().replace(
        r#""version": 1,"#,
        &format!(r#""version": 1, "auth": {{ "keys_env": "{KEYS_ENV}" }},"#),
    );
    let fake = FakeHost::new();
    let root = root(&fake, &config);
    let mut x = Exchange::new(&fake, &root, 1);
    let bearer = format!("Bearer {TOKEN}");
    let headers = [&REQUEST_HEADERS[..], &[("authorization", bearer.as_str())]].concat();
    x.request_headers(&headers, false);
    assert_eq!(x.request_body(chat(false).as_bytes(), true), Action::Continue);
    assert_eq!(x.request_header(global::KEY_HEADER).as_deref(), Some("team-g"));
    assert_eq!(x.request_header(global::ALIAS_HEADER).as_deref(), Some("chat"));
    assert!(fake
        .map(proxy_wasm::types::MapType::HttpRequestHeaders)
        .iter()
        .all(|(_, v)| !v.contains(TOKEN)));
}

#[test]
fn a_client_gone_before_the_answer_is_charged_its_input() {
    let fake = FakeHost::new();
    let root = root(&fake, &global_config());
    let (mut x, input) = admitted(&fake, &root, false);
    // The client resets the stream: no response headers, only the log phase.
    x.log();
    assert!(input > 0);
    assert_eq!(charged(&fake), Some(input.to_string()));
}

#[test]
fn a_stream_cut_before_its_usage_keeps_the_reservation() {
    let fake = FakeHost::new();
    let root = root(&fake, &global_config());
    let (mut x, input) = admitted(&fake, &root, true);
    x.response_headers(&[(":status", "200"), ("content-type", "text/event-stream")], false);
    x.response_body(SSE[0].as_bytes(), false);
    x.response_body(b"", true);
    x.log();
    assert_eq!(charged(&fake), Some((input + DEFAULT_MAX_TOKENS).to_string()));
}

#[test]
fn a_reply_of_the_rate_limit_filter_charges_nothing_and_is_counted() {
    for (details, status, retry_after, reason) in [
        (global::DETAILS_LIMITED, "429", Some("30"), "rate_limit_exceeded"),
        (global::DETAILS_SERVICE_ERROR, "503", None, "rate_limit_unavailable"),
    ] {
        let fake = FakeHost::new();
        let root = root(&fake, &global_config());
        let (mut x, _) = admitted(&fake, &root, false);
        fake.set_property_bytes(&["response", "code_details"], details.as_bytes());
        let reply = [
            (":status", status),
            ("content-type", "application/json"),
            (global::RESET_HEADER, "30"),
        ];
        assert_eq!(x.response_headers(&reply, false), Action::Continue);
        assert_eq!(x.response_header("retry-after").as_deref(), retry_after, "{details}");
        assert_eq!(x.response_body(br#"{"error":{}}"#, true), Action::Continue);
        x.log();
        assert_eq!(charged(&fake), None, "{details}: nothing charged");
        let rejected = format!("llmroute_rejections_total;reason={reason}");
        assert_eq!(fake.metric(&rejected), Some(1), "{details}");
        let limited = fake.metric("llmroute_rate_limited_total;alias=chat;key=none;kind=global");
        assert_eq!(limited, (details == global::DETAILS_LIMITED).then_some(1), "{details}");
    }
}

#[test]
fn a_reset_time_out_of_range_is_clamped_or_defaulted() {
    for (reset, after) in [("0", "1"), ("soon", "1"), ("999999", "86400")] {
        let fake = FakeHost::new();
        let root = root(&fake, &global_config());
        let (mut x, _) = admitted(&fake, &root, false);
        fake.set_property_bytes(&["response", "code_details"], global::DETAILS_LIMITED.as_bytes());
        x.response_headers(&[(":status", "429"), (global::RESET_HEADER, reset)], false);
        assert_eq!(x.response_header("retry-after").as_deref(), Some(after), "{reset}");
    }
}

#[test]
fn a_host_error_at_any_call_neither_panics_nor_loses_the_request() {
    for stream in [false, true] {
        super::http::assert_survives(&global_config(), stream, HostStatus::InternalFailure);
        super::http::assert_survives(&global_config(), stream, HostStatus::Other(77));
    }
}
