//! Runs in V8 (node's WASI), built exactly as the filter is (`wasm32-wasip1`, `+simd128`): the SIMD128 string
//! skips of `llmroute_core::json::skip` (with and without the stop at bytes from 0x80 up, on which the scanner's
//! UTF-8 check rides) must return what the byte-at-a-time definitions return, on random input drawn mostly from
//! the bytes that stop a scan and their neighbours, and on every byte value at every offset around the 16- and 64-byte
//! steps. The native build runs the same comparison as a property test (`filter/core/tests/json_skip.rs`). Exits
//! non-zero on the first disagreement.

use llmroute_core::json::skip::{
    string_stop, string_stop_simple, string_stop_utf8, string_stop_utf8_simple, string_stop_utf8_words,
    string_stop_words,
};

/// The bytes near the stop set, plus plain text.
const POOL: [u8; 16] = [
    b'a', b'a', b'a', b'a', b'"', b'\\', 0x00, 0x01, 0x1f, 0x20, 0x21, 0x5c, 0x7f, 0x80, 0xa0, 0xff,
];

fn check(v: &[u8]) -> Result<(), String> {
    let want = string_stop_simple(v);
    if string_stop(v) != want || string_stop_words(v) != want {
        return Err(format!("string_stop disagrees on {v:?}: want {want:?}"));
    }
    let want = string_stop_utf8_simple(v);
    if string_stop_utf8(v) != want || string_stop_utf8_words(v) != want {
        return Err(format!("string_stop_utf8 disagrees on {v:?}: want {want:?}"));
    }
    Ok(())
}

fn run() -> Result<u64, String> {
    if !cfg!(all(target_arch = "wasm32", target_feature = "simd128")) {
        return Err("not built for wasm32 with simd128: run it through `make simd-check`".into());
    }
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut checked = 0u64;
    for round in 0..300_000u64 {
        let len = (next() % 150) as usize;
        let mut v: Vec<u8> = (0..len)
            .map(|_| if next() % 4 == 0 { POOL[(next() % 16) as usize] } else { b'x' })
            .collect();
        if round % 3 == 0 && len > 0 {
            // Plain text with at most one byte of interest, anywhere.
            v.iter_mut().for_each(|b| *b = b'y');
            if next() % 2 == 0 {
                v[(next() as usize) % len] = POOL[(next() % 16) as usize];
            }
        }
        check(&v)?;
        checked += 1;
    }
    for b in 0..=255u8 {
        for at in 0..200 {
            let mut v = vec![b'm'; 200];
            v[at] = b;
            check(&v)?;
            check(&v[..=at])?;
            checked += 2;
        }
    }
    Ok(checked)
}

fn main() {
    match run() {
        Ok(n) => println!("simd-check: the SIMD128 skip agrees with its definition on {n} inputs"),
        Err(e) => {
            eprintln!("simd-check: {e}");
            std::process::exit(1);
        }
    }
}
