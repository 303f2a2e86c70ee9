//! `llmroute render --target istio`, on the Envoy side: an Istio-shaped Envoy (a sidecar's outbound listener
//! `0.0.0.0_PORT` and route config `PORT`, a `VirtualService` route named `llmroute`, backend clusters named
//! `outbound|PORT||HOST` with ring hash and endpoints from file-based EDS), the rendered `EnvoyFilter` patches
//! applied to it the way istiod applies them, then `envoy --mode validate` and traffic through the real filter.
//! What needs istiod itself (the DestinationRule translation, istio-agent's wasm fetch) is not run here.

use std::path::Path;

use llmroute_envoy::render::istio::{manifests, IstioOptions, WasmSource};
use llmroute_harness::envoy::{envoy_binary, wasm_module, Envoy, EnvoyOptions};
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::*;

const NS: &str = "models";
const CLUSTER: &str = "outbound|8080||llama.models.svc.cluster.local";

fn config(listen: u16, admin: u16) -> Value {
    json!({
        "version": 1,
        "listen": format!("127.0.0.1:{listen}"),
        "admin": format!("127.0.0.1:{admin}"),
        "backends": [{ "name": CLUSTER, "kind": "llamacpp", "discovery": {}, "lb": "chwbl", "balance_factor": 150 }],
        "models": [{ "name": ALIAS, "routes": [{ "backend": CLUSTER, "upstream_model": UPSTREAM }] }],
        "limits": { "max_body_bytes": 4 << 20 },
    })
}

/// What istiod would generate for a sidecar before any EnvoyFilter: the route from the VirtualService, the
/// backend cluster from the Service and its DestinationRule (consistent hash → RING_HASH), EDS for endpoints.
fn istio_shaped(listen: u16, admin: u16, eds: &Path) -> Value {
    json!({
        "node": { "id": "sidecar~127.0.0.1~client.models~models.svc.cluster.local", "cluster": "client.models" },
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
                        "route_config": { "name": listen.to_string(), "virtual_hosts": [{
                            "name": format!("llmroute.{NS}.svc.cluster.local:{listen}"),
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
            "clusters": [{
                "name": CLUSTER,
                "type": "EDS",
                "connect_timeout": "2s",
                "lb_policy": "RING_HASH",
                "eds_cluster_config": {
                    "service_name": CLUSTER,
                    "eds_config": { "path_config_source": { "path": eds.display().to_string() }, "resource_api_version": "V3" },
                },
            }],
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
        assert_eq!(m["context"], "SIDECAR_OUTBOUND");
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

/// Renders, patches, validates and starts the Istio-shaped Envoy.
async fn start(fleet: &Fleet, dir: &Path) -> Envoy {
    let eds = dir.join("eds.json");
    write_eds(&eds, &fleet.endpoints());
    let make = |listen: u16, admin: u16| {
        let doc = config(listen, admin).to_string();
        let cfg = llmroute_core::load_config(&doc).unwrap();
        let mut opts = IstioOptions::sidecar(WasmSource::Local(wasm_module().display().to_string()), NS);
        opts.admin_port = admin;
        let files = manifests(&cfg, &doc, &opts).unwrap();
        let (_, filter) = files.iter().find(|(n, _)| n == "envoyfilter.yaml").unwrap();
        let filter: Value = serde_yaml_ng::from_str(filter).unwrap();
        let mut bootstrap = istio_shaped(listen, admin, &eds);
        apply(&mut bootstrap, &filter);
        let path = dir.join("envoy.json");
        std::fs::write(&path, bootstrap.to_string()).unwrap();
        let out = std::process::Command::new(envoy_binary())
            .args(["--mode", "validate", "-c"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "envoy --mode validate refused the patched bootstrap:\n{}\n{}\n{bootstrap:#}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        bootstrap.to_string()
    };
    Envoy::start_bootstrap(make, EnvoyOptions::default())
        .await
        .unwrap_or_else(|log| panic!("the Istio-shaped Envoy did not start:\n{log}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_patches_route_aliases_keep_affinity_refuse_in_json_and_take_big_bodies() {
    let fleet = Fleet::start("llama-i", 3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let envoy = start(&fleet, dir.path()).await;
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
