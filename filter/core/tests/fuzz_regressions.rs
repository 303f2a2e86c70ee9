//! Regression tests for what the fuzz targets (`filter/core/fuzz/`, `make fuzz`) found, each minimized from the
//! crashing input and kept beside it as a seed in `testdata/fuzz/<target>/`.

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
        for cut in ["data: {\"choices\":[]}\r", "data: x\r: comment\r", "event: a\rdata: 1\r"] {
            let mut t = StreamTracker::new(api, false);
            t.feed(cut.as_bytes());
            let tail = t.closing_bytes(Some("req-1")).unwrap();
            let (ours, _) = client_events(&tail);
            let client = [cut.as_bytes(), &tail].concat();
            let (seen, mid) = client_events(&client);
            assert!(!mid, "{api:?} {cut:?}: the client is still inside an event");
            assert_eq!(seen.last(), ours.last(), "{api:?} {cut:?}: the error event was merged into the half event");
            assert!(!ours.last().unwrap().data.is_empty());
        }
    }
}
