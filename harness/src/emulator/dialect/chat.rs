//! `POST /v1/chat/completions` in llama.cpp's dialect.
//!
//! The prompt is one `role:content` line per message. A stream is a role chunk, a `: keepalive` comment, the
//! content chunks, a final chunk with `finish_reason` and `timings`, the usage chunk (no choices, `usage`) if
//! the request set `stream_options.include_usage`, then `data: [DONE]`.

use bytes::Bytes;
use serde_json::{json, Value};

use super::{conversation_text, data_event, delta_text, openai_usage, timings, usage_chunk, Answer, EventStream};
use super::{DONE, OPENAI_ERROR_EVENT};

/// SSE comment that llama.cpp-style servers send to keep a stream alive.
pub const KEEPALIVE: &[u8] = b": keepalive\n\n";

/// The prompt: one `role:content` line per message, joined by `\n`.
pub fn prompt_text(request: &Value) -> String {
    conversation_text(None, request.get("messages"))
}

/// Non-streamed `chat.completion` body.
pub fn body(answer: &Answer) -> Value {
    json!({
        "id": answer.id,
        "object": "chat.completion",
        "created": 0,
        "model": answer.model,
        "system_fingerprint": answer.backend,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": answer.text()},
            "finish_reason": "stop"
        }],
        "usage": openai_usage(answer, answer.plain_tokens()),
        "timings": timings(answer, answer.plain_tokens())
    })
}

/// One `chat.completion.chunk` object with one choice.
fn chunk(answer: &Answer, delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": answer.id,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": answer.model,
        "system_fingerprint": answer.backend,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
    })
}

/// The chat stream.
pub struct Events;

impl EventStream for Events {
    fn head(&self, answer: &Answer) -> Vec<Bytes> {
        let role = json!({"role": "assistant", "content": ""});
        vec![data_event(&chunk(answer, role, None)), Bytes::from_static(KEEPALIVE)]
    }

    fn delta(&self, answer: &Answer, index: u32) -> Bytes {
        data_event(&chunk(answer, json!({"content": delta_text(index)}), None))
    }

    /// The last chunk (empty delta, `stop`, the timings), then the usage chunk if asked for.
    fn tail(&self, answer: &Answer, chunks: u32) -> Vec<Bytes> {
        let completion = u64::from(chunks);
        let mut last = chunk(answer, json!({}), Some("stop"));
        last["timings"] = timings(answer, completion);
        let usage = usage_chunk(answer, chunk(answer, json!({}), None), completion);
        [data_event(&last)].into_iter().chain(usage).collect()
    }

    fn terminal(&self, _answer: &Answer, _chunks: u32) -> Bytes {
        Bytes::from_static(DONE)
    }

    fn error(&self, _answer: &Answer, _deltas: u32) -> Bytes {
        Bytes::from_static(OPENAI_ERROR_EVENT)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::testing::{answer, frame_json};
    use super::super::{stream_plan, StreamFaults};
    use super::*;

    #[test]
    fn body_reports_usage_and_timings() {
        let body = body(&answer());
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["system_fingerprint"], "a");
        assert_eq!(body["choices"][0]["message"]["content"], "Hello from a.");
        assert_eq!(body["usage"]["total_tokens"], 43);
        assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
        assert_eq!(body["timings"]["prompt_n"], 8);
        assert_eq!(body["timings"]["cache_n"], 32);
        assert_eq!(body["timings"]["predicted_n"], 3);
    }

    #[test]
    fn stream_has_the_llama_order() {
        let plan = stream_plan(&Events, &answer(), &StreamFaults::new(2));
        assert_eq!(plan.frames.len(), 6);
        assert_eq!(
            frame_json(&plan.frames[0].bytes)["choices"][0]["delta"]["role"],
            "assistant"
        );
        assert_eq!(plan.frames[1].bytes.as_ref(), KEEPALIVE);
        assert_eq!(
            frame_json(&plan.frames[3].bytes)["choices"][0]["delta"]["content"],
            "tok1 "
        );
        let last = frame_json(&plan.frames[4].bytes);
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        assert_eq!(last["timings"]["predicted_n"], 2);
        assert_eq!(last.get("usage"), None, "usage only when the request asks for it");
        assert_eq!(plan.frames[5].bytes.as_ref(), DONE);
    }

    #[test]
    fn include_usage_adds_a_usage_chunk_before_done() {
        let answer = Answer {
            include_usage: true,
            ..answer()
        };
        let plan = stream_plan(&Events, &answer, &StreamFaults::new(2));
        assert_eq!(plan.frames.len(), 7);
        assert_eq!(frame_json(&plan.frames[4].bytes).get("usage"), None);
        let usage = frame_json(&plan.frames[5].bytes);
        assert_eq!(usage["object"], "chat.completion.chunk");
        assert_eq!(usage["id"], "id-1");
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(
            usage["usage"],
            json!({"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42,
                "prompt_tokens_details": {"cached_tokens": 32}})
        );
        assert_eq!(plan.frames[6].bytes.as_ref(), DONE);
    }

    #[test]
    fn prompt_is_role_lines() {
        let request = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]}
        ]});
        assert_eq!(prompt_text(&request), "system:be brief\nuser:hi");
        assert_eq!(prompt_text(&json!({"model": "m"})), "");
    }
}
