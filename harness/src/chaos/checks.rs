//! The invariants of a chaos run, as pure functions over what the run recorded: the client's outcomes, the
//! engines' journal of attempts, Envoy's and the filter's counters, and the samples of a host's health flags.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::emulator::chaos::Attempt;

use super::outcome::Outcome;

/// Statuses the rendered retry policy retries (`retriable_status_codes` in `envoy/src/render/cluster.rs`): an
/// engine head with one of these is not forwarded while a retry is left, so it is not a first byte.
pub const RETRIABLE_STATUSES: [u16; 4] = [429, 502, 503, 504];

/// One invariant's verdict.
#[derive(Clone, Debug)]
pub struct Check {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

impl Check {
    fn new(name: &str, passed: bool, detail: String) -> Check {
        Check {
            name: name.to_string(),
            passed,
            detail,
        }
    }
}

/// Invariant 1: every request sent ended as exactly one outcome, and none is malformed.
pub fn one_outcome_each(sent: u64, outcomes: &BTreeMap<String, u64>, malformed: &[String]) -> Check {
    let classified: u64 = outcomes.values().sum();
    let passed = classified == sent && malformed.is_empty();
    let mut detail = format!("{classified} outcomes for {sent} requests: {outcomes:?}");
    if let Some(first) = malformed.first() {
        detail.push_str(&format!("; {} malformed, the first: {first}", malformed.len()));
    }
    Check::new("exactly one well-formed outcome per request", passed, detail)
}

/// Invariant 2: no attempt follows one whose head was a first byte (a head Envoy forwards: any status but the
/// retriable ones). Attempts are ordered by arrival, across the whole fleet.
pub fn no_retry_after_first_byte(attempts: &HashMap<String, Vec<Attempt>>) -> Check {
    let mut retried = 0u64;
    let mut violations = Vec::new();
    for (id, list) in attempts {
        let mut list = list.clone();
        list.sort_by_key(|a| a.at);
        if list.len() > 1 {
            retried += 1;
        }
        let first_byte = list
            .iter()
            .position(|a| a.head.is_some_and(|s| !RETRIABLE_STATUSES.contains(&s)));
        if let Some(at) = first_byte {
            if at + 1 < list.len() {
                let engines: Vec<String> = list
                    .iter()
                    .map(|a| format!("{}@{}ms:{:?}", a.engine, a.at.as_millis(), a.head))
                    .collect();
                violations.push(format!("{id}: {}", engines.join(" -> ")));
            }
        }
    }
    violations.sort();
    let passed = violations.is_empty();
    let mut detail = format!(
        "{} request ids reached an engine, {retried} of them more than once (retried before any byte); {} \
         attempted again after a first byte",
        attempts.len(),
        violations.len()
    );
    if let Some(first) = violations.first() {
        detail.push_str(&format!("; the first: {first}"));
    }
    Check::new("nothing retried after its first byte", passed, detail)
}

/// One equation between two counts.
#[derive(Clone, Debug)]
pub struct Equation {
    pub text: String,
    pub left: u64,
    pub right: u64,
}

impl Equation {
    pub fn new(text: &str, left: u64, right: u64) -> Equation {
        Equation {
            text: text.to_string(),
            left,
            right,
        }
    }
}

/// Invariant 3: each equation holds.
pub fn counters_add_up(equations: &[Equation]) -> Check {
    let lines: Vec<String> = equations
        .iter()
        .map(|e| {
            let mark = if e.left == e.right { "ok" } else { "FAILS" };
            format!("{mark}: {} ({} = {})", e.text, e.left, e.right)
        })
        .collect();
    let passed = equations.iter().all(|e| e.left == e.right);
    Check::new("the counters add up", passed, lines.join("\n"))
}

/// A stretch of time in which a host was seen ejected: from the first sample that showed it to the last one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Episode {
    pub first_seen: Duration,
    pub last_seen: Duration,
    /// The first sample that showed it back; `None` when the run ended first.
    pub back_at: Option<Duration>,
}

/// The ejection episodes in `(time, ejected)` samples, in time order.
pub fn episodes(samples: &[(Duration, bool)]) -> Vec<Episode> {
    let mut out: Vec<Episode> = Vec::new();
    let mut open: Option<Episode> = None;
    for &(at, ejected) in samples {
        match (&mut open, ejected) {
            (None, true) => {
                open = Some(Episode {
                    first_seen: at,
                    last_seen: at,
                    back_at: None,
                })
            }
            (Some(e), true) => e.last_seen = at,
            (Some(e), false) => {
                e.back_at = Some(at);
                out.extend(open.take());
            }
            (None, false) => {}
        }
    }
    out.extend(open);
    out
}

/// Samples of one host: when, whether it was ejected, and Envoy's `lb_healthy_panic` counter of its cluster then.
pub type HostSample = (Duration, bool, u64);

/// Whether Envoy's panic mode (too few healthy hosts: it balances over all of them, ejected ones too) was on
/// around `at`: the panic counter rose between the last sample `window` before and the first `window` after.
fn panicking(samples: &[HostSample], at: Duration, window: Duration) -> bool {
    let before = samples.iter().rev().find(|s| s.0 + window <= at).map_or(0, |s| s.2);
    let after = samples
        .iter()
        .find(|s| s.0 >= at + window)
        .or(samples.last())
        .map_or(0, |s| s.2);
    after > before
}

/// Invariant 4: the host, once ejected, received no request until its cool-down had passed, except while Envoy
/// was in panic mode (too few healthy hosts: Envoy then balances over all of them, ejected ones too, by design;
/// such arrivals are counted and shown apart).
///
/// For each episode, no arrival lies between `first_seen + grace` (a request routed just before the ejection
/// may still be on its way) and `first_seen + cool_down - slack` (the samples are `slack` apart at most); and an
/// episode that ended lasted at least `cool_down - slack`. The window is fixed by the cool-down, not by the
/// samples' end of the episode: a host readmitted and ejected again between two samples would look like one long
/// episode, and its arrivals in between are no fault. At least one ejection must have happened, or the check
/// proves nothing.
pub fn ejected_host_stays_out(
    samples: &[HostSample],
    arrivals: &[Duration],
    enforced: u64,
    cool_down: Duration,
    grace: Duration,
    slack: Duration,
) -> Check {
    let flags: Vec<(Duration, bool)> = samples.iter().map(|s| (s.0, s.1)).collect();
    let found = episodes(&flags);
    let mut excused = 0usize;
    let mut problems = Vec::new();
    if enforced == 0 || found.is_empty() {
        problems.push(format!(
            "no ejection to check: ejections_enforced_total {enforced}, {} episodes seen",
            found.len()
        ));
    }
    let mut lines = Vec::new();
    for e in &found {
        let from = e.first_seen + grace;
        let until = (e.first_seen + cool_down).saturating_sub(slack);
        let during: Vec<Duration> = arrivals.iter().copied().filter(|&a| a > from && a < until).collect();
        let in_panic = during.iter().filter(|&&a| panicking(samples, a, slack)).count();
        excused += in_panic;
        let inside = during.len() - in_panic;
        let length = e.last_seen.saturating_sub(e.first_seen);
        lines.push(format!(
            "ejected {:.1}s..{:.1}s ({}): {inside} requests arrived in its first {:.1}s, {in_panic} more in Envoy's \
             panic mode",
            e.first_seen.as_secs_f64(),
            e.last_seen.as_secs_f64(),
            if e.back_at.is_some() {
                "then back"
            } else {
                "until the end"
            },
            until.saturating_sub(e.first_seen).as_secs_f64(),
        ));
        if inside > 0 {
            problems.push(format!("{inside} requests arrived while ejected at {:?}", e.first_seen));
        }
        if e.back_at.is_some() && length + slack < cool_down {
            problems.push(format!(
                "back after {:.2}s, before its cool-down of {:.1}s",
                length.as_secs_f64(),
                cool_down.as_secs_f64()
            ));
        }
    }
    let mut detail = format!(
        "ejections_enforced_total {enforced} (cluster-wide); {excused} arrivals while ejected were in panic mode; {}",
        lines.join("; ")
    );
    if !problems.is_empty() {
        detail.push_str(&format!("; PROBLEMS: {}", problems.join("; ")));
    }
    Check::new(
        "an ejected host stays out for its cool-down",
        problems.is_empty(),
        detail,
    )
}

/// Every label's count.
pub fn tally<'a>(outcomes: impl Iterator<Item = &'a Outcome>) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for o in outcomes {
        *counts.entry(o.label().to_string()).or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn attempt(engine: &str, at: u64, head: Option<u16>) -> Attempt {
        Attempt {
            engine: engine.into(),
            at: ms(at),
            head,
        }
    }

    #[test]
    fn a_retry_before_any_forwarded_byte_is_fine_and_one_after_is_not() {
        let mut attempts = HashMap::new();
        attempts.insert(
            "a".to_string(),
            vec![attempt("e1", 5, Some(200)), attempt("e0", 1, None)],
        );
        attempts.insert(
            "b".to_string(),
            vec![attempt("e0", 1, Some(503)), attempt("e1", 2, Some(200))],
        );
        assert!(no_retry_after_first_byte(&attempts).passed);
        attempts.insert(
            "c".to_string(),
            vec![attempt("e0", 1, Some(200)), attempt("e1", 2, Some(200))],
        );
        let check = no_retry_after_first_byte(&attempts);
        assert!(!check.passed);
        assert!(check.detail.contains("c: e0@1ms"), "{}", check.detail);
        attempts.remove("c");
        attempts.insert(
            "d".to_string(),
            vec![attempt("e0", 1, Some(500)), attempt("e0", 9, Some(200))],
        );
        assert!(!no_retry_after_first_byte(&attempts).passed);
    }

    #[test]
    fn episodes_are_runs_of_ejected_samples() {
        let samples = [
            (ms(0), false),
            (ms(100), true),
            (ms(200), true),
            (ms(300), false),
            (ms(400), true),
        ];
        let found = episodes(&samples);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].first_seen, ms(100));
        assert_eq!(found[0].last_seen, ms(200));
        assert_eq!(found[0].back_at, Some(ms(300)));
        assert_eq!(found[1].back_at, None);
    }

    #[test]
    fn an_arrival_while_ejected_or_an_early_return_fails() {
        let samples: Vec<HostSample> = (0..80).map(|i| (ms(i * 100), (10..65).contains(&i), 0)).collect();
        let (cool, grace, slack) = (ms(5000), ms(200), ms(200));
        // Ejected from 1.0 s to 6.4 s: the cool-down window is 1.2 s..5.8 s; 6.0 s is past it.
        let quiet = [ms(500), ms(950), ms(6000), ms(7000)];
        assert!(ejected_host_stays_out(&samples, &quiet, 1, cool, grace, slack).passed);
        let leaked = [ms(500), ms(3000)];
        assert!(!ejected_host_stays_out(&samples, &leaked, 1, cool, grace, slack).passed);
        assert!(!ejected_host_stays_out(&samples, &quiet, 1, ms(8000), grace, slack).passed);
        assert!(!ejected_host_stays_out(&samples, &quiet, 0, cool, grace, slack).passed);
        let never: Vec<HostSample> = (0..10).map(|i| (ms(i * 100), false, 0)).collect();
        assert!(!ejected_host_stays_out(&never, &[], 0, cool, grace, slack).passed);
        // An arrival while Envoy's panic counter rose is excused; the same arrival without panic is not.
        let panic: Vec<HostSample> = samples
            .iter()
            .map(|&(t, e, _)| (t, e, if t >= ms(2900) { 5 } else { 0 }))
            .collect();
        let check = ejected_host_stays_out(&panic, &[ms(2950)], 1, cool, grace, slack);
        assert!(check.passed, "{}", check.detail);
        assert!(
            check.detail.contains("1 more in Envoy's panic mode"),
            "{}",
            check.detail
        );
        assert!(!ejected_host_stays_out(&samples, &[ms(2950)], 1, cool, grace, slack).passed);
    }

    #[test]
    fn counters_and_outcomes() {
        assert!(counters_add_up(&[Equation::new("a", 1, 1)]).passed);
        assert!(!counters_add_up(&[Equation::new("a", 1, 1), Equation::new("b", 1, 2)]).passed);
        let counts = tally([Outcome::Complete, Outcome::Complete, Outcome::StreamCut].iter());
        assert_eq!(counts["complete"], 2);
        assert!(one_outcome_each(3, &counts, &[]).passed);
        assert!(!one_outcome_each(4, &counts, &[]).passed);
        assert!(!one_outcome_each(3, &counts, &["x".into()]).passed);
    }
}
