//! What one request ended as, seen from the client: the first invariant of a chaos run is that every request
//! ends as exactly one of the well-formed [`Outcome`]s. The classification is a pure function of what the client
//! read, tested here without a socket.

use serde_json::Value;

/// How one request ended, from the client's side.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// A 200: non-streamed, a valid JSON answer; streamed, the terminal event and no error event.
    Complete,
    /// A 4xx or 5xx whose body is a JSON error envelope, with a request id in the body or in `x-request-id`.
    ErrorEnvelope,
    /// A 200 stream that ended with an error event (the engine's, or the one the filter closes a broken stream
    /// with).
    StreamErrorEvent,
    /// A 200 stream whose connection broke: the filter can only count it (`llmroute_stream_outcomes_total{outcome="upstream_cut"}`).
    StreamCut,
    /// Anything else: the invariant fails. The text says what was wrong.
    Malformed(String),
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::ErrorEnvelope => "error_envelope",
            Outcome::StreamErrorEvent => "stream_error_event",
            Outcome::StreamCut => "stream_cut",
            Outcome::Malformed(_) => "malformed",
        }
    }

    /// Whether the client saw a 200 head.
    pub fn had_200_head(&self) -> bool {
        matches!(self, Outcome::Complete | Outcome::StreamErrorEvent | Outcome::StreamCut)
    }
}

/// What the client read of one response.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// `None`: no response head arrived (a transport error first).
    pub status: Option<u16>,
    pub content_type: String,
    /// `x-request-id` of the response.
    pub request_id: Option<String>,
    pub body: Vec<u8>,
    /// The body ended with a transport error.
    pub body_failed: bool,
    /// The request asked for a stream.
    pub streamed: bool,
    /// The request was an Anthropic Messages one (`/v1/messages`).
    pub anthropic: bool,
}

/// Whether a 4xx or 5xx answer is well formed: only the API's JSON error envelope is. Envoy's own local replies
/// (`upstream connect error ...`, `no healthy upstream`, ...) are rewritten into it by the connection manager's
/// `local_reply_config`, so a plain-text one fails the chaos run.
pub fn well_formed_error(seen: &Seen) -> bool {
    is_envelope(seen)
}

/// A JSON error envelope (OpenAI's `{"error": {...}}` or Anthropic's `{"type": "error", "error": {...}}`) that
/// carries a request id, in the body or in the `x-request-id` header.
fn is_envelope(seen: &Seen) -> bool {
    if seen.body_failed || !seen.content_type.starts_with("application/json") {
        return false;
    }
    let Ok(doc) = serde_json::from_slice::<Value>(&seen.body) else {
        return false;
    };
    let error = doc.get("error").filter(|e| e.is_object());
    let has_message = error.and_then(|e| e.get("message")).is_some_and(Value::is_string);
    let body_id = doc
        .get("request_id")
        .and_then(Value::as_str)
        .is_some_and(|id| !id.is_empty());
    let header_id = seen.request_id.as_deref().is_some_and(|id| !id.is_empty());
    has_message && (body_id || header_id)
}

/// Classifies one response.
pub fn classify(seen: &Seen) -> Outcome {
    let Some(status) = seen.status else {
        return Outcome::Malformed("no response head (transport error)".into());
    };
    if status >= 400 {
        if well_formed_error(seen) {
            return Outcome::ErrorEnvelope;
        }
        return Outcome::Malformed(format!(
            "status {status} without an error envelope: {}",
            snippet(&seen.body)
        ));
    }
    if status != 200 {
        return Outcome::Malformed(format!("status {status}"));
    }
    if !seen.streamed {
        if seen.body_failed {
            return Outcome::Malformed("a non-streamed 200 whose body broke".into());
        }
        return match serde_json::from_slice::<Value>(&seen.body) {
            Ok(doc) if doc.get("choices").is_some() || doc.get("content").is_some() => Outcome::Complete,
            _ => Outcome::Malformed(format!("a 200 that is not an answer: {}", snippet(&seen.body))),
        };
    }
    if !seen.content_type.starts_with("text/event-stream") {
        return Outcome::Malformed(format!("a stream answered as {:?}", seen.content_type));
    }
    if seen.body_failed {
        return Outcome::StreamCut;
    }
    let events = Events::read(&seen.body, seen.anthropic);
    if events.error {
        Outcome::StreamErrorEvent
    } else if events.terminal {
        Outcome::Complete
    } else {
        Outcome::Malformed("a stream that ended without its terminal event or an error event".into())
    }
}

/// What a stream's events say.
struct Events {
    terminal: bool,
    error: bool,
}

impl Events {
    /// Reads SSE events (blank-line separated; `\r\n` taken as `\n`): OpenAI's terminal is `data: [DONE]`, its
    /// error a `data:` object with `error`; Anthropic's are `message_stop` and `error` events.
    fn read(body: &[u8], anthropic: bool) -> Events {
        let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
        let mut events = Events {
            terminal: false,
            error: false,
        };
        for event in text.split("\n\n") {
            let name = event.lines().find_map(|l| l.strip_prefix("event:")).map(str::trim);
            let data = event.lines().find_map(|l| l.strip_prefix("data:")).map(str::trim);
            let doc = data.and_then(|d| serde_json::from_str::<Value>(d).ok());
            let kind = doc.as_ref().and_then(|d| d.get("type")).and_then(Value::as_str);
            if anthropic {
                events.terminal |= name == Some("message_stop") || kind == Some("message_stop");
                events.error |= name == Some("error") || kind == Some("error");
            } else {
                events.terminal |= data == Some("[DONE]");
                events.error |= doc.as_ref().is_some_and(|d| d.get("error").is_some());
            }
        }
        events
    }
}

fn snippet(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn seen(status: u16, content_type: &str, body: &str) -> Seen {
        Seen {
            status: Some(status),
            content_type: content_type.into(),
            request_id: Some("rid".into()),
            body: body.as_bytes().to_vec(),
            ..Seen::default()
        }
    }

    fn stream(body: &str, anthropic: bool) -> Seen {
        Seen {
            streamed: true,
            anthropic,
            ..seen(200, "text/event-stream", body)
        }
    }

    #[test]
    fn answers_and_streams() {
        assert_eq!(
            classify(&seen(200, "application/json", r#"{"choices":[]}"#)),
            Outcome::Complete
        );
        assert_eq!(
            classify(&seen(200, "application/json", r#"{"content":[]}"#)),
            Outcome::Complete
        );
        assert!(matches!(
            classify(&seen(200, "application/json", "{not")),
            Outcome::Malformed(_)
        ));
        let done = "data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        assert_eq!(classify(&stream(done, false)), Outcome::Complete);
        let closed = "data: {\"choices\":[]}\n\ndata: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\n";
        assert_eq!(classify(&stream(closed, false)), Outcome::StreamErrorEvent);
        let open = "data: {\"choices\":[]}\n\n";
        assert!(matches!(classify(&stream(open, false)), Outcome::Malformed(_)));
        let stop = "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        assert_eq!(classify(&stream(stop, true)), Outcome::Complete);
        let err = "event: error\ndata: {\"type\":\"error\",\"error\":{\"message\":\"x\"}}\n\n";
        assert_eq!(classify(&stream(err, true)), Outcome::StreamErrorEvent);
        let cut = Seen {
            body_failed: true,
            ..stream(open, false)
        };
        assert_eq!(classify(&cut), Outcome::StreamCut);
        assert!(matches!(classify(&Seen::default()), Outcome::Malformed(_)));
    }

    #[test]
    fn errors_need_an_envelope_and_a_request_id() {
        let body = r#"{"error":{"message":"m","type":"server_error"}}"#;
        assert_eq!(classify(&seen(500, "application/json", body)), Outcome::ErrorEnvelope);
        let no_id = Seen {
            request_id: None,
            ..seen(500, "application/json", body)
        };
        assert!(matches!(classify(&no_id), Outcome::Malformed(_)));
        let in_body = Seen {
            request_id: None,
            ..seen(503, "application/json", r#"{"error":{"message":"m"},"request_id":"r"}"#)
        };
        assert_eq!(classify(&in_body), Outcome::ErrorEnvelope);
        let text = seen(
            503,
            "text/plain",
            "upstream connect error or disconnect/reset before headers",
        );
        assert!(
            matches!(classify(&text), Outcome::Malformed(_)),
            "plain text is not an envelope"
        );
        assert!(matches!(
            classify(&seen(502, "text/html", "<html>")),
            Outcome::Malformed(_)
        ));
        assert!(matches!(
            classify(&seen(500, "application/json", "{}")),
            Outcome::Malformed(_)
        ));
    }
}
