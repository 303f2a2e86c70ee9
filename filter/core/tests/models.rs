//! The `/v1/models` answers, in the OpenAI and the Anthropic shapes, with paging and percent-decoded ids.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::two_backends;
use llmroute_core::models;
use llmroute_core::{classify, Config, Endpoint, Envelope, GatewayError};
use serde_json::{json, Value};

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
    let cfg = common::document(common::README_EXAMPLE);
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
