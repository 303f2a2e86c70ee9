//! The affinity key: which source wins, what feeds the hash, what never does, and the exact hash values.
//!
//! The expected hashes were computed independently with Python's `xxhash` (`xxh3_64`):
//! - explicit keys: `b"llmroute/session\0" + value` (not scoped by alias);
//! - system keys: `b"llmroute/system\0" + alias + b"\x1e" + texts joined by b"\x1e"`;
//! - user-prefix keys: `b"llmroute/user\0" + alias + b"\x1e" + prefix`, the prefix cut on a character boundary.
//!
//! So a change in hashing, tagging, alias scoping or joining is caught.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{
    borrowed, lookup, refuses, routes, sdk_api, sdk_body, sdk_headers, two_backends, two_backends_with_affinity,
};
use llmroute_core::affinity::{check_explicit, explicit, ContentKey, EXPLICIT_MAX};
use llmroute_core::{route, session_from_headers, Affinity, AffinitySource, Api, Config, GatewayError, SessionKey};

// Independently computed hashes (see the module comment).
const EXPLICIT_CONV_42: &str = "ad8ebf05ba1818ab";
const EXPLICIT_CC_SESS_1: &str = "9e43ef241c784e8b";
const EXPLICIT_RESP_1: &str = "356b5dc210fbc54f";
const EXPLICIT_CONV_ABC: &str = "b628576d12d20006";
const EXPLICIT_U_123: &str = "edd6629f6dda37d0";
const EXPLICIT_SESS_1: &str = "b121c6fa7ec55f68";
/// system, alias `local-chat`, "You are terse."
const SYS_TERSE: &str = "cadd8de9b9e431eb";
/// system, alias `big`, "You are terse."
const SYS_TERSE_BIG: &str = "a9b2cb074797617b";
/// system, alias `same`, "You are terse."
const SYS_TERSE_SAME: &str = "39d1b4499360004e";
/// system, `local-chat`, "Follow policy."
const SYS_POLICY: &str = "86acf188b86ad3e1";
/// system, `local-chat`, "Agent system prompt part 1.Part 2." (two text parts of one message, joined as is)
const SYS_AGENT_PARTS: &str = "2efa9f2c00ca61dd";
/// system, `local-chat`, "Be brief."
const SYS_BRIEF: &str = "4c843396f367cd42";
/// system, `local-chat`, "You are Claude Code."
const SYS_CLAUDE_CODE: &str = "70686f68f77d4652";
/// system, `local-chat`, "Long cached system prompt"
const SYS_LONG_CACHED: &str = "45b59b8a4766d4a9";
/// system, `local-chat`, "You are terse." 0x1e "Be kind." (two system messages)
const SYS_TERSE_KIND: &str = "aef1dedd96070cfa";
/// user prefix, `local-chat`, "Hello"
const USER_HELLO: &str = "2d8bcc3346a2882e";
/// user prefix, `big`, "Hello"
const USER_HELLO_BIG: &str = "41041af1134a9478";
/// user prefix, `local-chat`, "hi"
const USER_HI: &str = "ed14fc2be6a5b3ae";
/// user prefix, `local-chat`, "Once upon a time"
const USER_ONCE: &str = "5082986afb7a428c";
/// user prefix, `local-chat`, "Plain string input"
const USER_PLAIN: &str = "7d45bcd5e5acad76";
/// user prefix, `local-chat`, "stream"
const USER_STREAM: &str = "139f38cb97c03866";
/// user prefix, `local-chat`, "aé" (what is left of "aé€" under a 4-byte limit)
const USER_AE_4: &str = "83c3ff47a32ba9c9";

/// A chat body for alias `local-chat` with the given messages array.
fn chat_body(messages: &str) -> String {
    format!(r#"{{"model":"local-chat","messages":{messages}}}"#)
}

/// The content key of a chat messages array, alias `local-chat`, default config.
fn key(messages: &str) -> Option<Affinity> {
    key_in(&two_backends(), messages)
}

fn key_in(cfg: &Config, messages: &str) -> Option<Affinity> {
    routes(cfg, Api::Chat, chat_body(messages).as_bytes(), None).affinity
}

/// The content key with a `user_prefix_bytes` of `prefix`.
fn key_with(messages: &str, prefix: usize) -> Option<Affinity> {
    key_in(
        &two_backends_with_affinity(&format!(r#"{{ "user_prefix_bytes": {prefix} }}"#)),
        messages,
    )
}

fn hex(a: Option<Affinity>) -> String {
    a.map(|a| a.header_value()).unwrap_or_default()
}

fn user(text: &str) -> String {
    serde_json::json!({ "role": "user", "content": text }).to_string()
}

fn system(text: &str) -> String {
    serde_json::json!({ "role": "system", "content": text }).to_string()
}

fn assistant(text: &str) -> String {
    serde_json::json!({ "role": "assistant", "content": text }).to_string()
}

fn arr(msgs: &[String]) -> String {
    format!("[{}]", msgs.join(","))
}

fn session_key(value: &str) -> SessionKey {
    SessionKey {
        value: value.to_string(),
        affinity: explicit(value.as_bytes(), AffinitySource::SessionHeader),
    }
}

fn assert_key(a: Option<Affinity>, source: AffinitySource, hex_value: &str) {
    let a = a.unwrap_or_else(|| panic!("expected a {source:?} key {hex_value}, got none"));
    assert_eq!((a.source, a.header_value().as_str()), (source, hex_value));
}

// ---------------------------------------------------------------------------------------------------------------
// Precedence: prompt_cache_key, then the session header, then the dialect's explicit id, then content

#[test]
fn prompt_cache_key_beats_a_session_header() {
    let body = chat_body(&arr(&[system("S"), user("U")]));
    let body = body.replacen('{', r#"{"prompt_cache_key":"conv-42","#, 1);
    let d = routes(
        &two_backends(),
        Api::Chat,
        body.as_bytes(),
        Some(&session_key("sess-1")),
    );
    assert_key(d.affinity, AffinitySource::PromptCacheKey, EXPLICIT_CONV_42);
    assert_eq!(d.echo_session.as_deref(), Some("conv-42"));
}

#[test]
fn session_header_beats_the_content_key() {
    let body = chat_body(&arr(&[system("You are terse."), user("Hello")]));
    let d = routes(
        &two_backends(),
        Api::Chat,
        body.as_bytes(),
        Some(&session_key("sess-1")),
    );
    assert_key(d.affinity, AffinitySource::SessionHeader, EXPLICIT_SESS_1);
    assert_eq!(d.echo_session.as_deref(), Some("sess-1"));
}

#[test]
fn prompt_cache_key_beats_the_system_prompt() {
    let body = r#"{"model":"local-chat","messages":[{"role":"system","content":"S"}],"prompt_cache_key":"conv-42"}"#;
    let d = routes(&two_backends(), Api::Chat, body.as_bytes(), None);
    assert_key(d.affinity, AffinitySource::PromptCacheKey, EXPLICIT_CONV_42);
}

#[test]
fn system_prompt_beats_the_user_prefix() {
    assert_key(
        key(&arr(&[system("You are terse."), user("Hello")])),
        AffinitySource::SystemPrompt,
        SYS_TERSE,
    );
}

#[test]
fn user_prefix_is_the_fallback_without_a_system_prompt() {
    assert_key(key(&arr(&[user("Hello")])), AffinitySource::UserPrefix, USER_HELLO);
}

#[test]
fn content_keys_are_never_echoed() {
    let d = routes(
        &two_backends(),
        Api::Chat,
        chat_body(&arr(&[system("S"), user("U")])).as_bytes(),
        None,
    );
    assert!(d.affinity.is_some());
    assert_eq!(d.echo_session, None);
}

#[test]
fn no_text_anywhere_gives_no_key() {
    for messages in [
        r#"[{"role":"assistant","content":"a"},{"role":"tool","content":"t"}]"#,
        r#"[{"role":"user","content":null}]"#,
        r#"[{"role":"user"}]"#,
        r#"[{"content":"no role"}]"#,
        r#"[1, "x", null]"#,
    ] {
        let d = routes(&two_backends(), Api::Chat, chat_body(messages).as_bytes(), None);
        assert_eq!((d.affinity, d.echo_session), (None, None), "{messages}");
    }
}

#[test]
fn explicit_keys_share_one_namespace_across_sources() {
    // The same id reaches the same host whichever way the client sends it; only the reported source differs.
    let sources = [
        AffinitySource::PromptCacheKey,
        AffinitySource::SessionHeader,
        AffinitySource::Conversation,
        AffinitySource::UserId,
    ];
    for s in sources {
        let a = explicit(b"conv-42", s);
        assert_eq!((a.source, a.header_value().as_str()), (s, EXPLICIT_CONV_42));
    }
}

#[test]
fn explicit_keys_share_one_namespace_through_every_api() {
    let cfg = two_backends_with_affinity(r#"{ "conversation_id": true, "anthropic_user_id": true }"#);
    let cases: [(Api, &str, Option<SessionKey>, AffinitySource); 5] = [
        (
            Api::Chat,
            r#"{"model":"local-chat","messages":[{"role":"user","content":"x"}],"prompt_cache_key":"conv-42"}"#,
            None,
            AffinitySource::PromptCacheKey,
        ),
        (
            Api::Chat,
            r#"{"model":"local-chat","messages":[{"role":"user","content":"x"}]}"#,
            Some(session_key("conv-42")),
            AffinitySource::SessionHeader,
        ),
        (
            Api::Responses,
            r#"{"model":"local-chat","input":"x","conversation":"conv-42"}"#,
            None,
            AffinitySource::Conversation,
        ),
        (
            Api::Messages,
            r#"{"model":"local-chat","max_tokens":8,"messages":[{"role":"user","content":"x"}],"metadata":{"user_id":"conv-42"}}"#,
            None,
            AffinitySource::UserId,
        ),
        (
            Api::Completions,
            r#"{"model":"local-chat","prompt":"x","prompt_cache_key":"conv-42"}"#,
            None,
            AffinitySource::PromptCacheKey,
        ),
    ];
    for (api, body, session, source) in cases {
        let d = routes(&cfg, api, body.as_bytes(), session.as_ref());
        assert_key(d.affinity, source, EXPLICIT_CONV_42);
        assert_eq!(d.echo_session.as_deref(), Some("conv-42"), "{body}");
    }
}

#[test]
fn explicit_keys_are_not_scoped_by_alias() {
    let cfg = two_backends();
    for alias in ["local-chat", "big", "same"] {
        let body = format!(
            r#"{{"model":"{alias}","messages":[{{"role":"system","content":"S"}}],"prompt_cache_key":"conv-42"}}"#
        );
        assert_key(
            routes(&cfg, Api::Chat, body.as_bytes(), None).affinity,
            AffinitySource::PromptCacheKey,
            EXPLICIT_CONV_42,
        );
    }
}

#[test]
fn content_keys_are_scoped_by_alias() {
    let cfg = two_backends();
    for (alias, want) in [
        ("local-chat", SYS_TERSE),
        ("big", SYS_TERSE_BIG),
        ("same", SYS_TERSE_SAME),
    ] {
        let body = format!(
            r#"{{"model":"{alias}","messages":[{{"role":"system","content":"You are terse."}},{{"role":"user","content":"x"}}]}}"#
        );
        assert_key(
            routes(&cfg, Api::Chat, body.as_bytes(), None).affinity,
            AffinitySource::SystemPrompt,
            want,
        );
    }
    for (alias, want) in [("local-chat", USER_HELLO), ("big", USER_HELLO_BIG)] {
        let body = format!(r#"{{"model":"{alias}","messages":[{{"role":"user","content":"Hello"}}]}}"#);
        assert_key(
            routes(&cfg, Api::Chat, body.as_bytes(), None).affinity,
            AffinitySource::UserPrefix,
            want,
        );
    }
}

#[test]
fn the_alias_not_the_upstream_name_scopes_the_key() {
    // `local-chat` goes upstream as `qwen3-0.6b`; a second alias with the same upstream must not share keys.
    let cfg = common::config(
        r#"{"version":1,"backends":[{"name":"b","kind":"vllm","endpoints":["10.0.0.1:80"]}],
            "models":[{"name":"a1","routes":[{"backend":"b","upstream_model":"same-up"}]},
                      {"name":"a2","routes":[{"backend":"b","upstream_model":"same-up"}]}]}"#,
    );
    let k = |alias: &str| {
        let body = format!(r#"{{"model":"{alias}","messages":[{{"role":"system","content":"S"}}]}}"#);
        routes(&cfg, Api::Chat, body.as_bytes(), None).affinity.unwrap()
    };
    assert_ne!(k("a1").hash, k("a2").hash);
}

#[test]
fn namespaces_keep_equal_texts_apart() {
    let s = key(&arr(&[system("same")])).unwrap();
    let u = key(&arr(&[user("same")])).unwrap();
    let e = explicit(b"same", AffinitySource::SessionHeader);
    assert_ne!(s.hash, u.hash);
    assert_ne!(s.hash, e.hash);
    assert_ne!(u.hash, e.hash);
}

#[test]
fn the_alias_and_the_text_do_not_run_together() {
    // Without the separator, alias "ab" + text "c" would equal alias "a" + text "bc".
    let mut k1 = ContentKey::system("ab");
    k1.feed("c");
    let mut k2 = ContentKey::system("a");
    k2.feed("bc");
    assert_ne!(k1.finish(), k2.finish());
}

// ---------------------------------------------------------------------------------------------------------------
// The system prompt

#[test]
fn system_string_and_text_part_array_hash_the_same() {
    let as_string = key(&arr(&[system("You are terse."), user("x")])).unwrap();
    let as_parts =
        key(r#"[{"role":"system","content":[{"type":"text","text":"You are terse."}]},{"role":"user","content":"y"}]"#)
            .unwrap();
    assert_eq!(as_string, as_parts);
    assert_eq!(as_string.header_value(), SYS_TERSE);
}

#[test]
fn text_parts_are_joined_without_a_separator() {
    let parts = key(
        r#"[{"role":"system","content":[{"type":"text","text":"Agent system prompt part 1."},{"type":"text","text":"Part 2."}]}]"#,
    );
    assert_key(parts, AffinitySource::SystemPrompt, SYS_AGENT_PARTS);
    assert_eq!(parts, key(&arr(&[system("Agent system prompt part 1.Part 2.")])));
}

#[test]
fn non_text_parts_of_the_system_prompt_are_skipped() {
    let with_image = key(
        r#"[{"role":"system","content":[{"type":"image_url","image_url":{"url":"data:x"}},{"type":"text","text":"You are terse."},"stray",7]}]"#,
    );
    assert_key(with_image, AffinitySource::SystemPrompt, SYS_TERSE);
}

#[test]
fn text_parts_without_a_type_still_count() {
    let untyped = key(r#"[{"role":"system","content":[{"text":"You are terse."}]}]"#);
    assert_key(untyped, AffinitySource::SystemPrompt, SYS_TERSE);
}

#[test]
fn developer_role_counts_as_system() {
    let dev = key(r#"[{"role":"developer","content":"Follow policy."},{"role":"user","content":"x"}]"#);
    assert_key(dev, AffinitySource::SystemPrompt, SYS_POLICY);
    assert_eq!(dev, key(&arr(&[system("Follow policy.")])));
}

#[test]
fn multiple_leading_system_messages_all_count() {
    let two = key(&arr(&[system("You are terse."), system("Be kind."), user("hi")]));
    assert_key(two, AffinitySource::SystemPrompt, SYS_TERSE_KIND);
    let one = key(&arr(&[system("You are terse."), user("hi")]));
    assert_ne!(two, one);
    let mixed = key(r#"[{"role":"system","content":"You are terse."},{"role":"developer","content":"Be kind."}]"#);
    assert_eq!(mixed, two);
}

#[test]
fn system_messages_are_separated_so_splits_do_not_collide() {
    let split = key(&arr(&[system("ab"), system("c")])).unwrap();
    let other = key(&arr(&[system("a"), system("bc")])).unwrap();
    let joined = key(&arr(&[system("abc")])).unwrap();
    assert_ne!(split, other);
    assert_ne!(split, joined);
}

#[test]
fn system_message_order_matters() {
    assert_ne!(
        key(&arr(&[system("A"), system("B")])),
        key(&arr(&[system("B"), system("A")]))
    );
}

#[test]
fn system_messages_after_the_conversation_starts_do_not_count() {
    let base = key(&arr(&[system("S"), user("U")])).unwrap();
    let late = key(&arr(&[system("S"), user("U"), system("injected later")])).unwrap();
    assert_eq!(base, late);
    // A system message after a user turn is not a system prompt at all.
    let only_late = key(&arr(&[user("U"), system("S")])).unwrap();
    assert_eq!(only_late.source, AffinitySource::UserPrefix);
}

#[test]
fn an_empty_leading_system_message_does_not_change_the_key() {
    let plain = key(&arr(&[system("You are terse."), user("Hello")]));
    assert_key(plain, AffinitySource::SystemPrompt, SYS_TERSE);
    for empty in [
        system(""),
        r#"{"role":"system","content":[]}"#.to_string(),
        r#"{"role":"system","content":null}"#.to_string(),
        r#"{"role":"system"}"#.to_string(),
        r#"{"role":"developer","content":[{"type":"text","text":""}]}"#.to_string(),
    ] {
        let with_empty = key(&arr(&[empty.clone(), system("You are terse."), user("Hello")]));
        assert_eq!(with_empty, plain, "{empty}");
    }
}

#[test]
fn empty_system_text_falls_through_to_the_user_prefix() {
    for messages in [
        arr(&[system(""), user("Hello")]),
        r#"[{"role":"system","content":[]},{"role":"user","content":"Hello"}]"#.to_string(),
        r#"[{"role":"system","content":null},{"role":"user","content":"Hello"}]"#.to_string(),
        r#"[{"role":"system","content":[{"type":"image_url","image_url":{"url":"u"}}]},{"role":"user","content":"Hello"}]"#
            .to_string(),
    ] {
        assert_key(key(&messages), AffinitySource::UserPrefix, USER_HELLO);
    }
}

#[test]
fn escaped_text_hashes_as_its_decoded_value() {
    let escaped = key(r#"[{"role":"sys\u0074em","content":"You are t\u0065rse."}]"#);
    assert_key(escaped, AffinitySource::SystemPrompt, SYS_TERSE);
    let user_escaped = key(r#"[{"role":"user","content":"H\u0065llo"}]"#);
    assert_key(user_escaped, AffinitySource::UserPrefix, USER_HELLO);
}

#[test]
fn roles_are_case_sensitive() {
    let a = key(r#"[{"role":"System","content":"S"},{"role":"user","content":"Hello"}]"#);
    assert_key(a, AffinitySource::UserPrefix, USER_HELLO);
}

// ---------------------------------------------------------------------------------------------------------------
// Conversations grow; the key does not move

#[test]
fn assistant_turns_never_change_the_system_key() {
    let mut turns = vec![system("You are terse."), user("first question")];
    let first = key(&arr(&turns)).unwrap();
    for i in 0..10 {
        turns.push(
            serde_json::json!({
                "role": "assistant",
                "content": format!("answer {i}"),
                "reasoning_content": format!("thinking about {i}"),
            })
            .to_string(),
        );
        assert_eq!(key(&arr(&turns)).unwrap(), first, "after assistant turn {i}");
        turns.push(user(&format!("follow-up {i}")));
        assert_eq!(key(&arr(&turns)).unwrap(), first, "after user turn {i}");
    }
    assert_eq!(first.header_value(), SYS_TERSE);
}

#[test]
fn growing_conversation_without_system_keeps_the_first_user_key() {
    let mut turns = vec![user("Hello")];
    let first = key(&arr(&turns)).unwrap();
    for i in 0..10 {
        turns.push(assistant(&format!("answer {i}")));
        turns.push(user(&format!("follow-up {i}")));
        assert_eq!(key(&arr(&turns)).unwrap(), first, "turn {i}");
    }
    assert_eq!(first.header_value(), USER_HELLO);
}

#[test]
fn tool_calls_and_tool_results_do_not_change_the_key() {
    let base = key(&arr(&[system("S"), user("U")])).unwrap();
    let with_tools = key(&format!(
        "[{},{},{},{}]",
        system("S"),
        user("U"),
        r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}"#,
        r#"{"role":"tool","tool_call_id":"c","content":"result"}"#
    ))
    .unwrap();
    assert_eq!(base, with_tools);
}

#[test]
fn leading_assistant_turn_is_skipped_for_the_user_prefix() {
    assert_key(
        key(&arr(&[assistant("greeting"), user("Hello")])),
        AffinitySource::UserPrefix,
        USER_HELLO,
    );
}

// ---------------------------------------------------------------------------------------------------------------
// The user prefix

#[test]
fn user_messages_differing_only_after_the_prefix_share_a_key() {
    let common_prefix = "p".repeat(256);
    let a = key(&arr(&[user(&format!("{common_prefix} tail one"))])).unwrap();
    let b = key(&arr(&[user(&format!(
        "{common_prefix} and a completely different tail"
    ))]))
    .unwrap();
    assert_eq!(a, b);
    assert_eq!(a, key(&arr(&[user(&common_prefix)])).unwrap());
}

#[test]
fn user_messages_differing_before_the_prefix_end_do_not() {
    let mut a = "p".repeat(300);
    let mut b = a.clone();
    a.replace_range(255..256, "x");
    b.replace_range(255..256, "y");
    assert_ne!(key(&arr(&[user(&a)])), key(&arr(&[user(&b)])));
}

#[test]
fn configured_prefix_length_is_respected() {
    assert_eq!(
        key_with(&arr(&[user("abcdXXX")]), 4),
        key_with(&arr(&[user("abcdYYY")]), 4)
    );
    assert_ne!(
        key_with(&arr(&[user("abcXYYY")]), 4),
        key_with(&arr(&[user("abcdYYY")]), 4)
    );
    assert_eq!(
        key_with(&arr(&[user("abcdXXX")]), 4),
        key_with(&arr(&[user("abcd")]), 1000)
    );
}

#[test]
fn prefix_is_cut_on_a_utf8_boundary() {
    // "aé" is 3 bytes; "€" (3 bytes) and "😀" (4 bytes) straddle a 4-byte limit and are dropped whole.
    let euro = key_with(&arr(&[user("aé€")]), 4);
    let emoji = key_with(&arr(&[user("aé😀")]), 4);
    assert_eq!(euro, emoji);
    assert_key(euro, AffinitySource::UserPrefix, USER_AE_4);
    assert_eq!(euro, key_with(&arr(&[user("aé")]), 256));
    // A limit inside the first character cuts it away: nothing is left, so there is no key.
    assert_eq!(key_with(&arr(&[user("€uro")]), 2), None);
}

#[test]
fn prefix_boundary_at_every_limit_never_panics() {
    let text = "aé€😀中x";
    for max in 0..=text.len() + 2 {
        let mut k = ContentKey::user_prefix("local-chat", max);
        k.feed(text);
        assert_eq!(k.finish().is_some(), max >= 1, "max {max}");
    }
}

#[test]
fn prefix_spans_text_parts() {
    let parts = key_with(
        r#"[{"role":"user","content":[{"type":"text","text":"ab"},{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"cdef"}]}]"#,
        4,
    );
    assert_eq!(parts, key_with(&arr(&[user("abcdZZ")]), 4));
}

#[test]
fn zero_user_prefix_bytes_turns_the_fallback_off() {
    assert_eq!(key_with(&arr(&[user("Hello")]), 0), None);
    // The system prompt still counts.
    assert_key(
        key_with(&arr(&[system("You are terse."), user("Hello")]), 0),
        AffinitySource::SystemPrompt,
        SYS_TERSE,
    );
}

#[test]
fn image_only_user_message_gives_no_key() {
    assert_eq!(
        key(r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]"#),
        None
    );
}

#[test]
fn only_the_first_user_message_feeds_the_prefix() {
    // An image-only first message leaves no key even if a later user message has text.
    assert_eq!(
        key(
            r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]},{"role":"user","content":"later"}]"#
        ),
        None
    );
    assert_key(
        key(&arr(&[user("Hello"), user("something else")])),
        AffinitySource::UserPrefix,
        USER_HELLO,
    );
}

#[test]
fn empty_user_text_gives_no_key() {
    assert_eq!(key(&arr(&[user("")])), None);
}

// ---------------------------------------------------------------------------------------------------------------
// ContentKey directly

#[test]
fn content_key_values_match_the_independent_computation() {
    let mut k = ContentKey::system("local-chat");
    k.feed("You are terse.");
    assert_eq!(hex(k.finish()), SYS_TERSE);
    let mut k = ContentKey::system("local-chat");
    k.separate();
    k.feed("You are terse.");
    k.separate();
    k.feed("Be kind.");
    assert_eq!(hex(k.finish()), SYS_TERSE_KIND);
    let mut k = ContentKey::user_prefix("local-chat", 256);
    k.feed("Hello");
    let a = k.finish().unwrap();
    assert_eq!(
        (a.source, a.header_value().as_str()),
        (AffinitySource::UserPrefix, USER_HELLO)
    );
}

#[test]
fn feeding_in_pieces_equals_feeding_at_once() {
    let mut whole = ContentKey::system("m");
    whole.feed("You are terse.");
    let mut pieces = ContentKey::system("m");
    for p in ["You", " are", "", " terse."] {
        pieces.feed(p);
    }
    assert_eq!(whole.finish(), pieces.finish());
}

#[test]
fn a_separator_before_any_text_is_not_hashed() {
    let mut a = ContentKey::system("m");
    a.separate();
    a.separate();
    a.feed("x");
    let mut b = ContentKey::system("m");
    b.feed("x");
    assert_eq!(a.finish(), b.finish());
}

#[test]
fn feed_reports_when_a_prefix_key_is_full() {
    let mut k = ContentKey::user_prefix("m", 5);
    assert!(k.feed("ab"));
    assert!(!k.feed("cde"), "exactly full");
    let mut k = ContentKey::user_prefix("m", 5);
    assert!(!k.feed("abcdefgh"), "overflowing");
    let mut k = ContentKey::system("m");
    assert!(k.feed(&"x".repeat(100_000)), "system keys never fill");
}

#[test]
fn no_text_no_key() {
    assert_eq!(ContentKey::system("m").finish(), None);
    let mut k = ContentKey::user_prefix("m", 10);
    k.feed("");
    k.separate();
    assert_eq!(k.finish(), None);
    let mut k = ContentKey::user_prefix("m", 0);
    k.feed("text");
    assert_eq!(k.finish(), None);
}

// ---------------------------------------------------------------------------------------------------------------
// Explicit values

#[test]
fn explicit_limit_is_256() {
    assert_eq!(EXPLICIT_MAX, 256);
}

#[test]
fn empty_explicit_value_is_rejected() {
    assert_eq!(check_explicit(b""), Err("the value is empty"));
}

#[test]
fn overlong_explicit_value_is_rejected() {
    assert_eq!(check_explicit(&[b'a'; 257]), Err("the value is longer than 256 bytes"));
    assert_eq!(check_explicit(&[b'a'; 256]), Ok(()));
    assert_eq!(check_explicit(b"a"), Ok(()));
}

#[test]
fn control_characters_in_explicit_values_are_rejected() {
    for bad in [&b"a\x00b"[..], b"a\tb", b"a\nb", b"a\rb", b"\x1f", b"a\x7fb", b"\x01"] {
        assert_eq!(
            check_explicit(bad),
            Err("the value contains control characters"),
            "{bad:?}"
        );
    }
}

#[test]
fn printable_and_utf8_explicit_values_are_accepted() {
    for good in ["a", "sess 1", "conv-42", "ü-session-€", "😀", "~!@#$%^&*()_+{}|:\"<>?"] {
        assert_eq!(check_explicit(good.as_bytes()), Ok(()), "{good}");
    }
    // 256 bytes of multi-byte characters: at the limit, accepted.
    let v = "é".repeat(128);
    assert_eq!(v.len(), 256);
    assert_eq!(check_explicit(v.as_bytes()), Ok(()));
    assert!(check_explicit(format!("{v}a").as_bytes()).is_err());
}

#[test]
fn known_explicit_hash_values_are_fixed() {
    for (value, want) in [
        ("conv-42", EXPLICIT_CONV_42),
        ("cc-sess-1", EXPLICIT_CC_SESS_1),
        ("resp-1", EXPLICIT_RESP_1),
        ("conv_abc", EXPLICIT_CONV_ABC),
        ("u-123", EXPLICIT_U_123),
        ("sess-1", EXPLICIT_SESS_1),
    ] {
        assert_eq!(
            explicit(value.as_bytes(), AffinitySource::SessionHeader).header_value(),
            want,
            "{value}"
        );
    }
    assert_eq!(
        explicit(b"conv-42", AffinitySource::SessionHeader).hash,
        0xad8e_bf05_ba18_18ab
    );
}

#[test]
fn hashes_are_deterministic() {
    let msgs = arr(&[system("S"), user("U")]);
    let first = key(&msgs);
    for _ in 0..50 {
        assert_eq!(key(&msgs), first);
    }
    assert_eq!(
        explicit(b"x", AffinitySource::SessionHeader),
        explicit(b"x", AffinitySource::SessionHeader)
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Hash output and source names

#[test]
fn header_value_is_16_lowercase_hex_digits() {
    let small = Affinity {
        source: AffinitySource::UserPrefix,
        hash: 0xab,
    };
    assert_eq!(small.header_value(), "00000000000000ab");
    let big = Affinity {
        source: AffinitySource::UserPrefix,
        hash: u64::MAX,
    };
    assert_eq!(big.header_value(), "ffffffffffffffff");
    for text in ["a", "b", "Hello", "中文", "x".repeat(1000).as_str()] {
        let v = key(&arr(&[user(text)])).unwrap().header_value();
        assert_eq!(v.len(), 16);
        assert!(
            v.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{v}"
        );
    }
}

#[test]
fn source_names_and_header_values() {
    let table = [
        (
            AffinitySource::PromptCacheKey,
            "prompt_cache_key",
            "prompt-cache-key",
            true,
        ),
        (AffinitySource::SessionHeader, "session_header", "session", true),
        (AffinitySource::Conversation, "conversation", "session", true),
        (AffinitySource::UserId, "user_id", "session", true),
        (AffinitySource::SystemPrompt, "system_prompt", "system", false),
        (AffinitySource::UserPrefix, "user_prefix", "user-prefix", false),
    ];
    for (source, name, header, is_explicit) in table {
        assert_eq!(
            (source.as_str(), source.header_value(), source.is_explicit()),
            (name, header, is_explicit)
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// prompt_cache_key in the body

fn with_pck(value_json: &str) -> String {
    format!(
        r#"{{"model":"local-chat","messages":[{{"role":"user","content":"Hello"}}],"prompt_cache_key":{value_json}}}"#
    )
}

#[test]
fn prompt_cache_key_of_256_bytes_is_accepted_and_257_refused() {
    let ok = "k".repeat(256);
    let d = routes(
        &two_backends(),
        Api::Chat,
        with_pck(&format!("\"{ok}\"")).as_bytes(),
        None,
    );
    assert_eq!(d.affinity.map(|a| a.source), Some(AffinitySource::PromptCacheKey));
    assert_eq!(d.echo_session.as_deref(), Some(ok.as_str()));
    let e = refuses(
        &two_backends(),
        Api::Chat,
        with_pck(&format!("\"{ok}k\"")).as_bytes(),
        None,
    );
    assert_eq!(
        e,
        GatewayError::InvalidField {
            field: "prompt_cache_key",
            reason: "the value is longer than 256 bytes".into()
        }
    );
    assert_eq!(
        (e.status(), e.code(), e.param()),
        (400, "invalid_field", Some("prompt_cache_key"))
    );
}

#[test]
fn prompt_cache_key_length_counts_decoded_bytes() {
    // 128 escaped `é` are 768 bytes of JSON but 256 bytes of key.
    let escaped = "\\u00e9".repeat(128);
    let d = routes(
        &two_backends(),
        Api::Chat,
        with_pck(&format!("\"{escaped}\"")).as_bytes(),
        None,
    );
    let key = "é".repeat(128);
    assert_eq!(
        d.affinity,
        Some(explicit(key.as_bytes(), AffinitySource::PromptCacheKey))
    );
}

#[test]
fn prompt_cache_key_with_control_characters_is_refused() {
    for v in [r#""a\u0001b""#, r#""a\nb""#, r#""a\tb""#, r#""\u007f""#, r#""a\u0000""#] {
        let e = refuses(&two_backends(), Api::Chat, with_pck(v).as_bytes(), None);
        assert_eq!(
            e,
            GatewayError::InvalidField {
                field: "prompt_cache_key",
                reason: "the value contains control characters".into()
            },
            "{v}"
        );
    }
}

#[test]
fn prompt_cache_key_not_a_string_is_400() {
    for v in ["42", "true", "{}", "[\"k\"]"] {
        let e = refuses(&two_backends(), Api::Chat, with_pck(v).as_bytes(), None);
        assert_eq!(
            e,
            GatewayError::InvalidField {
                field: "prompt_cache_key",
                reason: "must be a string".into()
            },
            "{v}"
        );
    }
}

#[test]
fn null_or_empty_prompt_cache_key_is_ignored() {
    for v in ["null", "\"\""] {
        let d = routes(&two_backends(), Api::Chat, with_pck(v).as_bytes(), None);
        assert_key(d.affinity, AffinitySource::UserPrefix, USER_HELLO);
        assert_eq!(d.echo_session, None, "{v}");
        // And a session header then takes over.
        let d = routes(
            &two_backends(),
            Api::Chat,
            with_pck(v).as_bytes(),
            Some(&session_key("sess-1")),
        );
        assert_key(d.affinity, AffinitySource::SessionHeader, EXPLICIT_SESS_1);
    }
}

#[test]
fn prompt_cache_key_is_validated_even_with_a_session_header() {
    let e = refuses(
        &two_backends(),
        Api::Chat,
        with_pck("7").as_bytes(),
        Some(&session_key("s")),
    );
    assert_eq!(e.code(), "invalid_field");
}

#[test]
fn escaped_prompt_cache_key_hashes_and_echoes_its_decoded_value() {
    let d = routes(
        &two_backends(),
        Api::Chat,
        with_pck(r#""conv\u002d42""#).as_bytes(),
        None,
    );
    assert_key(d.affinity, AffinitySource::PromptCacheKey, EXPLICIT_CONV_42);
    assert_eq!(d.echo_session.as_deref(), Some("conv-42"));
}

#[test]
fn prompt_cache_key_is_never_altered_in_the_body() {
    let body = with_pck(r#""conv\u002d42""#);
    let d = routes(&two_backends(), Api::Chat, body.as_bytes(), None);
    let out = String::from_utf8(d.patch.unwrap().apply(body.as_bytes())).unwrap();
    assert!(out.contains(r#""prompt_cache_key":"conv\u002d42""#), "{out}");
}

// ---------------------------------------------------------------------------------------------------------------
// Session headers

#[test]
fn no_session_header_gives_none() {
    assert_eq!(
        session_from_headers(&two_backends(), lookup(&[("content-type", "application/json")])),
        Ok(None)
    );
}

#[test]
fn every_default_session_header_is_read() {
    let cfg = two_backends();
    for name in ["x-session-id", "x-multi-turn-session-id", "x-claude-code-session-id"] {
        let got = session_from_headers(&cfg, lookup(&[(name, "conv-42")]))
            .unwrap()
            .unwrap();
        assert_eq!(got.value, "conv-42", "{name}");
        assert_key(Some(got.affinity), AffinitySource::SessionHeader, EXPLICIT_CONV_42);
    }
}

#[test]
fn default_session_headers_are_checked_in_order() {
    let cfg = two_backends();
    let all = [
        ("x-claude-code-session-id", "third"),
        ("x-multi-turn-session-id", "second"),
        ("x-session-id", "first"),
    ];
    assert_eq!(
        session_from_headers(&cfg, lookup(&all)).unwrap().unwrap().value,
        "first"
    );
    assert_eq!(
        session_from_headers(&cfg, lookup(&all[..2])).unwrap().unwrap().value,
        "second"
    );
    assert_eq!(
        session_from_headers(&cfg, lookup(&all[..1])).unwrap().unwrap().value,
        "third"
    );
}

#[test]
fn configured_order_decides_not_request_order() {
    let cfg = two_backends_with_affinity(r#"{ "session_headers": ["x-session-id", "x-claude-code-session-id"] }"#);
    let both = [("x-claude-code-session-id", "second"), ("x-session-id", "first")];
    let got = session_from_headers(&cfg, lookup(&both)).unwrap().unwrap();
    assert_eq!(got, session_key("first"));
    let only_second = [("x-claude-code-session-id", "second")];
    let got = session_from_headers(&cfg, lookup(&only_second)).unwrap().unwrap();
    assert_eq!(got, session_key("second"));
}

#[test]
fn a_configured_list_replaces_the_defaults() {
    let cfg = two_backends_with_affinity(r#"{ "session_headers": ["x-conv"] }"#);
    assert_eq!(session_from_headers(&cfg, lookup(&[("x-session-id", "s")])), Ok(None));
    assert_eq!(
        session_from_headers(&cfg, lookup(&[("x-conv", "s")]))
            .unwrap()
            .unwrap()
            .value,
        "s"
    );
    let none = two_backends_with_affinity(r#"{ "session_headers": [] }"#);
    assert_eq!(session_from_headers(&none, lookup(&[("x-session-id", "s")])), Ok(None));
}

#[test]
fn header_names_are_looked_up_in_lower_case() {
    let cfg = two_backends_with_affinity(r#"{ "session_headers": ["X-Conversation-ID"] }"#);
    let asked = std::cell::RefCell::new(Vec::new());
    let _ = session_from_headers(&cfg, |name: &str| {
        asked.borrow_mut().push(name.to_string());
        None
    });
    assert_eq!(asked.into_inner(), ["x-conversation-id"]);
}

#[test]
fn invalid_first_header_is_refused_even_if_a_later_one_is_valid() {
    let cfg = two_backends_with_affinity(r#"{ "session_headers": ["x-session-id", "x-claude-code-session-id"] }"#);
    let e = session_from_headers(
        &cfg,
        lookup(&[("x-session-id", ""), ("x-claude-code-session-id", "ok")]),
    )
    .unwrap_err();
    assert_eq!(
        e,
        GatewayError::InvalidSessionHeader {
            header: "x-session-id".into(),
            reason: "the value is empty"
        }
    );
    assert_eq!(
        (e.status(), e.code(), e.param()),
        (400, "invalid_session_header", Some("x-session-id"))
    );
    assert_eq!(e.to_string(), "Invalid `x-session-id` header: the value is empty.");
}

#[test]
fn session_header_value_errors() {
    let cfg = two_backends();
    let long = "a".repeat(257);
    for (header, value, reason) in [
        ("x-session-id", long.as_str(), "the value is longer than 256 bytes"),
        (
            "x-multi-turn-session-id",
            "a\tb",
            "the value contains control characters",
        ),
        (
            "x-claude-code-session-id",
            "a\u{7f}",
            "the value contains control characters",
        ),
        ("x-session-id", "a\u{0}", "the value contains control characters"),
        ("x-session-id", "sess 1", NOT_VISIBLE_ASCII),
        ("x-session-id", " s", NOT_VISIBLE_ASCII),
        ("x-session-id", "ü-session", NOT_VISIBLE_ASCII),
        ("x-multi-turn-session-id", "😀", NOT_VISIBLE_ASCII),
    ] {
        let e = session_from_headers(&cfg, lookup(&[(header, value)])).unwrap_err();
        assert_eq!(
            e,
            GatewayError::InvalidSessionHeader {
                header: header.into(),
                reason
            }
        );
    }
}

const NOT_VISIBLE_ASCII: &str = "the value has a space or a byte outside visible ASCII (0x21-0x7E)";

#[test]
fn session_header_values_are_visible_ascii_while_body_keys_may_be_any_text() {
    let cfg = two_backends();
    // Every visible ASCII byte, 0x21 to 0x7E, is accepted in a header.
    let visible: String = (0x21u8..=0x7e).map(char::from).collect();
    let got = session_from_headers(&cfg, lookup(&[("x-session-id", visible.as_str())]))
        .unwrap()
        .unwrap();
    assert_eq!(got.value, visible);
    // A byte just outside that range, or UTF-8, is refused with the reason in the API's envelope.
    for bad in ["a b", "a\u{80}", "é"] {
        let e = session_from_headers(&cfg, lookup(&[("x-session-id", bad)])).unwrap_err();
        assert_eq!((e.status(), e.code()), (400, "invalid_session_header"), "{bad:?}");
        assert_eq!(
            e.to_string(),
            format!("Invalid `x-session-id` header: {NOT_VISIBLE_ASCII}.")
        );
    }
    // The body's explicit keys keep their wider rule.
    assert_eq!(check_explicit("sess 1".as_bytes()), Ok(()));
}

#[test]
fn claude_code_capture_session_header() {
    let owned = sdk_headers("messages-tools-image-thinking-cache-control-claude-code");
    let headers = borrowed(&owned);
    // The default list includes `x-claude-code-session-id`.
    let cfg = two_backends();
    let got = session_from_headers(&cfg, lookup(&headers)).unwrap().unwrap();
    assert_eq!(got.value, "cc-sess-1");
    assert_key(Some(got.affinity), AffinitySource::SessionHeader, EXPLICIT_CC_SESS_1);
    // And it wins over the body's system prompt.
    let d = routes(
        &cfg,
        Api::Messages,
        sdk_body("messages-tools-image-thinking-cache-control-claude-code"),
        Some(&got),
    );
    assert_eq!(d.affinity, Some(got.affinity));
    assert_eq!(d.echo_session.as_deref(), Some("cc-sess-1"));
}

#[test]
fn openai_and_plain_anthropic_captures_carry_no_session_header() {
    let cfg = two_backends();
    for name in common::SDK_NAMES.into_iter().filter(|n| !n.contains("claude-code")) {
        let owned = sdk_headers(name);
        assert_eq!(
            session_from_headers(&cfg, lookup(&borrowed(&owned))),
            Ok(None),
            "{name}"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The SDK captures

#[test]
fn captured_bodies_get_the_expected_keys() {
    let cases: [(&str, Option<(AffinitySource, &str)>); 10] = [
        ("chat-basic", Some((AffinitySource::SystemPrompt, SYS_TERSE))),
        (
            "chat-stream-include-usage",
            Some((AffinitySource::SystemPrompt, SYS_POLICY)),
        ),
        (
            "chat-tools-image-prompt-cache-key",
            Some((AffinitySource::PromptCacheKey, EXPLICIT_CONV_42)),
        ),
        ("completions-basic", Some((AffinitySource::UserPrefix, USER_ONCE))),
        ("embeddings-two-inputs", None),
        ("messages-basic", Some((AffinitySource::SystemPrompt, SYS_CLAUDE_CODE))),
        ("messages-stream", Some((AffinitySource::UserPrefix, USER_STREAM))),
        (
            "messages-tools-image-thinking-cache-control-claude-code",
            Some((AffinitySource::SystemPrompt, SYS_LONG_CACHED)),
        ),
        (
            "responses-instructions-prompt-cache-key",
            Some((AffinitySource::PromptCacheKey, EXPLICIT_RESP_1)),
        ),
        // `conversation_id` is off by default: the string input is the key.
        (
            "responses-string-input-conversation",
            Some((AffinitySource::UserPrefix, USER_PLAIN)),
        ),
    ];
    let cfg = two_backends();
    for (name, want) in cases {
        let d = route(&cfg, sdk_api(name), sdk_body(name), None).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = d.affinity.map(|a| (a.source, a.header_value()));
        assert_eq!(got, want.map(|(s, h)| (s, h.to_string())), "{name}");
    }
}

#[test]
fn captures_with_their_own_session_headers() {
    // Each capture routed with the session its recorded headers carry (only Claude Code sends one).
    let cfg = two_backends();
    for name in common::SDK_NAMES {
        let owned = sdk_headers(name);
        let session = session_from_headers(&cfg, lookup(&borrowed(&owned))).unwrap();
        let d = routes(&cfg, sdk_api(name), sdk_body(name), session.as_ref());
        if name.contains("claude-code") {
            assert_key(d.affinity, AffinitySource::SessionHeader, EXPLICIT_CC_SESS_1);
        } else {
            assert_ne!(
                d.affinity.map(|a| a.source),
                Some(AffinitySource::SessionHeader),
                "{name}"
            );
        }
    }
}

#[test]
fn conversation_capture_with_conversation_ids_enabled() {
    let cfg = two_backends_with_affinity(r#"{ "conversation_id": true }"#);
    let d = routes(
        &cfg,
        Api::Responses,
        sdk_body("responses-string-input-conversation"),
        None,
    );
    assert_key(d.affinity, AffinitySource::Conversation, EXPLICIT_CONV_ABC);
    assert_eq!(d.echo_session.as_deref(), Some("conv_abc"));
}

#[test]
fn claude_code_capture_with_user_ids_enabled() {
    let cfg = two_backends_with_affinity(r#"{ "anthropic_user_id": true }"#);
    let body = sdk_body("messages-tools-image-thinking-cache-control-claude-code");
    let d = routes(&cfg, Api::Messages, body, None);
    assert_key(d.affinity, AffinitySource::UserId, EXPLICIT_U_123);
    assert_eq!(d.echo_session.as_deref(), Some("u-123"));
}

#[test]
fn tools_capture_without_its_cache_key_falls_back_to_its_system_parts() {
    let body = std::str::from_utf8(sdk_body("chat-tools-image-prompt-cache-key")).unwrap();
    let without = body.replace(r#""prompt_cache_key":"conv-42","#, "");
    assert_ne!(without, body);
    let d = routes(&two_backends(), Api::Chat, without.as_bytes(), None);
    assert_key(d.affinity, AffinitySource::SystemPrompt, SYS_AGENT_PARTS);
}

#[test]
fn responses_capture_without_its_cache_key_falls_back_to_its_instructions() {
    let body = std::str::from_utf8(sdk_body("responses-instructions-prompt-cache-key")).unwrap();
    let without = body.replace(r#","prompt_cache_key":"resp-1""#, "");
    assert_ne!(without, body);
    let d = routes(&two_backends(), Api::Responses, without.as_bytes(), None);
    assert_key(d.affinity, AffinitySource::SystemPrompt, SYS_BRIEF);
}

#[test]
fn messages_basic_capture_without_system_falls_back_to_its_user_text() {
    let body = std::str::from_utf8(sdk_body("messages-basic")).unwrap();
    let without = body.replace(r#","system":"You are Claude Code.""#, "");
    assert_ne!(without, body);
    let d = routes(&two_backends(), Api::Messages, without.as_bytes(), None);
    assert_key(d.affinity, AffinitySource::UserPrefix, USER_HI);
}

#[test]
fn a_session_value_that_could_not_be_echoed_faithfully_is_refused() {
    // Bytes that are not UTF-8 would come back altered in `x-multi-turn-session-id`, so the echo would not pin
    // later turns; such a value is refused instead.
    let cfg = two_backends();
    let raw: &[u8] = b"sess-\xff";
    let e = session_from_headers(&cfg, |n: &str| (n == "x-session-id").then_some(raw)).unwrap_err();
    assert_eq!(e.status(), 400);
    assert_eq!(e.code(), "invalid_session_header");
}

#[test]
fn an_echoed_key_pins_the_same_key_and_a_key_a_header_could_not_carry_is_not_echoed() {
    let cfg = two_backends();
    let with_cache_key = |k: &str| {
        let body = serde_json::json!({"model": "local-chat", "prompt_cache_key": k, "messages": [{"role": "user", "content": "Hello"}]});
        routes(&cfg, Api::Chat, body.to_string().as_bytes(), None)
    };
    let d = with_cache_key("sess-1");
    let echoed = d.echo_session.unwrap();
    let again = session_from_headers(&cfg, lookup(&[("x-multi-turn-session-id", echoed.as_str())]))
        .unwrap()
        .unwrap();
    assert_eq!(again.affinity.hash, d.affinity.unwrap().hash);
    // A body key with a space or UTF-8 still keys the request, but a session header could not bring it back.
    for raw in ["ü-session-€", "a b"] {
        let d = with_cache_key(raw);
        assert_eq!(
            d.affinity.map(|a| a.source),
            Some(AffinitySource::PromptCacheKey),
            "{raw}"
        );
        assert_eq!(d.echo_session, None, "{raw}");
    }
}
