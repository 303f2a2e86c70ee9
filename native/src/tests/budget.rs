//! The native host's callback budget of a typical chat request: how many of Envoy's dynamic-module callbacks one
//! request makes, streamed and not, on a warm worker (its stats already defined). The wasm build's host-call
//! budget is `filter/src/tests/budget.rs`; each of its host calls costs one or more callbacks here (a header map
//! is its size then its entries, a body read its chunks' count then the chunks, a request-header write clears the
//! route cache too). It counts; it does not time. Logs are not counted.
//!
//! Bodies (issue 28): a body hook sizes its body from the chunks' lengths (`get_body_size`) instead of reading
//! the chunks, the glue's read is the only full one, and the `model` rewrite's two writes reach Envoy as one
//! edit (a drain of the edited prefix, an append of the new head) instead of two rounds of re-reading the whole
//! body, draining both parts and appending all of it. So the chunk reads went from 10 and 11 to 4 (14 and 15 to
//! 6 streamed: each SSE chunk is read once), the drains from 4 to 1, the appends from 2 to 1, the checks of
//! whether the received chunk is the buffered body from 4 to 3, for 5 (7) size reads: 62 callbacks to 49, 75 to
//! 60 streamed.
//!
//! When a change adds or removes callbacks on purpose, run `cargo test -p llmroute-native budget`, check that the
//! new counts are the ones you meant (the failure prints them in this file's form) and paste them below.

use std::ffi::c_void;

use super::fake_envoy::{self, ENVOY};
use crate::abi;
use crate::hooks::*;

pub(super) const CONFIG: &str = r#"{
  "version": 1,
  "backends": [
    { "name": "llama-a", "kind": "llamacpp", "endpoints": ["127.0.0.1:8081", "127.0.0.1:8082"] }
  ],
  "models": [ { "name": "chat", "routes": [ { "backend": "llama-a", "upstream_model": "qwen3-0.6b" } ] } ],
  "affinity": { "session_headers": ["x-session-id"] }
}"#;

const CHAT: &str = r#"{"model":"chat","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"PROMPT-TEXT-7f3a"}]}"#;
const JSON_ANSWER: &str = r#"{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#;
const SSE: [&str; 3] = [
    "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3}}\n\n",
    "data: [DONE]\n\n",
];

/// A body hook with `chunk` received; a "stop and buffer" answer buffers it, as Envoy does.
fn body(request: bool, chunk: &str, end: bool, filter: abi::FilterEnvoyPtr, module: *const c_void) -> u32 {
    let at = if request { 0 } else { 2 };
    ENVOY.with(|e| e.borrow_mut().bodies[at] = chunk.as_bytes().to_vec());
    let status = if request {
        envoy_dynamic_module_on_http_filter_request_body(filter, module, end)
    } else {
        envoy_dynamic_module_on_http_filter_response_body(filter, module, end)
    };
    if status == abi::BODY_STOP_ITERATION_AND_BUFFER {
        fake_envoy::buffer_received(request);
    }
    status
}

/// One chat exchange through one stream of `config`, as Envoy runs it.
fn exchange(config: *const c_void, stream: bool) {
    fake_envoy::chat_request(0);
    let filter = std::ptr::NonNull::<c_void>::dangling().as_ptr();
    let module = envoy_dynamic_module_on_http_filter_new(config, filter);
    assert!(!module.is_null());
    let chat = if stream {
        CHAT.replacen('{', r#"{"stream":true,"#, 1)
    } else {
        CHAT.to_string()
    };
    let (a, b) = chat.split_at(chat.len() / 2);
    envoy_dynamic_module_on_http_filter_request_headers(filter, module, false);
    body(true, a, false, filter, module);
    body(true, b, true, filter, module);
    let content_type = if stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    ENVOY.with(|e| {
        e.borrow_mut().headers[2] = vec![
            (b":status".to_vec(), b"200".to_vec()),
            (b"content-type".to_vec(), content_type.as_bytes().to_vec()),
        ];
    });
    envoy_dynamic_module_on_http_filter_response_headers(filter, module, false);
    if stream {
        for (i, chunk) in SSE.iter().enumerate() {
            body(false, chunk, i == SSE.len() - 1, filter, module);
        }
    } else {
        body(false, JSON_ANSWER, true, filter, module);
    }
    envoy_dynamic_module_on_http_filter_stream_complete(filter, module);
    envoy_dynamic_module_on_http_filter_destroy(module);
    ENVOY.with(|e| assert!(e.borrow().replies.is_empty(), "the request was routed"));
}

/// Counts the callbacks of the second of two identical requests on one worker.
fn warm_counts(stream: bool) -> Vec<(&'static str, usize)> {
    let cfg = super::config(CONFIG);
    exchange(cfg, stream);
    fake_envoy::take_calls();
    exchange(cfg, stream);
    fake_envoy::take_calls().into_iter().collect()
}

fn check(stream: bool, expected: &[(&str, usize)]) {
    let got = warm_counts(stream);
    let total: usize = got.iter().map(|(_, n)| n).sum();
    let same = got.len() == expected.len() && got.iter().zip(expected).all(|((a, n), (b, m))| a == b && n == m);
    assert!(
        same,
        "callbacks per request changed (stream={stream}, {total} in all); if on purpose, update the budget to:\n{got:?}"
    );
}

#[test]
fn a_plain_chat_request_makes_this_many_callbacks() {
    #[rustfmt::skip]
    check(false, &[
        ("http_append_body", 1),                          // the `model` rewrite's two writes (wasm SetBuffer 2), given to
        ("http_clear_route_cache", 6),                    // each request-header write (wasm SetMapValue 7, one a response header)
        ("http_drain_body", 1),                           // Envoy as one: the edited prefix drained, the new head appended
        ("http_filter_config_increment_counter", 3),      // wasm IncrementMetric 3
        ("http_filter_config_record_histogram_value", 4), // wasm RecordMetric 4
        ("http_get_body_chunks", 4),                      // the glue reads the body once (wasm GetBuffer 2: the
        ("http_get_body_chunks_size", 4),                 // response too); the edit compares the new head with it
        ("http_get_body_size", 5),                        // each body hook sizes the body from its chunks' lengths,
                                                          // and the edit the buffered part
        ("http_get_header", 1),                           // the request path, for a failure reply's envelope
        ("http_get_headers", 2),                          // wasm GetMap 2
        ("http_get_headers_size", 2),
        ("http_received_buffered_request_body", 3),       // whether the received chunk is the buffered body
        ("http_set_filter_state_bytes", 6),               // wasm SetProperty 6
        ("http_set_header", 7),                           // wasm SetMapValue 7
    ]);
}

#[test]
fn a_streamed_chat_request_makes_this_many_callbacks() {
    #[rustfmt::skip]
    check(true, &[
        ("http_append_body", 1),
        ("http_clear_route_cache", 6),
        ("http_drain_body", 1),
        ("http_filter_config_increment_counter", 4),      // wasm IncrementMetric 4
        ("http_filter_config_record_histogram_value", 4),
        ("http_filter_get_attribute_string", 1),          // response.code_details (wasm GetProperty 1)
        ("http_get_body_chunks", 6),                      // as above, and each SSE chunk once
        ("http_get_body_chunks_size", 6),
        ("http_get_body_size", 7),
        ("http_get_header", 1),
        ("http_get_headers", 2),
        ("http_get_headers_size", 2),
        ("http_received_buffered_request_body", 3),
        ("http_set_filter_state_bytes", 8),               // wasm SetProperty 8
        ("http_set_header", 8),                           // wasm SetMapValue 8
    ]);
}
