//! The cluster through which the filter reaches etcd for the shared placement table
//! (`affinity.placement_store.etcd`, see `llmroute_core::key_placement::store`).
//!
//! Named [`PLACEMENT_STORE_CLUSTER`](llmroute_core::envoy_contract::PLACEMENT_STORE_CLUSTER), a name backends may
//! not take; its endpoints are the configured etcd members (STATIC for IP literals, STRICT_DNS otherwise). Envoy
//! health-checks each member's `/health` every second and drops a dead one from the rotation, so a member going
//! away costs at most a few callouts, each of which falls back to local placement. No route names this cluster.
//! With `tls` the cluster carries the same `UpstreamTlsContext` a backend's `tls` gives (see `tls`), and the health
//! checks go over it: a member whose certificate does not verify is never healthy, so every call to it is
//! `not_sent` and keys are placed locally.
//!
//! Every target carries it: the full bootstrap and `--target filter` through [`apply`], the Istio EnvoyFilter as
//! a `CLUSTER` `ADD` patch of [`cluster`]. `--target ecds` carries only the filter's config, so its header says
//! that the running Envoy needs this cluster (without it every store call is `not_sent`, and keys are placed
//! locally).

use llmroute_core::config::{Document, PlacementStore};
use llmroute_core::envoy_contract::PLACEMENT_STORE_CLUSTER;
use serde_json::{json, Value};

use super::json::{duration_ms, push, socket};

/// Appends the store's cluster when the config has a placement store.
pub fn apply(cfg: &Document, bootstrap: &mut Value) {
    if let Some(store) = &cfg.affinity.placement_store {
        push(&mut bootstrap["static_resources"]["clusters"], cluster(store));
    }
}

/// The `llmroute_placement_store` cluster for `store`'s etcd members.
pub fn cluster(store: &PlacementStore) -> Value {
    let endpoints: Vec<Value> = store
        .endpoints
        .iter()
        .map(|e| json!({ "endpoint": { "address": socket(&e.host, e.port) } }))
        .collect();
    let kind = if store.endpoints.iter().all(|e| e.is_ip) {
        "STATIC"
    } else {
        "STRICT_DNS"
    };
    let mut cluster = json!({
        "name": PLACEMENT_STORE_CLUSTER,
        "type": kind,
        "connect_timeout": duration_ms(store.timeout_ms.max(250)),
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": { "cluster_name": PLACEMENT_STORE_CLUSTER, "endpoints": [{ "lb_endpoints": endpoints }] },
        "health_checks": [{
            "timeout": "1s",
            "interval": "1s",
            "no_traffic_interval": "1s",
            "unhealthy_threshold": 2,
            "healthy_threshold": 1,
            "http_health_check": { "path": "/health" },
        }],
        // Every member may be down at once; the filter then places locally, so never panic-route to them all.
        "common_lb_config": { "healthy_panic_threshold": { "value": 0 } },
    });
    if let Some(t) = &store.tls {
        // Verified like a backend's engines: etcd's certificate chains to `ca_file` and names the member.
        super::tls::secure_endpoints(&mut cluster, &store.endpoints, t);
    }
    cluster
}

#[cfg(test)]
mod tests {
    use crate::render::{bootstrap, RenderOptions};
    use llmroute_core::envoy_contract::PLACEMENT_STORE_CLUSTER;
    use serde_json::Value;

    const DOC: &str = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081']\nmodels:\n  - name: m\n    routes: [{ backend: a }]\naffinity:\n  placement: bounded_keys\n";

    fn store_clusters(doc: &str) -> Vec<Value> {
        let cfg = llmroute_core::load_document(doc).unwrap();
        let v = bootstrap(&cfg, doc, &RenderOptions::new("/x.wasm")).unwrap();
        v["static_resources"]["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["name"] == PLACEMENT_STORE_CLUSTER)
            .cloned()
            .collect()
    }

    #[test]
    fn the_store_cluster_lists_every_etcd_member_and_checks_their_health() {
        let doc = format!(
            "{DOC}  placement_store:\n    etcd:\n      endpoints: ['127.0.0.1:2379', 'http://127.0.0.2:2379']\n      timeout_ms: 40\n"
        );
        let found = store_clusters(&doc);
        assert_eq!(found.len(), 1);
        let c = &found[0];
        assert_eq!(c["type"], "STATIC");
        let eps = c["load_assignment"]["endpoints"][0]["lb_endpoints"].as_array().unwrap();
        let addrs: Vec<String> = eps
            .iter()
            .map(|e| {
                let s = &e["endpoint"]["address"]["socket_address"];
                format!("{}:{}", s["address"].as_str().unwrap(), s["port_value"])
            })
            .collect();
        assert_eq!(addrs, ["127.0.0.1:2379", "127.0.0.2:2379"]);
        assert_eq!(c["health_checks"][0]["http_health_check"]["path"], "/health");
        assert_eq!(c["common_lb_config"]["healthy_panic_threshold"]["value"], 0);
    }

    fn with_store() -> (llmroute_core::Document, String) {
        let doc = format!("{DOC}  placement_store:\n    etcd:\n      endpoints: ['127.0.0.1:2379']\n");
        (llmroute_core::load_document(&doc).unwrap(), doc)
    }

    #[test]
    fn the_filter_target_carries_the_store_cluster() {
        let (cfg, doc) = with_store();
        let p = crate::render::target::pieces(&cfg, &doc, &RenderOptions::new("/x.wasm")).unwrap();
        let found: Vec<&Value> = p
            .clusters
            .iter()
            .filter(|c| c["name"] == PLACEMENT_STORE_CLUSTER)
            .collect();
        assert_eq!(found.len(), 1, "{:?}", p.clusters);
        assert_eq!(found[0]["health_checks"][0]["http_health_check"]["path"], "/health");
    }

    #[test]
    fn the_ecds_target_says_the_running_envoy_needs_the_store_cluster() {
        let (cfg, doc) = with_store();
        let opts = RenderOptions::new("/x.wasm");
        let text = crate::render::ecds::ecds_yaml(&cfg, &doc, &opts).unwrap();
        let header: Vec<&str> = text.lines().take_while(|l| l.starts_with('#')).collect();
        assert!(
            header
                .iter()
                .any(|l| l.contains(PLACEMENT_STORE_CLUSTER) && l.contains("--target filter")),
            "{header:?}"
        );
        let plain = llmroute_core::load_document(DOC).unwrap();
        let text = crate::render::ecds::ecds_yaml(&plain, DOC, &opts).unwrap();
        assert!(!text.contains(PLACEMENT_STORE_CLUSTER));
    }

    #[test]
    fn with_tls_every_member_is_verified_against_the_ca_and_its_own_name() {
        let doc = format!(
            "{DOC}  placement_store:\n    etcd:\n      endpoints: ['https://127.0.0.1:2379', 'etcd-1.local:2379']\n      tls: {{ ca_file: /etc/llmroute/etcd-ca.pem }}\n"
        );
        let c = &store_clusters(&doc)[0];
        let ctx = &c["transport_socket"]["typed_config"];
        assert_eq!(
            ctx["@type"],
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
        );
        let v = &ctx["common_tls_context"]["validation_context"];
        assert_eq!(v["trusted_ca"]["filename"], "/etc/llmroute/etcd-ca.pem");
        // Two names (an IP and a DNS name): one context each, picked by endpoint metadata.
        let matches = c["transport_socket_matches"].as_array().unwrap();
        assert_eq!(matches.len(), 2);
        let sans: Vec<&str> = matches
            .iter()
            .map(|m| {
                m["transport_socket"]["typed_config"]["common_tls_context"]["validation_context"]
                    ["match_typed_subject_alt_names"][0]["matcher"]["exact"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(sans, ["127.0.0.1", "etcd-1.local"]);
        let plain = format!("{DOC}  placement_store:\n    etcd:\n      endpoints: ['127.0.0.1:2379']\n");
        assert!(store_clusters(&plain)[0].get("transport_socket").is_none());
    }

    #[test]
    fn a_client_certificate_reaches_the_store_cluster_in_every_target() {
        let tls = "tls: { ca_file: /ca.pem, cert_file: /etcd-client.pem, key_file: /etcd-client.key }";
        let want = serde_json::json!([{
            "certificate_chain": { "filename": "/etcd-client.pem" },
            "private_key": { "filename": "/etcd-client.key" },
        }]);
        let certs = |c: &Value| c["transport_socket"]["typed_config"]["common_tls_context"]["tls_certificates"].clone();
        // The full bootstrap and `--target filter`; the health checks have no socket of their own, so they present
        // the cluster's certificate too.
        let doc =
            format!("{DOC}  placement_store:\n    etcd:\n      endpoints: ['https://127.0.0.1:2379']\n      {tls}\n");
        let c = &store_clusters(&doc)[0];
        assert_eq!(certs(c), want, "{c}");
        assert!(c["health_checks"][0].get("transport_socket_match_criteria").is_none());
        let cfg = llmroute_core::load_document(&doc).unwrap();
        let p = crate::render::target::pieces(&cfg, &doc, &RenderOptions::new("/x.wasm")).unwrap();
        let piece = p
            .clusters
            .iter()
            .find(|c| c["name"] == PLACEMENT_STORE_CLUSTER)
            .unwrap();
        assert_eq!(certs(piece), want);
        // `--target istio`: the store cluster is a CLUSTER ADD patch carrying the same socket.
        let istio = include_str!("../../../testdata/istio/llmroute.yaml").replace(
            "etcd: { endpoints: [\"etcd-0",
            &format!("etcd: {{ {tls}, endpoints: [\"etcd-0"),
        );
        let cfg = llmroute_core::load_document(&istio).unwrap();
        let wasm = crate::render::istio::WasmSource::Local("/w.wasm".into());
        let opts = crate::render::istio::IstioOptions::proxy(wasm, "llmroute");
        let docs = crate::render::istio::manifests(&cfg, &istio, &opts).unwrap().files;
        let (_, filter) = docs.iter().find(|(n, _)| n == "envoyfilter.yaml").unwrap();
        let filter: Value = serde_yaml_ng::from_str(filter).unwrap();
        let added = filter["spec"]["configPatches"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["patch"]["value"]["name"] == PLACEMENT_STORE_CLUSTER)
            .unwrap();
        let c = &added["patch"]["value"];
        assert_eq!(certs(c), want, "{c}");
        for m in c["transport_socket_matches"].as_array().unwrap() {
            assert_eq!(certs(m), want, "each member's own context presents it too");
        }
    }

    #[test]
    fn no_store_no_cluster_and_names_resolve_by_dns() {
        assert!(store_clusters(DOC).is_empty());
        let doc = format!("{DOC}  placement_store:\n    etcd:\n      endpoints: ['etcd-0.local:2379']\n");
        assert_eq!(store_clusters(&doc)[0]["type"], "STRICT_DNS");
    }
}
