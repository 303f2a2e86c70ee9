//! Status for operators: parsing real `/clusters?format=json` captures from Envoy 1.40 (`testdata/admin/`),
//! readiness, and the bodies of `/llmroute/status`, `/healthz` and `/readyz`.
//!
//! The captures come from one Envoy with three clusters:
//! - `llama-a`: STATIC, hosts on 127.0.0.1:21081..21084, active health checks on `/health` and outlier detection;
//!   21083 answers its health check with 503 and 21084 has nothing listening.
//! - `vllm-b`: STRICT_DNS `localhost:21082`, no health checks.
//! - `llmroute_admin`: the admin cluster.
//!
//! `clusters-starting.json` was taken before the first health checks (every checked host is still failed),
//! `clusters-busy.json` with six slow requests in flight, `clusters-mixed.json` after 21083 was also ejected
//! by outlier detection.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use llmroute_core::status::{
    self, parse_clusters, readiness, AdminFailure, BackendHealth, FleetStatus, Readiness, ADMIN_CLUSTER, STALE_AFTER_MS,
};
use llmroute_core::{load_config, Config};
use serde_json::Value;

const STARTING: &[u8] = include_bytes!("../../../testdata/admin/clusters-starting.json");
const BUSY: &[u8] = include_bytes!("../../../testdata/admin/clusters-busy.json");
const MIXED: &[u8] = include_bytes!("../../../testdata/admin/clusters-mixed.json");

const NOW: u64 = 1_760_000_000_000;

/// The captures' fleet, with upstream model names that must never show (also the filter's status tests').
const CONFIG: &str = include_str!("../../../testdata/admin/llmroute.json");

fn config() -> Config {
    load_config(CONFIG).unwrap()
}

/// A config with one more backend (`sglang-c`) that no capture lists, and an alias that needs it alone.
fn config_with_missing_backend() -> Config {
    let text = CONFIG
        .replacen(
            r#""lb": "least_request" }"#,
            r#""lb": "least_request" },
    { "name": "sglang-c", "kind": "sglang", "endpoints": ["127.0.0.1:21090"] }"#,
            1,
        )
        .replacen(
            r#"{ "name": "only-b","#,
            r#"{ "name": "only-c", "routes": [ { "backend": "sglang-c", "upstream_model": "secret-upstream-c" } ] },
    { "name": "only-b","#,
            1,
        );
    load_config(&text).unwrap()
}

fn parse(capture: &[u8]) -> FleetStatus {
    parse_clusters(capture, &config(), NOW).unwrap()
}

fn figures(f: &FleetStatus, name: &str) -> (u32, u32, u32, u64) {
    let b = f.backend(name).unwrap_or_else(|| panic!("{name} missing"));
    (b.healthy, b.degraded, b.total, b.in_flight)
}

/// A key for the shown host ids.
const KEY: status::IdKey = status::IdKey([0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908]);

fn body(cfg: &Config, fleet: Option<&FleetStatus>, now: u64) -> Value {
    serde_json::from_slice(&status::status_body(cfg, fleet, None, now, KEY)).unwrap()
}

fn backend_entry<'v>(v: &'v Value, name: &str) -> &'v Value {
    v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {v}"))
}

fn model_ready(v: &Value, name: &str) -> bool {
    let m = v["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap();
    m["ready"].as_bool().unwrap()
}

// --- parsing the captures ---

#[test]
fn starting_capture_counts_unchecked_hosts_as_unhealthy() {
    let f = parse(STARTING);
    assert_eq!(f.taken_at_ms, NOW);
    assert_eq!(figures(&f, "llama-a"), (0, 0, 4, 0));
    assert_eq!(figures(&f, "vllm-b"), (1, 0, 1, 0));
}

#[test]
fn busy_capture_sums_rq_active_over_hosts() {
    let f = parse(BUSY);
    assert_eq!(figures(&f, "llama-a"), (2, 0, 4, 6));
    assert_eq!(figures(&f, "vllm-b"), (1, 0, 1, 0));
}

#[test]
fn mixed_capture_counts_failed_checks_and_ejections_as_unhealthy() {
    let f = parse(MIXED);
    assert_eq!(figures(&f, "llama-a"), (2, 0, 4, 6));
    assert_eq!(figures(&f, "vllm-b"), (1, 0, 1, 0));
}

#[test]
fn only_configured_backends_are_kept() {
    for capture in [STARTING, BUSY, MIXED] {
        let f = parse(capture);
        let mut names: Vec<&str> = f.backends.iter().map(|b| b.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["llama-a", "vllm-b"]);
        assert!(f.backend(ADMIN_CLUSTER).is_none());
    }
}

#[test]
fn captures_survive_the_shared_data_round_trip() {
    for capture in [STARTING, BUSY, MIXED] {
        let f = parse(capture);
        assert_eq!(FleetStatus::decode(&f.encode()).as_ref(), Some(&f));
    }
}

#[test]
fn unreadable_answers_are_errors() {
    let cfg = config();
    for bad in [
        &b""[..],
        b"not json",
        b"[1,2]",
        b"{\"cluster_statuses\": 3}",
        b"{\"cluster_statuses\":[{}]}",
    ] {
        let e = parse_clusters(bad, &cfg, NOW).unwrap_err();
        assert!(e.to_string().starts_with("unreadable admin /clusters answer"), "{e}");
        assert!(e.0.contains("line 1, column"), "where, not what: {e}");
    }
    // The answer is never quoted: it may come from another server than Envoy's admin.
    let e = parse_clusters(br#"{"cluster_statuses": "secret words"}"#, &cfg, NOW).unwrap_err();
    assert!(!e.to_string().contains("secret"), "{e}");
    let truncated = &MIXED[..MIXED.len() / 2];
    assert!(parse_clusters(truncated, &cfg, NOW).is_err());
}

#[test]
fn an_empty_answer_lists_no_backend() {
    let f = parse_clusters(b"{}", &config(), NOW).unwrap();
    assert!(f.backends.is_empty());
    let f = parse_clusters(br#"{"cluster_statuses":[{"name":"llama-a"}]}"#, &config(), NOW).unwrap();
    assert_eq!(figures(&f, "llama-a"), (0, 0, 0, 0));
}

#[test]
fn degraded_hosts_are_counted_apart() {
    let doc = r#"{"cluster_statuses":[{"name":"llama-a","host_statuses":[
        {"health_status":{"eds_health_status":"DEGRADED"},"stats":[{"type":"GAUGE","name":"rq_active","value":"2"}]},
        {"health_status":{"failed_active_degraded_check":true,"eds_health_status":"HEALTHY"}},
        {"health_status":{"eds_health_status":"HEALTHY"},"stats":[{"name":"rq_total","value":"99"}]},
        {"health_status":{"eds_health_status":"DRAINING"}}]}]}"#;
    let f = parse_clusters(doc.as_bytes(), &config(), NOW).unwrap();
    assert_eq!(
        figures(&f, "llama-a"),
        (1, 2, 4, 2),
        "rq_total must not count as in flight"
    );
}

#[test]
fn a_large_fleet_parses_and_sums() {
    let hosts: Vec<String> = (0..500)
        .map(|i| {
            let health = if i % 5 == 0 {
                r#"{"failed_outlier_check":true,"eds_health_status":"HEALTHY"}"#
            } else {
                r#"{"eds_health_status":"HEALTHY"}"#
            };
            format!(
                r#"{{"address":{{"socket_address":{{"address":"10.1.{}.{}","port_value":8000}}}},"stats":[{{"type":"GAUGE","name":"rq_active","value":"{}"}}],"health_status":{health}}}"#,
                i / 250,
                i % 250,
                i % 3
            )
        })
        .collect();
    let doc = format!(
        r#"{{"cluster_statuses":[{{"name":"llama-a","host_statuses":[{}]}}]}}"#,
        hosts.join(",")
    );
    let f = parse_clusters(doc.as_bytes(), &config(), NOW).unwrap();
    let in_flight: u64 = (0..500u64).map(|i| i % 3).sum();
    assert_eq!(figures(&f, "llama-a"), (400, 0, 500, in_flight));
}

#[test]
fn host_weights_above_one_are_kept_by_address_and_never_shown() {
    // As Envoy 1.40 answers for an EDS cluster: `weight` per host, 1 when the endpoint named none.
    let doc = r#"{"cluster_statuses":[{"name":"llama-a","host_statuses":[
        {"address":{"socket_address":{"address":"127.0.0.1","port_value":18001}},"health_status":{"eds_health_status":"HEALTHY"},"weight":4,"locality":{}},
        {"address":{"socket_address":{"address":"127.0.0.1","port_value":18002}},"health_status":{"eds_health_status":"HEALTHY"},"weight":1,"locality":{}},
        {"address":{"socket_address":{"address":"127.0.0.1","port_value":18003}},"health_status":{"eds_health_status":"HEALTHY"}}]}]}"#;
    let f = parse_clusters(doc.as_bytes(), &config(), NOW).unwrap();
    let b = f.backend("llama-a").unwrap();
    assert_eq!(b.weights, [("127.0.0.1:18001".to_string(), 4)]);
    assert_eq!(FleetStatus::decode(&f.encode()).unwrap(), f);
    let page = String::from_utf8(status::status_body(&config(), Some(&f), None, NOW, KEY)).unwrap();
    assert!(!page.contains("18001") && !page.contains("weight"), "{page}");
}

// --- readiness ---

#[test]
fn not_ready_before_the_first_poll() {
    let cfg = config();
    assert_eq!(readiness(&cfg, None, None, NOW), Readiness::NoSnapshot);
    assert!(!status::ready(&cfg, None, None, NOW));
    let (code, body) = status::readyz(&cfg, None, None, NOW);
    assert_eq!(code, 503);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["ready"], false);
    assert!(v["reason"].as_str().unwrap().contains("first poll"), "{v}");
}

#[test]
fn ready_when_every_alias_has_a_healthy_route() {
    let cfg = config();
    let f = parse(MIXED);
    assert_eq!(readiness(&cfg, Some(&f), None, NOW + 10), Readiness::Ready);
    let (code, body) = status::readyz(&cfg, Some(&f), None, NOW + 10);
    assert_eq!(code, 200);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        serde_json::json!({"ready": true, "reason": null})
    );
}

#[test]
fn an_alias_with_no_healthy_route_makes_the_gateway_unready() {
    let cfg = config();
    let mut f = parse(STARTING);
    // Before the health checks pass, `chat` (llama-a only) is down; `big` still has vllm-b.
    assert_eq!(
        readiness(&cfg, Some(&f), None, NOW),
        Readiness::AliasesDown(vec!["chat".into()])
    );
    // vllm-b down too: `big` and `only-b` follow.
    for b in &mut f.backends {
        b.healthy = 0;
    }
    assert_eq!(
        readiness(&cfg, Some(&f), None, NOW),
        Readiness::AliasesDown(vec!["chat".into(), "big".into(), "only-b".into()])
    );
    let (code, body) = status::readyz(&cfg, Some(&f), None, NOW);
    assert_eq!(code, 503);
    let reason = serde_json::from_slice::<Value>(&body).unwrap()["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(reason.contains("chat, big, only-b"), "{reason}");
}

#[test]
fn a_lower_priority_route_keeps_an_alias_ready() {
    let cfg = config();
    let mut f = parse(MIXED);
    f.backends.iter_mut().find(|b| b.name == "vllm-b").unwrap().healthy = 0;
    assert_eq!(
        readiness(&cfg, Some(&f), None, NOW),
        Readiness::AliasesDown(vec!["only-b".into()]),
        "big falls back to llama-a"
    );
}

#[test]
fn degraded_only_is_not_ready() {
    let cfg = config();
    let f = FleetStatus {
        taken_at_ms: NOW,
        backends: vec![
            BackendHealth {
                name: "llama-a".into(),
                healthy: 0,
                degraded: 3,
                total: 3,
                in_flight: 0,
                down: Vec::new(),
                hosts: Vec::new(),
                weights: Vec::new(),
                active: Vec::new(),
            },
            BackendHealth {
                name: "vllm-b".into(),
                healthy: 1,
                degraded: 0,
                total: 1,
                in_flight: 0,
                down: Vec::new(),
                hosts: Vec::new(),
                weights: Vec::new(),
                active: Vec::new(),
            },
        ],
    };
    assert_eq!(
        readiness(&cfg, Some(&f), None, NOW),
        Readiness::AliasesDown(vec!["chat".into()])
    );
}

#[test]
fn a_backend_missing_from_the_answer_is_not_healthy() {
    let cfg = config_with_missing_backend();
    let f = parse_clusters(MIXED, &cfg, NOW).unwrap();
    assert!(f.backend("sglang-c").is_none());
    assert_eq!(
        readiness(&cfg, Some(&f), None, NOW),
        Readiness::AliasesDown(vec!["only-c".into()])
    );
    let v = body(&cfg, Some(&f), NOW);
    let c = backend_entry(&v, "sglang-c");
    assert_eq!(c["kind"], "sglang");
    assert_eq!(c["healthy_hosts"], Value::Null);
    assert_eq!(c["total_hosts"], Value::Null);
    assert!(!model_ready(&v, "only-c"));
    assert!(model_ready(&v, "chat"));
}

#[test]
fn a_stale_snapshot_is_not_ready() {
    let cfg = config();
    let f = parse(MIXED);
    assert!(status::ready(&cfg, Some(&f), None, NOW + STALE_AFTER_MS));
    let late = NOW + STALE_AFTER_MS + 1;
    assert_eq!(
        readiness(&cfg, Some(&f), None, late),
        Readiness::Stale {
            age_ms: STALE_AFTER_MS + 1
        }
    );
    let (code, _) = status::readyz(&cfg, Some(&f), None, late);
    assert_eq!(code, 503);
    let v = body(&cfg, Some(&f), late);
    assert_eq!(v["ready"], false);
    assert_eq!(v["snapshot"]["stale"], true);
    assert!(v["reason"].as_str().unwrap().contains("stale"));
}

/// Polls of a wrong `admin:` address: `/readyz` and the status page name it and say why, once no fresh snapshot
/// is left; while one is, readiness stands and only the page's `admin` shows the failing polls.
#[test]
fn failing_admin_polls_are_named_by_readyz_and_the_status_page() {
    let cfg = config();
    let failure = AdminFailure {
        address: "127.0.0.1:9911".into(),
        error: "Envoy answered 503 in its place: upstream connect error or disconnect/reset before headers".into(),
        since_ms: NOW - 3000,
    };
    let names_it = |text: &str| {
        text.contains("127.0.0.1:9911")
            && text.contains("`admin:` in llmroute.yaml")
            && text.contains("upstream connect error")
            && text.contains("own admin interface")
    };

    // Never a good poll.
    assert!(matches!(
        readiness(&cfg, None, Some(&failure), NOW),
        Readiness::AdminFailing {
            snapshot_age_ms: None,
            ..
        }
    ));
    let (code, readyz) = status::readyz(&cfg, None, Some(&failure), NOW);
    let readyz: Value = serde_json::from_slice(&readyz).unwrap();
    assert_eq!((code, &readyz["ready"]), (503, &Value::Bool(false)));
    let reason = readyz["reason"].as_str().unwrap();
    assert!(
        names_it(reason) && reason.contains("no health snapshot yet"),
        "{reason}"
    );
    let page: Value = serde_json::from_slice(&status::status_body(&cfg, None, Some(&failure), NOW, KEY)).unwrap();
    assert_eq!(
        page["admin"],
        serde_json::json!({"address": "127.0.0.1:9911", "error": failure.error, "failing_for_ms": 3000})
    );
    assert!(names_it(page["reason"].as_str().unwrap()), "{page}");

    // A snapshot that went stale while polls fail.
    let f = parse(MIXED);
    let late = NOW + STALE_AFTER_MS + 1;
    let (code, readyz) = status::readyz(&cfg, Some(&f), Some(&failure), late);
    let reason = serde_json::from_slice::<Value>(&readyz).unwrap()["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(code, 503);
    assert!(
        names_it(&reason) && reason.contains(&format!("{} ms old", STALE_AFTER_MS + 1)),
        "{reason}"
    );

    // A fresh snapshot still stands; the page shows the failing polls, ready or not.
    assert_eq!(readiness(&cfg, Some(&f), Some(&failure), NOW), Readiness::Ready);
    let page = body(&cfg, Some(&f), NOW);
    assert_eq!(page["admin"], Value::Null, "polls that work show no admin");
    let page: Value = serde_json::from_slice(&status::status_body(&cfg, Some(&f), Some(&failure), NOW, KEY)).unwrap();
    assert_eq!(
        (&page["ready"], &page["admin"]["address"]),
        (&Value::Bool(true), &Value::from("127.0.0.1:9911"))
    );
}

#[test]
fn a_clock_step_back_does_not_make_a_snapshot_stale() {
    let cfg = config();
    let f = parse(MIXED);
    assert!(status::ready(&cfg, Some(&f), None, NOW - 60_000));
    assert_eq!(body(&cfg, Some(&f), NOW - 60_000)["snapshot"]["age_ms"], 0);
}

// --- the bodies ---

#[test]
fn status_lists_every_backend_and_alias() {
    let cfg = config();
    let f = parse(BUSY);
    let v = body(&cfg, Some(&f), NOW + 420);
    assert_eq!(v["object"], "llmroute.status");
    assert_eq!(v["ready"], true);
    assert_eq!(v["reason"], Value::Null);
    assert_eq!(v["poll_interval_ms"], 1000);
    assert_eq!(v["snapshot"]["age_ms"], 420);
    assert_eq!(v["snapshot"]["stale"], false);
    assert!(v["source"].as_str().unwrap().contains("/clusters"));
    let a = backend_entry(&v, "llama-a");
    assert_eq!(a["kind"], "llamacpp");
    assert_eq!(
        (a["healthy_hosts"].as_u64(), a["total_hosts"].as_u64()),
        (Some(2), Some(4))
    );
    assert_eq!(a["degraded_hosts"], 0);
    assert_eq!(a["in_flight"], 6);
    let b = backend_entry(&v, "vllm-b");
    assert_eq!(b["kind"], "vllm");
    assert_eq!(
        (b["healthy_hosts"].as_u64(), b["total_hosts"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(b["in_flight"], 0);
    let names: Vec<&str> = v["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["chat", "big", "only-b"], "config order");
    for m in names {
        assert!(model_ready(&v, m), "{m}");
    }
    let big = &v["models"][1];
    assert_eq!(
        big["backends"],
        serde_json::json!(["vllm-b", "llama-a"]),
        "priority order"
    );
    assert_eq!(
        v["backends"].as_array().unwrap().len(),
        2,
        "the admin cluster is never listed"
    );
}

#[test]
fn status_before_the_first_poll_says_so() {
    let cfg = config();
    let v = body(&cfg, None, NOW);
    assert_eq!(v["ready"], false);
    assert_eq!(v["snapshot"], Value::Null);
    assert!(v["reason"].as_str().unwrap().contains("no health snapshot yet"));
    for name in ["llama-a", "vllm-b"] {
        let b = backend_entry(&v, name);
        assert_eq!(b["healthy_hosts"], Value::Null);
        assert_eq!(b["in_flight"], Value::Null);
    }
    for m in ["chat", "big", "only-b"] {
        assert!(!model_ready(&v, m));
    }
}

#[test]
fn status_shows_aliases_down() {
    let cfg = config();
    let v = body(&cfg, Some(&parse(STARTING)), NOW);
    assert_eq!(v["ready"], false);
    assert!(!model_ready(&v, "chat"));
    assert!(model_ready(&v, "big"));
    assert!(model_ready(&v, "only-b"));
    assert_eq!(backend_entry(&v, "llama-a")["healthy_hosts"], 0);
    assert!(v["reason"].as_str().unwrap().ends_with(": chat"));
}

#[test]
fn no_body_leaks_addresses_hostnames_or_upstream_models() {
    let cfg = config();
    let mut bodies = vec![status::status_body(&cfg, None, None, NOW, KEY), status::healthz_body()];
    for capture in [STARTING, BUSY, MIXED] {
        let f = parse(capture);
        bodies.push(status::status_body(&cfg, Some(&f), None, NOW, KEY));
        bodies.push(status::readyz(&cfg, Some(&f), None, NOW).1);
    }
    for b in bodies {
        let text = String::from_utf8(b).unwrap();
        for secret in [
            "127.0.0.1",
            "::1",
            "localhost",
            "2108",
            "21901",
            "secret-upstream",
            "socket_address",
        ] {
            assert!(!text.contains(secret), "{secret} leaked in {text}");
        }
    }
}

#[test]
fn the_snapshot_names_the_hosts_envoy_would_not_route_to() {
    // Kept in shared data for bounded-keys placement only; the pages above never show it.
    for capture in [STARTING, BUSY, MIXED] {
        let f = parse(capture);
        for b in &f.backends {
            assert_eq!(
                b.down.len() as u32,
                b.total - b.healthy - b.degraded,
                "{}: {:?}",
                b.name,
                b.down
            );
            assert!(
                b.down
                    .iter()
                    .all(|a| a.starts_with("127.0.0.1:") || a.starts_with("[::1]:")),
                "{:?}",
                b.down
            );
        }
        assert_eq!(status::FleetStatus::decode(&f.encode()), Some(f));
    }
    let starting = parse(STARTING);
    assert!(starting.backends.iter().any(|b| !b.down.is_empty()));
}

#[test]
fn healthz_is_constant() {
    let v: Value = serde_json::from_slice(&status::healthz_body()).unwrap();
    assert_eq!(v, serde_json::json!({"alive": true}));
}

#[test]
fn the_admin_cluster_name_is_reserved() {
    let text = CONFIG.replace("\"vllm-b\"", "\"llmroute_admin\"");
    let errs = load_config(&text).unwrap_err();
    let msg = errs.to_string();
    assert!(msg.contains("backends[1].name") && msg.contains("reserved"), "{msg}");
}

// --- host ids ---

#[test]
fn shown_ids_are_sip_hash_2_4_under_the_process_key() {
    // The reference vectors of SipHash-2-4 (key 00..0f): the empty message and the byte 00.
    let vector = |m: &[u8]| {
        #[allow(deprecated)]
        let mut h = std::hash::SipHasher::new_with_keys(KEY.0[0], KEY.0[1]);
        std::hash::Hasher::write(&mut h, m);
        std::hash::Hasher::finish(&h)
    };
    assert_eq!(vector(b""), 0x726f_db47_dd0e_0e31);
    assert_eq!(vector(b"\0"), 0x74f8_39c5_93dc_67fd);
    assert_eq!(status::shown_id(KEY, ""), 0xdd0e_0e31);
    assert_eq!(status::shown_id(KEY, "\0"), 0x93dc_67fd);
}

#[test]
fn shown_ids_cannot_be_matched_to_addresses_without_the_key() {
    // Anyone could hash every address of a subnet and match the unkeyed ids: the page shows keyed ones.
    let f = parse(MIXED);
    let a = f.backend("llama-a").unwrap();
    let shown = |key| -> Vec<String> {
        status::host_list(a, key)
            .iter()
            .map(|h| h["id"].as_str().unwrap().to_string())
            .collect()
    };
    let unkeyed: Vec<String> = a
        .hosts
        .iter()
        .map(|h| format!("{:08x}", llmroute_core::key_placement::host_id(h)))
        .collect();
    let ids = shown(KEY);
    assert!(!ids.is_empty());
    assert_eq!(ids.len(), a.hosts.len());
    assert!(ids.iter().all(|id| !unkeyed.contains(id)), "{ids:?} {unkeyed:?}");
    // The same key shows the same ids (every worker of a process); another process's key shows others.
    assert_eq!(shown(KEY), ids);
    let other = shown(status::IdKey([KEY.0[0], KEY.0[1] ^ 1]));
    assert!(other.iter().all(|id| !ids.contains(id)), "{other:?} {ids:?}");
}

#[test]
fn id_keys_round_trip_and_anything_else_is_no_key() {
    assert_eq!(status::IdKey::decode(&KEY.encode()), Some(KEY));
    assert_eq!(status::IdKey::decode(&[0; 15]), None);
    assert_eq!(status::IdKey::decode(&[0; 17]), None);
    assert_eq!(status::IdKey::decode(b""), None);
}

// --- in-flight figures per host ---

#[test]
fn each_hosts_requests_in_flight_are_kept_by_address_for_placement_and_never_shown() {
    let f = parse(MIXED);
    let a = f.backend("llama-a").unwrap();
    let active = [("127.0.0.1:21081".to_string(), 3), ("127.0.0.1:21082".to_string(), 3)];
    assert_eq!(a.active, active, "hosts without requests in flight are left out");
    assert!(f.backend("vllm-b").unwrap().active.is_empty());
    assert_eq!(FleetStatus::decode(&f.encode()).unwrap(), f);
    // Placement's counts, in its own host order, rebuilt from them.
    let addresses: Vec<String> = ["127.0.0.1:21084", "127.0.0.1:21082", "127.0.0.1:21081"]
        .map(String::from)
        .to_vec();
    assert_eq!(
        llmroute_core::key_placement::in_flight::from_envoy(&addresses, &a.active),
        [0, 3, 3]
    );
    let page = String::from_utf8(status::status_body(&config(), Some(&f), None, NOW, KEY)).unwrap();
    assert!(!page.contains("21081") && !page.contains("\"active\""), "{page}");
}
