//! `llmroute render`: one `llmroute.yaml` in, one complete Envoy bootstrap out.
//!
//! The bootstrap embeds the validated document (as JSON) as the wasm plugin's configuration, so the filter and
//! Envoy's clusters can never disagree about backend names. What Envoy does by itself is rendered here:
//! - the route reads the cluster from `x-llmroute-cluster` and hashes `x-llmroute-affinity`;
//! - each backend is a cluster whose load balancer is ring hash with `hash_balance_factor` for `chwbl`;
//! - the listener's buffer limit is raised above the filter's body limit, so the filter (not Envoy) answers 413
//!   with a JSON envelope;
//! - the route timeout follows `limits.request_timeout_ms`, since Envoy's 15 s default would cut long generations.
//!
//! With [`RenderOptions::with_filter`] off, the same bootstrap is rendered minus the wasm filter, and the route
//! names the first backend's cluster statically (the hash policy stays). The overhead bench compares the two.

mod admin;
mod cluster;
mod credentials;
mod failover;
pub mod istio;
mod probe;
mod tls;

use llmroute_core::config::Config;
use llmroute_core::headers;
use serde_json::{json, Value};

/// Slack above the filter's body limit, so Envoy's own 413 never fires first.
const BUFFER_SLACK: usize = 1 << 20;

/// Where the wasm module is, and how Envoy should load it.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    /// Path to `llmroute_filter.wasm`, as Envoy will see it.
    pub wasm_path: String,
    /// The wasm runtime. Default `envoy.wasm.runtime.v8`.
    pub runtime: String,
    /// Include the wasm filter. Default true. When false, the route sends everything to the first backend's
    /// cluster: plain Envoy, the baseline of the overhead bench.
    pub with_filter: bool,
}

impl RenderOptions {
    pub fn new(wasm_path: impl Into<String>) -> Self {
        RenderOptions {
            wasm_path: wasm_path.into(),
            runtime: "envoy.wasm.runtime.v8".into(),
            with_filter: true,
        }
    }

    /// The same options without the wasm filter.
    pub fn without_filter(mut self) -> Self {
        self.with_filter = false;
        self
    }
}

/// Converts a config document (YAML or JSON) to the compact JSON the filter reads.
pub fn config_json(text: &str) -> Result<String, String> {
    let value: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| e.to_string())?
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?
    };
    Ok(value.to_string())
}

/// Renders the bootstrap as a JSON value. `config_text` must be the document `cfg` was loaded from.
pub fn bootstrap(cfg: &Config, config_text: &str, opts: &RenderOptions) -> Result<Value, String> {
    let plugin_config = config_json(config_text)?;
    let mut clusters = cluster::clusters(cfg);
    if opts.with_filter {
        clusters.extend(failover::clusters(cfg, &plugin_config, opts));
    }
    let mut v = json!({
        "admin": { "address": socket(&cfg.admin.ip().to_string(), cfg.admin.port()) },
        // The filter's per-backend metrics carry the backend in their name; make it a label.
        "stats_config": { "stats_tags": [{
            "tag_name": "llmroute_backend",
            "regex": "^wasmcustom\\.llmroute\\.backend\\.((.+)\\.)[a-z_]+$",
        }] },
        "static_resources": {
            "listeners": [listener(cfg, plugin_config, opts)],
            "clusters": clusters,
        },
    });
    tls::apply(cfg, &mut v); // listener and cluster transport sockets (render/tls.rs)
    credentials::apply(cfg, &mut v); // backend tokens: env SDS secrets + upstream injectors (render/credentials.rs)
    probe::apply(cfg, &mut v); // one cluster per llama.cpp endpoint for the /props fleet check (render/probe.rs)
    admin::apply(cfg, &mut v); // the cluster the filter polls for /llmroute/status (render/admin.rs)
    if cluster::uses_xds(cfg) {
        // Envoy refuses xDS config sources, file-based ones included, without a node identity.
        v["node"] = json!({ "id": "llmroute", "cluster": "llmroute" });
    }
    Ok(v)
}

/// Renders the bootstrap as YAML text, with a header comment.
pub fn bootstrap_yaml(cfg: &Config, config_text: &str, opts: &RenderOptions) -> Result<String, String> {
    let value = bootstrap(cfg, config_text, opts)?;
    let body = serde_yaml_ng::to_string(&value).map_err(|e| e.to_string())?;
    Ok(format!(
        "# Rendered by `llmroute render` {}. Edit llmroute.yaml and render again instead of editing this file.\n{body}",
        llmroute_core::VERSION
    ))
}

/// `affinity.placement: bounded_keys`: the filter names the chosen host (base64 `IP:PORT`) in this header and
/// Envoy's stateful-session filter makes it the upstream host, if it is healthy; retries and unhealthy hosts
/// fall back to the cluster's load balancer. Not strict, so a stale or odd value never fails a request.
fn stateful_session() -> Value {
    json!({
        "name": "envoy.filters.http.stateful_session",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSession",
            "session_state": {
                "name": "envoy.http.stateful_session.header",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.http.stateful_session.header.v3.HeaderBasedSessionState",
                    "name": "x-llmroute-endpoint",
                },
            },
        },
    })
}

pub(crate) fn socket(address: &str, port: u16) -> Value {
    json!({ "socket_address": { "address": address, "port_value": port } })
}

pub(crate) fn duration_ms(ms: u64) -> String {
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}

fn listener(cfg: &Config, plugin_config: String, opts: &RenderOptions) -> Value {
    let router = json!({
        "name": "envoy.filters.http.router",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" },
    });
    let mut http_filters = vec![router];
    if opts.with_filter {
        if cfg.affinity.placement.bounded().is_some() {
            http_filters.insert(0, stateful_session());
        }
        http_filters.insert(0, wasm_filter(plugin_config, opts));
    }
    json!({
        "name": "llmroute",
        "address": socket(&cfg.listen.ip().to_string(), cfg.listen.port()),
        "per_connection_buffer_limit_bytes": cfg.limits.max_body_bytes + BUFFER_SLACK,
        "filter_chains": [{
            "filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "llmroute",
                    "codec_type": "AUTO",
                    "always_set_request_id_in_response": true,
                    "route_config": route_config(cfg, opts.with_filter),
                    "http_filters": http_filters,
                },
            }],
        }],
    })
}

/// The one route. With the filter, the cluster comes from the filter's header; without it, the first backend.
fn route_config(cfg: &Config, with_filter: bool) -> Value {
    let mut route = json!({
        "timeout": duration_ms(cfg.limits.request_timeout_ms),
        "hash_policy": [{ "header": { "header_name": headers::AFFINITY } }],
    });
    match (with_filter, cfg.backends.first()) {
        (false, Some(first)) => route["cluster"] = Value::from(first.name.as_str()),
        _ => route["cluster_header"] = Value::from(headers::CLUSTER),
    }
    if let Some(retry) = cluster::retry_policy(cfg) {
        route["retry_policy"] = retry;
    }
    let mut routes: Vec<Value> = failover::route(cfg, &route).into_iter().collect();
    routes.push(json!({ "match": { "prefix": "/" }, "route": route }));
    json!({
        "name": "llmroute",
        "virtual_hosts": [{ "name": "llmroute", "domains": ["*"], "routes": routes }],
    })
}

fn wasm_filter(plugin_config: String, opts: &RenderOptions) -> Value {
    wasm_plugin("llmroute", "llmroute", &plugin_config, opts)
}

/// The wasm HTTP filter, as a downstream filter or (with the upstream root id) an upstream one.
pub(crate) fn wasm_plugin(name: &str, root_id: &str, plugin_config: &str, opts: &RenderOptions) -> Value {
    json!({
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": root_id,
                "allow_on_headers_stop_iteration": true,
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": plugin_config,
                },
                "vm_config": {
                    "vm_id": "llmroute",
                    "runtime": opts.runtime,
                    "code": { "local": { "filename": opts.wasm_path } },
                },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081', 'llama.internal:8082']\n    balance_factor: 175\n  - name: b\n    kind: vllm\n    endpoints: ['127.0.0.1:9000']\n    lb: least_request\nmodels:\n  - name: m\n    routes: [{ backend: a, upstream_model: up }]\nlimits: { max_body_bytes: 2097152, request_timeout_ms: 1500 }\n";

    fn render() -> Value {
        let cfg = llmroute_core::load_config(DOC).unwrap();
        bootstrap(&cfg, DOC, &RenderOptions::new("/x/llmroute.wasm")).unwrap()
    }

    #[test]
    fn route_reads_our_headers() {
        let v = render();
        let hcm = &v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        let route = &hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
        assert_eq!(route["cluster_header"], "x-llmroute-cluster");
        assert_eq!(route["hash_policy"][0]["header"]["header_name"], "x-llmroute-affinity");
        assert_eq!(route["timeout"], "1.500s");
    }

    #[test]
    fn without_filter_routes_statically_and_keeps_the_rest() {
        let cfg = llmroute_core::load_config(DOC).unwrap();
        let with = render();
        let plain = bootstrap(&cfg, DOC, &RenderOptions::new("/x/llmroute.wasm").without_filter()).unwrap();
        let hcm =
            |v: &Value| v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"].clone();
        let filters = hcm(&plain)["http_filters"].as_array().unwrap().clone();
        assert_eq!(filters.len(), 1);
        assert_eq!(filters[0]["name"], "envoy.filters.http.router");
        let route = &hcm(&plain)["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
        assert_eq!(route["cluster"], "a");
        assert!(route.get("cluster_header").is_none());
        assert_eq!(route["hash_policy"][0]["header"]["header_name"], "x-llmroute-affinity");
        assert_eq!(route["timeout"], "1.500s");
        assert_eq!(
            plain["static_resources"]["clusters"],
            with["static_resources"]["clusters"]
        );
        assert_eq!(plain["admin"], with["admin"]);
        let listener = |v: &Value| v["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"].clone();
        assert_eq!(listener(&plain), listener(&with));
    }

    #[test]
    fn wasm_filter_pauses_and_embeds_the_config_as_json() {
        let v = render();
        let hcm = &v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        let wasm = &hcm["http_filters"][0]["typed_config"]["config"];
        assert_eq!(wasm["allow_on_headers_stop_iteration"], true);
        let embedded = wasm["configuration"]["value"].as_str().unwrap();
        let cfg = llmroute_core::load_config(embedded).unwrap();
        assert_eq!(cfg.backends.len(), 2);
        assert_eq!(hcm["http_filters"][1]["name"], "envoy.filters.http.router");
    }

    #[test]
    fn buffer_limit_exceeds_the_body_limit() {
        let v = render();
        let limit = v["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"]
            .as_u64()
            .unwrap();
        assert!(limit > 2097152);
    }

    #[test]
    fn chwbl_is_ring_hash_with_the_balance_factor() {
        let v = render();
        let a = &v["static_resources"]["clusters"][0];
        assert_eq!(a["name"], "a");
        assert_eq!(a["type"], "STRICT_DNS");
        let policy = &a["load_balancing_policy"]["policies"][0]["typed_extension_config"];
        assert_eq!(policy["name"], "envoy.load_balancing_policies.ring_hash");
        assert_eq!(
            policy["typed_config"]["consistent_hashing_lb_config"]["hash_balance_factor"],
            175
        );
        let b = &v["static_resources"]["clusters"][1];
        assert_eq!(b["type"], "STATIC");
        assert_eq!(
            b["load_balancing_policy"]["policies"][0]["typed_extension_config"]["name"],
            "envoy.load_balancing_policies.least_request"
        );
    }

    #[test]
    fn admin_and_listener_default_to_loopback() {
        let v = render();
        assert_eq!(v["admin"]["address"]["socket_address"]["address"], "127.0.0.1");
        assert_eq!(v["admin"]["address"]["socket_address"]["port_value"], 9901);
        let l = &v["static_resources"]["listeners"][0]["address"]["socket_address"];
        assert_eq!(
            (l["address"].as_str(), l["port_value"].as_u64()),
            (Some("127.0.0.1"), Some(10000))
        );
    }
}
