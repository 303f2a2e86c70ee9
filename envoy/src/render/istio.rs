//! `llmroute render --target istio`: the Kubernetes manifests that put the filter into Istio's Envoys (sidecar
//! outbound, or an ingress gateway) and shape the backends the way the filter needs.
//!
//! Istio owns the Envoy configuration, so everything Envoy-side is an `EnvoyFilter` patch onto what istiod
//! generates, and the backend clusters are Istio's own `outbound|PORT||HOST` clusters:
//! - `HTTP_FILTER` `INSERT_BEFORE` the router: the complete wasm filter (and, for `bounded_keys`, the
//!   stateful-session filter), because neither `WasmPlugin` nor `TrafficExtension` can set
//!   `allow_on_headers_stop_iteration`. A remote module (`https://`, `oci://`) goes through `EXTENSION_CONFIG`
//!   (ECDS), the only path on which istio-agent downloads a module and hands Envoy a local file;
//! - `HTTP_ROUTE` `MERGE` onto the `VirtualService` route named `llmroute`: `cluster_header` (a
//!   `VirtualService` cannot read the cluster from a header) and the affinity hash policy;
//! - `CLUSTER` `ADD`: `llmroute_admin`, the proxy's admin port that the filter polls, and for each `llamacpp`
//!   backend the `/props` fleet check's original-destination cluster (`llmroute-dst-probe-<cluster>`); `CLUSTER` `MERGE`:
//!   `hash_balance_factor` (CHWBL), `update_merge_window: 0s` and active health checks, which a
//!   `DestinationRule` cannot express;
//! - `LISTENER` `MERGE`: `per_connection_buffer_limit_bytes` above the filter's body limit (Istio's 1 MiB
//!   default would answer long prompts with Envoy's plain 413);
//! - one `DestinationRule` per backend: the load balancer (consistent hash on `x-llmroute-affinity`), outlier
//!   ejection, the circuit breaker, and locality load balancing off (locality weights would split the ring).
//!
//! Every builder the standalone bootstrap uses is reused, so both targets route the same way.

use llmroute_core::config::{Backend, Config, LbPolicy};
use llmroute_core::envoy_contract as contract;
use llmroute_core::route_choice::has_failover;
use serde_json::{json, Value};

use super::{admin, cluster, config_json, duration_ms, failover, stateful_session, RenderOptions};

/// The `VirtualService` route the `HTTP_ROUTE` patch finds by name.
pub const ROUTE_NAME: &str = "llmroute";
/// Envoy's type URL of the wasm HTTP filter, for ECDS.
const WASM_TYPE_URL: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";

/// Where the proxy finds `llmroute_filter.wasm`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WasmSource {
    /// An absolute path inside the proxy's container (mounted from a ConfigMap or volume).
    Local(String),
    /// `https://` or `oci://`, verified against `sha256` (64 lowercase hex digits).
    Remote { url: String, sha256: String },
}

impl WasmSource {
    /// The CLI's `--wasm PATH` or `--wasm-url URL --sha256 HEX`, checked.
    pub fn from_args(path: Option<String>, url: Option<String>, sha256: Option<String>) -> Result<Self, String> {
        match (path, url, sha256) {
            (Some(p), None, None) if p.starts_with('/') => Ok(WasmSource::Local(p)),
            (Some(p), None, None) => Err(format!(
                "--wasm: {p:?} is not an absolute path; give the module's path inside the proxy's container, e.g. /var/local/wasm/llmroute_filter.wasm"
            )),
            (None, Some(url), Some(sha)) => {
                if !(url.starts_with("https://") || url.starts_with("oci://")) {
                    return Err(format!(
                        "--wasm-url: {url:?} must start with https:// or oci://; for a file in the container use --wasm PATH"
                    ));
                }
                if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                    return Err(format!(
                        "--sha256: {sha:?} is not 64 lowercase hex digits; use the output of `sha256sum llmroute_filter.wasm`"
                    ));
                }
                Ok(WasmSource::Remote { url, sha256: sha })
            }
            (None, Some(_), None) => Err("--wasm-url needs --sha256 HEX (the module's sha256)".into()),
            (None, None, Some(_)) => Err("--sha256 goes with --wasm-url URL".into()),
            (None, None, None) => Err("--target istio needs --wasm PATH or --wasm-url URL --sha256 HEX".into()),
            _ => Err("give either --wasm PATH or --wasm-url URL --sha256 HEX, not both".into()),
        }
    }
}

/// Where the filter runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deployment {
    /// In the clients' sidecars, on outbound traffic to the `llmroute` Service.
    Sidecar,
    /// In an ingress gateway whose pods carry `istio: <selector>` labels, for requests to `host` through the
    /// Istio `Gateway` named `gateway` (`NAMESPACE/NAME`).
    Gateway {
        gateway: String,
        host: String,
        selector: String,
    },
}

/// Options of the Istio target.
#[derive(Debug, Clone)]
pub struct IstioOptions {
    pub wasm: WasmSource,
    /// Namespace of every manifest (for a gateway: the gateway's namespace).
    pub namespace: String,
    pub deployment: Deployment,
    /// The proxy's admin port, which `llmroute_admin` points at on loopback. Istio's is 15000.
    pub admin_port: u16,
}

impl IstioOptions {
    pub fn sidecar(wasm: WasmSource, namespace: impl Into<String>) -> Self {
        IstioOptions {
            wasm,
            namespace: namespace.into(),
            deployment: Deployment::Sidecar,
            admin_port: 15000,
        }
    }
}

/// An Istio backend cluster name, split: `outbound|PORT||HOST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IstioCluster {
    pub port: u16,
    pub host: String,
}

/// Parses `outbound|PORT||HOST` (no subset).
pub fn parse_cluster(name: &str) -> Option<IstioCluster> {
    let mut parts = name.split('|');
    let (dir, port, subset, host) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if dir != "outbound" || !subset.is_empty() || host.is_empty() || parts.next().is_some() {
        return None;
    }
    Some(IstioCluster {
        port: port.parse().ok().filter(|p| *p > 0)?,
        host: host.to_string(),
    })
}

fn check_backend(b: &Backend) -> Result<IstioCluster, String> {
    let fix = "name it as Istio names its cluster, `outbound|PORT||SERVICE.NAMESPACE.svc.cluster.local`, with `discovery: {}`";
    let c = parse_cluster(&b.name).ok_or_else(|| {
        format!(
            "backends[{}].name: not an Istio outbound cluster name (no subset); {fix}",
            b.name
        )
    })?;
    match &b.discovery {
        Some(d) if d.eds_path.is_none() => {}
        _ => {
            return Err(format!(
                "backends[{}].discovery: Istio discovers the endpoints, so use `discovery: {{}}` (no endpoints, no eds_path)",
                b.name
            ))
        }
    }
    if b.tls.is_some() {
        return Err(format!(
            "backends[{}].tls: not rendered for Istio; remove it and let the mesh (or a DestinationRule you own) set TLS",
            b.name
        ));
    }
    if b.credential_env.is_some() {
        return Err(format!(
            "backends[{}].credential_env: not rendered for Istio yet; remove it (inject the token another way)",
            b.name
        ));
    }
    Ok(c)
}

/// Every manifest, as `(file name, YAML)`, in the order to apply them. `config_text` is the document `cfg` was
/// loaded from.
pub fn manifests(cfg: &Config, config_text: &str, opts: &IstioOptions) -> Result<Vec<(String, String)>, String> {
    let backends: Vec<(&Backend, IstioCluster)> = cfg
        .backends
        .iter()
        .map(|b| check_backend(b).map(|c| (b, c)))
        .collect::<Result<_, _>>()?;
    let Some((_, first)) = backends.first() else {
        return Err("backends: at least one backend is needed".into());
    };
    if cfg.global_limits.is_some() {
        // Refused rather than dropped: without the rate-limit filter the limits would silently not apply.
        return Err("global_limits: the Istio manifests do not carry Envoy's rate-limit filter yet; render --target envoy or --target filter, or leave global_limits out".into());
    }
    let failover = cfg.models.iter().any(has_failover);
    if failover && matches!(opts.wasm, WasmSource::Remote { .. }) {
        return Err("models[].routes: failover across backends runs the module as an upstream filter too, which needs --wasm PATH; --wasm-url is not supported with failover yet".into());
    }
    let plugin_config = config_json(config_text)?;
    let mut docs = vec![(
        "envoyfilter.yaml".to_string(),
        envoy_filter(cfg, &plugin_config, opts, &backends),
    )];
    if opts.deployment == Deployment::Sidecar {
        docs.push(("service.yaml".into(), service(cfg, opts)));
    }
    docs.push(("virtualservice.yaml".into(), virtual_service(cfg, opts, first)));
    for (b, c) in &backends {
        docs.push((
            format!("destinationrule-{}.yaml", short_name(c)),
            destination_rule(b, c, opts),
        ));
    }
    docs.into_iter()
        .map(|(name, v)| {
            let body = serde_yaml_ng::to_string(&v).map_err(|e| e.to_string())?;
            Ok((
                name,
                format!(
                    "# Rendered by `llmroute render --target istio` {}.\n{body}",
                    llmroute_core::VERSION
                ),
            ))
        })
        .collect()
}

fn metadata(name: &str, opts: &IstioOptions) -> Value {
    json!({ "name": name, "namespace": opts.namespace, "labels": { "app.kubernetes.io/managed-by": "llmroute" } })
}

fn context(opts: &IstioOptions) -> &'static str {
    match opts.deployment {
        Deployment::Sidecar => "SIDECAR_OUTBOUND",
        Deployment::Gateway { .. } => "GATEWAY",
    }
}

/// The Service clients call in sidecar mode. It has no selector: its only job is a name and a port that Istio
/// builds a route for; the filter picks the real backend cluster.
fn service(cfg: &Config, opts: &IstioOptions) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata("llmroute", opts),
        "spec": { "ports": [{ "name": "http", "port": cfg.listen.port(), "appProtocol": "http" }] },
    })
}

fn virtual_service(cfg: &Config, opts: &IstioOptions, first: &IstioCluster) -> Value {
    let (hosts, gateways) = match &opts.deployment {
        Deployment::Sidecar => (vec![format!("llmroute.{}.svc.cluster.local", opts.namespace)], None),
        Deployment::Gateway { gateway, host, .. } => (vec![host.clone()], Some(vec![gateway.clone()])),
    };
    let mut route = json!({
        "name": ROUTE_NAME,
        // Replaced by the filter's header (HTTP_ROUTE patch); Istio needs a destination to build the route.
        "route": [{ "destination": { "host": first.host, "port": { "number": first.port } } }],
        "timeout": duration_ms(cfg.limits.request_timeout_ms),
    });
    // The same retries as the standalone route (cluster::retry_policy), in Istio's words: numeric codes in
    // `retryOn` become `retriable_status_codes`; Istio adds `previous_hosts` itself.
    route["retries"] = match cluster::retry_policy(cfg) {
        Some(p) => {
            let codes: Vec<String> = p["retriable_status_codes"]
                .as_array()
                .map(|a| a.iter().map(|c| c.to_string()).collect())
                .unwrap_or_default();
            let on = p["retry_on"]
                .as_str()
                .unwrap_or("")
                .replace(",retriable-status-codes", "");
            let mut r = json!({ "attempts": p["num_retries"], "retryOn": format!("{on},{}", codes.join(",")) });
            if let Some(t) = p.get("per_try_timeout") {
                r["perTryTimeout"] = t.clone();
            }
            r
        }
        None => json!({ "attempts": 0 }),
    };
    let mut spec = json!({ "hosts": hosts, "http": [route] });
    if let Some(g) = gateways {
        spec["gateways"] = json!(g);
    }
    json!({ "apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": metadata("llmroute", opts), "spec": spec })
}

fn destination_rule(b: &Backend, c: &IstioCluster, opts: &IstioOptions) -> Value {
    let mut lb = match b.lb {
        LbPolicy::Chwbl => json!({ "consistentHash": { "httpHeaderName": contract::AFFINITY } }),
        LbPolicy::LeastRequest => json!({ "simple": "LEAST_REQUEST" }),
        LbPolicy::RoundRobin => json!({ "simple": "ROUND_ROBIN" }),
    };
    lb["localityLbSetting"] = json!({ "enabled": false });
    let mut policy = json!({
        "loadBalancer": lb,
        "connectionPool": { "http": {
            "http1MaxPendingRequests": b.max_inflight,
            "http2MaxRequests": b.max_inflight,
            "maxRetries": b.max_inflight,
        } },
    });
    if let Some(o) = &b.outlier {
        policy["outlierDetection"] = json!({
            "consecutive5xxErrors": o.consecutive_5xx,
            "consecutiveGatewayErrors": 0,
            "interval": "1s",
            "baseEjectionTime": duration_ms(o.base_ejection_ms),
            "maxEjectionPercent": o.max_ejection_percent,
        });
    }
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": metadata(&format!("llmroute-{}", short_name(c)), opts),
        "spec": { "host": c.host, "trafficPolicy": policy },
    })
}

/// `SERVICE-NAMESPACE-PORT`, for resource and file names.
fn short_name(c: &IstioCluster) -> String {
    let mut parts: Vec<&str> = c.host.split('.').take(2).collect();
    let port = c.port.to_string();
    parts.push(&port);
    parts.join("-")
}

fn envoy_filter(
    cfg: &Config,
    plugin_config: &str,
    opts: &IstioOptions,
    backends: &[(&Backend, IstioCluster)],
) -> Value {
    let ctx = context(opts);
    let port = cfg.listen.port();
    let local_path = match &opts.wasm {
        WasmSource::Local(p) => p.clone(),
        WasmSource::Remote { .. } => String::new(),
    };
    let render = RenderOptions::new(local_path);
    let mut patches = Vec::new();
    let mut filter = super::wasm_filter(plugin_config.to_string(), &render);
    if let WasmSource::Remote { url, sha256 } = &opts.wasm {
        // istio-agent fetches remote modules only on ECDS: it rewrites this `remote` source to a local file before
        // Envoy sees it, for oci:// as for https://. The cluster name is required by Envoy's schema, unused here.
        filter["typed_config"]["config"]["vm_config"]["code"] = json!({ "remote": {
            "http_uri": { "uri": url, "cluster": "llmroute_wasm_fetch", "timeout": "30s" },
            "sha256": sha256,
        } });
        patches.push(json!({
            "applyTo": "EXTENSION_CONFIG",
            "match": { "context": ctx },
            "patch": { "operation": "ADD", "value": filter },
        }));
        filter = json!({
            "name": "llmroute",
            "config_discovery": {
                "config_source": { "ads": {}, "initial_fetch_timeout": "0s" },
                "type_urls": [WASM_TYPE_URL],
            },
        });
    }
    let router_match = |ctx: &str| {
        json!({ "context": ctx, "listener": { "portNumber": port, "filterChain": { "filter": {
            "name": "envoy.filters.network.http_connection_manager",
            "subFilter": { "name": "envoy.filters.http.router" },
        } } } })
    };
    patches.push(json!({ "applyTo": "HTTP_FILTER", "match": router_match(ctx), "patch": { "operation": "INSERT_BEFORE", "value": filter } }));
    if cfg.any_bounded_keys() {
        // Inserted after the wasm filter, before the router: the same order as the standalone bootstrap.
        patches.push(json!({ "applyTo": "HTTP_FILTER", "match": router_match(ctx), "patch": { "operation": "INSERT_BEFORE", "value": stateful_session() } }));
    }
    let route_match = json!({ "context": ctx, "routeConfiguration": { "vhost": { "route": { "name": ROUTE_NAME } } } });
    if cfg.models.iter().any(has_failover) {
        let mut plain = json!({ "cluster_header": contract::CLUSTER, "timeout": duration_ms(cfg.limits.request_timeout_ms),
            "hash_policy": [{ "header": { "header_name": contract::AFFINITY } }] });
        if let Some(r) = cluster::retry_policy(cfg) {
            plain["retry_policy"] = r;
        }
        if let Some(mut r) = failover::route(cfg, &plain) {
            r["name"] = Value::from("llmroute-failover");
            patches.push(json!({ "applyTo": "HTTP_ROUTE", "match": route_match.clone(), "patch": { "operation": "INSERT_BEFORE", "value": r } }));
        }
        for c in failover::clusters(cfg, plugin_config, &render) {
            patches.push(json!({ "applyTo": "CLUSTER", "match": { "context": ctx }, "patch": { "operation": "ADD", "value": c } }));
        }
    }
    patches.push(json!({
        "applyTo": "HTTP_ROUTE",
        "match": route_match,
        "patch": { "operation": "MERGE", "value": { "route": {
            "cluster_header": contract::CLUSTER,
            "hash_policy": [{ "header": { "header_name": contract::AFFINITY } }],
        } } },
    }));
    patches.push(json!({
        "applyTo": "CLUSTER",
        "match": { "context": ctx },
        "patch": { "operation": "ADD", "value": admin::cluster(std::net::SocketAddr::from(([127, 0, 0, 1], opts.admin_port))) },
    }));
    if let Some(store) = &cfg.affinity.placement_store {
        // The etcd members the shared placement table's callouts go to (see `store`).
        patches.push(json!({
            "applyTo": "CLUSTER",
            "match": { "context": ctx },
            "patch": { "operation": "ADD", "value": super::store::cluster(store) },
        }));
    }
    // The `/props` fleet check reaches each pod of a llama.cpp backend through an original-destination cluster.
    // Istio's own cluster is not copied (its mTLS socket matches endpoint metadata these hosts lack): the probe
    // is plain HTTP, which the pods' sidecars accept under PERMISSIVE mTLS (see docs/operations.md).
    for b in llmroute_core::fleet_check::discovered_backends(cfg) {
        patches.push(json!({
            "applyTo": "CLUSTER",
            "match": { "context": ctx },
            "patch": { "operation": "ADD", "value": super::probe::discovered_cluster(b, None) },
        }));
    }
    for (b, c) in backends {
        let mut merge = json!({ "common_lb_config": { "update_merge_window": "0s" } });
        if b.lb == LbPolicy::Chwbl {
            merge["common_lb_config"]["consistent_hashing_lb_config"] =
                json!({ "hash_balance_factor": b.balance_factor });
        }
        if let Some(h) = &b.health {
            merge["health_checks"] = json!([cluster::health_check(h)]);
        }
        patches.push(json!({
            "applyTo": "CLUSTER",
            "match": { "context": ctx, "cluster": { "name": b.name, "service": c.host, "portNumber": c.port } },
            "patch": { "operation": "MERGE", "value": merge },
        }));
    }
    patches.push(json!({
        "applyTo": "LISTENER",
        "match": { "context": ctx, "listener": { "portNumber": port } },
        "patch": { "operation": "MERGE", "value": {
            "per_connection_buffer_limit_bytes": cfg.limits.max_body_bytes + super::BUFFER_SLACK,
        } },
    }));
    let mut spec = json!({ "configPatches": patches });
    if let Deployment::Gateway { selector, .. } = &opts.deployment {
        spec["workloadSelector"] = json!({ "labels": { "istio": selector } });
    }
    json!({ "apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter", "metadata": metadata("llmroute", opts), "spec": spec })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = include_str!("../../../testdata/istio/llmroute.yaml");

    fn render(wasm: WasmSource) -> Vec<(String, Value)> {
        let cfg = llmroute_core::load_config(DOC).unwrap();
        manifests(&cfg, DOC, &IstioOptions::sidecar(wasm, "models"))
            .unwrap()
            .into_iter()
            .map(|(n, y)| (n, serde_yaml_ng::from_str(&y).unwrap()))
            .collect()
    }

    fn patches(docs: &[(String, Value)]) -> Vec<Value> {
        docs[0].1["spec"]["configPatches"].as_array().unwrap().clone()
    }

    #[test]
    fn destination_rules_hash_on_affinity_eject_and_turn_locality_off() {
        let docs = render(WasmSource::Local("/w.wasm".into()));
        let dr = &docs
            .iter()
            .find(|(n, _)| n == "destinationrule-llama-models-8080.yaml")
            .unwrap()
            .1;
        assert_eq!(dr["spec"]["host"], "llama.models.svc.cluster.local");
        let p = &dr["spec"]["trafficPolicy"];
        assert_eq!(
            p["loadBalancer"]["consistentHash"]["httpHeaderName"],
            contract::AFFINITY
        );
        assert_eq!(p["loadBalancer"]["localityLbSetting"]["enabled"], false);
        assert_eq!(p["outlierDetection"]["consecutive5xxErrors"], 3);
        let vllm = &docs
            .iter()
            .find(|(n, _)| n == "destinationrule-vllm-models-8000.yaml")
            .unwrap()
            .1;
        assert_eq!(vllm["spec"]["trafficPolicy"]["loadBalancer"]["simple"], "LEAST_REQUEST");
    }

    #[test]
    fn the_filter_patch_pauses_and_the_cluster_patch_bounds_the_load() {
        let p = patches(&render(WasmSource::Local("/w.wasm".into())));
        let f = &p[0];
        assert_eq!(
            (f["applyTo"].as_str(), f["patch"]["operation"].as_str()),
            (Some("HTTP_FILTER"), Some("INSERT_BEFORE"))
        );
        assert_eq!(
            f["patch"]["value"]["typed_config"]["config"]["allow_on_headers_stop_iteration"],
            true
        );
        let chwbl = p
            .iter()
            .find(|x| x["match"]["cluster"]["name"] == "outbound|8080||llama.models.svc.cluster.local")
            .unwrap();
        assert_eq!(
            chwbl["patch"]["value"]["common_lb_config"]["consistent_hashing_lb_config"]["hash_balance_factor"],
            150
        );
        let l = p.iter().find(|x| x["applyTo"] == "LISTENER").unwrap();
        assert!(
            l["patch"]["value"]["per_connection_buffer_limit_bytes"]
                .as_u64()
                .unwrap()
                > 8 << 20
        );
        assert!(p.iter().any(|x| x["patch"]["value"]["name"] == "llmroute_admin"));
        // The llama.cpp backend's pods get the fleet check's original-destination cluster; vLLM's do not.
        let probes: Vec<&Value> = p
            .iter()
            .filter(|x| {
                x["patch"]["value"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(contract::DISCOVERED_PROBE_CLUSTER_PREFIX))
            })
            .collect();
        assert_eq!(probes.len(), 1, "{probes:?}");
        assert_eq!(
            (probes[0]["applyTo"].as_str(), probes[0]["patch"]["operation"].as_str()),
            (Some("CLUSTER"), Some("ADD"))
        );
        let c = &probes[0]["patch"]["value"];
        assert_eq!(
            c["name"],
            "llmroute-dst-probe-outbound|8080||llama.models.svc.cluster.local"
        );
        assert_eq!(
            (c["type"].as_str(), c["lb_policy"].as_str()),
            (Some("ORIGINAL_DST"), Some("CLUSTER_PROVIDED"))
        );
    }

    #[test]
    fn a_remote_module_goes_through_ecds() {
        let sha = "a".repeat(64);
        let p = patches(&render(WasmSource::Remote {
            url: "oci://r.example/f:1".into(),
            sha256: sha.clone(),
        }));
        assert_eq!(p[0]["applyTo"], "EXTENSION_CONFIG");
        let remote = &p[0]["patch"]["value"]["typed_config"]["config"]["vm_config"]["code"]["remote"];
        assert_eq!(
            (remote["http_uri"]["uri"].as_str(), remote["sha256"].as_str()),
            (Some("oci://r.example/f:1"), Some(sha.as_str()))
        );
        assert_eq!(
            p[1]["patch"]["value"]["config_discovery"]["type_urls"][0],
            WASM_TYPE_URL
        );
    }

    #[test]
    fn the_placement_store_cluster_is_added_for_the_sidecar() {
        let p = patches(&render(WasmSource::Local("/w.wasm".into())));
        let store: Vec<&Value> = p
            .iter()
            .filter(|x| x["patch"]["value"]["name"] == contract::PLACEMENT_STORE_CLUSTER)
            .collect();
        assert_eq!(store.len(), 1, "{store:?}");
        assert_eq!(
            (store[0]["applyTo"].as_str(), store[0]["patch"]["operation"].as_str()),
            (Some("CLUSTER"), Some("ADD"))
        );
        let c = &store[0]["patch"]["value"];
        assert_eq!(c["type"], "STRICT_DNS", "the members are named by DNS in the fixture");
        assert_eq!(c["health_checks"][0]["http_health_check"]["path"], "/health");
        let eps = c["load_assignment"]["endpoints"][0]["lb_endpoints"].as_array().unwrap();
        assert_eq!(eps.len(), 2);
    }

    #[test]
    fn global_limits_are_refused_not_dropped() {
        let doc = format!("{DOC}\nglobal_limits: {{ address: '127.0.0.1:8081' }}\n");
        let cfg = llmroute_core::load_config(&doc).unwrap();
        let err = manifests(
            &cfg,
            &doc,
            &IstioOptions::sidecar(WasmSource::Local("/w.wasm".into()), "models"),
        )
        .unwrap_err();
        assert!(err.starts_with("global_limits:"), "{err}");
    }

    #[test]
    fn non_istio_backends_and_bad_sources_are_refused() {
        let doc = "version: 1\nbackends:\n  - { name: a, kind: vllm, endpoints: ['127.0.0.1:9000'] }\nmodels:\n  - { name: m, routes: [{ backend: a }] }\n";
        let cfg = llmroute_core::load_config(doc).unwrap();
        let err = manifests(&cfg, doc, &IstioOptions::sidecar(WasmSource::Local("/w".into()), "d")).unwrap_err();
        assert!(
            err.contains("backends[a].name") && err.contains("outbound|PORT||"),
            "{err}"
        );
        assert!(WasmSource::from_args(Some("rel.wasm".into()), None, None).is_err());
        assert!(WasmSource::from_args(None, Some("http://x".into()), Some("a".repeat(64))).is_err());
        assert!(WasmSource::from_args(None, Some("https://x".into()), Some("A".repeat(64))).is_err());
        assert!(WasmSource::from_args(None, Some("https://x".into()), None).is_err());
        assert_eq!(parse_cluster("outbound|8000|v1|h.ns.svc.cluster.local"), None);
    }
}
