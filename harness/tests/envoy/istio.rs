//! `llmroute render --target istio`, on the Envoy side:
//! - llmroute's proxy as istiod shapes a gateway (listener `0.0.0.0_PORT`, route config `http.PORT`, the
//!   `VirtualService` route named `llmroute`, backend clusters named `outbound|PORT||HOST` with ring hash and
//!   endpoints from file-based EDS), the rendered `EnvoyFilter` patches applied to it the way istiod applies them,
//!   then `envoy --mode validate` and traffic through the real filter;
//! - an engine's sidecar as istiod shapes its inbound side under PERMISSIVE mTLS (a TLS filter chain that asks for
//!   the client's certificate, a plaintext one, and the RBAC filter istiod translates the rendered
//!   `AuthorizationPolicy` into): the proxy, presenting its SPIFFE identity as istiod's `ISTIO_MUTUAL` does, is
//!   served; another namespace's workload and a plaintext client are refused.
//!
//! What needs istiod itself (the DestinationRule translation, istio-agent's wasm fetch) is not run here.

use std::path::Path;

use llmroute_envoy::render::istio::{manifests, IstioOptions, WasmSource};
use llmroute_harness::certs::MeshPki;
use llmroute_harness::envoy::{envoy_binary, wasm_module, Envoy, EnvoyOptions};
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::*;

/// llmroute's namespace; the engines are in `models`.
const NS: &str = "llmroute";
const CLUSTER: &str = "outbound|8080||llama.models.svc.cluster.local";
const PROXY_ID: &str = "spiffe://cluster.local/ns/llmroute/sa/llmroute";
const OTHER_ID: &str = "spiffe://cluster.local/ns/apps/sa/default";
const ENGINE_ID: &str = "spiffe://cluster.local/ns/models/sa/llama";

/// The llmroute config. Its `listen` port is the Service's; the rendered patches match every listener of the
/// proxy, so the test's own listener port does not appear in them.
fn config(admin: u16) -> Value {
    json!({
        "version": 1,
        "listen": "0.0.0.0:8000",
        "admin": format!("127.0.0.1:{admin}"),
        "backends": [{ "name": CLUSTER, "kind": "llamacpp", "discovery": {}, "lb": "chwbl", "balance_factor": 150 }],
        "models": [{ "name": ALIAS, "routes": [{ "backend": CLUSTER, "upstream_model": UPSTREAM }] }],
        "limits": { "max_body_bytes": 4 << 20 },
    })
}

/// What istiod would generate for llmroute's proxy (a gateway) before any EnvoyFilter: the route from the
/// VirtualService, the backend cluster from the Service and its DestinationRule (consistent hash → RING_HASH),
/// EDS for endpoints, and with `mtls` the transport socket of `ISTIO_MUTUAL` (the proxy's SPIFFE certificate).
fn istio_shaped(listen: u16, admin: u16, eds: &Path, mtls: Option<&Mtls>) -> Value {
    let mut cluster = json!({
        "name": CLUSTER,
        "type": "EDS",
        "connect_timeout": "2s",
        "lb_policy": "RING_HASH",
        "eds_cluster_config": {
            "service_name": CLUSTER,
            "eds_config": { "path_config_source": { "path": eds.display().to_string() }, "resource_api_version": "V3" },
        },
    });
    if let Some(m) = mtls {
        cluster["transport_socket"] = m.upstream(0, ENGINE_ID);
    }
    json!({
        "node": { "id": format!("router~127.0.0.1~llmroute-0.{NS}~{NS}.svc.cluster.local"), "cluster": "llmroute.llmroute" },
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": admin } } },
        "static_resources": {
            "listeners": [{
                "name": format!("0.0.0.0_{listen}"),
                "address": { "socket_address": { "address": "127.0.0.1", "port_value": listen } },
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": format!("outbound_0.0.0.0_{listen}"),
                        "route_config": { "name": format!("http.{listen}"), "virtual_hosts": [{
                            "name": format!("*:{listen}"),
                            "domains": ["*"],
                            "routes": [{
                                "name": "llmroute",
                                "match": { "prefix": "/" },
                                "route": {
                                    "cluster": CLUSTER,
                                    "timeout": "600s",
                                    "retry_policy": { "retry_on": "connect-failure,refused-stream,reset", "num_retries": 2 },
                                },
                            }],
                        }] },
                        "http_filters": [{
                            "name": "envoy.filters.http.router",
                            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" },
                        }],
                    },
                }] }],
            }],
            "clusters": [cluster],
        },
    })
}

/// Proto merge on JSON: objects merge field by field, lists append, scalars replace; setting one member of the
/// route's `cluster_specifier` one-of clears the others, as `proto.Merge` does.
fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                if ["cluster", "cluster_header", "weighted_clusters"].contains(&k.as_str()) {
                    a.retain(|key, _| {
                        key == k || !["cluster", "cluster_header", "weighted_clusters"].contains(&key.as_str())
                    });
                }
                match a.get_mut(k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => a.extend(b.iter().cloned()),
        (slot, v) => *slot = v.clone(),
    }
}

/// Applies the EnvoyFilter's patches, for the operations the renderer emits; panics on any other, so a new kind
/// of patch cannot go untested.
fn apply(bootstrap: &mut Value, filter: &Value) {
    for p in filter["spec"]["configPatches"].as_array().unwrap() {
        let (to, op, value, m) = (
            p["applyTo"].as_str().unwrap(),
            p["patch"]["operation"].as_str().unwrap(),
            &p["patch"]["value"],
            &p["match"],
        );
        assert_eq!(m["context"], "GATEWAY");
        let res = &mut bootstrap["static_resources"];
        let port_ok = |l: &Value| {
            m["listener"]["portNumber"].is_null()
                || l["address"]["socket_address"]["port_value"] == m["listener"]["portNumber"]
        };
        match (to, op) {
            ("HTTP_FILTER", "INSERT_BEFORE") => {
                let sub = m["listener"]["filterChain"]["filter"]["subFilter"]["name"]
                    .as_str()
                    .unwrap();
                for l in res["listeners"]
                    .as_array_mut()
                    .unwrap()
                    .iter_mut()
                    .filter(|l| port_ok(l))
                {
                    let filters = l["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
                        .as_array_mut()
                        .unwrap();
                    let at = filters
                        .iter()
                        .position(|f| f["name"] == sub)
                        .expect("subFilter present");
                    filters.insert(at, value.clone());
                }
            }
            ("HTTP_ROUTE", "MERGE") => {
                let name = &m["routeConfiguration"]["vhost"]["route"]["name"];
                let mut hits = 0;
                for l in res["listeners"].as_array_mut().unwrap() {
                    let rc = &mut l["filter_chains"][0]["filters"][0]["typed_config"]["route_config"];
                    for vh in rc["virtual_hosts"].as_array_mut().unwrap() {
                        for r in vh["routes"]
                            .as_array_mut()
                            .unwrap()
                            .iter_mut()
                            .filter(|r| &r["name"] == name)
                        {
                            merge(r, value);
                            hits += 1;
                        }
                    }
                }
                assert_eq!(hits, 1, "HTTP_ROUTE MERGE must find the VirtualService route {name}");
            }
            ("CLUSTER", "ADD") => res["clusters"].as_array_mut().unwrap().push(value.clone()),
            ("CLUSTER", "MERGE") => {
                let c = res["clusters"]
                    .as_array_mut()
                    .unwrap()
                    .iter_mut()
                    .find(|c| c["name"] == m["cluster"]["name"]);
                merge(c.expect("CLUSTER MERGE must find its cluster"), value);
            }
            ("LISTENER", "MERGE") => {
                for l in res["listeners"]
                    .as_array_mut()
                    .unwrap()
                    .iter_mut()
                    .filter(|l| port_ok(l))
                {
                    merge(l, value);
                }
            }
            other => panic!("the test's patch applier does not know {other:?}"),
        }
    }
}

fn write_eds(path: &Path, addrs: &[String]) {
    let endpoints: Vec<Value> = addrs
        .iter()
        .map(|a| {
            let (host, port) = a.rsplit_once(':').unwrap();
            json!({"endpoint": {"address": {"socket_address": {"address": host, "port_value": port.parse::<u16>().unwrap()}}}})
        })
        .collect();
    let doc = json!({
        "version_info": "1",
        "resources": [{
            "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "cluster_name": CLUSTER,
            "endpoints": [{"lb_endpoints": endpoints}],
        }],
    });
    std::fs::write(path, doc.to_string()).unwrap();
}

/// The rendered manifests for `doc`, with the proxy's admin at `admin`, parsed.
fn rendered(doc: &str, admin: u16) -> Vec<(String, Value)> {
    let cfg = llmroute_core::load_document(doc).unwrap();
    let mut opts = IstioOptions::proxy(WasmSource::Local(wasm_module().display().to_string()), NS);
    opts.admin_port = admin;
    let r = manifests(&cfg, doc, &opts).unwrap();
    r.files
        .into_iter()
        .map(|(n, y)| (n, serde_yaml_ng::from_str(&y).unwrap()))
        .collect()
}

fn manifest<'a>(docs: &'a [(String, Value)], name: &str) -> &'a Value {
    &docs.iter().find(|(n, _)| n == name).unwrap().1
}

/// Writes the bootstrap to `dir` and runs `envoy --mode validate` on it.
fn validated(dir: &Path, name: &str, bootstrap: &Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bootstrap.to_string()).unwrap();
    let out = std::process::Command::new(envoy_binary())
        .args(["--mode", "validate", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "envoy --mode validate refused {name}:\n{}\n{}\n{bootstrap:#}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    bootstrap.to_string()
}

/// Renders, patches, validates and starts the Istio-shaped proxy, its endpoints from `eds`.
async fn start(dir: &Path, eds: &Path, mtls: Option<&Mtls>) -> Envoy {
    let make = |listen: u16, admin: u16| {
        let docs = rendered(&config(admin).to_string(), admin);
        let mut bootstrap = istio_shaped(listen, admin, eds, mtls);
        apply(&mut bootstrap, manifest(&docs, "envoyfilter.yaml"));
        validated(dir, "proxy.json", &bootstrap)
    };
    Envoy::start_bootstrap(make, EnvoyOptions::default())
        .await
        .unwrap_or_else(|log| panic!("the Istio-shaped Envoy did not start:\n{log}"))
}

/// The mesh's certificates on disk: the CA, and per identity its certificate and key.
struct Mtls {
    ca: String,
    ids: Vec<(String, String, String)>,
}

impl Mtls {
    fn new(dir: &Path, identities: &[&str]) -> Mtls {
        let pki = MeshPki::generate(identities).unwrap();
        let (ca, files) = pki.write(dir).unwrap();
        let ids = identities
            .iter()
            .zip(files)
            .map(|(id, (c, k))| (id.to_string(), c.display().to_string(), k.display().to_string()))
            .collect();
        Mtls {
            ca: ca.display().to_string(),
            ids,
        }
    }

    fn certificate(&self, i: usize) -> Value {
        let (_, cert, key) = &self.ids[i];
        json!({ "certificate_chain": { "filename": cert }, "private_key": { "filename": key } })
    }

    /// The client side of `ISTIO_MUTUAL`: present identity `i`, and accept only a server whose SPIFFE URI is
    /// `server_id`.
    fn upstream(&self, i: usize, server_id: &str) -> Value {
        json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {
                    "tls_certificates": [self.certificate(i)],
                    "validation_context": {
                        "trusted_ca": { "filename": self.ca },
                        "match_typed_subject_alt_names": [{ "san_type": "URI", "matcher": { "exact": server_id } }],
                    },
                },
            },
        })
    }
}

/// The RBAC filter istiod builds from an `AuthorizationPolicy`, for the forms the renderer emits (DENY, rules of
/// `from.source.notPrincipals`); panics on any other, so a new form cannot go untested. A principal `P` is the
/// peer certificate's URI `spiffe://P`.
fn rbac_from(policy: &Value) -> Value {
    let spec = &policy["spec"];
    assert_eq!(spec["action"], "DENY", "{policy}");
    let mut policies = serde_json::Map::new();
    for (i, rule) in spec["rules"].as_array().unwrap().iter().enumerate() {
        let keys: Vec<&String> = rule.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["from"], "the test knows `from` only: {rule}");
        let mut ids = Vec::new();
        for from in rule["from"].as_array().unwrap() {
            let source = from["source"].as_object().unwrap();
            assert_eq!(source.keys().collect::<Vec<_>>(), ["notPrincipals"], "{from}");
            let any_of: Vec<Value> = source["notPrincipals"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| json!({ "authenticated": { "principal_name": { "exact": format!("spiffe://{}", p.as_str().unwrap()) } } }))
                .collect();
            ids.push(json!({ "not_id": { "or_ids": { "ids": any_of } } }));
        }
        policies.insert(
            format!(
                "ns[models]-policy[{}]-rule[{i}]",
                policy["metadata"]["name"].as_str().unwrap()
            ),
            json!({ "permissions": [{ "any": true }], "principals": [{ "and_ids": { "ids": ids } }] }),
        );
    }
    json!({
        "name": "envoy.filters.http.rbac",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
            "rules": { "action": "DENY", "policies": policies },
        },
    })
}

/// An engine's sidecar, inbound, under PERMISSIVE mTLS: mTLS (identity `i` of `mtls`, client certificate asked
/// for) or plaintext, both through `rbac`, to the engine at `engine`.
fn sidecar(listen: u16, admin: u16, mtls: &Mtls, rbac: &Value, engine: &str) -> Value {
    let (host, port) = engine.rsplit_once(':').unwrap();
    let hcm = json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "inbound_0.0.0.0_8080",
            "route_config": { "name": "inbound|8080||", "virtual_hosts": [{ "name": "inbound|http|8080", "domains": ["*"],
                "routes": [{ "match": { "prefix": "/" }, "route": { "cluster": "inbound|8080||", "timeout": "0s" } }] }] },
            "http_filters": [rbac, {
                "name": "envoy.filters.http.router",
                "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" },
            }],
        },
    });
    json!({
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": admin } } },
        "static_resources": {
            "listeners": [{
                "name": "virtualInbound",
                "address": { "socket_address": { "address": "127.0.0.1", "port_value": listen } },
                "listener_filters": [{ "name": "envoy.filters.listener.tls_inspector", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector" } }],
                "filter_chains": [
                    {
                        "filter_chain_match": { "transport_protocol": "tls" },
                        "transport_socket": { "name": "envoy.transport_sockets.tls", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                            "require_client_certificate": true,
                            "common_tls_context": {
                                "tls_certificates": [mtls.certificate(2)],
                                "validation_context": { "trusted_ca": { "filename": mtls.ca } },
                            },
                        } },
                        "filters": [hcm],
                    },
                    { "filter_chain_match": { "transport_protocol": "raw_buffer" }, "filters": [hcm] },
                ],
            }],
            "clusters": [{
                "name": "inbound|8080||",
                "type": "STATIC",
                "connect_timeout": "2s",
                "load_assignment": { "cluster_name": "inbound|8080||", "endpoints": [{ "lb_endpoints": [
                    { "endpoint": { "address": { "socket_address": { "address": host, "port_value": port.parse::<u16>().unwrap() } } } },
                ] }] },
            }],
        },
    })
}

/// Another namespace's workload calling the engine directly, through its own sidecar: mTLS as identity `i`.
fn direct_client(listen: u16, admin: u16, mtls: &Mtls, i: usize, engine_sidecar: u16) -> Value {
    json!({
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": admin } } },
        "static_resources": {
            "listeners": [{
                "name": "outbound",
                "address": { "socket_address": { "address": "127.0.0.1", "port_value": listen } },
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "outbound",
                        "route_config": { "virtual_hosts": [{ "name": "all", "domains": ["*"],
                            "routes": [{ "match": { "prefix": "/" }, "route": { "cluster": CLUSTER } }] }] },
                        "http_filters": [{
                            "name": "envoy.filters.http.router",
                            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" },
                        }],
                    },
                }] }],
            }],
            "clusters": [{
                "name": CLUSTER,
                "type": "STATIC",
                "connect_timeout": "2s",
                "transport_socket": mtls.upstream(i, ENGINE_ID),
                "load_assignment": { "cluster_name": CLUSTER, "endpoints": [{ "lb_endpoints": [
                    { "endpoint": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": engine_sidecar } } } },
                ] }] },
            }],
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_patches_route_aliases_keep_affinity_refuse_in_json_and_take_big_bodies() {
    let fleet = Fleet::start("llama-i", 3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let eds = dir.path().join("eds.json");
    write_eds(&eds, &fleet.endpoints());
    let envoy = start(dir.path(), &eds, None).await;
    let c = client();

    // The filter's status poll reaches the proxy's admin through the added llmroute_admin cluster.
    let ready = wait_for(std::time::Duration::from_secs(15), || async {
        let Ok(r) = c.get(envoy.url("/llmroute/status")).send().await else {
            return false;
        };
        let v: Value = r.json().await.unwrap_or_default();
        v["backends"][0]["healthy_hosts"] == 3
    })
    .await;
    assert!(
        ready.is_some(),
        "the filter never saw the 3 EDS hosts through llmroute_admin"
    );

    // Alias routing through the HTTP_ROUTE patch's cluster_header: the alias reaches the Istio-named cluster, and
    // the engine receives the upstream model.
    let (status, backend, body) = post(&c, &envoy, &chat(Some("istio tenant 0"), "hi"), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert!(backend.starts_with("llama-i-"), "answered by {backend:?}");
    assert_eq!(body["model"], UPSTREAM, "{body}");

    // Affinity: one tenant's requests stay on one engine (ring hash on x-llmroute-affinity).
    for t in 0..4 {
        let mut seen = Vec::new();
        for _ in 0..5 {
            let (status, backend, _) = post(&c, &envoy, &chat(Some(&format!("istio tenant {t}")), "hello"), &[]).await;
            assert_eq!(status, 200);
            seen.push(backend);
        }
        assert!(seen.iter().all(|b| b == &seen[0]), "tenant {t} moved: {seen:?}");
    }

    // A refusal is the filter's JSON, not a route miss: an unknown alias.
    let mut unknown = chat(None, "hi");
    unknown["model"] = Value::from("no-such-alias");
    let (status, _, body) = post(&c, &envoy, &unknown, &[]).await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]["message"].is_string(),
        "not a JSON error envelope: {body}"
    );

    // The LISTENER patch: a 2 MiB prompt passes (Istio's default 1 MiB buffer would answer Envoy's plain 413).
    let big = chat(Some("istio big"), &"x".repeat(2 << 20));
    let (status, backend, body) = post(&c, &envoy, &big, &[]).await;
    assert_eq!(status, 200, "2 MiB body: {body}");
    assert!(backend.starts_with("llama-i-"));
}

/// The rendered AuthorizationPolicy, enforced as istiod enforces it in an engine's sidecar: the proxy, presenting
/// its own identity, is served through the filter; a workload of another namespace calling the engine directly,
/// and a plaintext client, get the sidecar's 403, and the engine never sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_admit_llmroutes_proxies_only() {
    let fleet = Fleet::start("llama-p", 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mtls = Mtls::new(dir.path(), &[PROXY_ID, OTHER_ID, ENGINE_ID]);
    let docs = rendered(&config(15000).to_string(), 15000);
    let rbac = rbac_from(manifest(&docs, "authorizationpolicy-models.yaml"));
    let engine = fleet.endpoints()[0].clone();
    let engine_sidecar = Envoy::start_bootstrap(
        |l, a| validated(dir.path(), "sidecar.json", &sidecar(l, a, &mtls, &rbac, &engine)),
        EnvoyOptions::default(),
    )
    .await
    .unwrap_or_else(|log| panic!("the engine's sidecar did not start:\n{log}"));
    let eds = dir.path().join("eds.json");
    write_eds(&eds, &[engine_sidecar.listen.to_string()]);
    let proxy = start(dir.path(), &eds, Some(&mtls)).await;
    let other = Envoy::start_bootstrap(
        |l, a| {
            let port = engine_sidecar.listen.port();
            validated(dir.path(), "other.json", &direct_client(l, a, &mtls, 1, port))
        },
        EnvoyOptions::default(),
    )
    .await
    .unwrap_or_else(|log| panic!("the other workload's sidecar did not start:\n{log}"));
    let c = client();

    // Through llmroute: the filter routes, and the engine's sidecar admits the proxy's identity.
    let (status, backend, body) = post(&c, &proxy, &chat(Some("policy"), "hi"), &[]).await;
    assert_eq!((status, backend.as_str()), (200, "llama-p-0"), "{body}");

    // Around llmroute: mTLS as another namespace's workload, then plaintext.
    for (who, url) in [
        ("another namespace's workload", other.url("/v1/chat/completions")),
        (
            "a plaintext client",
            format!("http://{}/v1/chat/completions", engine_sidecar.listen),
        ),
    ] {
        let r = c
            .post(url)
            .header("content-type", "application/json")
            .body(chat(None, "around llmroute").to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        assert_eq!(status, 403, "{who}: {text}");
        assert!(text.contains("RBAC: access denied"), "{who}: {text}");
    }
    assert_eq!(
        fleet.chat_counts(),
        vec![1],
        "only the request through llmroute reached the engine"
    );
}
