//! Bodies read in place and edited at their ends (`body.rs`): what Envoy sends on after the `model` rewrite, however
//! the body arrived (one chunk or many, each held in one slice or many), and the body view's reads and writes on
//! their own, held and not.

use std::ffi::c_void;

use proxy_wasm::types::BufferType;

use super::budget::CONFIG;
use super::fake_envoy::{self, ENVOY};
use crate::abi;
use crate::body::{copy_range, View};
use crate::hooks::*;
use crate::host::{with_current, Current};

const MODEL_FIRST: &str =
    r#"{"model":"chat","messages":[{"role":"user","content":"PROMPT-TEXT-7f3a, and some more words"}]}"#;
const MODEL_LAST: &str =
    r#"{"messages":[{"role":"user","content":"PROMPT-TEXT-7f3a, and some more words"}],"model":"chat"}"#;

fn rewritten(body: &str) -> Vec<u8> {
    body.replacen(r#""model":"chat""#, r#""model":"qwen3-0.6b""#, 1)
        .into_bytes()
}

/// Sends `body` through one stream of `config`, received in pieces cut at `cuts`, each held in slices of `chunk`
/// bytes (0: one slice); the body Envoy sends on.
fn sent(config: *const c_void, body: &str, cuts: &[usize], chunk: usize) -> Vec<u8> {
    fake_envoy::chat_request(chunk);
    let filter = std::ptr::NonNull::<c_void>::dangling().as_ptr();
    let module = envoy_dynamic_module_on_http_filter_new(config, filter);
    assert_eq!(
        envoy_dynamic_module_on_http_filter_request_headers(filter, module, false),
        abi::HEADERS_STOP_ITERATION
    );
    let mut pieces = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain([body.len()].iter()) {
        pieces.push(&body[at..cut]);
        at = cut;
    }
    let last = pieces.len() - 1;
    for (i, piece) in pieces.into_iter().enumerate() {
        ENVOY.with(|e| e.borrow_mut().bodies[0] = piece.as_bytes().to_vec());
        let status = envoy_dynamic_module_on_http_filter_request_body(filter, module, i == last);
        if i < last {
            assert_eq!(status, abi::BODY_STOP_ITERATION_AND_BUFFER);
            fake_envoy::buffer_received(true);
        } else {
            assert_eq!(status, abi::BODY_CONTINUE, "the request goes on");
        }
    }
    let out = fake_envoy::sent_request_body();
    envoy_dynamic_module_on_http_filter_stream_complete(filter, module);
    envoy_dynamic_module_on_http_filter_destroy(module);
    ENVOY.with(|e| assert!(e.borrow().replies.is_empty(), "the request was routed"));
    out
}

#[test]
fn the_model_rewrite_reaches_envoy_however_the_body_arrived() {
    let cfg = super::config(CONFIG);
    for body in [MODEL_FIRST, MODEL_LAST] {
        let n = body.len();
        let model = body.find(r#""model""#).unwrap();
        let cut_sets: Vec<Vec<usize>> = vec![
            vec![],
            vec![n / 2],
            vec![model],
            vec![model + 3],
            vec![model + 12],
            vec![model + 14, model + 15],
            (1..n).step_by(7).collect(),
            (1..n).collect(),
        ];
        for cuts in &cut_sets {
            for chunk in [0, 1, 5] {
                let got = sent(cfg, body, cuts, chunk);
                assert_eq!(
                    String::from_utf8_lossy(&got),
                    String::from_utf8_lossy(&rewritten(body)),
                    "cuts {cuts:?}, slices of {chunk}"
                );
            }
        }
    }
}

#[test]
fn a_body_that_comes_whole_is_edited_without_copying_its_rest() {
    let cfg = super::config(CONFIG);
    let got = sent(cfg, MODEL_FIRST, &[], 0);
    assert_eq!(got, rewritten(MODEL_FIRST));
    // The new head starts the buffered body; the received chunk keeps the rest, drained of the old head in place.
    ENVOY.with(|e| {
        let e = e.borrow();
        assert_eq!(e.bodies[1], br#"{"model":"qwen3-0.6b""#.to_vec());
        assert_eq!(
            e.bodies[0],
            MODEL_FIRST.as_bytes()[r#"{"model":"chat""#.len()..].to_vec()
        );
    });
}

#[test]
fn a_range_is_copied_from_the_slices_it_spans() {
    let slices: [&[u8]; 4] = [b"abc", b"", b"defg", b"h"];
    assert_eq!(copy_range(&slices, 0, usize::MAX), b"abcdefgh");
    assert_eq!(copy_range(&slices, 2, 3), b"cde");
    assert_eq!(copy_range(&slices, 3, 4), b"defg");
    assert_eq!(copy_range(&slices, 7, 9), b"h");
    assert_eq!(copy_range(&slices, 8, 1), b"");
    assert_eq!(copy_range(&slices, 20, 1), b"");
    assert_eq!(copy_range(&slices, 1, 0), b"");
}

/// Runs `f` on the request body's view in a request body hook of a stream Envoy holds or not.
fn in_request_body<T>(buffering: bool, held: bool, f: impl FnOnce(View) -> T) -> T {
    let filter = std::ptr::NonNull::<c_void>::dangling().as_ptr();
    let context = 4242;
    crate::streams::register(context, filter, std::ptr::null());
    crate::streams::hold(context, held);
    let current = Current {
        filter,
        context,
        hook_context: context,
        in_request_body: true,
        buffering_request: buffering,
        ..Current::NONE
    };
    let out = with_current(current, || f(View::of(filter, BufferType::HttpRequestBody).unwrap()));
    crate::streams::unregister(context);
    out
}

fn bodies(buffered: &str, received: &str, chunk: usize) {
    fake_envoy::chat_request(chunk);
    ENVOY.with(|e| {
        let mut e = e.borrow_mut();
        e.bodies[1] = buffered.as_bytes().to_vec();
        e.bodies[0] = received.as_bytes().to_vec();
    });
}

#[test]
fn the_view_reads_and_sizes_the_buffered_then_the_received_chunks() {
    for chunk in [0, 1, 3] {
        bodies("0123", "456789", chunk);
        in_request_body(true, true, |v| {
            assert_eq!(v.len(), 10);
            assert_eq!(v.read(0, usize::MAX), b"0123456789");
            assert_eq!(v.read(3, 4), b"3456");
        });
        // Not buffering: only the received chunk.
        in_request_body(false, true, |v| {
            assert_eq!(v.len(), 6);
            assert_eq!(v.read(1, 2), b"56");
        });
    }
}

#[test]
fn a_prepend_replaces_the_prefix_in_every_shape() {
    // (buffered, received, buffering, held, drain, value, what Envoy sends on)
    let cases = [
        ("0123", "4567", true, true, 2, "ab", "ab234567"),
        ("0123", "4567", true, true, 6, "ab", "ab67"),
        ("0123", "4567", true, true, 4, "", "4567"),
        ("", "4567", false, true, 1, "abc", "abc567"),
        ("", "4567", false, false, 1, "abc", "abc567"),
        ("", "4567", false, false, 9, "abc", "abc"),
        ("0123", "", true, true, 0, "x", "x0123"),
    ];
    for chunk in [0, 1] {
        for (buffered, received, buffering, held, drain, value, want) in cases {
            bodies(buffered, received, chunk);
            assert!(in_request_body(buffering, held, |v| v.write(
                0,
                drain,
                value.as_bytes()
            )));
            let got = fake_envoy::sent_request_body();
            assert_eq!(
                String::from_utf8_lossy(&got),
                want,
                "{buffered}|{received} drain {drain} {value}"
            );
        }
    }
}

#[test]
fn what_the_new_head_repeats_of_the_old_body_stays_in_place() {
    // `model` in the received chunk: the buffered part stays, the received bytes before the edit move behind it.
    bodies("0123", "4567", 1);
    assert!(in_request_body(true, true, |v| v.replace_head(6, &[b"0123", b"45", b"XY"])));
    ENVOY.with(|e| {
        let e = e.borrow();
        assert_eq!(e.bodies[1], b"012345XY");
        assert_eq!(e.bodies[0], b"67");
    });
    // The new head differs inside the buffered part: it is rebuilt.
    bodies("0123", "4567", 1);
    assert!(in_request_body(true, true, |v| v.replace_head(6, &[b"0a23", b"45", b"XY"])));
    assert_eq!(fake_envoy::sent_request_body(), b"0a2345XY67");
    // One received chunk, Envoy holding the request: it starts the buffered body.
    bodies("", "4567", 0);
    assert!(in_request_body(false, true, |v| v.replace_head(3, &[b"45", b"Z"])));
    ENVOY.with(|e| {
        let e = e.borrow();
        assert_eq!(e.bodies[1], b"45Z");
        assert_eq!(e.bodies[0], b"7");
    });
}

#[test]
fn a_common_prefix_is_found_across_slices() {
    use crate::body::common_prefix;
    let a: [&[u8]; 3] = [b"ab", b"cde", b"f"];
    assert_eq!(common_prefix(&a, &[b"abcdef"], usize::MAX), 6);
    assert_eq!(common_prefix(&a, &[b"a", b"bcX"], usize::MAX), 3);
    assert_eq!(common_prefix(&a, &[b"abcdefgh"], 4), 4);
    assert_eq!(common_prefix(&a, &[b"", b"x"], usize::MAX), 0);
    assert_eq!(common_prefix(&[], &[b"x"], usize::MAX), 0);
}

#[test]
fn a_received_chunk_is_preceded_only_while_envoy_holds_the_request() {
    bodies("", "4567", 0);
    assert!(in_request_body(false, false, |v| v.replace_head(1, &[b"abc"])));
    ENVOY.with(|e| {
        let e = e.borrow();
        assert!(
            e.bodies[1].is_empty(),
            "nothing buffered where Envoy would not send it first"
        );
        assert_eq!(e.bodies[0], b"abc567");
    });
}

#[test]
fn an_append_and_an_edit_inside_the_body_land_where_asked() {
    bodies("0123", "4567", 1);
    assert!(in_request_body(true, true, |v| v.write(8, 0, b"89")));
    assert_eq!(fake_envoy::sent_request_body(), b"0123456789");
    bodies("0123", "4567", 1);
    assert!(in_request_body(true, true, |v| v.write(3, 2, b"xyz")));
    assert_eq!(fake_envoy::sent_request_body(), b"012xyz567");
}
