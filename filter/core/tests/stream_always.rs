//! `stream_upstream: always`: the body sent upstream asks for a stream (and its usage), and the decision says
//! the answer is to be rebuilt into one JSON document; requests that already stream, and aliases without the
//! option, go up untouched.

// Tests may index, do plain arithmetic and unwrap; the code that ships may not.
#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::config::{load, Config};
use llmroute_core::endpoint::Api;
use llmroute_core::route::route;

fn cfg() -> Config {
    load(
        r#"{"version":1,"backends":[{"name":"a","kind":"llamacpp","endpoints":["127.0.0.1:1"]}],
            "models":[{"name":"m","routes":[{"backend":"a","upstream_model":"up"}],"stream_upstream":"always"},
                      {"name":"same","routes":[{"backend":"a"}],"stream_upstream":"always"},
                      {"name":"plain","routes":[{"backend":"a"}]}]}"#,
    )
    .unwrap()
}

/// The body that goes upstream, and whether the answer is to be rebuilt.
fn sent(api: Api, body: &str) -> (String, bool) {
    let d = route(&cfg(), api, body.as_bytes(), None).unwrap();
    let out = d
        .patch
        .as_ref()
        .map_or(body.as_bytes().to_vec(), |p| p.apply(body.as_bytes()));
    assert_eq!(d.body_len(body.len()), Some(out.len()));
    assert!(!d.strip_usage_chunk);
    let out = String::from_utf8(out).unwrap();
    serde_json::from_str::<serde_json::Value>(&out).unwrap();
    (out, d.assemble)
}

#[test]
fn a_chat_request_without_stream_gets_stream_and_include_usage() {
    let (out, assemble) = sent(
        Api::Chat,
        r#"{"model":"m", "messages":[{"role":"user","content":"x"}] }"#,
    );
    assert!(assemble);
    assert_eq!(
        out,
        r#"{"model":"up", "messages":[{"role":"user","content":"x"}] ,"stream":true,"stream_options":{"include_usage":true}}"#
    );
}

#[test]
fn stream_false_or_null_is_replaced_in_place() {
    for v in ["false", "null", "0"] {
        let body = format!(r#"{{"stream" : {v},"model":"same","messages":[{{"role":"user","content":"x"}}]}}"#);
        let (out, assemble) = sent(Api::Chat, &body);
        assert!(assemble, "{v}");
        assert_eq!(
            out,
            r#"{"stream" : true,"model":"same","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#
        );
    }
}

#[test]
fn the_clients_stream_options_are_kept() {
    let body = r#"{"model":"same","stream":false,"Stream_Options":{"include_usage":false},"messages":[{"role":"user","content":"x"}]}"#;
    let (out, assemble) = sent(Api::Chat, body);
    assert!(assemble);
    assert_eq!(out, body.replace("\"stream\":false", "\"stream\":true"));
}

#[test]
fn responses_get_stream_only() {
    let (out, assemble) = sent(Api::Responses, r#"{"model":"m","input":"hi"}"#);
    assert!(assemble);
    assert_eq!(out, r#"{"model":"up","input":"hi","stream":true}"#);
}

#[test]
fn streamed_requests_other_apis_and_as_sent_aliases_are_left_alone() {
    let streamed = r#"{"model":"same","stream":true,"messages":[{"role":"user","content":"x"}]}"#;
    assert_eq!(sent(Api::Chat, streamed), (streamed.to_string(), false));
    let completions = r#"{"model":"same","prompt":"x"}"#;
    assert_eq!(sent(Api::Completions, completions), (completions.to_string(), false));
    let plain = r#"{"model":"plain","messages":[{"role":"user","content":"x"}]}"#;
    assert_eq!(sent(Api::Chat, plain), (plain.to_string(), false));
}
