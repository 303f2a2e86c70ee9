//! One Envoy cluster per backend, with the resilience Envoy provides on its own:
//! - the load balancer (`chwbl` is ring hash with `hash_balance_factor`);
//! - active health checks on the engine kind's path, with `no_traffic_interval` set so an idle backend is still
//!   probed every interval (Envoy's default is 60 s), and hosts out of rotation until their first check passes;
//! - `update_merge_window: 0s`, so a health change reaches the workers' load balancers at once instead of after
//!   Envoy's default one-second merge window;
//! - outlier ejection on consecutive 5xx only (success-rate and gateway-failure ejection are turned off, so the
//!   only rule is the one in the config), with `max_ejection_percent` set explicitly (Envoy's 10% default never
//!   ejects a host of a three-host backend), and a passing health check does not readmit an ejected host;
//! - a circuit breaker at `max_inflight`: overflow is an immediate 503, never a queue (with `fairness`, the filter
//!   queues at `max_inflight` and the breaker is twice it, a backstop: see `config::circuit_breaker_limit`);
//! - endpoint metadata naming the backend, which the filter's upstream side reads.

use llmroute_core::config::{circuit_breaker_limit, Backend, Document, Health, LbPolicy, Outlier};
use llmroute_core::envoy_contract as contract;
use serde_json::{json, Value};

use super::json::{duration_ms, socket};

/// Every backend's cluster, except a discovered backend without an EDS file: that cluster is defined outside
/// the bootstrap (CDS, Istio), and the route reaches it by name.
pub fn clusters(cfg: &Document) -> Vec<Value> {
    cfg.backends
        .iter()
        .filter(|b| b.discovery.as_ref().is_none_or(|d| d.eds_path.is_some()))
        .map(|b| cluster(b, cfg.render_only.retries.attempts, cfg.fairness.is_some()))
        .collect()
}

/// True when some backend's cluster is fed by EDS, which needs the bootstrap's `node` identity.
pub fn uses_xds(cfg: &Document) -> bool {
    cfg.backends
        .iter()
        .any(|b| b.discovery.as_ref().is_some_and(|d| d.eds_path.is_some()))
}

/// A discovered backend with an EDS file: an EDS cluster whose assignments come from that file, which Envoy
/// watches and reloads when it is replaced (write, then rename).
fn eds_config(path: &str) -> Value {
    json!({
        "eds_config": {
            "path_config_source": { "path": path },
            "resource_api_version": "V3",
        },
    })
}

fn cluster(b: &Backend, retries: u32, fairness: bool) -> Value {
    let all_ips = b.endpoints.iter().all(|e| e.is_ip);
    let endpoints: Vec<Value> = b
        .endpoints
        .iter()
        .map(|e| {
            json!({
                "endpoint": { "address": socket(&e.host, e.port) },
                "metadata": { "filter_metadata": { (contract::METADATA_NAMESPACE): { (contract::METADATA_BACKEND): b.name } } },
            })
        })
        .collect();
    let mut c = json!({
        "name": b.name,
        "type": if all_ips { "STATIC" } else { "STRICT_DNS" },
        "connect_timeout": duration_ms(b.connect_timeout_ms),
        "load_balancing_policy": { "policies": [{ "typed_extension_config": lb_policy(b) }] },
        // Envoy merges health updates for 1 s by default before workers see them; deliver them at once.
        "common_lb_config": { "update_merge_window": "0s" },
        "load_assignment": { "cluster_name": b.name, "endpoints": [{ "lb_endpoints": endpoints }] },
        "circuit_breakers": { "thresholds": [circuit_breaker(circuit_breaker_limit(b.max_inflight, fairness), retries)] },
        "metadata": { "filter_metadata": { (contract::METADATA_NAMESPACE): { (contract::METADATA_KIND): b.kind.as_str() } } },
    });
    if let Some(path) = b.discovery.as_ref().and_then(|d| d.eds_path.as_deref()) {
        if let Some(map) = c.as_object_mut() {
            map.remove("load_assignment");
        }
        c["type"] = Value::from("EDS");
        c["eds_cluster_config"] = eds_config(path);
        // A host removed from the file leaves at once; by default Envoy keeps a removed host that still passes
        // its health checks, so a scale-down would never take effect while the engine runs.
        c["ignore_health_on_host_removal"] = Value::from(true);
    }
    if let Some(h) = &b.health {
        c["health_checks"] = json!([health_check(h)]);
    }
    if let Some(o) = &b.outlier {
        c["outlier_detection"] = outlier_detection(o);
    }
    c
}

/// `max_inflight` bounds active and pending requests, so overflow is refused at once. Connections are left
/// at Envoy's default: a connection limit equal to the request limit would park an extra HTTP/1.1 request in
/// the pending queue until a connection frees up, which is queueing, not shedding.
fn circuit_breaker(max_inflight: u32, retries: u32) -> Value {
    json!({
        "priority": "DEFAULT",
        "max_requests": max_inflight,
        "max_pending_requests": max_inflight,
        // Envoy's default of 3 concurrent retries overflows under modest load; allow one per request in flight.
        "max_retries": max_inflight.saturating_mul(retries.max(1)),
    })
}

pub(crate) fn health_check(h: &Health) -> Value {
    json!({
        "timeout": duration_ms(h.timeout_ms),
        "interval": duration_ms(h.interval_ms),
        "no_traffic_interval": duration_ms(h.interval_ms),
        "unhealthy_interval": duration_ms(h.interval_ms),
        "unhealthy_threshold": h.unhealthy,
        "healthy_threshold": h.healthy,
        "reuse_connection": true,
        "http_health_check": { "path": h.path },
    })
}

fn outlier_detection(o: &Outlier) -> Value {
    json!({
        "consecutive_5xx": o.consecutive_5xx,
        "enforcing_consecutive_5xx": 100,
        "enforcing_consecutive_gateway_failure": 0,
        "enforcing_success_rate": 0,
        "enforcing_failure_percentage": 0,
        "interval": "1s",
        "base_ejection_time": duration_ms(o.base_ejection_ms),
        "max_ejection_percent": o.max_ejection_percent,
        // Envoy's default (true) readmits an ejected host at its next passing health check, so an engine whose
        // /health answers 200 while inference fails would get its traffic back within one interval. The
        // ejection holds for base_ejection_time (times the number of ejections) instead.
        "successful_active_health_check_uneject_host": false,
    })
}

fn lb_policy(b: &Backend) -> Value {
    let (name, type_url, config) = match b.lb {
        LbPolicy::Chwbl => (
            "ring_hash",
            "ring_hash.v3.RingHash",
            json!({
                "hash_function": "XX_HASH",
                "consistent_hashing_lb_config": { "hash_balance_factor": b.balance_factor },
            }),
        ),
        LbPolicy::LeastRequest => ("least_request", "least_request.v3.LeastRequest", json!({})),
        LbPolicy::RoundRobin => ("round_robin", "round_robin.v3.RoundRobin", json!({})),
    };
    let mut typed = config;
    typed["@type"] = Value::from(format!(
        "type.googleapis.com/envoy.extensions.load_balancing_policies.{type_url}"
    ));
    json!({ "name": format!("envoy.load_balancing_policies.{name}"), "typed_config": typed })
}

/// The route's retry policy: only failures before the first response byte, each retry on another host.
pub fn retry_policy(cfg: &Document) -> Option<Value> {
    let r = &cfg.render_only.retries;
    if r.attempts == 0 {
        return None;
    }
    let mut policy = json!({
        "retry_on": "connect-failure,refused-stream,reset,retriable-status-codes",
        "retriable_status_codes": [429, 502, 503, 504],
        "num_retries": r.attempts,
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate",
            },
        }],
        "host_selection_retry_max_attempts": 5,
    });
    if r.per_try_timeout_ms > 0 {
        policy["per_try_timeout"] = Value::from(duration_ms(r.per_try_timeout_ms));
    }
    Some(policy)
}

#[cfg(test)]
mod discovery_tests {
    use crate::render::{bootstrap, RenderOptions};

    const DOC: &str = "version: 1\nbackends:\n  - name: 'outbound|8000||llama.ns.svc.cluster.local'\n    kind: llamacpp\n    discovery: { eds_path: /etc/llmroute/eds.yaml }\n  - name: external\n    kind: vllm\n    discovery: {}\n  - name: fixed\n    kind: vllm\n    endpoints: ['127.0.0.1:9000']\nmodels:\n  - name: m\n    routes: [{ backend: 'outbound|8000||llama.ns.svc.cluster.local' }, { backend: external, priority: 1 }]\n";

    #[test]
    fn an_etcd_backend_is_an_eds_cluster_on_the_file_discover_writes() {
        let doc = "version: 1\nbackends:\n  - name: llama-a\n    kind: llamacpp\n    discovery:\n      eds_path: /var/lib/llmroute/a.json\n      etcd: { endpoints: ['127.0.0.1:2379'], prefix: /llmroute/backends/llama-a }\nmodels:\n  - name: m\n    routes: [{ backend: llama-a }]\n";
        let cfg = llmroute_core::load_document(doc).unwrap();
        let v = bootstrap(&cfg, doc, &RenderOptions::new("/x.wasm")).unwrap();
        let c = &v["static_resources"]["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "llama-a")
            .unwrap();
        assert_eq!(c["type"], "EDS");
        assert_eq!(
            c["eds_cluster_config"]["eds_config"]["path_config_source"]["path"],
            "/var/lib/llmroute/a.json"
        );
        assert!(c["health_checks"].is_array() && c["outlier_detection"].is_object());
    }

    #[test]
    fn an_eds_backend_is_an_eds_cluster_and_an_external_one_is_left_out() {
        let cfg = llmroute_core::load_document(DOC).unwrap();
        let v = bootstrap(&cfg, DOC, &RenderOptions::new("/x.wasm")).unwrap();
        let clusters = v["static_resources"]["clusters"].as_array().unwrap();
        let by_name = |n: &str| clusters.iter().find(|c| c["name"] == n);
        let eds = by_name("outbound|8000||llama.ns.svc.cluster.local").unwrap();
        assert_eq!(eds["type"], "EDS");
        assert!(eds.get("load_assignment").is_none());
        let source = &eds["eds_cluster_config"]["eds_config"];
        assert_eq!(source["path_config_source"]["path"], "/etc/llmroute/eds.yaml");
        assert_eq!(source["resource_api_version"], "V3");
        assert_eq!(eds["ignore_health_on_host_removal"], true);
        assert!(eds["health_checks"].is_array(), "health checks still apply");
        assert!(by_name("external").is_none());
        assert_eq!(by_name("fixed").unwrap()["type"], "STATIC");
        assert_eq!(v["node"]["id"], "llmroute");
        assert_eq!(v["node"]["cluster"], "llmroute");
    }

    #[test]
    fn no_node_without_xds() {
        let doc = "version: 1\nbackends:\n  - { name: a, kind: vllm, endpoints: ['127.0.0.1:9000'] }\nmodels:\n  - { name: m, routes: [{ backend: a }] }\n";
        let cfg = llmroute_core::load_document(doc).unwrap();
        let v = bootstrap(&cfg, doc, &RenderOptions::new("/x.wasm")).unwrap();
        assert!(v.get("node").is_none());
    }
}

#[cfg(test)]
mod breaker_tests {
    use crate::render::{bootstrap, RenderOptions};

    /// The breaker's `max_requests` of the backend's cluster, rendered from `doc`.
    fn max_requests(doc: &str) -> u64 {
        let cfg = llmroute_core::load_document(doc).unwrap();
        let v = bootstrap(&cfg, doc, &RenderOptions::new("/x.wasm")).unwrap();
        let clusters = v["static_resources"]["clusters"].as_array().unwrap();
        let c = clusters.iter().find(|c| c["name"] == "a").unwrap();
        let t = &c["circuit_breakers"]["thresholds"][0];
        assert_eq!(t["max_requests"], t["max_pending_requests"]);
        t["max_requests"].as_u64().unwrap()
    }

    #[test]
    fn with_the_fair_queue_the_breaker_is_a_backstop_at_twice_max_inflight() {
        let doc = "version: 1\nbackends:\n  - { name: a, kind: vllm, endpoints: ['127.0.0.1:9000'], max_inflight: 8 }\nmodels:\n  - { name: m, routes: [{ backend: a }] }\n";
        assert_eq!(max_requests(doc), 8);
        let fair = format!("{doc}fairness: {{ by: {{ header: x-tenant-id }} }}\n");
        assert_eq!(max_requests(&fair), 16);
    }
}
