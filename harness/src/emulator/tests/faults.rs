//! Socket-level tests of the stream faults in every streaming dialect: the exact bytes a client receives
//! compared with the whole stream, and how the body ends (cleanly, with an error, or not at all).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

use super::dialects::{post, request};
use crate::emulator::{Dialect, Emulator};

pub(super) fn streaming() -> impl Iterator<Item = Dialect> {
    Dialect::ALL.into_iter().filter(|dialect| dialect.events().is_some())
}

/// What a client read of a body.
pub(super) struct Received {
    pub bytes: Vec<u8>,
    /// The size of each body frame, in order.
    pub frames: Vec<usize>,
    /// The body ended with an error rather than cleanly.
    pub failed: bool,
}

pub(super) async fn receive(response: reqwest::Response) -> Received {
    let mut received = Received {
        bytes: Vec::new(),
        frames: Vec::new(),
        failed: false,
    };
    let mut body = response.bytes_stream();
    while let Some(item) = body.next().await {
        match item {
            Ok(bytes) => {
                received.frames.push(bytes.len());
                received.bytes.extend_from_slice(&bytes);
            }
            Err(_) => received.failed = true,
        }
    }
    received
}

/// A stream after a reset, so the answer id and the prefix cache are the same for every call.
pub(super) async fn fresh_stream(emulator: &Emulator, dialect: Dialect, headers: &[(&str, &str)]) -> Received {
    emulator.reset();
    let response = post(emulator, dialect, &request(dialect, "stream me", true), headers).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    receive(response).await
}

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap()
}

/// The end of the first event that starts at or after `from`.
fn event_end(bytes: &[u8], from: usize) -> usize {
    let at = bytes[from..].windows(2).position(|pair| pair == b"\n\n").unwrap();
    from + at + 2
}

/// The error event of each dialect after one delta.
fn error_event(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Responses => {
            "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"engine failure\",\
             \"param\":null,\"sequence_number\":5}\n\n"
        }
        Dialect::Messages => {
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"engine failure\"}}\n\n"
        }
        _ => "data: {\"error\":{\"message\":\"engine failure\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n",
    }
}

#[tokio::test]
async fn the_same_request_after_a_reset_gets_the_same_bytes() {
    let emulator = Emulator::spawn("same").await.unwrap();
    for dialect in streaming() {
        let first = fresh_stream(&emulator, dialect, &[]).await;
        let again = fresh_stream(&emulator, dialect, &[]).await;
        assert!(!first.failed);
        assert_eq!(first.bytes, again.bytes, "{dialect:?}");
    }
}

#[tokio::test]
async fn no_terminal_ends_cleanly_before_the_terminal_event() {
    let emulator = Emulator::spawn("nt").await.unwrap();
    for dialect in streaming() {
        let whole = fresh_stream(&emulator, dialect, &[]).await.bytes;
        let got = fresh_stream(&emulator, dialect, &[("x-emu-no-terminal", "1")]).await;
        assert!(!got.failed, "{dialect:?}: a clean end");
        assert!(whole.starts_with(&got.bytes), "{dialect:?}");
        let missing = text(&whole[got.bytes.len()..]);
        let terminal = match dialect {
            Dialect::Chat | Dialect::Completions => "data: [DONE]\n\n",
            Dialect::Responses => "event: response.completed\n",
            _ => "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        };
        assert!(missing.starts_with(terminal), "{dialect:?}: {missing}");
        assert_eq!(missing.matches("\n\n").count(), 1, "{dialect:?}: one event is missing");
    }
    let messages = fresh_stream(&emulator, Dialect::Messages, &[("x-emu-no-terminal", "1")]).await;
    let last = text(&messages.bytes).rsplit_terminator("\n\n").next().unwrap();
    assert!(last.starts_with("event: message_delta\n"), "{last}");
}

#[tokio::test]
async fn error_after_sends_the_error_event_then_ends_cleanly() {
    let emulator = Emulator::spawn("err").await.unwrap();
    for dialect in streaming() {
        let whole = fresh_stream(&emulator, dialect, &[]).await.bytes;
        let got = fresh_stream(&emulator, dialect, &[("x-emu-error-after", "1")]).await;
        assert!(!got.failed, "{dialect:?}: a clean end");
        let error = error_event(dialect);
        assert!(text(&got.bytes).ends_with(error), "{dialect:?}: {}", text(&got.bytes));
        let before = &got.bytes[..got.bytes.len() - error.len()];
        assert!(whole.starts_with(before), "{dialect:?}");
        let before = text(before);
        assert!(
            before.contains("tok0 ") && !before.contains("tok1 "),
            "{dialect:?}: {before}"
        );
    }
}

#[tokio::test]
async fn cut_mid_and_end_mid_stop_inside_an_event() {
    let emulator = Emulator::spawn("mid").await.unwrap();
    for dialect in streaming() {
        let whole = fresh_stream(&emulator, dialect, &[]).await.bytes;
        for (header, fails) in [("x-emu-cut-mid", true), ("x-emu-end-mid", false)] {
            let got = fresh_stream(&emulator, dialect, &[(header, "1")]).await;
            assert_eq!(got.failed, fails, "{dialect:?} {header}");
            assert!(whole.starts_with(&got.bytes), "{dialect:?} {header}");
            let whole_events = text(&got.bytes).rfind("\n\n").unwrap() + 2;
            let next = event_end(&whole, whole_events) - whole_events;
            let partial = &got.bytes[whole_events..];
            assert_eq!(partial.len(), next / 2, "{dialect:?} {header}: half the next event");
            let complete = text(&got.bytes[..whole_events]);
            assert!(complete.contains("tok0 ") && !complete.contains("tok1 "), "{dialect:?}");
            assert_eq!(emulator.inflight(), 0);
        }
    }
}

#[tokio::test]
async fn line_endings_apply_to_every_line() {
    let emulator = Emulator::spawn("eol").await.unwrap();
    for dialect in streaming() {
        let whole = String::from_utf8(fresh_stream(&emulator, dialect, &[]).await.bytes).unwrap();
        for (ending, with) in [("crlf", "\r\n"), ("CR", "\r"), ("lf", "\n")] {
            let got = fresh_stream(&emulator, dialect, &[("x-emu-line-ending", ending)]).await;
            assert_eq!(text(&got.bytes), whole.replace('\n', with), "{dialect:?} {ending}");
        }
        let cut = fresh_stream(
            &emulator,
            dialect,
            &[("x-emu-line-ending", "crlf"), ("x-emu-error-after", "0")],
        )
        .await;
        assert!(text(&cut.bytes).ends_with("}\r\n\r\n"), "{dialect:?}");
        assert!(!text(&cut.bytes).replace("\r\n", "").contains('\n'));
    }
}

#[tokio::test]
async fn trickle_sends_one_byte_per_frame() {
    let emulator = Emulator::spawn("drip").await.unwrap();
    for dialect in streaming() {
        let whole = fresh_stream(&emulator, dialect, &[("x-emu-chunks", "1")]).await.bytes;
        let got = fresh_stream(&emulator, dialect, &[("x-emu-chunks", "1"), ("x-emu-trickle-ms", "0")]).await;
        assert_eq!(got.bytes, whole, "{dialect:?}");
        assert_eq!(got.frames.len(), whole.len(), "{dialect:?}: one frame per byte");
        assert!(got.frames.iter().all(|&size| size == 1));
    }
    let headers = [("x-emu-chunks", "0"), ("x-emu-trickle-ms", "2")];
    let started = Instant::now();
    let got = fresh_stream(&emulator, Dialect::Completions, &headers).await;
    let elapsed = started.elapsed();
    assert_eq!(got.frames.len(), got.bytes.len());
    let least = Duration::from_millis(2 * (got.bytes.len() as u64 - 1));
    assert!(elapsed >= least, "{elapsed:?} for {} bytes", got.bytes.len());
}

#[tokio::test]
async fn stall_sends_the_head_then_nothing_until_the_emulator_stops() {
    for dialect in streaming() {
        let emulator = Emulator::spawn("stall").await.unwrap();
        let body = request(dialect, "x", true);
        let response = post(&emulator, dialect, &body, &[("x-emu-stall", "1")]).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let mut body = response.bytes_stream();
        let waited = tokio::time::timeout(Duration::from_millis(200), body.next()).await;
        assert!(waited.is_err(), "{dialect:?}: no byte within 200 ms: {waited:?}");
        assert_eq!(emulator.inflight(), 1);
        drop(emulator);
        let end = tokio::time::timeout(Duration::from_secs(5), body.next()).await.unwrap();
        assert!(
            matches!(end, Some(Err(_))),
            "{dialect:?}: aborted when the emulator stops: {end:?}"
        );
    }
}

#[tokio::test]
async fn a_client_leaving_a_stall_ends_the_request() {
    let emulator = Emulator::spawn("gone").await.unwrap();
    let body = request(Dialect::Chat, "x", true);
    let response = post(&emulator, Dialect::Chat, &body, &[("x-emu-stall", "1")]).await;
    assert_eq!(emulator.inflight(), 1);
    drop(response);
    for _ in 0..100 {
        if emulator.inflight() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the stalled request should end when its client leaves");
}

#[tokio::test]
async fn bad_or_conflicting_fault_headers_are_refused() {
    let emulator = Emulator::spawn("bad").await.unwrap();
    let body = request(Dialect::Messages, "x", true);
    let cases: [&[(&str, &str)]; 5] = [
        &[("x-emu-cut-after", "1"), ("x-emu-error-after", "1")],
        &[("x-emu-cut-mid", "1"), ("x-emu-end-mid", "2")],
        &[("x-emu-line-ending", "lfcr")],
        &[("x-emu-stall", "yes")],
        &[("x-emu-trickle-ms", "-1")],
    ];
    for headers in cases {
        let response = post(&emulator, Dialect::Messages, &body, headers).await;
        assert_eq!(response.status(), 400, "{headers:?}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["type"], "error", "{headers:?}: the dialect's envelope");
        assert!(error["error"]["message"].as_str().unwrap().starts_with("emulator: "));
    }
}
