//! The probe clusters of the `/props` fleet check and the engine load poll: one single-host cluster per endpoint
//! of each `llamacpp` backend with two or more endpoints (see `llmroute_core::fleet_check`) and of each backend
//! with `load` (see `llmroute_core::load::poll`); `llmroute_core::probe` lists them.
//!
//! The filter's root context reads `GET /props` from each llama.cpp server every few seconds to check that the
//! servers of a backend agree on their context size and slot count, and `GET /metrics` from each engine of a
//! backend with `load` every `poll_ms`. A wasm `dispatch_http_call` targets a
//! cluster, and the backend's own cluster would let its load balancer pick the host, so each endpoint gets its
//! own cluster, named by [`probe_cluster`](llmroute_core::envoy_contract::probe_cluster): STATIC for an IP,
//! STRICT_DNS for a name. It reaches the server the way the backend's cluster does: the same connect timeout,
//! the TLS context that verifies this endpoint's name, and a copy of the backend cluster's upstream filters (the
//! credential injector).
//! It has no health check, no outlier detection and no load balancer settings, and no route names it.
//!
//! A discovered `llamacpp` backend, or a discovered backend with `load`, has no endpoint list to render. It gets
//! one `ORIGINAL_DST` cluster instead,
//! named by [`discovered_probe_cluster`], with `lb_policy: CLUSTER_PROVIDED` and
//! `original_dst_lb_config.use_http_header`: each of the filter's calls names its host (`IP:PORT`) in
//! [`ORIGINAL_DST_HEADER`], and Envoy connects there. Envoy cannot limit such a cluster to a set of hosts; what
//! limits it is that only the filter's own `dispatch_http_call`s reach it (they do not pass through the
//! listener's filter chain, and no route names the cluster, so a client's request can neither choose it nor set
//! its header), and that the filter names only hosts the status poll found in the backend's cluster. It copies
//! the backend cluster's connect timeout and upstream filters when `llmroute render` writes that cluster, and
//! takes the backend's `tls` (verifying its `sni`) whoever writes the backend's cluster.

use llmroute_core::config::{Backend, Document};
use llmroute_core::envoy_contract::{discovered_probe_cluster, ORIGINAL_DST_HEADER};
use llmroute_core::fleet_check::ProbeTarget;
use serde_json::{json, Value};

use super::json::{duration_ms, socket};

/// What a probe cluster copies from its backend's rendered cluster.
const COPIED: [&str; 2] = ["transport_socket", "typed_extension_protocol_options"];

/// Appends the probe clusters to the bootstrap's clusters. Runs after the TLS and credential passes, so the
/// backend clusters it copies from are complete.
pub fn apply(cfg: &Document, bootstrap: &mut Value) {
    let Some(clusters) = bootstrap["static_resources"]["clusters"].as_array_mut() else {
        return;
    };
    let probes: Vec<Value> = llmroute_core::probe::endpoints(cfg)
        .iter()
        .filter_map(|t| {
            let backend = cfg.backends.iter().find(|b| b.name == t.backend)?;
            let endpoint = backend.endpoints.get(t.index)?;
            let rendered = clusters.iter().find(|c| c["name"] == t.backend.as_str());
            let mut c = cluster(
                t,
                &endpoint.host,
                endpoint.port,
                endpoint.is_ip,
                backend.connect_timeout_ms,
                rendered,
            );
            // The backend may verify each endpoint under its own name (see `tls`): use this endpoint's.
            if let Some(tls) = &backend.tls {
                c["transport_socket"] = super::tls::upstream(tls, &super::tls::verified_name(tls, endpoint));
            }
            Some(c)
        })
        .collect();
    let discovered: Vec<Value> = llmroute_core::probe::discovered_backends(cfg)
        .map(|b| discovered_cluster(b, clusters.iter().find(|c| c["name"] == b.name.as_str())))
        .collect();
    clusters.extend(probes);
    clusters.extend(discovered);
}

/// The original-destination probe cluster of the discovered backend `b`; `from` is the backend's rendered
/// cluster, when `llmroute render` writes it (an `eds_path` backend), whose upstream filters it copies. Its TLS
/// is the backend's own `tls`, so a cluster defined elsewhere (`discovery: {}`) is probed over TLS too.
pub fn discovered_cluster(b: &Backend, from: Option<&Value>) -> Value {
    let name = discovered_probe_cluster(&b.name);
    let mut c = json!({
        "name": name,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "original_dst_lb_config": { "use_http_header": true, "http_header_name": ORIGINAL_DST_HEADER },
        "connect_timeout": duration_ms(b.connect_timeout_ms),
    });
    for key in COPIED {
        if let Some(v) = from.and_then(|f| f.get(key)) {
            c[key] = v.clone();
        }
    }
    if let Some(socket) = b.tls.as_ref().and_then(super::tls::discovered) {
        c["transport_socket"] = socket;
    }
    c
}

fn cluster(
    t: &ProbeTarget,
    host: &str,
    port: u16,
    is_ip: bool,
    connect_timeout_ms: u64,
    from: Option<&Value>,
) -> Value {
    let mut c = json!({
        "name": t.cluster,
        "type": if is_ip { "STATIC" } else { "STRICT_DNS" },
        "connect_timeout": duration_ms(connect_timeout_ms),
        "load_assignment": {
            "cluster_name": t.cluster,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": socket(host, port) } }] }],
        },
    });
    for key in COPIED {
        if let Some(v) = from.and_then(|f| f.get(key)) {
            c[key] = v.clone();
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use crate::render::{bootstrap, RenderOptions};
    use llmroute_core::status::ADMIN_CLUSTER;
    use serde_json::Value;

    const DOC: &str = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081', 'llama.internal:8082']\n    connect_timeout_ms: 750\n  - name: solo\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8090']\n  - name: v\n    kind: vllm\n    endpoints: ['127.0.0.1:9001', '127.0.0.1:9002']\nmodels:\n  - name: m\n    routes: [{ backend: a }]\n";

    fn render(doc: &str) -> Value {
        let cfg = llmroute_core::load_document(doc).unwrap();
        bootstrap(&cfg, doc, &RenderOptions::new("/x.wasm")).unwrap()
    }

    fn clusters(v: &Value) -> Vec<Value> {
        v["static_resources"]["clusters"].as_array().unwrap().clone()
    }

    fn names(v: &Value) -> Vec<String> {
        clusters(v)
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    }

    fn named(v: &Value, name: &str) -> Value {
        clusters(v)
            .into_iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no cluster {name}"))
    }

    #[test]
    fn one_single_host_cluster_per_endpoint_of_a_multi_server_llamacpp_backend() {
        let v = render(DOC);
        let names = names(&v);
        assert_eq!(
            names,
            vec![
                "a",
                "solo",
                "v",
                "llmroute-probe-a-0",
                "llmroute-probe-a-1",
                ADMIN_CLUSTER
            ],
            "no probe for a single-endpoint backend or another engine kind; the admin cluster stays last"
        );
        let p0 = named(&v, "llmroute-probe-a-0");
        assert_eq!(p0["type"], "STATIC");
        assert_eq!(p0["connect_timeout"], "0.750s");
        let eps = p0["load_assignment"]["endpoints"][0]["lb_endpoints"]
            .as_array()
            .unwrap();
        assert_eq!(eps.len(), 1);
        let addr = &eps[0]["endpoint"]["address"]["socket_address"];
        assert_eq!(
            (addr["address"].as_str(), addr["port_value"].as_u64()),
            (Some("127.0.0.1"), Some(8081))
        );
        let p1 = named(&v, "llmroute-probe-a-1");
        assert_eq!(p1["type"], "STRICT_DNS");
        assert_eq!(
            p1["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
                ["address"],
            "llama.internal"
        );
        for p in [&p0, &p1] {
            assert!(p.get("health_checks").is_none() && p.get("outlier_detection").is_none());
            assert!(p.get("transport_socket").is_none() && p.get("typed_extension_protocol_options").is_none());
        }
        let listeners = v["static_resources"]["listeners"].to_string();
        assert!(!listeners.contains("llmroute-probe"), "no route names a probe cluster");
    }

    #[test]
    fn probes_reach_the_server_as_the_backend_does_tls_and_credential_included() {
        let doc = DOC.replace(
            "    connect_timeout_ms: 750\n",
            "    connect_timeout_ms: 750\n    tls: { sni: llama.internal, ca_file: /etc/ca.pem }\n    credential_env: LLAMA_TOKEN\n",
        );
        let v = render(&doc);
        let backend = named(&v, "a");
        assert!(backend.get("transport_socket").is_some() && backend.get("typed_extension_protocol_options").is_some());
        for probe in ["llmroute-probe-a-0", "llmroute-probe-a-1"] {
            let p = named(&v, probe);
            assert_eq!(p["transport_socket"], backend["transport_socket"], "{probe}");
            assert_eq!(
                p["typed_extension_protocol_options"], backend["typed_extension_protocol_options"],
                "{probe}"
            );
        }
    }

    #[test]
    fn without_sni_each_probe_verifies_its_own_endpoint_name() {
        let doc = DOC.replace(
            "    connect_timeout_ms: 750\n",
            "    connect_timeout_ms: 750\n    tls: { ca_file: /etc/ca.pem }\n",
        );
        let v = render(&doc);
        let san = |c: &Value| {
            c["transport_socket"]["typed_config"]["common_tls_context"]["validation_context"]
                ["match_typed_subject_alt_names"]
                .clone()
        };
        let p0 = named(&v, "llmroute-probe-a-0");
        assert_eq!(
            san(&p0),
            serde_json::json!([{ "san_type": "IP_ADDRESS", "matcher": { "exact": "127.0.0.1" } }])
        );
        assert!(p0["transport_socket"]["typed_config"].get("sni").is_none());
        let p1 = named(&v, "llmroute-probe-a-1");
        assert_eq!(
            san(&p1),
            serde_json::json!([{ "san_type": "DNS", "matcher": { "exact": "llama.internal" } }])
        );
        assert_eq!(p1["transport_socket"]["typed_config"]["sni"], "llama.internal");
    }

    #[test]
    fn a_backend_with_load_gets_a_probe_cluster_per_endpoint_whatever_its_kind_and_size() {
        // The engine load poll reads every endpoint of a backend with `load`: a single vLLM endpoint too, and a
        // llama.cpp backend the `/props` check also reads gets its clusters once.
        let doc = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081', 'llama.internal:8082']\n    load: {}\n  - name: solo\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8090']\n    load: { poll_ms: 500 }\n  - name: v\n    kind: vllm\n    endpoints: ['127.0.0.1:9001', '127.0.0.1:9002']\n    load: {}\n  - name: d\n    kind: sglang\n    discovery: { eds_path: /etc/eds/d.yaml }\n    load: {}\nmodels:\n  - name: m\n    routes: [{ backend: a }]\n";
        let v = render(doc);
        let names = names(&v);
        assert_eq!(
            names,
            vec![
                "a",
                "solo",
                "v",
                "d",
                "llmroute-probe-a-0",
                "llmroute-probe-a-1",
                "llmroute-probe-solo-0",
                "llmroute-probe-v-0",
                "llmroute-probe-v-1",
                "llmroute-dst-probe-d",
                ADMIN_CLUSTER
            ]
        );
        assert_eq!(named(&v, "llmroute-probe-v-1")["type"], "STATIC");
    }

    #[test]
    fn a_discovered_llamacpp_backend_gets_one_original_destination_probe_cluster() {
        let doc = "version: 1\nbackends:\n  - name: d\n    kind: llamacpp\n    discovery: { eds_path: /etc/eds/d.yaml }\n    connect_timeout_ms: 600\n    tls: { sni: llama.internal, ca_file: /etc/ca.pem }\n    credential_env: LLAMA_TOKEN\n  - name: dv\n    kind: vllm\n    discovery: { eds_path: /etc/eds/dv.yaml }\n  - name: ext\n    kind: llamacpp\n    discovery: {}\nmodels:\n  - name: m\n    routes: [{ backend: d }]\n";
        let v = render(doc);
        let names = names(&v);
        assert_eq!(
            names,
            vec![
                "d",
                "dv",
                "llmroute-dst-probe-d",
                "llmroute-dst-probe-ext",
                ADMIN_CLUSTER
            ],
            "one per discovered llama.cpp backend, none for vLLM; a cluster defined elsewhere still gets one"
        );
        let p = named(&v, "llmroute-dst-probe-d");
        assert_eq!(p["type"], "ORIGINAL_DST");
        assert_eq!(p["lb_policy"], "CLUSTER_PROVIDED");
        assert_eq!(p["original_dst_lb_config"]["use_http_header"], true);
        assert_eq!(
            p["original_dst_lb_config"]["http_header_name"],
            "x-envoy-original-dst-host"
        );
        assert_eq!(p["connect_timeout"], "0.600s");
        assert!(p.get("load_assignment").is_none(), "Envoy adds hosts on demand");
        let backend = named(&v, "d");
        assert_eq!(
            p["typed_extension_protocol_options"],
            backend["typed_extension_protocol_options"]
        );
        assert_eq!(p["transport_socket"]["typed_config"]["sni"], "llama.internal");
        assert_eq!(p["transport_socket"], backend["transport_socket"]);
        let ext = named(&v, "llmroute-dst-probe-ext");
        assert!(ext.get("typed_extension_protocol_options").is_none() && ext.get("transport_socket").is_none());
        let listeners = v["static_resources"]["listeners"].to_string();
        assert!(
            !listeners.contains("llmroute-dst-probe"),
            "no route names a probe cluster"
        );
    }
}
