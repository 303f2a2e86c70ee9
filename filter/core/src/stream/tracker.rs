//! Watches one streamed response and decides how it ended, what it cost, and what, if anything, the gateway must
//! add so the client can tell a finished answer from a broken one.
//!
//! Each API has its terminal event: `data: [DONE]` for chat and completions; `response.completed`,
//! `response.failed` or `response.incomplete` for responses; `message_stop` for messages. A stream that ends
//! cleanly without it, or that carried an upstream error event, is closed by the gateway with an error event in
//! the API's own shape. When the stream stopped inside an event, that event is closed first, for messages as a
//! `ping` (which the SDKs ignore). A stream cut by a reset cannot be repaired (Envoy gives the filter no end of
//! stream), only counted.

use serde_json::{json, Value};

use super::sse::{Event, SseReader};
use super::usage::{self, Usage, MAX_USAGE_DOC};
use crate::endpoint::Api;

/// How a stream ended, as far as its events tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The terminal event arrived and no error event did.
    Complete,
    /// The stream ended without its terminal event.
    MissingTerminal,
    /// The upstream sent an error event (or `response.failed`).
    UpstreamError,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Complete => "complete",
            Verdict::MissingTerminal => "missing_terminal",
            Verdict::UpstreamError => "upstream_error",
        }
    }
}

/// What one event means.
enum Kind {
    Terminal(Usage),
    /// A failure that also ends the stream (`response.failed`).
    FailedTerminal(Usage),
    Error,
    /// The usage-only chunk of a chat stream (`choices: []` with `usage`).
    UsageChunk(Usage),
    Other(Usage),
}

pub struct StreamTracker {
    api: Api,
    reader: SseReader,
    terminal: bool,
    error_event: bool,
    usage: Usage,
    /// Cut the usage-only chunk out of the client's stream (the gateway asked for it, the client did not).
    strip_usage_chunk: bool,
}

impl StreamTracker {
    pub fn new(api: Api, strip_usage_chunk: bool) -> Self {
        StreamTracker {
            api,
            reader: SseReader::new(MAX_USAGE_DOC),
            terminal: false,
            error_event: false,
            usage: Usage::default(),
            strip_usage_chunk,
        }
    }

    /// Watches a chunk of the response. Returns byte ranges of `chunk` to cut out of what the client gets.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<(usize, usize)> {
        let mut cuts = Vec::new();
        let api = self.api;
        let mut seen = Vec::new();
        self.reader
            .feed(chunk, |ev, span| seen.push((classify(api, &ev), span)));
        for (kind, span) in seen {
            match kind {
                Kind::Terminal(u) => {
                    self.terminal = true;
                    self.usage.merge(u);
                }
                Kind::FailedTerminal(u) => {
                    self.terminal = true;
                    self.error_event = true;
                    self.usage.merge(u);
                }
                Kind::Error => self.error_event = true,
                Kind::UsageChunk(u) => {
                    self.usage.merge(u);
                    if let (true, Some(span)) = (self.strip_usage_chunk, span) {
                        cuts.push(span);
                    }
                }
                Kind::Other(u) => self.usage.merge(u),
            }
        }
        cuts
    }

    pub fn verdict(&self) -> Verdict {
        match (self.error_event, self.terminal) {
            (true, _) => Verdict::UpstreamError,
            (false, true) => Verdict::Complete,
            (false, false) => Verdict::MissingTerminal,
        }
    }

    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The bytes to append when the stream ended cleanly without its terminal event; `None` when it is whole.
    pub fn closing_bytes(&self, request_id: Option<&str>) -> Option<Vec<u8>> {
        if self.terminal {
            return None;
        }
        let mut out = String::new();
        if self.reader.after_cr() {
            // Complete the CRLF, or the LF below that closes the half event would be read as its second half.
            out.push('\n');
        }
        if self.reader.mid_line() {
            out.push('\n');
        }
        if self.reader.mid_event() {
            // Close the half event so the client's parser never sees it joined to ours.
            out.push_str(if self.api == Api::Messages {
                "event: ping\n\n"
            } else {
                "\n"
            });
        }
        let message = if self.error_event {
            "The engine reported an error mid-stream."
        } else {
            "The engine's stream ended without its final event."
        };
        out.push_str(&error_event(self.api, message, request_id));
        Some(out.into_bytes())
    }
}

/// The API's error event, as the SDKs expect it.
fn error_event(api: Api, message: &str, request_id: Option<&str>) -> String {
    match api {
        Api::Messages => {
            let body =
                json!({"type": "error", "error": {"type": "api_error", "message": message}, "request_id": request_id});
            format!("event: error\ndata: {body}\n\n")
        }
        Api::Responses => {
            let body = json!({
                "type": "response.failed",
                "sequence_number": 0,
                "response": {
                    "id": format!("resp_{}", request_id.unwrap_or("llmroute")),
                    "object": "response",
                    "created_at": 0,
                    "status": "failed",
                    "error": {"code": "server_error", "message": message},
                    "incomplete_details": null,
                    "output": [],
                },
            });
            format!("event: response.failed\ndata: {body}\n\n")
        }
        _ => {
            let body = json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}});
            format!("data: {body}\n\n")
        }
    }
}

fn classify(api: Api, ev: &Event) -> Kind {
    if matches!(api, Api::Chat | Api::Completions) && ev.data.trim() == "[DONE]" {
        return Kind::Terminal(Usage::default());
    }
    let doc = if ev.oversized { None } else { usage::parse_doc(&ev.data) };
    let name = match (ev.name.as_str(), doc.as_ref()) {
        ("", Some(d)) => d.get("type").and_then(Value::as_str).unwrap_or("").to_string(),
        (n, _) => n.to_string(),
    };
    let Some(doc) = doc else {
        return match name.as_str() {
            "error" => Kind::Error,
            "message_stop" => Kind::Terminal(Usage::default()),
            _ => Kind::Other(Usage::default()),
        };
    };
    match api {
        Api::Messages => match name.as_str() {
            "message_stop" => Kind::Terminal(Usage::default()),
            "error" => Kind::Error,
            "message_start" => Kind::Other(doc.get("message").map(usage::from_value).unwrap_or_default()),
            _ => Kind::Other(usage::from_value(&doc)),
        },
        Api::Responses => {
            let u = doc.get("response").map(usage::from_value).unwrap_or_default();
            match name.as_str() {
                "response.completed" | "response.incomplete" => Kind::Terminal(u),
                "response.failed" => Kind::FailedTerminal(u),
                "error" => Kind::Error,
                _ => Kind::Other(u),
            }
        }
        _ => {
            if doc.get("error").is_some_and(|e| !e.is_null()) {
                return Kind::Error;
            }
            let u = usage::from_value(&doc);
            let usage_only = doc
                .get("choices")
                .and_then(Value::as_array)
                .is_some_and(|c| c.is_empty())
                && doc.get("usage").is_some_and(Value::is_object);
            if usage_only {
                Kind::UsageChunk(u)
            } else {
                Kind::Other(u)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(api: Api, chunks: &[&str]) -> StreamTracker {
        let mut t = StreamTracker::new(api, false);
        for c in chunks {
            t.feed(c.as_bytes());
        }
        t
    }

    #[test]
    fn chat_complete_with_usage() {
        let t = run(
            Api::Chat,
            &[
                "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n: keepalive\n\n",
                "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
                "data: [DONE]\n\n",
            ],
        );
        assert_eq!(t.verdict(), Verdict::Complete);
        assert_eq!(t.usage().cached_tokens, Some(4));
        assert_eq!(t.closing_bytes(None), None);
    }

    #[test]
    fn chat_without_done_is_closed_with_an_openai_error() {
        let t = run(Api::Chat, &["data: {\"choices\":[]}\n\n"]);
        assert_eq!(t.verdict(), Verdict::MissingTerminal);
        let tail = String::from_utf8(t.closing_bytes(Some("r")).unwrap()).unwrap();
        assert!(tail.starts_with("data: {\"error\":{"), "{tail}");
        let v: Value = serde_json::from_str(tail.trim_start_matches("data: ").trim()).unwrap();
        assert_eq!(v["error"]["type"], "server_error");
        assert!(tail.ends_with("\n\n"));
    }

    #[test]
    fn messages_cut_inside_an_event_is_closed_with_a_ping_then_an_error() {
        let t = run(Api::Messages, &["event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"cache_read_input_tokens\":40}}}\n\nevent: content_block_delta\ndata: {\"type\":\"conte"]);
        assert_eq!(t.usage().cached_tokens, Some(40));
        let tail = String::from_utf8(t.closing_bytes(Some("req-1")).unwrap()).unwrap();
        assert!(tail.starts_with("\nevent: ping\n\nevent: error\ndata: "), "{tail:?}");
        assert!(tail.contains("\"request_id\":\"req-1\""));
    }

    #[test]
    fn upstream_error_event_is_counted_and_closed() {
        let t = run(Api::Chat, &["data: {\"error\":{\"message\":\"boom\"}}\n\n"]);
        assert_eq!(t.verdict(), Verdict::UpstreamError);
        assert!(t.closing_bytes(None).is_some());
    }

    #[test]
    fn responses_terminals_and_failure() {
        let done = run(Api::Responses, &["event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":5,\"input_tokens_details\":{\"cached_tokens\":2},\"output_tokens\":1}}}\n\n"]);
        assert_eq!(
            (done.verdict(), done.usage().cached_tokens),
            (Verdict::Complete, Some(2))
        );
        let failed = run(
            Api::Responses,
            &["event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{}}\n\n"],
        );
        assert_eq!(failed.verdict(), Verdict::UpstreamError);
        assert_eq!(
            failed.closing_bytes(None),
            None,
            "response.failed is itself a terminal event"
        );
        let open = run(
            Api::Responses,
            &["event: response.created\ndata: {\"type\":\"response.created\"}\n\n"],
        );
        let tail = String::from_utf8(open.closing_bytes(None).unwrap()).unwrap();
        assert!(tail.starts_with("event: response.failed\ndata: "));
        assert!(tail.contains("\"code\":\"server_error\""));
    }

    #[test]
    fn the_usage_chunk_is_cut_only_when_asked_and_only_it() {
        let chunk = "data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n";
        let mut t = StreamTracker::new(Api::Chat, true);
        let cuts = t.feed(chunk.as_bytes());
        assert_eq!(cuts.len(), 1);
        let (a, b) = cuts[0];
        let mut kept = chunk.as_bytes()[..a].to_vec();
        kept.extend_from_slice(&chunk.as_bytes()[b..]);
        assert_eq!(
            String::from_utf8(kept).unwrap(),
            "data: {\"choices\":[{\"delta\":{}}]}\n\ndata: [DONE]\n\n"
        );
        assert_eq!(t.usage().prompt_tokens, Some(1));
        let mut keep = StreamTracker::new(Api::Chat, false);
        assert!(keep.feed(chunk.as_bytes()).is_empty());
    }

    #[test]
    fn crlf_streams_are_understood() {
        let t = run(
            Api::Messages,
            &["event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n"],
        );
        assert_eq!(t.verdict(), Verdict::Complete);
    }
}

/// How a streamed response ended for the client, for counting in the log phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Complete,
    /// Ended cleanly without its terminal event; the gateway closed it with an error event.
    MissingTerminal,
    /// The engine sent an error event.
    UpstreamError,
    /// The engine's connection broke mid-stream; nothing could be appended.
    UpstreamCut,
    /// The client went away first.
    ClientCancel,
    /// The gateway's timeout ended it.
    Timeout,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Complete,
        Outcome::MissingTerminal,
        Outcome::UpstreamError,
        Outcome::UpstreamCut,
        Outcome::ClientCancel,
        Outcome::Timeout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::MissingTerminal => "missing_terminal",
            Outcome::UpstreamError => "upstream_error",
            Outcome::UpstreamCut => "upstream_cut",
            Outcome::ClientCancel => "client_cancel",
            Outcome::Timeout => "timeout",
        }
    }
}

/// Decides the outcome from what the filter saw (`eos_seen`: the response reached a clean end of stream), the
/// stream's verdict, and Envoy's `response.code_details`.
pub fn outcome(eos_seen: bool, verdict: Verdict, code_details: &str) -> Outcome {
    if code_details.contains("downstream_remote_disconnect") || code_details.contains("downstream_local_disconnect") {
        return Outcome::ClientCancel;
    }
    if code_details.contains("timeout") {
        return Outcome::Timeout;
    }
    if !eos_seen {
        return Outcome::UpstreamCut;
    }
    match verdict {
        Verdict::Complete => Outcome::Complete,
        Verdict::MissingTerminal => Outcome::MissingTerminal,
        Verdict::UpstreamError => Outcome::UpstreamError,
    }
}

#[cfg(test)]
mod outcome_tests {
    use super::*;

    #[test]
    fn outcomes() {
        assert_eq!(outcome(true, Verdict::Complete, "via_upstream"), Outcome::Complete);
        assert_eq!(
            outcome(true, Verdict::MissingTerminal, "via_upstream"),
            Outcome::MissingTerminal
        );
        assert_eq!(
            outcome(true, Verdict::UpstreamError, "via_upstream"),
            Outcome::UpstreamError
        );
        assert_eq!(
            outcome(
                false,
                Verdict::MissingTerminal,
                "upstream_reset_after_response_started{remote_reset}"
            ),
            Outcome::UpstreamCut
        );
        assert_eq!(
            outcome(false, Verdict::MissingTerminal, "downstream_remote_disconnect"),
            Outcome::ClientCancel
        );
        assert_eq!(
            outcome(false, Verdict::MissingTerminal, "stream_idle_timeout"),
            Outcome::Timeout
        );
        assert_eq!(
            outcome(true, Verdict::MissingTerminal, "response_timeout"),
            Outcome::Timeout
        );
    }
}
