//! The routing goals of issue 4, checked on its four workloads (not the tenants ones, which only compare the
//! policies) for every llmroute CHWBL balance factor that ran:
//!
//! 1. On the workloads that share prefixes, the hit rate is at least 0.9 × the oracle's, and at least what
//!    sglang-router's `cache_aware` reaches on the same trace (within 0.01).
//! 2. On every workload, the busiest engine's request count ÷ the mean is at most the configured bound
//!    (`balance_factor` ÷ 100).
//! 3. On the low-sharing control, no loss against llmroute with `least_request` (the same proxy without
//!    affinity): a hit rate no lower (0.01 slack), TTFT p50 at most 1.10× + 0.5 ms and p99 at most 1.25× + 2 ms
//!    (slack for a shared 2-core machine).
//!
//! A missed goal carries a note: what the figures say about why, and what would close it.

use super::policy::Policy;
use super::workload::Workload;
use super::{Cell, Outcome};

/// Share of the oracle's hit rate to reach.
pub const ORACLE_SHARE: f64 = 0.9;
/// Hit rates within this of sglang's count as level: the same policy moves by about that much from run to run,
/// because Envoy places hosts on the ring by address and every run's engines listen on new ports.
pub const SGLANG_SLACK: f64 = 0.01;
/// No-loss slack on the control: hit rate (absolute), TTFT p50 (ratio, ms), TTFT p99 (ratio, ms).
const HIT_SLACK: f64 = 0.01;
const P50_SLACK: (f64, f64) = (1.10, 0.5);
const P99_SLACK: (f64, f64) = (1.25, 2.0);

/// One goal for one workload and policy.
#[derive(Debug, Clone)]
pub struct Check {
    pub workload: Workload,
    pub policy: Policy,
    pub goal: String,
    pub measured: String,
    /// `None` when it could not be measured (a peer is missing).
    pub met: Option<bool>,
    /// For a missed goal: why, and what would close it.
    pub note: Option<String>,
}

/// `met`, `MISSED` or `n/a`.
pub fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "n/a",
    }
}

/// Every goal that applies to what ran.
pub fn checks(o: &Outcome) -> Vec<Check> {
    let mut out = Vec::new();
    for &w in o.settings.workloads.iter().filter(|w| w.in_issue()) {
        for &p in &o.settings.policies {
            let (Some(bound), Some(cell)) = (p.bound(), o.cell(w, p)) else {
                continue;
            };
            if w.shares_prefixes() {
                out.push(oracle_check(o, cell));
                out.push(sglang_check(o, cell));
            }
            out.push(bound_check(o, cell, bound));
            if !w.shares_prefixes() {
                out.extend(control_checks(o, cell));
            }
        }
    }
    out
}

fn check(cell: &Cell, goal: String, measured: String, met: Option<bool>, note: impl FnOnce() -> String) -> Check {
    Check {
        workload: cell.workload,
        policy: cell.policy,
        goal,
        measured,
        note: (met == Some(false)).then(note),
        met,
    }
}

fn f3(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

fn oracle_check(o: &Outcome, cell: &Cell) -> Check {
    let oracle = o.trace(cell.workload).map(|t| t.oracle);
    let hit = cell.hit_rate();
    let met = hit.zip(oracle).map(|(h, or)| h >= ORACLE_SHARE * or);
    let ratio = hit.zip(oracle).map(|(h, or)| h / or.max(1e-9));
    check(
        cell,
        format!("hit rate ≥ {ORACLE_SHARE} × oracle"),
        format!("{} = {}× oracle {}", f3(hit), f3(ratio), f3(oracle)),
        met,
        || oracle_note(o, cell),
    )
}

/// Why a policy stays under 0.9 × the oracle.
fn oracle_note(o: &Outcome, cell: &Cell) -> String {
    let w = cell.workload;
    let trace = o.trace(w);
    let capacity = o.settings.engines * o.settings.cache_blocks;
    let fit = trace.map_or(String::new(), |t| {
        format!(
            " The fleet's caches hold {capacity} blocks against {} distinct blocks in the trace ({:.0}%), so even \
             a perfect partition evicts.",
            t.distinct_blocks,
            capacity as f64 * 100.0 / t.distinct_blocks.max(1) as f64
        )
    });
    let best = o
        .measured_policies()
        .into_iter()
        .filter_map(|p| Some((p, o.cell(w, p)?.hit_rate()?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let best = best.map_or(String::new(), |(p, h)| {
        format!(" The best policy here, {}, reached {h:.3}.", p.label())
    });
    let spill = spill_note(o, w);
    format!(
        "The oracle has an infinite cache shared by every engine, and the engines here have finite LRU caches.{fit}{best}{spill} \
         Closing it: larger engine caches (the oracle gap shrinks as the fleet's cache approaches the trace's \
         distinct blocks), or fewer keys per engine."
    )
}

/// What the balance factors say about hits lost to load-bound spills on workload `w`.
fn spill_note(o: &Outcome, w: crate::bench::routing::workload::Workload) -> String {
    let factors: Vec<(u32, f64)> = o
        .settings
        .policies
        .iter()
        .filter_map(|&p| match p {
            Policy::Chwbl(f) => Some((f, o.cell(w, p)?.hit_rate()?)),
            _ => None,
        })
        .collect();
    let (Some(low), Some(high)) = (
        factors.iter().min_by_key(|(f, _)| *f),
        factors.iter().max_by_key(|(f, _)| *f),
    ) else {
        return String::new();
    };
    if high.0 > low.0 && high.1 > low.1 + 0.01 {
        format!(
            " Here a looser bound keeps more hits (factor {}: {:.3}, factor {}: {:.3}).",
            low.0, low.1, high.0, high.1
        )
    } else {
        String::new()
    }
}

fn sglang_check(o: &Outcome, cell: &Cell) -> Check {
    let sglang = o.cell(cell.workload, Policy::SglangCacheAware).and_then(Cell::hit_rate);
    let hit = cell.hit_rate();
    let met = hit.zip(sglang).map(|(h, s)| h + SGLANG_SLACK >= s);
    check(
        cell,
        format!("hit rate ≥ sglang cache_aware − {SGLANG_SLACK}"),
        format!("{} vs {}", f3(hit), f3(sglang)),
        met,
        || sglang_note(o, cell),
    )
}

/// Why llmroute's hit rate trails sglang's `cache_aware` on one workload, and what the trade bought.
fn sglang_note(o: &Outcome, cell: &Cell) -> String {
    let w = cell.workload;
    let keys = o.trace(w).map_or(0, |t| t.keys);
    let sglang = o.cell(w, Policy::SglangCacheAware);
    let ms = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.0} ms"));
    let tail = match sglang {
        Some(s) => format!(
            " Alongside: engine TTFT p99 {} against sglang's {}, busiest ÷ mean {} against {}.",
            ms(cell.engine_ttft_p99_ms()),
            ms(s.engine_ttft_p99_ms()),
            f2(cell.busiest_over_mean()),
            f2(s.busiest_over_mean())
        ),
        None => String::new(),
    };
    format!(
        "sglang's cache_aware keeps a radix tree of the prompts it routed: a prompt goes to the worker holding its \
         longest match, and a new prefix to the worker whose tree is smallest, so prefixes spread evenly over the \
         caches and it balances load only past large thresholds (by default 64 requests and 1.5×). llmroute hashes \
         one key per request ({}) onto Envoy's ring, statelessly: with {keys} keys over {} engines some engines \
         get more prefixes than others (the placement changes with the engines' addresses, hence the range over \
         repeats), so their LRU caches evict more; and the load bound sends a busy key's overflow to engines \
         without its prefix.{}{tail} Closing it: larger caches make the uneven split harmless; a looser factor \
         keeps more hits at the price of the tail; matching sglang exactly needs cache state in the router, which \
         llmroute leaves out on purpose.",
        key_of(w),
        o.settings.engines,
        spill_note(o, w)
    )
}

fn f2(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The affinity key llmroute computes on a workload.
fn key_of(w: Workload) -> &'static str {
    match w {
        Workload::SharedPrefix | Workload::Zipf | Workload::Tenants6 | Workload::Tenants12 | Workload::Tenants24 => {
            "the system prompt"
        }
        Workload::MultiTurn | Workload::Control => "the first 256 bytes of the first user message",
    }
}

fn bound_check(o: &Outcome, cell: &Cell, bound: f64) -> Check {
    let busiest = cell.busiest_over_mean();
    let met = busiest.map(|b| b <= bound + 1e-9);
    check(
        cell,
        format!("busiest ÷ mean ≤ {bound:.2}"),
        busiest.map_or("-".into(), |b| format!("{b:.3}")),
        met,
        || {
            let hot = if cell.workload == Workload::Zipf {
                " On the Zipf trace one key carries a large share of all requests."
            } else {
                ""
            };
            format!(
                "Envoy bounds each host's *active* requests at the factor × the mean (computed over the requests in \
                 flight, rounded up), not its share of all requests. With few requests in flight per engine \
                 (here at most {} slots each), ceil() leaves room above the factor, and cache hits finish faster, \
                 so the warm engine takes more requests in total.{hot} Closing it: a tighter factor for the same \
                 count bound, or more requests in flight per host, where the rounding matters less.",
                o.settings.cost.slots
            )
        },
    )
}

fn control_checks(o: &Outcome, cell: &Cell) -> Vec<Check> {
    let base = o.cell(cell.workload, Policy::LeastRequest);
    let pick = |c: Option<&Cell>, f: fn(&Cell) -> Option<f64>| c.and_then(f);
    let hit = (cell.hit_rate(), pick(base, Cell::hit_rate));
    let p50 = (cell.ttft_p50_ms(), pick(base, Cell::ttft_p50_ms));
    let p99 = (cell.ttft_p99_ms(), pick(base, Cell::ttft_p99_ms));
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1} ms"));
    let why = || {
        "With unique prompts there is nothing to keep warm, so every request costs the same and only the spread \
         matters. Hashing unique keys spreads them at random, up to the load bound; least_request looks at the \
         requests in flight on two random hosts and picks the lighter, which queues less. Closing it: a tighter \
         balance factor (it spills sooner); or, since a key only pays when prefixes repeat, turning the \
         user-prefix fallback off (`user_prefix_bytes: 0`) and sending keyless requests to a least_request twin \
         of the cluster over the same endpoints. The filter already picks the cluster by header; the renderer \
         does not render such a twin yet."
            .to_string()
    };
    vec![
        check(
            cell,
            "no loss vs least_request: hit rate".into(),
            format!("{} vs {}", f3(hit.0), f3(hit.1)),
            hit.0.zip(hit.1).map(|(a, b)| a + HIT_SLACK >= b),
            why,
        ),
        check(
            cell,
            format!(
                "no loss vs least_request: TTFT p50 (≤ {}× + {} ms)",
                P50_SLACK.0, P50_SLACK.1
            ),
            format!("{} vs {}", ms(p50.0), ms(p50.1)),
            p50.0.zip(p50.1).map(|(a, b)| a <= b * P50_SLACK.0 + P50_SLACK.1),
            why,
        ),
        check(
            cell,
            format!(
                "no loss vs least_request: TTFT p99 (≤ {}× + {} ms)",
                P99_SLACK.0, P99_SLACK.1
            ),
            format!("{} vs {}", ms(p99.0), ms(p99.1)),
            p99.0.zip(p99.1).map(|(a, b)| a <= b * P99_SLACK.0 + P99_SLACK.1),
            why,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::sample;
    use super::*;

    #[test]
    fn goals_on_the_sample() {
        let o = sample::outcome();
        let checks = checks(&o);
        // 3 sharing workloads × (oracle, sglang, bound) + control × (bound, 3 no-loss), for chwbl 125 only.
        assert_eq!(checks.len(), 3 * 3 + 4);
        let find = |w: Workload, goal: &str| {
            checks
                .iter()
                .find(|c| c.workload == w && c.goal.starts_with(goal))
                .unwrap()
        };
        let oracle = find(Workload::SharedPrefix, "hit rate ≥ 0.9");
        assert_eq!(oracle.met, Some(true), "{oracle:?}");
        assert!(oracle.note.is_none());
        assert_eq!(find(Workload::SharedPrefix, "hit rate ≥ sglang").met, Some(true));
        // 40 of 100 requests on one engine: 1.2 > 1.25? No: 1.2 ≤ 1.25.
        assert_eq!(find(Workload::Zipf, "busiest").met, Some(true));
        let p50 = find(Workload::Control, "no loss vs least_request: TTFT p50");
        assert_eq!(p50.met, Some(true), "{p50:?}");
        assert_eq!(verdict(None), "n/a");
    }

    #[test]
    fn a_missed_goal_says_why() {
        let mut o = sample::outcome();
        for c in &mut o.cells {
            if c.policy == Policy::Chwbl(125) {
                c.runs[0].hit_rate = c.runs[0].hit_rate.map(|h| h * 0.5);
                c.runs[0].per_engine = vec![80, 10, 10];
            }
        }
        let checks = checks(&o);
        let missed: Vec<&Check> = checks.iter().filter(|c| c.met == Some(false)).collect();
        assert!(missed.iter().any(|c| c.goal.starts_with("hit rate ≥ 0.9")));
        assert!(missed.iter().any(|c| c.goal.starts_with("busiest")));
        assert!(missed.iter().all(|c| c.note.as_ref().is_some_and(|n| n.len() > 40)));
    }
}
