//! The traffic manifests: the `VirtualService` that gives the filter's route a name and a timeout, and one
//! `DestinationRule` per backend that shapes its load balancing the way the filter needs.
//!
//! Both are visible in their own namespace only (`exportTo: ["."]`), so they shape the traffic of the filter's
//! workloads and of no other client. The `VirtualService` binds to the Gateway of those workloads, never to the
//! mesh's sidecars.

use llmroute_core::config::{Backend, Document, LbPolicy};
use llmroute_core::envoy_contract as contract;
use serde_json::{json, Value};

use super::{Deployment, IstioCluster, IstioOptions, PROXY_NAME, ROUTE_NAME};
use crate::render::cluster;
use crate::render::json::duration_ms;

pub(super) fn metadata(name: &str, opts: &IstioOptions) -> Value {
    json!({ "name": name, "namespace": opts.namespace, "labels": { "app.kubernetes.io/managed-by": "llmroute" } })
}

pub fn virtual_service(cfg: &Document, opts: &IstioOptions, first: &IstioCluster) -> Value {
    let (hosts, gateway) = match &opts.deployment {
        Deployment::Proxy => (vec!["*".to_string()], format!("{}/{PROXY_NAME}", opts.namespace)),
        Deployment::Gateway { gateway, host, .. } => (vec![host.clone()], gateway.clone()),
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
    let mut spec = json!({ "hosts": hosts, "gateways": [gateway], "http": [route] });
    if opts.deployment == Deployment::Proxy {
        spec["exportTo"] = json!(["."]);
    }
    json!({ "apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": metadata("llmroute", opts), "spec": spec })
}

/// A backend's DestinationRule; with `fairness`, its connection-pool limits are the circuit breaker's
/// (`config::circuit_breaker_limit`).
pub fn destination_rule(b: &Backend, c: &IstioCluster, opts: &IstioOptions, fairness: bool) -> Value {
    let limit = llmroute_core::config::circuit_breaker_limit(b.max_inflight, fairness);
    let mut lb = match b.lb {
        LbPolicy::Chwbl => json!({ "consistentHash": { "httpHeaderName": contract::AFFINITY } }),
        LbPolicy::LeastRequest => json!({ "simple": "LEAST_REQUEST" }),
        LbPolicy::RoundRobin => json!({ "simple": "ROUND_ROBIN" }),
    };
    lb["localityLbSetting"] = json!({ "enabled": false });
    let mut policy = json!({
        "loadBalancer": lb,
        "connectionPool": { "http": {
            "http1MaxPendingRequests": limit,
            "http2MaxRequests": limit,
            "maxRetries": limit,
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
        "spec": { "host": c.host, "trafficPolicy": policy, "exportTo": ["."] },
    })
}

/// `SERVICE-NAMESPACE-PORT`, for resource and file names.
pub fn short_name(c: &IstioCluster) -> String {
    let mut parts: Vec<&str> = c.host.split('.').take(2).collect();
    let port = c.port.to_string();
    parts.push(&port);
    parts.join("-")
}
