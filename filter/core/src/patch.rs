//! The one edit the gateway makes to a request body, and how it reaches Envoy with the fewest bytes copied.
//!
//! A [`BodyPatch`] replaces one span (the `model` value, or from it to the closing brace when the gateway also asks
//! a stream for its usage). [`BodyPatch::apply`] builds the whole new body; the filter does not need it. Envoy's
//! `set_buffer` on a request body, called at offset 0 with a length, drains that many bytes from the front and
//! prepends the new ones (at any other offset below the end it refuses; see docs/overhead.md). So the smallest
//! edit it allows is [`BodyPatch::head_edit`]: drain up to the end of the span, prepend the replacement, prepend
//! what stood before the span. Nothing is copied inside the VM, and Envoy copies only the bytes up to the span:
//! a few dozen when `model` comes first, most of the body when it comes last (as the OpenAI SDKs send it, after
//! `messages`), which Envoy's API cannot avoid: it has no call that cuts a buffer's tail.

use crate::json::{Member, Span};

/// Replace the bytes in `span` with `replacement`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyPatch {
    pub span: Span,
    pub replacement: String,
}

impl BodyPatch {
    /// The new body. One allocation of the final size.
    pub fn apply(&self, body: &[u8]) -> Vec<u8> {
        let head = body.get(..self.span.start).unwrap_or_default();
        let tail = body.get(self.span.end..).unwrap_or_default();
        let mut out = Vec::with_capacity(
            head.len()
                .saturating_add(self.replacement.len())
                .saturating_add(tail.len()),
        );
        out.extend_from_slice(head);
        out.extend_from_slice(self.replacement.as_bytes());
        out.extend_from_slice(tail);
        out
    }

    /// The body length after the patch, for `content-length`. `None` when `span` does not lie within a body of
    /// `old_len` bytes (then [`BodyPatch::apply`] is no splice, and no length should be announced for it) or the
    /// sum overflows.
    pub fn new_len(&self, old_len: usize) -> Option<usize> {
        if self.span.start > self.span.end || self.span.end > old_len {
            return None;
        }
        old_len
            .checked_sub(self.span.len())?
            .checked_add(self.replacement.len())
    }

    /// The patch as Envoy's buffer API can take it with the fewest bytes copied: two `set_buffer` calls at offset
    /// 0, in order. The first drains the body up to the end of the span and prepends the replacement; the second
    /// prepends the bytes before the span, borrowed from `body` (nothing is copied inside the VM). `None` when the
    /// span does not lie within `body` (as for [`BodyPatch::new_len`]): then there is nothing sound to send.
    pub fn head_edit<'a>(&'a self, body: &'a [u8]) -> Option<[Prepend<'a>; 2]> {
        if self.span.start > self.span.end || self.span.end > body.len() {
            return None;
        }
        Some([
            Prepend {
                drain: self.span.end,
                bytes: self.replacement.as_bytes(),
            },
            Prepend {
                drain: 0,
                bytes: body.get(..self.span.start)?,
            },
        ])
    }
}

/// One `set_buffer` call on the request body at offset 0: Envoy drains the first `drain` bytes, then prepends
/// `bytes`. A call with nothing to drain and nothing to prepend changes nothing and need not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prepend<'a> {
    pub drain: usize,
    pub bytes: &'a [u8],
}

impl Prepend<'_> {
    /// True when the call would change nothing.
    pub fn is_noop(&self) -> bool {
        self.drain == 0 && self.bytes.is_empty()
    }
}

/// The text the gateway adds to ask a stream for its usage.
pub const INCLUDE_USAGE: &str = ",\"stream_options\":{\"include_usage\":true}";

/// One splice of the request body: the bytes in `span` become `text` (an insert when `span` is empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub span: Span,
    pub text: String,
}

impl Edit {
    pub fn insert(at: usize, text: &str) -> Edit {
        Edit {
            span: Span { start: at, end: at },
            text: text.to_string(),
        }
    }
}

/// The body's edits as one patch: one span from the first edit's start to the last one's end, the bytes between
/// edits kept, so the body is copied once. Edits must not overlap; `None` when there are none.
fn merge(body: &[u8], mut edits: Vec<Edit>) -> Option<BodyPatch> {
    edits.sort_by_key(|e| (e.span.start, e.span.end));
    let start = edits.first()?.span.start;
    let end = edits.last()?.span.end;
    let mut replacement = String::new();
    let mut at = start;
    for e in &edits {
        replacement.push_str(&String::from_utf8_lossy(body.get(at..e.span.start).unwrap_or_default()));
        replacement.push_str(&e.text);
        at = e.span.end;
    }
    Some(BodyPatch {
        span: Span { start, end },
        replacement,
    })
}

/// The edits to the body as one patch: `model` set to `upstream` (when the bytes differ), and `extra` (the
/// include-usage option, the stream-always edits).
pub fn body_patch(body: &[u8], model: Member, upstream: &str, mut extra: Vec<Edit>) -> Option<BodyPatch> {
    let model_edit = (!is_json_string_of(model.value.of(body), upstream)).then(|| Edit {
        span: model.value,
        text: json_string(upstream),
    });
    match (model_edit, extra.is_empty()) {
        // The common case of an alias named after its model and nothing else to change: nothing built or sent.
        (None, true) => None,
        // Only `model` changes: its new value is the whole patch, with no list and no second copy.
        (Some(e), true) => Some(BodyPatch {
            span: e.span,
            replacement: e.text,
        }),
        (model_edit, false) => {
            extra.extend(model_edit);
            merge(body, extra)
        }
    }
}

/// `s` as a JSON string, the way serde_json writes it (only `"`, `\\` and control characters are escaped).
fn json_string(s: &str) -> String {
    if crate::json::skip::string_stop(s.as_bytes()).is_some() {
        return serde_json::Value::from(s).to_string();
    }
    let mut out = String::with_capacity(s.len().saturating_add(2));
    out.push('"');
    out.push_str(s);
    out.push('"');
    out
}

/// True when `raw` is exactly the bytes [`json_string`] writes for `s`, without building them when `s` needs no
/// escape.
fn is_json_string_of(raw: &[u8], s: &str) -> bool {
    if crate::json::skip::string_stop(s.as_bytes()).is_some() {
        return raw == json_string(s).as_bytes();
    }
    raw.strip_prefix(b"\"")
        .and_then(|r| r.strip_suffix(b"\""))
        .is_some_and(|inner| inner == s.as_bytes())
}

/// A JSON number as a token count: an integer, or a float with no fraction (saturating at `u64::MAX`).
pub fn output_count(raw: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(raw).ok()?;
    if let Ok(n) = text.parse::<u64>() {
        return Some(n);
    }
    let f = text.parse::<f64>().ok()?;
    // `as` saturates: 1e30 becomes u64::MAX.
    (f.is_finite() && f >= 0.0 && f.fract() == 0.0).then_some(f as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_strings_are_written_as_serde_json_writes_them() {
        for s in [
            "qwen3",
            "",
            "é/ü<>",
            "a\u{7f}b",
            "we\"ird",
            "back\\slash",
            "tab\there",
            "nul\u{0}",
        ] {
            let serde = serde_json::Value::from(s).to_string();
            assert_eq!(json_string(s), serde, "{s:?}");
            assert!(is_json_string_of(serde.as_bytes(), s), "{s:?}");
            assert!(!is_json_string_of(format!("{serde} ").as_bytes(), s), "{s:?}");
        }
        assert!(!is_json_string_of(br#""qwen\u0033""#, "qwen3"));
        assert!(!is_json_string_of(b"\"", ""));
    }
}
