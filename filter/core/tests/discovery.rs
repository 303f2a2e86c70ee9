//! Backends whose hosts Envoy discovers: the config shape (`discovery` instead of `endpoints`), any Envoy
//! cluster name as a backend name, the host list read from the admin `/clusters` answer, and bounded-keys
//! placement on a host list that changes.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::config::{stat_token, Discovery};
use llmroute_core::key_placement::{self, Bounds, HostView, KeyTable, PlacementReason};
use llmroute_core::status::{host_list, parse_clusters, shown_id, IdKey};
use llmroute_core::{load_config, Config, ConfigError, ConfigErrors};
use serde_json::{json, Value};

fn doc(backend: Value) -> Value {
    let name = backend["name"].clone();
    json!({
        "version": 1,
        "backends": [backend],
        "models": [{"name": "m", "routes": [{"backend": name}]}],
        "affinity": {"placement": "bounded_keys"},
    })
}

fn load(v: &Value) -> Result<Config, ConfigErrors> {
    load_config(&v.to_string())
}

fn errors(v: &Value) -> Vec<ConfigError> {
    match load(v) {
        Ok(_) => panic!("should be refused: {v:#}"),
        Err(ConfigErrors(list)) => list,
    }
}

#[test]
fn discovery_replaces_endpoints() {
    let cfg = load(&doc(json!({"name": "d", "kind": "llamacpp", "discovery": {}}))).unwrap();
    let b = &cfg.backends[0];
    assert!(b.discovered() && b.endpoints.is_empty());
    assert_eq!(
        b.discovery,
        Some(Discovery {
            eds_path: None,
            etcd: None,
            mesh_tls: false,
        })
    );
    assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);

    let cfg = load(&doc(
        json!({"name": "d", "kind": "vllm", "discovery": {"eds_path": "/etc/llmroute/eds.yaml"}}),
    ))
    .unwrap();
    assert_eq!(
        cfg.backends[0].discovery.as_ref().unwrap().eds_path.as_deref(),
        Some("/etc/llmroute/eds.yaml")
    );
}

#[test]
fn endpoints_and_discovery_are_exclusive_and_one_is_required() {
    let both = errors(&doc(
        json!({"name": "d", "kind": "llamacpp", "endpoints": ["127.0.0.1:1"], "discovery": {}}),
    ));
    assert_eq!(both.len(), 1, "{both:?}");
    assert_eq!(both[0].field, "backends[0].endpoints");
    assert!(both[0].reason.contains("not both"), "{}", both[0].reason);

    let neither = errors(&doc(json!({"name": "d", "kind": "llamacpp"})));
    assert_eq!(neither.len(), 1, "{neither:?}");
    assert_eq!(neither[0].field, "backends[0].endpoints");
    assert!(neither[0].reason.contains("discovery"), "{}", neither[0].reason);

    // An empty list written by mistake is still refused, not taken for discovery.
    let empty = errors(&doc(json!({"name": "d", "kind": "llamacpp", "endpoints": []})));
    assert_eq!(empty[0].field, "backends[0].endpoints");
    assert!(empty[0].reason.contains("at least one endpoint"), "{}", empty[0].reason);
}

#[test]
fn discovery_fields_are_checked() {
    let unknown = errors(&doc(
        json!({"name": "d", "kind": "llamacpp", "discovery": {"eds_file": "/x"}}),
    ));
    assert!(unknown[0].field.contains("discovery"), "{unknown:?}");
    assert!(unknown[0].reason.contains("eds_file"), "{unknown:?}");
    for bad in ["relative/eds.yaml", "/", "/dir/", "/a\nb", ""] {
        let list = errors(&doc(
            json!({"name": "d", "kind": "llamacpp", "discovery": {"eds_path": bad}}),
        ));
        assert_eq!(list.len(), 1, "{bad:?}: {list:?}");
        assert_eq!(list[0].field, "backends[0].discovery.eds_path");
        assert_eq!(list[0].value, format!("{bad:?}"));
        assert!(list[0].reason.contains("absolute file path"), "{}", list[0].reason);
    }
}

#[test]
fn slots_need_listed_endpoints() {
    let list = errors(&doc(
        json!({"name": "d", "kind": "llamacpp", "discovery": {}, "slots": [2, 2]}),
    ));
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0].field, "backends[0].slots");
    assert!(list[0].reason.contains("discovered"), "{}", list[0].reason);
}

#[test]
fn a_discovered_backend_gets_no_dns_or_ejection_warning() {
    let cfg = load(&doc(json!({
        "name": "d", "kind": "llamacpp", "discovery": {},
        "outlier": {"consecutive_5xx": 3, "max_ejection_percent": 20},
    })))
    .unwrap();
    assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
}

#[test]
fn any_envoy_cluster_name_is_a_backend_name() {
    for name in [
        "outbound|8000||llama.ns.svc.cluster.local",
        "inbound|8080||",
        "a",
        "odd{name}=\"x\",y",
        &"n".repeat(255),
    ] {
        let cfg = load(&doc(json!({"name": name, "kind": "llamacpp", "discovery": {}})))
            .unwrap_or_else(|e| panic!("{name:?}: {e}"));
        assert_eq!(cfg.backends[0].name, name);
    }
    for reserved in ["llmroute_admin", "LLMRoute-probe-x", "llmroute|x"] {
        let list = errors(&doc(json!({"name": reserved, "kind": "llamacpp", "discovery": {}})));
        assert!(list[0].reason.contains("reserved"), "{reserved}: {list:?}");
    }
}

#[test]
fn stat_tokens_keep_plain_names_and_make_odd_ones_safe_and_distinct() {
    assert_eq!(stat_token("llama-a"), "llama-a");
    assert_eq!(
        stat_token("outbound|8000||llama.ns.svc.cluster.local"),
        "outbound|8000||llama.ns.svc.cluster.local"
    );
    let (a, b) = (stat_token("a b{x}"), stat_token("a_b{x}"));
    for t in [&a, &b] {
        assert!(t.starts_with("a_b_x_~"), "{t}");
        assert!(
            t.bytes().all(|c| c.is_ascii_alphanumeric() || b"._-|:~".contains(&c)),
            "{t}"
        );
    }
    assert_ne!(a, b, "names that sanitise alike still get distinct tokens");
    assert_eq!(stat_token("a b{x}"), a, "stable");
}

/// An admin `/clusters?format=json` answer in Envoy 1.40's shape: the discovered cluster `llama-d` with three
/// hosts (one failing its health check), plus a cluster the config does not know.
const ADMIN: &str = r#"{"cluster_statuses":[
 {"name":"other","host_statuses":[{"address":{"socket_address":{"address":"10.9.9.9","port_value":1}}}]},
 {"name":"llama-d","added_via_api":true,"host_statuses":[
  {"address":{"socket_address":{"address":"10.0.0.3","port_value":8080}},
   "stats":[{"name":"rq_active","type":"GAUGE","value":"2"}],
   "health_status":{"eds_health_status":"HEALTHY"}},
  {"address":{"socket_address":{"address":"10.0.0.1","port_value":8080}},
   "health_status":{"failed_active_health_check":true,"eds_health_status":"HEALTHY"}},
  {"address":{"socket_address":{"address":"fd00::2","port_value":8080}},
   "health_status":{"eds_health_status":"HEALTHY"}},
  {"address":{"pipe":{"path":"/tmp/x.sock"}}}
 ]}]}"#;

#[test]
fn the_admin_answer_gives_each_discovered_host_and_its_health() {
    let cfg = load(&doc(json!({"name": "llama-d", "kind": "llamacpp", "discovery": {}}))).unwrap();
    let fleet = parse_clusters(ADMIN.as_bytes(), &cfg, 7).unwrap();
    assert_eq!(fleet.backends.len(), 1);
    let b = &fleet.backends[0];
    assert_eq!((b.total, b.healthy, b.in_flight), (4, 3, 2));
    assert_eq!(
        b.hosts,
        ["10.0.0.1:8080", "10.0.0.3:8080", "[fd00::2]:8080"],
        "sorted, pipes left out"
    );
    assert_eq!(b.down, ["10.0.0.1:8080"]);

    let key = IdKey([7, 11]);
    let shown = host_list(b, key);
    assert_eq!(shown.len(), 3);
    let up: Vec<bool> = shown.iter().map(|h| h["up"].as_bool().unwrap()).collect();
    assert_eq!(up, [false, true, true]);
    let id = format!("{:08x}", shown_id(key, "10.0.0.3:8080"));
    assert_eq!(shown[1]["id"], id.as_str());
    let text = serde_json::to_string(&shown).unwrap();
    assert!(
        !text.contains("10.0.0"),
        "addresses never reach the status page: {text}"
    );
}

#[test]
fn the_status_page_says_where_hosts_come_from() {
    let cfg = load(&doc(json!({"name": "llama-d", "kind": "llamacpp", "discovery": {}}))).unwrap();
    let fleet = parse_clusters(ADMIN.as_bytes(), &cfg, 7).unwrap();
    let body: Value = serde_json::from_slice(&llmroute_core::status::status_body(
        &cfg,
        Some(&fleet),
        None,
        7,
        IdKey([1, 2]),
    ))
    .unwrap();
    let b = &body["backends"][0];
    assert_eq!(b["hosts_from"], "envoy");
    assert_eq!(b["hosts"].as_array().unwrap().len(), 3);
    assert_eq!(b["total_hosts"], 4);
    assert_eq!(body["ready"], true);
}

fn views(addrs: &[&str]) -> Vec<HostView> {
    addrs
        .iter()
        .map(|a| HostView {
            address: a.to_string(),
            up: true,
            weight: 1,
            in_flight: 0,
            queued: None,
        })
        .collect()
}

fn bounds() -> Bounds {
    Bounds::new(&llmroute_core::config::BoundedKeys::default(), 150)
}

/// Places `keys` on `hosts` at `now`, returning each key's host address and reason.
fn place(t: &mut KeyTable, hosts: &[HostView], keys: std::ops::Range<u64>, now: u64) -> Vec<(String, PlacementReason)> {
    keys.map(|k| {
        let c = key_placement::choose(t, hosts, k.wrapping_mul(0x9e37_79b9_7f4a_7c15), now, &bounds()).unwrap();
        (hosts[c.host].address.clone(), c.reason)
    })
    .collect()
}

#[test]
fn a_joining_host_takes_new_keys_and_moves_none() {
    let mut t = KeyTable::default();
    let two = views(&["10.0.0.1:80", "10.0.0.2:80"]);
    let before = place(&mut t, &two, 0..20, 1000);
    // The list as the poll stores it: sorted, so the newcomer may land in the middle and shift indices.
    let three = views(&["10.0.0.1:80", "10.0.0.15:80", "10.0.0.2:80"]);
    let again = place(&mut t, &three, 0..20, 2000);
    for (k, (b, a)) in before.iter().zip(&again).enumerate() {
        assert_eq!(b.0, a.0, "key {k} moved when a host joined");
        assert_eq!(a.1, PlacementReason::Pinned);
    }
    let fresh = place(&mut t, &three, 20..40, 3000);
    let on_new = fresh.iter().filter(|(a, _)| a == "10.0.0.15:80").count();
    assert!(on_new >= 8, "the new host took only {on_new} of 20 new keys");
}

#[test]
fn a_leaving_hosts_keys_are_placed_again_and_no_other_key_moves() {
    let mut t = KeyTable::default();
    let three = views(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]);
    let before = place(&mut t, &three, 0..30, 1000);
    let two = views(&["10.0.0.1:80", "10.0.0.3:80"]);
    let after = place(&mut t, &two, 0..30, 2000);
    let mut moved = 0;
    for (k, (b, a)) in before.iter().zip(&after).enumerate() {
        if b.0 == "10.0.0.2:80" {
            moved += 1;
            assert_eq!(a.1, PlacementReason::Moved, "key {k}");
        } else {
            assert_eq!(
                (&a.0, a.1),
                (&b.0, PlacementReason::Pinned),
                "key {k} moved though its host stayed"
            );
        }
    }
    assert!(moved >= 5, "only {moved} keys lived on the removed host");
    // The host comes back: the keys placed again stay where they went.
    let back = place(&mut t, &three, 0..30, 3000);
    assert_eq!(
        back.iter().map(|x| &x.0).collect::<Vec<_>>(),
        after.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
}
