//! Polling engine load, the pure part: which hosts a round reads and through which cluster, how long it waits,
//! how its answers and vLLM's ORCA reports update the readings kept in shared data, why a host gave none, and
//! how a host's load shows on the status page.
//!
//! A backend with `load: { poll_ms }` is polled by one root context per Envoy process every `poll_ms` (a lease
//! per backend in shared data, as for the status poll). A round sends one `GET /metrics` to each host
//! ([`targets`]): a listed endpoint through its probe cluster, a discovered host (one of the status poll's latest
//! fresh host list) through the backend's original-destination cluster, which the call names it to. Each call
//! waits at most [`timeout_ms`]; each page is read up to [`super::MAX_METRICS_BYTES`]. When every host has
//! answered or the time is up, the round's readings are merged into the backend's value ([`merge`]) and the
//! hosts that gave none are noted with their [`Problem`] ([`merge_problems`]). A host Envoy dropped stops being
//! polled; its reading ages out after [`keep_ms`].
//!
//! Requests never wait for a poll: placement reads the stored value and uses only the fresh readings
//! ([`super::fresh_at`]). So polling costs each request one shared-data read, and only on a backend with `load`.

use serde_json::{json, Value};

use super::orca::OrcaReport;
use super::{decode, encode, signals, with_orca, EngineLoad, MAX_HOSTS, STALE_POLLS};
use crate::config::{Backend, Config, EngineKind};
use crate::envoy_contract::{discovered_probe_cluster, probe_cluster};
use crate::fleet_check::MAX_PROBED_HOSTS;

/// The shortest time a round waits for its answers, whatever `poll_ms`: an engine busy with a batch may take a
/// moment to answer `/metrics`.
pub const MIN_TIMEOUT_MS: u64 = 250;
/// The longest time a round waits for its answers.
pub const MAX_TIMEOUT_MS: u64 = 2000;
/// How long a host's reading is kept after its last read, on top of its staleness: enough for the status page to
/// show a host whose engine stopped answering, short enough that a removed host's reading goes.
pub const KEEP_AFTER_STALE_MS: u64 = 60_000;

/// The backends whose engine load is polled.
pub fn polled_backends(cfg: &Config) -> impl Iterator<Item = &Backend> {
    cfg.backends.iter().filter(|b| b.load.is_some())
}

/// How long a round of a backend polled every `poll_ms` waits for its answers.
pub fn timeout_ms(poll_ms: u64) -> u64 {
    poll_ms.clamp(MIN_TIMEOUT_MS, MAX_TIMEOUT_MS)
}

/// True when a round polled every `poll_ms` is due at `now_ms`, given when the last one was claimed (0 for
/// never). A claim in the future (the clock stepped back) counts as expired, so polling never stalls.
pub fn due(last_claim_ms: u64, now_ms: u64, poll_ms: u64) -> bool {
    now_ms >= last_claim_ms.saturating_add(poll_ms) || last_claim_ms > now_ms.saturating_add(poll_ms)
}

/// How long after its read a reading is kept at all.
pub fn keep_ms(poll_ms: u64) -> u64 {
    poll_ms.saturating_mul(STALE_POLLS).saturating_add(KEEP_AFTER_STALE_MS)
}

/// One host a round reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The host as placement names it: a listed endpoint as configured (`IP:PORT` for an IP), a discovered
    /// host's `IP:PORT`.
    pub address: String,
    /// The cluster the call goes to.
    pub cluster: String,
    /// True when the call names its host in the original-destination header (a discovered host).
    pub original_dst: bool,
}

/// The hosts of `backend` one round reads at `now_ms`: each listed endpoint through its probe cluster; for a
/// discovered backend, the hosts of `hosts` (the status poll's latest list, `(taken_at_ms, sorted IP:PORTs)`)
/// when it is fresh, at most [`MAX_PROBED_HOSTS`], through the backend's original-destination cluster. The
/// filter never names an address the status poll did not list.
pub fn targets(backend: &Backend, now_ms: u64, hosts: Option<(u64, Vec<String>)>) -> Vec<Target> {
    if !backend.discovered() {
        return backend
            .endpoints
            .iter()
            .enumerate()
            .map(|(i, e)| Target {
                address: e.to_string(),
                cluster: probe_cluster(&backend.name, i),
                original_dst: false,
            })
            .collect();
    }
    let Some((taken_at_ms, list)) = hosts else {
        return Vec::new();
    };
    if now_ms.saturating_sub(taken_at_ms) > crate::host_poll::STALE_AFTER_MS {
        return Vec::new();
    }
    let cluster = discovered_probe_cluster(&backend.name);
    list.into_iter()
        .take(MAX_PROBED_HOSTS)
        .map(|address| Target {
            address,
            cluster: cluster.clone(),
            original_dst: true,
        })
        .collect()
}

/// Why one host's read gave no reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// `/metrics` answered this status (llama.cpp answers 501 without `--metrics`).
    Status(u32),
    /// No answer within the round's time (or the connection failed).
    Timeout,
    /// The page lacks the engine's queue gauge.
    NoGauge,
    /// The probe cluster could not be called (a bootstrap without it).
    NoCluster,
}

impl Problem {
    /// The `outcome` label of the reads counter.
    pub fn outcome(self) -> &'static str {
        match self {
            Problem::Status(_) | Problem::NoCluster => "error",
            Problem::Timeout => "timeout",
            Problem::NoGauge => "no_gauge",
        }
    }

    /// What an operator reads on the status page: a status, a metric name, a fix; never page content.
    pub fn reason(self, kind: EngineKind) -> String {
        match (self, kind) {
            (Problem::Status(501), EngineKind::LlamaCpp) => {
                "its /metrics answered 501: start llama-server with --metrics".to_string()
            }
            (Problem::Status(code), _) => format!("its /metrics answered {code}"),
            (Problem::Timeout, _) => "its /metrics did not answer within the poll's time".to_string(),
            (Problem::NoGauge, _) => {
                let gauge = signals(kind).map_or("its queue gauge", |s| s.queued);
                let hint = match kind {
                    EngineKind::LlamaCpp => " (llama.cpp needs --metrics)",
                    _ => "",
                };
                format!("its /metrics has no {gauge}{hint}")
            }
            (Problem::NoCluster, _) => {
                "its probe cluster cannot be called; `llmroute render` adds one per polled endpoint".to_string()
            }
        }
    }

    fn code(self) -> String {
        match self {
            Problem::Status(c) => c.to_string(),
            Problem::Timeout => "timeout".to_string(),
            Problem::NoGauge => "no_gauge".to_string(),
            Problem::NoCluster => "no_cluster".to_string(),
        }
    }

    fn parse(code: &str) -> Option<Problem> {
        Some(match code {
            "timeout" => Problem::Timeout,
            "no_gauge" => Problem::NoGauge,
            "no_cluster" => Problem::NoCluster,
            c => Problem::Status(c.parse().ok()?),
        })
    }
}

/// The reading of one answered call: the page of a 200, else the [`Problem`].
pub fn read_answer(kind: EngineKind, status: Option<u32>, page: &[u8], now_ms: u64) -> Result<EngineLoad, Problem> {
    match status {
        Some(200) => super::from_metrics(kind, page, now_ms).map_err(|_| Problem::NoGauge),
        Some(code) => Err(Problem::Status(code)),
        None => Err(Problem::Timeout),
    }
}

/// The backend's stored value (`stored`, [`super::encode`]d) with the round's `readings` in place of each
/// host's older one, and the readings older than [`keep_ms`] at `now_ms` dropped. At most [`MAX_HOSTS`] hosts.
pub fn merge(stored: &[u8], readings: &[(String, EngineLoad)], now_ms: u64, poll_ms: u64) -> Vec<u8> {
    let keep = keep_ms(poll_ms);
    let mut all: Vec<(String, EngineLoad)> = decode(stored)
        .into_iter()
        .filter(|(a, l)| now_ms.saturating_sub(l.at_ms) <= keep && !readings.iter().any(|(r, _)| r == a))
        .collect();
    all.extend(readings.iter().cloned());
    // Stable: of two entries for one address (a value written by hand), the later, the round's, stays.
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let mut once: Vec<(String, EngineLoad)> = Vec::with_capacity(all.len());
    for (a, l) in all {
        match once.last_mut() {
            Some(last) if last.0 == a => last.1 = l,
            _ => once.push((a, l)),
        }
    }
    once.truncate(MAX_HOSTS);
    encode(&once)
}

/// The stored value with the ORCA `report` of the host at `address`, received at `now_ms`, folded in
/// ([`super::with_orca`]). `None` when nothing worth a write changed: the report says what the reading already
/// says, and the reading is less than half a poll old.
pub fn fold_orca(stored: &[u8], address: &str, report: OrcaReport, now_ms: u64, poll_ms: u64) -> Option<Vec<u8>> {
    let mut all = decode(stored);
    let pos = all.iter().position(|(a, _)| a == address);
    let prev = pos.and_then(|p| all.get(p)).map(|(_, l)| *l);
    let next = with_orca(prev, report, now_ms)?;
    if let Some(p) = prev {
        let same = p.queued == next.queued && p.kv_permille == next.kv_permille;
        if same && now_ms.saturating_sub(p.at_ms) < poll_ms / 2 {
            return None;
        }
    }
    match pos {
        Some(p) => {
            if let Some(slot) = all.get_mut(p) {
                slot.1 = next;
            }
        }
        None if all.len() < MAX_HOSTS => all.push((address.to_string(), next)),
        None => return None,
    }
    Some(encode(&all))
}

/// The targeted hosts whose stored reading is stale at `now_ms` (a host never read is not counted).
pub fn stale_count(targets: &[Target], stored: &[(String, EngineLoad)], now_ms: u64, poll_ms: u64) -> usize {
    targets
        .iter()
        .filter(|t| {
            stored
                .iter()
                .any(|(a, l)| *a == t.address && !l.is_fresh(now_ms, poll_ms))
        })
        .count()
}

/// One host's last problem: its address, the problem, and when it was seen.
pub type Noted = (String, Problem, u64);

/// The form the hosts' problems are kept in: a line per host, `ADDRESS CODE AT_MS`.
pub fn encode_problems(problems: &[Noted]) -> Vec<u8> {
    let mut out = String::new();
    for (address, p, at) in problems.iter().take(MAX_HOSTS) {
        if address.is_empty() || address.contains([' ', '\n']) {
            continue;
        }
        out.push_str(&format!("{address} {} {at}\n", p.code()));
    }
    out.into_bytes()
}

/// Reads [`encode_problems`]' bytes; a malformed line is skipped.
pub fn decode_problems(bytes: &[u8]) -> Vec<Noted> {
    bytes
        .split(|&b| b == b'\n')
        .take(MAX_HOSTS)
        .filter_map(|line| {
            let mut f = std::str::from_utf8(line).ok()?.split(' ');
            let address = f.next().filter(|a| !a.is_empty())?.to_string();
            let problem = Problem::parse(f.next()?)?;
            let at = f.next()?.parse().ok()?;
            f.next().is_none().then_some((address, problem, at))
        })
        .collect()
}

/// The stored problems after a round: the hosts that gave a reading lose theirs, each host in `failed` gets its
/// new one, and problems older than [`keep_ms`] go. `None` when nothing changed (no write needed).
pub fn merge_problems(
    stored: &[u8],
    ok: &[String],
    failed: &[(String, Problem)],
    now_ms: u64,
    poll_ms: u64,
) -> Option<Vec<u8>> {
    let before = decode_problems(stored);
    let keep = keep_ms(poll_ms);
    let mut after: Vec<Noted> = before
        .iter()
        .filter(|(a, _, at)| {
            now_ms.saturating_sub(*at) <= keep && !ok.contains(a) && !failed.iter().any(|(f, _)| f == a)
        })
        .cloned()
        .collect();
    after.extend(failed.iter().map(|(a, p)| (a.clone(), *p, now_ms)));
    after.sort_by(|a, b| a.0.cmp(&b.0));
    let same = after.len() == before.len() && after.iter().zip(&before).all(|(x, y)| x.0 == y.0 && x.1 == y.1);
    (!same || !failed.is_empty()).then(|| encode_problems(&after))
}

/// What the status page shows of one host's load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostLoad {
    /// The last reading, fresh or not.
    pub reading: Option<EngineLoad>,
    /// Why the last read gave none, and when.
    pub problem: Option<(Problem, u64)>,
    /// Prompt tokens plus requested output of the requests placed on the host and not over yet.
    pub work_tokens: Option<u64>,
}

impl HostLoad {
    /// The host's `load` object on the status page: the queue, requests running, KV-cache use (a fraction),
    /// the reading's age and whether it is stale, the last problem, and the work in flight.
    pub fn to_json(&self, kind: EngineKind, now_ms: u64, poll_ms: u64) -> Value {
        let mut v = match &self.reading {
            Some(l) => {
                let age_ms = now_ms.saturating_sub(l.at_ms);
                json!({
                    "queued": l.queued,
                    "running": l.running,
                    "kv_cache_usage": l.kv_permille.map(|k| f64::from(k) / 1000.0),
                    "age_ms": age_ms,
                    "stale": !l.is_fresh(now_ms, poll_ms),
                })
            }
            None => json!({ "stale": true }),
        };
        if let Some(o) = v.as_object_mut() {
            if let Some((p, at)) = self.problem {
                o.insert("problem".into(), Value::from(p.reason(kind)));
                o.insert("problem_age_ms".into(), Value::from(now_ms.saturating_sub(at)));
            }
            if let Some(w) = self.work_tokens {
                o.insert("work_tokens".into(), Value::from(w));
            }
        }
        v
    }
}
