//! Socket-level tests of the chaos faults: reset before any byte, garbage streams, 5xx bursts, an engine that
//! passes `/health` while inference fails, kill and restart on the same port, the seeded fault plan and the
//! attempt journal.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::dialects::{post, request};
use super::faults::receive;
use crate::emulator::chaos::{EngineFault, FaultPlan, Journal};
use crate::emulator::dialect::GARBAGE;
use crate::emulator::{Dialect, Emulator, EmulatorOptions};

/// Sends one raw HTTP/1.1 chat request and reads until the server closes; returns every byte it sent.
async fn raw_chat(emulator: &Emulator, extra: &str) -> Vec<u8> {
    let body = request(Dialect::Chat, "hi", false).to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n{extra}\r\n",
        body.len()
    );
    let mut tcp = TcpStream::connect(emulator.addr()).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut got))
        .await
        .unwrap();
    got
}

#[tokio::test]
async fn a_reset_drops_the_connection_before_any_byte_and_the_journal_says_so() {
    let emulator = Emulator::spawn("r").await.unwrap();
    let got = raw_chat(&emulator, "x-emu-reset: 1\r\nx-request-id: rid-1\r\n").await;
    assert!(got.is_empty(), "a reset sent {:?}", String::from_utf8_lossy(&got));
    let whole = raw_chat(&emulator, "x-request-id: rid-2\r\n").await;
    assert!(whole.starts_with(b"HTTP/1.1 200"));
    let attempts = emulator.journal().attempts();
    assert_eq!(attempts["rid-1"].len(), 1);
    assert_eq!(attempts["rid-1"][0].head, None);
    assert_eq!(attempts["rid-1"][0].engine, "r");
    assert_eq!(attempts["rid-2"][0].head, Some(200));
}

#[tokio::test]
async fn garbage_after_one_delta_ends_cleanly_without_the_terminal_event() {
    let emulator = Emulator::spawn("g").await.unwrap();
    for dialect in [Dialect::Chat, Dialect::Messages] {
        let response = post(
            &emulator,
            dialect,
            &request(dialect, "x", true),
            &[("x-emu-garbage-after", "1")],
        )
        .await;
        assert_eq!(response.status(), 200);
        let got = receive(response).await;
        assert!(!got.failed, "{dialect:?}: a garbage stream ends cleanly");
        assert!(got.bytes.ends_with(GARBAGE), "{dialect:?}");
        let text = String::from_utf8_lossy(&got.bytes);
        assert!(text.contains("tok0") && !text.contains("tok1"), "{dialect:?}: {text}");
        assert!(
            !text.contains("[DONE]") && !text.contains("message_stop"),
            "{dialect:?}: {text}"
        );
    }
}

#[tokio::test]
async fn a_burst_fails_exactly_n_requests_then_heals() {
    let emulator = Emulator::spawn("b").await.unwrap();
    emulator.fail_next(3, 503);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let response = post(&emulator, Dialect::Chat, &request(Dialect::Chat, "x", false), &[]).await;
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [503, 503, 503, 200, 200]);
}

#[tokio::test]
async fn health_passes_while_inference_fails() {
    let emulator = Emulator::spawn("z").await.unwrap();
    emulator.set_fault_status(Some(500));
    let health = reqwest::get(format!("http://{}/health", emulator.addr()))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let response = post(&emulator, Dialect::Chat, &request(Dialect::Chat, "x", false), &[]).await;
    assert_eq!(response.status(), 500);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "server_error");
}

#[tokio::test]
async fn a_killed_engine_refuses_connections_and_restarts_on_its_port_with_its_journal() {
    let emulator = Emulator::spawn("k").await.unwrap();
    let addr = emulator.addr();
    let _ = raw_chat(&emulator, "x-request-id: before\r\n").await;
    let opts = emulator.options();
    drop(emulator);
    let refused = TcpStream::connect(addr).await;
    assert!(refused.is_err(), "the port still accepts after a kill");
    let again = Emulator::spawn_with(opts).await.unwrap();
    assert_eq!(again.addr(), addr);
    let _ = raw_chat(&again, "x-request-id: after\r\n").await;
    let attempts = again.journal().attempts();
    assert!(attempts.contains_key("before") && attempts.contains_key("after"));
}

#[test]
fn the_fault_plan_is_a_function_of_seed_engine_id_and_arrival() {
    let plan = FaultPlan {
        seed: 7,
        slow_headers_permille: 100,
        slow_headers: Duration::from_millis(300),
        garbage_permille: 100,
        cut_permille: 100,
        reset_permille: 100,
    };
    let picks = |plan: &FaultPlan| -> Vec<Option<EngineFault>> {
        (0..2000).map(|i| plan.pick("e-1", &format!("id-{i}"), 0)).collect()
    };
    assert_eq!(picks(&plan), picks(&plan.clone()));
    let reseeded = FaultPlan {
        seed: 8,
        ..plan.clone()
    };
    assert_ne!(picks(&plan), picks(&reseeded));
    let other_engine: Vec<_> = (0..2000).map(|i| plan.pick("e-2", &format!("id-{i}"), 0)).collect();
    assert_ne!(picks(&plan), other_engine);
    let second_arrival: Vec<_> = (0..2000).map(|i| plan.pick("e-1", &format!("id-{i}"), 1)).collect();
    assert_ne!(picks(&plan), second_arrival);
    // Each share lands near its 10%, and 60% of requests are left alone.
    let all = picks(&plan);
    let count = |want: Option<EngineFault>| all.iter().filter(|p| **p == want).count();
    for fault in [
        EngineFault::SlowHeaders(Duration::from_millis(300)),
        EngineFault::Garbage,
        EngineFault::Cut,
        EngineFault::Reset,
    ] {
        let n = count(Some(fault));
        assert!((140..=260).contains(&n), "{fault:?}: {n} of 2000");
    }
    assert!((1080..=1320).contains(&count(None)));
    assert!(picks(&FaultPlan::default()).iter().all(Option::is_none));
}

#[tokio::test]
async fn an_engine_plan_resets_what_it_picks_and_the_journal_is_shared() {
    let journal = Arc::new(Journal::default());
    let mut opts = EmulatorOptions::new("p");
    opts.journal = Some(journal.clone());
    opts.faults = Some(FaultPlan {
        seed: 1,
        reset_permille: 500,
        ..FaultPlan::default()
    });
    let emulator = Emulator::spawn_with(opts.clone()).await.unwrap();
    let plan = opts.faults.clone().unwrap();
    for i in 0..20 {
        let id = format!("req-{i}");
        let got = raw_chat(&emulator, &format!("x-request-id: {id}\r\n")).await;
        let reset = plan.pick("p", &id, 0) == Some(EngineFault::Reset);
        assert_eq!(got.is_empty(), reset, "{id}");
        assert_eq!(journal.attempts()[&id][0].head, (!reset).then_some(200));
    }
    assert_eq!(journal.len(), 20);
    assert_eq!(journal.arrivals("p").len(), 20);
}
