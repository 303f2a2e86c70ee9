//! The affinity key: which prompt family a request belongs to, so Envoy's ring hash sends the family to the host
//! whose KV cache is already warm.
//!
//! The contract, first match wins:
//! 1. a configured session header (explicit, set by the client or an agent framework);
//! 2. the body's `prompt_cache_key` (the OpenAI SDK's explicit key; same namespace as the session header);
//! 3. the system prompt: every `system`/`developer` message before the conversation starts, text parts joined;
//! 4. a bounded prefix of the first `user` message, cut on a character boundary;
//! 5. nothing, and Envoy spreads the request.
//!
//! Assistant turns never feed the key, so a multi-turn conversation keeps its key as it grows. The key leaves the
//! filter only as an xxh3-64 hash in hex: prompt text never reaches a header, a log line or a metric label.
//! The hash is seedless, so every Envoy replica, every restart and the native CLI agree on it.
//! Cost: one pass over the system messages and at most `user_prefix_bytes` of the first user message.

use std::borrow::Cow;

use xxhash_rust::xxh3::Xxh3;

use crate::json::{nav, Kind, Span};
use crate::text::prefix_on_char_boundary;

/// The longest session header value accepted.
pub const SESSION_VALUE_MAX: usize = 256;

/// Where the key came from. It names the reason in logs, the debug header, metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AffinitySource {
    SessionHeader,
    PromptCacheKey,
    SystemPrompt,
    UserPrefix,
}

impl AffinitySource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SessionHeader => "session_header",
            Self::PromptCacheKey => "prompt_cache_key",
            Self::SystemPrompt => "system_prompt",
            Self::UserPrefix => "user_prefix",
        }
    }
}

/// A computed key: its source and its hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Affinity {
    pub source: AffinitySource,
    pub hash: u64,
}

impl Affinity {
    /// The value of the hash header: 16 lower-case hex digits.
    pub fn header_value(&self) -> String {
        format!("{:016x}", self.hash)
    }
}

/// Domain tags keep the namespaces apart: a system prompt never collides with an equal user message.
const TAG_SESSION: &[u8] = b"llmroute/session\0";
const TAG_SYSTEM: &[u8] = b"llmroute/system\0";
const TAG_USER: &[u8] = b"llmroute/user\0";
/// Separates consecutive system messages in the hash input.
const MESSAGE_SEPARATOR: &[u8] = b"\x1e";

/// Checks a session header value: 1 to 256 bytes, no control characters.
pub fn check_session_value(v: &[u8]) -> Result<(), &'static str> {
    if v.is_empty() {
        return Err("the value is empty");
    }
    if v.len() > SESSION_VALUE_MAX {
        return Err("the value is longer than 256 bytes");
    }
    if v.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err("the value contains control characters");
    }
    Ok(())
}

/// The key for an explicit session id (header or `prompt_cache_key`).
pub fn session(value: &[u8], source: AffinitySource) -> Affinity {
    let mut h = Xxh3::new();
    h.update(TAG_SESSION);
    h.update(value);
    Affinity {
        source,
        hash: h.digest(),
    }
}

/// The content key of a chat `messages` array: system prompt, else first-user prefix.
pub fn chat_messages(buf: &[u8], messages: Span, user_prefix_bytes: usize) -> Option<Affinity> {
    system_prompt(buf, messages).or_else(|| first_user_prefix(buf, messages, user_prefix_bytes))
}

/// Hashes the leading `system`/`developer` messages. `None` when there are none or they hold no text.
pub fn system_prompt(buf: &[u8], messages: Span) -> Option<Affinity> {
    let mut h = Xxh3::new();
    h.update(TAG_SYSTEM);
    let mut text_bytes = 0usize;
    for (i, msg) in nav::array_items(buf, messages).enumerate() {
        if !matches!(role(buf, msg).as_deref(), Some("system" | "developer")) {
            break;
        }
        if i > 0 {
            h.update(MESSAGE_SEPARATOR);
        }
        for_each_text(buf, msg, |t| {
            text_bytes += t.len();
            h.update(t.as_bytes());
            true
        });
    }
    (text_bytes > 0).then(|| Affinity {
        source: AffinitySource::SystemPrompt,
        hash: h.digest(),
    })
}

/// Hashes up to `max` bytes of the first `user` message's text. `None` when `max` is 0 or there is no text.
pub fn first_user_prefix(buf: &[u8], messages: Span, max: usize) -> Option<Affinity> {
    if max == 0 {
        return None;
    }
    let msg = nav::array_items(buf, messages).find(|m| role(buf, *m).as_deref() == Some("user"))?;
    let mut prefix = String::new();
    for_each_text(buf, msg, |t| {
        let room = max - prefix.len();
        prefix.push_str(prefix_on_char_boundary(t, room));
        prefix.len() < max && t.len() <= room
    });
    text_key(TAG_USER, &prefix, AffinitySource::UserPrefix)
}

/// Hashes a plain text under a tag. `None` for empty text.
pub fn text_key(tag: &[u8], text: &str, source: AffinitySource) -> Option<Affinity> {
    if text.is_empty() {
        return None;
    }
    let mut h = Xxh3::new();
    h.update(tag);
    h.update(text.as_bytes());
    Some(Affinity {
        source,
        hash: h.digest(),
    })
}

fn role(buf: &[u8], msg: Span) -> Option<Cow<'_, str>> {
    if nav::kind(buf, msg) != Some(Kind::Object) {
        return None;
    }
    nav::str_value(buf, nav::get(buf, msg, "role")?)
}

/// Calls `f` with each piece of text in a message's `content`: the string itself, or each `text` part of an
/// array. Stops when `f` returns false.
fn for_each_text(buf: &[u8], msg: Span, mut f: impl FnMut(&str) -> bool) {
    let Some(content) = nav::get(buf, msg, "content") else {
        return;
    };
    match nav::kind(buf, content) {
        Some(Kind::String) => {
            if let Some(t) = nav::str_value(buf, content) {
                f(&t);
            }
        }
        Some(Kind::Array) => {
            for part in nav::array_items(buf, content) {
                if nav::kind(buf, part) != Some(Kind::Object) {
                    continue;
                }
                let text = nav::get(buf, part, "text").and_then(|t| nav::str_value(buf, t));
                if let Some(t) = text {
                    if !f(&t) {
                        return;
                    }
                }
            }
        }
        _ => {}
    }
}
