//! The inference APIs the emulator speaks, and what they share.
//!
//! Each API is a [`Dialect`] with its own module: how to read the prompt out of a request, the non-streamed
//! body, and the streamed events. Everything here is plain data: JSON values for non-streamed answers and a
//! [`StreamPlan`] (the exact SSE frames, with the pause before each, after the request's [`StreamFaults`]) for
//! streamed ones. The server module turns them into HTTP responses, so the shapes can be checked without a
//! socket.
//!
//! All dialects answer the same way: a non-streamed answer says `Hello from <backend>.` and reports
//! [`NON_STREAM_TOKENS`] output tokens; a stream sends `chunks` deltas `tok0 `, `tok1 `, ... and reports that
//! many. A request that names `x-emu-chunks` gets that stream's generation non-streamed too. Prompt and cached token counts come from the prefix cache model (see `cache`).

mod chat;
mod completions;
mod embeddings;
mod engine;
mod messages;
mod plan;
mod prompt;
mod responses;
mod stream;

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

pub use engine::{health_body, models_body, props_body};
#[cfg(test)]
pub use plan::GARBAGE;
pub use plan::{stream_plan, End, Frame, LineEnding, Stop, StreamFaults, StreamPlan};
use prompt::{conversation_text, prompt_parts};
use stream::with_fields;
pub use stream::{data_event, delta_text, named_event, streamed_text, EventStream};
pub use stream::{OPENAI_ERROR_EVENT, STREAM_ERROR_MESSAGE};

/// Content deltas in a stream unless `x-emu-chunks` says otherwise.
pub const DEFAULT_CHUNKS: u32 = 3;
/// Output tokens reported by a non-streamed answer.
pub const NON_STREAM_TOKENS: u64 = 3;
/// Last event of an OpenAI-style chat or completions stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// One inference API, named by its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/responses` (OpenAI Responses)
    Responses,
    /// `POST /v1/embeddings`
    Embeddings,
    /// `POST /v1/messages` (Anthropic Messages)
    Messages,
}

impl Dialect {
    pub const ALL: [Dialect; 5] = [
        Dialect::Chat,
        Dialect::Completions,
        Dialect::Responses,
        Dialect::Embeddings,
        Dialect::Messages,
    ];

    pub fn path(self) -> &'static str {
        match self {
            Dialect::Chat => "/v1/chat/completions",
            Dialect::Completions => "/v1/completions",
            Dialect::Responses => "/v1/responses",
            Dialect::Embeddings => "/v1/embeddings",
            Dialect::Messages => "/v1/messages",
        }
    }

    /// The dialect served at `path` (no query), if any.
    pub fn from_path(path: &str) -> Option<Dialect> {
        Self::ALL.into_iter().find(|dialect| dialect.path() == path)
    }

    /// The error envelope of this API.
    pub fn envelope(self) -> Envelope {
        match self {
            Dialect::Messages => Envelope::Anthropic,
            _ => Envelope::OpenAi,
        }
    }

    /// The id of the `n`th answer, in this API's style.
    pub fn answer_id(self, n: u64) -> String {
        match self {
            Dialect::Chat => format!("chatcmpl-emu-{n}"),
            Dialect::Completions => format!("cmpl-emu-{n}"),
            Dialect::Responses => format!("resp_emu{n}"),
            Dialect::Embeddings => format!("embd-emu-{n}"),
            Dialect::Messages => format!("msg_emu{n}"),
        }
    }

    /// The prompt as the engine would tokenize it: the text the prefix cache and token counts work on.
    pub fn prompt_text(self, request: &Value) -> String {
        match self {
            Dialect::Chat => chat::prompt_text(request),
            Dialect::Completions => completions::prompt_text(request),
            Dialect::Responses => responses::prompt_text(request),
            Dialect::Embeddings => embeddings::inputs(request).unwrap_or_default().join("\n"),
            Dialect::Messages => messages::prompt_text(request),
        }
    }

    /// Whether the prompt goes through the KV cache. An embedding pass neither reads nor fills it.
    pub fn uses_cache(self) -> bool {
        self != Dialect::Embeddings
    }

    /// Checks a request beyond being JSON; `Err` is the message of a 400.
    pub fn check(self, request: &Value) -> Result<(), String> {
        match self {
            Dialect::Embeddings => embeddings::inputs(request).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// The non-streamed answer body.
    pub fn body(self, answer: &Answer, request: &Value) -> Value {
        match self {
            Dialect::Chat => chat::body(answer),
            Dialect::Completions => completions::body(answer),
            Dialect::Responses => responses::body(answer),
            Dialect::Embeddings => embeddings::body(answer, request),
            Dialect::Messages => messages::body(answer),
        }
    }

    /// The events of a streamed answer; `None` where the API has no streaming.
    pub fn events(self) -> Option<&'static dyn EventStream> {
        match self {
            Dialect::Chat => Some(&chat::Events),
            Dialect::Completions => Some(&completions::Events),
            Dialect::Responses => Some(&responses::Events),
            Dialect::Embeddings => None,
            Dialect::Messages => Some(&messages::Events),
        }
    }
}

/// How an API wraps its errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Envelope {
    /// `{"error":{"code","message","type"}}`, as llama.cpp and OpenAI send it.
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}`
    Anthropic,
}

impl Envelope {
    /// An error body of the given `type`.
    pub fn error(self, status: u16, kind: &str, message: &str) -> Value {
        match self {
            Envelope::OpenAi => json!({"error": {"code": status, "message": message, "type": kind}}),
            Envelope::Anthropic => json!({"type": "error", "error": {"type": kind, "message": message}}),
        }
    }

    /// An error body typed after the status, the way a real server would type it.
    pub fn error_for(self, status: u16, message: &str) -> Value {
        self.error(status, self.kind(status), message)
    }

    /// The error `type` this API uses for a status.
    pub fn kind(self, status: u16) -> &'static str {
        match (self, status) {
            (_, 400) => "invalid_request_error",
            (_, 401) => "authentication_error",
            (_, 403) => "permission_error",
            (_, 404) => "not_found_error",
            (_, 429) => "rate_limit_error",
            (Envelope::OpenAi, 501) => "not_supported_error",
            (Envelope::OpenAi, 503) => "unavailable_error",
            (Envelope::OpenAi, _) => "server_error",
            (Envelope::Anthropic, 413) => "request_too_large",
            (Envelope::Anthropic, 503 | 529) => "overloaded_error",
            (Envelope::Anthropic, _) => "api_error",
        }
    }
}

/// What one answer is about: who answers, for which model, and the token counts it reports.
#[derive(Clone, Debug)]
pub struct Answer {
    pub id: String,
    pub model: String,
    pub backend: String,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Pause before each content delta; also feeds `predicted_ms`.
    pub chunk_delay: Duration,
    /// The request asked for `stream_options.include_usage`: an OpenAI-style stream ends with a usage chunk.
    pub include_usage: bool,
    /// Set when the request named `x-emu-chunks`: a non-streamed answer is then the same generation as a stream
    /// of that many deltas (their text, that many output tokens), so the two can be compared byte for byte.
    pub plain_chunks: Option<u32>,
}

impl Answer {
    /// The text of a non-streamed answer.
    pub fn text(&self) -> String {
        match self.plain_chunks {
            Some(chunks) => streamed_text(chunks),
            None => format!("Hello from {}.", self.backend),
        }
    }

    /// The output tokens of a non-streamed answer.
    pub fn plain_tokens(&self) -> u64 {
        self.plain_chunks.map_or(NON_STREAM_TOKENS, u64::from)
    }

    /// Prompt tokens that had to be computed, not read from the cache.
    pub fn uncached_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_sub(self.cached_tokens)
    }
}

/// OpenAI `usage` with llama.cpp's `prompt_tokens_details.cached_tokens`.
fn openai_usage(answer: &Answer, completion: u64) -> Value {
    json!({
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": answer.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": answer.cached_tokens}
    })
}

/// The usage chunk that ends an OpenAI-style stream (before `[DONE]`) when the request set
/// `stream_options.include_usage`: `chunk`, a chunk of that stream, with no choices and the totals.
fn usage_chunk(answer: &Answer, mut chunk: Value, completion: u64) -> Option<Bytes> {
    answer.include_usage.then(|| {
        chunk["choices"] = json!([]);
        chunk["usage"] = openai_usage(answer, completion);
        data_event(&chunk)
    })
}

/// llama.cpp's `timings` block.
fn timings(answer: &Answer, completion: u64) -> Value {
    let prompt_n = answer.uncached_tokens();
    let chunk_ms = answer.chunk_delay.as_secs_f64() * 1000.0;
    json!({
        "prompt_n": prompt_n,
        "cache_n": answer.cached_tokens,
        "predicted_n": completion,
        "prompt_ms": prompt_n as f64 * 0.1,
        "predicted_ms": completion as f64 * chunk_ms
    })
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers for the dialect tests.
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    pub fn answer() -> Answer {
        Answer {
            id: "id-1".into(),
            model: "m".into(),
            backend: "a".into(),
            prompt_tokens: 40,
            cached_tokens: 32,
            chunk_delay: Duration::from_millis(5),
            include_usage: false,
            plain_chunks: None,
        }
    }

    /// The JSON of a `data:` frame, ignoring an `event:` line before it.
    pub fn frame_json(bytes: &[u8]) -> Value {
        let text = std::str::from_utf8(bytes).unwrap();
        let data = text.lines().find_map(|line| line.strip_prefix("data: ")).unwrap();
        serde_json::from_str(data).unwrap()
    }

    /// The `event:` name of a frame, if it has one.
    pub fn frame_event(bytes: &[u8]) -> Option<String> {
        let text = std::str::from_utf8(bytes).unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix("event: "))
            .map(str::to_string)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::testing::answer;
    use super::*;

    #[test]
    fn paths_map_both_ways() {
        for dialect in Dialect::ALL {
            assert_eq!(Dialect::from_path(dialect.path()), Some(dialect));
        }
        assert_eq!(Dialect::from_path("/v1/models"), None);
        assert_eq!(Dialect::Messages.envelope(), Envelope::Anthropic);
        assert_eq!(Dialect::Responses.envelope(), Envelope::OpenAi);
    }

    #[test]
    fn with_explicit_chunks_a_plain_answer_is_the_streams_generation() {
        let answer = Answer {
            plain_chunks: Some(2),
            ..answer()
        };
        for dialect in [
            Dialect::Chat,
            Dialect::Completions,
            Dialect::Responses,
            Dialect::Messages,
        ] {
            let body = dialect.body(&answer, &json!({})).to_string();
            assert!(body.contains("\"tok0 tok1 \""), "{dialect:?}: {body}");
            assert!(!body.contains("Hello from"), "{dialect:?}: {body}");
        }
        assert_eq!(chat::body(&answer)["usage"]["completion_tokens"], 2);
        assert_eq!(answer.plain_tokens(), 2);
        assert_eq!(super::testing::answer().plain_tokens(), NON_STREAM_TOKENS);
    }

    #[test]
    fn uncached_tokens_are_the_rest_of_the_prompt() {
        assert_eq!(answer().uncached_tokens(), 8);
    }

    #[test]
    fn envelopes_have_their_shapes() {
        let openai = Envelope::OpenAi.error_for(503, "busy");
        assert_eq!(
            openai,
            json!({"error": {"code": 503, "message": "busy", "type": "unavailable_error"}})
        );
        let anthropic = Envelope::Anthropic.error_for(529, "busy");
        assert_eq!(
            anthropic,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
        );
        assert_eq!(Envelope::Anthropic.kind(500), "api_error");
        assert_eq!(Envelope::Anthropic.kind(413), "request_too_large");
        assert_eq!(Envelope::OpenAi.kind(500), "server_error");
    }
}
