//! The `/props` fleet check (`props.rs`): one round per interval, one call per llama.cpp server, findings
//! logged and counted, reported slots stored for placement, and a server that never answers.

use llmroute_core::envoy_contract::shared;
use llmroute_core::fleet_check::{CHECK_INTERVAL_MS, CHECK_TIMEOUT_MS, PROPS_PATH};
use llmroute_core::key_placement::table::decode_host_counts;
use llmroute_core::load_config;
use llmroute_core::status::TICK_MS;
use proxy_wasm::types::{BufferType, LogLevel, MapType};

use super::*;
use crate::fleet_check::FleetCheck;
use crate::host::HostStatus;

const WARNINGS: &str = "llmroute_fleet_warnings_total";
const CHECKS: &str = "llmroute_fleet_checks_total";

fn started() -> (Rc<FakeHost>, FleetCheck) {
    let fake = FakeHost::new();
    let mut prober = FleetCheck::default();
    prober.start(&fake.envoy(), Rc::new(load_config(CONFIG).unwrap()));
    (fake, prober)
}

fn props(n_ctx: u32, slots: u32) -> String {
    format!(r#"{{"default_generation_settings":{{"n_ctx":{n_ctx}}},"total_slots":{slots}}}"#)
}

fn answer(fake: &Rc<FakeHost>, prober: &mut FleetCheck, token: u32, status: &str, body: &str) {
    fake.set_map(MapType::HttpCallResponseHeaders, &[(":status", status)]);
    fake.set_buffer_bytes(BufferType::HttpCallResponseBody, body.as_bytes());
    prober.on_response(&fake.envoy(), token, body.len());
}

#[test]
fn servers_that_disagree_are_a_finding_and_their_slots_are_kept() {
    let (fake, mut prober) = started();
    prober.on_tick(&fake.envoy());
    let calls = fake.callouts();
    assert_eq!(calls.len(), 2, "one call per server");
    for c in &calls {
        assert!(c.headers.contains(&(":path".to_string(), PROPS_PATH.to_string())));
    }
    assert_ne!(
        calls[0].cluster, calls[1].cluster,
        "each server through its own probe cluster"
    );
    answer(&fake, &mut prober, calls[0].token, "200", &props(4096, 2));
    assert_eq!(fake.metric(CHECKS), Some(0), "the round waits for every server");
    answer(&fake, &mut prober, calls[1].token, "200", &props(8192, 4));
    // Two findings: the context per slot and the slot count differ.
    assert_eq!((fake.metric(WARNINGS), fake.metric(CHECKS)), (Some(2), Some(1)));
    assert!(fake
        .logs()
        .iter()
        .any(|(l, m)| *l == LogLevel::Warn && m.contains("fleet check")));
    let slots = decode_host_counts(&fake.shared(&shared::slots("llama-a")).unwrap().0, 2);
    assert_eq!(slots, vec![2, 4]);
}

#[test]
fn a_server_that_never_answers_is_left_out_after_the_timeout() {
    let (fake, mut prober) = started();
    prober.on_tick(&fake.envoy());
    let calls = fake.callouts();
    answer(&fake, &mut prober, calls[0].token, "200", &props(4096, 2));
    fake.advance_ms(CHECK_TIMEOUT_MS + TICK_MS);
    prober.on_tick(&fake.envoy());
    assert_eq!(fake.metric(CHECKS), Some(0));
    fake.advance_ms(1);
    prober.on_tick(&fake.envoy());
    assert_eq!((fake.metric(WARNINGS), fake.metric(CHECKS)), (Some(0), Some(1)));
    // A late answer is ignored; the next round starts after the interval.
    answer(&fake, &mut prober, calls[1].token, "200", &props(8192, 4));
    assert_eq!(fake.metric(CHECKS), Some(1));
    fake.advance_ms(CHECK_INTERVAL_MS);
    prober.on_tick(&fake.envoy());
    assert_eq!(fake.callouts().len(), 4);
}

#[test]
fn a_config_without_llama_fleets_checks_nothing() {
    let fake = FakeHost::new();
    let mut prober = FleetCheck::default();
    prober.start(
        &fake.envoy(),
        Rc::new(load_config(&CONFIG.replace("llamacpp", "vllm")).unwrap()),
    );
    prober.on_tick(&fake.envoy());
    assert!(fake.callouts().is_empty());
    assert_eq!(fake.tick_ms(), None);
}

#[test]
fn a_host_error_at_any_call_of_a_round_neither_panics_nor_stops_checking() {
    let (clean, mut prober) = started();
    clean.reset_calls();
    prober.on_tick(&clean.envoy());
    for c in clean.callouts() {
        answer(&clean, &mut prober, c.token, "200", &props(4096, 2));
    }
    let n = clean.calls().len();
    for i in 0..n {
        let (fake, mut prober) = started();
        fake.reset_calls();
        fake.fail_nth(i, HostStatus::InternalFailure);
        prober.on_tick(&fake.envoy());
        for c in fake.callouts() {
            answer(&fake, &mut prober, c.token, "200", &props(4096, 2));
        }
        fake.heal();
        fake.advance_ms(CHECK_INTERVAL_MS + CHECK_TIMEOUT_MS + 2 * TICK_MS);
        let seen = fake.callouts().len();
        prober.on_tick(&fake.envoy());
        let before = fake.metric(CHECKS).unwrap_or(0);
        let fresh = fake.callouts()[seen..].to_vec();
        for c in &fresh {
            answer(&fake, &mut prober, c.token, "200", &props(4096, 2));
        }
        assert_eq!(fresh.len(), 2, "call {i}: the next round calls every server");
        assert_eq!(
            fake.metric(CHECKS),
            Some(before + 1),
            "call {i}: the next round completes"
        );
    }
}
