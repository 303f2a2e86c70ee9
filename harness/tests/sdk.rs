//! The real `openai` and `anthropic` Python SDKs against emulated engines, directly and through Envoy.
//!
//! `harness/tests/sdk/check_sdks.py` runs one check per API (chat, completions, responses, embeddings,
//! messages, plain and streamed, and both models lists) with the SDKs' own calls and strict response
//! validation. These tests start the engines (and Envoy), run the script with the venv's Python, print its
//! report and require it to pass. The SDKs live in `.tools/venv` (`make sdk-clients`); without them the tests
//! fail and say so, they never skip.
//!
//! - `sdks_parse_every_dialect_of_one_engine`: the script straight at one emulator (`--direct`), which proves
//!   the emulator's dialects are what the SDKs expect, independent of the gateway.
//! - `sdks_work_through_the_gateway`: a 3-engine fleet behind Envoy and the filter. The engines' request logs
//!   must show every inference call and no client credential.
//! - `sdks_work_through_a_stream_always_alias`: the same checks with `stream_upstream: always`, so the plain
//!   chat and responses answers the SDKs parse are the ones the filter rebuilt from streams.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use llmroute_harness::emulator::{Emulator, EmulatorOptions, RecordedRequest};
use llmroute_harness::envoy::{repo_root, Envoy};
use llmroute_harness::fleet::{single_backend_config, Fleet};
use llmroute_harness::sdk_clients;

const ALIAS: &str = "local-chat";
const UPSTREAM: &str = "qwen3-0.6b";
/// Inference requests the script makes: one per inference check, two for embeddings (base64 and float).
const INFERENCE_CALLS: usize = 11;
/// Headers the SDK clients send that must never reach an engine through the gateway.
const CREDENTIALS: [&str; 4] = ["authorization", "x-api-key", "cookie", "proxy-authorization"];
const SCRIPT_LIMIT: Duration = Duration::from_secs(180);

fn python() -> PathBuf {
    sdk_clients::python().unwrap_or_else(|e| panic!("{e}"))
}

/// Runs the check script against `base_url`, prints its report, and returns its output.
async fn run_checks(base_url: &str, extra: &[&str]) -> Output {
    let script = repo_root().join("harness/tests/sdk/check_sdks.py");
    let mut command = sdk_clients::script_command(&script).unwrap_or_else(|e| panic!("{e}"));
    command.args(["--base-url", base_url, "--model", ALIAS]).args(extra);
    let output = tokio::time::timeout(SCRIPT_LIMIT, command.output())
        .await
        .unwrap_or_else(|_| panic!("{} did not finish within {SCRIPT_LIMIT:?}", script.display()))
        .unwrap_or_else(|e| panic!("starting {}: {e}", script.display()));
    println!("{}", String::from_utf8_lossy(&output.stdout));
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    output
}

fn assert_passed(output: &Output) {
    let report = String::from_utf8_lossy(&output.stdout);
    let failures: Vec<&str> = report.lines().filter(|line| line.starts_with("FAIL")).collect();
    assert!(
        output.status.success(),
        "the SDK checks failed ({}):\n{}\n{}",
        output.status,
        failures.join("\n"),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `(backend, path, header)` for every credential header that reached an engine.
fn leaked_credentials(requests: &[RecordedRequest]) -> Vec<(String, String, String)> {
    requests
        .iter()
        .flat_map(|request| {
            CREDENTIALS
                .iter()
                .filter(|name| request.header(name).is_some())
                .map(|name| (request.backend.clone(), request.path.clone(), name.to_string()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdks_parse_every_dialect_of_one_engine() {
    let mut opts = EmulatorOptions::new("direct-0");
    opts.model = ALIAS.to_string();
    let engine = Emulator::spawn_with(opts).await.unwrap();
    let output = run_checks(&format!("http://{}", engine.addr()), &["--direct"]).await;
    assert_passed(&output);
    let requests = engine.inference_requests();
    assert_eq!(requests.len(), INFERENCE_CALLS, "one engine request per inference call");
    // Straight at an engine nothing strips them: this proves the script sends every credential header, so
    // their absence through the gateway means something.
    let arrived = leaked_credentials(&requests);
    for name in CREDENTIALS {
        assert!(
            arrived.iter().any(|(_, _, header)| header == name),
            "the SDKs never sent {name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdks_work_through_the_gateway() {
    python(); // fail fast, before starting anything
    let fleet = Fleet::start("llama-a", 3).await.unwrap();
    let envoy = Envoy::start(single_backend_config(&fleet, ALIAS, UPSTREAM, 150))
        .await
        .unwrap();
    let output = run_checks(&envoy.url(""), &[]).await;
    let requests: Vec<RecordedRequest> = fleet.engines.iter().flat_map(|e| e.requests()).collect();
    assert_eq!(
        leaked_credentials(&requests),
        Vec::<(String, String, String)>::new(),
        "client credentials reached an engine"
    );
    assert_passed(&output);
    let counts = fleet.inference_counts();
    assert_eq!(
        counts.iter().sum::<usize>(),
        INFERENCE_CALLS,
        "every inference call reaches exactly one engine: {counts:?}"
    );
}

/// Every check again with the alias set to `stream_upstream: always`: the plain chat and responses answers the
/// SDKs parse (with strict validation) are rebuilt by the filter from streams; every other call is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdks_work_through_a_stream_always_alias() {
    python();
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let mut cfg = single_backend_config(&fleet, ALIAS, UPSTREAM, 150);
    cfg["models"][0]["stream_upstream"] = serde_json::json!("always");
    let envoy = Envoy::start(cfg).await.unwrap();
    let output = run_checks(&envoy.url(""), &[]).await;
    if !output.status.success() {
        eprintln!("{}", envoy.log());
    }
    assert_passed(&output);
    let streamed = fleet.engines[0]
        .inference_requests()
        .iter()
        .filter(|r| {
            let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            body["stream"] == true
        })
        .count();
    // Chat and responses, plain and streamed, plus the streamed completions and both messages streams.
    assert_eq!(streamed, 7, "the plain chat and responses calls went upstream streamed");
}

/// The anthropic SDK reads the request id from `request-id`: on an answer, on a gateway refusal and on a backend
/// error that the gateway renders in the Anthropic envelope (see `harness/tests/sdk/check_request_ids.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk_reports_the_gateways_request_id() {
    python();
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let envoy = Envoy::start(single_backend_config(&fleet, ALIAS, UPSTREAM, 150))
        .await
        .unwrap();
    let script = repo_root().join("harness/tests/sdk/check_request_ids.py");
    let mut command = sdk_clients::script_command(&script).unwrap_or_else(|e| panic!("{e}"));
    command.args(["--base-url", &envoy.url(""), "--model", ALIAS]);
    let output = tokio::time::timeout(SCRIPT_LIMIT, command.output())
        .await
        .unwrap_or_else(|_| panic!("{} did not finish within {SCRIPT_LIMIT:?}", script.display()))
        .unwrap_or_else(|e| panic!("starting {}: {e}", script.display()));
    println!("{}", String::from_utf8_lossy(&output.stdout));
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    if !output.status.success() {
        eprintln!("{}", envoy.log());
    }
    assert_passed(&output);
    let engine = fleet.engines[0].inference_requests();
    assert_eq!(engine.len(), 2, "the answer and the backend error reach the engine");
    for r in &engine {
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert!(
            body.get("extra_headers").is_none(),
            "extra_headers reached the engine: {body}"
        );
    }
}
