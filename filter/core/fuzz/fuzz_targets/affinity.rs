//! The affinity key's public functions: the explicit-key check and hash, and content keys fed piece by piece.
//!
//! Input: a selector byte (system or user-prefix key), a byte for the prefix bound, then text whose pieces are
//! separated by U+001F. Beyond "no panic": a key fed in pieces, stopping when `feed` says the key is full (as the
//! API modules do), equals the key fed the whole text at once; an accepted explicit key is header-safe text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llmroute_core::affinity::{check_explicit, explicit, ContentKey};
use llmroute_core::AffinitySource;
use llmroute_core_fuzz::header_safe;

fuzz_target!(|data: &[u8]| {
    let [selector, max, rest @ ..] = data else {
        return;
    };
    if check_explicit(rest).is_ok() {
        assert!(header_safe(rest) && std::str::from_utf8(rest).is_ok());
        let a = explicit(rest, AffinitySource::SessionHeader);
        assert_eq!(a.header_value().len(), 16);
        assert_eq!(a.hash, explicit(rest, AffinitySource::PromptCacheKey).hash);
    }
    let text = String::from_utf8_lossy(rest);
    let alias = "local-chat";
    let new_key = || match selector % 2 {
        0 => ContentKey::system(alias),
        _ => ContentKey::user_prefix(alias, usize::from(*max)),
    };
    let mut pieces = new_key();
    for piece in text.split('\u{1f}') {
        if !pieces.feed(piece) {
            break;
        }
    }
    let mut whole = new_key();
    whole.feed(&text.replace('\u{1f}', ""));
    assert_eq!(
        pieces.finish(),
        whole.finish(),
        "the key depends on where the text was split"
    );
    // Messages separated from each other, as the system prompt of several messages is fed.
    let mut separated = new_key();
    for piece in text.split('\u{1f}') {
        separated.separate();
        separated.feed(piece);
    }
    let _ = separated.finish();
});
