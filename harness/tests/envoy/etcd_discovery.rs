//! Backends discovered through etcd (`discovery: { eds_path, etcd }`), with a real etcd, the real `llmroute
//! discover` and `llmroute register` processes, and the real filter in Envoy: instances registered with plain
//! `etcdctl` get traffic within 2 s; a revoked or an expired lease takes its host out with no failed request
//! under load; while etcd is down nothing changes, and changes flow again once it is back; `register` revokes
//! its lease as soon as the engine's health URL fails; a registration's `slots` weighs its host in `bounded_keys`
//! placement ahead of what `/props` reports; with etcd requiring client certificates, `discover` and `register`
//! reach it with theirs (`discovery.etcd.tls`, `--ca-file`/`--cert-file`/`--key-file`), and a `register`
//! without one never registers.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llmroute_harness::certs::{PkiFiles, TestPki};
use llmroute_harness::envoy::Envoy;
use llmroute_harness::etcd::{CliProcess, Etcd};
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::support::*;

const BACKEND: &str = "llama-etcd";
const PREFIX: &str = "/llmroute/backends/llama-etcd";

/// The config with `etcd` as the backend's discovery source, reached with `tls`'s CA and client certificate when
/// given.
fn config(etcd: &Etcd, eds: &Path, tls: Option<&PkiFiles>) -> Value {
    let mut cfg = json!({
        "version": 1,
        "backends": [{
            "name": BACKEND,
            "kind": "llamacpp",
            "discovery": {
                "eds_path": eds.display().to_string(),
                "etcd": {"endpoints": [etcd.url()], "prefix": PREFIX, "allow_loopback": true},
            },
            "lb": "chwbl",
            "balance_factor": 150,
            "health": {"interval_ms": 200, "timeout_ms": 150, "unhealthy": 2, "healthy": 1},
        }],
        "models": [{"name": ALIAS, "routes": [{"backend": BACKEND, "upstream_model": UPSTREAM}]}],
        "affinity": {"placement": "bounded_keys"},
        "retries": {"attempts": 2},
        "debug_headers": true,
    });
    if let Some(f) = tls {
        cfg["backends"][0]["discovery"]["etcd"]["tls"] =
            json!({"ca_file": f.ca_file, "cert_file": f.client_cert_file, "key_file": f.client_key_file});
    }
    cfg
}

/// Everything a test runs: etcd, the engines, `discover`, Envoy. Dropped in reverse order.
struct Setup {
    envoy: Envoy,
    discover: CliProcess,
    fleet: Fleet,
    etcd: Etcd,
    stats: std::path::PathBuf,
    eds: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// Starts etcd and three engines, registers `initial` of them with `etcdctl` on a 60 s lease, then `discover`
/// and Envoy, and waits until the filter sees them.
async fn setup(initial: usize) -> Setup {
    let fleet = Fleet::start(BACKEND, 3).await.unwrap();
    setup_fleet(fleet, &vec![2; initial]).await
}

/// As [`setup`], with `fleet`'s first engines registered with `slots`, one entry each.
async fn setup_fleet(fleet: Fleet, slots: &[u32]) -> Setup {
    setup_on(fleet, slots, Etcd::start().await.unwrap(), None).await
}

/// As [`setup_fleet`], on `etcd`, which `discover` reaches with `tls` when given.
async fn setup_on(fleet: Fleet, slots: &[u32], etcd: Etcd, tls: Option<&PkiFiles>) -> Setup {
    let initial = slots.len();
    let addrs = fleet.endpoints();
    let lease = etcd.grant(60).unwrap();
    for (a, n) in addrs.iter().zip(slots) {
        etcd.ctl(&[
            "put",
            &format!("--lease={lease}"),
            &format!("{PREFIX}/{a}"),
            &format!(r#"{{"slots": {n}}}"#),
        ])
        .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let eds = dir.path().join("llama-etcd.eds.json");
    let stats = dir.path().join("stats.json");
    let cfg_path = dir.path().join("llmroute.json");
    std::fs::write(&cfg_path, config(&etcd, &eds, tls).to_string()).unwrap();
    let discover = CliProcess::start(&[
        "discover",
        cfg_path.to_str().unwrap(),
        "--stats",
        stats.to_str().unwrap(),
    ])
    .unwrap();
    let written = wait_for(Duration::from_secs(10), || async { eds_hosts(&eds).len() == initial }).await;
    assert!(
        written.is_some(),
        "discover never wrote {initial} hosts:\n{}",
        discover.log()
    );
    let envoy = Envoy::start(config(&etcd, &eds, tls)).await.unwrap();
    wait_hosts(&envoy, initial as u64).await;
    Setup {
        envoy,
        discover,
        fleet,
        etcd,
        stats,
        eds,
        _dir: dir,
    }
}

/// The addresses in the EDS file `discover` wrote.
fn eds_hosts(path: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        return Vec::new();
    };
    v["resources"][0]["endpoints"][0]["lb_endpoints"]
        .as_array()
        .map(|eps| {
            eps.iter()
                .map(|e| {
                    let s = &e["endpoint"]["address"]["socket_address"];
                    format!("{}:{}", s["address"].as_str().unwrap_or(""), s["port_value"])
                })
                .collect()
        })
        .unwrap_or_default()
}

fn stats(path: &Path) -> Value {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .map(|v| v[BACKEND].clone())
        .unwrap_or_default()
}

async fn backend_status(envoy: &Envoy) -> Value {
    status_page(envoy)
        .await
        .map(|v| v["backends"][0].clone())
        .unwrap_or_default()
}

/// Waits until Envoy's admin lists exactly `n` hosts of the backend, all healthy.
async fn wait_hosts(envoy: &Envoy, n: u64) {
    let ok = wait_for(Duration::from_secs(15), || async {
        let b = backend_status(envoy).await;
        b["total_hosts"] == n && b["healthy_hosts"] == n
    })
    .await;
    assert!(
        ok.is_some(),
        "Envoy never had {n} healthy hosts; last status: {:#}",
        backend_status(envoy).await
    );
}

/// One request for tenant `t`: (status, engine). A body cut mid-way reads as status 0.
async fn send(c: &reqwest::Client, envoy: &Envoy, t: usize) -> (u16, String) {
    let body = chat(Some(&format!("You are the assistant of etcd tenant {t}.")), "hi");
    let Ok(resp) = c
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
    else {
        return (0, String::new());
    };
    let engine = resp
        .headers()
        .get("x-emu-backend")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let status = resp.status().as_u16();
    (if resp.bytes().await.is_ok() { status } else { 0 }, engine)
}

/// Steady load: `workers` loops of at most `cap` requests each, until `stop`. Returns every (engine, status).
type Outcomes = Arc<Mutex<Vec<(String, u16)>>>;
fn load(envoy: &Envoy, stop: &Arc<AtomicBool>, workers: usize, cap: usize) -> (Outcomes, Vec<JoinHandle<()>>) {
    let outcomes: Outcomes = Arc::default();
    let url = envoy.url("/v1/chat/completions");
    let handles = (0..workers)
        .map(|w| {
            let (stop, outcomes, url) = (stop.clone(), outcomes.clone(), url.clone());
            tokio::spawn(async move {
                let c = client();
                for i in 0..cap {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let body = chat(Some(&format!("load tenant {}", w * 100 + i % 7)), "hi");
                    let r = c
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.to_string())
                        .send()
                        .await;
                    let (engine, status) = match r {
                        Ok(r) => {
                            let e = r
                                .headers()
                                .get("x-emu-backend")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_string();
                            let s = r.status().as_u16();
                            (e, if r.bytes().await.is_ok() { s } else { 0 })
                        }
                        Err(_) => (String::new(), 0),
                    };
                    outcomes.lock().unwrap().push((engine, status));
                }
            })
        })
        .collect();
    (outcomes, handles)
}

async fn finish(stop: &Arc<AtomicBool>, outcomes: &Outcomes, handles: Vec<JoinHandle<()>>, min: usize) {
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.unwrap();
    }
    let outcomes = outcomes.lock().unwrap();
    let failed: Vec<_> = outcomes.iter().filter(|(_, s)| *s != 200).collect();
    assert!(
        outcomes.len() >= min,
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

/// Sends requests for new tenants until one reaches `engine`; how long that took from `since`.
async fn first_request_on(envoy: &Envoy, engine: &str, since: Instant, limit: Duration) -> Option<Duration> {
    let c = client();
    let mut t = 10_000;
    while since.elapsed() < limit {
        let (status, on) = send(&c, envoy, t).await;
        if status == 200 && on == engine {
            return Some(since.elapsed());
        }
        t += 1;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_instances_join_within_2s_and_leave_on_revoke_or_expiry_under_load() {
    let s = setup(2).await;
    let addrs = s.fleet.endpoints();
    // The metadata's `slots` reaches Envoy as the host's weight.
    let admin = reqwest::get(s.envoy.admin_url("/clusters"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        admin.contains(&format!("{BACKEND}::{}::weight::2", addrs[0])),
        "{admin}"
    );
    let (e0, e2) = (
        s.fleet.engines[0].name().to_string(),
        s.fleet.engines[2].name().to_string(),
    );

    // A third instance registers with plain etcdctl, its lease kept alive by `etcdctl lease keep-alive`.
    let lease = s.etcd.grant(2).unwrap();
    let mut keepalive = s.etcd.etcdctl();
    let mut keepalive = keepalive
        .args(["lease", "keep-alive", &lease])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let put = Instant::now();
    s.etcd
        .ctl(&[
            "put",
            &format!("--lease={lease}"),
            &format!("{PREFIX}/{}", addrs[2]),
            "",
        ])
        .unwrap();
    let took = first_request_on(&s.envoy, &e2, put, Duration::from_secs(2)).await;
    assert!(
        took.is_some(),
        "no request reached the new instance within 2 s; EDS file {:?}; status {:#}\ndiscover:\n{}",
        eds_hosts(&s.eds),
        backend_status(&s.envoy).await,
        s.discover.log()
    );
    wait_hosts(&s.envoy, 3).await;

    // Under load: the first instance's lease is revoked, then the third one's expires.
    let stop = Arc::new(AtomicBool::new(false));
    let (outcomes, handles) = load(&s.envoy, &stop, 4, 5000);
    wait_for(Duration::from_secs(5), || async {
        outcomes.lock().unwrap().len() >= 20
    })
    .await;
    let revoked = s.etcd.ctl(&["get", "--prefix", PREFIX, "--keys-only"]).unwrap();
    assert!(revoked.contains(&addrs[0]), "{revoked}");
    // The first two share one lease: move the second to its own lease first, so the revoke takes only the first.
    let own = s.etcd.grant(60).unwrap();
    s.etcd
        .ctl(&[
            "put",
            &format!("--lease={own}"),
            &format!("{PREFIX}/{}", addrs[1]),
            r#"{"slots": 2}"#,
        ])
        .unwrap();
    let shared = lease_of(&s.etcd, &format!("{PREFIX}/{}", addrs[0]));
    s.etcd.ctl(&["lease", "revoke", &shared]).unwrap();
    wait_hosts(&s.envoy, 2).await;
    assert!(!eds_hosts(&s.eds).contains(&addrs[0]));
    let gone_at = outcomes.lock().unwrap().len();

    let _ = keepalive.kill();
    let _ = keepalive.wait();
    let expired = wait_for(Duration::from_secs(10), || async {
        eds_hosts(&s.eds) == [addrs[1].clone()]
    })
    .await;
    assert!(
        expired.is_some(),
        "the expired lease's host stayed: {:?}",
        eds_hosts(&s.eds)
    );
    wait_hosts(&s.envoy, 1).await;
    // More load after the expiry, all of it on the one host left.
    let after = outcomes.lock().unwrap().len();
    let more = wait_for(Duration::from_secs(10), || async {
        outcomes.lock().unwrap().len() >= after + 40
    })
    .await;
    assert!(more.is_some(), "the load stopped early");
    {
        // A request in flight at a removal may still finish on the removed host; skip a few per worker.
        let o = outcomes.lock().unwrap();
        let late: Vec<_> = o[after + 8..].iter().filter(|(e, _)| *e == e0 || *e == e2).collect();
        assert!(late.is_empty(), "requests still reached a removed host: {late:?}");
        assert!(
            !o[gone_at + 8..].iter().any(|(e, _)| *e == e0),
            "the revoked host still got traffic"
        );
    }
    finish(&stop, &outcomes, handles, 80).await;
    let st = stats(&s.stats);
    assert_eq!(st["hosts"], 1, "{st}");
    assert!(st["writes"].as_u64() >= Some(4), "{st}");
}

/// The lease id (hex, as etcdctl takes it) of `key`.
fn lease_of(etcd: &Etcd, key: &str) -> String {
    let out = etcd.ctl(&["get", key, "-w", "json"]).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let id = v["kvs"][0]["lease"].as_i64().unwrap();
    format!("{id:x}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_changes_nothing_and_later_changes_flow_again() {
    let mut s = setup(2).await;
    let addrs = s.fleet.endpoints();
    let before = std::fs::read_to_string(&s.eds).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (outcomes, handles) = load(&s.envoy, &stop, 3, 5000);

    s.etcd.stop();
    let noticed = wait_for(Duration::from_secs(15), || async {
        stats(&s.stats)["connected"] == false && stats(&s.stats)["etcd_errors"].as_u64() >= Some(2)
    })
    .await;
    assert!(
        noticed.is_some(),
        "discover never noticed etcd went away: {}",
        stats(&s.stats)
    );
    // While etcd is down: the file, Envoy's hosts and the traffic stay as they were.
    let during = outcomes.lock().unwrap().len();
    wait_for(Duration::from_secs(10), || async {
        outcomes.lock().unwrap().len() >= during + 40
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(&s.eds).unwrap(),
        before,
        "the EDS file changed during the outage"
    );
    let b = backend_status(&s.envoy).await;
    assert_eq!(
        (b["total_hosts"].as_u64(), b["healthy_hosts"].as_u64()),
        (Some(2), Some(2)),
        "{b}"
    );
    assert!(s.discover.running(), "discover exited:\n{}", s.discover.log());

    // etcd comes back (same data): discover reconnects, and a new registration flows through.
    s.etcd.restart().await.unwrap();
    let back = wait_for(Duration::from_secs(15), || async {
        stats(&s.stats)["connected"] == true && stats(&s.stats)["reconnects"].as_u64() >= Some(1)
    })
    .await;
    assert!(
        back.is_some(),
        "discover never reconnected: {}\n{}",
        stats(&s.stats),
        s.discover.log()
    );
    let lease = s.etcd.grant(60).unwrap();
    s.etcd
        .ctl(&[
            "put",
            &format!("--lease={lease}"),
            &format!("{PREFIX}/{}", addrs[2]),
            "",
        ])
        .unwrap();
    wait_hosts(&s.envoy, 3).await;
    let e2 = s.fleet.engines[2].name().to_string();
    let reached = first_request_on(&s.envoy, &e2, Instant::now(), Duration::from_secs(5)).await;
    assert!(
        reached.is_some(),
        "no request reached the instance registered after the outage"
    );
    finish(&stop, &outcomes, handles, 60).await;
}

/// The keys under the prefix, with their lease (0 for none).
async fn keys(etcd: &Etcd) -> Vec<(String, i64)> {
    let Ok(out) = etcd.ctl(&["get", "--prefix", PREFIX, "-w", "json"]) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&out).unwrap_or_default();
    v["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| {
                    let key = kv["key"].as_str().unwrap_or_default();
                    use base64::Engine;
                    let key = base64::engine::general_purpose::STANDARD
                        .decode(key)
                        .unwrap_or_default();
                    (
                        String::from_utf8_lossy(&key).into_owned(),
                        kv["lease"].as_i64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `llmroute register` for the engine at `addr` (its health URL at `health`) on `etcd`, refreshing every 200 ms,
/// with `extra` flags.
fn register(etcd: &Etcd, addr: &str, health: &str, extra: &[&str]) -> CliProcess {
    let (url, health) = (etcd.url(), format!("http://{health}/health"));
    let mut args = vec![
        "register",
        "--etcd",
        &url,
        "--prefix",
        PREFIX,
        "--addr",
        addr,
        "--health",
        &health,
        "--interval-ms",
        "200",
    ];
    args.extend_from_slice(extra);
    CliProcess::start(&args).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_revokes_its_lease_when_the_health_url_fails() {
    let etcd = Etcd::start().await.unwrap();
    let fleet = Fleet::start(BACKEND, 1).await.unwrap();
    let addr = fleet.endpoints()[0].clone();
    let key = format!("{PREFIX}/{addr}");
    let register = register(
        &etcd,
        &addr,
        &addr,
        &["--ttl", "30", "--metadata", r#"{"slots": 4, "zone": "rack-1"}"#],
    );
    let registered = wait_for(Duration::from_secs(10), || async {
        keys(&etcd).await.iter().any(|(k, lease)| *k == key && *lease != 0)
    })
    .await;
    assert!(registered.is_some(), "never registered:\n{}", register.log());
    let value = etcd.ctl(&["get", &key, "--print-value-only"]).unwrap();
    assert_eq!(serde_json::from_str::<Value>(value.trim()).unwrap()["slots"], 4);

    // The health URL fails: the key goes long before the 30 s TTL could run out, so by revocation.
    fleet.engines[0].set_health_status(503);
    let gone = wait_for(Duration::from_secs(5), || async { keys(&etcd).await.is_empty() }).await;
    assert!(
        gone.is_some(),
        "the key stayed after the health URL failed:\n{}",
        register.log()
    );
    assert!(gone.unwrap() < Duration::from_secs(3), "took {gone:?}");
    assert!(register.log().contains("revoked the lease"), "{}", register.log());

    // Healthy again: registered again, with a new lease.
    fleet.engines[0].set_health_status(200);
    let again = wait_for(Duration::from_secs(5), || async {
        keys(&etcd).await.iter().any(|(k, lease)| *k == key && *lease != 0)
    })
    .await;
    assert!(again.is_some(), "not registered again:\n{}", register.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_slots_weigh_placement_over_what_props_reports() {
    // Every engine answers /props with total_slots 2, but the third registers with slots 6: the registration
    // wins (config slots > registered slots > /props > 1), so it takes its share of new keys, 6 of 10.
    let fleet = Fleet::start_with(BACKEND, 3, |o| o.total_slots = 2).await.unwrap();
    let s = setup_fleet(fleet, &[2, 2, 6]).await;
    let addrs = s.fleet.endpoints();
    let checked = wait_for(Duration::from_secs(15), || async {
        s.envoy.stat("wasmcustom.llmroute_fleet_checks_total").await >= Some(1)
    })
    .await;
    assert!(checked.is_some(), "no /props round:\n{}", s.envoy.log());
    // The filter indexes a discovered backend's hosts in address order.
    let mut sorted = addrs.clone();
    sorted.sort();
    let weights: Vec<u32> = sorted.iter().map(|a| if *a == addrs[2] { 6 } else { 2 }).collect();
    let mut predict =
        crate::placement::Predictor::with(&config(&s.etcd, &s.eds, None), ALIAS, sorted.clone(), &weights);
    let c = client();
    for t in 0..12 {
        let body = chat(Some(&format!("You are the assistant of etcd tenant {t}.")), "hi");
        let want = predict.next_for(&body);
        let r = post_json(&c, s.envoy.url("/v1/chat/completions"), body.to_string(), &[]).await;
        assert_eq!(r.status, 200, "tenant {t}");
        let engine = r.header("x-emu-backend").unwrap_or_default();
        let at = s
            .fleet
            .engines
            .iter()
            .position(|e| e.name() == engine)
            .map(|i| &addrs[i]);
        assert_eq!(
            at,
            Some(&sorted[want.host]),
            "tenant {t}: the core predicts {want:?} over {sorted:?} weighing {weights:?}\n{}",
            s.envoy.log()
        );
    }
    let big = sorted.iter().position(|a| *a == addrs[2]).unwrap();
    let counts = predict.live_keys();
    let others = counts.iter().enumerate().filter(|(i, _)| *i != big).map(|(_, n)| *n);
    assert!(counts[big] >= 6 && others.clone().all(|n| n <= 3), "{counts:?}");
}

/// etcd serving TLS and requiring client certificates (`--client-cert-auth`): `discover` follows it through the
/// backend's `discovery.etcd.tls` and `register` writes to it with `--ca-file`, `--cert-file` and `--key-file`, so
/// the engine it registers gets traffic; a `register` with the right CA but no client certificate is refused at
/// the handshake, says so in its log, and never registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_and_register_reach_an_etcd_that_requires_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let files = TestPki::generate(&[]).unwrap().write(dir.path()).unwrap();
    let etcd = Etcd::start_mtls(files.clone()).await.unwrap();
    assert!(etcd.url().starts_with("https://"));
    let fleet = Fleet::start(BACKEND, 2).await.unwrap();
    // `discover` finds the instance etcdctl put (over TLS, with its client certificate).
    let s = setup_on(fleet, &[2], etcd, Some(&files)).await;
    let addrs = s.fleet.endpoints();
    let [ca, cert, key] =
        [&files.ca_file, &files.client_cert_file, &files.client_key_file].map(|p| p.to_str().unwrap());
    let tls = ["--ca-file", ca, "--cert-file", cert, "--key-file", key];
    let registered = register(&s.etcd, &addrs[1], &addrs[1], &tls);
    wait_hosts(&s.envoy, 2).await;
    let since = Instant::now();
    let reached = first_request_on(&s.envoy, s.fleet.engines[1].name(), since, Duration::from_secs(10)).await;
    assert!(
        reached.is_some(),
        "nothing reached the registered engine:\n{}",
        registered.log()
    );

    // The right CA, no client certificate: the handshake is refused, and nothing is registered.
    let stray = "127.0.0.1:9";
    let refused = register(&s.etcd, stray, &addrs[0], &["--ca-file", ca]);
    let said = wait_for(Duration::from_secs(10), || async {
        refused.log().contains("llmroute register: etcd:")
    })
    .await;
    assert!(said.is_some(), "no etcd failure logged:\n{}", refused.log());
    println!("without a client certificate: {}", refused.log().trim());
    // With TLS 1.3 the client may finish its side of the handshake and send the request before etcd's refusal
    // arrives: it then reads the alert, or finds the connection torn down under it.
    let log = refused.log();
    assert!(
        ["fatal alert", "Broken pipe", "Connection reset"]
            .iter()
            .any(|s| log.contains(s)),
        "etcd refused the handshake:\n{log}"
    );
    let stored: Vec<String> = keys(&s.etcd).await.into_iter().map(|(k, _)| k).collect();
    assert!(!stored.contains(&format!("{PREFIX}/{stray}")), "{stored:?}");
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert_eq!(eds_hosts(&s.eds).len(), 2);
}

/// `discover` for `cfg` (written to a file in `dir`) with `env`, its stats at `dir/<name>.stats.json`.
fn discover(dir: &Path, name: &str, cfg: &Value, env: &[(&str, &str)]) -> (CliProcess, std::path::PathBuf) {
    let cfg_path = dir.join(format!("{name}.json"));
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let stats = dir.join(format!("{name}.stats.json"));
    let args = [
        "discover",
        cfg_path.to_str().unwrap(),
        "--stats",
        stats.to_str().unwrap(),
    ];
    (CliProcess::start_with_env(&args, env).unwrap(), stats)
}

/// The `load_balancing_weight` of `addr` in the EDS file at `path`.
fn eds_weight(path: &Path, addr: &str) -> Option<u64> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    let eps = v["resources"][0]["endpoints"][0]["lb_endpoints"].as_array()?.clone();
    eps.into_iter().find_map(|e| {
        let s = &e["endpoint"]["address"]["socket_address"];
        let at = format!("{}:{}", s["address"].as_str()?, s["port_value"]);
        (at == addr).then(|| e["load_balancing_weight"].as_u64())?
    })
}

/// Anyone who can write under the prefix can register an address: `discover` refuses loopback (unless the
/// backend allows it), link-local (the cloud metadata address) and Envoy's own admin address, logs and counts each
/// refusal, and cuts a weight above `max_weight`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_refuses_loopback_and_link_local_registrations_unless_allowed() {
    let etcd = Etcd::start().await.unwrap();
    let lease = etcd.grant(60).unwrap();
    let put = |addr: &str, value: &str| {
        etcd.ctl(&["put", &format!("--lease={lease}"), &format!("{PREFIX}/{addr}"), value])
            .unwrap();
    };
    put("10.0.0.5:8080", r#"{"weight": 1000}"#);
    put("127.0.0.1:18080", "");
    put("169.254.169.254:80", "");
    put("127.0.0.1:9901", "");
    let dir = tempfile::tempdir().unwrap();
    let eds = dir.path().join("refused.eds.json");
    let mut cfg = config(&etcd, &eds, None);
    cfg["backends"][0]["discovery"]["etcd"]
        .as_object_mut()
        .unwrap()
        .remove("allow_loopback");
    let (strict, strict_stats) = discover(dir.path(), "strict", &cfg, &[]);
    let counted = wait_for(Duration::from_secs(10), || async {
        let st = stats(&strict_stats);
        st["refused"].as_u64() >= Some(3) && st["capped"].as_u64() >= Some(1)
    })
    .await;
    assert!(counted.is_some(), "{}\n{}", stats(&strict_stats), strict.log());
    assert_eq!(eds_hosts(&eds), ["10.0.0.5:8080"], "{}", strict.log());
    assert_eq!(eds_weight(&eds, "10.0.0.5:8080"), Some(256), "the default max_weight");
    let log = strict.log();
    for (addr, why) in [
        (
            "127.0.0.1:18080",
            "a loopback address; set `discovery.etcd.allow_loopback: true`",
        ),
        ("169.254.169.254:80", "a link-local address"),
        ("127.0.0.1:9901", "Envoy's own admin address"),
    ] {
        assert!(
            log.contains(&format!("refused {PREFIX}/{addr}: {why}")),
            "{addr}:\n{log}"
        );
    }
    assert!(log.contains("asked for weight 1000; cut to max_weight 256"), "{log}");
    assert_eq!(stats(&strict_stats)["rejected"], 0, "refusals are not malformed keys");

    // With loopback allowed, the loopback engine joins; link-local and Envoy's admin stay out.
    let eds_open = dir.path().join("open.eds.json");
    let (open, open_stats) = discover(dir.path(), "open", &config(&etcd, &eds_open, None), &[]);
    let joined = wait_for(Duration::from_secs(10), || async {
        eds_hosts(&eds_open) == ["10.0.0.5:8080", "127.0.0.1:18080"]
    })
    .await;
    assert!(joined.is_some(), "{:?}\n{}", eds_hosts(&eds_open), open.log());
    assert!(stats(&open_stats)["refused"].as_u64() >= Some(2));
    assert!(!open.log().contains("127.0.0.1:18080: a loopback"), "{}", open.log());
}

const ETCD_USER: &str = "llmroute";
const ETCD_PASSWORD: &str = "etcd-pw-5b1e";
const PASSWORD_VAR: &str = "LLMROUTE_TEST_ETCD_PASSWORD";

/// etcd with `auth enable`: `discover` (`discovery.etcd.auth`) and `register` (`--user`, `--password-env`) work
/// with the password from the named variable, also after etcd forgot their tokens (a restart); without the
/// password, or with a wrong one, they fail with a clear message and register nothing. The password never
/// reaches their logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_and_register_authenticate_to_an_etcd_with_users() {
    let mut etcd = Etcd::start().await.unwrap();
    etcd.enable_auth("root-pw-77", ETCD_USER, ETCD_PASSWORD, "/llmroute/")
        .unwrap();
    let fleet = Fleet::start(BACKEND, 2).await.unwrap();
    let addrs = fleet.endpoints();
    let dir = tempfile::tempdir().unwrap();
    let eds = dir.path().join("auth.eds.json");
    let mut cfg = config(&etcd, &eds, None);
    cfg["backends"][0]["discovery"]["etcd"]["auth"] = json!({"user": ETCD_USER, "password_env": PASSWORD_VAR});
    let env = [(PASSWORD_VAR, ETCD_PASSWORD)];
    let (disc, _) = discover(dir.path(), "auth", &cfg, &env);
    let auth_flags = ["--user", ETCD_USER, "--password-env", PASSWORD_VAR];
    let url = etcd.url();
    let reg = |addr: &str, env: &[(&str, &str)], extra: &[&str]| {
        let health = format!("http://{addr}/health");
        let mut args = vec![
            "register",
            "--etcd",
            &url,
            "--prefix",
            PREFIX,
            "--addr",
            addr,
            "--health",
            &health,
            "--interval-ms",
            "200",
        ];
        args.extend_from_slice(extra);
        CliProcess::start_with_env(&args, env).unwrap()
    };
    let first = reg(&addrs[0], &env, &auth_flags);
    let seen = wait_for(Duration::from_secs(10), || async {
        eds_hosts(&eds) == [addrs[0].clone()]
    })
    .await;
    assert!(seen.is_some(), "register:\n{}\ndiscover:\n{}", first.log(), disc.log());

    // No password: `register` says etcd wants a user, and writes nothing; `discover` stops at once, naming the
    // variable. A wrong password is refused by etcd, and said so.
    let anonymous = reg(&addrs[1], &[], &[]);
    let wrong = reg(&addrs[1], &[(PASSWORD_VAR, "not-the-password")], &auth_flags);
    let said = wait_for(Duration::from_secs(10), || async {
        anonymous.log().contains("give a user and its password") && wrong.log().contains("authentication failed")
    })
    .await;
    assert!(
        said.is_some(),
        "anonymous:\n{}\nwrong:\n{}",
        anonymous.log(),
        wrong.log()
    );
    let (mut unset, _) = discover(dir.path(), "unset", &cfg, &[]);
    let unset_running = std::cell::RefCell::new(&mut unset);
    let stopped = wait_for(Duration::from_secs(10), || async {
        !unset_running.borrow_mut().running()
    })
    .await;
    assert!(stopped.is_some(), "discover ran without its password");
    assert!(
        unset.log().contains(&format!(
            "discovery.etcd.auth.password_env {PASSWORD_VAR}: the variable is not set"
        )),
        "{}",
        unset.log()
    );
    let stored = etcd.ctl(&["get", "--prefix", PREFIX, "--keys-only"]).unwrap();
    assert!(!stored.contains(&addrs[1]), "{stored}");
    drop((anonymous, wrong));

    // etcd restarts and forgets every token: both clients authenticate again.
    etcd.restart().await.unwrap();
    let second = reg(&addrs[1], &env, &auth_flags);
    let both = wait_for(Duration::from_secs(15), || async { eds_hosts(&eds).len() == 2 }).await;
    assert!(
        both.is_some(),
        "{:?}\ndiscover:\n{}\nregister:\n{}",
        eds_hosts(&eds),
        disc.log(),
        second.log()
    );
    for log in [disc.log(), first.log(), second.log()] {
        assert!(!log.contains(ETCD_PASSWORD), "{log}");
    }
}
