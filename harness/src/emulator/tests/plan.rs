//! The stream faults on the plan of every streaming dialect, byte for byte and without a socket: where a stream
//! stops and what it ends with, its line endings, its trickle and its stall.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;

use crate::emulator::dialect::testing::answer;
use crate::emulator::dialect::{stream_plan, Dialect, End, EventStream, LineEnding, Stop, StreamFaults, StreamPlan};

/// Every dialect that streams, with its events.
fn streaming() -> impl Iterator<Item = (Dialect, &'static dyn EventStream)> {
    Dialect::ALL
        .into_iter()
        .filter_map(|dialect| dialect.events().map(|events| (dialect, events)))
}

fn plan(events: &dyn EventStream, faults: StreamFaults) -> StreamPlan {
    stream_plan(events, &answer(), &faults)
}

/// Three deltas, stopped as `stop` says.
fn stopped(events: &dyn EventStream, stop: Stop) -> StreamPlan {
    plan(
        events,
        StreamFaults {
            stop: Some(stop),
            ..StreamFaults::new(3)
        },
    )
}

fn head_len(events: &dyn EventStream) -> usize {
    events.head(&answer()).len()
}

fn frame_bytes(plan: &StreamPlan) -> Vec<Bytes> {
    plan.frames.iter().map(|frame| frame.bytes.clone()).collect()
}

/// The terminal event and the error event (after one delta, with the test answer) of each dialect.
fn terminal_and_error(dialect: Dialect) -> (&'static str, &'static str) {
    const OPENAI: &str =
        "data: {\"error\":{\"message\":\"engine failure\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n";
    match dialect {
        Dialect::Chat | Dialect::Completions => ("data: [DONE]\n\n", OPENAI),
        Dialect::Responses => (
            "event: response.completed\n",
            "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"engine failure\",\
             \"param\":null,\"sequence_number\":5}\n\n",
        ),
        Dialect::Messages => (
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"engine failure\"}}\n\n",
        ),
        Dialect::Embeddings => unreachable!("embeddings never stream"),
    }
}

#[test]
fn a_whole_stream_is_head_deltas_tail_terminal() {
    for (dialect, events) in streaming() {
        let whole = plan(events, StreamFaults::new(3));
        assert_eq!(whole.end, End::Finish, "{dialect:?}");
        let head = head_len(events);
        assert_eq!(whole.frames.len(), head + 3 + events.tail(&answer(), 3).len() + 1);
        assert_eq!(whole.frames[head].delay, Duration::from_millis(5));
        let last = whole.frames.last().unwrap();
        let (terminal, _) = terminal_and_error(dialect);
        assert!(last.bytes.starts_with(terminal.as_bytes()), "{dialect:?}: {last:?}");
    }
}

#[test]
fn no_terminal_drops_only_the_terminal_event() {
    for (dialect, events) in streaming() {
        let whole = frame_bytes(&plan(events, StreamFaults::new(3)));
        let faults = StreamFaults {
            no_terminal: true,
            ..StreamFaults::new(3)
        };
        let cut = plan(events, faults);
        assert_eq!(cut.end, End::Finish);
        assert_eq!(frame_bytes(&cut), whole[..whole.len() - 1], "{dialect:?}");
    }
}

#[test]
fn error_after_sends_the_dialect_error_event_instead_of_the_rest() {
    for (dialect, events) in streaming() {
        let whole = frame_bytes(&plan(events, StreamFaults::new(3)));
        let errored = stopped(events, Stop::ErrorAfter(1));
        assert_eq!(errored.end, End::Finish);
        let sent = head_len(events) + 1;
        let frames = frame_bytes(&errored);
        assert_eq!(frames[..sent], whole[..sent], "{dialect:?}");
        assert_eq!(frames.len(), sent + 1);
        let (_, error) = terminal_and_error(dialect);
        assert_eq!(frames[sent], error.as_bytes(), "{dialect:?}");
    }
    let responses = Dialect::Responses.events().unwrap();
    let late = stopped(responses, Stop::ErrorAfter(9));
    let last = late.frames.last().unwrap();
    assert!(std::str::from_utf8(&last.bytes)
        .unwrap()
        .contains("\"sequence_number\":7}"));
}

#[test]
fn cut_after_stops_on_an_event_boundary_and_aborts() {
    for (dialect, events) in streaming() {
        let whole = frame_bytes(&plan(events, StreamFaults::new(3)));
        let head = head_len(events);
        let cut = stopped(events, Stop::CutAfter(1));
        assert_eq!(cut.end, End::Abort);
        assert_eq!(frame_bytes(&cut), whole[..head + 1], "{dialect:?}");
        let past = stopped(events, Stop::CutAfter(9));
        assert_eq!(
            frame_bytes(&past),
            whole[..head + 3],
            "{dialect:?}: all deltas, no tail"
        );
    }
}

#[test]
fn cut_mid_and_end_mid_stop_inside_the_next_event() {
    for (dialect, events) in streaming() {
        let whole = plan(events, StreamFaults::new(3));
        let head = head_len(events);
        for (stop, end) in [(Stop::CutMid(1), End::Abort), (Stop::EndMid(1), End::Finish)] {
            let cut = stopped(events, stop);
            assert_eq!(cut.end, end, "{dialect:?}");
            assert_eq!(cut.frames[..head + 1], whole.frames[..head + 1]);
            let next = &whole.frames[head + 1];
            let half = cut.frames.last().unwrap();
            assert_eq!(cut.frames.len(), head + 2);
            assert_eq!(half.bytes, next.bytes[..next.bytes.len() / 2], "{dialect:?}");
            assert_eq!(half.delay, next.delay, "the half delta comes after the chunk delay");
            assert!(!half.bytes.ends_with(b"\n"));
        }
        // After the last delta, the half event is the first of the tail.
        let late = stopped(events, Stop::EndMid(3));
        let next = &whole.frames[head + 3].bytes;
        assert_eq!(late.frames.last().unwrap().bytes, next[..next.len() / 2]);
    }
    let messages = stopped(Dialect::Messages.events().unwrap(), Stop::CutMid(1));
    let half = &messages.frames.last().unwrap().bytes;
    assert!(half.starts_with(b"event: content_block_delta\ndata: {"), "{half:?}");
}

#[test]
fn line_endings_replace_every_newline() {
    for (dialect, events) in streaming() {
        let lf = plan(events, StreamFaults::new(2)).bytes();
        for (ending, with) in [(LineEnding::CrLf, "\r\n"), (LineEnding::Cr, "\r")] {
            let faults = StreamFaults {
                line_ending: ending,
                ..StreamFaults::new(2)
            };
            let text = String::from_utf8(plan(events, faults).bytes()).unwrap();
            let expected = String::from_utf8(lf.clone()).unwrap().replace('\n', with);
            assert_eq!(text, expected, "{dialect:?} {ending:?}");
        }
        let faults = StreamFaults {
            line_ending: LineEnding::CrLf,
            stop: Some(Stop::ErrorAfter(0)),
            ..StreamFaults::new(2)
        };
        let errored = plan(events, faults).bytes();
        assert!(errored.ends_with(b"}\r\n\r\n"), "{dialect:?}: the error event too");
    }
    // Halving works on the bytes sent: the CRLF event.
    let chat = Dialect::Chat.events().unwrap();
    let faults = StreamFaults {
        line_ending: LineEnding::CrLf,
        stop: Some(Stop::EndMid(3)),
        ..StreamFaults::new(3)
    };
    let half = plan(chat, faults).frames.last().unwrap().bytes.clone();
    let last = chat.tail(&answer(), 3)[0].len() + 2;
    assert_eq!(half.len(), last / 2);
    assert_eq!(LineEnding::parse(" CRLF "), Some(LineEnding::CrLf));
    assert_eq!(LineEnding::parse("lf"), Some(LineEnding::Lf));
    assert_eq!(LineEnding::parse("crlf\n"), Some(LineEnding::CrLf));
    assert_eq!(LineEnding::parse("nl"), None);
}

#[test]
fn trickle_sends_every_byte_alone() {
    let gap = Duration::from_millis(50);
    for (dialect, events) in streaming() {
        let whole = plan(events, StreamFaults::new(2));
        let faults = StreamFaults {
            trickle: Some(gap),
            ..StreamFaults::new(2)
        };
        let trickled = plan(events, faults);
        assert_eq!(trickled.end, End::Finish);
        assert_eq!(trickled.bytes(), whole.bytes(), "{dialect:?}");
        assert_eq!(trickled.frames.len(), whole.bytes().len());
        assert!(trickled.frames.iter().all(|frame| frame.bytes.len() == 1));
        assert_eq!(trickled.frames[0].delay, whole.frames[0].delay);
        let first_delta: usize = events.head(&answer()).iter().map(Bytes::len).sum();
        let after_delay = gap + Duration::from_millis(5);
        if first_delta > 0 {
            assert_eq!(trickled.frames[first_delta].delay, after_delay);
        }
        let rest = &trickled.frames[1..];
        let delayed = rest.iter().filter(|frame| frame.delay == after_delay).count();
        let plain = rest.iter().filter(|frame| frame.delay == gap).count();
        assert_eq!(
            plain + delayed,
            rest.len(),
            "{dialect:?}: each byte a gap after the one before"
        );
        assert_eq!(
            delayed,
            if first_delta == 0 { 1 } else { 2 },
            "{dialect:?}: the deltas' first bytes"
        );
    }
}

#[test]
fn stall_sends_nothing_and_never_ends() {
    for (_, events) in streaming() {
        let faults = StreamFaults {
            stall: true,
            ..StreamFaults::new(3)
        };
        let stall = plan(events, faults);
        assert!(stall.frames.is_empty());
        assert_eq!(stall.end, End::Stall);
    }
}
