//! The filter's overhead goals from issue 4, checked per case:
//! - at least 0.85× plain Envoy's requests/s at 4 KiB, and at least 0.6× at 256 KiB (loaded cases, c ≥ 16);
//! - at most 50 µs of added p50 latency at 4 KiB, judged unloaded (concurrency 1): under a saturating closed
//!   loop, latency is concurrency ÷ throughput (Little's law) and says nothing the throughput does not;
//! - more requests/s than each peer router, in every loaded case;
//! - the filter's VM memory per worker at most 8 MiB, and steady under load.
//!
//! The native build's goals from issue 28, checked per case on its own rows ([`Kind::Native`]):
//! - at least 0.90× plain Envoy's requests/s at 4 KiB and at least 0.80× at 256 KiB (loaded cases);
//! - at most 25 µs of added p50 latency unloaded (concurrency 1), at every body size;
//! - less proxy CPU per request than sglang-router at every body size (loaded cases, as the wasm build's peer
//!   goal).
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

/// The wasm build's least req/s ratio to plain Envoy, by body size (loaded cases).
const WASM_MIN_RATIO: [(usize, f64); 2] = [(4 << 10, 0.85), (256 << 10, 0.6)];
/// The wasm build's most added p50 at 4 KiB, µs.
const WASM_MAX_ADDED_P50_US: f64 = 50.0;
/// The native build's least req/s ratio to plain Envoy, by body size (loaded cases).
pub const NATIVE_MIN_RATIO: [(usize, f64); 2] = [(4 << 10, 0.90), (256 << 10, 0.80)];
/// The native build's most added p50 unloaded, at every body size, µs.
pub const NATIVE_MAX_ADDED_P50_US: f64 = 25.0;

fn min_ratio(table: &[(usize, f64)], size: usize) -> Option<f64> {
    table.iter().find(|(s, _)| *s == size).map(|(_, min)| *min)
}

fn case_checks(c: &CaseResult, has_unloaded: bool) -> Vec<Check> {
    let loaded = c.case.concurrency >= LOADED;
    let mut out = Vec::new();
    if c.case.size == 4 << 10 && (!loaded || !has_unloaded) {
        out.push(latency_check(c, Kind::Llmroute, WASM_MAX_ADDED_P50_US, "at 4 KiB"));
    }
    if !loaded || !has_unloaded {
        out.push(latency_check(c, Kind::Native, NATIVE_MAX_ADDED_P50_US, "unloaded"));
    }
    if !loaded {
        return out;
    }
    out.extend(min_ratio(&WASM_MIN_RATIO, c.case.size).map(|min| ratio_check(c, Kind::Llmroute, min)));
    out.extend([Kind::Sglang, Kind::Vllm].map(|peer| peer_check(c, peer)));
    out.extend(min_ratio(&NATIVE_MIN_RATIO, c.case.size).map(|min| ratio_check(c, Kind::Native, min)));
    out.push(cpu_below_check(c, Kind::Native, Kind::Sglang));
    out
}

/// `native: ` before the native build's goals; nothing before the wasm build's.
fn prefix(kind: Kind) -> &'static str {
    if kind.is_native() {
        "native: "
    } else {
        ""
    }
}

fn ratio_check(c: &CaseResult, kind: Kind, min: f64) -> Check {
    let (r, cpu) = (c.ratio(kind), c.cpu_ratio(kind));
    Check {
        case: c.case.label(),
        goal: format!(
            "{}req/s ≥ {min}× plain Envoy at {}",
            prefix(kind),
            size_label(c.case.size)
        ),
        measured: times(r),
        met: r.map(|r| r >= min),
        by_cpu: Some((times(cpu), cpu.map(|r| r >= min))),
    }
}

/// `kind`'s added p50 against plain Envoy's, at most `max` µs; `at` says where the goal applies.
fn latency_check(c: &CaseResult, kind: Kind, max: f64, at: &str) -> Check {
    let added = c.added_p50_us(kind);
    let p50 = |k| c.p50_us(k).map_or("n/a".into(), |v| format!("{v:.0}"));
    Check {
        case: c.case.label(),
        goal: format!("{}added p50 ≤ {max:.0} µs {at}", prefix(kind)),
        measured: added.map_or("n/a".into(), |a| {
            format!(
                "{a:.0} µs (p50 {} µs against plain Envoy's {} µs)",
                p50(kind),
                p50(Kind::PlainEnvoy)
            )
        }),
        met: added.map(|a| a <= max),
        by_cpu: None,
    }
}

/// `kind`'s proxy CPU per request below `peer`'s; judged on CPU alone, so it has no second verdict.
fn cpu_below_check(c: &CaseResult, kind: Kind, peer: Kind) -> Check {
    let (ours, theirs) = (c.cpu_us(kind), c.cpu_us(peer));
    Check {
        case: c.case.label(),
        goal: format!("{}proxy CPU per request below {}'s", prefix(kind), peer.name()),
        measured: match (ours, theirs) {
            (Some(o), Some(t)) => format!("{o:.0} vs {t:.0} µs/req"),
            _ => "not measured".into(),
        },
        met: ours.zip(theirs).map(|(o, t)| o < t),
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

#[cfg(test)]
mod tests {
    use super::super::overhead::sample;
    use super::*;

    fn find<'a>(checks: &'a [Check], case: &str, goal: &str) -> &'a Check {
        let found = checks.iter().find(|c| c.case == case && c.goal == goal);
        found.unwrap_or_else(|| panic!("no check {case:?} {goal:?} in {checks:#?}"))
    }

    #[test]
    fn the_native_goals_are_judged_from_the_measured_figures() {
        let checks = checks(&sample::outcome());
        let c = find(&checks, "4 KiB c=16", "native: req/s ≥ 0.9× plain Envoy at 4 KiB");
        assert_eq!((c.measured.as_str(), c.met), ("0.95×", Some(true)));
        assert_eq!(c.by_cpu, Some(("0.95×".to_string(), Some(true))));
        let c = find(&checks, "256 KiB c=16", "native: req/s ≥ 0.8× plain Envoy at 256 KiB");
        assert_eq!((c.measured.as_str(), c.met), ("0.75×", Some(false)));
        assert_eq!(c.by_cpu, Some(("0.75×".to_string(), Some(false))));
        for case in ["4 KiB c=1", "256 KiB c=1"] {
            let c = find(&checks, case, "native: added p50 ≤ 25 µs unloaded");
            assert_eq!(c.met, Some(true), "{case}");
            assert_eq!(c.measured, "10 µs (p50 310 µs against plain Envoy's 300 µs)");
        }
        let c = find(
            &checks,
            "256 KiB c=16",
            "native: proxy CPU per request below sglang-router's",
        );
        assert_eq!((c.measured.as_str(), c.met), ("133 vs 150 µs/req", Some(true)));
        assert!(
            !checks
                .iter()
                .any(|c| c.case.ends_with("c=16") && c.goal.starts_with("native: added p50")),
            "latency is judged unloaded when c=1 ran"
        );
        // The wasm build's goals are unchanged beside them.
        let c = find(&checks, "4 KiB c=16", "req/s ≥ 0.85× plain Envoy at 4 KiB");
        assert_eq!(c.met, Some(true));
        let c = find(&checks, "4 KiB c=1", "added p50 ≤ 50 µs at 4 KiB");
        assert_eq!(c.met, Some(true));
    }

    #[test]
    fn a_native_verdict_follows_the_figures_and_is_na_when_the_row_is_missing() {
        let mut o = sample::outcome();
        fn native_rounds(c: &mut CaseResult) -> &mut Vec<super::super::overhead::Measure> {
            let runs = c.systems.iter_mut().find(|r| r.kind == Kind::Native);
            runs.map(|r| &mut r.rounds).unwrap()
        }
        for m in native_rounds(&mut o.cases[0]).iter_mut() {
            m.p50_us = Some(326.0);
        }
        for m in native_rounds(&mut o.cases[2]).iter_mut() {
            m.cpu_per_req = Some(151e-6);
        }
        o.cases[3].systems.retain(|r| r.kind != Kind::Native);
        let checks = checks(&o);
        let c = find(&checks, "4 KiB c=1", "native: added p50 ≤ 25 µs unloaded");
        assert_eq!(c.met, Some(false), "{c:?}");
        let c = find(
            &checks,
            "4 KiB c=16",
            "native: proxy CPU per request below sglang-router's",
        );
        assert_eq!((c.measured.as_str(), c.met), ("151 vs 150 µs/req", Some(false)));
        // Plain Envoy's CPU per request is 100 µs there, so the CPU ratio falls below the goal too.
        let c = find(&checks, "4 KiB c=16", "native: req/s ≥ 0.9× plain Envoy at 4 KiB");
        assert_eq!(c.by_cpu.as_ref().and_then(|(_, met)| *met), Some(false));
        let c = find(&checks, "256 KiB c=16", "native: req/s ≥ 0.8× plain Envoy at 256 KiB");
        assert_eq!((c.measured.as_str(), c.met), ("n/a", None));
        let c = find(
            &checks,
            "256 KiB c=16",
            "native: proxy CPU per request below sglang-router's",
        );
        assert_eq!((c.measured.as_str(), c.met), ("not measured", None));
    }
}
