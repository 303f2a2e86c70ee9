//! Backends whose hosts Envoy discovers (`discovery: { eds_path }`), through the real filter in Envoy with
//! file-based EDS: the hosts join and leave while traffic flows, no request fails, known keys stay on their
//! hosts, new keys reach a new host, a removed host's keys are placed again, and `/llmroute/status` follows the
//! membership. Also: a backend named like an Istio cluster (`outbound|8000||llama.ns.svc.cluster.local`) routes
//! end to end and its metrics carry a sane `backend` label.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llmroute_harness::envoy::{Envoy, NATIVE_PROMETHEUS_PREFIX};
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::*;

const BACKEND: &str = "llama-d";

/// Writes the EDS file for `cluster` with `addrs`, atomically (write, then rename), as Envoy's file watch needs.
pub(crate) fn write_eds(path: &Path, cluster: &str, version: u32, addrs: &[String]) {
    let endpoints: Vec<Value> = addrs
        .iter()
        .map(|a| {
            let (host, port) = a.rsplit_once(':').unwrap();
            json!({"endpoint": {"address": {"socket_address": {"address": host, "port_value": port.parse::<u16>().unwrap()}}}})
        })
        .collect();
    let doc = json!({
        "version_info": version.to_string(),
        "resources": [{
            "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "cluster_name": cluster,
            "endpoints": [{"lb_endpoints": endpoints}],
        }],
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, doc.to_string()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn discovered_config(eds: &Path) -> Value {
    json!({
        "version": 1,
        "backends": [{
            "name": BACKEND,
            "kind": "llamacpp",
            "discovery": {"eds_path": eds.display().to_string()},
            "lb": "chwbl",
            "balance_factor": 150,
            "health": {"interval_ms": 300, "timeout_ms": 250, "unhealthy": 2, "healthy": 1},
        }],
        "models": [{"name": ALIAS, "routes": [{"backend": BACKEND, "upstream_model": UPSTREAM}]}],
        "affinity": {"placement": "bounded_keys"},
        "retries": {"attempts": 2},
        "debug_headers": true,
    })
}

/// The backend's entry in `/llmroute/status`.
async fn backend_status(envoy: &Envoy) -> Option<Value> {
    Some(status_page(envoy).await?["backends"][0].clone())
}

/// Waits until the filter's snapshot lists `n` hosts, all healthy and up.
async fn wait_hosts(envoy: &Envoy, n: u64) {
    let ok = wait_for(Duration::from_secs(15), || async {
        let Some(b) = backend_status(envoy).await else {
            return false;
        };
        let hosts = b["hosts"]
            .as_array()
            .map(|h| h.iter().all(|x| x["up"] == true) as u64 * h.len() as u64);
        b["total_hosts"] == n && b["healthy_hosts"] == n && hosts == Some(n)
    })
    .await;
    assert!(
        ok.is_some(),
        "the filter never saw {n} healthy hosts; last status: {:#}",
        backend_status(envoy).await.unwrap_or_default()
    );
}

fn tenant_body(t: usize) -> Value {
    chat(
        Some(&format!("You are the assistant of discovered tenant {t}. Be brief.")),
        "hi",
    )
}

/// One request for tenant `t`: (status, engine name, placement reason).
async fn send(c: &reqwest::Client, envoy: &Envoy, t: usize) -> (u16, String, String) {
    let resp = c
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(tenant_body(t).to_string())
        .send()
        .await;
    let Ok(resp) = resp else {
        return (0, String::new(), String::new());
    };
    let h = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (engine, reason) = (h("x-emu-backend"), h("x-llmroute-placement"));
    let status = resp.status().as_u16();
    // Read the body, so a response cut mid-way counts as a failure too.
    let ok = resp.bytes().await.is_ok();
    (if ok { status } else { 0 }, engine, reason)
}

/// Where tenant `t` lives: the engine of a request that was not spilled (spills go elsewhere by design, and the
/// background load can make one). Asserts every answer is a 200.
async fn home(c: &reqwest::Client, envoy: &Envoy, t: usize) -> (String, String) {
    let mut last = (String::new(), String::new());
    for _ in 0..10 {
        let (status, engine, reason) = send(c, envoy, t).await;
        assert_eq!(status, 200, "tenant {t}");
        if reason != "spilled" {
            return (engine, reason);
        }
        last = (engine, reason);
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_hosts_join_and_leave_under_load() {
    let fleet = Fleet::start(BACKEND, 3).await.unwrap();
    let addrs = fleet.endpoints();
    let dir = tempfile::tempdir().unwrap();
    let eds = dir.path().join("eds.json");
    write_eds(&eds, BACKEND, 1, &addrs[..2]);
    let envoy = Envoy::start(discovered_config(&eds)).await.unwrap();
    wait_hosts(&envoy, 2).await;
    let c = client();

    // Steady load through every change: 4 workers, bounded at 150 requests each, over their own tenants.
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes: Arc<Mutex<Vec<(usize, u16)>>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..4 {
        let (stop, outcomes, c) = (stop.clone(), outcomes.clone(), c.clone());
        let url_envoy = envoy.url("");
        workers.push(tokio::spawn(async move {
            for i in 0..150 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let t = 1000 + w * 10 + i % 5;
                let resp = c
                    .post(format!("{url_envoy}/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .body(tenant_body(t).to_string())
                    .send()
                    .await;
                let status = match resp {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        if r.bytes().await.is_ok() {
                            s
                        } else {
                            0
                        }
                    }
                    Err(_) => 0,
                };
                outcomes.lock().unwrap().push((t, status));
            }
        }));
    }

    // Ten known tenants on the first two hosts.
    let mut homes: HashMap<usize, String> = HashMap::new();
    for t in 0..10 {
        let (engine, _) = home(&c, &envoy, t).await;
        assert!(
            engine == fleet.engines[0].name() || engine == fleet.engines[1].name(),
            "{engine}"
        );
        homes.insert(t, engine);
    }

    // The third host joins.
    write_eds(&eds, BACKEND, 2, &addrs);
    wait_hosts(&envoy, 3).await;
    for t in 0..10 {
        let (engine, reason) = home(&c, &envoy, t).await;
        assert_eq!(engine, homes[&t], "tenant {t} moved when a host joined ({reason})");
    }
    let mut new_on_third = 0;
    for t in 10..22 {
        let (engine, _) = home(&c, &envoy, t).await;
        new_on_third += usize::from(engine == fleet.engines[2].name());
        homes.insert(t, engine);
    }
    assert!(
        new_on_third >= 3,
        "only {new_on_third} of 12 new keys reached the new host"
    );

    // The first host leaves (its engine keeps running: only the membership changes).
    write_eds(&eds, BACKEND, 3, &addrs[1..]);
    wait_hosts(&envoy, 2).await;
    let gone = fleet.engines[0].name().to_string();
    let mut moved = 0;
    for t in 0..22 {
        let (engine, reason) = home(&c, &envoy, t).await;
        assert_ne!(engine, gone, "tenant {t} still reaches the removed host");
        if homes[&t] == gone {
            moved += 1;
            assert_eq!(reason, "moved", "tenant {t} was on the removed host");
        } else {
            assert_eq!(engine, homes[&t], "tenant {t} moved though its host stayed ({reason})");
        }
    }
    assert!(
        moved > 0,
        "no known tenant lived on the removed host: the removal was not exercised"
    );

    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let outcomes = outcomes.lock().unwrap();
    let failed: Vec<_> = outcomes.iter().filter(|(_, s)| *s != 200).collect();
    assert!(
        outcomes.len() >= 40,
        "the load was too light: {} requests",
        outcomes.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        outcomes.len()
    );
}

/// The Prometheus lines of `/stats/prometheus` whose name starts with `metric`.
pub(crate) async fn prometheus(envoy: &Envoy, metric: &str) -> Vec<String> {
    let text = reqwest::get(envoy.admin_url("/stats/prometheus"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The native build's stats carry Envoy's prefix for a namespace it does not strip (see docs/native.md).
    let prefix = if envoy.runs_native() {
        NATIVE_PROMETHEUS_PREFIX
    } else {
        ""
    };
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_cluster_names_route_and_label_metrics() {
    const ISTIO: &str = "outbound|8000||llama.ns.svc.cluster.local";
    const ODD: &str = "odd{name}=\"x\",y";
    let istio = Fleet::start(ISTIO, 2).await.unwrap();
    let odd = Fleet::start(ODD, 1).await.unwrap();
    let config = json!({
        "version": 1,
        "backends": [istio.backend_entry(150), odd.backend_entry(150)],
        "models": [
            {"name": ALIAS, "routes": [{"backend": ISTIO, "upstream_model": UPSTREAM}]},
            {"name": "odd", "routes": [{"backend": ODD, "upstream_model": UPSTREAM}]},
        ],
        "debug_headers": true,
    });
    let envoy = Envoy::start(config).await.unwrap();
    let c = client();
    for (alias, fleet) in [(ALIAS, &istio), ("odd", &odd)] {
        for i in 0..4 {
            let mut body = chat(None, &format!("question {i}"));
            body["model"] = json!(alias);
            let (status, engine, _) = post(&c, &envoy, &body, &[]).await;
            assert_eq!(status, 200, "{alias}");
            assert!(
                fleet.engines.iter().any(|e| e.name() == engine),
                "{alias} answered by {engine:?}"
            );
        }
    }

    let istio_label = format!("backend=\"{ISTIO}\"");
    let odd_token = llmroute_core::config::stat_token(ODD);
    assert!(
        odd_token.starts_with("odd_name__") && odd_token.contains('~'),
        "{odd_token}"
    );
    let odd_label = format!("backend=\"{odd_token}\"");
    let ok = wait_for(Duration::from_secs(10), || async {
        let lines = prometheus(&envoy, "llmroute_tokens_total").await;
        let value = |label: &str| {
            lines
                .iter()
                .find(|l| l.contains(label) && l.contains("kind=\"input\""))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
        };
        value(&istio_label).is_some_and(|v| v > 0.0) && value(&odd_label).is_some_and(|v| v > 0.0)
    })
    .await;
    assert!(
        ok.is_some(),
        "no prompt-token series labelled {istio_label} and {odd_label}:\n{}",
        prometheus(&envoy, "llmroute_tokens_total").await.join("\n")
    );
    // The label is extracted: no series name carries the backend's bytes.
    let text = reqwest::get(envoy.admin_url("/stats/prometheus"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !text
            .lines()
            .filter_map(|l| l.split(['{', ' ']).next())
            .any(|name| name.starts_with("llmroute_") && (name.contains("outbound") || name.contains("odd"))),
        "a backend name leaked into a metric name"
    );

    let status = get_json(&c, envoy.url("/llmroute/status"), &[]).await.body;
    let names: Vec<&str> = status["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["name"].as_str())
        .collect();
    assert_eq!(names, [ISTIO, ODD]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_llamacpp_hosts_are_fleet_checked_and_weighed_by_their_own_slots() {
    // Three engines behind the EDS file, like llama-servers started with -np 1, 1 and 4; the 4-slot one also has
    // another context per slot (2048 instead of 4096).
    let fleet = Fleet::start_with(BACKEND, 3, |o| {
        if o.name.ends_with('2') {
            o.total_slots = 4;
            o.n_ctx = 2048;
        } else {
            o.total_slots = 1;
        }
    })
    .await
    .unwrap();
    let big = fleet
        .engines
        .iter()
        .position(|e| e.name().ends_with('2'))
        .expect("an engine named ...2");
    let addrs = fleet.endpoints();
    let dir = tempfile::tempdir().unwrap();
    let eds = dir.path().join("eds.json");
    write_eds(&eds, BACKEND, 1, &addrs);
    let envoy = Envoy::start(discovered_config(&eds)).await.unwrap();
    wait_hosts(&envoy, 3).await;

    // The check reads every discovered host through the original-destination probe cluster and warns.
    let warned = wait_for(Duration::from_secs(15), || async {
        envoy.stat("wasmcustom.llmroute_fleet_warnings_total").await >= Some(1)
            && envoy.log().lines().any(|l| l.contains("disagree on n_ctx"))
    })
    .await;
    let log = envoy.log();
    assert!(
        warned.is_some(),
        "no fleet-check warning for the discovered hosts:\n{log}"
    );
    let line = log.lines().find(|l| l.contains("disagree on n_ctx")).unwrap();
    assert!(
        line.contains("warning") && line.contains(&format!("backend {BACKEND}")),
        "{line}"
    );
    assert!(line.contains(&format!("2048 at {}", addrs[big])), "{line}");
    for (i, a) in addrs.iter().enumerate().filter(|(i, _)| *i != big) {
        assert!(line.contains(a.as_str()), "host {i} ({a}) missing: {line}");
    }
    let props: Vec<usize> = fleet
        .engines
        .iter()
        .map(|e| e.requests().iter().filter(|r| r.path == "/props").count())
        .collect();
    assert!(props.iter().all(|n| *n >= 1), "/props requests per engine: {props:?}");
    assert!(
        envoy.stat("wasmcustom.llmroute_fleet_checks_total").await >= Some(1),
        "the check completed"
    );

    // The reported total_slots reach placement, by address: with weights 1, 1 and 4 and a balance factor of
    // 150 %, a 1-slot host holds at most 2 of 12 keys, so the 4-slot host holds at least 8 (all equal, at most 6).
    let c = client();
    let mut on_big = 0;
    for t in 0..12 {
        let (engine, _) = home(&c, &envoy, 100 + t).await;
        on_big += usize::from(engine == fleet.engines[big].name());
    }
    assert!(
        on_big >= 8,
        "only {on_big} of 12 keys on the 4-slot host:\n{}",
        envoy.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_steer_the_original_destination_probe_cluster() {
    // The probe cluster connects wherever `x-envoy-original-dst-host` says. Only the filter's own calls may use
    // it: a client naming the cluster and another host must not reach that host.
    let fleet = Fleet::start(BACKEND, 2).await.unwrap();
    let outsider = Fleet::start("outsider", 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let eds = dir.path().join("eds.json");
    write_eds(&eds, BACKEND, 1, &fleet.endpoints());
    let envoy = Envoy::start(discovered_config(&eds)).await.unwrap();
    wait_hosts(&envoy, 2).await;
    let probe = llmroute_core::envoy_contract::discovered_probe_cluster(BACKEND);
    let target = outsider.endpoints()[0].clone();
    let steer = [
        ("x-llmroute-cluster", probe.as_str()),
        ("x-envoy-original-dst-host", target.as_str()),
    ];
    let c = client();
    let (status, engine, body) = post(&c, &envoy, &chat(None, "hi"), &steer).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        fleet.engines.iter().any(|e| e.name() == engine),
        "answered by {engine:?}"
    );
    for path in ["/props", "/v1/models", "/health"] {
        let mut req = c.get(envoy.url(path));
        for (k, v) in steer {
            req = req.header(k, v);
        }
        let status = req.send().await.map(|r| r.status().as_u16());
        eprintln!("GET {path} with steering headers: {status:?}");
    }
    // Meanwhile the filter's own check reads /props from the fleet through that very cluster.
    let checked = wait_for(Duration::from_secs(15), || async {
        fleet
            .engines
            .iter()
            .all(|e| e.requests().iter().any(|r| r.path == "/props"))
    })
    .await;
    assert!(checked.is_some(), "the fleet check never read the discovered hosts");
    let reached: Vec<String> = outsider.engines[0].requests().iter().map(|r| r.path.clone()).collect();
    assert!(
        reached.is_empty(),
        "a client reached {target} through {probe}: {reached:?}"
    );
}
