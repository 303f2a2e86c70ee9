//! The host-call budget of a typical chat request (issue 13): how many calls of each kind one request makes
//! through the filter, streamed and not, answered or refused by the engine, on a warm VM (its metrics already
//! defined). It counts; it does not time. A change that adds a host call on the request path fails here. The
//! counts before and after each lever are in `docs/overhead.md`.
//!
//! When a change adds or removes calls on purpose, run `cargo test -p llmroute-filter budget`, check that the
//! new counts are the ones you meant (the failure prints them in this file's form), paste them below, and say
//! why in the commit message. Log lines are not counted: whether one reaches the host depends on the level Envoy
//! sets, not on the filter.

use super::*;
use crate::host::fake::Kind::{self, *};
use llmroute_core::envoy_contract::SESSION_HEADER;

/// Counts the calls of the second of two identical requests on one VM.
fn warm_counts(config: &str, stream: bool) -> Vec<(Kind, usize)> {
    let fake = FakeHost::new();
    let root = root(&fake, config);
    run_chat(&mut Exchange::new(&fake, &root, 1), stream);
    fake.reset_calls();
    let mut x = Exchange::new(&fake, &root, 2);
    run_chat(&mut x, stream);
    assert!(fake.replies().is_empty(), "the request was routed");
    fake.counts()
}

fn check(config: &str, stream: bool, expected: &[(Kind, usize)]) {
    let got = warm_counts(config, stream);
    let total: usize = got.iter().map(|(_, n)| n).sum();
    assert_eq!(
        got, expected,
        "host calls per request changed (stream={stream}, {total} in all); if on purpose, update the budget to:\n{got:?}"
    );
}

#[test]
fn a_plain_chat_request_makes_this_many_host_calls() {
    #[rustfmt::skip]
    check(CONFIG, false, &[
        (Time, 3),             // request start, end; first response byte
        (GetBuffer, 2),        // the request body once; the JSON answer's copy for its usage
        (SetBuffer, 2),        // the `model` rewrite as a head edit: drain to the end of the span and prepend, then the bytes before it
        (GetMap, 2),           // the request headers, once; the response headers, once (was GetMapValue 2: :status, content-type)
        (SetMapValue, 7),      // content-length, cluster, accept-encoding, affinity, 2 token estimates; affinity source (the stateful-session header is removed only when present: was 8)
        // GetProperty 0 (was 3): the backend is the cluster off a failover route, response.code_details only a
        // stream's outcome reads, and the status label is the :status the response-header plan read (response.code
        // only when no response headers came)
        (SetProperty, 6),      // access-log fields: alias, upstream model, affinity source, backend, 2 token counts
        (IncrementMetric, 3),  // requests, input and output tokens
        (RecordMetric, 4),     // ttfb, duration, prompt and completion tokens
    ]);
}

#[test]
fn a_streamed_chat_request_makes_this_many_host_calls() {
    #[rustfmt::skip]
    check(CONFIG, true, &[
        (Time, 3),
        (GetBuffer, 4),        // the request body; each of the three SSE chunks
        (SetBuffer, 2),
        (GetMap, 2),           // as above (was 1, and GetMapValue 2)
        (SetMapValue, 8),      // as above, and content-length removed from the stream
        (GetProperty, 1),      // response.code_details for the outcome (was 3: the backend, response.code)
        (SetProperty, 8),      // as above, and the outcome twice (stream start and end) ...
        (IncrementMetric, 4),  // ... and the stream outcome counted
        (RecordMetric, 4),
    ]);
}

#[test]
fn a_request_that_does_not_wait_in_the_fair_queue_makes_this_many_host_calls() {
    // With `fairness`, a request that finds a free slot reads and writes its backend's queue when it arrives and
    // when it ends, and reads the clock for each: the plain chat's calls plus these six.
    let config = CONFIG.replace(
        r#""version": 1,"#,
        r#""version": 1, "fairness": { "by": { "header": "x-tenant-id" } },"#,
    );
    #[rustfmt::skip]
    check(&config, false, &[
        (Time, 5),             // as a plain chat, and the queue's clock on arrival and at the end
        (GetBuffer, 2),
        (SetBuffer, 2),
        (GetMap, 2),
        (SetMapValue, 7),
        (SetProperty, 6),
        (GetShared, 2),        // the backend's queue, on arrival and at the end
        (SetShared, 2),        // ... written back: the request counted in flight, then its slot freed
        (IncrementMetric, 3),
        (RecordMetric, 4),
    ]);
}

/// The second of two chat requests the engine answers with a JSON error (`status`).
fn error_counts(status: u32) -> Vec<(Kind, usize)> {
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    let mut counts = Vec::new();
    for id in 1..=2 {
        fake.reset_calls();
        let mut x = Exchange::new(&fake, &root, id);
        let body = chat(false);
        x.request_headers(&REQUEST_HEADERS, false);
        x.request_body(body.as_bytes(), true);
        let code = status.to_string();
        x.response_headers(&[(":status", &code), ("content-type", "application/json")], false);
        x.fake
            .set_property_bytes(&["response", "code"], &u64::from(status).to_le_bytes());
        x.response_body(br#"{"error":{"message":"busy","type":"server_error"}}"#, true);
        x.log();
        assert!(fake.replies().is_empty(), "the request was routed");
        counts = fake.counts();
    }
    counts
}

#[test]
fn an_engine_error_is_not_copied_into_the_vm() {
    // A JSON error carries no usage: it is relayed without a copy (GetBuffer was 2, the request body and the
    // answer's copy), and with neither token count nor token metric.
    #[rustfmt::skip]
    let expected = [
        (Time, 3),
        (GetBuffer, 1),        // the request body only
        (SetBuffer, 2),
        (GetMap, 2),           // request and response headers
        (SetMapValue, 7),
        (SetProperty, 4),      // alias, upstream model, affinity source, backend
        (IncrementMetric, 1),  // requests
        (RecordMetric, 2),     // ttfb, duration
    ];
    for status in [429, 500] {
        let got = error_counts(status);
        assert_eq!(got, expected, "status {status}: {got:?}");
    }
}

#[test]
fn a_body_sent_unedited_keeps_the_clients_content_length() {
    // The alias is its own upstream model, so the body goes through untouched: the client's `content-length`
    // already holds, and is not set again (one SetMapValue fewer than a plain chat; no SetBuffer either, nothing
    // to edit).
    let config = CONFIG.replace(r#", "upstream_model": "qwen3-0.6b""#, "");
    let fake = FakeHost::new();
    let root = root(&fake, &config);
    let body = chat(false);
    let length = body.len().to_string();
    let mut headers = REQUEST_HEADERS.to_vec();
    headers.push(("content-length", &length));
    let mut counts = Vec::new();
    for id in 1..=2 {
        fake.reset_calls();
        let mut x = Exchange::new(&fake, &root, id);
        x.request_headers(&headers, false);
        x.request_body(body.as_bytes(), true);
        assert_eq!(x.request_header("content-length").as_deref(), Some(length.as_str()));
        assert_eq!(x.request_buffer(), body.as_bytes(), "the body went through untouched");
        x.response_headers(&[(":status", "200"), ("content-type", "application/json")], false);
        x.fake.set_property_bytes(&["response", "code"], &200u64.to_le_bytes());
        x.response_body(JSON_ANSWER.as_bytes(), true);
        x.log();
        assert!(fake.replies().is_empty(), "the request was routed");
        counts = fake.counts();
    }
    #[rustfmt::skip]
    assert_eq!(counts, [
        (Time, 3),
        (GetBuffer, 2),
        (GetMap, 2),
        (SetMapValue, 6),      // cluster, accept-encoding, affinity, 2 token estimates; affinity source
        (SetProperty, 6),
        (IncrementMetric, 3),
        (RecordMetric, 4),
    ], "{counts:?}");
}

#[test]
fn the_session_header_costs_a_removal_only_on_a_response_that_carries_it() {
    // Envoy's stateful-session filter writes the host on responses (bounded-keys placement): the filter removes
    // it there, found in the response headers it reads whole; a response without it asks for no removal.
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    let mut removals = Vec::new();
    for (id, carried) in [(1, false), (2, true), (3, false)] {
        let mut x = Exchange::new(&fake, &root, id);
        x.request_headers(&REQUEST_HEADERS, false);
        x.request_body(chat(false).as_bytes(), true);
        fake.reset_calls();
        let mut headers = vec![(":status", "200"), ("content-type", "application/json")];
        if carried {
            headers.push((SESSION_HEADER, "MTI3LjAuMC4xOjgwODE="));
        }
        x.response_headers(&headers, false);
        assert_eq!(x.response_header(SESSION_HEADER), None, "response {id}");
        let set = fake
            .counts()
            .into_iter()
            .find(|(k, _)| *k == SetMapValue)
            .map_or(0, |(_, n)| n);
        removals.push(set);
    }
    assert_eq!(
        removals,
        [1, 2, 1],
        "the affinity source, and the removal only when carried"
    );
}

#[test]
fn engine_load_costs_a_placed_request_one_read_and_its_work_one_write_each_way() {
    // With `load`, placement reads the backend's readings once (the poll itself runs in the root context, never
    // on the request path), and the work in flight goes through the ledger at the pin and at the log phase.
    let bounded = bounded_config();
    let with_load = bounded.replace(
        r#""endpoints": ["127.0.0.1:8081", "127.0.0.1:8082"]"#,
        r#""endpoints": ["127.0.0.1:8081", "127.0.0.1:8082"], "load": { "poll_ms": 250 }"#,
    );
    let count = |c: &[(Kind, usize)], k: Kind| c.iter().find(|(x, _)| *x == k).map_or(0, |(_, n)| *n);
    let base = warm_counts(&bounded, false);
    let load = warm_counts(&with_load, false);
    let kinds: Vec<Kind> = base.iter().chain(&load).map(|(k, _)| *k).collect();
    for k in kinds {
        let want = count(&base, k)
            + match k {
                GetShared => 3, // the readings; the work counts' read at the pin and at the log phase
                SetShared => 2, // the work counts' write at the pin and at the log phase
                _ => 0,
            };
        assert_eq!(count(&load, k), want, "{k:?}: {base:?} -> {load:?}");
    }
}
