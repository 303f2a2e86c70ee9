//! Live reconfiguration through Envoy's extension config discovery (ECDS).
//!
//! With [`RenderOptions::ecds_path`](super::RenderOptions) set, the listener's wasm filter entry carries no
//! configuration: it names the extension config [`contract::ROOT_ID`] and a `path_config_source` watching a file. That
//! file holds a `DiscoveryResponse` whose one resource is the filter's `TypedExtensionConfig`: the same wasm
//! filter, with the validated llmroute document embedded, that the static bootstrap would inline
//! (`llmroute render --target ecds`). Envoy reloads it when the file is replaced by a rename; any xDS server can
//! serve the same resource instead.
//!
//! A pushed configuration the filter refuses (`on_configure` returns false) is rejected by Envoy: the previous
//! one stays in force, `extension_config_discovery.llmroute.config_fail` counts the refusal, and the filter
//! logs each validation error.
//!
//! What ECDS carries is the downstream filter only. Backends and the failover aggregates (with the filter's
//! upstream role) are clusters: a change to them needs a new bootstrap or CDS.

use llmroute_core::config::Document;
use llmroute_core::envoy_contract as contract;
use serde_json::{json, Value};

use super::filters::{filter_type, wasm_filter};
use super::json::config_json;
use super::options::RenderOptions;

#[cfg(test)]
use super::filters::WASM_TYPE;
const TYPED_EXTENSION_CONFIG: &str = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";

/// The listener's filter entry: the config comes from the discovery file at `path`, a wasm filter or (with
/// [`RenderOptions::module_path`]) a dynamic-module one.
pub fn discovered_filter(path: &str, opts: &RenderOptions) -> Value {
    json!({
        "name": contract::ROOT_ID,
        "config_discovery": {
            "config_source": {
                "path_config_source": { "path": path },
                "resource_api_version": "V3",
            },
            "type_urls": [filter_type(opts)],
        },
    })
}

/// The bootstrap's `node`, which Envoy requires as soon as any xDS source is configured.
pub fn node() -> Value {
    json!({ "id": "llmroute", "cluster": "llmroute" })
}

/// The `DiscoveryResponse` for the filter's extension config, versioned by a hash of the embedded document.
pub fn discovery_response(config_text: &str, opts: &RenderOptions) -> Result<Value, String> {
    discovery_response_raw(&config_json(config_text)?, opts)
}

/// The same, around an already-converted plugin configuration string. No validation: the CLI validates first.
pub fn discovery_response_raw(plugin_config: &str, opts: &RenderOptions) -> Result<Value, String> {
    let filter = wasm_filter(plugin_config.to_string(), opts);
    let version = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(plugin_config.as_bytes()));
    Ok(json!({
        "version_info": version,
        "resources": [{
            "@type": TYPED_EXTENSION_CONFIG,
            "name": contract::ROOT_ID,
            "typed_config": filter["typed_config"],
        }],
    }))
}

/// `--target ecds` as YAML, with a header that says how to deliver it.
pub fn ecds_yaml(cfg: &Document, config_text: &str, opts: &RenderOptions) -> Result<String, String> {
    let v = discovery_response(config_text, opts)?;
    let body = serde_yaml_ng::to_string(&v).map_err(|e| e.to_string())?;
    // The extension config carries no cluster: say which one the store's callouts need.
    let store = match cfg.affinity.placement_store {
        Some(_) => format!(
            "# affinity.placement_store: the running Envoy needs the cluster `{}` (`llmroute render --target \
             filter` prints it); without it every new key is placed locally and counted as not_sent.\n",
            llmroute_core::envoy_contract::PLACEMENT_STORE_CLUSTER
        ),
        None => String::new(),
    };
    // The admin cluster is the bootstrap's too: a pushed `admin:` names it, but does not move it.
    let admin = format!(
        "# admin: {} must stay the address of the running Envoy's own admin interface, where its cluster `{}` \
         points; otherwise /readyz stays 503 and names {}.\n",
        cfg.admin,
        llmroute_core::envoy_contract::ADMIN_CLUSTER,
        cfg.admin
    );
    Ok(format!(
        "# Rendered by `llmroute render --target ecds` {}: the llmroute filter's extension config (ECDS).\n\
         # Write it to a temporary file in the watched directory, then rename it over the watched path.\n\
         {admin}{store}{body}",
        llmroute_core::VERSION
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081']\nmodels:\n  - name: m\n    routes: [{ backend: a, upstream_model: up }]\n";

    #[test]
    fn the_resource_is_the_inline_filter_under_the_watched_name() {
        let opts = RenderOptions::new("/x.wasm");
        let v = discovery_response(DOC, &opts).unwrap();
        let inline = wasm_filter(config_json(DOC).unwrap(), &opts);
        let r = &v["resources"][0];
        assert_eq!(r["@type"], TYPED_EXTENSION_CONFIG);
        assert_eq!(
            r["name"],
            discovered_filter("/p", &RenderOptions::new("/x.wasm"))["name"]
        );
        assert_eq!(r["typed_config"], inline["typed_config"]);
        assert_eq!(r["typed_config"]["@type"], WASM_TYPE);
        let embedded = r["typed_config"]["config"]["configuration"]["value"].as_str().unwrap();
        assert!(llmroute_core::load_config(embedded).is_ok());
    }

    #[test]
    fn the_header_says_admin_must_stay_the_running_envoys_admin() {
        let doc = format!("{DOC}admin: 127.0.0.1:9911\n");
        let cfg = llmroute_core::load_document(&doc).unwrap();
        let text = ecds_yaml(&cfg, &doc, &RenderOptions::new("/x.wasm")).unwrap();
        let line = text.lines().find(|l| l.starts_with("# admin:")).unwrap_or_default();
        assert!(
            line.contains("127.0.0.1:9911 must stay the address of the running Envoy's own admin interface")
                && line.contains("llmroute_admin"),
            "{text}"
        );
    }

    #[test]
    fn the_version_follows_the_document() {
        let opts = RenderOptions::new("/x.wasm");
        let a = discovery_response(DOC, &opts).unwrap();
        let b = discovery_response(&DOC.replace("upstream_model: up", "upstream_model: other"), &opts).unwrap();
        assert_eq!(
            a["version_info"],
            discovery_response(DOC, &opts).unwrap()["version_info"]
        );
        assert_ne!(a["version_info"], b["version_info"]);
    }

    #[test]
    fn the_listener_entry_watches_the_path() {
        let f = discovered_filter("/etc/llmroute/ecds.yaml", &RenderOptions::new("/x.wasm"));
        let src = &f["config_discovery"]["config_source"];
        assert_eq!(src["path_config_source"]["path"], "/etc/llmroute/ecds.yaml");
        assert_eq!(f["config_discovery"]["type_urls"][0], WASM_TYPE);
        assert!(f.get("typed_config").is_none());
    }
}
