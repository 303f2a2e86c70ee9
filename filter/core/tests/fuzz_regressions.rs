//! Regression tests for what the fuzz targets (`filter/core/fuzz/`, `make fuzz`) found, each minimized from the
//! crashing input and kept beside it as a seed in `testdata/fuzz/<target>/`.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::stream::sse::{Event, SseReader};
use llmroute_core::stream::StreamTracker;
use llmroute_core::Api;

/// The events an SSE client reads from `bytes`, and whether it stopped inside one.
fn client_events(bytes: &[u8]) -> (Vec<Event>, bool) {
    let mut r = SseReader::new(usize::MAX);
    let mut out = Vec::new();
    r.feed(bytes, |e, _| out.push(e));
    (out, r.mid_event())
}

/// sse_tracker: a stream cut inside an event, right after a CR. The gateway closed the half event with a lone
/// LF, which a client takes as the second half of CRLF, so the gateway's error event was read as more data of
/// the half event: the client never saw the error.
#[test]
fn closing_a_stream_cut_after_a_cr_still_delivers_the_error_event() {
    for api in [Api::Chat, Api::Completions, Api::Responses, Api::Messages] {
        for cut in [
            "data: {\"choices\":[]}\r",
            "data: x\r: comment\r",
            "event: a\rdata: 1\r",
        ] {
            let mut t = StreamTracker::new(api, false);
            t.feed(cut.as_bytes());
            let tail = t.closing_bytes(Some("req-1")).unwrap();
            let (ours, _) = client_events(&tail);
            let client = [cut.as_bytes(), &tail].concat();
            let (seen, mid) = client_events(&client);
            assert!(!mid, "{api:?} {cut:?}: the client is still inside an event");
            assert_eq!(
                seen.last(),
                ours.last(),
                "{api:?} {cut:?}: the error event was merged into the half event"
            );
            assert!(!ours.last().unwrap().data.is_empty());
        }
    }
}

/// usage: token counts near `u64::MAX` overflowed the sums that make the prompt size (Anthropic's
/// `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`, llama.cpp's `prompt_n + cache_n`):
/// a panic with overflow checks on, a wrapped, tiny figure in the release filter. A figure that does not fit is
/// malformed, and malformed usage yields nothing.
#[test]
fn usage_sums_that_overflow_yield_no_prompt_figure() {
    use llmroute_core::stream::usage::{from_value, parse_doc};
    let anthropic = r#"{"type":"message","usage":{"input_tokens":18446744073709551600,"cache_read_input_tokens":30,"cache_creation_input_tokens":5,"output_tokens":7}}"#;
    let u = from_value(&parse_doc(anthropic).unwrap());
    assert_eq!(u.prompt_tokens, None);
    assert_eq!((u.cached_tokens, u.completion_tokens), (Some(30), Some(7)));
    let created = r#"{"usage":{"input_tokens":1,"cache_read_input_tokens":0,"cache_creation_input_tokens":18446744073709551615}}"#;
    assert_eq!(from_value(&parse_doc(created).unwrap()).prompt_tokens, None);
    let llamacpp = r#"{"timings":{"prompt_n":18446744073709551615,"cache_n":1,"predicted_n":2}}"#;
    let u = from_value(&parse_doc(llamacpp).unwrap());
    assert_eq!(u.prompt_tokens, None);
    assert_eq!((u.cached_tokens, u.completion_tokens), (Some(1), Some(2)));
    // The largest sums that fit are still read.
    let edge = r#"{"timings":{"prompt_n":18446744073709551614,"cache_n":1}}"#;
    assert_eq!(from_value(&parse_doc(edge).unwrap()).prompt_tokens, Some(u64::MAX));
}
