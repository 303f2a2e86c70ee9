//! `GET /v1/models` and `GET /v1/models/{id}`, answered from config.
//!
//! The list is the configured aliases, in config order: what a client may send, never upstream names. The
//! OpenAI shape is the default; a request carrying `anthropic-version` gets Anthropic's shape, with its paging
//! (`limit` 1 to 1000, default 20, and `after_id` / `before_id` cursors).

use serde_json::{json, Value};

use crate::config::Config;
use crate::endpoint::Envelope;
use crate::error::GatewayError;

/// A fixed creation time: aliases are config, not artefacts with a history.
const CREATED_AT: &str = "1970-01-01T00:00:00Z";

fn openai_object(name: &str) -> Value {
    json!({ "id": name, "object": "model", "created": 0, "owned_by": "llmroute" })
}

fn anthropic_object(name: &str) -> Value {
    json!({ "type": "model", "id": name, "display_name": name, "created_at": CREATED_AT, "lifecycle": "active" })
}

/// The list body, in the dialect asked for. `query` is the raw query string (without `?`).
pub fn list_body(cfg: &Config, envelope: Envelope, query: &str) -> Result<Vec<u8>, GatewayError> {
    let names: Vec<&str> = cfg.models.iter().map(|m| m.name.as_str()).collect();
    let body = match envelope {
        Envelope::OpenAi | Envelope::SystemOne => {
            let data: Vec<Value> = names.iter().map(|n| openai_object(n)).collect();
            json!({ "object": "list", "data": data })
        }
        Envelope::Anthropic => anthropic_page(&names, &Paging::parse(query)?)?,
    };
    Ok(body.to_string().into_bytes())
}

/// One model's body, or 404 `model_not_found`.
pub fn get_body(cfg: &Config, envelope: Envelope, id: &str) -> Result<Vec<u8>, GatewayError> {
    let id = percent_decode(id);
    let Some(m) = cfg.alias(&id) else {
        return Err(GatewayError::UnknownModel { model: id });
    };
    let body = match envelope {
        Envelope::OpenAi | Envelope::SystemOne => openai_object(&m.name),
        Envelope::Anthropic => anthropic_object(&m.name),
    };
    Ok(body.to_string().into_bytes())
}

/// Anthropic list paging.
#[derive(Debug, Default, PartialEq, Eq)]
struct Paging {
    limit: usize,
    after_id: Option<String>,
    before_id: Option<String>,
}

impl Paging {
    fn parse(query: &str) -> Result<Paging, GatewayError> {
        let mut p = Paging {
            limit: 20,
            ..Paging::default()
        };
        for pair in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v);
            match k {
                "limit" => {
                    p.limit = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or(GatewayError::InvalidQuery {
                            param: "limit",
                            reason: "must be an integer from 1 to 1000",
                        })?
                }
                "after_id" => p.after_id = Some(v),
                "before_id" => p.before_id = Some(v),
                _ => {}
            }
        }
        Ok(p)
    }
}

fn anthropic_page(names: &[&str], p: &Paging) -> Result<Value, GatewayError> {
    let position = |id: &str, param| {
        names.iter().position(|n| *n == id).ok_or(GatewayError::InvalidQuery {
            param,
            reason: "no model has this id",
        })
    };
    let (start, end) = match (&p.after_id, &p.before_id) {
        (Some(a), _) => {
            let s = position(a, "after_id")? + 1;
            (s, (s + p.limit).min(names.len()))
        }
        (None, Some(b)) => {
            let e = position(b, "before_id")?;
            (e.saturating_sub(p.limit), e)
        }
        (None, None) => (0, p.limit.min(names.len())),
    };
    let page = names.get(start..end).unwrap_or_default();
    let has_more = if p.before_id.is_some() && p.after_id.is_none() {
        start > 0
    } else {
        end < names.len()
    };
    Ok(json!({
        "data": page.iter().map(|n| anthropic_object(n)).collect::<Vec<_>>(),
        "has_more": has_more,
        "first_id": page.first(),
        "last_id": page.last(),
    }))
}

/// Decodes `%XX` escapes (and `+` as space) in a query value or path segment; invalid escapes stay as written.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (b, hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(names: &[&str], query: &str) -> Value {
        anthropic_page(names, &Paging::parse(query).unwrap()).unwrap()
    }

    const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

    #[test]
    fn first_page_and_has_more() {
        let v = page(&NAMES, "limit=2");
        assert_eq!(v["data"].as_array().unwrap().len(), 2);
        assert_eq!((v["first_id"].as_str(), v["last_id"].as_str()), (Some("a"), Some("b")));
        assert_eq!(v["has_more"], true);
        assert_eq!(page(&NAMES, "")["has_more"], false);
    }

    #[test]
    fn after_and_before_cursors() {
        let v = page(&NAMES, "limit=2&after_id=b");
        assert_eq!((v["first_id"].as_str(), v["last_id"].as_str()), (Some("c"), Some("d")));
        assert_eq!(v["has_more"], true);
        let v = page(&NAMES, "limit=2&after_id=d");
        assert_eq!(v["data"].as_array().unwrap().len(), 1);
        assert_eq!(v["has_more"], false);
        let v = page(&NAMES, "limit=2&before_id=d");
        assert_eq!((v["first_id"].as_str(), v["last_id"].as_str()), (Some("b"), Some("c")));
        assert_eq!(v["has_more"], true);
        let v = page(&NAMES, "limit=5&before_id=b");
        assert_eq!(v["has_more"], false);
        assert_eq!(v["data"][0]["type"], "model");
    }

    #[test]
    fn bad_paging_is_refused() {
        for q in ["limit=0", "limit=1001", "limit=x", "limit="] {
            assert_eq!(Paging::parse(q).unwrap_err().code(), "invalid_query", "{q}");
        }
        let p = Paging::parse("after_id=zz").unwrap();
        assert_eq!(anthropic_page(&NAMES, &p).unwrap_err().status(), 400);
    }

    #[test]
    fn empty_page_has_null_ids() {
        let v = page(&NAMES, "after_id=e");
        assert_eq!(v["data"].as_array().unwrap().len(), 0);
        assert_eq!(v["first_id"], Value::Null);
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("org%2Fmodel"), "org/model");
        assert_eq!(percent_decode("a+b%zz"), "a b%zz");
    }
}
