//! The request plans (`request_plan`): the headers phase's (headers stripped, the request id, the key, what
//! follows) and the body phase's (the edit, `content-length`, the headers and log fields, the place), and the
//! local replies with their request-id headers.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::cell::Cell;

use common::{config, two_backends, TWO_BACKENDS};
use llmroute_core::auth::parse_keys;
use llmroute_core::envoy_contract::log_fields;
use llmroute_core::error::unavailable_body;
use llmroute_core::headers::{AFFINITY, CLUSTER, ERROR, INPUT_TOKENS, REQUEST_ID, TOKEN_ESTIMATE};
use llmroute_core::limits::{Kind, Scope};
use llmroute_core::request_plan::body::{self, Edit, Facts, Length, RoutePlan};
use llmroute_core::request_plan::headers::{plan, HeadersPlan, Next};
use llmroute_core::request_plan::LocalReply;
use llmroute_core::status::StatusPage;
use llmroute_core::{anthropic, Api, Config, Endpoint, Envelope, GatewayError, SessionHeaders};

const TOKEN: &str = "tok-aaaaaaaaaaaaaaaa";

fn owned(headers: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect()
}

/// The headers plan for `headers`, and how many times it asked for a fresh id.
fn headers_plan<'h>(
    cfg: &Config,
    keys: Option<&str>,
    all: &'h [(String, Vec<u8>)],
    eos: bool,
) -> (HeadersPlan<'h>, usize) {
    let keys = keys.map(|k| parse_keys(k).unwrap());
    let made = Cell::new(0);
    let p = plan(cfg, keys.as_ref(), all, eos, || {
        made.set(made.get() + 1);
        "fresh-1".to_string()
    });
    (p, made.get())
}

fn header<'r>(r: &'r LocalReply, name: &str) -> Option<&'r str> {
    r.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
}

fn chat_headers(extra: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
    let mut h = vec![
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-type", "application/json"),
    ];
    h.extend_from_slice(extra);
    owned(&h)
}

#[test]
fn the_clients_gateway_headers_are_removed_and_a_good_request_id_kept() {
    let all = chat_headers(&[
        ("x-llmroute-cluster", "vllm-b"),
        ("authorization", "Bearer x"),
        ("x-request-id", "abc-123"),
        ("x-trace", "keep"),
    ]);
    let (p, fresh) = headers_plan(&two_backends(), None, &all, false);
    assert_eq!(p.remove, ["x-llmroute-cluster", "authorization"]);
    assert_eq!((p.request_id.as_str(), p.fresh_id, fresh), ("abc-123", false, 0));
    assert_eq!(p.envelope, Envelope::OpenAi);
    let Next::Read(read) = p.next else {
        panic!("{:?}", p.next)
    };
    assert_eq!(read.api, Api::Chat);
    assert!(read.charges.is_empty() && read.tenant.is_none() && read.sent_length.is_none());
}

#[test]
fn a_missing_or_malformed_request_id_is_replaced_once() {
    for sent in [None, Some("bad id with spaces")] {
        let all = chat_headers(&sent.map(|v| ("x-request-id", v)).into_iter().collect::<Vec<_>>());
        let (p, fresh) = headers_plan(&two_backends(), None, &all, false);
        assert_eq!(
            (p.request_id.as_str(), p.fresh_id, fresh),
            ("fresh-1", true, 1),
            "{sent:?}"
        );
    }
}

#[test]
fn a_refusal_carries_the_request_id_and_its_envelope() {
    let cfg = two_backends();
    // No body at all: refused in the headers phase, in the API's envelope.
    let all = owned(&[
        (":method", "POST"),
        (":path", "/v1/messages"),
        ("content-type", "application/json"),
        ("anthropic-version", "2023-06-01"),
        ("x-request-id", "r-1"),
    ]);
    let (p, _) = headers_plan(&cfg, None, &all, true);
    assert_eq!(p.envelope, Envelope::Anthropic);
    let Next::Reply(r) = p.next else { panic!("{:?}", p.next) };
    assert_eq!(r.status, 400);
    assert_eq!(
        r.rejected,
        Some(GatewayError::InvalidJson(llmroute_core::json::JsonError::Empty).metric_reason())
    );
    assert_eq!(header(&r, REQUEST_ID), Some("r-1"));
    assert_eq!(header(&r, anthropic::REQUEST_ID_HEADER), Some("r-1"));
    assert_eq!(header(&r, "content-type"), Some("application/json"));
}

#[test]
fn keys_are_checked_and_a_limited_key_is_charged_before_the_body() {
    let limited = TWO_BACKENDS.trim_end().trim_end_matches('}').to_string()
        + r#", "auth": { "keys_env": "K", "limits": { "requests": "10-M" } } }"#;
    let cfg = config(&limited);
    let keys = format!("alice:{TOKEN}");
    let bearer = format!("Bearer {TOKEN}");
    let all = chat_headers(&[("authorization", &bearer)]);
    let (p, _) = headers_plan(&cfg, Some(&keys), &all, false);
    assert_eq!(p.key.as_deref(), Some("alice"));
    assert_eq!(p.remove, ["authorization"], "the credential never travels upstream");
    let Next::Read(read) = p.next else {
        panic!("{:?}", p.next)
    };
    assert_eq!(read.charges.len(), 1);
    assert_eq!(
        (
            read.charges[0].scope,
            read.charges[0].name.as_str(),
            read.charges[0].kind
        ),
        (Scope::Key, "alice", Kind::Requests)
    );

    let all = chat_headers(&[("authorization", "Bearer tok-unknown-0000000")]);
    let (p, _) = headers_plan(&cfg, Some(&keys), &all, false);
    assert_eq!(p.key, None);
    let Next::Reply(r) = p.next else { panic!("{:?}", p.next) };
    assert_eq!(r.status, 401);
    assert_eq!(header(&r, "www-authenticate"), Some("Bearer"));
    assert_eq!(header(&r, REQUEST_ID), Some("fresh-1"));
}

#[test]
fn status_pages_and_models_end_in_the_headers_phase() {
    let cfg = two_backends();
    let get = |path: &str| owned(&[(":method", "GET"), (":path", path)]);
    let all = get("/healthz");
    assert!(matches!(
        headers_plan(&cfg, None, &all, true).0.next,
        Next::Status(StatusPage::Healthz)
    ));
    let all = get("/v1/models?limit=2");
    match headers_plan(&cfg, None, &all, true).0.next {
        Next::Models { endpoint, query } => assert_eq!((endpoint, query.as_str()), (Endpoint::ListModels, "limit=2")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_tenant_is_read_with_fairness_on() {
    let fair = TWO_BACKENDS.trim_end().trim_end_matches('}').to_string()
        + r#", "fairness": { "by": { "header": "x-tenant-id" }, "weights": { "heavy": 2 } } }"#;
    let cfg = config(&fair);
    let tenant_of = |t: &str| {
        let all = chat_headers(&[("x-tenant-id", t)]);
        match headers_plan(&cfg, None, &all, false).0.next {
            Next::Read(r) => r.tenant.unwrap(),
            other => panic!("{other:?}"),
        }
    };
    let (heavy, light) = (tenant_of("heavy"), tenant_of("light"));
    assert_eq!((heavy.weight, light.weight), (2, 1));
    assert_ne!(heavy.id, light.id);
}

const CHAT: &str = r#"{"model":"local-chat","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}]}"#;

fn body_plan(cfg: &Config, api: Api, body: &str, sent_length: Option<&str>) -> Result<RoutePlan, LocalReply> {
    let session = SessionHeaders::default();
    let facts = Facts {
        api,
        session: &session,
        key: None,
        sent_length: sent_length.map(str::as_bytes),
        request_id: Some("r-2"),
    };
    body::plan(cfg, &facts, body.as_bytes().to_vec(), |_, _| None)
}

#[test]
fn a_renamed_model_is_a_head_edit_with_its_new_length_and_the_route_headers() {
    let renamed = TWO_BACKENDS.replace(
        r#""upstream_model": "qwen3-0.6b""#,
        r#""upstream_model": "Qwen/Qwen3-32B""#,
    );
    let cfg = config(&renamed);
    let chat = CHAT;
    let p = body_plan(&cfg, Api::Chat, chat, Some(&chat.len().to_string())).unwrap();
    assert_eq!(
        p.edit,
        Edit::HeadEdit {
            body: chat.as_bytes().to_vec()
        }
    );
    let new_len = chat.len() - "local-chat".len() + "Qwen/Qwen3-32B".len();
    assert_eq!(p.length, Length::Set(new_len.to_string()));
    let tokens = p.decision.input_tokens.to_string();
    let names: Vec<&str> = p.request_headers().iter().map(|(n, _)| *n).collect();
    assert_eq!(names[..2], [CLUSTER, "accept-encoding"]);
    assert_eq!(names[names.len() - 2..], [INPUT_TOKENS, TOKEN_ESTIMATE]);
    let headers = p.request_headers();
    assert!(headers.contains(&(CLUSTER, "llama-a")));
    assert!(headers.contains(&(TOKEN_ESTIMATE, tokens.as_str())));
    let affinity = p.decision.affinity.unwrap();
    assert!(headers.contains(&(AFFINITY, affinity.header_value().as_str())));
    assert_eq!(
        p.place(),
        Some(affinity.hash),
        "not a failover cluster: placement pins the key"
    );
    assert_eq!(
        p.log_fields(),
        [
            (log_fields::ALIAS, "local-chat"),
            (log_fields::UPSTREAM_MODEL, "Qwen/Qwen3-32B"),
            (log_fields::AFFINITY_SOURCE, affinity.source.as_str()),
        ]
    );
}

#[test]
fn a_body_sent_unedited_keeps_its_length_and_buffer() {
    let cfg = two_backends();
    let body = CHAT.replace("local-chat", "same");
    let p = body_plan(&cfg, Api::Chat, &body, Some(&body.len().to_string())).unwrap();
    assert_eq!((p.edit, p.length), (Edit::Keep, Length::Unchanged));
    // Chunked (no length sent): the length is set even though nothing changed.
    let p = body_plan(&cfg, Api::Chat, &body, None).unwrap();
    assert_eq!(p.length, Length::Set(body.len().to_string()));
}

#[test]
fn a_messages_body_that_drops_extra_headers_is_replaced_whole() {
    let cfg = two_backends();
    let body =
        r#"{"model":"same","max_tokens":8,"extra_headers":{"x":"y"},"messages":[{"role":"user","content":"hi"}]}"#;
    let p = body_plan(&cfg, Api::Messages, body, None).unwrap();
    let Edit::Replace { drain, body: sent } = &p.edit else {
        panic!("{:?}", p.edit)
    };
    assert_eq!(*drain, body.len(), "the whole body received is drained");
    assert!(!String::from_utf8_lossy(sent).contains("extra_headers"));
    assert_eq!(p.length, Length::Set(sent.len().to_string()));
}

#[test]
fn an_unknown_model_is_refused_in_the_apis_envelope() {
    let cfg = two_backends();
    let body = r#"{"model":"nope","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    let r = body_plan(&cfg, Api::Messages, body, None).unwrap_err();
    assert_eq!(r.status, 404);
    assert!(r.rejected.is_some());
    assert_eq!(header(&r, REQUEST_ID), Some("r-2"));
    assert_eq!(header(&r, anthropic::REQUEST_ID_HEADER), Some("r-2"));
}

#[test]
fn local_replies_write_the_request_id_headers_once() {
    let limited = GatewayError::LimitContention;
    let r = LocalReply::refusal(&limited, Envelope::OpenAi, Some("r-3"));
    assert_eq!((r.status, header(&r, "retry-after")), (503, Some("1")));
    assert_eq!(header(&r, ERROR), Some(limited.code()));
    assert_eq!(
        header(&r, anthropic::REQUEST_ID_HEADER),
        None,
        "OpenAI's envelope has no request-id header"
    );
    let ids = r.headers.iter().filter(|(n, _)| *n == REQUEST_ID).count();
    assert_eq!(ids, 1);

    let u = LocalReply::unavailable(Envelope::Anthropic, Some("r-4"));
    assert_eq!((u.status, u.rejected), (503, Some("gateway_error")));
    assert_eq!(u.body, unavailable_body(Envelope::Anthropic, Some("r-4")));
    assert_eq!(header(&u, anthropic::REQUEST_ID_HEADER), Some("r-4"));

    let own = LocalReply::new(200, &[("content-type", "application/json")], Vec::new(), None, None);
    assert_eq!(
        (own.headers.len(), own.rejected),
        (1, None),
        "no id, no id header; not a rejection"
    );
}
