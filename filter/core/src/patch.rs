//! The one edit the gateway makes to a request body, and how it reaches Envoy with the fewest bytes copied.
//!
//! A [`BodyPatch`] replaces one span (the `model` value, or from it to the closing brace when the gateway also asks
//! a stream for its usage). [`BodyPatch::apply`] builds the whole new body; the filter does not need it. Envoy's
//! `set_buffer` on a request body, called at offset 0 with a length, drains that many bytes from the front and
//! prepends the new ones (at any other offset below the end it refuses; see docs/overhead.md). So the smallest
//! edit it allows is [`HeadEdit`]: drain up to the end of the span and prepend what now goes before it. With
//! `model` first, as clients send it, that is a few dozen bytes instead of a copy of the body into a new buffer and
//! another back into Envoy.

use crate::json::Span;

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

    /// The patch as a head edit of `body`. `None` when the span does not lie within the body (as for
    /// [`BodyPatch::new_len`]): then there is nothing sound to send.
    pub fn head_edit(&self, body: &[u8]) -> Option<HeadEdit> {
        if self.span.start > self.span.end {
            return None;
        }
        let before = body.get(..self.span.start)?;
        body.get(..self.span.end)?;
        let mut head = Vec::with_capacity(before.len().saturating_add(self.replacement.len()));
        head.extend_from_slice(before);
        head.extend_from_slice(self.replacement.as_bytes());
        Some(HeadEdit {
            drain: self.span.end,
            head,
        })
    }
}

/// The smallest edit Envoy's buffer API allows for a patch: drain the first `drain` bytes of the buffered body and
/// prepend `head` (what comes before the span, then the replacement).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadEdit {
    pub drain: usize,
    pub head: Vec<u8>,
}
