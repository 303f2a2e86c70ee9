//! Replicas across containers, `envoy/docker-compose.replicas.yaml`, with the local images: two Envoy replicas
//! whose `bounded_keys` placement is shared through a 3-member etcd cluster (the placement store), in front of three
//! llama-servers that `llmroute register` (in each engine's network namespace) keeps registered in that etcd and
//! that `llmroute discover`, beside each Envoy, writes into its EDS file. Each Envoy, each etcd member and each
//! engine is its own container, with its own address on Docker's networks: what one host cannot show.
//!
//! - Set-up: each engine registered at its address on the `engines` network (its name resolved by `register`), and
//!   discovered by both replicas; new keys spread over both replicas are each placed on one engine, created in etcd
//!   once (`won`), with no fallback.
//! - One Envoy cut off from etcd (`docker network disconnect` from `control`): no request fails; each new key's
//!   first request on it falls back, and only there, counted; once reconnected, the keys placed meanwhile converge
//!   on one engine and new keys agree again with no fallback.
//! - The etcd leader cut off: no request fails, known keys stay on their engines, and every engine keeps its
//!   registration (the same leases); once back the member is healthy again and the keys placed meanwhile agree.
//! - A registered engine's container killed with its registrar (its host lost): nothing refreshes or revokes the
//!   lease, which expires after its TTL (not at once, as a revoke would), the engine leaves both replicas'
//!   clusters, and no request fails.
//! - `down --volumes` leaves no container, network or volume (the EDS volumes included).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use base64::Engine as _;
use llmroute_core::envoy_contract::metrics::{labelled, PLACEMENT_STORE};
use llmroute_core::envoy_contract::PLACEMENT_STORE_CLUSTER;
use llmroute_core::key_placement::store::{Fallback, Outcome};
use llmroute_harness::compose::Stack;
use serde_json::Value;

use crate::support::*;

const FILE: &str = "envoy/docker-compose.replicas.yaml";
const BACKEND: &str = "llama-r";
const ENGINES: [&str; 3] = ["llama-r-0", "llama-r-1", "llama-r-2"];
const MEMBERS: [&str; 3] = ["etcd-0", "etcd-1", "etcd-2"];
const REGISTERED: &str = "/llmroute/backends/llama-r/";
/// `register`'s `--ttl` in the compose file, seconds, refreshed every second.
const TTL_S: u64 = 4;

/// `etcdctl ARGS` inside `member`'s container, against that member.
fn etcdctl(stack: &Stack, member: &str, args: &[&str]) -> Result<String, String> {
    let mut all = vec![
        "etcdctl",
        "--endpoints",
        "http://127.0.0.1:2379",
        "--command-timeout",
        "3s",
    ];
    all.extend_from_slice(args);
    stack.exec(member, &all)
}

/// The registered engines (`IP:PORT`) and their lease ids, read through `member`.
fn registrations(stack: &Stack, member: &str) -> BTreeMap<String, i64> {
    let text = etcdctl(stack, member, &["get", "--prefix", REGISTERED, "-w", "json"]).unwrap_or_else(|e| panic!("{e}"));
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let b64 = base64::engine::general_purpose::STANDARD;
    doc["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .filter_map(|kv| {
                    let key = b64.decode(kv["key"].as_str()?).ok()?;
                    let key = String::from_utf8(key).ok()?;
                    Some((
                        key.strip_prefix(REGISTERED)?.to_string(),
                        kv["lease"].as_i64().unwrap_or(0),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// etcd's revision now, read through `member`.
fn revision(stack: &Stack, member: &str) -> i64 {
    let text = etcdctl(
        stack,
        member,
        &["get", "--prefix", REGISTERED, "-w", "json", "--keys-only"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    doc["header"]["revision"]
        .as_i64()
        .unwrap_or_else(|| panic!("no revision in {text}"))
}

/// Follows the registrations from revision `from` on (`etcdctl watch`, through `member`), and answers when `key`
/// is deleted: an event read as etcd sends it, so the time it comes is the time it happened, give or take the
/// watch's own delay.
struct Deletions {
    _child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Deletions {
    fn watch(stack: &Stack, member: &str, from: i64) -> Deletions {
        let from = from.to_string();
        let args = [
            "etcdctl",
            "--endpoints",
            "http://127.0.0.1:2379",
            "watch",
            "--prefix",
            REGISTERED,
            "--rev",
            &from,
        ];
        let mut child = stack
            .exec_command(member, &args)
            .unwrap_or_else(|e| panic!("{e}"))
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("etcdctl watch: {e}"));
        let stdout = child
            .stdout
            .take()
            .unwrap_or_else(|| panic!("etcdctl watch: no output"));
        Deletions {
            _child: child,
            lines: tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout)),
        }
    }

    /// Waits until the watch reports `key` deleted.
    async fn of(&mut self, key: &str) {
        let mut last = String::new();
        while let Ok(Some(line)) = self.lines.next_line().await {
            if last == "DELETE" && line == key {
                return;
            }
            last = line;
        }
        panic!("etcdctl watch ended before {key} was deleted");
    }
}

/// The member that leads the etcd cluster, asked through `via`.
fn leader(stack: &Stack, via: &str) -> String {
    let all = MEMBERS.map(|m| format!("http://{m}:2379")).join(",");
    let text = stack
        .exec(
            via,
            &["etcdctl", "--endpoints", &all, "endpoint", "status", "-w", "json"],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    doc.as_array()
        .and_then(|all| {
            all.iter().find(|s| {
                s["Status"]["header"]["member_id"].as_u64().is_some()
                    && s["Status"]["header"]["member_id"] == s["Status"]["leader"]
            })
        })
        .and_then(|s| s["Endpoint"].as_str())
        .and_then(|e| MEMBERS.iter().find(|m| e.contains(*m)))
        .map(|m| m.to_string())
        .unwrap_or_else(|| panic!("no leader in {text}"))
}

fn store_stat(outcome: &str) -> String {
    format!("wasmcustom.{}", labelled(PLACEMENT_STORE, &[("outcome", outcome)]))
}

/// New keys this replica placed alone because etcd did not settle them (timeouts, errors, callouts not sent).
async fn fallbacks(envoy: &Envoy) -> u64 {
    let mut sum = 0;
    for f in [Fallback::Timeout, Fallback::NotSent, Fallback::Error] {
        sum += envoy.stat(&store_stat(Outcome::Fallback(f).as_str())).await;
    }
    sum
}

async fn outcomes(envoys: &[Envoy]) -> BTreeMap<&'static str, u64> {
    let mut m = BTreeMap::new();
    for o in Outcome::LABELS {
        let mut sum = 0;
        for e in envoys {
            sum += e.stat(&store_stat(o)).await;
        }
        m.insert(o, sum);
    }
    m
}

/// Waits until the filter's own snapshot of `envoy` (`/llmroute/status`) lists `n` healthy hosts of the backend,
/// every one up: `bounded_keys` places on that snapshot.
async fn wait_snapshot(envoy: &Envoy, n: u64) {
    let c = client();
    let mut last = Value::Null;
    let start = Instant::now();
    loop {
        if let Ok(r) = c.get(envoy.url("/llmroute/status")).send().await {
            last = r.json().await.unwrap_or(Value::Null);
        }
        let up = last["snapshot"]["stale"] == false
            && last["backends"].as_array().is_some_and(|bs| {
                bs.iter().any(|b| {
                    b["name"] == BACKEND
                        && b["healthy_hosts"].as_u64() == Some(n)
                        && b["hosts"]
                            .as_array()
                            .is_some_and(|hs| hs.iter().all(|h| h["up"] == true))
                })
            });
        if up {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{}: the filter's snapshot never showed {n} healthy hosts: {last}",
            envoy.service
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `rounds` rounds in which every key is sent at once, key `i` of round `r` to replica `(i + r) % replicas`, so
/// that over as many rounds as replicas every replica sees every key. Every request must succeed. Per key, the
/// engines that held it (requests that spilled off the key's host aside).
async fn rotate(envoys: &[Envoy], keys: &[String], rounds: usize) -> BTreeMap<String, BTreeMap<String, usize>> {
    let c = client();
    let mut held: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for round in 0..rounds {
        let sends = keys.iter().enumerate().map(|(i, k)| {
            let (c, envoy) = (c.clone(), envoys[(i + round) % envoys.len()].clone());
            async move { (k.clone(), envoy.service.clone(), envoy.chat(&c, k).await) }
        });
        for (key, via, a) in futures_util::future::join_all(sends).await {
            assert!(a.ok(), "{key} via {via}: {a:?}");
            if let Some(engine) = a.placed_on() {
                *held.entry(key).or_default().entry(engine.to_string()).or_default() += 1;
            }
        }
    }
    held
}

/// Requests not served by their key's most used engine.
fn disagreements(held: &BTreeMap<String, BTreeMap<String, usize>>) -> usize {
    held.values()
        .map(|by| by.values().sum::<usize>() - by.values().max().copied().unwrap_or(0))
        .sum()
}

/// Waits (30 s at most) until every key goes to one engine whichever replica takes it.
async fn converge(envoys: &[Envoy], keys: &[String]) -> Duration {
    let c = client();
    let took = wait_for(Duration::from_secs(30), || {
        let c = c.clone();
        async move {
            for k in keys {
                let mut engines = BTreeSet::new();
                for e in envoys {
                    let a = e.chat(&c, k).await;
                    assert!(a.ok(), "{k} via {}: {a:?}", e.service);
                    engines.extend(a.placed_on().map(str::to_string));
                }
                if engines.len() > 1 {
                    return false;
                }
            }
            true
        }
    })
    .await;
    took.unwrap_or_else(|| panic!("{keys:?} did not converge on one engine per key within 30 s"))
}

/// Sends fresh batches of 6 new keys over both replicas until one is placed with no fallback and no
/// disagreement (30 s at most): how long it took.
async fn fresh_keys_agree(envoys: &[Envoy], name: &str) -> Duration {
    let start = Instant::now();
    let mut tried = Vec::new();
    for batch in 0.. {
        let fresh = keys(&format!("{name}-{batch}"), 6);
        let mut before = 0;
        for e in envoys {
            before += fallbacks(e).await;
        }
        let held = rotate(envoys, &fresh, 2).await;
        let mut after = 0;
        for e in envoys {
            after += fallbacks(e).await;
        }
        tried.push((disagreements(&held), after - before));
        if disagreements(&held) == 0 && after == before {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "new keys never agreed again; (disagreements, fallbacks) per batch: {tried:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    start.elapsed()
}

/// Each key's engine: the one that held most of its requests.
fn owners(held: &BTreeMap<String, BTreeMap<String, usize>>) -> BTreeMap<String, String> {
    held.iter()
        .filter_map(|(k, by)| Some((k.clone(), by.iter().max_by_key(|(_, n)| **n)?.0.clone())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_in_containers_agree_through_etcd_and_ride_out_partitions_and_a_dead_engine() {
    let stack = start(FILE, "replicas");
    let envoys = [Envoy::of(&stack, "envoy-0"), Envoy::of(&stack, "envoy-1")];
    for e in &envoys {
        e.wait_ready(Duration::from_secs(120)).await;
    }
    let engine_ips: BTreeMap<String, &str> = ENGINES
        .iter()
        .map(|s| {
            (
                format!("{}:8080", stack.ip(s, "engines").unwrap_or_else(|e| panic!("{e}"))),
                *s,
            )
        })
        .collect();
    let want: BTreeSet<String> = engine_ips.keys().cloned().collect();
    for e in &envoys {
        let found = e.wait_healthy(BACKEND, 3, Duration::from_secs(120)).await;
        assert_eq!(
            found, want,
            "{}: the engines, at their addresses on `engines`",
            e.service
        );
        e.wait_healthy(PLACEMENT_STORE_CLUSTER, 3, Duration::from_secs(60))
            .await;
        wait_snapshot(e, 3).await;
    }
    let registered = registrations(&stack, "etcd-0");
    assert_eq!(
        registered.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "each register resolved its engine's name to its address on `engines`"
    );
    println!("set-up: engines registered and discovered by both replicas: {engine_ips:?}");

    // New keys, each sent to both replicas: one engine per key, created in etcd once, no fallback.
    let tenants = keys("tenant", 6);
    let placed = rotate(&envoys, &tenants, 2).await;
    let counts = outcomes(&envoys).await;
    println!("placed through the store: {placed:?}; outcomes {counts:?}");
    assert_eq!(disagreements(&placed), 0, "{placed:?}");
    assert_eq!(counts["won"], 6, "each key created in etcd once: {counts:?}");
    let fell: u64 = ["timeout", "not_sent", "error"].iter().map(|o| counts[o]).sum();
    assert_eq!(fell, 0, "{counts:?}");
    let used: BTreeSet<&String> = placed.values().flat_map(|by| by.keys()).collect();
    assert!(used.len() >= 2, "the keys spread over the engines: {placed:?}");

    // One Envoy cut off from etcd.
    let before = [fallbacks(&envoys[0]).await, fallbacks(&envoys[1]).await];
    let cut = stack.disconnect("envoy-1", "control").unwrap_or_else(|e| panic!("{e}"));
    let during_keys = keys("cut-off", 6);
    let during = rotate(&envoys, &during_keys, 2).await;
    let counted = [
        fallbacks(&envoys[0]).await - before[0],
        fallbacks(&envoys[1]).await - before[1],
    ];
    println!("envoy-1 cut off from etcd: every request served, fallbacks {counted:?}, {during:?}");
    assert_eq!(
        counted,
        [0, 6],
        "each new key's first request on envoy-1, and only there, falls back"
    );
    stack.reconnect(&cut).unwrap_or_else(|e| panic!("{e}"));
    let settled = converge(&envoys, &during_keys).await;
    let agreed = fresh_keys_agree(&envoys, "after-cut").await;
    println!("envoy-1 back: the cut-off keys converged in {settled:?}; new keys agree again after {agreed:?}");

    // The etcd leader cut off.
    let led = leader(&stack, "etcd-0");
    let via = MEMBERS.iter().find(|m| **m != led).copied().unwrap_or("etcd-0");
    let leases = registrations(&stack, via);
    let known = rotate(&envoys, &tenants, 1).await;
    let before = [fallbacks(&envoys[0]).await, fallbacks(&envoys[1]).await];
    let gone = stack.disconnect(&led, "control").unwrap_or_else(|e| panic!("{e}"));
    let member_keys = keys("member-cut", 6);
    let during = rotate(&envoys, &member_keys, 2).await;
    let still = rotate(&envoys, &tenants, 1).await;
    let counted = [
        fallbacks(&envoys[0]).await - before[0],
        fallbacks(&envoys[1]).await - before[1],
    ];
    println!("{led} (the leader) cut off: every request served; new keys {during:?}, fallbacks {counted:?}");
    let (known, still) = (owners(&known), owners(&still));
    let moved: Vec<&String> = still
        .keys()
        .filter(|k| known.get(*k).is_some_and(|e| *e != still[*k]))
        .collect();
    assert!(
        moved.is_empty(),
        "known keys stay on their engines: before {known:?}, during {still:?}"
    );
    stack.reconnect(&gone).unwrap_or_else(|e| panic!("{e}"));
    let all = MEMBERS.map(|m| format!("http://{m}:2379")).join(",");
    let healthy = wait_for(Duration::from_secs(30), || async {
        stack
            .exec(
                via,
                &[
                    "etcdctl",
                    "--endpoints",
                    &all,
                    "--command-timeout",
                    "2s",
                    "endpoint",
                    "health",
                ],
            )
            .is_ok()
    })
    .await
    .expect("the cut-off member never became healthy again");
    assert_eq!(
        registrations(&stack, via),
        leases,
        "every engine kept its registration, on the same lease"
    );
    let settled = converge(&envoys, &member_keys).await;
    println!("{led} back: healthy after {healthy:?}, its keys agree after {settled:?}; registrations unchanged");

    // A registered engine's container killed.
    let traffic = Traffic::start(&envoys, &keys("kill", 12), 2);
    traffic.more(Instant::now(), 10).await;
    let victim = "llama-r-2";
    let addr = engine_ips
        .iter()
        .find(|(_, s)| **s == victim)
        .map(|(a, _)| a.clone())
        .unwrap_or_default();
    assert!(
        registrations(&stack, "etcd-0").contains_key(&addr),
        "{victim} is registered"
    );
    let mut deletions = Deletions::watch(&stack, "etcd-0", revision(&stack, "etcd-0") + 1);
    // The engine's container and its registrar, in one `docker kill`: as when the engine's host is lost, nothing is
    // left to revoke the lease. (A registrar that outlives its engine revokes the lease at once; the etcd discovery
    // e2e tests check that.)
    stack.kill(&[victim, "register-2"]).unwrap_or_else(|e| panic!("{e}"));
    let killed = Instant::now();
    let key = format!("{REGISTERED}{addr}");
    tokio::time::timeout(Duration::from_secs(TTL_S + 16), deletions.of(&key))
        .await
        .unwrap_or_else(|_| panic!("{victim}'s registration outlived its lease"));
    let expired = killed.elapsed();
    for e in &envoys {
        let left = wait_for(Duration::from_secs(20), || async {
            !e.hosts(BACKEND).await.contains_key(&addr)
        })
        .await;
        assert!(
            left.is_some(),
            "{}: {victim} never left the cluster: {:?}",
            e.service,
            e.hosts(BACKEND).await
        );
    }
    let left = killed.elapsed();
    traffic.more(Instant::now(), 10).await;
    let sent = traffic.stop().await;
    println!(
        "killed {victim}: its lease expired {expired:?} after the kill, gone from both replicas after {left:?}; {} \
         requests, {} failed; per engine {:?}",
        sent.len(),
        failures(&sent).len(),
        per_engine(&sent)
    );
    assert_eq!(failures(&sent), Vec::<String>::new(), "no request fails");
    assert!(
        expired >= Duration::from_secs(TTL_S / 2),
        "the registration went after {expired:?}, before its {TTL_S} s lease (refreshed every second) could expire"
    );

    take_down(stack);
}
