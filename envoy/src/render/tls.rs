//! TLS, both ways, as Envoy transport sockets:
//! - `listen_tls` puts a `DownstreamTlsContext` (the certificate chain and key files, ALPN `h2,http/1.1`) on
//!   every filter chain of the listener. There is then no plain-HTTP chain at all: a plain listener is rendered
//!   only when no certificate is given. The connection manager's `codec_type: AUTO` follows the ALPN choice.
//! - A backend's `tls` puts an `UpstreamTlsContext` on its cluster: the engines' certificates must chain to
//!   `ca_file` (Envoy never falls back to a system trust store), `sni` is sent when given, and then the
//!   certificate must also name it (a DNS subject alternative name). Without `sni`, only the chain is checked.
//!
//! Envoy reads the PEM files itself, at start-up; they never enter the rendered bootstrap.

use llmroute_core::config::{Config, ListenTls, UpstreamTls};
use serde_json::{json, Value};

const TLS_SOCKET: &str = "envoy.transport_sockets.tls";
const DOWNSTREAM: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
const UPSTREAM: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// Adds the transport sockets to a rendered bootstrap: on every listener's filter chains when `listen_tls` is
/// set, and on the cluster of each backend with `tls`.
pub fn apply(cfg: &Config, bootstrap: &mut Value) {
    let resources = &mut bootstrap["static_resources"];
    if let Some(t) = &cfg.listen_tls {
        for listener in array_mut(&mut resources["listeners"]) {
            for chain in array_mut(&mut listener["filter_chains"]) {
                chain["transport_socket"] = downstream(t);
            }
        }
    }
    for cluster in array_mut(&mut resources["clusters"]) {
        let backend = cfg
            .backends
            .iter()
            .find(|b| cluster["name"].as_str() == Some(b.name.as_str()));
        if let Some(t) = backend.and_then(|b| b.tls.as_ref()) {
            cluster["transport_socket"] = upstream(t);
        }
    }
}

/// The listener side: serve `cert_file`/`key_file`, offer HTTP/2 then HTTP/1.1.
pub fn downstream(t: &ListenTls) -> Value {
    json!({
        "name": TLS_SOCKET,
        "typed_config": {
            "@type": DOWNSTREAM,
            "common_tls_context": {
                "tls_certificates": [{
                    "certificate_chain": { "filename": t.cert_file },
                    "private_key": { "filename": t.key_file },
                }],
                "alpn_protocols": ["h2", "http/1.1"],
            },
        },
    })
}

/// The cluster side: verify the engine against `ca_file`; send and verify `sni` when given.
pub fn upstream(t: &UpstreamTls) -> Value {
    let mut validation = json!({ "trusted_ca": { "filename": t.ca_file } });
    let mut context = json!({ "@type": UPSTREAM });
    if let Some(sni) = &t.sni {
        context["sni"] = Value::from(sni.as_str());
        validation["match_typed_subject_alt_names"] = json!([{ "san_type": "DNS", "matcher": { "exact": sni } }]);
    }
    context["common_tls_context"] = json!({ "validation_context": validation });
    json!({ "name": TLS_SOCKET, "typed_config": context })
}

fn array_mut(v: &mut Value) -> impl Iterator<Item = &mut Value> {
    v.as_array_mut().into_iter().flatten()
}

#[cfg(test)]
mod tests {
    use crate::render::{bootstrap, RenderOptions};
    use serde_json::Value;

    const PLAIN: &str = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081']\n  - name: b\n    kind: vllm\n    endpoints: ['10.0.0.2:8000']\n    tls: { sni: vllm.internal, ca_file: /etc/llmroute/ca.pem }\n  - name: c\n    kind: openai\n    endpoints: ['api.example.com:443']\n    tls: { ca_file: /etc/ssl/ca.pem }\nmodels:\n  - name: m\n    routes: [{ backend: a }]\n";

    fn render(doc: &str) -> Value {
        let cfg = llmroute_core::load_config(doc).unwrap();
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
        let validation = &ctx["common_tls_context"]["validation_context"];
        assert_eq!(validation["trusted_ca"]["filename"], "/etc/llmroute/ca.pem");
        assert_eq!(
            validation["match_typed_subject_alt_names"],
            serde_json::json!([{ "san_type": "DNS", "matcher": { "exact": "vllm.internal" } }])
        );

        let c = &cluster(&v, "c")["transport_socket"]["typed_config"];
        assert!(c.get("sni").is_none());
        let validation = &c["common_tls_context"]["validation_context"];
        assert_eq!(validation["trusted_ca"]["filename"], "/etc/ssl/ca.pem");
        assert!(validation.get("match_typed_subject_alt_names").is_none());
    }
}
