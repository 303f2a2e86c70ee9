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
