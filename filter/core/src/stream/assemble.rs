//! Rebuilds one JSON answer from a stream, for a request the gateway sent upstream streamed although the client
//! asked for a plain answer (`models[].stream_upstream: always`).
//!
//! Feed it the stream's bytes as they come; at the end, [`Assembler::finish`] gives the answer's body, or the
//! reason there is none:
//! - **chat**: the `chat.completion` object. Each choice's `delta`s are merged by `index`: `role`, `content`,
//!   `reasoning_content` and `refusal` concatenated, `tool_calls` merged by their own `index` (`id`, `type` and
//!   the function `name` taken when they come, `arguments` concatenated), `logprobs.content` appended, the last
//!   `finish_reason` kept. `id`, `created`, `model`, `system_fingerprint` and `service_tier` come from the
//!   chunks, `usage` from the usage chunk, and llama.cpp's `timings` from the last chunk that has them. The
//!   stream's terminal event is `data: [DONE]`.
//! - **responses**: the `response` object of the terminal `response.completed` (or `response.incomplete`)
//!   event, which the Responses API defines as the whole response.
//!
//! A stream that ends before its terminal event ([`Failure::Cut`]), that carries an error event or
//! `response.failed` ([`Failure::UpstreamError`]), or whose answer grows past the bound ([`Failure::TooLarge`])
//! has no answer: the filter sends a 502 in the API's error envelope instead, never a truncated body.
//!
//! Memory: the SSE reader holds at most one event of `limit` bytes; the answer's parts (text, arguments, kept
//! objects, and each new choice or tool call at the size of the event that made it) count against the same
//! `limit`, and past it everything held is dropped. Members of the JSON output
//! come out sorted by key (serde_json's map), as a serde_json-built engine answer does.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::sse::{Event, SseReader};
use super::usage::{self, Usage};
use crate::endpoint::Api;

/// Why a stream gave no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The stream ended before its terminal event.
    Cut,
    /// The engine sent an error event, or `response.failed`.
    UpstreamError,
    /// The answer grew past `limits.max_assembled_bytes`.
    TooLarge,
}

impl Failure {
    /// The status the client gets instead of the answer.
    pub const STATUS: u32 = 502;

    /// The code in the 502's body and in `x-llmroute-error`.
    pub fn code(self) -> &'static str {
        match self {
            Failure::Cut => "upstream_stream_cut",
            Failure::UpstreamError => "upstream_stream_error",
            Failure::TooLarge => "assembled_answer_too_large",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Failure::Cut => "The engine's stream ended before the answer was complete.",
            Failure::UpstreamError => "The engine reported an error while generating the answer.",
            Failure::TooLarge => "The answer is larger than the gateway may hold (limits.max_assembled_bytes).",
        }
    }
}

/// The 502 body for a stream that gave no answer, in the OpenAI envelope (chat and responses) with the request id.
pub fn failure_body(f: Failure, request_id: Option<&str>) -> Vec<u8> {
    serde_json::json!({
        "error": {"message": f.message(), "type": "server_error", "param": null, "code": f.code()},
        "request_id": request_id,
    })
    .to_string()
    .into_bytes()
}

/// One tool call being merged.
#[derive(Debug, Default)]
struct ToolCall {
    id: Option<Value>,
    kind: Option<Value>,
    name: String,
    arguments: String,
}

/// One choice being merged.
#[derive(Debug, Default)]
struct Choice {
    role: Option<String>,
    content: Option<String>,
    reasoning: Option<String>,
    refusal: Option<String>,
    tool_calls: BTreeMap<u64, ToolCall>,
    logprobs: Option<Vec<Value>>,
    finish_reason: Value,
}

/// The chat answer's parts seen so far.
#[derive(Debug, Default)]
struct Chat {
    /// `id`, `created`, `model`, `system_fingerprint`, `service_tier`, `timings`, `usage`: the last value seen.
    top: Map<String, Value>,
    choices: BTreeMap<u64, Choice>,
}

/// The top-level members of a chunk carried into the answer.
const CHAT_TOP: [&str; 5] = ["id", "created", "model", "system_fingerprint", "service_tier"];

#[derive(Debug)]
enum Parts {
    Chat(Chat),
    /// The terminal event's `response` object, once it came.
    Responses(Option<Value>),
}

pub struct Assembler {
    reader: SseReader,
    parts: Parts,
    limit: usize,
    /// Bytes of the answer held so far, counted against `limit`.
    held: usize,
    terminal: bool,
    failure: Option<Failure>,
    usage: Usage,
}

impl Assembler {
    /// An assembler for `api` (chat or responses; any other API assembles as chat) holding at most `limit` bytes.
    pub fn new(api: Api, limit: usize) -> Self {
        let parts = match api {
            Api::Responses => Parts::Responses(None),
            _ => Parts::Chat(Chat::default()),
        };
        Assembler {
            reader: SseReader::new(limit),
            parts,
            limit,
            held: 0,
            terminal: false,
            failure: None,
            usage: Usage::default(),
        }
    }

    /// Reads a chunk of the stream.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.failure.is_some() {
            return;
        }
        // Each event is handled as the reader completes it, so a chunk of many small events is never held twice.
        let mut reader = std::mem::take(&mut self.reader);
        reader.feed_spans(chunk, |ev, _| {
            if self.failure.is_none() && !self.terminal {
                self.event(ev);
            }
        });
        self.reader = reader;
    }

    /// True once the answer can no longer be built (the filter may stop reading).
    pub fn failed(&self) -> Option<Failure> {
        self.failure
    }

    /// The usage the stream reported so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The answer's JSON body, or why there is none.
    pub fn finish(self) -> Result<Vec<u8>, Failure> {
        if let Some(f) = self.failure {
            return Err(f);
        }
        if !self.terminal {
            return Err(Failure::Cut);
        }
        let answer = match self.parts {
            Parts::Chat(chat) => chat.answer(),
            Parts::Responses(response) => response.ok_or(Failure::Cut)?,
        };
        Ok(answer.to_string().into_bytes())
    }

    fn fail(&mut self, f: Failure) {
        self.failure = Some(f);
        // Nothing held is needed any more.
        self.parts = match self.parts {
            Parts::Chat(_) => Parts::Chat(Chat::default()),
            Parts::Responses(_) => Parts::Responses(None),
        };
    }

    /// Counts `n` more bytes held; false (and the assembler failed) past the bound.
    fn hold(&mut self, n: usize) -> bool {
        self.held = self.held.saturating_add(n);
        if self.held > self.limit {
            self.fail(Failure::TooLarge);
            return false;
        }
        true
    }

    fn event(&mut self, ev: Event) {
        if ev.oversized {
            return self.fail(Failure::TooLarge);
        }
        let chat = matches!(self.parts, Parts::Chat(_));
        if chat && ev.data.trim() == "[DONE]" {
            self.terminal = true;
            return;
        }
        let doc = usage::parse_doc(&ev.data);
        let name = match (ev.name.as_str(), doc.as_ref()) {
            ("", Some(d)) => d.get("type").and_then(Value::as_str).unwrap_or("").to_string(),
            (n, _) => n.to_string(),
        };
        if name == "error" {
            return self.fail(Failure::UpstreamError);
        }
        let Some(doc) = doc else {
            // Not JSON: comments, keepalives and unknown events carry nothing of the answer.
            return;
        };
        if chat {
            self.chat_chunk(doc, ev.data.len());
        } else {
            self.responses_event(&name, doc, ev.data.len());
        }
    }

    fn responses_event(&mut self, name: &str, mut doc: Value, size: usize) {
        match name {
            "response.failed" => self.fail(Failure::UpstreamError),
            "response.completed" | "response.incomplete" => {
                let response = doc.get_mut("response").map(Value::take).filter(Value::is_object);
                let Some(response) = response else {
                    return self.fail(Failure::UpstreamError);
                };
                if self.hold(size) {
                    self.usage.merge(usage::from_value(&response));
                    self.parts = Parts::Responses(Some(response));
                    self.terminal = true;
                }
            }
            _ => {}
        }
    }

    fn chat_chunk(&mut self, mut doc: Value, size: usize) {
        if doc.get("error").is_some_and(|e| !e.is_null()) {
            return self.fail(Failure::UpstreamError);
        }
        self.usage.merge(usage::from_value(&doc));
        let mut grew = 0usize;
        let Parts::Chat(chat) = &mut self.parts else {
            return;
        };
        for key in CHAT_TOP {
            if let Some(v) = doc.get_mut(key).map(Value::take).filter(|v| !v.is_null()) {
                chat.top.insert(key.to_string(), v);
            }
        }
        for key in ["usage", "timings"] {
            if let Some(v) = doc.get_mut(key).map(Value::take).filter(Value::is_object) {
                grew = grew.saturating_add(size);
                chat.top.insert(key.to_string(), v);
            }
        }
        let choices = doc.get_mut("choices").map(Value::take);
        for c in choices.into_iter().filter_map(into_array).flatten() {
            let index = c.get("index").and_then(Value::as_u64).unwrap_or(0);
            if !chat.choices.contains_key(&index) {
                // A new choice costs the event that made it, so many empty ones cannot grow past the bound.
                grew = grew.saturating_add(size);
            }
            grew = grew.saturating_add(chat.choices.entry(index).or_default().merge(c, size));
        }
        self.hold(grew);
    }
}

fn into_array(v: Value) -> Option<Vec<Value>> {
    match v {
        Value::Array(a) => Some(a),
        _ => None,
    }
}

/// Appends the string `v` to `to` (started when absent); the bytes appended.
fn append(to: &mut Option<String>, v: Option<&Value>) -> usize {
    let Some(s) = v.and_then(Value::as_str) else {
        return 0;
    };
    to.get_or_insert_with(String::new).push_str(s);
    s.len()
}

impl Choice {
    /// Merges one streamed choice; returns the bytes it added (`size`, the event's, for kept objects).
    fn merge(&mut self, mut c: Value, size: usize) -> usize {
        if let Some(f) = c.get_mut("finish_reason").map(Value::take).filter(|v| !v.is_null()) {
            self.finish_reason = f;
        }
        let mut grew = 0usize;
        if let Some(Value::Array(items)) = c.pointer_mut("/logprobs/content").map(Value::take) {
            self.logprobs.get_or_insert_with(Vec::new).extend(items);
            grew = grew.saturating_add(size);
        }
        let Some(delta) = c.get("delta") else {
            return grew;
        };
        if let Some(r) = delta.get("role").and_then(Value::as_str) {
            self.role = Some(r.to_string());
        }
        grew = grew
            .saturating_add(append(&mut self.content, delta.get("content")))
            .saturating_add(append(&mut self.reasoning, delta.get("reasoning_content")))
            .saturating_add(append(&mut self.refusal, delta.get("refusal")));
        for call in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            if !self.tool_calls.contains_key(&index) {
                grew = grew.saturating_add(size);
            }
            let t = self.tool_calls.entry(index).or_default();
            if let Some(id) = call.get("id").filter(|v| v.is_string()) {
                t.id = Some(id.clone());
            }
            if let Some(kind) = call.get("type").filter(|v| v.is_string()) {
                t.kind = Some(kind.clone());
            }
            let f = call.get("function");
            for (to, key) in [(&mut t.name, "name"), (&mut t.arguments, "arguments")] {
                if let Some(s) = f.and_then(|f| f.get(key)).and_then(Value::as_str) {
                    to.push_str(s);
                    grew = grew.saturating_add(s.len());
                }
            }
        }
        grew
    }

    fn answer(self, index: u64) -> Value {
        let mut message = Map::new();
        message.insert("role".into(), self.role.unwrap_or_else(|| "assistant".into()).into());
        let content = match (self.content, self.tool_calls.is_empty()) {
            (Some(c), false) if c.is_empty() => Value::Null,
            (Some(c), _) => c.into(),
            (None, _) => Value::Null,
        };
        message.insert("content".into(), content);
        if let Some(r) = self.reasoning {
            message.insert("reasoning_content".into(), r.into());
        }
        if let Some(r) = self.refusal {
            message.insert("refusal".into(), r.into());
        }
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self.tool_calls.into_values().map(ToolCall::answer).collect();
            message.insert("tool_calls".into(), calls.into());
        }
        let mut choice = Map::new();
        choice.insert("index".into(), index.into());
        choice.insert("message".into(), message.into());
        choice.insert("finish_reason".into(), self.finish_reason);
        if let Some(content) = self.logprobs {
            choice.insert("logprobs".into(), serde_json::json!({ "content": content }));
        }
        choice.into()
    }
}

impl ToolCall {
    fn answer(self) -> Value {
        let mut call = Map::new();
        if let Some(id) = self.id {
            call.insert("id".into(), id);
        }
        call.insert("type".into(), self.kind.unwrap_or_else(|| "function".into()));
        call.insert(
            "function".into(),
            serde_json::json!({ "name": self.name, "arguments": self.arguments }),
        );
        call.into()
    }
}

impl Chat {
    fn answer(self) -> Value {
        let mut out = self.top;
        out.insert("object".into(), "chat.completion".into());
        let choices: Vec<Value> = self.choices.into_iter().map(|(i, c)| c.answer(i)).collect();
        out.insert("choices".into(), choices.into());
        out.into()
    }
}

#[cfg(test)]
#[path = "assemble_tests.rs"]
mod tests;
