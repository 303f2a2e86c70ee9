//! The fair queue, host side (`fair_queue.rs`): a request to a full backend pauses, and is resumed by the root
//! context's tick or by another request's end, the least-served tenant first; a waiter past its deadline gets a
//! 429 in its API's envelope; a full queue and `x-max-wait-ms: 0` refuse at once; a client that leaves is removed
//! and charged nothing; another worker's waiter that goes next is left to that worker; a context that vanished
//! leaves the queue; and a queue that cannot be read lets the request go on.

use llmroute_core::envoy_contract::shared;
use llmroute_core::fairness::{self, FairQueue, Waiter};
use proxy_wasm::types::Action;

use super::*;
use crate::host::fake::{Kind, Reply};
use crate::host::HostStatus;

const BACKEND: &str = "llama-a";

/// [`CONFIG`] with one request in flight at most, and tenants by `x-tenant-id` (weight 2 for `heavy`).
fn fair_config(max_queue: u32) -> String {
    CONFIG
        .replace(
            r#""endpoints": ["127.0.0.1:8081", "127.0.0.1:8082"] }"#,
            r#""endpoints": ["127.0.0.1:8081", "127.0.0.1:8082"], "max_inflight": 1 }"#,
        )
        .replace(
            r#""version": 1,"#,
            &format!(
                r#""version": 1, "fairness": {{ "by": {{ "header": "x-tenant-id" }}, "max_wait_ms": 1000, "max_queue": {max_queue}, "weights": {{ "heavy": 2 }} }},"#
            ),
        )
}

fn queue(fake: &Rc<FakeHost>) -> FairQueue {
    fairness::decode(&fake.shared(&shared::fair_queue(BACKEND)).unwrap().0)
}

/// Another worker changes the backend's queue with `f`.
fn rewrite_queue(fake: &Rc<FakeHost>, f: impl FnOnce(&mut FairQueue)) {
    let key = shared::fair_queue(BACKEND);
    let (bytes, cas) = fake.shared(&key).unwrap();
    let mut q = fairness::decode(&bytes);
    f(&mut q);
    assert!(fake.envoy().set_shared_data(&key, &fairness::encode(&q), Some(cas)));
}

/// A chat request of `tenant` in context `id`, up to the end of its body; returns the exchange and the body's
/// action. `path` and `body` default to a chat.
fn arrive_with(
    fake: &Rc<FakeHost>,
    root: &Root,
    id: u32,
    tenant: &str,
    extra: &[(&str, &str)],
    path_body: Option<(&str, &str)>,
) -> (Exchange, Action) {
    fake.end_callback();
    let (path, body) = path_body.unwrap_or(("/v1/chat/completions", CHAT));
    let mut headers: Vec<(&str, &str)> = REQUEST_HEADERS.to_vec();
    headers[1] = (":path", path);
    headers.push(("x-tenant-id", tenant));
    headers.extend_from_slice(extra);
    let mut x = Exchange::new(fake, root, id);
    assert_eq!(x.request_headers(&headers, false), Action::Pause);
    let a = x.request_body(body.as_bytes(), true);
    (x, a)
}

fn arrive(fake: &Rc<FakeHost>, root: &Root, id: u32, tenant: &str) -> (Exchange, Action) {
    arrive_with(fake, root, id, tenant, &[], None)
}

/// The engine answers `x` (usage: 12 in, 3 out), and its log phase runs.
fn answer(x: &mut Exchange) {
    x.fake.end_callback();
    x.response_headers(&[(":status", "200"), ("content-type", "application/json")], false);
    x.response_body(JSON_ANSWER.as_bytes(), true);
    x.log();
}

fn tick(fake: &Rc<FakeHost>, root: &mut Root) {
    fake.end_callback();
    root.on_tick();
}

fn replies_to(fake: &Rc<FakeHost>, context: u32) -> Vec<Reply> {
    fake.replies()
        .into_iter()
        .filter(|r| r.context == Some(context))
        .collect()
}

#[test]
fn a_request_to_a_full_backend_waits_and_goes_when_the_slot_frees() {
    let fake = FakeHost::new();
    let mut root = root(&fake, &fair_config(8));
    assert_eq!(fake.tick_ms(), Some(25), "fairness ticks faster");
    let (mut a, action) = arrive(&fake, &root, 1, "alice");
    assert_eq!(action, Action::Continue, "a free slot: no wait");
    assert_eq!(queue(&fake).running(), 1);
    let (mut b, action) = arrive(&fake, &root, 2, "bob");
    assert_eq!(action, Action::Pause, "the backend is full: bob waits");
    assert_eq!(queue(&fake).depth(), 1);
    assert_eq!(fake.metric("llmroute_queue_depth;backend=llama-a"), Some(1));
    tick(&fake, &mut root);
    assert_eq!(fake.resumes(), 0, "still full");

    fake.advance_ms(40);
    answer(&mut a);
    assert_eq!(
        fake.resumed_contexts(),
        [Some(2)],
        "alice's end resumes bob, in bob's context"
    );
    assert_eq!(fake.log_field("llmroute.queue_wait_ms").as_deref(), Some("40"));
    assert_eq!(
        fake.metric("llmroute_queue_wait_milliseconds;backend=llama-a"),
        Some(40)
    );
    assert_eq!(fake.metric("llmroute_queue_depth;backend=llama-a"), Some(0));
    let q = queue(&fake);
    assert_eq!((q.depth(), q.running()), (0, 1));
    answer(&mut b);
    assert_eq!(queue(&fake).running(), 0);
    assert!(fake.replies().is_empty(), "nobody was refused");
}

#[test]
fn the_tick_resumes_a_waiter_whose_slot_freed_elsewhere() {
    let fake = FakeHost::new();
    let mut root = root(&fake, &fair_config(8));
    let (_a, _) = arrive(&fake, &root, 1, "alice");
    let (_b, action) = arrive(&fake, &root, 2, "bob");
    assert_eq!(action, Action::Pause);
    // Another worker's request ended: the slot is free in the shared queue, and only the tick can tell.
    rewrite_queue(&fake, |q| q.complete(fairness::tenant_id(b"alice"), 1, 0));
    tick(&fake, &mut root);
    assert_eq!(fake.resumed_contexts(), [Some(2)]);
    tick(&fake, &mut root);
    assert_eq!(fake.resumes(), 1, "once");
}

#[test]
fn the_least_served_tenant_goes_next_and_weights_count() {
    let fake = FakeHost::new();
    let mut root = root(&fake, &fair_config(16));
    let (mut running, _) = arrive(&fake, &root, 1, "flood");
    let mut waiting = Vec::new();
    for id in 2..=4 {
        waiting.push((id, arrive(&fake, &root, id, "flood").0));
    }
    waiting.push((5, arrive(&fake, &root, 5, "quiet").0));
    let mut order = Vec::new();
    answer(&mut running);
    tick(&fake, &mut root);
    while let Some(Some(next)) = fake.resumed_contexts().get(order.len()).copied() {
        order.push(next);
        let i = waiting.iter().position(|(id, _)| *id == next).unwrap();
        let (_, mut x) = waiting.remove(i);
        answer(&mut x);
    }
    // The quiet tenant starts level with the flood (idleness banks nothing, and a new tenant starts level), and
    // the flood's first request is then charged its output: the quiet one goes ahead of the flood's backlog.
    assert_eq!(order, [5, 2, 3, 4]);

    // A tenant of weight 2 is charged half per token: after one request each, `heavy` has less service.
    let (mut h, _) = arrive(&fake, &root, 10, "heavy");
    let (mut l, _) = arrive(&fake, &root, 11, "light");
    answer(&mut h);
    answer(&mut l);
    let q = queue(&fake);
    let counter = |name: &[u8]| q.tenant(fairness::tenant_id(name)).unwrap().counter;
    assert!(counter(b"heavy") < counter(b"light"), "{q:?}");
}

#[test]
fn a_waiter_past_its_deadline_gets_a_429_in_its_envelope() {
    let fake = FakeHost::new();
    let mut root = root(&fake, &fair_config(8));
    let (mut a, _) = arrive(&fake, &root, 1, "alice");
    let (mut b, action) = arrive(&fake, &root, 2, "bob");
    assert_eq!(action, Action::Pause);
    let msg = r#"{"model":"chat","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    let (mut c, action) = arrive_with(
        &fake,
        &root,
        3,
        "carol",
        &[("anthropic-version", "2023-06-01")],
        Some(("/v1/messages", msg)),
    );
    assert_eq!(action, Action::Pause);
    fake.advance_ms(999);
    tick(&fake, &mut root);
    assert!(fake.replies().is_empty(), "not yet");
    fake.advance_ms(1);
    tick(&fake, &mut root);
    let r = &replies_to(&fake, 2)[0];
    assert_eq!((r.status, r.header("retry-after")), (429, Some("1")));
    assert_eq!(r.header("x-llmroute-error"), Some("queue_timeout"));
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["error"]["code"], "queue_timeout", "{body}");
    assert_eq!(body["request_id"], "req-0001");
    let r = &replies_to(&fake, 3)[0];
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        (body["type"].as_str(), body["error"]["type"].as_str()),
        (Some("error"), Some("rate_limit_error"))
    );
    assert_eq!(r.header("request-id"), Some("req-0001"));
    assert_eq!(fake.log_field("llmroute.queue_wait_ms").as_deref(), Some("1000"));
    assert_eq!(fake.metric("llmroute_queue_timeouts_total;backend=llama-a"), Some(2));
    assert_eq!(fake.metric("llmroute_rejections_total;reason=queue_timeout"), Some(2));
    assert_eq!(fake.resumes(), 0);
    // Their log phases: nothing more to give back; alice's end then frees the last slot.
    for x in [&mut b, &mut c] {
        fake.end_callback();
        x.response_headers(&[(":status", "429"), ("content-type", "application/json")], false);
        x.log();
    }
    answer(&mut a);
    let routed = |class: &str| {
        fake.metric(&format!(
            "llmroute_requests_total;alias=chat;backend=llama-a;api=chat;code_class={class};affinity_source=system_prompt"
        ))
    };
    assert_eq!(
        (routed("2xx"), routed("4xx")),
        (Some(1), None),
        "a refusal is not a routed request"
    );
    let q = queue(&fake);
    assert_eq!((q.depth(), q.running()), (0, 0), "{q:?}");
}

#[test]
fn a_client_may_shorten_its_wait_or_refuse_to_wait() {
    let fake = FakeHost::new();
    let mut root = root(&fake, &fair_config(8));
    let (_a, _) = arrive(&fake, &root, 1, "alice");
    let (_b, action) = arrive_with(&fake, &root, 2, "bob", &[("x-max-wait-ms", "0")], None);
    assert_eq!(action, Action::Pause, "answered");
    let r = fake.replies().last().unwrap().clone();
    assert_eq!(
        (r.context, r.status, r.header("x-llmroute-error")),
        (None, 429, Some("queue_timeout"))
    );
    assert_eq!(
        fake.metric("llmroute_queue_refusals_total;backend=llama-a;reason=no_wait"),
        Some(1)
    );
    let (_c, action) = arrive_with(&fake, &root, 3, "carol", &[("x-max-wait-ms", "100")], None);
    assert_eq!(action, Action::Pause);
    fake.advance_ms(100);
    tick(&fake, &mut root);
    assert_eq!(
        replies_to(&fake, 3)[0].status,
        429,
        "the client's 100 ms, not max_wait_ms"
    );
}

#[test]
fn a_full_queue_refuses_at_once() {
    let fake = FakeHost::new();
    let root = root(&fake, &fair_config(1));
    let (_a, _) = arrive(&fake, &root, 1, "alice");
    let (_b, action) = arrive(&fake, &root, 2, "bob");
    assert!(action == Action::Pause && fake.replies().is_empty());
    let (_c, _) = arrive(&fake, &root, 3, "carol");
    let r = fake.replies().last().unwrap().clone();
    assert_eq!((r.status, r.header("x-llmroute-error")), (429, Some("queue_full")));
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(
        fake.metric("llmroute_queue_refusals_total;backend=llama-a;reason=queue_full"),
        Some(1)
    );
    assert_eq!(queue(&fake).depth(), 1);
}

#[test]
fn a_client_that_leaves_while_waiting_is_removed_and_charged_nothing() {
    let fake = FakeHost::new();
    let mut root = root(&fake, &fair_config(8));
    let (mut a, _) = arrive(&fake, &root, 1, "alice");
    let (mut b, _) = arrive(&fake, &root, 2, "bob");
    let (mut c, _) = arrive(&fake, &root, 3, "carol");
    let bob = fairness::tenant_id(b"bob");
    let before = queue(&fake).tenant(bob).unwrap().counter;
    fake.end_callback();
    b.log();
    let q = queue(&fake);
    assert_eq!(q.depth(), 1);
    let t = q.tenant(bob).unwrap();
    assert_eq!((t.counter, t.active), (before, 0), "removed, charged nothing");
    assert_eq!(fake.metric("llmroute_queue_abandoned_total;backend=llama-a"), Some(1));
    assert_eq!(fake.resumes(), 0, "alice still holds the slot");
    answer(&mut a);
    assert_eq!(fake.resumed_contexts(), [Some(3)], "the next waiter goes");
    tick(&fake, &mut root);
    answer(&mut c);
    assert_eq!(queue(&fake).running(), 0);
}

#[test]
fn another_workers_waiter_that_goes_next_is_left_to_that_worker() {
    let fake = FakeHost::new();
    let mut root = root(&fake, &fair_config(8));
    let (mut a, _) = arrive(&fake, &root, 1, "alice");
    // Another worker's waiter arrived first, for a tenant with no service yet.
    let now = 1_000_000;
    let theirs = Waiter {
        id: (u64::from(u32::MAX) << 32) | 7,
        tenant: fairness::tenant_id(b"zed"),
        weight: 1,
        input_tokens: 5,
        arrived_ms: now,
        deadline_ms: now + 500,
        host: fairness::NO_HOST,
    };
    rewrite_queue(&fake, |q| q.arrive(theirs, now, 8).unwrap());
    let (_b, action) = arrive(&fake, &root, 2, "bob");
    assert_eq!(action, Action::Pause);
    answer(&mut a);
    assert_eq!(
        fake.resumes(),
        0,
        "the other worker's waiter goes next; this one waits for its turn"
    );
    assert_eq!(queue(&fake).waiters.len(), 2);
    // That worker is gone: at its waiter's deadline it leaves, and this worker's waiter goes.
    fake.advance_ms(500);
    tick(&fake, &mut root);
    assert_eq!(fake.resumed_contexts(), [Some(2)]);
    assert_eq!(queue(&fake).depth(), 0);
}

#[test]
fn a_waiter_whose_context_vanished_leaves_the_queue() {
    let fake = FakeHost::new();
    let mut root = root(&fake, &fair_config(8));
    let (mut a, _) = arrive(&fake, &root, 1, "alice");
    let (b, _) = arrive(&fake, &root, 2, "bob");
    let (_c, _) = arrive(&fake, &root, 3, "carol");
    drop(b);
    tick(&fake, &mut root);
    assert_eq!(queue(&fake).depth(), 1, "bob's waiter is gone");
    answer(&mut a);
    assert_eq!(fake.resumed_contexts(), [Some(3)]);
}

#[test]
fn a_queue_that_cannot_be_read_lets_the_request_go_on() {
    let fake = FakeHost::new();
    let root = root(&fake, &fair_config(8));
    let (_a, _) = arrive(&fake, &root, 1, "alice");
    fake.fail_kind(Kind::GetShared, HostStatus::InternalFailure);
    let (mut b, action) = arrive(&fake, &root, 2, "bob");
    assert_eq!(
        action,
        Action::Continue,
        "unqueued: Envoy's circuit breaker still bounds the backend"
    );
    fake.heal();
    answer(&mut b);
    assert_eq!(queue(&fake).running(), 1, "bob was never counted");
}

#[test]
fn the_status_page_shows_each_queue() {
    let fake = FakeHost::new();
    let root = root(&fake, &fair_config(8));
    let (_a, _) = arrive(&fake, &root, 1, "alice");
    let (_b, _) = arrive(&fake, &root, 2, "bob");
    fake.end_callback();
    let mut x = Exchange::new(&fake, &root, 9);
    let mut headers = REQUEST_HEADERS.to_vec();
    headers[0] = (":method", "GET");
    headers[1] = (":path", "/llmroute/status");
    x.request_headers(&headers, true);
    let body: serde_json::Value = serde_json::from_slice(&fake.replies().last().unwrap().body).unwrap();
    let q = &body["backends"][0]["queue"];
    assert_eq!(
        (
            q["waiting"].as_u64(),
            q["in_flight"].as_u64(),
            q["max_inflight"].as_u64()
        ),
        (Some(1), Some(1), Some(1)),
        "{body}"
    );
}

#[test]
fn without_fairness_nothing_is_queued() {
    let fake = FakeHost::new();
    let root = root(&fake, CONFIG);
    assert_eq!(fake.tick_ms(), Some(250));
    let mut x = Exchange::new(&fake, &root, 1);
    run_chat(&mut x, false);
    assert_eq!(fake.shared(&shared::fair_queue(BACKEND)), None);
}

/// `host_max_inflight: 1` on two hosts with `bounded_keys`: the flood's second request waits for its key's host,
/// a quiet tenant's new key goes to the other host at once (the backend has room), and the flood's waiter goes when
/// its host frees.
#[test]
fn a_request_waits_for_its_full_host_while_another_host_serves_a_quiet_tenant() {
    let fake = FakeHost::new();
    let config = fair_config(8)
        .replace(
            r#""max_inflight": 1 }"#,
            r#""max_inflight": 8, "host_max_inflight": 1 }"#,
        )
        .replace(
            r#""affinity": { "session_headers": ["x-session-id"] }"#,
            r#""affinity": { "session_headers": ["x-session-id"], "placement": "bounded_keys" }"#,
        );
    let mut root = root(&fake, &config);
    let flood_key = [("x-session-id", "flood-doc")];
    let (mut first, action) = arrive_with(&fake, &root, 1, "flood", &flood_key, None);
    assert_eq!(action, Action::Continue);
    let (mut second, action) = arrive_with(&fake, &root, 2, "flood", &flood_key, None);
    assert_eq!(action, Action::Pause, "its key's host runs one already");
    let q = queue(&fake);
    assert_eq!((q.running(), q.depth()), (1, 1));
    let flood_host = q.waiters[0].host;
    assert_eq!(q.host_running(flood_host), 1);
    let (mut quiet, action) = arrive_with(&fake, &root, 3, "quiet", &[("x-session-id", "quiet-chat")], None);
    assert_eq!(
        action,
        Action::Continue,
        "a new key goes to the host with room, at once"
    );
    let q = queue(&fake);
    assert_eq!((q.running(), q.depth()), (2, 1));
    assert_eq!(q.hosts.len(), 2, "the quiet tenant runs on the other host");
    answer(&mut quiet);
    assert_eq!(fake.resumes(), 0, "the flood's host is still full");
    answer(&mut first);
    assert_eq!(fake.resumes(), 1, "its host freed: the flood's waiter goes");
    tick(&fake, &mut root);
    let q = queue(&fake);
    assert_eq!((q.running(), q.depth(), q.host_running(flood_host)), (1, 0, 1));
    answer(&mut second);
    assert_eq!(queue(&fake).hosts, vec![]);
}

/// The status poll rebuilds placement's in-flight counts from Envoy's `rq_active`, which does not count a request
/// paused in the fair queue: the rebuild adds each host's waiters, so a host full of waiters still reads full.
#[test]
fn the_in_flight_rebuild_counts_the_requests_waiting_for_each_host() {
    let fake = FakeHost::new();
    let config = fair_config(8)
        .replace(
            r#""max_inflight": 1 }"#,
            r#""max_inflight": 8, "host_max_inflight": 1 }"#,
        )
        .replace(
            r#""affinity": { "session_headers": ["x-session-id"] }"#,
            r#""affinity": { "session_headers": ["x-session-id"], "placement": "bounded_keys" }"#,
        );
    let root = root(&fake, &config);
    let key = [("x-session-id", "flood-doc")];
    let _running = arrive_with(&fake, &root, 1, "flood", &key, None);
    let _waiting: Vec<_> = (2..5)
        .map(|id| arrive_with(&fake, &root, id, "flood", &key, None))
        .collect();
    let cfg = llmroute_core::load_config(&config).unwrap();
    let addresses = ["127.0.0.1:8081", "127.0.0.1:8082"];
    let host = queue(&fake).waiters[0].host;
    let at = addresses
        .iter()
        .position(|a| llmroute_core::key_placement::host_id(a) == host)
        .unwrap();
    let health = llmroute_core::status::BackendHealth {
        name: BACKEND.to_string(),
        healthy: 2,
        degraded: 0,
        total: 2,
        in_flight: 1,
        down: vec![],
        hosts: vec![],
        weights: vec![],
        active: vec![(addresses[at].to_string(), 1)],
    };
    crate::key_placement::rebuild_in_flight(&fake.envoy(), &cfg, &health, 0);
    let counts = llmroute_core::key_placement::table::decode_host_counts(
        &fake.shared(&shared::in_flight(BACKEND)).unwrap().0,
        2,
    );
    let mut want = vec![0, 0];
    want[at] = 4;
    assert_eq!(counts, want, "one upstream and three waiting");
}
