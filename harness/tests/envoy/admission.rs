//! Admission through the real filter in a real Envoy (`--concurrency 2`):
//! - the API-key matrix: which headers are accepted where, 401s with `WWW-Authenticate`, the envelope and the
//!   request id, open and closed endpoints, no refused request reaching an engine, no key value in Envoy's log,
//!   its stats or its config dump;
//! - a request limit is exact across both workers under 64 concurrent clients, and refused requests get 429 with
//!   `Retry-After`;
//! - a per-second bucket refills;
//! - token reservations settle on the usage each API reports, streamed and not; a cut stream keeps its
//!   reservation and a refused request reserves nothing;
//! - an overrun is a debt the budget carries (a truthful `Retry-After`), and `inject_max_tokens` tells the engine
//!   the bound;
//! - a key over its request limit is refused from its headers alone, and a key named in `auth.key_limits` has a
//!   budget of its own.

use std::time::{Duration, Instant};

use llmroute_core::envoy_contract::metrics::{KEY_REQUESTS, RATE_LIMITED, REJECTIONS, TOKENS};
use llmroute_harness::envoy::{Envoy, EnvoyOptions};
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::*;

const VAR: &str = "LLMROUTE_TEST_CLIENT_KEYS";

type Headers<'a> = Vec<(&'a str, &'a str)>;

/// Tokens unlike anything else in the test, so finding one anywhere means it leaked.
fn tokens() -> (String, String) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let pid = std::process::id();
    (format!("ka-{nanos:x}-{pid}-alpha"), format!("kb-{nanos:x}-{pid}-bravo"))
}

fn alias_config(fleet: &Fleet, limits: Option<Value>) -> Value {
    let mut model = json!({ "name": ALIAS, "routes": [{ "backend": fleet.backend, "upstream_model": UPSTREAM }] });
    if let Some(l) = limits {
        model["limits"] = l;
    }
    json!({ "version": 1, "backends": [fleet.backend_entry(150)], "models": [model], "debug_headers": true })
}

struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

async fn send(
    c: &reqwest::Client,
    envoy: &Envoy,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Reply {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = c.request(method, envoy.url(path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b.to_string());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.text().await.unwrap_or_default();
    Reply { status, headers, body }
}

fn assert_401(r: &Reply, anthropic: bool, what: &str) {
    assert_eq!(r.status, 401, "{what}: {}", r.body);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"), "{what}");
    let id = r.header("x-request-id").unwrap_or_default().to_string();
    assert!(!id.is_empty(), "{what}: no request id");
    let v = r.json();
    assert_eq!(v["request_id"], json!(id), "{what}: {}", r.body);
    if anthropic {
        assert_eq!(v["type"], "error", "{what}: {}", r.body);
        assert_eq!(v["error"]["type"], "authentication_error", "{what}: {}", r.body);
    } else {
        assert_eq!(v["error"]["code"], "invalid_api_key", "{what}: {}", r.body);
        assert_eq!(v["error"]["type"], "invalid_request_error", "{what}: {}", r.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_matrix_and_no_key_is_ever_written() {
    let fleet = Fleet::start("auth", 1).await.unwrap();
    let (ka, kb) = tokens();
    let mut cfg = alias_config(&fleet, None);
    cfg["auth"] = json!({ "keys_env": VAR });
    let logs = tempfile::tempdir().unwrap();
    let access = logs.path().join("access.json");
    cfg["access_log"] = json!({ "path": access.display().to_string() });
    let opts = EnvoyOptions {
        log_level: "debug".into(),
        env: vec![(VAR.to_string(), format!("alice:{ka},bob:{kb}"))],
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start_with(cfg, opts).await.unwrap();
    let c = client();
    let chat_body = chat(None, "auth");
    let msg_body = json!({"model": ALIAS, "max_tokens": 16, "messages": [{"role": "user", "content": "auth"}]});
    let (bearer_a, bearer_b) = (format!("Bearer {ka}"), format!("Bearer {kb}"));
    let lower_b = format!("bearer {kb}");
    let av = ("anthropic-version", "2023-06-01");

    // Refusals: none may reach the engine.
    let refused: Vec<(&str, &str, Headers, &Value, bool)> = vec![
        ("no credential", "/v1/chat/completions", vec![], &chat_body, false),
        (
            "wrong key",
            "/v1/chat/completions",
            vec![("authorization", "Bearer not-a-configured-key-123")],
            &chat_body,
            false,
        ),
        (
            "malformed scheme",
            "/v1/chat/completions",
            vec![("authorization", "Basic YWxpY2U6eA==")],
            &chat_body,
            false,
        ),
        (
            "bearer without token",
            "/v1/chat/completions",
            vec![("authorization", "Bearer ")],
            &chat_body,
            false,
        ),
        (
            "two authorization headers",
            "/v1/chat/completions",
            vec![
                ("authorization", bearer_a.as_str()),
                ("authorization", bearer_a.as_str()),
            ],
            &chat_body,
            false,
        ),
        ("no credential on messages", "/v1/messages", vec![av], &msg_body, true),
        (
            "wrong x-api-key on messages",
            "/v1/messages",
            vec![av, ("x-api-key", "not-a-configured-key-123")],
            &msg_body,
            true,
        ),
        (
            "wrong authorization wins over a right x-api-key",
            "/v1/messages",
            vec![
                av,
                ("authorization", "Bearer not-a-configured-key-123"),
                ("x-api-key", ka.as_str()),
            ],
            &msg_body,
            true,
        ),
    ];
    for (what, path, headers, body, anthropic) in &refused {
        let r = send(&c, &envoy, "POST", path, headers, Some(body)).await;
        assert_401(&r, *anthropic, what);
    }
    for (what, path) in [("models", "/v1/models"), ("status", "/llmroute/status")] {
        let r = send(&c, &envoy, "GET", path, &[], None).await;
        assert_401(&r, false, what);
    }
    assert_eq!(
        fleet.inference_counts(),
        vec![0],
        "a refused request reached the engine"
    );

    // Accepted.
    let ok: Vec<(&str, &str, Headers, &Value)> = vec![
        (
            "bearer",
            "/v1/chat/completions",
            vec![("authorization", bearer_a.as_str())],
            &chat_body,
        ),
        (
            "lower-case scheme",
            "/v1/chat/completions",
            vec![("authorization", lower_b.as_str())],
            &chat_body,
        ),
        (
            "x-api-key on messages",
            "/v1/messages",
            vec![av, ("x-api-key", kb.as_str())],
            &msg_body,
        ),
        (
            "x-api-key on chat",
            "/v1/chat/completions",
            vec![("x-api-key", ka.as_str())],
            &chat_body,
        ),
        (
            "authorization wins over a wrong x-api-key",
            "/v1/messages",
            vec![av, ("authorization", bearer_b.as_str()), ("x-api-key", "junk")],
            &msg_body,
        ),
    ];
    for (what, path, headers, body) in &ok {
        let r = send(&c, &envoy, "POST", path, headers, Some(body)).await;
        assert_eq!(r.status, 200, "{what}: {}", r.body);
    }
    assert_eq!(fleet.inference_counts(), vec![ok.len()]);
    // The engine never sees the client's credentials.
    for req in fleet.engines[0].inference_requests() {
        for h in ["authorization", "x-api-key"] {
            assert_eq!(req.header(h), None, "{h} reached the engine");
        }
    }
    for path in ["/v1/models", "/llmroute/status"] {
        let r = send(&c, &envoy, "GET", path, &[("authorization", bearer_a.as_str())], None).await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        // As the Anthropic SDK sends it.
        let r = send(&c, &envoy, "GET", path, &[av, ("x-api-key", kb.as_str())], None).await;
        assert_eq!(r.status, 200, "{path} with x-api-key: {}", r.body);
    }
    // Open endpoints need no key.
    let r = send(&c, &envoy, "GET", "/healthz", &[], None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = send(&c, &envoy, "GET", "/readyz", &[], None).await;
    assert_ne!(r.status, 401, "{}", r.body);

    // Refusals are counted by reason, and admitted requests by key name.
    let rejected = |reason: &str| stat_name(REJECTIONS, &[("reason", reason)]);
    assert!(envoy.stat(&rejected("api_key_missing")).await >= Some(3));
    assert!(envoy.stat(&rejected("api_key_malformed")).await >= Some(3));
    assert!(envoy.stat(&rejected("api_key_unknown")).await >= Some(3));
    let by_key = |key: &str| stat_name(KEY_REQUESTS, &[("key", key)]);
    assert_eq!(envoy.stat(&by_key("alice")).await, Some(2));
    assert_eq!(envoy.stat(&by_key("bob")).await, Some(3));

    // No key value anywhere Envoy writes or serves.
    tokio::time::sleep(Duration::from_millis(400)).await; // the launcher flushes Envoy's log every 100 ms
                                                          // At debug level Envoy's connection manager prints every request header itself, the client's own
                                                          // `authorization` included; that is Envoy's, not the filter's, and absent at the default level. The filter's
                                                          // lines (the `wasm` logger; `dynamic_modules` on the native build) must never hold a key.
    let log: String = envoy
        .log()
        .lines()
        .filter(|l| l.contains("[wasm]") || l.contains("[dynamic_modules]"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(log.contains("llmroute"), "the filter's log lines were not found");
    let stats = reqwest::get(envoy.admin_url("/stats"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prom = reqwest::get(envoy.admin_url("/stats/prometheus"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let dump = reqwest::get(envoy.admin_url("/config_dump"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let bootstrap = envoy.bootstrap_yaml();
    assert!(bootstrap.contains(VAR), "the VM must be given the variable's name");
    // The access log names the client by its key's name: on inference requests (those that name a model), alice
    // twice and bob three times; their `/v1/models` and status requests carry the name too.
    let read = || std::fs::read_to_string(&access).unwrap_or_default();
    let by_name = |text: &str, name: &str| {
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["llmroute.key"] == name && v["gen_ai.request.model"].is_string())
            .count()
    };
    let logged = wait_for(Duration::from_secs(15), || async {
        let text = read();
        by_name(&text, "alice") >= 2 && by_name(&text, "bob") >= 3
    })
    .await;
    let access_text = read();
    assert!(logged.is_some(), "access log:\n{access_text}");
    assert_eq!(
        (by_name(&access_text, "alice"), by_name(&access_text, "bob")),
        (2, 3),
        "{access_text}"
    );
    for (what, text) in [
        ("access log", &access_text),
        ("log", &log),
        ("stats", &stats),
        ("prometheus", &prom),
        ("config_dump", &dump),
        ("bootstrap", &bootstrap),
    ] {
        for secret in [&ka, &kb] {
            assert!(!text.contains(secret.as_str()), "a key value is in Envoy's {what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_refuses_to_start_without_the_keys_variable() {
    let fleet = Fleet::start("nokeys", 1).await.unwrap();
    let mut cfg = alias_config(&fleet, None);
    cfg["auth"] = json!({ "keys_env": "LLMROUTE_TEST_UNSET_KEYS_VAR" });
    let err = Envoy::start(cfg)
        .await
        .err()
        .expect("Envoy started without the keys variable");
    assert!(err.contains("LLMROUTE_TEST_UNSET_KEYS_VAR"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_limit_is_exact_across_workers_under_64_clients() {
    let fleet = Fleet::start("exact", 2).await.unwrap();
    let cfg = alias_config(&fleet, Some(json!({ "requests": "20-M" })));
    let envoy = Envoy::start(cfg).await.unwrap();
    let url = envoy.url("/v1/chat/completions");
    let body = chat(None, "exact").to_string();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (url, body) = (url.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            // One client each: separate connections, spread over Envoy's two workers.
            let c = client();
            let r = c
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let retry = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body: Value = r.json().await.unwrap_or(Value::Null);
            (status, retry, body)
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        let (status, retry, body) = t.await.unwrap();
        match status {
            200 => admitted += 1,
            429 => {
                let secs: u64 = retry.as_deref().and_then(|s| s.parse().ok()).unwrap_or(0);
                // 20 per minute refill one every 3 s.
                assert!((1..=3).contains(&secs), "Retry-After {retry:?}");
                assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
                assert_eq!(body["error"]["type"], "requests", "{body}");
            }
            s => panic!("status {s}: {body}"),
        }
    }
    assert_eq!(admitted, 20);
    assert_eq!(fleet.inference_counts().iter().sum::<usize>(), 20);
    let refused = envoy
        .stat(&stat_name(
            RATE_LIMITED,
            &[("alias", ALIAS), ("key", "none"), ("kind", "requests")],
        ))
        .await;
    assert_eq!(refused, Some(44));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_second_bucket_refills() {
    let fleet = Fleet::start("refill", 1).await.unwrap();
    let envoy = Envoy::start(alias_config(&fleet, Some(json!({ "requests": "2-S" }))))
        .await
        .unwrap();
    let c = client();
    let body = chat(None, "refill");
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(send(&c, &envoy, "POST", "/v1/chat/completions", &[], Some(&body)).await);
    }
    assert_eq!(statuses[0].status, 200);
    // The first two may straddle a refill; the bucket holds two, so at most one of three is refused.
    let refused: Vec<&Reply> = statuses.iter().filter(|r| r.status == 429).collect();
    assert!(refused.len() <= 1);
    if let Some(r) = refused.first() {
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    // Drain, then one token comes back after about 500 ms, not before.
    while send(&c, &envoy, "POST", "/v1/chat/completions", &[], Some(&body))
        .await
        .status
        == 200
    {}
    let back = wait_for(Duration::from_secs(3), || async {
        send(&c, &envoy, "POST", "/v1/chat/completions", &[], Some(&body))
            .await
            .status
            == 200
    })
    .await
    .expect("the bucket never refilled");
    assert!(back >= Duration::from_millis(300), "refilled after {back:?}");
}

/// One inference request of `api`, asking for at most `max` output tokens.
fn request_for(api: &str, stream: bool, max: u64) -> (&'static str, Value, Vec<(&'static str, &'static str)>) {
    let text = format!("settle {api} {stream}");
    match api {
        "chat" => (
            "/v1/chat/completions",
            json!({"model": ALIAS, "stream": stream, "max_tokens": max, "messages": [{"role": "user", "content": text}]}),
            vec![],
        ),
        "completions" => (
            "/v1/completions",
            json!({"model": ALIAS, "stream": stream, "max_tokens": max, "prompt": text}),
            vec![],
        ),
        "responses" => (
            "/v1/responses",
            json!({"model": ALIAS, "stream": stream, "max_output_tokens": max, "input": text}),
            vec![],
        ),
        _ => (
            "/v1/messages",
            json!({"model": ALIAS, "stream": stream, "max_tokens": max, "messages": [{"role": "user", "content": text}]}),
            vec![("anthropic-version", "2023-06-01")],
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_reservations_settle_on_reported_usage_for_every_api() {
    const BUDGET: u64 = 20_000;
    const MAX: u64 = 400;
    let fleet = Fleet::start("settle", 1).await.unwrap();
    let cfg = alias_config(&fleet, Some(json!({ "tokens": format!("{BUDGET}-D") })));
    let envoy = Envoy::start(cfg).await.unwrap();
    let c = client();
    let backend = fleet.backend.clone();
    let used_now = || {
        let envoy = &envoy;
        let backend = backend.clone();
        async move {
            let m = |kind: &str| stat_name(TOKENS, &[("alias", ALIAS), ("backend", &backend), ("kind", kind)]);
            envoy.stat(&m("input")).await.unwrap_or(0) + envoy.stat(&m("output")).await.unwrap_or(0)
        }
    };
    let outcomes = || async {
        let text = reqwest::get(envoy.admin_url("/stats?filter=llmroute_stream_"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter_map(|l| l.rsplit(": ").next()?.trim().parse::<u64>().ok())
            .sum::<u64>()
    };
    let start = Instant::now();
    // Whole tokens a `BUDGET`-per-day bucket may have refilled by now, plus one for rounding.
    let drift = || (start.elapsed().as_millis() as u64 * BUDGET).div_ceil(86_400_000) + 1;
    // What the engine reported so far, and what cut streams still hold.
    let mut used = 0u64;
    let mut held = 0u64;
    let check = |r: &Reply, used: u64, held: u64, what: &str, estimate: u64| {
        let left: u64 = r
            .header("x-llmroute-tokens-remaining")
            .and_then(|v| v.parse().ok())
            .expect("no remaining header");
        let expected = BUDGET - used - held - (estimate + MAX);
        let d = drift();
        assert!(
            (expected..=expected + d).contains(&left),
            "{what}: {left} tokens left, expected {expected} (+ up to {d} refilled)"
        );
    };
    let last_estimate = |f: &Fleet| -> u64 {
        let reqs = f.engines[0].inference_requests();
        reqs.last()
            .and_then(|r| r.header("x-input-tokens"))
            .and_then(|v| v.parse().ok())
            .expect("no estimate")
    };
    for api in ["chat", "completions", "responses", "messages"] {
        for stream in [false, true] {
            let what = format!("{api} stream={stream}");
            let (path, body, headers) = request_for(api, stream, MAX);
            let r = send(&c, &envoy, "POST", path, &headers, Some(&body)).await;
            assert_eq!(r.status, 200, "{what}: {}", r.body);
            check(&r, used, held, &what, last_estimate(&fleet));
            let before = used;
            wait_for(Duration::from_secs(5), || async { used_now().await > before })
                .await
                .unwrap_or_else(|| panic!("{what}: no usage counted"));
            used = used_now().await;
        }
    }
    // A refused request reserves nothing.
    let (path, body, headers) = request_for("chat", false, BUDGET * 2);
    let r = send(&c, &envoy, "POST", path, &headers, Some(&body)).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "tokens", "{}", r.body);
    assert!(r
        .header("retry-after")
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|s| s > 0));
    // A cut stream keeps its reservation.
    let outcomes_before = outcomes().await;
    let (path, body, _) = request_for("chat", true, MAX);
    let r = c
        .post(envoy.url(path))
        .header("content-type", "application/json")
        .header("x-emu-cut-after", "1")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.text().await;
    held += last_estimate(&fleet) + MAX;
    wait_for(Duration::from_secs(5), || async { outcomes().await > outcomes_before })
        .await
        .expect("the cut stream was never logged");
    let (path, body, headers) = request_for("chat", false, MAX);
    let r = send(&c, &envoy, "POST", path, &headers, Some(&body)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    check(
        &r,
        used,
        held,
        "after a refusal and a cut stream",
        last_estimate(&fleet),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overrun_is_a_debt_and_an_injected_bound_reaches_the_engine() {
    let fleet = Fleet::start("debt", 1).await.unwrap();
    let mut cfg = alias_config(&fleet, Some(json!({ "tokens": "1000-M", "default_max_tokens": 16 })));
    // A second alias on the same engines, whose budget writes the bound into requests that name none.
    let capped = json!({
        "name": "capped",
        "routes": [{ "backend": fleet.backend, "upstream_model": UPSTREAM }],
        "limits": { "tokens": "1000-M", "default_max_tokens": 16, "inject_max_tokens": true },
    });
    cfg["models"].as_array_mut().unwrap().push(capped);
    let envoy = Envoy::start(cfg).await.unwrap();
    let c = client();

    // No bound: 16 tokens reserved, and the engine generates 3000.
    let body = chat(None, "debt");
    let r = send(
        &c,
        &envoy,
        "POST",
        "/v1/chat/completions",
        &[("x-emu-chunks", "3000")],
        Some(&body),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 3000, "{}", r.body);
    // The overrun is carried: about 2000 tokens of debt at 1000 a minute, so the wait is about two minutes, not
    // the second or so a bucket emptied to zero would need for one more reservation.
    // Settlement runs when Envoy logs the request, which may come just after the client has the answer.
    let deadline = Instant::now() + Duration::from_secs(5);
    let r = loop {
        let r = send(&c, &envoy, "POST", "/v1/chat/completions", &[], Some(&body)).await;
        if r.status != 200 || Instant::now() > deadline {
            break r;
        }
    };
    assert_eq!(r.status, 429, "the debt was forgiven: {}", r.body);
    assert_eq!(r.json()["error"]["type"], "tokens", "{}", r.body);
    let retry: u64 = r.header("retry-after").and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(retry >= 100, "Retry-After {retry} s does not count the debt");

    // With `inject_max_tokens`, the engine is told the bound.
    let mut body = chat(None, "bounded");
    body["model"] = json!("capped");
    let r = send(&c, &envoy, "POST", "/v1/chat/completions", &[], Some(&body)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let seen = fleet.engines[0].inference_requests().pop().unwrap();
    let sent: Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(sent["max_tokens"], 16, "{sent}");
    assert_eq!(sent["messages"], body["messages"]);
}

/// Sends a request's head with `content-length` but none of its body; returns the response head, if one comes
/// within `wait`.
async fn head_only(envoy: &Envoy, head: &str, wait: Duration) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(envoy.listen).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(wait, read).await;
    (!got.is_empty()).then(|| String::from_utf8_lossy(&got).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_request_limit_is_refused_before_its_body_is_read_and_a_team_has_its_own() {
    let fleet = Fleet::start("key-early", 1).await.unwrap();
    let (ka, kb) = tokens();
    let mut cfg = alias_config(&fleet, None);
    // Every key gets 1 a minute, but bob's team has a budget of its own.
    cfg["auth"] = json!({
        "keys_env": VAR,
        "limits": { "requests": "1-M" },
        "key_limits": { "bob": { "requests": "3-M" } },
    });
    let opts = EnvoyOptions {
        env: vec![(VAR.to_string(), format!("alice:{ka},bob:{kb}"))],
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start_with(cfg, opts).await.unwrap();
    let c = client();
    let bearer = format!("Bearer {ka}");
    let body = chat(None, "early");
    let chat_as = |bearer: String| {
        let (c, envoy, body) = (&c, &envoy, &body);
        async move {
            let auth = [("authorization", bearer.as_str())];
            send(c, envoy, "POST", "/v1/chat/completions", &auth, Some(body)).await
        }
    };
    let r = chat_as(bearer.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // The next request announces a 100 KB body and sends none of it: the 429 comes from its headers alone.
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: {bearer}\r\n\
         Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    );
    let answer = head_only(&envoy, &head, Duration::from_secs(5)).await;
    let answer = answer.expect("no answer before the body: the request limit waited for it");
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("retry-after:"), "{answer}");
    assert_eq!(fleet.inference_counts(), vec![1]);
    for i in 0..3 {
        let r = chat_as(format!("Bearer {kb}")).await;
        assert_eq!(r.status, 200, "bob's request {i}: {}", r.body);
    }
    let r = chat_as(format!("Bearer {kb}")).await;
    assert_eq!(r.status, 429, "{}", r.body);
}
