//! Route choice: which of an alias's routes may take a request (context-length routing), and which Envoy
//! cluster the request goes to (the backend's, or the alias's failover cluster). Not to be confused with
//! placement (`key_placement`), which picks the host inside a backend.
//!
//! A route whose backend declares `max_context` takes a request only if the estimated input tokens plus the
//! requested output tokens fit. When no route fits, the request is refused with 400 `context_length_exceeded`
//! before any engine sees it. When every route fits and there are several, the request goes to the alias's
//! failover cluster (an Envoy aggregate of the routes' backends in priority order), so Envoy itself moves to
//! the next priority when a backend is down. When only some fit, the first that fits is used alone.

use crate::affinity::Affinity;
use crate::api_kind::Api;
use crate::config::{Backend, Config, KeyPlacement, ModelAlias, Route};
use crate::error::GatewayError;
use crate::patch::BodyPatch;

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteChoice<'c> {
    /// The preferred route among those that fit.
    pub route: &'c Route,
    pub backend: &'c Backend,
    /// The Envoy cluster: the backend's, or the alias's failover cluster.
    pub cluster: String,
    /// True when `cluster` is a failover cluster, whose upstream side rewrites `model` per backend.
    pub failover: bool,
}

pub use crate::envoy_contract::failover_cluster;

/// True when the alias gets a failover cluster: it has routes to more than one backend.
pub fn has_failover(alias: &ModelAlias) -> bool {
    alias.routes.len() > 1
}

/// Places a request of `needed` tokens (input estimate plus requested output).
pub fn choose<'c>(cfg: &'c Config, alias: &'c ModelAlias, needed: u64) -> Result<RouteChoice<'c>, GatewayError> {
    let fits = |r: &&Route| {
        cfg.backend(r.backend)
            .and_then(|b| b.max_context)
            .is_none_or(|limit| needed <= u64::from(limit))
    };
    let fitting: Vec<&Route> = alias.routes.iter().filter(fits).collect();
    let Some(route) = fitting.first().copied() else {
        let limit = alias
            .routes
            .iter()
            .filter_map(|r| cfg.backend(r.backend).and_then(|b| b.max_context))
            .max()
            .unwrap_or(0);
        return Err(GatewayError::ContextLengthExceeded { needed, limit });
    };
    let backend = cfg.backend(route.backend).ok_or_else(|| GatewayError::UnknownModel {
        model: alias.name.clone(),
    })?;
    let all_fit = fitting.len() == alias.routes.len();
    let index = cfg.models.iter().position(|m| m.name == alias.name);
    match index {
        Some(i) if all_fit && has_failover(alias) => Ok(RouteChoice {
            route,
            backend,
            cluster: failover_cluster(i),
            failover: true,
        }),
        _ => Ok(RouteChoice {
            route,
            backend,
            cluster: backend.name.clone(),
            failover: false,
        }),
    }
}

/// Where a request goes and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteDecision {
    pub api: Api,
    /// The alias the request resolved to.
    pub alias: String,
    /// The backend name, which is the Envoy cluster.
    pub cluster: String,
    pub upstream_model: String,
    pub affinity: Option<Affinity>,
    /// How the key finds its host: the alias' own placement, else the top-level one.
    pub placement: KeyPlacement,
    /// The explicit key the client chose, echoed in `x-multi-turn-session-id` so later turns can pin to it.
    pub echo_session: Option<String>,
    /// True when `cluster` is the alias's failover cluster.
    pub failover: bool,
    /// The client named the upstream model itself (`<alias>/<model>` prefix routing): no later step, the failover
    /// cluster's upstream filter included, may replace it.
    pub model_from_client: bool,
    /// The gateway's estimate of input tokens.
    pub input_tokens: u64,
    /// The output tokens the request asks for at most, when it names a bound.
    pub max_output_tokens: Option<u64>,
    /// `None` when the body goes upstream untouched.
    pub patch: Option<BodyPatch>,
    /// The gateway added `stream_options.include_usage`, so the stream's usage chunk is not the client's.
    pub strip_usage_chunk: bool,
    /// The gateway sent a non-streamed request upstream as a stream (`stream_upstream: always`): the response
    /// must be rebuilt into one JSON answer (see `stream::assemble`).
    pub assemble: bool,
}

impl RouteDecision {
    /// The alias to name to the failover cluster's upstream filter, which then sets each backend's own
    /// `upstream_model`; `None` when the request is not on a failover cluster or its model came from the client.
    pub fn failover_alias(&self) -> Option<&str> {
        (self.failover && !self.model_from_client).then_some(self.alias.as_str())
    }

    /// The backend that serves the request when the decision already knows it: the cluster, which is the
    /// backend's name, unless it is a failover cluster, whose pick only Envoy knows (the picked host's
    /// `llmroute.backend` metadata). Reading that metadata costs a host call per request.
    pub fn known_backend(&self) -> Option<&str> {
        (!self.failover).then_some(self.cluster.as_str())
    }

    /// The `x-cache-affinity-key` value for the upstream: the hash of the client's explicit session key, in the
    /// hex of the affinity header. `None` when the key came from the content, or when there is none.
    pub fn cache_affinity_key(&self) -> Option<String> {
        self.affinity
            .filter(|a| a.source.is_explicit())
            .map(|a| a.header_value())
    }

    /// The body length after the decision's patch, `old_len` when it has none; `None` when the patch does not fit
    /// the body (see [`BodyPatch::new_len`]).
    pub fn body_len(&self, old_len: usize) -> Option<usize> {
        self.patch.as_ref().map_or(Some(old_len), |p| p.new_len(old_len))
    }
}

/// The alias `model` names, and the client's own upstream model after an `<alias>/` prefix; refused when no alias
/// has that name or the alias does not serve `api`. Shared by every route that reads `model`.
pub fn resolve_alias<'c, 'm>(
    cfg: &'c Config,
    api: Api,
    model: &'m str,
) -> Result<(&'c ModelAlias, Option<&'m str>), GatewayError> {
    let (alias, prefix_rest) = cfg.resolve(model).ok_or_else(|| GatewayError::UnknownModel {
        model: model.to_string(),
    })?;
    if !alias.endpoints.contains(api) {
        return Err(GatewayError::EndpointNotServed {
            model: model.to_string(),
            api,
        });
    }
    Ok((alias, prefix_rest))
}
