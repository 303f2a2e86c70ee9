//! The gateway's own estimate of a request's input tokens, sent upstream as `x-input-tokens` and
//! `x-token-estimate`, and available to capacity and context-length checks.
//!
//! The estimate is deliberately simple and the same for every API (the decision routes included), so it is cheap
//! and predictable:
//! - every string value in the body counts ceil(bytes / 4) tokens (keys do not count);
//! - each image counts a flat `image_tokens`. An image is (as in the NVCF LLM Gateway) an object whose `type`
//!   is `image`, `image_url` or `input_image`; an element of an `images` array; a value of an `assets` object
//!   (or an element of an `assets` array); or a string `data:image/<type>[;params];base64,<base64>` outside such
//!   an image object (members in any order: a payload met before its object's `type` looks its object up);
//! - an image's own payload counts nothing: a `data:image` URL, base64 under a `data` key inside an image object
//!   (Anthropic image sources), and the whole of an `images` element or `assets` value;
//! - base64 anywhere else counts as text, as do `data:` URLs of other types or with a payload that is not base64
//!   only, so no prefix can hide a prompt from the context-length check;
//! - the result is at least 1.
//!
//! The count is an [`Estimator`] fed the body's structure as events (a container opens or closes, a key, a string
//! value, a value starts). Two drivers feed it, one behaviour:
//! - the validating scanner, while it validates ([`crate::json::scan_object_with`]): the routes take the estimate
//!   from the one pass that also checks the JSON and indexes the top-level members, with no second walk;
//! - [`input_tokens`], a walk over an already validated body, for callers that hold no scan. It is the
//!   definition the property test (`filter/core/tests/estimate_one_pass.rs`) holds the scanner's count to.
//!
//! No allocation: strings are stepped over whole, so the brackets met are structure, and a depth count tells
//! when a counted image object closes. An `images` or `assets` value counts its elements and nothing inside
//! them: the walk looks the container over and skips it, the scanner counts the elements as they come and mutes
//! the rest. An image payload met before its object's `type` looks up to three enclosing objects up, each object
//! at most once, so the cost stays linear in the body (at most three extra skims). It over-counts
//! JSON scaffolding such as role names and tool schemas slightly, which errs on the safe side for limits.

use crate::json::{nav, Span, Visit, MAX_DEPTH};

/// Bytes per token assumed for text.
pub const BYTES_PER_TOKEN: usize = 4;

/// How many enclosing levels an image payload looks up for its image object (`part.image_url.url` is two).
const LOOKUP_LEVELS: usize = 3;
/// Levels tracked; a validated body nests at most [`MAX_DEPTH`].
const LEVELS: usize = MAX_DEPTH + 2;

/// Estimates the input tokens of a validated JSON body, walking it.
pub fn input_tokens(buf: &[u8], image_tokens: u32) -> u64 {
    let mut est = Estimator::new(buf);
    let mut i = 0;
    while let Some(&b) = buf.get(i) {
        match b {
            b'{' | b'[' => {
                est.open(i, b == b'{');
                i = i.saturating_add(1);
                continue;
            }
            b'}' | b']' => {
                est.close(i.saturating_add(1));
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
        // A key is a string followed by a colon.
        if next_non_ws(buf, end) != Some(b':') {
            est.string_value(span);
            i = end;
            continue;
        }
        est.key(span);
        if let Some(accept) = est.pending {
            // `images` or `assets`: look the value over whole. The value starts after the colon (which the key
            // check found past any whitespace).
            let value_start = skip_ws(buf, end).saturating_add(1);
            let value_end = nav::skip_value(buf, value_start);
            let value = Span {
                start: skip_ws(buf, value_start),
                end: value_end,
            };
            if let Some(n) = container_items(buf, value, accept) {
                est.whole(n);
                i = value_end;
                continue;
            }
        }
        i = end;
    }
    est.finish(image_tokens)
}

/// The estimate's state, fed the body's structure in document order (see the module doc).
pub struct Estimator<'b> {
    walk: Walk<'b>,
    text_bytes: usize,
    images: u64,
    last_key: LastKey,
    /// After an `images` or `assets` key: the containers its value may be to count whole.
    pending: Option<Container>,
    /// Inside such a container: its element count is running, nothing in it counts as text.
    muted: Option<Muted>,
}

/// A container counted whole while the scanner walks through it.
#[derive(Clone, Copy)]
struct Muted {
    /// Levels open inside it, itself included: its elements are at level 1.
    levels: usize,
    array: bool,
}

impl<'b> Estimator<'b> {
    pub fn new(buf: &'b [u8]) -> Self {
        Estimator {
            walk: Walk {
                buf,
                depth: 0,
                in_image: None,
                opened: [None; LEVELS],
                checked: [false; LEVELS],
            },
            text_bytes: 0,
            images: 0,
            last_key: LastKey::Other,
            pending: None,
            muted: None,
        }
    }

    /// The estimate: ceil(text bytes / 4) plus `image_tokens` per image, at least 1.
    pub fn finish(&self, image_tokens: u32) -> u64 {
        let text = self.text_bytes.div_ceil(BYTES_PER_TOKEN) as u64;
        // An estimate: past `u64::MAX` it stays at the maximum rather than wrap to a small count.
        text.saturating_add(self.images.saturating_mul(u64::from(image_tokens)))
            .max(1)
    }

    /// An `images` or `assets` value of `n` elements, looked over whole and skipped.
    fn whole(&mut self, n: u64) {
        self.images = self.images.saturating_add(n);
        self.last_key = LastKey::Other;
        self.pending = None;
    }
}

/// The structure's events, in document order: from the scanner, or from the walk in [`input_tokens`].
impl Visit for Estimator<'_> {
    fn open(&mut self, at: usize, object: bool) {
        if let Some(m) = &mut self.muted {
            m.levels = m.levels.saturating_add(1);
            return;
        }
        let accepted = match self.pending.take() {
            Some(Container::Array) => !object,
            Some(Container::Any) => true,
            None => false,
        };
        if accepted {
            self.muted = Some(Muted {
                levels: 1,
                array: !object,
            });
            return;
        }
        self.walk.open(at, object);
    }

    fn close(&mut self, _at: usize) {
        if let Some(m) = &mut self.muted {
            m.levels = m.levels.saturating_sub(1);
            if m.levels == 0 {
                self.muted = None;
                self.last_key = LastKey::Other;
            }
            return;
        }
        self.pending = None;
        self.walk.close();
    }

    fn key(&mut self, span: Span) {
        if let Some(m) = self.muted {
            if m.levels == 1 && !m.array {
                self.images = self.images.saturating_add(1);
            }
            return;
        }
        self.last_key = LastKey::of(self.walk.buf, span);
        self.pending = match self.last_key {
            LastKey::Images => Some(Container::Array),
            LastKey::Assets => Some(Container::Any),
            _ => None,
        };
    }

    fn value_start(&mut self, _at: usize) {
        if let Some(m) = self.muted {
            if m.levels == 1 && m.array {
                self.images = self.images.saturating_add(1);
            }
        }
    }

    fn string_value(&mut self, span: Span) {
        if self.muted.is_some() {
            return;
        }
        self.pending = None;
        let buf = self.walk.buf;
        let inner = buf
            .get(span.start.saturating_add(1)..span.end.saturating_sub(1))
            .unwrap_or_default();
        let walk = &mut self.walk;
        if self.last_key == LastKey::Type && is_image_type(inner) {
            if walk.in_image.is_none() {
                self.images = self.images.saturating_add(1);
                walk.in_image = Some(walk.depth);
            }
        } else if image_data_url(inner) {
            // The payload of an image object whose `type` comes later, or an image on its own: one image either
            // way, and the object's `type` will not count it again.
            if walk.in_image.is_none() {
                walk.find_image_object();
                self.images = self.images.saturating_add(1);
            }
        } else if self.last_key == LastKey::Data && inner.len() >= 16 && base64(inner) {
            // Base64 under `data` is an image's own only inside an image object (an Anthropic image source).
            if walk.in_image.is_none() {
                if walk.find_image_object() {
                    self.images = self.images.saturating_add(1);
                } else {
                    self.text_bytes = self.text_bytes.saturating_add(inner.len());
                }
            }
        } else {
            self.text_bytes = self.text_bytes.saturating_add(inner.len());
        }
        self.last_key = LastKey::Other;
    }
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
