//! `models[].stream_upstream: always` (issue 20 item 6), through the real filter in a real Envoy:
//! - a non-streamed chat or responses request reaches the engine with `stream: true` (chat also with
//!   `stream_options.include_usage`), and the client gets one JSON answer that is byte for byte what the same
//!   engine answers the same request unstreamed;
//! - a stream that ends before its terminal event, carries an error event, or grows past
//!   `limits.max_assembled_bytes` becomes a 502 in the OpenAI envelope with the request id, never a truncated
//!   body;
//! - Envoy holds none of the stream: the filter empties its buffer after every chunk;
//! - a request the client streams itself, and every request to an `as_sent` alias, go through as before.

use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::{client, h2_client, post_json, Reply, UPSTREAM};

const ALWAYS: &str = "always-chat";
const AS_SENT: &str = "plain-chat";

/// One engine behind two aliases of the same upstream model: one streams upstream always, one as sent.
async fn setup(limits: Option<Value>) -> (Fleet, Envoy) {
    let fleet = Fleet::start("stream-up", 1).await.unwrap();
    let route = json!([{ "backend": fleet.backend, "upstream_model": UPSTREAM }]);
    let mut cfg = json!({
        "version": 1,
        "backends": [fleet.backend_entry(150)],
        "models": [
            { "name": ALWAYS, "routes": route, "stream_upstream": "always" },
            { "name": AS_SENT, "routes": route },
        ],
    });
    if let Some(limits) = limits {
        cfg["limits"] = limits;
    }
    let envoy = Envoy::start(cfg).await.unwrap();
    (fleet, envoy)
}

/// Fails with Envoy's log when `cond` does not hold.
fn check(envoy: &Envoy, cond: bool, what: &str) {
    if !cond {
        eprintln!("{}", envoy.log());
        panic!("{what}");
    }
}

fn chat_body(alias: &str) -> Value {
    json!({"model": alias, "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
}

fn responses_body(alias: &str) -> Value {
    json!({"model": alias, "instructions": "be brief", "input": "hi"})
}

async fn send(c: &reqwest::Client, envoy: &Envoy, path: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
    post_json(c, envoy.url(path), body.to_string(), headers).await
}

/// The body the engine received last.
fn last_upstream_body(fleet: &Fleet) -> Value {
    let got = fleet.engines[0].inference_requests();
    serde_json::from_slice(&got.last().unwrap().body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rebuilt_answer_is_byte_for_byte_the_engines_unstreamed_answer() {
    let (fleet, envoy) = setup(None).await;
    let cases = [
        ("/v1/chat/completions", chat_body as fn(&str) -> Value),
        ("/v1/responses", responses_body),
    ];
    // Five deltas in one chunk each; then the same stream one byte per body chunk, which Envoy hands the filter
    // in many pieces.
    let shapes: [&[(&str, &str)]; 2] = [
        &[("x-emu-chunks", "5")],
        &[("x-emu-chunks", "5"), ("x-emu-trickle-ms", "1")],
    ];
    for c in [client(), h2_client()] {
        for (path, body) in cases {
            for headers in shapes {
                // The engine's prefix cache and answer counter restart before each request, so both answers
                // have the same id and cached-token count: every byte must match.
                fleet.reset();
                let plain = send(&c, &envoy, path, &body(AS_SENT), headers).await;
                check(
                    &envoy,
                    plain.status == 200,
                    &format!("{path}: as_sent failed: {}", plain.text),
                );
                let sent = last_upstream_body(&fleet);
                assert_eq!(sent.get("stream"), None, "{path}: as_sent must not touch stream");
                fleet.reset();
                let rebuilt = send(&c, &envoy, path, &body(ALWAYS), headers).await;
                check(
                    &envoy,
                    rebuilt.status == 200,
                    &format!("{path}: always failed: {}", rebuilt.text),
                );
                let sent = last_upstream_body(&fleet);
                assert_eq!(sent["stream"], true, "{path}: {sent}");
                let usage_asked = sent.pointer("/stream_options/include_usage").cloned();
                let want_usage = (path == "/v1/chat/completions").then_some(json!(true));
                assert_eq!(usage_asked, want_usage, "{path}: {sent}");
                assert_eq!(rebuilt.header("content-type"), Some("application/json"), "{path}");
                assert_eq!(
                    rebuilt.text, plain.text,
                    "{path} {headers:?}: the rebuilt answer differs from the engine's own"
                );
                if let Some(len) = rebuilt.header("content-length") {
                    assert_eq!(len, rebuilt.text.len().to_string(), "{path}");
                }
                assert!(rebuilt.text.contains("tok0 tok1 tok2 tok3 tok4 "), "{}", rebuilt.text);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_the_client_asked_for_pass_through_unchanged() {
    let (fleet, envoy) = setup(None).await;
    let mut body = chat_body(ALWAYS);
    body["stream"] = json!(true);
    let r = send(&client(), &envoy, "/v1/chat/completions", &body, &[]).await;
    check(&envoy, r.status == 200, "streamed request failed");
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert!(r.text.ends_with("data: [DONE]\n\n"), "{}", r.text);
    let sent = last_upstream_body(&fleet);
    assert_eq!(sent.get("stream_options"), None, "{sent}");
    // Embeddings are not converted either.
    let emb = json!({"model": ALWAYS, "input": "hi"});
    let r = send(&client(), &envoy, "/v1/embeddings", &emb, &[]).await;
    check(&envoy, r.status == 200, "embeddings failed");
    assert_eq!(last_upstream_body(&fleet).get("stream"), None);
}

/// What a broken stream gives the client: the status, the error code, and the request id the body carries.
async fn broken(envoy: &Envoy, path: &str, body: &Value, fault: (&str, &str), rid: &str) -> Reply {
    let headers = [fault, ("x-request-id", rid), ("x-emu-chunks", "4")];
    send(&client(), envoy, path, body, &headers).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_its_terminal_event_is_a_502_never_a_truncated_body() {
    let (_fleet, envoy) = setup(None).await;
    let cases = [
        (
            "/v1/chat/completions",
            ("x-emu-no-terminal", "1"),
            "upstream_stream_cut",
        ),
        ("/v1/chat/completions", ("x-emu-end-mid", "2"), "upstream_stream_cut"),
        (
            "/v1/chat/completions",
            ("x-emu-garbage-after", "2"),
            "upstream_stream_cut",
        ),
        (
            "/v1/chat/completions",
            ("x-emu-error-after", "2"),
            "upstream_stream_error",
        ),
        ("/v1/responses", ("x-emu-no-terminal", "1"), "upstream_stream_cut"),
        ("/v1/responses", ("x-emu-error-after", "1"), "upstream_stream_error"),
    ];
    for (i, (path, fault, code)) in cases.into_iter().enumerate() {
        let body = match path {
            "/v1/responses" => responses_body(ALWAYS),
            _ => chat_body(ALWAYS),
        };
        let rid = format!("rid-cut-{i}");
        let r = broken(&envoy, path, &body, fault, &rid).await;
        check(
            &envoy,
            r.status == 502,
            &format!("{path} {fault:?}: {} {}", r.status, r.text),
        );
        assert_eq!(r.header("content-type"), Some("application/json"), "{fault:?}");
        assert_eq!(r.header("x-llmroute-error"), Some(code), "{fault:?}");
        assert_eq!(r.body["error"]["code"], code, "{fault:?}: {}", r.text);
        assert_eq!(r.body["error"]["type"], "server_error", "{fault:?}");
        assert_eq!(r.body["request_id"], rid.as_str(), "{fault:?}");
        assert!(
            !r.text.contains("tok0"),
            "{fault:?}: no part of the answer may leak: {}",
            r.text
        );
    }
}

/// A reset upstream connection gives the filter no end of stream; since the filter still holds the response
/// headers, Envoy answers itself, and its local reply config puts that in the API's envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_stream_is_a_json_502_never_a_truncated_body() {
    let (_fleet, envoy) = setup(None).await;
    for (i, fault) in [("x-emu-cut-after", "2"), ("x-emu-cut-mid", "2")]
        .into_iter()
        .enumerate()
    {
        let rid = format!("rid-reset-{i}");
        let r = broken(&envoy, "/v1/chat/completions", &chat_body(ALWAYS), fault, &rid).await;
        check(&envoy, r.status == 502, &format!("{fault:?}: {} {}", r.status, r.text));
        assert_eq!(r.header("content-type"), Some("application/json"), "{fault:?}");
        // Envoy answers for the filter here (the filter gets no end of stream): the renderer's local reply for
        // an upstream reset, in the OpenAI envelope.
        assert_eq!(r.body["error"]["code"], "upstream_error", "{fault:?}: {}", r.text);
        assert_eq!(r.body["request_id"], rid.as_str(), "{fault:?}: {}", r.text);
        assert!(!r.text.contains("tok0"), "{fault:?}: {}", r.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_bound_is_a_502() {
    let (_fleet, envoy) = setup(Some(json!({ "max_assembled_bytes": 4096 }))).await;
    let headers = [("x-emu-chunks", "2000"), ("x-request-id", "rid-big")];
    let r = send(&client(), &envoy, "/v1/chat/completions", &chat_body(ALWAYS), &headers).await;
    check(&envoy, r.status == 502, &format!("{} {}", r.status, r.text));
    assert_eq!(r.header("x-llmroute-error"), Some("assembled_answer_too_large"));
    assert_eq!(r.body["error"]["code"], "assembled_answer_too_large", "{}", r.text);
    assert_eq!(r.body["request_id"], "rid-big");
    // The same answer within the bound is whole.
    let r = send(
        &client(),
        &envoy,
        "/v1/chat/completions",
        &chat_body(ALWAYS),
        &[("x-emu-chunks", "20")],
    )
    .await;
    check(&envoy, r.status == 200, &r.text);
}

/// Envoy's own buffer is emptied after every chunk: a stream several times the listener's buffer limit
/// (`max_body_bytes` + 1 MiB) is rebuilt whole, which Envoy would refuse if it held the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_holds_none_of_the_stream() {
    let (_fleet, envoy) = setup(Some(json!({ "max_body_bytes": 1024 }))).await;
    let headers = [("x-emu-chunks", "20000")];
    let r = send(&client(), &envoy, "/v1/chat/completions", &chat_body(ALWAYS), &headers).await;
    check(
        &envoy,
        r.status == 200,
        &format!("{} {}", r.status, r.text.get(..300).unwrap_or(&r.text)),
    );
    let content = r.body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.starts_with("tok0 tok1 ") && content.ends_with("tok19999 "));
    assert_eq!(r.body["usage"]["completion_tokens"], 20000);
}
