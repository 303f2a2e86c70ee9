//! Stream integrity and usage accounting through real Envoy. Each fault is chosen per request by the emulator's
//! `x-emu-*` headers; each test compares the exact bytes the client receives through Envoy with what the engine
//! sends directly, plus the gateway's closing event where one is due, and checks the outcome counters.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use llmroute_core::envoy_contract::metrics as names;
use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::*;

/// One engine behind Envoy, with `extra` merged into the config.
async fn one_engine(extra: Value) -> (Fleet, Envoy) {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let mut config = json!({
        "version": 1,
        "backends": [fleet.backend_entry(150)],
        "models": [{"name": ALIAS, "routes": [{"backend": "llama-a"}]}],
        "retries": {"attempts": 0},
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        config[k] = v;
    }
    let envoy = Envoy::start(config).await.unwrap();
    (fleet, envoy)
}

/// What a client read: the bytes, and whether the transfer broke.
struct Read {
    bytes: Vec<u8>,
    broke: bool,
    first_byte: Option<Duration>,
}

async fn read(url: &str, path: &str, body: &Value, headers: &[(&str, &str)]) -> Read {
    let mut req = client()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let start = Instant::now();
    let resp = req.send().await.unwrap();
    let mut stream = resp.bytes_stream();
    let (mut bytes, mut broke, mut first_byte) = (Vec::new(), false, None);
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(b) => {
                first_byte.get_or_insert(start.elapsed());
                bytes.extend_from_slice(&b);
            }
            Err(_) => {
                broke = true;
                break;
            }
        }
    }
    Read {
        bytes,
        broke,
        first_byte,
    }
}

/// The request body for an API, streamed.
fn streamed(path: &str) -> Value {
    let messages = json!([{"role": "user", "content": "tell me a story"}]);
    match path {
        "/v1/completions" => json!({"model": ALIAS, "prompt": "Once", "stream": true}),
        "/v1/responses" => json!({"model": ALIAS, "input": "tell me a story", "stream": true}),
        "/v1/messages" => json!({"model": ALIAS, "max_tokens": 16, "messages": messages, "stream": true}),
        _ => json!({"model": ALIAS, "messages": messages, "stream": true}),
    }
}

/// The gateway's closing event for an API, written out independently of the filter's code.
fn closing(path: &str, message: &str, request_id: &str) -> String {
    match path {
        "/v1/messages" => format!(
            "event: error\ndata: {{\"error\":{{\"message\":\"{message}\",\"type\":\"api_error\"}},\"request_id\":\"{request_id}\",\"type\":\"error\"}}\n\n"
        ),
        "/v1/responses" => format!(
            "event: response.failed\ndata: {{\"response\":{{\"created_at\":0,\"error\":{{\"code\":\"server_error\",\"message\":\"{message}\"}},\"id\":\"resp_{request_id}\",\"incomplete_details\":null,\"object\":\"response\",\"output\":[],\"status\":\"failed\"}},\"sequence_number\":0,\"type\":\"response.failed\"}}\n\n"
        ),
        _ => format!(
            "data: {{\"error\":{{\"code\":null,\"message\":\"{message}\",\"param\":null,\"type\":\"server_error\"}}}}\n\n"
        ),
    }
}

const PATHS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
];
const NO_TERMINAL: &str = "The engine's stream ended without its final event.";
const UPSTREAM_ERROR: &str = "The engine reported an error mid-stream.";

/// The `/stats` name of the alias's token counter of `kind` on backend `llama-a`.
fn tokens(kind: &str) -> String {
    stat_name(
        names::TOKENS,
        &[("alias", ALIAS), ("backend", "llama-a"), ("kind", kind)],
    )
}

async fn counter(envoy: &Envoy, outcome: &str) -> u64 {
    envoy
        .stat(&stat_name(names::STREAM_OUTCOMES, &[("outcome", outcome)]))
        .await
        .unwrap_or(0)
}

/// Direct vs through Envoy for one fault; returns (direct, proxied) after checking the proxied stream ends
/// with exactly the expected closing bytes.
async fn compare(fleet: &Fleet, envoy: &Envoy, path: &str, fault: (&str, &str), tail: impl Fn(&str) -> String) {
    let engine = format!("http://{}", fleet.engines[0].addr());
    let request_id = format!("rid-{}", path.len());
    let headers = [fault, ("x-request-id", request_id.as_str())];
    // A reset between the two restarts the engine's ids and empties its cache, so both answers are identical.
    fleet.reset();
    let direct = read(&engine, path, &streamed(path), &headers).await;
    fleet.reset();
    let proxied = read(&envoy.url(""), path, &streamed(path), &headers).await;
    assert!(!direct.broke && !proxied.broke, "{path}: a clean end must stay clean");
    let want = String::from_utf8_lossy(&direct.bytes).to_string() + &tail(&request_id);
    assert_eq!(String::from_utf8_lossy(&proxied.bytes), want, "{path} with {fault:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_its_terminal_event_is_closed_with_an_error_in_each_dialect() {
    let (fleet, envoy) = one_engine(json!({})).await;
    for path in PATHS {
        compare(&fleet, &envoy, path, ("x-emu-no-terminal", "1"), |rid| {
            closing(path, NO_TERMINAL, rid)
        })
        .await;
    }
    assert_eq!(counter(&envoy, "missing_terminal").await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_error_event_is_relayed_then_closed_in_the_dialects_shape() {
    let (fleet, envoy) = one_engine(json!({})).await;
    for path in PATHS {
        compare(&fleet, &envoy, path, ("x-emu-error-after", "1"), |rid| {
            closing(path, UPSTREAM_ERROR, rid)
        })
        .await;
    }
    assert_eq!(counter(&envoy, "upstream_error").await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_streams_pass_byte_for_byte_with_any_line_ending_and_a_slow_trickle() {
    let (fleet, envoy) = one_engine(json!({})).await;
    for ending in ["lf", "crlf", "cr"] {
        for path in PATHS {
            compare(&fleet, &envoy, path, ("x-emu-line-ending", ending), |_| String::new()).await;
        }
    }
    compare(&fleet, &envoy, "/v1/messages", ("x-emu-trickle-ms", "5"), |_| {
        String::new()
    })
    .await;
    assert_eq!(counter(&envoy, "complete").await, 13);
    assert_eq!(counter(&envoy, "missing_terminal").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_trickle_of_one_byte_every_50_ms_arrives_byte_by_byte() {
    let (_fleet, envoy) = one_engine(json!({})).await;
    let resp = client()
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-emu-trickle-ms", "50")
        .body(streamed("/v1/chat/completions").to_string())
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let (mut got, mut frames) = (0usize, 0usize);
    let start = Instant::now();
    while got < 20 {
        got += stream.next().await.unwrap().unwrap().len();
        frames += 1;
    }
    // Twenty bytes spread over about a second, in many small pieces: nothing held them back.
    assert!(start.elapsed() >= Duration::from_millis(700), "{:?}", start.elapsed());
    assert!(frames >= 10, "{frames} frames for {got} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_delimited_streams_look_clean_and_are_repaired() {
    let (fleet, envoy) = one_engine(json!({})).await;
    let path = "/v1/chat/completions";
    let close = ("x-emu-close-delimited", "1");
    compare(&fleet, &envoy, path, close, |_| String::new()).await;
    let engine = format!("http://{}", fleet.engines[0].addr());
    let headers = [close, ("x-emu-cut-after", "1"), ("x-request-id", "rid-close")];
    fleet.reset();
    let direct = read(&engine, path, &streamed(path), &headers).await;
    fleet.reset();
    let proxied = read(&envoy.url(""), path, &streamed(path), &headers).await;
    let want = String::from_utf8_lossy(&direct.bytes).to_string() + &closing(path, NO_TERMINAL, "rid-close");
    assert_eq!(
        String::from_utf8_lossy(&proxied.bytes),
        want,
        "a FIN mid-stream looks clean and is repaired"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_end_inside_an_event_closes_that_event_first() {
    let (fleet, envoy) = one_engine(json!({})).await;
    compare(&fleet, &envoy, "/v1/messages", ("x-emu-end-mid", "1"), |rid| {
        format!("\nevent: ping\n\n{}", closing("/v1/messages", NO_TERMINAL, rid))
    })
    .await;
    compare(&fleet, &envoy, "/v1/chat/completions", ("x-emu-end-mid", "1"), |rid| {
        format!("\n\n{}", closing("/v1/chat/completions", NO_TERMINAL, rid))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_that_envoy_cannot_repair_are_counted() {
    let (_fleet, envoy) = one_engine(json!({})).await;
    for fault in [("x-emu-cut-mid", "1"), ("x-emu-cut-after", "1")] {
        let r = read(&envoy.url(""), "/v1/messages", &streamed("/v1/messages"), &[fault]).await;
        assert!(r.broke, "{fault:?}: the client must see a transport error");
    }
    let counted = wait_for(Duration::from_secs(3), || async {
        counter(&envoy, "upstream_cut").await == 2
    })
    .await;
    assert!(
        counted.is_some(),
        "upstream cuts counted: {}",
        counter(&envoy, "upstream_cut").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upstream_ends_in_the_gateways_timeout() {
    let (_fleet, envoy) = one_engine(json!({"limits": {"request_timeout_ms": 1000}})).await;
    let start = Instant::now();
    let r = read(
        &envoy.url(""),
        "/v1/chat/completions",
        &streamed("/v1/chat/completions"),
        &[("x-emu-stall", "1")],
    )
    .await;
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(r.broke || r.bytes.is_empty() || !String::from_utf8_lossy(&r.bytes).contains("[DONE]"));
    let counted = wait_for(Duration::from_secs(3), || async {
        counter(&envoy, "timeout").await == 1
    })
    .await;
    assert!(
        counted.is_some(),
        "timeout counted: {}",
        counter(&envoy, "timeout").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_is_counted_as_a_cancel() {
    let (_fleet, envoy) = one_engine(json!({})).await;
    let resp = client()
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-emu-chunk-delay-ms", "300")
        .header("x-emu-chunks", "10")
        .body(streamed("/v1/chat/completions").to_string())
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let _first = stream.next().await;
    drop(stream);
    let counted = wait_for(Duration::from_secs(5), || async {
        counter(&envoy, "client_cancel").await == 1
    })
    .await;
    assert!(
        counted.is_some(),
        "client cancel counted: {}",
        counter(&envoy, "client_cancel").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_event_arrives_about_as_fast_as_going_direct() {
    let (fleet, envoy) = one_engine(json!({})).await;
    let engine = format!("http://{}", fleet.engines[0].addr());
    let mut gaps = Vec::new();
    for _ in 0..5 {
        let headers = [("x-emu-chunk-delay-ms", "100")];
        let d = read(
            &engine,
            "/v1/chat/completions",
            &streamed("/v1/chat/completions"),
            &headers,
        )
        .await;
        let p = read(
            &envoy.url(""),
            "/v1/chat/completions",
            &streamed("/v1/chat/completions"),
            &headers,
        )
        .await;
        gaps.push(p.first_byte.unwrap().as_secs_f64() - d.first_byte.unwrap().as_secs_f64());
    }
    gaps.sort_by(f64::total_cmp);
    let median_ms = gaps[2] * 1000.0;
    eprintln!("first-event latency through Envoy minus direct, median of 5: {median_ms:.1} ms");
    assert!(median_ms < 25.0, "{median_ms} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streamed_upstream_error_is_relayed_unchanged() {
    let (fleet, envoy) = one_engine(json!({})).await;
    let engine = format!("http://{}", fleet.engines[0].addr());
    let body = json!({"model": ALIAS, "messages": [{"role": "user", "content": "x"}]});
    fleet.reset();
    let direct = read(&engine, "/v1/chat/completions", &body, &[("x-emu-status", "500")]).await;
    fleet.reset();
    let proxied = read(
        &envoy.url(""),
        "/v1/chat/completions",
        &body,
        &[("x-emu-status", "500")],
    )
    .await;
    assert_eq!(proxied.bytes, direct.bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_asks_for_usage_and_hides_the_extra_chunk_unless_the_client_asked() {
    let (fleet, envoy) = one_engine(json!({"usage": {"stream_include_usage": true}})).await;
    let path = "/v1/chat/completions";
    let r = read(&envoy.url(""), path, &streamed(path), &[]).await;
    let text = String::from_utf8_lossy(&r.bytes).to_string();
    let sent: Value = serde_json::from_slice(&fleet.engines[0].inference_requests()[0].body).unwrap();
    assert_eq!(
        sent["stream_options"]["include_usage"], true,
        "the gateway asked the engine for usage"
    );
    assert!(
        !text.contains("\"choices\":[]"),
        "the usage chunk the client did not ask for must go: {text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"));
    let mut asked = streamed(path);
    asked["stream_options"] = json!({"include_usage": true});
    let r = read(&envoy.url(""), path, &asked, &[]).await;
    assert!(
        String::from_utf8_lossy(&r.bytes).contains("\"choices\":[]"),
        "kept when the client asked for it"
    );
    let prompt = tokens("input");
    let counted = wait_for(Duration::from_secs(3), || async {
        envoy.stat(&prompt).await.unwrap_or(0) > 0
    })
    .await;
    assert!(counted.is_some(), "stream usage reached the backend's counters");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_chunk_that_arrives_in_pieces_is_still_hidden_whole() {
    // The engine sends every byte as its own body chunk, so the usage chunk reaches the filter across many
    // body callbacks. The client must get exactly the engine's stream without that one event.
    let (fleet, envoy) = one_engine(json!({"usage": {"stream_include_usage": true}})).await;
    let path = "/v1/chat/completions";
    let trickle = [("x-emu-trickle-ms", "1")];
    let mut with_usage = streamed(path);
    with_usage["stream_options"] = json!({"include_usage": true});
    fleet.reset();
    let direct = read(
        &format!("http://{}", fleet.engines[0].addr()),
        path,
        &with_usage,
        &trickle,
    )
    .await;
    let direct = String::from_utf8(direct.bytes).unwrap();
    let events: Vec<&str> = direct.split_inclusive("\n\n").collect();
    let usage_events = events.iter().filter(|e| e.contains("\"choices\":[]")).count();
    assert_eq!(usage_events, 1, "the engine sends one usage chunk: {direct}");
    let want: String = events.into_iter().filter(|e| !e.contains("\"choices\":[]")).collect();
    fleet.reset();
    let proxied = read(&envoy.url(""), path, &streamed(path), &trickle).await;
    assert!(!proxied.broke);
    assert_eq!(
        String::from_utf8_lossy(&proxied.bytes),
        want,
        "the split usage chunk must be removed whole, and nothing else"
    );
    let counted = wait_for(Duration::from_secs(3), || async {
        counter(&envoy, "complete").await == 1
    })
    .await;
    assert!(counted.is_some(), "the stream counts as complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_tokens_from_the_engine_show_up_in_the_backends_hit_rate() {
    let (_fleet, envoy) = one_engine(json!({})).await;
    let c = client();
    let body = chat(Some(&"You are a meticulous assistant. ".repeat(40)), "hi");
    for _ in 0..2 {
        let (status, _, _) = post(&c, &envoy, &body, &[]).await;
        assert_eq!(status, 200);
    }
    let counted = wait_for(Duration::from_secs(3), || async {
        envoy.stat(&tokens("cached")).await.unwrap_or(0) > 0
    })
    .await;
    assert!(counted.is_some(), "the repeat's cached tokens must be counted");
    let cached = envoy.stat(&tokens("cached")).await.unwrap_or(0);
    let input = envoy.stat(&tokens("input")).await.unwrap_or(0);
    let permille = cached * 1000 / input.max(1);
    assert!(
        permille > 300 && permille < 1000,
        "two identical prompts: about half the prompt tokens cached, got {permille}‰"
    );
}
