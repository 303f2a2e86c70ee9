//! Which hosts the filter reads directly, and through which clusters: the per-host probe clusters.
//!
//! Two jobs of the filter's root context read each engine on its own, not through the backend's load balancer:
//! the `/props` fleet check of llama.cpp backends ([`crate::fleet_check`]) and the engine load poll of the
//! backends with `load:` ([`crate::load::poll`]). A wasm `dispatch_http_call` targets a cluster, so `llmroute
//! render` adds one single-host cluster per such endpoint ([`probe_cluster`]), and one original-destination
//! cluster per such discovered backend ([`discovered_probe_cluster`]), whose calls name the host. This module
//! lists them once for both jobs and for the renderer, so a cluster one of them needs is always rendered, and
//! none is rendered twice.

use crate::config::{Backend, Config};
use crate::fleet_check::{self, ProbeTarget};

/// Every listed endpoint either job reads, each once, in config order (backend, then endpoint).
pub fn endpoints(cfg: &Config) -> Vec<ProbeTarget> {
    let props = fleet_check::targets(cfg);
    cfg.backends
        .iter()
        .filter(|b| b.load.is_some() || props.iter().any(|t| t.backend == b.name))
        .flat_map(fleet_check::endpoint_targets)
        .collect()
}

/// Every discovered backend either job reads: its hosts are reached through its original-destination cluster.
pub fn discovered_backends(cfg: &Config) -> impl Iterator<Item = &Backend> {
    cfg.backends.iter().filter(|b| {
        b.discovered() && (b.load.is_some() || fleet_check::discovered_backends(cfg).any(|d| d.name == b.name))
    })
}
