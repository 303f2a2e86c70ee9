//! Endpoint classification, the `/v1/models` answers in both shapes, and header hygiene.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{sdk_api, sdk_headers, sdk_meta, two_backends, SDK_NAMES};
use llmroute_core::headers::{
    must_strip, to_strip, AFFINITY, AFFINITY_SOURCE, CLUSTER, ERROR, INPUT_TOKENS, REQUEST_ID, SESSION_ECHO,
    TOKEN_ESTIMATE, UPSTREAM,
};
use llmroute_core::json::JsonError;
use llmroute_core::models;
use llmroute_core::{classify, Api, Config, Endpoint, Envelope, GatewayError};
use serde_json::{json, Value};

const CHAT: Endpoint = Endpoint::Inference(Api::Chat);

fn list_body(cfg: &Config) -> Vec<u8> {
    models::list_body(cfg, Envelope::OpenAi, "").unwrap()
}

fn get_body(cfg: &Config, id: &str) -> Result<Vec<u8>, GatewayError> {
    models::get_body(cfg, Envelope::OpenAi, id)
}

fn envelope(e: &GatewayError) -> Value {
    serde_json::from_slice(&e.openai_body()).unwrap()
}

// ---------------------------------------------------------------------------------------------------------------
// classify

#[test]
fn every_inference_api_is_post_only() {
    for (api, path) in [
        (Api::Chat, "/v1/chat/completions"),
        (Api::Completions, "/v1/completions"),
        (Api::Responses, "/v1/responses"),
        (Api::Embeddings, "/v1/embeddings"),
        (Api::Messages, "/v1/messages"),
        (Api::Decisions, "/v1/decisions"),
        (Api::SystemOne, "/v1/systemone"),
    ] {
        assert_eq!(api.path(), path);
        assert_eq!(classify("POST", path), Ok(Endpoint::Inference(api)));
        for method in ["GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "post"] {
            let e = classify(method, path).unwrap_err();
            assert_eq!(e.status(), 405, "{method} {path}");
            assert_eq!(e.code(), "method_not_allowed");
            assert_eq!(e.headers(), vec![("allow", "POST")], "{method}");
        }
    }
}

#[test]
fn api_names_and_envelopes() {
    let names: Vec<&str> = Api::ALL.iter().map(|a| a.name()).collect();
    assert_eq!(
        names,
        [
            "chat",
            "completions",
            "responses",
            "embeddings",
            "messages",
            "decisions",
            "systemone"
        ]
    );
    assert_eq!(Api::NAMES, names.join(", "));
    for api in Api::ALL {
        assert_eq!(Api::parse(api.name()), Some(api));
        let want = match api {
            Api::Messages => Envelope::Anthropic,
            Api::SystemOne => Envelope::SystemOne,
            _ => Envelope::OpenAi,
        };
        assert_eq!(api.envelope(), want);
    }
    for bad in ["Chat", "chat_completions", "message", "", "models"] {
        assert_eq!(Api::parse(bad), None, "{bad}");
    }
}

#[test]
fn models_endpoints_allow_get_and_head() {
    assert_eq!(classify("GET", "/v1/models"), Ok(Endpoint::ListModels));
    assert_eq!(classify("HEAD", "/v1/models"), Ok(Endpoint::ListModels));
    assert_eq!(
        classify("GET", "/v1/models/local-chat"),
        Ok(Endpoint::GetModel("local-chat".into()))
    );
    assert_eq!(classify("HEAD", "/v1/models/x"), Ok(Endpoint::GetModel("x".into())));
    for method in ["POST", "DELETE", "get"] {
        let e = classify(method, "/v1/models").unwrap_err();
        assert_eq!((e.status(), e.headers()), (405, vec![("allow", "GET")]), "{method}");
        let e = classify(method, "/v1/models/local-chat").unwrap_err();
        assert_eq!(e.status(), 405, "{method}");
    }
}

#[test]
fn model_ids_may_contain_slashes() {
    assert_eq!(
        classify("GET", "/v1/models/Qwen/Qwen3-32B"),
        Ok(Endpoint::GetModel("Qwen/Qwen3-32B".into()))
    );
}

#[test]
fn query_and_fragment_are_ignored() {
    assert_eq!(classify("POST", "/v1/chat/completions?api-version=1"), Ok(CHAT));
    assert_eq!(classify("POST", "/v1/chat/completions#x"), Ok(CHAT));
    assert_eq!(
        classify("POST", "/v1/messages?beta=true"),
        Ok(Endpoint::Inference(Api::Messages))
    );
    assert_eq!(classify("GET", "/v1/models?limit=1&after=a"), Ok(Endpoint::ListModels));
    assert_eq!(classify("GET", "/v1/models/m?x=1"), Ok(Endpoint::GetModel("m".into())));
    assert_eq!(classify("GET", "/v1/models/m#frag"), Ok(Endpoint::GetModel("m".into())));
}

#[test]
fn unknown_paths_are_404_unknown_url() {
    for path in [
        "",
        "/",
        "/v1",
        "/v1/",
        "/v1/chat",
        "/v1/chat/completions/",
        "/V1/chat/completions",
        "/v1/Chat/Completions",
        "//v1/chat/completions",
        "/v2/chat/completions",
        "/v1/models/",
        "/v1/models/?x",
        "/v1/completions/",
        "/v1/embedding",
        "/v1/responses/resp_1",
        "/v1/messages/count_tokens",
        "/v1/Messages",
        "/health",
        "v1/chat/completions",
    ] {
        let e = classify("POST", path).unwrap_err();
        assert_eq!((e.status(), e.code()), (404, "unknown_url"), "{path:?}");
        assert!(e.headers().is_empty());
    }
}

#[test]
fn not_found_reports_the_path_without_its_query() {
    let e = classify("GET", "/nope?secret=1").unwrap_err();
    assert_eq!(
        e,
        GatewayError::NotFound {
            method: "GET".into(),
            path: "/nope".into()
        }
    );
    assert_eq!(e.to_string(), "Invalid URL (GET /nope).");
    let v = envelope(&e);
    assert_eq!(
        v,
        json!({ "error": {
            "message": "Invalid URL (GET /nope).",
            "type": "invalid_request_error",
            "param": null,
            "code": "unknown_url"
        }, "request_id": null })
    );
}

#[test]
fn method_not_allowed_message_and_envelope() {
    let e = classify("GET", "/v1/chat/completions?x=1").unwrap_err();
    assert_eq!(
        e,
        GatewayError::MethodNotAllowed {
            method: "GET".into(),
            path: "/v1/chat/completions".into(),
            allow: "POST"
        }
    );
    assert_eq!(
        e.to_string(),
        "Method GET is not allowed on /v1/chat/completions; use POST."
    );
    let v = envelope(&e);
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], "method_not_allowed");
    assert_eq!(v["error"]["param"], Value::Null);
}

#[test]
fn long_paths_are_quoted_bounded() {
    let path = format!("/{}", "p".repeat(5000));
    let e = classify("GET", &path).unwrap_err();
    assert!(e.to_string().len() < 200, "{}", e.to_string().len());
}

#[test]
fn endpoint_names() {
    for api in Api::ALL {
        assert_eq!(Endpoint::Inference(api).name(), api.name());
    }
    assert_eq!(Endpoint::ListModels.name(), "models");
    assert_eq!(Endpoint::GetModel("m".into()).name(), "models");
}

#[test]
fn captured_requests_classify_by_their_recorded_path() {
    for name in SDK_NAMES {
        let meta = sdk_meta(name);
        let got = classify(meta["method"].as_str().unwrap(), meta["path"].as_str().unwrap());
        assert_eq!(got, Ok(Endpoint::Inference(sdk_api(name))), "{name}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// /v1/models

#[test]
fn list_body_lists_aliases_in_config_order() {
    let v: Value = serde_json::from_slice(&list_body(&two_backends())).unwrap();
    let model = |id: &str| json!({ "id": id, "object": "model", "created": 0, "owned_by": "llmroute" });
    assert_eq!(
        v,
        json!({
            "object": "list",
            "data": [model("local-chat"), model("big"), model("same"), model("embedder")]
        })
    );
}

#[test]
fn list_body_never_names_upstream_models_or_backends() {
    let body = String::from_utf8(list_body(&two_backends())).unwrap();
    for hidden in [
        "qwen3-0.6b",
        "Qwen/Qwen3-32B",
        "bge-m3",
        "llama-a",
        "vllm-b",
        "127.0.0.1",
    ] {
        assert!(!body.contains(hidden), "{hidden} leaked: {body}");
    }
}

#[test]
fn readme_example_lists_one_model() {
    let cfg = common::config(common::README_EXAMPLE);
    let v: Value = serde_json::from_slice(&list_body(&cfg)).unwrap();
    assert_eq!(v["data"].as_array().unwrap().len(), 1);
    assert_eq!(v["data"][0]["id"], "local-chat");
}

#[test]
fn get_body_returns_one_model_object() {
    let v: Value = serde_json::from_slice(&get_body(&two_backends(), "big").unwrap()).unwrap();
    assert_eq!(
        v,
        json!({ "id": "big", "object": "model", "created": 0, "owned_by": "llmroute" })
    );
}

#[test]
fn get_body_of_an_unknown_model_is_404() {
    for id in ["gpt-4o", "qwen3-0.6b", "Local-Chat", ""] {
        let e = get_body(&two_backends(), id).unwrap_err();
        assert_eq!(e, GatewayError::UnknownModel { model: id.into() });
        assert_eq!(
            (e.status(), e.code(), e.param()),
            (404, "model_not_found", Some("model"))
        );
        assert_eq!(envelope(&e)["error"]["type"], "invalid_request_error");
        let v: Value = serde_json::from_slice(&e.body(Envelope::Anthropic, Some("r"))).unwrap();
        assert_eq!(v["error"]["type"], "not_found_error");
    }
}

#[test]
fn classify_then_get_round_trip() {
    let cfg = two_backends();
    let Ok(Endpoint::GetModel(id)) = classify("GET", "/v1/models/embedder?x=1") else {
        panic!("not GetModel")
    };
    let v: Value = serde_json::from_slice(&get_body(&cfg, &id).unwrap()).unwrap();
    assert_eq!(v["id"], "embedder");
}

// ---------------------------------------------------------------------------------------------------------------
// /v1/models in Anthropic's shape

/// A config with `n` aliases `m00`, `m01`, ...
fn many(n: usize) -> Config {
    let models: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"name":"m{i:02}","routes":[{{"backend":"b"}}]}}"#))
        .collect();
    common::config(&format!(
        r#"{{"version":1,"backends":[{{"name":"b","kind":"vllm","endpoints":["10.0.0.1:80"]}}],"models":[{}]}}"#,
        models.join(",")
    ))
}

fn anthropic_list(cfg: &Config, query: &str) -> Value {
    serde_json::from_slice(&models::list_body(cfg, Envelope::Anthropic, query).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<String> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

fn names(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i:02}")).collect()
}

/// Asserts an Anthropic model object: `type`, `id`, `display_name` (the alias) and a fixed `created_at`. Other
/// fields Anthropic's shape has may be present too.
fn assert_anthropic_model(v: &Value, id: &str) {
    assert_eq!(v["type"], "model", "{v}");
    assert_eq!(v["id"], id, "{v}");
    assert_eq!(v["display_name"], id, "{v}");
    assert_eq!(v["created_at"], "1970-01-01T00:00:00Z", "{v}");
}

#[test]
fn anthropic_list_shape() {
    let v = anthropic_list(&two_backends(), "");
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["data", "first_id", "has_more", "last_id"]);
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 4);
    for (m, id) in data.iter().zip(["local-chat", "big", "same", "embedder"]) {
        assert_anthropic_model(m, id);
    }
    assert_eq!(
        (v["has_more"].as_bool(), v["first_id"].as_str(), v["last_id"].as_str()),
        (Some(false), Some("local-chat"), Some("embedder"))
    );
    // Never an upstream name or a backend.
    let text = v.to_string();
    for hidden in ["qwen3-0.6b", "Qwen/Qwen3-32B", "bge-m3", "llama-a", "vllm-b"] {
        assert!(!text.contains(hidden), "{hidden} leaked: {text}");
    }
}

#[test]
fn anthropic_list_pages_by_20_by_default() {
    let cfg = many(45);
    let v = anthropic_list(&cfg, "");
    assert_eq!(ids(&v), names(0..20));
    assert_eq!(
        (v["has_more"].as_bool(), v["first_id"].as_str(), v["last_id"].as_str()),
        (Some(true), Some("m00"), Some("m19"))
    );
    let v = anthropic_list(&cfg, "after_id=m19");
    assert_eq!(ids(&v), names(20..40));
    let v = anthropic_list(&cfg, "after_id=m39");
    assert_eq!(ids(&v), names(40..45));
    assert_eq!(v["has_more"], false);
}

#[test]
fn anthropic_list_walks_forward_and_back() {
    let cfg = many(10);
    let mut seen = Vec::new();
    let mut query = "limit=3".to_string();
    loop {
        let v = anthropic_list(&cfg, &query);
        seen.extend(ids(&v));
        if v["has_more"] == false {
            break;
        }
        query = format!("limit=3&after_id={}", v["last_id"].as_str().unwrap());
    }
    assert_eq!(seen, names(0..10));
    let v = anthropic_list(&cfg, "limit=3&before_id=m05");
    assert_eq!((ids(&v), v["has_more"].as_bool()), (names(2..5), Some(true)));
    let v = anthropic_list(&cfg, "limit=3&before_id=m02");
    assert_eq!((ids(&v), v["has_more"].as_bool()), (names(0..2), Some(false)));
    let v = anthropic_list(&cfg, "limit=1000");
    assert_eq!((ids(&v).len(), v["has_more"].as_bool()), (10, Some(false)));
}

#[test]
fn anthropic_list_bad_paging_is_400_invalid_query() {
    let cfg = many(3);
    for (query, param) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=-1", "limit"),
        ("limit=abc", "limit"),
        ("limit=", "limit"),
        ("limit=2.5", "limit"),
        ("after_id=nope", "after_id"),
        ("before_id=nope", "before_id"),
    ] {
        let e = models::list_body(&cfg, Envelope::Anthropic, query).unwrap_err();
        assert_eq!(
            (e.status(), e.code(), e.param()),
            (400, "invalid_query", Some(param)),
            "{query}"
        );
        let v: Value = serde_json::from_slice(&e.body(Envelope::Anthropic, Some("r"))).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
}

#[test]
fn anthropic_paging_values_are_percent_decoded() {
    let cfg = common::config(
        r#"{"version":1,"backends":[{"name":"b","kind":"vllm","endpoints":["10.0.0.1:80"]}],
            "models":[{"name":"org/a","routes":[{"backend":"b"}]},{"name":"org/b","routes":[{"backend":"b"}]}]}"#,
    );
    let v = anthropic_list(&cfg, "after_id=org%2Fa");
    assert_eq!(ids(&v), ["org/b"]);
    let v = anthropic_list(&cfg, "limit=%31");
    assert_eq!(ids(&v), ["org/a"]);
}

#[test]
fn openai_list_ignores_the_query() {
    let cfg = many(30);
    for query in ["", "limit=0", "after_id=nope", "garbage"] {
        let v: Value = serde_json::from_slice(&models::list_body(&cfg, Envelope::OpenAi, query).unwrap()).unwrap();
        assert_eq!(v["data"].as_array().unwrap().len(), 30, "{query}");
        assert_eq!(v["object"], "list");
    }
}

#[test]
fn anthropic_get_model_and_its_404() {
    let cfg = two_backends();
    let v: Value = serde_json::from_slice(&models::get_body(&cfg, Envelope::Anthropic, "big").unwrap()).unwrap();
    assert_anthropic_model(&v, "big");
    assert!(v.get("object").is_none(), "not the OpenAI shape: {v}");
    let e = models::get_body(&cfg, Envelope::Anthropic, "claude-9").unwrap_err();
    assert_eq!((e.status(), e.code()), (404, "model_not_found"));
    let v: Value = serde_json::from_slice(&e.body(Envelope::Anthropic, Some("req_1"))).unwrap();
    assert_eq!(
        v,
        json!({
            "type": "error",
            "error": { "type": "not_found_error", "message": "The model `claude-9` does not exist or is not served by this gateway." },
            "request_id": "req_1"
        })
    );
}

#[test]
fn get_model_ids_are_percent_decoded() {
    let cfg = common::config(
        r#"{"version":1,"backends":[{"name":"b","kind":"vllm","endpoints":["10.0.0.1:80"]}],
            "models":[{"name":"org/model","routes":[{"backend":"b"}]}]}"#,
    );
    for id in ["org/model", "org%2Fmodel", "org%2fmodel"] {
        let v: Value = serde_json::from_slice(&get_body(&cfg, id).unwrap()).unwrap();
        assert_eq!(v["id"], "org/model", "{id}");
    }
    assert_eq!(
        get_body(&cfg, "org%2Fother").unwrap_err(),
        GatewayError::UnknownModel {
            model: "org/other".into()
        }
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Headers

#[test]
fn gateway_header_names() {
    assert_eq!(CLUSTER, "x-llmroute-cluster");
    assert_eq!(AFFINITY, "x-llmroute-affinity");
    assert_eq!(AFFINITY_SOURCE, "x-llmroute-affinity-source");
    assert_eq!(UPSTREAM, "x-llmroute-upstream");
    assert_eq!(ERROR, "x-llmroute-error");
    assert_eq!(INPUT_TOKENS, "x-input-tokens");
    assert_eq!(TOKEN_ESTIMATE, "x-token-estimate");
    assert_eq!(SESSION_ECHO, "x-multi-turn-session-id");
    assert_eq!(REQUEST_ID, "x-request-id");
}

#[test]
fn client_copies_of_the_token_headers_are_stripped() {
    for name in [INPUT_TOKENS, TOKEN_ESTIMATE, "X-Input-Tokens", "X-TOKEN-ESTIMATE"] {
        assert!(must_strip(name), "{name}");
    }
    for name in ["x-input-token", "x-token-estimates", "x-output-tokens"] {
        assert!(!must_strip(name), "{name}");
    }
}

#[test]
fn cookies_are_stripped() {
    for name in ["cookie", "Cookie", "COOKIE"] {
        assert!(must_strip(name), "{name}");
    }
    assert!(!must_strip("set-cookie"));
    assert!(!must_strip("cookie2x"));
}

#[test]
fn the_session_echo_and_request_id_headers_are_not_stripped() {
    // Clients send these; they are read (session) or kept (request id), never removed.
    assert!(!must_strip(SESSION_ECHO));
    assert!(!must_strip(REQUEST_ID));
}

#[test]
fn anthropic_and_trace_headers_are_kept() {
    for name in [
        "anthropic-version",
        "anthropic-beta",
        "traceparent",
        "tracestate",
        "baggage",
        "Traceparent",
    ] {
        assert!(!must_strip(name), "{name}");
    }
}

#[test]
fn every_gateway_header_is_stripped_from_clients() {
    for name in [CLUSTER, AFFINITY, AFFINITY_SOURCE, UPSTREAM, ERROR] {
        assert!(must_strip(name), "{name}");
        assert!(must_strip(&name.to_ascii_uppercase()), "{name}");
    }
}

#[test]
fn the_whole_x_llmroute_namespace_is_stripped() {
    for name in [
        "x-llmroute-",
        "x-llmroute-anything",
        "X-LLMROUTE-Cluster",
        "x-LlmRoute-future-header",
    ] {
        assert!(must_strip(name), "{name}");
    }
    for name in [
        "x-llmroute",
        "x-llmroutex-cluster",
        "llmroute-cluster",
        "x-llm-route-cluster",
        "xx-llmroute-a",
    ] {
        assert!(!must_strip(name), "{name}");
    }
}

#[test]
fn client_credentials_are_stripped() {
    for name in [
        "authorization",
        "Authorization",
        "AUTHORIZATION",
        "proxy-authorization",
        "Proxy-Authorization",
        "x-api-key",
        "X-Api-Key",
        "api-key",
        "Api-Key",
    ] {
        assert!(must_strip(name), "{name}");
    }
}

#[test]
fn other_headers_are_kept() {
    for name in [
        "content-type",
        "accept",
        "x-session-id",
        "x-claude-code-session-id",
        "anthropic-version",
        "anthropic-beta",
        "openai-organization",
        "x-stainless-os",
        "user-agent",
        ":path",
        ":authority",
        "authorization-extra",
        "x-authorization",
        "x-api-keys",
        "",
    ] {
        assert!(!must_strip(name), "{name}");
    }
}

#[test]
fn to_strip_keeps_request_order_and_duplicates() {
    let names = [
        "content-type",
        "X-LLMRoute-Cluster",
        "authorization",
        "accept",
        "x-llmroute-cluster",
        "api-key",
    ];
    assert_eq!(
        to_strip(names),
        vec!["X-LLMRoute-Cluster", "authorization", "x-llmroute-cluster", "api-key"]
    );
    assert!(to_strip(["a", "b"]).is_empty());
    assert!(to_strip(Vec::<&str>::new()).is_empty());
}

#[test]
fn captured_headers_lose_only_the_credentials() {
    assert_eq!(SDK_NAMES.len(), 10);
    for name in SDK_NAMES {
        let headers = sdk_headers(name);
        let stripped = to_strip(headers.iter().map(|(n, _)| n.as_str()));
        assert_eq!(stripped, ["authorization"], "{name}");
        // What stays includes every SDK telemetry and Anthropic header.
        let kept: Vec<&str> = headers
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| !must_strip(n))
            .collect();
        assert_eq!(kept.len(), headers.len() - 1, "{name}");
        assert!(kept.contains(&"x-stainless-lang"), "{name}");
    }
}

#[test]
fn claude_code_capture_keeps_its_session_and_beta_headers() {
    let headers = sdk_headers("messages-tools-image-thinking-cache-control-claude-code");
    for wanted in ["x-claude-code-session-id", "anthropic-beta", "anthropic-version"] {
        assert!(headers.iter().any(|(n, _)| n == wanted), "{wanted}");
        assert!(!must_strip(wanted), "{wanted}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Error envelopes and statuses

#[test]
fn every_error_variant_has_its_status_code_and_param() {
    let cases: Vec<(GatewayError, u32, &str, Option<&str>)> = vec![
        (GatewayError::InvalidJson(JsonError::Empty), 400, "invalid_json", None),
        (
            GatewayError::InvalidJson(JsonError::TooDeep { limit: 64 }),
            400,
            "json_too_deep",
            None,
        ),
        (
            GatewayError::InvalidJson(JsonError::NotAnObject {
                found: llmroute_core::json::Kind::Array,
            }),
            400,
            "body_not_object",
            None,
        ),
        (GatewayError::BodyTooLarge { limit: 1024 }, 413, "body_too_large", None),
        (
            GatewayError::UnsupportedMediaType {
                header: "content-type",
                value: "text/plain".into(),
            },
            415,
            "unsupported_media_type",
            Some("content-type"),
        ),
        (
            GatewayError::EndpointNotServed {
                model: "m".into(),
                api: Api::Embeddings,
            },
            404,
            "endpoint_not_served",
            Some("model"),
        ),
        (
            GatewayError::InvalidQuery {
                param: "limit",
                reason: "must be an integer from 1 to 1000",
            },
            400,
            "invalid_query",
            Some("limit"),
        ),
        (
            GatewayError::MissingField { field: "model" },
            400,
            "missing_field",
            Some("model"),
        ),
        (
            GatewayError::InvalidField {
                field: "messages",
                reason: "r".into(),
            },
            400,
            "invalid_field",
            Some("messages"),
        ),
        (
            GatewayError::DuplicateField { field: "stream" },
            400,
            "duplicate_field",
            Some("stream"),
        ),
        (
            GatewayError::UnknownModel { model: "x".into() },
            404,
            "model_not_found",
            Some("model"),
        ),
        (
            GatewayError::InvalidSessionHeader {
                header: "x-session-id".into(),
                reason: "r",
            },
            400,
            "invalid_session_header",
            Some("x-session-id"),
        ),
        (
            GatewayError::MethodNotAllowed {
                method: "GET".into(),
                path: "/p".into(),
                allow: "POST",
            },
            405,
            "method_not_allowed",
            None,
        ),
        (
            GatewayError::NotFound {
                method: "GET".into(),
                path: "/p".into(),
            },
            404,
            "unknown_url",
            None,
        ),
    ];
    for (e, status, code, param) in cases {
        assert_eq!((e.status(), e.code(), e.param()), (status, code, param), "{e:?}");
        let v = envelope(&e);
        assert_eq!(v["error"]["code"], code);
        assert_eq!(v["error"]["param"], param.map_or(Value::Null, Value::from));
        assert_eq!(v["error"]["message"], e.to_string());
        assert!(e.to_string().ends_with('.'), "{e}");
    }
}

#[test]
fn body_too_large_message() {
    let e = GatewayError::BodyTooLarge { limit: 8_388_608 };
    assert_eq!(
        e.to_string(),
        "The request body exceeds the gateway limit of 8388608 bytes."
    );
    assert_eq!(envelope(&e)["error"]["type"], "invalid_request_error");
}

#[test]
fn quoted_model_is_cut_on_a_character_boundary() {
    let e = GatewayError::UnknownModel {
        model: format!("a{}", "€".repeat(100)),
    };
    let msg = e.to_string();
    // 1 + 42 * 3 = 127 bytes fit in 128; the 43rd euro sign would not.
    assert!(msg.contains(&format!("`a{}`", "€".repeat(42))), "{msg}");
}

#[test]
fn envelope_escapes_client_strings() {
    let e = GatewayError::UnknownModel {
        model: "a\"b\\c\n</script>".into(),
    };
    let v = envelope(&e);
    assert!(v["error"]["message"].as_str().unwrap().contains("a\"b\\c\n</script>"));
}
