//! Per-alias affinity (`models[].affinity`, the seed's per-model routing method): the fields an alias sets are
//! checked like their top-level namesakes and override them, the rest are inherited, and requests follow their
//! alias' own session headers, prefix length and placement.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::lookup;
use llmroute_core::config::{BoundedKeys, KeyPlacement};
use llmroute_core::request::start;
use llmroute_core::{load_config, route, Api, Config, ConfigError, GatewayError, SessionHeaders};
use serde_json::{json, Value};

/// Two aliases on one ring-hash backend: `plain` inherits everything, `own` sets `own` fields.
fn cfg_value(own: Value, top: Value) -> Value {
    json!({
        "version": 1,
        "backends": [
            { "name": "a", "kind": "llamacpp", "endpoints": ["10.0.0.1:8080", "10.0.0.2:8080"] },
            { "name": "rr", "kind": "vllm", "endpoints": ["10.0.0.3:8000"], "lb": "round_robin" }
        ],
        "models": [
            { "name": "plain", "routes": [ { "backend": "a" } ] },
            { "name": "own", "routes": [ { "backend": "a" } ], "affinity": own }
        ],
        "affinity": top
    })
}

fn cfg(own: Value, top: Value) -> Config {
    load_config(&cfg_value(own, top).to_string()).unwrap_or_else(|e| panic!("should load:\n{e}"))
}

fn errors(v: &Value) -> Vec<ConfigError> {
    match load_config(&v.to_string()) {
        Ok(_) => panic!("should be refused: {v:#}"),
        Err(e) => e.0,
    }
}

#[test]
fn unset_fields_inherit_and_set_fields_override() {
    let c = cfg(
        json!({ "placement": "bounded_keys", "user_prefix_bytes": 32, "session_headers": ["X-Conv"] }),
        json!({ "session_headers": ["x-session-id"], "user_prefix_bytes": 100, "conversation_id": true, "key_balance_factor": 150 }),
    );
    let (plain, own) = (c.alias("plain").unwrap(), c.alias("own").unwrap());
    assert_eq!(plain.affinity, c.affinity);
    assert_eq!(own.affinity.session_headers, ["x-conv"]);
    assert_eq!(own.affinity.user_prefix_bytes, 32);
    assert!(own.affinity.conversation_id, "inherited");
    // bounded_keys takes the top-level parameters, even when the top-level placement is hash.
    assert_eq!(c.affinity.placement, KeyPlacement::Hash);
    let want = BoundedKeys {
        key_balance_factor: 150,
        ..BoundedKeys::default()
    };
    assert_eq!(own.affinity.placement, KeyPlacement::BoundedKeys(want));
    assert!(c.any_bounded_keys());
    assert_eq!(c.session_header_names(), ["x-session-id", "x-conv"]);
    assert!(!c.session_headers_shared());
    // An alias may also turn the top-level bounded_keys off for itself.
    let c = cfg(json!({ "placement": "hash" }), json!({ "placement": "bounded_keys" }));
    assert_eq!(c.alias("own").unwrap().affinity.placement, KeyPlacement::Hash);
    assert!(c.alias("plain").unwrap().affinity.placement.bounded().is_some());
    assert!(c.session_headers_shared());
    // Nothing set anywhere: no alias places keys.
    assert!(!cfg(json!({}), json!({})).any_bounded_keys());
}

#[test]
fn alias_fields_are_checked_like_the_top_level_ones() {
    let v = cfg_value(
        json!({ "placement": "ring", "user_prefix_bytes": 100000, "session_headers": ["x-llmroute-s", "authorization", "x-a", "X-A"] }),
        json!({}),
    );
    let got: Vec<(String, String)> = errors(&v).into_iter().map(|e| (e.field, e.value)).collect();
    let want = [
        ("models[1].affinity.session_headers[0]", "x-llmroute-s"),
        ("models[1].affinity.session_headers[1]", "authorization"),
        ("models[1].affinity.session_headers[3]", "X-A"),
        ("models[1].affinity.user_prefix_bytes", "100000"),
        ("models[1].affinity.placement", "ring"),
    ];
    let want: Vec<(String, String)> = want.iter().map(|(f, v)| (f.to_string(), v.to_string())).collect();
    assert_eq!(got, want);
    // Unknown fields are refused by name: the bounded_keys parameters stay top-level.
    let v = cfg_value(json!({ "key_balance_factor": 150 }), json!({}));
    let e = errors(&v);
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].field.starts_with("models[1].affinity") && e[0].reason.contains("key_balance_factor"),
        "{e:?}"
    );
    let many: Vec<String> = (0..17).map(|i| format!("x-s{i}")).collect();
    let e = errors(&cfg_value(json!({ "session_headers": many }), json!({})));
    assert_eq!(e[0].field, "models[1].affinity.session_headers", "{e:?}");
    assert!(e[0].reason.contains("at most 16"), "{e:?}");
}

#[test]
fn bounded_keys_parameters_need_some_alias_to_place_keys() {
    let e = errors(&cfg_value(json!({}), json!({ "max_keys": 64 })));
    assert_eq!((e[0].field.as_str(), e.len()), ("affinity.max_keys", 1), "{e:?}");
    assert!(e[0].reason.contains("an alias' own"), "{e:?}");
    let c = cfg(json!({ "placement": "bounded_keys" }), json!({ "max_keys": 64 }));
    assert_eq!(
        c.alias("own").unwrap().affinity.placement.bounded().unwrap().max_keys,
        64
    );
    let e = errors(&cfg_value(
        json!({ "placement": "bounded_keys" }),
        json!({ "max_keys": 1 }),
    ));
    assert!(
        e[0].field == "affinity.max_keys" && e[0].reason.contains("between 16"),
        "{e:?}"
    );
}

#[test]
fn an_alias_placing_keys_on_a_backend_that_cannot_pin_is_warned() {
    let mut v = cfg_value(json!({ "placement": "bounded_keys" }), json!({}));
    v["models"][1]["routes"] = json!([{ "backend": "rr" }]);
    v["backends"][0]["slots"] = json!([2, 2]);
    let c = load_config(&v.to_string()).unwrap();
    let w: Vec<String> = c.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(w.len(), 2, "{w:#?}");
    assert!(w[0].starts_with("backends[0].slots") && w[0].contains("only used by affinity.placement: bounded_keys"));
    assert!(
        w[1].contains(
            "backends[1].lb = round_robin: models[1].affinity.placement: bounded_keys applies only to lb: chwbl"
        ),
        "{w:?}"
    );
}

fn body(model: &str, user: &str) -> Vec<u8> {
    json!({ "model": model, "messages": [{ "role": "user", "content": user }] })
        .to_string()
        .into_bytes()
}

#[test]
fn each_alias_reads_its_own_session_headers() {
    let c = cfg(
        json!({ "session_headers": ["x-conv"] }),
        json!({ "session_headers": ["x-session-id"] }),
    );
    let sent = [
        ("content-type", "application/json"),
        ("x-session-id", "s-1"),
        ("x-conv", "c-1"),
    ];
    let s = start(&c, "POST", "/v1/chat/completions", lookup(&sent)).unwrap();
    let echo = |alias: &str| {
        route(&c, Api::Chat, &body(alias, "hi"), &s.session)
            .unwrap()
            .echo_session
    };
    assert_eq!(echo("plain").as_deref(), Some("s-1"));
    assert_eq!(echo("own").as_deref(), Some("c-1"));
    // A bad value counts only for the alias that reads that header, and only once the body names the alias.
    let bad = [("content-type", "application/json"), ("x-conv", "a\tb")];
    let s = start(&c, "POST", "/v1/chat/completions", lookup(&bad)).unwrap();
    let d = route(&c, Api::Chat, &body("plain", "hi"), &s.session).unwrap();
    assert_eq!(d.echo_session, None);
    let e = route(&c, Api::Chat, &body("own", "hi"), &s.session).unwrap_err();
    assert_eq!(
        e,
        GatewayError::InvalidSessionHeader {
            header: "x-conv".into(),
            reason: "the value contains control characters"
        }
    );
    // With one list for every alias, the headers phase refuses it at once, as before.
    let shared = cfg(json!({}), json!({ "session_headers": ["x-conv"] }));
    assert!(start(&shared, "POST", "/v1/chat/completions", lookup(&bad)).is_err());
    assert_eq!(
        SessionHeaders::read(&c, lookup(&[])).first(&c.affinity.session_headers),
        Ok(None)
    );
}

#[test]
fn each_alias_keys_its_own_prefix_and_names_its_own_placement() {
    let c = cfg(
        json!({ "user_prefix_bytes": 4, "placement": "bounded_keys" }),
        json!({}),
    );
    let key = |alias: &str, user: &str| {
        let d = route(&c, Api::Chat, &body(alias, user), None).unwrap();
        (d.affinity.unwrap().hash, d.placement)
    };
    // `own` keys only the first 4 bytes of the user message; `plain` the default 256.
    assert_eq!(key("own", "abcd-one").0, key("own", "abcd-two").0);
    assert_ne!(key("plain", "abcd-one").0, key("plain", "abcd-two").0);
    assert!(key("own", "x").1.bounded().is_some());
    assert_eq!(key("plain", "x").1, KeyPlacement::Hash);
}
