//! `POST /v1/messages` (Anthropic Messages API).
//!
//! The prompt is the top-level `system` (a string or text blocks) as a system line, then one `role:text` line
//! per message. Usage follows Anthropic's split: `input_tokens` counts only the prompt tokens that were not
//! read from the cache, `cache_read_input_tokens` the ones that were.
//!
//! A stream is named events, each `event: <type>` with a JSON `data` that repeats the `type`:
//! `message_start` (the message with empty content and the input usage), `content_block_start`, `ping`, one
//! `content_block_delta` (`text_delta`) per delta, `content_block_stop`, `message_delta` (`stop_reason` and
//! the output tokens), `message_stop`. An engine failure mid-stream is an `error` event (`api_error`).

use bytes::Bytes;
use serde_json::{json, Value};

use super::STREAM_ERROR_MESSAGE;
use super::{conversation_text, delta_text, named_event, with_fields, Answer, EventStream};

/// The prompt text of a Messages request.
pub fn prompt_text(request: &Value) -> String {
    let system = request.get("system").filter(|value| !value.is_null());
    conversation_text(system, request.get("messages"))
}

/// Anthropic `usage` for `output` generated tokens.
fn usage(answer: &Answer, output: u64) -> Value {
    json!({
        "input_tokens": answer.uncached_tokens(),
        "output_tokens": output,
        "cache_read_input_tokens": answer.cached_tokens,
        "cache_creation_input_tokens": 0
    })
}

/// A `message` object with the given content blocks.
fn message(answer: &Answer, content: Vec<Value>, stop_reason: Option<&str>, usage: Value) -> Value {
    json!({
        "id": answer.id,
        "type": "message",
        "role": "assistant",
        "model": answer.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": null,
        "usage": usage
    })
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// Non-streamed `message` body.
pub fn body(answer: &Answer) -> Value {
    let content = vec![text_block(&answer.text())];
    message(answer, content, Some("end_turn"), usage(answer, answer.plain_tokens()))
}

/// `event: <kind>` with `type` and the given fields.
fn event(kind: &str, fields: Value) -> Bytes {
    named_event(kind, &with_fields(json!({"type": kind}), fields))
}

/// The Messages stream.
pub struct Events;

impl EventStream for Events {
    fn head(&self, answer: &Answer) -> Vec<Bytes> {
        let started = message(answer, Vec::new(), None, usage(answer, 1));
        vec![
            event("message_start", json!({"message": started})),
            event(
                "content_block_start",
                json!({"index": 0, "content_block": text_block("")}),
            ),
            event("ping", json!({})),
        ]
    }

    fn delta(&self, _answer: &Answer, index: u32) -> Bytes {
        let delta = json!({"type": "text_delta", "text": delta_text(index)});
        event("content_block_delta", json!({"index": 0, "delta": delta}))
    }

    fn tail(&self, _answer: &Answer, chunks: u32) -> Vec<Bytes> {
        let delta = json!({"stop_reason": "end_turn", "stop_sequence": null});
        vec![
            event("content_block_stop", json!({"index": 0})),
            event(
                "message_delta",
                json!({"delta": delta, "usage": {"output_tokens": chunks}}),
            ),
        ]
    }

    fn terminal(&self, _answer: &Answer, _chunks: u32) -> Bytes {
        event("message_stop", json!({}))
    }

    /// `error` in Anthropic's key order.
    fn error(&self, _answer: &Answer, _deltas: u32) -> Bytes {
        let data = format!(r#"{{"type":"error","error":{{"type":"api_error","message":"{STREAM_ERROR_MESSAGE}"}}}}"#);
        Bytes::from(format!("event: error\ndata: {data}\n\n"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::testing::{answer, frame_event, frame_json};
    use super::super::{stream_plan, StreamFaults};
    use super::*;

    #[test]
    fn prompt_is_system_then_messages() {
        let request = json!({
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}
            ]
        });
        assert_eq!(prompt_text(&request), "system:be brief\nuser:hi\nassistant:hello");
        let plain = json!({"system": "s", "messages": [{"role": "user", "content": "x"}]});
        assert_eq!(prompt_text(&plain), "system:s\nuser:x");
        assert_eq!(
            prompt_text(&json!({"messages": [{"role": "user", "content": "x"}]})),
            "user:x"
        );
    }

    #[test]
    fn body_is_a_message() {
        let body = body(&answer());
        assert_eq!(body["type"], "message");
        assert_eq!(body["id"], "id-1");
        assert_eq!(body["role"], "assistant");
        assert_eq!(body["content"], json!([{"type": "text", "text": "Hello from a."}]));
        assert_eq!(body["stop_reason"], "end_turn");
        assert_eq!(body["stop_sequence"], Value::Null);
        assert_eq!(
            body["usage"],
            json!({"input_tokens": 8, "output_tokens": 3, "cache_read_input_tokens": 32, "cache_creation_input_tokens": 0})
        );
    }

    #[test]
    fn stream_events_are_in_order() {
        let plan = stream_plan(&Events, &answer(), &StreamFaults::new(2));
        let kinds: Vec<String> = plan.frames.iter().map(|f| frame_event(&f.bytes).unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        for (frame, kind) in plan.frames.iter().zip(&kinds) {
            assert_eq!(&frame_json(&frame.bytes)["type"], kind.as_str());
        }
        let start = frame_json(&plan.frames[0].bytes);
        assert_eq!(start["message"]["content"], json!([]));
        assert_eq!(start["message"]["stop_reason"], Value::Null);
        assert_eq!(start["message"]["usage"]["cache_read_input_tokens"], 32);
        let delta = frame_json(&plan.frames[4].bytes);
        assert_eq!(delta["delta"], json!({"type": "text_delta", "text": "tok1 "}));
        let end = frame_json(&plan.frames[6].bytes);
        assert_eq!(end["delta"]["stop_reason"], "end_turn");
        assert_eq!(end["usage"]["output_tokens"], 2);
    }
}
