//! Reading text out of message content, the same way for every API.
//!
//! Chat, Responses and Anthropic messages all carry content as either a string or an array of typed parts; the
//! text parts (`text`, `input_text`) hold a `text` string. Images, tool calls, tool results and reasoning
//! (`thinking`) parts are skipped, so they never shape an affinity key. Everything here walks validated JSON
//! without allocating, except to decode an escaped string.

use std::borrow::Cow;

use crate::affinity::ContentKey;
use crate::json::{nav, Kind, Span};

/// The `role` of a message object.
pub fn role(buf: &[u8], msg: Span) -> Option<Cow<'_, str>> {
    if nav::kind(buf, msg) != Some(Kind::Object) {
        return None;
    }
    nav::str_value(buf, nav::get(buf, msg, "role")?)
}

/// The text of a content part, when it is a text part (at least its first `want` bytes, see [`nav::str_prefix`]).
fn part_text(buf: &[u8], part: Span, want: usize) -> Option<Cow<'_, str>> {
    if nav::kind(buf, part) != Some(Kind::Object) {
        return None;
    }
    if let Some(t) = nav::get(buf, part, "type") {
        let kind = nav::str_value(buf, t)?;
        if !matches!(kind.as_ref(), "text" | "input_text") {
            return None;
        }
    }
    nav::str_prefix(buf, nav::get(buf, part, "text")?, want)
}

/// Feeds the text of `content` (a string or text parts) into `key`, reading of each string only what the key can
/// still take (see [`nav::str_prefix`]).
pub fn feed_content(buf: &[u8], content: Span, key: &mut ContentKey) {
    match nav::kind(buf, content) {
        Some(Kind::String) => {
            if let Some(t) = nav::str_prefix(buf, content, key.room()) {
                key.feed(&t);
            }
        }
        Some(Kind::Array) => {
            for part in nav::array_items(buf, content) {
                if let Some(t) = part_text(buf, part, key.room()) {
                    if !key.feed(&t) {
                        return;
                    }
                }
            }
        }
        _ => {}
    }
}

/// Feeds the text of a message object's `content`.
pub fn feed_message(buf: &[u8], msg: Span, key: &mut ContentKey) {
    if let Some(content) = nav::get(buf, msg, "content") {
        feed_content(buf, content, key);
    }
}

/// Feeds every leading message whose role is one of `roles`, separated from each other.
pub fn feed_leading(buf: &[u8], messages: Span, roles: &[&str], key: &mut ContentKey) {
    for msg in nav::array_items(buf, messages) {
        if !role(buf, msg).is_some_and(|r| roles.contains(&r.as_ref())) {
            break;
        }
        key.separate();
        feed_message(buf, msg, key);
    }
}

/// The first message with role `user`.
pub fn first_user(buf: &[u8], messages: Span) -> Option<Span> {
    nav::array_items(buf, messages).find(|m| role(buf, *m).as_deref() == Some("user"))
}

/// True when `span` is a non-empty array.
pub fn is_non_empty_array(buf: &[u8], span: Span) -> bool {
    nav::kind(buf, span) == Some(Kind::Array) && nav::array_items(buf, span).next().is_some()
}
