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

use llmroute_core::config::Document;
use llmroute_core::envoy_contract::{self as contract, failover_cluster};
use llmroute_core::route_choice::has_failover;
use serde_json::{json, Value};

use super::filters::wasm_plugin;
use super::json::duration_ms;
use super::options::RenderOptions;

pub use llmroute_core::envoy_contract::UPSTREAM_ROOT_ID;

/// The aggregate clusters, one per alias with failover.
pub fn clusters(cfg: &Document, plugin_config: &str, opts: &RenderOptions) -> Vec<Value> {
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

fn aggregate(name: &str, members: &[&str], cfg: &Document, plugin_config: &str, opts: &RenderOptions) -> Value {
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
            "max_retries": budget.saturating_mul(cfg.render_only.retries.attempts.max(1)),
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
pub fn route(cfg: &Document, plain: &Value) -> Option<Value> {
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

#[cfg(test)]
mod tests {
    use super::super::{bootstrap, RenderOptions};
    use super::*;

    /// Issue 13: the per-attempt upstream filter costs nothing on a request that cannot fail over. It is rendered
    /// only into the failover aggregate's options; the backends' own clusters, which a single-route alias's
    /// requests go to (the filter names them in `x-llmroute-cluster`), carry no upstream filter, and a config
    /// without failover renders none at all.
    #[test]
    fn the_upstream_filter_runs_only_on_the_failover_cluster() {
        let doc = "version: 1\nbackends:\n  - { name: a, kind: llamacpp, endpoints: ['127.0.0.1:8081'] }\n  - { name: b, kind: vllm, endpoints: ['127.0.0.1:9000'] }\nmodels:\n  - name: pair\n    routes: [{ backend: a, upstream_model: up, priority: 1 }, { backend: b, upstream_model: other, priority: 2 }]\n  - { name: solo, routes: [{ backend: a }] }\n";
        let cfg = llmroute_core::load_document(doc).unwrap();
        let v = bootstrap(&cfg, doc, &RenderOptions::new("/x.wasm")).unwrap();
        let clusters = v["static_resources"]["clusters"].as_array().unwrap();
        let with_upstream: Vec<&str> = clusters
            .iter()
            .filter(|c| c.to_string().contains(UPSTREAM_ROOT_ID))
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(with_upstream, [failover_cluster(0)]);
        for backend in ["a", "b"] {
            let c = clusters.iter().find(|c| c["name"] == backend).unwrap();
            assert!(!c.to_string().contains("http_filters"), "{c}");
        }
        let single = llmroute_core::route(
            &cfg,
            llmroute_core::Api::Chat,
            br#"{"model":"solo","messages":[{"role":"user","content":"hi"}]}"#,
            None,
        );
        let single = single.unwrap();
        assert_eq!((single.cluster.as_str(), single.failover_alias()), ("a", None));

        let plain = doc.replace(
            ", priority: 1 }, { backend: b, upstream_model: other, priority: 2 }",
            " }",
        );
        let cfg = llmroute_core::load_document(&plain).unwrap();
        let v = bootstrap(&cfg, &plain, &RenderOptions::new("/x.wasm")).unwrap();
        assert!(
            !v.to_string().contains(UPSTREAM_ROOT_ID),
            "no failover, no upstream filter"
        );
    }
}
