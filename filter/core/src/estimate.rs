//! The gateway's own estimate of a request's input tokens, sent upstream as `x-input-tokens` and
//! `x-token-estimate`, and available to capacity and context-length checks.
//!
//! The estimate is deliberately simple and the same for every API, so it is cheap and predictable:
//! - every string value in the body counts ceil(bytes / 4) tokens (keys do not count);
//! - every image part (`"type"` of `image`, `image_url` or `input_image`) counts a flat `image_tokens`;
//! - image payloads (a well-formed base64 `data:` URL, a base64 string under a `data` key as in Anthropic image
//!   sources, or any string of 1 KiB or more made only of base64 characters) count nothing as text, since their
//!   size says nothing about the tokens a vision encoder will use. A `data:` URL counts as binary only when it
//!   names a non-text media type (`type/subtype`) and its payload is base64 characters only; anything else
//!   (`data:;base64,` with no type, which RFC 2397 reads as text, a `text/*` type, or a payload with other
//!   characters) counts as text, so the prefix cannot hide a prompt from the context-length check;
//! - the result is at least 1.
//!
//! It is one linear pass over the validated body, with no allocation. It over-counts JSON scaffolding such as
//! role names and tool schemas slightly, which errs on the safe side for limits.

use crate::json::{nav, Span};

/// Bytes per token assumed for text.
pub const BYTES_PER_TOKEN: usize = 4;
/// A bare base64 string this long or longer is taken for binary data.
const BASE64_MIN: usize = 1024;

/// Estimates the input tokens of a validated JSON body.
pub fn input_tokens(buf: &[u8], image_tokens: u32) -> u64 {
    let mut text_bytes = 0usize;
    let mut images = 0u64;
    let mut last_key_was_type = false;
    let mut last_key_was_data = false;
    let mut i = 0;
    // From string to string: the bytes between them are structure, numbers and literals.
    while let Some(offset) = buf.get(i..).and_then(|rest| rest.iter().position(|&c| c == b'"')) {
        // Both are below the body's length, so the sum cannot overflow.
        i = i.saturating_add(offset);
        let end = nav::skip_string(buf, i);
        let span = Span { start: i, end };
        let is_key = next_non_ws(buf, end) == Some(b':');
        if is_key {
            last_key_was_type = nav::key_eq(buf, span, "type");
            last_key_was_data = nav::key_eq(buf, span, "data");
        } else {
            let inner = buf.get(i.saturating_add(1)..end.saturating_sub(1)).unwrap_or_default();
            if last_key_was_type && matches!(inner, b"image" | b"image_url" | b"input_image") {
                images = images.saturating_add(1);
            } else if !is_binary(inner, last_key_was_data) {
                text_bytes = text_bytes.saturating_add(inner.len());
            }
            last_key_was_type = false;
            last_key_was_data = false;
        }
        i = end;
    }
    let text = text_bytes.div_ceil(BYTES_PER_TOKEN) as u64;
    // An estimate: past `u64::MAX` it stays at the maximum rather than wrap to a small count.
    text.saturating_add(images.saturating_mul(u64::from(image_tokens)))
        .max(1)
}

fn next_non_ws(buf: &[u8], mut i: usize) -> Option<u8> {
    while let Some(&b) = buf.get(i) {
        if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
            return Some(b);
        }
        i = i.saturating_add(1);
    }
    None
}

/// True for image payloads: `data:` URLs with base64 content, base64 under a `data` key (Anthropic image
/// sources), and long strings of base64 characters only.
fn is_binary(s: &[u8], under_data_key: bool) -> bool {
    let base64 = |s: &[u8]| {
        s.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'='))
    };
    data_url(s, base64) || (under_data_key && s.len() >= 16 && base64(s)) || (s.len() >= BASE64_MIN && base64(s))
}

/// True for `data:TYPE/SUBTYPE[;PARAMS];base64,PAYLOAD` with a non-text type and a base64-only payload.
fn data_url(s: &[u8], base64: impl Fn(&[u8]) -> bool) -> bool {
    let Some(rest) = s.strip_prefix(b"data:") else {
        return false;
    };
    let Some(at) = rest.windows(8).position(|w| w == b";base64,") else {
        return false;
    };
    let (head, payload) = (
        rest.get(..at).unwrap_or_default(),
        rest.get(at.saturating_add(8)..).unwrap_or_default(),
    );
    let media = head.split(|&b| b == b';').next().unwrap_or_default();
    let mut parts = media.splitn(2, |&b| b == b'/');
    let token = |p: &[u8]| {
        !p.is_empty()
            && p.iter()
                .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.' | b'_'))
    };
    let (kind, sub) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    token(kind) && token(sub) && !kind.eq_ignore_ascii_case(b"text") && base64(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_counts_a_token_per_four_bytes() {
        // "m" (1) + "user" (4) + 16 bytes of text = 21 bytes -> 6 tokens.
        let body = br#"{"model":"m","messages":[{"role":"user","content":"0123456789abcdef"}]}"#;
        assert_eq!(input_tokens(body, 100), 6);
    }

    #[test]
    fn keys_do_not_count_and_minimum_is_one() {
        assert_eq!(input_tokens(br#"{"a_very_long_key_name_here":1}"#, 100), 1);
        assert_eq!(input_tokens(b"{}", 100), 1);
    }

    #[test]
    fn images_count_flat_and_their_data_does_not() {
        let data = "A".repeat(50_000);
        let chat =
            format!(r#"{{"content":[{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{data}"}}}}]}}"#);
        // "image_url" is the type value (counted as an image, not text); the data URL is skipped.
        assert_eq!(input_tokens(chat.as_bytes(), 500), 500);
        let anthropic = format!(
            r#"{{"content":[{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{data}"}}}}]}}"#
        );
        // "base64" (6) + "image/png" (9) = 15 bytes -> 4 tokens, plus one image.
        assert_eq!(input_tokens(anthropic.as_bytes(), 500), 504);
    }

    #[test]
    fn escaped_quotes_do_not_confuse_the_walk() {
        let body = br#"{"a":"x\"y:z","type":"image"}"#;
        assert_eq!(input_tokens(body, 10), 2 + 10);
    }
}
