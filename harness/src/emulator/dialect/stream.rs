//! What every streamed answer shares: SSE framing, the delta texts, and the plan of a stream.
//!
//! A dialect describes its stream as an [`EventStream`]: a head, one frame per content delta, a tail.
//! [`stream_plan`] lays that out with the chunk delay before each delta, and cuts it short on request.

use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use super::Answer;

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

/// The events of one API's stream. A stream is the head, then one frame per content delta, then the tail.
pub trait EventStream: Sync {
    /// Frames before the first delta.
    fn head(&self, answer: &Answer) -> Vec<Bytes>;
    /// The frame carrying delta `index`.
    fn delta(&self, answer: &Answer, index: u32) -> Bytes;
    /// Frames after the last delta of a stream of `chunks` deltas.
    fn tail(&self, answer: &Answer, chunks: u32) -> Vec<Bytes>;
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

/// A whole stream: its frames in order and whether it ends by aborting the connection instead of finishing.
#[derive(Clone, Debug)]
pub struct StreamPlan {
    pub frames: Vec<Frame>,
    pub abort: bool,
}

/// Plans a stream of `chunks` deltas: the head, the deltas (each after the chunk delay), the tail. With
/// `cut_after`, the plan stops after that many deltas and aborts.
pub fn stream_plan(events: &dyn EventStream, answer: &Answer, chunks: u32, cut_after: Option<u32>) -> StreamPlan {
    let mut frames: Vec<Frame> = events.head(answer).into_iter().map(Frame::now).collect();
    let sent = cut_after.map_or(chunks, |cut| cut.min(chunks));
    frames.extend((0..sent).map(|index| Frame {
        delay: answer.chunk_delay,
        bytes: events.delta(answer, index),
    }));
    if cut_after.is_some() {
        return StreamPlan { frames, abort: true };
    }
    frames.extend(events.tail(answer, chunks).into_iter().map(Frame::now));
    StreamPlan { frames, abort: false }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::testing::answer;
    use super::super::Dialect;
    use super::*;

    #[test]
    fn streamed_text_is_the_deltas() {
        assert_eq!(streamed_text(3), "tok0 tok1 tok2 ");
        assert_eq!(streamed_text(0), "");
    }

    #[test]
    fn every_streaming_dialect_cuts_after_the_deltas_it_sent() {
        for dialect in Dialect::ALL {
            let Some(events) = dialect.events() else {
                continue;
            };
            let head = events.head(&answer()).len();
            let whole = stream_plan(events, &answer(), 3, None);
            assert!(!whole.abort);
            assert_eq!(whole.frames.len(), head + 3 + events.tail(&answer(), 3).len());
            assert_eq!(whole.frames[head].delay, Duration::from_millis(5));
            let cut = stream_plan(events, &answer(), 3, Some(1));
            assert!(cut.abort, "{dialect:?}");
            assert_eq!(cut.frames.len(), head + 1, "{dialect:?}");
            assert_eq!(stream_plan(events, &answer(), 2, Some(9)).frames.len(), head + 2);
        }
    }
}
