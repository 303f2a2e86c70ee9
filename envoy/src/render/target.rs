//! Everything llmroute adds to an Envoy, split by where it goes: what `llmroute render --target filter` prints for
//! an Envoy someone already runs, and what the full bootstrap (`--target envoy`) is assembled from, so the two
//! cannot drift. Nothing of the bootstrap is left out of the pieces but the listener's own address and names.
//!
//! - `bootstrap`: top-level fields: `stats_config` (the `stats_tags` that make the filter's metric labels) and the
//!   overload manager.
//! - `listener`: `per_connection_buffer_limit_bytes`, above the filter's body limit; `filter_chain`: with
//!   `listen_tls`, the chain's `transport_socket`.
//! - `connection_manager`: the connection manager's fields: the JSON access log, the edge timeouts and HTTP/2
//!   bounds, header hygiene and the `local_reply_config` that gives Envoy's own errors the API's envelope.
//! - `http_filters`: the entries that go before the router, in order: the compressor (`compress_responses`), the
//!   wasm filter (inline, or through ECDS when [`RenderOptions::ecds_path`] is set), Envoy's rate-limit filter with
//!   `global_limits`, then the stateful-session filter with `bounded_keys` placement.
//! - `route`: the RouteAction for inference paths (`cluster_header`, `hash_policy`, retry policy, timeout).
//! - `failover_route`: only when an alias has routes to several backends. A whole route (match plus action) that
//!   must come before the inference route: requests for such aliases carry `x-llmroute-alias` and need the retry
//!   priority that moves on to the next backend.
//! - `other_routes`: the per-route config that turns every one of those filters off, for the routes of other
//!   applications on the same connection manager: the filter then runs on the inference routes only.
//! - `clusters`: the extra clusters: the failover aggregates (with the filter's upstream role), the probe
//!   clusters of the `/props` check and the engine load poll (per endpoint, and original-destination ones for
//!   discovered llama.cpp backends and discovered backends with `load`), and
//!   `llmroute_admin`, and with `affinity.placement_store` the etcd cluster `llmroute_placement_store`. A
//!   multi-route alias is routed to its aggregate; without it the request names a cluster that does not exist.
//! - `backend_clusters`: one cluster per backend with listed endpoints or an EDS file, named after it, with its
//!   load balancer, health checks, outlier detection, circuit breaker, TLS and credential injector, and its
//!   endpoints tagged with `llmroute.backend` metadata for failover.
//! - `secrets`: only when a backend has `credential_env`: the SDS secrets the injectors read.
//!
//! [`notes`] names what the pieces still leave to the operator for a given config (the admin address, clusters
//! defined elsewhere); the CLI prints them.

use llmroute_core::config::Document;
use llmroute_core::envoy_contract as contract;
use serde_json::{json, Map, Value};

use super::filters::stateful_session;
use super::json::{config_json, duration_ms};
use super::options::{RenderOptions, BUFFER_SLACK};
use super::{admin, cluster, credentials, ecds, edge, failover, observe, probe, ratelimit, store, tls};

/// Everything llmroute adds to an Envoy, split by where it goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Pieces {
    /// The http filters before the router, in order. Empty without the filter.
    pub http_filters: Vec<Value>,
    /// The RouteAction for inference paths.
    pub route: Value,
    /// The route (match and action) for aliases with failover, to put before the inference route.
    pub failover_route: Option<Value>,
    /// The backends' clusters, as the full bootstrap renders them (not part of `--target filter`).
    pub backend_clusters: Vec<Value>,
    /// The extra clusters: failover aggregates, probes, admin.
    pub clusters: Vec<Value>,
    /// Static SDS secrets (backend credentials).
    pub secrets: Vec<Value>,
    /// The bootstrap's top-level fields: `stats_config`, `overload_manager`.
    pub bootstrap: Map<String, Value>,
    /// The listener's fields: `per_connection_buffer_limit_bytes`.
    pub listener: Map<String, Value>,
    /// The filter chain's fields: its `transport_socket` with `listen_tls`; empty without.
    pub filter_chain: Map<String, Value>,
    /// The connection manager's fields: access log, edge timeouts and bounds, `local_reply_config`.
    pub connection_manager: Map<String, Value>,
    /// The route fields that turn every entry of `http_filters` off, for other applications' routes.
    pub other_routes: Value,
}

/// Renders the pieces. `config_text` must be the document `cfg` was loaded from.
pub fn pieces(cfg: &Document, config_text: &str, opts: &RenderOptions) -> Result<Pieces, String> {
    let plugin_config = config_json(config_text)?;
    let mut clusters = cluster::clusters(cfg);
    clusters.extend(cfg.global_limits.as_ref().map(ratelimit::cluster));
    if opts.with_filter {
        clusters.extend(failover::clusters(cfg, &plugin_config, opts));
    }
    // The cluster passes work on a bootstrap-shaped value: run them on one that holds only the clusters.
    let mut scratch = json!({ "static_resources": { "clusters": clusters } });
    tls::apply(cfg, &mut scratch);
    credentials::apply(cfg, &mut scratch);
    probe::apply(cfg, &mut scratch);
    admin::apply(cfg, &mut scratch);
    store::apply(cfg, &mut scratch);
    let all = take_array(&mut scratch["static_resources"]["clusters"]);
    let is_backend = |c: &Value| cfg.backends.iter().any(|b| c["name"].as_str() == Some(b.name.as_str()));
    let (backend_clusters, clusters): (Vec<Value>, Vec<Value>) = all.into_iter().partition(is_backend);

    let mut http_filters = Vec::new();
    if cfg.render_only.compress_responses {
        // First in the chain, so on the way back it runs last: the wasm filter sees the engine's bytes as sent.
        http_filters.push(compressor());
    }
    if opts.with_filter {
        http_filters.push(match &opts.ecds_path {
            Some(path) => ecds::discovered_filter(path, opts),
            None => super::filters::wasm_filter(plugin_config, opts),
        });
        if let Some(g) = &cfg.global_limits {
            // After the wasm filter: its descriptors read the headers the filter sets once the body is read.
            http_filters.push(ratelimit::filter(g));
        }
        if cfg.any_bounded_keys() {
            http_filters.push(stateful_session());
        }
    }
    let route = route_action(cfg, opts.with_filter);
    let failover_route = if opts.with_filter {
        failover::route(cfg, &route)
    } else {
        None
    };
    let other_routes = other_routes(&http_filters);
    let mut connection_manager = Map::new();
    // One JSON line per request (render/observe.rs), then the edge settings (render/edge.rs).
    connection_manager.insert("access_log".into(), observe::access_log(cfg));
    connection_manager.extend(edge::hcm_fields(cfg));
    // The listener pass works on a bootstrap-shaped value too: one listener with one empty filter chain.
    let mut chain = json!({ "static_resources": { "listeners": [{ "filter_chains": [{}] }] } });
    tls::apply_listeners(cfg, &mut chain);
    let filter_chain = object(chain["static_resources"]["listeners"][0]["filter_chains"][0].take());
    Ok(Pieces {
        http_filters,
        route,
        failover_route,
        backend_clusters,
        clusters,
        secrets: take_array(&mut scratch["static_resources"]["secrets"]),
        bootstrap: object(json!({
            // The filter's metrics carry their labels in their names; make them labels (render/observe.rs).
            "stats_config": observe::stats_config(),
            // A heap budget, so Envoy sheds requests instead of running out of memory (render/edge.rs).
            "overload_manager": edge::overload_manager(cfg),
        })),
        listener: object(json!({ "per_connection_buffer_limit_bytes": cfg.limits.max_body_bytes + BUFFER_SLACK })),
        filter_chain,
        connection_manager,
        other_routes,
    })
}

/// `typed_per_filter_config` that disables each of `filters` on a route: Envoy's generic `FilterConfig`, keyed by
/// the filter's name in the chain.
fn other_routes(filters: &[Value]) -> Value {
    let off: Map<String, Value> = filters
        .iter()
        .filter_map(|f| f["name"].as_str())
        .map(|name| {
            (
                name.to_string(),
                json!({ "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": true }),
            )
        })
        .collect();
    json!({ "typed_per_filter_config": off })
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The RouteAction. With the filter, the cluster comes from the filter's header; without it, the first backend.
fn route_action(cfg: &Document, with_filter: bool) -> Value {
    let mut route = json!({
        "timeout": duration_ms(cfg.limits.request_timeout_ms),
        "hash_policy": [{ "header": { "header_name": contract::AFFINITY } }],
    });
    match (with_filter, cfg.backends.first()) {
        (false, Some(first)) => route["cluster"] = Value::from(first.name.as_str()),
        _ => route["cluster_header"] = Value::from(contract::CLUSTER),
    }
    if let Some(retry) = cluster::retry_policy(cfg) {
        route["retry_policy"] = retry;
    }
    route
}

/// The route config of the full bootstrap: the failover route (when any), then the inference route on `/`.
pub fn route_config(p: &Pieces) -> Value {
    let mut routes: Vec<Value> = p.failover_route.iter().cloned().collect();
    routes.push(json!({ "match": { "prefix": "/" }, "route": p.route }));
    json!({
        "name": "llmroute",
        "virtual_hosts": [{ "name": "llmroute", "domains": ["*"], "routes": routes }],
    })
}

/// The router, which ends every chain.
pub fn router() -> Value {
    json!({
        "name": "envoy.filters.http.router",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" },
    })
}

/// Envoy's gzip compressor for responses: JSON and SSE toward clients that send `accept-encoding: gzip`. It
/// also removes `accept-encoding` before the upstream (the wasm filter sets `identity` on routed requests).
pub fn compressor() -> Value {
    json!({
        "name": "envoy.filters.http.compressor",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor",
            "response_direction_config": {
                "common_config": {
                    "min_content_length": 256,
                    "content_type": ["application/json", "text/event-stream"],
                },
                "remove_accept_encoding_header": true,
            },
            "compressor_library": {
                "name": "gzip",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.compression.gzip.compressor.v3.Gzip",
                },
            },
        },
    })
}

/// The sections of the `--target filter` document, in order, each with where it goes. Optional sections are
/// left out when the config does not need them.
pub const SECTIONS: [(&str, &str); 11] = [
    ("bootstrap", "merge into your bootstrap's top level (append the stats_tags to yours, if you have some)"),
    ("listener", "merge into the listener that serves inference"),
    ("filter_chain", "merge into that listener's filter chain (listen_tls)"),
    (
        "connection_manager",
        "merge into that listener's HttpConnectionManager typed_config: access log, timeouts, HTTP/2 bounds, JSON local replies",
    ),
    ("http_filters", "put these before envoy.filters.http.router, in this order"),
    (
        "route",
        "the RouteAction of your inference route(s), e.g. prefix /v1/; /healthz, /readyz and /llmroute/status need a route where the filter runs too",
    ),
    (
        "failover_route",
        "a route before your inference route, with its path match plus this header match; multi-route aliases need it",
    ),
    (
        "other_routes",
        "merge into every other route (or virtual host) of that connection manager: llmroute's filters stay off there",
    ),
    ("clusters", "add to your clusters: llmroute's own (failover aggregates, probes, llmroute_admin)"),
    (
        "backend_clusters",
        "add to your clusters, or replace yours of the same name: one per backend, with health checks, outlier detection, circuit breaker",
    ),
    ("secrets", "add to static_resources.secrets"),
];

/// The `--target filter` document: every section the config needs, keyed by [`SECTIONS`] names.
pub fn filter_document(p: &Pieces) -> Value {
    let mut doc = Map::new();
    let mut put = |k: &str, v: Value| {
        doc.insert(k.to_string(), v);
    };
    put("bootstrap", Value::Object(p.bootstrap.clone()));
    put("listener", Value::Object(p.listener.clone()));
    if !p.filter_chain.is_empty() {
        put("filter_chain", Value::Object(p.filter_chain.clone()));
    }
    put("connection_manager", Value::Object(p.connection_manager.clone()));
    put("http_filters", Value::from(p.http_filters.clone()));
    put("route", p.route.clone());
    if let Some(f) = &p.failover_route {
        put("failover_route", f.clone());
    }
    put("other_routes", p.other_routes.clone());
    put("clusters", Value::from(p.clusters.clone()));
    if !p.backend_clusters.is_empty() {
        put("backend_clusters", Value::from(p.backend_clusters.clone()));
    }
    if !p.secrets.is_empty() {
        put("secrets", Value::from(p.secrets.clone()));
    }
    Value::Object(doc)
}

/// `--target filter` as YAML: one document, with a header that says where each section goes, and the notes.
pub fn filter_yaml(cfg: &Document, config_text: &str, opts: &RenderOptions) -> Result<String, String> {
    let doc = filter_document(&pieces(cfg, config_text, opts)?);
    let mut head = vec![format!(
        "# Rendered by `llmroute render --target filter` {}: everything llmroute adds to an Envoy you run, in \
         sections. Paste each where its line says (or let `--paste-into` do it).",
        llmroute_core::VERSION
    )];
    for (key, where_) in SECTIONS {
        if doc.get(key).is_some() {
            head.push(format!("# {key}: {where_}."));
        }
    }
    for l in notes(cfg) {
        head.push(format!("# NOTE: {l}"));
    }
    // One section at a time, each after a blank line, in the order of the header.
    let mut body = String::new();
    for (key, _) in SECTIONS {
        if let Some(v) = doc.get(key) {
            let one = serde_yaml_ng::to_string(&json!({ key: v })).map_err(|e| e.to_string())?;
            body.push('\n');
            body.push_str(&one);
        }
    }
    Ok(format!("{}\n{body}", head.join("\n")))
}

/// What the pieces leave to the operator for this config, as sentences for notes and the header.
pub fn notes(cfg: &Document) -> Vec<String> {
    let to = admin::target(cfg.admin);
    let mut out = vec![format!(
        "admin: the filter polls Envoy's admin API at {to} through llmroute_admin for /readyz and /llmroute/status; \
         `admin:` in llmroute.yaml ({}) must be the address of your Envoy's own admin interface, or /readyz stays \
         503 (its reason, /llmroute/status and Envoy's log then name {})",
        cfg.admin, cfg.admin
    )];
    for b in cfg
        .backends
        .iter()
        .filter(|b| b.discovery.as_ref().is_some_and(|d| d.eds_path.is_none()))
    {
        out.push(format!(
            "backend `{}` is discovered (discovery: {{}}): your Envoy must define its cluster, named exactly `{}`{}",
            b.name,
            b.name,
            if cfg.models.iter().any(llmroute_core::route_choice::has_failover) {
                ", with endpoint metadata filter_metadata.llmroute.backend for failover"
            } else {
                ""
            }
        ));
    }
    out
}

fn take_array(v: &mut Value) -> Vec<Value> {
    match v.take() {
        Value::Array(items) => items,
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::bootstrap;

    const DOC: &str = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081', '127.0.0.1:8082']\n    credential_env: A_TOKEN\n  - name: b\n    kind: vllm\n    endpoints: ['127.0.0.1:9000']\n    tls: { ca_file: /etc/ca.pem }\nmodels:\n  - name: m\n    routes: [{ backend: a, upstream_model: up, priority: 1 }, { backend: b, upstream_model: other, priority: 2 }]\n  - name: solo\n    routes: [{ backend: a }]\naffinity: { placement: bounded_keys }\n";

    fn load(doc: &str) -> Document {
        llmroute_core::load_document(doc).unwrap()
    }

    fn hcm(v: &Value) -> &Value {
        &v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    }

    #[test]
    fn the_compressor_comes_first_and_only_when_asked() {
        let plain = load(DOC);
        let filters = |cfg: &Document| {
            let v = bootstrap(cfg, DOC, &RenderOptions::new("/f.wasm")).unwrap();
            hcm(&v)["http_filters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["name"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert!(!filters(&plain).iter().any(|n| n.contains("compressor")));
        let doc = format!("{DOC}compress_responses: true\n");
        let names = filters(&load(&doc));
        assert_eq!(names[0], "envoy.filters.http.compressor", "{names:?}");
        assert!(names[1].contains("wasm") || names[1].contains("llmroute"), "{names:?}");
    }

    /// The bootstrap is the pieces assembled: its filters, routes, clusters and secrets are exactly theirs.
    #[test]
    fn the_bootstrap_is_the_pieces_assembled() {
        let cfg = load(DOC);
        for opts in [
            RenderOptions::new("/x.wasm"),
            RenderOptions::new("/x.wasm").without_filter(),
            RenderOptions::new("/x.wasm").with_ecds("/etc/llmroute/ecds.yaml"),
        ] {
            let p = pieces(&cfg, DOC, &opts).unwrap();
            let v = bootstrap(&cfg, DOC, &opts).unwrap();
            let mut filters = p.http_filters.clone();
            filters.push(router());
            assert_eq!(hcm(&v)["http_filters"], Value::from(filters));
            assert_eq!(hcm(&v)["route_config"], route_config(&p));
            let mut clusters = p.backend_clusters.clone();
            clusters.extend(p.clusters.clone());
            assert_eq!(v["static_resources"]["clusters"], Value::from(clusters));
            let secrets = &v["static_resources"]["secrets"];
            match p.secrets.is_empty() {
                true => assert!(secrets.is_null()),
                false => assert_eq!(secrets, &Value::from(p.secrets.clone())),
            }
            assert_eq!(v.get("node").is_some(), opts.with_filter && opts.ecds_path.is_some());
        }
    }

    #[test]
    fn one_alias_with_its_own_bounded_keys_adds_the_stateful_session_filter() {
        let names = |doc: &str| -> Vec<String> {
            let cfg = load(doc);
            let p = pieces(&cfg, doc, &RenderOptions::new("/x.wasm")).unwrap();
            let d = filter_document(&p);
            d["http_filters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["name"].as_str().unwrap().to_string())
                .collect()
        };
        let hash = DOC.replace("affinity: { placement: bounded_keys }\n", "");
        assert_eq!(names(&hash), ["llmroute"]);
        let per_alias = hash.replace(
            "  - name: solo\n",
            "  - name: solo\n    affinity: { placement: bounded_keys }\n",
        );
        assert_ne!(per_alias, hash);
        assert_eq!(names(&per_alias), ["llmroute", "envoy.filters.http.stateful_session"]);
    }

    #[test]
    fn the_filter_document_has_every_section_the_config_needs() {
        let cfg = load(DOC);
        let p = pieces(&cfg, DOC, &RenderOptions::new("/x.wasm")).unwrap();
        let doc = filter_document(&p);
        let names: Vec<&str> = doc["http_filters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["llmroute", "envoy.filters.http.stateful_session"]);
        assert_eq!(doc["route"]["cluster_header"], contract::CLUSTER);
        assert!(doc["route"]["retry_policy"].is_object());
        let clusters: Vec<&str> = doc["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            clusters,
            vec![
                "llmroute-failover-0",
                "llmroute-probe-a-0",
                "llmroute-probe-a-1",
                "llmroute_admin"
            ]
        );
        let backends: Vec<&str> = doc["backend_clusters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(backends, vec!["a", "b"]);
        assert!(
            doc["backend_clusters"][1]["transport_socket"].is_object(),
            "b's tls comes with its cluster"
        );
        assert_eq!(doc["failover_route"]["match"]["headers"][0]["name"], contract::ALIAS);
        assert_eq!(doc["secrets"][0]["name"], "llmroute-credential-a");
        assert!(doc["bootstrap"]["stats_config"]["stats_tags"].is_array());
        assert!(doc["connection_manager"]["access_log"].is_array());
        assert!(doc["connection_manager"]["local_reply_config"]["mappers"].is_array());
        assert!(doc["listener"]["per_connection_buffer_limit_bytes"].as_u64().unwrap() > 8 << 20);
        assert!(doc.get("filter_chain").is_none(), "no listen_tls");
        // Every filter the config adds is turned off on other routes, by its name in the chain.
        let off = doc["other_routes"]["typed_per_filter_config"].as_object().unwrap();
        assert_eq!(off.keys().map(String::as_str).collect::<Vec<_>>(), {
            let mut n = names.clone();
            n.sort();
            n
        });
        for v in off.values() {
            assert_eq!(v["@type"], "type.googleapis.com/envoy.config.route.v3.FilterConfig");
            assert_eq!(v["disabled"], true);
        }
    }

    /// Pasting every section into a skeleton that holds only the listener's address and names gives the whole
    /// `--target envoy` bootstrap: nothing is left to copy by hand.
    #[test]
    fn every_section_pasted_into_a_bare_skeleton_is_the_bootstrap() {
        for doc in [DOC, include_str!("../../../testdata/configs/good-tls.yaml")] {
            let cfg = load(doc);
            let skeleton = format!(
                r#"
admin: {{ address: {{ socket_address: {{ address: "{admin_ip}", port_value: {admin_port} }} }} }}
"@llmroute bootstrap": merge
static_resources:
  listeners:
  - name: llmroute
    address: {{ socket_address: {{ address: "{ip}", port_value: {port} }} }}
    "@llmroute listener": merge
    filter_chains:
    - "@llmroute filter_chain": merge
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: llmroute
          codec_type: AUTO
          always_set_request_id_in_response: true
          "@llmroute connection_manager": merge
          route_config:
            name: llmroute
            virtual_hosts:
            - name: llmroute
              domains: ["*"]
              routes: ["@llmroute failover_route", {{ match: {{ prefix: / }}, route: "@llmroute route" }}]
          http_filters: ["@llmroute http_filters", {{ name: envoy.filters.http.router, typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }} }}]
  clusters: ["@llmroute backend_clusters", "@llmroute clusters"]
  secrets: ["@llmroute secrets"]
"#,
                admin_ip = cfg.admin.ip(),
                admin_port = cfg.admin.port(),
                ip = cfg.render_only.listen.ip(),
                port = cfg.render_only.listen.port(),
            );
            let opts = RenderOptions::new("/x.wasm");
            let sections = filter_document(&pieces(&cfg, doc, &opts).unwrap());
            let mut pasted = crate::render::paste::paste(&skeleton, &sections).unwrap();
            if pasted["static_resources"]["secrets"] == serde_json::json!([]) {
                pasted["static_resources"].as_object_mut().unwrap().remove("secrets");
            }
            assert_eq!(pasted, bootstrap(&cfg, doc, &opts).unwrap());
        }
    }

    #[test]
    fn the_notes_name_the_admin_address_and_the_clusters_defined_elsewhere() {
        let doc = "version: 1\nadmin: 0.0.0.0:9911\nbackends:\n  - { name: d, kind: vllm, discovery: {} }\n  - { name: e, kind: vllm, endpoints: ['127.0.0.1:9000'] }\nmodels:\n  - { name: m, routes: [{ backend: d, priority: 1 }, { backend: e, priority: 2 }] }\n";
        let notes = notes(&load(doc)).join("\n");
        assert!(
            notes.contains("admin API at 127.0.0.1:9911")
                && notes
                    .contains("`admin:` in llmroute.yaml (0.0.0.0:9911) must be the address of your Envoy's own admin")
                && notes.contains("/readyz stays 503"),
            "{notes}"
        );
        assert!(
            notes.contains("backend `d` is discovered") && notes.contains("filter_metadata.llmroute.backend"),
            "{notes}"
        );
        assert!(!notes.contains("backend `e`"), "{notes}");
    }

    #[test]
    fn a_discovered_llamacpp_backend_brings_its_original_destination_probe_cluster() {
        let doc = "version: 1\nbackends:\n  - { name: d, kind: llamacpp, discovery: {} }\nmodels:\n  - { name: m, routes: [{ backend: d }] }\n";
        let p = pieces(&load(doc), doc, &RenderOptions::new("/x.wasm")).unwrap();
        let names: Vec<&str> = p.clusters.iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, vec!["llmroute-dst-probe-d", "llmroute_admin"]);
        assert_eq!(p.clusters[0]["type"], "ORIGINAL_DST");
        assert!(
            p.backend_clusters.is_empty(),
            "a cluster defined elsewhere is not rendered"
        );
    }

    #[test]
    fn a_config_without_failover_credentials_or_tls_has_no_section_for_them() {
        let doc = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081']\nmodels:\n  - name: m\n    routes: [{ backend: a }]\n";
        let cfg = load(doc);
        let v = filter_document(&pieces(&cfg, doc, &RenderOptions::new("/x.wasm")).unwrap());
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            vec![
                "backend_clusters",
                "bootstrap",
                "clusters",
                "connection_manager",
                "http_filters",
                "listener",
                "other_routes",
                "route"
            ]
        );
        let text = filter_yaml(&cfg, doc, &RenderOptions::new("/x.wasm")).unwrap();
        assert!(!text.contains("failover_route"), "{text}");
        assert!(
            text.contains("# NOTE: admin: the filter polls Envoy's admin API at 127.0.0.1:9901"),
            "{text}"
        );
        // The sections come in the header's order, each once.
        let at = |k: &str| {
            text.find(&format!("\n{k}:"))
                .unwrap_or_else(|| panic!("{k} missing:\n{text}"))
        };
        assert!(
            at("bootstrap") < at("connection_manager")
                && at("http_filters") < at("route")
                && at("clusters") < at("backend_clusters")
        );
        let parsed: Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(parsed, v);
    }
}
