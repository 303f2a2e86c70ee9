//! The filter's overhead goals from issue 4, checked per case:
//! - at least 0.85× plain Envoy's requests/s at 4 KiB, and at least 0.6× at 256 KiB (loaded cases, c ≥ 16);
//! - at most 50 µs of added p50 latency at 4 KiB, judged unloaded (concurrency 1): under a saturating closed
//!   loop, latency is concurrency ÷ throughput (Little's law) and says nothing the throughput does not;
//! - more requests/s than each peer router, in every loaded case;
//! - the filter's VM memory per worker at most 8 MiB, and steady under load.
//!
//! Each throughput goal is also judged on CPU: plain Envoy's proxy CPU per request ÷ ours is the throughput
//! ratio a CPU-bound proxy reaches on a core of its own. It is the steadier figure on a shared machine, where
//! the scheduler shares a busy core per thread, which favours routers with more threads than Envoy's one worker.

use super::body::size_label;
use super::overhead::{CaseResult, Outcome};
use super::systems::Kind;

/// Concurrency at and above which a case is "loaded".
const LOADED: usize = 16;

/// One goal in one case.
#[derive(Debug, Clone)]
pub struct Check {
    pub case: String,
    pub goal: String,
    pub measured: String,
    /// `None` when it could not be measured (a peer is missing).
    pub met: Option<bool>,
    /// The same goal judged on proxy CPU per request, where that applies.
    pub by_cpu: Option<(String, Option<bool>)>,
}

/// `met`, `MISSED` or `n/a`.
pub fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "n/a",
    }
}

/// Every goal that applies to the cases that ran.
pub fn checks(outcome: &Outcome) -> Vec<Check> {
    let has_unloaded = outcome.cases.iter().any(|c| c.case.concurrency < LOADED);
    let mut out: Vec<Check> = outcome
        .cases
        .iter()
        .flat_map(|c| case_checks(c, has_unloaded))
        .collect();
    out.extend(memory_check(outcome));
    out
}

/// The VM memory per worker at the end of every case: at most [`VM_MEMORY_GOAL`], and steady: after the first
/// concurrency's pass over every body size it grows by at most [`VM_MEMORY_SLACK`] (wasm memory grows in 64 KiB
/// pages and never shrinks, so what the largest body needs is reached in that first pass). `None` when the gauge
/// was never read.
fn memory_check(outcome: &Outcome) -> Option<Check> {
    let first_c = outcome.cases.first()?.case.concurrency;
    let first_pass = outcome
        .cases
        .iter()
        .filter(|c| c.case.concurrency == first_c)
        .filter_map(|c| c.vm_bytes)
        .max()?;
    let peak = outcome.cases.iter().filter_map(|c| c.vm_bytes).max()?;
    let growth = peak.saturating_sub(first_pass);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    Some(Check {
        case: "every case".into(),
        goal: format!("VM memory per worker ≤ {} MiB, steady under load", VM_MEMORY_GOAL >> 20),
        measured: format!(
            "{:.2} MiB at most; {:.2} MiB after c={first_c}, grew {:.2} MiB after",
            mib(peak),
            mib(first_pass),
            mib(growth)
        ),
        met: Some(peak <= VM_MEMORY_GOAL && growth <= VM_MEMORY_SLACK),
        by_cpu: None,
    })
}

/// The goal for the filter's VM memory per worker.
pub const VM_MEMORY_GOAL: u64 = 8 << 20;
/// Growth after the first pass that still counts as steady: 16 wasm pages, the soak's own allowance.
const VM_MEMORY_SLACK: u64 = 1 << 20;

fn case_checks(c: &CaseResult, has_unloaded: bool) -> Vec<Check> {
    let loaded = c.case.concurrency >= LOADED;
    let mut out = Vec::new();
    if c.case.size == 4 << 10 && (!loaded || !has_unloaded) {
        out.push(latency_check(c));
    }
    if !loaded {
        return out;
    }
    let min = match c.case.size {
        s if s == 4 << 10 => Some(0.85),
        s if s == 256 << 10 => Some(0.6),
        _ => None,
    };
    out.extend(min.map(|min| ratio_check(c, min)));
    out.extend([Kind::Sglang, Kind::Vllm].map(|peer| peer_check(c, peer)));
    out
}

fn ratio_check(c: &CaseResult, min: f64) -> Check {
    let (r, cpu) = (c.ratio(Kind::Llmroute), c.cpu_ratio(Kind::Llmroute));
    Check {
        case: c.case.label(),
        goal: format!("req/s ≥ {min}× plain Envoy at {}", size_label(c.case.size)),
        measured: times(r),
        met: r.map(|r| r >= min),
        by_cpu: Some((times(cpu), cpu.map(|r| r >= min))),
    }
}

fn latency_check(c: &CaseResult) -> Check {
    let added = c.added_p50_us(Kind::Llmroute);
    let p50 = |k| c.p50_us(k).map_or("n/a".into(), |v| format!("{v:.0}"));
    Check {
        case: c.case.label(),
        goal: "added p50 ≤ 50 µs at 4 KiB".into(),
        measured: added.map_or("n/a".into(), |a| {
            format!(
                "{a:.0} µs (p50 {} µs against plain Envoy's {} µs)",
                p50(Kind::Llmroute),
                p50(Kind::PlainEnvoy)
            )
        }),
        met: added.map(|a| a <= 50.0),
        by_cpu: None,
    }
}

fn peer_check(c: &CaseResult, peer: Kind) -> Check {
    let (ours, theirs) = (c.rps(Kind::Llmroute), c.rps(peer));
    let (our_cpu, their_cpu) = (c.cpu_us(Kind::Llmroute), c.cpu_us(peer));
    Check {
        case: c.case.label(),
        goal: format!("req/s ahead of {}", peer.name()),
        measured: match (ours, theirs) {
            (Some(o), Some(t)) => format!("{o:.0} vs {t:.0} req/s ({:.2}×)", o / t),
            _ => "peer not measured".into(),
        },
        met: ours.zip(theirs).map(|(o, t)| o > t),
        by_cpu: Some(match (our_cpu, their_cpu) {
            (Some(o), Some(t)) => (format!("{o:.0} vs {t:.0} µs/req"), Some(o < t)),
            _ => ("peer not measured".into(), None),
        }),
    }
}

fn times(r: Option<f64>) -> String {
    r.map_or("n/a".into(), |r| format!("{r:.2}×"))
}
