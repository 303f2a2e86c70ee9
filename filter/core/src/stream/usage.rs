//! Token usage as engines report it, read from a JSON response body or from stream events.
//!
//! Four shapes are understood: OpenAI `usage` (`prompt_tokens`, `completion_tokens`,
//! `prompt_tokens_details.cached_tokens`), Responses `usage` (`input_tokens`, `input_tokens_details.cached_tokens`,
//! `output_tokens`), Anthropic `usage` (`input_tokens` counts only uncached input, so the prompt is
//! `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`, and cached is `cache_read_input_tokens`),
//! and llama.cpp `timings` (`prompt_n` uncached, `cache_n` cached, `predicted_n`). Anything missing, malformed or
//! oversized yields nothing: usage never changes delivery.

use serde_json::Value;

use crate::json::{nav, scan_object, Kind, Member, MAX_DEPTH};

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
    readable(text).then(|| serde_json::from_str(text).ok()).flatten()
}

/// True when `text` is within the bounds of a document read for usage: at most [`MAX_USAGE_DOC`] bytes, one JSON
/// object nested at most [`MAX_DEPTH`] levels.
fn readable(text: &str) -> bool {
    text.len() <= MAX_USAGE_DOC && scan_object(text.as_bytes(), MAX_DEPTH).is_ok()
}

/// The usage of a whole JSON answer: the same as [`from_value`] of [`parse_doc`], without building the rest of the
/// document (see [`parse_members`]). `None` when `parse_doc` would give none.
pub fn of_document(text: &str) -> Option<Usage> {
    parse_members(text, &["timings", "usage"], &[]).map(|doc| from_value(&doc))
}

/// [`parse_doc`], keeping only the top-level members named in `keep`, and those named in `shape_only` as their
/// shape: an array as an empty array or a one-`null` array, anything else as `null`. The document is validated
/// and its top-level members found in one pass of the scanner; only the kept members' values are then handed to
/// serde, so a stream event's text or an answer's choices are neither parsed twice nor built. A member given
/// twice counts as its last copy, as in a parsed document. Whatever reads the kept members of the result reads
/// what it would have read in `parse_doc`'s.
pub fn parse_members(text: &str, keep: &[&str], shape_only: &[&str]) -> Option<Value> {
    if text.len() > MAX_USAGE_DOC {
        return None;
    }
    let bytes = text.as_bytes();
    let mut doc = serde_json::Map::new();
    for m in scan_object(bytes, MAX_DEPTH).ok()? {
        let Some(name) = keep.iter().chain(shape_only).find(|n| nav::key_eq(bytes, m.key, n)) else {
            continue;
        };
        let value = match keep.contains(name) {
            true => serde_json::from_slice(m.value.of(bytes)).ok()?,
            false => shape(bytes, &m),
        };
        doc.insert((*name).to_string(), value);
    }
    Some(Value::Object(doc))
}

/// A member's value reduced to its shape (see [`parse_members`]).
fn shape(bytes: &[u8], m: &Member) -> Value {
    match m.kind {
        Kind::Array if nav::array_items(bytes, m.value).next().is_some() => Value::Array(vec![Value::Null]),
        Kind::Array => Value::Array(Vec::new()),
        _ => Value::Null,
    }
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
        prompt_tokens: prompt.and_then(|p| p.checked_add(cache.unwrap_or(0))),
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
            prompt_tokens: input.and_then(|i| i.checked_add(read.unwrap_or(0))?.checked_add(created)),
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
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn a_whole_answer_reads_as_its_parsed_document_does() {
        let answers = [
            r#"{"id":"x","choices":[{"message":{"role":"assistant","content":"hi \"there\""}}],"usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}"#,
            r#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2,"completion_tokens":5}}"#,
            r#"{"content":"x","timings":{"prompt_n":4,"cache_n":6,"predicted_n":2}}"#,
            r#"{"type":"message","usage":{"input_tokens":2,"cache_read_input_tokens":30,"output_tokens":7}}"#,
            r#"{"usage":"none","timings":[1]}"#,
            r#"{"choices":[]}"#,
            r#"{"\u0075sage":{"prompt_tokens":9}}"#,
            r#"[1,2]"#,
            r#"{"usage":{"prompt_tokens":1}"#,
            r#"{"a":1} trailing"#,
            "",
        ];
        for text in answers {
            let parsed = parse_doc(text).map(|d| from_value(&d));
            assert_eq!(of_document(text), parsed, "{text}");
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            "[a-z\\\"\u{e9}]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            let key = prop_oneof![
                Just("usage".to_string()),
                Just("choices".to_string()),
                Just("type".to_string()),
                Just("prompt_tokens".to_string()),
                "[a-z]{1,3}",
            ];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((key, inner), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// What `parse_members` keeps reads as `parse_doc`'s document does, member by member, duplicates included.
        #[test]
        fn the_kept_members_are_the_parsed_documents(
            members in prop::collection::vec((prop_oneof![
                Just("usage"), Just("timings"), Just("choices"), Just("type"), Just("error"), Just("delta"),
            ], json_value()), 0..6)
        ) {
            let text = format!("{{{}}}", members.iter()
                .map(|(k, v)| format!("{}:{v}", Value::from(*k)))
                .collect::<Vec<_>>()
                .join(","));
            let full = parse_doc(&text);
            let kept = parse_members(&text, &["usage", "timings", "type", "error"], &["choices"]);
            prop_assert_eq!(full.is_some(), kept.is_some(), "{}", text);
            let (Some(full), Some(kept)) = (full, kept) else { return Ok(()) };
            for k in ["usage", "timings", "type", "error"] {
                prop_assert_eq!(full.get(k), kept.get(k), "{}", k);
            }
            let shape = |d: &Value| d.get("choices").and_then(Value::as_array).map(Vec::is_empty);
            prop_assert_eq!(shape(&full), shape(&kept));
            prop_assert_eq!(kept.get("delta"), None);
            prop_assert_eq!(of_document(&text), Some(from_value(&full)));
        }
    }

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
