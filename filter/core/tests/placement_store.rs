//! The shared placement store: etcd's JSON encoding (`etcd_json`), what a replica does with each answer
//! (`key_placement::store`), the config block, and replicas that agree through one store. The same bodies are sent
//! to a real etcd in `harness/tests/envoy/replicas.rs`.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use llmroute_core::config::ShareKeys;
use llmroute_core::etcd_json::{self, b64, int, prefix_end, EtcdJsonError, Kv, RangeAnswer, TxnAnswer};
use llmroute_core::key_placement::store::{
    self, Ask, CreateBudget, Decision, Fallback, InView, KeptLocal, Lease, Next, Outcome, Pending, Reply, Settled,
};
use llmroute_core::key_placement::{choose, choose_stored, host_id, Bounds, HostView, KeyTable, PlacementReason};
use llmroute_core::{load_config, ConfigErrors};
use proptest::prelude::*;
use serde_json::{json, Value};

mod common;

use common::{hosts, PLACEMENT_TTL as TTL};

fn bounds() -> Bounds {
    common::bounds(125)
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap()
}

fn unb64(v: &Value) -> String {
    String::from_utf8(etcd_json::unb64(v.as_str().unwrap()).unwrap()).unwrap()
}

// The answers below are etcd 3.4.23's, as captured from its gateway.
const CREATED: &str = r#"{"header":{"cluster_id":"1","member_id":"2","revision":"2","raft_term":"2"},"succeeded":true,"responses":[{"response_put":{"header":{"revision":"2"}}}]}"#;
const EXISTS: &str = r#"{"header":{"cluster_id":"1","member_id":"2","revision":"2","raft_term":"2"},"responses":[{"response_range":{"header":{"revision":"2"},"kvs":[{"key":"L2wva2V5cy9hLzAwMDAwMDAwMDAwMDAwZmY=","create_revision":"2","mod_revision":"2","version":"1","value":"MTI3LjAuMC4xOjgwMDE="}],"count":"1"}}]}"#;
const LEASE_GONE: &str =
    r#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#;
const GRANTED: &str = r#"{"header":{"cluster_id":"1","member_id":"2","revision":"2","raft_term":"2"},"ID":"2324035746352910857","TTL":"5"}"#;
// A swap's answer when the key is gone: the failure branch's range found nothing.
const RANGE_EMPTY_TXN: &str = r#"{"header":{"cluster_id":"1","member_id":"2","revision":"4","raft_term":"2"},"responses":[{"response_range":{"header":{"revision":"4"}}}]}"#;
const RANGE_FILTERED: &str =
    r#"{"header":{"cluster_id":"1","member_id":"2","revision":"7","raft_term":"2"},"count":"1"}"#;

#[test]
fn bodies_carry_base64_keys_and_int64s_as_strings() {
    let b = json_of(&etcd_json::create_if_absent_body(
        "/l/keys/a/00000000000000ff",
        "127.0.0.1:8001",
        42,
        None,
    ));
    assert_eq!(unb64(&b["compare"][0]["key"]), "/l/keys/a/00000000000000ff");
    assert_eq!(
        b["success"].as_array().map(Vec::len),
        Some(1),
        "no marker, no second put"
    );
    assert_eq!(b["compare"][0]["target"], "CREATE");
    assert_eq!(b["compare"][0]["result"], "EQUAL");
    assert_eq!(b["compare"][0]["create_revision"], "0");
    let put = &b["success"][0]["request_put"];
    assert_eq!(unb64(&put["value"]), "127.0.0.1:8001");
    assert_eq!(put["lease"], "42");
    assert_eq!(
        unb64(&b["failure"][0]["request_range"]["key"]),
        "/l/keys/a/00000000000000ff"
    );

    let r = json_of(&etcd_json::range_body("/l/keys/a/", 4096, 9));
    assert_eq!(unb64(&r["key"]), "/l/keys/a/");
    assert_eq!(unb64(&r["range_end"]), "/l/keys/a0");
    assert_eq!(r["limit"], "4096");
    assert_eq!(r["min_mod_revision"], "9");
    assert!(json_of(&etcd_json::range_body("/p/", 1, 0))
        .get("min_mod_revision")
        .is_none());

    assert_eq!(json_of(&etcd_json::grant_body(30))["TTL"], "30");
    assert_eq!(json_of(&etcd_json::keepalive_body(7))["ID"], "7");
    assert_eq!(json_of(&etcd_json::revoke_body(7))["ID"], "7");
    let w = json_of(&etcd_json::watch_body("/p/", 3));
    assert_eq!(w["create_request"]["start_revision"], "3");
}

#[test]
fn prefix_end_and_int64s() {
    assert_eq!(prefix_end(b"/llmroute/a/"), b"/llmroute/a0");
    assert_eq!(prefix_end(b"a"), b"b");
    assert_eq!(prefix_end(b"a\xff"), b"b");
    assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    assert_eq!(int(&json!("7587878")), 7_587_878);
    assert_eq!(int(&json!(12)), 12);
    assert_eq!(int(&Value::Null), 0);
    assert_eq!(int(&json!("x")), 0);
    assert_eq!(b64("a"), "YQ==");
}

#[test]
fn transaction_answers_are_read() {
    assert_eq!(
        etcd_json::parse_create(CREATED.as_bytes()),
        Ok(TxnAnswer::Created { revision: 2 })
    );
    match etcd_json::parse_create(EXISTS.as_bytes()).unwrap() {
        TxnAnswer::Exists { kv: Some(kv), revision } => {
            assert_eq!(revision, 2);
            assert_eq!(kv.key, b"/l/keys/a/00000000000000ff");
            assert_eq!(kv.value, b"127.0.0.1:8001");
            assert_eq!(kv.mod_revision, 2);
            assert_eq!(kv.lease, 0);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        etcd_json::parse_create(LEASE_GONE.as_bytes()),
        Err(EtcdJsonError::Etcd { code: 5 })
    );
    assert_eq!(
        etcd_json::parse_grant(GRANTED.as_bytes()),
        Ok(2_324_035_746_352_910_857)
    );
    assert_eq!(etcd_json::parse_puts(CREATED.as_bytes()), Ok(2));
}

#[test]
fn authentication_sends_the_user_and_reads_back_a_header_safe_token() {
    let body = json_of(&etcd_json::authenticate_body("llm\"route", "p\"w"));
    assert_eq!(body, json!({ "name": "llm\"route", "password": "p\"w" }));
    let ok = br#"{"header":{"revision":"1"},"token":"yYaBENxkTneJpYNy.14"}"#;
    assert_eq!(etcd_json::parse_authenticate(ok).as_deref(), Ok("yYaBENxkTneJpYNy.14"));
    let refused = br#"{"error":"etcdserver: authentication failed, invalid user ID or password","code":3}"#;
    assert_eq!(
        etcd_json::parse_authenticate(refused),
        Err(EtcdJsonError::Etcd { code: 3 })
    );
    let long = format!(r#"{{"token":"{}"}}"#, "a".repeat(etcd_json::MAX_TOKEN + 1));
    for bad in [
        &br#"{"token":""}"#[..],
        br#"{"token":"a\r\nx: y"}"#,
        br#"{}"#,
        long.as_bytes(),
    ] {
        assert_eq!(
            etcd_json::parse_authenticate(bad),
            Err(EtcdJsonError::Missing("token")),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn range_answers_are_read_and_odd_ones_refused() {
    let r = etcd_json::parse_range(RANGE_FILTERED.as_bytes()).unwrap();
    assert_eq!(
        r,
        RangeAnswer {
            kvs: vec![],
            revision: 7,
            more: false
        }
    );
    for bad in [
        "",
        "garbage",
        "[]",
        "{}",
        "{\"header\":{}}",
        "null",
        "{\"code\":3,\"error\":\"x\"}",
    ] {
        assert!(etcd_json::parse_range(bad.as_bytes()).is_err(), "{bad:?}");
        assert!(etcd_json::parse_create(bad.as_bytes()).is_err(), "{bad:?}");
    }
    // A key that is not base64 is skipped, not trusted.
    let odd = r#"{"header":{"revision":"3"},"kvs":[{"key":"%%%","value":"YQ=="},{"key":"YQ==","value":"YQ==","lease":"9"}],"more":true}"#;
    let r = etcd_json::parse_range(odd.as_bytes()).unwrap();
    assert_eq!(r.kvs.len(), 1);
    assert_eq!(r.kvs[0].lease, 9);
    assert!(r.more);
}

#[test]
fn each_answer_decides_what_the_replica_does() {
    let ok = |body: &'static str| Reply::Answer {
        status: 200,
        body: body.as_bytes(),
    };
    assert_eq!(store::create_outcome(ok(CREATED)), Outcome::Won);
    assert_eq!(
        store::create_outcome(ok(EXISTS)),
        Outcome::Adopted {
            host: host_id("127.0.0.1:8001")
        }
    );
    assert_eq!(
        store::create_outcome(Reply::NoAnswer),
        Outcome::Fallback(Fallback::Timeout)
    );
    assert_eq!(
        store::create_outcome(Reply::NotSent),
        Outcome::Fallback(Fallback::NotSent)
    );
    let unavailable = Reply::Answer {
        status: 503,
        body: b"no healthy upstream",
    };
    assert_eq!(store::create_outcome(unavailable), Outcome::Fallback(Fallback::Error));
    // Envoy's own answer to a callout past its timeout.
    let timed_out = Reply::Answer {
        status: 504,
        body: b"upstream request timeout",
    };
    assert_eq!(store::create_outcome(timed_out), Outcome::Fallback(Fallback::Timeout));
    let lease_gone = Reply::Answer {
        status: 404,
        body: LEASE_GONE.as_bytes(),
    };
    assert_eq!(store::create_outcome(lease_gone), Outcome::Fallback(Fallback::Error));
    assert_eq!(
        store::create_outcome(ok("not json")),
        Outcome::Fallback(Fallback::Error)
    );
    // A stored value that is no address is not adopted.
    let junk = EXISTS.replace("MTI3LjAuMC4xOjgwMDE=", "AAEC");
    let junk: &'static str = Box::leak(junk.into_boxed_str());
    assert_eq!(store::create_outcome(ok(junk)), Outcome::Fallback(Fallback::Error));

    assert_eq!(Outcome::Won.stored(5), Some(5));
    assert_eq!(Outcome::Adopted { host: 9 }.stored(5), Some(9));
    assert_eq!(Outcome::Fallback(Fallback::Timeout).stored(5), None);
    assert_eq!(Outcome::Moved.stored(5), Some(5));
    assert_eq!(Outcome::MoveAdopted { host: 9 }.stored(5), Some(9));
    let labels: Vec<&str> = [
        Outcome::Won,
        Outcome::Adopted { host: 1 },
        Outcome::Moved,
        Outcome::MoveAdopted { host: 1 },
        Outcome::Fallback(Fallback::Timeout),
        Outcome::Fallback(Fallback::NotSent),
        Outcome::Fallback(Fallback::Error),
    ]
    .iter()
    .map(|o| o.as_str())
    .collect();
    assert_eq!(labels, Outcome::LABELS[..7]);
    assert_eq!(Outcome::LABELS[7], store::STALE_VIEW);
}

// A create-in-view's answers, in etcd 3.4's shape: the key absent and the range changed since the view (one key,
// of two, read back: `more`), and the key present (the range read is then whatever it is).
const STALE: &str = r#"{"header":{"cluster_id":"1","member_id":"2","revision":"9","raft_term":"2"},"responses":[{"response_range":{"header":{"revision":"9"}}},{"response_range":{"header":{"revision":"9"},"kvs":[{"key":"L2wva2V5cy9hLzAwMDAwMDAwMDAwMDAwMDE=","create_revision":"8","mod_revision":"8","version":"1","value":"MTI3LjAuMC4xOjgwMDI="}],"more":true,"count":"2"}}]}"#;
const IN_VIEW_EXISTS: &str = r#"{"header":{"revision":"9"},"responses":[{"response_range":{"header":{"revision":"9"},"kvs":[{"key":"L2wva2V5cy9hLzAwMDAwMDAwMDAwMDAwZmY=","create_revision":"2","mod_revision":"2","version":"1","value":"MTI3LjAuMC4xOjgwMDE="}],"count":"1"}},{"response_range":{"header":{"revision":"9"}}}]}"#;

#[test]
fn a_create_in_view_compares_the_backends_marker_and_reads_back_what_changed() {
    let body = store::ask_request(&Ask::Create.in_view(41, 64), "/l", "a", 255, "127.0.0.1:8002", 42);
    let b = json_of(&body);
    assert_eq!(unb64(&b["compare"][0]["key"]), "/l/keys/a/00000000000000ff");
    assert_eq!(b["compare"][0]["target"], "CREATE");
    let marker = &b["compare"][1];
    assert_eq!(unb64(&marker["key"]), "/l/placed/a");
    assert!(marker.get("range_end").is_none(), "one key compared, not the range");
    assert_eq!(marker["target"], "MOD");
    assert_eq!(marker["result"], "LESS");
    assert_eq!(
        marker["mod_revision"], "42",
        "no placement since the view: the marker modified before view + 1"
    );
    assert_eq!(unb64(&b["success"][0]["request_put"]["value"]), "127.0.0.1:8002");
    assert_eq!(b["success"][0]["request_put"]["lease"], "42");
    let put_marker = &b["success"][1]["request_put"];
    assert_eq!(unb64(&put_marker["key"]), "/l/placed/a");
    assert_eq!(put_marker["lease"], "0", "the marker outlives every lease");
    // Every placement write puts the marker: a plain create and a move too; a lease's refresh does not.
    for other in [
        store::create_request("/l", "a", 255, "127.0.0.1:8002", 42),
        store::move_request("/l", "a", 255, "127.0.0.1:8001", "127.0.0.1:8002", 42),
    ] {
        assert_eq!(
            unb64(&json_of(&other)["success"][1]["request_put"]["key"]),
            "/l/placed/a"
        );
    }
    assert_eq!(
        unb64(&b["failure"][0]["request_range"]["key"]),
        "/l/keys/a/00000000000000ff"
    );
    let read = &b["failure"][1]["request_range"];
    assert_eq!(unb64(&read["key"]), "/l/keys/a/");
    assert_eq!(unb64(&read["range_end"]), "/l/keys/a0");
    assert_eq!(read["min_mod_revision"], "42");
    assert_eq!(read["limit"], "64");
    // A replica that never read the range compares against revision 1: only a backend never written passes.
    let never = json_of(&store::ask_request(&Ask::Create.in_view(0, 8), "/l", "a", 1, "x:1", 0));
    assert_eq!(never["compare"][1]["mod_revision"], "1");
    // Moves are not affected by a view.
    let mv = Ask::Move { from: "x:1".into() };
    assert_eq!(mv.clone().in_view(5, 8), mv);
}

#[test]
fn each_answer_to_a_create_in_view_decides_what_the_replica_does() {
    let ok = |body: &'static str| Reply::Answer {
        status: 200,
        body: body.as_bytes(),
    };
    assert_eq!(
        store::create_in_view_outcome(ok(CREATED)),
        InView::Settled {
            outcome: Outcome::Won,
            revision: 2
        },
        "created: the view holding this key is complete up to its revision"
    );
    assert_eq!(
        store::create_in_view_outcome(ok(IN_VIEW_EXISTS)),
        InView::Settled {
            outcome: Outcome::Adopted {
                host: host_id("127.0.0.1:8001")
            },
            revision: 0
        }
    );
    let InView::Stale(stale) = store::create_in_view_outcome(ok(STALE)) else {
        panic!("a stale view")
    };
    assert_eq!(stale.revision, 9);
    assert!(stale.more);
    assert_eq!(stale.kvs.len(), 1);
    assert_eq!(stale.kvs[0].key, b"/l/keys/a/0000000000000001");
    assert_eq!(stale.kvs[0].value, b"127.0.0.1:8002");
    assert_eq!(stale.kvs[0].mod_revision, 8);
    // Failures read as a create-if-absent's do.
    for (reply, want) in [
        (Reply::NoAnswer, Fallback::Timeout),
        (Reply::NotSent, Fallback::NotSent),
        (Reply::Answer { status: 504, body: b"" }, Fallback::Timeout),
        (ok(LEASE_GONE), Fallback::Error),
        (ok("not json"), Fallback::Error),
        // A failed transaction without the range read is not something this body gets back.
        (ok(RANGE_EMPTY_TXN), Fallback::Error),
    ] {
        assert_eq!(
            store::create_in_view_outcome(reply),
            InView::Settled {
                outcome: Outcome::Fallback(want),
                revision: 0
            },
            "{reply:?}"
        );
    }
    let in_view = Ask::CreateInView { view: 1, limit: 8 };
    assert_eq!(store::ask_outcome(&in_view, ok(CREATED)), Some(Outcome::Won));

    // After a stale view: retry in the answer's view, until the retries are spent or the answer was cut.
    let answer = |more| RangeAnswer {
        kvs: vec![],
        revision: 9,
        more,
    };
    assert_eq!(
        store::after_stale(&answer(false), 0, 64),
        Ask::CreateInView { view: 9, limit: 64 }
    );
    assert_eq!(
        store::after_stale(&answer(false), store::MAX_STALE_RETRIES - 1, 64),
        Ask::CreateInView { view: 9, limit: 64 }
    );
    assert_eq!(
        store::after_stale(&answer(false), store::MAX_STALE_RETRIES, 64),
        Ask::Create
    );
    assert_eq!(store::after_stale(&answer(true), 0, 64), Ask::Create);
}

#[test]
fn keys_live_under_the_backend_prefix_as_sixteen_hex_digits() {
    assert_eq!(
        store::key_path("/llmroute", "llama-a", 255),
        "/llmroute/keys/llama-a/00000000000000ff"
    );
    let prefix = store::backend_prefix("/llmroute", "llama-a");
    assert_eq!(
        store::key_of(&prefix, b"/llmroute/keys/llama-a/00000000000000ff"),
        Some(255)
    );
    assert_eq!(store::key_of(&prefix, b"/llmroute/keys/llama-b/00000000000000ff"), None);
    assert_eq!(store::key_of(&prefix, b"/llmroute/keys/llama-a/ff"), None);
    assert_eq!(store::key_of(&prefix, b"/llmroute/keys/llama-a/zzzzzzzzzzzzzzzz"), None);
    let body = json_of(&store::create_request("/llmroute", "llama-a", 255, "127.0.0.1:8001", 0));
    assert_eq!(
        unb64(&body["compare"][0]["key"]),
        "/llmroute/keys/llama-a/00000000000000ff"
    );
}

#[test]
fn only_keys_the_local_table_lacks_or_has_not_shared_go_to_the_store() {
    let h = hosts(3);
    let b = bounds();
    let mut t = KeyTable::default();
    assert!(store::needs_store(&t, 1, 1000, &b));
    let proposed = store::proposal(&t, &h, 1, 1000, &b).unwrap();
    assert!(t.is_empty(), "a proposal leaves the table alone");
    // Placed locally (a first sighting, or over the budget): held, but not shared, so still for the store.
    choose(&mut t, &h, 1, 1000, &b).unwrap();
    assert_eq!(t.get(1).unwrap().host, h[proposed].id());
    assert!(!t.get(1).unwrap().shared);
    assert!(store::needs_store(&t, 1, 2000, &b));
    // Settled by the store: shared, and known.
    choose_stored(&mut t, &h, 1, Some(h[proposed].id()), 2000, &b).unwrap();
    assert!(t.get(1).unwrap().shared);
    assert!(!store::needs_store(&t, 1, 2000, &b));
    assert!(
        store::needs_store(&t, 1, 2000 + TTL, &b),
        "an idled-out key is new again"
    );
}

#[test]
fn a_stored_host_wins_over_the_bounds_and_over_a_local_first_placement() {
    let h = hosts(3);
    let b = bounds();
    let mut t = KeyTable::default();
    let local = store::proposal(&t, &h, 7, 0, &b).unwrap();
    let other = (local + 1) % 3;
    let c = choose_stored(&mut t, &h, 7, Some(h[other].id()), 0, &b).unwrap();
    assert_eq!(
        (c.host, c.reason, c.table_changed),
        (other, PlacementReason::Placed, true)
    );
    assert!(!t.get(7).unwrap().established, "a new key enters on probation");
    assert!(t.get(7).unwrap().shared);
    // The same answer again: pinned where it is.
    let c = choose_stored(&mut t, &h, 7, Some(h[other].id()), 10, &b).unwrap();
    assert_eq!((c.host, c.reason), (other, PlacementReason::Pinned));
    // A key placed locally on its first sighting, which another replica stored elsewhere: it follows the store,
    // once, established and shared.
    let mut t = KeyTable::default();
    choose(&mut t, &h, 7, 0, &b).unwrap();
    let c = choose_stored(&mut t, &h, 7, Some(h[other].id()), 10, &b).unwrap();
    assert_eq!(
        (c.host, c.reason, c.table_changed),
        (other, PlacementReason::Placed, true)
    );
    let e = t.get(7).unwrap();
    assert_eq!((e.host, e.established, e.shared), (h[other].id(), true, true));
    let c = choose(&mut t, &h, 7, 20, &b).unwrap();
    assert_eq!((c.host, c.reason), (other, PlacementReason::Pinned));
    // A stored host that is down (or unknown here) is not used: the bounds place the key.
    let mut down = h.clone();
    down[other].up = false;
    let mut t = KeyTable::default();
    let c = choose_stored(&mut t, &down, 7, Some(h[other].id()), 0, &b).unwrap();
    assert_ne!(c.host, other);
    let c = choose_stored(&mut KeyTable::default(), &h, 7, Some(12345), 0, &b).unwrap();
    assert_eq!(c.host, local);
}

fn kv(prefix: &str, key: u64, host: &str) -> Kv {
    Kv {
        key: format!("{prefix}{key:016x}").into_bytes(),
        value: host.as_bytes().to_vec(),
        lease: 0,
        mod_revision: 1,
    }
}

#[test]
fn merging_adds_new_keys_moves_disagreeing_ones_and_keeps_local_use_times() {
    let h = hosts(3);
    let prefix = store::backend_prefix("/l", "a");
    let mut t = KeyTable::default();
    t.insert(1, h[0].id(), 500, 4096);
    t.insert(2, h[0].id(), 600, 4096);
    let kvs = vec![
        kv(&prefix, 1, &h[0].address),
        kv(&prefix, 2, &h[2].address),
        kv(&prefix, 3, &h[1].address),
        Kv {
            key: b"/l/keys/b/0000000000000004".to_vec(),
            ..kv(&prefix, 4, &h[1].address)
        },
    ];
    assert!(store::merge(&mut t, &prefix, &kvs, 9000, 4096));
    assert_eq!(t.get(1).unwrap().host, h[0].id());
    assert_eq!(
        t.get(1).unwrap().last_ms,
        500,
        "a key already in place keeps when this replica used it"
    );
    assert_eq!(t.get(2).unwrap().host, h[2].id(), "the stored placement wins");
    assert_eq!(t.get(2).unwrap().last_ms, 600);
    assert_eq!(t.get(3).unwrap().host, h[1].id());
    assert_eq!(t.get(3).unwrap().last_ms, 9000);
    assert!(!t.get(3).unwrap().established);
    assert!(t.get(4).is_none(), "another backend's key is not merged");
    assert!(
        !store::merge(&mut t, &prefix, &kvs, 9500, 4096),
        "merging again changes nothing"
    );
}

#[test]
fn revisions_advance_restart_after_a_replaced_store_and_repeat_a_cut_read() {
    let answer = |revision, more| RangeAnswer {
        kvs: vec![],
        revision,
        more,
    };
    assert_eq!(store::next_revision(0, &answer(10, false)), 10);
    assert_eq!(store::next_revision(10, &answer(12, false)), 12);
    assert_eq!(store::next_revision(10, &answer(12, true)), 10);
    assert_eq!(store::next_revision(10, &answer(3, false)), 0);
    let body = json_of(&store::range_request("/l", "a", 10, 64));
    assert_eq!(body["min_mod_revision"], "11");
    assert_eq!(body["limit"], "64");
    assert!(json_of(&store::range_request("/l", "a", 0, 64))
        .get("min_mod_revision")
        .is_none());
    assert!(store::range_answer(Reply::NoAnswer).is_err());
    assert!(store::range_answer(Reply::Answer {
        status: 500,
        body: b"{}"
    })
    .is_err());
    assert_eq!(
        store::range_answer(Reply::Answer {
            status: 200,
            body: RANGE_FILTERED.as_bytes()
        })
        .unwrap()
        .revision,
        7
    );
}

#[test]
fn leases_roll_over_each_epoch_and_outlive_the_idle_ttl() {
    assert_eq!(store::epoch_ms(300_000), 75_000);
    assert_eq!(store::epoch_ms(2000), 1000);
    assert_eq!(store::lease_ttl_s(300_000), 375);
    assert_eq!(store::lease_ttl_s(1500), 3);
    let l = Lease {
        id: 77,
        granted_ms: 1_000_000,
    };
    assert_eq!(Lease::decode(&l.encode()), l);
    assert_eq!(Lease::decode(b"short"), Lease::default());
    assert!(Lease::default().due(5, TTL));
    assert!(!l.due(1_000_000 + 74_999, TTL));
    assert!(l.due(1_000_000 + 75_000, TTL));
}

#[test]
fn refreshes_re_attach_only_keys_this_replica_used_in_batches_etcd_accepts() {
    let h = hosts(2);
    let mut t = KeyTable::default();
    for k in 0..300u64 {
        t.insert(k, h[(k % 2) as usize].id(), 1000, 4096);
        t.promote(k, 5000 + k, 4096);
        t.mark_shared(k);
    }
    t.insert(1000, h[0].id(), 9000, 4096); // seen once: not refreshed
    t.mark_shared(1000);
    t.insert(1001, 42, 9000, 4096);
    t.promote(1001, 9000, 4096); // on a host not in the list: skipped
    t.mark_shared(1001);
    t.insert(1002, h[0].id(), 9000, 4096);
    t.promote(1002, 9000, 4096); // never shared (placed locally): a refresh must not create it
    let bodies = store::refresh_batches(&t, &h, 5100, "/l", "a", 99);
    let ops: Vec<Value> = bodies
        .iter()
        .flat_map(|b| json_of(b)["success"].as_array().unwrap().clone())
        .collect();
    assert_eq!(bodies.len(), 2);
    assert_eq!(ops.len(), 200, "keys 100..300 were used since 5100");
    assert!(
        ops.iter()
            .all(|op| unb64(&op["request_put"]["key"]).starts_with("/l/keys/a/")),
        "a refresh writes no placement: the marker is left alone"
    );
    assert!(bodies
        .iter()
        .all(|b| json_of(b)["success"].as_array().unwrap().len() <= etcd_json::MAX_TXN_OPS));
    let put = &ops[0]["request_put"];
    assert_eq!(put["lease"], "99");
    assert!(unb64(&put["key"]).starts_with("/l/keys/a/"));
    assert!(unb64(&put["value"]).starts_with("127.0.0.1:800"));
}

/// etcd in memory, as far as the store's transactions go: each key's host and the revision it was last modified
/// at, the store's revision, and the keys in the order they were created.
#[derive(Default)]
struct MemEtcd {
    revision: i64,
    keys: BTreeMap<u64, (u32, i64)>,
    created: Vec<u64>,
    /// The revision of the last placement write: the backend's marker key (`store::marker_path`).
    marker: i64,
}

/// The backend prefix the model's keys live under.
const MODEL_PREFIX: &str = "/l/keys/a/";

impl MemEtcd {
    /// A placement write (a create or a move): the key and the marker, at one revision.
    fn put(&mut self, key: u64, host: u32) -> i64 {
        self.revision += 1;
        self.marker = self.revision;
        if self.keys.insert(key, (host, self.revision)).is_none() {
            self.created.push(key);
        }
        self.revision
    }

    /// What etcd does with [`etcd_json::create_if_absent_body`].
    fn create(&mut self, key: u64, proposed: u32) -> Outcome {
        match self.keys.get(&key) {
            Some(&(host, _)) => Outcome::Adopted { host },
            None => {
                self.put(key, proposed);
                Outcome::Won
            }
        }
    }

    /// What etcd does with [`etcd_json::create_in_view_body`]: the key is created only if it is absent and no
    /// placement was written after `view` (the marker); else the key, or the changed keys (at most `limit`, in
    /// key order as etcd returns them), are read back.
    fn create_in_view(&mut self, key: u64, proposed: u32, view: i64, limit: usize, h: &[HostView]) -> InView {
        if let Some(&(host, _)) = self.keys.get(&key) {
            return InView::Settled {
                outcome: Outcome::Adopted { host },
                revision: 0,
            };
        }
        let changed: Vec<Kv> = self
            .keys
            .iter()
            .filter(|(_, (_, m))| *m > view)
            .map(|(k, (host, m))| Kv {
                mod_revision: *m,
                ..kv(MODEL_PREFIX, *k, &h.iter().find(|v| v.id() == *host).unwrap().address)
            })
            .collect();
        if self.marker <= view {
            let revision = self.put(key, proposed);
            return InView::Settled {
                outcome: Outcome::Won,
                revision,
            };
        }
        InView::Stale(RangeAnswer {
            more: changed.len() > limit,
            kvs: changed.into_iter().take(limit).collect(),
            revision: self.revision,
        })
    }

    /// What etcd does with [`etcd_json::swap_body`]. `None` when the key is absent.
    fn swap(&mut self, key: u64, from: u32, proposed: u32) -> Option<Outcome> {
        match self.keys.get(&key).copied() {
            Some((host, _)) if host == from => {
                self.put(key, proposed);
                Some(Outcome::Moved)
            }
            Some((host, _)) => Some(Outcome::MoveAdopted { host }),
            None => None,
        }
    }

    /// Keys per host, in the order of `h`.
    fn per_host(&self, h: &[HostView]) -> Vec<usize> {
        h.iter()
            .map(|v| self.keys.values().filter(|(host, _)| *host == v.id()).count())
            .collect()
    }
}

/// The most changed keys a stale view reads back, in the model.
const MODEL_LIMIT: usize = 4096;

/// One replica of the model: its local table and the revision that table is known complete up to.
#[derive(Clone, Default)]
struct Replica {
    table: KeyTable,
    view: i64,
}

impl Replica {
    /// What the filter does with a stale view's answer ([`InView::Stale`]): merge, and take the answer's view
    /// when it was not cut.
    fn merge_stale(&mut self, stale: &RangeAnswer, now: u64, b: &Bounds) {
        store::merge(&mut self.table, MODEL_PREFIX, &stale.kvs, now, b.max_keys);
        if !stale.more {
            self.view = self.view.max(stale.revision);
        }
    }
}

/// Replicas fed requests for `keys` in the order `picks` (replica, key): the host each request went to.
fn run(replicas: usize, picks: &[(usize, u64)], shared: bool) -> Vec<(u64, usize)> {
    run_down(replicas, picks, shared, usize::MAX).0
}

/// [`run`], with host 0 down from request `down_at` on; also returns how many swaps moved a key.
fn run_down(replicas: usize, picks: &[(usize, u64)], shared: bool, down_at: usize) -> (Vec<(u64, usize)>, usize) {
    let r = run_in(replicas, picks, shared.then_some(ShareKeys::All), down_at);
    (r.placed, r.moved)
}

/// What [`run_in`] saw.
struct Run {
    /// Each request's key and the host it went to.
    placed: Vec<(u64, usize)>,
    /// Per request: placed locally without asking the store (a first sighting).
    kept: Vec<bool>,
    /// Swaps that moved a key.
    moved: usize,
    etcd: MemEtcd,
}

/// [`run_down`], with a store that shares keys as `share` says (`None`: no store), returning what it saw.
fn run_in(replicas: usize, picks: &[(usize, u64)], share: Option<ShareKeys>, down_at: usize) -> Run {
    let mut h = hosts(3);
    let b = bounds();
    let mut fleet = vec![Replica::default(); replicas];
    let mut etcd = MemEtcd::default();
    let mut out = Vec::new();
    let mut kept = Vec::new();
    let mut moved = 0;
    for (i, &(r, key)) in picks.iter().enumerate() {
        h[0].up = i < down_at;
        let now = i as u64 * 10;
        let rep = &mut fleet[r % replicas];
        let decision = share.map_or(Decision::Table, |s| store::decide(&rep.table, &h, key, now, &b, s));
        kept.push(matches!(decision, Decision::Keep(_)));
        let mut ask = match decision {
            Decision::Send(a) => Some(a.in_view(rep.view, MODEL_LIMIT)),
            Decision::Keep(_) | Decision::Table => None,
        };
        let mut stored = None;
        let (mut sends, mut stale_retries, mut won_at) = (0, 0, 0);
        while let Some(a) = ask.take() {
            let proposed = h[store::proposal(&rep.table, &h, key, now, &b).unwrap()].id();
            let answered = match a {
                Ask::Create => Some(etcd.create(key, proposed)),
                Ask::CreateInView { view, limit } => match etcd.create_in_view(key, proposed, view, limit, &h) {
                    InView::Stale(stale) => {
                        rep.merge_stale(&stale, now, &b);
                        ask = Some(store::after_stale(&stale, stale_retries, MODEL_LIMIT));
                        stale_retries += 1;
                        continue;
                    }
                    InView::Settled { outcome, revision } => {
                        won_at = revision;
                        Some(outcome)
                    }
                },
                Ask::Move { from } => etcd.swap(key, host_id(&from), proposed),
            };
            sends += 1;
            match store::next(answered, &h) {
                Next::Send(a) if sends <= store::MAX_FOLLOW_UPS => ask = Some(a),
                Next::Send(_) => stored = answered.and_then(|o| o.stored(proposed)),
                Next::Done(o) => {
                    moved += usize::from(o == Outcome::Moved);
                    stored = o.stored(proposed);
                }
            }
        }
        let c = choose_stored(&mut rep.table, &h, key, stored, now, &b).unwrap();
        if won_at > 0 {
            rep.view = rep.view.max(won_at);
        }
        out.push((key, c.host));
    }
    Run {
        placed: out,
        kept,
        moved,
        etcd,
    }
}

/// One new key's request on its way through the store, in [`burst`].
struct Flight {
    replica: usize,
    key: u64,
    ask: Ask,
    proposed: u32,
    stale_retries: u8,
}

/// Requests for new keys sent to replicas (`picks`: replica, key) with their transactions reaching etcd in any
/// order: each step of `steps` either sends the next pick (its proposal and view taken from its replica at that
/// moment) or delivers the in-flight transaction at that index (modulo how many there are), a stale view being
/// merged and sent again at once. Returns the store, and whether any request spent its stale retries.
fn burst(replicas: usize, picks: &[(usize, u64)], steps: &[(bool, usize)]) -> (MemEtcd, bool) {
    burst_with(replicas, picks, steps, true)
}

/// [`burst`]; with `in_view` false each new key is proposed with a plain create-if-absent, as before the range
/// compare.
fn burst_with(replicas: usize, picks: &[(usize, u64)], steps: &[(bool, usize)], in_view: bool) -> (MemEtcd, bool) {
    let h = hosts(3);
    let b = bounds();
    let mut fleet = vec![Replica::default(); replicas];
    let mut etcd = MemEtcd::default();
    let mut flights: Vec<Flight> = Vec::new();
    let mut exhausted = false;
    let mut next_pick = picks.iter();
    let mut steps = steps.iter().copied();
    loop {
        let (send, i) = steps.next().unwrap_or((false, 0));
        if send || flights.is_empty() {
            let Some(&(r, key)) = next_pick.next() else {
                if flights.is_empty() {
                    break;
                }
                continue;
            };
            let rep = &fleet[r % replicas];
            // A key the replica already holds (merged, or settled by an earlier request) is placed locally.
            if let Some(ask) = store::ask(&rep.table, &h, key, 0, &b) {
                flights.push(Flight {
                    replica: r % replicas,
                    key,
                    ask: match in_view {
                        true => ask.in_view(rep.view, MODEL_LIMIT),
                        false => ask,
                    },
                    proposed: h[store::proposal(&rep.table, &h, key, 0, &b).unwrap()].id(),
                    stale_retries: 0,
                });
            }
            continue;
        }
        let mut f = flights.remove(i % flights.len());
        let rep = &mut fleet[f.replica];
        let (outcome, won_at) = match f.ask {
            Ask::Create => (etcd.create(f.key, f.proposed), 0),
            Ask::CreateInView { view, limit } => match etcd.create_in_view(f.key, f.proposed, view, limit, &h) {
                InView::Stale(stale) => {
                    rep.merge_stale(&stale, 0, &b);
                    f.ask = store::after_stale(&stale, f.stale_retries, MODEL_LIMIT);
                    exhausted |= f.ask == Ask::Create;
                    f.stale_retries += 1;
                    f.proposed = h[store::proposal(&rep.table, &h, f.key, 0, &b).unwrap()].id();
                    flights.push(f);
                    continue;
                }
                InView::Settled { outcome, revision } => (outcome, revision),
            },
            Ask::Move { .. } => unreachable!("every host stays up"),
        };
        choose_stored(&mut rep.table, &h, f.key, outcome.stored(f.proposed), 0, &b).unwrap();
        if won_at > 0 {
            rep.view = rep.view.max(won_at);
        }
    }
    (etcd, exhausted)
}

#[test]
fn six_new_keys_at_once_on_three_replicas_are_spread_two_per_host() {
    // Two new keys per replica, all six proposed before any reaches etcd (each replica's view empty), delivered
    // in the order sent.
    let picks: Vec<(usize, u64)> = (1..=6).map(|k| ((k % 3) as usize, k)).collect();
    let all_sent_first = vec![(true, 0); 6];
    let (etcd, exhausted) = burst(3, &picks, &all_sent_first);
    assert!(!exhausted);
    assert_eq!(etcd.per_host(&hosts(3)), vec![2, 2, 2]);
    assert_eq!(etcd.per_host(&hosts(3)), one_table(&etcd.created));
    // Before the view condition each replica placed its keys by its own empty view: the bound one table keeps is
    // broken for some set of six keys (found among the first few; the test names it).
    let broken = (0..20u64).find_map(|base| {
        let picks: Vec<(usize, u64)> = (1..=6).map(|k| ((k % 3) as usize, base * 6 + k)).collect();
        let (plain, _) = burst_with(3, &picks, &all_sent_first, false);
        let counts = plain.per_host(&hosts(3));
        (counts.iter().any(|&c| c > 2)).then_some((base, counts))
    });
    assert!(
        broken.is_some(),
        "plain create-if-absent was expected to break the bound"
    );
    let (base, _) = broken.unwrap();
    let picks: Vec<(usize, u64)> = (1..=6).map(|k| ((k % 3) as usize, base * 6 + k)).collect();
    let (etcd, _) = burst(3, &picks, &all_sent_first);
    assert_eq!(etcd.per_host(&hosts(3)), vec![2, 2, 2], "the same keys, in view");
}

/// Keys per host when one table places `keys` in this order.
fn one_table(keys: &[u64]) -> Vec<usize> {
    let h = hosts(3);
    let mut t = KeyTable::default();
    let mut counts = vec![0; h.len()];
    for &key in keys {
        counts[choose(&mut t, &h, key, 0, &bounds()).unwrap().host] += 1;
    }
    counts
}

fn disagreements(placed: &[(u64, usize)]) -> usize {
    let mut first: HashMap<u64, usize> = HashMap::new();
    placed
        .iter()
        .filter(|(k, host)| *first.entry(*k).or_insert(*host) != *host)
        .count()
}

#[test]
fn without_the_store_replicas_disagree_on_a_fixed_workload() {
    // Twelve tenants, three replicas, each request to a pseudo-random replica: the local tables diverge.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let picks: Vec<(usize, u64)> = (0..240).map(|_| ((next() % 3) as usize, next() % 12 + 1)).collect();
    let alone = disagreements(&run(3, &picks, false));
    let shared = disagreements(&run(3, &picks, true));
    assert!(alone > 0, "this workload should make lone replicas disagree");
    assert_eq!(shared, 0);
}

proptest! {
    #[test]
    fn replicas_sharing_a_store_place_every_key_alike(
        picks in proptest::collection::vec((0usize..3, 1u64..13), 1..200),
    ) {
        prop_assert_eq!(disagreements(&run(3, &picks, true)), 0);
    }

    #[test]
    fn with_share_keys_returning_keys_seen_once_per_replica_never_reach_etcd(
        picks in proptest::collection::vec((0usize..3, 1u64..1000), 1..120),
    ) {
        // Each (replica, key) once: every request is a first sighting on its replica.
        let mut seen = BTreeSet::new();
        let once: Vec<(usize, u64)> = picks.into_iter().filter(|p| seen.insert(*p)).collect();
        let r = run_in(3, &once, Some(ShareKeys::Returning), usize::MAX);
        prop_assert!(r.etcd.created.is_empty());
        prop_assert!(r.kept.iter().all(|k| *k));
    }

    #[test]
    fn with_share_keys_returning_replicas_agree_on_every_key_once_it_is_shared(
        picks in proptest::collection::vec((0usize..3, 1u64..13), 1..200),
    ) {
        let r = run_in(3, &picks, Some(ShareKeys::Returning), usize::MAX);
        // Every request that was not a first sighting on its replica went where etcd holds the key.
        for ((key, host), kept) in r.placed.iter().zip(&r.kept) {
            if !kept {
                let (stored, _) = r.etcd.keys[key];
                prop_assert_eq!(hosts(3)[*host].id(), stored, "key {}", key);
            }
        }
        // A key is created once it came back to some replica, and only then.
        let mut counts: BTreeMap<(usize, u64), usize> = BTreeMap::new();
        for p in &picks {
            *counts.entry((p.0 % 3, p.1)).or_default() += 1;
        }
        let returned: BTreeSet<u64> = counts.iter().filter(|(_, n)| **n > 1).map(|((_, k), _)| *k).collect();
        let created: BTreeSet<u64> = r.etcd.created.iter().copied().collect();
        prop_assert_eq!(created, returned);
    }

    #[test]
    fn new_keys_in_any_interleaving_are_placed_as_one_table_places_them_in_commit_order(
        picks in proptest::collection::vec((0usize..3, 1u64..8), 1..40),
        steps in proptest::collection::vec((any::<bool>(), 0usize..64), 0..120),
    ) {
        let (etcd, exhausted) = burst(3, &picks, &steps);
        // Each stale retry follows another key's creation, and there are at most 7 keys.
        prop_assert!(!exhausted);
        let keys: BTreeSet<u64> = picks.iter().map(|(_, k)| *k).collect();
        prop_assert_eq!(etcd.created.len(), keys.len());
        prop_assert_eq!(etcd.per_host(&hosts(3)), one_table(&etcd.created));
    }

    #[test]
    fn a_key_whose_host_goes_down_moves_once_for_every_replica(
        picks in proptest::collection::vec((0usize..3, 1u64..13), 2..200),
        at in 0.0f64..1.0,
    ) {
        let down_at = ((picks.len() as f64) * at) as usize;
        let (placed, moved) = run_down(3, &picks, true, down_at);
        let after = &placed[down_at..];
        prop_assert_eq!(disagreements(after), 0, "after the host went down: {:?}", after);
        prop_assert!(after.iter().all(|(_, host)| *host != 0));
        // Each key that lived on host 0 moved through the store exactly once, whichever replica saw it first.
        let on_down: std::collections::BTreeSet<u64> =
            placed[..down_at].iter().filter(|(_, h)| *h == 0).map(|(k, _)| *k).collect();
        let seen_after: std::collections::BTreeSet<u64> = after.iter().map(|(k, _)| *k).collect();
        prop_assert_eq!(moved, on_down.intersection(&seen_after).count());
    }
}

#[test]
fn swap_bodies_compare_the_value_and_read_back_on_failure() {
    let b = json_of(&store::move_request(
        "/l",
        "a",
        255,
        "127.0.0.1:8001",
        "127.0.0.1:8002",
        42,
    ));
    assert_eq!(unb64(&b["compare"][0]["key"]), "/l/keys/a/00000000000000ff");
    assert_eq!(b["compare"][0]["target"], "VALUE");
    assert_eq!(b["compare"][0]["result"], "EQUAL");
    assert_eq!(unb64(&b["compare"][0]["value"]), "127.0.0.1:8001");
    let put = &b["success"][0]["request_put"];
    assert_eq!(unb64(&put["value"]), "127.0.0.1:8002");
    assert_eq!(put["lease"], "42");
    assert_eq!(
        unb64(&b["failure"][0]["request_range"]["key"]),
        "/l/keys/a/00000000000000ff"
    );
    let create = store::ask_request(&Ask::Create, "/l", "a", 255, "127.0.0.1:8002", 42);
    assert_eq!(create, store::create_request("/l", "a", 255, "127.0.0.1:8002", 42));
}

#[test]
fn a_known_key_asks_the_store_only_when_its_listed_host_is_down() {
    let mut h = hosts(3);
    let b = bounds();
    let mut t = KeyTable::default();
    assert_eq!(store::ask(&t, &h, 1, 1000, &b), Some(Ask::Create));
    let stored = h[store::proposal(&t, &h, 1, 1000, &b).unwrap()].id();
    let c = choose_stored(&mut t, &h, 1, Some(stored), 1000, &b).unwrap();
    assert_eq!(store::ask(&t, &h, 1, 2000, &b), None, "a known key on an up host");
    h[c.host].up = false;
    assert_eq!(
        store::ask(&t, &h, 1, 2000, &b),
        Some(Ask::Move {
            from: h[c.host].address.clone()
        })
    );
    let listed: Vec<_> = h.iter().filter(|x| x.id() != h[c.host].id()).cloned().collect();
    assert_eq!(
        store::ask(&t, &listed, 1, 2000, &b),
        None,
        "a host no longer listed has no address to swap"
    );
    assert_eq!(
        store::ask(&t, &h, 1, 1000 + TTL, &b),
        Some(Ask::Create),
        "an idled-out key is new again"
    );
    let none_up: Vec<_> = h
        .iter()
        .cloned()
        .map(|mut x| {
            x.up = false;
            x
        })
        .collect();
    assert_eq!(store::ask(&t, &none_up, 1, 2000, &b), None, "Envoy's ring decides");
}

#[test]
fn with_share_keys_returning_a_first_sighting_stays_local_and_a_key_that_comes_back_is_created() {
    let mut h = hosts(3);
    let b = bounds();
    let returning = ShareKeys::Returning;
    let mut t = KeyTable::default();
    assert_eq!(
        store::decide(&t, &h, 1, 1000, &b, returning),
        Decision::Keep(KeptLocal::FirstSighting)
    );
    assert_eq!(
        store::decide(&t, &h, 1, 1000, &b, ShareKeys::All),
        Decision::Send(Ask::Create),
        "share_keys: all creates every new key"
    );
    // The first sighting is placed as without a store, and remembered unshared.
    let first = choose(&mut t, &h, 1, 1000, &b).unwrap().host;
    assert!(!t.get(1).unwrap().shared);
    // It comes back within its idle TTL: created, whatever its host's state.
    assert_eq!(
        store::decide(&t, &h, 1, 2000, &b, returning),
        Decision::Send(Ask::Create)
    );
    h[first].up = false;
    assert_eq!(
        store::decide(&t, &h, 1, 2000, &b, returning),
        Decision::Send(Ask::Create)
    );
    h[first].up = true;
    // Back only after its idle TTL: a first sighting again.
    assert_eq!(
        store::decide(&t, &h, 1, 1000 + TTL, &b, returning),
        Decision::Keep(KeptLocal::FirstSighting)
    );
    // Once shared: the table places it, and a down host moves it through the store, under either setting.
    let stored = h[store::proposal(&t, &h, 1, 2000, &b).unwrap()].id();
    choose_stored(&mut t, &h, 1, Some(stored), 2000, &b).unwrap();
    for share in [ShareKeys::Returning, ShareKeys::All] {
        assert_eq!(store::decide(&t, &h, 1, 3000, &b, share), Decision::Table);
    }
    let at = h.iter().position(|x| x.id() == stored).unwrap();
    h[at].up = false;
    assert_eq!(
        store::decide(&t, &h, 1, 3000, &b, returning),
        Decision::Send(Ask::Move {
            from: h[at].address.clone()
        })
    );
    // A key another replica shared, read by the refresh: known, no transaction.
    let mut t = KeyTable::default();
    store::merge(&mut t, MODEL_PREFIX, &[kv(MODEL_PREFIX, 9, &h[0].address)], 1000, 64);
    assert_eq!(store::decide(&t, &hosts(3), 9, 1500, &b, returning), Decision::Table);
}

#[test]
fn the_proposal_counts_only_shared_keys_so_every_replica_proposes_alike() {
    let h = hosts(3);
    let b = bounds();
    // Two replicas hold the same shared keys; one of them also placed many one-off keys alone.
    let mut quiet = KeyTable::default();
    for k in 100..104u64 {
        quiet.insert(k, h[(k % 3) as usize].id(), 0, 4096);
        quiet.mark_shared(k);
    }
    let mut flooded = quiet.clone();
    for k in 1000..1060u64 {
        choose(&mut flooded, &h, k, 0, &b).unwrap();
    }
    for key in 1..40u64 {
        assert_eq!(
            store::proposal(&quiet, &h, key, 0, &b),
            store::proposal(&flooded, &h, key, 0, &b),
            "key {key}"
        );
    }
}

#[test]
fn the_create_budget_spends_up_to_its_max_each_second_and_moves_spend_none() {
    let mut budget = CreateBudget::default();
    assert!((0..3).all(|_| budget.take(5_000, 3)));
    assert!(!budget.take(5_999, 3), "the fourth create of second 5");
    assert!(budget.take(6_000, 3), "a new second");
    assert_eq!(budget, CreateBudget { second: 6, used: 1 });
    assert_eq!(CreateBudget::decode(&budget.encode()), budget);
    assert_eq!(CreateBudget::decode(b"odd"), CreateBudget::default());

    let create = Decision::Send(Ask::Create.in_view(4, 64));
    assert_eq!(create.clone().within_budget(|| true), create);
    assert_eq!(create.within_budget(|| false), Decision::Keep(KeptLocal::OverBudget));
    assert_eq!(
        Decision::Send(Ask::Create).within_budget(|| false),
        Decision::Keep(KeptLocal::OverBudget)
    );
    let spent = std::cell::Cell::new(0);
    let take = || {
        spent.set(spent.get() + 1);
        false
    };
    let moving = Decision::Send(Ask::Move { from: "x:1".into() });
    assert_eq!(moving.clone().within_budget(take), moving);
    for d in [Decision::Table, Decision::Keep(KeptLocal::FirstSighting)] {
        assert_eq!(d.clone().within_budget(take), d);
    }
    assert_eq!(spent.get(), 0, "only a create spends the budget");
    assert_eq!(KeptLocal::OverBudget.as_str(), "over_budget");
    assert_eq!(KeptLocal::FirstSighting.as_str(), "first_sighting");
}

#[test]
fn each_answer_to_a_swap_decides_what_the_replica_does() {
    let ok = |body: &'static str| Reply::Answer {
        status: 200,
        body: body.as_bytes(),
    };
    assert_eq!(store::move_outcome(ok(CREATED)), Some(Outcome::Moved));
    assert_eq!(
        store::move_outcome(ok(EXISTS)),
        Some(Outcome::MoveAdopted {
            host: host_id("127.0.0.1:8001")
        })
    );
    assert_eq!(
        store::move_outcome(ok(RANGE_EMPTY_TXN)),
        None,
        "gone from etcd: create it"
    );
    assert_eq!(
        store::move_outcome(Reply::NoAnswer),
        Some(Outcome::Fallback(Fallback::Timeout))
    );
    assert_eq!(
        store::move_outcome(Reply::NotSent),
        Some(Outcome::Fallback(Fallback::NotSent))
    );
    assert_eq!(
        store::move_outcome(Reply::Answer {
            status: 404,
            body: LEASE_GONE.as_bytes()
        }),
        Some(Outcome::Fallback(Fallback::Error))
    );
    assert_eq!(store::move_outcome(ok("[]")), Some(Outcome::Fallback(Fallback::Error)));
    let ask = Ask::Move { from: "x".into() };
    assert_eq!(store::ask_outcome(&ask, ok(CREATED)), Some(Outcome::Moved));
    assert_eq!(store::ask_outcome(&Ask::Create, ok(CREATED)), Some(Outcome::Won));
}

#[test]
fn a_gone_key_is_created_and_a_stored_host_that_is_down_is_swapped() {
    let mut h = hosts(3);
    let on0 = Outcome::Adopted { host: h[0].id() };
    assert_eq!(store::next(None, &h), Next::Send(Ask::Create));
    assert_eq!(
        store::next(Some(on0), &h),
        Next::Done(on0),
        "an up stored host is adopted"
    );
    assert_eq!(store::next(Some(Outcome::Moved), &h), Next::Done(Outcome::Moved));
    h[0].up = false;
    let swap0 = Next::Send(Ask::Move {
        from: h[0].address.clone(),
    });
    assert_eq!(store::next(Some(on0), &h), swap0);
    assert_eq!(store::next(Some(Outcome::MoveAdopted { host: h[0].id() }), &h), swap0);
    let fallback = Outcome::Fallback(Fallback::Timeout);
    assert_eq!(store::next(Some(fallback), &h), Next::Done(fallback));
    // A stored host not listed here is passed on; the table places the key alone.
    let unknown = Outcome::Adopted { host: 12345 };
    assert_eq!(store::next(Some(unknown), &h), Next::Done(unknown));
}

#[test]
fn a_moved_key_follows_the_stored_host_and_stays_off_the_down_one() {
    let mut h = hosts(3);
    let b = bounds();
    let mut t = KeyTable::default();
    let home = choose(&mut t, &h, 7, 0, &b).unwrap().host;
    h[home].up = false;
    let local = store::proposal(&t, &h, 7, 10, &b).unwrap();
    assert_ne!(local, home);
    let other = (0..3).find(|&i| i != home && i != local).unwrap();
    let c = choose_stored(&mut t, &h, 7, Some(h[other].id()), 10, &b).unwrap();
    assert_eq!(
        (c.host, c.reason),
        (other, PlacementReason::Moved),
        "the stored host wins"
    );
    assert_eq!(t.get(7).unwrap().host, h[other].id());
    // A stored host that is down too is not used: the bounds place it.
    let mut t2 = KeyTable::default();
    h[home].up = true;
    choose(&mut t2, &h, 7, 0, &b).unwrap();
    h[home].up = false;
    let c = choose_stored(&mut t2, &h, 7, Some(h[home].id()), 10, &b).unwrap();
    assert_eq!((c.host, c.reason), (local, PlacementReason::Moved));
}

#[test]
fn a_key_settled_after_an_outage_replaces_a_stored_host_that_is_down() {
    let ok = |body: &'static str| Reply::Answer {
        status: 200,
        body: body.as_bytes(),
    };
    let mut h = hosts(3);
    assert_eq!(
        store::settle_outcome_in(ok(EXISTS), &h),
        Settled::MoveTo(host_id("127.0.0.1:8001")),
        "a stored host that is up is adopted"
    );
    h[0].up = false;
    assert_eq!(
        store::settle_outcome_in(ok(EXISTS), &h),
        Settled::Replace {
            from: "127.0.0.1:8001".into()
        }
    );
    assert_eq!(store::settle_outcome_in(ok(CREATED), &h), Settled::Kept);
    assert_eq!(store::settle_move_outcome(ok(CREATED)), Settled::Kept);
    assert_eq!(
        store::settle_move_outcome(ok(EXISTS)),
        Settled::MoveTo(host_id("127.0.0.1:8001"))
    );
    assert_eq!(store::settle_move_outcome(ok(RANGE_EMPTY_TXN)), Settled::Retry);
    assert_eq!(store::settle_move_outcome(Reply::NoAnswer), Settled::Retry);
}

fn config(store: Value, placement: &str) -> Value {
    json!({
        "version": 1,
        "backends": [{"name": "a", "kind": "llamacpp", "endpoints": ["127.0.0.1:8001", "127.0.0.1:8002"]}],
        "models": [{"name": "m", "routes": [{"backend": "a"}]}],
        "affinity": {"placement": placement, "placement_store": store},
    })
}

fn refused(v: &Value) -> Vec<String> {
    match load_config(&v.to_string()) {
        Ok(_) => panic!("should be refused: {v:#}"),
        Err(ConfigErrors(list)) => list.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn the_store_config_is_normalised_with_defaults() {
    let cfg = load_config(
        &config(
            json!({"etcd": {"endpoints": ["127.0.0.1:2379", "http://10.0.0.2:2379"]}}),
            "bounded_keys",
        )
        .to_string(),
    )
    .unwrap();
    let s = cfg.affinity.placement_store.unwrap();
    assert_eq!(s.prefix, "/llmroute");
    assert_eq!(s.timeout_ms, 50);
    assert_eq!((s.share_keys, s.max_creates_per_s), (ShareKeys::Returning, 20));
    let eps: Vec<String> = s.endpoints.iter().map(|e| e.to_string()).collect();
    assert_eq!(eps, ["127.0.0.1:2379", "10.0.0.2:2379"]);
    let cfg = load_config(
        &config(
            json!({"etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": "/p", "timeout_ms": 200}}),
            "bounded_keys",
        )
        .to_string(),
    )
    .unwrap();
    let s = cfg.affinity.placement_store.unwrap();
    assert_eq!((s.prefix.as_str(), s.timeout_ms), ("/p", 200));
    let cfg = load_config(
        &config(
            json!({"etcd": {"endpoints": ["127.0.0.1:2379"]}, "share_keys": "all", "max_creates_per_s": 10000}),
            "bounded_keys",
        )
        .to_string(),
    )
    .unwrap();
    let s = cfg.affinity.placement_store.unwrap();
    assert_eq!((s.share_keys, s.max_creates_per_s), (ShareKeys::All, 10000));
    assert_eq!(s.tls, None);
    // TLS: `https://` or bare members, the backends' `tls` block.
    let cfg = load_config(
        &config(
            json!({"etcd": {"endpoints": ["https://127.0.0.1:2379", "10.0.0.2:2379"], "tls": {"ca_file": "/ca.pem", "sni": "etcd.internal"}}}),
            "bounded_keys",
        )
        .to_string(),
    )
    .unwrap();
    let s = cfg.affinity.placement_store.unwrap();
    let eps: Vec<String> = s.endpoints.iter().map(|e| e.to_string()).collect();
    assert_eq!(eps, ["127.0.0.1:2379", "10.0.0.2:2379"]);
    let tls = s.tls.unwrap();
    assert_eq!(
        (tls.ca_file.as_str(), tls.sni.as_deref()),
        ("/ca.pem", Some("etcd.internal"))
    );
    assert_eq!(tls.client_cert, None);
    // A client certificate, for an etcd started with `--client-cert-auth`.
    let cfg = load_config(
        &config(
            json!({"etcd": {"endpoints": ["https://127.0.0.1:2379"], "tls": {"ca_file": "/ca.pem", "cert_file": "/c.pem", "key_file": "/c.key"}}}),
            "bounded_keys",
        )
        .to_string(),
    )
    .unwrap();
    let client = cfg.affinity.placement_store.unwrap().tls.unwrap().client_cert.unwrap();
    assert_eq!(
        (client.cert_file.as_str(), client.key_file.as_str()),
        ("/c.pem", "/c.key")
    );
    assert!(load_config(&config(Value::Null, "bounded_keys").to_string())
        .unwrap()
        .affinity
        .placement_store
        .is_none());
}

#[test]
fn bad_store_configs_name_the_field_the_value_and_the_fix() {
    let cases = [
        (
            json!({"etcd": {"endpoints": ["127.0.0.1:2379"]}}),
            "hash",
            "affinity.placement_store",
        ),
        (
            json!({"etcd": {"endpoints": []}}),
            "bounded_keys",
            "affinity.placement_store.etcd.endpoints",
        ),
        (
            json!({"etcd": {"endpoints": ["https://127.0.0.1:2379"]}}),
            "bounded_keys",
            "affinity.placement_store.etcd.endpoints[0] = https://127.0.0.1:2379: https:// needs the CA that signed etcd's certificate: add `tls: { ca_file: ... }`",
        ),
        (
            json!({"etcd": {"endpoints": ["http://127.0.0.1:2379"], "tls": {"ca_file": "/ca.pem"}}}),
            "bounded_keys",
            "with `tls` every member is reached over TLS; write https://HOST:PORT",
        ),
        (
            json!({"etcd": {"endpoints": ["https://127.0.0.1:2379"], "tls": {"ca_file": ""}}}),
            "bounded_keys",
            "affinity.placement_store.etcd.tls.ca_file",
        ),
        (
            json!({"etcd": {"endpoints": ["https://127.0.0.1:2379"], "tls": {"ca_file": "/ca.pem", "sni": "bad name"}}}),
            "bounded_keys",
            "affinity.placement_store.etcd.tls.sni",
        ),
        (
            json!({"etcd": {"endpoints": ["https://127.0.0.1:2379"], "tls": {"ca_file": "/ca.pem", "cert_file": "/c.pem"}}}),
            "bounded_keys",
            "affinity.placement_store.etcd.tls.cert_file = /c.pem: a client certificate needs its private key: add `key_file: PATH`",
        ),
        (
            json!({"etcd": {"endpoints": ["127.0.0.1:2379"], "tls": {"ca_file": "/ca.pem", "verify": false}}}),
            "bounded_keys",
            "unknown field `verify`",
        ),
        (
            json!({"etcd": {"endpoints": ["nope"]}}),
            "bounded_keys",
            "affinity.placement_store.etcd.endpoints[0]",
        ),
        (
            json!({"etcd": {"endpoints": ["127.0.0.1:2379"], "prefix": "llmroute/"}}),
            "bounded_keys",
            "affinity.placement_store.etcd.prefix",
        ),
        (
            json!({"etcd": {"endpoints": ["127.0.0.1:2379"], "timeout_ms": 0}}),
            "bounded_keys",
            "affinity.placement_store.etcd.timeout_ms",
        ),
        (
            json!({"etcd": {"endpoints": ["127.0.0.1:2379"], "timeout_ms": 10001}}),
            "bounded_keys",
            "between 1 and 10000",
        ),
        (
            json!({"etcd": {"endpoints": ["127.0.0.1:2379"], "tls": {}}}),
            "bounded_keys",
            "missing field `ca_file`",
        ),
        (json!({"redis": {}}), "bounded_keys", "unknown field `redis`"),
        (
            json!({"etcd": {"endpoints": ["127.0.0.1:2379"]}, "share_keys": "some"}),
            "bounded_keys",
            "affinity.placement_store.share_keys = some: expected one of returning, all",
        ),
        (
            json!({"etcd": {"endpoints": ["127.0.0.1:2379"]}, "max_creates_per_s": 0}),
            "bounded_keys",
            "affinity.placement_store.max_creates_per_s = 0: must be between 1 and 10000",
        ),
        (
            json!({"etcd": {"endpoints": ["127.0.0.1:2379"]}, "max_creates_per_s": 10001}),
            "bounded_keys",
            "affinity.placement_store.max_creates_per_s = 10001",
        ),
    ];
    for (store, placement, want) in cases {
        let errs = refused(&config(store.clone(), placement)).join("\n");
        assert!(errs.contains(want), "{store} with {placement}: {errs}");
    }
}

#[test]
fn keys_placed_during_an_outage_wait_in_a_bounded_list_and_settle_once() {
    let mut p = Pending::default();
    assert!(p.add(1) && p.add(2) && !p.add(1));
    assert_eq!(Pending::decode(&p.encode()), p);
    assert_eq!(Pending::decode(b"ragged"), Pending::default());
    assert!(p.remove(1) && !p.remove(1));
    assert_eq!(p.keys(), [2]);
    for k in 0..(Pending::MAX as u64 + 10) {
        p.add(k + 100);
    }
    assert_eq!(p.keys().len(), Pending::MAX);
    assert_eq!(p.keys()[0], 110, "the oldest are dropped first");

    let ok = |body: &'static str| Reply::Answer {
        status: 200,
        body: body.as_bytes(),
    };
    assert_eq!(store::settle_outcome(ok(CREATED)), Settled::Kept);
    assert_eq!(
        store::settle_outcome(ok(EXISTS)),
        Settled::MoveTo(host_id("127.0.0.1:8001"))
    );
    assert_eq!(store::settle_outcome(Reply::NoAnswer), Settled::Retry);
    assert_eq!(
        store::settle_outcome(Reply::Answer { status: 503, body: b"" }),
        Settled::Retry
    );
}

#[test]
fn only_a_503_is_sent_again_to_another_member() {
    assert!(store::retry_once(Reply::Answer {
        status: 503,
        body: b"no healthy upstream"
    }));
    assert!(!store::retry_once(Reply::Answer {
        status: 200,
        body: CREATED.as_bytes()
    }));
    assert!(!store::retry_once(Reply::Answer {
        status: 404,
        body: LEASE_GONE.as_bytes()
    }));
    assert!(!store::retry_once(Reply::NoAnswer), "a timeout is not doubled");
    assert!(!store::retry_once(Reply::NotSent));
}
