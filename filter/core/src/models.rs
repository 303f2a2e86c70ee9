//! `GET /v1/models` and `GET /v1/models/{id}`, answered from config.
//!
//! The list is the configured aliases, in config order: what a client may send, never upstream names. The
//! OpenAI shape is the default; a request carrying `anthropic-version` gets Anthropic's shape, with its paging
//! (`limit` 1 to 1000, default 20, and `after_id` / `before_id` cursors).
//!
//! Every model object names the APIs its alias serves (`supported_endpoints`, so a client can tell a
//! Messages-only model apart) and its `status`: `available`, `unavailable` when the latest fresh health snapshot
//! (see [`crate::status`]) shows no healthy host on any of its routes, or `unknown` without a fresh snapshot.
//! `GET /v1/models/{id}` for an unavailable alias answers 503 with `Retry-After`, in the API's shape (the NVCF LLM
//! Gateway's behaviour); unknown health never refuses.

use serde_json::{json, Value};

use crate::config::{Config, ModelAlias};
use crate::endpoint::{Api, Envelope};
use crate::error::GatewayError;
use crate::status::{alias_ready, FleetStatus, STALE_AFTER_MS};

/// Whether an alias can be served now, as far as the gateway knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelState {
    Available,
    /// A fresh snapshot shows no healthy host on any of its routes.
    Unavailable,
    /// No fresh health snapshot.
    Unknown,
}

impl ModelState {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Available => "available",
            ModelState::Unavailable => "unavailable",
            ModelState::Unknown => "unknown",
        }
    }

    /// The state of `alias` given the latest snapshot, taken at most [`STALE_AFTER_MS`] before `now_ms`.
    pub fn of(cfg: &Config, fleet: Option<&FleetStatus>, now_ms: u64, alias: &ModelAlias) -> ModelState {
        match fleet.filter(|f| f.age_ms(now_ms) <= STALE_AFTER_MS) {
            None => ModelState::Unknown,
            Some(f) if alias_ready(cfg, f, alias) => ModelState::Available,
            Some(_) => ModelState::Unavailable,
        }
    }
}

/// The seconds a client is told to wait for an unavailable model.
pub const RETRY_AFTER_S: &str = "5";

/// What `GET /v1/models/{id}` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelAnswer {
    /// 200 with the model object.
    Found(Vec<u8>),
    /// 503 with `Retry-After`: the alias exists but none of its routes has a healthy host.
    Unavailable(Vec<u8>),
}

/// The names of the APIs `alias` serves, in the order of [`Api::ALL`].
pub fn supported_endpoints(alias: &ModelAlias) -> Vec<&'static str> {
    Api::ALL
        .into_iter()
        .filter(|a| alias.endpoints.contains(*a))
        .map(Api::name)
        .collect()
}

/// Adds `supported_endpoints` and `status` to a model object.
fn annotate(mut object: Value, alias: &ModelAlias, state: ModelState) -> Value {
    if let Some(o) = object.as_object_mut() {
        o.insert("supported_endpoints".into(), json!(supported_endpoints(alias)));
        o.insert("status".into(), json!(state.as_str()));
    }
    object
}

/// The list body with each alias's endpoints and state; `state` gives an alias's [`ModelState`].
pub fn list_body_with(
    cfg: &Config,
    envelope: Envelope,
    query: &str,
    state: &dyn Fn(&ModelAlias) -> ModelState,
) -> Result<Vec<u8>, GatewayError> {
    let mut body: Value = serde_json::from_slice(&list_body(cfg, envelope, query)?).unwrap_or_default();
    if let Some(data) = body.get_mut("data").and_then(Value::as_array_mut) {
        for object in data.iter_mut() {
            let alias = object.get("id").and_then(Value::as_str).and_then(|id| cfg.alias(id));
            if let Some(alias) = alias {
                *object = annotate(object.take(), alias, state(alias));
            }
        }
    }
    Ok(body.to_string().into_bytes())
}

/// One model's answer: the object (with endpoints and state), or a 503 in the API's shape when it is
/// unavailable; 404 `model_not_found` when there is no such alias.
pub fn get_answer(
    cfg: &Config,
    envelope: Envelope,
    id: &str,
    state: &dyn Fn(&ModelAlias) -> ModelState,
    request_id: Option<&str>,
) -> Result<ModelAnswer, GatewayError> {
    let found: Value = serde_json::from_slice(&get_body(cfg, envelope, id)?).unwrap_or_default();
    let Some(alias) = found.get("id").and_then(Value::as_str).and_then(|n| cfg.alias(n)) else {
        return Err(GatewayError::UnknownModel { model: id.to_string() });
    };
    let s = state(alias);
    if s != ModelState::Unavailable {
        return Ok(ModelAnswer::Found(annotate(found, alias, s).to_string().into_bytes()));
    }
    let message = format!(
        "The model `{}` has no healthy backend right now; retry after {RETRY_AFTER_S} seconds.",
        alias.name
    );
    let body = match envelope {
        Envelope::Anthropic => json!({
            "type": "error",
            "error": { "type": "api_error", "message": message },
            "request_id": request_id,
        }),
        Envelope::SystemOne => crate::error::system_one("model_unavailable", &message, request_id),
        Envelope::OpenAi => json!({
            "error": { "message": message, "type": "server_error", "param": "model", "code": "model_unavailable" },
            "request_id": request_id,
        }),
    };
    Ok(ModelAnswer::Unavailable(body.to_string().into_bytes()))
}

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
            let s = position(a, "after_id")?.saturating_add(1);
            (s, s.saturating_add(p.limit).min(names.len()))
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
        let hex = bytes
            .get(i..)
            .and_then(|rest| rest.get(1..3))
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b, hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i = i.saturating_add(3);
            }
            (b'+', _) => {
                out.push(b' ');
                i = i.saturating_add(1);
            }
            _ => {
                out.push(b);
                i = i.saturating_add(1);
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

    fn cfg() -> Config {
        crate::config::load(
            r#"{"version":1,"backends":[{"name":"a","kind":"vllm","endpoints":["127.0.0.1:1"]},
                                        {"name":"b","kind":"vllm","endpoints":["127.0.0.1:2"]}],
                "models":[{"name":"up","routes":[{"backend":"a"}]},
                          {"name":"down","endpoints":["messages"],"routes":[{"backend":"b"}]}]}"#,
        )
        .unwrap()
    }

    fn state(_: &Config) -> impl Fn(&ModelAlias) -> ModelState {
        |a: &ModelAlias| match a.name.as_str() {
            "down" => ModelState::Unavailable,
            _ => ModelState::Available,
        }
    }

    #[test]
    fn the_list_names_endpoints_and_state() {
        let c = cfg();
        for envelope in [Envelope::OpenAi, Envelope::Anthropic] {
            let v: Value = serde_json::from_slice(&list_body_with(&c, envelope, "", &state(&c)).unwrap()).unwrap();
            let data = v["data"].as_array().unwrap();
            assert_eq!(data[0]["status"], "available");
            assert_eq!(
                data[0]["supported_endpoints"],
                json!(["chat", "completions", "responses", "embeddings", "messages"])
            );
            assert_eq!(data[1]["status"], "unavailable");
            assert_eq!(data[1]["supported_endpoints"], json!(["messages"]));
        }
    }

    #[test]
    fn an_unavailable_model_is_a_503_in_the_apis_shape() {
        let c = cfg();
        let s = state(&c);
        let ModelAnswer::Found(up) = get_answer(&c, Envelope::OpenAi, "up", &s, Some("r")).unwrap() else {
            panic!("up is available");
        };
        assert_eq!(serde_json::from_slice::<Value>(&up).unwrap()["status"], "available");
        let ModelAnswer::Unavailable(b) = get_answer(&c, Envelope::OpenAi, "down", &s, Some("r")).unwrap() else {
            panic!("down is unavailable");
        };
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            (v["error"]["code"].as_str(), v["request_id"].as_str()),
            (Some("model_unavailable"), Some("r"))
        );
        let ModelAnswer::Unavailable(b) = get_answer(&c, Envelope::Anthropic, "down", &s, Some("r")).unwrap() else {
            panic!("down is unavailable");
        };
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            (v["type"].as_str(), v["error"]["type"].as_str()),
            (Some("error"), Some("api_error"))
        );
        assert_eq!(
            get_answer(&c, Envelope::OpenAi, "nope", &s, None).unwrap_err().status(),
            404
        );
    }

    #[test]
    fn state_needs_a_fresh_snapshot() {
        let c = cfg();
        let health = |name: &str, healthy| crate::status::BackendHealth {
            name: name.into(),
            healthy,
            degraded: 0,
            total: 1,
            in_flight: 0,
            down: Vec::new(),
            hosts: Vec::new(),
            weights: Vec::new(),
            active: Vec::new(),
        };
        let fleet = FleetStatus {
            taken_at_ms: 10_000,
            backends: vec![health("a", 1), health("b", 0)],
        };
        let (up, down) = (c.alias("up").unwrap(), c.alias("down").unwrap());
        assert_eq!(ModelState::of(&c, None, 10_000, up), ModelState::Unknown);
        assert_eq!(ModelState::of(&c, Some(&fleet), 12_000, up), ModelState::Available);
        assert_eq!(ModelState::of(&c, Some(&fleet), 12_000, down), ModelState::Unavailable);
        let stale = 10_000 + STALE_AFTER_MS + 1;
        assert_eq!(ModelState::of(&c, Some(&fleet), stale, down), ModelState::Unknown);
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("org%2Fmodel"), "org/model");
        assert_eq!(percent_decode("a+b%zz"), "a b%zz");
    }
}
