//! Stepping over string content fast: the one inner loop every pass over a body spends its time in.
//!
//! Inside a JSON string only three kinds of byte need a look: `"` (the end), `\` (an escape) and a control byte
//! below 0x20 (an error). Everything else, which in a prompt is nearly every byte, is stepped over. Two ways,
//! one behaviour:
//! - **wasm with SIMD128** (the filter's build: `-C target-feature=+simd128`, set once in `.cargo/config.toml`;
//!   V8 in Envoy runs it): 64 bytes per step while the string lasts (four vectors, three compares each, one
//!   any-true test; the bitmasks only on a hit), then 16;
//! - **x86-64** (the native build, the CLI, the tests there): the same 64 bytes per step with SSE2, which every
//!   x86-64 CPU has (four vectors, three compares each, one mask test); an unsigned "below 0x20" is "the byte
//!   equals its minimum with 0x1f";
//! - **everywhere else** (wasm without SIMD, other CPUs): word at a time, 8 bytes per step, with
//!   the classic "has a zero byte" and "has a byte less than n" bit tricks. The lowest flagged byte is always a
//!   real hit (a false flag can only sit above a real one, where a borrow ran on), so the first stop is exact.
//!
//! [`string_stop_utf8`] stops at the same bytes and at every byte from 0x80 up, the start of a character outside
//! ASCII: the scanner's string loop uses it, so the UTF-8 check costs a look only where a string holds such
//! characters, instead of a second pass over the whole body (with SIMD128 it is the same three compares: a signed
//! "below 0x20" is also true of every byte from 0x80 up).
//!
//! Each returns exactly what its byte-at-a-time definition returns ([`string_stop_simple`],
//! [`string_stop_utf8_simple`]); a property test (`filter/core/tests/json_skip.rs`) holds the word versions to
//! them on random input (and the SSE2 ones, which are `string_stop` there, on x86-64), `make simd-check` the
//! SIMD128 ones in V8, and the real-Envoy tests run the SIMD build.
//! Cost: linear, no allocation, no indexing that can fail.

/// The index of the first `"`, `\` or byte below 0x20 in `bytes`, if any.
#[inline]
pub fn string_stop(bytes: &[u8]) -> Option<usize> {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd::string_stop(bytes)
    }
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    {
        sse2::string_stop(bytes)
    }
    #[cfg(not(any(
        all(target_arch = "wasm32", target_feature = "simd128"),
        all(target_arch = "x86_64", target_feature = "sse2")
    )))]
    {
        words::string_stop(bytes)
    }
}

/// The index of the first `"`, `\`, byte below 0x20 or byte from 0x80 up in `bytes`, if any.
#[inline]
pub fn string_stop_utf8(bytes: &[u8]) -> Option<usize> {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd::string_stop_utf8(bytes)
    }
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    {
        sse2::string_stop_utf8(bytes)
    }
    #[cfg(not(any(
        all(target_arch = "wasm32", target_feature = "simd128"),
        all(target_arch = "x86_64", target_feature = "sse2")
    )))]
    {
        words::string_stop_utf8(bytes)
    }
}

/// The definition: byte at a time. The fast versions must agree with it on every input.
pub fn string_stop_simple(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&c| is_stop(c))
}

/// The definition of [`string_stop_utf8`]: byte at a time.
pub fn string_stop_utf8_simple(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&c| is_stop(c) || c >= 0x80)
}

/// True for the bytes a string scan must stop at.
#[inline(always)]
fn is_stop(c: u8) -> bool {
    c == b'"' || c == b'\\' || c < 0x20
}

/// The word-at-a-time versions, exposed so the property test can hold them to the definitions on every target.
pub fn string_stop_words(bytes: &[u8]) -> Option<usize> {
    words::string_stop(bytes)
}

/// See [`string_stop_words`].
pub fn string_stop_utf8_words(bytes: &[u8]) -> Option<usize> {
    words::string_stop_utf8(bytes)
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
        first(bytes, stops, super::string_stop_simple)
    }

    /// [`string_stop`], also stopping at every byte from 0x80 up: its high bit is a real flag, never a false one.
    pub fn string_stop_utf8(bytes: &[u8]) -> Option<usize> {
        first(bytes, |w| stops(w) | (w & HIGH), super::string_stop_utf8_simple)
    }

    /// The first byte `flags` marks, 16 bytes a step; the tail shorter than 16 bytes goes to `simple`.
    #[inline(always)]
    fn first(bytes: &[u8], flags: impl Fn(u64) -> u64, simple: fn(&[u8]) -> Option<usize>) -> Option<usize> {
        let mut at = 0usize;
        let mut pairs = bytes.chunks_exact(16);
        for pair in &mut pairs {
            let (lo, hi) = (flags(word(pair)), flags(word(pair.get(8..).unwrap_or_default())));
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
        simple(pairs.remainder()).map(|i| at.saturating_add(i))
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd {
    use core::arch::wasm32::{
        i8x16_lt, i8x16_splat, u8x16_bitmask, u8x16_eq, u8x16_lt, u8x16_splat, v128, v128_any_true, v128_load, v128_or,
    };

    /// The 16 bytes of a 16-byte chunk.
    #[inline(always)]
    fn load(chunk: &[u8]) -> v128 {
        // SAFETY: every caller passes a `chunks_exact(16)` chunk, 16 readable bytes, and `v128_load` is a 1-aligned load:
        // no alignment requirement.
        unsafe { v128_load(chunk.as_ptr().cast::<v128>()) }
    }

    /// The four vectors of a 64-byte block.
    #[inline(always)]
    fn load4(block: &[u8; 64]) -> [v128; 4] {
        let p = block.as_ptr().cast::<v128>();
        // SAFETY: the block is 64 readable bytes, four 16-byte vectors, and `v128_load` needs no alignment.
        unsafe {
            [
                v128_load(p),
                v128_load(p.add(1)),
                v128_load(p.add(2)),
                v128_load(p.add(3)),
            ]
        }
    }

    pub fn string_stop(bytes: &[u8]) -> Option<usize> {
        let space = u8x16_splat(0x20);
        first(bytes, |v| u8x16_lt(v, space), super::string_stop_simple)
    }

    /// As signed bytes, 0x80 and up are negative: one signed "below 0x20" flags them and the control bytes.
    pub fn string_stop_utf8(bytes: &[u8]) -> Option<usize> {
        let space = i8x16_splat(0x20);
        first(bytes, |v| i8x16_lt(v, space), super::string_stop_utf8_simple)
    }

    /// The first `"`, `\` or byte `low` flags: 64 bytes a step while they last (four vectors, one test), then 16
    /// bytes a step; the tail shorter than 16 bytes goes to `simple`.
    #[inline(always)]
    fn first(bytes: &[u8], low: impl Fn(v128) -> v128, simple: fn(&[u8]) -> Option<usize>) -> Option<usize> {
        let (quote, backslash) = (u8x16_splat(b'"'), u8x16_splat(b'\\'));
        let hits = |v: v128| v128_or(v128_or(u8x16_eq(v, quote), u8x16_eq(v, backslash)), low(v));
        let mut at = 0usize;
        let (blocks, rest) = bytes.as_chunks::<64>();
        for block in blocks {
            let [a, b, c, d] = load4(block).map(hits);
            if v128_any_true(v128_or(v128_or(a, b), v128_or(c, d))) {
                let mask = u64::from(u8x16_bitmask(a))
                    | u64::from(u8x16_bitmask(b)) << 16
                    | u64::from(u8x16_bitmask(c)) << 32
                    | u64::from(u8x16_bitmask(d)) << 48;
                return Some(at.saturating_add(mask.trailing_zeros() as usize));
            }
            at = at.saturating_add(64);
        }
        let mut chunks = rest.chunks_exact(16);
        for chunk in &mut chunks {
            let mask = u8x16_bitmask(hits(load(chunk)));
            if mask != 0 {
                return Some(at.saturating_add(mask.trailing_zeros() as usize));
            }
            at = at.saturating_add(16);
        }
        simple(chunks.remainder()).map(|i| at.saturating_add(i))
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
mod sse2 {
    //! Each function enables SSE2, so the intrinsics inside are safe calls; SSE2 is part of every x86-64 target
    //! (the module exists only where `target_feature = "sse2"` holds), which is what makes the calls from
    //! outside sound.

    use core::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };

    pub fn string_stop(bytes: &[u8]) -> Option<usize> {
        // SAFETY: SSE2 is enabled on this target (see the module's cfg).
        unsafe { first(bytes, false) }
    }

    pub fn string_stop_utf8(bytes: &[u8]) -> Option<usize> {
        // SAFETY: as above.
        unsafe { first(bytes, true) }
    }

    /// The bytes of `v` that stop a string scan, `0xff` each: `"`, `\`, a byte below 0x20 and, with `utf8`, a byte
    /// from 0x80 up. Unsigned `v < 0x20` is `min(v, 0x1f) == v`; as signed bytes 0x80 and up are negative, so one
    /// signed "below 0x20" flags them with the control bytes.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn hits(v: __m128i, utf8: bool) -> __m128i {
        let low = match utf8 {
            true => _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)),
            false => _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1f)), v),
        };
        let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"'.cast_signed()));
        let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\'.cast_signed()));
        _mm_or_si128(_mm_or_si128(quote, backslash), low)
    }

    /// The flagged bytes of a 16-byte chunk as bits, lowest byte first.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn mask(chunk: &[u8; 16], utf8: bool) -> u64 {
        // SAFETY: the chunk is 16 readable bytes and `_mm_loadu_si128` is an unaligned load.
        let v = unsafe { _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>()) };
        u64::from(_mm_movemask_epi8(hits(v, utf8)).cast_unsigned() & 0xffff)
    }

    /// The first stop: 64 bytes a step while they last (four masks, one test), then 16 bytes a step; the tail
    /// shorter than 16 bytes goes to the byte-at-a-time definition.
    #[target_feature(enable = "sse2")]
    fn first(bytes: &[u8], utf8: bool) -> Option<usize> {
        let mut at = 0usize;
        let (blocks, rest) = bytes.as_chunks::<64>();
        for block in blocks {
            let (quarters, _) = block.as_chunks::<16>();
            let mut found = 0u64;
            for (q, shift) in quarters.iter().zip([0u32, 16, 32, 48]) {
                found |= mask(q, utf8) << shift;
            }
            if found != 0 {
                return Some(at.saturating_add(found.trailing_zeros() as usize));
            }
            at = at.saturating_add(64);
        }
        let (chunks, tail) = rest.as_chunks::<16>();
        for chunk in chunks {
            let m = mask(chunk, utf8);
            if m != 0 {
                return Some(at.saturating_add(m.trailing_zeros() as usize));
            }
            at = at.saturating_add(16);
        }
        let simple = match utf8 {
            true => super::string_stop_utf8_simple,
            false => super::string_stop_simple,
        };
        simple(tail).map(|i| at.saturating_add(i))
    }
}
