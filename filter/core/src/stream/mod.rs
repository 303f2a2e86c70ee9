//! The response path: reading streams and bodies for how they ended and what they cost.

pub mod assemble;
pub mod json_copy;
pub mod sse;
pub mod tracker;
pub mod usage;

pub use assemble::{Assembler, Failure};
pub use json_copy::JsonCopy;
pub use tracker::{outcome, Outcome, StreamTracker, Verdict};
pub use usage::Usage;

/// `chunk` without the byte ranges in `cuts` (sorted, not overlapping): what the client gets when the gateway
/// removes an event from a chunk.
pub fn without(chunk: &[u8], cuts: &[(usize, usize)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(chunk.len());
    let mut at = 0;
    for &(a, b) in cuts {
        out.extend_from_slice(chunk.get(at..a).unwrap_or_default());
        at = b;
    }
    out.extend_from_slice(chunk.get(at..).unwrap_or_default());
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn without_cuts_the_ranges() {
        assert_eq!(super::without(b"abcdef", &[(1, 2), (4, 6)]), b"acd".to_vec());
        assert_eq!(super::without(b"abc", &[]), b"abc".to_vec());
    }
}
