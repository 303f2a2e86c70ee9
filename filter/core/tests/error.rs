//! Error envelopes and statuses: every gateway error's status, code and param, in each API's envelope.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use llmroute_core::json::JsonError;
use llmroute_core::{Api, GatewayError};
use serde_json::Value;

fn envelope(e: &GatewayError) -> Value {
    serde_json::from_slice(&e.openai_body()).unwrap()
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
