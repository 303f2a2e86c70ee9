//! The shared placement store, host side (`placement_store.rs`): with `share_keys: returning` one-off keys are
//! placed at once and never reach etcd, a key that comes back does; past `max_creates_per_s` a new key is placed
//! locally, counted, and created on a later request; a request whose key is to be shared pauses for etcd's
//! answer (won, adopted, timeout, an error, a 503 sent once more to another member) and resumes pinned where the
//! store says; the root side's lease grant, range read, and settling of keys placed during an outage; and a host
//! error at any call of these paths.

use llmroute_core::envoy_contract::{shared, PLACEMENT_STORE_CLUSTER, SESSION_HEADER};
use llmroute_core::etcd_json::b64;
use llmroute_core::key_placement::store::{self, Lease, Pending};
use llmroute_core::key_placement::{host_id, session_header_value, KeyTable};
use llmroute_core::load_config;
use proxy_wasm::types::{Action, BufferType, MapType};

use super::*;
use crate::host::fake::{Callout, Kind};
use crate::host::HostStatus;
use crate::placement_store::Syncer;

const A: &str = "127.0.0.1:8081";
const B: &str = "127.0.0.1:8082";

// etcd 3.4's answers, as `filter/core/tests/placement_store.rs` captured them.
const CREATED: &str = r#"{"header":{"cluster_id":"1","member_id":"2","revision":"2","raft_term":"2"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"2"}}}]}"#;
const LEASE_GONE: &str =
    r#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#;
const GRANTED: &str = r#"{"header":{"cluster_id":"1","member_id":"2","revision":"2","raft_term":"2"},"ID":"2324035746352910857","TTL":"5"}"#;

/// A store that shares every new key on its first request (`share_keys: all`), as most cases here need.
fn store_config() -> String {
    store_config_with(r#""share_keys": "all""#)
}

/// A store with `fields` besides `etcd` (`share_keys`, `max_creates_per_s`).
fn store_config_with(fields: &str) -> String {
    bounded_config().replace(
        r#""placement": "bounded_keys" }"#,
        &format!(
            r#""placement": "bounded_keys", "placement_store": {{ {fields}, "etcd": {{ "endpoints": ["127.0.0.1:2379", "127.0.0.1:22379"], "prefix": "/llmroute", "timeout_ms": 50 }} }} }}"#
        ),
    )
}

/// etcd's answer when the key already existed, stored on `address`.
fn exists(key: u64, address: &str) -> String {
    let path = store::key_path("/llmroute", "llama-a", key);
    format!(
        r#"{{"header":{{"revision":"3"}},"responses":[{{"response_range":{{"header":{{"revision":"3"}},"kvs":[{{"key":"{}","create_revision":"2","mod_revision":"2","version":"1","value":"{}"}}],"count":"1"}}}}]}}"#,
        b64(path),
        b64(address)
    )
}

fn store_calls(fake: &Rc<FakeHost>) -> Vec<Callout> {
    fake.callouts()
        .into_iter()
        .filter(|c| c.cluster == PLACEMENT_STORE_CLUSTER)
        .collect()
}

fn outcome(fake: &Rc<FakeHost>, o: &str) -> Option<u64> {
    fake.metric(&format!("llmroute_placement_store_total;outcome={o}"))
}

/// A callout's answer, `(status, body)`; `None` is Envoy's "no answer".
type Answer<'a> = Option<(&'a str, &'a str)>;

/// Delivers an answer to a callout: `None` is Envoy's "no answer" (a timeout, a refused connection).
fn deliver(fake: &Rc<FakeHost>, answer: Answer) -> usize {
    match answer {
        Some((status, body)) => {
            fake.set_map(MapType::HttpCallResponseHeaders, &[(":status", status)]);
            fake.set_buffer_bytes(BufferType::HttpCallResponseBody, body.as_bytes());
            body.len()
        }
        None => {
            fake.set_map(MapType::HttpCallResponseHeaders, &[]);
            fake.set_buffer_bytes(BufferType::HttpCallResponseBody, b"");
            0
        }
    }
}

fn answer(x: &mut Exchange, token: u32, a: Answer) {
    let size = deliver(&x.fake, a);
    x.ctx.on_http_call_response(token, 0, size, 0);
}

/// A chat request up to the end of its body; returns the body's action and the request's affinity key.
fn send(x: &mut Exchange) -> (Action, u64) {
    assert_eq!(x.request_headers(&REQUEST_HEADERS, false), Action::Pause);
    let a = x.request_body(chat(false).as_bytes(), true);
    let key = x.request_header("x-llmroute-affinity").unwrap_or_default();
    (a, u64::from_str_radix(&key, 16).unwrap_or(0))
}

fn table(fake: &Rc<FakeHost>) -> KeyTable {
    KeyTable::decode(&fake.shared(&shared::keys("llama-a")).map(|s| s.0).unwrap_or_default())
}

fn pending(fake: &Rc<FakeHost>) -> Vec<u64> {
    let bytes = fake
        .shared(&shared::store_pending("llama-a"))
        .map(|s| s.0)
        .unwrap_or_default();
    Pending::decode(&bytes).keys().to_vec()
}

fn setup() -> (Rc<FakeHost>, Root) {
    let fake = FakeHost::new();
    let root = root(&fake, &store_config());
    (fake, root)
}

#[test]
fn a_new_key_waits_for_etcd_then_resumes_pinned_where_the_store_says() {
    // (answer, outcome, the host the request is pinned to: `None` for the local choice)
    let cases: [(Answer, &str, Option<&str>); 5] = [
        (Some(("200", CREATED)), "won", None),
        (Some(("200", "")), "adopted", Some(B)),
        (None, "timeout", None),
        (Some(("200", LEASE_GONE)), "error", None),
        (Some(("500", "oops")), "error", None),
    ];
    for (reply, expected, stored) in cases {
        let (fake, root) = setup();
        let mut x = Exchange::new(&fake, &root, 1);
        let (action, key) = send(&mut x);
        assert_eq!(action, Action::Pause, "{expected}: the request waits for etcd");
        assert_eq!(x.request_header(SESSION_HEADER), None, "{expected}: not pinned yet");
        let calls = store_calls(&fake);
        assert_eq!(calls.len(), 1);
        let c = &calls[0];
        assert!(c.headers.contains(&(":path".to_string(), store::TXN_PATH.to_string())));
        assert_eq!(c.timeout.as_millis(), 50);
        let body = String::from_utf8(c.body.clone().unwrap_or_default()).unwrap();
        assert!(
            body.contains(&b64(store::key_path("/llmroute", "llama-a", key))),
            "{body}"
        );
        // An answer to some other call is not this request's.
        answer(&mut x, c.token + 100, Some(("200", CREATED)));
        assert_eq!(fake.resumes(), 0);
        let adopted = exists(key, B);
        let reply = match (expected, reply) {
            ("adopted", _) => Some(("200", adopted.as_str())),
            (_, r) => r,
        };
        answer(&mut x, c.token, reply);
        assert_eq!(fake.resumes(), 1, "{expected}: resumed once");
        assert_eq!(outcome(&fake, expected), Some(1), "{expected}");
        let session = x.request_header(SESSION_HEADER);
        let entry = table(&fake).get(key);
        assert!(entry.is_some(), "{expected}: the key is in the shared table");
        if let Some(address) = stored {
            assert_eq!(session, Some(session_header_value(address)), "{expected}");
            assert_eq!(entry.map(|e| e.host), Some(host_id(address)));
        } else {
            let proposed = entry.map(|e| e.host);
            let pinned = [A, B].into_iter().find(|a| Some(host_id(a)) == proposed).unwrap();
            assert_eq!(session, Some(session_header_value(pinned)), "{expected}");
        }
        let fallback = !matches!(expected, "won" | "adopted");
        assert_eq!(
            pending(&fake).contains(&key),
            fallback,
            "{expected}: pending only on a fallback"
        );
        assert!(fake.log_field("llmroute.placement").is_some(), "{expected}");
        // The key is known now: the next request does not wait.
        let mut y = Exchange::new(&fake, &root, 2);
        assert_eq!(send(&mut y).0, Action::Continue, "{expected}");
        assert_eq!(store_calls(&fake).len(), 1, "{expected}");
    }
}

#[test]
fn a_503_is_sent_once_more_to_another_member_then_falls_back() {
    let (fake, root) = setup();
    let mut x = Exchange::new(&fake, &root, 1);
    send(&mut x);
    let first = store_calls(&fake)[0].clone();
    answer(&mut x, first.token, Some(("503", "no healthy upstream")));
    let calls = store_calls(&fake);
    assert_eq!((calls.len(), fake.resumes()), (2, 0), "sent again, still waiting");
    assert_eq!(calls[1].body, first.body, "the same transaction");
    // The first token is spent.
    answer(&mut x, first.token, Some(("200", CREATED)));
    assert_eq!(fake.resumes(), 0);
    answer(&mut x, calls[1].token, Some(("200", CREATED)));
    assert_eq!((fake.resumes(), outcome(&fake, "won")), (1, Some(1)));

    // Two 503s: retried once only, then placed locally.
    let (fake, root) = setup();
    let mut x = Exchange::new(&fake, &root, 1);
    let (_, key) = send(&mut x);
    answer(&mut x, store_calls(&fake)[0].token, Some(("503", "")));
    answer(&mut x, store_calls(&fake)[1].token, Some(("503", "")));
    assert_eq!(store_calls(&fake).len(), 2);
    assert_eq!((fake.resumes(), outcome(&fake, "error")), (1, Some(1)));
    assert!(x.request_header(SESSION_HEADER).is_some());
    assert_eq!(pending(&fake), vec![key]);

    // The retry cannot be sent: placed locally at once.
    let (fake, root) = setup();
    let mut x = Exchange::new(&fake, &root, 1);
    send(&mut x);
    fake.fail_kind(Kind::HttpCall, HostStatus::InternalFailure);
    answer(&mut x, store_calls(&fake)[0].token, Some(("503", "")));
    assert_eq!((fake.resumes(), outcome(&fake, "error")), (1, Some(1)));
}

#[test]
fn a_transaction_that_cannot_be_sent_routes_at_once_and_is_settled_later() {
    let (fake, root) = setup();
    fake.fail_kind(Kind::HttpCall, HostStatus::BadArgument);
    let mut x = Exchange::new(&fake, &root, 1);
    let (action, key) = send(&mut x);
    assert_eq!(action, Action::Continue, "nothing to wait for");
    assert_eq!(outcome(&fake, "not_sent"), Some(1));
    assert!(x.request_header(SESSION_HEADER).is_some());
    assert_eq!(pending(&fake), vec![key]);
    let local = table(&fake).get(key).map(|e| e.host);
    fake.heal();

    // The root settles it: another replica stored the key on the other host, so it moves there, once.
    let cfg = Rc::new(load_config(&store_config()).unwrap());
    let mut syncer = Syncer::default();
    syncer.start(&fake.envoy(), cfg, None);
    syncer.on_tick(&fake.envoy());
    let calls = store_calls(&fake);
    let is_txn = |c: &&Callout| {
        c.body
            .as_ref()
            .is_some_and(|b| String::from_utf8_lossy(b).contains("compare"))
    };
    assert_eq!(calls.iter().filter(is_txn).count(), 1, "the pending key is proposed");
    // No answer (to anything this round): still pending, proposed again next round.
    for c in &calls {
        syncer.on_response(&fake.envoy(), c.token, deliver(&fake, None));
    }
    assert_eq!(pending(&fake), vec![key]);
    fake.advance_ms(2000);
    let seen = store_calls(&fake).len();
    syncer.on_tick(&fake.envoy());
    let again = store_calls(&fake)[seen..].to_vec();
    let settle = again.iter().find(is_txn).unwrap();
    let other = [A, B].into_iter().find(|a| Some(host_id(a)) != local).unwrap();
    let body = exists(key, other);
    syncer.on_response(&fake.envoy(), settle.token, deliver(&fake, Some(("200", &body))));
    assert_eq!(table(&fake).get(key).map(|e| e.host), Some(host_id(other)));
    assert!(pending(&fake).is_empty());
}

fn kept_local(fake: &Rc<FakeHost>, reason: &str) -> Option<u64> {
    fake.metric(&format!("llmroute_placement_store_kept_local_total;reason={reason}"))
}

/// A chat request with session id `session` up to the end of its body: the body's action, and the affinity key.
fn send_session(x: &mut Exchange, session: &str) -> (Action, u64) {
    let mut headers = REQUEST_HEADERS.to_vec();
    headers.push(("x-session-id", session));
    assert_eq!(x.request_headers(&headers, false), Action::Pause);
    let a = x.request_body(chat(false).as_bytes(), true);
    let key = x.request_header("x-llmroute-affinity").unwrap_or_default();
    (a, u64::from_str_radix(&key, 16).unwrap_or(0))
}

#[test]
fn with_share_keys_returning_first_sightings_never_reach_etcd_and_a_key_that_comes_back_does() {
    // `share_keys` left out: returning.
    let fake = FakeHost::new();
    let root = super::root(&fake, &store_config_with(r#""max_creates_per_s": 20"#));
    assert_eq!(kept_local(&fake, "first_sighting"), Some(0), "primed at 0");
    assert_eq!(kept_local(&fake, "over_budget"), Some(0), "primed at 0");
    // A stream of one-off session ids: each placed at once, locally, and no call to etcd.
    for i in 0..50u32 {
        let mut x = Exchange::new(&fake, &root, i + 1);
        let (action, key) = send_session(&mut x, &format!("one-off-{i}"));
        assert_eq!(action, Action::Continue, "request {i} does not wait");
        assert!(x.request_header(SESSION_HEADER).is_some(), "request {i} is pinned");
        assert!(table(&fake).get(key).is_some_and(|e| !e.shared), "request {i}");
    }
    assert!(store_calls(&fake).is_empty(), "no first sighting reaches etcd");
    assert_eq!(kept_local(&fake, "first_sighting"), Some(50));
    // One of them comes back: created in etcd, and pinned where etcd says (another replica stored it on B).
    let mut x = Exchange::new(&fake, &root, 100);
    let (action, key) = send_session(&mut x, "one-off-7");
    assert_eq!(action, Action::Pause, "the key that came back waits for etcd");
    let calls = store_calls(&fake);
    assert_eq!(calls.len(), 1);
    assert!(body_of(&calls[0]).contains(&b64(store::key_path("/llmroute", "llama-a", key))));
    answer(&mut x, calls[0].token, Some(("200", &exists(key, B))));
    assert_eq!(outcome(&fake, "adopted"), Some(1));
    assert_eq!(x.request_header(SESSION_HEADER), Some(session_header_value(B)));
    let e = table(&fake).get(key).unwrap();
    assert_eq!((e.host, e.established, e.shared), (host_id(B), true, true));
    // Shared now: known, no more calls.
    let mut y = Exchange::new(&fake, &root, 101);
    assert_eq!(send_session(&mut y, "one-off-7").0, Action::Continue);
    assert_eq!(store_calls(&fake).len(), 1);
    assert_eq!(kept_local(&fake, "first_sighting"), Some(50));
    // Back only after its idle TTL: a first sighting again.
    fake.advance_ms(300_000);
    let mut z = Exchange::new(&fake, &root, 102);
    assert_eq!(send_session(&mut z, "one-off-7").0, Action::Continue);
    assert_eq!(kept_local(&fake, "first_sighting"), Some(51));
    assert_eq!(store_calls(&fake).len(), 1);
}

#[test]
fn past_max_creates_per_s_a_new_key_is_placed_locally_counted_and_created_on_a_later_request() {
    let fake = FakeHost::new();
    let root = super::root(
        &fake,
        &store_config_with(r#""share_keys": "all", "max_creates_per_s": 2"#),
    );
    let mut waiting = Vec::new();
    for i in 0..3u32 {
        let mut x = Exchange::new(&fake, &root, i + 1);
        let (action, _) = send_session(&mut x, &format!("tenant-{i}"));
        waiting.push((x, action));
    }
    let actions: Vec<Action> = waiting.iter().map(|(_, a)| *a).collect();
    assert_eq!(actions, [Action::Pause, Action::Pause, Action::Continue]);
    assert_eq!(store_calls(&fake).len(), 2, "two creates this second");
    assert_eq!(kept_local(&fake, "over_budget"), Some(1));
    assert!(waiting[2].0.request_header(SESSION_HEADER).is_some(), "placed locally");
    // The next second: the key kept local comes back and is created.
    fake.advance_ms(1000);
    let mut x = Exchange::new(&fake, &root, 10);
    let (action, key) = send_session(&mut x, "tenant-2");
    assert_eq!(action, Action::Pause);
    let calls = store_calls(&fake);
    assert_eq!(calls.len(), 3);
    assert!(body_of(&calls[2]).contains(&b64(store::key_path("/llmroute", "llama-a", key))));
    answer(&mut x, calls[2].token, Some(("200", CREATED)));
    assert_eq!(outcome(&fake, "won"), Some(1));
    assert!(table(&fake).get(key).is_some_and(|e| e.shared));
    // The budget is the Envoy's, shared by its workers: the shared-data counter holds this second's creates.
    let budget = store::CreateBudget::decode(&fake.shared(shared::STORE_CREATES).unwrap().0);
    assert_eq!(budget.used, 1);
}

#[test]
fn the_root_grants_a_lease_and_merges_the_keys_other_replicas_stored() {
    let fake = FakeHost::new();
    let cfg = Rc::new(load_config(&store_config()).unwrap());
    crate::key_placement::seed(&fake.envoy(), &cfg);
    let mut syncer = Syncer::default();
    syncer.start(&fake.envoy(), cfg.clone(), None);
    assert_eq!(
        fake.shared(&shared::store_pending("llama-a")).map(|s| s.0),
        Some(vec![])
    );
    syncer.on_tick(&fake.envoy());
    let calls = store_calls(&fake);
    let path = |c: &Callout| c.headers.iter().find(|(n, _)| n == ":path").map(|(_, v)| v.clone());
    let paths: Vec<_> = calls.iter().filter_map(path).collect();
    assert_eq!(paths, vec![store::GRANT_PATH, store::RANGE_PATH]);
    // One round at a time: nothing more while calls are out.
    fake.advance_ms(1000);
    syncer.on_tick(&fake.envoy());
    assert_eq!(store_calls(&fake).len(), 2);

    syncer.on_response(&fake.envoy(), calls[0].token, deliver(&fake, Some(("200", GRANTED))));
    let lease = Lease::decode(&fake.shared(shared::STORE_LEASE).unwrap().0);
    assert_eq!(lease.id, 2_324_035_746_352_910_857);
    let key = 0x00ab_cdef_0123_4567_u64;
    let range = format!(
        r#"{{"header":{{"revision":"9"}},"kvs":[{{"key":"{}","create_revision":"4","mod_revision":"9","version":"1","value":"{}"}}],"count":"1"}}"#,
        b64(store::key_path("/llmroute", "llama-a", key)),
        b64(A)
    );
    syncer.on_response(&fake.envoy(), calls[1].token, deliver(&fake, Some(("200", &range))));
    assert_eq!(table(&fake).get(key).map(|e| e.host), Some(host_id(A)));
    let revision = fake.shared(&shared::store_revision("llama-a")).unwrap().0;
    assert_eq!(revision, 9i64.to_le_bytes().to_vec());

    // The next round reads only what changed after revision 9.
    fake.advance_ms(2000);
    syncer.on_tick(&fake.envoy());
    let next = store_calls(&fake);
    let range_body = next.last().and_then(|c| c.body.clone()).unwrap();
    let range_body = String::from_utf8_lossy(&range_body).into_owned();
    assert!(range_body.contains(r#""min_mod_revision":"10""#), "{range_body}");
    // Failures are logged and retried next round: a 500, no answer, garbage.
    for (i, a) in [Some(("500", "")), None, Some(("200", "not json"))]
        .into_iter()
        .enumerate()
    {
        let last = store_calls(&fake).last().map_or(0, |c| c.token);
        syncer.on_response(&fake.envoy(), last, deliver(&fake, a));
        fake.advance_ms(2000 + i as u64);
        let before = store_calls(&fake).len();
        syncer.on_tick(&fake.envoy());
        assert!(
            store_calls(&fake).len() > before,
            "answer {i}: the next round reads again"
        );
    }
}

#[test]
fn a_host_error_at_any_call_of_the_store_path_neither_panics_nor_loses_the_request() {
    let run = |fail: &dyn Fn(&FakeHost), reply: Answer| -> (Rc<FakeHost>, bool) {
        let (fake, root) = setup();
        fake.reset_calls();
        fail(&fake);
        let mut x = Exchange::new(&fake, &root, 1);
        let (action, _) = send(&mut x);
        // Each callout the request waits on is answered (a 503 is sent once more).
        let mut answered = 0;
        while action == Action::Pause && fake.replies().is_empty() && fake.resumes() == 0 {
            let Some(c) = store_calls(&fake).get(answered).cloned() else {
                break;
            };
            answer(&mut x, c.token, reply);
            answered += 1;
        }
        let lost = action == Action::Pause && fake.replies().is_empty() && fake.resumes() == 0;
        (fake, lost)
    };
    for reply in [Some(("200", CREATED)), None, Some(("503", ""))] {
        let (clean, lost) = run(&|_| {}, reply);
        assert!(!lost);
        let n = clean.calls().len();
        for i in 0..n {
            for status in [HostStatus::InternalFailure, HostStatus::Other(77)] {
                let (fake, lost) = run(&|h| h.fail_nth(i, status), reply);
                let failed = fake.calls().get(i).copied();
                let reply_failed = fake.calls().contains(&Kind::LocalResponse) && fake.replies().is_empty();
                assert!(
                    !lost || reply_failed,
                    "{reply:?}: call {i} ({failed:?}) failing with {status:?}"
                );
            }
        }
    }
}

#[test]
fn a_host_error_at_any_call_of_a_sync_round_neither_panics_nor_stops_syncing() {
    let round = |fake: &Rc<FakeHost>, syncer: &mut Syncer| {
        syncer.on_tick(&fake.envoy());
        for c in store_calls(fake) {
            let path = c.headers.iter().find(|(n, _)| n == ":path").map(|(_, v)| v.clone());
            let body = match path.as_deref() {
                Some(store::GRANT_PATH) => GRANTED,
                _ => r#"{"header":{"revision":"4"},"count":"0"}"#,
            };
            syncer.on_response(&fake.envoy(), c.token, deliver(fake, Some(("200", body))));
        }
    };
    let start = || {
        let fake = FakeHost::new();
        let cfg = Rc::new(load_config(&store_config()).unwrap());
        crate::key_placement::seed(&fake.envoy(), &cfg);
        let mut syncer = Syncer::default();
        syncer.start(&fake.envoy(), cfg, None);
        fake.reset_calls();
        (fake, syncer)
    };
    let (clean, mut syncer) = start();
    round(&clean, &mut syncer);
    let n = clean.calls().len();
    for i in 0..n {
        let (fake, mut syncer) = start();
        fake.fail_nth(i, HostStatus::InternalFailure);
        round(&fake, &mut syncer);
        fake.heal();
        fake.advance_ms(10_000);
        let seen = store_calls(&fake).len();
        syncer.on_tick(&fake.envoy());
        assert!(
            store_calls(&fake).len() > seen,
            "call {i}: the next round reads the store"
        );
    }
}

#[test]
fn each_epoch_a_new_lease_is_granted_and_the_keys_in_use_are_re_attached_to_it() {
    let fake = FakeHost::new();
    let cfg = Rc::new(load_config(&store_config()).unwrap());
    crate::key_placement::seed(&fake.envoy(), &cfg);
    let mut syncer = Syncer::default();
    syncer.start(&fake.envoy(), cfg.clone(), None);
    let round = |syncer: &mut Syncer, grant: &str| {
        let seen = store_calls(&fake).len();
        syncer.on_tick(&fake.envoy());
        for c in store_calls(&fake)[seen..].to_vec() {
            let body = match c.headers.iter().any(|(n, v)| n == ":path" && v == store::GRANT_PATH) {
                true => grant.to_string(),
                false => r#"{"header":{"revision":"4"},"count":"0"}"#.to_string(),
            };
            syncer.on_response(&fake.envoy(), c.token, deliver(&fake, Some(("200", &body))));
        }
    };
    round(&mut syncer, GRANTED);
    // A key this replica's requests use (twice: established) during the first epoch, settled through the store;
    // and one it placed alone (never shared), which a refresh must not create.
    let key = 0x0fed_cba9_8765_4321_u64;
    let alone = 0x0123_4567_89ab_cdef_u64;
    for _ in 0..2 {
        let placement = &cfg.affinity.placement;
        if let Some(p) = crate::key_placement::pin_stored(&fake.envoy(), &cfg, placement, "llama-a", key, None, true) {
            p.release(&fake.envoy());
        }
        if let Some(p) = crate::key_placement::pin(&fake.envoy(), &cfg, placement, "llama-a", alone) {
            p.release(&fake.envoy());
        }
    }
    assert!(table(&fake).get(alone).is_some_and(|e| e.established && !e.shared));
    fake.advance_ms(store::epoch_ms(300_000));
    let seen = store_calls(&fake).len();
    round(&mut syncer, &GRANTED.replace("2324035746352910857", "77"));
    assert_eq!(Lease::decode(&fake.shared(shared::STORE_LEASE).unwrap().0).id, 77);
    let refresh: Vec<_> = store_calls(&fake)[seen..]
        .iter()
        .filter(|c| {
            c.body
                .as_ref()
                .is_some_and(|b| String::from_utf8_lossy(b).contains(r#""lease":"77""#))
        })
        .cloned()
        .collect();
    assert_eq!(refresh.len(), 1, "one batch re-attaches the key");
    let body = String::from_utf8(refresh[0].body.clone().unwrap()).unwrap();
    assert!(
        body.contains(&b64(store::key_path("/llmroute", "llama-a", key))),
        "{body}"
    );
    assert!(
        !body.contains(&b64(store::key_path("/llmroute", "llama-a", alone))),
        "{body}"
    );
    // Its answer (or a bad one) is read and changes nothing.
    let before = table(&fake).get(key);
    syncer.on_response(&fake.envoy(), refresh[0].token, deliver(&fake, Some(("200", CREATED))));
    assert_eq!(table(&fake).get(key), before);
}

/// Marks `address` down in llama-a's status, as the root's poll would.
fn mark_down(fake: &Rc<FakeHost>, address: &str) {
    crate::key_placement::store_down(&fake.envoy(), "llama-a", fake.envoy().now_ms(), &[address.to_string()]);
}

fn body_of(c: &Callout) -> String {
    String::from_utf8(c.body.clone().unwrap_or_default()).unwrap_or_default()
}

/// A request whose key the store settled on the local choice (won); returns that host.
fn placed(fake: &Rc<FakeHost>, root: &Root) -> (u64, &'static str) {
    let mut x = Exchange::new(fake, root, 1);
    let (_, key) = send(&mut x);
    answer(&mut x, store_calls(fake)[0].token, Some(("200", CREATED)));
    let host = table(fake).get(key).map(|e| e.host);
    let address = [A, B].into_iter().find(|a| Some(host_id(a)) == host).unwrap();
    (key, address)
}

// The swap's answer when the key is gone from etcd.
const GONE: &str = r#"{"header":{"revision":"4"},"responses":[{"response_range":{"header":{"revision":"4"}}}]}"#;

#[test]
fn a_known_key_whose_host_goes_down_is_moved_once_through_a_swap_in_etcd() {
    // (answer to the swap, outcome counted, pending afterwards)
    let cases: [(Answer, &str, bool); 4] = [
        (Some(("200", CREATED)), "moved", false),
        (Some(("200", "")), "move_adopted", false),
        (None, "timeout", true),
        (Some(("500", "oops")), "error", true),
    ];
    for (reply, expected, fell_back) in cases {
        let (fake, root) = setup();
        let (key, home) = placed(&fake, &root);
        let other = if home == A { B } else { A };
        mark_down(&fake, home);
        let mut x = Exchange::new(&fake, &root, 2);
        assert_eq!(send(&mut x).0, Action::Pause, "{expected}: the move waits for etcd");
        let calls = store_calls(&fake);
        assert_eq!(calls.len(), 2, "{expected}");
        let body = body_of(&calls[1]);
        assert!(body.contains(r#""target":"VALUE""#), "{expected}: a swap: {body}");
        assert!(body.contains(&b64(home)) && body.contains(&b64(other)), "{body}");
        let stored = exists(key, other);
        let reply = match expected {
            "move_adopted" => Some(("200", stored.as_str())),
            _ => reply,
        };
        answer(&mut x, calls[1].token, reply);
        assert_eq!(fake.resumes(), 2, "{expected}: resumed");
        assert_eq!(outcome(&fake, expected), Some(1), "{expected}");
        assert_eq!(
            x.request_header(SESSION_HEADER),
            Some(session_header_value(other)),
            "{expected}: pinned off the down host"
        );
        assert_eq!(table(&fake).get(key).map(|e| e.host), Some(host_id(other)));
        assert_eq!(pending(&fake).contains(&key), fell_back, "{expected}");
        // Moved now: the next request neither waits nor asks etcd.
        let mut y = Exchange::new(&fake, &root, 3);
        assert_eq!(send(&mut y).0, Action::Continue, "{expected}");
        assert_eq!(store_calls(&fake).len(), 2, "{expected}");
    }
}

#[test]
fn a_swap_that_finds_the_key_gone_creates_it_and_a_created_key_on_a_down_host_is_swapped() {
    let (fake, root) = setup();
    let (_, home) = placed(&fake, &root);
    let other = if home == A { B } else { A };
    mark_down(&fake, home);
    let mut x = Exchange::new(&fake, &root, 2);
    send(&mut x);
    answer(&mut x, store_calls(&fake)[1].token, Some(("200", GONE)));
    let calls = store_calls(&fake);
    assert_eq!(
        (calls.len(), fake.resumes()),
        (3, 1),
        "sent again as a create, still waiting"
    );
    assert!(body_of(&calls[2]).contains(r#""target":"CREATE""#));
    answer(&mut x, calls[2].token, Some(("200", CREATED)));
    assert_eq!(
        (fake.resumes(), outcome(&fake, "won")),
        (2, Some(2)),
        "the first placement and this create"
    );
    assert_eq!(x.request_header(SESSION_HEADER), Some(session_header_value(other)));

    // A replica that never saw the key learns from etcd that it lives on the down host: it swaps it.
    let (fake, root) = setup();
    mark_down(&fake, A);
    let mut x = Exchange::new(&fake, &root, 1);
    let (_, key) = send(&mut x);
    let on_a = exists(key, A);
    answer(&mut x, store_calls(&fake)[0].token, Some(("200", &on_a)));
    let calls = store_calls(&fake);
    assert_eq!(calls.len(), 2, "a swap follows");
    let body = body_of(&calls[1]);
    assert!(body.contains(r#""target":"VALUE""#) && body.contains(&b64(A)), "{body}");
    answer(&mut x, calls[1].token, Some(("200", CREATED)));
    assert_eq!(outcome(&fake, "moved"), Some(1));
    assert_eq!(x.request_header(SESSION_HEADER), Some(session_header_value(B)));

    // Follow-ups are bounded: answers that keep naming the down host end with the last one, placed locally.
    let (fake, root) = setup();
    mark_down(&fake, A);
    let mut x = Exchange::new(&fake, &root, 1);
    let (_, key) = send(&mut x);
    let on_a = exists(key, A);
    for i in 0..=store::MAX_FOLLOW_UPS as usize {
        let calls = store_calls(&fake);
        assert_eq!((calls.len(), fake.resumes()), (i + 1, 0));
        answer(&mut x, calls[i].token, Some(("200", &on_a)));
    }
    assert_eq!(fake.resumes(), 1, "resumed after the last follow-up");
    assert_eq!(x.request_header(SESSION_HEADER), Some(session_header_value(B)));
}

#[test]
fn a_key_moved_while_etcd_failed_is_swapped_at_settling_when_etcd_still_holds_the_down_host() {
    let (fake, root) = setup();
    let (key, home) = placed(&fake, &root);
    let other = if home == A { B } else { A };
    mark_down(&fake, home);
    let mut x = Exchange::new(&fake, &root, 2);
    send(&mut x);
    answer(&mut x, store_calls(&fake)[1].token, None);
    assert_eq!(pending(&fake), vec![key]);

    let cfg = Rc::new(load_config(&store_config()).unwrap());
    let mut syncer = Syncer::default();
    syncer.start(&fake.envoy(), cfg, None);
    mark_down(&fake, home);
    let seen = store_calls(&fake).len();
    syncer.on_tick(&fake.envoy());
    let round = store_calls(&fake)[seen..].to_vec();
    let settle = round
        .iter()
        .find(|c| body_of(c).contains(r#""target":"CREATE""#))
        .unwrap();
    let on_home = exists(key, home);
    syncer.on_response(&fake.envoy(), settle.token, deliver(&fake, Some(("200", &on_home))));
    assert_eq!(
        table(&fake).get(key).map(|e| e.host),
        Some(host_id(other)),
        "not moved back onto the down host"
    );
    assert_eq!(pending(&fake), vec![key], "pending until the swap is answered");
    let swap = store_calls(&fake).last().cloned().unwrap();
    let body = body_of(&swap);
    assert!(body.contains(r#""target":"VALUE""#) && body.contains(&b64(home)) && body.contains(&b64(other)));
    syncer.on_response(&fake.envoy(), swap.token, deliver(&fake, Some(("200", CREATED))));
    assert!(pending(&fake).is_empty());
    assert_eq!(table(&fake).get(key).map(|e| e.host), Some(host_id(other)));
}

/// etcd's answer to a create-in-view whose view was stale: the key absent, and `keys` (key, address) of the
/// backend changed since the view, read at `revision`.
fn stale(keys: &[(u64, &str)], revision: i64) -> String {
    let kvs: Vec<String> = keys
        .iter()
        .map(|(k, address)| {
            format!(
                r#"{{"key":"{}","create_revision":"{revision}","mod_revision":"{revision}","version":"1","value":"{}"}}"#,
                b64(store::key_path("/llmroute", "llama-a", *k)),
                b64(address)
            )
        })
        .collect();
    format!(
        r#"{{"header":{{"revision":"{revision}"}},"responses":[{{"response_range":{{"header":{{"revision":"{revision}"}}}}}},{{"response_range":{{"header":{{"revision":"{revision}"}},"kvs":[{}],"count":"{}"}}}}]}}"#,
        kvs.join(","),
        keys.len()
    )
}

fn revision(fake: &Rc<FakeHost>) -> i64 {
    let bytes = fake
        .shared(&shared::store_revision("llama-a"))
        .map(|s| s.0)
        .unwrap_or_default();
    bytes.get(..8).map_or(0, |b| i64::from_le_bytes(b.try_into().unwrap()))
}

/// The transaction a callout carries, as JSON.
fn txn(c: &Callout) -> serde_json::Value {
    serde_json::from_slice(c.body.as_deref().unwrap_or_default()).unwrap()
}

fn proposed(c: &Callout) -> String {
    let value = txn(c)["success"][0]["request_put"]["value"]
        .as_str()
        .unwrap()
        .to_string();
    String::from_utf8(llmroute_core::etcd_json::unb64(&value).unwrap()).unwrap()
}

#[test]
fn a_new_key_proposed_from_a_stale_view_learns_what_changed_chooses_again_and_retries() {
    let (fake, root) = setup();
    let mut x = Exchange::new(&fake, &root, 1);
    let (_, key) = send(&mut x);
    let first = store_calls(&fake)[0].clone();
    let body = txn(&first);
    assert_eq!(
        body["compare"][1]["mod_revision"], "1",
        "a replica that never read the range: only an empty one passes"
    );
    let mine = proposed(&first);
    // Two keys another replica just placed on that host: with two hosts, it is at its bound for a third.
    answer(
        &mut x,
        first.token,
        Some(("200", &stale(&[(0xa1, &mine), (0xa2, &mine)], 9))),
    );
    let calls = store_calls(&fake);
    assert_eq!((calls.len(), fake.resumes()), (2, 0), "sent again, still waiting");
    assert_eq!(outcome(&fake, "stale_view"), Some(1));
    assert_eq!(
        txn(&calls[1])["compare"][1]["mod_revision"],
        "10",
        "in the view the answer brought"
    );
    assert_ne!(
        proposed(&calls[1]),
        mine,
        "chosen again, with the other replica's keys counted"
    );
    let t = table(&fake);
    assert_eq!(t.get(0xa1).map(|e| e.host), Some(host_id(&mine)), "merged");
    assert_eq!(revision(&fake), 9);
    // Created at revision 12: the view, now holding this key too, is complete up to it.
    let created = CREATED.replace(r#""revision":"2""#, r#""revision":"12""#);
    answer(&mut x, calls[1].token, Some(("200", &created)));
    assert_eq!((fake.resumes(), outcome(&fake, "won")), (1, Some(1)));
    assert_eq!(
        table(&fake).get(key).map(|e| e.host),
        Some(host_id(&proposed(&calls[1])))
    );
    assert_eq!(revision(&fake), 12);
    assert!(pending(&fake).is_empty());

    // Stale views past the retries: the last transaction is a plain create-if-absent, and its answer stands.
    let (fake, root) = setup();
    let mut x = Exchange::new(&fake, &root, 1);
    send(&mut x);
    for i in 0..=store::MAX_STALE_RETRIES {
        let c = store_calls(&fake)[usize::from(i)].clone();
        assert_eq!(
            txn(&c)["compare"].as_array().map(Vec::len),
            Some(2),
            "try {i} compares the range"
        );
        let r = 20 + i64::from(i);
        answer(&mut x, c.token, Some(("200", &stale(&[(0xb0 + u64::from(i), A)], r))));
    }
    let calls = store_calls(&fake);
    assert_eq!(calls.len(), usize::from(store::MAX_STALE_RETRIES) + 2);
    let last = calls.last().unwrap();
    assert_eq!(
        txn(last)["compare"].as_array().map(Vec::len),
        Some(1),
        "a plain create-if-absent"
    );
    assert_eq!(
        outcome(&fake, "stale_view"),
        Some(u64::from(store::MAX_STALE_RETRIES) + 1)
    );
    answer(&mut x, last.token, Some(("200", CREATED)));
    assert_eq!((fake.resumes(), outcome(&fake, "won")), (1, Some(1)));

    // A cut answer (`more`) makes no view: merged, then a plain create-if-absent.
    let (fake, root) = setup();
    let mut x = Exchange::new(&fake, &root, 1);
    send(&mut x);
    let cut = stale(&[(0xc1, B)], 30).replace(r#""count":"1""#, r#""more":true,"count":"5""#);
    answer(&mut x, store_calls(&fake)[0].token, Some(("200", &cut)));
    let calls = store_calls(&fake);
    assert_eq!(txn(&calls[1])["compare"].as_array().map(Vec::len), Some(1));
    assert_eq!(revision(&fake), 0, "the view did not advance");
    assert!(table(&fake).get(0xc1).is_some());
}

const PASSWORD_VAR: &str = "LLMROUTE_TEST_STORE_PASSWORD";
const PASSWORD: &str = "store-pw-9c2d";

fn auth_config() -> String {
    store_config().replace(
        r#""timeout_ms": 50 }"#,
        &format!(r#""timeout_ms": 50, "auth": {{ "user": "llmroute", "password_env": "{PASSWORD_VAR}" }} }}"#),
    )
}

fn path_of(c: &Callout) -> String {
    c.headers
        .iter()
        .find(|(n, _)| n == ":path")
        .map_or(String::new(), |(_, v)| v.clone())
}

fn authorization(c: &Callout) -> Option<String> {
    c.headers
        .iter()
        .find(|(n, _)| n == "authorization")
        .map(|(_, v)| v.clone())
}

/// The root's store calls of one tick, from `seen` on.
fn tick(fake: &Rc<FakeHost>, root: &mut Root, seen: usize) -> Vec<Callout> {
    root.on_tick();
    store_calls(fake)[seen..].to_vec()
}

fn deliver_to_root(fake: &Rc<FakeHost>, root: &mut Root, token: u32, a: Answer) {
    use proxy_wasm::traits::Context;
    let size = deliver(fake, a);
    root.on_http_call_response(token, 0, size, 0);
}

#[test]
fn with_auth_the_root_authenticates_first_and_every_call_then_carries_the_token() {
    std::env::set_var(PASSWORD_VAR, PASSWORD);
    let fake = FakeHost::new();
    let mut root = root(&fake, &auth_config());

    // Before a token, a new key's request does not wait: placed locally, settled later.
    let mut x = Exchange::new(&fake, &root, 1);
    let (action, key) = send(&mut x);
    assert_eq!(action, Action::Continue, "no token: nothing to wait for");
    assert_eq!(outcome(&fake, "not_sent"), Some(1));
    assert_eq!(pending(&fake), vec![key]);
    assert!(store_calls(&fake).is_empty());

    // The root's first round only authenticates, with the user and password in the body, no token.
    let first = tick(&fake, &mut root, 0);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(path_of(&first[0]), "/v3/auth/authenticate");
    assert_eq!(authorization(&first[0]), None);
    let body: serde_json::Value = serde_json::from_slice(first[0].body.as_deref().unwrap()).unwrap();
    assert_eq!(body, serde_json::json!({ "name": "llmroute", "password": PASSWORD }));
    deliver_to_root(&fake, &mut root, first[0].token, Some(("200", r#"{"token":"tok.1"}"#)));
    assert_eq!(fake.shared(shared::STORE_TOKEN).map(|s| s.0), Some(b"tok.1".to_vec()));

    // Then every call carries it: the root's grant, range and settling, and a request's transaction.
    fake.advance_ms(1000);
    let round = tick(&fake, &mut root, 1);
    let paths: Vec<String> = round.iter().map(path_of).collect();
    assert!(
        paths.contains(&store::GRANT_PATH.to_string()) && paths.contains(&store::TXN_PATH.to_string()),
        "{paths:?}"
    );
    assert!(
        round.iter().all(|c| authorization(c).as_deref() == Some("tok.1")),
        "{round:?}"
    );
    let mut x = Exchange::new(&fake, &root, 2);
    let other = chat(false).replace("You are terse.", "You are another tenant.");
    assert_eq!(x.request_headers(&REQUEST_HEADERS, false), Action::Pause);
    assert_eq!(
        x.request_body(other.as_bytes(), true),
        Action::Pause,
        "a token: the request waits for etcd"
    );
    let txn = store_calls(&fake).last().cloned().unwrap();
    assert_eq!(authorization(&txn).as_deref(), Some("tok.1"));

    // etcd forgets the token (a restart): the 401 drops it, the request is placed locally, and the next round
    // authenticates again.
    let forgotten = r#"{"error":"etcdserver: invalid auth token","code":16}"#;
    answer(&mut x, txn.token, Some(("401", forgotten)));
    assert_eq!(fake.resumes(), 1);
    assert_eq!(fake.shared(shared::STORE_TOKEN).map(|s| s.0), Some(Vec::new()));
    for c in &round {
        deliver_to_root(&fake, &mut root, c.token, None);
    }
    fake.advance_ms(1000);
    let seen = store_calls(&fake).len();
    let again = tick(&fake, &mut root, seen);
    assert_eq!(again.iter().map(path_of).collect::<Vec<_>>(), ["/v3/auth/authenticate"]);
    let logs = fake.logs();
    assert!(logs.iter().all(|(_, l)| !l.contains(PASSWORD)), "{logs:?}");
}

#[test]
fn a_refused_password_is_logged_without_it_and_tried_again_ten_seconds_later() {
    std::env::set_var(PASSWORD_VAR, PASSWORD);
    let fake = FakeHost::new();
    let mut root = root(&fake, &auth_config());
    let first = tick(&fake, &mut root, 0);
    let refused = r#"{"error":"etcdserver: authentication failed, invalid user ID or password","code":3}"#;
    deliver_to_root(&fake, &mut root, first[0].token, Some(("400", refused)));
    let logs = fake.logs();
    let line = logs
        .iter()
        .map(|(_, l)| l)
        .find(|l| l.contains("refused user llmroute"))
        .unwrap();
    assert!(
        line.contains("authentication failed") && !line.contains(PASSWORD),
        "{line}"
    );
    assert_eq!(token_now(&fake), None);
    for _ in 0..9 {
        fake.advance_ms(1000);
        assert!(tick(&fake, &mut root, 1).is_empty(), "no new try within 10 s");
    }
    fake.advance_ms(1000);
    let again = tick(&fake, &mut root, 1);
    assert_eq!(again.iter().map(path_of).collect::<Vec<_>>(), ["/v3/auth/authenticate"]);
}

fn token_now(fake: &Rc<FakeHost>) -> Option<Vec<u8>> {
    fake.shared(shared::STORE_TOKEN).map(|s| s.0).filter(|t| !t.is_empty())
}

#[test]
fn an_unset_password_refuses_the_configuration_naming_the_variable() {
    let fake = FakeHost::new();
    let config = auth_config().replace(PASSWORD_VAR, "LLMROUTE_TEST_STORE_PASSWORD_NEVER_SET");
    fake.set_buffer_bytes(BufferType::PluginConfiguration, config.as_bytes());
    let mut root = Root::new(fake.envoy());
    assert!(!root.on_configure(config.len()));
    let logs = fake.logs();
    assert!(
        logs.iter().any(|(_, l)| l.contains(
            "affinity.placement_store.etcd.auth.password_env: the variable LLMROUTE_TEST_STORE_PASSWORD_NEVER_SET is not set"
        )),
        "{logs:?}"
    );
}
