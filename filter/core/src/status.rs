//! Status for operators: `GET /llmroute/status`, `GET /healthz` and `GET /readyz`, answered by the filter.
//!
//! A wasm filter cannot see cluster health, so the filter polls Envoy's own admin API: `GET
//! /clusters?format=json` on the loopback cluster [`ADMIN_CLUSTER`] that `llmroute render` adds. Every
//! [`POLL_INTERVAL_MS`] one root context of the Envoy process polls (a lease in shared data picks which), turns
//! the answer into a [`FleetStatus`] with [`parse_clusters`], and stores it in shared data ([`FleetStatus::encode`]);
//! every worker answers the three endpoints from that one snapshot. The functions here are the pure part: parsing
//! the admin JSON, deciding readiness, and writing the bodies.
//!
//! A host counts as healthy when Envoy would route to it: no failed active health check, not ejected by outlier
//! detection, not excluded, not waiting for its first check, and an EDS status of healthy (or none). A degraded
//! host is counted apart. An alias is ready when a backend of one of its routes has a healthy host; the gateway is
//! ready when every alias is, on a snapshot no older than [`STALE_AFTER_MS`]. When polls fail, the pages name the
//! admin address that fails and why ([`AdminFailure`], see `admin_poll`).
//!
//! The bodies name backends, their kinds, host counts and aliases. They never carry endpoint addresses or host
//! names, upstream model names, or credentials; the one address they may show is `admin:`, while polls of it fail.
//! A host is shown by an id keyed with a secret of the Envoy process ([`IdKey`], [`shown_id`]): an unkeyed hash of
//! `IP:PORT` could be inverted by trying every address of a subnet.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Value};

pub use crate::admin_poll::AdminFailure;
use crate::config::Config;
use crate::load::poll::HostLoad;

pub use crate::envoy_contract::ADMIN_CLUSTER;
pub use crate::host_poll::{ADMIN_PATH, MAX_HOSTS, POLL_INTERVAL_MS, POLL_TIMEOUT_MS, STALE_AFTER_MS, TICK_MS};
/// True when a poll is due at `now_ms`, given the time the last one was claimed (0 for never). A claim in the
/// future (the clock stepped back) counts as expired, so polling never stalls.
pub fn poll_due(last_claim_ms: u64, now_ms: u64) -> bool {
    now_ms >= last_claim_ms.saturating_add(POLL_INTERVAL_MS) || last_claim_ms > now_ms.saturating_add(POLL_INTERVAL_MS)
}

/// The three status endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusPage {
    /// `GET /llmroute/status`: per backend and per alias.
    Status,
    /// `GET /healthz`: the process is alive.
    Healthz,
    /// `GET /readyz`: every alias has a healthy route.
    Readyz,
}

impl StatusPage {
    pub const ALL: [StatusPage; 3] = [StatusPage::Status, StatusPage::Healthz, StatusPage::Readyz];

    pub fn path(self) -> &'static str {
        match self {
            StatusPage::Status => "/llmroute/status",
            StatusPage::Healthz => "/healthz",
            StatusPage::Readyz => "/readyz",
        }
    }

    /// The page at exactly `path` (query string already removed).
    pub fn from_path(path: &str) -> Option<StatusPage> {
        StatusPage::ALL.into_iter().find(|p| p.path() == path)
    }
}

/// One backend's figures, as Envoy saw them at the poll.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendHealth {
    /// The backend (Envoy cluster) name.
    pub name: String,
    pub healthy: u32,
    /// Hosts marked degraded (by EDS or a degraded active check) but not failed; not counted as healthy.
    pub degraded: u32,
    pub total: u32,
    /// Upstream requests in progress on this backend's hosts (`rq_active`, summed over hosts and workers).
    pub in_flight: u64,
    /// `IP:PORT` of the hosts Envoy would not route to (the status pages never show it; key placement reads it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub down: Vec<String>,
    /// `IP:PORT` of every host Envoy listed, sorted, at most [`MAX_HOSTS`]: what key placement works on when
    /// the backend's hosts are discovered (the status pages show only each host's id, see [`host_list`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// `IP:PORT` and Envoy's weight of each host weighing more than 1, at most [`MAX_HOSTS`]: a discovered
    /// host's registered `slots` (see `key_placement::host_weight`). Never shown on the status pages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<(String, u32)>,
    /// `IP:PORT` and Envoy's `rq_active` of each host with requests in flight, at most [`MAX_HOSTS`]: what
    /// bounded-keys placement rebuilds its in-flight counts from at each poll (see
    /// `key_placement::in_flight::from_envoy`). Never shown on the status pages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active: Vec<(String, u32)>,
}

/// One poll's result: the configured backends found in the admin answer, in admin order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetStatus {
    /// When the admin answer was received, in milliseconds since the Unix epoch.
    pub taken_at_ms: u64,
    pub backends: Vec<BackendHealth>,
}

impl FleetStatus {
    /// The figures of the backend named `name`, if the admin answer listed its cluster.
    pub fn backend(&self, name: &str) -> Option<&BackendHealth> {
        self.backends.iter().find(|b| b.name == name)
    }

    /// How old the snapshot is at `now_ms` (0 when the clock stepped back).
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.taken_at_ms)
    }

    /// The form kept in Envoy shared data, read back by every worker with [`FleetStatus::decode`].
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Option<FleetStatus> {
        serde_json::from_slice(bytes).ok()
    }
}

/// Why the admin answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unreadable admin /clusters answer: {}", self.0)
    }
}

// The parts of `/clusters?format=json` (envoy.admin.v3.Clusters) that are read; everything else is skipped.
#[derive(Deserialize)]
struct AdminClusters {
    #[serde(default)]
    cluster_statuses: Vec<AdminCluster>,
}

#[derive(Deserialize)]
struct AdminCluster {
    name: String,
    #[serde(default)]
    host_statuses: Vec<AdminHost>,
}

#[derive(Deserialize)]
struct AdminHost {
    #[serde(default)]
    address: AdminAddress,
    #[serde(default)]
    stats: Vec<AdminStat>,
    #[serde(default)]
    health_status: HostHealth,
    /// The host's load-balancing weight (EDS `load_balancing_weight`; 1 when none was given).
    #[serde(default)]
    weight: u32,
}

#[derive(Default, Deserialize)]
struct AdminAddress {
    #[serde(default)]
    socket_address: Option<AdminSocketAddress>,
}

#[derive(Deserialize)]
struct AdminSocketAddress {
    #[serde(default)]
    address: String,
    #[serde(default)]
    port_value: u32,
}

impl AdminAddress {
    /// `IP:PORT`, with brackets for IPv6, as Envoy names the host; `None` for a pipe or internal address.
    fn text(&self) -> Option<String> {
        let s = self.socket_address.as_ref()?;
        Some(if s.address.contains(':') {
            format!("[{}]:{}", s.address, s.port_value)
        } else {
            format!("{}:{}", s.address, s.port_value)
        })
    }
}

/// A host stat. Proto3 JSON writes the uint64 value as a string and leaves out zeros.
#[derive(Deserialize)]
struct AdminStat {
    name: String,
    #[serde(default, deserialize_with = "stat_value")]
    value: u64,
}

fn stat_value<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    })
}

/// `envoy.admin.v3.HostHealthStatus`: proto3 JSON leaves out false flags.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
pub struct HostHealth {
    #[serde(default)]
    pub failed_active_health_check: bool,
    #[serde(default)]
    pub failed_outlier_check: bool,
    #[serde(default)]
    pub failed_active_degraded_check: bool,
    #[serde(default)]
    pub pending_dynamic_removal: bool,
    #[serde(default)]
    pub pending_active_hc: bool,
    #[serde(default)]
    pub excluded_via_immediate_hc_fail: bool,
    #[serde(default)]
    pub active_hc_timeout: bool,
    /// `UNKNOWN`, `HEALTHY`, `UNHEALTHY`, `DRAINING`, `TIMEOUT` or `DEGRADED`; absent for static hosts in old
    /// releases.
    #[serde(default)]
    pub eds_health_status: Option<String>,
}

/// What a host's flags mean for routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostState {
    /// Envoy routes to it.
    Healthy,
    /// Envoy routes to it only when too few hosts are healthy.
    Degraded,
    /// Failed, ejected, excluded or not yet checked.
    Unhealthy,
}

impl HostHealth {
    /// Envoy's coarse health of the host, with excluded and not-yet-checked hosts counted as unhealthy.
    pub fn state(&self) -> HostState {
        let eds = self.eds_health_status.as_deref().unwrap_or("HEALTHY");
        let failed = self.failed_active_health_check
            || self.failed_outlier_check
            || self.excluded_via_immediate_hc_fail
            || self.active_hc_timeout
            || self.pending_active_hc
            || matches!(eds, "UNHEALTHY" | "DRAINING" | "TIMEOUT");
        if failed {
            HostState::Unhealthy
        } else if self.failed_active_degraded_check || eds == "DEGRADED" {
            HostState::Degraded
        } else {
            HostState::Healthy
        }
    }
}

/// Reads Envoy's `/clusters?format=json` answer, keeping the clusters of `cfg`'s backends. `now_ms` stamps it.
pub fn parse_clusters(admin_json: &[u8], cfg: &Config, now_ms: u64) -> Result<FleetStatus, ParseError> {
    let doc: AdminClusters = serde_json::from_slice(admin_json).map_err(|e| ParseError(where_unreadable(&e)))?;
    let backends = doc
        .cluster_statuses
        .into_iter()
        .filter(|c| cfg.backends.iter().any(|b| b.name == c.name))
        .map(|c| {
            let mut b = BackendHealth {
                name: c.name,
                healthy: 0,
                degraded: 0,
                total: 0,
                in_flight: 0,
                down: Vec::new(),
                hosts: Vec::new(),
                weights: Vec::new(),
                active: Vec::new(),
            };
            for h in &c.host_statuses {
                let active: u64 = h.stats.iter().filter(|s| s.name == "rq_active").map(|s| s.value).sum();
                if b.hosts.len() < MAX_HOSTS {
                    b.hosts.extend(h.address.text());
                    if h.weight > 1 {
                        b.weights.extend(h.address.text().map(|a| (a, h.weight)));
                    }
                    if active > 0 {
                        let n = u32::try_from(active).unwrap_or(u32::MAX);
                        b.active.extend(h.address.text().map(|a| (a, n)));
                    }
                }
                b.total = b.total.saturating_add(1);
                match h.health_status.state() {
                    HostState::Healthy => b.healthy = b.healthy.saturating_add(1),
                    HostState::Degraded => b.degraded = b.degraded.saturating_add(1),
                    HostState::Unhealthy => b.down.extend(h.address.text()),
                }
                b.in_flight = b.in_flight.saturating_add(active);
            }
            b.hosts.sort();
            b.hosts.dedup();
            b
        })
        .collect();
    Ok(FleetStatus {
        taken_at_ms: now_ms,
        backends,
    })
}

/// What is wrong with an unreadable answer and where, without quoting it: the answer may come from another server
/// than Envoy's admin when `admin:` is wrong.
fn where_unreadable(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let what = match e.classify() {
        Category::Syntax => "not JSON",
        Category::Data => "JSON of another shape",
        Category::Eof => "cut short",
        Category::Io => "unreadable",
    };
    format!("{what} (line {}, column {})", e.line(), e.column())
}

/// True when a backend of one of `alias`'s routes has a healthy host in `fleet`.
pub fn alias_ready(cfg: &Config, fleet: &FleetStatus, alias: &crate::config::ModelAlias) -> bool {
    alias.routes.iter().any(|r| {
        cfg.backend(r.backend)
            .and_then(|b| fleet.backend(&b.name))
            .is_some_and(|h| h.healthy > 0)
    })
}

/// The gateway's readiness at `now_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// No poll has completed yet.
    NoSnapshot,
    /// The last good poll is older than [`STALE_AFTER_MS`].
    Stale {
        age_ms: u64,
    },
    /// These aliases have no route with a healthy host.
    AliasesDown(Vec<String>),
    /// Polls of the admin API fail, and no snapshot younger than [`STALE_AFTER_MS`] is left (`snapshot_age_ms`:
    /// the last one's age, if there is one).
    AdminFailing {
        failure: AdminFailure,
        snapshot_age_ms: Option<u64>,
    },
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        *self == Readiness::Ready
    }

    fn reason(&self) -> Option<String> {
        match self {
            Readiness::Ready => None,
            Readiness::NoSnapshot => {
                Some("no health snapshot yet: the first poll of Envoy's admin API has not completed".into())
            }
            Readiness::Stale { age_ms } => Some(format!(
                "the health snapshot is {age_ms} ms old (polls of Envoy's admin API are failing); figures are stale"
            )),
            Readiness::AliasesDown(names) => Some(format!("no healthy host on any route of: {}", names.join(", "))),
            Readiness::AdminFailing {
                failure,
                snapshot_age_ms,
            } => Some(format!(
                "{} ({})",
                failure.describe(),
                match snapshot_age_ms {
                    Some(age_ms) => format!("the last health snapshot is {age_ms} ms old"),
                    None => "no health snapshot yet".into(),
                }
            )),
        }
    }
}

/// Decides readiness: a fresh snapshot in which every alias is ready. Without one, `admin` (polls failing, if they
/// are) says why.
pub fn readiness(cfg: &Config, fleet: Option<&FleetStatus>, admin: Option<&AdminFailure>, now_ms: u64) -> Readiness {
    let age_ms = fleet.map(|f| f.age_ms(now_ms));
    if age_ms.is_none_or(|a| a > STALE_AFTER_MS) {
        if let Some(failure) = admin {
            return Readiness::AdminFailing {
                failure: failure.clone(),
                snapshot_age_ms: age_ms,
            };
        }
    }
    let (Some(fleet), Some(age_ms)) = (fleet, age_ms) else {
        return Readiness::NoSnapshot;
    };
    if age_ms > STALE_AFTER_MS {
        return Readiness::Stale { age_ms };
    }
    let down: Vec<String> = cfg
        .models
        .iter()
        .filter(|a| !alias_ready(cfg, fleet, a))
        .map(|a| a.name.clone())
        .collect();
    if down.is_empty() {
        Readiness::Ready
    } else {
        Readiness::AliasesDown(down)
    }
}

/// True when `/readyz` answers 200.
pub fn ready(cfg: &Config, fleet: Option<&FleetStatus>, admin: Option<&AdminFailure>, now_ms: u64) -> bool {
    readiness(cfg, fleet, admin, now_ms).is_ready()
}

/// Where the figures come from, as the status body says it.
const SOURCE: &str =
    "Envoy admin /clusters, polled once a second; host health is Envoy's active health checks and outlier ejection";

/// The `GET /llmroute/status` body, its hosts shown by ids under `key`. Always answered with 200: readiness is in
/// the body. `admin` is `null` while polls work, else the address that fails, why, and for how long.
pub fn status_body(
    cfg: &Config,
    fleet: Option<&FleetStatus>,
    admin: Option<&AdminFailure>,
    now_ms: u64,
    key: IdKey,
) -> Vec<u8> {
    status_body_with_load(cfg, fleet, admin, now_ms, key, &|_, _| None)
}

/// [`status_body`], where each host of a backend with `load` also shows its engine's load: `load(backend,
/// address)` gives what is known of the host's (shown as [`HostLoad::to_json`] writes it), and the backend
/// shows its `load` settings.
pub fn status_body_with_load(
    cfg: &Config,
    fleet: Option<&FleetStatus>,
    admin: Option<&AdminFailure>,
    now_ms: u64,
    key: IdKey,
    load: &dyn Fn(&crate::config::Backend, &str) -> Option<HostLoad>,
) -> Vec<u8> {
    let readiness = readiness(cfg, fleet, admin, now_ms);
    let backends: Vec<Value> = cfg
        .backends
        .iter()
        .map(|b| {
            let h = fleet.and_then(|f| f.backend(&b.name));
            let mut v = json!({
                "name": b.name,
                "kind": b.kind.as_str(),
                "hosts_from": if b.discovered() { "envoy" } else { "config" },
                "hosts": h.map(|h| host_list_with(h, key, &|a| {
                    let poll_ms = b.load.map(|l| l.poll_ms)?;
                    load(b, a).map(|l| l.to_json(b.kind, now_ms, poll_ms))
                })),
                "healthy_hosts": h.map(|h| h.healthy),
                "degraded_hosts": h.map(|h| h.degraded),
                "total_hosts": h.map(|h| h.total),
                "in_flight": h.map(|h| h.in_flight),
            });
            if let (Some(l), Some(o)) = (b.load, v.as_object_mut()) {
                o.insert(
                    "load".into(),
                    json!({ "poll_ms": l.poll_ms, "spill_queue": l.spill_queue }),
                );
            }
            v
        })
        .collect();
    let models: Vec<Value> = cfg
        .models
        .iter()
        .map(|a| {
            let names: Vec<&str> = a
                .routes
                .iter()
                .filter_map(|r| cfg.backend(r.backend).map(|b| b.name.as_str()))
                .collect();
            json!({
                "name": a.name,
                "ready": fleet.is_some_and(|f| alias_ready(cfg, f, a)),
                "backends": names,
            })
        })
        .collect();
    let snapshot = fleet.map(|f| {
        let age_ms = f.age_ms(now_ms);
        json!({ "age_ms": age_ms, "stale": age_ms > STALE_AFTER_MS })
    });
    json!({
        "object": "llmroute.status",
        "version": crate::envoy_contract::VERSION,
        "ready": readiness.is_ready(),
        "reason": readiness.reason(),
        "source": SOURCE,
        "poll_interval_ms": POLL_INTERVAL_MS,
        "snapshot": snapshot,
        "admin": admin.map(|a| json!({
            "address": a.address,
            "error": a.error,
            "failing_for_ms": a.failing_for_ms(now_ms),
        })),
        "backends": backends,
        "models": models,
    })
    .to_string()
    .into_bytes()
}

/// Each host of a backend as the status page shows it: its id under `key` ([`shown_id`]) and whether Envoy routes
/// to it. The address itself stays out of the page.
pub fn host_list(h: &BackendHealth, key: IdKey) -> Vec<Value> {
    host_list_with(h, key, &|_| None)
}

/// [`host_list`], each host with the `load` object `load(address)` gives, if any.
fn host_list_with(h: &BackendHealth, key: IdKey, load: &dyn Fn(&str) -> Option<Value>) -> Vec<Value> {
    h.hosts
        .iter()
        .map(|a| {
            let mut v = json!({
                "id": shown_host(key, a),
                "up": !h.down.contains(a),
            });
            if let (Some(l), Some(o)) = (load(a), v.as_object_mut()) {
                o.insert("load".into(), l);
            }
            v
        })
        .collect()
}

/// A host's id as the status page and the engine-load metrics show it: [`shown_id`] in 8 hex digits.
pub fn shown_host(key: IdKey, address: &str) -> String {
    format!("{:08x}", shown_id(key, address))
}

/// The secret under which the status page names hosts: 128 bits drawn once per Envoy process (the filter keeps it
/// in shared data, so every worker shows the same ids). Ids are stable while the process lives and change when it
/// restarts. Placement never uses them: the key table and the placement store name hosts by their address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdKey(pub [u64; 2]);

impl IdKey {
    pub fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        let (a, b) = out.split_at_mut(8);
        a.copy_from_slice(&self.0[0].to_le_bytes());
        b.copy_from_slice(&self.0[1].to_le_bytes());
        out
    }

    /// Reads [`IdKey::encode`]'s bytes; anything else is no key.
    pub fn decode(bytes: &[u8]) -> Option<IdKey> {
        let (a, b) = bytes.split_first_chunk::<8>()?;
        let b: [u8; 8] = b.try_into().ok()?;
        Some(IdKey([u64::from_le_bytes(*a), u64::from_le_bytes(b)]))
    }
}

/// A host's id on the status page: the low 32 bits of SipHash-2-4 of its `IP:PORT` under `key`. Without the key,
/// an id says nothing about the address; with it, only this process's page is read.
pub fn shown_id(key: IdKey, address: &str) -> u32 {
    // `SipHasher` is std's SipHash-2-4 with a caller's key, deprecated only in favour of `DefaultHasher`, which
    // takes no key.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(key.0[0], key.0[1]);
    std::hash::Hasher::write(&mut h, address.as_bytes());
    std::hash::Hasher::finish(&h) as u32
}

/// The `GET /readyz` answer: 200 when ready, else 503, with a one-line reason.
pub fn readyz(cfg: &Config, fleet: Option<&FleetStatus>, admin: Option<&AdminFailure>, now_ms: u64) -> (u32, Vec<u8>) {
    let r = readiness(cfg, fleet, admin, now_ms);
    let status = if r.is_ready() { 200 } else { 503 };
    let body = json!({ "ready": r.is_ready(), "reason": r.reason() });
    (status, body.to_string().into_bytes())
}

/// The `GET /healthz` body: the filter is running, so the process is alive.
pub fn healthz_body() -> Vec<u8> {
    br#"{"alive":true}"#.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_by_exact_path() {
        for p in StatusPage::ALL {
            assert_eq!(StatusPage::from_path(p.path()), Some(p));
        }
        for p in ["/llmroute/status/", "/llmroute", "/healthz/x", "/ready", "/READYZ", ""] {
            assert_eq!(StatusPage::from_path(p), None, "{p}");
        }
    }

    #[test]
    fn stat_values_as_string_or_number() {
        let s: AdminStat = serde_json::from_str(r#"{"name":"rq_active","value":"42"}"#).unwrap();
        assert_eq!(s.value, 42);
        let s: AdminStat = serde_json::from_str(r#"{"name":"rq_active","value":7}"#).unwrap();
        assert_eq!(s.value, 7);
        let s: AdminStat = serde_json::from_str(r#"{"type":"GAUGE","name":"rq_active"}"#).unwrap();
        assert_eq!(s.value, 0);
        let s: AdminStat = serde_json::from_str(r#"{"name":"rq_active","value":"x"}"#).unwrap();
        assert_eq!(s.value, 0);
    }

    #[test]
    fn host_states() {
        let h = |j: &str| serde_json::from_str::<HostHealth>(j).unwrap().state();
        assert_eq!(h(r#"{"eds_health_status":"HEALTHY"}"#), HostState::Healthy);
        assert_eq!(h(r#"{}"#), HostState::Healthy);
        assert_eq!(h(r#"{"eds_health_status":"UNKNOWN"}"#), HostState::Healthy);
        assert_eq!(h(r#"{"pending_dynamic_removal":true}"#), HostState::Healthy);
        for bad in [
            r#"{"failed_active_health_check":true,"eds_health_status":"HEALTHY"}"#,
            r#"{"failed_outlier_check":true}"#,
            r#"{"excluded_via_immediate_hc_fail":true}"#,
            r#"{"active_hc_timeout":true}"#,
            r#"{"pending_active_hc":true}"#,
            r#"{"eds_health_status":"UNHEALTHY"}"#,
            r#"{"eds_health_status":"DRAINING"}"#,
            r#"{"eds_health_status":"TIMEOUT"}"#,
            r#"{"failed_active_degraded_check":true,"failed_outlier_check":true}"#,
        ] {
            assert_eq!(h(bad), HostState::Unhealthy, "{bad}");
        }
        assert_eq!(h(r#"{"eds_health_status":"DEGRADED"}"#), HostState::Degraded);
        assert_eq!(h(r#"{"failed_active_degraded_check":true}"#), HostState::Degraded);
    }

    #[test]
    fn encode_round_trips() {
        let f = FleetStatus {
            taken_at_ms: 1_700_000_000_123,
            backends: vec![BackendHealth {
                name: "a".into(),
                healthy: 2,
                degraded: 1,
                total: 4,
                in_flight: 9,
                down: Vec::new(),
                hosts: vec!["10.0.0.1:8080".into()],
                weights: Vec::new(),
                active: vec![("10.0.0.1:8080".into(), 9)],
            }],
        };
        assert_eq!(FleetStatus::decode(&f.encode()), Some(f));
        assert_eq!(FleetStatus::decode(b"not json"), None);
        assert_eq!(FleetStatus::decode(b""), None);
    }

    #[test]
    fn polls_are_due_once_an_interval() {
        assert!(poll_due(0, 1_000_000));
        assert!(!poll_due(10_000, 10_000));
        assert!(!poll_due(10_000, 10_000 + POLL_INTERVAL_MS - 1));
        assert!(poll_due(10_000, 10_000 + POLL_INTERVAL_MS));
        assert!(
            !poll_due(10_000, 10_000 - POLL_INTERVAL_MS),
            "a claim just ahead of a skewed clock holds"
        );
        assert!(
            poll_due(10_000, 10_000 - POLL_INTERVAL_MS - 1),
            "a claim far in the future expires"
        );
        assert!(poll_due(u64::MAX, 0));
    }

    #[test]
    fn ages_never_underflow() {
        let f = FleetStatus {
            taken_at_ms: 5000,
            backends: vec![],
        };
        assert_eq!(f.age_ms(4000), 0);
        assert_eq!(f.age_ms(5250), 250);
    }
}
