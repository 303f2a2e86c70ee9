//! The copy of a non-streamed JSON answer that the filter keeps to read its usage once, at the answer's end.
//!
//! The answer itself is relayed untouched; the copy only feeds [`usage::of_document`]. It holds at most
//! [`MAX_USAGE_DOC`] bytes. A chunk that would take it over that bound, or that the host could not hand over, is
//! not copied, and then the copy stops for good: the later chunks are not read either, and the answer yields no
//! usage. Copying on after a gap would glue the bytes before and after it into a document the engine never sent,
//! which may still parse, with a usage taken from text the client chose (an echoed prompt, say).

use super::usage::{self, Usage, MAX_USAGE_DOC};

/// A bounded, gap-free copy of a JSON answer.
#[derive(Debug, Default)]
pub struct JsonCopy {
    bytes: Vec<u8>,
    /// True once a chunk was left out: the copy is no longer the answer.
    gap: bool,
}

impl JsonCopy {
    pub fn new() -> JsonCopy {
        JsonCopy::default()
    }

    /// Copies the next chunk of `size` bytes, which `read` hands over (`None` when the host could not). `read` is
    /// not called once the copy stopped, nor for a chunk that would take it over its bound.
    pub fn push(&mut self, size: usize, read: impl FnOnce(usize) -> Option<Vec<u8>>) {
        if self.gap || size == 0 {
            return;
        }
        let fits = self.bytes.len().saturating_add(size) <= MAX_USAGE_DOC;
        match fits.then(|| read(size)).flatten() {
            Some(chunk) if self.bytes.len().saturating_add(chunk.len()) <= MAX_USAGE_DOC => {
                self.bytes.extend_from_slice(&chunk)
            }
            _ => self.stop(),
        }
    }

    /// The answer's usage: nothing when the copy stopped, or the bytes are not one bounded JSON object. Frees the
    /// copy.
    pub fn finish(&mut self) -> Usage {
        let bytes = std::mem::take(&mut self.bytes);
        if self.gap {
            return Usage::default();
        }
        std::str::from_utf8(&bytes)
            .ok()
            .and_then(usage::of_document)
            .unwrap_or_default()
    }

    fn stop(&mut self) {
        self.gap = true;
        self.bytes = Vec::new();
    }
}
