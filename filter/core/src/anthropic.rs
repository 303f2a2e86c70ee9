//! Anthropic Messages the way the real API behaves (the NVCF LLM Gateway's `/v1/messages` contract):
//!
//! - **Request id.** Every `/v1/messages` response carries the gateway's request id in [`REQUEST_ID_HEADER`],
//!   which Anthropic SDKs report as the request id, and every error body carries it as `request_id`.
//! - **Backend errors.** An error body already in the Anthropic envelope (`{"type":"error","error":{"type":
//!   <snake_case>,...}}`) is relayed with its `request_id` set to the gateway's. Any other error body (an
//!   OpenAI-style envelope, a FastAPI validation error as vLLM sends on `/v1/messages`, plain text) is rendered in
//!   the Anthropic envelope: the type follows the status, the message is the backend's.
//! - **`extra_headers` in the body.** SDK users sometimes put `extra_headers` into the JSON body by mistake; any
//!   top-level member whose key folds to `extra-headers` (any letter case, `_` or `-`) is cut before the upstream.
//!
//! All of it is pure: the filter reads the bytes and applies the result. Costs: the header is one set; the error
//! body is buffered (at most [`ERROR_BODY_MAX`] bytes are read) and parsed once; the body edit is one scan of the
//! top-level members, and a copy only when a member is removed.

use serde_json::{json, Map, Value};

use crate::json::{nav, scan_object, Member, MAX_DEPTH};
use crate::text::prefix_on_char_boundary;

/// The response header Anthropic SDKs read the request id from.
pub const REQUEST_ID_HEADER: &str = "request-id";
/// The most of a backend error body the gateway reads; a longer one is answered with a message of its own.
pub const ERROR_BODY_MAX: usize = 64 * 1024;
/// The longest backend message kept in a rendered error.
const MESSAGE_MAX: usize = 2048;

/// The Anthropic `error.type` for an HTTP status, as the real API uses them.
pub fn error_type(status: u32) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// How a backend error body was handled, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorShape {
    /// Already an Anthropic error: relayed, with the request id set.
    Relayed,
    /// Rendered into the Anthropic envelope from another shape.
    Rendered,
}

/// The body to send the client for a backend error `status` with body `body` on `/v1/messages`.
pub fn backend_error_body(status: u32, body: &[u8], request_id: Option<&str>) -> (Vec<u8>, ErrorShape) {
    let doc: Option<Value> = (body.len() <= ERROR_BODY_MAX)
        .then(|| serde_json::from_slice(body).ok())
        .flatten();
    if let Some(Value::Object(mut top)) = doc.clone() {
        if is_anthropic_error(&top) {
            top.insert("request_id".to_string(), json!(request_id));
            return (Value::Object(top).to_string().into_bytes(), ErrorShape::Relayed);
        }
    }
    let message = doc
        .as_ref()
        .and_then(message_of)
        .or_else(|| plain_text(body))
        .unwrap_or_else(|| format!("The backend answered with HTTP status {status}."));
    let message = prefix_on_char_boundary(&message, MESSAGE_MAX).to_string();
    let out = json!({
        "type": "error",
        "error": { "type": error_type(status), "message": message },
        "request_id": request_id,
    });
    (out.to_string().into_bytes(), ErrorShape::Rendered)
}

/// `{"type":"error","error":{"type":"<lowercase_snake_case>", ...}}`.
fn is_anthropic_error(top: &Map<String, Value>) -> bool {
    let kind = top.get("error").and_then(|e| e.get("type")).and_then(Value::as_str);
    top.get("type").and_then(Value::as_str) == Some("error")
        && kind.is_some_and(|k| {
            !k.is_empty()
                && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                && !k.starts_with('_')
                && !k.ends_with('_')
        })
}

/// The message of a non-Anthropic error document: OpenAI `error.message`, a bare `error` string, FastAPI
/// `detail` (a string, or a list of `{loc, msg}`), or a top-level `message`.
fn message_of(doc: &Value) -> Option<String> {
    let error = doc.get("error");
    if let Some(m) = error.and_then(|e| e.get("message")).and_then(Value::as_str) {
        return Some(m.to_string());
    }
    if let Some(m) = error.and_then(Value::as_str) {
        return Some(m.to_string());
    }
    match doc.get("detail") {
        Some(Value::String(s)) => return Some(s.clone()),
        Some(Value::Array(items)) => {
            let parts: Vec<String> = items.iter().take(16).filter_map(fastapi_item).collect();
            if !parts.is_empty() {
                return Some(parts.join("; "));
            }
        }
        _ => {}
    }
    doc.get("message").and_then(Value::as_str).map(str::to_string)
}

/// One FastAPI validation item: `body.max_tokens: Input should be a valid integer`.
fn fastapi_item(item: &Value) -> Option<String> {
    let msg = item.get("msg").and_then(Value::as_str)?;
    let loc: Vec<String> = item
        .get("loc")
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .map(|p| match p {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(match loc.is_empty() {
        true => msg.to_string(),
        false => format!("{}: {msg}", loc.join(".")),
    })
}

/// A short non-JSON body (plain text from a proxy or engine), trimmed; `None` when empty or not text.
fn plain_text(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body.get(..body.len().min(MESSAGE_MAX))?)
        .ok()?
        .trim();
    let looks_like_json = text.starts_with('{') || text.starts_with('[');
    (!text.is_empty() && !looks_like_json && !text.chars().any(|c| c.is_control() && c != '\n'))
        .then(|| text.to_string())
}

/// True for a key that folds to `extra-headers`: any letter case, `_` or `-` between the words.
fn is_extra_headers(key: &str) -> bool {
    let norm: String = key
        .chars()
        .map(|c| if c == '_' { '-' } else { c.to_ascii_lowercase() })
        .collect();
    norm == "extra-headers"
}

/// The body without its top-level `extra_headers` members (see [`is_extra_headers`]); `None` when it has none
/// or is not a JSON object. Every other byte is kept, separators included.
pub fn strip_extra_headers(body: &[u8]) -> Option<Vec<u8>> {
    let members = scan_object(body, MAX_DEPTH).ok()?;
    let drop = |m: &Member| nav::str_value(body, m.key).is_some_and(|k| is_extra_headers(&k));
    if !members.iter().any(drop) {
        return None;
    }
    let first = members.first()?;
    let last = members.last()?;
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(body.get(..first.key.start)?);
    let kept: Vec<(usize, &Member)> = members.iter().enumerate().filter(|(_, m)| !drop(m)).collect();
    for (n, (i, m)) in kept.iter().enumerate() {
        out.extend_from_slice(body.get(m.key.start..m.value.end)?);
        if n.saturating_add(1) < kept.len() {
            // The separator that followed this member in the original body (comma and whitespace).
            let next = members.get(i.saturating_add(1))?;
            out.extend_from_slice(body.get(m.value.end..next.key.start)?);
        }
    }
    out.extend_from_slice(body.get(last.value.end..)?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(b: &[u8]) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn anthropic_errors_are_relayed_with_the_gateways_request_id() {
        let body = br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: bad"},"request_id":"req_backend"}"#;
        let (out, shape) = backend_error_body(400, body, Some("gw-1"));
        assert_eq!(shape, ErrorShape::Relayed);
        let v = parsed(&out);
        assert_eq!(v["request_id"], "gw-1");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["message"], "max_tokens: bad");
    }

    #[test]
    fn openai_errors_become_anthropic_with_the_status_type() {
        let body =
            br#"{"error":{"message":"The model `x` does not exist.","type":"NotFoundError","param":null,"code":404}}"#;
        let (out, shape) = backend_error_body(404, body, Some("gw-2"));
        assert_eq!(shape, ErrorShape::Rendered);
        let v = parsed(&out);
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "not_found_error");
        assert_eq!(v["error"]["message"], "The model `x` does not exist.");
        assert_eq!(v["request_id"], "gw-2");
    }

    #[test]
    fn an_error_with_a_camel_case_type_is_not_anthropic() {
        let body = br#"{"type":"error","error":{"type":"BadRequestError","message":"nope"}}"#;
        let (out, shape) = backend_error_body(400, body, None);
        assert_eq!(shape, ErrorShape::Rendered);
        assert_eq!(parsed(&out)["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn fastapi_validation_errors_are_rendered() {
        let body = br#"{"detail":[{"type":"int_parsing","loc":["body","max_tokens"],"msg":"Input should be a valid integer","input":"x"}]}"#;
        let (out, _) = backend_error_body(422, body, Some("gw-3"));
        let v = parsed(&out);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(
            v["error"]["message"],
            "body.max_tokens: Input should be a valid integer"
        );
    }

    #[test]
    fn text_and_empty_bodies_get_a_message() {
        let (out, _) = backend_error_body(503, b"upstream overloaded\n", Some("r"));
        let v = parsed(&out);
        assert_eq!(v["error"]["type"], "api_error");
        assert_eq!(v["error"]["message"], "upstream overloaded");
        let (out, _) = backend_error_body(529, b"", Some("r"));
        let v = parsed(&out);
        assert_eq!(v["error"]["type"], "overloaded_error");
        assert_eq!(v["error"]["message"], "The backend answered with HTTP status 529.");
        let big = vec![b'{'; ERROR_BODY_MAX + 1];
        let (out, _) = backend_error_body(500, &big, Some("r"));
        assert_eq!(
            parsed(&out)["error"]["message"],
            "The backend answered with HTTP status 500."
        );
    }

    #[test]
    fn status_types() {
        for (s, t) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (422, "invalid_request_error"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (502, "api_error"),
            (529, "overloaded_error"),
        ] {
            assert_eq!(error_type(s), t, "{s}");
        }
    }

    #[test]
    fn extra_headers_members_are_cut_in_every_spelling() {
        let cases = [
            (
                r#"{"model":"m","extra_headers":{"a":"b"},"max_tokens":5}"#,
                r#"{"model":"m","max_tokens":5}"#,
            ),
            (r#"{"model":"m", "Extra-Headers": 1}"#, r#"{"model":"m"}"#),
            (r#"{"EXTRA_HEADERS":[],"model":"m"}"#, r#"{"model":"m"}"#),
            (
                r#"{ "extra_headers":1 , "model" : "m" ,"extra-headers":2,"x":{"extra_headers":3}}"#,
                r#"{ "model" : "m" ,"x":{"extra_headers":3}}"#,
            ),
            (r#"{"extra\u005fheaders":1,"model":"m"}"#, r#"{"model":"m"}"#),
            (r#"{"extra_headers":1}"#, r#"{}"#),
        ];
        for (input, want) in cases {
            let out = strip_extra_headers(input.as_bytes()).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), want, "{input}");
        }
    }

    #[test]
    fn bodies_without_extra_headers_are_left_alone() {
        assert_eq!(strip_extra_headers(br#"{"model":"m","extra":1,"headers":2}"#), None);
        assert_eq!(strip_extra_headers(br#"{"model":"m","extraheaders":1}"#), None);
        assert_eq!(strip_extra_headers(b"not json"), None);
    }
}
