//! The request context (`http.rs`) driven natively: phase order and pauses, what each phase leaves in Envoy,
//! local replies in their envelope, and a host error at every call index.

use proxy_wasm::types::{Action, BufferType, LogLevel, MapType};

use super::*;
use crate::host::fake::Kind;
use crate::host::HostStatus;

#[test]
fn a_chat_request_pauses_until_its_body_ends_then_routes_once() {
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    let mut x = Exchange::new(&fake, &root, 1);
    let client = [
        &REQUEST_HEADERS[..],
        &[("x-llmroute-cluster", "evil"), ("authorization", "Bearer sk-1")],
    ]
    .concat();
    assert_eq!(x.request_headers(&client, false), Action::Pause);
    // The client's routing header and credential are gone at once; nothing is routed yet.
    assert_eq!(
        (
            x.request_header("x-llmroute-cluster"),
            x.request_header("authorization")
        ),
        (None, None)
    );
    let body = chat(false);
    let (a, b) = body.as_bytes().split_at(40);
    assert_eq!(x.request_body(a, false), Action::Pause);
    assert_eq!(
        x.request_header("x-llmroute-cluster"),
        None,
        "no decision before the body ends"
    );
    assert_eq!(x.request_body(b, true), Action::Continue);

    let sent = x.request_buffer();
    let sent_text = String::from_utf8(sent.clone()).unwrap();
    assert_eq!(
        sent_text,
        body.replace(r#""model":"chat""#, r#""model":"qwen3-0.6b""#),
        "only `model` changes"
    );
    assert_eq!(x.request_header("content-length"), Some(sent.len().to_string()));
    assert_eq!(x.request_header("x-llmroute-cluster").as_deref(), Some("llama-a"));
    assert_eq!(x.request_header("x-llmroute-affinity").map(|h| h.len()), Some(16));
    assert_eq!(x.request_header("accept-encoding").as_deref(), Some("identity"));
    assert_eq!(
        x.request_header("x-request-id").as_deref(),
        Some("req-0001"),
        "a good request id is kept"
    );
    assert_eq!(fake.log_field("llmroute.alias").as_deref(), Some("chat"));
    assert_eq!(
        fake.log_field("llmroute.affinity_source").as_deref(),
        Some("system_prompt")
    );
    assert!(fake.replies().is_empty());
}

#[test]
fn http2_may_end_the_body_in_the_trailers() {
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    let mut x = Exchange::new(&fake, &root, 1);
    assert_eq!(x.request_headers(&REQUEST_HEADERS, false), Action::Pause);
    assert_eq!(x.request_body(chat(false).as_bytes(), false), Action::Pause);
    assert_eq!(x.request_trailers(), Action::Continue);
    assert_eq!(x.request_header("x-llmroute-cluster").as_deref(), Some("llama-a"));
    // A second end (trailers after the body's end) decides nothing twice.
    assert_eq!(x.request_trailers(), Action::Continue);
}

#[test]
fn a_stream_is_relayed_chunk_by_chunk_and_closed_when_its_end_is_missing() {
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    let mut x = Exchange::new(&fake, &root, 1);
    x.request_headers(&REQUEST_HEADERS, false);
    x.request_body(chat(true).as_bytes(), true);
    let sse = [
        (":status", "200"),
        ("content-type", "text/event-stream"),
        ("content-length", "999"),
    ];
    assert_eq!(x.response_headers(&sse, false), Action::Continue);
    assert_eq!(
        x.response_header("content-length"),
        None,
        "the gateway may append to a stream"
    );
    assert_eq!(
        x.response_header("x-llmroute-affinity-source").as_deref(),
        Some("system")
    );
    assert_eq!(x.response_body(SSE[0].as_bytes(), false), Action::Continue);
    assert_eq!(x.delivered, SSE[0].as_bytes(), "relayed as it came");
    // The engine hangs up before `[DONE]`: the client gets a closing error event.
    assert_eq!(x.response_body(b"", true), Action::Continue);
    let tail = String::from_utf8(x.delivered[SSE[0].len()..].to_vec()).unwrap();
    assert!(tail.contains("error"), "closing event appended: {tail:?}");
    fake.set_property_bytes(&["response", "code"], &200u64.to_le_bytes());
    x.log();
    let outcome = |o: &str| fake.metric(&format!("llmroute_stream_outcomes_total;outcome={o}"));
    assert_eq!(
        outcome("missing_terminal").or(outcome("truncated")).map(|n| n > 0),
        Some(true)
    );
}

#[test]
fn a_json_answer_whose_copy_left_out_a_chunk_gives_no_usage() {
    // The head and the tail alone make a valid document with a usage; only the whole answer may be read.
    let head = r#"{"usage":{"prompt_tokens":12,"completion_tokens":3},"pad":""#;
    let tail = r#""}"#;
    let tokens = "llmroute_tokens_total;alias=chat;backend=llama-a;kind=output";
    for (middle, counted) in [(1000, Some("3")), (llmroute_core::stream::usage::MAX_USAGE_DOC, None)] {
        let fake = FakeHost::new();
        let root = root(&fake, CONFIG);
        let mut x = Exchange::new(&fake, &root, 1);
        x.request_headers(&REQUEST_HEADERS, false);
        assert_eq!(x.request_body(chat(false).as_bytes(), true), Action::Continue);
        x.response_headers(&[(":status", "200"), ("content-type", "application/json")], false);
        fake.set_property_bytes(&["response", "code"], &200u64.to_le_bytes());
        x.response_body(head.as_bytes(), false);
        x.response_body(&vec![b'x'; middle], false);
        x.response_body(tail.as_bytes(), true);
        x.log();
        assert_eq!(x.delivered.len(), head.len() + middle + tail.len(), "relayed whole");
        assert_eq!(
            fake.log_field("llmroute.output_tokens").as_deref(),
            counted,
            "middle {middle}"
        );
        assert_eq!(fake.metric(tokens), counted.map(|_| 3), "middle {middle}");
    }
}

#[test]
fn a_whole_exchange_counts_its_tokens_and_logs_no_prompt_text() {
    for stream in [false, true] {
        let fake = FakeHost::new();
        let root = root(&fake, CONFIG);
        let mut x = Exchange::new(&fake, &root, 1);
        assert_eq!(
            run_chat(&mut x, stream),
            vec![Action::Pause, Action::Pause, Action::Continue]
        );
        let expected = if stream { SSE.concat() } else { JSON_ANSWER.to_string() };
        assert_eq!(
            String::from_utf8(x.delivered.clone()).unwrap(),
            expected,
            "stream={stream}"
        );
        assert_eq!(fake.log_field("llmroute.input_tokens").as_deref(), Some("12"));
        assert_eq!(fake.log_field("llmroute.output_tokens").as_deref(), Some("3"));
        let tokens = "llmroute_tokens_total;alias=chat;backend=llama-a;kind=output";
        assert_eq!(fake.metric(tokens), Some(3), "stream={stream}");
        // No prompt text anywhere the gateway writes: headers, log lines, log fields, metric names.
        let mut written: Vec<String> = fake
            .map(MapType::HttpRequestHeaders)
            .into_iter()
            .map(|(k, v)| k + &v)
            .collect();
        written.extend(fake.map(MapType::HttpResponseHeaders).into_iter().map(|(k, v)| k + &v));
        written.extend(fake.logs().into_iter().map(|(_, l)| l));
        for w in written {
            assert!(
                !w.contains("PROMPT-TEXT") && !w.contains("terse"),
                "prompt text leaked: {w}"
            );
        }
    }
}

#[test]
fn a_refusal_is_a_local_reply_in_the_envelope_and_never_routed() {
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    let mut x = Exchange::new(&fake, &root, 1);
    x.request_headers(&REQUEST_HEADERS, false);
    assert_eq!(x.request_body(br#"{"model":"chat","messages":"#, true), Action::Pause);
    let replies = fake.replies();
    assert_eq!(replies.len(), 1);
    let r = &replies[0];
    assert_eq!(r.status, 400);
    assert_eq!(r.header("x-request-id"), Some("req-0001"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(body["error"]["message"].is_string(), "OpenAI envelope: {body}");
    assert_eq!(x.request_header("x-llmroute-local-reply").as_deref(), Some("1"));
    assert_eq!(x.request_header("x-llmroute-cluster"), None);
    x.log();
    assert_eq!(fake.metric("llmroute_rejections_total;reason=invalid_json"), Some(1));
}

#[test]
fn a_body_over_the_limit_is_refused_before_it_ends() {
    let fake = FakeHost::new();
    let root = root(
        &fake,
        &CONFIG.replace(
            r#""version": 1,"#,
            r#""version": 1, "limits": { "max_body_bytes": 1024 },"#,
        ),
    );
    let mut x = Exchange::new(&fake, &root, 1);
    x.request_headers(&REQUEST_HEADERS, false);
    assert_eq!(x.request_body(&[b' '; 600], false), Action::Pause);
    assert_eq!(x.request_body(&[b' '; 600], false), Action::Pause);
    assert_eq!(fake.replies().iter().map(|r| r.status).collect::<Vec<_>>(), vec![413]);
}

#[test]
fn an_empty_request_and_a_missing_request_id_are_handled_in_the_headers_phase() {
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    let mut x = Exchange::new(&fake, &root, 7);
    let headers: Vec<_> = REQUEST_HEADERS
        .iter()
        .copied()
        .filter(|(n, _)| *n != "x-request-id")
        .collect();
    assert_eq!(x.request_headers(&headers, true), Action::Pause);
    let r = &fake.replies()[0];
    assert_eq!(r.status, 400);
    let id = x.request_header("x-request-id").unwrap();
    assert!(id.starts_with("llmroute-"), "{id}");
    assert_eq!(r.header("x-request-id"), Some(id.as_str()));
}

#[test]
fn status_pages_and_the_models_list_are_answered_without_a_body() {
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    for (path, status) in [
        ("/healthz", 200),
        ("/readyz", 503),
        ("/v1/models", 200),
        ("/nowhere", 404),
    ] {
        let mut x = Exchange::new(&fake, &root, 1);
        let before = fake.replies().len();
        let headers = [(":method", "GET"), (":path", path), (":authority", "gw")];
        assert_eq!(x.request_headers(&headers, true), Action::Pause, "{path}");
        assert_eq!(fake.replies()[before].status, status, "{path}");
        x.log();
    }
}

#[test]
fn phases_out_of_order_or_missing_neither_panic_nor_route() {
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    // A body, trailers, a response and a log without request headers (Envoy's own reply to a bad request).
    let mut x = Exchange::new(&fake, &root, 1);
    assert_eq!(x.request_body(b"{}", true), Action::Continue);
    assert_eq!(x.request_trailers(), Action::Continue);
    assert_eq!(x.response_headers(&[(":status", "400")], false), Action::Continue);
    assert_eq!(x.response_body(b"oops", true), Action::Continue);
    x.log();
    // Envoy answers while the body is still paused (its own timeout): the response passes, nothing is routed.
    let mut x = Exchange::new(&fake, &root, 2);
    x.request_headers(&REQUEST_HEADERS, false);
    x.request_body(b"{\"model\":", false);
    assert_eq!(
        x.response_headers(&[(":status", "408"), ("content-type", "text/plain")], false),
        Action::Continue
    );
    assert_eq!(x.response_body(b"timeout", true), Action::Continue);
    x.log();
    assert_eq!(x.delivered, b"timeout");
    assert_eq!(x.request_header("x-llmroute-cluster"), None);
}

#[test]
fn a_root_without_config_answers_503_in_the_envelope() {
    let fake = FakeHost::new();
    let root = Root::new(fake.envoy());
    let mut x = Exchange::new(&fake, &root, 1);
    assert_eq!(x.request_headers(&REQUEST_HEADERS, false), Action::Pause);
    assert_eq!(fake.replies()[0].status, 503);
    // The bad configuration itself is refused, its reason logged.
    fake.set_buffer_bytes(BufferType::PluginConfiguration, b"{\"version\": 9}");
    assert!(!Root::new(fake.envoy()).on_configure(14));
    let logs = fake.logs();
    assert!(
        logs.iter()
            .any(|(l, m)| *l == LogLevel::Error && m.contains("llmroute config")),
        "{logs:?}"
    );
}

#[test]
fn a_backend_error_on_messages_is_buffered_and_rewritten_in_the_anthropic_envelope() {
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    let mut x = Exchange::new(&fake, &root, 1);
    let mut headers = REQUEST_HEADERS;
    headers[1] = (":path", "/v1/messages");
    x.request_headers(&headers, false);
    let body = br#"{"model":"chat","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(x.request_body(body, true), Action::Continue);
    assert!(fake.replies().is_empty());
    let error = [
        (":status", "429"),
        ("content-type", "text/plain"),
        ("content-length", "9"),
    ];
    assert_eq!(x.response_headers(&error, false), Action::Continue);
    assert_eq!(x.response_header("request-id").as_deref(), Some("req-0001"));
    assert_eq!(x.response_header("content-length"), None);
    assert_eq!(x.response_body(b"too ", false), Action::Pause, "buffered until its end");
    assert_eq!(x.response_body(b"many", true), Action::Continue);
    let doc: serde_json::Value = serde_json::from_slice(&x.delivered).unwrap();
    assert_eq!(doc["type"], "error", "{doc}");
    assert_eq!(doc["error"]["type"], "rate_limit_error", "{doc}");
}

#[test]
fn a_request_envoy_shed_gets_the_overloaded_envelope_and_retry_after() {
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    let mut x = Exchange::new(&fake, &root, 1);
    x.request_headers(&REQUEST_HEADERS, false);
    x.request_body(chat(false).as_bytes(), true);
    let shed = [
        (":status", "503"),
        ("x-envoy-overloaded", "true"),
        ("content-type", "text/plain"),
    ];
    assert_eq!(x.response_headers(&shed, false), Action::Continue);
    assert_eq!(x.response_header("retry-after").as_deref(), Some("1"));
    assert_eq!(x.response_body(b"upstream ", false), Action::Pause);
    assert_eq!(x.response_body(b"overflow", true), Action::Continue);
    let doc: serde_json::Value = serde_json::from_slice(&x.delivered).unwrap();
    assert!(doc["error"]["message"].is_string(), "{doc}");
    assert!(!String::from_utf8_lossy(&x.delivered).contains("upstream overflow"));
    assert_eq!(fake.metric("llmroute_overflow_total"), Some(1));
}

/// What became of a request: answered by the gateway, or sent on to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Answered(u32),
    Forwarded,
    Lost,
}

fn fate(fake: &Rc<FakeHost>, actions: &[Action]) -> Fate {
    match (fake.replies().last(), actions.last()) {
        (Some(r), _) => Fate::Answered(r.status),
        (None, Some(Action::Continue)) => Fate::Forwarded,
        _ => Fate::Lost,
    }
}

/// One whole exchange on a fresh host whose calls fail as `fail` says (after the root is configured).
fn exchange_with(config: &str, stream: bool, fail: impl Fn(&FakeHost)) -> (Rc<FakeHost>, Fate, bool) {
    let fake = FakeHost::new();
    let root = root(&fake, config);
    fake.reset_calls();
    fail(&fake);
    let mut x = Exchange::new(&fake, &root, 1);
    let actions = run_chat(&mut x, stream);
    let reply_failed = fake.calls().contains(&Kind::LocalResponse) && fake.replies().is_empty();
    let f = fate(&fake, &actions);
    (fake, f, reply_failed)
}

/// The request survives any one host error: it is answered (503 when the gateway cannot do its part) or
/// forwarded; only a failed local reply itself can leave it to Envoy's timeout.
pub(super) fn assert_survives(config: &str, stream: bool, status: HostStatus) {
    let (clean, fate0, _) = exchange_with(config, stream, |_| {});
    assert_eq!(fate0, Fate::Forwarded);
    let n = clean.calls().len();
    assert!(n > 10, "the exchange makes host calls: {n}");
    for i in 0..n {
        let (fake, f, reply_failed) = exchange_with(config, stream, |h| h.fail_nth(i, status));
        let failed = fake.calls().get(i).copied();
        match f {
            Fate::Forwarded | Fate::Answered(400..) => {}
            other if reply_failed => assert_eq!(other, Fate::Lost),
            other => panic!("call {i} ({failed:?}) failing with {status:?}: {other:?}"),
        }
        if let Fate::Answered(code) = f {
            assert_eq!(code, 503, "call {i} ({failed:?}): a host error is the gateway's 503");
        }
    }
    for kind in clean.counts().into_iter().map(|(k, _)| k) {
        let (_, f, reply_failed) = exchange_with(config, stream, |h| h.fail_kind(kind, status));
        assert!(
            matches!(f, Fate::Forwarded | Fate::Answered(503)) || reply_failed,
            "every {kind:?} failing: {f:?}"
        );
    }
}

#[test]
fn a_host_error_at_any_call_neither_panics_nor_loses_the_request() {
    for stream in [false, true] {
        assert_survives(CONFIG, stream, HostStatus::InternalFailure);
        assert_survives(&bounded_config(), stream, HostStatus::Other(77));
    }
}

#[test]
fn the_status_label_is_the_response_headers_and_envoys_only_without_them() {
    let requests = |class: &str| {
        format!("llmroute_requests_total;alias=chat;backend=llama-a;api=chat;code_class={class};affinity_source=system_prompt")
    };
    // Response headers came: their :status is the label (response.code is not read; here it would disagree).
    let fake = FakeHost::new();
    let first = root(&fake, CONFIG);
    let mut x = Exchange::new(&fake, &first, 1);
    let body = chat(false);
    x.request_headers(&REQUEST_HEADERS, false);
    x.request_body(body.as_bytes(), true);
    x.response_headers(&[(":status", "200"), ("content-type", "application/json")], false);
    fake.set_property_bytes(&["response", "code"], &503u64.to_le_bytes());
    x.response_body(JSON_ANSWER.as_bytes(), true);
    x.log();
    assert_eq!(fake.metric(&requests("2xx")), Some(1));
    assert_eq!(fake.metric(&requests("5xx")), None);
    // None came (the upstream reset first): Envoy's response.code is the label.
    let fake = FakeHost::new();
    let second = root(&fake, CONFIG);
    let mut x = Exchange::new(&fake, &second, 2);
    x.request_headers(&REQUEST_HEADERS, false);
    x.request_body(body.as_bytes(), true);
    fake.set_property_bytes(&["response", "code"], &503u64.to_le_bytes());
    x.log();
    assert_eq!(fake.metric(&requests("5xx")), Some(1));
}
