//! llmroute's own proxies: the workloads that carry the filter, and what their `istio-proxy` needs.
//!
//! - A `ServiceAccount` `llmroute`: the proxies' mTLS identity, the only one the engines admit (see `policy`).
//! - A `Deployment` `llmroute` of Istio gateway proxies (gateway injection: `image: auto`, the `gateway`
//!   template), pods labelled `istio: llmroute`. Its `istio-proxy` container gets the API keys from a Secret
//!   (`auth.keys_env`, read by the filter through `host_env_keys`) and the bootstrap override that adds the
//!   filter's `stats_tags` (mounted from the ConfigMap, named by `ISTIO_BOOTSTRAP_OVERRIDE`).
//! - A `Service` `llmroute` selecting those pods: what clients call.
//! - A `Gateway` `llmroute` on those pods, on `listen`'s port, which admits `VirtualService`s of its own
//!   namespace only (`./*`).
//! - The ConfigMap of the bootstrap override, rendered for an ingress gateway too (whose pods you patch).

use llmroute_core::config::Document;
use serde_json::{json, Value};

use super::traffic::metadata;
use super::{IstioOptions, PROXY_NAME};
use crate::render::observe;

/// The ConfigMap holding the bootstrap override.
pub const BOOTSTRAP_CONFIG_MAP: &str = "llmroute-bootstrap";
/// Where istio-proxy finds it, as Istio's own injection template names it.
const BOOTSTRAP_DIR: &str = "/etc/istio/custom-bootstrap";
const BOOTSTRAP_FILE: &str = "custom_bootstrap.json";

fn proxy_labels() -> Value {
    json!({ "istio": PROXY_NAME, "app": PROXY_NAME })
}

pub fn service_account(opts: &IstioOptions) -> Value {
    json!({ "apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(PROXY_NAME, opts) })
}

/// The bootstrap override: Envoy merges it into Istio's bootstrap (lists are appended), so the filter's
/// `stats_tags` join Istio's own. Istio keeps `wasmcustom.*` stats by default (its `wasm` inclusion prefix).
pub fn bootstrap_config_map(opts: &IstioOptions) -> Value {
    let overlay = json!({ "stats_config": observe::stats_config() });
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(BOOTSTRAP_CONFIG_MAP, opts),
        "data": { (BOOTSTRAP_FILE): serde_json::to_string_pretty(&overlay).unwrap_or_default() },
    })
}

/// The `istio-proxy` settings that load the bootstrap override: an environment variable and a volume mount.
fn bootstrap_env() -> Value {
    json!({ "name": "ISTIO_BOOTSTRAP_OVERRIDE", "value": format!("{BOOTSTRAP_DIR}/{BOOTSTRAP_FILE}") })
}

fn bootstrap_mount() -> Value {
    json!({ "name": "llmroute-bootstrap", "mountPath": BOOTSTRAP_DIR, "readOnly": true })
}

fn bootstrap_volume() -> Value {
    json!({ "name": "llmroute-bootstrap", "configMap": { "name": BOOTSTRAP_CONFIG_MAP } })
}

/// For an ingress gateway you run: the `kubectl patch` that gives its pods the bootstrap override.
pub fn bootstrap_patch_hint(namespace: &str) -> String {
    let patch = json!({ "spec": { "template": { "spec": {
        "containers": [{ "name": "istio-proxy", "env": [bootstrap_env()], "volumeMounts": [bootstrap_mount()] }],
        "volumes": [bootstrap_volume()],
    } } } });
    format!("kubectl -n {namespace} patch deployment/<your gateway> -p '{patch}'")
}

pub fn deployment(cfg: &Document, opts: &IstioOptions) -> Value {
    let mut env = vec![bootstrap_env()];
    if let Some(auth) = &cfg.auth {
        env.push(json!({
            "name": auth.keys_env,
            "valueFrom": { "secretKeyRef": { "name": opts.keys_secret, "key": auth.keys_env } },
        }));
    }
    let mut labels = proxy_labels();
    labels["sidecar.istio.io/inject"] = json!("true");
    let mut pod = json!({
        "serviceAccountName": PROXY_NAME,
        "containers": [{
            "name": "istio-proxy",
            // Istio's gateway injection replaces `auto` with its proxy image.
            "image": "auto",
            "env": env,
            "volumeMounts": [bootstrap_mount()],
            "ports": [{ "name": "http", "containerPort": cfg.render_only.listen.port() }],
            "securityContext": {
                "capabilities": { "drop": ["ALL"] },
                "runAsUser": 1337,
                "runAsGroup": 1337,
                "runAsNonRoot": true,
                "allowPrivilegeEscalation": false,
            },
        }],
        "volumes": [bootstrap_volume()],
    });
    if cfg.render_only.listen.port() < 1024 {
        // istio-proxy runs unprivileged; let it bind a low port.
        pod["securityContext"] =
            json!({ "sysctls": [{ "name": "net.ipv4.ip_unprivileged_port_start", "value": "0" }] });
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(PROXY_NAME, opts),
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": proxy_labels() },
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": { "inject.istio.io/templates": "gateway" },
                },
                "spec": pod,
            },
        },
    })
}

/// The Service clients call: the proxies' pods, on `listen`'s port.
pub fn service(cfg: &Document, opts: &IstioOptions) -> Value {
    let port = cfg.render_only.listen.port();
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(PROXY_NAME, opts),
        "spec": {
            "selector": proxy_labels(),
            "ports": [{ "name": "http", "port": port, "targetPort": port, "appProtocol": "http" }],
        },
    })
}

/// The Istio Gateway on the proxies: one plain-HTTP server on `listen`'s port.
pub fn gateway(cfg: &Document, opts: &IstioOptions) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "Gateway",
        "metadata": metadata(PROXY_NAME, opts),
        "spec": {
            "selector": { "istio": PROXY_NAME },
            "servers": [{
                "port": { "number": cfg.render_only.listen.port(), "name": "http", "protocol": "HTTP" },
                "hosts": ["./*"],
            }],
        },
    })
}
