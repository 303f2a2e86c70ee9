//! Parity with the NVCF gateway seed (issue 20), through the real filter in a real Envoy:
//! - the gateway's control headers (`x-max-wait-ms`, `x-request-slo-ms`, `x-cache-affinity-key`) are stripped
//!   from clients, and `x-cache-affinity-key` goes upstream as the hash of the explicit session key;
//! - `/v1/messages` behaves like the real Anthropic API: `request-id` on every response (answers, the filter's
//!   refusals, Envoy's own local replies), `request_id` in every error body, backend errors in the Anthropic
//!   envelope, and `extra_headers` body members cut before the engine. OpenAI routes relay backend errors as is.

use llmroute_core::affinity::{self, AffinitySource};
use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::{single_backend_config, Fleet};
use serde_json::{json, Value};

use llmroute_core::models;

use crate::support::{self, chat, client, h2_client, ALIAS, UPSTREAM};

/// Long enough for health checks to flip a host and the filter's status poll to see it, on a loaded machine.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(30);

async fn one_engine() -> (Fleet, Envoy) {
    let fleet = Fleet::start("nvcf", 1).await.unwrap();
    let envoy = Envoy::start(single_backend_config(&fleet, ALIAS, UPSTREAM, 150))
        .await
        .unwrap();
    (fleet, envoy)
}

/// Fails with Envoy's log when `cond` does not hold.
fn check(envoy: &Envoy, cond: bool, what: &str) {
    if !cond {
        eprintln!("{}", envoy.log());
        panic!("{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_headers_are_the_gateways_and_the_session_hash_goes_upstream() {
    let (fleet, envoy) = one_engine().await;
    let forged = [
        ("x-max-wait-ms", "1234567"),
        ("x-request-slo-ms", "7654321"),
        ("x-cache-affinity-key", "client-chosen-key"),
    ];
    for c in [client(), h2_client()] {
        // With an explicit session key: its hash, never the raw value, replaces the client's copy.
        let mut req = c
            .post(envoy.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-session-id", "sess-nvcf-42")
            .body(chat(Some("sys"), "hello").to_string());
        for (k, v) in forged {
            req = req.header(k, v);
        }
        let resp = req.send().await.unwrap();
        check(&envoy, resp.status() == 200, "session request failed");
        // Without one (the key comes from the system prompt): no cache key at all upstream.
        let mut req = c
            .post(envoy.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(chat(Some("sys"), "hello").to_string());
        for (k, v) in forged {
            req = req.header(k, v);
        }
        let resp = req.send().await.unwrap();
        check(&envoy, resp.status() == 200, "content-keyed request failed");
    }
    let got = fleet.engines[0].chat_requests();
    assert_eq!(got.len(), 4);
    let want = affinity::explicit(b"sess-nvcf-42", AffinitySource::SessionHeader).header_value();
    assert_eq!(want.len(), 16);
    for (i, r) in got.iter().enumerate() {
        for (k, v) in forged {
            assert!(
                !r.headers.iter().any(|(_, value)| value == v),
                "request {i}: the client's {k} value reached the engine: {:?}",
                r.headers
            );
        }
        assert_eq!(r.header("x-max-wait-ms"), None, "request {i}");
        assert_eq!(r.header("x-request-slo-ms"), None, "request {i}");
        let keys: Vec<&str> = r
            .headers
            .iter()
            .filter(|(k, _)| k == "x-cache-affinity-key")
            .map(|(_, v)| v.as_str())
            .collect();
        if i % 2 == 0 {
            assert_eq!(keys, vec![want.as_str()], "request {i}: the session's hash, once");
            assert_eq!(r.header("x-llmroute-affinity"), Some(want.as_str()), "request {i}");
        } else {
            assert!(keys.is_empty(), "request {i}: no explicit key, no cache key: {keys:?}");
        }
    }
}

fn messages_body(model: &str) -> Value {
    json!({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
}

/// Posts to `/v1/messages`; returns status, `request-id`, `x-request-id` and the body.
async fn post_messages(
    c: &reqwest::Client,
    envoy: &Envoy,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, Option<String>, Value) {
    let mut req = c
        .post(envoy.url("/v1/messages"))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let h = |n: &str| resp.headers().get(n).map(|v| v.to_str().unwrap().to_string());
    let (status, rid, xrid) = (resp.status().as_u16(), h("request-id"), h("x-request-id"));
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, rid, xrid, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_carry_request_id_on_answers_and_refusals() {
    let (_fleet, envoy) = one_engine().await;
    for c in [client(), h2_client()] {
        // An answer: the client's own id, in request-id.
        let body = messages_body(ALIAS).to_string();
        let (status, rid, _, answer) = post_messages(&c, &envoy, &body, &[("x-request-id", "nvcf-answer-1")]).await;
        check(&envoy, status == 200, &format!("answer: {status} {answer}"));
        assert_eq!(rid.as_deref(), Some("nvcf-answer-1"));
        // An id the gateway makes up is the one in both headers.
        let (_, rid, xrid, _) = post_messages(&c, &envoy, &body, &[]).await;
        assert!(rid.is_some() && rid == xrid, "{rid:?} {xrid:?}");
        // The filter's own refusals: unknown model (404) and invalid JSON (400).
        for (bad, want_status, want_type) in [
            (messages_body("no-such-model").to_string(), 404, "not_found_error"),
            ("{not json".to_string(), 400, "invalid_request_error"),
        ] {
            let (status, rid, xrid, body) = post_messages(&c, &envoy, &bad, &[]).await;
            assert_eq!(status, want_status, "{body}");
            assert!(rid.is_some() && rid == xrid, "{rid:?} {xrid:?}");
            assert_eq!(body["type"], "error", "{body}");
            assert_eq!(body["error"]["type"], want_type, "{body}");
            assert_eq!(body["request_id"].as_str(), rid.as_deref(), "{body}");
        }
    }
    // OpenAI routes do not get the Anthropic header.
    let resp = client()
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat(None, "hi").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("request-id").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_own_replies_on_messages_carry_request_id() {
    let (fleet, envoy) = one_engine().await;
    drop(fleet); // the only engine is gone: Envoy answers 503 itself
    let body = messages_body(ALIAS).to_string();
    let (status, rid, _, reply) = post_messages(&client(), &envoy, &body, &[("x-request-id", "nvcf-dead-1")]).await;
    check(&envoy, status == 503, &format!("{status} {reply}"));
    assert_eq!(rid.as_deref(), Some("nvcf-dead-1"), "{reply}");
    assert_eq!(reply["type"], "error", "{reply}");
    assert_eq!(reply["request_id"], "nvcf-dead-1", "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_errors_on_messages_take_the_anthropic_envelope() {
    let (_fleet, envoy) = one_engine().await;
    let body = messages_body(ALIAS).to_string();
    // (status, shape the engine answers in, Anthropic type, message)
    let cases = [
        (400, "", "invalid_request_error", "emulated failure with status 400"),
        (
            429,
            "anthropic-with-id",
            "rate_limit_error",
            "emulated failure with status 429",
        ),
        (404, "openai", "not_found_error", "emulated failure with status 404"),
        (
            422,
            "fastapi",
            "invalid_request_error",
            "body.max_tokens: Field required",
        ),
        (500, "openai", "api_error", "emulated failure with status 500"),
    ];
    for c in [client(), h2_client()] {
        for (code, shape, kind, message) in cases {
            let code_text = code.to_string();
            let id = format!("nvcf-err-{code}");
            let mut hdrs = vec![("x-emu-status", code_text.as_str()), ("x-request-id", id.as_str())];
            if !shape.is_empty() {
                hdrs.push(("x-emu-error-shape", shape));
            }
            let (status, rid, _, reply) = post_messages(&c, &envoy, &body, &hdrs).await;
            check(&envoy, status == code, &format!("{code} {shape}: {status} {reply}"));
            assert_eq!(rid.as_deref(), Some(id.as_str()), "{code} {shape}");
            assert_eq!(
                reply,
                json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": id}),
                "{code} {shape}"
            );
        }
    }
    // OpenAI routes relay a backend error byte for byte.
    let resp = client()
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-emu-status", "422")
        .header("x-emu-error-shape", "fastapi")
        .body(chat(None, "hi").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
    let text = resp.text().await.unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"detail": [{"type": "missing", "loc": ["body", "max_tokens"], "msg": "Field required", "input": null}]})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_headers_members_never_reach_the_engine() {
    let (fleet, envoy) = one_engine().await;
    let sent = format!(
        r#"{{"extra_headers":{{"x-a":"1"}}, "model":"{ALIAS}","Extra-Headers":[],"max_tokens":16,"EXTRA_HEADERS":null,"messages":[{{"role":"user","content":"hi","extra_headers":"kept"}}] , "extra-headers":2}}"#
    );
    let want = format!(
        r#"{{"model":"{UPSTREAM}","max_tokens":16,"messages":[{{"role":"user","content":"hi","extra_headers":"kept"}}]}}"#
    );
    for c in [client(), h2_client()] {
        let (status, _, _, reply) = post_messages(&c, &envoy, &sent, &[]).await;
        check(&envoy, status == 200, &format!("{status} {reply}"));
    }
    // Chat is left as sent: only `model` changes.
    let chat_sent =
        format!(r#"{{"model":"{ALIAS}","extra_headers":{{"a":"b"}},"messages":[{{"role":"user","content":"x"}}]}}"#);
    let resp = client()
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat_sent.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got = fleet.engines[0].inference_requests();
    assert_eq!(got.len(), 3);
    for r in &got[..2] {
        assert_eq!(String::from_utf8_lossy(&r.body), want);
        assert_eq!(r.header("content-length"), Some(want.len().to_string().as_str()));
    }
    assert_eq!(
        String::from_utf8_lossy(&got[2].body),
        chat_sent.replacen(ALIAS, UPSTREAM, 1)
    );
}

// ---- Item 1: decision-model routes ----

const DECIDER: &str = "decider";
const DECIDER_UPSTREAM: &str = "org/decider-v2";

/// `decider` serves both decision routes; `local-chat` serves the default set (not the decision routes).
async fn decision_fleet() -> (Fleet, Envoy) {
    let fleet = Fleet::start("nvcf-d", 1).await.unwrap();
    let mut cfg = single_backend_config(&fleet, ALIAS, UPSTREAM, 150);
    cfg["models"].as_array_mut().unwrap().push(json!({
        "name": DECIDER,
        "endpoints": ["decisions", "systemone"],
        "routes": [{"backend": fleet.backend, "upstream_model": DECIDER_UPSTREAM}],
    }));
    let envoy = Envoy::start(cfg).await.unwrap();
    (fleet, envoy)
}

async fn post_raw(c: &reqwest::Client, envoy: &Envoy, path: &str, body: &str) -> (u16, Option<String>, Value) {
    let resp = c
        .post(envoy.url(path))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let rid = resp
        .headers()
        .get("x-request-id")
        .map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    (status, rid, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decision_routes_rewrite_only_model_and_forward_every_other_byte() {
    let (fleet, envoy) = decision_fleet().await;
    // `stream` is not read: a duplicated, non-boolean `stream` goes through untouched, and so do odd fields.
    let sent = format!(
        r#"{{ "input" : {{"features":[1,2.50,-3e2], "images":["data:image/png;base64,iVBORw0KGgo="]}},"stream":"yes","STREAM":[true],
  "model":"{DECIDER}", "max_tokens":"many", "prompt_cache_key":"" , "extra_headers":{{"a":1}}}}"#
    );
    let want = sent.replacen(&format!("\"{DECIDER}\""), &format!("\"{DECIDER_UPSTREAM}\""), 1);
    for c in [client(), h2_client()] {
        for path in ["/v1/decisions", "/v1/systemone"] {
            let (status, _, answer) = post_raw(&c, &envoy, path, &sent).await;
            check(&envoy, status == 200, &format!("{path}: {status} {answer}"));
            assert_eq!(answer["model"], DECIDER_UPSTREAM, "{path}");
        }
    }
    let got: Vec<_> = fleet.engines[0]
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(got.len(), 4);
    for r in &got {
        assert_eq!(String::from_utf8_lossy(&r.body), want, "{}", r.path);
        assert_eq!(r.header("content-length"), Some(want.len().to_string().as_str()));
        // One image (the `images` element) at the default 768 tokens, its base64 not counted, plus the text.
        let tokens: u64 = r.header("x-input-tokens").unwrap().parse().unwrap();
        assert_eq!(tokens, llmroute_core::estimate::input_tokens(sent.as_bytes(), 768));
        assert!((768..768 + 40).contains(&tokens), "{tokens}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decision_routes_refuse_in_their_own_shape() {
    let (fleet, envoy) = decision_fleet().await;
    let deep = format!(r#"{{"model":"{DECIDER}","x":{}1{}}}"#, "[".repeat(70), "]".repeat(70));
    let cases = [
        (r#"{"input":1}"#.to_string(), 400, "missing_field"),
        (r#"{"model":7}"#.to_string(), 400, "invalid_field"),
        (
            format!(r#"{{"model":"{DECIDER}","Model":"{DECIDER}"}}"#),
            400,
            "duplicate_field",
        ),
        (deep, 400, "json_too_deep"),
        (r#"{"model":"nope"}"#.to_string(), 404, "model_not_found"),
        // An alias whose endpoints do not list the route: no default-allow.
        (format!(r#"{{"model":"{ALIAS}"}}"#), 404, "endpoint_not_served"),
    ];
    for c in [client(), h2_client()] {
        for (body, want_status, code) in &cases {
            // OpenAI Decisions: the OpenAI envelope.
            let (status, rid, e) = post_raw(&c, &envoy, "/v1/decisions", body).await;
            assert_eq!(
                (status, e["error"]["code"].as_str()),
                (*want_status, Some(*code)),
                "{body}: {e}"
            );
            assert!(
                e["error"]["type"].is_string() && e["error"]["message"].is_string(),
                "{e}"
            );
            assert_eq!(e["request_id"].as_str(), rid.as_deref());
            // System One: {"error":{"code","message","request_id"},"request_id"}, both ids the header's.
            let (status, rid, e) = post_raw(&c, &envoy, "/v1/systemone", body).await;
            assert_eq!(status, *want_status, "{body}: {e}");
            let rid = rid.expect("x-request-id");
            let message = e["error"]["message"].clone();
            assert!(message.as_str().is_some_and(|m| !m.is_empty()), "{e}");
            assert_eq!(
                e,
                json!({"error": {"code": code, "message": message, "request_id": rid}, "request_id": rid}),
                "{body}"
            );
        }
    }
    assert!(
        fleet.engines[0].requests().iter().all(|r| r.method != "POST"),
        "no refused request reaches the engine"
    );
}

// ---- Item 5: models that are down ----

async fn get_json(
    c: &reqwest::Client,
    envoy: &Envoy,
    path: &str,
    anthropic: bool,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = c.get(envoy.url(path));
    if anthropic {
        req = req.header("anthropic-version", "2023-06-01");
    }
    let resp = req.send().await.unwrap();
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    (status, headers, resp.json().await.unwrap_or(Value::Null))
}

fn listed<'v>(list: &'v Value, id: &str) -> &'v Value {
    list["data"]
        .as_array()
        .and_then(|d| d.iter().find(|m| m["id"] == id))
        .unwrap_or_else(|| panic!("{id} is not listed: {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_with_no_healthy_route_is_marked_and_answers_503() {
    let up = Fleet::start("nvcf-up", 1).await.unwrap();
    let down = Fleet::start("nvcf-down", 1).await.unwrap();
    let cfg = json!({
        "version": 1,
        "backends": [up.backend_entry(150), down.backend_entry(150)],
        "models": [
            { "name": "up-chat", "routes": [{ "backend": up.backend }] },
            { "name": "down-msgs", "endpoints": ["messages"], "routes": [{ "backend": down.backend }] },
        ],
    });
    let envoy = Envoy::start(cfg).await.unwrap();
    let c = client();
    let state = |list: &Value, id: &str| listed(list, id)["status"].as_str().unwrap_or_default().to_string();
    let settled = |want: &'static str| {
        let (c, envoy) = (&c, &envoy);
        async move {
            let (_, _, list) = get_json(c, envoy, "/v1/models", false).await;
            state(&list, "up-chat") == "available" && state(&list, "down-msgs") == want
        }
    };
    check(
        &envoy,
        support::wait_for(SETTLE, || settled("available")).await.is_some(),
        "never available",
    );
    down.engines[0].set_health_status(503);
    check(
        &envoy,
        support::wait_for(SETTLE, || settled("unavailable")).await.is_some(),
        "never unavailable",
    );

    for anthropic in [false, true] {
        let (_, _, list) = get_json(&c, &envoy, "/v1/models", anthropic).await;
        assert_eq!(
            listed(&list, "down-msgs")["supported_endpoints"],
            json!(["messages"]),
            "{list}"
        );
        assert_eq!(
            listed(&list, "up-chat")["supported_endpoints"],
            json!(["chat", "completions", "responses", "embeddings", "messages"])
        );
        let (status, h, body) = get_json(&c, &envoy, "/v1/models/down-msgs", anthropic).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(
            h.get("retry-after").and_then(|v| v.to_str().ok()),
            Some(models::RETRY_AFTER_S)
        );
        let rid = h.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap();
        assert_eq!(body["request_id"], rid);
        if anthropic {
            assert_eq!(
                (body["type"].as_str(), body["error"]["type"].as_str()),
                (Some("error"), Some("api_error"))
            );
            assert_eq!(h.get("request-id").and_then(|v| v.to_str().ok()), Some(rid));
        } else {
            assert_eq!(body["error"]["code"], "model_unavailable", "{body}");
        }
        let (status, _, body) = get_json(&c, &envoy, "/v1/models/up-chat", anthropic).await;
        assert_eq!((status, body["status"].as_str()), (200, Some("available")), "{body}");
    }

    // Back up: 200 again.
    down.engines[0].set_health_status(200);
    check(
        &envoy,
        support::wait_for(SETTLE, || settled("available")).await.is_some(),
        "never back",
    );
    let (status, _, body) = get_json(&c, &envoy, "/v1/models/down-msgs", false).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("available")), "{body}");
}

// ---- Item 4: identity upstream, compression toward clients ----

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes).read_to_end(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_are_asked_for_identity_and_clients_that_accept_gzip_get_it() {
    for compress in [false, true] {
        let fleet = Fleet::start("nvcf-gz", 1).await.unwrap();
        let mut cfg = single_backend_config(&fleet, ALIAS, UPSTREAM, 150);
        cfg["compress_responses"] = json!(compress);
        let envoy = Envoy::start(cfg).await.unwrap();
        let c = client();
        // A long enough answer to pass the compressor's minimum, plain and streamed.
        for stream in [false, true] {
            let mut body = chat(None, "hello");
            body["stream"] = json!(stream);
            let resp = c
                .post(envoy.url("/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("accept-encoding", "gzip")
                .header("x-emu-chunks", "40")
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            check(&envoy, resp.status() == 200, "request failed");
            let encoding = resp
                .headers()
                .get("content-encoding")
                .map(|v| v.to_str().unwrap().to_string());
            let raw = resp.bytes().await.unwrap();
            let text = if compress {
                assert_eq!(encoding.as_deref(), Some("gzip"), "stream={stream}");
                String::from_utf8(gunzip(&raw)).unwrap()
            } else {
                assert_eq!(encoding, None, "stream={stream}");
                String::from_utf8(raw.to_vec()).unwrap()
            };
            if stream {
                assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
            } else {
                let v: Value = serde_json::from_str(&text).unwrap();
                assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
            }
        }
        for r in fleet.engines[0].chat_requests() {
            let sent: Vec<&str> = r
                .headers
                .iter()
                .filter(|(k, _)| k == "accept-encoding")
                .map(|(_, v)| v.as_str())
                .collect();
            assert_eq!(sent, vec!["identity"], "compress={compress}");
        }
    }
}
