//! The cluster the filter polls for `/llmroute/status`, `/healthz` and `/readyz`: Envoy's own admin interface.
//!
//! A wasm filter cannot read cluster health, so its root context calls `GET /clusters?format=json` on this
//! cluster about once a second (see `llmroute_core::status`). The cluster is named
//! [`ADMIN_CLUSTER`](llmroute_core::envoy_contract::ADMIN_CLUSTER), a name backends may not take, and points at the
//! configured admin address; an admin bound to a wildcard address is reached on loopback. It is rendered with or
//! without the filter, so both bootstraps keep the same clusters.
//!
//! No route names this cluster, and the filter removes every client-sent `x-llmroute-*` header before it sets
//! `x-llmroute-cluster` to a backend, so a client cannot reach the admin interface through the listener.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use llmroute_core::config::Document;
use llmroute_core::envoy_contract::ADMIN_CLUSTER;
use serde_json::{json, Value};

use super::json::{push, socket};

/// Appends the admin cluster to the bootstrap's clusters.
pub fn apply(cfg: &Document, bootstrap: &mut Value) {
    push(&mut bootstrap["static_resources"]["clusters"], cluster(cfg.admin));
}

/// Where the filter reaches the admin interface bound at `admin`.
pub fn target(admin: SocketAddr) -> SocketAddr {
    let ip = match admin.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        // Envoy binds `::` as IPv6-only unless told otherwise, so IPv4 loopback would not reach it.
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, admin.port())
}

pub(crate) fn cluster(admin: SocketAddr) -> Value {
    let to = target(admin);
    json!({
        "name": ADMIN_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": ADMIN_CLUSTER,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": socket(&to.ip().to_string(), to.port()) } }] }],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{bootstrap, RenderOptions};

    const DOC: &str = "version: 1\nadmin: 127.0.0.1:9911\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081']\n  - name: b\n    kind: vllm\n    endpoints: ['127.0.0.1:9000']\nmodels:\n  - name: m\n    routes: [{ backend: a, upstream_model: up }]\n";

    fn render(doc: &str, opts: &RenderOptions) -> Value {
        let cfg = llmroute_core::load_document(doc).unwrap();
        bootstrap(&cfg, doc, opts).unwrap()
    }

    fn admin_cluster(v: &Value) -> Value {
        let clusters = v["static_resources"]["clusters"].as_array().unwrap();
        let found: Vec<&Value> = clusters.iter().filter(|c| c["name"] == ADMIN_CLUSTER).collect();
        assert_eq!(found.len(), 1, "exactly one admin cluster");
        found[0].clone()
    }

    fn endpoint(c: &Value) -> (String, u64) {
        let s = &c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"];
        (
            s["address"].as_str().unwrap().to_string(),
            s["port_value"].as_u64().unwrap(),
        )
    }

    #[test]
    fn the_admin_cluster_points_at_the_admin_address() {
        let v = render(DOC, &RenderOptions::new("/x.wasm"));
        let c = admin_cluster(&v);
        assert_eq!(c["type"], "STATIC");
        assert_eq!(c["load_assignment"]["cluster_name"], ADMIN_CLUSTER);
        assert_eq!(endpoint(&c), ("127.0.0.1".to_string(), 9911));
        assert_eq!(v["admin"]["address"]["socket_address"]["port_value"], 9911);
        assert!(c.get("transport_socket").is_none() && c.get("health_checks").is_none());
    }

    #[test]
    fn it_comes_after_the_backends_with_or_without_the_filter() {
        for opts in [
            RenderOptions::new("/x.wasm"),
            RenderOptions::new("/x.wasm").without_filter(),
        ] {
            let v = render(DOC, &opts);
            let names: Vec<&str> = v["static_resources"]["clusters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap())
                .collect();
            assert_eq!(names.first(), Some(&"a"));
            assert_eq!(names.last(), Some(&ADMIN_CLUSTER));
        }
    }

    #[test]
    fn wildcard_admin_addresses_are_reached_on_loopback() {
        let t = |s: &str| target(s.parse().unwrap()).to_string();
        assert_eq!(t("0.0.0.0:9901"), "127.0.0.1:9901");
        assert_eq!(t("[::]:9901"), "[::1]:9901");
        assert_eq!(t("127.0.0.1:9901"), "127.0.0.1:9901");
        assert_eq!(t("10.1.2.3:9901"), "10.1.2.3:9901");
        assert_eq!(t("[::1]:9901"), "[::1]:9901");
        let v = render(
            &DOC.replace("127.0.0.1:9911", "0.0.0.0:9911"),
            &RenderOptions::new("/x.wasm"),
        );
        assert_eq!(endpoint(&admin_cluster(&v)), ("127.0.0.1".to_string(), 9911));
        assert_eq!(v["admin"]["address"]["socket_address"]["address"], "0.0.0.0");
    }

    #[test]
    fn no_route_names_the_admin_cluster() {
        let v = render(DOC, &RenderOptions::new("/x.wasm"));
        let listeners = v["static_resources"]["listeners"].to_string();
        assert!(!listeners.contains(ADMIN_CLUSTER));
    }
}
