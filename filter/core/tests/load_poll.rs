//! The engine load poll's pure part (`load::poll`): which hosts a round reads and through which cluster, when a
//! round is due, how answers, problems and ORCA reports update what is stored, and the status page's view; and
//! the probe clusters both the poll and the `/props` check need (`probe`).
#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use llmroute_core::config::EngineKind;
use llmroute_core::key_placement::table::encode_down_hosts;
use llmroute_core::load::orca::OrcaReport;
use llmroute_core::load::poll::{self, HostLoad, Problem, Target};
use llmroute_core::load::{self, EngineLoad};
use llmroute_core::status::STALE_AFTER_MS;
use llmroute_core::Config;
use proptest::prelude::*;

fn cfg(backends: &str) -> Config {
    common::config(&format!(
        r#"{{ "version": 1, "backends": [{backends}],
            "models": [{{ "name": "m", "routes": [{{ "backend": "a" }}] }}] }}"#
    ))
}

const FIXED: &str = r#"{ "name": "a", "kind": "vllm", "endpoints": ["10.0.0.1:8000", "10.0.0.2:8000"],
    "load": { "poll_ms": 200 } }"#;
const DISCOVERED: &str = r#"{ "name": "a", "kind": "sglang", "discovery": {}, "load": {} }"#;

fn reading(queued: u32, at_ms: u64) -> EngineLoad {
    EngineLoad {
        running: 2,
        queued,
        kv_permille: Some(500),
        at_ms,
    }
}

#[test]
fn a_fixed_backend_reads_each_endpoint_through_its_probe_cluster() {
    let c = cfg(FIXED);
    let t = poll::targets(&c.backends[0], 0, None);
    assert_eq!(
        t,
        vec![
            Target {
                address: "10.0.0.1:8000".into(),
                cluster: "llmroute-probe-a-0".into(),
                original_dst: false
            },
            Target {
                address: "10.0.0.2:8000".into(),
                cluster: "llmroute-probe-a-1".into(),
                original_dst: false
            },
        ]
    );
}

#[test]
fn a_discovered_backend_reads_the_fresh_polled_hosts_only() {
    let c = cfg(DISCOVERED);
    let b = &c.backends[0];
    let hosts = vec!["10.1.0.1:30000".to_string(), "10.1.0.2:30000".to_string()];
    let now = 100_000;
    let t = poll::targets(b, now, Some((now - STALE_AFTER_MS, hosts.clone())));
    assert_eq!(t.len(), 2);
    assert!(t.iter().all(|t| t.original_dst && t.cluster == "llmroute-dst-probe-a"));
    assert_eq!(t[1].address, "10.1.0.2:30000");
    assert!(poll::targets(b, now, Some((now - STALE_AFTER_MS - 1, hosts))).is_empty());
    assert!(poll::targets(b, now, None).is_empty());
    // The encoding the status poll stores reads back as the list.
    let stored = encode_down_hosts(now, &["10.1.0.1:30000".to_string()]);
    let list = llmroute_core::key_placement::table::decode_down_hosts(&stored);
    assert_eq!(poll::targets(b, now, list).len(), 1);
}

#[test]
fn rounds_are_due_every_poll_and_wait_a_bounded_time() {
    assert!(poll::due(0, 1000, 250));
    assert!(!poll::due(1000, 1249, 250));
    assert!(poll::due(1000, 1250, 250));
    assert!(poll::due(10_000, 1000, 250), "a claim in the future has expired");
    assert_eq!(poll::timeout_ms(50), poll::MIN_TIMEOUT_MS);
    assert_eq!(poll::timeout_ms(800), 800);
    assert_eq!(poll::timeout_ms(60_000), poll::MAX_TIMEOUT_MS);
}

#[test]
fn answers_become_readings_or_problems() {
    let page = b"llamacpp:requests_processing 1\nllamacpp:requests_deferred 3\n";
    let got = poll::read_answer(EngineKind::LlamaCpp, Some(200), page, 7).unwrap();
    assert_eq!((got.running, got.queued, got.at_ms), (1, 3, 7));
    assert_eq!(
        poll::read_answer(EngineKind::LlamaCpp, Some(501), b"", 7),
        Err(Problem::Status(501))
    );
    assert_eq!(
        poll::read_answer(EngineKind::LlamaCpp, Some(200), b"other 1\n", 7),
        Err(Problem::NoGauge)
    );
    assert_eq!(poll::read_answer(EngineKind::Vllm, None, b"", 7), Err(Problem::Timeout));
    assert!(Problem::Status(501).reason(EngineKind::LlamaCpp).contains("--metrics"));
    assert!(Problem::NoGauge
        .reason(EngineKind::LlamaCpp)
        .contains("llamacpp:requests_deferred"));
    assert!(Problem::NoGauge
        .reason(EngineKind::Vllm)
        .contains("vllm:num_requests_waiting"));
}

#[test]
fn a_round_replaces_each_hosts_reading_and_old_ones_age_out() {
    let poll_ms = 200;
    let now = 1_000_000;
    let old = vec![
        ("10.0.0.1:8000".to_string(), reading(5, now - 400)),
        (
            "10.0.0.2:8000".to_string(),
            reading(1, now - poll::keep_ms(poll_ms) - 1),
        ),
        ("10.0.0.3:8000".to_string(), reading(2, now - 100)),
    ];
    let merged = poll::merge(
        &load::encode(&old),
        &[("10.0.0.1:8000".to_string(), reading(0, now))],
        now,
        poll_ms,
    );
    assert_eq!(
        load::decode(&merged),
        vec![
            ("10.0.0.1:8000".to_string(), reading(0, now)),
            ("10.0.0.3:8000".to_string(), reading(2, now - 100)),
        ]
    );
}

#[test]
fn an_orca_report_refreshes_the_hosts_queue_between_polls_and_spares_needless_writes() {
    let poll_ms = 1000;
    let stored = load::encode(&[("10.0.0.1:8000".to_string(), reading(0, 5000))]);
    let report = OrcaReport {
        queued: Some(4.0),
        kv_usage: Some(0.9),
    };
    let v = poll::fold_orca(&stored, "10.0.0.1:8000", report, 5100, poll_ms).unwrap();
    let got = load::decode(&v)[0].1;
    assert_eq!(
        (got.running, got.queued, got.kv_permille, got.at_ms),
        (2, 4, Some(900), 5100)
    );
    // The same figures again within half a poll: nothing to write; later, a refresh of its age.
    assert_eq!(poll::fold_orca(&v, "10.0.0.1:8000", report, 5500, poll_ms), None);
    assert!(poll::fold_orca(&v, "10.0.0.1:8000", report, 5600, poll_ms).is_some());
    // A host with no reading yet starts from the report.
    let v = poll::fold_orca(&stored, "10.0.0.2:8000", report, 5100, poll_ms).unwrap();
    assert_eq!(load::decode(&v).len(), 2);
    // A report without a queue says nothing new about a host never read.
    let empty = OrcaReport {
        queued: None,
        kv_usage: None,
    };
    assert_eq!(poll::fold_orca(b"", "10.0.0.2:8000", empty, 5100, poll_ms), None);
}

#[test]
fn stale_hosts_are_counted_among_the_targets_only() {
    let targets = poll::targets(&cfg(FIXED).backends[0], 0, None);
    let stored = vec![
        ("10.0.0.1:8000".to_string(), reading(0, 10_000 - 601)),
        ("10.9.9.9:8000".to_string(), reading(0, 0)),
    ];
    assert_eq!(poll::stale_count(&targets, &stored, 10_000, 200), 1);
    assert_eq!(poll::stale_count(&targets, &stored, 10_000 - 1, 200), 0);
}

#[test]
fn problems_are_noted_per_host_and_cleared_by_a_reading() {
    let poll_ms = 200;
    let v = poll::merge_problems(b"", &[], &[("10.0.0.1:8000".into(), Problem::Status(501))], 10, poll_ms).unwrap();
    assert_eq!(
        poll::decode_problems(&v),
        vec![("10.0.0.1:8000".to_string(), Problem::Status(501), 10)]
    );
    // Nothing new: no write.
    assert_eq!(poll::merge_problems(&v, &[], &[], 20, poll_ms), None);
    let cleared = poll::merge_problems(&v, &["10.0.0.1:8000".to_string()], &[], 30, poll_ms).unwrap();
    assert!(poll::decode_problems(&cleared).is_empty());
    for p in [
        Problem::Timeout,
        Problem::NoGauge,
        Problem::NoCluster,
        Problem::Status(503),
    ] {
        let v = poll::encode_problems(&[("h:1".into(), p, 1)]);
        assert_eq!(poll::decode_problems(&v), vec![("h:1".to_string(), p, 1)]);
    }
    assert!(poll::decode_problems(b"h:1 nonsense 1\nh:2 timeout x\n").is_empty());
}

#[test]
fn the_status_page_shows_a_hosts_queue_age_staleness_problem_and_work() {
    let h = HostLoad {
        reading: Some(reading(3, 1000)),
        problem: Some((Problem::Timeout, 1500)),
        work_tokens: Some(640),
    };
    let v = h.to_json(EngineKind::Vllm, 1600, 200);
    assert_eq!(v["queued"], 3);
    assert_eq!(v["running"], 2);
    assert_eq!(v["kv_cache_usage"], 0.5);
    assert_eq!(v["age_ms"], 600);
    assert_eq!(v["stale"], false);
    assert_eq!(v["work_tokens"], 640);
    assert_eq!(v["problem_age_ms"], 100);
    assert!(v["problem"].as_str().unwrap().contains("did not answer"));
    assert_eq!(h.to_json(EngineKind::Vllm, 1601, 200)["stale"], true);
    assert_eq!(HostLoad::default().to_json(EngineKind::Vllm, 0, 200)["stale"], true);
}

#[test]
fn probe_clusters_cover_the_props_check_and_the_load_poll_once() {
    let c = cfg(
        r#"{ "name": "a", "kind": "llamacpp", "endpoints": ["10.0.0.1:8080", "10.0.0.2:8080"], "load": {} },
           { "name": "solo", "kind": "vllm", "endpoints": ["10.0.0.3:8000"], "load": {} },
           { "name": "quiet", "kind": "vllm", "endpoints": ["10.0.0.4:8000"] },
           { "name": "d", "kind": "sglang", "discovery": {}, "load": {} },
           { "name": "dl", "kind": "llamacpp", "discovery": {} },
           { "name": "dq", "kind": "vllm", "discovery": {} }"#,
    );
    let clusters: Vec<String> = llmroute_core::probe::endpoints(&c)
        .into_iter()
        .map(|t| t.cluster)
        .collect();
    assert_eq!(
        clusters,
        vec!["llmroute-probe-a-0", "llmroute-probe-a-1", "llmroute-probe-solo-0"],
        "a checked and polled backend's endpoints once each; a single polled endpoint too; none unpolled"
    );
    let discovered: Vec<&str> = llmroute_core::probe::discovered_backends(&c)
        .map(|b| b.name.as_str())
        .collect();
    assert_eq!(discovered, vec!["d", "dl"]);
    // The poll's own targets name the same clusters.
    for b in poll::polled_backends(&c).filter(|b| !b.discovered()) {
        for t in poll::targets(b, 0, None) {
            assert!(clusters.contains(&t.cluster), "{}", t.cluster);
        }
    }
}

fn a_reading() -> impl Strategy<Value = EngineLoad> {
    (
        any::<u32>(),
        any::<u32>(),
        proptest::option::of(0u16..=1000),
        any::<u64>(),
    )
        .prop_map(|(running, queued, kv_permille, at_ms)| EngineLoad {
            running,
            queued,
            kv_permille,
            at_ms,
        })
}

proptest! {
    /// Whatever was stored and whatever a round read, the round's readings are what a reader decodes for its hosts,
    /// and no host appears twice.
    #[test]
    fn a_merged_value_holds_each_rounds_reading_once(
        stored in proptest::collection::vec((0u8..8, a_reading()), 0..10),
        round in proptest::collection::btree_map(0u8..8, a_reading(), 0..8),
        now in any::<u64>(),
    ) {
        let name = |i: u8| format!("10.0.0.{i}:80");
        let stored: Vec<(String, EngineLoad)> = stored.into_iter().map(|(i, l)| (name(i), l)).collect();
        let round: Vec<(String, EngineLoad)> = round.into_iter().map(|(i, l)| (name(i), l)).collect();
        let merged = load::decode(&poll::merge(&load::encode(&stored), &round, now, 250));
        for (a, l) in &round {
            prop_assert_eq!(merged.iter().filter(|(m, _)| m == a).map(|(_, l)| *l).collect::<Vec<_>>(), vec![*l]);
        }
        let mut names: Vec<&String> = merged.iter().map(|(a, _)| a).collect();
        names.dedup();
        prop_assert_eq!(names.len(), merged.len());
    }
}
