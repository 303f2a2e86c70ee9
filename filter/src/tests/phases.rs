//! The bench build's phase switch (`bench-phases`, see `phases`): each phase adds exactly its own host calls to
//! the phases before it, and the last one is the whole filter. Runs only with the feature:
//! `cargo test -p llmroute-filter --features bench-phases phases`.

use super::*;
use crate::host::fake::Kind::{self, *};
use crate::phases;

/// The host calls of the second of two chat requests on one VM, with phases up to `last` (`None`: the whole filter).
fn counts(last: Option<&str>) -> Vec<(Kind, usize)> {
    phases::configure(last.map(str::as_bytes));
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    run_chat(&mut Exchange::new(&fake, &root, 1), false);
    fake.reset_calls();
    run_chat(&mut Exchange::new(&fake, &root, 2), false);
    assert!(
        fake.replies().is_empty(),
        "phase {last:?}: nothing is answered by the filter"
    );
    fake.counts()
}

/// `b`'s counts minus `a`'s, kind by kind; panics if `a` has a call `b` lacks (phases only add).
fn added(a: &[(Kind, usize)], b: &[(Kind, usize)]) -> Vec<(Kind, usize)> {
    for (k, n) in a {
        let m = b.iter().find(|(j, _)| j == k).map_or(0, |(_, m)| *m);
        assert!(m >= *n, "{k:?}: {n} before, {m} after");
    }
    b.iter()
        .map(|(k, m)| (*k, m - a.iter().find(|(j, _)| j == k).map_or(0, |(_, n)| *n)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[test]
fn each_phase_adds_its_own_host_calls_and_the_last_is_the_whole_filter() {
    let by_phase: Vec<Vec<(Kind, usize)>> = ["enter", "headers", "copy", "scan", "patch", "request", "response"]
        .iter()
        .map(|p| counts(Some(p)))
        .collect();
    assert_eq!(by_phase[0], [], "entering the VM makes no host call");
    assert_eq!(
        added(&by_phase[1], &by_phase[2]),
        [(GetBuffer, 1)],
        "copy: the body, once"
    );
    assert_eq!(
        added(&by_phase[2], &by_phase[3]),
        [],
        "scan: the core's decision calls nothing"
    );
    assert_eq!(
        added(&by_phase[3], &by_phase[4]),
        [(SetBuffer, 2), (SetMapValue, 1)],
        "patch: the head edit and content-length"
    );
    for pair in by_phase.windows(2) {
        added(&pair[0], &pair[1]);
    }
    assert_eq!(by_phase[6], counts(None), "up to `response` is the whole filter");
    assert_eq!(counts(Some("no such phase")), counts(None));
}
