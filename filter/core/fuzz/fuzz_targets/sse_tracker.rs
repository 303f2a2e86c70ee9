//! The SSE tracker on a response stream delivered in chunks, as `filter/src/response.rs` feeds it: cut what it
//! says to cut, then append its closing bytes at the end of the stream.
//!
//! Input: a selector byte (the API, and whether the usage chunk is to be cut), then chunk boundaries and the
//! stream (see `llmroute_core_fuzz::chunks`). Beyond "no panic": the verdict, usage and closing bytes, and the
//! answer the assembler rebuilds from the stream (`stream_upstream: always`), do not depend on where the stream
//! was split; cuts are ordered and inside their chunk; and when the gateway closes
//! a stream, a client's SSE parser reads the gateway's error event as an event of its own, last.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llmroute_core::stream::sse::{Event, SseReader};
use llmroute_core::stream::{self, Assembler, StreamTracker};
use llmroute_core_fuzz::{api, chunks};

/// The events a client's parser reads from `bytes`, and whether it stopped inside one.
fn events(bytes: &[u8]) -> (Vec<Event>, bool) {
    let mut r = SseReader::new(usize::MAX);
    let mut out = Vec::new();
    r.feed(bytes, |e, _| out.push(e));
    (out, r.mid_event())
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let api = api(selector % 5);
    let strip = selector & 0x80 != 0;
    let parts = chunks(rest);
    let mut tracker = StreamTracker::new(api, strip);
    let mut client = Vec::new();
    for chunk in &parts {
        let cuts = tracker.feed(chunk);
        let mut at = 0;
        for &(a, b) in &cuts {
            assert!(
                at <= a && a <= b && b <= chunk.len(),
                "cut {a}..{b} after {at} in {}",
                chunk.len()
            );
            at = b;
        }
        let kept = stream::without(chunk, &cuts);
        let cut: usize = cuts.iter().map(|(a, b)| b - a).sum();
        assert_eq!(kept.len(), chunk.len() - cut);
        client.extend_from_slice(&kept);
    }
    let closing = tracker.closing_bytes(Some("req-1"));

    let whole: Vec<u8> = parts.concat();
    let mut one = StreamTracker::new(api, strip);
    one.feed(&whole);
    assert_eq!(one.verdict(), tracker.verdict(), "the verdict depends on the chunking");
    assert_eq!(one.usage(), tracker.usage(), "the usage depends on the chunking");
    assert_eq!(
        one.closing_bytes(Some("req-1")),
        closing,
        "the closing depends on the chunking"
    );

    let mut asm = Assembler::new(api, 1 << 16);
    for chunk in &parts {
        asm.feed(chunk);
    }
    let mut asm_one = Assembler::new(api, 1 << 16);
    asm_one.feed(&whole);
    assert_eq!(asm.usage(), asm_one.usage(), "the assembler's usage depends on the chunking");
    assert_eq!(asm.finish(), asm_one.finish(), "the rebuilt answer depends on the chunking");

    if let Some(tail) = closing {
        let (ours, _) = events(&tail);
        client.extend_from_slice(&tail);
        let (seen, mid) = events(&client);
        assert!(!mid, "the closed stream still ends inside an event");
        assert_eq!(
            seen.last(),
            ours.last(),
            "the client does not read the gateway's error event as sent"
        );
    }
});
