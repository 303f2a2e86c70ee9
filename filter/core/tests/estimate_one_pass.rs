//! The token estimate counted by the validating scanner (the routes' one pass) against the walk over a validated
//! body (`estimate::input_tokens`, the definition): equal on random JSON rich in what the estimate looks at
//! (`type`, `data`, `images`, `assets` keys, image types, `data:image` URLs, base64, escapes, nesting, spacing),
//! and on every SDK capture.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{sdk_body, SDK_NAMES};
use llmroute_core::estimate::{input_tokens, Estimator};
use llmroute_core::json::{scan_object_with, MAX_DEPTH};
use proptest::prelude::*;
use serde_json::{Map, Value};

/// The scanner's count, or `None` when the body does not scan.
fn one_pass(body: &[u8], image_tokens: u32) -> Option<u64> {
    let mut est = Estimator::new(body);
    scan_object_with(body, MAX_DEPTH, &mut est).ok()?;
    Some(est.finish(image_tokens))
}

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "type",
        "data",
        "images",
        "assets",
        "url",
        "image_url",
        "source",
        "content",
        "text",
        "Type",
        "dat\u{61}",
        "x",
    ])
    .prop_map(String::from)
}

fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "image",
            "image_url",
            "input_image",
            "text",
            "base64",
            "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==",
            "data:image/png;base64,not base64!",
            "data:text/plain;base64,aGVsbG8=",
            "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=",
            "short",
            "quote \" and back\\slash and \u{e9}\n",
            "",
        ])
        .prop_map(String::from),
        "[a-z {}\\[\\]:,\"\\\\]{0,24}",
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        3 => string().prop_map(Value::String),
        1 => any::<i32>().prop_map(Value::from),
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn body() -> impl Strategy<Value = Value> {
    prop::collection::vec((key(), value()), 0..8).prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn the_scanners_count_is_the_walks(doc in body(), pretty in any::<bool>(), image_tokens in 0u32..2000) {
        let text = if pretty { serde_json::to_string_pretty(&doc) } else { serde_json::to_string(&doc) }.unwrap();
        let body = text.as_bytes();
        prop_assert_eq!(one_pass(body, image_tokens), Some(input_tokens(body, image_tokens)), "{}", text);
    }
}

#[test]
fn every_capture_counts_the_same_both_ways() {
    for name in SDK_NAMES {
        let body = sdk_body(name);
        for image_tokens in [0, 768, 1768] {
            assert_eq!(
                one_pass(body, image_tokens),
                Some(input_tokens(body, image_tokens)),
                "{name}"
            );
        }
    }
}

/// Duplicated keys (which a JSON map cannot make) and images containers of every shape, written by hand.
#[test]
fn hand_written_shapes_count_the_same_both_ways() {
    let bodies = [
        r#"{"images":["a","b",{"x":"text"}],"images":5,"assets":{"a":1,"b":[1,2]}}"#,
        r#"{"images":{"k":"counted as text"},"assets":["x",{"y":"z"}],"t":"after"}"#,
        r#"{"images":[],"assets":{},"x":[{"images":[[1],[2,3]]}]}"#,
        r#"{"c":[{"data":"QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=","type":"image"},{"type":"image","type":"image_url"}]}"#,
        r#"{"c":[{"image_url":{"url":"data:image/png;base64,AAAA"},"type":"image_url"}],"type":["image"]}"#,
        r#"{ "images" : [ 1 , 2 ] , "type" : "input_image" , "x" : "yz" }"#,
    ];
    for body in bodies {
        for image_tokens in [0, 100] {
            assert_eq!(
                one_pass(body.as_bytes(), image_tokens),
                Some(input_tokens(body.as_bytes(), image_tokens)),
                "{body}"
            );
        }
    }
}
