//! Walking inside a body that [`super::scan_object`] has already validated.
//!
//! After validation the gateway only needs a few values (the messages' roles and text), so instead of building a
//! tree it steps over values it does not need. Skipping is a bracket count that knows about strings, with no
//! allocation. These functions assume valid input: on anything else they stop early rather than fail, and they
//! never index out of bounds.
//!
//! Positions only grow by small steps and never pass the body's length (at most `isize::MAX`), so position
//! arithmetic saturates: it never actually does, and an impossible overflow cannot wrap back to the body's start.

use std::borrow::Cow;

use super::scan::{kind_of, Kind, Span};

/// Returns the end of the value that starts at `pos` (after leading whitespace).
pub fn skip_value(buf: &[u8], pos: usize) -> usize {
    let mut i = skip_ws(buf, pos);
    let mut depth = 0usize;
    loop {
        let Some(&b) = buf.get(i) else {
            return buf.len();
        };
        match b {
            b'"' => i = skip_string(buf, i),
            b'{' | b'[' => {
                depth = depth.saturating_add(1);
                i = i.saturating_add(1);
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                i = i.saturating_add(1);
            }
            _ => {
                // A scalar: numbers and literals end at a delimiter.
                while let Some(&c) = buf.get(i) {
                    if matches!(c, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t') {
                        break;
                    }
                    i = i.saturating_add(1);
                }
            }
        }
        if depth == 0 {
            return i;
        }
        // Inside a container, walk over separators.
        while let Some(b',' | b':' | b' ' | b'\n' | b'\r' | b'\t') = buf.get(i) {
            i = i.saturating_add(1);
        }
    }
}

fn skip_ws(buf: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\r' | b'\t') = buf.get(i) {
        i = i.saturating_add(1);
    }
    i
}

/// Returns the index just past the string that opens at `pos`.
pub fn skip_string(buf: &[u8], pos: usize) -> usize {
    let mut i = pos.saturating_add(1);
    // From quote or backslash to the next: the bytes between need no look. (A control byte, which validated
    // input never holds inside a string, is stepped over.)
    while let Some(rest) = buf.get(i..) {
        let Some(at) = super::skip::string_stop(rest) else {
            break;
        };
        let at = i.saturating_add(at);
        match buf.get(at) {
            Some(b'"') => return at.saturating_add(1),
            Some(b'\\') => i = at.saturating_add(2),
            _ => i = at.saturating_add(1),
        }
    }
    buf.len()
}

/// The kind of the value in `span`.
pub fn kind(buf: &[u8], span: Span) -> Option<Kind> {
    buf.get(span.start).copied().and_then(kind_of)
}

/// Iterates over the element spans of the array in `span`.
pub fn array_items(buf: &[u8], span: Span) -> ArrayItems<'_> {
    ArrayItems {
        buf,
        pos: span.start.saturating_add(1),
        end: span.end,
    }
}

pub struct ArrayItems<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

impl Iterator for ArrayItems<'_> {
    type Item = Span;

    fn next(&mut self) -> Option<Span> {
        let start = skip_ws(self.buf, self.pos);
        match self.buf.get(start) {
            None | Some(b']') => return None,
            Some(_) if start >= self.end => return None,
            Some(_) => {}
        }
        let end = skip_value(self.buf, start);
        let after = skip_ws(self.buf, end);
        self.pos = if self.buf.get(after) == Some(&b',') {
            after.saturating_add(1)
        } else {
            self.end
        };
        Some(Span { start, end })
    }
}

/// Iterates over `(key, value)` spans of the object in `span`. Keys include their quotes.
pub fn object_members(buf: &[u8], span: Span) -> ObjectMembers<'_> {
    ObjectMembers {
        buf,
        pos: span.start.saturating_add(1),
        end: span.end,
    }
}

pub struct ObjectMembers<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

impl Iterator for ObjectMembers<'_> {
    type Item = (Span, Span);

    fn next(&mut self) -> Option<(Span, Span)> {
        let kstart = skip_ws(self.buf, self.pos);
        if kstart >= self.end || self.buf.get(kstart) != Some(&b'"') {
            return None;
        }
        let kend = skip_string(self.buf, kstart);
        let colon = skip_ws(self.buf, kend);
        let vstart = skip_ws(self.buf, colon.saturating_add(1));
        let vend = skip_value(self.buf, vstart);
        let after = skip_ws(self.buf, vend);
        self.pos = if self.buf.get(after) == Some(&b',') {
            after.saturating_add(1)
        } else {
            self.end
        };
        Some((
            Span {
                start: kstart,
                end: kend,
            },
            Span {
                start: vstart,
                end: vend,
            },
        ))
    }
}

/// Finds the first member whose key equals `name` (decoding escaped keys).
pub fn get(buf: &[u8], object: Span, name: &str) -> Option<Span> {
    object_members(buf, object)
        .find(|(k, _)| key_eq(buf, *k, name))
        .map(|(_, v)| v)
}

/// True when the quoted key in `key` decodes to `name`.
pub fn key_eq(buf: &[u8], key: Span, name: &str) -> bool {
    let raw = key.of(buf);
    let inner = raw.get(1..raw.len().saturating_sub(1)).unwrap_or_default();
    if !inner.contains(&b'\\') {
        return inner == name.as_bytes();
    }
    str_value(buf, key).is_some_and(|s| s == name)
}

/// Decodes the JSON string in `span`. Borrowed when it has no escapes. `None` when it is not a string.
pub fn str_value(buf: &[u8], span: Span) -> Option<Cow<'_, str>> {
    let raw = span.of(buf);
    if raw.len() < 2 || raw.first() != Some(&b'"') {
        return None;
    }
    let inner = raw.get(1..raw.len().saturating_sub(1))?;
    if !inner.contains(&b'\\') {
        return std::str::from_utf8(inner).ok().map(Cow::Borrowed);
    }
    serde_json::from_slice::<String>(raw).ok().map(Cow::Owned)
}

/// The decoded string in `span`, or as much of its start as a key of at most `want` bytes needs: when the first
/// `want + 4` raw bytes hold no escape, only they are read, and the text returned is at least `want` bytes long,
/// ending on a character boundary (so its first `want` bytes, cut on a boundary, are the whole string's). Otherwise
/// the whole string, as [`str_value`]. A user-prefix key reads a few hundred bytes of what may be a megabyte.
pub fn str_prefix(buf: &[u8], span: Span, want: usize) -> Option<Cow<'_, str>> {
    let raw = span.of(buf);
    let inner = raw.strip_prefix(b"\"").and_then(|r| r.strip_suffix(b"\""));
    let window = inner.and_then(|i| i.get(..want.saturating_add(4)));
    let Some(window) = window.filter(|w| !w.contains(&b'\\')) else {
        return str_value(buf, span);
    };
    // A validated body is UTF-8: the window can only end inside a character, never hold a bad one.
    let text = match std::str::from_utf8(window) {
        Ok(t) => Some(t),
        Err(e) => window.get(..e.valid_up_to()).and_then(|w| std::str::from_utf8(w).ok()),
    };
    match text {
        Some(t) if t.len() >= want => Some(Cow::Borrowed(t)),
        _ => str_value(buf, span),
    }
}
