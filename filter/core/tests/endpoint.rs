//! Endpoint classification: which API a method and path name, and the 404/405 answers for the rest.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{sdk_api, sdk_meta, SDK_NAMES};
use llmroute_core::{classify, Api, Endpoint, Envelope, GatewayError};
use serde_json::{json, Value};

const CHAT: Endpoint = Endpoint::Inference(Api::Chat);

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
