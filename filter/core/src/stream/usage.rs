//! Token usage as engines report it, read from a JSON response body or from stream events.
//!
//! Four shapes are understood: OpenAI `usage` (`prompt_tokens`, `completion_tokens`,
//! `prompt_tokens_details.cached_tokens`), Responses `usage` (`input_tokens`, `input_tokens_details.cached_tokens`,
//! `output_tokens`), Anthropic `usage` (`input_tokens` counts only uncached input, so the prompt is
//! `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`, and cached is `cache_read_input_tokens`),
//! and llama.cpp `timings` (`prompt_n` uncached, `cache_n` cached, `predicted_n`). Anything missing, malformed or
//! oversized yields nothing: usage never changes delivery.

use serde_json::Value;

use crate::json::{scan_object, MAX_DEPTH};

/// The most bytes of one JSON document read for usage.
pub const MAX_USAGE_DOC: usize = 1 << 20;

/// What a request cost, as far as the engine said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

impl Usage {
    /// Takes every figure `other` has.
    pub fn merge(&mut self, other: Usage) {
        self.prompt_tokens = other.prompt_tokens.or(self.prompt_tokens);
        self.cached_tokens = other.cached_tokens.or(self.cached_tokens);
        self.completion_tokens = other.completion_tokens.or(self.completion_tokens);
    }

    pub fn is_empty(&self) -> bool {
        *self == Usage::default()
    }
}

/// Parses a bounded JSON document; `None` when it is too big, too deep or not an object.
pub fn parse_doc(text: &str) -> Option<Value> {
    if text.len() > MAX_USAGE_DOC || scan_object(text.as_bytes(), MAX_DEPTH).is_err() {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// Usage in any of the shapes, looked for in `doc` itself.
pub fn from_value(doc: &Value) -> Usage {
    let mut u = Usage::default();
    if let Some(t) = doc.get("timings") {
        u.merge(llamacpp(t));
    }
    if let Some(usage) = doc.get("usage").filter(|v| v.is_object()) {
        u.merge(from_usage_object(usage));
    }
    u
}

fn num(v: &Value, path: &[&str]) -> Option<u64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_u64()
}

fn llamacpp(t: &Value) -> Usage {
    let (prompt, cache) = (num(t, &["prompt_n"]), num(t, &["cache_n"]));
    Usage {
        // Counts come from the engine: a sum past `u64::MAX` stays there rather than wrap (or panic).
        prompt_tokens: prompt.map(|p| p.saturating_add(cache.unwrap_or(0))),
        cached_tokens: cache,
        completion_tokens: num(t, &["predicted_n"]),
    }
}

/// A `usage` object of any dialect.
pub fn from_usage_object(u: &Value) -> Usage {
    if u.get("prompt_tokens").is_some() {
        return Usage {
            prompt_tokens: num(u, &["prompt_tokens"]),
            cached_tokens: num(u, &["prompt_tokens_details", "cached_tokens"]),
            completion_tokens: num(u, &["completion_tokens"]),
        };
    }
    let read = num(u, &["cache_read_input_tokens"]);
    if read.is_some() || u.get("cache_creation_input_tokens").is_some() {
        let input = num(u, &["input_tokens"]);
        let created = num(u, &["cache_creation_input_tokens"]).unwrap_or(0);
        return Usage {
            prompt_tokens: input.map(|i| i.saturating_add(read.unwrap_or(0)).saturating_add(created)),
            cached_tokens: read,
            completion_tokens: num(u, &["output_tokens"]),
        };
    }
    Usage {
        prompt_tokens: num(u, &["input_tokens"]),
        cached_tokens: num(u, &["input_tokens_details", "cached_tokens"]),
        completion_tokens: num(u, &["output_tokens"]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openai_usage() {
        let u = from_value(&json!({"usage": {"prompt_tokens": 10, "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 8}}}));
        assert_eq!(
            u,
            Usage {
                prompt_tokens: Some(10),
                cached_tokens: Some(8),
                completion_tokens: Some(3)
            }
        );
    }

    #[test]
    fn anthropic_input_excludes_the_cache() {
        let u = from_usage_object(&json!({"input_tokens": 2, "cache_read_input_tokens": 30,
            "cache_creation_input_tokens": 5, "output_tokens": 7}));
        assert_eq!(
            u,
            Usage {
                prompt_tokens: Some(37),
                cached_tokens: Some(30),
                completion_tokens: Some(7)
            }
        );
    }

    #[test]
    fn responses_usage() {
        let u = from_usage_object(
            &json!({"input_tokens": 20, "input_tokens_details": {"cached_tokens": 16},
            "output_tokens": 4}),
        );
        assert_eq!(
            u,
            Usage {
                prompt_tokens: Some(20),
                cached_tokens: Some(16),
                completion_tokens: Some(4)
            }
        );
    }

    #[test]
    fn llamacpp_timings() {
        let u = from_value(&json!({"timings": {"prompt_n": 4, "cache_n": 60, "predicted_n": 9}}));
        assert_eq!(
            u,
            Usage {
                prompt_tokens: Some(64),
                cached_tokens: Some(60),
                completion_tokens: Some(9)
            }
        );
    }

    #[test]
    fn garbage_gives_nothing() {
        assert!(from_value(&json!({"usage": null})).is_empty());
        assert!(from_value(&json!({"usage": {"prompt_tokens": "x"}}))
            .cached_tokens
            .is_none());
        assert!(parse_doc("[1]").is_none());
        assert!(parse_doc(&format!("{{\"a\":{}{}}}", "[".repeat(100), "]".repeat(100))).is_none());
    }

    #[test]
    fn merge_keeps_earlier_figures() {
        let mut u = Usage {
            prompt_tokens: Some(5),
            cached_tokens: Some(1),
            completion_tokens: None,
        };
        u.merge(Usage {
            completion_tokens: Some(9),
            ..Usage::default()
        });
        assert_eq!(
            u,
            Usage {
                prompt_tokens: Some(5),
                cached_tokens: Some(1),
                completion_tokens: Some(9)
            }
        );
    }
}
