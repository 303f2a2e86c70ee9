//! Admission glue (`admission.rs`) through the request context: API keys read from the VM's environment,
//! request limits taken from shared-data buckets, and the 401 and 429 answers.

use proxy_wasm::types::{Action, BufferType};

use super::*;

/// The variable the keys come from; only this test module sets it.
const KEYS_ENV: &str = "LLMROUTE_TEST_GLUE_KEYS";
/// A second team's key, for the per-key budget test.
const OTHER: &str = "sk-glue-team-b-0123456789abcdef";

/// Sets the keys every test here reads. Tests run in parallel threads of one process and share its environment,
/// so all of them set the same value: a test that set fewer keys would refuse another test's key mid-run.
fn set_keys() {
    std::env::set_var(KEYS_ENV, format!("team-a:{TOKEN},team-b:{OTHER}"));
}
const TOKEN: &str = "sk-glue-0123456789abcdef0123";

fn admission_config() -> String {
    CONFIG.replace(
        r#""routes": [ { "backend": "llama-a", "upstream_model": "qwen3-0.6b" } ]"#,
        r#""routes": [ { "backend": "llama-a", "upstream_model": "qwen3-0.6b" } ], "limits": { "requests": "2-M" }"#,
    )
    .replace(
        r#""version": 1,"#,
        &format!(r#""version": 1, "auth": {{ "keys_env": "{KEYS_ENV}" }},"#),
    )
}

fn with_key(token: &str) -> Vec<(&'static str, String)> {
    let mut h: Vec<(&str, String)> = REQUEST_HEADERS.iter().map(|(n, v)| (*n, v.to_string())).collect();
    h.push(("authorization", format!("Bearer {token}")));
    h
}

fn send(fake: &Rc<FakeHost>, root: &Root, token: &str) -> (Vec<Action>, Option<u32>) {
    let headers = with_key(token);
    let borrowed: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let before = fake.replies().len();
    let mut x = Exchange::new(fake, root, 1);
    let mut actions = vec![x.request_headers(&borrowed, false)];
    if fake.replies().len() == before {
        actions.push(x.request_body(chat(false).as_bytes(), true));
    }
    x.log();
    (actions, fake.replies().get(before).map(|r| r.status))
}

#[test]
fn keys_and_request_limits_are_applied_in_order() {
    set_keys();
    let fake = FakeHost::new();
    let root = root(&fake, &admission_config());
    assert_eq!(send(&fake, &root, "sk-wrong-0123456789abcdef0123").1, Some(401));
    assert_eq!(send(&fake, &root, TOKEN), (vec![Action::Pause, Action::Continue], None));
    assert_eq!(
        fake.log_field("llmroute.key").as_deref(),
        Some("team-a"),
        "the key's name, never its value"
    );
    assert_eq!(send(&fake, &root, TOKEN).1, None);
    assert_eq!(send(&fake, &root, TOKEN).1, Some(429), "the alias allows 2 a minute");
    let r = fake.replies().last().unwrap().clone();
    assert!(r.header("retry-after").is_some_and(|s| s.parse::<u64>().unwrap() >= 1));
    assert_eq!(
        fake.metric("llmroute_rate_limited_total;alias=chat;key=team-a;kind=requests"),
        Some(1)
    );
    assert_eq!(fake.metric("llmroute_key_requests_total;key=team-a"), Some(2));
}

#[test]
fn a_missing_keys_variable_refuses_the_config() {
    let fake = FakeHost::new();
    let config = admission_config().replace(KEYS_ENV, "LLMROUTE_TEST_GLUE_KEYS_UNSET");
    fake.set_buffer_bytes(BufferType::PluginConfiguration, config.as_bytes());
    assert!(!Root::new(fake.envoy()).on_configure(config.len()));
}

#[test]
fn a_token_reservation_is_settled_on_the_usage_the_engine_reported() {
    let config = CONFIG
        .replace(
            r#""upstream_model": "qwen3-0.6b" } ]"#,
            r#""upstream_model": "qwen3-0.6b" } ], "limits": { "tokens": "100000-M" }"#,
        )
        .replace(r#""version": 1,"#, r#""version": 1, "debug_headers": true,"#);
    let fake = FakeHost::new();
    let root = root(&fake, &config);
    let mut left = Vec::new();
    for id in 1..=2 {
        let mut x = Exchange::new(&fake, &root, id);
        run_chat(&mut x, false);
        left.push(
            x.response_header("x-llmroute-tokens-remaining")
                .unwrap()
                .parse::<u64>()
                .unwrap(),
        );
    }
    // The second request finds the first one charged exactly what the engine reported (12 + 3 tokens), not what
    // was reserved for it; the clock stands still, so nothing refilled.
    let reserved = 100_000 - left[0];
    assert!(reserved > 15, "{left:?}");
    assert_eq!(left[1], 100_000 - 15 - reserved, "{left:?}");
}

#[test]
fn a_failed_shared_data_read_fails_closed_and_never_refills_a_bucket() {
    use crate::host::fake::Kind;
    use crate::host::HostStatus;
    set_keys();
    let fake = FakeHost::new();
    let config = admission_config();
    let root = root(&fake, &config);
    for _ in 0..2 {
        assert_eq!(send(&fake, &root, TOKEN).1, None);
    }
    assert_eq!(send(&fake, &root, TOKEN).1, Some(429), "drained");
    // The host fails every read: the request is refused, not served from a bucket read as full.
    fake.fail_kind(Kind::GetShared, HostStatus::InternalFailure);
    assert_eq!(send(&fake, &root, TOKEN).1, Some(503));
    let r = fake.replies().last().unwrap().clone();
    assert_eq!(r.header("x-llmroute-error"), Some("limit_unavailable"));
    assert!(r.header("retry-after").is_some());
    assert_eq!(
        fake.metric("llmroute_rejections_total;reason=limit_unavailable"),
        Some(1)
    );
    // A configure pass (a worker starting, a new config) under failing reads seeds nothing over the bucket.
    fake.set_buffer_bytes(BufferType::PluginConfiguration, config.as_bytes());
    assert!(Root::new(fake.envoy()).on_configure(config.len()));
    fake.heal();
    assert_eq!(send(&fake, &root, TOKEN).1, Some(429), "still drained");
}

/// [`CONFIG`] with a token budget on the alias, written with `limits`, and debug headers.
fn token_config(limits: &str) -> String {
    CONFIG
        .replace(
            r#""upstream_model": "qwen3-0.6b" } ]"#,
            &format!(r#""upstream_model": "qwen3-0.6b" }} ], "limits": {limits}"#),
        )
        .replace(r#""version": 1,"#, r#""version": 1, "debug_headers": true,"#)
}

/// One chat request without an output bound, answered with JSON reporting `used` completion tokens. Returns the
/// body the engine got, or the status of the gateway's own reply.
fn unbounded_chat(fake: &Rc<FakeHost>, root: &Root, id: u32, used: u64) -> Result<String, u32> {
    let before = fake.replies().len();
    let mut x = Exchange::new(fake, root, id);
    x.request_headers(&REQUEST_HEADERS, false);
    x.request_body(CHAT.as_bytes(), true);
    if let Some(r) = fake.replies().get(before) {
        x.log();
        return Err(r.status);
    }
    let sent = String::from_utf8(x.request_buffer()).unwrap();
    x.response_headers(&[(":status", "200"), ("content-type", "application/json")], false);
    let answer = format!(r#"{{"choices":[],"usage":{{"prompt_tokens":12,"completion_tokens":{used}}}}}"#);
    x.response_body(answer.as_bytes(), true);
    x.log();
    Ok(sent)
}

#[test]
fn an_injected_bound_reaches_the_engine_capped_by_what_the_budget_has_left() {
    let fake = FakeHost::new();
    let injecting = root(
        &fake,
        &token_config(r#"{ "tokens": "1000-M", "default_max_tokens": 300, "inject_max_tokens": true }"#),
    );
    let sent = unbounded_chat(&fake, &injecting, 1, 800).unwrap();
    assert!(sent.ends_with(r#","max_tokens":300}"#), "{sent}");
    assert!(sent.starts_with(r#"{"model":"qwen3-0.6b","messages""#), "{sent}");
    // 1000 − (12 + 800) = 188 left; the next bound is what is left after this request's input estimate.
    let sent = unbounded_chat(&fake, &injecting, 2, 1).unwrap();
    let bound: u64 = sent
        .rsplit_once(r#""max_tokens":"#)
        .and_then(|(_, n)| n.trim_end_matches('}').parse().ok())
        .unwrap();
    assert!((150..188).contains(&bound), "{sent}");
    // Without the option, the body goes up as sent.
    let fake = FakeHost::new();
    let plain = root(
        &fake,
        &token_config(r#"{ "tokens": "1000-M", "default_max_tokens": 300 }"#),
    );
    let sent = unbounded_chat(&fake, &plain, 1, 1).unwrap();
    assert!(!sent.contains("max_tokens"), "{sent}");
}

#[test]
fn an_overrun_is_carried_as_a_debt_with_a_truthful_retry_after() {
    let fake = FakeHost::new();
    let root = root(
        &fake,
        &token_config(r#"{ "tokens": "1000-M", "default_max_tokens": 16 }"#),
    );
    // The engine generated far past the 16 tokens reserved: 3000 + 12 against a 1000-token minute.
    unbounded_chat(&fake, &root, 1, 3000).unwrap();
    assert_eq!(unbounded_chat(&fake, &root, 2, 1), Err(429));
    let retry: u64 = fake
        .replies()
        .last()
        .and_then(|r| r.header("retry-after").and_then(|v| v.parse().ok()))
        .unwrap();
    // 2012 tokens of debt plus this request's reservation, at 1000 a minute: about two minutes.
    assert!((121..=125).contains(&retry), "retry-after {retry}");
    // Refill repays it: a minute later (the clock moves), still refused.
    fake.advance_ms(60_000);
    assert_eq!(unbounded_chat(&fake, &root, 3, 1), Err(429));
    fake.advance_ms(retry * 1000);
    assert!(unbounded_chat(&fake, &root, 4, 1).is_ok());
}

#[test]
fn a_decision_route_reserves_its_own_bound_and_settles_on_the_answers_usage() {
    let config = token_config(r#"{ "tokens": "100000-M", "default_max_tokens": 2048 }"#).replace(
        r#""routes": [ { "backend""#,
        r#""endpoints": ["decisions"], "routes": [ { "backend""#,
    );
    let fake = FakeHost::new();
    let root = root(&fake, &config);
    let headers = [
        (":method", "POST"),
        (":path", "/v1/decisions"),
        (":authority", "gw"),
        ("content-type", "application/json"),
    ];
    let body = r#"{"model":"chat","max_tokens":40,"input":{"question":"which?"}}"#;
    let mut left = Vec::new();
    for id in 1..=2 {
        let mut x = Exchange::new(&fake, &root, id);
        x.request_headers(&headers, false);
        x.request_body(body.as_bytes(), true);
        assert!(fake.replies().is_empty(), "{:?}", fake.replies());
        x.response_headers(&[(":status", "200"), ("content-type", "application/json")], false);
        left.push(
            x.response_header("x-llmroute-tokens-remaining")
                .unwrap()
                .parse::<u64>()
                .unwrap(),
        );
        x.response_body(
            br#"{"decision":"a","usage":{"prompt_tokens":12,"completion_tokens":3}}"#,
            true,
        );
        x.log();
    }
    let input = x_input_tokens(body);
    assert_eq!(left[0], 100_000 - (input + 40), "the body's own bound is reserved");
    assert_eq!(
        left[1],
        100_000 - 15 - (input + 40),
        "the answer's usage settled the first"
    );
}

/// The gateway's input estimate for a decision-route body.
fn x_input_tokens(body: &str) -> u64 {
    let cfg = llmroute_core::config::load(
        r#"{"version":1,"backends":[{"name":"a","kind":"vllm","endpoints":["127.0.0.1:1"]}],
            "models":[{"name":"chat","endpoints":["decisions"],"routes":[{"backend":"a"}]}]}"#,
    )
    .unwrap();
    llmroute_core::route(&cfg, llmroute_core::Api::Decisions, body.as_bytes(), None)
        .unwrap()
        .input_tokens
}

/// [`CONFIG`] with API keys from [`KEYS_ENV`] and each key limited by `limits`.
fn key_limits_config(limits: &str) -> String {
    CONFIG.replace(
        r#""version": 1,"#,
        &format!(r#""version": 1, "auth": {{ "keys_env": "{KEYS_ENV}", "limits": {limits} }},"#),
    )
}

#[test]
fn a_key_over_its_request_limit_is_refused_at_the_headers() {
    set_keys();
    let fake = FakeHost::new();
    let root = root(&fake, &key_limits_config(r#"{ "requests": "1-M" }"#));
    assert_eq!(send(&fake, &root, TOKEN), (vec![Action::Pause, Action::Continue], None));
    let headers = with_key(TOKEN);
    let borrowed: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let mut x = Exchange::new(&fake, &root, 2);
    assert_eq!(x.request_headers(&borrowed, false), Action::Pause);
    let r = fake
        .replies()
        .last()
        .cloned()
        .expect("answered at the headers, no body read");
    assert_eq!(r.status, 429);
    assert!(r.header("retry-after").is_some_and(|s| s.parse::<u64>().unwrap() >= 1));
    assert_eq!(
        fake.metric("llmroute_rate_limited_total;alias=none;key=team-a;kind=requests"),
        Some(1)
    );
}

#[test]
fn a_request_refused_after_its_headers_gives_back_the_keys_request() {
    set_keys();
    let fake = FakeHost::new();
    let root = root(&fake, &key_limits_config(r#"{ "requests": "1-M" }"#));
    let headers = with_key(TOKEN);
    let borrowed: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    for (id, body) in [(1, r#"{"model":"nope","messages":[]}"#), (2, r#"{"model":"#)] {
        let mut x = Exchange::new(&fake, &root, id);
        x.request_headers(&borrowed, false);
        x.request_body(body.as_bytes(), true);
        assert!(fake
            .replies()
            .last()
            .is_some_and(|r| (400..500).contains(&r.status) && r.status != 429));
        x.log();
    }
    assert_eq!(send(&fake, &root, TOKEN).1, None, "the refused requests held nothing");
}

#[test]
fn a_key_named_in_key_limits_has_its_own_budget() {
    set_keys();
    let config = key_limits_config(r#"{ "requests": "3-M" }, "key_limits": { "team-a": { "requests": "1-M" } }"#);
    let fake = FakeHost::new();
    let root = root(&fake, &config);
    assert_eq!(send(&fake, &root, TOKEN).1, None);
    assert_eq!(
        send(&fake, &root, TOKEN).1,
        Some(429),
        "team-a's own budget: 1 a minute"
    );
    for i in 0..3 {
        assert_eq!(
            send(&fake, &root, OTHER).1,
            None,
            "team-b, request {i}: the shared budget, 3 a minute"
        );
    }
    assert_eq!(send(&fake, &root, OTHER).1, Some(429));
}
