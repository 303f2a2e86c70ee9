//! The `EnvoyFilter`: every Envoy-side piece as a patch onto what istiod generates for the filter's workloads
//! (context `GATEWAY`, selected by their `istio` label). The backend clusters are Istio's own
//! `outbound|PORT||HOST` clusters.
//!
//! - `HTTP_FILTER` `INSERT_BEFORE` the router: the complete wasm filter (and, for `bounded_keys`, the
//!   stateful-session filter), because neither `WasmPlugin` nor `TrafficExtension` can set
//!   `allow_on_headers_stop_iteration`. On llmroute's own proxies it matches every HTTP listener, so every request
//!   they serve passes the filter; on an ingress gateway, the listener of `listen`'s port. A remote module
//!   (`https://`, `oci://`) goes through `EXTENSION_CONFIG` (ECDS), the only path on which istio-agent downloads a
//!   module and hands Envoy a local file;
//! - `HTTP_ROUTE` `MERGE` onto the `VirtualService` route named `llmroute`: `cluster_header` (a
//!   `VirtualService` cannot read the cluster from a header) and the affinity hash policy;
//! - `CLUSTER` `ADD`: `llmroute_admin`, the proxy's admin port that the filter polls, and for each `llamacpp`
//!   backend the `/props` fleet check's original-destination cluster (`llmroute-dst-probe-<cluster>`); `CLUSTER`
//!   `MERGE`: `hash_balance_factor` (CHWBL), `update_merge_window: 0s` and active health checks, which a
//!   `DestinationRule` cannot express;
//! - `LISTENER` `MERGE`: `per_connection_buffer_limit_bytes` above the filter's body limit (Istio's 1 MiB
//!   default would answer long prompts with Envoy's plain 413).

use llmroute_core::config::{Backend, Document, LbPolicy};
use llmroute_core::envoy_contract as contract;
use llmroute_core::route_choice::has_failover;
use serde_json::{json, Value};

use super::traffic::metadata;
use super::{Deployment, IstioCluster, IstioOptions, WasmSource, PROXY_NAME, ROUTE_NAME};
use crate::render::filters::stateful_session;
use crate::render::json::duration_ms;
use crate::render::options::RenderOptions;
use crate::render::{admin, cluster, failover, probe, store};

/// Envoy's type URL of the wasm HTTP filter, for ECDS.
pub(super) const WASM_TYPE_URL: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
/// The patches' context: both llmroute's proxies and an ingress gateway are Istio gateways.
pub const CONTEXT: &str = "GATEWAY";

pub fn envoy_filter(
    cfg: &Document,
    plugin_config: &str,
    opts: &IstioOptions,
    backends: &[(&Backend, IstioCluster)],
) -> Value {
    let ctx = CONTEXT;
    // llmroute's own proxies: every listener; an ingress gateway: the listener of `listen`'s port only.
    let port = match opts.deployment {
        Deployment::Proxy => None,
        Deployment::Gateway { .. } => Some(cfg.render_only.listen.port()),
    };
    let local_path = match &opts.wasm {
        WasmSource::Local(p) => p.clone(),
        WasmSource::Remote { .. } => String::new(),
    };
    let render = RenderOptions::new(local_path);
    let mut patches = filter_patches(cfg, plugin_config, opts, port, &render);
    patches.extend(route_patches(cfg, plugin_config, &render));
    patches.extend(cluster_patches(cfg, opts, backends));
    patches.push(json!({
        "applyTo": "LISTENER",
        "match": match port {
            Some(p) => json!({ "context": ctx, "listener": { "portNumber": p } }),
            None => json!({ "context": ctx }),
        },
        "patch": { "operation": "MERGE", "value": {
            "per_connection_buffer_limit_bytes": cfg.limits.max_body_bytes + crate::render::options::BUFFER_SLACK,
        } },
    }));
    let selector = match &opts.deployment {
        Deployment::Proxy => PROXY_NAME,
        Deployment::Gateway { selector, .. } => selector.as_str(),
    };
    json!({
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": metadata("llmroute", opts),
        "spec": { "workloadSelector": { "labels": { "istio": selector } }, "configPatches": patches },
    })
}

/// The HTTP filters, inserted before the router of the listeners llmroute serves: the wasm filter (inline, or
/// through ECDS for a remote module) and, with `bounded_keys`, the stateful-session filter after it.
fn filter_patches(
    cfg: &Document,
    plugin_config: &str,
    opts: &IstioOptions,
    port: Option<u16>,
    render: &RenderOptions,
) -> Vec<Value> {
    let ctx = CONTEXT;
    let mut patches = Vec::new();
    let mut filter = crate::render::filters::wasm_filter(plugin_config.to_string(), render);
    if let WasmSource::Remote { url, sha256 } = &opts.wasm {
        // istio-agent fetches remote modules only on ECDS: it rewrites this `remote` source to a local file before
        // Envoy sees it, for oci:// as for https://. The cluster name is required by Envoy's schema, unused here.
        filter["typed_config"]["config"]["vm_config"]["code"] = json!({ "remote": {
            "http_uri": { "uri": url, "cluster": "llmroute_wasm_fetch", "timeout": "30s" },
            "sha256": sha256,
        } });
        patches.push(json!({
            "applyTo": "EXTENSION_CONFIG",
            "match": { "context": ctx },
            "patch": { "operation": "ADD", "value": filter },
        }));
        filter = json!({
            "name": contract::ROOT_ID,
            "config_discovery": {
                "config_source": { "ads": {}, "initial_fetch_timeout": "0s" },
                "type_urls": [WASM_TYPE_URL],
            },
        });
    }
    let mut listener = json!({ "filterChain": { "filter": {
        "name": "envoy.filters.network.http_connection_manager",
        "subFilter": { "name": "envoy.filters.http.router" },
    } } });
    if let Some(p) = port {
        listener["portNumber"] = json!(p);
    }
    let router_match = json!({ "context": ctx, "listener": listener });
    patches.push(json!({ "applyTo": "HTTP_FILTER", "match": router_match, "patch": { "operation": "INSERT_BEFORE", "value": filter } }));
    if cfg.any_bounded_keys() {
        // Inserted after the wasm filter, before the router: the same order as the standalone bootstrap.
        patches.push(json!({ "applyTo": "HTTP_FILTER", "match": router_match, "patch": { "operation": "INSERT_BEFORE", "value": stateful_session() } }));
    }
    patches
}

/// The route: the cluster and hash headers merged into llmroute's route, and with failover aliases the
/// failover route and its aggregate clusters ahead of it.
fn route_patches(cfg: &Document, plugin_config: &str, render: &RenderOptions) -> Vec<Value> {
    let ctx = CONTEXT;
    let mut patches = Vec::new();
    let route_match = json!({ "context": ctx, "routeConfiguration": { "vhost": { "route": { "name": ROUTE_NAME } } } });
    if cfg.models.iter().any(has_failover) {
        let mut plain = json!({ "cluster_header": contract::CLUSTER, "timeout": duration_ms(cfg.limits.request_timeout_ms),
            "hash_policy": [{ "header": { "header_name": contract::AFFINITY } }] });
        if let Some(r) = cluster::retry_policy(cfg) {
            plain["retry_policy"] = r;
        }
        if let Some(mut r) = failover::route(cfg, &plain) {
            r["name"] = Value::from("llmroute-failover");
            patches.push(json!({ "applyTo": "HTTP_ROUTE", "match": route_match, "patch": { "operation": "INSERT_BEFORE", "value": r } }));
        }
        for c in failover::clusters(cfg, plugin_config, render) {
            patches.push(add_cluster(c));
        }
    }
    patches.push(json!({
        "applyTo": "HTTP_ROUTE",
        "match": route_match,
        "patch": { "operation": "MERGE", "value": { "route": {
            "cluster_header": contract::CLUSTER,
            "hash_policy": [{ "header": { "header_name": contract::AFFINITY } }],
        } } },
    }));
    patches
}

/// The clusters llmroute adds (admin, placement store, per-pod probes) and what it merges into each backend's
/// own cluster (hash balance factor, health check).
fn cluster_patches(cfg: &Document, opts: &IstioOptions, backends: &[(&Backend, IstioCluster)]) -> Vec<Value> {
    let ctx = CONTEXT;
    let mut patches = Vec::new();
    patches.push(add_cluster(admin::cluster(std::net::SocketAddr::from((
        [127, 0, 0, 1],
        opts.admin_port,
    )))));
    if let Some(s) = &cfg.affinity.placement_store {
        // The etcd members the shared placement table's callouts go to (see `store`).
        patches.push(add_cluster(store::cluster(s)));
    }
    // The `/props` fleet check and the engine load poll reach each pod of a llama.cpp backend, or of a backend
    // with `load`, through an original-destination cluster. Istio's own cluster is not copied (its mTLS socket
    // matches endpoint metadata these hosts lack).
    for b in llmroute_core::probe::discovered_backends(cfg) {
        patches.push(add_cluster(probe::discovered_cluster(b, None)));
    }
    for (b, c) in backends {
        let mut merge = json!({ "common_lb_config": { "update_merge_window": "0s" } });
        if b.lb == LbPolicy::Chwbl {
            merge["common_lb_config"]["consistent_hashing_lb_config"] =
                json!({ "hash_balance_factor": b.balance_factor });
        }
        if let Some(h) = &b.health {
            merge["health_checks"] = json!([cluster::health_check(h)]);
        }
        patches.push(json!({
            "applyTo": "CLUSTER",
            "match": { "context": ctx, "cluster": { "name": b.name, "service": c.host, "portNumber": c.port } },
            "patch": { "operation": "MERGE", "value": merge },
        }));
    }
    patches
}

fn add_cluster(value: Value) -> Value {
    json!({ "applyTo": "CLUSTER", "match": { "context": CONTEXT }, "patch": { "operation": "ADD", "value": value } })
}
