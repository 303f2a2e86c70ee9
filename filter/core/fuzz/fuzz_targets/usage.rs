//! The usage reader on a response body, as `filter/src/response.rs` reads a non-streamed JSON response in the
//! log phase, and on a bare `usage` object, as stream events carry it.
//!
//! Input: the body. Beyond "no panic": a document is accepted only when it is a JSON object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llmroute_core::stream::usage;

fuzz_target!(|data: &[u8]| {
    let Some(doc) = std::str::from_utf8(data).ok().and_then(usage::parse_doc) else {
        return;
    };
    assert!(doc.is_object(), "parse_doc accepted a non-object");
    let u = usage::from_value(&doc);
    let _ = u.is_empty();
    if let Some(inner) = doc.get("usage") {
        let _ = usage::from_usage_object(inner);
    }
});
