//! The routing decision for an inference request: which backend, which upstream model, which affinity key,
//! the token estimate, and the one body edit.
//!
//! The steps every API shares live here: JSON validity, duplicate fields, alias resolution (with optional
//! `<alias>/<upstream>` prefix routing), the endpoint check, explicit keys, and the `model` rewrite. The API
//! modules add their own checks and content keys. The decision is data: the filter applies it and reads nothing
//! else, and tests assert on it directly. The only body edit is the `model` value: every other byte, including
//! whitespace, key order and unknown fields, reaches the engine exactly as the client sent it.

use crate::affinity::{self, Affinity, AffinitySource};
use crate::api::{self, string_value};
use crate::config::{Config, StreamUpstream};
use crate::endpoint::Api;
use crate::error::GatewayError;
use crate::estimate::Estimator;
use crate::fields::{read_fields, Fields};
use crate::json::{nav, scan_object_with, Kind, Member, MAX_DEPTH};
use crate::message_index::MessageIndex;
use crate::output_bound;
use crate::route_choice;
use crate::session;
pub use crate::session::{session_from_headers, SessionHeaders, SessionKey, SessionSource};
use crate::stream_always;

pub use crate::patch::BodyPatch;
use crate::patch::{body_patch, output_count, Edit, INCLUDE_USAGE};
use crate::route_choice::resolve_alias;
pub use crate::route_choice::RouteDecision;

/// Decides an inference request. `session` gives the explicit key from the headers, for the alias' own
/// `session_headers`.
pub fn route(cfg: &Config, api: Api, body: &[u8], session: impl SessionSource) -> Result<RouteDecision, GatewayError> {
    route_bounded(cfg, api, body, session, |_, _| None)
}

/// [`route`], writing an output bound into a request that names none (see [`crate::output_bound`]): `bound`
/// gets the alias and the input estimate, and says how many output tokens the budget allows, or `None` for no
/// bound. The decision's `max_output_tokens` is then the bound written.
pub fn route_bounded(
    cfg: &Config,
    api: Api,
    body: &[u8],
    session: impl SessionSource,
    bound: impl FnOnce(&str, u64) -> Option<u64>,
) -> Result<RouteDecision, GatewayError> {
    if api.is_decision() {
        return crate::decisions::route(cfg, api, body, session);
    }
    // One pass validates, indexes the top-level members and the messages, and counts the tokens.
    let mut heard = (Estimator::new(body), MessageIndex::new(body));
    let members = scan_object_with(body, MAX_DEPTH, &mut heard).map_err(GatewayError::InvalidJson)?;
    let (tokens, messages) = &heard;
    let fields = read_fields(body, &members)?;
    let usage_insert = stream_usage_insert(cfg, api, body, &fields, &members);
    let model_member = fields
        .get("model")
        .ok_or(GatewayError::MissingField { field: "model" })?;
    let model = string_value(body, model_member, "model")?;
    let (alias, prefix_rest) = resolve_alias(cfg, api, &model)?;
    let session = session.key_for(&alias.affinity)?;
    let ctx = api::Context {
        alias: &alias.name,
        affinity: &alias.affinity,
        messages: Some(messages),
    };
    let inspection = api::inspect(api, body, &fields, &ctx)?;
    let cache_key = prompt_cache_key(body, &fields)?;
    let explicit = cache_key
        .or_else(|| session.map(|s| (s.value, s.affinity)))
        .or_else(|| {
            let (value, source) = inspection.explicit.clone()?;
            let a = affinity::explicit(value.as_bytes(), source);
            Some((value, a))
        });
    let (echo_session, affinity) = match (inspection.sticky, explicit) {
        (false, _) => (None, None),
        // Echoed only when a session header could bring it back unchanged.
        (true, Some((value, a))) => (session::check_value(value.as_bytes()).is_ok().then_some(value), Some(a)),
        (true, None) => (None, inspection.content),
    };
    let input_tokens = tokens.finish(cfg.image_tokens);
    let asked = requested_output(body, &fields)?;
    let needed = input_tokens.saturating_add(asked.unwrap_or(0));
    let choice = route_choice::choose(cfg, alias, needed)?;
    let injected = match (asked, output_bound::field(api)) {
        (None, Some(field)) => bound(&alias.name, input_tokens).and_then(|n| {
            let n = n
                .min(output_bound::context_room(cfg, alias, &choice, input_tokens))
                .max(1);
            output_bound::edit(body, &members, field, n).map(|e| (n, e))
        }),
        _ => None,
    };
    let max_output_tokens = asked.or(injected.as_ref().map(|(n, _)| *n));
    let upstream_model = prefix_rest.unwrap_or(&choice.route.upstream_model).to_string();
    let stream_edits = match alias.stream_upstream {
        StreamUpstream::Always => {
            let has_options = has_stream_options(body, &members);
            stream_always::edits(api, body, fields.get("stream"), has_options)
        }
        StreamUpstream::AsSent => None,
    };
    let assemble = stream_edits.is_some();
    let mut edits = stream_edits.unwrap_or_default();
    edits.extend(usage_insert.map(|at| Edit::insert(at, INCLUDE_USAGE)));
    edits.extend(injected.map(|(_, e)| e));
    Ok(RouteDecision {
        api,
        patch: body_patch(body, model_member, &upstream_model, edits),
        strip_usage_chunk: usage_insert.is_some(),
        assemble,
        alias: alias.name.clone(),
        cluster: choice.cluster,
        failover: choice.failover,
        model_from_client: prefix_rest.is_some(),
        upstream_model,
        affinity,
        placement: alias.affinity.placement,
        echo_session,
        input_tokens,
        max_output_tokens,
    })
}

/// The body's `prompt_cache_key`: 1 to 256 bytes without control characters; empty or null is ignored.
fn prompt_cache_key(body: &[u8], fields: &Fields) -> Result<Option<(String, Affinity)>, GatewayError> {
    let Some(m) = fields.get("prompt_cache_key") else {
        return Ok(None);
    };
    if m.kind == Kind::Null {
        return Ok(None);
    }
    let key = string_value(body, m, "prompt_cache_key")?;
    if key.is_empty() {
        return Ok(None);
    }
    affinity::check_explicit(key.as_bytes()).map_err(|reason| GatewayError::InvalidField {
        field: "prompt_cache_key",
        reason: reason.to_string(),
    })?;
    let a = affinity::explicit(key.as_bytes(), AffinitySource::PromptCacheKey);
    Ok(Some((key.into_owned(), a)))
}

/// Where to add `stream_options.include_usage`: the offset of the body's closing brace, when the config asks for
/// it and the request is a streamed chat or completions request without `stream_options` of its own.
fn stream_usage_insert(cfg: &Config, api: Api, body: &[u8], fields: &Fields, members: &[Member]) -> Option<usize> {
    if !cfg.stream_include_usage || !matches!(api, Api::Chat | Api::Completions) {
        return None;
    }
    let streaming = fields.get("stream").is_some_and(|m| m.value.of(body) == b"true");
    if !streaming || has_stream_options(body, members) {
        return None;
    }
    body.iter().rposition(|&b| b == b'}')
}

/// True when the body has `stream_options` of its own. Keys are compared as the engine's JSON parser sees them:
/// escapes decoded (`"stream\u005foptions"`) and, for engines whose parsers fold case, in any letter case. Any
/// such key means the client chose.
fn has_stream_options(body: &[u8], members: &[Member]) -> bool {
    members
        .iter()
        .any(|m| nav::str_value(body, m.key).is_some_and(|k| crate::fields::folds_to(&k, "stream_options")))
}

/// The output tokens a request asks for: `max_completion_tokens`, `max_output_tokens` or `max_tokens`, if any.
///
/// Each must be `null` or a non-negative whole number: engines coerce `"4096"` or `4096.0` to 4096, so reading
/// those as 0 would let a request slip past the context-length check. An integral float counts as its value
/// (saturating); anything else is refused, with a 400 in the API's envelope.
fn requested_output(body: &[u8], fields: &Fields) -> Result<Option<u64>, GatewayError> {
    let mut asked = None;
    for field in ["max_completion_tokens", "max_output_tokens", "max_tokens"] {
        let Some(m) = fields.get(field) else { continue };
        if m.kind == Kind::Null {
            continue;
        }
        let n = output_count(m.value.of(body))
            .filter(|_| m.kind == Kind::Number)
            .ok_or_else(|| GatewayError::InvalidField {
                field,
                reason: "must be a non-negative integer".to_string(),
            })?;
        asked = asked.or(Some(n));
    }
    Ok(asked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(include_usage: bool) -> Config {
        crate::config::load(&format!(
            r#"{{"version":1,"backends":[{{"name":"a","kind":"llamacpp","endpoints":["127.0.0.1:1"]}}],
                "models":[{{"name":"m","routes":[{{"backend":"a","upstream_model":"up"}}]}},
                          {{"name":"same","routes":[{{"backend":"a"}}]}}],
                "usage":{{"stream_include_usage":{include_usage}}}}}"#
        ))
        .unwrap()
    }

    fn routed(c: &Config, body: &str) -> (RouteDecision, String) {
        let d = route(c, Api::Chat, body.as_bytes(), None).unwrap();
        let out = d
            .patch
            .as_ref()
            .map_or(body.as_bytes().to_vec(), |p| p.apply(body.as_bytes()));
        (d, String::from_utf8(out).unwrap())
    }

    #[test]
    fn include_usage_is_added_to_streams_that_lack_stream_options() {
        let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}"#;
        let (d, out) = routed(&cfg(true), body);
        assert!(d.strip_usage_chunk);
        assert_eq!(
            out,
            r#"{"model":"up","stream":true,"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#
        );
        assert_eq!(d.body_len(body.len()), Some(out.len()));
        let (d, out) = routed(&cfg(true), &body.replace("\"m\"", "\"same\""));
        assert!(d.strip_usage_chunk);
        assert!(out.ends_with(r#""stream_options":{"include_usage":true}}"#), "{out}");
    }

    #[test]
    fn cache_affinity_key_is_the_hash_of_an_explicit_key_only() {
        let c = cfg(false);
        let body = r#"{"model":"m","prompt_cache_key":"conv-7","messages":[{"role":"system","content":"s"},{"role":"user","content":"x"}]}"#;
        let d = route(&c, Api::Chat, body.as_bytes(), None).unwrap();
        let want = format!(
            "{:016x}",
            affinity::explicit(b"conv-7", AffinitySource::PromptCacheKey).hash
        );
        assert_eq!(d.cache_affinity_key(), Some(want.clone()));
        assert!(!want.contains("conv-7"));
        let body = r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"x"}]}"#;
        let d = route(&c, Api::Chat, body.as_bytes(), None).unwrap();
        assert_eq!(d.affinity.map(|a| a.source), Some(AffinitySource::SystemPrompt));
        assert_eq!(d.cache_affinity_key(), None);
    }

    #[test]
    fn include_usage_is_left_alone_when_off_unstreamed_or_already_chosen() {
        let streamed = r#"{"model":"same","stream":true,"messages":[{"role":"user","content":"x"}]}"#;
        assert_eq!(routed(&cfg(false), streamed).1, streamed);
        let plain = r#"{"model":"same","messages":[{"role":"user","content":"x"}]}"#;
        assert_eq!(routed(&cfg(true), plain).1, plain);
        let chosen = r#"{"model":"same","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"x"}]}"#;
        let (d, out) = routed(&cfg(true), chosen);
        assert!(!d.strip_usage_chunk);
        assert_eq!(out, chosen);
    }
}
