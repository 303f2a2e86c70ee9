//! Engine load: what each engine says it is doing, read from its own metrics, and how fresh that is.
//!
//! Placement by affinity alone cannot see an engine that is drowning: Envoy counts only this proxy's own
//! requests in flight, not the engine's queue, and not the work other gateways sent. Engines report their state
//! as gauges on `/metrics` (and vLLM also per response, as an ORCA report):
//!
//! | kind | running | queued | KV-cache use |
//! |---|---|---|---|
//! | llama.cpp (`--metrics`) | `llamacpp:requests_processing` | `llamacpp:requests_deferred` | none |
//! | vLLM | `vllm:num_requests_running` | `vllm:num_requests_waiting` | `vllm:kv_cache_usage_perc` |
//! | SGLang | `sglang:num_running_reqs` | `sglang:num_queue_reqs` | `sglang:token_usage` |
//!
//! Ollama and hosted OpenAI-style backends report no queue: [`signals`] is `None` and placement keeps counting
//! requests in flight. A reading older than [`STALE_POLLS`] polls is stale ([`EngineLoad::is_fresh`]): placement
//! then falls back to request counts for that host, as if it had no reading.
//!
//! The readings of one backend travel as one shared-data value ([`encode`], [`decode`]): the form the poller (one
//! per Envoy, see [`poll`]) writes and each request reads back. Both are a pure function of bytes, so the writer
//! and every reader agree however many workers read them. A backend's `load: { poll_ms, spill_queue }` turns the
//! poll on; bounded-keys placement then reads the fresh readings into `HostView::queued`
//! (`key_placement::views`).

pub mod orca;
pub mod poll;
pub mod prometheus;

use crate::config::EngineKind;

/// The path polled on each host.
pub const METRICS_PATH: &str = "/metrics";

/// The largest `/metrics` page read; a bigger one is cut at this size (the gauges that matter come early on
/// every engine named in [`signals`], and the scan stays bounded).
pub const MAX_METRICS_BYTES: usize = 256 * 1024;

/// A reading older than this many polls is stale.
pub const STALE_POLLS: u64 = 3;

/// The gauge names that carry one engine kind's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signals {
    pub running: &'static str,
    pub queued: &'static str,
    /// KV-cache use as a fraction (0 to 1), when the engine reports one.
    pub kv_usage: Option<&'static str>,
}

/// The gauges of `kind`, `None` when the engine reports no load (Ollama, hosted OpenAI-style backends).
pub fn signals(kind: EngineKind) -> Option<Signals> {
    match kind {
        EngineKind::LlamaCpp => Some(Signals {
            running: "llamacpp:requests_processing",
            queued: "llamacpp:requests_deferred",
            kv_usage: None,
        }),
        EngineKind::Vllm => Some(Signals {
            running: "vllm:num_requests_running",
            queued: "vllm:num_requests_waiting",
            kv_usage: Some("vllm:kv_cache_usage_perc"),
        }),
        EngineKind::Sglang => Some(Signals {
            running: "sglang:num_running_reqs",
            queued: "sglang:num_queue_reqs",
            kv_usage: Some("sglang:token_usage"),
        }),
        EngineKind::Ollama | EngineKind::OpenAi => None,
    }
}

/// One host's load as its engine last reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineLoad {
    /// Requests the engine is running.
    pub running: u32,
    /// Requests waiting in the engine's own queue.
    pub queued: u32,
    /// KV-cache use in thousandths, when reported.
    pub kv_permille: Option<u16>,
    /// When it was read (the poll's clock, or an ORCA report's arrival).
    pub at_ms: u64,
}

impl EngineLoad {
    /// True while the reading is at most [`STALE_POLLS`] polls of `poll_ms` old.
    pub fn is_fresh(&self, now_ms: u64, poll_ms: u64) -> bool {
        now_ms.saturating_sub(self.at_ms) <= poll_ms.saturating_mul(STALE_POLLS)
    }
}

/// Why a `/metrics` page gave no reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// The engine kind reports no load.
    NoSignals,
    /// The page lacks the queue gauge: for llama.cpp, the server was started without `--metrics` (its `/metrics`
    /// then answers 501), or it is not the engine the config names.
    MissingGauge(&'static str),
}

impl ReadError {
    /// A short reason for the status page and the log: a metric name, never page content.
    pub fn reason(&self) -> String {
        match self {
            ReadError::NoSignals => "this engine kind reports no load".to_string(),
            ReadError::MissingGauge(name) => format!("its /metrics has no {name} (llama.cpp needs --metrics)"),
        }
    }
}

/// The load in one `/metrics` page of a `kind` engine, read at `now_ms`. The page is read up to
/// [`MAX_METRICS_BYTES`].
pub fn from_metrics(kind: EngineKind, page: &[u8], now_ms: u64) -> Result<EngineLoad, ReadError> {
    let s = signals(kind).ok_or(ReadError::NoSignals)?;
    let page = page.get(..MAX_METRICS_BYTES).unwrap_or(page);
    let got = match s.kv_usage {
        Some(kv) => prometheus::gauges(page, &[s.running, s.queued, kv]),
        None => prometheus::gauges(page, &[s.running, s.queued]),
    };
    let value = |i: usize| got.get(i).copied().flatten();
    let queued = value(1).ok_or(ReadError::MissingGauge(s.queued))?;
    Ok(EngineLoad {
        running: count(value(0).unwrap_or(0.0)),
        queued: count(queued),
        kv_permille: value(2).map(permille),
        at_ms: now_ms,
    })
}

/// `prev` with an ORCA report that arrived at `now_ms` folded in: the queue and KV use it reports replace the
/// poll's; requests running come from the last poll (ORCA does not report them). With no earlier reading, the
/// report alone counts, with 0 running.
pub fn with_orca(prev: Option<EngineLoad>, report: orca::OrcaReport, now_ms: u64) -> Option<EngineLoad> {
    let queued = report.queued.map(count).or(prev.map(|p| p.queued))?;
    Some(EngineLoad {
        running: prev.map_or(0, |p| p.running),
        queued,
        kv_permille: report.kv_usage.map(permille).or(prev.and_then(|p| p.kv_permille)),
        at_ms: now_ms,
    })
}

/// A gauge as a whole count, rounded to nearest, at most `u32::MAX`.
fn count(v: f64) -> u32 {
    // `as` saturates on floats, and the value is finite and non-negative (see `prometheus::gauges`).
    v.round() as u32
}

/// A fraction as thousandths, at most 1000.
fn permille(v: f64) -> u16 {
    (v.clamp(0.0, 1.0) * 1000.0).round() as u16
}

/// The most hosts one encoded value holds; more are dropped, like the status page's host list.
pub const MAX_HOSTS: usize = 1024;

/// One backend's readings as one shared-data value: a line per host, `ADDRESS RUNNING QUEUED KV AT_MS`, with
/// `-` for an unreported KV use. Addresses hold no space or newline (Envoy names hosts `IP:PORT`).
pub fn encode(readings: &[(String, EngineLoad)]) -> Vec<u8> {
    let mut out = String::new();
    for (address, l) in readings.iter().take(MAX_HOSTS) {
        if address.is_empty() || address.contains([' ', '\n']) {
            continue;
        }
        let kv = l.kv_permille.map_or("-".to_string(), |k| k.to_string());
        out.push_str(&format!("{address} {} {} {kv} {}\n", l.running, l.queued, l.at_ms));
    }
    out.into_bytes()
}

/// Reads [`encode`]'s bytes; a malformed line is skipped.
pub fn decode(bytes: &[u8]) -> Vec<(String, EngineLoad)> {
    bytes
        .split(|&b| b == b'\n')
        .take(MAX_HOSTS)
        .filter_map(|line| {
            let line = std::str::from_utf8(line).ok()?;
            let mut f = line.split(' ');
            let address = f.next().filter(|a| !a.is_empty())?.to_string();
            let running = f.next()?.parse().ok()?;
            let queued = f.next()?.parse().ok()?;
            let kv = match f.next()? {
                "-" => None,
                k => Some(k.parse::<u16>().ok()?.min(1000)),
            };
            let at_ms = f.next()?.parse().ok()?;
            f.next().is_none().then_some((
                address,
                EngineLoad {
                    running,
                    queued,
                    kv_permille: kv,
                    at_ms,
                },
            ))
        })
        .collect()
}

/// The fresh reading of each of `addresses` in `readings`, `None` where there is none or it is stale.
pub fn fresh_at(
    addresses: &[String],
    readings: &[(String, EngineLoad)],
    now_ms: u64,
    poll_ms: u64,
) -> Vec<Option<EngineLoad>> {
    addresses
        .iter()
        .map(|a| {
            readings
                .iter()
                .find(|(r, _)| r == a)
                .map(|(_, l)| *l)
                .filter(|l| l.is_fresh(now_ms, poll_ms))
        })
        .collect()
}
