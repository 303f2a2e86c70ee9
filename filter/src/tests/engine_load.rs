//! Engine load, host side (`engine_load/`): one round per `poll_ms` per Envoy, one `/metrics` call per engine
//! through its probe cluster, readings stored for placement with their gauges, problems noted for the status
//! page, a queued host kept from new keys, a known key's request sent past a host over `spill_queue`, vLLM's
//! ORCA report asked for, folded in and never passed on, work in flight held and released, and host errors at
//! any call of a round.

use llmroute_core::envoy_contract::metrics::{labelled, ENGINE_LOAD_READS, ENGINE_LOAD_STALE, ENGINE_QUEUE};
use llmroute_core::envoy_contract::shared;
use llmroute_core::key_placement::table::decode_host_counts;
use llmroute_core::load::{self, EngineLoad, METRICS_PATH};
use llmroute_core::load_config;
use llmroute_core::status::{shown_host, TICK_MS};
use proxy_wasm::types::{BufferType, MapType};
use serde_json::Value;

use super::*;
use crate::engine_load::LoadPoller;
use crate::host::HostStatus;
use crate::metrics::Metrics;

const A: &str = "127.0.0.1:8081";
const B: &str = "127.0.0.1:8082";

/// [`bounded_config`] with the backend's load polled every 200 ms, a known key leaving a host over 2 queued.
fn load_config_text(kind: &str) -> String {
    bounded_config().replace(
        r#""kind": "llamacpp", "endpoints": ["127.0.0.1:8081", "127.0.0.1:8082"]"#,
        &format!(
            r#""kind": "{kind}", "endpoints": ["127.0.0.1:8081", "127.0.0.1:8082"], "load": {{ "poll_ms": 200, "spill_queue": 2 }}"#
        ),
    )
}

fn page(queued: u32) -> String {
    format!("llamacpp:requests_processing 1\nllamacpp:requests_deferred {queued}\n")
}

fn started(kind: &str) -> (Rc<FakeHost>, LoadPoller) {
    let fake = FakeHost::new();
    let mut poller = LoadPoller::new(Metrics::new(fake.envoy()));
    poller.start(
        &fake.envoy(),
        Rc::new(load_config(&load_config_text(kind)).unwrap()),
        Metrics::new(fake.envoy()),
    );
    (fake, poller)
}

fn answer(fake: &Rc<FakeHost>, poller: &mut LoadPoller, token: u32, status: &str, body: &str) {
    fake.set_map(MapType::HttpCallResponseHeaders, &[(":status", status)]);
    fake.set_buffer_bytes(BufferType::HttpCallResponseBody, body.as_bytes());
    poller.on_response(&fake.envoy(), token, body.len());
}

fn stored(fake: &Rc<FakeHost>) -> Vec<(String, EngineLoad)> {
    load::decode(&fake.shared(&shared::load("llama-a")).map(|v| v.0).unwrap_or_default())
}

/// Runs one round whose engines report `queues` (A, then B).
fn round(fake: &Rc<FakeHost>, poller: &mut LoadPoller, queues: [u32; 2]) {
    let seen = fake.callouts().len();
    poller.on_tick(&fake.envoy());
    let calls = fake.callouts()[seen..].to_vec();
    assert_eq!(calls.len(), 2, "one call per engine");
    for (c, q) in calls.iter().zip(queues) {
        answer(fake, poller, c.token, "200", &page(q));
    }
}

#[test]
fn a_round_reads_each_engine_through_its_probe_cluster_and_stores_the_readings() {
    let (fake, mut poller) = started("llamacpp");
    assert_eq!(
        fake.tick_ms(),
        Some(200),
        "the root ticks as often as the shortest poll"
    );
    poller.on_tick(&fake.envoy());
    let calls = fake.callouts();
    assert_eq!(
        calls.iter().map(|c| c.cluster.as_str()).collect::<Vec<_>>(),
        vec!["llmroute-probe-llama-a-0", "llmroute-probe-llama-a-1"]
    );
    for c in &calls {
        assert!(c.headers.contains(&(":path".to_string(), METRICS_PATH.to_string())));
        assert_eq!(c.timeout.as_millis(), 250, "bounded in time");
    }
    answer(&fake, &mut poller, calls[0].token, "200", &page(4));
    assert!(stored(&fake).is_empty(), "the round waits for every engine");
    answer(&fake, &mut poller, calls[1].token, "200", &page(0));
    let got = stored(&fake);
    assert_eq!(
        got.iter()
            .map(|(a, l)| (a.as_str(), l.queued, l.running))
            .collect::<Vec<_>>(),
        vec![(A, 4, 1), (B, 0, 1)]
    );
    let id = shown_host(crate::status::id_key(&fake.envoy()), A);
    let queue = labelled(ENGINE_QUEUE, &[("backend", "llama-a"), ("host", &id)]);
    assert_eq!(fake.metric(&queue), Some(4));
    let ok = labelled(ENGINE_LOAD_READS, &[("backend", "llama-a"), ("outcome", "ok")]);
    assert_eq!(fake.metric(&ok), Some(2));
    // The next round waits for the interval.
    poller.on_tick(&fake.envoy());
    assert_eq!(fake.callouts().len(), 2);
    fake.advance_ms(200);
    poller.on_tick(&fake.envoy());
    assert_eq!(fake.callouts().len(), 4);
}

#[test]
fn one_root_context_per_envoy_polls_each_interval() {
    let (fake, mut one) = started("llamacpp");
    let mut other = LoadPoller::new(Metrics::new(fake.envoy()));
    other.start(
        &fake.envoy(),
        Rc::new(load_config(&load_config_text("llamacpp")).unwrap()),
        Metrics::new(fake.envoy()),
    );
    one.on_tick(&fake.envoy());
    other.on_tick(&fake.envoy());
    assert_eq!(fake.callouts().len(), 2, "the other worker found the lease taken");
    fake.advance_ms(200);
    other.on_tick(&fake.envoy());
    one.on_tick(&fake.envoy());
    assert_eq!(fake.callouts().len(), 4);
}

#[test]
fn a_llama_server_without_metrics_is_named_on_the_status_page_and_its_reading_goes_stale() {
    let (fake, mut poller) = started("llamacpp");
    round(&fake, &mut poller, [1, 0]);
    // From now on engine A answers 501, as llama-server does without --metrics.
    for _ in 0..4 {
        fake.advance_ms(200);
        let seen = fake.callouts().len();
        poller.on_tick(&fake.envoy());
        let calls = fake.callouts()[seen..].to_vec();
        answer(&fake, &mut poller, calls[0].token, "501", "not supported");
        answer(&fake, &mut poller, calls[1].token, "200", &page(0));
    }
    let stale = labelled(ENGINE_LOAD_STALE, &[("backend", "llama-a")]);
    assert_eq!(fake.metric(&stale), Some(1), "A's reading went stale after 3 polls");
    let error = labelled(ENGINE_LOAD_READS, &[("backend", "llama-a"), ("outcome", "error")]);
    assert_eq!(fake.metric(&error), Some(4));
    // The status page shows A's problem and its stale reading; B's fresh one.
    let fleet = llmroute_core::status::FleetStatus {
        taken_at_ms: fake.envoy().now_ms(),
        backends: vec![llmroute_core::status::BackendHealth {
            name: "llama-a".into(),
            healthy: 2,
            degraded: 0,
            total: 2,
            in_flight: 0,
            down: vec![],
            hosts: vec![A.into(), B.into()],
            weights: vec![],
            active: vec![],
        }],
    };
    fake.envoy()
        .set_shared_data(shared::STATUS_SNAPSHOT, &fleet.encode(), None);
    let root = root(&fake, &load_config_text("llamacpp"));
    let mut x = Exchange::new(&fake, &root, 1);
    let status_headers = [(":method", "GET"), (":path", "/llmroute/status"), (":authority", "gw")];
    x.request_headers(&status_headers, true);
    let reply = fake.replies().pop().unwrap();
    let page: Value = serde_json::from_slice(&reply.body).unwrap();
    let b = &page["backends"][0];
    assert_eq!(b["load"]["poll_ms"], 200);
    let hosts = b["hosts"].as_array().unwrap();
    let a = &hosts[0]["load"];
    assert_eq!(a["stale"], true, "{page:#}");
    assert!(a["problem"].as_str().unwrap().contains("--metrics"), "{page:#}");
    assert_eq!(hosts[1]["load"]["stale"], false);
    assert_eq!(hosts[1]["load"]["queued"], 0);
    let text = String::from_utf8(reply.body).unwrap();
    assert!(!text.contains(A) && !text.contains(B), "no address on the status page");
}

#[test]
fn an_engine_that_never_answers_times_out_and_the_next_round_still_runs() {
    let (fake, mut poller) = started("llamacpp");
    poller.on_tick(&fake.envoy());
    let calls = fake.callouts();
    answer(&fake, &mut poller, calls[0].token, "200", &page(3));
    fake.advance_ms(250 + TICK_MS + 1);
    poller.on_tick(&fake.envoy());
    assert_eq!(stored(&fake).len(), 1, "the round ended with what came");
    let timeout = labelled(ENGINE_LOAD_READS, &[("backend", "llama-a"), ("outcome", "timeout")]);
    assert_eq!(fake.metric(&timeout), Some(1));
    assert_eq!(fake.callouts().len(), 4, "and a new one started");
}

/// A chat request whose system prompt is tenant `t`'s, through the root: the engine it was pinned to (0: A) and
/// the placement reason.
fn chat_for(fake: &Rc<FakeHost>, root: &Root, id: u32, t: u32) -> (usize, String) {
    let mut x = Exchange::new(fake, root, id);
    let body = CHAT.replace("You are terse.", &format!("You are the assistant of tenant {t}."));
    x.request_headers(&REQUEST_HEADERS, false);
    x.request_body(body.as_bytes(), true);
    let session = x.request_header(llmroute_core::envoy_contract::SESSION_HEADER).unwrap();
    let host = [A, B]
        .iter()
        .position(|a| llmroute_core::key_placement::session_header_value(a) == session)
        .unwrap();
    let reason = fake
        .log_field(llmroute_core::envoy_contract::log_fields::PLACEMENT)
        .unwrap();
    x.response_headers(&[(":status", "200"), ("content-type", "application/json")], false);
    x.response_body(JSON_ANSWER.as_bytes(), true);
    x.log();
    (host, reason)
}

fn store_queues(fake: &Rc<FakeHost>, queues: [u32; 2]) {
    let _ = fake;
    let now = fake.envoy().now_ms();
    let readings: Vec<(String, EngineLoad)> = [A, B]
        .iter()
        .zip(queues)
        .map(|(a, q)| {
            (
                a.to_string(),
                EngineLoad {
                    running: 1,
                    queued: q,
                    kv_permille: None,
                    at_ms: now,
                },
            )
        })
        .collect();
    fake.envoy()
        .set_shared_data(&shared::load("llama-a"), &load::encode(&readings), None);
}

#[test]
fn a_queued_host_takes_no_new_key_until_it_is_idle_again() {
    let fake = FakeHost::new();
    let root = root(&fake, &load_config_text("llamacpp"));
    store_queues(&fake, [3, 0]);
    for t in 0..4 {
        let (host, reason) = chat_for(&fake, &root, t + 1, t);
        assert_eq!(
            (host, reason.as_str()),
            (1, "placed"),
            "tenant {t} avoids the queued host"
        );
    }
    store_queues(&fake, [0, 0]);
    let homes: Vec<usize> = (4..8).map(|t| chat_for(&fake, &root, t + 1, t).0).collect();
    assert!(
        homes.iter().all(|h| *h == 0),
        "A has room again and takes the new keys: {homes:?}"
    );
}

#[test]
fn a_known_keys_request_passes_a_host_over_the_spill_queue_and_the_key_stays() {
    let fake = FakeHost::new();
    let root = root(&fake, &load_config_text("llamacpp"));
    store_queues(&fake, [0, 0]);
    let (home, reason) = chat_for(&fake, &root, 1, 7);
    assert_eq!(reason, "placed");
    let mut q = [0, 0];
    q[home] = 2;
    store_queues(&fake, q);
    assert_eq!(
        chat_for(&fake, &root, 2, 7),
        (home, "pinned".into()),
        "at the bound it stays"
    );
    q[home] = 3;
    store_queues(&fake, q);
    assert_eq!(chat_for(&fake, &root, 3, 7), (1 - home, "queued".into()));
    store_queues(&fake, [0, 0]);
    assert_eq!(
        chat_for(&fake, &root, 4, 7),
        (home, "pinned".into()),
        "the key never moved"
    );
    // A stale reading counts as none: the key's own host again.
    store_queues(&fake, q);
    fake.advance_ms(601);
    assert_eq!(chat_for(&fake, &root, 5, 7), (home, "pinned".into()));
}

#[test]
fn a_vllm_engine_is_asked_for_its_orca_report_which_is_folded_in_and_never_passed_on() {
    let fake = FakeHost::new();
    let root = root(&fake, &load_config_text("vllm"));
    let mut x = Exchange::new(&fake, &root, 1);
    x.request_headers(&REQUEST_HEADERS, false);
    x.request_body(CHAT.as_bytes(), true);
    assert_eq!(
        x.request_header("endpoint-load-metrics-format").as_deref(),
        Some("JSON")
    );
    fake.set_property_bytes(&["upstream", "address"], B.as_bytes());
    let report = r#"JSON {"named_metrics": {"kv_cache_usage_perc": 0.25, "num_requests_waiting": 5.0}}"#;
    x.response_headers(
        &[
            (":status", "200"),
            ("content-type", "application/json"),
            ("endpoint-load-metrics", report),
        ],
        false,
    );
    assert_eq!(
        x.response_header("endpoint-load-metrics"),
        None,
        "the client never sees it"
    );
    let got = stored(&fake);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].0.as_str(), got[0].1.queued, got[0].1.kv_permille),
        (B, 5, Some(250))
    );
    // A llama.cpp backend is not asked; a report it sent anyway is still removed.
    let fake = FakeHost::new();
    let llama = super::root(&fake, &load_config_text("llamacpp"));
    let mut x = Exchange::new(&fake, &llama, 1);
    x.request_headers(&REQUEST_HEADERS, false);
    x.request_body(CHAT.as_bytes(), true);
    assert_eq!(x.request_header("endpoint-load-metrics-format"), None);
    x.response_headers(
        &[
            (":status", "200"),
            ("content-type", "application/json"),
            ("endpoint-load-metrics", report),
        ],
        false,
    );
    assert_eq!(x.response_header("endpoint-load-metrics"), None);
    assert!(
        stored(&fake).is_empty(),
        "not folded in for an engine kind that does not send it"
    );
}

#[test]
fn a_placed_request_holds_its_tokens_as_work_until_the_log_phase() {
    let fake = FakeHost::new();
    let root = root(&fake, &load_config_text("llamacpp"));
    let mut x = Exchange::new(&fake, &root, 1);
    let body = CHAT.replacen('{', r#"{"max_tokens":100,"#, 1);
    x.request_headers(&REQUEST_HEADERS, false);
    x.request_body(body.as_bytes(), true);
    let estimate: u32 = x.request_header("x-input-tokens").unwrap().parse().unwrap();
    let work = || decode_host_counts(&fake.shared(&shared::work("llama-a")).unwrap().0, 2);
    let held = work();
    assert_eq!(held.iter().sum::<u32>(), estimate + 100, "{held:?}");
    x.response_headers(&[(":status", "200"), ("content-type", "application/json")], false);
    x.response_body(JSON_ANSWER.as_bytes(), true);
    x.log();
    assert_eq!(work(), vec![0, 0]);
    // Without load, no work is kept.
    let fake = FakeHost::new();
    let plain = super::root(&fake, &bounded_config());
    run_chat(&mut Exchange::new(&fake, &plain, 1), false);
    assert!(fake.shared(&shared::work("llama-a")).is_none());
}

#[test]
fn a_host_error_at_any_call_of_a_round_neither_panics_nor_stops_polling() {
    let (clean, mut poller) = started("llamacpp");
    clean.reset_calls();
    round(&clean, &mut poller, [1, 1]);
    let n = clean.calls().len();
    for i in 0..n {
        let (fake, mut poller) = started("llamacpp");
        fake.reset_calls();
        fake.fail_nth(i, HostStatus::InternalFailure);
        poller.on_tick(&fake.envoy());
        for c in fake.callouts() {
            answer(&fake, &mut poller, c.token, "200", &page(1));
        }
        fake.heal();
        // Whatever the failed call left (a round pending, a lease taken), the next rounds run.
        let healed = fake.callouts().len();
        fake.advance_ms(200 + 250 + 2 * TICK_MS);
        poller.on_tick(&fake.envoy());
        for c in fake.callouts()[healed..].to_vec() {
            answer(&fake, &mut poller, c.token, "200", &page(1));
        }
        let seen = fake.callouts().len();
        fake.advance_ms(200);
        poller.on_tick(&fake.envoy());
        let fresh = fake.callouts()[seen..].to_vec();
        assert_eq!(fresh.len(), 2, "call {i}: a later round calls every engine");
        for c in &fresh {
            answer(&fake, &mut poller, c.token, "200", &page(2));
        }
        assert!(
            stored(&fake).iter().all(|(_, l)| l.queued == 2),
            "call {i}: {:?}",
            stored(&fake)
        );
    }
}
