//! `POST /v1/responses` (OpenAI Responses API).
//!
//! The prompt is `instructions` as a system line, then the input: a string as one user line, or one
//! `role:text` line per input item. The answer is one assistant `message` item with one `output_text` part.
//!
//! A stream is named events, each `event: <type>` with a JSON `data` that repeats the `type` and carries a
//! `sequence_number` counting from 0: `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`, one `response.output_text.delta` per delta,
//! `response.output_text.done`, `response.content_part.done`, `response.output_item.done`,
//! `response.completed` (with `usage`). An engine failure mid-stream is an `error` event with the next
//! `sequence_number`.

use bytes::Bytes;
use serde_json::{json, Value};

use super::STREAM_ERROR_MESSAGE;
use super::{conversation_text, delta_text, named_event, streamed_text, with_fields, Answer, EventStream};

/// Events before the first delta; deltas are numbered from here.
const HEAD_EVENTS: u32 = 4;

/// The prompt text of a Responses request.
pub fn prompt_text(request: &Value) -> String {
    let instructions = request.get("instructions").filter(|value| !value.is_null());
    match request.get("input") {
        Some(Value::String(text)) => {
            let user = json!([{"role": "user", "content": text}]);
            conversation_text(instructions, Some(&user))
        }
        input => conversation_text(instructions, input),
    }
}

/// Where a response or an output item stands.
#[derive(Clone, Copy)]
enum Status {
    InProgress,
    Completed,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
        }
    }
}

/// The `usage` object for `output` generated tokens.
fn usage(answer: &Answer, output: u64) -> Value {
    json!({
        "input_tokens": answer.prompt_tokens,
        "input_tokens_details": {"cached_tokens": answer.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": answer.prompt_tokens + output
    })
}

/// The id of the answer's one output message.
fn item_id(answer: &Answer) -> String {
    format!("msg_{}", answer.id)
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The assistant message item with the given parts.
fn message_item(answer: &Answer, status: Status, content: Vec<Value>) -> Value {
    json!({
        "type": "message",
        "id": item_id(answer),
        "status": status.as_str(),
        "role": "assistant",
        "content": content
    })
}

/// A whole `response` object.
fn response(answer: &Answer, status: Status, output: Vec<Value>, usage: Value) -> Value {
    json!({
        "id": answer.id,
        "object": "response",
        "created_at": 0,
        "status": status.as_str(),
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": null,
        "max_output_tokens": null,
        "metadata": {},
        "model": answer.model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": false,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": null
    })
}

/// The finished response for an answer text and its token count.
fn completed(answer: &Answer, text: &str, output_tokens: u64) -> Value {
    let item = message_item(answer, Status::Completed, vec![text_part(text)]);
    response(answer, Status::Completed, vec![item], usage(answer, output_tokens))
}

/// Non-streamed `response` body.
pub fn body(answer: &Answer) -> Value {
    completed(answer, &answer.text(), answer.plain_tokens())
}

/// `event: <kind>` with `type`, `sequence_number` and the given fields.
fn event(kind: &str, sequence: u32, fields: Value) -> Bytes {
    let data = with_fields(json!({"type": kind, "sequence_number": sequence}), fields);
    named_event(kind, &data)
}

/// Fields that place an event at the answer's one text part.
fn at_part(answer: &Answer, extra: Value) -> Value {
    with_fields(
        json!({"item_id": item_id(answer), "output_index": 0, "content_index": 0}),
        extra,
    )
}

/// The Responses stream.
pub struct Events;

impl EventStream for Events {
    fn head(&self, answer: &Answer) -> Vec<Bytes> {
        let started = response(answer, Status::InProgress, Vec::new(), Value::Null);
        let item = message_item(answer, Status::InProgress, Vec::new());
        vec![
            event("response.created", 0, json!({"response": started})),
            event("response.in_progress", 1, json!({"response": started})),
            event(
                "response.output_item.added",
                2,
                json!({"output_index": 0, "item": item}),
            ),
            event(
                "response.content_part.added",
                3,
                at_part(answer, json!({"part": text_part("")})),
            ),
        ]
    }

    fn delta(&self, answer: &Answer, index: u32) -> Bytes {
        let fields = at_part(answer, json!({"delta": delta_text(index), "logprobs": []}));
        event("response.output_text.delta", HEAD_EVENTS + index, fields)
    }

    fn tail(&self, answer: &Answer, chunks: u32) -> Vec<Bytes> {
        let text = streamed_text(chunks);
        let first = HEAD_EVENTS + chunks;
        let item = message_item(answer, Status::Completed, vec![text_part(&text)]);
        vec![
            event(
                "response.output_text.done",
                first,
                at_part(answer, json!({"text": text, "logprobs": []})),
            ),
            event(
                "response.content_part.done",
                first + 1,
                at_part(answer, json!({"part": text_part(&text)})),
            ),
            event(
                "response.output_item.done",
                first + 2,
                json!({"output_index": 0, "item": item}),
            ),
        ]
    }

    fn terminal(&self, answer: &Answer, chunks: u32) -> Bytes {
        let done = completed(answer, &streamed_text(chunks), u64::from(chunks));
        event(
            "response.completed",
            HEAD_EVENTS + chunks + 3,
            json!({"response": done}),
        )
    }

    /// `error` in OpenAI's key order, numbered after the events before it.
    fn error(&self, _answer: &Answer, deltas: u32) -> Bytes {
        let sequence = HEAD_EVENTS + deltas;
        let message = STREAM_ERROR_MESSAGE;
        let data = format!(
            r#"{{"type":"error","code":"server_error","message":"{message}","param":null,"sequence_number":{sequence}}}"#
        );
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
    fn prompt_is_instructions_then_input() {
        let plain = json!({"instructions": "be brief", "input": "hi"});
        assert_eq!(prompt_text(&plain), "system:be brief\nuser:hi");
        let items = json!({"input": [
            {"role": "user", "content": "one"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "two"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "three"}]}
        ]});
        assert_eq!(prompt_text(&items), "user:one\nassistant:two\nuser:three");
        assert_eq!(prompt_text(&json!({"instructions": null, "input": "x"})), "user:x");
    }

    #[test]
    fn body_is_a_completed_response() {
        let body = body(&answer());
        assert_eq!(body["object"], "response");
        assert_eq!(body["status"], "completed");
        let item = &body["output"][0];
        assert_eq!(item["type"], "message");
        assert_eq!(item["role"], "assistant");
        assert_eq!(item["status"], "completed");
        assert_eq!(item["content"][0]["type"], "output_text");
        assert_eq!(item["content"][0]["text"], "Hello from a.");
        assert_eq!(item["content"][0]["annotations"], json!([]));
        let usage = &body["usage"];
        assert_eq!(usage["input_tokens"], 40);
        assert_eq!(usage["input_tokens_details"]["cached_tokens"], 32);
        assert_eq!(usage["output_tokens"], 3);
        assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
        assert_eq!(usage["total_tokens"], 43);
    }

    #[test]
    fn stream_events_are_in_order_and_numbered() {
        let plan = stream_plan(&Events, &answer(), &StreamFaults::new(2));
        let kinds: Vec<String> = plan.frames.iter().map(|f| frame_event(&f.bytes).unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (sequence, frame) in plan.frames.iter().enumerate() {
            let data = frame_json(&frame.bytes);
            assert_eq!(data["sequence_number"], sequence);
            assert_eq!(data["type"], kinds[sequence]);
        }
        assert_eq!(frame_json(&plan.frames[0].bytes)["response"]["status"], "in_progress");
        let delta = frame_json(&plan.frames[5].bytes);
        assert_eq!(delta["delta"], "tok1 ");
        assert_eq!(delta["item_id"], "msg_id-1");
        assert_eq!(frame_json(&plan.frames[6].bytes)["text"], "tok0 tok1 ");
        let done = frame_json(&plan.frames[9].bytes);
        assert_eq!(done["response"]["status"], "completed");
        assert_eq!(done["response"]["output"][0]["content"][0]["text"], "tok0 tok1 ");
        assert_eq!(done["response"]["usage"]["output_tokens"], 2);
    }
}
