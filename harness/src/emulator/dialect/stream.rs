//! What every streamed answer shares: SSE framing, the delta texts, and the events a dialect streams.
//!
//! A dialect describes its stream as an [`EventStream`]: a head, one frame per content delta, a tail, the
//! terminal event, and the error event it sends when the engine fails mid-stream. `plan` lays the events out
//! and applies the per-request stream faults.

use bytes::Bytes;
use serde_json::Value;

use super::Answer;

/// Message of every emulated mid-stream engine error.
pub const STREAM_ERROR_MESSAGE: &str = "engine failure";

/// The mid-stream error event of the OpenAI-style streams (chat, completions), in OpenAI's key order.
pub const OPENAI_ERROR_EVENT: &[u8] =
    b"data: {\"error\":{\"message\":\"engine failure\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n";

/// The text of content delta `index`.
pub fn delta_text(index: u32) -> String {
    format!("tok{index} ")
}

/// The whole text of a stream of `chunks` deltas.
pub fn streamed_text(chunks: u32) -> String {
    (0..chunks).map(delta_text).collect()
}

/// `base` (an object) with the fields of `extra` (an object) added.
pub(super) fn with_fields(mut base: Value, extra: Value) -> Value {
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

/// `data: <json>\n\n`
pub fn data_event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// `event: <name>\ndata: <json>\n\n`
pub fn named_event(name: &str, value: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {value}\n\n"))
}

/// The events of one API's stream, each framed with `\n` line endings. A whole stream is the head, one frame
/// per content delta, the tail, then the terminal event.
pub trait EventStream: Sync {
    /// Frames before the first delta.
    fn head(&self, answer: &Answer) -> Vec<Bytes>;
    /// The frame carrying delta `index`.
    fn delta(&self, answer: &Answer, index: u32) -> Bytes;
    /// Frames after the last delta of a stream of `chunks` deltas, up to the terminal event.
    fn tail(&self, answer: &Answer, chunks: u32) -> Vec<Bytes>;
    /// The event that tells the client a stream of `chunks` deltas is complete.
    fn terminal(&self, answer: &Answer, chunks: u32) -> Bytes;
    /// The error event an engine that fails after `deltas` deltas sends instead of the rest of the stream.
    fn error(&self, answer: &Answer, deltas: u32) -> Bytes;
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn streamed_text_is_the_deltas() {
        assert_eq!(streamed_text(3), "tok0 tok1 tok2 ");
        assert_eq!(streamed_text(0), "");
    }

    #[test]
    fn the_openai_error_event_is_one_json_event() {
        let text = std::str::from_utf8(OPENAI_ERROR_EVENT).unwrap();
        let data: Value = serde_json::from_str(text.strip_prefix("data: ").unwrap().trim_end()).unwrap();
        assert_eq!(data["error"]["message"], STREAM_ERROR_MESSAGE);
        assert_eq!(data["error"]["type"], "server_error");
        assert!(text.ends_with("}}\n\n"));
    }
}
