//! The validating scanner: what it accepts, the spans it reports, and every way it refuses a body.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{text, Lcg};
use llmroute_core::json::{kind_of, scan_object, JsonError, Kind, Member, Span, MAX_DEPTH};
use serde_json::{Map, Number, Value};

fn scan(body: &str) -> Result<Vec<Member>, JsonError> {
    scan_object(body.as_bytes(), MAX_DEPTH)
}

fn ok(body: &str) -> Vec<Member> {
    match scan(body) {
        Ok(m) => m,
        Err(e) => panic!("{body:?} should scan: {e}"),
    }
}

fn syntax_offset(body: &[u8]) -> usize {
    match scan_object(body, MAX_DEPTH) {
        Err(JsonError::Syntax { offset, .. }) => offset,
        other => panic!(
            "{:?} should be a syntax error, got {other:?}",
            String::from_utf8_lossy(body)
        ),
    }
}

fn assert_syntax(body: &str) {
    syntax_offset(body.as_bytes());
}

/// `(key text, value text)` of each member.
fn pairs(body: &str) -> Vec<(String, String)> {
    ok(body)
        .iter()
        .map(|m| {
            (
                text(body.as_bytes(), m.key).to_string(),
                text(body.as_bytes(), m.value).to_string(),
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------------------------
// Valid documents

#[test]
fn empty_object_has_no_members() {
    assert_eq!(ok("{}"), vec![]);
    assert_eq!(ok("{ \n\t\r }"), vec![]);
}

#[test]
fn whitespace_around_the_object_is_allowed() {
    let m = ok(" \r\n\t{\"a\":1} \n\t\r ");
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].key, Span { start: 5, end: 8 });
}

#[test]
fn every_value_kind_is_reported_with_its_exact_text() {
    let body = r#"{"o":{"x":[1]},"a":[],"s":"str","n":-1.5e+3,"t":true,"f":false,"z":null}"#;
    let m = ok(body);
    let got: Vec<(&str, &str, Kind)> = m
        .iter()
        .map(|m| (text(body.as_bytes(), m.key), text(body.as_bytes(), m.value), m.kind))
        .collect();
    assert_eq!(
        got,
        vec![
            ("\"o\"", "{\"x\":[1]}", Kind::Object),
            ("\"a\"", "[]", Kind::Array),
            ("\"s\"", "\"str\"", Kind::String),
            ("\"n\"", "-1.5e+3", Kind::Number),
            ("\"t\"", "true", Kind::Bool),
            ("\"f\"", "false", Kind::Bool),
            ("\"z\"", "null", Kind::Null),
        ]
    );
}

#[test]
fn spans_exclude_surrounding_whitespace_and_keep_inner_whitespace() {
    let body = "{ \"a\" :  [1, 2]\t,\n\"b\"\r\n:\"x y\"  , \"c\":{ \"k\" : [ ] } }";
    let m = ok(body);
    let b = body.as_bytes();
    assert_eq!(text(b, m[0].key), "\"a\"");
    assert_eq!(text(b, m[0].value), "[1, 2]");
    assert_eq!(text(b, m[1].key), "\"b\"");
    assert_eq!(text(b, m[1].value), "\"x y\"");
    assert_eq!(text(b, m[2].value), "{ \"k\" : [ ] }");
    // The bytes around each value are untouched whitespace and separators.
    assert_eq!(&body[m[0].key.end..m[0].value.start], " :  ");
    assert_eq!(&body[m[0].value.end..m[1].key.start], "\t,\n");
    assert_eq!(&body[m[1].key.end..m[1].value.start], "\r\n:");
    assert_eq!(&body[m[2].value.end..], " }");
}

#[test]
fn spans_are_absolute_offsets() {
    let body = r#"{"model":"local-chat","n":12}"#;
    let m = ok(body);
    assert_eq!(m[0].key, Span { start: 1, end: 8 });
    assert_eq!(m[0].value, Span { start: 9, end: 21 });
    assert_eq!(m[1].value, Span { start: 26, end: 28 });
    assert_eq!(m[1].value.len(), 2);
}

#[test]
fn duplicate_keys_are_kept_in_document_order() {
    assert_eq!(
        pairs(r#"{"a":1,"b":2,"a":3,"a":[4]}"#),
        vec![
            ("\"a\"".into(), "1".into()),
            ("\"b\"".into(), "2".into()),
            ("\"a\"".into(), "3".into()),
            ("\"a\"".into(), "[4]".into()),
        ]
    );
}

#[test]
fn escaped_keys_are_flagged_and_plain_keys_are_not() {
    let body = r#"{"plain":1,"a\"b":2,"mod\u0065l":3,"x\\":4,"v":"esc\naped"}"#;
    let flags: Vec<bool> = ok(body).iter().map(|m| m.key_escaped).collect();
    assert_eq!(flags, vec![false, true, true, true, false]);
}

#[test]
fn only_top_level_members_are_indexed() {
    let body = r#"{"a":{"b":1,"c":[{"d":2},{"e":{"f":3}}]},"g":[{"h":4}]}"#;
    let keys: Vec<String> = pairs(body).into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec!["\"a\"", "\"g\""]);
}

#[test]
fn nested_containers_close_in_any_valid_mix() {
    let body = r#"{"a":[{"b":[[],{}]},[{"c":{"d":[1,[2,[3]]]}}]],"e":{}}"#;
    let m = ok(body);
    assert_eq!(m.len(), 2);
    assert_eq!(
        text(body.as_bytes(), m[0].value),
        r#"[{"b":[[],{}]},[{"c":{"d":[1,[2,[3]]]}}]]"#
    );
}

#[test]
fn valid_numbers_are_accepted_with_exact_spans() {
    for n in [
        "0",
        "-0",
        "7",
        "-7",
        "0.5",
        "-0.0",
        "10",
        "1e10",
        "1E10",
        "1e-10",
        "1E+10",
        "-1.25e+2",
        "123456789012345678901234567890",
        "1.000000000000000000000001",
        "0e0",
    ] {
        let body = format!("{{\"n\":{n}}}");
        let m = ok(&body);
        assert_eq!(text(body.as_bytes(), m[0].value), n);
        assert_eq!(m[0].kind, Kind::Number, "{n}");
    }
}

#[test]
fn valid_strings_with_every_escape_are_accepted() {
    let body = r#"{"s":"q\" b\\ s\/ \b\f\n\r\t \u00e9 \u00E9 \uD83D\uDE00 \u0000 end"}"#;
    let m = ok(body);
    assert_eq!(m[0].kind, Kind::String);
    assert_eq!(m[0].value.end, body.len() - 1);
}

#[test]
fn raw_non_ascii_and_del_are_allowed_in_strings() {
    let body = "{\"s\":\"é€😀 \u{7f} 中文\",\"clé\":1}";
    let m = ok(body);
    assert_eq!(text(body.as_bytes(), m[0].value), "\"é€😀 \u{7f} 中文\"");
    assert_eq!(text(body.as_bytes(), m[1].key), "\"clé\"");
    assert!(!m[1].key_escaped);
}

#[test]
fn string_values_may_hold_brackets_and_quotes() {
    let body = r#"{"a":"}]{[,:\"","b":1}"#;
    assert_eq!(pairs(body)[0].1, r#""}]{[,:\"""#);
    assert_eq!(pairs(body)[1].1, "1");
}

#[test]
fn empty_key_and_empty_string_are_valid() {
    assert_eq!(pairs(r#"{"":""}"#), vec![("\"\"".into(), "\"\"".into())]);
}

#[test]
fn kind_of_reads_the_first_byte() {
    let cases = [
        (b'{', Some(Kind::Object)),
        (b'[', Some(Kind::Array)),
        (b'"', Some(Kind::String)),
        (b'-', Some(Kind::Number)),
        (b'0', Some(Kind::Number)),
        (b'9', Some(Kind::Number)),
        (b't', Some(Kind::Bool)),
        (b'f', Some(Kind::Bool)),
        (b'n', Some(Kind::Null)),
        (b'x', None),
        (b'+', None),
        (b'.', None),
        (b' ', None),
    ];
    for (b, want) in cases {
        assert_eq!(kind_of(b), want, "{}", b as char);
    }
}

#[test]
fn kind_names_read_as_prose() {
    let names: Vec<&str> = [
        Kind::Object,
        Kind::Array,
        Kind::String,
        Kind::Number,
        Kind::Bool,
        Kind::Null,
    ]
    .iter()
    .map(|k| k.name())
    .collect();
    assert_eq!(
        names,
        ["an object", "an array", "a string", "a number", "a boolean", "null"]
    );
}

#[test]
fn span_helpers() {
    let buf = b"hello";
    let s = Span { start: 1, end: 4 };
    assert_eq!(s.of(buf), b"ell");
    assert_eq!(s.len(), 3);
    assert!(!s.is_empty());
    assert!(Span { start: 2, end: 2 }.is_empty());
    // Out of range never panics.
    assert_eq!(Span { start: 3, end: 99 }.of(buf), b"");
}

// ---------------------------------------------------------------------------------------------------------------
// Syntax errors, one class at a time

#[test]
fn trailing_comma_in_object_is_refused_at_the_brace() {
    assert_eq!(syntax_offset(br#"{"a":1,}"#), 7);
    assert_eq!(syntax_offset(br#"{"a":{"b":1,}}"#), 12);
}

#[test]
fn trailing_comma_in_array_is_refused_at_the_bracket() {
    assert_eq!(syntax_offset(br#"{"a":[1,]}"#), 8);
    assert_eq!(syntax_offset(br#"{"a":[[1],]}"#), 10);
}

#[test]
fn missing_colon_is_refused() {
    assert_eq!(
        scan(r#"{"a" 1}"#),
        Err(JsonError::Syntax {
            offset: 5,
            expected: "':' after an object key"
        })
    );
    assert_syntax(r#"{"a"}"#);
    assert_syntax(r#"{"a":{"b" 2}}"#);
    assert_syntax(r#"{"a","b"}"#);
}

#[test]
fn missing_value_and_stray_commas_are_refused() {
    for body in [
        r#"{"a":}"#,
        r#"{"a":,"b":1}"#,
        r#"{,}"#,
        r#"{,"a":1}"#,
        r#"{"a":1,,"b":2}"#,
        r#"{"a":[,1]}"#,
        r#"{"a":[1,,2]}"#,
        r#"{"a":1 "b":2}"#,
        r#"{"a":[1 2]}"#,
    ] {
        assert_syntax(body);
    }
}

#[test]
fn keys_must_be_double_quoted_strings() {
    for body in [r#"{a:1}"#, r#"{'a':1}"#, r#"{1:2}"#, r#"{null:1}"#, r#"{"a":{b:1}}"#] {
        assert_syntax(body);
    }
    assert_eq!(syntax_offset(b"{a:1}"), 1);
}

#[test]
fn bad_literals_are_refused() {
    for body in [
        r#"{"a":tru}"#,
        r#"{"a":nul}"#,
        r#"{"a":fals}"#,
        r#"{"a":True}"#,
        r#"{"a":NULL}"#,
        r#"{"a":truex}"#,
        r#"{"a":nulll}"#,
        r#"{"a":undefined}"#,
        r#"{"a":NaN}"#,
        r#"{"a":Infinity}"#,
        r#"{"a":-Infinity}"#,
        r#"{"a":t"#,
    ] {
        assert_syntax(body);
    }
    assert_eq!(
        scan(r#"{"a":tru}"#),
        Err(JsonError::Syntax {
            offset: 5,
            expected: "true, false or null"
        })
    );
}

#[test]
fn leading_zeros_are_refused() {
    assert_eq!(syntax_offset(br#"{"a":01}"#), 6);
    assert_syntax(r#"{"a":00}"#);
    assert_syntax(r#"{"a":-01}"#);
    assert_syntax(r#"{"a":[007]}"#);
}

#[test]
fn fraction_without_digits_is_refused() {
    assert_eq!(
        scan(r#"{"a":1.}"#),
        Err(JsonError::Syntax {
            offset: 7,
            expected: "a digit after '.'"
        })
    );
    assert_syntax(r#"{"a":1.e5}"#);
    assert_syntax(r#"{"a":-.5}"#);
}

#[test]
fn fraction_without_integer_part_is_refused() {
    assert_eq!(syntax_offset(br#"{"a":.5}"#), 5);
}

#[test]
fn exponent_without_digits_is_refused() {
    assert_eq!(
        scan(r#"{"a":1e}"#),
        Err(JsonError::Syntax {
            offset: 7,
            expected: "a digit in the exponent"
        })
    );
    assert_syntax(r#"{"a":1E+}"#);
    assert_syntax(r#"{"a":1e-}"#);
    assert_syntax(r#"{"a":1e+-2}"#);
}

#[test]
fn sign_errors_are_refused() {
    assert_eq!(
        scan(r#"{"a":-}"#),
        Err(JsonError::Syntax {
            offset: 6,
            expected: "a digit"
        })
    );
    assert_syntax(r#"{"a":+1}"#);
    assert_syntax(r#"{"a":--1}"#);
    assert_syntax(r#"{"a":0x10}"#);
}

#[test]
fn unterminated_strings_are_refused_at_the_end() {
    let body = r#"{"a":"abc"#;
    assert_eq!(
        scan(body),
        Err(JsonError::Syntax {
            offset: body.len(),
            expected: "a closing '\"'"
        })
    );
    assert_syntax(r#"{"abc"#);
    assert_syntax(r#"{"a":"abc\"}"#);
    assert_syntax(r#"{"a":"abc\"#);
}

#[test]
fn raw_control_characters_in_strings_are_refused() {
    for c in [0x00u8, 0x01, b'\t', b'\n', b'\r', 0x1f] {
        let mut body = br#"{"a":"x"#.to_vec();
        body.push(c);
        body.extend_from_slice(br#"y"}"#);
        assert_eq!(
            scan_object(&body, MAX_DEPTH),
            Err(JsonError::Syntax {
                offset: 7,
                expected: "no raw control characters inside a string"
            }),
            "byte {c:#x}"
        );
    }
    // In keys too.
    assert_syntax("{\"a\nb\":1}");
}

#[test]
fn bad_escapes_are_refused() {
    for body in [
        r#"{"a":"\x41"}"#,
        r#"{"a":"\'"}"#,
        r#"{"a":"\U0041"}"#,
        r#"{"a":"\a"}"#,
        r#"{"a":"\0"}"#,
        r#"{"a":"\ "}"#,
        r#"{"\q":1}"#,
    ] {
        assert_syntax(body);
    }
    assert_eq!(
        scan(r#"{"a":"\x41"}"#),
        Err(JsonError::Syntax {
            offset: 7,
            expected: "a valid escape sequence"
        })
    );
}

#[test]
fn short_or_non_hex_unicode_escapes_are_refused() {
    for body in [
        r#"{"a":"\u12"}"#,
        r#"{"a":"\u12"#,
        r#"{"a":"\u"}"#,
        r#"{"a":"\u00g0"}"#,
        r#"{"a":"\u-123"}"#,
        r#"{"a":"\u 123"}"#,
        r#"{"a":"\uD83D\uDE0"}"#,
    ] {
        assert_syntax(body);
    }
}

#[test]
fn lone_low_surrogate_is_refused() {
    assert_eq!(
        scan(r#"{"a":"\uDC00"}"#),
        Err(JsonError::Syntax {
            offset: 12,
            expected: "no lone low surrogate in a \\u escape"
        })
    );
    assert_syntax(r#"{"a":"x\udfff"}"#);
    assert_syntax(r#"{"\uDE00":1}"#);
}

#[test]
fn high_surrogate_without_a_low_one_is_refused() {
    for body in [
        r#"{"a":"\uD800"}"#,
        r#"{"a":"\uD800x"}"#,
        r#"{"a":"\uD800\n"}"#,
        r#"{"a":"\uD800\u0041"}"#,
        r#"{"a":"\uD800\uD800"}"#,
        r#"{"a":"\uDBFF\uE000"}"#,
        r#"{"a":"\uD800"#,
    ] {
        assert_syntax(body);
    }
    assert_eq!(
        scan(r#"{"a":"\uD800x"}"#),
        Err(JsonError::Syntax {
            offset: 12,
            expected: "a low surrogate after a high surrogate"
        })
    );
}

#[test]
fn surrogate_pair_boundaries_are_accepted() {
    ok(r#"{"a":"\uD800\uDC00\uDBFF\uDFFF\ud83d\ude00"}"#);
    // Just outside the surrogate ranges.
    ok(r#"{"a":"\uD7FF\uE000\uFFFF"}"#);
}

#[test]
fn trailing_garbage_after_the_object_is_refused() {
    assert_eq!(
        scan("{}x"),
        Err(JsonError::Syntax {
            offset: 2,
            expected: "end of input"
        })
    );
    assert_eq!(syntax_offset(b"{} {}"), 3);
    assert_eq!(syntax_offset(br#"{"a":1}}"#), 7);
    assert_eq!(syntax_offset(b"{}]"), 2);
    assert_eq!(syntax_offset(b"{} \n ,"), 5);
    assert_eq!(syntax_offset(b"{}\0"), 2);
}

#[test]
fn unclosed_containers_are_refused() {
    assert_eq!(
        scan(r#"{"a""#),
        Err(JsonError::Syntax {
            offset: 4,
            expected: "':' after an object key"
        })
    );
    for body in [
        "{",
        "{ ",
        r#"{"a":"#,
        r#"{"a":1"#,
        r#"{"a":1,"#,
        r#"{"a":[1"#,
        r#"{"a":{"b":1}"#,
    ] {
        assert_eq!(
            scan(body),
            Err(JsonError::Syntax {
                offset: body.len(),
                expected: "more input"
            }),
            "{body:?}"
        );
    }
}

#[test]
fn mismatched_brackets_are_refused() {
    assert_eq!(syntax_offset(br#"{"a":[1}"#), 7);
    assert_eq!(syntax_offset(br#"{"a":{"b":1]}"#), 11);
    assert_syntax(r#"{"a":[}"#);
    assert_syntax(r#"{]"#);
}

#[test]
fn comments_and_bom_are_refused() {
    assert_syntax("{/*c*/}");
    assert_syntax("{\"a\":1 // c\n}");
    // A UTF-8 byte-order mark is valid UTF-8 but not JSON whitespace.
    assert_eq!(
        scan_object(b"\xEF\xBB\xBF{}", MAX_DEPTH),
        Err(JsonError::Syntax {
            offset: 0,
            expected: "a JSON value"
        })
    );
}

#[test]
fn only_the_four_json_whitespace_bytes_are_whitespace() {
    ok("{\u{20}\u{9}\u{a}\u{d}}");
    assert_syntax("{\u{c}}");
    assert_syntax("{\u{b}}");
    assert_syntax("{\u{a0}}");
    assert_syntax("\u{c}{}");
}

#[test]
fn empty_body_is_empty() {
    assert_eq!(scan_object(b"", MAX_DEPTH), Err(JsonError::Empty));
}

#[test]
fn whitespace_only_body_is_empty() {
    assert_eq!(scan(" \n\r\t  "), Err(JsonError::Empty));
}

#[test]
fn garbage_top_level_is_a_syntax_error() {
    assert_eq!(
        scan("x"),
        Err(JsonError::Syntax {
            offset: 0,
            expected: "a JSON value"
        })
    );
    assert_eq!(
        scan("  }"),
        Err(JsonError::Syntax {
            offset: 2,
            expected: "a JSON value"
        })
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Invalid UTF-8 and non-object bodies

#[test]
fn invalid_utf8_reports_the_first_bad_offset() {
    let cases: [(&[u8], usize); 6] = [
        (b"{\"a\":\"\xff\"}", 6),
        (b"\xff{}", 0),
        (b"{\"a\":\"\xc0\xaf\"}", 6),
        (b"{\"a\":\"\xed\xa0\x80\"}", 6),
        (b"{\"a\":\"ok\"}\xe2\x82", 10),
        (b"{\"\xc3\":1}", 2),
    ];
    for (body, offset) in cases {
        assert_eq!(
            scan_object(body, MAX_DEPTH),
            Err(JsonError::InvalidUtf8 { offset }),
            "{body:?}"
        );
    }
}

#[test]
fn invalid_utf8_wins_over_later_syntax() {
    // The whole body is checked before it is parsed.
    assert_eq!(
        scan_object(b"[\xff", MAX_DEPTH),
        Err(JsonError::InvalidUtf8 { offset: 1 })
    );
}

#[test]
fn non_object_top_level_names_its_kind() {
    let cases = [
        ("[1,2]", Kind::Array),
        ("[]", Kind::Array),
        ("\"str\"", Kind::String),
        ("42", Kind::Number),
        ("-1", Kind::Number),
        ("true", Kind::Bool),
        ("false", Kind::Bool),
        ("null", Kind::Null),
        ("  \n[{}]", Kind::Array),
    ];
    for (body, found) in cases {
        assert_eq!(scan(body), Err(JsonError::NotAnObject { found }), "{body:?}");
    }
}

#[test]
fn errors_display_what_went_wrong() {
    let cases = [
        (JsonError::Empty, "the request body is empty"),
        (
            JsonError::InvalidUtf8 { offset: 3 },
            "the body is not valid UTF-8 (byte 3)",
        ),
        (
            JsonError::Syntax {
                offset: 9,
                expected: "a digit",
            },
            "invalid JSON at byte 9: expected a digit",
        ),
        (JsonError::TooDeep { limit: 64 }, "JSON nesting exceeds 64 levels"),
        (
            JsonError::NotAnObject { found: Kind::Array },
            "the body must be a JSON object, not an array",
        ),
    ];
    for (e, want) in cases {
        assert_eq!(e.to_string(), want);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Depth

/// An object nested `levels` deep, the top-level object included: `{"a":{"a":...1...}}`.
fn nested_objects(levels: usize) -> String {
    format!("{}1{}", "{\"a\":".repeat(levels), "}".repeat(levels))
}

/// The top-level object holding arrays nested so the total depth is `levels`.
fn nested_arrays(levels: usize) -> String {
    format!("{{\"a\":{}{}}}", "[".repeat(levels - 1), "]".repeat(levels - 1))
}

#[test]
fn max_depth_is_64() {
    assert_eq!(MAX_DEPTH, 64);
}

#[test]
fn exactly_64_levels_of_objects_is_accepted() {
    assert_eq!(ok(&nested_objects(64)).len(), 1);
}

#[test]
fn sixty_five_levels_of_objects_is_too_deep() {
    assert_eq!(scan(&nested_objects(65)), Err(JsonError::TooDeep { limit: 64 }));
}

#[test]
fn exactly_64_levels_of_arrays_is_accepted() {
    assert_eq!(ok(&nested_arrays(64)).len(), 1);
}

#[test]
fn sixty_five_levels_of_arrays_is_too_deep() {
    assert_eq!(scan(&nested_arrays(65)), Err(JsonError::TooDeep { limit: 64 }));
}

#[test]
fn depth_counts_siblings_separately() {
    // Many containers side by side at depth 2 never add up.
    let body = format!("{{\"a\":[{}[]]}}", "[],".repeat(10_000));
    assert_eq!(ok(&body).len(), 1);
}

#[test]
fn depth_limit_is_the_callers() {
    assert_eq!(scan_object(b"{}", 1), Ok(vec![]));
    assert_eq!(scan_object(br#"{"a":[]}"#, 1), Err(JsonError::TooDeep { limit: 1 }));
    assert_eq!(scan_object(b"{}", 0), Err(JsonError::TooDeep { limit: 0 }));
    assert!(scan_object(nested_objects(100).as_bytes(), 100).is_ok());
    assert_eq!(
        scan_object(nested_objects(101).as_bytes(), 100),
        Err(JsonError::TooDeep { limit: 100 })
    );
}

#[test]
fn too_deep_in_a_later_member_is_found() {
    let body = format!("{{\"ok\":[1,2,3],\"deep\":{}}}", "[".repeat(200));
    assert_eq!(scan(&body), Err(JsonError::TooDeep { limit: 64 }));
}

#[test]
fn ten_thousand_nested_arrays_fail_fast_without_recursion() {
    let open = format!("{{\"a\":{}", "[".repeat(10_000));
    let closed = format!("{open}{}}}", "]".repeat(10_000));
    let start = Instant::now();
    assert_eq!(scan(&open), Err(JsonError::TooDeep { limit: 64 }));
    assert_eq!(scan(&closed), Err(JsonError::TooDeep { limit: 64 }));
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
}

#[test]
fn hundred_thousand_nested_objects_fail_fast_without_recursion() {
    let body = nested_objects(100_000);
    let start = Instant::now();
    assert_eq!(scan(&body), Err(JsonError::TooDeep { limit: 64 }));
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
}

#[test]
fn deep_nesting_with_a_huge_limit_does_not_overflow_the_stack() {
    // The scanner's stack is a Vec, not the call stack: 100,000 levels are fine when the caller allows them.
    let body = nested_objects(100_000);
    assert_eq!(scan_object(body.as_bytes(), 1_000_000).map(|m| m.len()), Ok(1));
}

// ---------------------------------------------------------------------------------------------------------------
// Size

#[test]
fn one_mebibyte_string_is_fine() {
    let big = "x".repeat(1 << 20);
    let body = format!("{{\"model\":\"m\",\"s\":\"{big}\",\"t\":true}}");
    let m = ok(&body);
    assert_eq!(m.len(), 3);
    assert_eq!(m[1].value.len(), (1 << 20) + 2);
    assert_eq!(text(body.as_bytes(), m[2].value), "true");
}

#[test]
fn many_members_are_all_indexed() {
    let mut body = String::from("{");
    for i in 0..50_000 {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!("\"k{i}\":{i}"));
    }
    body.push('}');
    let m = ok(&body);
    assert_eq!(m.len(), 50_000);
    assert_eq!(text(body.as_bytes(), m[49_999].key), "\"k49999\"");
    assert_eq!(text(body.as_bytes(), m[49_999].value), "49999");
}

// ---------------------------------------------------------------------------------------------------------------
// Agreement with serde_json

/// A random JSON value, at most `depth` containers deep.
fn gen_value(rng: &mut Lcg, depth: usize) -> Value {
    let choice = if depth == 0 { rng.below(5) } else { rng.below(7) };
    match choice {
        0 => Value::Null,
        1 => Value::Bool(rng.chance(2)),
        2 => gen_number(rng),
        3 | 4 => Value::String(gen_string(rng)),
        5 => Value::Array((0..rng.below(5)).map(|_| gen_value(rng, depth - 1)).collect()),
        _ => Value::Object(gen_object(rng, depth - 1)),
    }
}

fn gen_object(rng: &mut Lcg, depth: usize) -> Map<String, Value> {
    (0..rng.below(6))
        .map(|_| (gen_string(rng), gen_value(rng, depth)))
        .collect()
}

fn gen_number(rng: &mut Lcg) -> Value {
    match rng.below(4) {
        0 => Value::from(rng.below(1000) as i64 - 500),
        1 => Value::from(rng.next_u64()),
        2 => Value::from(-((rng.next_u64() >> 2) as i64)),
        _ => {
            let mantissa = (rng.next_u64() >> 11) as f64 / (1u64 << 40) as f64;
            let exp = rng.below(80) as i32 - 40;
            Number::from_f64(mantissa * 10f64.powi(exp)).map_or(Value::Null, Value::Number)
        }
    }
}

fn gen_string(rng: &mut Lcg) -> String {
    const PIECES: &[&str] = &[
        "a", "model", "messages", " ", "\"", "\\", "/", "\n", "\t", "\u{1}", "\u{1f}", "\u{7f}", "é", "€", "😀", "中",
        "{", "}", "[", "]", ",", ":", "\u{2028}", "\u{fffd}", "0", "true",
    ];
    (0..rng.below(8)).map(|_| *rng.pick(PIECES)).collect()
}

/// Writes `v` as JSON with random whitespace between tokens and random `\u` escapes in strings.
fn write_json(rng: &mut Lcg, v: &Value, out: &mut String) {
    const WS: &[&str] = &["", "", "", " ", "\n", "\t", "\r\n", "  "];
    let ws = |rng: &mut Lcg, out: &mut String| {
        let w: &&str = rng.pick(WS);
        out.push_str(w)
    };
    match v {
        Value::Array(items) => {
            out.push('[');
            ws(rng, out);
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    ws(rng, out);
                }
                write_json(rng, item, out);
                ws(rng, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            ws(rng, out);
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    ws(rng, out);
                }
                write_string(rng, k, out);
                ws(rng, out);
                out.push(':');
                ws(rng, out);
                write_json(rng, item, out);
                ws(rng, out);
            }
            out.push('}');
        }
        Value::String(s) => write_string(rng, s, out),
        other => out.push_str(&other.to_string()),
    }
}

fn write_string(rng: &mut Lcg, s: &str, out: &mut String) {
    if rng.chance(2) {
        out.push_str(&Value::from(s).to_string());
        return;
    }
    out.push('"');
    for c in s.chars() {
        let mut units = [0u16; 2];
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || rng.chance(3) => {
                for u in c.encode_utf16(&mut units) {
                    if rng.chance(2) {
                        out.push_str(&format!("\\u{u:04x}"));
                    } else {
                        out.push_str(&format!("\\u{u:04X}"));
                    }
                }
            }
            '/' if rng.chance(2) => out.push_str("\\/"),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn gen_document(rng: &mut Lcg) -> (Map<String, Value>, String) {
    let obj = gen_object(rng, 4);
    let mut text = String::new();
    if rng.chance(3) {
        text.push_str(" \n");
    }
    write_json(rng, &Value::Object(obj.clone()), &mut text);
    if rng.chance(3) {
        text.push_str("\t\r\n ");
    }
    (obj, text)
}

/// serde_json's verdict for the gateway's question: is this one valid JSON object?
/// `None` for the one class where serde_json is stricter than the JSON grammar: numbers out of f64 range.
fn serde_accepts(body: &[u8]) -> Option<bool> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => Some(v.is_object()),
        Err(e) if e.to_string().contains("number out of range") => None,
        Err(_) => Some(false),
    }
}

#[test]
fn generated_documents_scan_and_their_spans_reparse_to_serde_values() {
    let mut rng = Lcg(0x5eed_0001);
    for n in 0..400 {
        let (generated, body) = gen_document(&mut rng);
        // Compare with serde_json's reading of the same text (its float parsing is not always exact, so the
        // generated map is only compared by keys).
        let parsed = serde_json::from_str::<Value>(&body).unwrap();
        let obj = parsed.as_object().unwrap();
        assert!(obj.keys().eq(generated.keys()), "doc {n}");
        let members = ok(&body);
        assert_eq!(members.len(), obj.len(), "doc {n}: {body}");
        // serde_json's map is ordered by key, and so is the document we wrote from it.
        for (m, (k, v)) in members.iter().zip(obj.iter()) {
            let key: String = serde_json::from_slice(m.key.of(body.as_bytes())).unwrap();
            assert_eq!(&key, k, "doc {n}");
            assert_eq!(
                m.key_escaped,
                m.key.of(body.as_bytes()).contains(&b'\\'),
                "doc {n} key {k:?}"
            );
            let value: Value = serde_json::from_slice(m.value.of(body.as_bytes())).unwrap();
            assert_eq!(&value, v, "doc {n} key {k:?}");
            assert_eq!(Some(m.kind), kind_of(body.as_bytes()[m.value.start]));
            let expected_kind = match v {
                Value::Null => Kind::Null,
                Value::Bool(_) => Kind::Bool,
                Value::Number(_) => Kind::Number,
                Value::String(_) => Kind::String,
                Value::Array(_) => Kind::Array,
                Value::Object(_) => Kind::Object,
            };
            assert_eq!(m.kind, expected_kind);
        }
    }
}

#[test]
fn compact_and_pretty_serde_output_scans() {
    let mut rng = Lcg(0x5eed_0002);
    for _ in 0..200 {
        let obj = Value::Object(gen_object(&mut rng, 5));
        for body in [
            serde_json::to_string(&obj).unwrap(),
            serde_json::to_string_pretty(&obj).unwrap(),
        ] {
            let members = ok(&body);
            assert_eq!(members.len(), obj.as_object().unwrap().len());
        }
    }
}

#[test]
fn truncated_documents_agree_with_serde() {
    let mut rng = Lcg(0x5eed_0003);
    for _ in 0..60 {
        let (_, body) = gen_document(&mut rng);
        let bytes = body.as_bytes();
        for cut in 0..bytes.len() {
            let part = &bytes[..cut];
            let mine = scan_object(part, MAX_DEPTH).is_ok();
            if let Some(theirs) = serde_accepts(part) {
                assert_eq!(mine, theirs, "cut at {cut}: {:?}", String::from_utf8_lossy(part));
            }
        }
    }
}

#[test]
fn mutated_documents_agree_with_serde() {
    const BYTES: &[u8] = b"{}[]\",:\\/0123456789-+.eEtrufalsn \n\t\rxu\x00\x1f\x7f\xff\xc3\xa9";
    let mut rng = Lcg(0x5eed_0004);
    let mut checked = 0;
    let mut accepted = 0;
    for _ in 0..400 {
        let (_, body) = gen_document(&mut rng);
        for _ in 0..25 {
            let mut m = body.as_bytes().to_vec();
            for _ in 0..=rng.below(3) {
                let at = rng.below(m.len() + 1);
                let b = *rng.pick(BYTES);
                match rng.below(3) {
                    0 if at < m.len() => m[at] = b,
                    1 if at < m.len() => {
                        m.remove(at);
                    }
                    _ => m.insert(at, b),
                }
            }
            let mine = scan_object(&m, MAX_DEPTH);
            if let Some(theirs) = serde_accepts(&m) {
                assert_eq!(mine.is_ok(), theirs, "{:?} -> {mine:?}", String::from_utf8_lossy(&m));
                checked += 1;
                accepted += usize::from(theirs);
            }
        }
    }
    // The mutations must exercise both verdicts.
    assert!(checked > 9_000, "{checked}");
    assert!(accepted > 100 && accepted < checked - 100, "{accepted} of {checked}");
}

#[test]
fn scanner_follows_the_grammar_where_serde_json_limits_number_range() {
    // serde_json (without arbitrary_precision) refuses numbers beyond f64; the JSON grammar, and the scanner, do
    // not. The engine behind the gateway decides what such a number means.
    let body = br#"{"a":1e400}"#;
    assert!(serde_json::from_slice::<Value>(body).is_err());
    assert_eq!(scan_object(body, MAX_DEPTH).map(|m| m.len()), Ok(1));
}

#[test]
fn scanner_and_serde_json_both_refuse_lone_surrogates() {
    for body in [r#"{"a":"\uDC00"}"#, r#"{"a":"\uD800"}"#, r#"{"a":"\uD800\u0041"}"#] {
        assert!(serde_json::from_str::<Value>(body).is_err(), "{body}");
        assert!(scan(body).is_err(), "{body}");
    }
}

/// The UTF-8 check rides on the scan (a string's characters from 0x80 up are checked where the skip stops at
/// them); it must still answer exactly as a check of the whole body before the scan would: a body that is not
/// UTF-8 is refused as such at std's offset whatever else is wrong with it, and a UTF-8 one never is.
#[test]
fn utf8_errors_are_found_anywhere_and_at_stds_offset() {
    const BYTES: &[u8] = &[
        0x80, 0xbf, 0xc0, 0xc1, 0xc3, 0xdf, 0xe0, 0xe2, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff, b'"', b'\\', b'a', 0x1f,
    ];
    let mut rng = Lcg(0x5eed_0007);
    let mut invalid = 0;
    for n in 0..600 {
        let (_, body) = gen_document(&mut rng);
        let mut bytes = body.into_bytes();
        for _ in 0..1 + rng.below(3) {
            if bytes.is_empty() {
                break;
            }
            let at = rng.below(bytes.len());
            bytes[at] = *rng.pick(BYTES);
        }
        if rng.chance(4) {
            bytes.truncate(rng.below(bytes.len() + 1));
        }
        let got = scan_object(&bytes, MAX_DEPTH);
        match std::str::from_utf8(&bytes) {
            Err(e) => {
                invalid += 1;
                assert_eq!(
                    got,
                    Err(JsonError::InvalidUtf8 {
                        offset: e.valid_up_to()
                    }),
                    "doc {n}: {bytes:?}"
                );
            }
            Ok(_) => {
                assert!(!matches!(got, Err(JsonError::InvalidUtf8 { .. })), "doc {n}: {bytes:?}");
                if let Some(theirs) = serde_accepts(&bytes) {
                    assert_eq!(got.is_ok(), theirs, "doc {n}: {bytes:?}");
                }
            }
        }
    }
    assert!(invalid > 100, "the mutations made {invalid} bodies that are not UTF-8");
}

#[test]
fn long_runs_of_text_outside_ascii_scan() {
    // Runs of characters from 0x80 up, between escapes and ASCII, across the 16-byte steps.
    for len in [1usize, 5, 15, 16, 17, 40, 1000] {
        for piece in ["é", "€", "中", "😀", "aé", "\\n中"] {
            let s = piece.repeat(len);
            let body = format!("{{\"a\":\"{s}\",\"b\":[\"{s}x\",1]}}");
            assert_eq!(ok(&body).len(), 2, "{piece} x{len}");
            let mut cut = body.clone().into_bytes();
            let last = body.rfind(piece.chars().last().unwrap()).unwrap();
            cut.remove(last + piece.chars().last().unwrap().len_utf8() - 1);
            if std::str::from_utf8(&cut).is_err() {
                assert!(matches!(
                    scan_object(&cut, MAX_DEPTH),
                    Err(JsonError::InvalidUtf8 { .. })
                ));
            }
        }
    }
}
