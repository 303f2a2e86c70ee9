//! Config loading: the README example, the defaults, and every rejection with its field, value and reason.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;

use common::{README_EXAMPLE, TWO_BACKENDS};
use llmroute_core::config::{
    env_problems, parse_endpoint, parse_listen, EngineKind, EnvHolds, LbPolicy, StreamUpstream, DEFAULT_BALANCE_FACTOR,
    DEFAULT_IMAGE_TOKENS, DEFAULT_MAX_BODY_BYTES, DEFAULT_SESSION_HEADERS, DEFAULT_USER_PREFIX_BYTES,
    MAX_MAX_BODY_BYTES, MAX_USER_PREFIX_BYTES, SCHEMA_VERSION,
};
use llmroute_core::config::{strip_render_only, RENDER_ONLY_FIELDS};
use llmroute_core::endpoint::ApiSet;
use llmroute_core::{load_config, load_document, Api, ConfigError, ConfigErrors, Document};
use serde_json::{json, Value};

/// The smallest valid config: every optional field left out.
fn minimal() -> Value {
    json!({
        "version": 1,
        "backends": [ { "name": "a", "kind": "llamacpp", "endpoints": ["127.0.0.1:8081"] } ],
        "models": [ { "name": "m", "routes": [ { "backend": "a" } ] } ]
    })
}

/// [`minimal`] plus a backend `b` that no alias routes to: a refusal of `b` stands alone.
fn spare() -> Value {
    edit(minimal(), |v| {
        v["backends"]
            .as_array_mut()
            .unwrap()
            .push(json!({ "name": "b", "kind": "vllm", "endpoints": ["10.0.0.9:8000"] }))
    })
}

fn two() -> Value {
    serde_json::from_str(TWO_BACKENDS).unwrap()
}

/// The whole document, as `llmroute validate` reads it.
fn load(v: &Value) -> Result<Document, ConfigErrors> {
    load_document(&v.to_string())
}

fn loads(v: &Value) -> Document {
    load(v).unwrap_or_else(|e| panic!("should load:\n{e}\n{v:#}"))
}

fn errors(v: &Value) -> Vec<ConfigError> {
    match load(v) {
        Ok(_) => panic!("should be refused: {v:#}"),
        Err(ConfigErrors(list)) => list,
    }
}

/// The config `base` with `f` applied.
fn edit(mut base: Value, f: impl FnOnce(&mut Value)) -> Value {
    f(&mut base);
    base
}

/// Asserts exactly one error, on `field`, with `value`, whose reason contains `reason`.
fn refused(v: &Value, field: &str, value: &str, reason: &str) -> ConfigError {
    let list = errors(v);
    assert_eq!(list.len(), 1, "expected one error, got {list:#?}");
    let e = list.into_iter().next().unwrap();
    assert_eq!(e.field, field, "{e:?}");
    assert_eq!(e.value, value, "{e:?}");
    assert!(
        e.reason.contains(reason),
        "reason {:?} should contain {reason:?}",
        e.reason
    );
    e
}

// ---------------------------------------------------------------------------------------------------------------
// Loading

#[test]
fn readme_example_loads() {
    let cfg = common::document(README_EXAMPLE);
    assert_eq!(cfg.render_only.listen, "127.0.0.1:10000".parse::<SocketAddr>().unwrap());
    assert_eq!(cfg.admin, "127.0.0.1:9901".parse::<SocketAddr>().unwrap());
    assert_eq!(cfg.backends.len(), 1);
    let b = &cfg.backends[0];
    assert_eq!(b.name, "llama-a");
    assert_eq!(b.kind, EngineKind::LlamaCpp);
    assert_eq!(b.lb, LbPolicy::Chwbl);
    assert_eq!(b.balance_factor, 175);
    assert_eq!(b.connect_timeout_ms, 2000);
    let eps: Vec<String> = b.endpoints.iter().map(ToString::to_string).collect();
    assert_eq!(eps, ["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"]);
    assert!(b.endpoints.iter().all(|e| e.is_ip && e.host == "127.0.0.1"));
    assert_eq!(cfg.models.len(), 1);
    let alias = cfg.alias("local-chat").unwrap();
    assert_eq!(alias.name, "local-chat");
    assert_eq!(alias.routes.len(), 1);
    assert_eq!(alias.routes[0].backend, 0);
    assert_eq!(alias.routes[0].upstream_model, "qwen3-0.6b");
    assert_eq!(alias.routes[0].priority, 10);
    assert_eq!(cfg.affinity.session_headers, ["x-session-id"]);
    assert_eq!(cfg.affinity.user_prefix_bytes, 256);
    assert_eq!(cfg.limits.max_body_bytes, 8 << 20);
    assert!(!cfg.debug_headers);
}

#[test]
fn readme_json_matches_the_shipped_yaml_example() {
    // testdata/configs/good-basic.yaml is the README's example; its JSON form above must say the same things.
    let yaml = include_str!("../../../testdata/configs/good-basic.yaml");
    for needle in [
        "name: llama-a",
        "kind: llamacpp",
        "\"127.0.0.1:8081\", \"127.0.0.1:8082\", \"127.0.0.1:8083\"",
        "balance_factor: 175",
        "name: local-chat",
        "upstream_model: qwen3-0.6b, priority: 10",
        "user_prefix_bytes: 256",
    ] {
        assert!(yaml.contains(needle), "{needle}");
    }
}

#[test]
fn two_backend_config_loads() {
    let cfg = common::two_backends();
    assert_eq!(cfg.backends.len(), 2);
    assert_eq!(cfg.backends[1].kind, EngineKind::Vllm);
    assert_eq!(cfg.backends[1].lb, LbPolicy::LeastRequest);
    let names: Vec<&str> = cfg.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["local-chat", "big", "same", "embedder"]);
}

#[test]
fn defaults_fill_every_optional_field() {
    let cfg = loads(&minimal());
    assert_eq!(cfg.render_only.listen.to_string(), "127.0.0.1:10000");
    assert_eq!(cfg.admin.to_string(), "127.0.0.1:9901");
    let b = &cfg.backends[0];
    assert_eq!(b.lb, LbPolicy::Chwbl);
    assert_eq!(b.balance_factor, 150);
    assert_eq!(b.connect_timeout_ms, 2000);
    assert_eq!(
        cfg.affinity.session_headers,
        ["x-session-id", "x-multi-turn-session-id", "x-claude-code-session-id"]
    );
    assert_eq!(cfg.affinity.user_prefix_bytes, 256);
    assert!(!cfg.affinity.conversation_id);
    assert!(!cfg.affinity.anthropic_user_id);
    assert_eq!(cfg.limits.max_body_bytes, 8 * 1024 * 1024);
    assert_eq!(cfg.limits.request_timeout_ms, 600_000);
    assert!(!cfg.debug_headers);
    assert_eq!(cfg.image_tokens, 768);
    let alias = cfg.alias("m").unwrap();
    assert_eq!(alias.routes[0].priority, 0);
    assert_eq!(
        alias.endpoints,
        ApiSet::DEFAULT,
        "the decision routes are never served by default"
    );
    assert!(!alias.model_prefix_routing);
    assert_eq!(alias.stream_upstream, StreamUpstream::AsSent);
    assert_eq!(cfg.limits.max_assembled_bytes, 4 << 20);
}

#[test]
fn stream_upstream_and_its_bound_are_read_and_checked() {
    let cfg = loads(&edit(minimal(), |v| {
        v["models"][0]["stream_upstream"] = json!("always");
        v["limits"] = json!({"max_assembled_bytes": 65536});
    }));
    assert_eq!(cfg.alias("m").unwrap().stream_upstream, StreamUpstream::Always);
    assert_eq!(cfg.limits.max_assembled_bytes, 65536);
    let bad = edit(minimal(), |v| v["models"][0]["stream_upstream"] = json!("sometimes"));
    refused(
        &bad,
        "models[0].stream_upstream",
        "sometimes",
        "use one of: as_sent, always",
    );
    for n in [4095, 64 * 1024 * 1024 + 1] {
        let bad = edit(minimal(), |v| v["limits"] = json!({"max_assembled_bytes": n}));
        refused(
            &bad,
            "limits.max_assembled_bytes",
            &n.to_string(),
            "must be between 4096 and 67108864",
        );
    }
}

#[test]
fn default_constants() {
    assert_eq!(SCHEMA_VERSION, 1);
    assert_eq!(DEFAULT_MAX_BODY_BYTES, 8_388_608);
    assert_eq!(MAX_MAX_BODY_BYTES, 67_108_864);
    assert_eq!(DEFAULT_BALANCE_FACTOR, 150);
    assert_eq!(DEFAULT_USER_PREFIX_BYTES, 256);
    assert_eq!(MAX_USER_PREFIX_BYTES, 65_536);
    assert_eq!(DEFAULT_IMAGE_TOKENS, 768);
    assert_eq!(
        DEFAULT_SESSION_HEADERS,
        ["x-session-id", "x-multi-turn-session-id", "x-claude-code-session-id"]
    );
}

#[test]
fn empty_affinity_and_limits_sections_take_defaults() {
    let cfg = loads(&edit(minimal(), |v| {
        v["affinity"] = json!({});
        v["limits"] = json!({});
        v["tokens"] = json!({});
    }));
    assert_eq!(cfg.affinity.session_headers, DEFAULT_SESSION_HEADERS);
    assert_eq!(cfg.image_tokens, DEFAULT_IMAGE_TOKENS);
    assert_eq!(cfg.affinity.user_prefix_bytes, 256);
    assert_eq!(cfg.limits.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
}

#[test]
fn upstream_model_defaults_to_the_alias() {
    let cfg = common::two_backends();
    assert_eq!(cfg.alias("same").unwrap().routes[0].upstream_model, "same");
    assert_eq!(cfg.alias("local-chat").unwrap().routes[0].upstream_model, "qwen3-0.6b");
}

#[test]
fn routes_are_sorted_by_priority_lowest_first() {
    let cfg = common::two_backends();
    let big = cfg.alias("big").unwrap();
    let order: Vec<(&str, i32)> = big
        .routes
        .iter()
        .map(|r| (cfg.backend(r.backend).unwrap().name.as_str(), r.priority))
        .collect();
    assert_eq!(order, [("llama-a", 1), ("vllm-b", 5)]);
    assert_eq!(big.routes[0].upstream_model, "big");
}

#[test]
fn priority_ties_keep_the_listed_order() {
    let v = json!({
        "version": 1,
        "backends": [
            { "name": "a", "kind": "vllm", "endpoints": ["10.0.0.1:80"] },
            { "name": "b", "kind": "vllm", "endpoints": ["10.0.0.2:80"] },
            { "name": "c", "kind": "vllm", "endpoints": ["10.0.0.3:80"] },
            { "name": "d", "kind": "vllm", "endpoints": ["10.0.0.4:80"] }
        ],
        "models": [ { "name": "m", "routes": [
            { "backend": "c", "priority": 2 },
            { "backend": "b", "priority": -1 },
            { "backend": "d" },
            { "backend": "a", "priority": -1 }
        ] } ]
    });
    let cfg = loads(&v);
    let order: Vec<usize> = cfg.alias("m").unwrap().routes.iter().map(|r| r.backend).collect();
    // b(-1), a(-1) in listed order, then d(0), then c(2); indices into `backends`.
    assert_eq!(order, [1, 0, 3, 2]);
}

#[test]
fn alias_lookup_is_exact() {
    let cfg = common::two_backends();
    assert!(cfg.alias("local-chat").is_some());
    assert!(cfg.alias("Local-Chat").is_none());
    assert!(cfg.alias("qwen3-0.6b").is_none(), "upstream names are not aliases");
    assert!(cfg.alias("").is_none());
    assert!(cfg.backend(1).is_some());
    assert!(cfg.backend(2).is_none());
}

#[test]
fn every_engine_kind_is_accepted() {
    for (name, kind) in [
        ("llamacpp", EngineKind::LlamaCpp),
        ("vllm", EngineKind::Vllm),
        ("sglang", EngineKind::Sglang),
        ("ollama", EngineKind::Ollama),
        ("openai", EngineKind::OpenAi),
    ] {
        let cfg = loads(&edit(minimal(), |v| v["backends"][0]["kind"] = json!(name)));
        assert_eq!(cfg.backends[0].kind, kind);
        assert_eq!(kind.as_str(), name);
        assert_eq!(EngineKind::parse(name), Some(kind));
    }
    assert_eq!(EngineKind::parse("vLLM"), None);
}

#[test]
fn every_lb_policy_is_accepted() {
    for (name, lb) in [
        ("chwbl", LbPolicy::Chwbl),
        ("least_request", LbPolicy::LeastRequest),
        ("round_robin", LbPolicy::RoundRobin),
    ] {
        let cfg = loads(&edit(minimal(), |v| v["backends"][0]["lb"] = json!(name)));
        assert_eq!(cfg.backends[0].lb, lb);
    }
}

#[test]
fn explicit_values_are_kept() {
    let cfg = loads(&edit(minimal(), |v| {
        v["listen"] = json!("0.0.0.0:8080");
        v["admin"] = json!("[::1]:9000");
        v["debug_headers"] = json!(true);
        v["backends"][0]["connect_timeout_ms"] = json!(250);
        v["backends"][0]["balance_factor"] = json!(100);
        v["affinity"] =
            json!({ "session_headers": ["X-Session-Id", "x-claude-code-session-id"], "user_prefix_bytes": 0 });
        v["limits"] = json!({ "max_body_bytes": 1024, "request_timeout_ms": 1 });
    }));
    assert_eq!(cfg.render_only.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(cfg.admin.to_string(), "[::1]:9000");
    assert!(cfg.debug_headers);
    assert_eq!(cfg.backends[0].connect_timeout_ms, 250);
    assert_eq!(cfg.backends[0].balance_factor, 100);
    // Header names are stored in lower case.
    assert_eq!(
        cfg.affinity.session_headers,
        ["x-session-id", "x-claude-code-session-id"]
    );
    assert_eq!(cfg.affinity.user_prefix_bytes, 0);
    assert_eq!(cfg.limits.max_body_bytes, 1024);
    assert_eq!(cfg.limits.request_timeout_ms, 1);
}

#[test]
fn endpoints_of_every_address_form_are_parsed() {
    let cfg = loads(&edit(minimal(), |v| {
        v["backends"][0]["endpoints"] = json!(["127.0.0.1:8081", "[::1]:8082", "llama-0.llama.svc.cluster.local:8080"])
    }));
    let eps = &cfg.backends[0].endpoints;
    assert_eq!(
        (eps[0].host.as_str(), eps[0].port, eps[0].is_ip),
        ("127.0.0.1", 8081, true)
    );
    assert_eq!((eps[1].host.as_str(), eps[1].port, eps[1].is_ip), ("::1", 8082, true));
    assert_eq!(eps[1].to_string(), "[::1]:8082");
    assert_eq!(
        (eps[2].host.as_str(), eps[2].port, eps[2].is_ip),
        ("llama-0.llama.svc.cluster.local", 8080, false)
    );
}

#[test]
fn address_parsers_directly() {
    assert!(parse_endpoint("localhost:1").is_ok());
    assert!(
        parse_endpoint("host.:80").is_ok(),
        "a trailing dot is a fully qualified name"
    );
    assert!(parse_endpoint(&format!("{}:80", "a".repeat(63))).is_ok());
    assert!(parse_endpoint(&format!("{}:80", "a".repeat(64))).is_err());
    assert!(parse_endpoint("h_st:80").is_err());
    assert!(parse_endpoint("127.0.0.1:65535").is_ok());
    assert_eq!(parse_listen("0.0.0.0:1").map(|a| a.port()), Ok(1));
    assert!(parse_listen("127.0.0.1").is_err());
    assert!(parse_listen("[::]:0").is_err());
}

// ---------------------------------------------------------------------------------------------------------------
// Stage one: shape errors

#[test]
fn unknown_top_level_field_is_refused() {
    let list = errors(&edit(minimal(), |v| v["listen_address"] = json!("127.0.0.1:1")));
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].field, "listen_address");
    assert!(
        list[0].reason.contains("unknown field `listen_address`"),
        "{:?}",
        list[0]
    );
    // The reason lists what is allowed and where the typo is.
    assert!(list[0].reason.contains("expected one of `version`"), "{:?}", list[0]);
    assert!(list[0].reason.contains("line 1 column"), "{:?}", list[0]);
    assert!(list[0].value.is_empty());
}

#[test]
fn unknown_nested_field_names_its_path() {
    let list = errors(&edit(minimal(), |v| v["backends"][0]["weight"] = json!(3)));
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].field, "backends[0].weight");
    assert!(list[0].reason.contains("unknown field `weight`"), "{:?}", list[0]);
}

#[test]
fn unknown_field_deep_in_a_route_names_its_path() {
    let list = errors(&edit(two(), |v| v["models"][1]["routes"][1]["weight"] = json!(3)));
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].field, "models[1].routes[1].weight");
    assert!(list[0].reason.contains("unknown field `weight`"));
}

#[test]
fn unknown_fields_in_affinity_and_limits_are_refused() {
    let list = errors(&edit(minimal(), |v| v["affinity"] = json!({ "headers": [] })));
    assert_eq!(list[0].field, "affinity.headers");
    let list = errors(&edit(minimal(), |v| v["limits"] = json!({ "max_body": 1 })));
    assert_eq!(list[0].field, "limits.max_body");
    assert!(list[0].reason.contains("unknown field `max_body`"));
}

#[test]
fn wrong_types_name_the_field() {
    let list = errors(&edit(minimal(), |v| v["version"] = json!("1")));
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].field, "version");
    let list = errors(&edit(minimal(), |v| v["backends"][0]["balance_factor"] = json!(-5)));
    assert_eq!(list[0].field, "backends[0].balance_factor");
    let list = errors(&edit(minimal(), |v| {
        v["backends"][0]["endpoints"] = json!("127.0.0.1:80")
    }));
    assert_eq!(list[0].field, "backends[0].endpoints");
}

#[test]
fn missing_required_fields_are_refused() {
    let list = errors(&edit(minimal(), |v| {
        v.as_object_mut().unwrap().remove("version");
    }));
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].field, "(document)");
    assert!(list[0].reason.contains("missing field `version`"), "{list:?}");
    let list = errors(&edit(minimal(), |v| {
        v["models"][0]["routes"][0].as_object_mut().unwrap().remove("backend");
    }));
    assert!(list[0].reason.contains("missing field `backend`"), "{list:?}");
    assert_eq!(list[0].field, "models[0].routes[0]");
}

#[test]
fn broken_json_is_refused_with_its_position() {
    let err = load_config("{ \"version\": 1, ").unwrap_err();
    assert_eq!(err.0.len(), 1);
    assert!(err.0[0].reason.contains("EOF while parsing"), "{err}");
    assert!(err.0[0].reason.contains("line 1 column"), "{err}");
}

#[test]
fn broken_json_is_a_document_error() {
    let err = load_config("{ \"version\": 1, ").unwrap_err();
    assert_eq!(err.0[0].field, "(document)", "{err:?}");
}

#[cfg(not(feature = "yaml"))]
#[test]
fn yaml_needs_the_yaml_feature() {
    let err = load_config("version: 1\n").unwrap_err();
    assert_eq!(err.0.len(), 1);
    assert_eq!(err.0[0].field, "(document)");
    assert!(err.0[0].reason.contains("JSON form"), "{err}");
}

// ---------------------------------------------------------------------------------------------------------------
// Stage two: values, one rejection each

#[test]
fn wrong_version_is_refused() {
    refused(
        &edit(minimal(), |v| v["version"] = json!(2)),
        "version",
        "2",
        "unsupported schema version",
    );
    refused(
        &edit(minimal(), |v| v["version"] = json!(0)),
        "version",
        "0",
        "version 1",
    );
}

#[test]
fn route_to_an_undefined_backend_is_refused() {
    refused(
        &edit(two(), |v| v["models"][1]["routes"][0]["backend"] = json!("vllm-c")),
        "models[1].routes[0].backend",
        "vllm-c",
        "no backend with this name is defined",
    );
}

#[test]
fn an_undefined_backend_lists_the_defined_ones_and_the_closest() {
    let e = refused(
        &edit(two(), |v| v["models"][1]["routes"][0]["backend"] = json!("vllm-c")),
        "models[1].routes[0].backend",
        "vllm-c",
        "no backend with this name is defined",
    );
    assert_eq!(
        e.reason,
        "no backend with this name is defined (did you mean `vllm-b`?); the backends are `llama-a`, `vllm-b`"
    );
    let e = refused(
        &edit(two(), |v| v["models"][1]["routes"][0]["backend"] = json!("sglang")),
        "models[1].routes[0].backend",
        "sglang",
        "no backend",
    );
    assert_eq!(
        e.reason,
        "no backend with this name is defined; the backends are `llama-a`, `vllm-b`"
    );
}

#[test]
fn an_undefined_backend_lists_at_most_sixteen_defined_ones() {
    let many = edit(minimal(), |v| {
        v["backends"] = (0..20)
            .map(|i| json!({ "name": format!("b{i:02}"), "kind": "vllm", "endpoints": [format!("10.0.0.{i}:8000")] }))
            .collect();
        v["models"][0]["routes"][0]["backend"] = json!("nowhere");
    });
    let e = refused(&many, "models[0].routes[0].backend", "nowhere", "no backend");
    assert!(e.reason.ends_with("`b00`, `b01`, `b02`, `b03`, `b04`, `b05`, `b06`, `b07`, `b08`, `b09`, `b10`, `b11`, `b12`, `b13`, `b14`, `b15` and 4 more"), "{}", e.reason);
}

#[test]
fn a_misspelled_field_gets_the_closest_accepted_name() {
    for (doc, field, hint) in [
        (
            edit(minimal(), |v| v["lsiten"] = json!("127.0.0.1:1")),
            "lsiten",
            "`lsiten` (did you mean `listen`?)",
        ),
        (
            edit(minimal(), |v| v["backends"][0]["credentials_env"] = json!("T")),
            "backends[0].credentials_env",
            "`credentials_env` (did you mean `credential_env`?)",
        ),
        (
            edit(minimal(), |v| {
                v["models"][0]["routes"][0]["upstream_modle"] = json!("m")
            }),
            "models[0].routes[0].upstream_modle",
            "`upstream_modle` (did you mean `upstream_model`?)",
        ),
        (
            edit(minimal(), |v| v["limits"] = json!({ "max_body_byte": 2048 })),
            "limits.max_body_byte",
            "(did you mean `max_body_bytes`?)",
        ),
    ] {
        let list = errors(&doc);
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(list[0].field, field);
        assert!(list[0].reason.contains(hint), "{:?}", list[0]);
        assert!(
            list[0].reason.contains("expected one of"),
            "the whole list still follows: {:?}",
            list[0]
        );
    }
    let far = errors(&edit(minimal(), |v| v["backends"][0]["weight"] = json!(3)));
    assert!(
        !far[0].reason.contains("did you mean"),
        "no guess for a name unlike any: {:?}",
        far[0]
    );
}

#[test]
fn an_address_without_its_port_is_shown_with_one() {
    for (kind, port) in [
        ("llamacpp", 8080),
        ("vllm", 8000),
        ("sglang", 30000),
        ("ollama", 11434),
        ("openai", 443),
    ] {
        let e = refused(
            &edit(minimal(), |v| {
                v["backends"][0]["kind"] = json!(kind);
                v["backends"][0]["endpoints"] = json!(["gpu-0.internal"]);
            }),
            "backends[0].endpoints[0]",
            "gpu-0.internal",
            "malformed address",
        );
        assert_eq!(
            e.reason,
            format!(
                "malformed address: no port; write HOST:PORT, such as gpu-0.internal:{port} ({kind}'s default port)"
            )
        );
    }
    refused(
        &edit(minimal(), |v| v["global_limits"] = json!({ "address": "ratelimit" })),
        "global_limits.address",
        "ratelimit",
        "no port; write HOST:PORT, such as ratelimit:8081 (the rate-limit service's gRPC port)",
    );
}

#[test]
fn backend_references_are_case_sensitive() {
    refused(
        &edit(two(), |v| v["models"][0]["routes"][0]["backend"] = json!("LLAMA-A")),
        "models[0].routes[0].backend",
        "LLAMA-A",
        "no backend",
    );
}

#[test]
fn duplicate_backend_name_is_refused() {
    refused(
        &edit(spare(), |v| v["backends"][1]["name"] = json!("a")),
        "backends[1]",
        "a",
        "backends[0] already uses it",
    );
}

#[test]
fn backend_names_are_unique_ignoring_case() {
    refused(
        &edit(spare(), |v| v["backends"][1]["name"] = json!("A")),
        "backends[1]",
        "A",
        "duplicate name",
    );
}

#[test]
fn duplicate_alias_is_refused() {
    refused(
        &edit(two(), |v| v["models"][2]["name"] = json!("local-chat")),
        "models[2]",
        "local-chat",
        "models[0] already uses it",
    );
    refused(
        &edit(two(), |v| v["models"][3]["name"] = json!("BIG")),
        "models[3]",
        "BIG",
        "models[1] already uses it",
    );
}

#[test]
fn duplicate_route_to_one_backend_is_refused() {
    refused(
        &edit(two(), |v| v["models"][1]["routes"][1]["backend"] = json!("vllm-b")),
        "models[1].routes[1].backend",
        "vllm-b",
        "duplicate route",
    );
}

#[test]
fn balance_factor_below_100_is_refused() {
    let e = refused(
        &edit(spare(), |v| v["backends"][1]["balance_factor"] = json!(99)),
        "backends[1].balance_factor",
        "99",
        "must be >= 100",
    );
    assert_eq!(e.to_string(), format!("backends[1].balance_factor = 99: {}", e.reason));
    loads(&edit(spare(), |v| v["backends"][1]["balance_factor"] = json!(100)));
}

#[test]
fn balance_factor_with_a_non_chwbl_policy_is_refused() {
    refused(
        &edit(spare(), |v| {
            v["backends"][1]["lb"] = json!("least_request");
            v["backends"][1]["balance_factor"] = json!(150);
        }),
        "backends[1].balance_factor",
        "150",
        "only applies to lb: chwbl, not least_request",
    );
    refused(
        &edit(spare(), |v| {
            v["backends"][1]["lb"] = json!("round_robin");
            v["backends"][1]["balance_factor"] = json!(200);
        }),
        "backends[1].balance_factor",
        "200",
        "not round_robin",
    );
    loads(&edit(minimal(), |v| {
        v["backends"][0]["lb"] = json!("chwbl");
        v["backends"][0]["balance_factor"] = json!(200);
    }));
}

#[test]
fn empty_endpoints_are_refused() {
    refused(
        &edit(spare(), |v| v["backends"][1]["endpoints"] = json!([])),
        "backends[1].endpoints",
        "[]",
        "at least one endpoint",
    );
}

#[test]
fn malformed_addresses_are_refused_with_their_index() {
    for bad in [
        "127.0.0.1",
        "127.0.0.1:0",
        "127.0.0.1:70000",
        "::1:8080",
        "host name:80",
        "http://h:80",
        ":80",
    ] {
        refused(
            &edit(spare(), |v| v["backends"][1]["endpoints"] = json!(["10.0.0.1:80", bad])),
            "backends[1].endpoints[1]",
            bad,
            "malformed address",
        );
    }
}

#[test]
fn duplicate_endpoints_in_a_backend_are_refused() {
    refused(
        &edit(spare(), |v| {
            v["backends"][1]["endpoints"] = json!(["10.0.0.1:80", "10.0.0.2:80", "10.0.0.1:80"])
        }),
        "backends[1].endpoints[2]",
        "10.0.0.1:80",
        "duplicate endpoint",
    );
}

#[test]
fn bad_kind_is_refused_with_the_valid_list() {
    refused(
        &edit(spare(), |v| v["backends"][1]["kind"] = json!("tgi")),
        "backends[1].kind",
        "tgi",
        "expected one of llamacpp, vllm, sglang, ollama, openai",
    );
}

#[test]
fn bad_lb_is_refused_with_the_valid_list() {
    refused(
        &edit(spare(), |v| v["backends"][1]["lb"] = json!("random")),
        "backends[1].lb",
        "random",
        "expected one of chwbl, least_request, round_robin",
    );
}

#[test]
fn connect_timeout_out_of_range_is_refused() {
    for bad in [0u64, 600_001] {
        refused(
            &edit(spare(), |v| v["backends"][1]["connect_timeout_ms"] = json!(bad)),
            "backends[1].connect_timeout_ms",
            &bad.to_string(),
            "between 1 and 600000",
        );
    }
    loads(&edit(spare(), |v| {
        v["backends"][1]["connect_timeout_ms"] = json!(600_000)
    }));
}

#[test]
fn bad_backend_names_are_refused_quoted() {
    for bad in ["", "has space", "tab\there", "new\nline", "caf\u{e9}", &"n".repeat(256)] {
        refused(
            &edit(spare(), |v| v["backends"][1]["name"] = json!(bad)),
            "backends[1].name",
            &format!("{bad:?}"),
            "1 to 255 printable ASCII characters without spaces",
        );
    }
    loads(&edit(minimal(), |v| {
        v["backends"][0]["name"] = json!("A.b_c-9");
        v["models"][0]["routes"][0]["backend"] = json!("A.b_c-9");
    }));
}

#[test]
fn bad_model_names_are_refused_quoted() {
    for bad in ["", "has space", "tab\there", &"m".repeat(257)] {
        refused(
            &edit(minimal(), |v| v["models"][0]["name"] = json!(bad)),
            "models[0].name",
            &format!("{bad:?}"),
            "without spaces or control characters",
        );
    }
    refused(
        &edit(minimal(), |v| {
            v["models"][0]["routes"][0]["upstream_model"] = json!("a\u{1}b")
        }),
        "models[0].routes[0].upstream_model",
        "\"a\\u{1}b\"",
        "without spaces",
    );
    loads(&edit(minimal(), |v| {
        v["models"][0]["name"] = json!("Qwen/Qwen3-32B:q4_K_M")
    }));
}

#[test]
fn alias_without_routes_is_refused() {
    refused(
        &edit(minimal(), |v| v["models"][0]["routes"] = json!([])),
        "models[0].routes",
        "[]",
        "at least one route",
    );
}

#[test]
fn empty_model_list_is_refused() {
    refused(
        &edit(minimal(), |v| v["models"] = json!([])),
        "models",
        "[]",
        "at least one model alias",
    );
}

#[test]
fn empty_backends_reports_both_the_list_and_the_dangling_route() {
    let list = errors(&edit(minimal(), |v| v["backends"] = json!([])));
    let fields: Vec<&str> = list.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["backends", "models[0].routes[0].backend"], "{list:#?}");
    assert_eq!(list[0].value, "[]");
    assert!(list[0].reason.contains("at least one backend"));
}

#[test]
fn slots_above_the_cap_are_refused() {
    let with = |n: u32| {
        edit(minimal(), |v| {
            v["backends"][0]["slots"] = json!([n]);
            v["affinity"] = json!({ "placement": "bounded_keys" });
        })
    };
    refused(&with(257), "backends[0].slots[0]", "257", "must be between 1 and 256");
    refused(
        &with(u32::MAX),
        "backends[0].slots[0]",
        &u32::MAX.to_string(),
        "between 1 and 256",
    );
    assert_eq!(loads(&with(256)).backends[0].slots, Some(vec![256]));
}

#[test]
fn load_is_read_with_its_defaults_and_checked() {
    let with = |l: Value| edit(minimal(), |v| v["backends"][0]["load"] = l);
    let b = &loads(&with(json!({}))).backends[0];
    assert_eq!(
        b.load,
        Some(llmroute_core::config::Load {
            poll_ms: 1000,
            spill_queue: None
        })
    );
    assert_eq!(loads(&minimal()).backends[0].load, None);
    let b = &loads(&with(json!({ "poll_ms": 50, "spill_queue": 0 }))).backends[0];
    assert_eq!(b.load.map(|l| (l.poll_ms, l.spill_queue)), Some((50, Some(0))));
    refused(
        &with(json!({ "poll_ms": 49 })),
        "backends[0].load.poll_ms",
        "49",
        "must be between 50 and 60000",
    );
    refused(
        &with(json!({ "poll_ms": 60001 })),
        "backends[0].load.poll_ms",
        "60001",
        "must be between 50 and 60000",
    );
    refused(
        &with(json!({ "spill_queue": 100001 })),
        "backends[0].load.spill_queue",
        "100001",
        "between 0 and 100000",
    );
    let unknown = errors(&with(json!({ "poll": 5 })));
    assert!(unknown[0].reason.contains("unknown field"), "{unknown:?}");
}

#[test]
fn load_on_an_engine_that_reports_none_is_refused() {
    for kind in ["ollama", "openai"] {
        let v = edit(minimal(), |v| {
            v["backends"][0]["kind"] = json!(kind);
            v["backends"][0]["load"] = json!({});
            if kind == "openai" {
                v["backends"][0]["endpoints"] = json!(["127.0.0.1:8443"]);
            }
        });
        let list = errors(&v);
        let e = list
            .iter()
            .find(|e| e.field == "backends[0].load")
            .unwrap_or_else(|| panic!("{list:?}"));
        assert_eq!(e.value, kind);
        assert!(e.reason.contains("reports no load"), "{e:?}");
    }
    for kind in ["llamacpp", "vllm", "sglang"] {
        loads(&edit(minimal(), |v| {
            v["backends"][0]["kind"] = json!(kind);
            v["backends"][0]["load"] = json!({});
        }));
    }
}

#[test]
fn a_spill_queue_nothing_places_on_is_a_warning() {
    let v = edit(minimal(), |v| v["backends"][0]["load"] = json!({ "spill_queue": 3 }));
    let warnings = loads(&v).config.warnings;
    assert!(
        warnings
            .iter()
            .any(|w| w.field == "backends[0].load.spill_queue" && w.reason.contains("bounded_keys")),
        "{warnings:?}"
    );
    let placed = edit(v, |v| v["affinity"] = json!({ "placement": "bounded_keys" }));
    let warnings = loads(&placed).config.warnings;
    assert!(
        warnings.iter().all(|w| !w.field.contains("spill_queue")),
        "{warnings:?}"
    );
}

#[test]
fn zero_request_timeout_is_refused() {
    refused(
        &edit(minimal(), |v| v["limits"] = json!({ "request_timeout_ms": 0 })),
        "limits.request_timeout_ms",
        "0",
        "must be between 1 and 86400000",
    );
}

#[test]
fn per_try_timeout_cannot_outlast_the_request() {
    refused(
        &edit(minimal(), |v| {
            v["limits"] = json!({ "request_timeout_ms": 1000 });
            v["retries"] = json!({ "attempts": 2, "per_try_timeout_ms": 1001 });
        }),
        "retries.per_try_timeout_ms",
        "1001",
        "must be at most limits.request_timeout_ms (1000)",
    );
    // Against the default request timeout (10 minutes), too.
    refused(
        &edit(minimal(), |v| v["retries"] = json!({ "per_try_timeout_ms": u64::MAX })),
        "retries.per_try_timeout_ms",
        &u64::MAX.to_string(),
        "(600000)",
    );
    let cfg = loads(&edit(minimal(), |v| {
        v["limits"] = json!({ "request_timeout_ms": 1000 });
        v["retries"] = json!({ "attempts": 2, "per_try_timeout_ms": 1000 });
    }));
    assert_eq!(cfg.render_only.retries.per_try_timeout_ms, 1000);
}

#[test]
fn credential_headers_cannot_carry_the_session() {
    for (i, h) in ["authorization", "Cookie", "x-api-key", "Proxy-Authorization", "api-key"]
        .into_iter()
        .enumerate()
    {
        let e = refused(
            &edit(minimal(), |v| {
                v["affinity"] = json!({ "session_headers": [format!("x-session-{i}"), h] })
            }),
            "affinity.session_headers[1]",
            h,
            "carries a credential",
        );
        assert!(e.reason.contains("echoed back"), "{e:?}");
    }
}

#[test]
fn reserved_session_header_is_refused() {
    refused(
        &edit(minimal(), |v| {
            v["affinity"] = json!({ "session_headers": ["x-session-id", "x-llmroute-session"] })
        }),
        "affinity.session_headers[1]",
        "x-llmroute-session",
        "gateway's own",
    );
    refused(
        &edit(minimal(), |v| {
            v["affinity"] = json!({ "session_headers": ["X-LLMRoute-Affinity"] })
        }),
        "affinity.session_headers[0]",
        "X-LLMRoute-Affinity",
        "gateway's own",
    );
}

#[test]
fn invalid_session_header_names_are_refused() {
    for bad in ["", "has space", ":authority", "x-sess\u{e9}", "a\nb", &"h".repeat(129)] {
        refused(
            &edit(minimal(), |v| v["affinity"] = json!({ "session_headers": [bad] })),
            "affinity.session_headers[0]",
            bad,
            "not a valid HTTP header name",
        );
    }
    loads(&edit(minimal(), |v| {
        v["affinity"] = json!({ "session_headers": ["x-a!#$%&'*+-.^_`|~0"] })
    }));
}

#[test]
fn duplicate_session_headers_are_refused_ignoring_case() {
    refused(
        &edit(minimal(), |v| {
            v["affinity"] = json!({ "session_headers": ["x-session-id", "X-Session-Id"] })
        }),
        "affinity.session_headers[1]",
        "X-Session-Id",
        "duplicate name",
    );
}

#[test]
fn empty_session_header_list_is_allowed() {
    let cfg = loads(&edit(minimal(), |v| v["affinity"] = json!({ "session_headers": [] })));
    assert!(cfg.affinity.session_headers.is_empty());
}

#[test]
fn user_prefix_bytes_too_large_is_refused() {
    refused(
        &edit(minimal(), |v| v["affinity"] = json!({ "user_prefix_bytes": 65_537 })),
        "affinity.user_prefix_bytes",
        "65537",
        "at most 65536",
    );
    loads(&edit(minimal(), |v| {
        v["affinity"] = json!({ "user_prefix_bytes": 65_536 })
    }));
}

#[test]
fn max_body_bytes_out_of_range_is_refused() {
    for bad in [0usize, 1023, (64 << 20) + 1] {
        refused(
            &edit(minimal(), |v| v["limits"] = json!({ "max_body_bytes": bad })),
            "limits.max_body_bytes",
            &bad.to_string(),
            "between 1024 and 67108864",
        );
    }
    for good in [1024usize, 64 << 20] {
        loads(&edit(minimal(), |v| v["limits"] = json!({ "max_body_bytes": good })));
    }
}

#[test]
fn request_timeout_over_a_day_is_refused() {
    refused(
        &edit(minimal(), |v| {
            v["limits"] = json!({ "request_timeout_ms": 86_400_001u64 })
        }),
        "limits.request_timeout_ms",
        "86400001",
        "one day",
    );
    loads(&edit(minimal(), |v| {
        v["limits"] = json!({ "request_timeout_ms": 86_400_000u64 })
    }));
}

#[test]
fn listen_equal_to_admin_is_refused() {
    refused(
        &edit(minimal(), |v| {
            v["listen"] = json!("127.0.0.1:9901");
        }),
        "admin",
        "127.0.0.1:9901",
        "`listen`",
    );
}

#[test]
fn admin_on_the_listen_port_of_a_wildcard_address_is_refused() {
    // 0.0.0.0:9901 and 127.0.0.1:9901 cannot both be bound.
    refused(
        &edit(minimal(), |v| v["listen"] = json!("0.0.0.0:9901")),
        "admin",
        "127.0.0.1:9901",
        "`listen`",
    );
    refused(
        &edit(minimal(), |v| v["admin"] = json!("0.0.0.0:10000")),
        "admin",
        "0.0.0.0:10000",
        "`listen`",
    );
}

#[test]
fn listen_and_admin_may_share_a_port_on_different_addresses() {
    let cfg = loads(&edit(minimal(), |v| {
        v["listen"] = json!("127.0.0.1:9000");
        v["admin"] = json!("127.0.0.2:9000");
    }));
    assert_eq!(cfg.render_only.listen.port(), cfg.admin.port());
}

#[test]
fn listen_and_admin_must_be_ip_and_port() {
    refused(
        &edit(minimal(), |v| v["listen"] = json!("localhost:10000")),
        "listen",
        "localhost:10000",
        "expected IP:PORT",
    );
    refused(
        &edit(minimal(), |v| v["admin"] = json!("127.0.0.1:0")),
        "admin",
        "127.0.0.1:0",
        "port must be",
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Many errors, and how they read

#[test]
fn every_problem_is_reported_at_once_in_document_order() {
    let v = json!({
        "version": 3,
        "listen": "127.0.0.1:9901",
        "backends": [
            { "name": "a", "kind": "tgi", "endpoints": ["127.0.0.1"], "balance_factor": 50 },
            { "name": "a", "kind": "vllm", "endpoints": [] }
        ],
        "models": [
            { "name": "m", "routes": [ { "backend": "zzz" } ] },
            { "name": "m", "routes": [] }
        ],
        "affinity": { "session_headers": ["x-llmroute-s"], "user_prefix_bytes": 100000 },
        "limits": { "max_body_bytes": 10 }
    });
    let list = errors(&v);
    let fields: Vec<&str> = list.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "version",
            "admin",
            "backends[0].kind",
            "backends[0].balance_factor",
            "backends[0].endpoints[0]",
            "backends[1].endpoints",
            "backends[1]",
            "models[0].routes[0].backend",
            "models[1].routes",
            "models[1]",
            "affinity.session_headers[0]",
            "affinity.user_prefix_bytes",
            "limits.max_body_bytes",
        ],
        "{list:#?}"
    );
    assert_eq!(list.len(), 13);
}

#[test]
fn error_display_is_field_value_reason() {
    let e = ConfigError {
        field: "backends[1].lb".into(),
        value: "random".into(),
        reason: "bad".into(),
    };
    assert_eq!(e.to_string(), "backends[1].lb = random: bad");
    let e = ConfigError {
        field: "version".into(),
        value: String::new(),
        reason: "missing".into(),
    };
    assert_eq!(e.to_string(), "version: missing");
}

#[test]
fn error_list_display_has_one_line_per_error() {
    let list = load_config(
        &edit(spare(), |v| {
            v["version"] = json!(9);
            v["backends"][1]["lb"] = json!("random");
        })
        .to_string(),
    )
    .unwrap_err();
    let text = list.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("version = 9: "), "{text}");
    assert!(
        lines[1].starts_with("backends[1].lb = random: unknown load-balancing policy"),
        "{text}"
    );
    assert!(!text.ends_with('\n'));
}

#[test]
fn shape_error_display_has_no_value() {
    let list = errors(&edit(minimal(), |v| v["bogus"] = json!(1)));
    let line = list[0].to_string();
    assert!(!line.contains(" = "), "{line}");
    assert!(line.contains("unknown field `bogus`"), "{line}");
}

#[test]
fn invalid_backend_does_not_make_its_routes_dangling() {
    // Only the backend's own problem is reported: its routes still name a backend that is defined.
    refused(
        &edit(minimal(), |v| v["backends"][0]["kind"] = json!("tgi")),
        "backends[0].kind",
        "tgi",
        "unknown engine",
    );
    refused(
        &edit(minimal(), |v| v["backends"][0]["endpoints"] = json!(["nope"])),
        "backends[0].endpoints[0]",
        "nope",
        "malformed address",
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Per-alias endpoints, prefix routing, dialect ids, token estimate

#[test]
fn alias_endpoints_are_read() {
    let cfg = loads(&edit(minimal(), |v| {
        v["models"][0]["endpoints"] = json!(["chat", "messages"])
    }));
    let set = cfg.alias("m").unwrap().endpoints;
    for api in Api::ALL {
        assert_eq!(
            set.contains(api),
            matches!(api, Api::Chat | Api::Messages),
            "{}",
            api.name()
        );
    }
    let all = loads(&edit(minimal(), |v| {
        v["models"][0]["endpoints"] = json!(["chat", "completions", "responses", "embeddings", "messages", "chat"])
    }));
    assert_eq!(all.alias("m").unwrap().endpoints, ApiSet::DEFAULT);
    let decisions = loads(&edit(minimal(), |v| {
        v["models"][0]["endpoints"] = json!(["decisions", "systemone"])
    }));
    let set = decisions.alias("m").unwrap().endpoints;
    for api in Api::ALL {
        assert_eq!(set.contains(api), api.is_decision(), "{}", api.name());
    }
}

#[test]
fn unknown_endpoint_names_are_refused_with_the_valid_list() {
    refused(
        &edit(minimal(), |v| {
            v["models"][0]["endpoints"] = json!(["chat", "chat_completions"])
        }),
        "models[0].endpoints[1]",
        "chat_completions",
        "unknown endpoint; expected one of chat, completions, responses, embeddings, messages",
    );
    refused(
        &edit(minimal(), |v| v["models"][0]["endpoints"] = json!(["Chat"])),
        "models[0].endpoints[0]",
        "Chat",
        "unknown endpoint",
    );
}

#[test]
fn an_empty_endpoint_list_is_refused() {
    refused(
        &edit(minimal(), |v| v["models"][0]["endpoints"] = json!([])),
        "models[0].endpoints",
        "[]",
        "an alias must serve at least one endpoint",
    );
}

#[test]
fn endpoints_of_the_wrong_type_name_the_field() {
    let list = errors(&edit(minimal(), |v| v["models"][0]["endpoints"] = json!("chat")));
    assert_eq!(list[0].field, "models[0].endpoints");
    let list = errors(&edit(minimal(), |v| {
        v["models"][0]["model_prefix_routing"] = json!("yes")
    }));
    assert_eq!(list[0].field, "models[0].model_prefix_routing");
}

#[test]
fn model_prefix_routing_is_read() {
    let cfg = loads(&edit(minimal(), |v| {
        v["models"][0]["model_prefix_routing"] = json!(true)
    }));
    assert!(cfg.alias("m").unwrap().model_prefix_routing);
}

#[test]
fn resolve_finds_exact_aliases_and_prefixed_names() {
    let cfg = loads(&edit(minimal(), |v| {
        v["models"][0]["model_prefix_routing"] = json!(true);
        v["models"]
            .as_array_mut()
            .unwrap()
            .push(json!({ "name": "plain", "routes": [ { "backend": "a" } ] }));
    }));
    let got = |model: &str| {
        cfg.resolve(model)
            .map(|(a, rest)| (a.name.clone(), rest.map(str::to_string)))
    };
    assert_eq!(got("m"), Some(("m".into(), None)));
    assert_eq!(got("m/x"), Some(("m".into(), Some("x".into()))));
    assert_eq!(got("m/a/b"), Some(("m".into(), Some("a/b".into()))));
    assert_eq!(got("m/"), None);
    assert_eq!(got("plain"), Some(("plain".into(), None)));
    assert_eq!(got("plain/x"), None, "plain has no model_prefix_routing");
    assert_eq!(got("other/x"), None);
    assert_eq!(got("M/x"), None);
    assert_eq!(got(""), None);
    assert_eq!(got("/"), None);
}

#[test]
fn dialect_ids_are_read() {
    let cfg = loads(&edit(minimal(), |v| {
        v["affinity"] = json!({ "conversation_id": true, "anthropic_user_id": true })
    }));
    assert!(cfg.affinity.conversation_id);
    assert!(cfg.affinity.anthropic_user_id);
    // The session header defaults still apply when only these are set.
    assert_eq!(cfg.affinity.session_headers, DEFAULT_SESSION_HEADERS);
    let list = errors(&edit(minimal(), |v| {
        v["affinity"] = json!({ "conversation_id": "yes" })
    }));
    assert_eq!(list[0].field, "affinity.conversation_id");
}

#[test]
fn image_tokens_are_read_and_bounded() {
    for good in [0u32, 1, 768, 100_000] {
        let cfg = loads(&edit(minimal(), |v| v["tokens"] = json!({ "image_tokens": good })));
        assert_eq!(cfg.image_tokens, good);
    }
    refused(
        &edit(minimal(), |v| v["tokens"] = json!({ "image_tokens": 100_001 })),
        "tokens.image_tokens",
        "100001",
        "at most 100000",
    );
    let list = errors(&edit(minimal(), |v| v["tokens"] = json!({ "per_image": 1 })));
    assert_eq!(list[0].field, "tokens.per_image");
    assert!(
        list[0].reason.contains("unknown field `per_image`"),
        "{}",
        list[0].reason
    );
}

#[test]
fn the_session_echo_header_may_be_a_session_header() {
    // `x-multi-turn-session-id` is echoed back and read again: that is how a client pins later turns.
    let cfg = loads(&edit(minimal(), |v| {
        v["affinity"] = json!({ "session_headers": ["X-Multi-Turn-Session-Id"] })
    }));
    assert_eq!(cfg.affinity.session_headers, ["x-multi-turn-session-id"]);
}

/// A backend with `credential_env`, the given endpoints and, optionally, `tls`.
fn credential_doc(endpoints: &[&str], tls: Option<Value>) -> Value {
    let mut backend = json!({ "name": "k", "kind": "vllm", "endpoints": endpoints, "credential_env": "TOKEN" });
    if let Some(t) = tls {
        backend["tls"] = t;
    }
    json!({ "version": 1, "backends": [backend], "models": [{ "name": "m", "routes": [{ "backend": "k" }] }] })
}

#[test]
fn a_credential_without_tls_is_refused_unless_every_endpoint_is_loopback() {
    let errs = load(&credential_doc(&["127.0.0.1:8000", "vllm.internal:8000"], None)).unwrap_err();
    let text = errs.to_string();
    assert_eq!(errs.0.len(), 1, "{text}");
    assert_eq!(errs.0[0].field, "backends[0].credential_env");
    assert_eq!(errs.0[0].value, "TOKEN");
    assert!(
        text.contains("vllm.internal:8000") && text.contains("unencrypted") && text.contains("add `tls:"),
        "{text}"
    );
    for loopback in [
        &["127.0.0.1:8000"][..],
        &["127.0.0.9:8000", "[::1]:8000"],
        &["localhost:8000"],
    ] {
        let doc = credential_doc(loopback, None);
        assert!(load(&doc).is_ok(), "{loopback:?}: {:?}", load(&doc).err());
    }
    let with_tls = credential_doc(&["10.0.0.5:8000"], Some(json!({ "ca_file": "/etc/ca.pem" })));
    assert!(load(&with_tls).is_ok(), "{:?}", load(&with_tls).err());
}

/// A discovered backend (`discovery` as given) with `credential_env` and, optionally, `tls`.
fn discovered_credential_doc(discovery: Value, tls: Option<Value>) -> Value {
    let mut doc = credential_doc(&[], tls);
    let backend = doc["backends"][0].as_object_mut().unwrap();
    backend.remove("endpoints");
    backend.insert("discovery".into(), discovery);
    doc
}

/// The fields of every error, in order.
fn error_fields(doc: &Value) -> Vec<String> {
    load(doc).unwrap_err().0.iter().map(|e| e.field.clone()).collect()
}

#[test]
fn a_discovered_backend_needs_tls_for_its_credential_whatever_its_discovery() {
    let etcd =
        json!({ "eds_path": "/var/lib/llmroute/k.json", "etcd": { "endpoints": ["10.0.0.1:2379"], "prefix": "/p" } });
    for discovery in [json!({}), json!({ "eds_path": "/etc/eds.json" }), etcd] {
        let doc = discovered_credential_doc(discovery.clone(), None);
        let errs = load(&doc).unwrap_err();
        let text = errs.to_string();
        assert_eq!(errs.0.len(), 1, "{discovery}: {text}");
        assert_eq!(errs.0[0].field, "backends[0].credential_env", "{text}");
        assert_eq!(errs.0[0].value, "TOKEN");
        assert!(
            text.contains("discovered") && text.contains("unencrypted") && text.contains("mesh_tls: true"),
            "{text}"
        );
        let tls = json!({ "ca_file": "/etc/ca.pem", "sni": "vllm.internal" });
        let with_tls = discovered_credential_doc(discovery.clone(), Some(tls));
        assert!(load(&with_tls).is_ok(), "{discovery}: {:?}", load(&with_tls).err());
    }
}

#[test]
fn a_discovered_backends_tls_needs_sni() {
    let doc = discovered_credential_doc(
        json!({ "eds_path": "/etc/eds.json" }),
        Some(json!({ "ca_file": "/ca.pem" })),
    );
    let errs = load(&doc).unwrap_err();
    assert_eq!(error_fields(&doc), ["backends[0].tls.sni"], "{errs}");
    assert!(errs.to_string().contains("set `sni`"), "{errs}");
}

#[test]
fn mesh_tls_accepts_a_credential_only_on_a_cluster_defined_elsewhere() {
    let cfg = loads(&discovered_credential_doc(json!({ "mesh_tls": true }), None));
    assert!(cfg.backends[0].discovery.as_ref().unwrap().mesh_tls);
    let off = discovered_credential_doc(json!({ "mesh_tls": false }), None);
    assert_eq!(error_fields(&off), ["backends[0].credential_env"]);
    let rendered_here = discovered_credential_doc(json!({ "eds_path": "/etc/eds.json", "mesh_tls": true }), None);
    let errs = load(&rendered_here).unwrap_err();
    assert_eq!(
        error_fields(&rendered_here),
        ["backends[0].discovery.mesh_tls", "backends[0].credential_env"],
        "{errs}"
    );
    assert!(errs.to_string().contains("use `tls` instead"), "{errs}");
    let tls = json!({ "ca_file": "/etc/ca.pem", "sni": "vllm.internal" });
    let both = discovered_credential_doc(json!({ "mesh_tls": true }), Some(tls));
    assert_eq!(error_fields(&both), ["backends[0].discovery.mesh_tls"]);
}

#[test]
fn a_client_certificate_needs_both_files_and_each_a_path() {
    let tls = |extra: Value| {
        let mut t = json!({ "ca_file": "/etc/ca.pem" });
        t.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        credential_doc(&["10.0.0.5:8000"], Some(t))
    };
    let cfg = loads(&tls(
        json!({ "cert_file": "/etc/client.pem", "key_file": "/etc/client.key" }),
    ));
    let client = cfg.backends[0].tls.as_ref().unwrap().client_cert.clone().unwrap();
    assert_eq!(
        (client.cert_file.as_str(), client.key_file.as_str()),
        ("/etc/client.pem", "/etc/client.key")
    );
    assert_eq!(
        loads(&tls(json!({}))).backends[0].tls.as_ref().unwrap().client_cert,
        None
    );
    let cases = [
        (
            json!({ "cert_file": "/etc/client.pem" }),
            "backends[0].tls.cert_file",
            "/etc/client.pem",
            "add `key_file: PATH`",
        ),
        (
            json!({ "key_file": "/etc/client.key" }),
            "backends[0].tls.key_file",
            "/etc/client.key",
            "add `cert_file: PATH`",
        ),
        (
            json!({ "cert_file": "", "key_file": "/k" }),
            "backends[0].tls.cert_file",
            "\"\"",
            "a PEM file path is needed",
        ),
        (
            json!({ "cert_file": "/c", "key_file": "" }),
            "backends[0].tls.key_file",
            "\"\"",
            "a PEM file path is needed",
        ),
    ];
    for (extra, field, value, fix) in cases {
        let errs = load(&tls(extra.clone())).unwrap_err();
        assert_eq!(errs.0.len(), 1, "{extra}: {errs}");
        let e = &errs.0[0];
        assert_eq!((e.field.as_str(), e.value.as_str()), (field, value), "{extra}");
        assert!(e.reason.contains(fix), "{extra}: {}", e.reason);
    }
}

#[test]
fn global_limits_are_off_by_default_and_filled_with_defaults_when_set() {
    assert_eq!(loads(&minimal()).global_limits, None);
    let cfg = loads(&edit(minimal(), |v| {
        v["global_limits"] = json!({ "address": "rls.internal:8081" })
    }));
    let g = cfg.config.global_limits.unwrap();
    assert_eq!(g.address, parse_endpoint("rls.internal:8081").unwrap());
    assert_eq!((g.domain.as_str(), g.timeout_ms), ("llmroute", 100));
    assert!(g.failure_mode_allow);
    assert_eq!(g.default_max_tokens, 1024);
    let deny =
        loads(&edit(
            minimal(),
            |v| {
                v["global_limits"] = json!({ "address": "127.0.0.1:8081", "failure_mode": "deny", "domain": "a.b-c_d" })
            },
        ));
    assert!(!deny.config.global_limits.unwrap().failure_mode_allow);
}

#[test]
fn global_limits_refusals_name_field_value_and_reason() {
    let v = edit(
        minimal(),
        |v| {
            v["global_limits"] =
                json!({ "address": "127.0.0.1:0", "domain": "", "timeout_ms": 10001, "failure_mode": "Allow" })
        },
    );
    let fields: Vec<String> = errors(&v).into_iter().map(|e| e.field).collect();
    assert_eq!(
        fields,
        [
            "global_limits.address",
            "global_limits.domain",
            "global_limits.timeout_ms",
            "global_limits.failure_mode"
        ]
    );
    let unknown = edit(minimal(), |v| {
        v["global_limits"] = json!({ "address": "127.0.0.1:8081", "cluster": "x" })
    });
    assert!(errors(&unknown)[0].reason.contains("unknown field `cluster`"));
}

// ---------------------------------------------------------------------------------------------------------------
// Environment variables the config names

/// [`spare`] with `credential_env` on `b` (behind TLS) and `a`, and `auth`.
fn with_env_vars() -> Value {
    edit(spare(), |v| {
        v["backends"][1]["credential_env"] = json!("B_TOKEN");
        v["backends"][1]["tls"] = json!({ "ca_file": "/etc/ca.pem" });
        v["backends"][0]["credential_env"] = json!("A_TOKEN");
        v["auth"] = json!({ "keys_env": "GATEWAY_KEYS" });
    })
}

#[test]
fn env_vars_lists_each_variable_with_the_field_that_names_it() {
    let cfg = loads(&with_env_vars());
    let vars: Vec<(String, &str, EnvHolds)> = cfg.env_vars().into_iter().map(|v| (v.field, v.name, v.holds)).collect();
    assert_eq!(
        vars,
        [
            (
                "backends[0].credential_env".to_string(),
                "A_TOKEN",
                EnvHolds::BearerToken
            ),
            (
                "backends[1].credential_env".to_string(),
                "B_TOKEN",
                EnvHolds::BearerToken
            ),
            ("auth.keys_env".to_string(), "GATEWAY_KEYS", EnvHolds::ApiKeys),
        ]
    );
    assert!(loads(&minimal()).env_vars().is_empty());
}

#[test]
fn env_problems_name_what_an_environment_lacks_and_never_a_value() {
    let cfg = loads(&with_env_vars());
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    };
    let all = env(&[
        ("A_TOKEN", "t"),
        ("B_TOKEN", "t"),
        ("GATEWAY_KEYS", "ops:0123456789abcdef"),
    ]);
    assert_eq!(env_problems(&cfg, all), []);

    let missing = env_problems(&cfg, env(&[("A_TOKEN", "t")]));
    let named: Vec<(&str, &str)> = missing.iter().map(|e| (e.field.as_str(), e.value.as_str())).collect();
    assert_eq!(
        named,
        [
            ("backends[1].credential_env", "B_TOKEN"),
            ("auth.keys_env", "GATEWAY_KEYS")
        ]
    );
    assert!(missing.iter().all(|e| e.reason.contains("not set")), "{missing:?}");
    assert!(
        missing[0].reason.contains("Environment variable doesn't exist"),
        "{missing:?}"
    );

    let empty = env_problems(
        &cfg,
        env(&[
            ("A_TOKEN", ""),
            ("B_TOKEN", "t"),
            ("GATEWAY_KEYS", "ops:0123456789abcdef"),
        ]),
    );
    assert_eq!(empty.len(), 1, "{empty:?}");
    assert_eq!(empty[0].field, "backends[0].credential_env");
    assert!(empty[0].reason.contains("401"), "{empty:?}");

    let refused = env_problems(
        &cfg,
        env(&[
            ("A_TOKEN", "t"),
            ("B_TOKEN", "t"),
            ("GATEWAY_KEYS", "ops:tooshort-secret"),
        ]),
    );
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(
        (refused[0].field.as_str(), refused[0].value.as_str()),
        ("auth.keys_env", "GATEWAY_KEYS")
    );
    assert!(refused[0].reason.contains("key `ops`"), "{refused:?}");
    assert!(!refused[0].to_string().contains("tooshort-secret"), "{refused:?}");
}

#[test]
fn keys_may_have_budgets_of_their_own() {
    let with = |key_limits: Value| {
        edit(minimal(), |v| {
            v["auth"] = json!({ "keys_env": "K", "limits": { "requests": "5-M" }, "key_limits": key_limits });
        })
    };
    let cfg = loads(&with(
        json!({ "team-a": { "tokens": "9000-M", "inject_max_tokens": true } }),
    ));
    let auth = cfg.auth.as_ref().unwrap();
    let own = auth.limits_for("team-a").unwrap();
    assert_eq!(
        (own.requests.len(), own.tokens.len(), own.inject_max_tokens),
        (0, 1, true)
    );
    assert_eq!(
        auth.limits_for("team-b").unwrap().requests.len(),
        1,
        "the shared budget"
    );
    // Without `limits`, only the keys named have a budget.
    let only = edit(with(json!({ "team-a": { "requests": "1-S" } })), |v| {
        v["auth"].as_object_mut().unwrap().remove("limits");
    });
    let cfg = loads(&only);
    assert!(cfg.auth.as_ref().unwrap().limits_for("team-b").is_none());

    refused(
        &with(json!({ "team a": { "requests": "1-S" } })),
        "auth.key_limits.team a",
        "team a",
        "a key name is 1 to 64 characters",
    );
    refused(
        &with(json!({ "team-a": { "requests": "1-X" } })),
        "auth.key_limits.team-a.requests",
        "1-X",
        "the unit must be S, M, H or D",
    );
    // A JSON object that names a key twice is refused, not read as its last copy.
    let twice = r#"{"version":1,"backends":[{"name":"a","kind":"llamacpp","endpoints":["127.0.0.1:8081"]}],
        "models":[{"name":"m","routes":[{"backend":"a"}]}],
        "auth":{"keys_env":"K","key_limits":{"team-a":{"requests":"1-S"},"team-a":{"requests":"9-S"}}}}"#;
    let ConfigErrors(list) = load_config(twice).unwrap_err();
    assert_eq!(list.len(), 1, "{list:#?}");
    assert_eq!(list[0].field, "auth.key_limits.team-a");
    assert!(list[0].reason.contains("named twice"), "{:?}", list[0]);
    let unknown = with(json!({ "team-a": { "requests": "1-S", "burst": 3 } }));
    let e = errors(&unknown);
    assert!(
        e[0].field.contains("key_limits") && e[0].reason.contains("burst"),
        "{e:#?}"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// The fields only the renderer reads

/// A document with every field only `llmroute render` reads.
fn with_renderer_fields() -> Value {
    edit(minimal(), |v| {
        v["listen"] = json!("127.0.0.1:10001");
        v["compress_responses"] = json!(true);
        v["listen_tls"] = json!({ "cert_file": "/c.pem", "key_file": "/k.pem" });
        v["retries"] = json!({ "attempts": 1 });
        v["access_log"] = json!({ "path": "/var/log/access.json" });
    })
}

#[test]
fn the_document_reads_the_renderers_fields_and_the_filter_refuses_each_one_saying_what_to_give_it() {
    let v = with_renderer_fields();
    let doc = loads(&v);
    assert_eq!(doc.render_only.listen.port(), 10001);
    assert!(doc.render_only.compress_responses);
    assert_eq!(doc.render_only.retries.attempts, 1);
    assert_eq!(doc.render_only.access_log_path.as_deref(), Some("/var/log/access.json"));
    assert!(doc.render_only.listen_tls.is_some());
    let ConfigErrors(list) = load_config(&v.to_string()).unwrap_err();
    let fields: Vec<&str> = list.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, RENDER_ONLY_FIELDS);
    for e in &list {
        assert!(
            e.reason.contains("only `llmroute render` reads this field")
                && e.reason.contains("`llmroute render --target filter`"),
            "{e}"
        );
    }
}

#[test]
fn the_document_without_the_renderers_fields_is_what_the_filter_takes() {
    let mut v = with_renderer_fields();
    strip_render_only(&mut v);
    let cfg = load_config(&v.to_string()).unwrap();
    assert_eq!(&cfg, &loads(&with_renderer_fields()).config);
}

#[test]
fn a_renderers_field_is_checked_by_the_document_alone_and_its_typos_by_both() {
    // A misspelled name is refused by both, with the name it resembles.
    let typo = edit(minimal(), |v| v["compres_responses"] = json!(true));
    for list in [errors(&typo), load_config(&typo.to_string()).unwrap_err().0] {
        assert_eq!(list[0].field, "compres_responses");
        assert!(list[0].reason.contains("did you mean `compress_responses`"), "{list:?}");
    }
    // Inside one, the document names the field's path; the filter never reads that far.
    let inner = edit(minimal(), |v| {
        v["listen_tls"] = json!({ "cert_fiel": "/c.pem", "key_file": "/k.pem" })
    });
    let list = errors(&inner);
    assert_eq!(list[0].field, "listen_tls.cert_fiel");
    assert!(list[0].reason.contains("line 1 column"), "{list:?}");
    assert_eq!(load_config(&inner.to_string()).unwrap_err().0[0].field, "listen_tls");
    // A value out of range is the document's error, as any other.
    refused(
        &edit(minimal(), |v| v["retries"] = json!({ "attempts": 11 })),
        "retries.attempts",
        "11",
        "at most 10",
    );
}
