//! An incremental Server-Sent Events reader that never holds the stream.
//!
//! The filter relays every byte as it arrives; this reader only watches a copy. It splits lines on LF, CRLF or a
//! lone CR (a CR at the end of a chunk waits for the next byte to tell CR from CRLF), keeps the `event:` name and
//! the `data:` lines of the current event, and yields the event at its blank line. Comment lines (`:`) and other
//! fields are ignored. Memory is bounded: an event whose data exceeds `max_event` bytes is still tracked (so the
//! reader knows where events end) but its data is dropped and it is marked oversized.

/// One complete event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    /// The `event:` field, empty when absent.
    pub name: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// True when the data was over the bound and dropped.
    pub oversized: bool,
}

/// Feeds bytes, yields complete events.
#[derive(Debug, Default)]
pub struct SseReader {
    line: Vec<u8>,
    /// The previous chunk ended with CR: a following LF belongs to it.
    pending_cr: bool,
    current: Event,
    /// Some field line of the current event has been seen (so a blank line ends an event).
    in_event: bool,
    /// Where the current event (or its first line) began, as an offset in the whole stream.
    start: u64,
    /// Bytes fed before the chunk being fed: the stream offset of its first byte.
    fed: u64,
    /// True while nothing of a new event or line has been read since the last event boundary.
    at_boundary: bool,
    /// The current line grew past the bound; its tail was dropped.
    line_overflow: bool,
    max_event: usize,
}

impl SseReader {
    pub fn new(max_event: usize) -> Self {
        SseReader {
            max_event,
            at_boundary: true,
            ..SseReader::default()
        }
    }

    /// Reads `bytes` and calls `on_event` for each event completed by them, with the event's byte range in
    /// `bytes` (from its first byte through its blank line) when the whole event lies in this chunk.
    pub fn feed(&mut self, bytes: &[u8], mut on_event: impl FnMut(Event, Option<(usize, usize)>)) {
        let base = self.fed;
        self.feed_spans(bytes, |ev, (start, end)| {
            let span = match (start.checked_sub(base), end.checked_sub(base)) {
                (Some(a), Some(b)) => usize::try_from(a).ok().zip(usize::try_from(b).ok()),
                _ => None,
            };
            on_event(ev, span)
        });
    }

    /// Like [`SseReader::feed`], but every event comes with its range in the whole stream (offsets counted from
    /// the first byte ever fed), wherever it began.
    ///
    /// Line ends are found with `memchr` (SIMD128 in the filter's build), not byte by byte: a line that lies
    /// wholly in `bytes` is read where it is, and only the unfinished line at the end of a chunk is copied, to be
    /// completed by the next. The result is the byte-at-a-time reader's, event for event and span for span
    /// (`filter/core/tests/sse_reader.rs` holds it to that definition on random streams and splits).
    pub fn feed_spans(&mut self, bytes: &[u8], mut on_event: impl FnMut(Event, (u64, u64))) {
        let base = self.fed;
        self.fed = base.saturating_add(bytes.len() as u64);
        let mut rest = bytes;
        // Stream offsets saturate like `fed` above: a stream of 2^64 bytes is not one to count exactly.
        let mut at = base;
        if self.pending_cr && !rest.is_empty() {
            self.pending_cr = false;
            if let Some(after) = rest.strip_prefix(b"\n") {
                rest = after;
                at = at.saturating_add(1);
            }
        }
        while !rest.is_empty() {
            let stop = memchr::memchr2(b'\n', b'\r', rest);
            let (text, ending) = match stop {
                Some(i) => rest.split_at(i),
                None => (rest, &[][..]),
            };
            if self.at_boundary && !text.is_empty() {
                self.at_boundary = false;
                self.start = at;
            }
            let after_text = at.saturating_add(text.len() as u64);
            match ending {
                [] => {
                    self.keep(text);
                    return;
                }
                [b'\n', ..] => {
                    self.end_line(text, after_text.saturating_add(1), &mut on_event);
                    rest = ending.get(1..).unwrap_or_default();
                    at = after_text.saturating_add(1);
                }
                _ => {
                    // CR: with an LF right after it in this chunk, one line ending of two bytes; at the end of the
                    // chunk, the next chunk's first byte decides (see `pending_cr`).
                    let crlf = ending.get(1) == Some(&b'\n');
                    let end = after_text.saturating_add(if crlf { 2 } else { 1 });
                    self.end_line(text, end, &mut on_event);
                    match (crlf, ending.len()) {
                        (true, _) => {
                            rest = ending.get(2..).unwrap_or_default();
                            at = end;
                        }
                        (false, 1) => {
                            self.pending_cr = true;
                            return;
                        }
                        (false, _) => {
                            rest = ending.get(1..).unwrap_or_default();
                            at = end;
                        }
                    }
                }
            }
        }
    }

    /// Keeps the start of an unfinished line, up to the bound; past it the line's tail is dropped and marked.
    fn keep(&mut self, text: &[u8]) {
        let room = self.max_event.saturating_sub(self.line.len());
        let kept = text.get(..room).unwrap_or(text);
        self.line.extend_from_slice(kept);
        if kept.len() < text.len() {
            self.line_overflow = true;
        }
    }

    /// Where the unfinished event (or comment line) began, as a stream offset; `None` at an event boundary.
    pub fn pending_start(&self) -> Option<u64> {
        (!self.at_boundary).then_some(self.start)
    }

    /// Bytes fed so far.
    pub fn fed(&self) -> u64 {
        self.fed
    }

    /// True when bytes of an unfinished event (or line) have been read: the stream stopped inside an event.
    pub fn mid_event(&self) -> bool {
        self.in_event || !self.line.is_empty()
    }

    /// True when the last line is unfinished (no line ending yet).
    pub fn mid_line(&self) -> bool {
        !self.line.is_empty()
    }

    /// True when the last byte read was a CR: a client takes an LF that follows as part of that line ending.
    pub fn after_cr(&self) -> bool {
        self.pending_cr
    }

    /// Ends a line whose last bytes are `text` (the first ones, if any, kept from earlier chunks); `end` is the
    /// stream offset just past its line ending.
    fn end_line(&mut self, text: &[u8], end: u64, on_event: &mut impl FnMut(Event, (u64, u64))) {
        if self.line.is_empty() {
            // (A line can be marked with nothing kept only when the bound is 0.)
            let overflow = std::mem::take(&mut self.line_overflow) || text.len() > self.max_event;
            let line = text.get(..self.max_event).unwrap_or(text);
            return self.read_line(line, overflow, end, on_event);
        }
        self.keep(text);
        let line = std::mem::take(&mut self.line);
        let overflow = std::mem::take(&mut self.line_overflow);
        self.read_line(&line, overflow, end, on_event);
        // The buffer's capacity serves the next unfinished line.
        self.line = line;
        self.line.clear();
    }

    /// Reads one whole line (at most `max_event` bytes of it; `overflow` when more were dropped).
    fn read_line(&mut self, line: &[u8], overflow: bool, end: u64, on_event: &mut impl FnMut(Event, (u64, u64))) {
        if line.is_empty() {
            if self.in_event {
                self.in_event = false;
                on_event(std::mem::take(&mut self.current), (self.start, end));
            }
            self.at_boundary = true;
            return;
        }
        if line.first() == Some(&b':') && !self.in_event {
            self.at_boundary = true; // a comment between events, such as a keepalive
            return;
        }
        if line.first() == Some(&b':') {
            return;
        }
        self.in_event = true;
        let text = match std::str::from_utf8(line) {
            Ok(t) => std::borrow::Cow::Borrowed(t),
            Err(_) => String::from_utf8_lossy(line),
        };
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
            "data" => self.push_data(value),
            _ => {}
        }
    }

    fn push_data(&mut self, value: &str) {
        let ev = &mut self.current;
        if ev.oversized {
            return;
        }
        if ev.data.len().saturating_add(value.len()).saturating_add(1) > self.max_event {
            ev.oversized = true;
            ev.data.clear();
            return;
        }
        if !ev.data.is_empty() {
            ev.data.push('\n');
        }
        ev.data.push_str(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> Vec<Event> {
        let mut r = SseReader::new(1 << 20);
        let mut out = Vec::new();
        for c in chunks {
            r.feed(c, |e, _| out.push(e));
        }
        out
    }

    #[test]
    fn lf_crlf_and_cr_endings_give_the_same_events() {
        for sep in ["\n", "\r\n", "\r"] {
            let text = format!("event: a{sep}data: 1{sep}{sep}: keepalive{sep}{sep}data: x{sep}data: y{sep}{sep}");
            let ev = events(&[text.as_bytes()]);
            assert_eq!(ev.len(), 2, "{sep:?}");
            assert_eq!((ev[0].name.as_str(), ev[0].data.as_str()), ("a", "1"));
            assert_eq!(ev[1].data, "x\ny");
        }
    }

    #[test]
    fn events_split_across_chunks_and_crlf_split_between_chunks() {
        let ev = events(&[b"data: {\"a\":", b"1}\r", b"\n\r", b"\n"]);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].data, "{\"a\":1}");
    }

    #[test]
    fn byte_by_byte_is_the_same() {
        let text = b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let chunks: Vec<&[u8]> = text.chunks(1).collect();
        let ev = events(&chunks);
        assert_eq!(ev[0].name, "message_stop");
    }

    #[test]
    fn mid_event_state() {
        let mut r = SseReader::new(1024);
        r.feed(b"data: 1\n\n", |_, _| {});
        assert!(!r.mid_event());
        r.feed(b"event: x\n", |_, _| {});
        assert!(r.mid_event() && !r.mid_line());
        r.feed(b"data: {\"ty", |_, _| {});
        assert!(r.mid_event() && r.mid_line());
    }

    #[test]
    fn spans_cover_whole_events_within_a_chunk() {
        let chunk = b": keepalive\n\ndata: a\n\nevent: x\r\ndata: b\r\n\r\ndata: c";
        let mut r = SseReader::new(1024);
        let mut spans = Vec::new();
        r.feed(chunk, |e, s| spans.push((e.data, s)));
        assert_eq!(spans.len(), 2);
        let (a, b) = (spans[0].1.unwrap(), spans[1].1.unwrap());
        assert_eq!(&chunk[a.0..a.1], b"data: a\n\n");
        assert_eq!(&chunk[b.0..b.1], b"event: x\r\ndata: b\r\n\r\n");
        let mut later = Vec::new();
        r.feed(b"\n\n", |e, s| later.push((e.data, s)));
        assert_eq!(
            later,
            vec![("c".to_string(), None)],
            "an event begun in an earlier chunk has no span"
        );
    }

    #[test]
    fn comments_alone_are_not_events() {
        assert!(events(&[b": ping\n\n: keepalive\n\n"]).is_empty());
    }

    #[test]
    fn oversized_events_are_marked_and_bounded() {
        let mut r = SseReader::new(16);
        let mut out = Vec::new();
        r.feed(b"data: 0123456789abcdefghij\n\ndata: ok\n\n", |e, _| out.push(e));
        assert!(out[0].oversized && out[0].data.is_empty());
        assert_eq!(out[1].data, "ok");
    }
}
