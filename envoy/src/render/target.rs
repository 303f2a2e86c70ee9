//! The pieces an Envoy needs for llmroute, apart from the listener, the virtual host and the backends' own
//! clusters: what `llmroute render --target filter` prints for an Envoy someone already runs, and what the full
//! bootstrap (`--target envoy`) is assembled from, so the two cannot drift.
//!
//! - `http_filters`: the entries that go before the router, in order: the wasm filter (inline, or through ECDS
//!   when [`RenderOptions::ecds_path`] is set), Envoy's rate-limit filter with `global_limits`, then the
//!   stateful-session filter with `bounded_keys` placement.
//! - `route`: the RouteAction for inference paths (`cluster_header`, `hash_policy`, retry policy, timeout).
//! - `failover_route`: only when an alias has routes to several backends. A whole route (match plus action) that
//!   must come before the inference route: requests for such aliases carry `x-llmroute-alias` and need the retry
//!   priority that moves on to the next backend.
//! - `clusters`: the extra clusters: the failover aggregates (with the filter's upstream role), the `/props`
//!   probe clusters (per endpoint, and original-destination ones for discovered llama.cpp backends), and
//!   `llmroute_admin`, and with `affinity.placement_store` the etcd cluster `llmroute_placement_store`. A multi-route alias is routed to its aggregate; without it the request names a cluster that
//!   does not exist.
//! - `secrets`: only when a backend has `credential_env`: the SDS secrets the aggregates' injectors read.
//!
//! What the pieces cannot carry: the backends' own clusters (named after the backends, their endpoints tagged
//! with `llmroute.backend` metadata for failover), and a backend's `tls` transport socket and credential
//! injector, which belong on those clusters; the listener's `per_connection_buffer_limit_bytes` and downstream
//! TLS. [`limitations`] names the ones a given config needs, and the CLI prints them as warnings.

use llmroute_core::config::Config;
use llmroute_core::envoy_contract as contract;
use serde_json::{json, Value};

use super::{
    admin, cluster, config_json, credentials, duration_ms, ecds, failover, probe, ratelimit, stateful_session, store,
    tls, RenderOptions, BUFFER_SLACK,
};

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
}

/// Renders the pieces. `config_text` must be the document `cfg` was loaded from.
pub fn pieces(cfg: &Config, config_text: &str, opts: &RenderOptions) -> Result<Pieces, String> {
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
    if cfg.compress_responses {
        // First in the chain, so on the way back it runs last: the wasm filter sees the engine's bytes as sent.
        http_filters.push(compressor());
    }
    if opts.with_filter {
        http_filters.push(match &opts.ecds_path {
            Some(path) => ecds::discovered_filter(path),
            None => super::wasm_filter(plugin_config, opts),
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
    Ok(Pieces {
        http_filters,
        route,
        failover_route,
        backend_clusters,
        clusters,
        secrets: take_array(&mut scratch["static_resources"]["secrets"]),
    })
}

/// The RouteAction. With the filter, the cluster comes from the filter's header; without it, the first backend.
fn route_action(cfg: &Config, with_filter: bool) -> Value {
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

/// The `--target filter` document: `http_filters`, `route`, `clusters`, and `failover_route` / `secrets`
/// when the config needs them.
pub fn filter_document(p: &Pieces) -> Value {
    let mut doc = json!({ "http_filters": p.http_filters, "route": p.route, "clusters": p.clusters });
    if let Some(f) = &p.failover_route {
        doc["failover_route"] = f.clone();
    }
    if !p.secrets.is_empty() {
        doc["secrets"] = Value::from(p.secrets.clone());
    }
    doc
}

/// `--target filter` as YAML, with a header that says where each key goes and what the Envoy must also have.
pub fn filter_yaml(cfg: &Config, config_text: &str, opts: &RenderOptions) -> Result<String, String> {
    let p = pieces(cfg, config_text, opts)?;
    let body = serde_yaml_ng::to_string(&filter_document(&p)).map_err(|e| e.to_string())?;
    let mut head = vec![
        format!(
            "# Rendered by `llmroute render --target filter` {}: the pieces llmroute adds to an Envoy you run.",
            llmroute_core::VERSION
        ),
        "# http_filters: put these before envoy.filters.http.router in your connection manager, in this order."
            .to_string(),
        "# route: the RouteAction of your inference route(s) (for example prefix /v1/).".to_string(),
    ];
    if p.failover_route.is_some() {
        head.push(
            "# failover_route: a route to put before your inference route, with the same path match plus its header \
             match; multi-route aliases need it and the llmroute-failover-* clusters."
                .to_string(),
        );
    }
    head.push(
        "# clusters: add to your clusters. Yours must include one per backend, named as in llmroute.yaml.".to_string(),
    );
    if !p.secrets.is_empty() {
        head.push("# secrets: add to static_resources.secrets.".to_string());
    }
    for l in limitations(cfg) {
        head.push(format!("# NOTE: {l}"));
    }
    Ok(format!("{}\n{body}", head.join("\n")))
}

/// What the pieces cannot carry for this config, as sentences for warnings and the header.
pub fn limitations(cfg: &Config) -> Vec<String> {
    let mut out = vec![format!(
        "your listener needs per_connection_buffer_limit_bytes: {} so the filter, not Envoy, answers oversized \
         bodies",
        cfg.limits.max_body_bytes + BUFFER_SLACK
    )];
    if cfg.models.iter().any(llmroute_core::route_choice::has_failover) {
        out.push(
            "failover: every endpoint of a failover member cluster needs metadata filter_metadata.llmroute.backend: \
             <backend name>"
                .to_string(),
        );
    }
    for b in &cfg.backends {
        if b.tls.is_some() {
            out.push(format!(
                "backend `{}` has tls: put its transport_socket on your cluster `{}` (see --target envoy)",
                b.name, b.name
            ));
        }
        if b.credential_env.is_some() {
            out.push(format!(
                "backend `{}` has credential_env: put its credential_injector upstream filter on your cluster `{}` \
                 (see --target envoy)",
                b.name, b.name
            ));
        }
    }
    if cfg.listen_tls.is_some() {
        out.push(
            "listen_tls: put the DownstreamTlsContext on your listener's filter chain (see --target envoy)".into(),
        );
    }
    out.push(
        "metrics: add the bootstrap's stats_config.stats_tags from --target envoy, or the filter's metrics keep their \
         labels inside their names (docs/observability.md)"
            .into(),
    );
    out.push("access log: copy the connection manager's access_log entry from --target envoy to yours".into());
    out.push(
        "errors and edge: copy the connection manager's local_reply_config (Envoy's own errors in the API's JSON \
         envelope) and its timeouts and HTTP/2 bounds from --target envoy (docs/hardening.md)"
            .into(),
    );
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

    fn load(doc: &str) -> Config {
        llmroute_core::load_config(doc).unwrap()
    }

    fn hcm(v: &Value) -> &Value {
        &v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    }

    #[test]
    fn the_compressor_comes_first_and_only_when_asked() {
        let plain = load(DOC);
        let filters = |cfg: &Config| {
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
    fn the_filter_document_has_the_pieces_and_no_backend_cluster() {
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
        assert_eq!(
            doc["route"]["hash_policy"][0]["header"]["header_name"],
            contract::AFFINITY
        );
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
        assert_eq!(doc["failover_route"]["match"]["headers"][0]["name"], contract::ALIAS);
        assert_eq!(doc["secrets"][0]["name"], "llmroute-credential-a");
        let lims = limitations(&cfg).join("\n");
        assert!(lims.contains("per_connection_buffer_limit_bytes"), "{lims}");
        assert!(
            lims.contains("backend `b` has tls") && lims.contains("backend `a` has credential_env"),
            "{lims}"
        );
        assert!(lims.contains("filter_metadata.llmroute.backend"), "{lims}");
        assert!(lims.contains("stats_tags") && lims.contains("access_log"), "{lims}");
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
    fn a_config_without_failover_or_credentials_has_only_the_three_keys() {
        let doc = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081']\nmodels:\n  - name: m\n    routes: [{ backend: a }]\n";
        let cfg = load(doc);
        let v = filter_document(&pieces(&cfg, doc, &RenderOptions::new("/x.wasm")).unwrap());
        let mut keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, vec!["clusters", "http_filters", "route"]);
        let text = filter_yaml(&cfg, doc, &RenderOptions::new("/x.wasm")).unwrap();
        assert!(!text.contains("failover_route"), "{text}");
        assert!(
            text.contains("# NOTE: your listener needs per_connection_buffer_limit_bytes"),
            "{text}"
        );
    }
}
