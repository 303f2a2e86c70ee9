//! The `/props` fleet check through the real filter, against emulators that report a chosen `n_ctx` and
//! `total_slots` in `/props` (the real llama-server version is in `tests/real_engines.rs`).
//!
//! - A backend whose servers disagree gets a warning in Envoy's log naming the odd server, and
//!   `llmroute_fleet_warnings_total` counts it.
//! - An identical fleet gets no warning, after checks have run (`llmroute_fleet_checks_total`).
//! - One root context checks per interval whatever the worker count: each server sees one `/props` per check.

use std::time::{Duration, Instant};

use llmroute_harness::envoy::{Envoy, EnvoyOptions};
use llmroute_harness::fleet::{single_backend_config, Fleet};

use crate::support::*;

const WARNINGS: &str = "wasmcustom.llmroute_fleet_warnings_total";
const CHECKS: &str = "wasmcustom.llmroute_fleet_checks_total";
/// The first check runs a tick after start; a loaded machine gets some slack.
const DEADLINE: Duration = Duration::from_secs(15);

async fn wait_for_stat(envoy: &Envoy, name: &str, at_least: u64) -> u64 {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let value = envoy.stat(name).await.unwrap_or(0);
        if value >= at_least {
            return value;
        }
        assert!(Instant::now() < deadline, "{name} stayed at {value} for {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first line of Envoy's log with "fleet check" and `needle`, once Envoy has flushed it to its file.
async fn wait_for_log_line(envoy: &Envoy, needle: &str) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let log = envoy.log();
        if let Some(line) = log.lines().find(|l| l.contains("fleet check") && l.contains(needle)) {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no fleet-check warning with {needle:?} in Envoy's log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn props_requests(fleet: &Fleet) -> Vec<usize> {
    fleet
        .engines
        .iter()
        .map(|e| e.requests().iter().filter(|r| r.path == "/props").count())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_another_context_size_is_warned_about_and_counted() {
    let fleet = Fleet::start_with("llama-a", 3, |_| {}).await.unwrap();
    let odd = Fleet::start_with("llama-odd", 1, |o| o.n_ctx = 2048).await.unwrap();
    let mut config = single_backend_config(&fleet, ALIAS, UPSTREAM, 150);
    let mut endpoints = fleet.endpoints();
    endpoints.insert(1, odd.endpoints()[0].clone());
    config["backends"][0]["endpoints"] = endpoints.clone().into();
    let envoy = Envoy::start(config).await.unwrap();

    let warnings = wait_for_stat(&envoy, WARNINGS, 1).await;
    let line = wait_for_log_line(&envoy, "disagree on n_ctx").await;
    assert!(line.contains("warning"), "logged as a warning: {line}");
    assert!(line.contains(&format!("2048 at {}", endpoints[1])), "{line}");
    assert!(line.contains("backend llama-a"), "{line}");
    assert!(!line.contains("total_slots"), "only n_ctx differs: {line}");
    eprintln!("{warnings} warning(s): {line}");

    // Traffic is routed as usual meanwhile.
    let (status, _, body) = post(&client(), &envoy, &chat(Some("You are a pirate."), "Hello"), &[]).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_fleet_is_checked_once_per_interval_without_warnings() {
    let fleet = Fleet::start("llama-a", 3).await.unwrap();
    let opts = EnvoyOptions {
        concurrency: 4,
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start_with(single_backend_config(&fleet, ALIAS, UPSTREAM, 150), opts)
        .await
        .unwrap();
    let checks = wait_for_stat(&envoy, CHECKS, 1).await;
    let seen = props_requests(&fleet);
    eprintln!("{checks} check(s); /props requests per server: {seen:?}");
    // Five root contexts (main thread and four workers) tick, yet each check reads each server once.
    for n in &seen {
        assert!(
            (1..=checks as usize + 1).contains(n),
            "{seen:?} /props requests after {checks} check(s)"
        );
    }
    assert_eq!(envoy.stat(WARNINGS).await, Some(0));
    assert!(!envoy.log().contains("fleet check:"), "{}", envoy.log());
}
