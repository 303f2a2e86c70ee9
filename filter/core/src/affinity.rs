//! The affinity key: which prompt family a request belongs to, so Envoy's ring hash sends the family to the host
//! whose KV cache is already warm.
//!
//! The contract, the same for chat, completions, responses and messages; the first source present wins:
//! 1. **Explicit**: the body's `prompt_cache_key`; then a configured session header; then, when enabled,
//!    the Responses `conversation` id or Anthropic `metadata.user_id`. Explicit keys share one namespace, so the
//!    same id sent in any of these places gives the same key.
//! 2. **Content**: the system prompt (chat `system`/`developer` messages, Responses `instructions`, Anthropic
//!    `system`), hashed together with the resolved alias.
//! 3. **Fallback**: a bounded prefix of the first user message (of `prompt` for completions, of the first input
//!    item for responses), cut on a character boundary, hashed with the alias.
//! 4. **None**: no hash header, and Envoy spreads the request.
//!
//! Assistant turns (including reasoning) never feed a key, so a conversation resent with its history appended
//! keeps its key. The key leaves the filter only as an xxh3-64 hash in hex: prompt text never reaches a header, a
//! log line or a metric label. The hash is seedless, so every Envoy replica, every restart and the native CLI
//! agree on it.

use xxhash_rust::xxh3::Xxh3;

use crate::text::prefix_on_char_boundary;

/// The longest explicit key accepted (session header value, `prompt_cache_key`, conversation id, user id).
pub const EXPLICIT_MAX: usize = 256;

/// Where the key came from. It names the reason in logs, headers, metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AffinitySource {
    PromptCacheKey,
    SessionHeader,
    /// The Responses `conversation` id.
    Conversation,
    /// Anthropic `metadata.user_id`.
    UserId,
    SystemPrompt,
    UserPrefix,
}

impl AffinitySource {
    /// The detailed name, for logs and tests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PromptCacheKey => "prompt_cache_key",
            Self::SessionHeader => "session_header",
            Self::Conversation => "conversation",
            Self::UserId => "user_id",
            Self::SystemPrompt => "system_prompt",
            Self::UserPrefix => "user_prefix",
        }
    }

    /// The value of the `x-llmroute-affinity-source` response header.
    pub fn header_value(self) -> &'static str {
        match self {
            Self::PromptCacheKey => "prompt-cache-key",
            Self::SessionHeader | Self::Conversation | Self::UserId => "session",
            Self::SystemPrompt => "system",
            Self::UserPrefix => "user-prefix",
        }
    }

    /// True for keys the client chose; those are echoed back so later turns can pin to them.
    pub fn is_explicit(self) -> bool {
        !matches!(self, Self::SystemPrompt | Self::UserPrefix)
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
const TAG_EXPLICIT: &[u8] = b"llmroute/session\0";
const TAG_SYSTEM: &[u8] = b"llmroute/system\0";
const TAG_USER: &[u8] = b"llmroute/user\0";
/// Separates the alias from the text, and consecutive system messages from each other.
const SEPARATOR: &[u8] = b"\x1e";

/// Checks an explicit key: 1 to 256 bytes of UTF-8, no control characters.
pub fn check_explicit(v: &[u8]) -> Result<(), &'static str> {
    if v.is_empty() {
        return Err("the value is empty");
    }
    if v.len() > EXPLICIT_MAX {
        return Err("the value is longer than 256 bytes");
    }
    if v.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err("the value contains control characters");
    }
    // The key is echoed back in a header; only text survives that round trip unchanged.
    if std::str::from_utf8(v).is_err() {
        return Err("the value is not valid UTF-8");
    }
    Ok(())
}

/// The key for an explicit id. Not scoped by alias: the client chose it.
pub fn explicit(value: &[u8], source: AffinitySource) -> Affinity {
    let mut h = Xxh3::new();
    h.update(TAG_EXPLICIT);
    h.update(value);
    Affinity {
        source,
        hash: h.digest(),
    }
}

/// Builds a content key from pieces of text, scoped by alias. Empty text gives no key.
pub struct ContentKey {
    hasher: Xxh3,
    source: AffinitySource,
    text_bytes: usize,
    /// For prefix keys: how many more bytes may be fed.
    room: usize,
}

impl ContentKey {
    /// A system-prompt key: the whole text counts.
    pub fn system(alias: &str) -> Self {
        Self::new(TAG_SYSTEM, alias, AffinitySource::SystemPrompt, usize::MAX)
    }

    /// A prefix key: only the first `max` bytes count, cut on a character boundary.
    pub fn user_prefix(alias: &str, max: usize) -> Self {
        Self::new(TAG_USER, alias, AffinitySource::UserPrefix, max)
    }

    fn new(tag: &[u8], alias: &str, source: AffinitySource, room: usize) -> Self {
        let mut hasher = Xxh3::new();
        hasher.update(tag);
        hasher.update(alias.as_bytes());
        hasher.update(SEPARATOR);
        ContentKey {
            hasher,
            source,
            text_bytes: 0,
            room,
        }
    }

    /// Feeds text. Returns false once a prefix key is full, so callers can stop walking.
    pub fn feed(&mut self, text: &str) -> bool {
        let piece = prefix_on_char_boundary(text, self.room);
        self.hasher.update(piece.as_bytes());
        // `piece` is at most `room` bytes, so `room` never goes below 0.
        self.text_bytes = self.text_bytes.saturating_add(piece.len());
        self.room = self.room.saturating_sub(piece.len());
        piece.len() == text.len() && self.room > 0
    }

    /// How many more bytes of text the key takes: `usize::MAX` for a system key, what is left of the prefix for a
    /// prefix key.
    pub fn room(&self) -> usize {
        self.room
    }

    /// Marks a boundary between two messages.
    pub fn separate(&mut self) {
        if self.text_bytes > 0 {
            self.hasher.update(SEPARATOR);
        }
    }

    /// The key, or `None` when no text was fed.
    pub fn finish(self) -> Option<Affinity> {
        (self.text_bytes > 0).then(|| Affinity {
            source: self.source,
            hash: self.hasher.digest(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system(alias: &str, parts: &[&str]) -> Option<Affinity> {
        let mut k = ContentKey::system(alias);
        for p in parts {
            k.feed(p);
        }
        k.finish()
    }

    #[test]
    fn content_keys_are_scoped_by_alias() {
        assert_ne!(system("a", &["You are terse."]), system("b", &["You are terse."]));
        assert_eq!(system("a", &["You are terse."]), system("a", &["You are ", "terse."]));
    }

    #[test]
    fn explicit_keys_are_not_scoped_and_share_a_namespace() {
        let a = explicit(b"conv-1", AffinitySource::PromptCacheKey);
        let b = explicit(b"conv-1", AffinitySource::SessionHeader);
        assert_eq!(a.hash, b.hash);
        assert_ne!(a.hash, explicit(b"conv-2", AffinitySource::SessionHeader).hash);
    }

    #[test]
    fn prefix_keys_stop_at_the_limit() {
        let mut k = ContentKey::user_prefix("m", 4);
        assert!(!k.feed("abcdef"));
        let mut k2 = ContentKey::user_prefix("m", 4);
        assert!(!k2.feed("abcdXYZ"));
        assert_eq!(k.finish(), k2.finish());
    }

    #[test]
    fn prefix_keys_never_split_a_character() {
        let mut k = ContentKey::user_prefix("m", 2);
        k.feed("aé");
        let mut k2 = ContentKey::user_prefix("m", 2);
        k2.feed("a");
        assert_eq!(k.finish(), k2.finish());
    }

    #[test]
    fn no_text_no_key() {
        assert_eq!(system("a", &[]), None);
        assert_eq!(system("a", &[""]), None);
    }

    #[test]
    fn header_values() {
        assert_eq!(AffinitySource::PromptCacheKey.header_value(), "prompt-cache-key");
        assert_eq!(AffinitySource::Conversation.header_value(), "session");
        assert_eq!(AffinitySource::UserPrefix.header_value(), "user-prefix");
        assert!(AffinitySource::UserId.is_explicit());
        assert!(!AffinitySource::SystemPrompt.is_explicit());
        let a = Affinity {
            source: AffinitySource::SystemPrompt,
            hash: 0xab,
        };
        assert_eq!(a.header_value(), "00000000000000ab");
    }

    #[test]
    fn explicit_values_are_checked() {
        assert!(check_explicit(b"abc").is_ok());
        assert!(check_explicit(&[b'a'; 256]).is_ok());
        assert!(check_explicit(&[b'a'; 257]).is_err());
        assert!(check_explicit(b"").is_err());
        assert!(check_explicit(b"a\tb").is_err());
        assert!(check_explicit(b"a\x7f").is_err());
    }
}
