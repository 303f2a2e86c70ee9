//! Reading text out of message content, the same way for every API.
//!
//! Chat, Responses and Anthropic messages all carry content as either a string or an array of typed parts; the
//! text parts (`text`, `input_text`) hold a `text` string. Images, tool calls, tool results and reasoning
//! (`thinking`) parts are skipped, so they never shape an affinity key. Everything here walks validated JSON
//! without allocating, except to decode an escaped string.
//!
//! The messages of a `messages` array are read through the scan's [`MessageIndex`] when it covers the array,
//! else found by walking; [`Message`] reads a message's role and content the same way from either.

use std::borrow::Cow;

use crate::affinity::ContentKey;
use crate::json::{nav, Kind, Span};
use crate::message_index::{Entry, MessageIndex};

/// One message of a `messages` array: as the scan indexed it, or its span, to walk.
#[derive(Debug, Clone, Copy)]
pub enum Message {
    Indexed(Entry),
    Walked(Span),
}

impl Message {
    /// The message's `role`, when it is an object whose first `role` is a string.
    pub fn role(self, buf: &[u8]) -> Option<Cow<'_, str>> {
        match self {
            Message::Indexed(e) if e.object => nav::str_value(buf, e.role?),
            Message::Indexed(_) => None,
            Message::Walked(span) => role(buf, span),
        }
    }

    /// The value of the message's first `content` member.
    pub fn content(self, buf: &[u8]) -> Option<Span> {
        match self {
            Message::Indexed(e) => e.content.filter(|_| e.object),
            Message::Walked(span) => nav::get(buf, span, "content"),
        }
    }
}

/// The messages of the array in `messages`, in order: from `index` while it covers them, then by walking.
pub fn messages<'a>(buf: &'a [u8], messages: Span, index: Option<&'a MessageIndex<'_>>) -> Messages<'a> {
    match index.and_then(|i| i.of(messages)) {
        Some(indexed) => Messages {
            buf,
            span: messages,
            indexed: indexed.entries.iter(),
            walk_after: indexed.overflow.then_some(indexed.entries.len()),
            walking: None,
        },
        None => Messages {
            buf,
            span: messages,
            indexed: [].iter(),
            walk_after: Some(0),
            walking: None,
        },
    }
}

/// The iterator of [`messages`].
pub struct Messages<'a> {
    buf: &'a [u8],
    span: Span,
    indexed: std::slice::Iter<'a, Entry>,
    /// Once the index is used up: walk on, past this many elements, or stop (`None`).
    walk_after: Option<usize>,
    walking: Option<std::iter::Skip<nav::ArrayItems<'a>>>,
}

impl Iterator for Messages<'_> {
    type Item = Message;

    fn next(&mut self) -> Option<Message> {
        if let Some(e) = self.indexed.next() {
            return Some(Message::Indexed(*e));
        }
        if self.walking.is_none() {
            let skip = self.walk_after.take()?;
            self.walking = Some(nav::array_items(self.buf, self.span).skip(skip));
        }
        self.walking.as_mut()?.next().map(Message::Walked)
    }
}

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
    feed_indexed(buf, Message::Walked(msg), key);
}

/// Feeds the text of a message's `content`, however it was found.
fn feed_indexed(buf: &[u8], msg: Message, key: &mut ContentKey) {
    if let Some(content) = msg.content(buf) {
        feed_content(buf, content, key);
    }
}

/// Feeds every leading message whose role is one of `roles`, separated from each other.
pub fn feed_leading(buf: &[u8], list: Span, index: Option<&MessageIndex<'_>>, roles: &[&str], key: &mut ContentKey) {
    for msg in messages(buf, list, index) {
        if !msg.role(buf).is_some_and(|r| roles.contains(&r.as_ref())) {
            break;
        }
        key.separate();
        feed_indexed(buf, msg, key);
    }
}

/// Feeds the text of the first message with role `user`; false when there is none.
pub fn feed_first_user(buf: &[u8], list: Span, index: Option<&MessageIndex<'_>>, key: &mut ContentKey) -> bool {
    let Some(msg) = messages(buf, list, index).find(|m| m.role(buf).as_deref() == Some("user")) else {
        return false;
    };
    feed_indexed(buf, msg, key);
    true
}

/// True when `span` is a non-empty array.
pub fn is_non_empty_array(buf: &[u8], span: Span, index: Option<&MessageIndex<'_>>) -> bool {
    nav::kind(buf, span) == Some(Kind::Array) && messages(buf, span, index).next().is_some()
}
