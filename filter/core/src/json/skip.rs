//! Stepping over string content fast: the one inner loop every pass over a body spends its time in.
//!
//! Inside a JSON string only three kinds of byte need a look: `"` (the end), `\` (an escape) and a control byte
//! below 0x20 (an error). Everything else, which in a prompt is nearly every byte, is stepped over. Two ways,
//! one behaviour:
//! - **wasm with SIMD128** (the filter's build: `-C target-feature=+simd128`, set once in `.cargo/config.toml`;
//!   V8 in Envoy runs it): 16 bytes per step, three compares and a bitmask;
//! - **everywhere else** (native, the CLI, the tests, wasm without SIMD): word at a time, 8 bytes per step, with
//!   the classic "has a zero byte" and "has a byte less than n" bit tricks. The lowest flagged byte is always a
//!   real hit (a false flag can only sit above a real one, where a borrow ran on), so the first stop is exact.
//!
//! [`is_ascii`] lets the scanner skip its UTF-8 check for an all-ASCII body, the usual prompt, in the same way.
//!
//! Both return exactly what [`string_stop_simple`] returns, the byte-at-a-time definition; a property test
//! (`filter/core/tests/json_skip.rs`) holds the word version to it on random input, and the real-Envoy tests run
//! the SIMD build. Cost: linear, no allocation, no indexing that can fail.

/// The index of the first `"`, `\` or byte below 0x20 in `bytes`, if any.
#[inline]
pub fn string_stop(bytes: &[u8]) -> Option<usize> {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd::string_stop(bytes)
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        words::string_stop(bytes)
    }
}

/// True when every byte of `bytes` is ASCII, so the body is UTF-8 without a closer look. With SIMD128, 64 bytes
/// per step (std's own check steps a machine word at a time, 4 bytes on wasm32); elsewhere, std's check.
#[inline]
pub fn is_ascii(bytes: &[u8]) -> bool {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd::is_ascii(bytes)
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        bytes.is_ascii()
    }
}

/// The definition: byte at a time. The fast versions must agree with it on every input.
pub fn string_stop_simple(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&c| is_stop(c))
}

/// True for the bytes a string scan must stop at.
#[inline(always)]
fn is_stop(c: u8) -> bool {
    c == b'"' || c == b'\\' || c < 0x20
}

/// The word-at-a-time version, exposed so the property test can hold it to the definition on every target.
pub fn string_stop_words(bytes: &[u8]) -> Option<usize> {
    words::string_stop(bytes)
}

mod words {
    const LOW: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = 0x2222_2222_2222_2222;
    const BACKSLASHES: u64 = 0x5c5c_5c5c_5c5c_5c5c;
    const SPACES: u64 = 0x2020_2020_2020_2020;

    /// The high bit of each byte of `w` (little-endian) that is `"`, `\` or below 0x20; false flags only above
    /// a real one.
    #[inline(always)]
    fn stops(w: u64) -> u64 {
        let q = w ^ QUOTES;
        let b = w ^ BACKSLASHES;
        let zero_q = q.wrapping_sub(LOW) & !q;
        let zero_b = b.wrapping_sub(LOW) & !b;
        let below_space = w.wrapping_sub(SPACES) & !w;
        (zero_q | zero_b | below_space) & HIGH
    }

    #[inline(always)]
    fn word(chunk: &[u8]) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk.get(..8).unwrap_or(&[0; 8]));
        u64::from_le_bytes(w)
    }

    pub fn string_stop(bytes: &[u8]) -> Option<usize> {
        let mut at = 0usize;
        let mut pairs = bytes.chunks_exact(16);
        for pair in &mut pairs {
            let (lo, hi) = (stops(word(pair)), stops(word(pair.get(8..).unwrap_or_default())));
            if lo | hi != 0 {
                let first = if lo != 0 {
                    lo.trailing_zeros() / 8
                } else {
                    (hi.trailing_zeros() / 8) | 8
                };
                return Some(at.saturating_add(first as usize));
            }
            at = at.saturating_add(16);
        }
        super::string_stop_simple(pairs.remainder()).map(|i| at.saturating_add(i))
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd {
    use core::arch::wasm32::{u8x16_bitmask, u8x16_eq, u8x16_lt, u8x16_splat, v128, v128_load, v128_or};

    /// The 16 bytes of a 16-byte chunk.
    #[inline(always)]
    fn load(chunk: &[u8]) -> v128 {
        // SAFETY: every caller passes a `chunks_exact(16)` chunk, 16 readable bytes, and `v128_load` is a 1-aligned load:
        // no alignment requirement.
        unsafe { v128_load(chunk.as_ptr().cast::<v128>()) }
    }

    pub fn is_ascii(bytes: &[u8]) -> bool {
        let mut blocks = bytes.chunks_exact(64);
        for block in &mut blocks {
            let any = block
                .chunks_exact(16)
                .fold(u8x16_splat(0), |acc, chunk| v128_or(acc, load(chunk)));
            // The bitmask holds each byte's high bit: zero when all 64 bytes are ASCII.
            if u8x16_bitmask(any) != 0 {
                return false;
            }
        }
        blocks.remainder().is_ascii()
    }

    pub fn string_stop(bytes: &[u8]) -> Option<usize> {
        let (quote, backslash, space) = (u8x16_splat(b'"'), u8x16_splat(b'\\'), u8x16_splat(0x20));
        let mut at = 0usize;
        let mut chunks = bytes.chunks_exact(16);
        for chunk in &mut chunks {
            let v = load(chunk);
            let hits = v128_or(v128_or(u8x16_eq(v, quote), u8x16_eq(v, backslash)), u8x16_lt(v, space));
            let mask = u8x16_bitmask(hits);
            if mask != 0 {
                return Some(at.saturating_add(mask.trailing_zeros() as usize));
            }
            at = at.saturating_add(16);
        }
        super::string_stop_simple(chunks.remainder()).map(|i| at.saturating_add(i))
    }
}
