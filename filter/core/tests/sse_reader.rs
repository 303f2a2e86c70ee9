//! The SSE reader (`stream::sse::SseReader`, which finds line ends with `memchr` and reads a whole line where it
//! lies) against its definition, the byte-at-a-time reader it replaced (below): on random streams of SSE lines,
//! fields, comments, every line ending (LF, CRLF, a lone CR, a CR and LF split across chunks), bytes outside
//! UTF-8 and lines over the bound, cut into random chunks, the two must give the same events with the same spans,
//! and the same state after every chunk.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::stream::sse::{Event, SseReader};
use proptest::prelude::*;

/// The definition: one byte at a time.
struct Reference {
    line: Vec<u8>,
    pending_cr: bool,
    current: Event,
    in_event: bool,
    start: u64,
    fed: u64,
    at_boundary: bool,
    line_overflow: bool,
    max_event: usize,
}

impl Reference {
    fn new(max_event: usize) -> Self {
        Reference {
            line: Vec::new(),
            pending_cr: false,
            current: Event::default(),
            in_event: false,
            start: 0,
            fed: 0,
            at_boundary: true,
            line_overflow: false,
            max_event,
        }
    }

    fn feed_spans(&mut self, bytes: &[u8], on_event: &mut impl FnMut(Event, (u64, u64))) {
        let base = self.fed;
        self.fed = base + bytes.len() as u64;
        for (i, &b) in bytes.iter().enumerate() {
            let at = base + i as u64;
            if self.pending_cr {
                self.pending_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            if self.at_boundary && b != b'\n' && b != b'\r' {
                self.at_boundary = false;
                self.start = at;
            }
            match b {
                b'\n' => self.end_line(at + 1, on_event),
                b'\r' => {
                    let end = if bytes.get(i + 1) == Some(&b'\n') {
                        at + 2
                    } else {
                        at + 1
                    };
                    self.pending_cr = true;
                    self.end_line(end, on_event);
                }
                _ => {
                    if self.line.len() < self.max_event {
                        self.line.push(b);
                    } else {
                        self.line_overflow = true;
                    }
                }
            }
        }
    }

    fn end_line(&mut self, end: u64, on_event: &mut impl FnMut(Event, (u64, u64))) {
        let line = std::mem::take(&mut self.line);
        let overflow = std::mem::take(&mut self.line_overflow);
        if line.is_empty() {
            if self.in_event {
                self.in_event = false;
                on_event(std::mem::take(&mut self.current), (self.start, end));
            }
            self.at_boundary = true;
            return;
        }
        if line[0] == b':' && !self.in_event {
            self.at_boundary = true;
            return;
        }
        if line[0] == b':' {
            return;
        }
        self.in_event = true;
        let text = String::from_utf8_lossy(&line);
        let (field, value) = match text.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (text.as_ref(), ""),
        };
        match field {
            "event" => self.current.name = value.to_string(),
            "data" if overflow => {
                self.current.oversized = true;
                self.current.data.clear();
            }
            "data" => {
                let ev = &mut self.current;
                if ev.oversized {
                    return;
                }
                if ev.data.len() + value.len() + 1 > self.max_event {
                    ev.oversized = true;
                    ev.data.clear();
                    return;
                }
                if !ev.data.is_empty() {
                    ev.data.push('\n');
                }
                ev.data.push_str(value);
            }
            _ => {}
        }
    }

    /// The state the reader exposes: (pending start, fed, mid event, mid line, after CR).
    fn state(&self) -> (Option<u64>, u64, bool, bool, bool) {
        (
            (!self.at_boundary).then_some(self.start),
            self.fed,
            self.in_event || !self.line.is_empty(),
            !self.line.is_empty(),
            self.pending_cr,
        )
    }
}

fn state(r: &SseReader) -> (Option<u64>, u64, bool, bool, bool) {
    (r.pending_start(), r.fed(), r.mid_event(), r.mid_line(), r.after_cr())
}

/// Pieces SSE streams are made of, line endings and awkward bytes included.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => Just(b"data: ".to_vec()),
        1 => Just(b"data:".to_vec()),
        1 => Just(b"event: message_stop".to_vec()),
        1 => Just(b"id: 7".to_vec()),
        1 => Just(b": keepalive".to_vec()),
        1 => Just(b":".to_vec()),
        3 => Just(b"\n".to_vec()),
        2 => Just(b"\r\n".to_vec()),
        1 => Just(b"\r".to_vec()),
        1 => Just(b"\n\n".to_vec()),
        2 => Just(br#"{"choices":[{"delta":{"content":"hi"}}]}"#.to_vec()),
        1 => Just("é 中".as_bytes().to_vec()),
        1 => Just(vec![0xff, 0xc3]),
        2 => "[a-z :]{0,40}".prop_map(String::into_bytes),
        1 => "[a-z]{60,200}".prop_map(String::into_bytes),
    ]
}

fn stream_and_cuts() -> impl Strategy<Value = (Vec<u8>, Vec<usize>)> {
    prop::collection::vec(piece(), 0..40).prop_flat_map(|pieces| {
        let stream: Vec<u8> = pieces.concat();
        let len = stream.len();
        (Just(stream), prop::collection::vec(0..=len, 0..12))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn the_reader_is_its_byte_at_a_time_definition(
        (stream, mut cuts) in stream_and_cuts(),
        max_event in prop::sample::select(vec![0usize, 1, 5, 16, 64, 1 << 20]),
    ) {
        cuts.push(0);
        cuts.push(stream.len());
        cuts.sort_unstable();
        let (mut fast, mut slow) = (SseReader::new(max_event), Reference::new(max_event));
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for pair in cuts.windows(2) {
            let chunk = &stream[pair[0]..pair[1]];
            fast.feed_spans(chunk, |e, s| got.push((e, s)));
            slow.feed_spans(chunk, &mut |e, s| want.push((e, s)));
            prop_assert_eq!(&got, &want, "after bytes {}..{}", pair[0], pair[1]);
            prop_assert_eq!(state(&fast), slow.state(), "after bytes {}..{}", pair[0], pair[1]);
        }
    }
}

#[test]
fn line_endings_split_across_chunks_read_as_whole() {
    // A CR that ends a chunk ends its line there (a span runs through it); the LF that starts the next chunk
    // belongs to it and starts nothing. A CR followed by a CR is two line endings.
    let mut r = SseReader::new(1 << 20);
    let mut got = Vec::new();
    for chunk in [&b"data: a\r"[..], b"\n\r", b"\ndata: b\r\r", b""] {
        r.feed_spans(chunk, |e, s| got.push((e.data, s)));
    }
    assert_eq!(got, vec![("a".to_string(), (0, 10)), ("b".to_string(), (11, 20))]);
    assert!(
        r.after_cr(),
        "the last byte read was a CR: an LF that follows is its line ending's"
    );
    assert!(!r.mid_event());
}
