//! The affinity key: which source wins, what feeds the hash, what never does, and the exact hash values.
//!
//! The expected hashes were computed independently with Python's `xxhash` (`xxh3_64` over the tag and text), so a
//! change in hashing, tagging or joining is caught.

// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{two_backends, two_backends_with_affinity};
use llmroute_core::affinity::{
    chat_messages, check_session_value, first_user_prefix, session, system_prompt, text_key, SESSION_VALUE_MAX,
};
use llmroute_core::json::{scan_object, Span, MAX_DEPTH};
use llmroute_core::{route_chat, Affinity, AffinitySource};

/// A body `{"messages": <messages>}` and the span of its array.
fn body_with(messages: &str) -> (Vec<u8>, Span) {
    let body = format!("{{\"messages\": {messages}}}").into_bytes();
    let span = scan_object(&body, MAX_DEPTH).unwrap()[0].value;
    (body, span)
}

/// The content key of a messages array with the default 256-byte user prefix.
fn key(messages: &str) -> Option<Affinity> {
    key_with(messages, 256)
}

fn key_with(messages: &str, prefix: usize) -> Option<Affinity> {
    let (body, span) = body_with(messages);
    chat_messages(&body, span, prefix)
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

/// Routes a chat body through the two-backend config.
fn routed(body: &str, session_key: Option<Affinity>) -> Option<Affinity> {
    route_chat(&two_backends(), body.as_bytes(), session_key)
        .unwrap()
        .affinity
}

// ---------------------------------------------------------------------------------------------------------------
// Precedence

#[test]
fn session_header_wins_over_everything() {
    let header = session(b"sess-1", AffinitySource::SessionHeader);
    let body = r#"{"model":"local-chat","prompt_cache_key":"conv-42","messages":[{"role":"system","content":"S"},{"role":"user","content":"U"}]}"#;
    assert_eq!(routed(body, Some(header)), Some(header));
}

#[test]
fn prompt_cache_key_beats_the_system_prompt() {
    let body = r#"{"model":"local-chat","messages":[{"role":"system","content":"S"}],"prompt_cache_key":"conv-42"}"#;
    let a = routed(body, None).unwrap();
    assert_eq!(a.source, AffinitySource::PromptCacheKey);
    assert_eq!(a.header_value(), "ad8ebf05ba1818ab");
}

#[test]
fn system_prompt_beats_the_user_prefix() {
    let a = key(&arr(&[system("You are terse."), user("Hello")])).unwrap();
    assert_eq!(a.source, AffinitySource::SystemPrompt);
    assert_eq!(a.header_value(), "a640428db57a9d52");
}

#[test]
fn user_prefix_is_the_fallback_without_a_system_prompt() {
    let a = key(&arr(&[user("Hello")])).unwrap();
    assert_eq!(a.source, AffinitySource::UserPrefix);
    assert_eq!(a.header_value(), "1bf346db3110a88d");
}

#[test]
fn no_text_anywhere_gives_no_key() {
    assert_eq!(
        key(r#"[{"role":"assistant","content":"a"},{"role":"tool","content":"t"}]"#),
        None
    );
    assert_eq!(key(r#"[{"role":"user","content":null}]"#), None);
    assert_eq!(key(r#"[{"role":"user"}]"#), None);
    assert_eq!(key(r#"[{"content":"no role"}]"#), None);
    assert_eq!(key(r#"[1, "x", null]"#), None);
}

#[test]
fn session_header_and_prompt_cache_key_share_a_namespace() {
    // The same id reaches the same host whichever way the client sends it; only the reported source differs.
    let h = session(b"conv-42", AffinitySource::SessionHeader);
    let p = session(b"conv-42", AffinitySource::PromptCacheKey);
    assert_eq!(h.hash, p.hash);
    assert_ne!(h.source, p.source);
    assert_eq!(h.header_value(), "ad8ebf05ba1818ab");
}

#[test]
fn namespaces_keep_equal_texts_apart() {
    let s = key(&arr(&[system("same")])).unwrap();
    let u = key(&arr(&[user("same")])).unwrap();
    let sess = session(b"same", AffinitySource::SessionHeader);
    assert_ne!(s.hash, u.hash);
    assert_ne!(s.hash, sess.hash);
    assert_ne!(u.hash, sess.hash);
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
}

#[test]
fn text_parts_are_joined_without_a_separator() {
    let parts = key(r#"[{"role":"system","content":[{"type":"text","text":"Agent system prompt part 1."},{"type":"text","text":"Part 2."}]}]"#)
        .unwrap();
    assert_eq!(parts.header_value(), "90c236ef982aa394");
    assert_eq!(
        parts,
        key(&arr(&[system("Agent system prompt part 1.Part 2.")])).unwrap()
    );
}

#[test]
fn non_text_parts_of_the_system_prompt_are_skipped() {
    let with_image = key(
        r#"[{"role":"system","content":[{"type":"image_url","image_url":{"url":"data:x"}},{"type":"text","text":"You are terse."},"stray",7]}]"#,
    )
    .unwrap();
    assert_eq!(with_image.header_value(), "a640428db57a9d52");
}

#[test]
fn developer_role_counts_as_system() {
    let dev = key(r#"[{"role":"developer","content":"Follow policy."},{"role":"user","content":"x"}]"#).unwrap();
    assert_eq!(dev.source, AffinitySource::SystemPrompt);
    assert_eq!(dev.header_value(), "03e5c1b8fa716821");
    assert_eq!(dev, key(&arr(&[system("Follow policy.")])).unwrap());
}

#[test]
fn multiple_leading_system_messages_all_count() {
    let two = key(&arr(&[system("You are terse."), system("Be kind."), user("hi")])).unwrap();
    assert_eq!(two.header_value(), "47b7d3a728b0c236");
    let one = key(&arr(&[system("You are terse."), user("hi")])).unwrap();
    assert_ne!(two, one);
    let mixed =
        key(r#"[{"role":"system","content":"You are terse."},{"role":"developer","content":"Be kind."}]"#).unwrap();
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
fn empty_system_text_falls_through_to_the_user_prefix() {
    let a = key(&arr(&[system(""), user("Hello")])).unwrap();
    assert_eq!(a.source, AffinitySource::UserPrefix);
    assert_eq!(a.header_value(), "1bf346db3110a88d");
    let b = key(r#"[{"role":"system","content":[]},{"role":"user","content":"Hello"}]"#).unwrap();
    assert_eq!(b, a);
    let c = key(r#"[{"role":"system","content":null},{"role":"user","content":"Hello"}]"#).unwrap();
    assert_eq!(c, a);
}

#[test]
fn escaped_text_hashes_as_its_decoded_value() {
    let escaped = key(r#"[{"role":"sys\u0074em","content":"You are t\u0065rse."}]"#).unwrap();
    assert_eq!(escaped.header_value(), "a640428db57a9d52");
    let user_escaped = key(r#"[{"role":"user","content":"H\u0065llo"}]"#).unwrap();
    assert_eq!(user_escaped.header_value(), "1bf346db3110a88d");
}

#[test]
fn roles_are_case_sensitive() {
    let a = key(r#"[{"role":"System","content":"S"},{"role":"user","content":"Hello"}]"#).unwrap();
    assert_eq!(a.source, AffinitySource::UserPrefix);
}

#[test]
fn system_prompt_alone_is_none_without_system_messages() {
    let (body, span) = body_with(&arr(&[user("U")]));
    assert_eq!(system_prompt(&body, span), None);
    let (body, span) = body_with("[]");
    assert_eq!(system_prompt(&body, span), None);
}

// ---------------------------------------------------------------------------------------------------------------
// Conversations grow; the key does not move

#[test]
fn assistant_turns_never_change_the_system_key() {
    let mut turns = vec![system("You are terse."), user("first question")];
    let first = key(&arr(&turns)).unwrap();
    for i in 0..10 {
        turns.push(assistant(&format!("answer {i}")));
        assert_eq!(key(&arr(&turns)).unwrap(), first, "after assistant turn {i}");
        turns.push(user(&format!("follow-up {i}")));
        assert_eq!(key(&arr(&turns)).unwrap(), first, "after user turn {i}");
    }
    assert_eq!(first.header_value(), "a640428db57a9d52");
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
    let a = key(&arr(&[assistant("greeting"), user("Hello")])).unwrap();
    assert_eq!(a.header_value(), "1bf346db3110a88d");
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
    let euro = key_with(&arr(&[user("aé€")]), 4).unwrap();
    let emoji = key_with(&arr(&[user("aé😀")]), 4).unwrap();
    assert_eq!(euro, emoji);
    assert_eq!(euro.header_value(), "a65e90f7452f6f80");
    assert_eq!(euro, key_with(&arr(&[user("aé")]), 256).unwrap());
    // A limit inside the first character cuts it away: nothing is left, so there is no key.
    assert_eq!(key_with(&arr(&[user("€uro")]), 2), None);
}

#[test]
fn prefix_boundary_at_every_limit_never_panics() {
    let text = "aé€😀中x";
    for max in 0..=text.len() + 2 {
        let k = key_with(&arr(&[user(text)]), max);
        assert_eq!(k.is_some(), max >= 1, "max {max}");
    }
}

#[test]
fn prefix_spans_text_parts() {
    let parts = key_with(
        r#"[{"role":"user","content":[{"type":"text","text":"ab"},{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"cdef"}]}]"#,
        4,
    )
    .unwrap();
    assert_eq!(parts, key_with(&arr(&[user("abcdZZ")]), 4).unwrap());
}

#[test]
fn zero_user_prefix_bytes_turns_the_fallback_off() {
    assert_eq!(key_with(&arr(&[user("Hello")]), 0), None);
    // The system prompt still counts.
    assert_eq!(
        key_with(&arr(&[system("You are terse."), user("Hello")]), 0).map(|a| a.source),
        Some(AffinitySource::SystemPrompt)
    );
    let (body, span) = body_with(&arr(&[user("Hello")]));
    assert_eq!(first_user_prefix(&body, span, 0), None);
}

#[test]
fn zero_user_prefix_bytes_in_config_gives_no_key() {
    let cfg = two_backends_with_affinity(r#"{ "user_prefix_bytes": 0 }"#);
    let body = br#"{"model":"local-chat","messages":[{"role":"user","content":"Hello"}]}"#;
    assert_eq!(route_chat(&cfg, body, None).unwrap().affinity, None);
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
    assert_eq!(
        key(&arr(&[user("Hello"), user("something else")]))
            .unwrap()
            .header_value(),
        "1bf346db3110a88d"
    );
}

#[test]
fn empty_user_text_gives_no_key() {
    assert_eq!(key(&arr(&[user("")])), None);
}

// ---------------------------------------------------------------------------------------------------------------
// Hash output

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
fn hashes_are_deterministic() {
    let msgs = arr(&[system("S"), user("U")]);
    let first = key(&msgs);
    for _ in 0..100 {
        assert_eq!(key(&msgs), first);
    }
    assert_eq!(
        session(b"x", AffinitySource::SessionHeader),
        session(b"x", AffinitySource::SessionHeader)
    );
}

#[test]
fn known_hash_values_are_fixed() {
    // xxh3_64(b"llmroute/<tag>\0" + text), computed outside this crate.
    assert_eq!(
        session(b"conv-42", AffinitySource::SessionHeader).hash,
        0xad8e_bf05_ba18_18ab
    );
    assert_eq!(
        session(b"cc-sess-1", AffinitySource::SessionHeader).hash,
        0x9e43_ef24_1c78_4e8b
    );
    assert_eq!(
        text_key(b"llmroute/system\0", "You are terse.", AffinitySource::SystemPrompt).map(|a| a.hash),
        Some(0xa640_428d_b57a_9d52)
    );
    assert_eq!(
        text_key(b"llmroute/user\0", "Hello", AffinitySource::UserPrefix).map(|a| a.hash),
        Some(0x1bf3_46db_3110_a88d)
    );
    assert_eq!(hex(key(&arr(&[user("hi")]))), "965d32b9645cc501");
}

#[test]
fn text_key_of_empty_text_is_none() {
    assert_eq!(text_key(b"t", "", AffinitySource::UserPrefix), None);
    assert_eq!(
        text_key(b"t", "x", AffinitySource::UserPrefix).map(|a| a.source),
        Some(AffinitySource::UserPrefix)
    );
}

#[test]
fn source_names() {
    let names: Vec<&str> = [
        AffinitySource::SessionHeader,
        AffinitySource::PromptCacheKey,
        AffinitySource::SystemPrompt,
        AffinitySource::UserPrefix,
    ]
    .iter()
    .map(|s| s.as_str())
    .collect();
    assert_eq!(
        names,
        ["session_header", "prompt_cache_key", "system_prompt", "user_prefix"]
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Session values

#[test]
fn session_value_limit_is_256() {
    assert_eq!(SESSION_VALUE_MAX, 256);
}

#[test]
fn empty_session_value_is_rejected() {
    assert_eq!(check_session_value(b""), Err("the value is empty"));
}

#[test]
fn overlong_session_value_is_rejected() {
    assert_eq!(
        check_session_value(&[b'a'; 257]),
        Err("the value is longer than 256 bytes")
    );
    assert_eq!(check_session_value(&[b'a'; 256]), Ok(()));
}

#[test]
fn control_characters_in_session_values_are_rejected() {
    for bad in [&b"a\x00b"[..], b"a\tb", b"a\nb", b"a\rb", b"\x1f", b"a\x7fb", b"\x01"] {
        assert_eq!(
            check_session_value(bad),
            Err("the value contains control characters"),
            "{bad:?}"
        );
    }
}

#[test]
fn printable_and_utf8_session_values_are_accepted() {
    for good in ["a", "sess 1", "conv-42", "ü-session-€", "😀", "~!@#$%^&*()_+{}|:\"<>?"] {
        assert_eq!(check_session_value(good.as_bytes()), Ok(()), "{good}");
    }
    // 256 bytes of multi-byte characters: at the limit, accepted.
    let v = "é".repeat(128);
    assert_eq!(v.len(), 256);
    assert_eq!(check_session_value(v.as_bytes()), Ok(()));
    assert!(check_session_value(format!("{v}a").as_bytes()).is_err());
}

// ---------------------------------------------------------------------------------------------------------------
// The SDK captures

#[test]
fn captured_chat_bodies_get_the_expected_keys() {
    let cases = [
        ("chat-basic", AffinitySource::SystemPrompt, "a640428db57a9d52"),
        (
            "chat-stream-include-usage",
            AffinitySource::SystemPrompt,
            "03e5c1b8fa716821",
        ),
        (
            "chat-tools-image-prompt-cache-key",
            AffinitySource::PromptCacheKey,
            "ad8ebf05ba1818ab",
        ),
        // Anthropic's top-level `system` is not a chat message; its first user text is the key.
        (
            "messages-tools-image-thinking-cache-control-claude-code",
            AffinitySource::UserPrefix,
            "6abd166513804ca5",
        ),
        ("messages-basic", AffinitySource::UserPrefix, "965d32b9645cc501"),
    ];
    let cfg = two_backends();
    for (name, source, hash) in cases {
        let a = route_chat(&cfg, common::sdk_body(name), None)
            .unwrap()
            .affinity
            .unwrap();
        assert_eq!((a.source, a.header_value().as_str()), (source, hash), "{name}");
    }
}

#[test]
fn tools_capture_without_its_cache_key_falls_back_to_its_system_parts() {
    let body = std::str::from_utf8(common::sdk_body("chat-tools-image-prompt-cache-key")).unwrap();
    let without = body.replace(r#""prompt_cache_key":"conv-42","#, "");
    assert_ne!(without, body);
    let a = routed(&without, None).unwrap();
    assert_eq!(a.source, AffinitySource::SystemPrompt);
    assert_eq!(a.header_value(), "90c236ef982aa394");
}
