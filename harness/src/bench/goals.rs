//! The filter's overhead goals from issue 4, checked per case:
//! - at least 0.85× plain Envoy's requests/s at 4 KiB, and at least 0.6× at 256 KiB;
//! - at most 50 µs of added p50 latency at 4 KiB;
//! - more requests/s than each peer router, in every case.

use super::body::size_label;
use super::overhead::{CaseResult, Outcome};
use super::systems::Kind;

/// One goal in one case.
#[derive(Debug, Clone)]
pub struct Check {
    pub case: String,
    pub goal: String,
    pub measured: String,
    /// `None` when it could not be measured (a peer is missing).
    pub met: Option<bool>,
}

impl Check {
    pub fn verdict(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "n/a",
        }
    }
}

/// Every goal that applies to the cases that ran.
pub fn checks(outcome: &Outcome) -> Vec<Check> {
    outcome.cases.iter().flat_map(case_checks).collect()
}

fn case_checks(c: &CaseResult) -> Vec<Check> {
    let label = c.case.label();
    let mut out = Vec::new();
    let ratio_goal = match c.case.size {
        s if s == 4 << 10 => Some(0.85),
        s if s == 256 << 10 => Some(0.6),
        _ => None,
    };
    if let Some(min) = ratio_goal {
        let r = c.ratio(Kind::Llmroute);
        out.push(Check {
            case: label.clone(),
            goal: format!("req/s ≥ {min}× plain Envoy at {}", size_label(c.case.size)),
            measured: r.map_or("n/a".into(), |r| format!("{r:.2}×")),
            met: r.map(|r| r >= min),
        });
    }
    if c.case.size == 4 << 10 {
        let added = c.added_p50_us(Kind::Llmroute);
        out.push(Check {
            case: label.clone(),
            goal: "added p50 ≤ 50 µs at 4 KiB".into(),
            measured: added.map_or("n/a".into(), |a| format!("{a:.0} µs")),
            met: added.map(|a| a <= 50.0),
        });
    }
    for peer in [Kind::Sglang, Kind::Vllm] {
        let (ours, theirs) = (c.rps(Kind::Llmroute), c.rps(peer));
        out.push(Check {
            case: label.clone(),
            goal: format!("req/s ahead of {}", peer.name()),
            measured: match (ours, theirs) {
                (Some(o), Some(t)) => format!("{o:.0} vs {t:.0} req/s ({:.2}×)", o / t),
                _ => "peer not measured".into(),
            },
            met: ours.zip(theirs).map(|(o, t)| o > t),
        });
    }
    out
}
