//! `stream_upstream: always`, host side (`response.rs`, `ResponseWatch::Assemble`): the request goes up as a
//! stream, the response headers wait, each chunk is read and dropped from Envoy's buffer, and the client gets one
//! rebuilt JSON answer with its length; a cut stream is a 502 in the OpenAI envelope, and an answer over the bound
//! a local 502 before the stream ends. A host error at any call of such an exchange never loses the request.

use proxy_wasm::types::{Action, BufferType};

use super::*;
use crate::host::fake::Kind;
use crate::host::HostStatus;

fn always_config(limits: &str) -> String {
    CONFIG
        .replace(
            r#""routes": [ { "backend": "llama-a", "upstream_model": "qwen3-0.6b" } ]"#,
            r#""routes": [ { "backend": "llama-a", "upstream_model": "qwen3-0.6b" } ], "stream_upstream": "always""#,
        )
        .replace(r#""version": 1,"#, &format!(r#""version": 1, {limits}"#))
}

const SSE_HEADERS: [(&str, &str); 3] = [
    (":status", "200"),
    ("content-type", "text/event-stream"),
    ("content-length", "999"),
];

/// The request, sent without `stream`, goes upstream streamed.
fn sent(fake: &Rc<FakeHost>, root: &Root) -> Exchange {
    let mut x = Exchange::new(fake, root, 1);
    x.request_headers(&REQUEST_HEADERS, false);
    assert_eq!(x.request_body(chat(false).as_bytes(), true), Action::Continue);
    let upstream = String::from_utf8(x.request_buffer()).unwrap();
    assert!(upstream.contains(r#""stream":true"#), "{upstream}");
    x
}

fn doc(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(bytes)))
}

#[test]
fn the_stream_is_held_chunk_by_chunk_and_the_client_gets_one_json_answer() {
    let fake = FakeHost::new();
    let root = root(&fake, &always_config(""));
    let mut x = sent(&fake, &root);
    assert_eq!(x.response_headers(&SSE_HEADERS, false), Action::Pause, "headers wait");
    assert_eq!(x.response_header("content-type").as_deref(), Some("application/json"));
    assert_eq!(x.response_header("content-length"), None);
    for chunk in &SSE[..2] {
        assert_eq!(x.response_body(chunk.as_bytes(), false), Action::Pause);
        assert!(
            fake.buffer(BufferType::HttpResponseBody).is_empty(),
            "Envoy holds nothing"
        );
    }
    assert_eq!(x.response_body(SSE[2].as_bytes(), true), Action::Continue);
    let answer = doc(&x.delivered);
    assert_eq!(answer["choices"][0]["message"]["content"], "hi", "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens"], 12, "{answer}");
    assert_eq!(x.response_header("content-length"), Some(x.delivered.len().to_string()));
    assert_eq!(x.response_header(":status").as_deref(), Some("200"));
    fake.set_property_bytes(&["response", "code"], &200u64.to_le_bytes());
    x.log();
    assert_eq!(fake.log_field("llmroute.output_tokens").as_deref(), Some("3"));
    assert_eq!(fake.log_field("llmroute.stream_outcome").as_deref(), Some("complete"));
    let tokens = "llmroute_tokens_total;alias=chat;backend=llama-a;kind=output";
    assert_eq!(fake.metric(tokens), Some(3));
}

#[test]
fn a_cut_stream_is_a_502_in_the_openai_envelope() {
    let fake = FakeHost::new();
    let root = root(&fake, &always_config(""));
    let mut x = sent(&fake, &root);
    x.response_headers(&SSE_HEADERS, false);
    assert_eq!(x.response_body(SSE[0].as_bytes(), false), Action::Pause);
    assert_eq!(x.response_body(b"", true), Action::Continue);
    assert_eq!(x.response_header(":status").as_deref(), Some("502"));
    assert_eq!(
        x.response_header("x-llmroute-error").as_deref(),
        Some("upstream_stream_cut")
    );
    let body = doc(&x.delivered);
    assert_eq!(body["error"]["code"], "upstream_stream_cut", "{body}");
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    assert_eq!(body["request_id"], "req-0001", "{body}");
    assert_eq!(x.response_header("content-length"), Some(x.delivered.len().to_string()));
    assert!(fake.replies().is_empty(), "the engine's response carries the 502");
    assert_eq!(
        fake.log_field("llmroute.stream_outcome").as_deref(),
        Some("missing_terminal")
    );
}

#[test]
fn an_answer_over_the_bound_is_a_local_502_before_the_stream_ends() {
    let fake = FakeHost::new();
    let root = root(&fake, &always_config(r#""limits": { "max_assembled_bytes": 4096 },"#));
    let mut x = sent(&fake, &root);
    x.response_headers(&SSE_HEADERS, false);
    let big = format!(
        "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "x".repeat(5000)
    );
    assert_eq!(x.response_body(big.as_bytes(), false), Action::Pause);
    let replies = fake.replies();
    assert_eq!(replies.len(), 1);
    let r = &replies[0];
    assert_eq!(r.status, 502);
    assert_eq!(r.header("x-llmroute-error"), Some("assembled_answer_too_large"));
    assert_eq!(r.header("x-request-id"), Some("req-0001"));
    assert_eq!(doc(&r.body)["error"]["code"], "assembled_answer_too_large");
    assert!(x.delivered.is_empty(), "nothing of the stream reached the client");
    // Whatever Envoy still delivers is passed on untouched (it goes nowhere after the local reply).
    assert_eq!(x.response_body(SSE[2].as_bytes(), true), Action::Continue);
}

/// One assembled exchange on a fresh host whose calls fail as `fail` says; true when the client got an answer
/// (the rebuilt one, a 502, or the gateway's 503 before the request went up).
fn answered_with(fail: impl Fn(&FakeHost)) -> (Rc<FakeHost>, bool) {
    let fake = FakeHost::new();
    let root = root(&fake, &always_config(""));
    fake.reset_calls();
    fail(&fake);
    let mut x = Exchange::new(&fake, &root, 1);
    x.request_headers(&REQUEST_HEADERS, false);
    let mut last = Action::Pause;
    if fake.replies().is_empty() {
        last = x.request_body(chat(false).as_bytes(), true);
    }
    if fake.replies().is_empty() && last == Action::Continue {
        x.response_headers(&SSE_HEADERS, false);
        for (i, chunk) in SSE.iter().enumerate() {
            last = x.response_body(chunk.as_bytes(), i == SSE.len() - 1);
            if !fake.replies().is_empty() {
                break;
            }
        }
    }
    x.log();
    let reply_failed = fake.calls().contains(&Kind::LocalResponse) && fake.replies().is_empty();
    let answered = !fake.replies().is_empty() || (last == Action::Continue && !x.delivered.is_empty());
    (fake, answered || reply_failed)
}

#[test]
fn a_host_error_at_any_call_of_an_assembled_exchange_neither_panics_nor_loses_it() {
    let (clean, answered) = answered_with(|_| {});
    assert!(answered);
    let n = clean.calls().len();
    assert!(n > 10, "{n}");
    for status in [HostStatus::InternalFailure, HostStatus::Other(77)] {
        for i in 0..n {
            let (fake, answered) = answered_with(|h| h.fail_nth(i, status));
            let failed = fake.calls().get(i).copied();
            assert!(answered, "call {i} ({failed:?}) failing with {status:?}");
        }
        for (kind, _) in clean.counts() {
            let (_, answered) = answered_with(|h| h.fail_kind(kind, status));
            assert!(answered, "every {kind:?} failing with {status:?}");
        }
    }
}

#[test]
fn a_chunk_the_host_would_not_drop_is_not_fed_twice() {
    let fake = FakeHost::new();
    let root = root(&fake, &always_config(""));
    let mut x = sent(&fake, &root);
    x.response_headers(&SSE_HEADERS, false);
    fake.fail_kind(Kind::SetBuffer, HostStatus::InternalFailure);
    assert_eq!(x.response_body(SSE[0].as_bytes(), false), Action::Pause);
    fake.heal();
    // Envoy's buffer now holds the first chunk and the second: only the second is new.
    assert_eq!(x.response_body(SSE[1].as_bytes(), false), Action::Pause);
    assert_eq!(x.response_body(SSE[2].as_bytes(), true), Action::Continue);
    let answer = doc(&x.delivered);
    assert_eq!(answer["choices"][0]["message"]["content"], "hi", "{answer}");
}
