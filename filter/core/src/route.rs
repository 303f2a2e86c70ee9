//! The routing decision for a chat request: which backend, which upstream model, which affinity key, and the
//! one body edit.
//!
//! The decision is data. The filter applies it (headers, body) and reads nothing else; tests assert on it
//! directly. The only body edit is the `model` value: every other byte, including whitespace, key order and
//! unknown fields, reaches the engine exactly as the client sent it.

use crate::affinity::{self, Affinity, AffinitySource};
use crate::config::Config;
use crate::error::GatewayError;
use crate::fields::{read_fields, Fields};
use crate::json::{nav, scan_object, Kind, Member, Span, MAX_DEPTH};

/// Replace the bytes in `span` with `replacement`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyPatch {
    pub span: Span,
    pub replacement: String,
}

impl BodyPatch {
    /// The new body. One allocation of the final size.
    pub fn apply(&self, body: &[u8]) -> Vec<u8> {
        let head = body.get(..self.span.start).unwrap_or_default();
        let tail = body.get(self.span.end..).unwrap_or_default();
        let mut out = Vec::with_capacity(head.len() + self.replacement.len() + tail.len());
        out.extend_from_slice(head);
        out.extend_from_slice(self.replacement.as_bytes());
        out.extend_from_slice(tail);
        out
    }

    /// The body length after the patch.
    pub fn new_len(&self, old_len: usize) -> usize {
        old_len - self.span.len() + self.replacement.len()
    }
}

/// Where a chat request goes and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteDecision {
    /// The alias the client sent.
    pub alias: String,
    /// The backend name, which is the Envoy cluster.
    pub cluster: String,
    pub upstream_model: String,
    pub affinity: Option<Affinity>,
    /// `None` when the body goes upstream untouched.
    pub patch: Option<BodyPatch>,
}

impl RouteDecision {
    pub fn body_len(&self, old_len: usize) -> usize {
        self.patch.as_ref().map_or(old_len, |p| p.new_len(old_len))
    }
}

/// Finds the session key in the request headers: the first configured header present wins.
/// `header` returns a header's value by lower-case name.
pub fn session_from_headers<'h>(
    cfg: &Config,
    header: impl Fn(&str) -> Option<&'h [u8]>,
) -> Result<Option<Affinity>, GatewayError> {
    for name in &cfg.affinity.session_headers {
        if let Some(v) = header(name) {
            affinity::check_session_value(v).map_err(|reason| GatewayError::InvalidSessionHeader {
                header: name.clone(),
                reason,
            })?;
            return Ok(Some(affinity::session(v, AffinitySource::SessionHeader)));
        }
    }
    Ok(None)
}

/// Decides a `POST /v1/chat/completions` request. `session` is the key from the headers, if any.
pub fn route_chat(cfg: &Config, body: &[u8], session: Option<Affinity>) -> Result<RouteDecision, GatewayError> {
    let members = scan_object(body, MAX_DEPTH).map_err(GatewayError::InvalidJson)?;
    let fields = read_fields(body, &members)?;
    let model = fields
        .get("model")
        .ok_or(GatewayError::MissingField { field: "model" })?;
    let alias_name = string_field(body, model, "model")?;
    let alias = cfg.alias(&alias_name).ok_or_else(|| GatewayError::UnknownModel {
        model: alias_name.clone(),
    })?;
    let messages = fields
        .get("messages")
        .ok_or(GatewayError::MissingField { field: "messages" })?;
    if messages.kind != Kind::Array || nav::array_items(body, messages.value).next().is_none() {
        return Err(GatewayError::InvalidField {
            field: "messages",
            reason: "must be a non-empty array".into(),
        });
    }
    let cache_key = prompt_cache_key(body, &fields)?;
    let route = alias.routes.first().ok_or_else(|| GatewayError::UnknownModel {
        model: alias_name.clone(),
    })?;
    let backend = cfg.backend(route.backend).ok_or_else(|| GatewayError::UnknownModel {
        model: alias_name.clone(),
    })?;
    let affinity = session
        .or(cache_key)
        .or_else(|| affinity::chat_messages(body, messages.value, cfg.affinity.user_prefix_bytes));
    Ok(RouteDecision {
        patch: model_patch(body, model, &route.upstream_model),
        alias: alias.name.clone(),
        cluster: backend.name.clone(),
        upstream_model: route.upstream_model.clone(),
        affinity,
    })
}

fn string_field(body: &[u8], m: Member, field: &'static str) -> Result<String, GatewayError> {
    let invalid = || GatewayError::InvalidField {
        field,
        reason: "must be a string".into(),
    };
    if m.kind != Kind::String {
        return Err(invalid());
    }
    nav::str_value(body, m.value)
        .map(|s| s.into_owned())
        .ok_or_else(invalid)
}

fn prompt_cache_key(body: &[u8], fields: &Fields) -> Result<Option<Affinity>, GatewayError> {
    let Some(m) = fields.get("prompt_cache_key") else {
        return Ok(None);
    };
    if m.kind == Kind::Null {
        return Ok(None);
    }
    let key = string_field(body, m, "prompt_cache_key")?;
    Ok((!key.is_empty()).then(|| affinity::session(key.as_bytes(), AffinitySource::PromptCacheKey)))
}

/// The edit that puts `upstream` in place of the client's `model` value; `None` when the bytes already match.
fn model_patch(body: &[u8], model: Member, upstream: &str) -> Option<BodyPatch> {
    let replacement = serde_json::Value::from(upstream).to_string();
    (model.value.of(body) != replacement.as_bytes()).then_some(BodyPatch {
        span: model.value,
        replacement,
    })
}
