//! The routing policies compared, and how each system is started in front of a fleet.
//!
//! - **llmroute**: Envoy (one worker) with the filter, rendered from an llmroute config whose one backend lists
//!   the fleet, with `lb: chwbl` and a balance factor, or `lb: least_request`; `bounded_keys` is `chwbl` with
//!   `affinity.placement: bounded_keys` and the engines' slot counts. It is ready once Envoy's active health checks
//!   pass for every host.
//! - **llmroute replicas**: `n` such Envoys with the same config; with [`Placement::Store`] they share their key
//!   table through a fresh 3-member etcd cluster on loopback ([`EtcdCluster`]), started for the run and ready once
//!   every replica's Envoy sees every member healthy.
//! - **sglang-router** and **vllm-router**: the PyPI wheels from the bench venv ([`systems::venv`]), on loopback,
//!   with `--policy` set and every other option at its default. Ready once a chat request answers 200.
//!
//! Each system is stopped when dropped.

use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench::body::{ALIAS, UPSTREAM_MODEL};
use crate::bench::systems::{self, Kind, Peer, Process, CHAT_PATH};
use crate::envoy::{random_ports, Envoy, EnvoyOptions};
use crate::etcd::EtcdCluster;
use llmroute_core::envoy_contract::{metrics::PLACEMENT_STORE, PLACEMENT_STORE_CLUSTER};
use llmroute_core::key_placement::store::{Fallback, Outcome};

/// The llmroute backend (Envoy cluster) name.
pub const BACKEND: &str = "bench";
/// How long a system may take to become ready.
const START_LIMIT: Duration = Duration::from_secs(60);

/// One routing policy of one system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Policy {
    /// llmroute, Envoy ring hash with `hash_balance_factor` (percent).
    Chwbl(u32),
    /// llmroute, `affinity.placement: bounded_keys` over `chwbl` with this balance factor: the filter pins each new
    /// key to the first host, in the key's rendezvous order, under its share of live keys.
    BoundedKeys(u32),
    /// `n` llmroute replicas with the same config (`Chwbl` or `BoundedKeys` inside, with the balance factor), each
    /// request sent to one of them at random (seeded), as an L4 load balancer spreading connections would: what
    /// placement keeps when replicas see different traffic.
    Replicas(Placement, u32, u8),
    /// llmroute, Envoy least request.
    LeastRequest,
    SglangCacheAware,
    SglangRoundRobin,
    /// vllm-router's consistent hash on `x-session-id`.
    VllmConsistentHash,
    VllmCacheAware,
}

/// The placement of a [`Policy::Replicas`] run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Placement {
    /// `lb: chwbl`: every replica builds the same ring.
    Hash,
    /// `bounded_keys`, each replica with its own key table.
    BoundedKeys,
    /// `bounded_keys` with `affinity.placement_store.etcd`: one table shared through etcd.
    Store,
}

/// The prefix of the store's keys in etcd, for the bench.
pub const STORE_PREFIX: &str = "/bench";

impl Policy {
    /// Not in a default run; chosen with `--policies`.
    pub const EXTRA: [Policy; 6] = [
        Policy::Replicas(Placement::Hash, 175, 3),
        Policy::Replicas(Placement::BoundedKeys, 150, 3),
        Policy::Replicas(Placement::Store, 150, 3),
        Policy::Replicas(Placement::Hash, 175, 2),
        Policy::Replicas(Placement::BoundedKeys, 150, 2),
        Policy::Replicas(Placement::Store, 150, 2),
    ];

    pub const ALL: [Policy; 9] = [
        Policy::Chwbl(125),
        Policy::Chwbl(175),
        Policy::Chwbl(200),
        Policy::BoundedKeys(150),
        Policy::LeastRequest,
        Policy::SglangCacheAware,
        Policy::SglangRoundRobin,
        Policy::VllmConsistentHash,
        Policy::VllmCacheAware,
    ];

    /// The label in tables and the legend, e.g. `llmroute chwbl 175`, `sglang cache_aware`.
    pub fn label(self) -> String {
        match self {
            Policy::Chwbl(f) => format!("llmroute chwbl {f}"),
            Policy::BoundedKeys(_) => "llmroute bounded_keys".into(),
            Policy::Replicas(Placement::Hash, f, n) => format!("llmroute chwbl {f} x{n} replicas"),
            Policy::Replicas(Placement::BoundedKeys, _, n) => format!("llmroute bounded_keys x{n} replicas"),
            Policy::Replicas(Placement::Store, _, n) => format!("llmroute bounded_keys+etcd x{n} replicas"),
            Policy::LeastRequest => "llmroute least_request".into(),
            Policy::SglangCacheAware => "sglang cache_aware".into(),
            Policy::SglangRoundRobin => "sglang round_robin".into(),
            Policy::VllmConsistentHash => "vllm consistent_hash".into(),
            Policy::VllmCacheAware => "vllm cache_aware".into(),
        }
    }

    /// The id on the command line: `chwbl-175`, `bounded-keys`, `least-request`, `sglang-cache-aware`,
    /// `bounded-keys+etcd-x3-replicas`, ...
    pub fn id(self) -> String {
        self.label().replace("llmroute ", "").replace([' ', '_'], "-")
    }

    pub fn parse(id: &str) -> Option<Policy> {
        Self::ALL.into_iter().chain(Self::EXTRA).find(|p| p.id() == id)
    }

    /// How many Envoy replicas the run starts (1 for the peers).
    pub fn replicas(self) -> usize {
        match self {
            Policy::Replicas(_, _, n) => usize::from(n.max(1)),
            _ => 1,
        }
    }

    /// Whether the replicas share their key table through etcd.
    pub fn store(self) -> bool {
        matches!(self, Policy::Replicas(Placement::Store, ..))
    }

    /// The single-replica policy a replicated one runs on each replica.
    fn single(self) -> Policy {
        match self {
            Policy::Replicas(Placement::Hash, f, _) => Policy::Chwbl(f),
            Policy::Replicas(Placement::BoundedKeys | Placement::Store, f, _) => Policy::BoundedKeys(f),
            p => p,
        }
    }

    /// The peer router this policy belongs to; `None` for llmroute.
    pub fn peer(self) -> Option<Kind> {
        match self {
            Policy::Chwbl(_) | Policy::BoundedKeys(_) | Policy::Replicas(..) | Policy::LeastRequest => None,
            Policy::SglangCacheAware | Policy::SglangRoundRobin => Some(Kind::Sglang),
            Policy::VllmConsistentHash | Policy::VllmCacheAware => Some(Kind::Vllm),
        }
    }

    /// The peer's `--policy` value.
    fn peer_policy(self) -> &'static str {
        match self {
            Policy::SglangCacheAware | Policy::VllmCacheAware => "cache_aware",
            Policy::SglangRoundRobin => "round_robin",
            _ => "consistent_hash",
        }
    }

    /// Whether the replay sends each request's session id as `x-session-id`: only vllm's `consistent_hash`, which
    /// hashes that header. llmroute keys the same requests on their content.
    pub fn sends_session(self) -> bool {
        self == Policy::VllmConsistentHash
    }

    /// The configured load bound, busiest ÷ mean, for CHWBL. `None` for `bounded_keys`, whose placement is the
    /// filter's, with Envoy's bounded ring only as the fallback.
    pub fn bound(self) -> Option<f64> {
        match self {
            Policy::Chwbl(f) | Policy::Replicas(Placement::Hash, f, _) => Some(f64::from(f) / 100.0),
            _ => None,
        }
    }

    /// How it is configured, for the report.
    pub fn describe(self) -> String {
        match self {
            Policy::Chwbl(f) => {
                format!("`lb: chwbl`, `balance_factor: {f}` (Envoy `RING_HASH`, `hash_balance_factor: {f}`)")
            }
            Policy::BoundedKeys(f) => format!(
                "`affinity.placement: bounded_keys` (`key_balance_factor` 125, `slots: [2, 2, 2]`): the filter places \
                 each new key on the first host, in the key's rendezvous order, under its share of live keys, and \
                 keeps it there; requests spill past Envoy's in-flight bound (factor {f}); Envoy's ring hash is the \
                 fallback"
            ),
            Policy::Replicas(placement, _, n) => {
                format!(
                    "{n} Envoys, each configured as `{}`; the client sends each request to one of them at random \
                     (seeded)",
                    self.single().label()
                )
                .replace("`llmroute ", "`")
                    + match placement {
                        Placement::Hash => "",
                        Placement::BoundedKeys => ", so each builds its own key table from its share of the traffic",
                        Placement::Store => {
                            ", sharing one key table through `affinity.placement_store.etcd` (a fresh 3-member etcd \
                             cluster on loopback per run, `timeout_ms` 50, the default)"
                        }
                    }
            }
            Policy::LeastRequest => "`lb: least_request` (Envoy `LEAST_REQUEST`, two random choices)".into(),
            p => {
                let header = if p.sends_session() {
                    "; requests carry `x-session-id`"
                } else {
                    ""
                };
                format!(
                    "`--policy {}`, other options at their defaults{header}",
                    p.peer_policy()
                )
            }
        }
    }
}

/// The llmroute config for a policy over `endpoints` (`HOST:PORT`), engines of `slots` slots each; `store` lists
/// the etcd members (`http://IP:PORT`) of a [`Placement::Store`] run.
pub fn llmroute_config(policy: Policy, endpoints: &[String], slots: usize, store: Option<&[String]>) -> Value {
    let mut backend = json!({ "name": BACKEND, "kind": "llamacpp", "endpoints": endpoints });
    match policy.single() {
        Policy::Chwbl(f) | Policy::BoundedKeys(f) => {
            backend["lb"] = json!("chwbl");
            backend["balance_factor"] = json!(f);
        }
        _ => backend["lb"] = json!("least_request"),
    }
    if let Policy::BoundedKeys(_) = policy.single() {
        backend["slots"] = json!(vec![slots.max(1); endpoints.len()]);
    }
    let mut config = json!({
        "version": 1,
        "backends": [backend],
        "models": [{ "name": ALIAS, "routes": [{ "backend": BACKEND, "upstream_model": UPSTREAM_MODEL }] }],
    });
    if let Policy::BoundedKeys(_) = policy.single() {
        config["affinity"] = json!({ "placement": "bounded_keys" });
        if let Some(members) = store.filter(|_| policy.store()) {
            config["affinity"]["placement_store"] = json!({ "etcd": { "endpoints": members, "prefix": STORE_PREFIX } });
        }
    }
    config
}

/// A running system.
pub struct Running {
    /// The chat URL of each replica (one, except for [`Policy::Replicas`]).
    pub urls: Vec<String>,
    _process: Process,
}

impl Running {
    /// Starts `policy`'s system in front of `endpoints` (`HOST:PORT`), engines of `slots` slots each, and waits
    /// until it routes.
    pub async fn start(policy: Policy, endpoints: &[String], slots: usize) -> Result<Running, String> {
        match policy.peer() {
            None => start_llmroute(policy, endpoints, slots).await,
            Some(kind) => start_peer(policy, kind, endpoints).await,
        }
    }

    /// The (first) Envoy, for llmroute.
    pub fn envoy(&self) -> Option<&Envoy> {
        self.envoys().first()
    }

    /// Every Envoy replica (none for a peer).
    pub fn envoys(&self) -> &[Envoy] {
        self._process.envoys()
    }

    /// What the replicas' new keys met in etcd, summed over them: `None` without a store.
    pub async fn store_counts(&self) -> Option<StoreCounts> {
        if !self._process.has_store() {
            return None;
        }
        Some(store_counts(self.envoys()).await)
    }
}

/// A store run's `llmroute_placement_store_total`, summed over the replicas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreCounts {
    /// New keys this replica created in etcd (`won`) or found there (`adopted`).
    pub stored: u64,
    /// New keys placed locally because etcd did not answer in time, could not be reached, or failed.
    pub fallbacks: u64,
    /// Of those, by cause: etcd did not answer within `timeout_ms`, answered with an error (or Envoy with a 503),
    /// or the callout could not be sent.
    pub timeouts: u64,
    pub errors: u64,
    pub not_sent: u64,
}

impl std::ops::Add for StoreCounts {
    type Output = StoreCounts;

    /// Counts of several runs (or replicas) together.
    fn add(self, b: StoreCounts) -> StoreCounts {
        StoreCounts {
            stored: self.stored + b.stored,
            fallbacks: self.fallbacks + b.fallbacks,
            timeouts: self.timeouts + b.timeouts,
            errors: self.errors + b.errors,
            not_sent: self.not_sent + b.not_sent,
        }
    }
}

/// Reads the store outcomes from every Envoy's admin `/stats`.
pub async fn store_counts(envoys: &[Envoy]) -> StoreCounts {
    let mut counts = StoreCounts::default();
    let outcomes = [
        (Outcome::Won, false),
        (Outcome::Adopted { host: 0 }, false),
        (Outcome::Fallback(Fallback::Timeout), true),
        (Outcome::Fallback(Fallback::NotSent), true),
        (Outcome::Fallback(Fallback::Error), true),
    ];
    for envoy in envoys {
        for (outcome, fallback) in outcomes {
            let name = format!(
                "wasmcustom.{}",
                llmroute_core::envoy_contract::metrics::labelled(PLACEMENT_STORE, &[("outcome", outcome.as_str())])
            );
            let n = envoy.stat(&name).await.unwrap_or(0);
            if fallback {
                counts.fallbacks += n;
                match outcome {
                    Outcome::Fallback(Fallback::Timeout) => counts.timeouts += n,
                    Outcome::Fallback(Fallback::Error) => counts.errors += n,
                    _ => counts.not_sent += n,
                }
            } else {
                counts.stored += n;
            }
        }
    }
    counts
}

async fn start_llmroute(policy: Policy, endpoints: &[String], slots: usize) -> Result<Running, String> {
    let etcd = if policy.store() {
        Some(EtcdCluster::start().await?)
    } else {
        None
    };
    let members = etcd.as_ref().map(EtcdCluster::urls);
    let config = llmroute_config(policy, endpoints, slots, members.as_deref());
    let mut envoys = Vec::new();
    for _ in 0..policy.replicas() {
        envoys.push(start_envoy(&config, endpoints.len(), members.as_ref().map_or(0, Vec::len)).await?);
    }
    Ok(Running {
        urls: envoys.iter().map(|e| e.url(CHAT_PATH)).collect(),
        _process: Process::Envoy(envoys, etcd),
    })
}

/// Starts one Envoy with `config` and waits until its `hosts` engines (and its `members` etcd members, when it
/// has a store) pass their health checks, the filter's snapshot sees them (with `bounded_keys`), and it routes.
pub async fn start_envoy(config: &Value, hosts: usize, members: usize) -> Result<Envoy, String> {
    let envoy = start_envoy_healthy(config, BACKEND, hosts, members).await?;
    wait_routes(&envoy.url(CHAT_PATH), None).await?;
    Ok(envoy)
}

/// Starts one Envoy (one worker) with `config` and waits until the `hosts` hosts of `backend` (and its `members`
/// etcd members, when it has a store) pass their health checks, and the filter's snapshot sees them (with
/// `bounded_keys`). Sends no request: the real-engine bench starts its routers with this, so that no probe leaves
/// a prompt in an engine's slots.
pub async fn start_envoy_healthy(config: &Value, backend: &str, hosts: usize, members: usize) -> Result<Envoy, String> {
    let opts = EnvoyOptions {
        concurrency: 1,
        log_level: "warning".into(),
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start_with(config.clone(), opts).await?;
    let deadline = Instant::now() + START_LIMIT;
    for (cluster, n) in [(backend, hosts), (PLACEMENT_STORE_CLUSTER, members)] {
        loop {
            let health = envoy.host_health(cluster).await;
            if health.len() == n && health.values().all(|f| f == "healthy") {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("Envoy's {cluster} hosts did not all turn healthy: {health:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Bounded-keys placement reads the filter's own snapshot of host health: until it is current, keys are left
    // to Envoy's ring, and would move once it is.
    if config.pointer("/affinity/placement").is_some() {
        envoy.wait_snapshot_healthy(backend, hosts as u64, START_LIMIT).await?;
    }
    Ok(envoy)
}

async fn start_peer(policy: Policy, kind: Kind, endpoints: &[String]) -> Result<Running, String> {
    let python = systems::peer_python()?;
    let worker_urls: Vec<String> = endpoints.iter().map(|e| format!("http://{e}")).collect();
    let mut last = String::new();
    for attempt in 0..2 {
        let (port, metrics_port) = random_ports(attempt + 200);
        let mut peer = Peer::spawn(
            &python,
            systems::peer_module(kind),
            None,
            &worker_urls,
            policy.peer_policy(),
            (port, metrics_port),
            kind.name(),
        )?;
        let url = format!("http://127.0.0.1:{port}{CHAT_PATH}");
        match wait_routes(&url, Some(&mut peer.child)).await {
            Ok(()) => {
                return Ok(Running {
                    urls: vec![url],
                    _process: Process::Peer(peer),
                })
            }
            Err(e) => last = format!("{e}\n--- {} log (tail) ---\n{}", kind.short(), peer.log_tail(1500)),
        }
    }
    Err(last)
}

/// Polls with a small non-streamed chat request (llmroute: `child` is `None`) until the system answers 200, its process exits, or the limit
/// passes. The fleet is reset afterwards, so the probes leave nothing behind in the engines.
async fn wait_routes(url: &str, mut child: Option<&mut Child>) -> Result<(), String> {
    let client = reqwest::Client::new();
    // llmroute is probed with an empty prompt, of which it makes no affinity key, so bounded-keys placement starts
    // with an empty table. The peers refuse an empty prompt (sglang-router answers 400), so they get a short one;
    // it leaves a 2-word entry in their prefix trees, which no workload prompt shares.
    let content = if child.is_none() { "" } else { "ready?" };
    let body = json!({ "model": ALIAS, "messages": [{ "role": "user", "content": content }], "max_tokens": 1 });
    let deadline = Instant::now() + START_LIMIT;
    loop {
        if let Some(Ok(Some(status))) = child.as_mut().map(|c| c.try_wait()) {
            return Err(format!("the router exited with {status} before it answered"));
        }
        let answer = client
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send();
        let last = match tokio::time::timeout(Duration::from_secs(2), answer).await {
            Ok(Ok(r)) if r.status().is_success() => return Ok(()),
            Ok(Ok(r)) => format!("status {}", r.status()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 2 s".into(),
        };
        if Instant::now() > deadline {
            return Err(format!("no 200 within {START_LIMIT:?} (last: {last})"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_labels_read_well() {
        for p in Policy::ALL.into_iter().chain(Policy::EXTRA) {
            assert_eq!(Policy::parse(&p.id()), Some(p), "{}", p.id());
        }
        let store = Policy::Replicas(Placement::Store, 150, 3);
        assert_eq!(store.id(), "bounded-keys+etcd-x3-replicas");
        assert_eq!((store.replicas(), store.store(), store.peer()), (3, true, None));
        assert!(!Policy::Replicas(Placement::BoundedKeys, 150, 3).store());
        assert_eq!(Policy::Replicas(Placement::Hash, 175, 3).bound(), Some(1.75));
        assert_eq!(Policy::Chwbl(175).id(), "chwbl-175");
        assert_eq!(Policy::BoundedKeys(150).id(), "bounded-keys");
        assert_eq!(Policy::BoundedKeys(150).label(), "llmroute bounded_keys");
        assert_eq!(Policy::ALL[3], Policy::BoundedKeys(150), "after the chwbl ones");
        assert_eq!(Policy::BoundedKeys(150).peer(), None);
        assert!(Policy::BoundedKeys(150).describe().contains("factor 150"));
        assert_eq!(Policy::VllmConsistentHash.id(), "vllm-consistent-hash");
        assert_eq!(Policy::SglangCacheAware.label(), "sglang cache_aware");
        assert_eq!(Policy::Chwbl(125).bound(), Some(1.25));
        assert!(Policy::VllmConsistentHash.sends_session());
        assert!(!Policy::Chwbl(125).sends_session());
    }

    #[test]
    fn llmroute_configs_validate() {
        let endpoints = vec![
            "127.0.0.1:1".to_string(),
            "127.0.0.1:2".to_string(),
            "127.0.0.1:3".to_string(),
        ];
        for p in Policy::ALL.into_iter().filter(|p| p.peer().is_none()) {
            let config = llmroute_config(p, &endpoints, 2, None);
            llmroute_core::load_document(&config.to_string()).unwrap_or_else(|e| panic!("{}: {e:?}", p.label()));
        }
        let chwbl = llmroute_config(Policy::Chwbl(200), &endpoints, 2, None);
        assert_eq!(chwbl["backends"][0]["balance_factor"], 200);
        assert!(chwbl.get("affinity").is_none() && chwbl["backends"][0].get("slots").is_none());
        let bounded = llmroute_config(Policy::BoundedKeys(150), &endpoints, 2, None);
        assert_eq!(bounded["affinity"], json!({ "placement": "bounded_keys" }));
        assert_eq!(bounded["backends"][0]["lb"], "chwbl");
        assert_eq!(bounded["backends"][0]["balance_factor"], 150);
        assert_eq!(bounded["backends"][0]["slots"], json!([2, 2, 2]));
        let members = vec!["http://127.0.0.1:4".to_string()];
        for p in Policy::EXTRA {
            let config = llmroute_config(p, &endpoints, 2, Some(&members));
            llmroute_core::load_document(&config.to_string()).unwrap_or_else(|e| panic!("{}: {e:?}", p.label()));
            let store = config.pointer("/affinity/placement_store/etcd/endpoints");
            assert_eq!(store.is_some(), p.store(), "{}", p.label());
        }
    }
}
