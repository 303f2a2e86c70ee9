//! `llmroute discover CONFIG`: keeps each etcd-discovered backend's EDS file equal to the live instances
//! registered under its prefix.
//!
//! An instance is the key `<prefix>/<IP:PORT>`, normally attached to a lease, whose value is empty or a JSON
//! object of optional metadata: `slots` (1–256, llama.cpp `-np`), `weight` (1–1000), `model` and `zone` (strings
//! of at most 128 bytes). Each becomes one EDS endpoint: `load_balancing_weight` is `weight`, else `slots`, else
//! 1, cut to the backend's `max_weight`, and the metadata is carried as endpoint metadata `filter_metadata.llmroute`.
//! A key that is not an `IP:PORT` or whose value is not such an object is left out, logged and counted
//! (`rejected`); an address `crate::instance_address` refuses (loopback unless allowed, link-local, unspecified,
//! multicast, Envoy's own) is left out, logged and counted as `refused`; a cut weight is logged and counted as
//! `capped`. With `discovery.etcd.auth`, the etcd client authenticates with the password from the variable it names.
//!
//! One thread per backend: read the prefix, write the file if the membership changed (temp file + rename, which
//! Envoy's file watch needs), then watch the prefix from the next revision until something changes, the watch
//! stays idle for [`WATCH_IDLE`] (a read every such period also checks etcd), or it fails. On failure the file
//! keeps the last good membership, and the thread tries again after a backoff from 100 ms doubling to 2 s,
//! across the configured etcd endpoints. Counters go to the log on each change and, with `--stats`, to a JSON
//! file rewritten atomically.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llmroute_core::config::{parse_endpoint, Backend, EtcdSource};
use llmroute_core::envoy_contract as contract;
use llmroute_core::Document;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::etcd::{Client, Credentials, Kv, WatchEnd};
use crate::instance_address::{Policy, Refusal};

/// How long a watch waits for a change before the prefix is read again anyway.
pub const WATCH_IDLE: Duration = Duration::from_secs(10);
/// Bound on one etcd call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Most hosts one backend's EDS file lists (the filter's admin snapshot keeps as many).
pub const MAX_HOSTS: usize = llmroute_core::status::MAX_HOSTS;
const MAX_SLOTS: u64 = 256;
const MAX_WEIGHT: u64 = 1000;
const MAX_LABEL: usize = 128;

/// One live instance, as it goes into the EDS file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub ip: String,
    pub port: u16,
    pub weight: u32,
    /// `filter_metadata.llmroute` of the endpoint.
    pub metadata: BTreeMap<String, Value>,
}

/// The membership read from one prefix: the hosts, sorted by address, and the keys left out or cut, with why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Membership {
    pub hosts: Vec<Host>,
    /// Keys that are not an instance (`IP:PORT` with empty or object metadata).
    pub rejected: Vec<(String, String)>,
    /// Instances on an address the backend does not accept.
    pub refused: Vec<(String, Refusal)>,
    /// Instances whose weight was cut to `max_weight`: the key and the weight it asked for.
    pub capped: Vec<(String, u32)>,
}

/// What one backend accepts from its registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    pub addresses: Policy,
    /// The largest weight one instance gets.
    pub max_weight: u32,
}

impl Rules {
    /// The rules of `source`, next to the Envoy that `cfg` renders.
    pub fn of(cfg: &Document, source: &EtcdSource) -> Rules {
        Rules {
            addresses: Policy {
                allow_loopback: source.allow_loopback,
                admin: cfg.admin,
                listener: cfg.render_only.listen,
            },
            max_weight: source.max_weight,
        }
    }
}

/// Why a key did not become a host.
enum LeftOut {
    Malformed(String),
    Refused(Refusal),
}

/// Turns the keys under `<prefix>/` into hosts, as `rules` allow. Pure: the caller reads etcd and writes the file.
pub fn membership(prefix: &str, kvs: &[Kv], rules: &Rules) -> Membership {
    let mut m = Membership::default();
    let dir = format!("{prefix}/");
    for kv in kvs {
        let Some(addr) = kv.key.strip_prefix(&dir) else {
            continue;
        };
        match host(addr, &kv.value, &rules.addresses) {
            Ok(_) if m.hosts.len() >= MAX_HOSTS => m
                .rejected
                .push((kv.key.clone(), format!("more than {MAX_HOSTS} hosts"))),
            Ok(mut h) => {
                if h.weight > rules.max_weight {
                    m.capped.push((kv.key.clone(), h.weight));
                    h.weight = rules.max_weight;
                }
                m.hosts.push(h);
            }
            Err(LeftOut::Malformed(why)) => m.rejected.push((kv.key.clone(), why)),
            Err(LeftOut::Refused(r)) => m.refused.push((kv.key.clone(), r)),
        }
    }
    m.hosts.sort_by(|a, b| (&a.ip, a.port).cmp(&(&b.ip, b.port)));
    m
}

fn host(addr: &str, value: &[u8], policy: &Policy) -> Result<Host, LeftOut> {
    let ep = parse_endpoint(addr).map_err(|e| LeftOut::Malformed(format!("the key must end in IP:PORT: {e}")))?;
    let ip = ep.host.trim_start_matches('[').trim_end_matches(']');
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return Err(LeftOut::Malformed(
            "the key must end in an IP address, not a DNS name".into(),
        ));
    };
    policy.check(ip, ep.port).map_err(LeftOut::Refused)?;
    metadata(value)
        .map_err(LeftOut::Malformed)
        .map(|(weight, metadata)| Host {
            ip: ip.to_string(),
            port: ep.port,
            weight,
            metadata,
        })
}

/// The weight and the endpoint metadata an instance's value gives.
fn metadata(value: &[u8]) -> Result<(u32, BTreeMap<String, Value>), String> {
    let mut metadata = BTreeMap::new();
    let text = std::str::from_utf8(value).map_err(|_| "the value is not UTF-8".to_string())?;
    let mut weight = None;
    let mut slots = None;
    if !text.trim().is_empty() {
        let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(text) else {
            return Err("the value must be empty or a JSON object".into());
        };
        for (name, v) in &obj {
            match name.as_str() {
                "slots" => slots = Some(number(v, name, MAX_SLOTS)?),
                "weight" => weight = Some(number(v, name, MAX_WEIGHT)?),
                "model" | "zone" => match v.as_str() {
                    Some(s) if !s.is_empty() && s.len() <= MAX_LABEL && !s.chars().any(char::is_control) => {}
                    _ => return Err(format!("`{name}` must be a string of 1 to {MAX_LABEL} bytes")),
                },
                // Unknown fields are left for other readers of the registry.
                _ => continue,
            }
            metadata.insert(name.clone(), v.clone());
        }
    }
    Ok((weight.or(slots).unwrap_or(1), metadata))
}

fn number(v: &Value, name: &str, max: u64) -> Result<u32, String> {
    match v.as_u64() {
        Some(n) if (1..=max).contains(&n) => Ok(n as u32),
        _ => Err(format!("`{name}` must be an integer from 1 to {max}")),
    }
}

/// The `DiscoveryResponse` Envoy reads from the EDS file.
pub fn eds_document(cluster: &str, hosts: &[Host]) -> Value {
    let endpoints: Vec<Value> = hosts
        .iter()
        .map(|h| {
            let mut meta: Map<String, Value> = h.metadata.clone().into_iter().collect();
            meta.insert(contract::METADATA_BACKEND.into(), Value::from(cluster));
            json!({
                "endpoint": { "address": { "socket_address": { "address": h.ip, "port_value": h.port } } },
                "load_balancing_weight": h.weight,
                "metadata": { "filter_metadata": { contract::METADATA_NAMESPACE: meta } },
            })
        })
        .collect();
    let assignment = json!({
        "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": cluster,
        "endpoints": [{ "lb_endpoints": endpoints }],
    });
    let version = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(assignment.to_string().as_bytes()));
    json!({ "version_info": version, "resources": [assignment] })
}

/// Writes `text` to `path` through a temporary file in the same directory and a rename, so a reader (Envoy's
/// file watch) never sees half a file.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// What `discover` has done, per backend.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    /// Hosts in the last file written.
    pub hosts: usize,
    /// EDS files written (a membership change, or the first read).
    pub writes: u64,
    /// Failed etcd reads or watches; the file kept its last membership meanwhile.
    pub etcd_errors: u64,
    /// Reads that succeeded right after a failure.
    pub reconnects: u64,
    /// Keys left out (not `IP:PORT`, bad metadata), counted at each read that saw them.
    pub rejected: u64,
    /// Instances left out for their address (see `crate::instance_address`), counted at each read that saw them.
    pub refused: u64,
    /// Instances whose weight was cut to `max_weight`, counted at each read that saw them.
    pub capped: u64,
    /// False from a failed etcd call until the next read succeeds.
    pub connected: bool,
}

type Stats = Arc<Mutex<BTreeMap<String, Counters>>>;

fn update(stats: &Stats, stats_path: Option<&Path>, backend: &str, f: impl FnOnce(&mut Counters)) {
    let Ok(mut map) = stats.lock() else { return };
    f(map.entry(backend.to_string()).or_default());
    if let Some(path) = stats_path {
        let text = serde_json::to_string_pretty(&*map).unwrap_or_default();
        if let Err(e) = write_atomically(path, &text) {
            eprintln!("llmroute discover: writing {}: {e}", path.display());
        }
    }
}

/// The backends `discover` serves: those with `discovery.etcd` (and so an `eds_path`).
pub fn etcd_backends(cfg: &Document) -> Vec<(&Backend, &EtcdSource, &str)> {
    cfg.backends
        .iter()
        .filter_map(|b| {
            let d = b.discovery.as_ref()?;
            Some((b, d.etcd.as_ref()?, d.eds_path.as_deref()?))
        })
        .collect()
}

/// Runs until the process is stopped: one thread per etcd-discovered backend.
pub fn run(cfg: &Document, stats_path: Option<PathBuf>) -> Result<(), String> {
    let backends = etcd_backends(cfg);
    if backends.is_empty() {
        return Err("no backend has `discovery.etcd`: nothing to discover".into());
    }
    let stats: Stats = Arc::default();
    // Every client first, so that an unreadable PEM file or an unset password stops the command before anything
    // runs.
    let mut clients = Vec::new();
    for (b, source, path) in backends {
        let credentials = match &source.auth {
            Some(a) => Some(Credentials::from_env(
                a,
                &format!("backend {}: discovery.etcd", b.name),
            )?),
            None => None,
        };
        let client = Client::new(source.endpoints.clone(), source.tls.as_ref(), CALL_TIMEOUT, WATCH_IDLE)
            .map_err(|e| format!("backend {}: discovery.etcd.{e}", b.name))?
            .with_credentials(credentials);
        let rules = Rules::of(cfg, source);
        clients.push((b.name.clone(), source.clone(), rules, PathBuf::from(path), client));
    }
    let mut threads = Vec::new();
    for (name, source, rules, path, client) in clients {
        let (stats, stats_path) = (stats.clone(), stats_path.clone());
        threads.push(std::thread::spawn(move || {
            follow(&name, &source, &rules, &path, client, &stats, stats_path.as_deref())
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    Err("every discovery thread stopped".into())
}

/// Follows one backend's prefix forever, through `client`.
fn follow(
    name: &str,
    source: &EtcdSource,
    rules: &Rules,
    path: &Path,
    mut client: Client,
    stats: &Stats,
    stats_path: Option<&Path>,
) {
    let dir = format!("{}/", source.prefix);
    let mut last: Option<Vec<Host>> = None;
    let mut failing = false;
    let mut backoff = BACKOFF_FIRST;
    // Envoy needs the file to exist when it starts: until etcd answers, an existing file is kept, and a missing
    // one is written empty.
    if !path.exists() {
        let text = eds_document(name, &[]).to_string();
        if let Err(e) = write_atomically(path, &text) {
            eprintln!("llmroute discover: {name}: writing {}: {e}", path.display());
        }
    }
    loop {
        let result = client.range_prefix(&dir).and_then(|range| {
            if failing {
                failing = false;
                backoff = BACKOFF_FIRST;
                eprintln!("llmroute discover: {name}: etcd answers again at {}", client.endpoint());
                update(stats, stats_path, name, |c| c.reconnects += 1);
            }
            let m = membership(&source.prefix, &range.kvs, rules);
            log_left_out(name, &m, rules.max_weight);
            if range.more {
                eprintln!(
                    "llmroute discover: {name}: more than {} keys under {dir}; the rest are ignored",
                    crate::etcd::RANGE_LIMIT
                );
            }
            let (rejected, refused, capped) = (m.rejected.len() as u64, m.refused.len() as u64, m.capped.len() as u64);
            if last.as_ref() != Some(&m.hosts) {
                apply(name, path, last.as_deref(), &m.hosts)?;
                let n = m.hosts.len();
                update(stats, stats_path, name, |c| {
                    c.writes += 1;
                    c.hosts = n;
                });
                last = Some(m.hosts);
            }
            update(stats, stats_path, name, |c| {
                c.rejected += rejected;
                c.refused += refused;
                c.capped += capped;
                c.connected = true;
            });
            client.watch(&dir, range.revision.saturating_add(1))
        });
        match result {
            Ok(WatchEnd::Changed | WatchEnd::Idle) => {}
            Err(e) => {
                if !failing {
                    eprintln!(
                        "llmroute discover: {name}: {e}; keeping the last membership ({} hosts), retrying",
                        last.as_ref().map_or(0, Vec::len)
                    );
                }
                failing = true;
                update(stats, stats_path, name, |c| {
                    c.etcd_errors += 1;
                    c.connected = false;
                });
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// Logs each registered instance the membership leaves out, refuses, or weighs less than it asked.
fn log_left_out(name: &str, m: &Membership, max_weight: u32) {
    for (key, why) in &m.rejected {
        eprintln!("llmroute discover: {name}: left out {key}: {why}");
    }
    for (key, r) in &m.refused {
        eprintln!("llmroute discover: {name}: refused {key}: {}", r.reason());
    }
    for (key, w) in &m.capped {
        eprintln!("llmroute discover: {name}: {key} asked for weight {w}; cut to max_weight {max_weight}");
    }
}

/// Writes the new membership and logs the difference.
fn apply(name: &str, path: &Path, old: Option<&[Host]>, new: &[Host]) -> Result<(), crate::etcd::EtcdError> {
    let text = eds_document(name, new).to_string();
    write_atomically(path, &text).map_err(|e| crate::etcd::EtcdError(format!("writing {}: {e}", path.display())))?;
    let addr = |h: &Host| format!("{}:{}", h.ip, h.port);
    let old: Vec<String> = old.unwrap_or_default().iter().map(addr).collect();
    let now: Vec<String> = new.iter().map(addr).collect();
    let joined: Vec<&String> = now.iter().filter(|a| !old.contains(a)).collect();
    let left: Vec<&String> = old.iter().filter(|a| !now.contains(a)).collect();
    eprintln!(
        "llmroute discover: {name}: {} host(s) written to {} (joined {joined:?}, left {left:?})",
        new.len(),
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback allowed, Envoy on its defaults, weights up to 1000: only malformed keys are left out.
    fn open() -> Rules {
        rules(true, 1000)
    }

    fn rules(allow_loopback: bool, max_weight: u32) -> Rules {
        Rules {
            addresses: Policy {
                allow_loopback,
                admin: "127.0.0.1:9901".parse().unwrap(),
                listener: "127.0.0.1:10000".parse().unwrap(),
            },
            max_weight,
        }
    }

    fn kv(key: &str, value: &str) -> Kv {
        Kv {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            lease: 1,
        }
    }

    #[test]
    fn keys_become_sorted_hosts_with_weights_and_metadata() {
        let m = membership(
            "/p",
            &[
                kv(
                    "/p/10.0.0.2:8080",
                    r#"{"slots": 4, "model": "qwen", "zone": "a", "owner": "x"}"#,
                ),
                kv("/p/10.0.0.1:8080", ""),
                kv("/p/[::1]:9000", r#"{"weight": 3, "slots": 8}"#),
            ],
            &open(),
        );
        assert!(m.rejected.is_empty(), "{:?}", m.rejected);
        let addrs: Vec<_> = m.hosts.iter().map(|h| (h.ip.as_str(), h.port, h.weight)).collect();
        assert_eq!(addrs, [("10.0.0.1", 8080, 1), ("10.0.0.2", 8080, 4), ("::1", 9000, 3)]);
        assert_eq!(m.hosts[1].metadata.get("model"), Some(&json!("qwen")));
        assert!(!m.hosts[1].metadata.contains_key("owner"));
        let doc = eds_document("llama-a", &m.hosts);
        let eps = &doc["resources"][0]["endpoints"][0]["lb_endpoints"];
        assert_eq!(eps[1]["load_balancing_weight"], 4);
        assert_eq!(eps[1]["metadata"]["filter_metadata"]["llmroute"]["slots"], 4);
        assert_eq!(eps[1]["metadata"]["filter_metadata"]["llmroute"]["backend"], "llama-a");
        assert_eq!(eps[2]["endpoint"]["address"]["socket_address"]["address"], "::1");
        assert_eq!(doc["resources"][0]["cluster_name"], "llama-a");
    }

    #[test]
    fn bad_keys_and_values_are_left_out_with_a_reason() {
        let m = membership(
            "/p",
            &[
                kv("/p/llama.local:8080", ""),
                kv("/p/10.0.0.1", ""),
                kv("/p/10.0.0.2:1", "not json"),
                kv("/p/10.0.0.3:1", r#"{"slots": 0}"#),
                kv("/p/10.0.0.4:1", r#"{"weight": 1001}"#),
                kv("/p/10.0.0.5:1", r#"{"zone": 5}"#),
                kv("/p/10.0.0.6:1", "[1]"),
                kv("/pq/10.0.0.7:1", ""),
            ],
            &open(),
        );
        assert!(m.hosts.is_empty(), "{:?}", m.hosts);
        assert_eq!(m.rejected.len(), 7, "{:?}", m.rejected);
        assert!(m.rejected[0].1.contains("DNS"), "{:?}", m.rejected[0]);
        assert!(m.rejected[3].1.contains("slots"), "{:?}", m.rejected[3]);
    }

    #[test]
    fn refused_addresses_are_left_out_with_their_reason_and_loopback_only_when_allowed() {
        let kvs = [
            kv("/p/10.0.0.1:8080", ""),
            kv("/p/127.0.0.1:8080", ""),
            kv("/p/[::1]:8080", ""),
            kv("/p/169.254.169.254:80", ""),
            kv("/p/0.0.0.0:8080", ""),
            kv("/p/224.0.0.1:8080", ""),
            kv("/p/127.0.0.1:9901", ""),
            kv("/p/127.0.0.1:10000", ""),
        ];
        let m = membership("/p", &kvs, &rules(false, 256));
        let hosts: Vec<_> = m.hosts.iter().map(|h| format!("{}:{}", h.ip, h.port)).collect();
        assert_eq!(hosts, ["10.0.0.1:8080"]);
        assert!(m.rejected.is_empty(), "{:?}", m.rejected);
        let refused: Vec<(&str, Refusal)> = m.refused.iter().map(|(k, r)| (k.as_str(), *r)).collect();
        assert_eq!(
            refused,
            [
                ("/p/127.0.0.1:8080", Refusal::Loopback),
                ("/p/[::1]:8080", Refusal::Loopback),
                ("/p/169.254.169.254:80", Refusal::LinkLocal),
                ("/p/0.0.0.0:8080", Refusal::Unspecified),
                ("/p/224.0.0.1:8080", Refusal::Multicast),
                ("/p/127.0.0.1:9901", Refusal::EnvoyAdmin),
                ("/p/127.0.0.1:10000", Refusal::EnvoyListener),
            ]
        );
        let allowed = membership("/p", &kvs, &rules(true, 256));
        let hosts: Vec<_> = allowed.hosts.iter().map(|h| format!("{}:{}", h.ip, h.port)).collect();
        assert_eq!(hosts, ["10.0.0.1:8080", "127.0.0.1:8080", "::1:8080"]);
        assert_eq!(allowed.refused.len(), 5, "{:?}", allowed.refused);
    }

    #[test]
    fn a_weight_above_max_weight_is_cut_and_noted() {
        let m = membership(
            "/p",
            &[
                kv("/p/10.0.0.1:1", r#"{"weight": 1000}"#),
                kv("/p/10.0.0.2:1", r#"{"slots": 16}"#),
                kv("/p/10.0.0.3:1", r#"{"weight": 8}"#),
            ],
            &rules(false, 8),
        );
        let weights: Vec<u32> = m.hosts.iter().map(|h| h.weight).collect();
        assert_eq!(weights, [8, 8, 8]);
        assert_eq!(
            m.capped,
            [("/p/10.0.0.1:1".to_string(), 1000), ("/p/10.0.0.2:1".to_string(), 16)]
        );
        let doc = eds_document("c", &m.hosts);
        assert_eq!(
            doc["resources"][0]["endpoints"][0]["lb_endpoints"][0]["load_balancing_weight"],
            8
        );
    }

    #[test]
    fn the_version_follows_the_content() {
        let a = membership("/p", &[kv("/p/10.0.0.1:1", "")], &open());
        let b = membership("/p", &[kv("/p/10.0.0.1:1", r#"{"slots": 2}"#)], &open());
        let v = |m: &Membership| eds_document("c", &m.hosts)["version_info"].clone();
        assert_eq!(v(&a), v(&a.clone()));
        assert_ne!(v(&a), v(&b));
    }

    #[test]
    fn files_are_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eds.json");
        write_atomically(&path, "one").unwrap();
        write_atomically(&path, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }
}
