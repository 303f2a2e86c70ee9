//! The message index: where each message of the top-level `messages` array keeps its `role` and its `content`,
//! recorded by the one validating pass, so the content key reads them without walking the array again.
//!
//! Why: to find a message's `role` by walking, the walk must step over every value before it in the message,
//! and to reach the next message it must step over the whole message. A chat body whose members come in
//! alphabetical order (`content` before `role`, as serde_json writes them) had its user message, most of a
//! large body, stepped over twice after the scan had already crossed it. The scanner knows every span as it
//! goes; this listener ([`Visit`]) keeps the few the content key needs, in a fixed array: no allocation.
//!
//! What it keeps, for the first [`MAX_MESSAGES`] elements of the first top-level array whose key is exactly
//! `"messages"` as written: whether the element is an object, and the span of the value of its first `role`
//! and first `content` member (the members [`crate::json::nav::get`] would find). Anything the index cannot
//! answer as a walk would leaves it unused, and the reader walks: a key written with an escape inside a message
//! (the walk decodes keys), a `messages` key written with an escape (the index then covers no array the fields
//! name). Past [`MAX_MESSAGES`] elements the reader walks on from the array's start.
//!
//! The property test `filter/core/tests/message_index.rs` holds every read through the index to the walk's.

use crate::json::{nav, Span, Visit};

/// Messages indexed; a longer array's later messages are found by walking.
pub const MAX_MESSAGES: usize = 32;

/// Depths as the scanner nests them: the body's object is 1, the `messages` array 2, a message 3.
const TOP: usize = 1;
const ARRAY: usize = 2;
const MESSAGE: usize = 3;

/// What the index knows of one message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Entry {
    /// The element is an object (only objects have a role).
    pub object: bool,
    /// The value of its first `role` member.
    pub role: Option<Span>,
    /// The value of its first `content` member.
    pub content: Option<Span>,
}

/// The member whose value is being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Role,
    Content,
}

/// The listener and its result.
#[derive(Debug, Clone)]
pub struct MessageIndex<'b> {
    /// The body the scan runs over, to read keys.
    buf: &'b [u8],
    /// Where the indexed array starts (its `[`), once it has opened.
    array: Option<usize>,
    entries: [Entry; MAX_MESSAGES],
    len: usize,
    /// More elements than [`MAX_MESSAGES`].
    overflow: bool,
    /// False once something was met that only a walk reads right.
    usable: bool,
    depth: usize,
    /// The last top-level key was `"messages"` and no array is indexed yet.
    armed: bool,
    /// Inside the indexed array.
    inside: bool,
    /// The message member whose value is being read, and where it started.
    reading: Option<(Field, usize)>,
    /// The message member whose value comes next.
    next_field: Option<Field>,
}

impl<'b> MessageIndex<'b> {
    /// An empty index, for a scan of `buf`.
    pub fn new(buf: &'b [u8]) -> Self {
        MessageIndex {
            buf,
            array: None,
            entries: [Entry::default(); MAX_MESSAGES],
            len: 0,
            overflow: false,
            usable: true,
            depth: 0,
            armed: false,
            inside: false,
            reading: None,
            next_field: None,
        }
    }
}

/// What the index answers for an array: its messages in order, and whether later ones exist unindexed.
pub struct Indexed<'a> {
    pub entries: &'a [Entry],
    pub overflow: bool,
}

impl MessageIndex<'_> {
    /// The indexed messages of the array in `span`, when the index covers exactly that array.
    pub fn of(&self, span: Span) -> Option<Indexed<'_>> {
        if !self.usable || self.array != Some(span.start) {
            return None;
        }
        Some(Indexed {
            entries: self.entries.get(..self.len).unwrap_or_default(),
            overflow: self.overflow,
        })
    }

    fn current(&mut self) -> Option<&mut Entry> {
        self.entries.get_mut(self.len.checked_sub(1)?)
    }

    /// Ends the value being read at `end`; a scalar (`None`: no event marks its end) is stepped over, a few bytes.
    fn finish_reading(&mut self, end: Option<usize>) {
        let Some((field, start)) = self.reading.take() else {
            return;
        };
        let span = Span {
            start,
            end: end.unwrap_or_else(|| nav::skip_value(self.buf, start)),
        };
        if let Some(entry) = self.current() {
            match field {
                Field::Role => entry.role = Some(span),
                Field::Content => entry.content = Some(span),
            }
        }
    }
}

impl Visit for MessageIndex<'_> {
    fn value_start(&mut self, at: usize) {
        if !self.inside {
            return;
        }
        if self.depth == ARRAY {
            if self.len < MAX_MESSAGES {
                self.len = self.len.saturating_add(1);
            } else {
                self.overflow = true;
            }
        } else if self.depth == MESSAGE && !self.overflow {
            self.reading = self.next_field.take().map(|f| (f, at));
        }
    }

    fn open(&mut self, at: usize, object: bool) {
        if self.depth == TOP && self.armed {
            self.armed = false;
            if !object {
                self.array = Some(at);
                self.inside = true;
            }
        } else if self.inside && self.depth == ARRAY && object && !self.overflow {
            if let Some(entry) = self.current() {
                entry.object = true;
            }
        }
        self.depth = self.depth.saturating_add(1);
    }

    fn close(&mut self, at: usize) {
        self.depth = self.depth.saturating_sub(1);
        if !self.inside {
            return;
        }
        match self.depth {
            MESSAGE => self.finish_reading(Some(at)),
            ARRAY => {
                // A message closes: a scalar last member ends here.
                self.finish_reading(None);
                self.next_field = None;
            }
            TOP => self.inside = false,
            _ => {}
        }
    }

    fn key(&mut self, key: Span) {
        if self.depth == TOP {
            self.armed = self.array.is_none() && key.of(self.buf) == b"\"messages\"";
            return;
        }
        if !self.inside || self.depth != MESSAGE || self.overflow {
            return;
        }
        // A scalar value before this key ended where it started.
        self.finish_reading(None);
        let Some(entry) = self.current().copied() else {
            return;
        };
        let raw = key.of(self.buf);
        let field = match raw {
            b"\"role\"" => entry.role.is_none().then_some(Field::Role),
            b"\"content\"" => entry.content.is_none().then_some(Field::Content),
            _ => None,
        };
        if field.is_none() && raw.contains(&b'\\') {
            // `r\u006fle` is `role` to the walk: leave such bodies to it.
            self.usable = false;
        }
        self.next_field = field;
    }

    fn string_value(&mut self, value: Span) {
        if self.inside && self.depth == MESSAGE {
            self.finish_reading(Some(value.end));
        }
    }
}
