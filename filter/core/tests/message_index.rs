//! The message index against the walk: on random `messages` arrays (members in any order, duplicates, escaped
//! keys, scalar and container values, non-object elements, more elements than the index holds), every message
//! read through the index has the role and content the walk finds, and the content keys built both ways are equal.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::affinity::ContentKey;
use llmroute_core::content::{feed_first_user, feed_leading, is_non_empty_array, messages};
use llmroute_core::json::{scan_object_with, Span, MAX_DEPTH};
use llmroute_core::message_index::{MessageIndex, MAX_MESSAGES};
use proptest::prelude::*;

/// A JSON value a message member may hold.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["system", "developer", "user", "assistant", "tool", "us\\u0065r", ""])
            .prop_map(|r| format!("\"{r}\"")),
        3 => "[a-z \\\\\"]{0,40}".prop_map(|t| format!("\"{}\"", t.replace('\\', "\\\\").replace('"', "\\\""))),
        2 => prop::collection::vec("[a-z ]{0,12}", 0..4).prop_map(|parts| {
            let parts: Vec<String> = parts
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    if i % 3 == 2 {
                        format!("{{\"type\":\"image_url\",\"image_url\":{{\"url\":\"{t}\"}}}}")
                    } else {
                        format!("{{\"text\":\"{t}\",\"type\":\"text\"}}")
                    }
                })
                .collect();
            format!("[{}]", parts.join(","))
        }),
        1 => Just("null".to_string()),
        1 => Just("-12.5e3".to_string()),
        1 => Just("true".to_string()),
        1 => Just("{\"role\":\"user\",\"content\":\"nested\"}".to_string()),
    ]
}

/// A member key of a message, some of them duplicates or written with escapes.
fn key() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "role",
        "role",
        "content",
        "content",
        "name",
        "tool_calls",
        "r\\u006fle",
        "cont\\u0065nt",
        "Role",
    ])
}

/// One element of `messages`: usually an object, sometimes another value.
fn element() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::collection::vec((key(), value()), 0..5).prop_map(|members| {
            let inner: Vec<String> = members.iter().map(|(k, v)| format!("\"{k}\" : {v}")).collect();
            format!("{{ {} }}", inner.join(" ,"))
        }),
        1 => value(),
        1 => Just("[\"user\", {\"role\":\"user\"}]".to_string()),
    ]
}

/// A body whose `messages` key is sometimes written with an escape, between other members.
fn body() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(element(), 0..(MAX_MESSAGES + 6)),
        prop::sample::select(vec!["messages", "messages", "messages", "m\\u0065ssages"]),
        any::<bool>(),
    )
        .prop_map(|(elements, key, messages_first)| {
            let list = format!("[{}]", elements.join(", "));
            if messages_first {
                format!("{{\"{key}\":{list},\"model\":\"m\",\"n\":[1,{{\"role\":\"x\"}}]}}")
            } else {
                format!("{{\"model\":\"m\",\"tools\":[{{\"messages\":[1]}}],\"{key}\":{list}}}")
            }
        })
}

/// The scan's index and the span of the `messages` array (found by its decoded key).
fn scanned(body: &[u8]) -> (MessageIndex<'_>, Span) {
    let mut index = MessageIndex::new(body);
    let members = scan_object_with(body, MAX_DEPTH, &mut index).unwrap();
    let list = members
        .iter()
        .find(|m| llmroute_core::json::nav::str_value(body, m.key).as_deref() == Some("messages"))
        .unwrap()
        .value;
    (index, list)
}

fn keys(body: &[u8], list: Span, index: Option<&MessageIndex<'_>>) -> (Option<String>, Option<String>, bool) {
    let mut system = ContentKey::system("alias");
    feed_leading(body, list, index, &["system", "developer"], &mut system);
    let mut user = ContentKey::user_prefix("alias", 64);
    let found = feed_first_user(body, list, index, &mut user);
    let show = |k: ContentKey| k.finish().map(|a| format!("{a:?}"));
    (show(system), show(user), found)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_index_reads_every_message_as_the_walk_does(body in body()) {
        let body = body.as_bytes();
        let (index, list) = scanned(body);
        let read = |index: Option<&MessageIndex<'_>>| -> Vec<(Option<String>, Option<Span>)> {
            messages(body, list, index)
                .map(|m| (m.role(body).map(|r| r.into_owned()), m.content(body)))
                .collect()
        };
        prop_assert_eq!(read(Some(&index)), read(None));
        prop_assert_eq!(keys(body, list, Some(&index)), keys(body, list, None));
        prop_assert_eq!(
            is_non_empty_array(body, list, Some(&index)),
            is_non_empty_array(body, list, None)
        );
    }
}

#[test]
fn the_index_covers_a_plain_chat_body_and_its_spans_are_the_values() {
    let body = br#"{"model":"m","messages":[{"content":"be brief","role":"system"},{"role":"user","content":[{"type":"text","text":"hi"}]},3]}"#;
    let (index, list) = scanned(body);
    let indexed = index.of(list).expect("a plain `messages` array is indexed");
    assert_eq!(indexed.entries.len(), 3);
    assert!(!indexed.overflow);
    let text = |s: Option<Span>| std::str::from_utf8(s.unwrap().of(body)).unwrap().to_string();
    assert_eq!(text(indexed.entries[0].role), "\"system\"");
    assert_eq!(text(indexed.entries[0].content), "\"be brief\"");
    assert_eq!(text(indexed.entries[1].content), r#"[{"type":"text","text":"hi"}]"#);
    assert!(!indexed.entries[2].object);
}

#[test]
fn an_escaped_key_inside_a_message_leaves_the_array_to_the_walk() {
    let body = br#"{"messages":[{"r\u006fle":"user","content":"x"}]}"#;
    let (index, list) = scanned(body);
    assert!(index.of(list).is_none());
    let body = br#"{"m\u0065ssages":[{"role":"user","content":"x"}]}"#;
    let (index, list) = scanned(body);
    assert!(index.of(list).is_none());
}

#[test]
fn past_the_indexed_messages_the_reader_walks_on() {
    let assistant = r#"{"role":"assistant","content":"a"}"#;
    let mut elements = vec![assistant; MAX_MESSAGES + 2];
    elements.push(r#"{"role":"user","content":"late question"}"#);
    let body = format!("{{\"messages\":[{}]}}", elements.join(","));
    let body = body.as_bytes();
    let (index, list) = scanned(body);
    assert!(index.of(list).unwrap().overflow);
    assert_eq!(messages(body, list, Some(&index)).count(), MAX_MESSAGES + 3);
    let (_, user, found) = keys(body, list, Some(&index));
    assert!(found);
    assert_eq!(user, keys(body, list, None).1);
}
