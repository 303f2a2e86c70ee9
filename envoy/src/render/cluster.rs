//! One Envoy cluster per backend, with the resilience Envoy provides on its own:
//! - the load balancer (`chwbl` is ring hash with `hash_balance_factor`);
//! - active health checks on the engine kind's path, with `no_traffic_interval` set so an idle backend is still
//!   probed every interval (Envoy's default is 60 s), and hosts out of rotation until their first check passes;
//! - `update_merge_window: 0s`, so a health change reaches the workers' load balancers at once instead of after
//!   Envoy's default one-second merge window;
//! - outlier ejection on consecutive 5xx only (success-rate and gateway-failure ejection are turned off, so the
//!   only rule is the one in the config), with `max_ejection_percent` set explicitly (Envoy's 10% default never
//!   ejects a host of a three-host backend);
//! - a circuit breaker at `max_inflight`: overflow is an immediate 503, never a queue;
//! - endpoint metadata naming the backend, which the filter's upstream side reads.

use llmroute_core::config::{Backend, Config, Health, LbPolicy, Outlier};
use serde_json::{json, Value};

use super::{duration_ms, socket};

/// Every backend's cluster.
pub fn clusters(cfg: &Config) -> Vec<Value> {
    cfg.backends.iter().map(|b| cluster(b, cfg.retries.attempts)).collect()
}

fn cluster(b: &Backend, retries: u32) -> Value {
    let all_ips = b.endpoints.iter().all(|e| e.is_ip);
    let endpoints: Vec<Value> = b
        .endpoints
        .iter()
        .map(|e| {
            json!({
                "endpoint": { "address": socket(&e.host, e.port) },
                "metadata": { "filter_metadata": { "llmroute": { "backend": b.name } } },
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
        "circuit_breakers": { "thresholds": [circuit_breaker(b.max_inflight, retries)] },
        "metadata": { "filter_metadata": { "llmroute": { "kind": b.kind.as_str() } } },
    });
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

fn health_check(h: &Health) -> Value {
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
pub fn retry_policy(cfg: &Config) -> Option<Value> {
    let r = &cfg.retries;
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
