//! The status poll (`status.rs`): one root context per interval claims the lease and calls Envoy's admin API,
//! the answer becomes the shared snapshot and placement's down lists, and a failed or missing answer keeps the
//! last snapshot.

use llmroute_core::envoy_contract::shared;
use llmroute_core::key_placement::table::decode_down_hosts;
use llmroute_core::status::{self, ADMIN_CLUSTER, ADMIN_PATH, POLL_INTERVAL_MS, POLL_TIMEOUT_MS, TICK_MS};
use llmroute_core::{load_config, Config};
use proxy_wasm::types::{BufferType, LogLevel, MapType};

use super::*;
use crate::host::HostStatus;
use crate::status::{latest, Poller};

const MIXED: &[u8] = include_bytes!("../../../testdata/admin/clusters-mixed.json");

/// The fleet of the admin captures in `testdata/admin/`.
const FLEET: &str = include_str!("../../../testdata/admin/llmroute.json");

fn started() -> (Rc<FakeHost>, Rc<Config>, Poller) {
    let fake = FakeHost::new();
    let cfg = Rc::new(load_config(FLEET).unwrap());
    let mut poller = Poller::default();
    poller.start(&fake.envoy(), cfg.clone());
    (fake, cfg, poller)
}

fn answer(fake: &Rc<FakeHost>, status: &str, body: &[u8]) -> usize {
    fake.set_map(MapType::HttpCallResponseHeaders, &[(":status", status)]);
    fake.set_buffer_bytes(BufferType::HttpCallResponseBody, body);
    body.len()
}

#[test]
fn one_root_context_polls_per_interval_and_stores_the_snapshot() {
    let (fake, _, mut poller) = started();
    assert_eq!(fake.tick_ms(), Some(u32::try_from(TICK_MS).unwrap()));
    poller.on_tick(&fake.envoy());
    let calls = fake.callouts();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].cluster, ADMIN_CLUSTER);
    assert!(calls[0]
        .headers
        .contains(&(":path".to_string(), ADMIN_PATH.to_string())));
    // Another worker's root context on the same tick finds the lease taken.
    let mut other = Poller::default();
    other.start(&fake.envoy(), Rc::new(load_config(FLEET).unwrap()));
    other.on_tick(&fake.envoy());
    assert_eq!(fake.callouts().len(), 1);

    assert!(latest(&fake.envoy()).is_none());
    poller.on_response(&fake.envoy(), calls[0].token + 100, answer(&fake, "200", MIXED));
    assert!(latest(&fake.envoy()).is_none(), "an answer to another call is ignored");
    poller.on_response(&fake.envoy(), calls[0].token, answer(&fake, "200", MIXED));
    let fleet = latest(&fake.envoy()).expect("a snapshot");
    assert_eq!(fleet.backends.len(), 2);
    let (_, down) = decode_down_hosts(&fake.shared(&shared::down("llama-a")).unwrap().0).unwrap();
    assert!(
        down.contains(&"127.0.0.1:21084".to_string()),
        "placement sees the down hosts: {down:?}"
    );
    // Not due again until the interval has passed.
    poller.on_tick(&fake.envoy());
    assert_eq!(fake.callouts().len(), 1);
    fake.advance_ms(POLL_INTERVAL_MS + 1);
    poller.on_tick(&fake.envoy());
    assert_eq!(fake.callouts().len(), 2);
}

/// Envoy's answer in the admin's place when nothing listens at the admin cluster's address.
const REFUSED: &[u8] = b"upstream connect error or disconnect/reset before headers. reset reason: remote connection \
failure, transport failure reason: delayed connect error: Connection refused";

/// The one page `root`'s worker answers on `GET path`: its status and body.
fn page(fake: &Rc<FakeHost>, root: &Root, path: &str) -> (u32, serde_json::Value) {
    let before = fake.replies().len();
    let mut x = Exchange::new(fake, root, 9);
    x.request_headers(&[(":method", "GET"), (":path", path), (":authority", "gw")], true);
    let reply = fake.replies().get(before).cloned().expect("the page");
    (reply.status, serde_json::from_slice(&reply.body).unwrap())
}

fn logged(fake: &Rc<FakeHost>, level: LogLevel, part: &str) -> Vec<String> {
    fake.logs()
        .into_iter()
        .filter(|(l, m)| *l == level && m.contains(part))
        .map(|(_, m)| m)
        .collect()
}

#[test]
fn a_failed_poll_keeps_the_last_snapshot_and_names_the_admin_address_once() {
    let (fake, _, mut poller) = started();
    poller.on_tick(&fake.envoy());
    poller.on_response(&fake.envoy(), fake.callouts()[0].token, answer(&fake, "200", MIXED));
    let stored = fake.shared(shared::STATUS_SNAPSHOT).unwrap();
    // Another worker's root context takes some of the polls: the failure is the process's, logged once.
    let mut other = Poller::default();
    other.start(&fake.envoy(), Rc::new(load_config(FLEET).unwrap()));
    let failures = [
        ("503", REFUSED),
        ("200", &b"{\"cluster_statuses\": 3}"[..]),
        ("404", &b"<html>not here</html>"[..]),
        ("503", REFUSED),
    ];
    for (i, (status, body)) in failures.into_iter().enumerate() {
        fake.advance_ms(POLL_INTERVAL_MS + 1);
        let p = if i % 2 == 0 { &mut other } else { &mut poller };
        p.on_tick(&fake.envoy());
        let token = fake.callouts().last().unwrap().token;
        p.on_response(&fake.envoy(), token, answer(&fake, status, body));
        assert_eq!(fake.shared(shared::STATUS_SNAPSHOT).unwrap().0, stored.0, "{status}");
    }
    let warnings = logged(&fake, LogLevel::Warn, "admin");
    assert_eq!(warnings.len(), 1, "one line per change of state: {warnings:?}");
    assert!(
        warnings[0].contains("127.0.0.1:9901") && warnings[0].contains("Connection refused"),
        "{warnings:?}"
    );
    assert!(!warnings[0].contains("not here"), "another server's body is not quoted");

    // The pages name it: /readyz once the last snapshot is stale.
    let root = root(&fake, FLEET);
    let (_, st) = page(&fake, &root, "/llmroute/status");
    assert_eq!(st["admin"]["address"], "127.0.0.1:9901");
    assert!(
        st["admin"]["error"].as_str().unwrap().contains("Connection refused"),
        "{st}"
    );
    assert_eq!(st["admin"]["failing_for_ms"], 3 * (POLL_INTERVAL_MS + 1));
    fake.advance_ms(status::STALE_AFTER_MS);
    let (code, readyz) = page(&fake, &root, "/readyz");
    assert_eq!(code, 503);
    assert!(
        readyz["reason"].as_str().unwrap().contains("127.0.0.1:9901"),
        "{readyz}"
    );

    // A good poll clears it, with one line.
    fake.advance_ms(POLL_INTERVAL_MS + 1);
    poller.on_tick(&fake.envoy());
    poller.on_response(
        &fake.envoy(),
        fake.callouts().last().unwrap().token,
        answer(&fake, "200", MIXED),
    );
    assert_eq!(
        page(&fake, &root, "/llmroute/status").1["admin"],
        serde_json::Value::Null
    );
    let infos = logged(&fake, LogLevel::Info, "work again");
    assert_eq!(
        infos,
        vec!["llmroute: polls of Envoy's admin API at 127.0.0.1:9901 work again".to_string()]
    );
}

#[test]
fn an_admin_cluster_that_cannot_be_called_hands_the_lease_back() {
    let (fake, _, mut poller) = started();
    fake.fail_kind(crate::host::fake::Kind::HttpCall, HostStatus::BadArgument);
    poller.on_tick(&fake.envoy());
    assert_eq!(fake.shared(shared::STATUS_LEASE).unwrap().0, 0u64.to_le_bytes());
    let failure = crate::status::admin_failure(&fake.envoy()).expect("named on the pages");
    assert!(
        failure.error.contains("llmroute_admin could not be called"),
        "{failure:?}"
    );
    fake.heal();
    let mut other = Poller::default();
    other.start(&fake.envoy(), Rc::new(load_config(FLEET).unwrap()));
    other.on_tick(&fake.envoy());
    assert_eq!(fake.callouts().len(), 1, "the next root context polls at once");
}

#[test]
fn an_answer_that_never_comes_is_forgotten_after_the_timeout() {
    let (fake, _, mut poller) = started();
    poller.on_tick(&fake.envoy());
    fake.advance_ms(POLL_TIMEOUT_MS + TICK_MS);
    poller.on_tick(&fake.envoy());
    assert_eq!(fake.callouts().len(), 1, "still waiting");
    fake.advance_ms(POLL_INTERVAL_MS);
    poller.on_tick(&fake.envoy());
    assert_eq!(fake.callouts().len(), 2, "a new poll once the old one timed out");
    let failure = crate::status::admin_failure(&fake.envoy()).expect("named on the pages");
    assert_eq!(failure.error, format!("no answer within {POLL_TIMEOUT_MS} ms"));
    let late = fake.callouts()[0].token;
    poller.on_response(&fake.envoy(), late, answer(&fake, "200", MIXED));
    assert!(latest(&fake.envoy()).is_none(), "a late answer is ignored");
}

#[test]
fn a_host_error_at_any_call_of_a_poll_neither_panics_nor_stops_polling() {
    let (clean, _, mut poller) = started();
    clean.reset_calls();
    poller.on_tick(&clean.envoy());
    poller.on_response(&clean.envoy(), clean.callouts()[0].token, answer(&clean, "200", MIXED));
    let n = clean.calls().len();
    for i in 0..n {
        let (fake, _, mut poller) = started();
        fake.fail_nth(i, HostStatus::InternalFailure);
        poller.on_tick(&fake.envoy());
        if let Some(c) = fake.callouts().first() {
            poller.on_response(&fake.envoy(), c.token, answer(&fake, "200", MIXED));
        }
        fake.heal();
        fake.advance_ms(POLL_INTERVAL_MS + POLL_TIMEOUT_MS + 2 * TICK_MS);
        poller.on_tick(&fake.envoy());
        let token = fake.callouts().last().map(|c| c.token);
        poller.on_response(&fake.envoy(), token.unwrap(), answer(&fake, "200", MIXED));
        assert!(
            latest(&fake.envoy()).is_some(),
            "call {i}: the next poll stores a snapshot"
        );
    }
}

#[test]
fn the_root_context_ticks_the_poll_and_hands_it_the_answer() {
    use proxy_wasm::traits::{Context, RootContext};
    let fake = FakeHost::new();
    let mut root = root(&fake, FLEET);
    assert!(root.on_vm_start(0));
    assert_eq!(root.get_type(), Some(proxy_wasm::types::ContextType::HttpContext));
    root.on_tick();
    let admin = fake
        .callouts()
        .into_iter()
        .find(|c| c.cluster == ADMIN_CLUSTER)
        .expect("the poll");
    let size = answer(&fake, "200", MIXED);
    root.on_http_call_response(admin.token, 1, size, 0);
    assert!(latest(&fake.envoy()).is_some());
}

/// The host ids `root`'s worker shows on `GET /llmroute/status`, for the backend `llama-a`.
fn shown_ids(fake: &Rc<FakeHost>, root: &Root, context_id: u32) -> Vec<String> {
    let before = fake.replies().len();
    let mut x = Exchange::new(fake, root, context_id);
    x.request_headers(
        &[(":method", "GET"), (":path", "/llmroute/status"), (":authority", "gw")],
        true,
    );
    let reply = fake.replies().get(before).cloned().expect("the status page");
    let page: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    let backend = page["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "llama-a")
        .cloned();
    let hosts = backend.unwrap()["hosts"].as_array().cloned().unwrap();
    hosts.iter().map(|h| h["id"].as_str().unwrap().to_string()).collect()
}

#[test]
fn every_worker_shows_the_same_keyed_host_ids_and_none_is_the_unkeyed_hash() {
    let fake = FakeHost::new();
    let (first, second) = (root(&fake, FLEET), root(&fake, FLEET));
    let key = fake.shared(shared::STATUS_ID_KEY).expect("a key made at configure").0;
    let mut poller = Poller::default();
    poller.start(&fake.envoy(), Rc::new(load_config(FLEET).unwrap()));
    poller.on_tick(&fake.envoy());
    poller.on_response(&fake.envoy(), fake.callouts()[0].token, answer(&fake, "200", MIXED));
    let ids = shown_ids(&fake, &first, 1);
    assert!(!ids.is_empty());
    assert_eq!(shown_ids(&fake, &second, 2), ids, "both workers show the same ids");
    assert_eq!(
        fake.shared(shared::STATUS_ID_KEY).unwrap().0,
        key,
        "one key per process"
    );
    let unkeyed: Vec<String> = latest(&fake.envoy())
        .unwrap()
        .backend("llama-a")
        .unwrap()
        .hosts
        .iter()
        .map(|a| format!("{:08x}", llmroute_core::key_placement::host_id(a)))
        .collect();
    assert!(ids.iter().all(|id| !unkeyed.contains(id)), "{ids:?} {unkeyed:?}");
    // Another process draws another key, so shows other ids.
    let other = FakeHost::new();
    let third = root(&other, FLEET);
    assert_ne!(other.shared(shared::STATUS_ID_KEY).unwrap().0, key);
    let mut poller = Poller::default();
    poller.start(&other.envoy(), Rc::new(load_config(FLEET).unwrap()));
    poller.on_tick(&other.envoy());
    poller.on_response(&other.envoy(), other.callouts()[0].token, answer(&other, "200", MIXED));
    let theirs = shown_ids(&other, &third, 3);
    assert!(theirs.iter().all(|id| !ids.contains(id)), "{theirs:?} {ids:?}");
}
