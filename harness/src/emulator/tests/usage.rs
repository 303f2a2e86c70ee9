//! The usage chunk of the OpenAI-style streams: sent only when the request sets
//! `stream_options.include_usage`, with the prefix cache's `cached_tokens`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};

use super::dialects::{post, request};
use crate::emulator::{Dialect, Emulator};

/// The `data:` payloads of a stream, `[DONE]` as a string.
async fn stream_data(emulator: &Emulator, dialect: Dialect, body: &Value) -> Vec<Value> {
    let text = post(emulator, dialect, body, &[]).await.text().await.unwrap();
    text.split_terminator("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap_or_else(|_| Value::String(data.to_string())))
        .collect()
}

#[tokio::test]
async fn include_usage_adds_one_usage_chunk_before_done() {
    let emulator = Emulator::spawn("use").await.unwrap();
    for (dialect, object) in [
        (Dialect::Chat, "chat.completion.chunk"),
        (Dialect::Completions, "text_completion"),
    ] {
        emulator.reset();
        let mut body = request(dialect, &"p".repeat(300), true);
        let plain = stream_data(&emulator, dialect, &body).await;
        assert!(
            plain.iter().all(|data| data.get("usage").is_none()),
            "{dialect:?}: {plain:?}"
        );
        assert_eq!(plain.last().unwrap(), "[DONE]");

        body["stream_options"] = json!({"include_usage": true});
        let asked = stream_data(&emulator, dialect, &body).await;
        assert_eq!(asked.len(), plain.len() + 1, "{dialect:?}");
        assert_eq!(asked.last().unwrap(), "[DONE]");
        let finish = &asked[asked.len() - 3];
        assert_eq!(finish["choices"][0]["finish_reason"], "stop");
        assert_eq!(finish.get("usage"), None, "{dialect:?}: usage only in its own chunk");
        assert_eq!(
            finish["timings"]["cache_n"], 64,
            "{dialect:?}: llama.cpp's timings stay"
        );
        let usage = &asked[asked.len() - 2];
        assert_eq!(usage["object"], object);
        assert_eq!(usage["id"], finish["id"]);
        assert_eq!(usage["choices"], json!([]));
        let prompt = usage["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(
            usage["usage"],
            json!({"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3,
                "prompt_tokens_details": {"cached_tokens": 64}}),
            "{dialect:?}: the second request of the prompt reads its blocks from the cache"
        );
    }
}

#[tokio::test]
async fn include_usage_false_or_elsewhere_adds_nothing() {
    let emulator = Emulator::spawn("nouse").await.unwrap();
    let mut body = request(Dialect::Chat, "x", true);
    body["stream_options"] = json!({"include_usage": false});
    let data = stream_data(&emulator, Dialect::Chat, &body).await;
    assert!(data.iter().all(|data| data.get("usage").is_none()));
    let mut messages = request(Dialect::Messages, "x", true);
    messages["stream_options"] = json!({"include_usage": true});
    let text = post(&emulator, Dialect::Messages, &messages, &[])
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(
        text.matches("\n\n").count(),
        9,
        "the Messages stream is unchanged: {text}"
    );
}
