//! The plan of a stream: the exact frames a dialect's events make, changed by the per-request stream faults.
//!
//! [`stream_plan`] lays out the head, the deltas (each after the chunk delay), the tail and the terminal event,
//! then applies the [`StreamFaults`]: the line endings, where the stream stops early ([`Stop`]), and the
//! byte-by-byte trickle. The plan also says how the body ends ([`End`]). Every byte is a pure function of the
//! answer and the faults.

use std::time::Duration;

use bytes::Bytes;

use super::{Answer, EventStream};

/// Where a stream stops early. `N` counts content deltas; an `N` past the last delta means all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// N deltas, then the connection aborts: a cut on an event boundary.
    CutAfter(u32),
    /// N deltas, the first half of the next event's bytes, then the connection aborts: a cut inside an event.
    CutMid(u32),
    /// N deltas, the first half of the next event, then a clean end: end of stream with a partial event.
    EndMid(u32),
    /// N deltas, the dialect's error event, then a clean end without the terminal event.
    ErrorAfter(u32),
    /// N deltas, then [`GARBAGE`] (bytes that are no SSE event an API knows), then a clean end without the
    /// terminal event: an engine that lost its mind mid-answer.
    GarbageAfter(u32),
}

/// What a garbage stream sends after its deltas: a `data:` line that is not JSON, a line with control bytes and
/// invalid UTF-8, and a field no SSE reader knows, each ending its event.
pub const GARBAGE: &[u8] =
    b"data: {\"choices\": [{\"delta\": tok\n\n\x00\x01\xff\xfe garbage \x7f\n\nbogus-field: 42\n\n";

impl Stop {
    fn deltas(self) -> u32 {
        match self {
            Stop::CutAfter(n) | Stop::CutMid(n) | Stop::EndMid(n) | Stop::ErrorAfter(n) | Stop::GarbageAfter(n) => n,
        }
    }
}

/// The line ending of every SSE line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LineEnding {
    #[default]
    Lf,
    CrLf,
    Cr,
}

impl LineEnding {
    /// `lf`, `crlf` or `cr`, in any case.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "lf" => Some(LineEnding::Lf),
            "crlf" => Some(LineEnding::CrLf),
            "cr" => Some(LineEnding::Cr),
            _ => None,
        }
    }

    /// The frame with each `\n` replaced. Event payloads are compact JSON, so every `\n` ends a line.
    fn apply(self, bytes: Bytes) -> Bytes {
        let ending: &[u8] = match self {
            LineEnding::Lf => return bytes,
            LineEnding::CrLf => b"\r\n",
            LineEnding::Cr => b"\r",
        };
        let mut out = Vec::with_capacity(bytes.len() + 16);
        for &byte in bytes.iter() {
            match byte {
                b'\n' => out.extend_from_slice(ending),
                other => out.push(other),
            }
        }
        Bytes::from(out)
    }
}

/// How one request's stream differs from a whole, well-formed one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamFaults {
    /// Content deltas in the stream.
    pub chunks: u32,
    /// Where the stream stops early, if it does.
    pub stop: Option<Stop>,
    /// Leave out the terminal event; the body still ends cleanly.
    pub no_terminal: bool,
    pub line_ending: LineEnding,
    /// Send every byte as its own frame, this long after the one before.
    pub trickle: Option<Duration>,
    /// Send nothing after the response head, and never end the body.
    pub stall: bool,
}

impl StreamFaults {
    /// A whole stream of `chunks` deltas.
    pub fn new(chunks: u32) -> Self {
        StreamFaults {
            chunks,
            stop: None,
            no_terminal: false,
            line_ending: LineEnding::Lf,
            trickle: None,
            stall: false,
        }
    }
}

/// One frame of a stream (one body chunk) and how long to wait before sending it.
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

    /// The first half of the frame's bytes, after the same delay.
    fn first_half(self) -> Self {
        let half = self.bytes.len() / 2;
        Frame {
            delay: self.delay,
            bytes: self.bytes.slice(..half),
        }
    }
}

/// How a body ends after its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// A clean end of the body (the terminating chunk, or the close of a close-delimited body).
    Finish,
    /// The body fails and the connection aborts.
    Abort,
    /// The body never ends (until the emulator stops, which aborts it).
    Stall,
}

/// A whole stream: its frames in order and how it ends.
#[derive(Clone, Debug)]
pub struct StreamPlan {
    pub frames: Vec<Frame>,
    pub end: End,
}

#[cfg(test)]
impl StreamPlan {
    /// Every byte of the body, in order.
    pub fn bytes(&self) -> Vec<u8> {
        self.frames
            .iter()
            .flat_map(|frame| frame.bytes.iter().copied())
            .collect()
    }
}

/// Plans one stream of `events` for `answer`, with `faults` applied.
pub fn stream_plan(events: &dyn EventStream, answer: &Answer, faults: &StreamFaults) -> StreamPlan {
    if faults.stall {
        return StreamPlan {
            frames: Vec::new(),
            end: End::Stall,
        };
    }
    let chunks = faults.chunks;
    let mut frames: Vec<Frame> = events.head(answer).into_iter().map(Frame::now).collect();
    let first_delta = frames.len();
    frames.extend((0..chunks).map(|index| Frame {
        delay: answer.chunk_delay,
        bytes: events.delta(answer, index),
    }));
    frames.extend(events.tail(answer, chunks).into_iter().map(Frame::now));
    if !faults.no_terminal {
        frames.push(Frame::now(events.terminal(answer, chunks)));
    }
    let ending = faults.line_ending;
    for frame in &mut frames {
        frame.bytes = ending.apply(std::mem::take(&mut frame.bytes));
    }
    let mut end = End::Finish;
    if let Some(stop) = faults.stop {
        let deltas = stop.deltas().min(chunks);
        let mut rest = frames.split_off(first_delta + deltas as usize).into_iter();
        match stop {
            Stop::CutAfter(_) => end = End::Abort,
            Stop::ErrorAfter(_) => frames.push(Frame::now(ending.apply(events.error(answer, deltas)))),
            Stop::GarbageAfter(_) => frames.push(Frame::now(Bytes::from_static(GARBAGE))),
            Stop::CutMid(_) | Stop::EndMid(_) => {
                frames.extend(rest.next().map(Frame::first_half));
                if matches!(stop, Stop::CutMid(_)) {
                    end = End::Abort;
                }
            }
        }
    }
    if let Some(gap) = faults.trickle {
        frames = trickle(frames, gap);
    }
    StreamPlan { frames, end }
}

/// One frame per byte: each `gap` after the one before, plus the delay of the frame it came from.
fn trickle(frames: Vec<Frame>, gap: Duration) -> Vec<Frame> {
    let mut out: Vec<Frame> = Vec::with_capacity(frames.iter().map(|frame| frame.bytes.len()).sum());
    for frame in frames {
        let mut delay = frame.delay;
        for at in 0..frame.bytes.len() {
            let gap = if out.is_empty() { Duration::ZERO } else { gap };
            out.push(Frame {
                delay: delay + gap,
                bytes: frame.bytes.slice(at..=at),
            });
            delay = Duration::ZERO;
        }
    }
    out
}
