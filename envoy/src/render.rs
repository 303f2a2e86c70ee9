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
pub mod istio;
pub mod observe;
pub mod paste;
mod probe;
mod ratelimit;
mod store;
pub mod target;
mod tls;

use llmroute_core::config::Config;
use llmroute_core::envoy_contract as contract;
use serde_json::{json, Value};

/// Slack above the filter's body limit, so Envoy's own 413 never fires first.
pub(crate) const BUFFER_SLACK: usize = 1 << 20;

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
    /// Deliver the listener's wasm filter through ECDS from this watched file instead of inline (see
    /// [`ecds`]). Default none.
    pub ecds_path: Option<String>,
    /// Render the native build instead of the wasm one: Envoy's dynamic-module filter loading
    /// `libllmroute_native.so` from this path, with the same configuration, role names and neighbours (see
    /// [`module_filter`]). Default none (the wasm filter).
    pub module_path: Option<String>,
}

impl RenderOptions {
    pub fn new(wasm_path: impl Into<String>) -> Self {
        RenderOptions {
            wasm_path: wasm_path.into(),
            runtime: "envoy.wasm.runtime.v8".into(),
            with_filter: true,
            ecds_path: None,
            module_path: None,
        }
    }

    /// The same options rendering the native build: the dynamic module at `path` instead of the wasm filter.
    pub fn with_module(mut self, path: impl Into<String>) -> Self {
        self.module_path = Some(path.into());
        self
    }

    /// The same options with the listener's wasm filter discovered from the watched file `path`.
    pub fn with_ecds(mut self, path: impl Into<String>) -> Self {
        self.ecds_path = Some(path.into());
        self
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

/// Renders the bootstrap as a JSON value. `config_text` must be the document `cfg` was loaded from. It is
/// assembled from the same [`target::pieces`] that `--target filter` prints.
pub fn bootstrap(cfg: &Config, config_text: &str, opts: &RenderOptions) -> Result<Value, String> {
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
pub(crate) fn stateful_session() -> Value {
    json!({
        "name": "envoy.filters.http.stateful_session",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSession",
            "session_state": {
                "name": "envoy.http.stateful_session.header",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.http.stateful_session.header.v3.HeaderBasedSessionState",
                    "name": contract::SESSION_HEADER,
                },
            },
        },
    })
}

/// Appends `item` to the JSON list `list`, which becomes a list first if it is not one.
pub(crate) fn push(list: &mut Value, item: Value) {
    if !list.is_array() {
        *list = json!([]);
    }
    if let Some(items) = list.as_array_mut() {
        items.push(item);
    }
}

pub(crate) fn socket(address: &str, port: u16) -> Value {
    json!({ "socket_address": { "address": address, "port_value": port } })
}

pub(crate) fn duration_ms(ms: u64) -> String {
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}

fn listener(cfg: &Config, http_filters: Vec<Value>, route_config: Value, p: &target::Pieces) -> Value {
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
        "address": socket(&cfg.listen.ip().to_string(), cfg.listen.port()),
        "filter_chains": [chain],
    });
    if let Value::Object(m) = &mut l {
        m.extend(p.listener.clone());
    }
    l
}

pub(crate) fn wasm_filter(plugin_config: String, opts: &RenderOptions) -> Value {
    let mut filter = wasm_plugin(contract::ROOT_ID, contract::ROOT_ID, &plugin_config, opts);
    admission::expose_keys(&mut filter, &plugin_config);
    filter
}

/// How Envoy treats a VM that trapped: it is replaced by a fresh one (see `docs/failure-policy-and-tls.md`).
pub(crate) const FAILURE_POLICY: &str = "FAIL_RELOAD";
/// The first wait before a trapped VM is reloaded; Envoy backs off from there (jittered, up to 10 s).
pub(crate) const RELOAD_BASE_INTERVAL: &str = "0.1s";

/// The wasm HTTP filter, as a downstream filter or (with the upstream root id) an upstream one.
///
/// Each role runs in its own VM, named after its root id, so a trap in one role never takes the other down, and
/// a trapped VM is reloaded ([`FAILURE_POLICY`]). Shared data is scoped by VM id; the upstream role reads none.
pub(crate) fn wasm_plugin(name: &str, root_id: &str, plugin_config: &str, opts: &RenderOptions) -> Value {
    if let Some(path) = &opts.module_path {
        return module_filter(name, root_id, plugin_config, path);
    }
    json!({
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": root_id,
                "allow_on_headers_stop_iteration": true,
                "failure_policy": FAILURE_POLICY,
                // Envoy's default waits 1 s before a reload, and its worker answers 503 meanwhile.
                "reload_config": { "backoff": { "base_interval": RELOAD_BASE_INTERVAL, "max_interval": "10s" } },
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": plugin_config,
                },
                "vm_config": {
                    "vm_id": root_id,
                    "runtime": opts.runtime,
                    "code": { "local": { "filename": opts.wasm_path } },
                },
            },
        },
    })
}

/// The type of the filter [`wasm_plugin`] renders for `opts`: the wasm filter, or the dynamic-module one.
pub(crate) fn filter_type(opts: &RenderOptions) -> &'static str {
    match opts.module_path {
        Some(_) => MODULE_TYPE,
        None => WASM_TYPE,
    }
}

pub(crate) const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
pub(crate) const MODULE_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter";

/// The native build's filter: Envoy's dynamic-module HTTP filter loading the module at `path`. The role is the
/// filter name (the module reads it as the wasm build reads its root id) and the configuration is the same JSON
/// document. The module stays loaded for Envoy's lifetime (`do_not_close`): its process-wide state (the key
/// table, buckets, in-flight counts) must outlive a filter configuration that is replaced.
pub(crate) fn module_filter(name: &str, root_id: &str, plugin_config: &str, path: &str) -> Value {
    json!({
        "name": name,
        "typed_config": {
            "@type": MODULE_TYPE,
            "dynamic_module_config": {
                "module": { "local": { "filename": path } },
                "do_not_close": true,
            },
            "filter_name": root_id,
            "filter_config": {
                "@type": "type.googleapis.com/google.protobuf.StringValue",
                "value": plugin_config,
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
    fn with_a_module_the_dynamic_module_filter_replaces_the_wasm_one() {
        let cfg = llmroute_core::load_config(DOC).unwrap();
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
