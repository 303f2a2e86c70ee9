//! Backends whose hosts `llmroute discover` reads from etcd: `discovery: { eds_path, etcd: { endpoints, prefix } }`,
//! its normalisation and its refusals.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::config::EtcdSource;
use llmroute_core::{load_config, ConfigError, ConfigErrors};
use serde_json::{json, Value};

fn doc(discovery: Value) -> Value {
    json!({
        "version": 1,
        "backends": [{"name": "llama-a", "kind": "llamacpp", "discovery": discovery}],
        "models": [{"name": "m", "routes": [{"backend": "llama-a"}]}],
    })
}

fn errors(v: &Value) -> Vec<ConfigError> {
    match load_config(&v.to_string()) {
        Ok(_) => panic!("should be refused: {v:#}"),
        Err(ConfigErrors(list)) => list,
    }
}

#[test]
fn an_etcd_source_is_normalised() {
    let cfg = load_config(
        &doc(json!({
            "eds_path": "/var/lib/llmroute/a.eds.json",
            "etcd": {"endpoints": ["127.0.0.1:2379", "http://etcd.local:2379"], "prefix": "/llmroute/backends/llama-a"},
        }))
        .to_string(),
    )
    .unwrap();
    let d = cfg.backends[0].discovery.clone().unwrap();
    assert_eq!(d.eds_path.as_deref(), Some("/var/lib/llmroute/a.eds.json"));
    let etcd = d.etcd.unwrap();
    assert_eq!(
        etcd,
        EtcdSource {
            endpoints: vec!["http://127.0.0.1:2379".into(), "http://etcd.local:2379".into()],
            prefix: "/llmroute/backends/llama-a".into(),
            tls: None,
            auth: None,
            allow_loopback: false,
            max_weight: 256,
        }
    );
    assert_eq!(etcd.key("10.0.0.5:8080"), "/llmroute/backends/llama-a/10.0.0.5:8080");
}

#[test]
fn an_etcd_source_over_tls_takes_the_upstream_tls_block() {
    let tls = json!({"ca_file": "/ca.pem", "sni": "etcd.internal", "cert_file": "/c.pem", "key_file": "/c.key"});
    let cfg = load_config(
        &doc(json!({
            "eds_path": "/e.json",
            "etcd": {"endpoints": ["10.0.0.1:2379", "https://etcd.local:2379"], "prefix": "/p", "tls": tls},
        }))
        .to_string(),
    )
    .unwrap();
    let etcd = cfg.backends[0].discovery.clone().unwrap().etcd.unwrap();
    assert_eq!(etcd.endpoints, ["https://10.0.0.1:2379", "https://etcd.local:2379"]);
    let t = etcd.tls.unwrap();
    assert_eq!(
        (t.ca_file.as_str(), t.sni.as_deref()),
        ("/ca.pem", Some("etcd.internal"))
    );
    let client = t.client_cert.unwrap();
    assert_eq!(
        (client.cert_file.as_str(), client.key_file.as_str()),
        ("/c.pem", "/c.key")
    );
    let cases = [
        (
            json!({"endpoints": ["http://10.0.0.1:2379"], "prefix": "/p", "tls": {"ca_file": "/ca.pem"}}),
            "backends[0].discovery.etcd.endpoints[0]",
            "with `tls` every member is reached over TLS",
        ),
        (
            json!({"endpoints": ["10.0.0.1:2379"], "prefix": "/p", "tls": {"ca_file": "/ca.pem", "key_file": "/k"}}),
            "backends[0].discovery.etcd.tls.key_file",
            "add `cert_file: PATH`",
        ),
        (
            json!({"endpoints": ["10.0.0.1:2379"], "prefix": "/p", "tls": {"ca_file": ""}}),
            "backends[0].discovery.etcd.tls.ca_file",
            "a CA bundle is needed",
        ),
    ];
    for (etcd, field, reason) in cases {
        let errs = errors(&doc(json!({"eds_path": "/e.json", "etcd": etcd})));
        assert!(
            errs.iter().any(|e| e.field == field && e.reason.contains(reason)),
            "{etcd}: {errs:?}"
        );
    }
}

#[test]
fn etcd_needs_the_eds_file_it_fills() {
    let errs = errors(&doc(json!({"etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": "/p"}})));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, "backends[0].discovery.eds_path");
    assert!(errs[0].reason.contains("llmroute discover"), "{}", errs[0].reason);
}

#[test]
fn bad_endpoints_and_prefixes_are_named() {
    let cases: &[(Value, &str, &str)] = &[
        (json!([]), "backends[0].discovery.etcd.endpoints", "needs 1 to 16"),
        (
            json!(["https://10.0.0.1:2379"]),
            "backends[0].discovery.etcd.endpoints[0]",
            "https:// needs the CA that signed etcd's certificate: add `tls: { ca_file: ... }` to backends[0].discovery.etcd",
        ),
        (
            json!(["10.0.0.1"]),
            "backends[0].discovery.etcd.endpoints[0]",
            "HOST:PORT",
        ),
        (
            json!(["10.0.0.1:0"]),
            "backends[0].discovery.etcd.endpoints[0]",
            "HOST:PORT",
        ),
    ];
    for (endpoints, field, reason) in cases {
        let errs = errors(&doc(json!({
            "eds_path": "/e.json",
            "etcd": {"endpoints": endpoints, "prefix": "/p"},
        })));
        assert!(
            errs.iter().any(|e| e.field == *field && e.reason.contains(reason)),
            "{endpoints}: {errs:?}"
        );
    }
    for prefix in ["", "/", "p", "/p/", "/a b", "/a\nb"] {
        let errs = errors(&doc(json!({
            "eds_path": "/e.json",
            "etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": prefix},
        })));
        assert_eq!(errs.len(), 1, "{prefix:?}: {errs:?}");
        assert_eq!(errs[0].field, "backends[0].discovery.etcd.prefix", "{prefix:?}");
    }
    let long = format!("/{}", "a".repeat(EtcdSource::MAX_PREFIX));
    let errs = errors(&doc(
        json!({"eds_path": "/e.json", "etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": long}}),
    ));
    assert_eq!(errs[0].field, "backends[0].discovery.etcd.prefix");
    let unknown = errors(&doc(
        json!({"eds_path": "/e.json", "etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": "/p", "ttl": 5}}),
    ));
    assert!(
        unknown[0].reason.contains("ttl") || unknown[0].value.contains("ttl"),
        "{unknown:?}"
    );
}

#[test]
fn etcd_auth_names_the_password_variable_and_needs_tls_off_loopback() {
    let auth = json!({"user": "llmroute", "password_env": "ETCD_PASSWORD"});
    let cfg = load_config(
        &doc(json!({
            "eds_path": "/e.json",
            "etcd": {"endpoints": ["127.0.0.1:2379", "[::1]:2379"], "prefix": "/p", "auth": auth},
        }))
        .to_string(),
    )
    .unwrap();
    let a = cfg.backends[0].discovery.clone().unwrap().etcd.unwrap().auth.unwrap();
    assert_eq!(
        (a.user.as_str(), a.password_env.as_str()),
        ("llmroute", "ETCD_PASSWORD")
    );
    // Off loopback, the password needs TLS.
    let errs = errors(&doc(json!({
        "eds_path": "/e.json",
        "etcd": {"endpoints": ["127.0.0.1:2379", "10.0.0.1:2379"], "prefix": "/p", "auth": auth},
    })));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, "backends[0].discovery.etcd.auth");
    assert!(
        errs[0].reason.contains("10.0.0.1:2379 unencrypted") && errs[0].reason.contains("tls:"),
        "{}",
        errs[0].reason
    );
    let over_tls = json!({"endpoints": ["10.0.0.1:2379"], "prefix": "/p", "auth": auth, "tls": {"ca_file": "/ca.pem"}});
    assert!(load_config(&doc(json!({"eds_path": "/e.json", "etcd": over_tls})).to_string()).is_ok());
    let cases = [
        (
            json!({"user": "", "password_env": "P"}),
            "backends[0].discovery.etcd.auth.user",
        ),
        (
            json!({"user": "a\nb", "password_env": "P"}),
            "backends[0].discovery.etcd.auth.user",
        ),
        (
            json!({"user": "u", "password_env": "1P"}),
            "backends[0].discovery.etcd.auth.password_env",
        ),
        (
            json!({"user": "u", "password_env": "MY-PASS"}),
            "backends[0].discovery.etcd.auth.password_env",
        ),
    ];
    for (auth, field) in cases {
        let errs = errors(&doc(json!({
            "eds_path": "/e.json",
            "etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": "/p", "auth": auth},
        })));
        assert_eq!(errs.len(), 1, "{auth}: {errs:?}");
        assert_eq!(errs[0].field, field, "{auth}");
    }
    let unknown = errors(&doc(json!({
        "eds_path": "/e.json",
        "etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": "/p", "auth": {"user": "u", "password": "x"}},
    })));
    assert!(unknown[0].reason.contains("unknown field `password`"), "{unknown:?}");
}

#[test]
fn registrations_may_be_allowed_on_loopback_and_their_weight_is_capped() {
    let etcd = |extra: Value| {
        let mut e = json!({"endpoints": ["127.0.0.1:2379"], "prefix": "/p"});
        e.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        doc(json!({"eds_path": "/e.json", "etcd": e}))
    };
    let source = |v: &Value| {
        load_config(&v.to_string()).unwrap().backends[0]
            .discovery
            .clone()
            .unwrap()
            .etcd
            .unwrap()
    };
    let s = source(&etcd(json!({"allow_loopback": true, "max_weight": 8})));
    assert_eq!((s.allow_loopback, s.max_weight), (true, 8));
    for bad in [0, 1001] {
        let errs = errors(&etcd(json!({ "max_weight": bad })));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "backends[0].discovery.etcd.max_weight");
    }
}

#[test]
fn the_placement_store_takes_the_same_auth_block() {
    let store = |endpoints: Value, tls: Option<Value>| {
        let mut etcd = json!({"endpoints": endpoints, "auth": {"user": "llmroute", "password_env": "STORE_PW"}});
        if let Some(t) = tls {
            etcd["tls"] = t;
        }
        json!({
            "version": 1,
            "backends": [{"name": "a", "kind": "llamacpp", "endpoints": ["10.0.0.5:8080"]}],
            "models": [{"name": "m", "routes": [{"backend": "a"}]}],
            "affinity": {"placement": "bounded_keys", "placement_store": {"etcd": etcd}},
        })
    };
    let cfg = load_config(&store(json!(["127.0.0.1:2379"]), None).to_string()).unwrap();
    let a = cfg.affinity.placement_store.unwrap().auth.unwrap();
    assert_eq!((a.user.as_str(), a.password_env.as_str()), ("llmroute", "STORE_PW"));
    let errs = errors(&store(json!(["10.0.0.1:2379"]), None));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, "affinity.placement_store.etcd.auth");
    let tls = json!({"ca_file": "/ca.pem"});
    assert!(load_config(&store(json!(["10.0.0.1:2379"]), Some(tls)).to_string()).is_ok());
}
