//! Response bodies in llama.cpp's dialect.
//!
//! Everything here is plain data: JSON values for the non-streamed answers
//! and a [`StreamPlan`] (the exact SSE frames, with the pause before each)
//! for streamed ones. The server module turns them into HTTP responses, so
//! the shapes can be checked without a socket.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

/// SSE comment that llama.cpp-style servers send to keep a stream alive.
pub const KEEPALIVE: &[u8] = b": keepalive\n\n";
/// Last event of every complete stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";
/// Content chunks in a stream unless `x-emu-chunks` says otherwise.
pub const DEFAULT_CHUNKS: u32 = 3;
/// Completion tokens reported by a non-streamed answer.
pub const NON_STREAM_TOKENS: u64 = 3;

/// What one chat answer is about: who answers, for which model, and the
/// token counts it reports.
#[derive(Clone, Debug)]
pub struct Answer {
    pub id: String,
    pub model: String,
    pub backend: String,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Pause before each content chunk; also feeds `predicted_ms`.
    pub chunk_delay: Duration,
}

/// An error envelope, llama.cpp / OpenAI style.
pub fn error_body(code: u16, message: &str, kind: &str) -> Value {
    json!({"error": {"code": code, "message": message, "type": kind}})
}

/// The error `type` a real server would pick for a status.
pub fn error_kind(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        501 => "not_supported_error",
        503 => "unavailable_error",
        _ => "server_error",
    }
}

/// `GET /health` body for a status.
pub fn health_body(status: u16) -> Value {
    match status {
        200 => json!({"status": "ok"}),
        503 => error_body(503, "Loading model", "unavailable_error"),
        other => error_body(other, "emulated health failure", error_kind(other)),
    }
}

/// `GET /props` body.
pub fn props_body(model: &str, n_ctx: u32, total_slots: u32) -> Value {
    json!({
        "default_generation_settings": {
            "id": 0,
            "n_ctx": n_ctx,
            "is_processing": false,
            "speculative": false,
            "params": {"n_predict": -1, "temperature": 0.8, "top_k": 40, "top_p": 0.95}
        },
        "total_slots": total_slots,
        "model_path": format!("{model}.gguf"),
        "chat_template": "{{ messages }}",
        "modalities": {"vision": false, "audio": false},
        "build_info": "emulator"
    })
}

/// `GET /v1/models` body.
pub fn models_body(model: &str, n_ctx: u32) -> Value {
    json!({
        "object": "list",
        "data": [{
            "id": model,
            "object": "model",
            "created": 0,
            "owned_by": "llamacpp",
            "meta": {"n_ctx_train": n_ctx}
        }]
    })
}

fn usage(answer: &Answer, completion: u64) -> Value {
    json!({
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": answer.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": answer.cached_tokens}
    })
}

fn timings(answer: &Answer, completion: u64) -> Value {
    let prompt_n = answer.prompt_tokens - answer.cached_tokens;
    let chunk_ms = answer.chunk_delay.as_secs_f64() * 1000.0;
    json!({
        "prompt_n": prompt_n,
        "cache_n": answer.cached_tokens,
        "predicted_n": completion,
        "prompt_ms": prompt_n as f64 * 0.1,
        "predicted_ms": completion as f64 * chunk_ms
    })
}

/// Non-streamed `chat.completion` body.
pub fn completion_body(answer: &Answer) -> Value {
    json!({
        "id": answer.id,
        "object": "chat.completion",
        "created": 0,
        "model": answer.model,
        "system_fingerprint": answer.backend,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": format!("Hello from {}.", answer.backend)},
            "finish_reason": "stop"
        }],
        "usage": usage(answer, NON_STREAM_TOKENS),
        "timings": timings(answer, NON_STREAM_TOKENS)
    })
}

/// One `chat.completion.chunk` object.
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

/// The last chunk: empty delta, `stop`, and the totals.
fn final_chunk(answer: &Answer, completion: u64) -> Value {
    let mut value = chunk(answer, json!({}), Some("stop"));
    value["timings"] = timings(answer, completion);
    value["usage"] = usage(answer, completion);
    value
}

/// `data: <json>\n\n`
pub fn sse_event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// One frame of a stream and how long to wait before sending it.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    pub delay: Duration,
    pub bytes: Bytes,
}

impl Frame {
    fn now(bytes: Bytes) -> Self {
        Frame {
            delay: Duration::ZERO,
            bytes,
        }
    }
}

/// A whole stream: its frames in order and whether it ends by aborting the
/// connection instead of finishing.
#[derive(Clone, Debug)]
pub struct StreamPlan {
    pub frames: Vec<Frame>,
    pub abort: bool,
}

/// Plans a stream of `chunks` content chunks: role chunk, keepalive comment,
/// the content chunks (each after the chunk delay), final chunk, `[DONE]`.
/// With `cut_after`, the plan stops after that many content chunks and
/// aborts.
pub fn stream_plan(answer: &Answer, chunks: u32, cut_after: Option<u32>) -> StreamPlan {
    let role = json!({"role": "assistant", "content": ""});
    let mut frames = vec![
        Frame::now(sse_event(&chunk(answer, role, None))),
        Frame::now(Bytes::from_static(KEEPALIVE)),
    ];
    let sent = cut_after.map_or(chunks, |cut| cut.min(chunks));
    for index in 0..sent {
        let delta = json!({"content": format!("tok{index} ")});
        frames.push(Frame {
            delay: answer.chunk_delay,
            bytes: sse_event(&chunk(answer, delta, None)),
        });
    }
    if cut_after.is_some() {
        return StreamPlan { frames, abort: true };
    }
    frames.push(Frame::now(sse_event(&final_chunk(answer, u64::from(chunks)))));
    frames.push(Frame::now(Bytes::from_static(DONE)));
    StreamPlan { frames, abort: false }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn answer() -> Answer {
        Answer {
            id: "chatcmpl-emu-1".into(),
            model: "m".into(),
            backend: "a".into(),
            prompt_tokens: 40,
            cached_tokens: 32,
            chunk_delay: Duration::from_millis(5),
        }
    }

    fn data_json(frame: &Frame) -> Value {
        let text = std::str::from_utf8(&frame.bytes).unwrap();
        let json = text.strip_prefix("data: ").unwrap().strip_suffix("\n\n").unwrap();
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn completion_reports_usage_and_timings() {
        let body = completion_body(&answer());
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
    fn stream_plan_has_the_llama_order() {
        let plan = stream_plan(&answer(), 2, None);
        assert!(!plan.abort);
        assert_eq!(plan.frames.len(), 6);
        assert_eq!(data_json(&plan.frames[0])["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(plan.frames[1].bytes.as_ref(), KEEPALIVE);
        assert_eq!(data_json(&plan.frames[3])["choices"][0]["delta"]["content"], "tok1 ");
        assert_eq!(plan.frames[3].delay, Duration::from_millis(5));
        let last = data_json(&plan.frames[4]);
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        assert_eq!(last["usage"]["completion_tokens"], 2);
        assert_eq!(plan.frames[5].bytes.as_ref(), DONE);
    }

    #[test]
    fn cut_plan_stops_early_and_aborts() {
        let plan = stream_plan(&answer(), 3, Some(1));
        assert!(plan.abort);
        assert_eq!(plan.frames.len(), 3);
        let beyond = stream_plan(&answer(), 2, Some(9));
        assert!(beyond.abort);
        assert_eq!(beyond.frames.len(), 4);
    }
}
