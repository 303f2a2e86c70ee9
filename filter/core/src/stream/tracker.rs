//! Watches one streamed response and decides how it ended, what it cost, and what, if anything, the gateway must
//! add so the client can tell a finished answer from a broken one.
//!
//! Each API has its terminal event: `data: [DONE]` for chat and completions; `response.completed`,
//! `response.failed` or `response.incomplete` for responses; `message_stop` for messages. A stream that ends
//! cleanly without it, or that carried an upstream error event, is closed by the gateway with an error event in
//! the API's own shape. When the stream stopped inside an event, that event is closed first, for messages as a
//! `ping` (which the SDKs ignore). A stream cut by a reset cannot be repaired (Envoy gives the filter no end of
//! stream), only counted.

use std::sync::OnceLock;

use memchr::memmem;
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
#[derive(Debug, PartialEq)]
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
    /// Bytes of an unfinished event held back by [`StreamTracker::relay`], and their stream offset.
    held: Vec<u8>,
    held_from: u64,
}

/// The most [`StreamTracker::relay`] holds back of one unfinished event: past this it cannot be the usage
/// chunk the tracker would recognise (whose document is bounded by [`MAX_USAGE_DOC`]), so it is let through.
pub const MAX_HELD: usize = MAX_USAGE_DOC + 1024;

impl StreamTracker {
    pub fn new(api: Api, strip_usage_chunk: bool) -> Self {
        StreamTracker {
            api,
            reader: SseReader::new(MAX_USAGE_DOC),
            terminal: false,
            error_event: false,
            usage: Usage::default(),
            strip_usage_chunk,
            held: Vec::new(),
            held_from: 0,
        }
    }

    /// Watches a chunk of the response. Returns byte ranges of `chunk` to cut out of what the client gets (only
    /// events that lie wholly in `chunk`; [`StreamTracker::relay`] also cuts those split across chunks).
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<(usize, usize)> {
        let base = self.reader.fed();
        self.feed_spans(chunk)
            .into_iter()
            .filter_map(|(a, b)| {
                let a = usize::try_from(a.checked_sub(base)?).ok()?;
                let b = usize::try_from(b.checked_sub(base)?).ok()?;
                Some((a, b))
            })
            .collect()
    }

    /// Watches a chunk and returns what the client gets for it now, or `None` when that is the chunk unchanged.
    ///
    /// When the tracker strips the usage chunk, a chunk that ends inside an event keeps that event's bytes back
    /// (at most [`MAX_HELD`]) and sends them with the next chunk, so an event split across reads is cut whole.
    /// The client loses no time by it: an SSE client can do nothing with half an event. At `end_of_stream`
    /// everything held is released. Without stripping, nothing is held and chunks pass unchanged.
    pub fn relay(&mut self, chunk: &[u8], end_of_stream: bool) -> Option<Vec<u8>> {
        let base = self.reader.fed();
        let cuts = self.feed_spans(chunk);
        if !self.strip_usage_chunk {
            return None;
        }
        let end = self.reader.fed();
        let from = if self.held.is_empty() { base } else { self.held_from };
        let hold_at = match end_of_stream {
            true => None,
            false => self
                .reader
                .pending_start()
                .filter(|s| *s >= from && end.saturating_sub(*s) <= MAX_HELD as u64),
        };
        let cuts: Vec<(u64, u64)> = cuts.into_iter().filter(|(a, _)| *a >= from).collect();
        if self.held.is_empty() && cuts.is_empty() && hold_at.is_none() {
            return None;
        }
        let mut window = std::mem::take(&mut self.held);
        window.extend_from_slice(chunk);
        let offset = |at: u64| {
            usize::try_from(at.saturating_sub(from))
                .unwrap_or(usize::MAX)
                .min(window.len())
        };
        let release_end = hold_at.map_or(window.len(), offset);
        let local: Vec<(usize, usize)> = cuts
            .iter()
            .map(|&(a, b)| (offset(a), offset(b).min(release_end)))
            .filter(|(a, b)| a < b)
            .collect();
        let out = super::without(window.get(..release_end).unwrap_or_default(), &local);
        if let Some(at) = hold_at {
            self.held = window.get(release_end..).unwrap_or_default().to_vec();
            self.held_from = at;
        }
        Some(out)
    }

    /// Feeds the reader; returns the stream ranges of the usage chunks to cut.
    fn feed_spans(&mut self, chunk: &[u8]) -> Vec<(u64, u64)> {
        let mut cuts = Vec::new();
        let api = self.api;
        let mut seen = Vec::new();
        self.reader
            .feed_spans(chunk, |ev, span| seen.push((classify(api, &ev), span)));
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
                    if self.strip_usage_chunk {
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

/// The top-level members of an event that [`classify`] reads; `choices` only for whether it is empty.
const EVENT_MEMBERS: &[&str] = &["type", "error", "usage", "timings", "message", "response"];

/// What a chat or completions event is read for: an error, or usage (`usage`, llama.cpp's `timings`), as keys
/// are written (quoted), and `\u`, the only escape that makes a letter, so a key spelled with escapes is seen too.
const CHAT_READS: [&str; 4] = ["\"error\"", "\"usage\"", "\"timings\"", "\\u"];

/// True when a chat or completions event cannot be an error or carry usage, whatever its JSON: its data holds
/// none of [`CHAT_READS`] and its own name is not one [`classify_parsed`] reads when the data is not JSON. Most of
/// a chat stream is such deltas, and [`classify_parsed`] would make `Other` with no usage of each; this says so
/// without parsing it (a property test below holds the two to the same answer).
fn plain_delta(ev: &Event) -> bool {
    static FINDERS: OnceLock<[memmem::Finder<'static>; 4]> = OnceLock::new();
    let finders = FINDERS.get_or_init(|| CHAT_READS.map(memmem::Finder::new));
    let data = ev.data.as_bytes();
    !matches!(ev.name.as_str(), "error" | "message_stop") && finders.iter().all(|f| f.find(data).is_none())
}

fn classify(api: Api, ev: &Event) -> Kind {
    let chat = matches!(api, Api::Chat | Api::Completions);
    if chat && ev.data.trim() != "[DONE]" && plain_delta(ev) {
        return Kind::Other(Usage::default());
    }
    classify_parsed(api, ev)
}

/// What an event means, read from its parsed members.
fn classify_parsed(api: Api, ev: &Event) -> Kind {
    if matches!(api, Api::Chat | Api::Completions) && ev.data.trim() == "[DONE]" {
        return Kind::Terminal(Usage::default());
    }
    // Only the members read below are built; an event's text (`choices`, `delta`) is checked and skipped.
    let doc = match ev.oversized {
        true => None,
        false => usage::parse_members(&ev.data, EVENT_MEMBERS, &["choices"]),
    };
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
    use proptest::prelude::*;

    /// JSON and near-JSON pieces of chat events: the words `plain_delta` looks for as keys, values and text,
    /// keys spelled with escapes, and bytes that make the data invalid.
    fn data_piece() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            " ",
            "\"",
            "null",
            "0",
            "12",
            "true",
            "\"choices\"",
            "\"delta\"",
            "\"content\"",
            "\"text\"",
            "\"usage\"",
            "\"timings\"",
            "\"error\"",
            "\"prompt_tokens\"",
            "\"completion_tokens\"",
            "\"prompt_n\"",
            "\"predicted_n\"",
            "\"\\u0075sage\"",
            "\"er\\u0072or\"",
            "\"tim\\u0069ngs\"",
            "\\n",
            "\\\"",
            "usage",
            "error",
            "[DONE]",
            "message_stop",
        ])
        .prop_map(str::to_string)
    }

    /// Events of a chat stream: well-formed deltas, usage and error chunks, and random pieces.
    fn chat_event() -> impl Strategy<Value = Event> {
        let data = prop_oneof![
            3 => prop::collection::vec(data_piece(), 0..24).prop_map(|p| p.concat()),
            1 => Just(r#"{"choices":[{"delta":{"content":"the usage of words"}}]}"#.to_string()),
            1 => Just(r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#.to_string()),
            1 => Just(r#"{"error":{"message":"x"}}"#.to_string()),
            1 => Just(r#"{"choices":[{"delta":{}}],"timings":{"prompt_n":1,"predicted_n":2}}"#.to_string()),
            1 => Just(r#"{"\u0075sage":{"prompt_tokens":3},"choices":[]}"#.to_string()),
        ];
        let name = prop::sample::select(vec!["", "", "", "error", "message_stop", "ping"]);
        (data, name, prop::bool::weighted(0.05)).prop_map(|(data, name, oversized)| Event {
            name: name.to_string(),
            data,
            oversized,
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5000))]

        /// Whatever the shortcut skips, the parse would have called `Other` with no usage.
        #[test]
        fn a_plain_delta_is_what_the_parse_would_say(ev in chat_event()) {
            for api in [Api::Chat, Api::Completions] {
                prop_assert_eq!(classify(api, &ev), classify_parsed(api, &ev), "{:?}", ev);
            }
        }
    }

    #[test]
    fn the_shortcut_takes_plain_deltas_and_nothing_that_matters() {
        let ev = |data: &str| Event {
            name: String::new(),
            data: data.to_string(),
            oversized: false,
        };
        assert!(plain_delta(&ev(r#"{"choices":[{"delta":{"content":"hi"}}]}"#)));
        for read in [
            r#"{"choices":[],"usage":{"prompt_tokens":1}}"#,
            r#"{"error":{"message":"x"}}"#,
            r#"{"timings":{"prompt_n":1}}"#,
            r#"{"\u0075sage":{"prompt_tokens":1}}"#,
        ] {
            assert!(!plain_delta(&ev(read)), "{read}");
        }
        let named = Event {
            name: "error".into(),
            ..ev("not json")
        };
        assert!(!plain_delta(&named));
    }

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

    /// What the client receives when `stream` arrives in `chunks` pieces split at `cuts`, through `relay`.
    fn relayed(t: &mut StreamTracker, stream: &[u8], splits: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = 0;
        let mut bounds = splits.to_vec();
        bounds.push(stream.len());
        for (n, &b) in bounds.iter().enumerate() {
            let chunk = &stream[at..b];
            let eos = n + 1 == bounds.len();
            out.extend(t.relay(chunk, eos).unwrap_or_else(|| chunk.to_vec()));
            at = b;
        }
        out
    }

    const WITH_USAGE: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n: keepalive\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7}}\n\ndata: [DONE]\n\n";
    const WITHOUT_USAGE: &str =
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n: keepalive\n\ndata: [DONE]\n\n";

    #[test]
    fn a_usage_chunk_split_anywhere_is_still_cut_whole() {
        let stream = WITH_USAGE.as_bytes();
        for a in 1..stream.len() {
            let mut t = StreamTracker::new(Api::Chat, true);
            let out = relayed(&mut t, stream, &[a]);
            assert_eq!(String::from_utf8(out).unwrap(), WITHOUT_USAGE, "split at {a}");
            assert_eq!(t.usage().prompt_tokens, Some(7));
            assert_eq!(t.verdict(), Verdict::Complete);
        }
    }

    #[test]
    fn a_usage_chunk_byte_by_byte_and_in_three_pieces_is_cut() {
        let stream = WITH_USAGE.as_bytes();
        let every: Vec<usize> = (1..stream.len()).collect();
        let mut t = StreamTracker::new(Api::Chat, true);
        assert_eq!(
            String::from_utf8(relayed(&mut t, stream, &every)).unwrap(),
            WITHOUT_USAGE
        );
        let start = WITH_USAGE.find("data: {\"choices\":[]").unwrap();
        let mut t = StreamTracker::new(Api::Chat, true);
        let out = relayed(&mut t, stream, &[start + 3, start + 20, start + 40]);
        assert_eq!(String::from_utf8(out).unwrap(), WITHOUT_USAGE);
    }

    #[test]
    fn relay_holds_only_partial_events_and_nothing_without_stripping() {
        let mut t = StreamTracker::new(Api::Chat, true);
        // A whole event passes at once; half of the next is held until it completes.
        assert_eq!(t.relay(b"data: {\"choices\":[{}]}\n\n", false), None);
        assert_eq!(t.relay(b"data: {\"cho", false), Some(Vec::new()));
        assert_eq!(
            t.relay(b"ices\":[{}]}\n\ndata: [DO", false),
            Some(b"data: {\"choices\":[{}]}\n\n".to_vec())
        );
        // End of stream releases whatever is held.
        assert_eq!(t.relay(b"NE]", true), Some(b"data: [DONE]".to_vec()));
        let mut keep = StreamTracker::new(Api::Chat, false);
        let stream = WITH_USAGE.as_bytes();
        assert_eq!(keep.relay(&stream[..40], false), None);
        assert_eq!(keep.relay(&stream[40..], true), None);
    }

    #[test]
    fn an_event_too_big_to_be_the_usage_chunk_is_not_held() {
        let mut t = StreamTracker::new(Api::Chat, true);
        let big = format!("data: {{\"x\":\"{}", "a".repeat(MAX_HELD));
        assert_eq!(t.relay(big.as_bytes(), false), None);
        assert_eq!(t.relay(b"\"}\n\n", true), None);
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
