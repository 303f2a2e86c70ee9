//! `global_limits` through the real filter, Envoy 1.40's own rate-limit filter and a gRPC rate-limit service
//! (the harness's test stand-in, `llmroute_harness::ratelimit_service`, which speaks the real protocol):
//! - the descriptors carry the configured alias and key name exactly, whatever the client sends in the
//!   descriptor headers; token descriptors are peeks (`hits_addend` 0) before the request;
//! - when the stream is done, Envoy charges the tokens the engine reported (the filter's filter state, read by
//!   `hits_addend`), streamed and not, and the input of a request whose client left before the answer;
//! - over a limit: 429 in the route's envelope with `Retry-After` from the service's reset time, no engine
//!   contacted and nothing charged after;
//! - the service down: `failure_mode: allow` serves, `deny` answers 503 in the envelope.

use std::time::Duration;

use llmroute_harness::envoy::{Envoy, EnvoyOptions};
use llmroute_harness::fleet::Fleet;
use llmroute_harness::ratelimit_service::{Call, RateLimitService, SeenDescriptor};
use serde_json::{json, Value};

use crate::support::*;

const VAR: &str = "LLMROUTE_TEST_GLOBAL_KEYS";
const KEY: &str = "Bearer gl-alpha-0123456789abcdef";

fn config(fleet: &Fleet, rls: &str, failure_mode: &str) -> Value {
    json!({
        "version": 1,
        "backends": [fleet.backend_entry(150)],
        "models": [{ "name": ALIAS, "routes": [{ "backend": fleet.backend, "upstream_model": UPSTREAM }] }],
        "auth": { "keys_env": VAR },
        "global_limits": { "address": rls, "domain": "llmroute-test", "timeout_ms": 500, "failure_mode": failure_mode },
    })
}

/// A chat request with the test's API key, its user message `content`.
async fn keyed_chat(c: &reqwest::Client, envoy: &Envoy, content: &str) -> Reply {
    let auth = [("authorization", KEY)];
    post_json(
        c,
        envoy.url("/v1/chat/completions"),
        chat(None, content).to_string(),
        &auth,
    )
    .await
}

async fn start(fleet: &Fleet, rls: &str, failure_mode: &str) -> Envoy {
    let opts = EnvoyOptions {
        env: vec![(VAR.to_string(), "alice:gl-alpha-0123456789abcdef".to_string())],
        ..EnvoyOptions::default()
    };
    Envoy::start_with(config(fleet, rls, failure_mode), opts).await.unwrap()
}

fn d(kind: &str, by: &str, value: &str, hits: Option<u64>) -> SeenDescriptor {
    SeenDescriptor {
        entries: vec![("llmroute".into(), kind.into()), (by.into(), value.into())],
        hits_addend: hits,
    }
}

/// The calls made when the stream was done: every descriptor is a token one with a nonzero `hits_addend`.
fn stream_done(calls: &[Call]) -> Vec<Call> {
    calls
        .iter()
        .filter(|c| c.descriptors.iter().all(|d| d.hits_addend.is_some_and(|h| h > 0)))
        .cloned()
        .collect()
}

async fn wait_calls(rls: &RateLimitService, n: usize) -> Vec<Call> {
    wait_for(Duration::from_secs(5), || async { rls.calls().len() >= n }).await;
    rls.calls()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_carry_alias_and_key_and_the_usage_is_charged_when_the_stream_is_done() {
    let fleet = Fleet::start("global", 1).await.unwrap();
    let rls = RateLimitService::spawn().await.unwrap();
    let envoy = start(&fleet, &rls.addr().to_string(), "allow").await;
    let c = client();
    // A client's copies of the descriptor headers must change nothing.
    let spoof = [
        ("authorization", KEY),
        ("x-llmroute-limit-alias", "someone-else"),
        ("x-llmroute-limit-key", "mallory"),
    ];
    let body = json!({"model": ALIAS, "max_tokens": 40, "messages": [{"role": "user", "content": "global one"}]});
    let r = post_json(&c, envoy.url("/v1/chat/completions"), body.to_string(), &spoof).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let usage = &r.body["usage"];
    let used = usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap();
    assert!(used > 0, "{}", r.text);

    let calls = wait_calls(&rls, 2).await;
    assert_eq!(calls.len(), 2, "{calls:#?}");
    let before = &calls[0];
    assert_eq!(before.domain, "llmroute-test");
    assert_eq!(
        before.descriptors,
        [
            d("requests", "alias", ALIAS, None),
            d("requests", "key", "alice", None),
            d("tokens", "alias", ALIAS, Some(0)),
            d("tokens", "key", "alice", Some(0)),
        ],
        "before the request"
    );
    let after = &calls[1];
    assert_eq!(
        after.descriptors,
        [
            d("tokens", "alias", ALIAS, Some(used)),
            d("tokens", "key", "alice", Some(used)),
        ],
        "when the stream is done: the engine's usage"
    );

    // A stream: the usage comes in its last event, after the response headers.
    let body = json!({"model": ALIAS, "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 40,
        "messages": [{"role": "user", "content": "global two"}]});
    let r = post_json(
        &c,
        envoy.url("/v1/chat/completions"),
        body.to_string(),
        &[("authorization", KEY)],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let streamed = r
        .text
        .lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| {
            let u = v.get("usage")?;
            Some(u["prompt_tokens"].as_u64()? + u["completion_tokens"].as_u64()?)
        })
        .next()
        .expect("no usage in the stream");
    let calls = wait_calls(&rls, 4).await;
    let done = stream_done(&calls);
    assert_eq!(done.len(), 2, "{calls:#?}");
    assert_eq!(
        done[1].descriptors,
        [
            d("tokens", "alias", ALIAS, Some(streamed)),
            d("tokens", "key", "alice", Some(streamed)),
        ],
        "when the stream is done"
    );
    // The engine never sees the client's copies.
    for req in fleet.engines[0].inference_requests() {
        assert_ne!(req.header("x-llmroute-limit-key"), Some("mallory"));
        assert_ne!(req.header("x-llmroute-limit-alias"), Some("someone-else"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_the_answer_is_charged_its_input() {
    let fleet = Fleet::start("global-gone", 1).await.unwrap();
    let rls = RateLimitService::spawn().await.unwrap();
    let envoy = start(&fleet, &rls.addr().to_string(), "allow").await;
    // The engine answers after 5 s; the client gives up after 500 ms, before any response header.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let r = impatient
        .post(envoy.url("/v1/chat/completions"))
        .header("authorization", KEY)
        .header("content-type", "application/json")
        .header("x-emu-delay-ms", "5000")
        .body(chat(None, "gone").to_string())
        .send()
        .await;
    assert!(r.is_err(), "the client should have given up: {r:?}");
    let engines = &fleet.engines[0];
    wait_for(Duration::from_secs(5), || async {
        !engines.inference_requests().is_empty()
    })
    .await;
    let input: u64 = engines.inference_requests()[0]
        .header("x-input-tokens")
        .and_then(|v| v.parse().ok())
        .expect("the engine saw the request and its estimate");
    let calls = wait_calls(&rls, 2).await;
    let done = stream_done(&calls);
    assert_eq!(done.len(), 1, "{calls:#?}");
    assert_eq!(
        done[0].descriptors,
        [
            d("tokens", "alias", ALIAS, Some(input)),
            d("tokens", "key", "alice", Some(input)),
        ],
        "a request the client left still costs its input"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_limit_is_a_429_in_the_envelope_with_retry_after_and_costs_nothing() {
    let fleet = Fleet::start("global-429", 1).await.unwrap();
    let rls = RateLimitService::spawn().await.unwrap();
    rls.limit(&[("llmroute", "requests"), ("key", "alice")], 2);
    let envoy = start(&fleet, &rls.addr().to_string(), "allow").await;
    let c = client();
    for i in 0..2 {
        let r = keyed_chat(&c, &envoy, "429").await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text);
    }
    wait_calls(&rls, 4).await;
    let served = fleet.engines[0].inference_requests().len();
    let calls_before = rls.calls().len();

    let r = keyed_chat(&c, &envoy, "429").await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.header("retry-after"), Some("7"), "the service's reset time");
    assert_eq!(r.header("x-llmroute-error"), Some("rate_limit_exceeded"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let id = r.header("x-request-id").unwrap_or_default().to_string();
    assert!(!id.is_empty());
    assert_eq!(r.body["error"]["code"], "rate_limit_exceeded", "{}", r.text);
    assert_eq!(r.body["error"]["type"], "rate_limit_error", "{}", r.text);
    assert_eq!(r.body["request_id"], json!(id), "{}", r.text);

    let msg = json!({"model": ALIAS, "max_tokens": 16, "messages": [{"role": "user", "content": "429"}]});
    let headers = [("authorization", KEY), ("anthropic-version", "2023-06-01")];
    let r = post_json(&c, envoy.url("/v1/messages"), msg.to_string(), &headers).await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.body["type"], "error", "{}", r.text);
    assert_eq!(r.body["error"]["type"], "rate_limit_error", "{}", r.text);
    assert_eq!(r.header("retry-after"), Some("7"));

    assert_eq!(
        fleet.engines[0].inference_requests().len(),
        served,
        "no engine was contacted"
    );
    // Only the two refused checks: no stream-done charge for a refused request.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = rls.calls();
    assert_eq!(calls.len(), calls_before + 2, "{:#?}", &calls[calls_before..]);
    assert!(calls[calls_before..].iter().all(|c| c.over_limit));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_refuses_once_the_charged_usage_fills_it() {
    let fleet = Fleet::start("global-tok", 1).await.unwrap();
    let rls = RateLimitService::spawn().await.unwrap();
    rls.limit(&[("llmroute", "tokens"), ("alias", ALIAS)], 1);
    let envoy = start(&fleet, &rls.addr().to_string(), "allow").await;
    let c = client();
    let r = keyed_chat(&c, &envoy, "tok").await;
    assert_eq!(r.status, 200, "the peek charges nothing: {}", r.text);
    let u = &r.body["usage"];
    let used = u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap();
    wait_for(Duration::from_secs(5), || async {
        rls.used(&[("llmroute", "tokens"), ("alias", ALIAS)]) == Some(used)
    })
    .await;
    assert_eq!(rls.used(&[("llmroute", "tokens"), ("alias", ALIAS)]), Some(used));
    let r = keyed_chat(&c, &envoy, "tok").await;
    assert_eq!(r.status, 429, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_service_down_allow_serves_and_deny_answers_503() {
    let fleet = Fleet::start("global-down", 1).await.unwrap();
    let rls = RateLimitService::spawn().await.unwrap();
    let addr = rls.addr().to_string();
    rls.stop().await;
    let c = client();

    let allow = start(&fleet, &addr, "allow").await;
    let r = keyed_chat(&c, &allow, "down").await;
    assert_eq!(r.status, 200, "{}", r.text);
    drop(allow);

    let deny = start(&fleet, &addr, "deny").await;
    let served = fleet.engines[0].inference_requests().len();
    let r = keyed_chat(&c, &deny, "down").await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert_eq!(r.header("x-llmroute-error"), Some("rate_limit_unavailable"));
    assert_eq!(r.body["error"]["code"], "rate_limit_unavailable", "{}", r.text);
    assert!(r.header("x-request-id").is_some());
    assert_eq!(fleet.engines[0].inference_requests().len(), served);
}
