//! The routing decision, through the chat API: alias resolution, the one body edit, every refusal and its envelope,
//! the read fields and their duplicates. The other APIs are in `apis.rs`.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{members, sdk_api, sdk_body, two_backends};
use llmroute_core::affinity::explicit;
use llmroute_core::fields::{read_fields, READ_FIELDS};
use llmroute_core::json::{JsonError, Kind, Span};
use llmroute_core::{route, AffinitySource, Api, BodyPatch, Config, GatewayError, RouteDecision, SessionKey};
use serde_json::{json, Value};

const HELLO: &str = r#"[{"role":"user","content":"Hello"}]"#;

fn chat(model_json: &str) -> String {
    format!(r#"{{"model":{model_json},"messages":{HELLO}}}"#)
}

fn route_chat(cfg: &Config, body: &[u8], session: Option<&SessionKey>) -> Result<RouteDecision, GatewayError> {
    route(cfg, Api::Chat, body, session)
}

fn decide(body: &str) -> RouteDecision {
    match route_chat(&two_backends(), body.as_bytes(), None) {
        Ok(d) => d,
        Err(e) => panic!("{body} should route: {e}"),
    }
}

fn refuse(body: &[u8]) -> GatewayError {
    match route_chat(&two_backends(), body, None) {
        Ok(d) => panic!("{} should be refused, got {d:?}", String::from_utf8_lossy(body)),
        Err(e) => e,
    }
}

fn envelope(e: &GatewayError) -> Value {
    serde_json::from_slice(&e.openai_body()).unwrap()
}

/// Asserts the status, code and `param` of a refusal, and that its OpenAI envelope carries them.
fn assert_refusal(e: &GatewayError, status: u32, code: &str, param: Option<&str>) {
    assert_eq!((e.status(), e.code(), e.param()), (status, code, param), "{e:?}");
    let v = envelope(e);
    let err = v["error"].as_object().unwrap();
    let mut keys: Vec<&str> = err.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["code", "message", "param", "type"], "{v}");
    let mut top: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    top.sort();
    assert_eq!(top, ["error", "request_id"], "{v}");
    assert_eq!(v["request_id"], Value::Null);
    assert_eq!(v["error"]["code"], code);
    assert_eq!(v["error"]["param"], param.map_or(Value::Null, Value::from));
    assert_eq!(v["error"]["message"], e.to_string());
    // OpenAI uses `invalid_request_error` for every 4xx it answers itself, `model_not_found` included.
    assert_eq!(v["error"]["type"], "invalid_request_error");
}

// ---------------------------------------------------------------------------------------------------------------
// Resolution

#[test]
fn alias_resolves_to_its_cluster_and_upstream_model() {
    let d = decide(&chat("\"local-chat\""));
    assert_eq!(d.alias, "local-chat");
    assert_eq!(d.cluster, "llama-a");
    assert_eq!(d.upstream_model, "qwen3-0.6b");
}

#[test]
fn the_lowest_priority_route_is_chosen() {
    // `big` lists vllm-b (priority 5, upstream `Qwen/Qwen3-32B`) before llama-a (priority 1, upstream `big`).
    // The lowest priority decides the upstream name; the lower-priority backend is never chosen on its own.
    // (Which cluster carries a multi-route alias, its backend or a failover aggregate, is placement's business.)
    let d = decide(&chat("\"big\""));
    assert_eq!(d.upstream_model, "big");
    assert_eq!(d.patch, None);
    assert_ne!(d.cluster, "vllm-b");
}

#[test]
fn a_single_route_alias_goes_to_its_backend() {
    for (alias, cluster) in [("local-chat", "llama-a"), ("same", "vllm-b"), ("embedder", "vllm-b")] {
        assert_eq!(decide(&chat(&format!("\"{alias}\""))).cluster, cluster, "{alias}");
    }
}

#[test]
fn alias_on_the_second_backend() {
    let d = decide(&chat("\"same\""));
    assert_eq!((d.cluster.as_str(), d.upstream_model.as_str()), ("vllm-b", "same"));
}

#[test]
fn alias_match_is_exact() {
    for model in ["\"Local-Chat\"", "\"local-chat \"", "\"qwen3-0.6b\"", "\"\""] {
        let e = refuse(chat(model).as_bytes());
        assert_eq!(e.code(), "model_not_found", "{model}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The body patch

#[test]
fn patch_changes_only_the_model_bytes() {
    let body = "{ \"stream\" : false,\n  \"model\" :  \"local-chat\" ,\n  \"messages\": [{\"role\":\"user\",\"content\":\"model: local-chat\"}],\n  \"extra\": {\"model\": \"local-chat\"}, \"z\": 1.50 }\n";
    let d = decide(body);
    let p = d.patch.clone().unwrap();
    assert_eq!(p.replacement, "\"qwen3-0.6b\"");
    assert_eq!(&body[p.span.start..p.span.end], "\"local-chat\"");
    let out = p.apply(body.as_bytes());
    assert_eq!(&out[..p.span.start], &body.as_bytes()[..p.span.start]);
    assert_eq!(
        &out[out.len() - (body.len() - p.span.end)..],
        &body.as_bytes()[p.span.end..]
    );
    let expected = body.replacen("\"local-chat\"", "\"qwen3-0.6b\"", 1);
    assert_eq!(String::from_utf8(out.clone()).unwrap(), expected);
    // Parsed, only `model` differs.
    let mut before: Value = serde_json::from_str(body).unwrap();
    let after: Value = serde_json::from_slice(&out).unwrap();
    before["model"] = json!("qwen3-0.6b");
    assert_eq!(after, before);
}

#[test]
fn no_patch_when_the_upstream_name_is_the_alias() {
    let d = decide(&chat("\"same\""));
    assert_eq!(d.patch, None);
    assert_eq!(d.body_len(1234), Some(1234));
}

#[test]
fn escaped_model_is_resolved_and_rewritten_plainly() {
    let body = chat(r#""loc\u0061l-chat""#);
    let d = decide(&body);
    assert_eq!(d.alias, "local-chat");
    let out = d.patch.unwrap().apply(body.as_bytes());
    assert_eq!(String::from_utf8(out).unwrap(), chat("\"qwen3-0.6b\""));
}

#[test]
fn escaped_model_equal_to_upstream_is_still_normalised() {
    // `same` routes upstream as `same`; the client's escaped spelling is replaced by the plain one.
    let body = chat(r#""s\u0061me""#);
    let d = decide(&body);
    let p = d.patch.unwrap();
    assert_eq!(p.replacement, "\"same\"");
    assert_eq!(String::from_utf8(p.apply(body.as_bytes())).unwrap(), chat("\"same\""));
}

#[test]
fn body_len_follows_the_patch() {
    let body = chat("\"local-chat\"");
    let d = decide(&body);
    let p = d.patch.clone().unwrap();
    let out = p.apply(body.as_bytes());
    assert_eq!(d.body_len(body.len()), Some(out.len()));
    assert_eq!(
        p.new_len(body.len()),
        Some(body.len() - "\"local-chat\"".len() + "\"qwen3-0.6b\"".len())
    );
    // `local-chat` and `qwen3-0.6b` are both 10 bytes.
    assert_eq!(d.body_len(body.len()), Some(body.len()));
    // `embedder` (8 bytes) becomes `bge-m3` (6 bytes).
    let body = chat("\"embedder\"");
    let d = decide(&body);
    assert_eq!(d.body_len(body.len()), Some(body.len() - 2));
    assert_eq!(d.patch.unwrap().apply(body.as_bytes()).len(), body.len() - 2);
}

#[test]
fn patch_growing_the_body() {
    let body = r#"{"model":"big","messages":[{"role":"user","content":"x"}]}"#;
    let cfg = common::config(
        r#"{"version":1,"backends":[{"name":"b","kind":"vllm","endpoints":["10.0.0.1:80"]}],
            "models":[{"name":"big","routes":[{"backend":"b","upstream_model":"Qwen/Qwen3-235B-A22B-Instruct-2507"}]}]}"#,
    );
    let d = route_chat(&cfg, body.as_bytes(), None).unwrap();
    let out = d.patch.as_ref().unwrap().apply(body.as_bytes());
    assert_eq!(d.body_len(body.len()), Some(out.len()));
    assert!(out.len() > body.len());
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["model"], "Qwen/Qwen3-235B-A22B-Instruct-2507");
}

#[test]
fn upstream_names_needing_escapes_stay_valid_json() {
    let cfg = common::config(
        r#"{"version":1,"backends":[{"name":"b","kind":"openai","endpoints":["api.example.com:443"]}],
            "models":[{"name":"m","routes":[{"backend":"b","upstream_model":"we\"ird\\name"}]}]}"#,
    );
    let body = r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#;
    let d = route_chat(&cfg, body.as_bytes(), None).unwrap();
    let out = d.patch.unwrap().apply(body.as_bytes());
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["model"], "we\"ird\\name");
}

#[test]
fn apply_is_a_plain_splice() {
    let p = BodyPatch {
        span: Span { start: 2, end: 5 },
        replacement: "XY".into(),
    };
    assert_eq!(p.apply(b"abcdefg"), b"abXYfg");
    assert_eq!(p.new_len(7), Some(6));
    let empty = BodyPatch {
        span: Span { start: 0, end: 0 },
        replacement: ">".into(),
    };
    assert_eq!(empty.apply(b"ab"), b">ab");
    assert_eq!(empty.new_len(2), Some(3));
}

/// The filter sends a patch as a head edit: `set_buffer` calls at offset 0, each draining then prepending, as
/// Envoy does. The body Envoy then holds is exactly what `apply` builds, for every span inside the body; a span
/// outside it gives no edit.
#[test]
fn head_edit_gives_the_body_apply_gives() {
    let body = b"{\"model\":\"a\",\"x\":1}";
    for start in 0..=body.len() {
        for end in start..=body.len() {
            let p = BodyPatch {
                span: Span { start, end },
                replacement: "\"qwen\"".into(),
            };
            let mut envoy = body.to_vec();
            for call in p.head_edit(body).unwrap() {
                envoy.drain(..call.drain);
                envoy.splice(0..0, call.bytes.iter().copied());
            }
            assert_eq!(envoy, p.apply(body), "{start}..{end}");
        }
    }
    let outside = |start, end| BodyPatch {
        span: Span { start, end },
        replacement: "X".into(),
    };
    assert_eq!(outside(2, body.len() + 1).head_edit(body), None);
    assert_eq!(outside(5, 2).head_edit(body), None);
}

/// `new_len` announces a length only for a real splice: a span past the body's end or inverted (which `apply`
/// would not splice) and a sum past `usize::MAX` give `None`, never a wrong `content-length` or a panic.
#[test]
fn new_len_is_checked() {
    let patch = |start, end| BodyPatch {
        span: Span { start, end },
        replacement: "XY".into(),
    };
    assert_eq!(patch(2, 5).new_len(5), Some(4));
    assert_eq!(patch(2, 5).new_len(4), None);
    assert_eq!(patch(5, 2).new_len(7), None);
    assert_eq!(patch(0, 0).new_len(usize::MAX - 1), None);
    assert_eq!(patch(0, 0).new_len(usize::MAX - 2), Some(usize::MAX));
}

#[test]
fn patch_span_is_the_model_members_value_span() {
    let body = chat("\"local-chat\"");
    let model = members(body.as_bytes())
        .into_iter()
        .find(|m| m.kind == Kind::String)
        .unwrap();
    assert_eq!(decide(&body).patch.unwrap().span, model.value);
}

// ---------------------------------------------------------------------------------------------------------------
// Refusals

#[test]
fn invalid_json_is_400_invalid_json() {
    let e = refuse(br#"{"model":"local-chat","messages":[}"#);
    assert!(
        matches!(e, GatewayError::InvalidJson(JsonError::Syntax { .. })),
        "{e:?}"
    );
    assert_refusal(&e, 400, "invalid_json", None);
    assert!(e
        .to_string()
        .starts_with("We could not parse the JSON body of your request: invalid JSON at byte"));
}

#[test]
fn empty_body_is_400_invalid_json() {
    let e = refuse(b"");
    assert_eq!(e, GatewayError::InvalidJson(JsonError::Empty));
    assert_refusal(&e, 400, "invalid_json", None);
}

#[test]
fn invalid_utf8_is_400_invalid_json() {
    let e = refuse(b"{\"model\":\"\xff\"}");
    assert_eq!(e, GatewayError::InvalidJson(JsonError::InvalidUtf8 { offset: 10 }));
    assert_refusal(&e, 400, "invalid_json", None);
}

#[test]
fn non_object_body_is_400_body_not_object() {
    for (body, kind) in [
        ("[]", Kind::Array),
        ("\"x\"", Kind::String),
        ("1", Kind::Number),
        ("null", Kind::Null),
    ] {
        let e = refuse(body.as_bytes());
        assert_eq!(e, GatewayError::InvalidJson(JsonError::NotAnObject { found: kind }));
        assert_refusal(&e, 400, "body_not_object", None);
    }
}

#[test]
fn too_deep_body_is_400_json_too_deep() {
    let body = format!(r#"{{"model":"local-chat","messages":{HELLO},"x":{}}}"#, "[".repeat(100));
    let e = refuse(body.as_bytes());
    assert_eq!(e, GatewayError::InvalidJson(JsonError::TooDeep { limit: 64 }));
    assert_refusal(&e, 400, "json_too_deep", None);
}

#[test]
fn missing_model_is_400_missing_field() {
    let e = refuse(format!(r#"{{"messages":{HELLO}}}"#).as_bytes());
    assert_eq!(e, GatewayError::MissingField { field: "model" });
    assert_refusal(&e, 400, "missing_field", Some("model"));
    assert_eq!(e.to_string(), "The request is missing the required field `model`.");
}

#[test]
fn model_in_another_case_is_not_model() {
    let e = refuse(format!(r#"{{"Model":"local-chat","messages":{HELLO}}}"#).as_bytes());
    assert_eq!(e, GatewayError::MissingField { field: "model" });
}

#[test]
fn nested_model_is_not_model() {
    let e = refuse(format!(r#"{{"extra":{{"model":"local-chat"}},"messages":{HELLO}}}"#).as_bytes());
    assert_eq!(e, GatewayError::MissingField { field: "model" });
}

#[test]
fn model_that_is_not_a_string_is_400_invalid_field() {
    for model in ["42", "null", "true", "[\"local-chat\"]", "{\"name\":\"local-chat\"}"] {
        let e = refuse(chat(model).as_bytes());
        assert_eq!(
            e,
            GatewayError::InvalidField {
                field: "model",
                reason: "must be a string".into()
            },
            "{model}"
        );
        assert_refusal(&e, 400, "invalid_field", Some("model"));
    }
}

#[test]
fn unknown_alias_is_404_model_not_found() {
    let e = refuse(chat("\"gpt-9\"").as_bytes());
    assert_eq!(e, GatewayError::UnknownModel { model: "gpt-9".into() });
    assert_refusal(&e, 404, "model_not_found", Some("model"));
    assert_eq!(
        e.to_string(),
        "The model `gpt-9` does not exist or is not served by this gateway."
    );
}

#[test]
fn unknown_alias_is_checked_before_messages() {
    let e = refuse(br#"{"model":"gpt-9"}"#);
    assert_eq!(e.code(), "model_not_found");
}

#[test]
fn long_unknown_model_is_quoted_bounded() {
    let model = "m".repeat(10_000);
    let e = refuse(chat(&format!("\"{model}\"")).as_bytes());
    assert!(e.to_string().len() < 300);
    assert!(e.to_string().contains(&"m".repeat(128)));
    assert!(!e.to_string().contains(&"m".repeat(129)));
}

#[test]
fn missing_messages_is_400_missing_field() {
    let e = refuse(br#"{"model":"local-chat"}"#);
    assert_eq!(e, GatewayError::MissingField { field: "messages" });
    assert_refusal(&e, 400, "missing_field", Some("messages"));
}

#[test]
fn empty_or_non_array_messages_is_400_invalid_field() {
    for messages in ["[]", "[ \n ]", "{}", "\"hi\"", "null", "1", "{\"role\":\"user\"}"] {
        let e = refuse(format!(r#"{{"model":"local-chat","messages":{messages}}}"#).as_bytes());
        assert_eq!(
            e,
            GatewayError::InvalidField {
                field: "messages",
                reason: "must be a non-empty array".into()
            },
            "{messages}"
        );
        assert_refusal(&e, 400, "invalid_field", Some("messages"));
    }
}

#[test]
fn duplicate_model_in_another_case_is_400_duplicate_field() {
    for body in [
        format!(r#"{{"model":"local-chat","Model":"same","messages":{HELLO}}}"#),
        format!(r#"{{"MODEL":"same","model":"local-chat","messages":{HELLO}}}"#),
        format!(r#"{{"model":"local-chat","model":"local-chat","messages":{HELLO}}}"#),
    ] {
        let e = refuse(body.as_bytes());
        assert_eq!(e, GatewayError::DuplicateField { field: "model" }, "{body}");
        assert_refusal(&e, 400, "duplicate_field", Some("model"));
    }
}

#[test]
fn duplicate_messages_is_400_duplicate_field() {
    let e = refuse(format!(r#"{{"model":"local-chat","messages":{HELLO},"messages":[]}}"#).as_bytes());
    assert_eq!(e, GatewayError::DuplicateField { field: "messages" });
    let e = refuse(format!(r#"{{"model":"local-chat","messages":{HELLO},"MESSAGES":{HELLO}}}"#).as_bytes());
    assert_eq!(e, GatewayError::DuplicateField { field: "messages" });
}

#[test]
fn escaped_duplicate_key_is_400_duplicate_field() {
    let e = refuse(format!(r#"{{"mod\u0065l":"local-chat","mod\u0065l":"same","messages":{HELLO}}}"#).as_bytes());
    assert_eq!(e, GatewayError::DuplicateField { field: "model" });
    let e = refuse(format!(r#"{{"model":"local-chat","\u006dodel":"same","messages":{HELLO}}}"#).as_bytes());
    assert_eq!(e, GatewayError::DuplicateField { field: "model" });
}

#[test]
fn single_escaped_model_key_is_read() {
    let d = decide(&format!(r#"{{"mod\u0065l":"local-chat","messages":{HELLO}}}"#));
    assert_eq!(d.cluster, "llama-a");
}

#[test]
fn duplicates_of_other_read_fields_are_refused() {
    for field in [
        "stream",
        "max_tokens",
        "prompt_cache_key",
        "input",
        "prompt",
        "system",
        "instructions",
        "conversation",
        "metadata",
    ] {
        let body = format!(r#"{{"model":"local-chat","messages":{HELLO},"{field}":1,"{field}":2}}"#);
        assert_eq!(
            refuse(body.as_bytes()),
            GatewayError::DuplicateField {
                field: field_static(field)
            },
            "{field}"
        );
    }
}

/// Maps a read-field name to the `&'static str` the error carries.
fn field_static(name: &str) -> &'static str {
    llmroute_core::fields::READ_FIELDS
        .iter()
        .find(|f| **f == name)
        .copied()
        .unwrap()
}

#[test]
fn duplicates_of_fields_the_gateway_ignores_pass_through() {
    let body =
        format!(r#"{{"model":"local-chat","messages":{HELLO},"user":"a","user":"b","temperature":1,"Temperature":2}}"#);
    decide(&body);
}

#[test]
fn duplicate_is_refused_before_the_model_is_checked() {
    let e = refuse(br#"{"model":"gpt-9","stream":true,"Stream":false}"#);
    assert_eq!(e, GatewayError::DuplicateField { field: "stream" });
}

#[test]
fn prompt_cache_key_not_a_string_is_400() {
    for v in ["42", "true", "{}", "[\"k\"]"] {
        let body = format!(r#"{{"model":"local-chat","messages":{HELLO},"prompt_cache_key":{v}}}"#);
        let e = refuse(body.as_bytes());
        assert_eq!(
            e,
            GatewayError::InvalidField {
                field: "prompt_cache_key",
                reason: "must be a string".into()
            },
            "{v}"
        );
        assert_refusal(&e, 400, "invalid_field", Some("prompt_cache_key"));
    }
}

#[test]
fn null_prompt_cache_key_is_ignored() {
    let d = decide(&format!(
        r#"{{"model":"local-chat","messages":{HELLO},"prompt_cache_key":null}}"#
    ));
    assert_eq!(d.affinity.map(|a| a.source), Some(AffinitySource::UserPrefix));
}

#[test]
fn empty_prompt_cache_key_is_ignored() {
    let d = decide(&format!(
        r#"{{"model":"local-chat","messages":{HELLO},"prompt_cache_key":""}}"#
    ));
    assert_eq!(d.affinity.map(|a| a.source), Some(AffinitySource::UserPrefix));
}

#[test]
fn prompt_cache_key_is_validated_even_with_a_session_header() {
    let s = session(b"s");
    let body = format!(r#"{{"model":"local-chat","messages":{HELLO},"prompt_cache_key":7}}"#);
    assert!(route_chat(&two_backends(), body.as_bytes(), Some(&s)).is_err());
}

#[test]
fn session_key_passes_through_the_decision() {
    let s = session(b"abc");
    let d = route_chat(&two_backends(), chat("\"local-chat\"").as_bytes(), Some(&s)).unwrap();
    assert_eq!(d.affinity, Some(s.affinity));
    assert_eq!(d.echo_session.as_deref(), Some("abc"));
}

#[test]
fn escaped_prompt_cache_key_hashes_as_its_decoded_value() {
    let d = decide(&format!(
        r#"{{"model":"local-chat","messages":{HELLO},"prompt_cache_key":"conv\u002d42"}}"#
    ));
    assert_eq!(d.affinity, Some(explicit(b"conv-42", AffinitySource::PromptCacheKey)));
}

/// A session key as `session_from_headers` builds it.
fn session(value: &[u8]) -> SessionKey {
    SessionKey {
        value: String::from_utf8(value.to_vec()).unwrap(),
        affinity: explicit(value, AffinitySource::SessionHeader),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// read_fields directly

#[test]
fn read_fields_finds_exact_case_fields_only() {
    let body = br#"{"model":"m","Stream":true,"messages":[],"other":1}"#;
    let f = read_fields(body, &members(body)).unwrap();
    assert_eq!(f.get("model").map(|m| m.value.of(body)), Some(&b"\"m\""[..]));
    assert_eq!(f.get("messages").map(|m| m.kind), Some(Kind::Array));
    // Present, but not in the exact case: not read, yet still counted for duplicates.
    assert_eq!(f.get("stream"), None);
    // Not a read field at all.
    assert_eq!(f.get("other"), None);
    assert_eq!(f.get("max_tokens"), None);
}

#[test]
fn read_fields_refuses_the_second_copy_in_any_case() {
    let body = br#"{"Stream":true,"stream":false}"#;
    assert_eq!(
        read_fields(body, &members(body)).unwrap_err(),
        GatewayError::DuplicateField { field: "stream" }
    );
    let body = br#"{"inPut":1,"INPUT":2}"#;
    assert_eq!(
        read_fields(body, &members(body)).unwrap_err(),
        GatewayError::DuplicateField { field: "input" }
    );
}

#[test]
fn read_fields_list() {
    // Every field any API reads (the list may grow as the gateway reads more).
    for field in [
        "model",
        "stream",
        "messages",
        "input",
        "prompt",
        "max_tokens",
        "system",
        "instructions",
        "prompt_cache_key",
        "conversation",
        "metadata",
    ] {
        assert!(READ_FIELDS.contains(&field), "{field}");
    }
    let mut unique = READ_FIELDS.to_vec();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), READ_FIELDS.len());
}

#[test]
fn case_variant_duplicates_of_every_read_field_are_refused() {
    for field in READ_FIELDS {
        let upper = field.to_ascii_uppercase();
        let body = format!(r#"{{"model":"local-chat","messages":{HELLO},"{upper}":1,"{field}":2}}"#);
        let body = if field == "model" || field == "messages" {
            format!(r#"{{"model":"local-chat","messages":{HELLO},"{upper}":1}}"#)
        } else {
            body
        };
        assert_eq!(
            refuse(body.as_bytes()),
            GatewayError::DuplicateField { field },
            "{body}"
        );
    }
}

#[test]
fn duplicates_are_refused_on_every_api() {
    let cfg = two_backends();
    for api in Api::ALL {
        let body = br#"{"model":"local-chat","Model":"local-chat"}"#;
        let e = route(&cfg, api, body, None).unwrap_err();
        assert_eq!(e, GatewayError::DuplicateField { field: "model" }, "{}", api.name());
        // A field another API reads is still refused here: the backend might read it.
        let body = br#"{"model":"local-chat","system":"a","SYSTEM":"b","input":"x","prompt":"x","messages":[{"role":"user","content":"x"}],"max_tokens":1}"#;
        let e = route(&cfg, api, body, None).unwrap_err();
        if api.is_decision() {
            // Decision routes read only `model`: the next check is whether the alias serves the route.
            assert_eq!(e.code(), "endpoint_not_served", "{}", api.name());
            continue;
        }
        assert_eq!(e, GatewayError::DuplicateField { field: "system" }, "{}", api.name());
    }
}

#[test]
fn unicode_case_folded_duplicate_is_refused() {
    // Go's encoding/json (Ollama) matches keys with Unicode case folding: U+017F 'ſ' folds to 's' and U+212A
    // (Kelvin sign) to 'k'. Go picks the last of the equal keys; the gateway would read the first.
    let body = format!(
        r#"{{"model":"local-chat","messages":{HELLO},"me\u017f\u017fages":[{{"role":"user","content":"other"}}]}}"#
    );
    assert_eq!(
        refuse(body.as_bytes()),
        GatewayError::DuplicateField { field: "messages" }
    );
    let body = format!(r#"{{"model":"local-chat","messages":{HELLO},"max_to\u212aens":1,"max_tokens":2}}"#);
    assert_eq!(
        refuse(body.as_bytes()),
        GatewayError::DuplicateField { field: "max_tokens" }
    );
    // Unescaped, in the other order, and for a field the gateway reads only on other APIs.
    let body = format!(r#"{{"model":"local-chat","ſtream":true,"messages":{HELLO},"stream":false}}"#);
    assert_eq!(
        refuse(body.as_bytes()),
        GatewayError::DuplicateField { field: "stream" }
    );
    let body =
        format!(r#"{{"model":"local-chat","messages":{HELLO},"prompt_cache_key":"a","prompt_cache_\u212Aey":"b"}}"#);
    assert_eq!(
        refuse(body.as_bytes()),
        GatewayError::DuplicateField {
            field: "prompt_cache_key"
        }
    );
}

#[test]
fn a_lone_case_folded_key_is_not_read_but_is_not_a_duplicate() {
    // `meſſages` alone is not `messages`: the gateway does not read it, so `messages` is missing.
    let body = format!(r#"{{"model":"local-chat","me\u017f\u017fages":{HELLO}}}"#);
    assert_eq!(
        refuse(body.as_bytes()),
        GatewayError::MissingField { field: "messages" }
    );
}

#[test]
fn other_non_ascii_look_alikes_are_not_folded() {
    // Only ſ and the Kelvin sign fold to ASCII under simple case folding; é, ı and fullwidth letters do not.
    for key in [r"mod\u00e9l", r"\u0131nput", r"\uff4dodel", "modeł"] {
        let body = format!(r#"{{"model":"local-chat","messages":{HELLO},"{key}":1}}"#);
        decide(&body);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The SDK captures

#[test]
fn every_capture_routes_on_its_own_api() {
    for name in common::SDK_NAMES {
        let body = sdk_body(name);
        let api = sdk_api(name);
        let d = route(&two_backends(), api, body, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(d.api, api, "{name}");
        let (alias, cluster, upstream) = if api == Api::Embeddings {
            ("embedder", "vllm-b", "bge-m3")
        } else {
            ("local-chat", "llama-a", "qwen3-0.6b")
        };
        assert_eq!(
            (d.alias.as_str(), d.cluster.as_str(), d.upstream_model.as_str()),
            (alias, cluster, upstream)
        );
        let out = d.patch.as_ref().unwrap().apply(body);
        assert_eq!(Some(out.len()), d.body_len(body.len()));
        let mut want: Value = serde_json::from_slice(body).unwrap();
        want["model"] = json!(upstream);
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), want, "{name}");
        assert!(d.input_tokens >= 1, "{name}");
    }
}

#[test]
fn every_capture_is_refused_on_an_api_whose_required_field_it_lacks() {
    let cfg = two_backends();
    for name in common::SDK_NAMES {
        let own = sdk_api(name);
        // Decision routes require nothing but `model` (see `decisions::tests`).
        for api in Api::ALL.into_iter().filter(|a| *a != own && !a.is_decision()) {
            let Err(e) = route(&cfg, api, sdk_body(name), None) else {
                // Bodies of sibling dialects may be valid on each other's path: messages bodies carry
                // `messages`, responses and embeddings bodies both carry `input`.
                let siblings = [
                    (Api::Messages, Api::Chat),
                    (Api::Responses, Api::Embeddings),
                    (Api::Embeddings, Api::Responses),
                ];
                assert!(
                    siblings.contains(&(own, api)),
                    "{name} should not route as {}",
                    api.name()
                );
                continue;
            };
            assert_eq!(e.status(), 400, "{name} as {}: {e:?}", api.name());
        }
    }
}

#[test]
fn tools_capture_uses_its_prompt_cache_key() {
    let d = route_chat(&two_backends(), sdk_body("chat-tools-image-prompt-cache-key"), None).unwrap();
    assert_eq!(d.affinity, Some(explicit(b"conv-42", AffinitySource::PromptCacheKey)));
    assert_eq!(d.echo_session.as_deref(), Some("conv-42"));
}

#[test]
fn decision_records_the_api() {
    for api in [Api::Chat, Api::Messages] {
        let body = br#"{"model":"same","max_tokens":1,"messages":[{"role":"user","content":"x"}]}"#;
        assert_eq!(route(&two_backends(), api, body, None).unwrap().api, api);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Issue 15: body edits and the context-length check

/// One alias on a backend of `max_context` 1000 tokens that adds `stream_options.include_usage` to streams; the
/// alias `pair` has two routes (a failover cluster) and prefix routing.
fn guarded() -> Config {
    common::config(
        r#"{"version":1,
            "backends":[{"name":"a","kind":"llamacpp","endpoints":["127.0.0.1:1"],"max_context":1000},
                        {"name":"b","kind":"vllm","endpoints":["127.0.0.1:2"]}],
            "models":[{"name":"m","routes":[{"backend":"a","upstream_model":"up"}]},
                      {"name":"pair","model_prefix_routing":true,
                       "routes":[{"backend":"b","upstream_model":"b-model","priority":1},
                                 {"backend":"a","upstream_model":"a-model","priority":2}]}],
            "usage":{"stream_include_usage":true}}"#,
    )
}

#[test]
fn an_escaped_stream_options_key_is_the_clients_choice() {
    let cfg = guarded();
    for key in [
        r"stream\u005foptions",
        r"\u0073tream_options",
        "STREAM_OPTIONS",
        "stream_options",
    ] {
        let body = format!(r#"{{"model":"m","stream":true,"messages":{HELLO},"{key}":{{"include_usage":false}}}}"#);
        let d = route_chat(&cfg, body.as_bytes(), None).unwrap();
        assert!(!d.strip_usage_chunk, "{key}");
        let out = d
            .patch
            .as_ref()
            .map_or(body.clone().into_bytes(), |p| p.apply(body.as_bytes()));
        let out = String::from_utf8(out).unwrap();
        assert!(
            !out.contains("include_usage\":true"),
            "{key}: a second stream_options was added: {out}"
        );
    }
    // Without one, the option is still added.
    let body = format!(r#"{{"model":"m","stream":true,"messages":{HELLO}}}"#);
    assert!(route_chat(&cfg, body.as_bytes(), None).unwrap().strip_usage_chunk);
}

#[test]
fn odd_output_token_counts_are_refused_in_the_envelope() {
    let cfg = guarded();
    for (field, value) in [
        ("max_tokens", "1.5"),
        ("max_tokens", "-1"),
        ("max_tokens", r#""5000""#),
        ("max_tokens", "true"),
        ("max_completion_tokens", "1e-3"),
        ("max_completion_tokens", "{}"),
    ] {
        let body = format!(r#"{{"model":"m","messages":{HELLO},"{field}":{value}}}"#);
        let e = route_chat(&cfg, body.as_bytes(), None).unwrap_err();
        assert_refusal(&e, 400, "invalid_field", Some(field));
        assert!(e.to_string().contains("non-negative integer"), "{e}");
    }
}

#[test]
fn whole_number_output_counts_in_any_notation_reach_the_context_check() {
    let cfg = guarded();
    for value in ["2000", "2000.0", "2e3", "1e30"] {
        let body = format!(r#"{{"model":"m","messages":{HELLO},"max_tokens":{value}}}"#);
        let e = route_chat(&cfg, body.as_bytes(), None).unwrap_err();
        assert_eq!(
            (e.status(), e.code()),
            (400, "context_length_exceeded"),
            "{value}: {e:?}"
        );
    }
    for value in ["null", "900", "900.0"] {
        let body = format!(r#"{{"model":"m","messages":{HELLO},"max_tokens":{value}}}"#);
        assert!(route_chat(&cfg, body.as_bytes(), None).is_ok(), "{value}");
    }
}

#[test]
fn a_data_prefix_cannot_hide_a_prompt_from_the_context_check() {
    let cfg = guarded();
    let prompt = "word ".repeat(2000);
    for content in [
        format!("data:;base64,{prompt}"),
        format!("data:text/plain;base64,{prompt}"),
        format!("data:image/png;base64,{prompt}"),
    ] {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": content}]}).to_string();
        let e = route_chat(&cfg, body.as_bytes(), None).unwrap_err();
        assert_eq!(e.code(), "context_length_exceeded", "{}", &content[..20]);
    }
}

#[test]
fn a_prefix_routed_model_is_not_handed_to_the_failover_rewrite() {
    let cfg = guarded();
    let plain = route_chat(&cfg, chat(r#""pair""#).as_bytes(), None).unwrap();
    assert!(plain.failover);
    assert_eq!(plain.failover_alias(), Some("pair"));
    let pinned = route_chat(&cfg, chat(r#""pair/client-model""#).as_bytes(), None).unwrap();
    assert!(pinned.failover && pinned.model_from_client);
    assert_eq!(pinned.upstream_model, "client-model");
    assert_eq!(
        pinned.failover_alias(),
        None,
        "the upstream filter would overwrite client-model"
    );
    let single = route_chat(&cfg, chat(r#""m""#).as_bytes(), None).unwrap();
    assert_eq!(single.failover_alias(), None);
}
