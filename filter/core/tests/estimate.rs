//! The input-token estimate: ceil(string-value bytes / 4), a flat count per image (image parts, `images`
//! elements, `assets` values, bare `data:image` URLs), image data not counted, other base64 counted as text, at
//! least 1.
//!
//! The per-capture numbers were computed independently in Python: parse the body, sum the JSON-escaped byte length
//! of every string value except image `type`s and data URLs, divide by 4 rounding up, add 768 per image.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{routes, sdk_api, sdk_body, two_backends, SDK_NAMES};
use llmroute_core::config::DEFAULT_IMAGE_TOKENS;
use llmroute_core::estimate::{input_tokens, BYTES_PER_TOKEN};
use llmroute_core::Api;
use serde_json::json;

const CLAUDE_CODE: &str = "messages-tools-image-thinking-cache-control-claude-code";

fn est(body: &str) -> u64 {
    input_tokens(body.as_bytes(), 768)
}

#[test]
fn constants() {
    assert_eq!(BYTES_PER_TOKEN, 4);
    assert_eq!(DEFAULT_IMAGE_TOKENS, 768);
    assert_eq!(two_backends().image_tokens, 768);
}

#[test]
fn every_capture_has_its_expected_estimate() {
    let expected = [
        ("chat-basic", 10),
        ("chat-stream-include-usage", 13),
        // 269 text bytes (68 tokens) + one image; its 118-byte data URL does not count.
        ("chat-tools-image-prompt-cache-key", 68 + 768),
        ("completions-basic", 7),
        ("embeddings-two-inputs", 9),
        ("messages-basic", 9),
        ("messages-stream", 5),
        ("responses-instructions-prompt-cache-key", 10),
        ("responses-string-input-conversation", 9),
    ];
    for (name, want) in expected {
        assert_eq!(input_tokens(sdk_body(name), 768), want, "{name}");
    }
}

#[test]
fn every_capture_is_at_least_one_and_counts_its_images() {
    for name in SDK_NAMES {
        let body = sdk_body(name);
        let n = input_tokens(body, 768);
        assert!(n >= 1, "{name}");
        let images = usize::from(name.contains("image"));
        // Images count flat: the difference between two image prices is exactly one price step per image.
        assert_eq!(input_tokens(body, 1768) - n, 1000 * images as u64, "{name}");
    }
}

#[test]
fn claude_code_capture_counts_its_text_and_one_image() {
    // 180 bytes of text (45 tokens) + one image, plus at most its 96 bytes of base64 (see the ignored test below).
    let n = input_tokens(sdk_body(CLAUDE_CODE), 768);
    assert!((45 + 768..=45 + 24 + 768).contains(&n), "{n}");
}

#[test]
fn claude_code_capture_image_data_does_not_count() {
    assert_eq!(input_tokens(sdk_body(CLAUDE_CODE), 768), 45 + 768);
    let body = std::str::from_utf8(sdk_body(CLAUDE_CODE)).unwrap();
    let start = body.find(r#""data":""#).unwrap() + 8;
    let end = start + body[start..].find('"').unwrap();
    let emptied = format!("{}{}", &body[..start], &body[end..]);
    assert_eq!(
        input_tokens(body.as_bytes(), 768),
        input_tokens(emptied.as_bytes(), 768)
    );
}

#[test]
fn the_decision_carries_the_estimate_with_the_configured_image_price() {
    for name in SDK_NAMES {
        let body = sdk_body(name);
        let d = routes(&two_backends(), sdk_api(name), body, None);
        assert_eq!(d.input_tokens, input_tokens(body, 768), "{name}");
    }
    let cfg = common::config(&common::TWO_BACKENDS.replacen(
        "\"version\": 1,",
        r#""version": 1, "tokens": { "image_tokens": 100 },"#,
        1,
    ));
    assert_eq!(cfg.image_tokens, 100);
    let d = routes(&cfg, Api::Chat, sdk_body("chat-tools-image-prompt-cache-key"), None);
    assert_eq!(d.input_tokens, 68 + 100);
}

#[test]
fn text_counts_a_token_per_four_bytes_rounded_up() {
    for (text, want) in [
        ("", 1),
        ("a", 1),
        ("abcd", 1),
        ("abcde", 2),
        ("abcdefgh", 2),
        ("abcdefghi", 3),
    ] {
        assert_eq!(est(&json!({ "input": text }).to_string()), want, "{text:?}");
    }
    // Multi-byte text counts bytes, not characters: 3 x 3 bytes -> 3 tokens.
    assert_eq!(est(&json!({ "input": "€€€" }).to_string()), 3);
    assert_eq!(est(&json!({ "input": "abc ".repeat(1000) }).to_string()), 1000);
}

#[test]
fn keys_numbers_and_literals_do_not_count() {
    assert_eq!(
        est(r#"{"a_very_long_key_name_that_is_not_text":123456789,"b":true,"c":null,"d":[1,2,3]}"#),
        1
    );
    assert_eq!(est("{}"), 1);
}

#[test]
fn escaped_text_counts_as_written() {
    // `\"` is two bytes on the wire; the walk must not end the string there.
    assert_eq!(est(r#"{"a":"x\"y:z"}"#), 2);
    assert_eq!(est(r#"{"a":"\\","b":"abcd"}"#), 2);
}

#[test]
fn images_count_flat_whatever_their_size() {
    let chat = |data: &str| {
        json!({ "model": "m", "messages": [ { "role": "user", "content": [
            { "type": "image_url", "image_url": { "url": format!("data:image/png;base64,{data}") } } ] } ] })
        .to_string()
    };
    let small = est(&chat("AAAA"));
    let huge = est(&chat(&"A".repeat(1 << 20)));
    assert_eq!(small, huge);
    // "m" + "user" = 5 bytes -> 2 tokens, plus the image.
    assert_eq!(small, 2 + 768);
    assert_eq!(input_tokens(chat("AAAA").as_bytes(), 0), 2);
}

#[test]
fn every_image_kind_counts() {
    let cases = [
        json!({ "type": "image_url", "image_url": { "url": "https://example.com/a.png" } }),
        json!({ "type": "input_image", "image_url": "data:image/jpeg;base64,/9j/4AAQ" }),
        json!({ "type": "image", "source": { "type": "url", "url": "https://example.com/a.png" } }),
    ];
    for part in cases {
        for n in [1u64, 2, 5] {
            let body = json!({ "content": vec![part.clone(); n as usize] }).to_string();
            // Raising the price per image by 1000 raises the estimate by 1000 per image.
            assert_eq!(
                input_tokens(body.as_bytes(), 1768) - input_tokens(body.as_bytes(), 768),
                1000 * n,
                "{part}"
            );
        }
    }
}

#[test]
fn the_word_image_as_text_is_not_an_image() {
    assert_eq!(est(r#"{"text":"image"}"#), 2);
    assert_eq!(est(r#"{"type":"text","text":"image_url"}"#), 1 + 3);
}

#[test]
fn base64_outside_an_image_counts_as_text() {
    // The NVCF seed's rule: only an image's own payload is free; base64 anywhere else is text.
    let b64 = "QUJD".repeat(256);
    assert_eq!(est(&json!({ "blob": b64 }).to_string()), 256);
    assert_eq!(
        est(&json!({ "data": b64 }).to_string()),
        256,
        "a `data` key outside an image object"
    );
    assert_eq!(est(&json!({ "input": "y".repeat(1024) }).to_string()), 256);
    let pdf = format!("data:application/pdf;base64,{b64}");
    assert_eq!(est(&json!({ "file": pdf }).to_string()), pdf.len().div_ceil(4) as u64);
    // Under a `data` key inside an image object (an Anthropic image source), base64 is the image's.
    let anthropic = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}});
    // "base64" + "image/png" = 15 bytes -> 4 tokens, plus the image.
    assert_eq!(est(&anthropic.to_string()), 4 + 768);
    // A long string with a character outside base64 is text, even there.
    let prose = json!({"type": "image", "source": {"data": format!("{b64} ")}});
    assert!(est(&prose.to_string()) > 256 + 768);
}

#[test]
fn images_arrays_and_assets_values_count_one_image_each_and_nothing_else() {
    let png = format!("data:image/png;base64,{}", "QUJD".repeat(2000));
    let raw = "QUJD".repeat(2000);
    for (body, images, text_tokens) in [
        (
            json!({"model": "m", "images": [png, raw, "https://example.com/a.png"]}),
            3,
            1,
        ),
        (json!({"model": "m", "images": []}), 0, 1),
        (
            json!({"model": "m", "assets": {"front": raw, "back": {"url": png}}}),
            2,
            1,
        ),
        (json!({"model": "m", "assets": [raw]}), 1, 1),
        // Nested: the decision-format input.
        (
            json!({"model": "m", "input": {"images": [png], "prompt": "abcdefgh"}}),
            1,
            1 + 2,
        ),
        // `images` that is not an array is plain content.
        (json!({"model": "m", "images": "abcdefgh"}), 0, 1 + 2),
    ] {
        let at = |price: u32| input_tokens(body.to_string().as_bytes(), price);
        assert_eq!(at(1768) - at(768), 1000 * images, "{body}");
        assert_eq!(at(0), text_tokens, "{body}");
    }
}

#[test]
fn a_bare_image_data_url_is_one_image_but_not_twice_inside_an_image_part() {
    let png = format!("data:image/png;base64,{}", "QUJD".repeat(1000));
    assert_eq!(est(&json!({"content": png}).to_string()), 768);
    let part = json!({"type": "image_url", "image_url": {"url": png, "detail": "high"}});
    // "image_url" is the type (not text); "high" is 1 token; one image, not two.
    assert_eq!(est(&json!({"content": [part.clone(), part]}).to_string()), 2 + 2 * 768);
    let responses = json!({"type": "input_image", "image_url": png});
    assert_eq!(est(&json!({"content": [responses]}).to_string()), 768);
}

#[test]
fn responses_input_image_data_is_not_text() {
    let body = json!({ "model": "m", "input": [ { "role": "user", "content": [
        { "type": "input_text", "text": "abcd" },
        { "type": "input_image", "image_url": format!("data:image/png;base64,{}", "A".repeat(5000)) } ] } ] })
    .to_string();
    // "m" + "user" + "input_text" + "abcd" = 19 bytes -> 5 tokens, plus the image.
    assert_eq!(est(&body), 5 + 768);
}

#[test]
fn text_that_starts_with_data_colon_is_counted() {
    let log = format!("data: {}", "{\"delta\":\"token\"} ".repeat(500));
    let body = json!({ "model": "m", "messages": [ { "role": "user", "content": log } ] }).to_string();
    assert!(est(&body) >= (log.len() / 4) as u64, "{}", est(&body));
}

#[test]
fn the_estimate_is_linear_in_text_and_never_zero() {
    let mut last = 0;
    for n in [0usize, 1, 10, 100, 1000, 10_000] {
        let e = est(&json!({ "messages": [ { "role": "user", "content": "why ".repeat(n) } ] }).to_string());
        assert!(e >= 1);
        assert!(e >= last);
        last = e;
    }
}

#[test]
fn unterminated_input_does_not_panic() {
    // The estimate runs on validated bodies, but it must not panic on anything.
    for raw in [
        &b"\""[..],
        b"\"\\",
        b"{\"a\":\"",
        b"{\"type\":\"image",
        b"\\\\\\\"",
        b"",
    ] {
        assert!(input_tokens(raw, 768) >= 1);
    }
}

#[test]
fn only_well_formed_non_text_data_urls_count_as_images() {
    let text = "x".repeat(4000);
    // Text that a data: prefix must not hide: no media type (RFC 2397 reads it as text/plain), a text type, a
    // type without a subtype, or a payload that is not base64.
    for url in [
        format!("data:;base64,{text}"),
        format!("data:text/plain;base64,{text}"),
        format!("data:image;base64,{text}"),
        format!("data:image/png;base64,{text} and more words"),
    ] {
        let body = json!({"content": url}).to_string();
        assert!(est(&body) >= 1000, "{}: {}", &url[..24], est(&body));
    }
    let png = format!("data:image/png;base64,{}", "QUJD".repeat(1000));
    assert_eq!(est(&json!({"content": png}).to_string()), 768);
    let with_params = format!("data:image/jpeg;name=a.jpg;base64,{}", "QUJD".repeat(1000));
    assert_eq!(est(&json!({"content": with_params}).to_string()), 768);
}
