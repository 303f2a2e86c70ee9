//! Navigation inside validated bodies: arrays, objects, key look-up, string decoding and value skipping.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::borrow::Cow;

use common::{member_span, members, text};
use llmroute_core::json::nav::{array_items, get, key_eq, kind, object_members, skip_value, str_value};
use llmroute_core::json::{Kind, Span};

/// The span of the whole (validated) top-level object.
fn whole(body: &[u8]) -> Span {
    members(body);
    let start = body.iter().position(|b| *b == b'{').unwrap();
    Span {
        start,
        end: skip_value(body, start),
    }
}

fn items(body: &str, span: Span) -> Vec<&str> {
    array_items(body.as_bytes(), span)
        .map(|s| text(body.as_bytes(), s))
        .collect()
}

fn member_texts(body: &str, span: Span) -> Vec<(&str, &str)> {
    object_members(body.as_bytes(), span)
        .map(|(k, v)| (text(body.as_bytes(), k), text(body.as_bytes(), v)))
        .collect()
}

// ---------------------------------------------------------------------------------------------------------------
// skip_value

#[test]
fn skip_value_steps_over_scalars() {
    let cases = [
        ("1,", 1),
        ("-12.5e+3}", 8),
        ("true]", 4),
        ("false ", 5),
        ("null\n", 4),
        ("7", 1),
        ("\"abc\",", 5),
    ];
    for (buf, end) in cases {
        assert_eq!(skip_value(buf.as_bytes(), 0), end, "{buf:?}");
    }
}

#[test]
fn skip_value_skips_leading_whitespace() {
    assert_eq!(skip_value(b" \n\t\r 42 ,", 0), 7);
    assert_eq!(skip_value(b"xx  [1] ", 2), 7);
}

#[test]
fn skip_value_steps_over_containers_with_tricky_strings() {
    let buf = br#"{"a":"}]\"\\","b":[{"c":"[["}],"d":{}} tail"#;
    let end = skip_value(buf, 0);
    assert_eq!(&buf[end..], b" tail");
    let buf = br#"[ [ ], { }, "]", "\\" ] ,"#;
    assert_eq!(&buf[skip_value(buf, 0)..], b" ,");
}

#[test]
fn skip_value_on_a_string_ending_in_an_escaped_backslash() {
    let buf = br#""a\\" , 1"#;
    assert_eq!(skip_value(buf, 0), 5);
}

#[test]
fn skip_value_stops_at_the_end_of_the_buffer() {
    assert_eq!(skip_value(b"123", 0), 3);
    assert_eq!(skip_value(b"[1, [2", 0), 6);
    assert_eq!(skip_value(b"\"open", 0), 5);
    assert_eq!(skip_value(b"", 0), 0);
    assert_eq!(skip_value(b"  ", 5), 2);
}

#[test]
fn skip_value_agrees_with_the_scanner_on_member_spans() {
    let body = br#"{ "a" : [1, {"x": "y]"}] , "b":"s\"}", "c" : -0.5e7 , "d":{ } }"#;
    for m in members(body) {
        assert_eq!(skip_value(body, m.value.start), m.value.end);
        // From just after the key's colon, leading whitespace included.
        let colon = m.key.end + body[m.key.end..].iter().position(|b| *b == b':').unwrap();
        assert_eq!(skip_value(body, colon + 1), m.value.end);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// kind

#[test]
fn kind_reads_the_span_start() {
    let body = r#"{"o":{},"a":[],"s":"","n":0,"b":true,"z":null}"#;
    let kinds: Vec<Option<Kind>> = members(body.as_bytes())
        .iter()
        .map(|m| kind(body.as_bytes(), m.value))
        .collect();
    assert_eq!(
        kinds,
        [
            Kind::Object,
            Kind::Array,
            Kind::String,
            Kind::Number,
            Kind::Bool,
            Kind::Null
        ]
        .map(Some)
    );
    assert_eq!(kind(b"{}", Span { start: 5, end: 6 }), None);
}

// ---------------------------------------------------------------------------------------------------------------
// array_items

#[test]
fn array_items_yields_each_element_exactly() {
    let body = r#"{"a":[1, "a,b" , {"b":[2,3]}, [ ], null,true,-2.5]}"#;
    let span = member_span(body.as_bytes(), "a");
    assert_eq!(
        items(body, span),
        ["1", "\"a,b\"", "{\"b\":[2,3]}", "[ ]", "null", "true", "-2.5"]
    );
}

#[test]
fn array_items_of_empty_arrays_is_empty() {
    for arr in ["[]", "[ ]", "[\n\t]", "[\r\n  ]"] {
        let body = format!("{{\"a\":{arr},\"b\":[1]}}");
        let span = member_span(body.as_bytes(), "a");
        assert_eq!(items(&body, span), Vec::<&str>::new(), "{arr:?}");
    }
}

#[test]
fn array_items_with_whitespace_everywhere() {
    let body = "{\"a\":[\n\t1\r\n,\n  \"x\"\t,\n[ 2 ,3 ]\n]}";
    let span = member_span(body.as_bytes(), "a");
    assert_eq!(items(body, span), ["1", "\"x\"", "[ 2 ,3 ]"]);
}

#[test]
fn array_items_does_not_run_past_its_array() {
    let body = r#"{"a":[1,2],"b":[3,4]}"#;
    let span = member_span(body.as_bytes(), "a");
    assert_eq!(items(body, span), ["1", "2"]);
    let one = r#"{"a":["only"] ,"z":9}"#;
    assert_eq!(items(one, member_span(one.as_bytes(), "a")), ["\"only\""]);
}

#[test]
fn array_items_of_nested_arrays() {
    let body = r#"{"m":[[1,[2]],[],[[[]]]]}"#;
    let outer = member_span(body.as_bytes(), "m");
    let inner: Vec<Span> = array_items(body.as_bytes(), outer).collect();
    assert_eq!(inner.len(), 3);
    assert_eq!(items(body, inner[0]), ["1", "[2]"]);
    assert!(items(body, inner[1]).is_empty());
    assert_eq!(items(body, inner[2]), ["[[]]"]);
}

#[test]
fn array_items_with_strings_holding_escapes_and_brackets() {
    let body = r#"{"a":["\"]", "\\", "}", "\u005d"]}"#;
    let span = member_span(body.as_bytes(), "a");
    assert_eq!(items(body, span), [r#""\"]""#, r#""\\""#, r#""}""#, r#""\u005d""#]);
}

// ---------------------------------------------------------------------------------------------------------------
// object_members

#[test]
fn object_members_yields_keys_with_quotes_and_exact_values() {
    let body = r#"{"o":{ "a" : 1 , "b":{"c":[1,{"d":"}"}]}, "e" :"x"}}"#;
    let span = member_span(body.as_bytes(), "o");
    assert_eq!(
        member_texts(body, span),
        [("\"a\"", "1"), ("\"b\"", r#"{"c":[1,{"d":"}"}]}"#), ("\"e\"", "\"x\"")]
    );
}

#[test]
fn object_members_of_empty_objects_is_empty() {
    for obj in ["{}", "{ }", "{\n}", "{\t\r\n}"] {
        let body = format!("{{\"o\":{obj},\"p\":{{\"q\":1}}}}");
        let span = member_span(body.as_bytes(), "o");
        assert!(member_texts(&body, span).is_empty(), "{obj:?}");
    }
}

#[test]
fn object_members_of_the_whole_body_match_the_scanner() {
    let body = "{\n  \"model\" : \"m\",\n  \"messages\":[ {\"role\":\"user\"} ],\n  \"x\":null\n}\n";
    let from_nav: Vec<(Span, Span)> = object_members(body.as_bytes(), whole(body.as_bytes())).collect();
    let from_scan: Vec<(Span, Span)> = members(body.as_bytes()).iter().map(|m| (m.key, m.value)).collect();
    assert_eq!(from_nav, from_scan);
}

#[test]
fn object_members_keeps_duplicates_in_order() {
    let body = r#"{"o":{"k":1,"k":2,"K":3}}"#;
    let span = member_span(body.as_bytes(), "o");
    assert_eq!(
        member_texts(body, span),
        [("\"k\"", "1"), ("\"k\"", "2"), ("\"K\"", "3")]
    );
}

#[test]
fn object_members_with_whitespace_everywhere() {
    let body = "{ \"o\" :\n{\r\n\t\"a\"\n:\n[ ]\n,\n\"b\"\t:\t\"s\"\n}\n}";
    let span = member_span(body.as_bytes(), "o");
    assert_eq!(member_texts(body, span), [("\"a\"", "[ ]"), ("\"b\"", "\"s\"")]);
}

#[test]
fn object_members_with_escaped_keys() {
    let body = r#"{"o":{"a\"b":1,"c\\":2}}"#;
    let span = member_span(body.as_bytes(), "o");
    assert_eq!(member_texts(body, span), [(r#""a\"b""#, "1"), (r#""c\\""#, "2")]);
}

// ---------------------------------------------------------------------------------------------------------------
// get and key_eq

#[test]
fn get_finds_a_member_by_name() {
    let body = br#"{"role":"user","content":[{"type":"text","text":"hi"}]}"#;
    let obj = whole(body);
    assert_eq!(get(body, obj, "role").map(|s| s.of(body)), Some(&b"\"user\""[..]));
    assert_eq!(
        get(body, obj, "content").map(|s| s.of(body)),
        Some(&br#"[{"type":"text","text":"hi"}]"#[..])
    );
    assert_eq!(get(body, obj, "missing"), None);
    // Nested keys are not top-level members of this object.
    assert_eq!(get(body, obj, "type"), None);
}

#[test]
fn get_is_case_sensitive() {
    let body = br#"{"Role":"x"}"#;
    assert_eq!(get(body, whole(body), "role"), None);
    assert!(get(body, whole(body), "Role").is_some());
}

#[test]
fn get_returns_the_first_duplicate() {
    let body = br#"{"role":"system","role":"user"}"#;
    assert_eq!(
        get(body, whole(body), "role").map(|s| s.of(body)),
        Some(&b"\"system\""[..])
    );
}

#[test]
fn get_decodes_escaped_keys() {
    let body = br#"{"\u0072ole":"user","con\u0074ent":"x","a\/b":1}"#;
    let obj = whole(body);
    assert_eq!(get(body, obj, "role").map(|s| s.of(body)), Some(&b"\"user\""[..]));
    assert!(get(body, obj, "content").is_some());
    assert!(get(body, obj, "a/b").is_some());
    assert!(get(body, obj, "a\\/b").is_none());
}

#[test]
fn get_in_an_empty_object_is_none() {
    assert_eq!(get(b"{}", Span { start: 0, end: 2 }, ""), None);
    assert_eq!(get(b"{ }", Span { start: 0, end: 3 }, "a"), None);
}

#[test]
fn key_eq_compares_plain_and_escaped_keys() {
    let body = br#"{"model":1,"mod\u0065l":2,"a\"b":3,"\u00e9":4,"":5,"\ud83d\ude00":6}"#;
    let keys: Vec<Span> = members(body).iter().map(|m| m.key).collect();
    assert!(key_eq(body, keys[0], "model"));
    assert!(!key_eq(body, keys[0], "mode"));
    assert!(!key_eq(body, keys[0], "models"));
    assert!(!key_eq(body, keys[0], "MODEL"));
    assert!(!key_eq(body, keys[0], "\"model\""));
    assert!(key_eq(body, keys[1], "model"));
    assert!(!key_eq(body, keys[1], "mod\\u0065l"));
    assert!(key_eq(body, keys[2], "a\"b"));
    assert!(key_eq(body, keys[3], "é"));
    assert!(key_eq(body, keys[4], ""));
    assert!(!key_eq(body, keys[4], "x"));
    assert!(key_eq(body, keys[5], "😀"));
}

// ---------------------------------------------------------------------------------------------------------------
// str_value

#[test]
fn str_value_borrows_plain_strings() {
    let body = r#"{"s":"plain text é"}"#.as_bytes();
    let span = member_span(body, "s");
    match str_value(body, span) {
        Some(Cow::Borrowed(s)) => assert_eq!(s, "plain text é"),
        other => panic!("expected a borrowed string, got {other:?}"),
    }
}

#[test]
fn str_value_decodes_escapes() {
    let body = br#"{"s":"q\" b\\ s\/ \b\f\n\r\t \u00e9\uD83D\uDE00 \u0041"}"#;
    let span = member_span(body, "s");
    match str_value(body, span) {
        Some(Cow::Owned(s)) => assert_eq!(s, "q\" b\\ s/ \u{8}\u{c}\n\r\t é😀 A"),
        other => panic!("expected an owned string, got {other:?}"),
    }
}

#[test]
fn str_value_of_an_empty_string() {
    let body = br#"{"s":""}"#;
    assert_eq!(str_value(body, member_span(body, "s")).as_deref(), Some(""));
}

#[test]
fn str_value_refuses_non_strings() {
    let body = br#"{"n":12,"o":{"a":"b"},"a":["x"],"t":true,"z":null}"#;
    for name in ["n", "o", "a", "t", "z"] {
        assert_eq!(str_value(body, member_span(body, name)), None, "{name}");
    }
    assert_eq!(str_value(b"\"", Span { start: 0, end: 1 }), None);
    assert_eq!(str_value(b"\"abc\"", Span { start: 9, end: 12 }), None);
}

#[test]
fn str_value_of_keys_decodes_them() {
    let body = br#"{"k\u0065y":1}"#;
    let key = members(body)[0].key;
    assert_eq!(str_value(body, key).as_deref(), Some("key"));
}

// ---------------------------------------------------------------------------------------------------------------
// Together: walking a real chat body

#[test]
fn walking_the_tools_capture_reaches_every_role_and_text() {
    let body = common::sdk_body("chat-tools-image-prompt-cache-key");
    let messages = member_span(body, "messages");
    let roles: Vec<String> = array_items(body, messages)
        .map(|m| str_value(body, get(body, m, "role").unwrap()).unwrap().into_owned())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"]);

    let system = array_items(body, messages).next().unwrap();
    let parts: Vec<String> = array_items(body, get(body, system, "content").unwrap())
        .map(|p| str_value(body, get(body, p, "text").unwrap()).unwrap().into_owned())
        .collect();
    assert_eq!(parts, ["Agent system prompt part 1.", "Part 2."]);

    let assistant = array_items(body, messages).nth(2).unwrap();
    assert_eq!(kind(body, get(body, assistant, "content").unwrap()), Some(Kind::Null));
    let call = array_items(body, get(body, assistant, "tool_calls").unwrap())
        .next()
        .unwrap();
    let function = get(body, call, "function").unwrap();
    assert_eq!(
        str_value(body, get(body, function, "arguments").unwrap()).as_deref(),
        Some("{\"city\":\"Paris\"}")
    );
}

#[test]
fn walking_every_capture_agrees_with_serde() {
    for name in common::SDK_NAMES {
        let body = common::sdk_body(name);
        let parsed: serde_json::Value = serde_json::from_slice(body).unwrap();
        let obj = parsed.as_object().unwrap();
        let walked: Vec<String> = object_members(body, whole(body))
            .map(|(k, _)| str_value(body, k).unwrap().into_owned())
            .collect();
        let mut sorted = walked.clone();
        sorted.sort();
        assert_eq!(sorted, obj.keys().cloned().collect::<Vec<_>>(), "{name}");
        for key in &walked {
            let span = get(body, whole(body), key).unwrap();
            let value: serde_json::Value = serde_json::from_slice(span.of(body)).unwrap();
            assert_eq!(&value, &obj[key], "{name}.{key}");
        }
        // The capture's parsed body in the .json file is the same document.
        assert_eq!(common::sdk_meta(name)["body"], parsed, "{name}");
    }
}

mod str_prefix {
    use llmroute_core::affinity::ContentKey;
    use llmroute_core::json::nav::{str_prefix, str_value};
    use llmroute_core::json::Span;
    use proptest::prelude::*;

    /// The key a prefix of `want` bytes makes from `text`.
    fn key(text: &str, want: usize) -> Option<u64> {
        let mut k = ContentKey::user_prefix("m", want);
        let more = k.feed(text);
        k.finish().map(|a| a.hash ^ u64::from(more))
    }

    fn string() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                6 => Just("a".to_string()),
                1 => Just("é".to_string()),
                1 => Just("€".to_string()),
                1 => Just("😀".to_string()),
                1 => Just("\"".to_string()),
                1 => Just("\\".to_string()),
                1 => Just("\n".to_string()),
            ],
            0..80,
        )
        .prop_map(|parts| parts.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// Reading only what the key needs makes the key (and its "take more" answer) that the whole string makes.
        #[test]
        fn a_prefix_read_makes_the_whole_strings_key(s in string(), want in 0usize..64) {
            let json = serde_json::to_string(&s).unwrap();
            let span = Span { start: 0, end: json.len() };
            let whole = str_value(json.as_bytes(), span).unwrap();
            let part = str_prefix(json.as_bytes(), span, want).unwrap();
            prop_assert!(whole.starts_with(part.as_ref()));
            prop_assert_eq!(key(&part, want), key(&whole, want), "{:?} want {}", json, want);
        }
    }

    #[test]
    fn only_the_window_is_read_when_it_has_no_escape() {
        let json = format!("\"{}\\n{}\"", "a".repeat(100), "b".repeat(100));
        let span = Span {
            start: 0,
            end: json.len(),
        };
        assert_eq!(str_prefix(json.as_bytes(), span, 10).unwrap(), "a".repeat(14));
        // An escape inside the window: the whole string, decoded.
        assert_eq!(
            str_prefix(json.as_bytes(), span, 98).unwrap(),
            str_value(json.as_bytes(), span).unwrap()
        );
        assert_eq!(str_prefix(b"12", Span { start: 0, end: 2 }, 1), None);
    }
}
