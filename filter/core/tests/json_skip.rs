//! The fast string skips (`json::skip`, with and without the stop at bytes from 0x80 up) against their
//! byte-at-a-time definitions, on random input: every length and alignment around the 8- and 16-byte steps, and
//! bytes drawn mostly from the ones that stop them and their neighbours (`"`, `\`, 0x1f, 0x20, 0x21, 0x5b-0x5d,
//! 0x7f-0x81, 0xa0, 0xff), where a bit trick would slip.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::json::skip::{
    string_stop, string_stop_simple, string_stop_utf8, string_stop_utf8_simple, string_stop_utf8_words,
    string_stop_words,
};

/// Every fast skip against its definition on `bytes`.
fn agree(bytes: &[u8]) -> Result<(), TestCaseError> {
    prop_assert_eq!(string_stop(bytes), string_stop_simple(bytes));
    prop_assert_eq!(string_stop_words(bytes), string_stop_simple(bytes));
    prop_assert_eq!(string_stop_utf8(bytes), string_stop_utf8_simple(bytes));
    prop_assert_eq!(string_stop_utf8_words(bytes), string_stop_utf8_simple(bytes));
    Ok(())
}
use proptest::prelude::*;

/// Bytes near the stop set, plus plain text, plus anything.
fn byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        4 => Just(b'a'),
        2 => prop::sample::select(vec![
            b'"', b'\\', 0x00, 0x01, 0x1f, 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0x81, 0xa0, 0xdc, 0xfe, 0xff,
        ]),
        2 => any::<u8>(),
    ]
}

/// Mostly plain text with a few stop bytes, so the first stop falls anywhere in a long run.
fn sparse() -> impl Strategy<Value = Vec<u8>> {
    (0usize..200, prop::collection::vec((0usize..200, byte()), 0..3)).prop_map(|(len, hits)| {
        let mut v = vec![b'x'; len];
        for (at, b) in hits {
            if let Some(slot) = v.get_mut(at) {
                *slot = b;
            }
        }
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn fast_skip_agrees_with_the_definition(bytes in prop::collection::vec(byte(), 0..80)) {
        agree(&bytes)?;
    }

    #[test]
    fn fast_skip_finds_a_lone_stop_anywhere(bytes in sparse()) {
        agree(&bytes)?;
    }
}

#[test]
fn every_byte_value_at_every_offset() {
    // Past 128 bytes: the fast versions step 64 bytes, then 16, then one at a time.
    for b in 0..=255u8 {
        for at in 0..150 {
            for len in [at + 1, 150] {
                let mut v = vec![b'm'; len];
                v[at] = b;
                assert_eq!(
                    string_stop_words(&v),
                    string_stop_simple(&v),
                    "byte {b:#04x} at {at} of {len}"
                );
                assert_eq!(
                    string_stop(&v),
                    string_stop_simple(&v),
                    "byte {b:#04x} at {at} of {len}"
                );
                assert_eq!(
                    string_stop_utf8_words(&v),
                    string_stop_utf8_simple(&v),
                    "byte {b:#04x} at {at} of {len}"
                );
                assert_eq!(
                    string_stop_utf8(&v),
                    string_stop_utf8_simple(&v),
                    "byte {b:#04x} at {at} of {len}"
                );
            }
        }
    }
}
