//! The listener's edge settings: what bounds a slow or abusive client, and how Envoy's own errors reach one.
//!
//! - `request_headers_timeout` (`limits.headers_timeout_ms`, 60 s): a client that trickles its headers is cut.
//! - `request_timeout` (`limits.body_timeout_ms`, 120 s): the whole request must arrive in time, or 408. Envoy
//!   disarms it once the request is in, so it never cuts a long generation (the route timeout does that).
//! - `stream_idle_timeout` and the connection `idle_timeout` (`limits.stream_idle_timeout_ms`, 300 s): a stream
//!   or connection on which nothing moves is closed.
//! - HTTP/2 `max_concurrent_streams` (`limits.max_concurrent_streams`, 100) and 64 KiB stream / 1 MiB
//!   connection windows (Envoy's defaults are unbounded streams and 256 MiB windows): one connection cannot
//!   hold thousands of buffered bodies.
//! - `headers_with_underscores_action: DROP_HEADER`: `x_llmroute_cluster` can never alias `x-llmroute-cluster`
//!   at a server that folds underscores into dashes.
//! - `use_remote_address`: the client's real address goes into `x-forwarded-for`, and a client's `x-envoy-*`
//!   control headers (retries, timeouts) are stripped, never honoured; `preserve_external_request_id` keeps a
//!   client's own `x-request-id`, as before.
//! - The overload manager's fixed-heap monitor (`limits.max_heap_bytes`, 2 GiB): at 95% Envoy shrinks its heap, at
//!   98% it refuses new requests (503) instead of running out of memory.
//! - `local_reply_config`: each of Envoy's own replies (no healthy host, connect failure, timeout, codec error,
//!   buffer overflow, circuit-breaker overflow) gets a JSON body in the route's envelope (Anthropic on
//!   `/v1/messages`, OpenAI elsewhere) with the request id (also in `request-id` on `/v1/messages`, where
//!   Anthropic SDKs read it), and its code in `x-llmroute-error`. Replies the
//!   filter sent itself carry the request header [`contract::LOCAL_REPLY`] and are left as they are.

use llmroute_core::anthropic::REQUEST_ID_HEADER;
use llmroute_core::config::Document;
use llmroute_core::endpoint::{Api, Envelope};
use llmroute_core::envoy_contract as contract;
use llmroute_core::error::{envoy_fallback, system_one, EnvoyReply, ENVOY_REPLIES};
use serde_json::{json, Map, Value};

use super::json::duration_ms;

/// HTTP/2 windows: Envoy's recommended edge values.
pub const STREAM_WINDOW: u32 = 64 * 1024;
pub const CONNECTION_WINDOW: u32 = 1024 * 1024;

/// The connection manager's edge fields, to merge into its `typed_config`.
pub fn hcm_fields(cfg: &Document) -> Map<String, Value> {
    let l = &cfg.limits;
    let v = json!({
        "request_headers_timeout": duration_ms(l.headers_timeout_ms),
        "request_timeout": duration_ms(l.body_timeout_ms),
        "stream_idle_timeout": duration_ms(l.stream_idle_timeout_ms),
        "use_remote_address": true,
        // With use_remote_address, Envoy would replace every client's x-request-id; keep a client's own.
        "preserve_external_request_id": true,
        "common_http_protocol_options": {
            "idle_timeout": duration_ms(l.stream_idle_timeout_ms),
            "headers_with_underscores_action": "DROP_HEADER",
        },
        "http2_protocol_options": {
            "max_concurrent_streams": l.max_concurrent_streams,
            "initial_stream_window_size": STREAM_WINDOW,
            "initial_connection_window_size": CONNECTION_WINDOW,
        },
        "local_reply_config": local_reply_config(),
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The bootstrap's overload manager: a fixed heap budget, shrink at 95%, refuse new requests at 98%.
pub fn overload_manager(cfg: &Document) -> Value {
    const MONITOR: &str = "envoy.resource_monitors.fixed_heap";
    let trigger =
        |name: &str, at: f64| json!({ "name": name, "triggers": [{ "name": MONITOR, "threshold": { "value": at } }] });
    json!({
        "refresh_interval": "0.25s",
        "resource_monitors": [{
            "name": MONITOR,
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig",
                "max_heap_size_bytes": cfg.limits.max_heap_bytes,
            },
        }],
        "actions": [
            trigger("envoy.overload_actions.shrink_heap", 0.95),
            trigger("envoy.overload_actions.stop_accepting_requests", 0.98),
        ],
    })
}

/// One mapper per reply kind and envelope (Anthropic first, since the OpenAI one matches every path), then the
/// 4xx and 5xx fallbacks. No top-level `body_format`: a reply no mapper matches (the filter's own, and its
/// 200s) keeps its body and content type.
fn local_reply_config() -> Value {
    let mut mappers = Vec::new();
    let fallbacks = [
        (
            envoy_fallback(true),
            json!([status_is("GE", 400), status_is("LE", 499)]),
        ),
        (envoy_fallback(false), json!([status_is("GE", 500)])),
    ];
    let specific = ENVOY_REPLIES.iter().map(|r| {
        let mut conds = vec![status_is("EQ", r.status)];
        if let Some(flag) = r.response_flag {
            conds.push(json!({ "response_flag_filter": { "flags": [flag] } }));
        }
        (*r, Value::from(conds))
    });
    for (reply, conds) in specific.chain(fallbacks) {
        // The OpenAI mapper matches every path, so it comes last.
        for (envelope, path) in [
            (Envelope::Anthropic, Some(Api::Messages.path())),
            (Envelope::SystemOne, Some(Api::SystemOne.path())),
            (Envelope::OpenAi, None),
        ] {
            let mut all = conds.as_array().cloned().unwrap_or_default();
            all.push(not_the_filters_own());
            if let Some(prefix) = path {
                all.push(json!({ "header_filter": { "header": {
                    "name": ":path", "string_match": { "prefix": prefix },
                } } }));
            }
            mappers.push(mapper(&reply, envelope, all));
        }
    }
    json!({ "mappers": mappers })
}

fn status_is(op: &str, status: u16) -> Value {
    json!({ "status_code_filter": { "comparison": {
        "op": op,
        "value": { "default_value": status, "runtime_key": format!("llmroute.local_reply.{op}_{status}") },
    } } })
}

fn not_the_filters_own() -> Value {
    json!({ "header_filter": { "header": { "name": contract::LOCAL_REPLY, "present_match": true, "invert_match": true } } })
}

fn mapper(r: &EnvoyReply, envelope: Envelope, conditions: Vec<Value>) -> Value {
    let request_id = format!("%REQ({})%", contract::REQUEST_ID);
    let anthropic = envelope == Envelope::Anthropic;
    let body = match envelope {
        Envelope::Anthropic => json!({
            "type": "error",
            "error": { "type": r.anthropic_type, "message": r.message },
            "request_id": request_id,
        }),
        Envelope::SystemOne => system_one(r.code, r.message, Some(&request_id)),
        Envelope::OpenAi => json!({
            "error": { "message": r.message, "type": r.openai_type, "param": null, "code": r.code },
            "request_id": request_id,
        }),
    };
    let mut headers = vec![json!({
        "header": { "key": contract::ERROR, "value": r.code },
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    })];
    if anthropic {
        // Anthropic SDKs report the request id from `request-id`.
        headers.push(json!({
            "header": { "key": REQUEST_ID_HEADER, "value": request_id },
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }));
    }
    json!({
        "filter": { "and_filter": { "filters": conditions } },
        "headers_to_add": headers,
        "body_format_override": { "json_format": body },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::render::testing::one_backend as cfg;

    #[test]
    fn defaults_cut_slow_headers_at_60_s_and_slow_bodies_at_120_s() {
        let f = hcm_fields(&cfg(""));
        assert_eq!(f["request_headers_timeout"], "60.000s");
        assert_eq!(f["request_timeout"], "120.000s");
        assert_eq!(f["stream_idle_timeout"], "300.000s");
        assert_eq!(f["common_http_protocol_options"]["idle_timeout"], "300.000s");
        assert_eq!(
            f["common_http_protocol_options"]["headers_with_underscores_action"],
            "DROP_HEADER"
        );
        assert_eq!(f["use_remote_address"], true);
        assert_eq!(f["preserve_external_request_id"], true);
        let h2 = &f["http2_protocol_options"];
        assert_eq!(h2["max_concurrent_streams"], 100);
        assert_eq!(h2["initial_stream_window_size"], 65536);
        assert_eq!(h2["initial_connection_window_size"], 1048576);
    }

    #[test]
    fn limits_set_the_edge_timeouts_and_streams() {
        let c = cfg("limits: { headers_timeout_ms: 1500, body_timeout_ms: 2500, stream_idle_timeout_ms: 4000, max_concurrent_streams: 7 }\n");
        let f = hcm_fields(&c);
        assert_eq!(f["request_headers_timeout"], "1.500s");
        assert_eq!(f["request_timeout"], "2.500s");
        assert_eq!(f["stream_idle_timeout"], "4.000s");
        assert_eq!(f["http2_protocol_options"]["max_concurrent_streams"], 7);
    }

    #[test]
    fn overload_manager_has_a_fixed_heap_budget_with_two_actions() {
        let v = overload_manager(&cfg("limits: { max_heap_bytes: 134217728 }\n"));
        assert_eq!(
            v["resource_monitors"][0]["typed_config"]["max_heap_size_bytes"],
            134217728
        );
        let names: Vec<&str> = v["actions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a["name"].as_str())
            .collect();
        assert_eq!(
            names,
            [
                "envoy.overload_actions.shrink_heap",
                "envoy.overload_actions.stop_accepting_requests"
            ]
        );
        assert_eq!(
            overload_manager(&cfg(""))["resource_monitors"][0]["typed_config"]["max_heap_size_bytes"],
            2u64 << 30
        );
    }

    #[test]
    fn every_local_reply_mapper_skips_the_filters_own_replies() {
        let v = local_reply_config();
        assert!(v.get("body_format").is_none(), "unmatched replies must keep their body");
        let mappers = v["mappers"].as_array().unwrap();
        assert_eq!(mappers.len(), (ENVOY_REPLIES.len() + 2) * 3);
        for m in mappers {
            let filters = m["filter"]["and_filter"]["filters"].as_array().unwrap();
            assert!(filters.contains(&not_the_filters_own()), "{m}");
        }
    }

    #[test]
    fn the_anthropic_mapper_precedes_the_openai_one_for_each_reply() {
        let v = local_reply_config();
        let m = &v["mappers"];
        assert_eq!(m[0]["body_format_override"]["json_format"]["type"], "error");
        assert_eq!(
            m[0]["body_format_override"]["json_format"]["error"]["type"],
            "overloaded_error"
        );
        assert_eq!(
            m[2]["body_format_override"]["json_format"]["error"]["code"],
            "overloaded"
        );
        assert_eq!(m[2]["headers_to_add"][0]["header"]["value"], "overloaded");
        let s1 = &m[1]["body_format_override"]["json_format"];
        assert_eq!(s1["error"]["code"], "overloaded");
        assert_eq!(s1["error"]["request_id"], "%REQ(x-request-id)%");
        assert_eq!(s1["request_id"], "%REQ(x-request-id)%");
        assert_eq!(m[0]["headers_to_add"][1]["header"]["key"], "request-id");
        assert_eq!(m[0]["headers_to_add"][1]["header"]["value"], "%REQ(x-request-id)%");
        assert_eq!(
            m[2]["headers_to_add"].as_array().map(Vec::len),
            Some(1),
            "OpenAI replies have no request-id"
        );
        assert_eq!(
            m[2]["body_format_override"]["json_format"]["request_id"],
            "%REQ(x-request-id)%"
        );
    }
}
