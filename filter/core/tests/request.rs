//! The headers phase (`request::start`): which endpoint, which error envelope, the media-type check and the
//! session header, before any body byte; then the error bodies of both envelopes, with their request ids.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{borrowed, lookup, sdk_api, sdk_headers, sdk_meta, two_backends, two_backends_with_affinity, SDK_NAMES};
use llmroute_core::affinity::explicit;
use llmroute_core::json::{JsonError, Kind};
use llmroute_core::request::{check_media_type, request_id_ok, start, Refusal, RequestStart, REQUEST_ID_MAX};
use llmroute_core::{AffinitySource, Api, Config, Endpoint, Envelope, GatewayError, SessionKey};
use serde_json::{json, Value};

const JSON: (&str, &str) = ("content-type", "application/json");

fn started(cfg: &Config, method: &str, path: &str, headers: &[(&str, &str)]) -> RequestStart {
    match start(cfg, method, path, lookup(headers)) {
        Ok(s) => s,
        Err(r) => panic!("{method} {path} should start: {r:?}"),
    }
}

fn refused(cfg: &Config, method: &str, path: &str, headers: &[(&str, &str)]) -> Refusal {
    match start(cfg, method, path, lookup(headers)) {
        Ok(s) => panic!("{method} {path} should be refused, got {s:?}"),
        Err(r) => r,
    }
}

fn parse(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap()
}

fn sorted_keys(v: &Value) -> Vec<String> {
    let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    keys
}

/// The session key the headers give an alias that reads the top-level `session_headers`.
fn key(cfg: &Config, s: &RequestStart) -> Option<SessionKey> {
    s.session.first(&cfg.affinity.session_headers).unwrap()
}

// ---------------------------------------------------------------------------------------------------------------
// Endpoints and envelopes

#[test]
fn every_inference_path_starts_in_its_own_envelope() {
    let cfg = two_backends();
    for api in Api::ALL {
        let s = started(&cfg, "POST", api.path(), &[JSON]);
        assert_eq!(s.endpoint, Endpoint::Inference(api));
        assert_eq!(s.envelope, api.envelope(), "{}", api.name());
        assert_eq!(key(&cfg, &s), None);
    }
    assert_eq!(
        started(&cfg, "POST", "/v1/messages", &[JSON]).envelope,
        Envelope::Anthropic
    );
    assert_eq!(
        started(&cfg, "POST", "/v1/chat/completions", &[JSON]).envelope,
        Envelope::OpenAi
    );
}

#[test]
fn anthropic_version_does_not_change_an_openai_route() {
    let s = started(
        &two_backends(),
        "POST",
        "/v1/chat/completions",
        &[JSON, ("anthropic-version", "2023-06-01")],
    );
    assert_eq!(s.envelope, Envelope::OpenAi);
}

#[test]
fn messages_errors_are_anthropic_even_before_the_body() {
    let cfg = two_backends();
    for (method, path) in [
        ("GET", "/v1/messages"),
        ("PUT", "/v1/messages?beta=true"),
        ("DELETE", "/v1/messages#x"),
    ] {
        let r = refused(&cfg, method, path, &[JSON]);
        assert_eq!(
            (r.envelope, r.error.status()),
            (Envelope::Anthropic, 405),
            "{method} {path}"
        );
        assert_eq!(r.error.headers(), vec![("allow", "POST")]);
    }
}

#[test]
fn other_405s_and_404s_are_openai() {
    let cfg = two_backends();
    let r = refused(&cfg, "GET", "/v1/chat/completions", &[]);
    assert_eq!((r.envelope, r.error.code()), (Envelope::OpenAi, "method_not_allowed"));
    let r = refused(&cfg, "POST", "/v1/nope", &[JSON]);
    assert_eq!((r.envelope, r.error.code()), (Envelope::OpenAi, "unknown_url"));
    let r = refused(&cfg, "POST", "/v1/messages/", &[JSON]);
    assert_eq!((r.envelope, r.error.code()), (Envelope::OpenAi, "unknown_url"));
}

#[test]
fn models_answer_in_the_anthropic_shape_when_asked() {
    let cfg = two_backends();
    let anthropic = [("anthropic-version", "2023-06-01")];
    assert_eq!(started(&cfg, "GET", "/v1/models", &[]).envelope, Envelope::OpenAi);
    assert_eq!(
        started(&cfg, "GET", "/v1/models", &anthropic).envelope,
        Envelope::Anthropic
    );
    assert_eq!(
        started(&cfg, "HEAD", "/v1/models?limit=2", &anthropic).envelope,
        Envelope::Anthropic
    );
    let s = started(&cfg, "GET", "/v1/models/local-chat", &anthropic);
    assert_eq!(
        (s.endpoint, s.envelope),
        (Endpoint::GetModel("local-chat".into()), Envelope::Anthropic)
    );
    let s = started(&cfg, "GET", "/v1/models/local-chat", &[]);
    assert_eq!(s.envelope, Envelope::OpenAi);
}

#[test]
fn models_need_no_content_type_and_ignore_session_headers() {
    let cfg = two_backends();
    let s = started(
        &cfg,
        "GET",
        "/v1/models",
        &[("content-type", "text/html"), ("x-session-id", "")],
    );
    assert_eq!((key(&cfg, &s), s.endpoint), (None, Endpoint::ListModels));
    let s = started(
        &cfg,
        "GET",
        "/v1/models/x",
        &[("content-encoding", "gzip"), ("x-session-id", "ok")],
    );
    assert_eq!(key(&cfg, &s), None);
}

// ---------------------------------------------------------------------------------------------------------------
// 415

#[test]
fn inference_needs_a_json_content_type() {
    let cfg = two_backends();
    for api in Api::ALL {
        for headers in [
            vec![],
            vec![("content-type", "text/plain")],
            vec![("content-type", "application/x-www-form-urlencoded")],
            vec![("content-type", "multipart/form-data; boundary=x")],
            vec![("content-type", "application/jsonl")],
            vec![("content-type", "")],
        ] {
            let r = refused(&cfg, "POST", api.path(), &headers);
            assert_eq!(r.envelope, api.envelope(), "{} {headers:?}", api.name());
            assert_eq!(
                (r.error.status(), r.error.code(), r.error.param()),
                (415, "unsupported_media_type", Some("content-type"))
            );
        }
    }
}

#[test]
fn inference_refuses_a_content_encoding() {
    let cfg = two_backends();
    for enc in ["gzip", "br", "deflate", "zstd", "gzip, identity"] {
        let r = refused(&cfg, "POST", "/v1/messages", &[JSON, ("content-encoding", enc)]);
        assert_eq!(r.envelope, Envelope::Anthropic);
        assert_eq!(
            r.error,
            GatewayError::UnsupportedMediaType {
                header: "content-encoding",
                value: enc.to_string()
            }
        );
    }
    for enc in ["identity", "IDENTITY", " identity ", ""] {
        started(&cfg, "POST", "/v1/responses", &[JSON, ("content-encoding", enc)]);
    }
}

#[test]
fn json_content_type_variants_are_accepted() {
    let cfg = two_backends();
    for ct in [
        "application/json",
        "Application/JSON",
        "application/json; charset=utf-8",
        " application/json ",
        "application/json;charset=UTF-8",
    ] {
        started(&cfg, "POST", "/v1/chat/completions", &[("content-type", ct)]);
    }
}

#[test]
fn media_type_errors_name_the_header_and_value() {
    let e = check_media_type(Some(b"text/plain"), None).unwrap_err();
    assert_eq!(
        e,
        GatewayError::UnsupportedMediaType {
            header: "content-type",
            value: "text/plain".into()
        }
    );
    assert_eq!(
        e.to_string(),
        "Unsupported content-type `text/plain`; send `application/json` without content encoding."
    );
    let e = check_media_type(None, None).unwrap_err();
    assert_eq!(
        e,
        GatewayError::UnsupportedMediaType {
            header: "content-type",
            value: "(none)".into()
        }
    );
    let e = check_media_type(Some(b"application/json"), Some(b"GZIP")).unwrap_err();
    assert_eq!(e.param(), Some("content-encoding"));
    // A huge header value is quoted bounded.
    let long = format!("text/{}", "x".repeat(5000));
    let msg = check_media_type(Some(long.as_bytes()), None).unwrap_err().to_string();
    assert!(msg.len() < 300, "{}", msg.len());
}

#[test]
fn the_415_comes_before_the_session_header_check() {
    let r = refused(
        &two_backends(),
        "POST",
        "/v1/chat/completions",
        &[("content-type", "text/plain"), ("x-session-id", "")],
    );
    assert_eq!(r.error.status(), 415);
}

// ---------------------------------------------------------------------------------------------------------------
// Session headers in the headers phase

#[test]
fn session_header_is_read_for_inference() {
    let s = started(
        &two_backends(),
        "POST",
        "/v1/chat/completions",
        &[JSON, ("x-multi-turn-session-id", "conv-42")],
    );
    assert_eq!(
        key(&two_backends(), &s),
        Some(SessionKey {
            value: "conv-42".into(),
            affinity: explicit(b"conv-42", AffinitySource::SessionHeader)
        })
    );
    assert_eq!(
        key(&two_backends(), &s).unwrap().affinity.header_value(),
        "ad8ebf05ba1818ab"
    );
}

#[test]
fn session_header_errors_use_the_routes_envelope() {
    let cfg = two_backends();
    for (path, envelope) in [
        ("/v1/chat/completions", Envelope::OpenAi),
        ("/v1/messages", Envelope::Anthropic),
        ("/v1/embeddings", Envelope::OpenAi),
        ("/v1/systemone", Envelope::SystemOne),
    ] {
        let r = refused(&cfg, "POST", path, &[JSON, ("x-claude-code-session-id", "a\tb")]);
        assert_eq!(r.envelope, envelope, "{path}");
        assert_eq!(
            r.error,
            GatewayError::InvalidSessionHeader {
                header: "x-claude-code-session-id".into(),
                reason: "the value contains control characters"
            }
        );
        let body = parse(&r.error.body(r.envelope, Some("req-9")));
        assert_eq!(body["request_id"], "req-9");
        match envelope {
            Envelope::Anthropic => assert_eq!(body["error"]["type"], "invalid_request_error"),
            Envelope::OpenAi => assert_eq!(body["error"]["param"], "x-claude-code-session-id"),
            Envelope::SystemOne => {
                assert_eq!(body["error"]["code"], "invalid_session_header");
                assert_eq!(body["error"]["request_id"], "req-9");
            }
        }
    }
}

#[test]
fn configured_session_headers_are_used() {
    let cfg = two_backends_with_affinity(r#"{ "session_headers": ["x-conv"] }"#);
    let s = started(
        &cfg,
        "POST",
        "/v1/responses",
        &[JSON, ("x-conv", "c1"), ("x-session-id", "ignored")],
    );
    assert_eq!(key(&cfg, &s).map(|k| k.value), Some("c1".into()));
}

// ---------------------------------------------------------------------------------------------------------------
// The SDK captures

#[test]
fn every_capture_starts_with_its_recorded_method_path_and_headers() {
    let cfg = two_backends();
    for name in SDK_NAMES {
        let meta = sdk_meta(name);
        let owned = sdk_headers(name);
        let headers = borrowed(&owned);
        let s = started(
            &cfg,
            meta["method"].as_str().unwrap(),
            meta["path"].as_str().unwrap(),
            &headers,
        );
        let api = sdk_api(name);
        assert_eq!(
            (s.endpoint.clone(), s.envelope),
            (Endpoint::Inference(api), api.envelope()),
            "{name}"
        );
        let want = name.contains("claude-code").then(|| "cc-sess-1".to_string());
        assert_eq!(key(&cfg, &s).map(|k| k.value), want, "{name}");
    }
}

#[test]
fn captures_with_a_foreign_content_type_are_refused() {
    let cfg = two_backends();
    for name in SDK_NAMES {
        let meta = sdk_meta(name);
        let mut owned = sdk_headers(name);
        for (n, v) in owned.iter_mut() {
            if n == "content-type" {
                *v = "text/plain".into();
            }
        }
        let r = refused(&cfg, "POST", meta["path"].as_str().unwrap(), &borrowed(&owned));
        assert_eq!(
            (r.error.status(), r.envelope),
            (415, sdk_api(name).envelope()),
            "{name}"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Request ids

#[test]
fn request_ids_worth_keeping() {
    assert_eq!(REQUEST_ID_MAX, 128);
    for good in [
        "a",
        "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab",
        "req_01:abc.def",
        &"a".repeat(128),
    ] {
        assert!(request_id_ok(good.as_bytes()), "{good}");
    }
    for bad in [
        "",
        " ",
        "has space",
        "quote\"d",
        "a/b",
        "a\nb",
        "é",
        "<script>",
        &"a".repeat(129),
    ] {
        assert!(!request_id_ok(bad.as_bytes()), "{bad}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Error bodies in both envelopes

fn every_error() -> Vec<GatewayError> {
    vec![
        GatewayError::InvalidJson(JsonError::Empty),
        GatewayError::InvalidJson(JsonError::TooDeep { limit: 64 }),
        GatewayError::InvalidJson(JsonError::NotAnObject { found: Kind::Array }),
        GatewayError::BodyTooLarge { limit: 1024 },
        GatewayError::UnsupportedMediaType {
            header: "content-type",
            value: "text/plain".into(),
        },
        GatewayError::MissingField { field: "max_tokens" },
        GatewayError::InvalidField {
            field: "input",
            reason: "must not be empty".into(),
        },
        GatewayError::DuplicateField { field: "system" },
        GatewayError::UnknownModel { model: "gpt-9".into() },
        GatewayError::EndpointNotServed {
            model: "m".into(),
            api: Api::Embeddings,
        },
        GatewayError::InvalidSessionHeader {
            header: "x-session-id".into(),
            reason: "the value is empty",
        },
        GatewayError::InvalidQuery {
            param: "limit",
            reason: "must be an integer from 1 to 1000",
        },
        GatewayError::MethodNotAllowed {
            method: "GET".into(),
            path: "/v1/messages".into(),
            allow: "POST",
        },
        GatewayError::NotFound {
            method: "GET".into(),
            path: "/x".into(),
        },
    ]
}

#[test]
fn openai_bodies_carry_the_four_fields_and_the_request_id() {
    for e in every_error() {
        let v = parse(&e.body(Envelope::OpenAi, Some("req-123")));
        assert_eq!(sorted_keys(&v), ["error", "request_id"], "{e:?}");
        assert_eq!(sorted_keys(&v["error"]), ["code", "message", "param", "type"], "{e:?}");
        assert_eq!(
            v,
            json!({
                "error": { "message": e.to_string(), "type": "invalid_request_error", "param": e.param(), "code": e.code() },
                "request_id": "req-123"
            })
        );
    }
}

#[test]
fn anthropic_bodies_carry_type_error_and_the_request_id() {
    for e in every_error() {
        let v = parse(&e.body(Envelope::Anthropic, Some("req_01ABC")));
        assert_eq!(sorted_keys(&v), ["error", "request_id", "type"], "{e:?}");
        assert_eq!(sorted_keys(&v["error"]), ["message", "type"], "{e:?}");
        let kind = match e.status() {
            404 => "not_found_error",
            413 => "request_too_large",
            _ => "invalid_request_error",
        };
        assert_eq!(
            v,
            json!({ "type": "error", "error": { "type": kind, "message": e.to_string() }, "request_id": "req_01ABC" }),
            "{e:?}"
        );
        assert_eq!(e.anthropic_type(), kind);
    }
}

#[test]
fn new_variants_have_their_statuses_and_codes() {
    let cases: [(GatewayError, u32, &str, Option<&str>); 3] = [
        (
            GatewayError::UnsupportedMediaType {
                header: "content-encoding",
                value: "gzip".into(),
            },
            415,
            "unsupported_media_type",
            Some("content-encoding"),
        ),
        (
            GatewayError::EndpointNotServed {
                model: "m".into(),
                api: Api::Messages,
            },
            404,
            "endpoint_not_served",
            Some("model"),
        ),
        (
            GatewayError::InvalidQuery {
                param: "after_id",
                reason: "no model has this id",
            },
            400,
            "invalid_query",
            Some("after_id"),
        ),
    ];
    for (e, status, code, param) in cases {
        assert_eq!((e.status(), e.code(), e.param()), (status, code, param), "{e:?}");
        assert!(e.to_string().ends_with('.'), "{e}");
    }
}

#[test]
fn a_missing_request_id_is_null_not_absent() {
    let e = GatewayError::MissingField { field: "model" };
    assert_eq!(parse(&e.body(Envelope::OpenAi, None))["request_id"], Value::Null);
    assert_eq!(parse(&e.body(Envelope::Anthropic, None))["request_id"], Value::Null);
    assert!(parse(&e.body(Envelope::Anthropic, None))
        .as_object()
        .unwrap()
        .contains_key("request_id"));
    assert_eq!(e.openai_body(), e.body(Envelope::OpenAi, None));
}

#[test]
fn request_ids_are_escaped_in_bodies() {
    let e = GatewayError::MissingField { field: "model" };
    let id = "a\"b\\c</script>";
    assert_eq!(parse(&e.body(Envelope::OpenAi, Some(id)))["request_id"], id);
    assert_eq!(parse(&e.body(Envelope::Anthropic, Some(id)))["request_id"], id);
}

#[test]
fn a_refusal_renders_end_to_end() {
    let r = refused(
        &two_backends(),
        "POST",
        "/v1/messages",
        &[("content-type", "text/plain")],
    );
    let v = parse(&r.error.body(r.envelope, Some("rid-1")));
    assert_eq!(
        v,
        json!({
            "type": "error",
            "error": { "type": "invalid_request_error", "message": "Unsupported content-type `text/plain`; send `application/json` without content encoding." },
            "request_id": "rid-1"
        })
    );
}
