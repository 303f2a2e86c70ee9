//! The gateway's own estimate of a request's input tokens, sent upstream as `x-input-tokens` and
//! `x-token-estimate`, and available to capacity and context-length checks.
//!
//! The estimate is deliberately simple and the same for every API (the decision routes included), so it is cheap
//! and predictable:
//! - every string value in the body counts ceil(bytes / 4) tokens (keys do not count);
//! - each image counts a flat `image_tokens`. An image is (as in the NVCF gateway seed) an object whose `type`
//!   is `image`, `image_url` or `input_image`; an element of an `images` array; a value of an `assets` object
//!   (or an element of an `assets` array); or a string `data:image/<type>[;params];base64,<base64>` outside such
//!   an image object (members in any order: a payload met before its object's `type` looks its object up);
//! - an image's own payload counts nothing: a `data:image` URL, base64 under a `data` key inside an image object
//!   (Anthropic image sources), and the whole of an `images` element or `assets` value;
//! - base64 anywhere else counts as text, as do `data:` URLs of other types or with a payload that is not base64
//!   only, so no prefix can hide a prompt from the context-length check;
//! - the result is at least 1.
//!
//! It is one pass over the validated body, with no allocation: strings are stepped over whole, so the brackets it
//! meets are structure, and a depth count tells when a counted image object closes. An image payload met before
//! its object's `type` looks up to three enclosing objects up, each object at most once, so the cost stays linear
//! in the body (at most three extra skims). It over-counts
//! JSON scaffolding such as role names and tool schemas slightly, which errs on the safe side for limits.

use crate::json::{nav, Span, MAX_DEPTH};

/// Bytes per token assumed for text.
pub const BYTES_PER_TOKEN: usize = 4;

/// How many enclosing levels an image payload looks up for its image object (`part.image_url.url` is two).
const LOOKUP_LEVELS: usize = 3;
/// Levels tracked; a validated body nests at most [`MAX_DEPTH`].
const LEVELS: usize = MAX_DEPTH + 2;

/// Estimates the input tokens of a validated JSON body.
pub fn input_tokens(buf: &[u8], image_tokens: u32) -> u64 {
    let mut walk = Walk {
        buf,
        depth: 0,
        in_image: None,
        opened: [None; LEVELS],
        checked: [false; LEVELS],
    };
    let mut text_bytes = 0usize;
    let mut images = 0u64;
    let mut last_key = LastKey::Other;
    let mut i = 0;
    while let Some(&b) = buf.get(i) {
        match b {
            b'{' | b'[' => {
                walk.open(i, b == b'{');
                i = i.saturating_add(1);
                continue;
            }
            b'}' | b']' => {
                walk.close();
                i = i.saturating_add(1);
                continue;
            }
            b'"' => {}
            _ => {
                i = i.saturating_add(1);
                continue;
            }
        }
        let end = nav::skip_string(buf, i);
        let span = Span { start: i, end };
        let is_key = next_non_ws(buf, end) == Some(b':');
        if is_key {
            last_key = LastKey::of(buf, span);
            let accept = match last_key {
                LastKey::Images => Container::Array,
                LastKey::Assets => Container::Any,
                _ => {
                    i = end;
                    continue;
                }
            };
            // Only `images` and `assets` look at their value whole: any other key's value is walked as it comes,
            // so it is not skipped twice. The value starts after the colon (which `is_key` found past any
            // whitespace).
            let value_start = skip_ws(buf, end).saturating_add(1);
            let value_end = nav::skip_value(buf, value_start);
            let value = Span {
                start: skip_ws(buf, value_start),
                end: value_end,
            };
            if let Some(n) = container_items(buf, value, accept) {
                // Every element is one image, and nothing inside it counts as text.
                images = images.saturating_add(n);
                i = value_end;
                last_key = LastKey::Other;
                continue;
            }
            i = end;
            continue;
        }
        let inner = buf.get(i.saturating_add(1)..end.saturating_sub(1)).unwrap_or_default();
        if last_key == LastKey::Type && is_image_type(inner) {
            if walk.in_image.is_none() {
                images = images.saturating_add(1);
                walk.in_image = Some(walk.depth);
            }
        } else if image_data_url(inner) {
            // The payload of an image object whose `type` comes later, or an image on its own: one image either
            // way, and the object's `type` will not count it again.
            if walk.in_image.is_none() {
                walk.find_image_object();
                images = images.saturating_add(1);
            }
        } else if last_key == LastKey::Data && inner.len() >= 16 && base64(inner) {
            // Base64 under `data` is an image's own only inside an image object (an Anthropic image source).
            if walk.in_image.is_none() {
                if walk.find_image_object() {
                    images = images.saturating_add(1);
                } else {
                    text_bytes = text_bytes.saturating_add(inner.len());
                }
            }
        } else {
            text_bytes = text_bytes.saturating_add(inner.len());
        }
        last_key = LastKey::Other;
        i = end;
    }
    let text = text_bytes.div_ceil(BYTES_PER_TOKEN) as u64;
    // An estimate: past `u64::MAX` it stays at the maximum rather than wrap to a small count.
    text.saturating_add(images.saturating_mul(u64::from(image_tokens)))
        .max(1)
}

fn is_image_type(value: &[u8]) -> bool {
    matches!(value, b"image" | b"image_url" | b"input_image")
}

/// Where the walk is: nesting, the open objects, and the image object it is inside, if any.
struct Walk<'b> {
    buf: &'b [u8],
    depth: usize,
    /// The depth of the image object being walked.
    in_image: Option<usize>,
    /// Where the object open at each depth starts (`None` for arrays).
    opened: [Option<usize>; LEVELS],
    /// The object open at this depth was already looked up and has no image `type`.
    checked: [bool; LEVELS],
}

impl Walk<'_> {
    fn open(&mut self, at: usize, object: bool) {
        self.depth = self.depth.saturating_add(1);
        if let Some(slot) = self.opened.get_mut(self.depth) {
            *slot = object.then_some(at);
        }
        if let Some(c) = self.checked.get_mut(self.depth) {
            *c = false;
        }
    }

    fn close(&mut self) {
        if self.in_image == Some(self.depth) {
            self.in_image = None;
        }
        self.depth = self.depth.saturating_sub(1);
    }

    /// Looks a few levels up for an object whose `type` is an image (its `type` may come after its payload, as
    /// with sorted keys). On a hit the walk is inside that image from now on, so its `type` does not count it
    /// again, and this returns true. Each object is looked up at most once, so the cost stays linear.
    fn find_image_object(&mut self) -> bool {
        let lowest = self.depth.saturating_sub(LOOKUP_LEVELS - 1);
        for level in (lowest..=self.depth).rev() {
            let (Some(Some(start)), Some(false)) = (self.opened.get(level), self.checked.get(level)) else {
                continue;
            };
            let object = Span {
                start: *start,
                end: nav::skip_value(self.buf, *start),
            };
            let typed = nav::get(self.buf, object, "type")
                .and_then(|v| self.buf.get(v.start.saturating_add(1)..v.end.saturating_sub(1)))
                .is_some_and(is_image_type);
            if typed {
                self.in_image = Some(level);
                return true;
            }
            if let Some(c) = self.checked.get_mut(level) {
                *c = true;
            }
        }
        false
    }
}

/// The key a value follows, as far as the estimate cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LastKey {
    Type,
    Data,
    Images,
    Assets,
    Other,
}

impl LastKey {
    fn of(buf: &[u8], key: Span) -> LastKey {
        if nav::key_eq(buf, key, "type") {
            LastKey::Type
        } else if nav::key_eq(buf, key, "data") {
            LastKey::Data
        } else if nav::key_eq(buf, key, "images") {
            LastKey::Images
        } else if nav::key_eq(buf, key, "assets") {
            LastKey::Assets
        } else {
            LastKey::Other
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Array,
    Any,
}

/// The number of elements of an array (or, for `Any`, also of an object's members); `None` for other values.
fn container_items(buf: &[u8], value: Span, accept: Container) -> Option<u64> {
    match (buf.get(value.start)?, accept) {
        (b'[', _) => Some(nav::array_items(buf, value).count() as u64),
        (b'{', Container::Any) => Some(nav::object_members(buf, value).count() as u64),
        _ => None,
    }
}

fn skip_ws(buf: &[u8], mut i: usize) -> usize {
    while buf.get(i).is_some_and(|b| matches!(b, b' ' | b'\n' | b'\r' | b'\t')) {
        i = i.saturating_add(1);
    }
    i
}

fn base64(s: &[u8]) -> bool {
    s.iter()
        .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'='))
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

/// True for `data:image/SUBTYPE[;PARAMS];base64,PAYLOAD` with a base64-only payload.
fn image_data_url(s: &[u8]) -> bool {
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
    kind.eq_ignore_ascii_case(b"image") && token(sub) && base64(payload)
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
