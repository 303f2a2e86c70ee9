//! How the dialects read a prompt out of a request.
//!
//! A conversation (chat, Responses, Messages) becomes one `role:text` line per message, with the system
//! prompt first, so the same conversation sent through two APIs is the same prompt to the engine and hits
//! the same cache blocks. A completions `prompt` or an embeddings `input` is a list of parts.

use serde_json::Value;

/// A message's text: a string as is; an array as the concatenated `text` of its text parts (`text`,
/// `input_text`, `output_text`); anything else as empty.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|part| {
                matches!(
                    part.get("type").and_then(Value::as_str),
                    Some("text" | "input_text" | "output_text")
                )
            })
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// `role:text` for one message.
fn message_line(message: &Value) -> String {
    let role = message.get("role").and_then(Value::as_str).unwrap_or("");
    let content = message.get("content").map(content_text).unwrap_or_default();
    format!("{role}:{content}")
}

/// One `role:text` line per message, an optional system line first, joined by `\n`.
pub(super) fn conversation_text(system: Option<&Value>, messages: Option<&Value>) -> String {
    let system = system.map(|text| format!("system:{}", content_text(text)));
    let messages = messages
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(message_line);
    system.into_iter().chain(messages).collect::<Vec<_>>().join("\n")
}

/// The parts of a completions `prompt` or an embeddings `input`: a string, a list of token ids, or a list of
/// strings and token-id lists. Token ids are written as numbers, space separated. `None` if malformed.
pub(super) fn prompt_parts(value: &Value) -> Option<Vec<String>> {
    match value {
        Value::String(text) => Some(vec![text.clone()]),
        Value::Array(parts) if !parts.is_empty() && parts.iter().all(Value::is_number) => Some(vec![token_text(parts)]),
        Value::Array(parts) => parts.iter().map(prompt_part).collect(),
        _ => None,
    }
}

/// One part of a prompt list: a string or a list of token ids.
fn prompt_part(part: &Value) -> Option<String> {
    match part {
        Value::String(text) => Some(text.clone()),
        Value::Array(tokens) if tokens.iter().all(Value::is_number) => Some(token_text(tokens)),
        _ => None,
    }
}

fn token_text(tokens: &[Value]) -> String {
    tokens.iter().map(Value::to_string).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conversation_joins_roles_and_text_parts() {
        let messages = json!([
            {"role": "user", "content": [
                {"type": "text", "text": "hello "},
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "input_text", "text": "world"}
            ]},
            {"role": "assistant", "content": null}
        ]);
        let system = json!([{"type": "text", "text": "be brief"}]);
        assert_eq!(
            conversation_text(Some(&system), Some(&messages)),
            "system:be brief\nuser:hello world\nassistant:"
        );
        assert_eq!(conversation_text(None, None), "");
    }

    #[test]
    fn prompt_parts_take_strings_and_token_ids() {
        assert_eq!(prompt_parts(&json!("a")).unwrap(), ["a"]);
        assert_eq!(prompt_parts(&json!([1, 2])).unwrap(), ["1 2"]);
        assert_eq!(prompt_parts(&json!(["a", [3]])).unwrap(), ["a", "3"]);
        assert_eq!(prompt_parts(&json!([])).unwrap(), Vec::<String>::new());
        assert_eq!(prompt_parts(&json!({"a": 1})), None);
        assert_eq!(prompt_parts(&json!([true])), None);
    }
}
