//! TLS, both ways, as Envoy transport sockets:
//! - `listen_tls` puts a `DownstreamTlsContext` (the certificate chain and key files, ALPN `h2,http/1.1`) on
//!   every filter chain of the listener. There is then no plain-HTTP chain at all: a plain listener is rendered
//!   only when no certificate is given. The connection manager's `codec_type: AUTO` follows the ALPN choice.
//! - A backend's `tls` puts an `UpstreamTlsContext` on its cluster: the engines' certificates must chain to
//!   `ca_file` (Envoy never falls back to a system trust store) **and** name the host Envoy meant to reach, so a
//!   backend token never goes to another holder of a certificate from the same CA. The verified name is `sni`
//!   when given (sent as SNI, matched as a DNS subject alternative name). Without `sni`, it is each endpoint's
//!   own host: a DNS name is sent as SNI and matched as a DNS SAN; an IP literal is matched as an IP-address SAN
//!   (and no SNI is sent, since SNI cannot carry an IP).
//! - With `cert_file` and `key_file`, that context also presents a client certificate (`tls_certificates` in its
//!   `common_tls_context`), for servers that require one (mTLS; etcd's `--client-cert-auth`).
//! - The placement store's `tls` (`affinity.placement_store.etcd.tls`, the same block) secures the etcd cluster
//!   the same way ([`secure_endpoints`]); its health checks go over that socket too, client certificate included.
//! - A discovered backend (`discovery`) has no endpoint list when the bootstrap is rendered: its cluster, and every
//!   other cluster llmroute writes toward its hosts (the `/props` original-destination probe), get one context
//!   verifying `sni` ([`discovered`]; validation requires `sni` there). Without it, an EDS cluster would be
//!   plaintext and carry the backend's token in clear text.
//! - When the endpoints of one backend need different names, each endpoint gets its own context: the cluster's
//!   `transport_socket_matches` holds one per name, keyed on the endpoint metadata
//!   `envoy.transport_socket_match: { llmroute_tls_name: NAME }`. The cluster's default `transport_socket` is
//!   the first endpoint's, so an endpoint that somehow matched none would still be verified, and refused.
//!
//! Envoy reads the PEM files itself, at start-up; they never enter the rendered bootstrap.

use llmroute_core::config::{Backend, CertKey, Document, Endpoint, ListenTls, UpstreamTls};
use serde_json::{json, Value};

const TLS_SOCKET: &str = "envoy.transport_sockets.tls";
const DOWNSTREAM: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
const UPSTREAM: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// Adds the transport sockets to a rendered bootstrap: on every listener's filter chains when `listen_tls` is
/// set, and on the cluster of each backend with `tls`.
pub fn apply(cfg: &Document, bootstrap: &mut Value) {
    apply_listeners(cfg, bootstrap);
    for cluster in array_mut(&mut bootstrap["static_resources"]["clusters"]) {
        let backend = cfg
            .backends
            .iter()
            .find(|b| cluster["name"].as_str() == Some(b.name.as_str()));
        if let Some((b, t)) = backend.and_then(|b| Some((b, b.tls.as_ref()?))) {
            secure_cluster(cluster, b, t);
        }
    }
}

/// The listeners' transport socket only (`listen_tls`); the clusters' come with the renderer's pieces.
pub fn apply_listeners(cfg: &Document, bootstrap: &mut Value) {
    if let Some(t) = &cfg.render_only.listen_tls {
        for listener in array_mut(&mut bootstrap["static_resources"]["listeners"]) {
            for chain in array_mut(&mut listener["filter_chains"]) {
                chain["transport_socket"] = downstream(t);
            }
        }
    }
}

/// The endpoint metadata key that picks an endpoint's entry in `transport_socket_matches`.
pub const MATCH_KEY: &str = "llmroute_tls_name";

/// The name an endpoint's certificate must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifiedName {
    /// Sent as SNI and matched as a DNS subject alternative name.
    Dns(String),
    /// Matched as an IP-address subject alternative name; no SNI.
    Ip(String),
}

impl VerifiedName {
    fn text(&self) -> &str {
        match self {
            VerifiedName::Dns(n) | VerifiedName::Ip(n) => n,
        }
    }
}

/// `sni` when the backend gives one, else the endpoint's own host.
pub fn verified_name(t: &UpstreamTls, e: &Endpoint) -> VerifiedName {
    match (&t.sni, e.is_ip) {
        (Some(sni), _) => VerifiedName::Dns(sni.clone()),
        (None, false) => VerifiedName::Dns(e.host.clone()),
        (None, true) => VerifiedName::Ip(e.host.clone()),
    }
}

/// One context when every endpoint needs the same name; else one per name, picked by endpoint metadata. A
/// discovered backend's one context verifies its `sni`.
fn secure_cluster(cluster: &mut Value, b: &Backend, t: &UpstreamTls) {
    match (b.discovered(), discovered(t)) {
        (true, Some(socket)) => cluster["transport_socket"] = socket,
        _ => secure_endpoints(cluster, &b.endpoints, t),
    }
}

/// The transport socket toward a discovered backend's hosts, whichever they turn out to be: `sni` sent and
/// required as a DNS SAN. `None` without `sni`, which validation refuses on a discovered backend.
pub fn discovered(t: &UpstreamTls) -> Option<Value> {
    let sni = t.sni.as_ref()?;
    Some(upstream(t, &VerifiedName::Dns(sni.clone())))
}

/// [`secure_cluster`] for any cluster whose `lb_endpoints` are `endpoints`, in order: a backend's, or the
/// placement store's etcd members.
pub fn secure_endpoints(cluster: &mut Value, endpoints: &[Endpoint], t: &UpstreamTls) {
    let mut names: Vec<VerifiedName> = Vec::new();
    for e in endpoints {
        let n = verified_name(t, e);
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let Some(first) = names.first() else {
        return;
    };
    cluster["transport_socket"] = upstream(t, first);
    if names.len() < 2 {
        return;
    }
    let matches: Vec<Value> = names
        .iter()
        .map(|n| {
            json!({
                "name": format!("llmroute-tls-{}", n.text()),
                "match": { MATCH_KEY: n.text() },
                "transport_socket": upstream(t, n),
            })
        })
        .collect();
    cluster["transport_socket_matches"] = Value::from(matches);
    let lb_endpoints = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"].as_array_mut();
    for (endpoint, e) in lb_endpoints.into_iter().flatten().zip(endpoints) {
        let n = verified_name(t, e);
        endpoint["metadata"]["filter_metadata"]["envoy.transport_socket_match"][MATCH_KEY] = Value::from(n.text());
    }
}

/// The listener side: serve `cert_file`/`key_file`, offer HTTP/2 then HTTP/1.1.
pub fn downstream(t: &ListenTls) -> Value {
    json!({
        "name": TLS_SOCKET,
        "typed_config": {
            "@type": DOWNSTREAM,
            "common_tls_context": {
                "tls_certificates": certificates(t),
                "alpn_protocols": ["h2", "http/1.1"],
            },
        },
    })
}

/// `tls_certificates`: the one certificate and key Envoy presents, read from their files at start-up.
fn certificates(t: &CertKey) -> Value {
    json!([{
        "certificate_chain": { "filename": t.cert_file },
        "private_key": { "filename": t.key_file },
    }])
}

/// The cluster side: verify the engine against `ca_file`, and that its certificate names `name`; present the
/// client certificate when there is one.
pub fn upstream(t: &UpstreamTls, name: &VerifiedName) -> Value {
    let (san_type, san) = match name {
        VerifiedName::Dns(n) => ("DNS", n),
        VerifiedName::Ip(n) => ("IP_ADDRESS", n),
    };
    let mut context = json!({
        "@type": UPSTREAM,
        "common_tls_context": { "validation_context": {
            "trusted_ca": { "filename": t.ca_file },
            "match_typed_subject_alt_names": [{ "san_type": san_type, "matcher": { "exact": san } }],
        } },
    });
    if let VerifiedName::Dns(n) = name {
        context["sni"] = Value::from(n.as_str());
    }
    if let Some(client) = &t.client_cert {
        context["common_tls_context"]["tls_certificates"] = certificates(client);
    }
    json!({ "name": TLS_SOCKET, "typed_config": context })
}

fn array_mut(v: &mut Value) -> impl Iterator<Item = &mut Value> {
    v.as_array_mut().into_iter().flatten()
}

#[cfg(test)]
mod tests {
    use crate::render::{bootstrap, RenderOptions};
    use serde_json::{json, Value};

    const PLAIN: &str = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081']\n  - name: b\n    kind: vllm\n    endpoints: ['10.0.0.2:8000']\n    tls: { sni: vllm.internal, ca_file: /etc/llmroute/ca.pem }\n  - name: c\n    kind: openai\n    endpoints: ['api.example.com:443']\n    tls: { ca_file: /etc/ssl/ca.pem }\nmodels:\n  - name: m\n    routes: [{ backend: a }]\n";

    fn render(doc: &str) -> Value {
        let cfg = llmroute_core::load_document(doc).unwrap();
        bootstrap(&cfg, doc, &RenderOptions::new("/x/llmroute.wasm")).unwrap()
    }

    fn with_listen_tls() -> String {
        format!("{PLAIN}listen_tls: {{ cert_file: /etc/llmroute/server.pem, key_file: /etc/llmroute/server.key }}\n")
    }

    fn cluster<'v>(v: &'v Value, name: &str) -> &'v Value {
        let clusters = v["static_resources"]["clusters"].as_array().unwrap();
        clusters.iter().find(|c| c["name"] == name).unwrap()
    }

    #[test]
    fn without_a_certificate_the_listener_is_plain() {
        let v = render(PLAIN);
        let chains = v["static_resources"]["listeners"][0]["filter_chains"]
            .as_array()
            .unwrap();
        assert_eq!(chains.len(), 1);
        assert!(chains[0].get("transport_socket").is_none());
        assert!(!v.to_string().contains("DownstreamTlsContext"));
    }

    #[test]
    fn with_a_certificate_every_chain_terminates_tls_with_alpn() {
        let v = render(&with_listen_tls());
        let chains = v["static_resources"]["listeners"][0]["filter_chains"]
            .as_array()
            .unwrap();
        assert_eq!(chains.len(), 1, "no plain-HTTP chain beside the TLS one");
        let socket = &chains[0]["transport_socket"];
        assert_eq!(socket["name"], "envoy.transport_sockets.tls");
        let ctx = &socket["typed_config"];
        assert_eq!(
            ctx["@type"],
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
        );
        let common = &ctx["common_tls_context"];
        assert_eq!(common["alpn_protocols"], serde_json::json!(["h2", "http/1.1"]));
        let pair = &common["tls_certificates"][0];
        assert_eq!(pair["certificate_chain"]["filename"], "/etc/llmroute/server.pem");
        assert_eq!(pair["private_key"]["filename"], "/etc/llmroute/server.key");
        // The route is the same as without TLS.
        let plain = render(PLAIN);
        let hcm = |v: &Value| v["filters"][0]["typed_config"]["route_config"].clone();
        assert_eq!(
            hcm(&chains[0]),
            hcm(&plain["static_resources"]["listeners"][0]["filter_chains"][0])
        );
    }

    fn validation(c: &Value) -> &Value {
        &c["typed_config"]["common_tls_context"]["validation_context"]
    }

    #[test]
    fn upstream_tls_verifies_the_ca_and_the_sni() {
        let v = render(PLAIN);
        assert!(cluster(&v, "a").get("transport_socket").is_none());

        let b = &cluster(&v, "b")["transport_socket"];
        assert_eq!(b["name"], "envoy.transport_sockets.tls");
        let ctx = &b["typed_config"];
        assert_eq!(
            ctx["@type"],
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
        );
        assert_eq!(ctx["sni"], "vllm.internal");
        assert_eq!(validation(b)["trusted_ca"]["filename"], "/etc/llmroute/ca.pem");
        assert_eq!(
            validation(b)["match_typed_subject_alt_names"],
            json!([{ "san_type": "DNS", "matcher": { "exact": "vllm.internal" } }])
        );
        assert!(cluster(&v, "b").get("transport_socket_matches").is_none());
    }

    #[test]
    fn without_sni_a_dns_endpoint_is_verified_under_its_own_name() {
        let v = render(PLAIN);
        let c = &cluster(&v, "c")["transport_socket"];
        assert_eq!(c["typed_config"]["sni"], "api.example.com");
        assert_eq!(validation(c)["trusted_ca"]["filename"], "/etc/ssl/ca.pem");
        assert_eq!(
            validation(c)["match_typed_subject_alt_names"],
            json!([{ "san_type": "DNS", "matcher": { "exact": "api.example.com" } }])
        );
        assert!(cluster(&v, "c").get("transport_socket_matches").is_none());
    }

    #[test]
    fn without_sni_an_ip_endpoint_is_verified_by_its_ip_san_and_sends_no_sni() {
        let doc = PLAIN.replace("tls: { sni: vllm.internal, ca_file:", "tls: { ca_file:");
        let v = render(&doc);
        let b = &cluster(&v, "b")["transport_socket"];
        assert!(b["typed_config"].get("sni").is_none(), "{b}");
        assert_eq!(
            validation(b)["match_typed_subject_alt_names"],
            json!([{ "san_type": "IP_ADDRESS", "matcher": { "exact": "10.0.0.2" } }])
        );
    }

    #[test]
    fn endpoints_with_different_names_each_get_their_own_context() {
        let doc = PLAIN.replace(
            "endpoints: ['api.example.com:443']",
            "endpoints: ['api.example.com:443', 'eu.example.com:443', '10.1.2.3:443']",
        );
        let v = render(&doc);
        let c = cluster(&v, "c");
        let matches = c["transport_socket_matches"].as_array().unwrap();
        let want = [
            ("api.example.com", "DNS"),
            ("eu.example.com", "DNS"),
            ("10.1.2.3", "IP_ADDRESS"),
        ];
        assert_eq!(matches.len(), want.len());
        for (m, (name, san_type)) in matches.iter().zip(want) {
            assert_eq!(m["match"], json!({ "llmroute_tls_name": name }));
            let socket = &m["transport_socket"];
            assert_eq!(
                validation(socket)["match_typed_subject_alt_names"],
                json!([{ "san_type": san_type, "matcher": { "exact": name } }])
            );
            assert_eq!(validation(socket)["trusted_ca"]["filename"], "/etc/ssl/ca.pem");
        }
        let endpoints = c["load_assignment"]["endpoints"][0]["lb_endpoints"].as_array().unwrap();
        for (e, (name, _)) in endpoints.iter().zip(want) {
            let md = &e["metadata"]["filter_metadata"];
            assert_eq!(md["envoy.transport_socket_match"]["llmroute_tls_name"], name);
            assert_eq!(md["llmroute"]["backend"], "c", "the backend metadata stays");
        }
        // The default is the first endpoint's context, never an unverified one.
        assert_eq!(c["transport_socket"], matches[0]["transport_socket"]);
    }

    #[test]
    fn a_client_certificate_is_presented_by_every_context_and_none_without_one() {
        let v = render(PLAIN);
        for name in ["b", "c"] {
            let ctx = &cluster(&v, name)["transport_socket"]["typed_config"]["common_tls_context"];
            assert!(ctx.get("tls_certificates").is_none(), "{name}: {ctx}");
        }
        let doc = PLAIN
            .replace(
                "tls: { ca_file: /etc/ssl/ca.pem }",
                "tls: { ca_file: /etc/ssl/ca.pem, cert_file: /etc/llmroute/client.pem, key_file: /etc/llmroute/client.key }",
            )
            .replace(
                "endpoints: ['api.example.com:443']",
                "endpoints: ['api.example.com:443', 'eu.example.com:443']",
            );
        let v = render(&doc);
        let c = cluster(&v, "c");
        let want = json!([{
            "certificate_chain": { "filename": "/etc/llmroute/client.pem" },
            "private_key": { "filename": "/etc/llmroute/client.key" },
        }]);
        let sockets = std::iter::once(&c["transport_socket"]).chain(
            c["transport_socket_matches"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| &m["transport_socket"]),
        );
        for socket in sockets {
            let ctx = &socket["typed_config"]["common_tls_context"];
            assert_eq!(ctx["tls_certificates"], want, "{socket}");
            assert_eq!(ctx["validation_context"]["trusted_ca"]["filename"], "/etc/ssl/ca.pem");
        }
        // Only the backend that has one presents it.
        let b = &cluster(&v, "b")["transport_socket"]["typed_config"]["common_tls_context"];
        assert!(b.get("tls_certificates").is_none(), "{b}");
    }

    /// A discovered backend on an EDS file (fed by etcd or not) and one defined elsewhere, each with `tls`, in a
    /// failover alias: every cluster llmroute writes toward their hosts verifies the `sni`.
    const DISCOVERED: &str = "version: 1\nbackends:\n  - name: eds\n    kind: llamacpp\n    discovery: { eds_path: /etc/eds/eds.json }\n    tls: { sni: eds.internal, ca_file: /etc/ca.pem }\n    credential_env: EDS_TOKEN\n  - name: etcd\n    kind: llamacpp\n    discovery:\n      eds_path: /var/lib/llmroute/etcd.json\n      etcd: { endpoints: ['10.0.0.1:2379'], prefix: /llmroute/backends/etcd }\n    tls: { sni: etcd.internal, ca_file: /etc/ca.pem, cert_file: /etc/c.pem, key_file: /etc/c.key }\n    credential_env: ETCD_TOKEN\n  - name: mesh\n    kind: llamacpp\n    discovery: {}\n    tls: { sni: mesh.internal, ca_file: /etc/ca.pem }\n    credential_env: MESH_TOKEN\nmodels:\n  - name: m\n    routes: [{ backend: eds }, { backend: etcd, priority: 1 }, { backend: mesh, priority: 2 }]\n";

    fn assert_verifies(c: &Value, sni: &str) {
        let socket = &c["transport_socket"];
        assert_eq!(socket["typed_config"]["sni"], sni, "{c}");
        assert_eq!(validation(socket)["trusted_ca"]["filename"], "/etc/ca.pem");
        assert_eq!(
            validation(socket)["match_typed_subject_alt_names"],
            json!([{ "san_type": "DNS", "matcher": { "exact": sni } }])
        );
    }

    #[test]
    fn every_cluster_toward_a_discovered_backends_hosts_verifies_its_sni() {
        let v = render(DISCOVERED);
        for (backend, sni) in [("eds", "eds.internal"), ("etcd", "etcd.internal")] {
            let c = cluster(&v, backend);
            assert_eq!(c["type"], "EDS");
            assert_verifies(c, sni);
            assert!(c.get("transport_socket_matches").is_none());
            assert!(
                c["typed_extension_protocol_options"].is_object(),
                "the token goes inside TLS"
            );
            let probe = cluster(&v, &format!("llmroute-dst-probe-{backend}"));
            assert_eq!(probe["transport_socket"], c["transport_socket"], "{backend}");
        }
        let client = &cluster(&v, "etcd")["transport_socket"]["typed_config"]["common_tls_context"];
        assert_eq!(
            client["tls_certificates"][0]["certificate_chain"]["filename"],
            "/etc/c.pem"
        );
        // The cluster defined elsewhere is not rendered; its probe, which llmroute writes, verifies the sni.
        let clusters = v["static_resources"]["clusters"].as_array().unwrap();
        assert!(!clusters.iter().any(|c| c["name"] == "mesh"));
        assert_verifies(cluster(&v, "llmroute-dst-probe-mesh"), "mesh.internal");
        // The failover aggregate connects through its members, the clusters above; it holds no socket of its own.
        let aggregate = cluster(&v, "llmroute-failover-0");
        assert_eq!(
            aggregate["cluster_type"]["typed_config"]["clusters"],
            json!(["eds", "etcd", "mesh"])
        );
        assert!(aggregate.get("transport_socket").is_none());
        // No cluster toward these hosts is left plain: each names a transport socket, or is the aggregate.
        for c in clusters {
            let name = c["name"].as_str().unwrap();
            if ["eds", "etcd"].contains(&name) || name.starts_with("llmroute-dst-probe-") {
                assert!(c["transport_socket"].is_object(), "{name} is plain");
            }
        }
    }

    #[test]
    fn an_explicit_sni_is_one_context_for_every_endpoint() {
        let doc = PLAIN.replace(
            "endpoints: ['10.0.0.2:8000']",
            "endpoints: ['10.0.0.2:8000', 'b2.internal:8000']",
        );
        let v = render(&doc);
        let b = cluster(&v, "b");
        assert!(b.get("transport_socket_matches").is_none());
        assert_eq!(b["transport_socket"]["typed_config"]["sni"], "vllm.internal");
    }
}
