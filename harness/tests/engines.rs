//! Proves `make engines` works: the built `llama-server` serves the tiny model written by `llmroute-gguf`.
//!
//! Each test starts a real `llama-server` with `llmroute_harness::llama` (a free loopback port in 20000..30000,
//! `--alias` set, `/health` polled until it answers 200, 503 while loading), and talks to it over HTTP:
//! - chat completions, plain and streamed, answer with `model` equal to the alias;
//! - the same ~1k-token prompt sent twice shows the engine's own `timings.cache_n` > 0 the second time;
//! - the prefill time of a ~1.5k-token prompt is measured and printed (never asserted: times depend on the machine).
//!
//! A missing binary or model fails the test with a hint to run `make engines`; it never skips. The server is killed
//! on drop, and its log (kept in a file) is printed when a test fails. Run with `make engines-check`.

use std::time::Duration;

use llmroute_harness::llama::workload::prompt_text;
use llmroute_harness::llama::{LlamaOptions, LlamaServer};
use serde_json::{json, Value};

/// Starts a server for the tiny model (`-c 8192 -np 2`, `threads` threads) and waits until it is ready.
async fn start(alias: &str, threads: u32) -> LlamaServer {
    let mut opts = LlamaOptions::new(alias);
    opts.threads = threads;
    opts.ready_limit = Duration::from_secs(60);
    LlamaServer::start(opts).await.unwrap_or_else(|e| panic!("{e}"))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .expect("http client")
}

/// A non-streamed chat completion; returns the response body.
async fn chat(server: &LlamaServer, text: &str, max_tokens: u32) -> Value {
    let body = json!({
        "model": "anything",
        "messages": [{ "role": "user", "content": text }],
        "max_tokens": max_tokens,
    });
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("POST");
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    resp.json().await.expect("JSON body")
}

fn timing(resp: &Value, field: &str) -> f64 {
    resp["timings"][field]
        .as_f64()
        .unwrap_or_else(|| panic!("no timings.{field} in {resp}"))
}

#[tokio::test]
async fn chat_answers_with_the_alias_plain_and_streamed() {
    let server = start("tiny-a", 1).await;
    let resp = chat(&server, "Say hello.", 8).await;
    assert_eq!(resp["model"], server.alias());
    assert_eq!(resp["object"], "chat.completion");
    assert!(resp["usage"]["completion_tokens"].as_u64().unwrap() >= 1, "{resp}");

    let body = json!({
        "model": "anything",
        "messages": [{ "role": "user", "content": "Say hello." }],
        "max_tokens": 8,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = resp.text().await.unwrap();
    let events: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks.len() >= 2, "{text}");
    assert!(chunks.iter().all(|c| c["model"] == server.alias()), "{text}");
    assert!(
        chunks.iter().any(|c| c["usage"]["prompt_tokens"].as_u64().is_some()),
        "{text}"
    );
    println!("streamed {} chunks from {}", chunks.len(), server.alias());
}

#[tokio::test]
async fn a_repeated_prompt_hits_the_engine_prompt_cache() {
    let server = start("tiny-cache", 1).await;
    let prompt = prompt_text(7, 1000);
    let first = chat(&server, &prompt, 4).await;
    let second = chat(&server, &prompt, 4).await;
    let (n1, c1, c2) = (
        timing(&first, "prompt_n"),
        timing(&first, "cache_n"),
        timing(&second, "cache_n"),
    );
    println!(
        "same ~1k-token prompt twice: first prompt_n={n1} cache_n={c1} prompt_ms={:.1}; \
         second prompt_n={} cache_n={c2} prompt_ms={:.1}",
        timing(&first, "prompt_ms"),
        timing(&second, "prompt_n"),
        timing(&second, "prompt_ms"),
    );
    assert!(n1 >= 800.0, "the prompt is about 1k tokens: {first}");
    assert_eq!(c1, 0.0, "a fresh server has nothing cached: {first}");
    assert!(c2 > 0.0, "the repeat reuses the cache: {second}");
    let cached = &second["usage"]["prompt_tokens_details"]["cached_tokens"];
    println!("second usage.prompt_tokens_details.cached_tokens = {cached}");

    let metrics = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("llamacpp:prompt_tokens_total"), "{metrics}");
}

#[tokio::test]
async fn prefill_of_a_1_5k_token_prompt_is_measured() {
    for threads in [1, 2] {
        let server = start("tiny-prefill", threads).await;
        chat(&server, &prompt_text(100, 1500), 1).await; // warms the server up
        let mut runs = Vec::new();
        for seed in 1..=5 {
            let resp = chat(&server, &prompt_text(100 + seed, 1500), 1).await;
            runs.push((timing(&resp, "prompt_n"), timing(&resp, "prompt_ms")));
        }
        runs.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (n, median) = runs[runs.len() / 2];
        println!(
            "prefill with -t {threads}: {n} tokens, median {median:.1} ms, min {:.1} ms over {} cold prompts \
             (load average {})",
            runs[0].1,
            runs.len(),
            load_average(),
        );
        assert!(
            runs.iter().all(|r| (1300.0..=1800.0).contains(&r.0)),
            "about 1.5k tokens: {runs:?}"
        );
    }
}

/// The 1-minute load average, to read timings against.
fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().next().unwrap_or("?").to_string()
}
