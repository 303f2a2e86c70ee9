//! The native build (`make native`: the same filter as an Envoy dynamic module) in a real Envoy, whatever
//! `LLMROUTE_BUILD` says for the rest of the suite:
//! - Envoy loads the module, and it logs that its ABI version matched Envoy's;
//! - a chat request is routed to its alias's cluster with only `model` rewritten, over HTTP/1.1 and HTTP/2,
//!   and a refusal is the filter's own JSON error;
//! - a panic inside the filter (`make native-trap`, cargo feature `test-trap`) fails only that request, closed,
//!   with a JSON 503 in the API's envelope that reaches no engine; Envoy stays up and routes the next request on
//!   the same worker;
//! - its configuration delivered through ECDS from a watched file (`--ecds-path` with `--module`): Envoy 1.40
//!   accepts the dynamic-module filter's extension config, the module routes with it, a pushed change takes
//!   effect without a restart, and a push the module refuses leaves the previous one in force.

use std::time::Duration;

use llmroute_harness::envoy::{native_module, trap_native_module, wasm_module, Envoy, EnvoyOptions};
use llmroute_harness::fleet::{single_backend_config, Fleet};
use llmroute_harness::render::{ecds, RenderOptions};
use serde_json::{json, Value};

use crate::support::*;

const TRAP_HEADER: &str = "x-llmroute-test-trap";

async fn native_envoy(module: std::path::PathBuf, config: Value, concurrency: u32) -> Envoy {
    assert!(
        module.exists(),
        "{} is missing: run `make native native-trap`",
        module.display()
    );
    let opts = EnvoyOptions {
        concurrency,
        module: Some(module),
        ..EnvoyOptions::default()
    };
    Envoy::start_with(config, opts).await.unwrap()
}

async fn routes_with_only_model_rewritten(c: reqwest::Client) {
    let a = Fleet::start("llama-a", 1).await.unwrap();
    let b = Fleet::start("vllm-b", 1).await.unwrap();
    let config = json!({
        "version": 1,
        "backends": [a.backend_entry(150), b.backend_entry(150)],
        "models": [
            {"name": "other", "routes": [{"backend": "llama-a", "upstream_model": "x"}]},
            {"name": ALIAS, "routes": [{"backend": "vllm-b", "upstream_model": UPSTREAM}]},
        ],
    });
    let envoy = native_envoy(native_module(), config, 2).await;
    let matched = wait_for(std::time::Duration::from_secs(10), || async {
        envoy.log().contains("Dynamic module ABI version v0.2.0 matched")
    })
    .await;
    assert!(matched.is_some(), "{}", envoy.log());
    let headers = [("x-llmroute-cluster", "llama-a"), ("authorization", "Bearer sk-client")];
    let resp = post_json(&c, envoy.url("/v1/chat/completions"), RAW_BODY, &headers).await;
    assert_eq!(resp.status, 200, "{:?}\n{}", resp.text, envoy.log());
    assert_eq!(
        a.chat_counts(),
        vec![0],
        "the client's x-llmroute-cluster must not steer the route"
    );
    assert_only_model_rewritten(&b.engines[0].chat_requests());

    // A refusal is the filter's own reply, in the OpenAI envelope.
    let unknown = json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let resp = post_json(&c, envoy.url("/v1/chat/completions"), unknown, &[]).await;
    assert_eq!(resp.status, 404, "{:?}", resp.text);
    assert_eq!(resp.header("x-llmroute-error"), Some("model_not_found"));
    let body: Value = serde_json::from_str(&resp.text).unwrap();
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_routes_an_alias_with_only_model_rewritten_http1() {
    routes_with_only_model_rewritten(client()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_routes_an_alias_with_only_model_rewritten_http2() {
    routes_with_only_model_rewritten(h2_client()).await;
}

/// One worker, so the request after the panic is served by the same worker and its same root context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_fails_only_its_request_closed_and_envoy_carries_on() {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let config = single_backend_config(&fleet, ALIAS, UPSTREAM, 150);
    let envoy = native_envoy(trap_native_module(), config, 1).await;
    let c = client();
    let (status, backend, _) = post(&c, &envoy, &chat(None, "before"), &[]).await;
    assert_eq!((status, backend.as_str()), (200, "llama-a-0"), "{}", envoy.log());

    for (path, body, envelope) in [
        ("/v1/chat/completions", chat(None, "panic"), "openai"),
        (
            "/v1/messages",
            json!({"model": ALIAS, "max_tokens": 8, "messages": [{"role": "user", "content": "panic"}]}),
            "anthropic",
        ),
    ] {
        let resp = post_json(&c, envoy.url(path), body.to_string(), &[(TRAP_HEADER, "1")]).await;
        assert_eq!(resp.status, 503, "{path}: {:?}", resp.text);
        assert_eq!(resp.header("x-llmroute-error"), Some("gateway_error"), "{path}");
        assert_eq!(resp.header("content-type"), Some("application/json"), "{path}");
        let got: Value = serde_json::from_str(&resp.text).unwrap();
        match envelope {
            "anthropic" => {
                assert_eq!(got["type"], "error", "{got}");
                assert!(got["error"]["type"].is_string(), "{got}");
            }
            _ => assert_eq!(got["error"]["code"], "gateway_error", "{got}"),
        }
    }
    assert_eq!(
        fleet.chat_counts(),
        vec![1],
        "a request that panicked reaches no engine"
    );
    let logged = wait_for(std::time::Duration::from_secs(10), || async {
        envoy.log().contains("llmroute test trap triggered")
    })
    .await;
    assert!(logged.is_some(), "the panic is logged: {}", envoy.log());

    // Envoy did not abort, and the same worker routes again.
    let (status, backend, _) = post(&c, &envoy, &chat(None, "after"), &[]).await;
    assert_eq!((status, backend.as_str()), (200, "llama-a-0"), "{}", envoy.log());
    assert_eq!(fleet.chat_counts(), vec![2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_filter_config_is_accepted_through_ecds() {
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let module = native_module();
    assert!(module.exists(), "{} is missing: run `make native`", module.display());
    let dir = tempfile::tempdir().unwrap();
    let ecds_path = dir.path().join("llmroute-ecds.yaml");
    let opts = RenderOptions::new(wasm_module().display().to_string())
        .with_module(module.display().to_string())
        .with_ecds(ecds_path.display().to_string());
    let doc = |admin: u16, upstream: &str| {
        let mut doc = single_backend_config(&fleet, ALIAS, upstream, 150);
        doc["admin"] = Value::from(format!("127.0.0.1:{admin}"));
        doc
    };
    let (envoy, admin) = start_ecds(&ecds_path, &opts, |admin| doc(admin, UPSTREAM)).await;
    let bootstrap = envoy.bootstrap_yaml();
    assert!(
        bootstrap.contains("config_discovery") && bootstrap.contains("DynamicModuleFilter"),
        "the listener discovers a dynamic-module filter:\n{bootstrap}"
    );
    assert!(
        !bootstrap.contains("libllmroute_native.so") && !bootstrap.contains(".wasm"),
        "the module and its configuration come only through ECDS:\n{bootstrap}"
    );

    // Envoy took the extension config from the file, loaded the module, and the module routes with it.
    let c = client();
    let (status, backend, body) = post(&c, &envoy, &chat(None, "first"), &[]).await;
    assert_eq!(
        (status, backend.as_str()),
        (200, "llama-a-0"),
        "{body}\n{}",
        envoy.log()
    );
    assert_eq!(last_model(&fleet.engines[0]), UPSTREAM);
    assert_eq!(ecds_stat(&envoy, "update_success").await, Some(1));
    let matched = wait_for(Duration::from_secs(10), || async {
        envoy.log().contains("Dynamic module ABI version v0.2.0 matched")
    })
    .await;
    assert!(matched.is_some(), "Envoy loaded the module: {}", envoy.log());
    let stats = admin_text(&envoy, "/stats?filter=^dynamicmodulescustom").await;
    assert!(
        stats.contains("dynamicmodulescustom.llmroute_requests_total."),
        "the module counts the request in its own stats:\n{stats}"
    );

    // A pushed change takes effect without a restart.
    push(
        &ecds_path,
        &ecds::discovery_response(&doc(admin, "model-v2").to_string(), &opts).unwrap(),
    );
    let took = wait_for(Duration::from_secs(15), || async {
        let (status, _, _) = post(&c, &envoy, &chat(None, "after the push"), &[]).await;
        status == 200 && last_model(&fleet.engines[0]) == "model-v2"
    })
    .await;
    assert!(
        took.is_some(),
        "the pushed upstream model never took effect:\n{}",
        envoy.log()
    );
    assert_eq!(ecds_stat(&envoy, "update_success").await, Some(2));

    // A push the module refuses (an unknown backend, past the CLI's validation) is rejected; the last good one stays.
    let mut bad = doc(admin, "model-v3");
    bad["models"][0]["routes"][0]["backend"] = Value::from("llama-zz");
    push(
        &ecds_path,
        &ecds::discovery_response_raw(&bad.to_string(), &opts).unwrap(),
    );
    let refused = wait_for(Duration::from_secs(15), || async {
        ecds_stat(&envoy, "config_fail").await.unwrap_or(0) >= 1
    })
    .await;
    assert!(refused.is_some(), "no config_fail:\n{}", envoy.log());
    assert_eq!(ecds_stat(&envoy, "update_success").await, Some(2));
    let (status, backend, body) = post(&c, &envoy, &chat(None, "still v2"), &[]).await;
    assert_eq!((status, backend.as_str()), (200, "llama-a-0"), "{body}");
    assert_eq!(last_model(&fleet.engines[0]), "model-v2", "the old config stays");
    let logged = wait_for(Duration::from_secs(5), || async {
        let log = envoy.log();
        log.contains("llmroute config:") && log.contains("llama-zz")
    })
    .await;
    assert!(
        logged.is_some(),
        "the module logs why it refused the push:\n{}",
        envoy.log()
    );
}
