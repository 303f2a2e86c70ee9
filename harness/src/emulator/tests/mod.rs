//! Socket-level tests of the emulator: chat answers, streams, faults, the request log, the prefix cache, and
//! how the server stops. The other dialects are tested in `dialects`; the stream faults in `plan` (no socket)
//! and `faults`, close-delimited framing in `close_delimited`, the usage chunk in `usage`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod chaos;
mod close_delimited;
mod dialects;
mod faults;
mod plan;
mod usage;

use super::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

const CHAT_PATH: &str = "/v1/chat/completions";

fn url(emulator: &Emulator, path: &str) -> String {
    format!("http://{}{path}", emulator.addr())
}

fn chat_body(model: &str, content: &str, stream: bool) -> String {
    json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": content}]
    })
    .to_string()
}

async fn post_chat(emulator: &Emulator, body: String, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(url(emulator, CHAT_PATH))
        .header("content-type", "application/json")
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

async fn chat_json(emulator: &Emulator, content: &str) -> Value {
    let response = post_chat(emulator, chat_body("m", content, false), &[]).await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

fn backend_of(response: &reqwest::Response) -> &str {
    response.headers()["x-emu-backend"].to_str().unwrap()
}

#[tokio::test]
async fn non_stream_answer_is_recorded_exactly() {
    let emulator = Emulator::spawn("alpha").await.unwrap();
    let body = chat_body("tiny", "hi there", false);
    let response = reqwest::Client::new()
        .post(url(&emulator, "/v1/chat/completions?trace=1"))
        .header("content-type", "application/json")
        .header("X-Custom", "Yes")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(backend_of(&response), "alpha");
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["model"], "tiny");
    assert_eq!(answer["system_fingerprint"], "alpha");
    assert_eq!(answer["choices"][0]["message"]["content"], "Hello from alpha.");
    // "user:hi there" is 13 bytes: 4 tokens.
    assert_eq!(answer["usage"]["prompt_tokens"], 4);
    assert_eq!(answer["usage"]["completion_tokens"], 3);
    assert_eq!(answer["usage"]["total_tokens"], 7);

    let recorded = emulator.chat_requests();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].method, "POST");
    assert_eq!(recorded[0].path, "/v1/chat/completions?trace=1");
    assert_eq!(recorded[0].body, Bytes::from(body));
    assert_eq!(recorded[0].header("x-custom"), Some("Yes"));
    assert_eq!(recorded[0].header("X-CUSTOM"), Some("Yes"));
    assert_eq!(recorded[0].backend, "alpha");
    assert!(recorded[0].headers.iter().any(|(name, _)| name == "x-custom"));
}

#[tokio::test]
async fn stream_follows_llama_order() {
    let emulator = Emulator::spawn("beta").await.unwrap();
    let response = post_chat(
        &emulator,
        chat_body("m", "stream me", true),
        &[("x-emu-chunks", "4"), ("x-emu-chunk-delay-ms", "5")],
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(backend_of(&response), "beta");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["cache-control"], "no-cache");
    let text = response.text().await.unwrap();

    assert!(text.ends_with("\n\ndata: [DONE]\n\n"));
    let events: Vec<&str> = text.split_terminator("\n\n").collect();
    assert_eq!(events.len(), 8, "{text}");
    assert_eq!(events[1], ": keepalive");
    assert!(text.contains("\n\n: keepalive\n\ndata: "));
    let chunk = |event: &str| -> Value { serde_json::from_str(event.strip_prefix("data: ").unwrap()).unwrap() };
    let first = chunk(events[0]);
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(
        first["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(first["choices"][0]["finish_reason"], Value::Null);
    for (index, event) in events[2..6].iter().enumerate() {
        let content = chunk(event)["choices"][0]["delta"]["content"].clone();
        assert_eq!(content, format!("tok{index} "));
    }
    let last = chunk(events[6]);
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert_eq!(last["choices"][0]["delta"], json!({}));
    assert_eq!(last.get("usage"), None, "no usage chunk unless the request asks");
    assert_eq!(last["timings"]["predicted_n"], 4);
    assert_eq!(events[7], "data: [DONE]");
    assert_eq!(emulator.inflight(), 0);
}

#[tokio::test]
async fn cut_after_aborts_the_body() {
    let emulator = Emulator::spawn("gamma").await.unwrap();
    let response = post_chat(&emulator, chat_body("m", "cut me", true), &[("x-emu-cut-after", "1")]).await;
    assert_eq!(response.status(), 200);
    let mut received = Vec::new();
    let mut failed = false;
    let mut body = response.bytes_stream();
    while let Some(item) = body.next().await {
        match item {
            Ok(bytes) => received.extend_from_slice(&bytes),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the body should end with an error");
    let text = String::from_utf8(received).unwrap();
    assert!(text.contains("tok0 "));
    assert!(!text.contains("tok1 "));
    assert!(!text.contains("[DONE]"));
    // The same request without the cut finishes cleanly.
    let whole = post_chat(&emulator, chat_body("m", "cut me", true), &[]).await;
    assert!(whole.text().await.unwrap().ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn health_follows_the_set_status() {
    let emulator = Emulator::spawn("delta").await.unwrap();
    let client = reqwest::Client::new();
    let response = client.get(url(&emulator, "/health")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(backend_of(&response), "delta");
    assert_eq!(response.text().await.unwrap(), r#"{"status":"ok"}"#);

    emulator.set_health_status(503);
    let response = client.get(url(&emulator, "/health")).send().await.unwrap();
    assert_eq!(response.status(), 503);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["message"], "Loading model");
    assert_eq!(body["error"]["type"], "unavailable_error");

    emulator.set_health_status(200);
    let response = client.get(url(&emulator, "/health")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let recorded = emulator.requests();
    assert_eq!(recorded.len(), 3);
    assert!(recorded.iter().all(|r| r.path == "/health" && r.method == "GET"));
    assert!(emulator.chat_requests().is_empty());
}

#[tokio::test]
async fn props_models_and_unknown_paths() {
    let mut opts = EmulatorOptions::new("eps");
    opts.model = "qwen-tiny".into();
    opts.n_ctx = 8192;
    opts.total_slots = 2;
    let emulator = Emulator::spawn_with(opts).await.unwrap();
    let client = reqwest::Client::new();
    let props: Value = client
        .get(url(&emulator, "/props"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(props["default_generation_settings"]["n_ctx"], 8192);
    assert_eq!(props["total_slots"], 2);
    assert_eq!(props["model_path"], "qwen-tiny.gguf");
    assert_eq!(props["build_info"], "emulator");
    let models: Value = client
        .get(url(&emulator, "/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "qwen-tiny");

    let missing = client.get(url(&emulator, "/nope")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(backend_of(&missing), "eps");
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], 404);
    let wrong_method = client.get(url(&emulator, CHAT_PATH)).send().await.unwrap();
    assert_eq!(wrong_method.status(), 404);
}

#[tokio::test]
async fn cache_n_grows_for_a_repeated_prefix() {
    let emulator = Emulator::spawn("zeta").await.unwrap();
    // "user:" plus 300 bytes: 305 bytes, 77 tokens, 4 complete blocks.
    let long = "a".repeat(300);
    let first = chat_json(&emulator, &long).await;
    assert_eq!(first["usage"]["prompt_tokens"], 77);
    assert_eq!(first["timings"]["cache_n"], 0);
    assert_eq!(first["timings"]["prompt_n"], 77);

    let second = chat_json(&emulator, &long).await;
    assert_eq!(second["timings"]["cache_n"], 64);
    assert_eq!(second["timings"]["prompt_n"], 13);
    assert_eq!(second["usage"]["prompt_tokens_details"]["cached_tokens"], 64);

    let other = chat_json(&emulator, &"b".repeat(300)).await;
    assert_eq!(other["timings"]["cache_n"], 0);

    // A longer prompt sharing the prefix reuses its blocks.
    let extended = chat_json(&emulator, &format!("{long}{}", "c".repeat(100))).await;
    assert_eq!(extended["timings"]["cache_n"], 64);

    emulator.reset();
    let after_reset = chat_json(&emulator, &long).await;
    assert_eq!(after_reset["timings"]["cache_n"], 0);
    assert_eq!(emulator.requests().len(), 1);
}

#[tokio::test]
async fn expectations_and_faults() {
    let emulator = Emulator::spawn("eta").await.unwrap();
    let body = || chat_body("small", "x", false);

    let ok = post_chat(&emulator, body(), &[("x-emu-expect-model", "small")]).await;
    assert_eq!(ok.status(), 200);

    let wrong = post_chat(&emulator, body(), &[("x-emu-expect-model", "big")]).await;
    assert_eq!(wrong.status(), 500);
    assert_eq!(backend_of(&wrong), "eta");
    let error: Value = wrong.json().await.unwrap();
    assert_eq!(error["error"]["type"], "expectation_failed");
    assert_eq!(
        error["error"]["message"],
        "emulator expectation failed: model was small, expected big"
    );

    let elsewhere = post_chat(&emulator, body(), &[("x-emu-expect-backend", "theta")]).await;
    assert_eq!(elsewhere.status(), 500);
    let here = post_chat(&emulator, body(), &[("x-emu-expect-backend", "eta")]).await;
    assert_eq!(here.status(), 200);

    let failing = post_chat(&emulator, body(), &[("x-emu-status", "503")]).await;
    assert_eq!(failing.status(), 503);
    let error: Value = failing.json().await.unwrap();
    assert_eq!(error["error"]["code"], 503);

    let not_json = post_chat(&emulator, "{oops".to_string(), &[]).await;
    assert_eq!(not_json.status(), 400);
    let error: Value = not_json.json().await.unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");

    let bad_header = post_chat(&emulator, body(), &[("x-emu-delay-ms", "soon")]).await;
    assert_eq!(bad_header.status(), 400);
    assert_eq!(emulator.chat_requests().len(), 7);
}

#[tokio::test]
async fn max_inflight_counts_concurrent_requests() {
    let emulator = Emulator::spawn("iota").await.unwrap();
    let started = std::time::Instant::now();
    let requests = (0..3).map(|_| post_chat(&emulator, chat_body("m", "wait", false), &[("x-emu-delay-ms", "300")]));
    let responses = futures_util::future::join_all(requests).await;
    assert!(responses.iter().all(|r| r.status() == 200));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(emulator.max_inflight(), 3);
    assert_eq!(emulator.inflight(), 0);
    emulator.reset();
    assert_eq!(emulator.max_inflight(), 0);
}

#[tokio::test]
async fn a_slow_stream_counts_as_inflight_until_done() {
    let mut opts = EmulatorOptions::new("kappa");
    opts.chunk_delay_ms = 100;
    let emulator = Emulator::spawn_with(opts).await.unwrap();
    let response = post_chat(&emulator, chat_body("m", "slow", true), &[]).await;
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    assert_eq!(emulator.inflight(), 1);
    while let Some(item) = body.next().await {
        item.unwrap();
    }
    assert_eq!(emulator.inflight(), 0);
    assert_eq!(emulator.max_inflight(), 1);
}

#[tokio::test]
async fn dropping_stops_the_server_and_open_streams() {
    let mut opts = EmulatorOptions::new("lambda");
    opts.chunk_delay_ms = 200;
    let emulator = Emulator::spawn_with(opts).await.unwrap();
    let addr = emulator.addr();
    let response = post_chat(&emulator, chat_body("m", "x", true), &[]).await;
    let mut body = response.bytes_stream();
    body.next().await.unwrap().unwrap();
    drop(emulator);

    let mut ended_with_error = false;
    while let Some(item) = body.next().await {
        if item.is_err() {
            ended_with_error = true;
            break;
        }
    }
    assert!(ended_with_error);
    let mut refused = false;
    for _ in 0..50 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the port should close after drop");
}

#[tokio::test]
async fn dropping_fails_a_request_still_waiting() {
    let emulator = Emulator::spawn("mu").await.unwrap();
    let pending = post_chat_result(url(&emulator, CHAT_PATH), &[("x-emu-delay-ms", "5000")]);
    let stop = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(emulator.inflight(), 1);
        drop(emulator);
    };
    let (outcome, ()) = tokio::join!(pending, stop);
    assert!(outcome.is_err(), "{outcome:?}");
}

async fn post_chat_result(target: String, headers: &[(&str, &str)]) -> reqwest::Result<bytes::Bytes> {
    let mut request = reqwest::Client::new().post(target).body(chat_body("m", "x", false));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await?.bytes().await
}
