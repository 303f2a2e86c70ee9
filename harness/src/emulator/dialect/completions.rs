//! `POST /v1/completions` (OpenAI text completions) in llama.cpp's dialect.
//!
//! `prompt` is a string, a list of strings, a list of token ids, or a list of token-id lists; the engine's
//! prompt is those parts joined by `\n` (token ids written as numbers). A stream is `text_completion` chunks,
//! a final chunk with `finish_reason` and `timings`, the usage chunk (no choices, `usage`) if the request set
//! `stream_options.include_usage`, then `data: [DONE]`.

use bytes::Bytes;
use serde_json::{json, Value};

use super::{data_event, delta_text, openai_usage, prompt_parts, timings, usage_chunk, Answer, EventStream};
use super::{DONE, OPENAI_ERROR_EVENT};

/// The prompt text of a completions request.
pub fn prompt_text(request: &Value) -> String {
    request
        .get("prompt")
        .and_then(prompt_parts)
        .unwrap_or_default()
        .join("\n")
}

/// One `text_completion` object with a single choice.
fn completion(answer: &Answer, text: &str, finish_reason: Option<&str>) -> Value {
    json!({
        "id": answer.id,
        "object": "text_completion",
        "created": 0,
        "model": answer.model,
        "system_fingerprint": answer.backend,
        "choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": finish_reason}]
    })
}

/// Non-streamed `text_completion` body.
pub fn body(answer: &Answer) -> Value {
    let mut body = completion(answer, &answer.text(), Some("stop"));
    body["usage"] = openai_usage(answer, answer.plain_tokens());
    body["timings"] = timings(answer, answer.plain_tokens());
    body
}

/// The completions stream.
pub struct Events;

impl EventStream for Events {
    fn head(&self, _answer: &Answer) -> Vec<Bytes> {
        Vec::new()
    }

    fn delta(&self, answer: &Answer, index: u32) -> Bytes {
        data_event(&completion(answer, &delta_text(index), None))
    }

    /// The last chunk (empty text, `stop`, the timings), then the usage chunk if asked for.
    fn tail(&self, answer: &Answer, chunks: u32) -> Vec<Bytes> {
        let completion_tokens = u64::from(chunks);
        let mut last = completion(answer, "", Some("stop"));
        last["timings"] = timings(answer, completion_tokens);
        let usage = usage_chunk(answer, completion(answer, "", None), completion_tokens);
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
    fn prompt_takes_every_form() {
        assert_eq!(prompt_text(&json!({"prompt": "once upon"})), "once upon");
        assert_eq!(prompt_text(&json!({"prompt": ["a", "b"]})), "a\nb");
        assert_eq!(prompt_text(&json!({"prompt": [1, 2, 3]})), "1 2 3");
        assert_eq!(prompt_text(&json!({"prompt": [[1, 2], [3]]})), "1 2\n3");
        assert_eq!(prompt_text(&json!({})), "");
    }

    #[test]
    fn body_is_a_text_completion() {
        let body = body(&answer());
        assert_eq!(body["object"], "text_completion");
        assert_eq!(body["id"], "id-1");
        assert_eq!(body["choices"][0]["text"], "Hello from a.");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["choices"][0]["logprobs"], Value::Null);
        assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
        assert_eq!(body["usage"]["completion_tokens"], 3);
        assert_eq!(body["timings"]["cache_n"], 32);
    }

    #[test]
    fn stream_sends_text_then_totals_then_done() {
        let plan = stream_plan(&Events, &answer(), &StreamFaults::new(2));
        assert_eq!(plan.frames.len(), 4);
        let first = frame_json(&plan.frames[0].bytes);
        assert_eq!(first["object"], "text_completion");
        assert_eq!(first["choices"][0]["text"], "tok0 ");
        assert_eq!(first["choices"][0]["finish_reason"], Value::Null);
        let last = frame_json(&plan.frames[2].bytes);
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        assert_eq!(last.get("usage"), None);
        assert_eq!(last["timings"]["predicted_n"], 2);
        assert_eq!(plan.frames[3].bytes.as_ref(), DONE);

        let asked = Answer {
            include_usage: true,
            ..answer()
        };
        let plan = stream_plan(&Events, &asked, &StreamFaults::new(2));
        assert_eq!(plan.frames.len(), 5);
        let usage = frame_json(&plan.frames[3].bytes);
        assert_eq!(usage["object"], "text_completion");
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 2);
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
    }
}
