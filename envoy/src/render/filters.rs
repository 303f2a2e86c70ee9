//! The HTTP filters llmroute puts in front of the router: the wasm filter (downstream and upstream roles, each in
//! its own VM, reloaded after a trap) and Envoy's stateful-session filter that `bounded_keys` placement pins hosts
//! with.

use llmroute_core::envoy_contract as contract;
use serde_json::{json, Value};

use super::admission;
use super::options::RenderOptions;

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
            "@type": WASM_TYPE,
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
