//! `llmroute render`: one `llmroute.yaml` in, one complete Envoy bootstrap out.
//!
//! The bootstrap embeds the validated document (as JSON) as the wasm plugin's configuration, so the filter and
//! Envoy's clusters can never disagree about backend names. What Envoy does by itself is rendered here:
//! - the route reads the cluster from `x-llmroute-cluster` and hashes `x-llmroute-affinity`;
//! - each backend is a cluster whose load balancer is ring hash with `hash_balance_factor` for `chwbl`;
//! - the listener's buffer limit is raised above the filter's body limit, so the filter (not Envoy) answers 413
//!   with a JSON envelope;
//! - the route timeout follows `limits.request_timeout_ms`, since Envoy's 15 s default would cut long generations;
//! - the connection manager bounds slow and abusive clients, Envoy's own errors get JSON bodies, and an overload
//!   manager caps the heap (see `render/edge.rs`).
//!
//! With [`RenderOptions::with_filter`] off, the same bootstrap is rendered minus the wasm filter, and the route
//! names the first backend's cluster statically (the hash policy stays). The overhead bench compares the two.

mod admin;
mod admission;
mod cluster;
mod credentials;
pub mod ecds;
mod edge;
mod failover;
pub(crate) mod filters;
pub mod istio;
pub(crate) mod json;
pub mod observe;
pub(crate) mod options;
pub mod paste;
mod probe;
mod ratelimit;
mod store;
pub mod target;
#[cfg(test)]
mod testing;
mod tls;

use llmroute_core::config::Document;

pub use json::config_json;
use json::socket;
pub use options::RenderOptions;
use serde_json::{json, Value};

/// Renders the bootstrap as a JSON value. `config_text` must be the document `cfg` was loaded from. It is
/// assembled from the same [`target::pieces`] that `--target filter` prints.
pub fn bootstrap(cfg: &Document, config_text: &str, opts: &RenderOptions) -> Result<Value, String> {
    let p = target::pieces(cfg, config_text, opts)?;
    let mut http_filters = p.http_filters.clone();
    http_filters.push(target::router());
    let mut clusters = p.backend_clusters.clone();
    clusters.extend(p.clusters.iter().cloned());
    let mut v = json!({
        "admin": { "address": socket(&cfg.admin.ip().to_string(), cfg.admin.port()) },
        "static_resources": {
            "listeners": [listener(cfg, http_filters, target::route_config(&p), &p)],
            "clusters": clusters,
        },
    });
    if let Value::Object(m) = &mut v {
        // stats_config (the filter's metric labels) and the overload manager's heap budget.
        m.extend(p.bootstrap.clone());
    }
    if !p.secrets.is_empty() {
        v["static_resources"]["secrets"] = Value::from(p.secrets);
    }
    if cluster::uses_xds(cfg) || (opts.with_filter && opts.ecds_path.is_some()) {
        // Envoy refuses xDS config sources, file-based ones included, without a node identity.
        v["node"] = ecds::node();
    }
    Ok(v)
}

/// Renders the bootstrap as YAML text, with a header comment.
pub fn bootstrap_yaml(cfg: &Document, config_text: &str, opts: &RenderOptions) -> Result<String, String> {
    let value = bootstrap(cfg, config_text, opts)?;
    let body = serde_yaml_ng::to_string(&value).map_err(|e| e.to_string())?;
    Ok(format!(
        "# Rendered by `llmroute render` {}. Edit llmroute.yaml and render again instead of editing this file.\n{body}",
        llmroute_core::VERSION
    ))
}

fn listener(cfg: &Document, http_filters: Vec<Value>, route_config: Value, p: &target::Pieces) -> Value {
    let mut hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "llmroute",
        "codec_type": "AUTO",
        "always_set_request_id_in_response": true,
        "route_config": route_config,
        "http_filters": http_filters,
    });
    let mut chain = json!({
        "filters": [{ "name": "envoy.filters.network.http_connection_manager", "typed_config": hcm.take() }],
    });
    if let Value::Object(m) = &mut chain["filters"][0]["typed_config"] {
        // The access log, timeouts, HTTP/2 bounds, header hygiene and JSON local replies.
        m.extend(p.connection_manager.clone());
    }
    if let Value::Object(m) = &mut chain {
        m.extend(p.filter_chain.clone()); // the transport socket with listen_tls (render/tls.rs)
    }
    let mut l = json!({
        "name": "llmroute",
        "address": socket(&cfg.render_only.listen.ip().to_string(), cfg.render_only.listen.port()),
        "filter_chains": [chain],
    });
    if let Value::Object(m) = &mut l {
        m.extend(p.listener.clone());
    }
    l
}

#[cfg(test)]
mod tests {
    use super::filters::{wasm_plugin, MODULE_TYPE};
    use super::*;
    use llmroute_core::envoy_contract as contract;

    const DOC: &str = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081', 'llama.internal:8082']\n    balance_factor: 175\n  - name: b\n    kind: vllm\n    endpoints: ['127.0.0.1:9000']\n    lb: least_request\nmodels:\n  - name: m\n    routes: [{ backend: a, upstream_model: up }]\nlimits: { max_body_bytes: 2097152, request_timeout_ms: 1500 }\n";

    fn render() -> Value {
        let cfg = llmroute_core::load_document(DOC).unwrap();
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
        let cfg = llmroute_core::load_document(DOC).unwrap();
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
    fn with_a_module_the_dynamic_module_filter_replaces_the_wasm_one() {
        let cfg = llmroute_core::load_document(DOC).unwrap();
        let opts = RenderOptions::new("/x.wasm").with_module("/x/libllmroute_native.so");
        let v = bootstrap(&cfg, DOC, &opts).unwrap();
        let hcm = &v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        let f = &hcm["http_filters"][0]["typed_config"];
        assert_eq!(f["@type"], MODULE_TYPE);
        assert_eq!(f["filter_name"], contract::ROOT_ID);
        assert_eq!(
            f["dynamic_module_config"]["module"]["local"]["filename"],
            "/x/libllmroute_native.so"
        );
        assert_eq!(f["dynamic_module_config"]["do_not_close"], true);
        let embedded = f["filter_config"]["value"].as_str().unwrap();
        assert_eq!(
            embedded,
            config_json(DOC).unwrap(),
            "the same document the wasm build embeds"
        );
        assert!(!v.to_string().contains("/x.wasm"), "no wasm filter is left");
        // The upstream role is the filter name, as the wasm build's root id.
        let up = wasm_plugin("llmroute-upstream", contract::UPSTREAM_ROOT_ID, "{}", &opts);
        assert_eq!(up["typed_config"]["filter_name"], contract::UPSTREAM_ROOT_ID);
        let discovered = ecds::discovered_filter("/p", &opts);
        assert_eq!(discovered["config_discovery"]["type_urls"][0], MODULE_TYPE);
    }

    #[test]
    fn each_role_has_its_own_vm_and_a_trapped_vm_is_reloaded() {
        let down = wasm_plugin("llmroute", "llmroute", "{}", &RenderOptions::new("/x.wasm"));
        let up = wasm_plugin(
            "llmroute-upstream",
            "llmroute_upstream",
            "{}",
            &RenderOptions::new("/x.wasm"),
        );
        let config = |v: &Value| v["typed_config"]["config"].clone();
        assert_eq!(config(&down)["vm_config"]["vm_id"], "llmroute");
        assert_eq!(config(&up)["vm_config"]["vm_id"], "llmroute_upstream");
        for v in [&down, &up] {
            assert_eq!(config(v)["failure_policy"], "FAIL_RELOAD");
            assert_eq!(config(v)["reload_config"]["backoff"]["base_interval"], "0.1s");
        }
        // The rendered downstream filter is the same entry.
        let v = render();
        let hcm = &v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        let rendered = &hcm["http_filters"][0]["typed_config"]["config"];
        for key in ["failure_policy", "reload_config", "root_id"] {
            assert_eq!(rendered[key], config(&down)[key], "{key}");
        }
        assert_eq!(rendered["vm_config"]["vm_id"], "llmroute");
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
