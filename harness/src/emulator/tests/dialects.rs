//! Socket-level tests of the non-chat dialects: each served over HTTP, streamed in its event order, with the
//! prefix cache, the faults, the self-checks and the request log applied the same way as for chat.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::emulator::{Dialect, Emulator};

fn url(emulator: &Emulator, path: &str) -> String {
    format!("http://{}{path}", emulator.addr())
}

pub(super) async fn post(
    emulator: &Emulator,
    dialect: Dialect,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(url(emulator, dialect.path()))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

async fn post_json(emulator: &Emulator, dialect: Dialect, body: &Value) -> Value {
    let response = post(emulator, dialect, body, &[]).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-emu-backend"], emulator.name());
    response.json().await.unwrap()
}

/// A small valid request of each dialect, streamed or not.
pub(super) fn request(dialect: Dialect, text: &str, stream: bool) -> Value {
    match dialect {
        Dialect::Chat => json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": text}]}),
        Dialect::Completions => json!({"model": "m", "stream": stream, "prompt": text}),
        Dialect::Responses => json!({"model": "m", "stream": stream, "instructions": "be brief", "input": text}),
        Dialect::Embeddings => json!({"model": "m", "input": text}),
        Dialect::Messages => json!({
            "model": "m", "stream": stream, "max_tokens": 16, "system": "be brief",
            "messages": [{"role": "user", "content": text}]
        }),
    }
}

/// `(event name, data)` of each SSE event in a body; `data: [DONE]` is `("", Null)`.
fn sse_events(text: &str) -> Vec<(String, Value)> {
    text.split_terminator("\n\n")
        .filter(|event| !event.starts_with(':'))
        .map(|event| {
            let name = event.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("");
            let data = event.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            (name.to_string(), serde_json::from_str(data).unwrap_or(Value::Null))
        })
        .collect()
}

async fn stream_text(emulator: &Emulator, dialect: Dialect, headers: &[(&str, &str)]) -> String {
    let response = post(emulator, dialect, &request(dialect, "stream me", true), headers).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    response.text().await.unwrap()
}

#[tokio::test]
async fn completions_answer_plain_and_streamed() {
    let emulator = Emulator::spawn("cmp").await.unwrap();
    let long = "p".repeat(300);
    let first = post_json(
        &emulator,
        Dialect::Completions,
        &request(Dialect::Completions, &long, false),
    )
    .await;
    assert_eq!(first["object"], "text_completion");
    assert_eq!(first["choices"][0]["text"], "Hello from cmp.");
    assert_eq!(first["usage"]["prompt_tokens"], 75);
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let again = post_json(
        &emulator,
        Dialect::Completions,
        &request(Dialect::Completions, &long, false),
    )
    .await;
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 64);
    assert_eq!(again["timings"]["cache_n"], 64);

    let text = stream_text(&emulator, Dialect::Completions, &[("x-emu-chunks", "2")]).await;
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let events = sse_events(&text);
    assert_eq!(events.len(), 4);
    assert_eq!(events[0].1["choices"][0]["text"], "tok0 ");
    assert_eq!(events[2].1["choices"][0]["finish_reason"], "stop");
    assert_eq!(events[2].1["timings"]["predicted_n"], 2);
}

#[tokio::test]
async fn responses_answer_plain_and_streamed() {
    let emulator = Emulator::spawn("rsp").await.unwrap();
    let body = post_json(&emulator, Dialect::Responses, &request(Dialect::Responses, "hi", false)).await;
    assert_eq!(body["object"], "response");
    assert!(body["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(body["output"][0]["content"][0]["text"], "Hello from rsp.");
    // "system:be brief\nuser:hi" is 23 bytes: 6 tokens.
    assert_eq!(body["usage"]["input_tokens"], 6);

    let text = stream_text(&emulator, Dialect::Responses, &[("x-emu-chunks", "3")]).await;
    let events = sse_events(&text);
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names.first(), Some(&"response.created"));
    assert_eq!(names.last(), Some(&"response.completed"));
    assert_eq!(names.iter().filter(|n| **n == "response.output_text.delta").count(), 3);
    for (sequence, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], sequence);
    }
    let completed = &events[events.len() - 1].1["response"];
    assert_eq!(completed["output"][0]["content"][0]["text"], "tok0 tok1 tok2 ");
}

#[tokio::test]
async fn embeddings_answer_floats_or_base64_and_refuse_empty_input() {
    let emulator = Emulator::spawn("emb").await.unwrap();
    let floats = post_json(
        &emulator,
        Dialect::Embeddings,
        &json!({"model": "e", "input": ["a", "b"]}),
    )
    .await;
    assert_eq!(floats["object"], "list");
    assert_eq!(floats["model"], "e");
    assert_eq!(floats["data"].as_array().unwrap().len(), 2);
    assert_eq!(floats["data"][1]["embedding"].as_array().unwrap().len(), 8);
    let base64 = json!({"model": "e", "input": "a", "encoding_format": "base64"});
    let encoded = post_json(&emulator, Dialect::Embeddings, &base64).await;
    assert_eq!(encoded["data"][0]["embedding"].as_str().unwrap().len(), 44);

    let empty = post(&emulator, Dialect::Embeddings, &json!({"model": "e", "input": []}), &[]).await;
    assert_eq!(empty.status(), 400);
    let error: Value = empty.json().await.unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
    // A stream flag does not apply to embeddings: the answer is plain JSON.
    let streamed = post(
        &emulator,
        Dialect::Embeddings,
        &json!({"input": "a", "stream": true}),
        &[],
    )
    .await;
    assert_eq!(streamed.headers()["content-type"], "application/json; charset=utf-8");
    assert_eq!(emulator.inference_requests().len(), 4);
}

#[tokio::test]
async fn messages_answer_plain_and_streamed() {
    let emulator = Emulator::spawn("msg").await.unwrap();
    let long = "m".repeat(300);
    let body = post_json(&emulator, Dialect::Messages, &request(Dialect::Messages, &long, false)).await;
    assert_eq!(body["type"], "message");
    assert!(body["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(body["content"][0]["text"], "Hello from msg.");
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(body["usage"]["cache_read_input_tokens"], 0);
    let again = post_json(&emulator, Dialect::Messages, &request(Dialect::Messages, &long, false)).await;
    // "system:be brief\nuser:" plus 300 bytes: 321 bytes, 81 tokens, 5 complete blocks.
    assert_eq!(again["usage"]["cache_read_input_tokens"], 80);
    assert_eq!(again["usage"]["input_tokens"], 1);

    let text = stream_text(&emulator, Dialect::Messages, &[]).await;
    let names: Vec<String> = sse_events(&text).into_iter().map(|(name, _)| name).collect();
    let expected = [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ];
    assert_eq!(names, expected);
}

#[tokio::test]
async fn messages_errors_use_the_anthropic_envelope() {
    let emulator = Emulator::spawn("ant").await.unwrap();
    let body = request(Dialect::Messages, "x", false);
    let failing = post(&emulator, Dialect::Messages, &body, &[("x-emu-status", "529")]).await;
    assert_eq!(failing.status(), 529);
    let error: Value = failing.json().await.unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "overloaded_error");

    let wrong = post(&emulator, Dialect::Messages, &body, &[("x-emu-expect-model", "other")]).await;
    assert_eq!(wrong.status(), 500);
    let error: Value = wrong.json().await.unwrap();
    assert_eq!(error["error"]["type"], "expectation_failed");
    assert_eq!(
        error["error"]["message"],
        "emulator expectation failed: model was m, expected other"
    );

    let not_json = reqwest::Client::new()
        .post(url(&emulator, "/v1/messages"))
        .body("{oops")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), 400);
    let error: Value = not_json.json().await.unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert_eq!(error["type"], "error");
}

#[tokio::test]
async fn faults_and_checks_apply_to_every_dialect() {
    let emulator = Emulator::spawn("all").await.unwrap();
    for dialect in Dialect::ALL {
        let body = request(dialect, "x", false);
        let failing = post(&emulator, dialect, &body, &[("x-emu-status", "429")]).await;
        assert_eq!(failing.status(), 429, "{dialect:?}");
        assert_eq!(failing.headers()["x-emu-backend"], "all");
        let error: Value = failing.json().await.unwrap();
        assert_eq!(error["error"]["type"], "rate_limit_error", "{dialect:?}");

        let here = post(&emulator, dialect, &body, &[("x-emu-expect-backend", "all")]).await;
        assert_eq!(here.status(), 200, "{dialect:?}");
        let elsewhere = post(&emulator, dialect, &body, &[("x-emu-expect-backend", "other")]).await;
        assert_eq!(elsewhere.status(), 500, "{dialect:?}");
        let bad = post(&emulator, dialect, &body, &[("x-emu-chunks", "many")]).await;
        assert_eq!(bad.status(), 400, "{dialect:?}");
    }
    assert_eq!(emulator.inference_requests().len(), 20);
    assert_eq!(emulator.chat_requests().len(), 4);
    let wrong_method = reqwest::get(url(&emulator, "/v1/messages")).await.unwrap();
    assert_eq!(wrong_method.status(), 404);
    let error: Value = wrong_method.json().await.unwrap();
    assert_eq!(error["error"]["type"], "not_found_error");
    assert_eq!(
        error["type"], "error",
        "a /v1/messages path answers in Anthropic's envelope"
    );
    assert_eq!(emulator.inference_requests().len(), 20);
}

#[tokio::test]
async fn every_stream_honours_chunks_cut_and_delay() {
    let emulator = Emulator::spawn("cut").await.unwrap();
    for dialect in Dialect::ALL.into_iter().filter(|d| d.events().is_some()) {
        let whole = stream_text(&emulator, dialect, &[("x-emu-chunks", "5")]).await;
        assert!(
            whole.contains("tok4 ") && !whole.contains("tok5 "),
            "{dialect:?}: {whole}"
        );

        let started = std::time::Instant::now();
        let response = post(
            &emulator,
            dialect,
            &request(dialect, "x", true),
            &[("x-emu-cut-after", "1"), ("x-emu-delay-ms", "50")],
        )
        .await;
        assert!(started.elapsed() >= std::time::Duration::from_millis(50));
        let mut body = response.bytes_stream();
        let mut received = Vec::new();
        let mut failed = false;
        while let Some(item) = body.next().await {
            match item {
                Ok(bytes) => received.extend_from_slice(&bytes),
                Err(_) => failed = true,
            }
        }
        let text = String::from_utf8(received).unwrap();
        assert!(failed, "{dialect:?}: the body should end with an error");
        assert!(text.contains("tok0 ") && !text.contains("tok1 "), "{dialect:?}: {text}");
        assert_eq!(emulator.inflight(), 0);
    }
}

#[tokio::test]
async fn the_same_conversation_shares_the_cache_across_dialects() {
    let emulator = Emulator::spawn("kv").await.unwrap();
    let system = "s".repeat(200);
    let user = "u".repeat(100);
    let chat = json!({"model": "m", "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user}
    ]});
    let first = post_json(&emulator, Dialect::Chat, &chat).await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let messages = json!({"model": "m", "max_tokens": 8, "system": system,
        "messages": [{"role": "user", "content": user}]});
    let reused = post_json(&emulator, Dialect::Messages, &messages).await;
    // The same template text: "system:" + 200 + "\nuser:" + 100 = 313 bytes, 4 complete blocks.
    assert_eq!(reused["usage"]["cache_read_input_tokens"], 64);
    let embedded = post_json(&emulator, Dialect::Embeddings, &json!({"input": "z".repeat(300)})).await;
    assert_eq!(embedded["usage"]["prompt_tokens"], 75);
    let completion = json!({"model": "m", "prompt": "z".repeat(300)});
    let after = post_json(&emulator, Dialect::Completions, &completion).await;
    assert_eq!(
        after["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "embeddings never fill the cache"
    );
}
