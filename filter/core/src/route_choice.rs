//! Route choice: which of an alias's routes may take a request (context-length routing), and which Envoy
//! cluster the request goes to (the backend's, or the alias's failover cluster). Not to be confused with
//! placement (`key_placement`), which picks the host inside a backend.
//!
//! A route whose backend declares `max_context` takes a request only if the estimated input tokens plus the
//! requested output tokens fit. When no route fits, the request is refused with 400 `context_length_exceeded`
//! before any engine sees it. When every route fits and there are several, the request goes to the alias's
//! failover cluster (an Envoy aggregate of the routes' backends in priority order), so Envoy itself moves to
//! the next priority when a backend is down. When only some fit, the first that fits is used alone.

use crate::config::{Backend, Config, ModelAlias, Route};
use crate::error::GatewayError;

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
