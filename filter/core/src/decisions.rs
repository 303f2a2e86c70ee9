//! The decision-model routes of the NVCF LLM Gateway: `POST /v1/decisions` (OpenAI Decisions format) and
//! `POST /v1/systemone` (TypeSafe System One format).
//!
//! Their bodies are opaque to the gateway but for `model`: it is read, resolved to an alias and rewritten, and
//! every other byte goes upstream unchanged. Nothing else is checked (not `stream`, not `prompt_cache_key`), so a
//! duplicated `stream` or an odd field never causes a refusal here; only the JSON itself (one object, nesting at
//! most 64) and `model` are:
//! - `model` missing, not a string, or present twice in any letter case: 400;
//! - an unknown alias, or an alias whose `endpoints` does not list `decisions` / `systemone`: 404 (no alias
//!   serves these routes by default).
//!
//! Affinity comes only from an explicit session header; the token estimate is the shared one
//! ([`crate::estimate`]), images included. For the token limits the output bound is read as on the other APIs
//! (`max_tokens`, `max_completion_tokens`, `max_output_tokens`), but never refused: the largest whole number any
//! copy of them names, in any letter case, is reserved, and a body without one reserves the limits'
//! `default_max_tokens`. The answer's usage settles the reservation as on the other APIs (see `response_plan`).
//! Cost: one pass, which validates, indexes the top-level members and counts the tokens.

use crate::api::string_value;
use crate::config::Config;
use crate::endpoint::Api;
use crate::error::GatewayError;
use crate::estimate::Estimator;
use crate::fields::folds_to;
use crate::json::{nav, scan_object_with, Kind, Member, MAX_DEPTH};
use crate::patch::{body_patch, output_count};
use crate::route_choice;
use crate::route_choice::{resolve_alias, RouteDecision};
use crate::session::SessionSource;

/// Decides a decision-route request.
pub fn route(cfg: &Config, api: Api, body: &[u8], session: impl SessionSource) -> Result<RouteDecision, GatewayError> {
    // One pass validates, indexes the top-level members and counts the tokens.
    let mut tokens = Estimator::new(body);
    let members = scan_object_with(body, MAX_DEPTH, &mut tokens).map_err(GatewayError::InvalidJson)?;
    let mut models = members
        .iter()
        .filter(|m| nav::str_value(body, m.key).is_some_and(|k| folds_to(&k, "model")));
    let model_member = *models.next().ok_or(GatewayError::MissingField { field: "model" })?;
    if models.next().is_some() {
        return Err(GatewayError::DuplicateField { field: "model" });
    }
    let model = string_value(body, model_member, "model")?;
    let (alias, prefix_rest) = resolve_alias(cfg, api, &model)?;
    let session = session.key_for(&alias.affinity)?;
    let input_tokens = tokens.finish(cfg.image_tokens);
    let choice = route_choice::choose(cfg, alias, input_tokens)?;
    let upstream_model = prefix_rest.unwrap_or(&choice.route.upstream_model).to_string();
    Ok(RouteDecision {
        api,
        patch: body_patch(body, model_member, &upstream_model, Vec::new()),
        strip_usage_chunk: false,
        assemble: false,
        alias: alias.name.clone(),
        cluster: choice.cluster,
        failover: choice.failover,
        model_from_client: prefix_rest.is_some(),
        upstream_model,
        affinity: session.as_ref().map(|s| s.affinity),
        placement: alias.affinity.placement,
        echo_session: session.map(|s| s.value),
        input_tokens,
        max_output_tokens: output_bound(body, &members),
    })
}

/// The largest output bound any top-level member names (see the module doc); `None` when none names one.
fn output_bound(body: &[u8], members: &[Member]) -> Option<u64> {
    const BOUNDS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];
    members
        .iter()
        .filter(|m| m.kind == Kind::Number)
        .filter(|m| nav::str_value(body, m.key).is_some_and(|k| BOUNDS.iter().any(|b| folds_to(&k, b))))
        .filter_map(|m| output_count(m.value.of(body)))
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        crate::config::load(
            r#"{"version":1,"backends":[{"name":"a","kind":"vllm","endpoints":["127.0.0.1:1"]}],
                "models":[{"name":"dm","endpoints":["decisions","systemone"],"routes":[{"backend":"a","upstream_model":"up"}]},
                          {"name":"chat","routes":[{"backend":"a"}]}]}"#,
        )
        .unwrap()
    }

    fn apply(d: &RouteDecision, body: &str) -> String {
        let out = d
            .patch
            .as_ref()
            .map_or(body.as_bytes().to_vec(), |p| p.apply(body.as_bytes()));
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn only_model_is_read_and_rewritten() {
        let body = r#"{ "stream":"not a bool","stream":[1], "model" : "dm", "max_tokens":"x", "input":{"a":[1,2]} }"#;
        for api in [Api::Decisions, Api::SystemOne] {
            let d = route(&cfg(), api, body.as_bytes(), None).unwrap();
            assert_eq!(d.upstream_model, "up");
            assert_eq!(apply(&d, body), body.replacen("\"dm\"", "\"up\"", 1));
            assert_eq!(d.affinity, None);
            assert!(!d.strip_usage_chunk);
        }
    }

    #[test]
    fn the_output_bound_is_read_for_the_limits_but_never_refused() {
        let c = cfg();
        let bound = |body: &str| {
            route(&c, Api::Decisions, body.as_bytes(), None)
                .unwrap()
                .max_output_tokens
        };
        assert_eq!(bound(r#"{"model":"dm","max_tokens":40}"#), Some(40));
        assert_eq!(
            bound(r#"{"model":"dm","max_output_tokens":7.0,"input":{"max_tokens":900}}"#),
            Some(7)
        );
        assert_eq!(
            bound(r#"{"model":"dm","max_tokens":40,"MAX_TOKENS":90,"max_tokens":5}"#),
            Some(90)
        );
        assert_eq!(
            bound(r#"{"model":"dm","max_tokens":"x","max_completion_tokens":-1}"#),
            None
        );
        assert_eq!(bound(r#"{"model":"dm"}"#), None);
    }

    #[test]
    fn model_errors_are_400_and_unserved_aliases_404() {
        let c = cfg();
        let status = |body: &str| route(&c, Api::Decisions, body.as_bytes(), None).unwrap_err().status();
        assert_eq!(status(r#"{"input":1}"#), 400);
        assert_eq!(status(r#"{"model":5}"#), 400);
        assert_eq!(status(r#"{"model":"dm","MODEL":"dm"}"#), 400);
        assert_eq!(status(r#"{"model":"dm","Model":"x"}"#), 400);
        let deep = format!(r#"{{"model":"dm","x":{}1{}}}"#, "[".repeat(70), "]".repeat(70));
        assert_eq!(status(&deep), 400);
        assert_eq!(status(r#"{"model":"nope"}"#), 404);
        let e = route(&c, Api::SystemOne, br#"{"model":"chat"}"#, None).unwrap_err();
        assert_eq!((e.status(), e.code()), (404, "endpoint_not_served"));
    }
}
