//! Failover across an alias's priority routes, whose backends expect different `model` names.
//!
//! Each alias with routes to several backends gets an Envoy aggregate cluster listing those backends in
//! priority order. Envoy sends requests to the first backend with healthy hosts, and its retries move on to the
//! next priority (`previous_priorities`) when the first has failed. The same wasm module runs again as an upstream
//! HTTP filter on the aggregate (upstream filters on member clusters never run under an aggregate); it sees the
//! host Envoy picked and rewrites `model` to that backend's upstream model on every attempt. Ring hash on the
//! member clusters keeps CHWBL affinity inside each backend.
//!
//! Requests for such an alias carry `x-llmroute-alias`, which selects a route whose retry policy adds
//! `previous_priorities`; other requests keep the plain route.

use llmroute_core::config::Config;
use llmroute_core::envoy_contract::{self as contract, failover_cluster};
use llmroute_core::route_choice::has_failover;
use serde_json::{json, Value};

use super::{duration_ms, wasm_plugin, RenderOptions};

pub use llmroute_core::envoy_contract::UPSTREAM_ROOT_ID;

/// The aggregate clusters, one per alias with failover.
pub fn clusters(cfg: &Config, plugin_config: &str, opts: &RenderOptions) -> Vec<Value> {
    cfg.models
        .iter()
        .enumerate()
        .filter(|(_, m)| has_failover(m))
        .map(|(i, m)| {
            let members: Vec<&str> = m
                .routes
                .iter()
                .filter_map(|r| cfg.backend(r.backend).map(|b| b.name.as_str()))
                .collect();
            aggregate(&failover_cluster(i), &members, cfg, plugin_config, opts)
        })
        .collect()
}

fn aggregate(name: &str, members: &[&str], cfg: &Config, plugin_config: &str, opts: &RenderOptions) -> Value {
    let upstream_filter = wasm_plugin("llmroute-upstream", UPSTREAM_ROOT_ID, plugin_config, opts);
    let budget = cfg.backends.iter().map(|b| b.max_inflight).max().unwrap_or(1024);
    json!({
        "name": name,
        "connect_timeout": duration_ms(cfg.backends.iter().map(|b| b.connect_timeout_ms).max().unwrap_or(2000)),
        "lb_policy": "CLUSTER_PROVIDED",
        "cluster_type": {
            "name": "envoy.clusters.aggregate",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig",
                "clusters": members,
            },
        },
        "circuit_breakers": { "thresholds": [{
            "priority": "DEFAULT",
            "max_retries": budget.saturating_mul(cfg.retries.attempts.max(1)),
        }] },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http_protocol_options": {} },
                "http_filters": [upstream_filter, {
                    "name": "envoy.filters.http.upstream_codec",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec",
                    },
                }],
            },
        },
    })
}

/// The route for failover requests: the plain route plus `previous_priorities`, matched on the alias header.
/// `None` when no alias has failover.
pub fn route(cfg: &Config, plain: &Value) -> Option<Value> {
    if !cfg.models.iter().any(has_failover) {
        return None;
    }
    let mut route = plain.clone();
    let mut retry = route
        .get("retry_policy")
        .cloned()
        .unwrap_or_else(|| json!({ "retry_on": "connect-failure,refused-stream,reset", "num_retries": 1 }));
    retry["retry_priority"] = json!({
        "name": "envoy.retry_priorities.previous_priorities",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
            "update_frequency": 1,
        },
    });
    route["retry_policy"] = retry;
    Some(json!({
        "match": { "prefix": "/", "headers": [{ "name": contract::ALIAS, "present_match": true }] },
        "route": route,
    }))
}
