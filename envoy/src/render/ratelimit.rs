//! `global_limits`: Envoy's own rate-limit filter in front of a gRPC rate-limit service (envoyproxy/ratelimit).
//!
//! Rendered only when the config has `global_limits`:
//! - the cluster [`global::CLUSTER`], HTTP/2, to the service's address;
//! - `envoy.filters.http.ratelimit` after the wasm filter (it must see the headers the filter sets once the body
//!   is read), with the domain, the timeout, `failure_mode_deny` and a 503 when the service fails;
//! - the filter's own `rate_limits` (not the route's: Envoy 1.40 drops `hits_addend` from route-level policies,
//!   see `docs/admission.md`), six descriptors whose values come only from the filter's
//!   [`global::ALIAS_HEADER`] and [`global::KEY_HEADER`]:
//!   - `(llmroute, requests), (alias, A)` and `(llmroute, requests), (key, K)`: one hit each, before the request;
//!   - `(llmroute, tokens), (alias, A)` and `(llmroute, tokens), (key, K)` with `hits_addend: 0`: a check that
//!     charges nothing for a service that reads an explicit 0 as a peek (not verified against envoyproxy/ratelimit
//!     here), before the request;
//!   - the same two token descriptors with `apply_on_stream_done` and `hits_addend` read from the filter state
//!     [`global::TOKENS_CHARGED`]: the usage is charged when the stream is done.
//!
//! Envoy's 429 and 503 get the route's JSON envelope from `local_reply_config` (`ENVOY_REPLIES`); the filter adds
//! `Retry-After`.

use llmroute_core::config::GlobalLimits;
use llmroute_core::envoy_contract::{global, log_fields};
use serde_json::{json, Value};

use super::json::{duration_ms, socket};

/// The rate-limit filter, for the http filters before the router (after the wasm filter).
pub fn filter(g: &GlobalLimits) -> Value {
    json!({
        "name": global::FILTER,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": g.domain,
            "timeout": duration_ms(g.timeout_ms),
            "failure_mode_deny": !g.failure_mode_allow,
            "status_on_error": { "code": "ServiceUnavailable" },
            // x-ratelimit-reset (from the service's duration_until_reset) gives the 429 its Retry-After.
            "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
            "rate_limit_service": {
                "transport_api_version": "V3",
                "grpc_service": { "envoy_grpc": { "cluster_name": global::CLUSTER } },
            },
            // In the filter, not on the route: Envoy 1.40 sends `hits_addend` only for the filter's own policies.
            "rate_limits": rate_limits(),
        },
    })
}

/// The service's cluster: HTTP/2 (gRPC), a static address or a DNS name.
pub fn cluster(g: &GlobalLimits) -> Value {
    json!({
        "name": global::CLUSTER,
        "type": if g.address.is_ip { "STATIC" } else { "STRICT_DNS" },
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http2_protocol_options": {} },
            },
        },
        "load_assignment": {
            "cluster_name": global::CLUSTER,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": socket(&g.address.host, g.address.port) } }] }],
        },
    })
}

/// The filter's `rate_limits`: the descriptors, and when each is sent.
pub fn rate_limits() -> Value {
    let entry = |kind: &str, (key, header): (&str, &str)| {
        json!([
            { "generic_key": { "descriptor_key": global::KIND, "descriptor_value": kind } },
            { "request_headers": { "header_name": header, "descriptor_key": key } },
        ])
    };
    let by = [(global::ALIAS, global::ALIAS_HEADER), (global::KEY, global::KEY_HEADER)];
    let charged = format!(
        "%FILTER_STATE({}:PLAIN)%",
        log_fields::filter_state(global::TOKENS_CHARGED)
    );
    let mut out = Vec::new();
    for b in by {
        out.push(json!({ "actions": entry(global::REQUESTS, b) }));
    }
    for b in by {
        out.push(json!({ "actions": entry(global::TOKENS, b), "hits_addend": { "number": 0 } }));
    }
    for b in by {
        out.push(json!({
            "actions": entry(global::TOKENS, b),
            "apply_on_stream_done": true,
            "hits_addend": { "format": charged },
        }));
    }
    Value::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{bootstrap, RenderOptions};

    use crate::render::testing::ONE_BACKEND as DOC;

    fn render(extra: &str) -> Value {
        let doc = format!("{DOC}{extra}");
        let cfg = llmroute_core::load_document(&doc).unwrap();
        bootstrap(&cfg, &doc, &RenderOptions::new("/x.wasm")).unwrap()
    }

    fn hcm(v: &Value) -> Value {
        v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"].clone()
    }

    #[test]
    fn nothing_is_rendered_without_global_limits() {
        let v = render("");
        let names: Vec<Value> = hcm(&v)["http_filters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].clone())
            .collect();
        assert!(!names.contains(&json!(global::FILTER)));
        let clusters = v["static_resources"]["clusters"].as_array().unwrap();
        assert!(clusters.iter().all(|c| c["name"] != global::CLUSTER));
    }

    #[test]
    fn the_filter_follows_the_wasm_filter_and_the_service_speaks_http2() {
        let v = render(
            "global_limits: { address: 'rls.internal:8081', domain: d1, timeout_ms: 250, failure_mode: deny }\n",
        );
        let filters = hcm(&v)["http_filters"].as_array().unwrap().clone();
        let names: Vec<&str> = filters.iter().filter_map(|f| f["name"].as_str()).collect();
        assert_eq!(names, ["llmroute", global::FILTER, "envoy.filters.http.router"]);
        let rl = &filters[1]["typed_config"];
        assert_eq!(rl["domain"], "d1");
        assert_eq!(rl["timeout"], "0.250s");
        assert_eq!(rl["failure_mode_deny"], true);
        assert_eq!(rl["status_on_error"]["code"], "ServiceUnavailable");
        let c = v["static_resources"]["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == global::CLUSTER)
            .unwrap()
            .clone();
        assert_eq!(c["type"], "STRICT_DNS");
        let opts = &c["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
        assert!(opts["explicit_http_config"]["http2_protocol_options"].is_object());
        let allow = render("global_limits: { address: '127.0.0.1:8081' }\n");
        let rl = &hcm(&allow)["http_filters"][1]["typed_config"];
        assert_eq!(rl["failure_mode_deny"], false);
        assert_eq!(rl["domain"], "llmroute");
    }

    #[test]
    fn descriptors_read_only_the_filters_headers_and_tokens_are_charged_when_the_stream_is_done() {
        let v = render("global_limits: { address: '127.0.0.1:8081' }\n");
        let limits = hcm(&v)["http_filters"][1]["typed_config"]["rate_limits"].clone();
        assert!(hcm(&v)["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
            .get("rate_limits")
            .is_none());
        let limits = limits.as_array().unwrap();
        assert_eq!(limits.len(), 6);
        for l in limits {
            let headers: Vec<&str> = l["actions"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|a| a["request_headers"]["header_name"].as_str())
                .collect();
            assert!(
                headers == [global::ALIAS_HEADER] || headers == [global::KEY_HEADER],
                "{l}"
            );
        }
        let done: Vec<&Value> = limits.iter().filter(|l| l["apply_on_stream_done"] == true).collect();
        assert_eq!(done.len(), 2);
        for l in done {
            assert_eq!(l["actions"][0]["generic_key"]["descriptor_value"], global::TOKENS);
            assert_eq!(
                l["hits_addend"]["format"],
                "%FILTER_STATE(wasm.llmroute.tokens_charged:PLAIN)%"
            );
        }
        let peeks = limits.iter().filter(|l| l["hits_addend"]["number"] == 0).count();
        assert_eq!(peeks, 2);
    }

    /// The shipped envoyproxy/ratelimit example speaks the descriptors rendered here.
    #[test]
    fn the_shipped_ratelimit_config_uses_the_rendered_descriptors() {
        let doc: Value = serde_yaml_ng::from_str(include_str!("../../ratelimit/config.yaml")).unwrap();
        let cfg =
            llmroute_core::load_document(&format!("{DOC}global_limits: {{ address: '127.0.0.1:8081' }}\n")).unwrap();
        let domain = cfg.config.global_limits.map(|g| g.domain);
        assert_eq!(
            doc["domain"].as_str(),
            domain.as_deref(),
            "the default global_limits.domain"
        );
        let top = doc["descriptors"].as_array().unwrap();
        let kinds: Vec<&str> = top.iter().filter_map(|d| d["value"].as_str()).collect();
        assert_eq!(kinds, [global::REQUESTS, global::TOKENS]);
        for d in top {
            assert_eq!(d["key"], global::KIND);
            for inner in d["descriptors"].as_array().unwrap() {
                let key = inner["key"].as_str().unwrap();
                assert!(key == global::ALIAS || key == global::KEY, "{inner}");
                let unit = inner["rate_limit"]["unit"].as_str().unwrap();
                assert!(["second", "minute", "hour", "day"].contains(&unit), "{inner}");
                assert!(
                    inner["rate_limit"]["requests_per_unit"].as_u64().unwrap() > 0,
                    "{inner}"
                );
            }
        }
    }
}
