//! The edge, through the real filter in Envoy: an ejection that health checks do not undo, Envoy's own errors in
//! the JSON envelopes, no upstream address on client responses, and bounds on slow and abusive clients
//! (slowloris on headers and on the body, many HTTP/2 streams, client `x-envoy-*` control headers).

use std::time::{Duration, Instant};

use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

/// A one-backend config for `fleet`, with `limits` and `extra` merged into the backend.
fn config(fleet: &Fleet, limits: Value, extra: Value) -> Value {
    let mut backend = fleet.backend_entry(150);
    backend["health"] = json!({"interval_ms": 300, "timeout_ms": 250, "unhealthy": 2, "healthy": 1});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        backend[k] = v;
    }
    json!({
        "version": 1,
        "backends": [backend],
        "models": [{"name": ALIAS, "routes": [{"backend": fleet.backend, "upstream_model": UPSTREAM}]}],
        "affinity": { "session_headers": ["x-session-id"] },
        "limits": limits,
    })
}

fn messages_body() -> Value {
    json!({"model": ALIAS, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
}

// `Reply` is the shared one (support.rs); the envelope check is this file's own.
impl Reply {
    /// Asserts the OpenAI or Anthropic envelope, the request id in header and body, and the stable code.
    fn assert_envelope(&self, anthropic: bool, code: &str) {
        let what = format!("{} {:?} {}", self.status, self.headers, self.text);
        assert_eq!(self.header("content-type"), Some("application/json"), "{what}");
        assert_eq!(self.header("x-llmroute-error"), Some(code), "{what}");
        let id = self.header("x-request-id").expect("x-request-id on the reply");
        assert!(!id.is_empty());
        assert_eq!(self.body["request_id"].as_str(), Some(id), "{what}");
        let message = if anthropic {
            // Anthropic SDKs read the request id from `request-id`.
            assert_eq!(self.header("request-id"), Some(id), "{what}");
            assert_eq!(self.body["type"], "error", "{what}");
            assert!(
                self.body["error"]["type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("_error") || t == "request_too_large"),
                "{what}"
            );
            &self.body["error"]["message"]
        } else {
            assert_eq!(self.body["error"]["code"], code, "{what}");
            assert!(self.body["error"]["type"].is_string(), "{what}");
            assert!(self.body["error"].get("param").is_some(), "{what}");
            &self.body["error"]["message"]
        };
        assert!(message.as_str().is_some_and(|m| !m.is_empty()), "{what}");
    }
}

async fn send(envoy: &Envoy, path: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
    post_json(&client(), envoy.url(path), body.to_string(), headers).await
}

// ---- Defect 1: an ejection holds while health checks pass ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejected_host_stays_out_while_its_health_checks_pass_and_returns_after_the_cool_down() {
    const EJECTION: Duration = Duration::from_millis(3000);
    let fleet = Fleet::start("llama-a", 3).await.unwrap();
    let outlier = json!({"outlier": {"consecutive_5xx": 3, "base_ejection_ms": 3000, "max_ejection_percent": 50}});
    let envoy = Envoy::start(config(&fleet, json!({}), outlier)).await.unwrap();
    all_healthy(&envoy, "llama-a", 3).await;
    let c = client();
    let pinned = [("x-session-id", "pinned")];
    let (status, backend, _) = post(&c, &envoy, &chat(None, "x"), &pinned).await;
    assert_eq!(status, 200);
    let owner = fleet.engines.iter().position(|e| e.name() == backend).unwrap();
    let addr = fleet.engines[owner].addr().to_string();
    // /health keeps answering 200 while every inference request fails.
    fleet.engines[owner].set_fault_status(Some(500));
    for _ in 0..3 {
        assert_eq!(post(&c, &envoy, &chat(None, "x"), &pinned).await.0, 500);
    }
    let ejected_at = Instant::now();
    wait_for(Duration::from_secs(2), || async {
        envoy
            .host_health("llama-a")
            .await
            .get(&addr)
            .is_some_and(|f| f.contains("failed_outlier_check"))
    })
    .await
    .expect("three consecutive 500s did not eject the host");
    // Several health-check intervals (300 ms) pass inside the cool-down; none may readmit the host.
    fleet.reset();
    let mut statuses = Vec::new();
    while ejected_at.elapsed() < EJECTION - Duration::from_millis(800) {
        for (i, key) in ["pinned", "a", "b", "c", "d", "e"].iter().enumerate() {
            let (status, _, _) = post(
                &c,
                &envoy,
                &chat(Some(&format!("tenant {i}")), "x"),
                &[("x-session-id", key)],
            )
            .await;
            statuses.push(status);
        }
    }
    let reached = fleet.engines[owner].inference_requests().len();
    assert!(
        statuses.len() >= 12,
        "too few requests inside the cool-down: {}",
        statuses.len()
    );
    assert_eq!(
        reached,
        0,
        "{reached} of {} requests reached the ejected host within its cool-down",
        statuses.len()
    );
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    // The engine recovers; the host is readmitted once the ejection time has passed, and only then.
    fleet.engines[owner].set_fault_status(None);
    wait_for(Duration::from_secs(6), || async {
        envoy
            .host_health("llama-a")
            .await
            .get(&addr)
            .is_some_and(|f| f == "healthy")
    })
    .await
    .expect("the host was never readmitted");
    let after = ejected_at.elapsed();
    assert!(
        after >= EJECTION - Duration::from_millis(300),
        "readmitted after {after:?}, inside the cool-down"
    );
    let (status, backend, _) = post(&c, &envoy, &chat(None, "x"), &pinned).await;
    assert_eq!((status, backend.as_str()), (200, fleet.engines[owner].name()));
}

// ---- Defect 2: Envoy's own errors in the JSON envelopes ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backend_answers_503_in_each_apis_envelope() {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let mut cfg = config(&fleet, json!({}), json!({}));
    drop(fleet); // the port is closed now: every connect fails
    cfg["retries"] = json!({"attempts": 1});
    let envoy = Envoy::start(cfg).await.unwrap();
    let r = send(
        &envoy,
        "/v1/chat/completions",
        &chat(None, "hi"),
        &[("x-request-id", "dead-1")],
    )
    .await;
    assert_eq!(r.status, 503, "{}", r.text);
    r.assert_envelope(false, "upstream_unavailable");
    assert_eq!(r.body["request_id"], "dead-1");
    assert!(!r.text.contains("upstream connect error"), "{}", r.text);
    let r = send(&envoy, "/v1/messages", &messages_body(), &[]).await;
    assert_eq!(r.status, 503, "{}", r.text);
    r.assert_envelope(true, "upstream_unavailable");
    assert_eq!(r.body["error"]["type"], "api_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_timeout_answers_504_in_the_envelope() {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let mut cfg = config(&fleet, json!({"request_timeout_ms": 700}), json!({}));
    cfg["retries"] = json!({"attempts": 0});
    let envoy = Envoy::start(cfg).await.unwrap();
    all_healthy(&envoy, "llama-a", 1).await;
    let slow = [("x-emu-delay-ms", "3000")];
    let r = send(&envoy, "/v1/chat/completions", &chat(None, "hi"), &slow).await;
    assert_eq!(r.status, 504, "{}", r.text);
    r.assert_envelope(false, "upstream_timeout");
    let r = send(&envoy, "/v1/messages", &messages_body(), &slow).await;
    assert_eq!(r.status, 504, "{}", r.text);
    r.assert_envelope(true, "upstream_timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_listener_buffer_and_a_shed_request_answer_in_the_envelope() {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    // The listener buffer is max_body_bytes + 1 MiB; send twice that.
    let cfg = config(&fleet, json!({"max_body_bytes": 1024}), json!({"max_inflight": 1}));
    let envoy = Envoy::start(cfg).await.unwrap();
    all_healthy(&envoy, "llama-a", 1).await;
    let big = chat(None, &"x".repeat(2 << 20));
    let r = send(&envoy, "/v1/chat/completions", &big, &[]).await;
    assert_eq!(r.status, 413, "{}", r.text);
    r.assert_envelope(false, "body_too_large");
    let mut big = messages_body();
    big["messages"][0]["content"] = json!("y".repeat(2 << 20));
    let r = send(&envoy, "/v1/messages", &big, &[]).await;
    assert_eq!(r.status, 413, "{}", r.text);
    r.assert_envelope(true, "body_too_large");
    // Circuit-breaker overflow: one request holds the only slot, the next is shed.
    let holder = {
        let url = envoy.url("/v1/chat/completions");
        tokio::spawn(async move {
            client()
                .post(url)
                .header("content-type", "application/json")
                .header("x-emu-delay-ms", "1500")
                .body(chat(None, "hold").to_string())
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    assert!(
        wait_for(Duration::from_secs(2), || async { fleet.engines[0].inflight() == 1 })
            .await
            .is_some()
    );
    let r = send(&envoy, "/v1/messages", &messages_body(), &[]).await;
    assert_eq!(r.status, 503, "{}", r.text);
    r.assert_envelope(true, "overloaded");
    assert_eq!(r.body["error"]["type"], "overloaded_error");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(holder.await.unwrap().unwrap(), 200);
}

/// Sends raw bytes on a fresh connection; returns what came back until the server closed (bounded).
async fn raw_exchange(envoy: &Envoy, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(envoy.listen).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn split_response(raw: &str) -> (u16, String, Value) {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (
        status,
        head.to_ascii_lowercase(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_http_request_gets_a_json_400_and_the_filters_own_replies_are_untouched() {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let envoy = Envoy::start(config(&fleet, json!({}), json!({}))).await.unwrap();
    let raw = raw_exchange(
        &envoy,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n",
    )
    .await;
    let (status, head, body) = split_response(&raw);
    assert_eq!(status, 400, "{raw}");
    assert!(head.contains("x-llmroute-error: bad_request"), "{raw}");
    assert!(head.contains("content-type: application/json"), "{raw}");
    assert_eq!(body["error"]["code"], "bad_request", "{raw}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{raw}");
    // The filter's own refusal keeps its body and code, and its 200s stay as they are.
    let r = send(
        &envoy,
        "/v1/chat/completions",
        &json!({"model": "nope", "messages": []}),
        &[],
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text);
    r.assert_envelope(false, "model_not_found");
    assert!(
        r.body["error"]["message"].as_str().unwrap().contains("nope"),
        "{}",
        r.text
    );
    let models = get_json(&client(), envoy.url("/v1/models"), &[]).await;
    assert_eq!(models.status, 200);
    assert_eq!(models.body["data"][0]["id"], ALIAS, "{}", models.text);
    assert_eq!(models.header("x-llmroute-error"), None);
}

// ---- Defect 3: no upstream address for clients ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_response_names_the_upstream_host_unless_debug_headers_are_on() {
    let a = Fleet::start("llama-a", 2).await.unwrap();
    let b = Fleet::start("rr-b", 1).await.unwrap();
    let mut rr = b.backend_entry(150);
    rr["lb"] = json!("round_robin");
    rr.as_object_mut().unwrap().remove("balance_factor");
    let base = json!({
        "version": 1,
        "backends": [a.backend_entry(150), rr],
        "models": [
            {"name": ALIAS, "routes": [{"backend": "llama-a", "upstream_model": UPSTREAM}]},
            {"name": "embedder", "endpoints": ["embeddings"], "routes": [{"backend": "llama-a"}]},
            {"name": "rr", "routes": [{"backend": "rr-b"}]},
            {"name": "fo", "routes": [{"backend": "llama-a", "priority": 1}, {"backend": "rr-b", "priority": 2}]},
        ],
        "affinity": {"placement": "bounded_keys"},
    });
    let requests: Vec<(&str, &str, Value)> = vec![
        ("pinned chat", "/v1/chat/completions", chat(Some("a tenant"), "hi")),
        (
            "embeddings",
            "/v1/embeddings",
            json!({"model": "embedder", "input": "hello"}),
        ),
        (
            "round robin",
            "/v1/chat/completions",
            json!({"model": "rr", "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "failover alias",
            "/v1/chat/completions",
            json!({"model": "fo", "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "empty prompt",
            "/v1/chat/completions",
            json!({"model": ALIAS, "messages": [{"role": "user", "content": ""}]}),
        ),
    ];
    for debug in [false, true] {
        let mut cfg = base.clone();
        cfg["debug_headers"] = json!(debug);
        let envoy = Envoy::start(cfg).await.unwrap();
        all_healthy(&envoy, "llama-a", 2).await;
        all_healthy(&envoy, "rr-b", 1).await;
        for (what, path, body) in &requests {
            let r = send(&envoy, path, body, &[]).await;
            assert_eq!(r.status, 200, "{what}: {}", r.text);
            assert!(r.header("x-emu-backend").is_some(), "{what} was not routed");
            let endpoint = r.header("x-llmroute-endpoint");
            if debug {
                if *what != "pinned chat" {
                    assert!(endpoint.is_some(), "{what}: debug_headers should show the endpoint");
                }
            } else {
                assert_eq!(endpoint, None, "{what} leaked the upstream address");
            }
        }
        let models = get_json(&client(), envoy.url("/v1/models"), &[]).await;
        assert_eq!(models.header("x-llmroute-endpoint"), None);
    }
}

// ---- Defect 6: slow and abusive clients ----

/// Writes `head`, then one `piece` every `every` until the server closes the connection or `limit` passes.
/// Returns how long the server took to close, and what it answered.
async fn trickle(
    envoy: &Envoy,
    head: &[u8],
    piece: &[u8],
    every: Duration,
    limit: Duration,
) -> (Option<Duration>, String) {
    let start = Instant::now();
    let s = TcpStream::connect(envoy.listen).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    wr.write_all(head).await.unwrap();
    let reader = tokio::spawn(async move {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return (start.elapsed(), out),
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    });
    while start.elapsed() < limit && !reader.is_finished() {
        tokio::time::sleep(every).await;
        if wr.write_all(piece).await.is_err() {
            break;
        }
    }
    let closed = tokio::time::timeout(Duration::from_secs(2), reader).await;
    match closed {
        Ok(Ok((at, out))) => (Some(at), String::from_utf8_lossy(&out).into_owned()),
        _ => (None, String::new()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_its_headers_is_cut_at_the_headers_timeout() {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let limits = json!({"headers_timeout_ms": 1500, "body_timeout_ms": 20000, "stream_idle_timeout_ms": 20000});
    let envoy = Envoy::start(config(&fleet, limits, json!({}))).await.unwrap();
    // One header line every 200 ms: the headers would take 15 s to finish.
    let (closed, answer) = trickle(
        &envoy,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",
        b"x-pad: y\r\n",
        Duration::from_millis(200),
        Duration::from_secs(15),
    )
    .await;
    let closed = closed.expect("the connection was never cut");
    assert!(
        closed >= Duration::from_millis(1400) && closed < Duration::from_millis(4000),
        "cut after {closed:?}, expected about 1.5 s: {answer}"
    );
    let (status, _, body) = split_response(&answer);
    if status != 0 {
        assert_eq!(status, 408, "{answer}");
        assert_eq!(body["error"]["code"], "request_timeout", "{answer}");
    }
    assert_eq!(fleet.engines[0].inference_requests().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_its_body_gets_a_json_408_but_a_long_generation_is_not_cut() {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let limits = json!({"headers_timeout_ms": 1000, "body_timeout_ms": 2000, "stream_idle_timeout_ms": 20000});
    let envoy = Envoy::start(config(&fleet, limits, json!({}))).await.unwrap();
    all_healthy(&envoy, "llama-a", 1).await;
    // One body byte every 100 ms of a 1000-byte body: it would take 100 s.
    let (closed, answer) = trickle(
        &envoy,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
        b" ",
        Duration::from_millis(100),
        Duration::from_secs(15),
    )
    .await;
    let closed = closed.expect("the connection was never cut");
    assert!(
        closed >= Duration::from_millis(1900) && closed < Duration::from_millis(4500),
        "cut after {closed:?}, expected about 2 s: {answer}"
    );
    let (status, head, body) = split_response(&answer);
    assert_eq!(status, 408, "{answer}");
    assert!(head.contains("x-llmroute-error: request_timeout"), "{answer}");
    assert_eq!(body["error"]["code"], "request_timeout", "{answer}");
    assert_eq!(fleet.engines[0].inference_requests().len(), 0);
    // The body timeout stops counting once the request is in: a 3 s answer to a prompt sent at once is fine.
    let (status, backend, _) = post(&client(), &envoy, &chat(None, "hi"), &[("x-emu-delay-ms", "3000")]).await;
    assert_eq!((status, backend.as_str()), (200, fleet.engines[0].name()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_http2_connection_gets_at_most_max_concurrent_streams_at_once() {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let envoy = Envoy::start(config(
        &fleet,
        json!({"max_concurrent_streams": 4}),
        json!({"max_inflight": 256}),
    ))
    .await
    .unwrap();
    all_healthy(&envoy, "llama-a", 1).await;
    let tcp = TcpStream::connect(envoy.listen).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = |delay: &str| {
        hyper::Request::post(envoy.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-emu-delay-ms", delay)
            .body(Full::new(bytes::Bytes::from(chat(None, "hi").to_string())))
            .unwrap()
    };
    // A first exchange, so the client has Envoy's SETTINGS before it opens the crowd.
    let first = sender.clone().send_request(request("0")).await.unwrap();
    assert_eq!(first.status(), 200);
    let mut crowd = Vec::new();
    for _ in 0..16 {
        let mut s = sender.clone();
        let req = request("300");
        crowd.push(tokio::spawn(async move {
            let resp = s.send_request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            resp.into_body().collect().await.map_err(|e| e.to_string())?;
            Ok::<u16, String>(status)
        }));
    }
    for h in crowd {
        assert_eq!(h.await.unwrap(), Ok(200));
    }
    let peak = fleet.engines[0].max_inflight();
    assert!(peak <= 4, "{peak} streams of one connection were in flight at once");
    assert!(peak >= 2, "the streams did not overlap at all ({peak})");
    // The server is still healthy for everyone else.
    let (status, _, _) = post(&client(), &envoy, &chat(None, "after"), &[]).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_x_envoy_control_headers_are_not_honoured() {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let mut cfg = config(&fleet, json!({}), json!({}));
    cfg["retries"] = json!({"attempts": 0});
    let envoy = Envoy::start(cfg).await.unwrap();
    all_healthy(&envoy, "llama-a", 1).await;
    let c = client();
    // A client timeout of 50 ms would turn a 600 ms answer into a 504.
    let (status, _, _) = post(
        &c,
        &envoy,
        &chat(None, "hi"),
        &[("x-envoy-upstream-rq-timeout-ms", "50"), ("x-emu-delay-ms", "600")],
    )
    .await;
    assert_eq!(status, 200, "x-envoy-upstream-rq-timeout-ms was honoured");
    // A client retry policy would send a 500 three more times.
    fleet.reset();
    let (status, _, _) = post(
        &c,
        &envoy,
        &chat(None, "hi"),
        &[
            ("x-envoy-retry-on", "5xx"),
            ("x-envoy-max-retries", "3"),
            ("x-emu-status", "500"),
        ],
    )
    .await;
    assert_eq!(status, 500);
    assert_eq!(
        fleet.engines[0].inference_requests().len(),
        1,
        "x-envoy-retry-on was honoured"
    );
}
