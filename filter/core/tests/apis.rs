//! Each inference API in its own dialect: the checks beyond the common ones, the content key, the explicit ids,
//! then what every API shares: a conversation resent with its history appended keeps its key, aliases restricted
//! to some endpoints, and `<alias>/<upstream>` prefix routing.
//!
//! Expected hashes were computed independently with Python's `xxhash` (see `affinity.rs` for the layout).

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{hex_of, one_alias, refuses, routes, sdk_body, two_backends, two_backends_with_affinity};
use llmroute_core::affinity::explicit;
use llmroute_core::endpoint::Envelope;
use llmroute_core::{route, Affinity, AffinitySource, Api, Config, GatewayError, SessionKey};
use serde_json::{json, Value};

/// system, alias `local-chat`, "You are terse."
const SYS_TERSE: &str = "cadd8de9b9e431eb";
/// system, `local-chat`, "Be brief."
const SYS_BRIEF: &str = "4c843396f367cd42";
/// user prefix, `local-chat`, "Hello"
const USER_HELLO: &str = "2d8bcc3346a2882e";
/// user prefix, `local-chat`, "Once upon a time"
const USER_ONCE: &str = "5082986afb7a428c";
/// user prefix, `local-chat`, "Plain string input"
const USER_PLAIN: &str = "7d45bcd5e5acad76";
/// user prefix, `local-chat`, "Hi there"
const USER_HI_THERE: &str = "f45115a85d3c2edc";
/// user prefix, `local-chat`, "look"
const USER_LOOK: &str = "fb5efb866f51a614";
/// explicit "conv_abc"
const EXPLICIT_CONV_ABC: &str = "b628576d12d20006";
/// explicit "u-123"
const EXPLICIT_U_123: &str = "edd6629f6dda37d0";
/// explicit "conv-42"
const EXPLICIT_CONV_42: &str = "ad8ebf05ba1818ab";
/// explicit "sess-1"
const EXPLICIT_SESS_1: &str = "b121c6fa7ec55f68";

fn ok(api: Api, body: &Value) -> llmroute_core::RouteDecision {
    routes(&two_backends(), api, body.to_string().as_bytes(), None)
}

fn ok_in(cfg: &Config, api: Api, body: &Value) -> llmroute_core::RouteDecision {
    routes(cfg, api, body.to_string().as_bytes(), None)
}

fn err(api: Api, body: &Value) -> GatewayError {
    refuses(&two_backends(), api, body.to_string().as_bytes(), None)
}

fn invalid(field: &'static str, reason: &str) -> GatewayError {
    GatewayError::InvalidField {
        field,
        reason: reason.into(),
    }
}

fn key_of(api: Api, body: &Value) -> Option<(AffinitySource, String)> {
    ok(api, body).affinity.map(|a| (a.source, a.header_value()))
}

fn want(source: AffinitySource, hex: &str) -> Option<(AffinitySource, String)> {
    Some((source, hex.to_string()))
}

fn session(value: &str) -> SessionKey {
    SessionKey {
        value: value.into(),
        affinity: explicit(value.as_bytes(), AffinitySource::SessionHeader),
    }
}

/// `body` with `field` set to `value`.
fn with(mut body: Value, field: &str, value: Value) -> Value {
    body[field] = value;
    body
}

/// `body` without `field`.
fn without(mut body: Value, field: &str) -> Value {
    body.as_object_mut().unwrap().remove(field);
    body
}

// ---------------------------------------------------------------------------------------------------------------
// Chat

fn chat() -> Value {
    json!({ "model": "local-chat", "messages": [ { "role": "system", "content": "You are terse." }, { "role": "user", "content": "Hello" } ] })
}

#[test]
fn chat_routes_with_its_system_key() {
    let d = ok(Api::Chat, &chat());
    assert_eq!(
        (d.api, d.cluster.as_str(), hex_of(&d).as_str()),
        (Api::Chat, "llama-a", SYS_TERSE)
    );
}

#[test]
fn chat_requires_a_non_empty_messages_array() {
    assert_eq!(
        err(Api::Chat, &without(chat(), "messages")),
        GatewayError::MissingField { field: "messages" }
    );
    for bad in [json!([]), json!({}), json!("hi"), json!(null), json!(1)] {
        assert_eq!(
            err(Api::Chat, &with(chat(), "messages", bad.clone())),
            invalid("messages", "must be a non-empty array"),
            "{bad}"
        );
    }
}

#[test]
fn chat_ignores_fields_of_other_dialects() {
    // `system`, `instructions` and `prompt` mean nothing to chat: the key still comes from the messages.
    let body = with(
        with(with(chat(), "system", json!("other")), "instructions", json!("other")),
        "prompt",
        json!("other"),
    );
    assert_eq!(key_of(Api::Chat, &body), want(AffinitySource::SystemPrompt, SYS_TERSE));
}

// ---------------------------------------------------------------------------------------------------------------
// Completions

fn completions(prompt: Value) -> Value {
    json!({ "model": "local-chat", "prompt": prompt, "max_tokens": 16 })
}

#[test]
fn completions_string_prompt_is_a_user_prefix_key() {
    assert_eq!(
        key_of(Api::Completions, &completions(json!("Once upon a time"))),
        want(AffinitySource::UserPrefix, USER_ONCE)
    );
}

#[test]
fn completions_string_array_prompt_keys_on_its_first_element() {
    let one = key_of(Api::Completions, &completions(json!(["Once upon a time"])));
    let two = key_of(
        Api::Completions,
        &completions(json!(["Once upon a time", "something else"])),
    );
    assert_eq!(one, want(AffinitySource::UserPrefix, USER_ONCE));
    assert_eq!(two, one);
    assert_ne!(
        key_of(Api::Completions, &completions(json!(["other", "Once upon a time"]))),
        one
    );
}

#[test]
fn completions_prompt_key_is_bounded() {
    let base = "p".repeat(256);
    let a = key_of(Api::Completions, &completions(json!(format!("{base} tail a"))));
    let b = key_of(Api::Completions, &completions(json!(format!("{base} other tail"))));
    assert_eq!(a, b);
    assert_eq!(a, key_of(Api::Completions, &completions(json!(base))));
}

#[test]
fn completions_token_array_prompts_route() {
    for prompt in [json!([1, 2, 3]), json!([[1, 2], [3, 4]]), json!([1])] {
        let d = ok(Api::Completions, &completions(prompt.clone()));
        assert_eq!(
            d.affinity.map(|a| a.source),
            Some(AffinitySource::UserPrefix),
            "{prompt}"
        );
    }
    // A token prompt counts by its JSON text: `[1]` keys like the string "[1]".
    assert_eq!(
        key_of(Api::Completions, &completions(json!([1]))),
        key_of(Api::Completions, &completions(json!("[1]")))
    );
}

#[test]
fn completions_token_array_prompt_keys_on_a_prefix_of_the_tokens() {
    let a = key_of(Api::Completions, &completions(json!([128000, 9906, 1917])));
    let b = key_of(Api::Completions, &completions(json!([128000, 791, 4320])));
    assert_ne!(a, b, "two different token prompts that share only their first token");
}

#[test]
fn completions_requires_a_prompt() {
    assert_eq!(
        err(Api::Completions, &without(completions(json!("x")), "prompt")),
        GatewayError::MissingField { field: "prompt" }
    );
    let e = err(Api::Completions, &completions(json!([])));
    assert_eq!(e, invalid("prompt", "must not be an empty array"));
    assert_eq!(
        (e.status(), e.code(), e.param()),
        (400, "invalid_field", Some("prompt"))
    );
    for bad in [json!(null), json!(7), json!(true), json!({ "text": "x" })] {
        assert_eq!(
            err(Api::Completions, &completions(bad.clone())),
            invalid("prompt", "must be a string or an array"),
            "{bad}"
        );
    }
}

#[test]
fn completions_empty_string_prompt_routes_without_a_key() {
    let d = ok(Api::Completions, &completions(json!("")));
    assert_eq!((d.affinity, d.echo_session), (None, None));
}

#[test]
fn completions_does_not_read_messages() {
    let body = with(
        completions(json!("Once upon a time")),
        "messages",
        json!([{ "role": "system", "content": "S" }]),
    );
    assert_eq!(
        key_of(Api::Completions, &body),
        want(AffinitySource::UserPrefix, USER_ONCE)
    );
}

#[test]
fn completions_prompt_cache_key_and_session_header_win() {
    let body = with(completions(json!("Once")), "prompt_cache_key", json!("conv-42"));
    assert_eq!(
        key_of(Api::Completions, &body),
        want(AffinitySource::PromptCacheKey, EXPLICIT_CONV_42)
    );
    let d = routes(
        &two_backends(),
        Api::Completions,
        completions(json!("Once")).to_string().as_bytes(),
        Some(&session("sess-1")),
    );
    assert_eq!(hex_of(&d), EXPLICIT_SESS_1);
}

#[test]
fn completions_capture_routes() {
    let d = routes(&two_backends(), Api::Completions, sdk_body("completions-basic"), None);
    assert_eq!((d.api, hex_of(&d).as_str()), (Api::Completions, USER_ONCE));
}

// ---------------------------------------------------------------------------------------------------------------
// Responses

fn responses(input: Value) -> Value {
    json!({ "model": "local-chat", "input": input })
}

#[test]
fn responses_string_input_is_a_user_prefix_key() {
    assert_eq!(
        key_of(Api::Responses, &responses(json!("Plain string input"))),
        want(AffinitySource::UserPrefix, USER_PLAIN)
    );
}

#[test]
fn responses_item_array_keys_on_the_first_items_text() {
    let expected = want(AffinitySource::UserPrefix, USER_HI_THERE);
    for input in [
        json!("Hi there"),
        json!(["Hi there"]),
        json!([{ "role": "user", "content": "Hi there" }]),
        json!([{ "type": "message", "role": "user", "content": [ { "type": "input_text", "text": "Hi there" } ] }]),
        json!([{ "type": "message", "role": "user", "content": [
            { "type": "input_text", "text": "Hi " },
            { "type": "input_image", "image_url": "data:image/png;base64,AAAA" },
            { "type": "input_file", "file_id": "file-1" },
            { "type": "input_text", "text": "there" } ] }]),
        json!([{ "role": "user", "content": "Hi there" }, { "role": "user", "content": "second item" }]),
    ] {
        assert_eq!(key_of(Api::Responses, &responses(input.clone())), expected, "{input}");
    }
}

#[test]
fn responses_instructions_beat_the_input() {
    let body = with(responses(json!("Hi there")), "instructions", json!("Be brief."));
    assert_eq!(
        key_of(Api::Responses, &body),
        want(AffinitySource::SystemPrompt, SYS_BRIEF)
    );
    // Different input, same instructions: same key.
    let other = with(
        responses(json!([{ "role": "user", "content": "Something else" }])),
        "instructions",
        json!("Be brief."),
    );
    assert_eq!(
        key_of(Api::Responses, &other),
        want(AffinitySource::SystemPrompt, SYS_BRIEF)
    );
}

#[test]
fn responses_null_or_empty_instructions_fall_back_to_the_input() {
    for instructions in [json!(null), json!("")] {
        let body = with(responses(json!("Hi there")), "instructions", instructions.clone());
        assert_eq!(
            key_of(Api::Responses, &body),
            want(AffinitySource::UserPrefix, USER_HI_THERE),
            "{instructions}"
        );
    }
}

#[test]
fn responses_instructions_must_be_a_string() {
    for bad in [json!(42), json!(["Be brief."]), json!({ "text": "x" }), json!(true)] {
        let e = err(
            Api::Responses,
            &with(responses(json!("x")), "instructions", bad.clone()),
        );
        assert_eq!(e, invalid("instructions", "must be a string"), "{bad}");
    }
}

#[test]
fn responses_requires_an_input() {
    assert_eq!(
        err(Api::Responses, &without(responses(json!("x")), "input")),
        GatewayError::MissingField { field: "input" }
    );
    for bad in [json!(null), json!(1), json!({ "role": "user" }), json!(false)] {
        let e = err(Api::Responses, &responses(bad.clone()));
        assert_eq!(
            e,
            invalid("input", "must be a string or an array of input items"),
            "{bad}"
        );
    }
}

#[test]
fn responses_empty_array_input_routes_without_a_key() {
    assert_eq!(ok(Api::Responses, &responses(json!([]))).affinity, None);
    assert_eq!(ok(Api::Responses, &responses(json!(""))).affinity, None);
}

fn conversation_cfg() -> Config {
    two_backends_with_affinity(r#"{ "conversation_id": true }"#)
}

#[test]
fn responses_conversation_string_or_object_is_explicit_when_enabled() {
    for conversation in [
        json!("conv_abc"),
        json!({ "id": "conv_abc" }),
        json!({ "id": "conv_abc", "extra": 1 }),
    ] {
        let body = with(
            responses(json!("Plain string input")),
            "conversation",
            conversation.clone(),
        );
        let d = ok_in(&conversation_cfg(), Api::Responses, &body);
        let a = d.affinity.unwrap();
        assert_eq!(
            (a.source, a.header_value().as_str()),
            (AffinitySource::Conversation, EXPLICIT_CONV_ABC),
            "{conversation}"
        );
        assert_eq!(a.source.header_value(), "session");
        assert_eq!(d.echo_session.as_deref(), Some("conv_abc"));
    }
}

#[test]
fn responses_conversation_beats_instructions_but_not_prompt_cache_key_or_session() {
    let body = with(
        with(responses(json!("x")), "conversation", json!("conv_abc")),
        "instructions",
        json!("Be brief."),
    );
    assert_eq!(
        ok_in(&conversation_cfg(), Api::Responses, &body)
            .affinity
            .unwrap()
            .source,
        AffinitySource::Conversation
    );
    let with_key = with(body.clone(), "prompt_cache_key", json!("conv-42"));
    let d = ok_in(&conversation_cfg(), Api::Responses, &with_key);
    assert_eq!(
        (hex_of(&d).as_str(), d.echo_session.as_deref()),
        (EXPLICIT_CONV_42, Some("conv-42"))
    );
    let d = routes(
        &conversation_cfg(),
        Api::Responses,
        body.to_string().as_bytes(),
        Some(&session("sess-1")),
    );
    assert_eq!(
        (d.affinity.unwrap().source, d.echo_session.as_deref()),
        (AffinitySource::SessionHeader, Some("sess-1"))
    );
}

#[test]
fn responses_conversation_is_ignored_when_not_enabled() {
    for conversation in [
        json!("conv_abc"),
        json!({ "id": "conv_abc" }),
        json!("bad\u{1}value"),
        json!(7),
    ] {
        let body = with(
            responses(json!("Plain string input")),
            "conversation",
            conversation.clone(),
        );
        let d = ok(Api::Responses, &body);
        assert_eq!(
            (hex_of(&d).as_str(), d.echo_session),
            (USER_PLAIN, None),
            "{conversation}"
        );
    }
}

#[test]
fn responses_unusable_conversation_ids_are_ignored_or_refused() {
    // Absent or empty ids are ignored; ids that would be refused as a session header are refused.
    for ignored in [
        json!(""),
        json!({}),
        json!({ "id": "" }),
        json!({ "id": 5 }),
        json!(null),
        json!(12),
        json!(["conv_abc"]),
    ] {
        let body = with(responses(json!("Plain string input")), "conversation", ignored.clone());
        assert_eq!(
            hex_of(&ok_in(&conversation_cfg(), Api::Responses, &body)),
            USER_PLAIN,
            "{ignored}"
        );
    }
    for (bad, reason) in [
        (json!("a\nb"), "the value contains control characters"),
        (json!({ "id": "x".repeat(257) }), "the value is longer than 256 bytes"),
    ] {
        let body = with(responses(json!("x")), "conversation", bad.clone());
        let e = refuses(&conversation_cfg(), Api::Responses, body.to_string().as_bytes(), None);
        assert_eq!(e, invalid("conversation", reason), "{bad}");
        assert_eq!(e.param(), Some("conversation"));
    }
}

#[test]
fn responses_captures_route() {
    let d = routes(
        &two_backends(),
        Api::Responses,
        sdk_body("responses-string-input-conversation"),
        None,
    );
    assert_eq!(hex_of(&d), USER_PLAIN);
    let d = routes(
        &conversation_cfg(),
        Api::Responses,
        sdk_body("responses-string-input-conversation"),
        None,
    );
    assert_eq!(hex_of(&d), EXPLICIT_CONV_ABC);
}

// ---------------------------------------------------------------------------------------------------------------
// Embeddings

fn embeddings(input: Value) -> Value {
    json!({ "model": "embedder", "input": input })
}

#[test]
fn embeddings_string_and_arrays_route_never_sticky() {
    for input in [
        json!("one text"),
        json!(["a", "b"]),
        json!([1, 2, 3]),
        json!([[1, 2], [3]]),
        json!([""]),
    ] {
        let d = ok(Api::Embeddings, &embeddings(input.clone()));
        assert_eq!(
            (d.api, d.cluster.as_str(), d.upstream_model.as_str()),
            (Api::Embeddings, "vllm-b", "bge-m3")
        );
        assert_eq!((d.affinity, d.echo_session.as_deref()), (None, None), "{input}");
    }
}

#[test]
fn embeddings_are_never_sticky_even_with_explicit_keys() {
    let cfg = two_backends();
    let body = with(embeddings(json!("text")), "prompt_cache_key", json!("conv-42"));
    let d = routes(
        &cfg,
        Api::Embeddings,
        body.to_string().as_bytes(),
        Some(&session("sess-1")),
    );
    assert_eq!((d.affinity, d.echo_session), (None, None));
    let d = routes(
        &cfg,
        Api::Embeddings,
        embeddings(json!("text")).to_string().as_bytes(),
        Some(&session("sess-1")),
    );
    assert_eq!((d.affinity, d.echo_session), (None, None));
}

#[test]
fn embeddings_refuse_empty_input() {
    assert_eq!(
        err(Api::Embeddings, &embeddings(json!(""))),
        invalid("input", "must not be empty")
    );
    assert_eq!(
        err(Api::Embeddings, &embeddings(json!([]))),
        invalid("input", "must not be an empty array")
    );
    assert_eq!(
        err(Api::Embeddings, &json!({ "model": "embedder" })),
        GatewayError::MissingField { field: "input" }
    );
    for bad in [json!(null), json!(3), json!({ "text": "x" })] {
        assert_eq!(
            err(Api::Embeddings, &embeddings(bad.clone())),
            invalid("input", "must be a string or an array"),
            "{bad}"
        );
    }
}

#[test]
fn embeddings_accept_2048_inputs_and_refuse_2049() {
    let inputs = |n: usize| Value::Array((0..n).map(|i| json!(format!("t{i}"))).collect());
    ok(Api::Embeddings, &embeddings(inputs(1)));
    ok(Api::Embeddings, &embeddings(inputs(2048)));
    let e = err(Api::Embeddings, &embeddings(inputs(2049)));
    assert_eq!(e, invalid("input", "must have at most 2048 entries"));
    assert_eq!((e.status(), e.param()), (400, Some("input")));
    assert_eq!(
        err(Api::Embeddings, &embeddings(inputs(100_000))).code(),
        "invalid_field"
    );
}

#[test]
fn embeddings_capture_routes_to_the_embedder() {
    let d = routes(
        &two_backends(),
        Api::Embeddings,
        sdk_body("embeddings-two-inputs"),
        None,
    );
    assert_eq!((d.upstream_model.as_str(), d.affinity), ("bge-m3", None));
}

// ---------------------------------------------------------------------------------------------------------------
// Messages (Anthropic)

fn messages() -> Value {
    json!({ "model": "local-chat", "max_tokens": 64, "messages": [ { "role": "user", "content": "Hello" } ] })
}

#[test]
fn messages_max_tokens_must_be_a_positive_integer() {
    for bad in [
        json!(0),
        json!(-1),
        json!(1.5),
        json!("8"),
        json!(null),
        json!(true),
        json!(1.0),
        json!([8]),
    ] {
        let e = err(Api::Messages, &with(messages(), "max_tokens", bad.clone()));
        assert_eq!(e, invalid("max_tokens", "must be a positive integer"), "{bad}");
        assert_eq!(e.param(), Some("max_tokens"));
    }
    assert_eq!(
        err(Api::Messages, &without(messages(), "max_tokens")),
        GatewayError::MissingField { field: "max_tokens" }
    );
    for good in [json!(1), json!(64), json!(128_000)] {
        ok(Api::Messages, &with(messages(), "max_tokens", good));
    }
}

#[test]
fn messages_max_tokens_literal_forms() {
    // Exponent and huge literals are not plain positive integers.
    for literal in ["1e3", "-0", "99999999999999999999999"] {
        let body =
            format!(r#"{{"model":"local-chat","max_tokens":{literal},"messages":[{{"role":"user","content":"x"}}]}}"#);
        let e = refuses(&two_backends(), Api::Messages, body.as_bytes(), None);
        assert_eq!(e.param(), Some("max_tokens"), "{literal}");
    }
}

#[test]
fn messages_requires_a_non_empty_messages_array() {
    assert_eq!(
        err(Api::Messages, &without(messages(), "messages")),
        GatewayError::MissingField { field: "messages" }
    );
    for bad in [json!([]), json!("hi"), json!({})] {
        assert_eq!(
            err(Api::Messages, &with(messages(), "messages", bad.clone())),
            invalid("messages", "must be a non-empty array"),
            "{bad}"
        );
    }
}

#[test]
fn messages_system_string_and_text_blocks_give_equal_keys() {
    let string = key_of(Api::Messages, &with(messages(), "system", json!("You are terse.")));
    assert_eq!(string, want(AffinitySource::SystemPrompt, SYS_TERSE));
    for blocks in [
        json!([{ "type": "text", "text": "You are terse." }]),
        json!([{ "type": "text", "text": "You are terse.", "cache_control": { "type": "ephemeral" } }]),
        json!([{ "type": "text", "text": "You are " }, { "type": "text", "text": "terse." }]),
    ] {
        assert_eq!(
            key_of(Api::Messages, &with(messages(), "system", blocks.clone())),
            string,
            "{blocks}"
        );
    }
}

#[test]
fn messages_system_key_matches_chat_and_responses() {
    let chat_key = key_of(Api::Chat, &chat());
    let messages_key = key_of(Api::Messages, &with(messages(), "system", json!("You are terse.")));
    let responses_key = key_of(
        Api::Responses,
        &with(responses(json!("x")), "instructions", json!("You are terse.")),
    );
    assert_eq!(chat_key, messages_key);
    assert_eq!(chat_key, responses_key);
}

#[test]
fn messages_null_or_empty_system_falls_back_to_the_first_user_message() {
    for system in [
        json!(null),
        json!(""),
        json!([]),
        json!([{ "type": "text", "text": "" }]),
    ] {
        assert_eq!(
            key_of(Api::Messages, &with(messages(), "system", system.clone())),
            want(AffinitySource::UserPrefix, USER_HELLO),
            "{system}"
        );
    }
}

#[test]
fn messages_system_of_the_wrong_type_is_refused() {
    for bad in [json!(1), json!(true), json!({ "text": "x" })] {
        assert_eq!(
            err(Api::Messages, &with(messages(), "system", bad.clone())),
            invalid("system", "must be a string or an array of text blocks"),
            "{bad}"
        );
    }
}

#[test]
fn messages_user_prefix_skips_non_text_blocks() {
    let body = with(
        messages(),
        "messages",
        json!([{ "role": "user", "content": [
            { "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo=" } },
            { "type": "text", "text": "look" },
            { "type": "document", "source": { "type": "text", "media_type": "text/plain", "data": "doc body" } } ] }]),
    );
    assert_eq!(
        key_of(Api::Messages, &body),
        want(AffinitySource::UserPrefix, USER_LOOK)
    );
}

#[test]
fn messages_thinking_tool_use_and_assistant_blocks_never_affect_the_key() {
    for system in [Some("You are terse."), None] {
        let mut msgs = vec![json!({ "role": "user", "content": "Hello" })];
        let base = |msgs: &[Value]| {
            let mut b = with(messages(), "messages", Value::Array(msgs.to_vec()));
            if let Some(s) = system {
                b["system"] = json!(s);
            }
            b
        };
        let first = key_of(Api::Messages, &base(&msgs));
        assert_eq!(
            first.as_ref().map(|k| k.1.as_str()),
            Some(if system.is_some() { SYS_TERSE } else { USER_HELLO })
        );
        msgs.push(json!({ "role": "assistant", "content": [
            { "type": "thinking", "thinking": "Let me think about Hello.", "signature": "sig" },
            { "type": "redacted_thinking", "data": "opaque" },
            { "type": "text", "text": "Running a tool." },
            { "type": "tool_use", "id": "tu_1", "name": "bash", "input": { "cmd": "ls" } } ] }));
        msgs.push(json!({ "role": "user", "content": [ { "type": "tool_result", "tool_use_id": "tu_1", "content": "a.txt" } ] }));
        msgs.push(json!({ "role": "assistant", "content": "Done." }));
        let mut body = base(&msgs);
        body["thinking"] = json!({ "type": "enabled", "budget_tokens": 1024 });
        assert_eq!(key_of(Api::Messages, &body), first, "system {system:?}");
    }
}

#[test]
fn messages_metadata_user_id_is_explicit_when_enabled() {
    let cfg = two_backends_with_affinity(r#"{ "anthropic_user_id": true }"#);
    let body = with(
        with(messages(), "system", json!("S")),
        "metadata",
        json!({ "user_id": "u-123" }),
    );
    let d = ok_in(&cfg, Api::Messages, &body);
    let a = d.affinity.unwrap();
    assert_eq!(
        (a.source, a.header_value().as_str()),
        (AffinitySource::UserId, EXPLICIT_U_123)
    );
    assert_eq!(a.source.header_value(), "session");
    assert_eq!(d.echo_session.as_deref(), Some("u-123"));
    // Not enabled: the system prompt decides.
    assert_eq!(
        ok(Api::Messages, &body).affinity.unwrap().source,
        AffinitySource::SystemPrompt
    );
    // The session header and prompt_cache_key still come first.
    let d = routes(
        &cfg,
        Api::Messages,
        body.to_string().as_bytes(),
        Some(&session("sess-1")),
    );
    assert_eq!(hex_of(&d), EXPLICIT_SESS_1);
    let d = ok_in(&cfg, Api::Messages, &with(body, "prompt_cache_key", json!("conv-42")));
    assert_eq!(hex_of(&d), EXPLICIT_CONV_42);
}

#[test]
fn messages_unusable_user_ids_are_ignored_or_refused() {
    let cfg = two_backends_with_affinity(r#"{ "anthropic_user_id": true }"#);
    for ignored in [
        json!(null),
        json!("u-123"),
        json!({}),
        json!({ "user_id": null }),
        json!({ "user_id": 7 }),
        json!({ "user_id": "" }),
    ] {
        let body = with(messages(), "metadata", ignored.clone());
        assert_eq!(hex_of(&ok_in(&cfg, Api::Messages, &body)), USER_HELLO, "{ignored}");
    }
    let body = with(messages(), "metadata", json!({ "user_id": "u\u{7f}" }));
    let e = refuses(&cfg, Api::Messages, body.to_string().as_bytes(), None);
    assert_eq!(e, invalid("metadata", "the value contains control characters"));
    // Not enabled: never refused for it.
    ok(Api::Messages, &body);
}

#[test]
fn messages_errors_render_in_the_anthropic_envelope() {
    let e = err(Api::Messages, &with(messages(), "max_tokens", json!(0)));
    let v: Value = serde_json::from_slice(&e.body(Api::Messages.envelope(), Some("req-1"))).unwrap();
    assert_eq!(Api::Messages.envelope(), Envelope::Anthropic);
    assert_eq!(
        v,
        json!({
            "type": "error",
            "error": { "type": "invalid_request_error", "message": "Invalid value for `max_tokens`: must be a positive integer." },
            "request_id": "req-1"
        })
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Across APIs

#[test]
fn the_same_first_user_text_gives_the_same_key_everywhere() {
    let keys = [
        key_of(
            Api::Chat,
            &json!({ "model": "local-chat", "messages": [ { "role": "user", "content": "Hello" } ] }),
        ),
        key_of(Api::Completions, &completions(json!("Hello"))),
        key_of(Api::Responses, &responses(json!("Hello"))),
        key_of(Api::Messages, &messages()),
    ];
    for k in keys {
        assert_eq!(k, want(AffinitySource::UserPrefix, USER_HELLO));
    }
}

// ---------------------------------------------------------------------------------------------------------------
// A 10-turn conversation, resent with its history appended, keeps its key with no session header

/// Resends the conversation after each turn and returns every key seen.
fn replay(mut body_at: impl FnMut(usize) -> Value, api: Api) -> Vec<Option<Affinity>> {
    (0..10).map(|turn| ok(api, &body_at(turn)).affinity).collect()
}

fn assert_one_key(keys: &[Option<Affinity>], source: AffinitySource, hex: &str) {
    assert_eq!(keys.len(), 10);
    for (turn, k) in keys.iter().enumerate() {
        let k = k.unwrap_or_else(|| panic!("turn {turn}: no key"));
        assert_eq!((k.source, k.header_value().as_str()), (source, hex), "turn {turn}");
    }
}

fn chat_history(system: Option<&str>, turns: usize) -> Value {
    let mut msgs = Vec::new();
    if let Some(s) = system {
        msgs.push(json!({ "role": "system", "content": s }));
    }
    msgs.push(json!({ "role": "user", "content": "Hello" }));
    for i in 0..turns {
        msgs.push(json!({ "role": "assistant", "content": format!("Answer {i}."), "reasoning_content": format!("Reasoning {i}.") }));
        if i % 3 == 1 {
            msgs.push(json!({ "role": "assistant", "content": null, "tool_calls": [ { "id": format!("c{i}"), "type": "function", "function": { "name": "f", "arguments": "{}" } } ] }));
            msgs.push(json!({ "role": "tool", "tool_call_id": format!("c{i}"), "content": "tool output" }));
        }
        msgs.push(json!({ "role": "user", "content": [ { "type": "text", "text": format!("Follow-up {i}") } ] }));
    }
    json!({ "model": "local-chat", "messages": msgs })
}

fn responses_history(instructions: Option<&str>, turns: usize) -> Value {
    let mut items = vec![json!({ "role": "user", "content": [ { "type": "input_text", "text": "Hello" } ] })];
    for i in 0..turns {
        items.push(json!({ "type": "reasoning", "id": format!("rs_{i}"), "summary": [ { "type": "summary_text", "text": format!("Reasoning {i}.") } ] }));
        items.push(json!({ "type": "message", "role": "assistant", "id": format!("msg_{i}"), "content": [ { "type": "output_text", "text": format!("Answer {i}."), "annotations": [] } ] }));
        if i % 3 == 1 {
            items.push(json!({ "type": "function_call", "call_id": format!("c{i}"), "name": "f", "arguments": "{}" }));
            items.push(json!({ "type": "function_call_output", "call_id": format!("c{i}"), "output": "tool output" }));
        }
        items.push(json!({ "role": "user", "content": format!("Follow-up {i}") }));
    }
    let mut body = json!({ "model": "local-chat", "input": items });
    if let Some(s) = instructions {
        body["instructions"] = json!(s);
    }
    body
}

fn messages_history(system: Option<&str>, turns: usize) -> Value {
    let mut msgs = vec![json!({ "role": "user", "content": "Hello" })];
    for i in 0..turns {
        msgs.push(json!({ "role": "assistant", "content": [
            { "type": "thinking", "thinking": format!("Reasoning {i}."), "signature": "sig" },
            { "type": "text", "text": format!("Answer {i}.") },
            { "type": "tool_use", "id": format!("tu_{i}"), "name": "bash", "input": { "cmd": "ls" } } ] }));
        msgs.push(json!({ "role": "user", "content": [
            { "type": "tool_result", "tool_use_id": format!("tu_{i}"), "content": "a.txt" },
            { "type": "text", "text": format!("Follow-up {i}") } ] }));
    }
    let mut body = json!({ "model": "local-chat", "max_tokens": 256, "messages": msgs });
    if let Some(s) = system {
        body["system"] = json!([{ "type": "text", "text": s, "cache_control": { "type": "ephemeral" } }]);
    }
    body
}

#[test]
fn ten_turn_chat_conversation_keeps_its_key() {
    assert_one_key(
        &replay(|t| chat_history(Some("You are terse."), t), Api::Chat),
        AffinitySource::SystemPrompt,
        SYS_TERSE,
    );
    assert_one_key(
        &replay(|t| chat_history(None, t), Api::Chat),
        AffinitySource::UserPrefix,
        USER_HELLO,
    );
}

#[test]
fn ten_turn_responses_conversation_keeps_its_key() {
    assert_one_key(
        &replay(|t| responses_history(Some("Be brief."), t), Api::Responses),
        AffinitySource::SystemPrompt,
        SYS_BRIEF,
    );
    assert_one_key(
        &replay(|t| responses_history(None, t), Api::Responses),
        AffinitySource::UserPrefix,
        USER_HELLO,
    );
}

#[test]
fn ten_turn_messages_conversation_keeps_its_key() {
    assert_one_key(
        &replay(|t| messages_history(Some("You are terse."), t), Api::Messages),
        AffinitySource::SystemPrompt,
        SYS_TERSE,
    );
    assert_one_key(
        &replay(|t| messages_history(None, t), Api::Messages),
        AffinitySource::UserPrefix,
        USER_HELLO,
    );
}

#[test]
fn ten_turn_conversations_land_on_the_same_key_in_every_api() {
    // With no system prompt, all three dialects key on the first user text "Hello" for the same alias.
    let chat = ok(Api::Chat, &chat_history(None, 9)).affinity;
    assert_eq!(ok(Api::Responses, &responses_history(None, 9)).affinity, chat);
    assert_eq!(ok(Api::Messages, &messages_history(None, 9)).affinity, chat);
}

// ---------------------------------------------------------------------------------------------------------------
// Aliases restricted to some endpoints

#[test]
fn alias_endpoints_restrict_the_apis_it_serves() {
    let cfg = one_alias(r#""endpoints": ["chat", "completions", "responses", "messages"]"#, None);
    let bodies = [
        (Api::Chat, r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#),
        (Api::Completions, r#"{"model":"m","prompt":"x"}"#),
        (Api::Responses, r#"{"model":"m","input":"x"}"#),
        (
            Api::Messages,
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}]}"#,
        ),
    ];
    for (api, body) in bodies {
        routes(&cfg, api, body.as_bytes(), None);
    }
    let e = refuses(&cfg, Api::Embeddings, br#"{"model":"m","input":"x"}"#, None);
    assert_eq!(
        e,
        GatewayError::EndpointNotServed {
            model: "m".into(),
            api: Api::Embeddings
        }
    );
    assert_eq!(
        (e.status(), e.code(), e.param()),
        (404, "endpoint_not_served", Some("model"))
    );
    assert_eq!(e.to_string(), "The model `m` is not served on /v1/embeddings.");
}

#[test]
fn endpoint_not_served_renders_in_the_routes_envelope() {
    let cfg = one_alias(r#""endpoints": ["embeddings"]"#, None);
    for api in [
        Api::Chat,
        Api::Completions,
        Api::Responses,
        Api::Messages,
        Api::Decisions,
        Api::SystemOne,
    ] {
        let e = refuses(
            &cfg,
            api,
            br#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1,"input":"x","prompt":"x"}"#,
            None,
        );
        assert_eq!(e.code(), "endpoint_not_served", "{}", api.name());
        let v: Value = serde_json::from_slice(&e.body(api.envelope(), Some("rid"))).unwrap();
        match api.envelope() {
            Envelope::Anthropic => {
                assert_eq!(v["type"], "error");
                assert_eq!(v["error"]["type"], "not_found_error");
            }
            Envelope::OpenAi => {
                assert_eq!(v["error"]["code"], "endpoint_not_served");
                assert_eq!(v["error"]["param"], "model");
            }
            Envelope::SystemOne => {
                assert_eq!(v["error"]["code"], "endpoint_not_served");
                assert_eq!(v["error"]["request_id"], "rid");
            }
        }
        assert_eq!(v["request_id"], "rid");
    }
}

#[test]
fn endpoint_restriction_comes_before_body_checks() {
    // The body would be refused as a messages body (no max_tokens), but the alias does not serve messages at all.
    let cfg = one_alias(r#""endpoints": ["chat"]"#, None);
    let e = refuses(&cfg, Api::Messages, br#"{"model":"m","messages":[]}"#, None);
    assert_eq!(e.status(), 404);
    assert_eq!(e.code(), "endpoint_not_served");
}

#[test]
fn aliases_without_endpoints_serve_everything() {
    let cfg = one_alias("", None);
    routes(&cfg, Api::Embeddings, br#"{"model":"m","input":"x"}"#, None);
    routes(
        &cfg,
        Api::Messages,
        br#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}]}"#,
        None,
    );
}

// ---------------------------------------------------------------------------------------------------------------
// <alias>/<upstream> prefix routing

fn prefix_cfg() -> Config {
    one_alias(r#""model_prefix_routing": true"#, None)
}

#[test]
fn prefix_routing_sends_the_rest_upstream_unchanged() {
    let body = r#"{"model":"m/upstream-x","messages":[{"role":"user","content":"Hello"}]}"#;
    let d = routes(&prefix_cfg(), Api::Chat, body.as_bytes(), None);
    assert_eq!(
        (d.alias.as_str(), d.cluster.as_str(), d.upstream_model.as_str()),
        ("m", "b", "upstream-x")
    );
    let out = d.patch.as_ref().unwrap().apply(body.as_bytes());
    assert_eq!(
        String::from_utf8(out).unwrap(),
        body.replace("m/upstream-x", "upstream-x")
    );
    assert_eq!(d.body_len(body.len()), Some(body.len() - 2));
}

#[test]
fn prefix_routing_keeps_later_slashes_and_odd_characters() {
    for (model, upstream) in [
        ("m/Qwen/Qwen3-32B", "Qwen/Qwen3-32B"),
        ("m/org/model:latest", "org/model:latest"),
        ("m//x", "/x"),
        ("m/m", "m"),
    ] {
        let body = json!({ "model": model, "input": "x" });
        let d = routes(&prefix_cfg(), Api::Responses, body.to_string().as_bytes(), None);
        assert_eq!(d.upstream_model, upstream, "{model}");
        let out: Value = serde_json::from_slice(&d.patch.unwrap().apply(body.to_string().as_bytes())).unwrap();
        assert_eq!(out["model"], upstream, "{model}");
    }
}

#[test]
fn prefix_routing_resolves_an_escaped_slash() {
    let body = r#"{"model":"m\/upstream-x","input":"x"}"#;
    let d = routes(&prefix_cfg(), Api::Responses, body.as_bytes(), None);
    assert_eq!(d.upstream_model, "upstream-x");
}

#[test]
fn the_exact_alias_still_uses_its_route() {
    let d = routes(
        &prefix_cfg(),
        Api::Chat,
        br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
        None,
    );
    assert_eq!(d.upstream_model, "up");
}

#[test]
fn prefix_routing_needs_the_flag() {
    let cfg = one_alias("", None);
    let e = refuses(
        &cfg,
        Api::Chat,
        br#"{"model":"m/upstream-x","messages":[{"role":"user","content":"x"}]}"#,
        None,
    );
    assert_eq!(
        e,
        GatewayError::UnknownModel {
            model: "m/upstream-x".into()
        }
    );
    assert_eq!(e.status(), 404);
    let cfg = one_alias(r#""model_prefix_routing": false"#, None);
    assert_eq!(
        refuses(&cfg, Api::Responses, br#"{"model":"m/x","input":"x"}"#, None).code(),
        "model_not_found"
    );
}

#[test]
fn prefix_routing_refuses_an_empty_rest_and_unknown_prefixes() {
    for model in ["m/", "/x", "other/x", "M/x", "m", "mm/x"] {
        let body = json!({ "model": model, "input": "x" });
        let r = route(&prefix_cfg(), Api::Responses, body.to_string().as_bytes(), None);
        if model == "m" {
            assert!(r.is_ok());
            continue;
        }
        let e = r.unwrap_err();
        assert_eq!((e.status(), e.code()), (404, "model_not_found"), "{model}");
    }
}

#[test]
fn prefix_routed_requests_key_on_the_alias() {
    // Content keys are scoped by the resolved alias, whatever follows the slash.
    let cfg = prefix_cfg();
    let body =
        |model: &str| json!({ "model": model, "messages": [ { "role": "system", "content": "S" } ] }).to_string();
    let plain = routes(&cfg, Api::Chat, body("m").as_bytes(), None).affinity;
    assert_eq!(routes(&cfg, Api::Chat, body("m/a").as_bytes(), None).affinity, plain);
    assert_eq!(routes(&cfg, Api::Chat, body("m/b").as_bytes(), None).affinity, plain);
}

#[test]
fn prefix_routing_honours_the_alias_endpoints() {
    let cfg = one_alias(r#""model_prefix_routing": true, "endpoints": ["messages"]"#, None);
    routes(
        &cfg,
        Api::Messages,
        br#"{"model":"m/x","max_tokens":1,"messages":[{"role":"user","content":"x"}]}"#,
        None,
    );
    let e = refuses(
        &cfg,
        Api::Chat,
        br#"{"model":"m/x","messages":[{"role":"user","content":"x"}]}"#,
        None,
    );
    assert_eq!(
        e,
        GatewayError::EndpointNotServed {
            model: "m/x".into(),
            api: Api::Chat
        }
    );
}

#[test]
fn an_exact_alias_containing_a_slash_wins_over_prefix_routing() {
    let cfg = common::config(
        r#"{"version":1,"backends":[{"name":"b","kind":"vllm","endpoints":["10.0.0.1:8000"]},
                                    {"name":"c","kind":"vllm","endpoints":["10.0.0.2:8000"]}],
            "models":[{"name":"org","routes":[{"backend":"b"}],"model_prefix_routing":true},
                      {"name":"org/model","routes":[{"backend":"c","upstream_model":"exact"}]}]}"#,
    );
    let d = routes(&cfg, Api::Responses, br#"{"model":"org/model","input":"x"}"#, None);
    assert_eq!(
        (d.alias.as_str(), d.cluster.as_str(), d.upstream_model.as_str()),
        ("org/model", "c", "exact")
    );
    let d = routes(&cfg, Api::Responses, br#"{"model":"org/other","input":"x"}"#, None);
    assert_eq!(
        (d.alias.as_str(), d.cluster.as_str(), d.upstream_model.as_str()),
        ("org", "b", "other")
    );
}
