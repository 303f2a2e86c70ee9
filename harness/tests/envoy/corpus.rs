//! The table of bad requests in `testdata/bad-requests.json`, replayed through real Envoy.
//!
//! Each case names its method, path, headers and body, and the status and `code` the gateway must answer with.
//! Bodies and header values may use `{{REPEAT:N:TEXT}}` to stay readable (deep nesting, huge strings), `body_hex`
//! and `headers_hex` carry bytes that are not UTF-8, and `many_headers: N` adds N filler headers. Every refusal
//! must come in its route's envelope, carry the request id, and leave every engine untouched. A `codec` case is
//! refused by Envoy's codec before any filter runs (431): any envelope will do, and its request id may be null.
//! No response header may carry anything but visible ASCII, and a malformed client request id is never echoed.

use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::Fleet;
use serde::Deserialize;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::*;

#[derive(Deserialize)]
struct Case {
    name: String,
    method: String,
    path: String,
    headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    body_hex: Option<String>,
    /// Header values as hex, for bytes a text value cannot hold.
    #[serde(default)]
    headers_hex: std::collections::BTreeMap<String, String>,
    /// Adds `x-filler-0` .. `x-filler-{N-1}`.
    #[serde(default)]
    many_headers: usize,
    /// Envoy's codec refuses the request before any filter sees it.
    #[serde(default)]
    codec: bool,
    status: u16,
    code: String,
}

/// A request id the gateway may pass on: 1 to 128 of `A-Z a-z 0-9 - _ . :` (written out here, apart from the
/// filter's own check, so that a fault there cannot hide).
fn id_ok(v: &[u8]) -> bool {
    (1..=128).contains(&v.len()) && v.iter().all(|&b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

impl Case {
    fn body(&self) -> Vec<u8> {
        if let Some(hex) = &self.body_hex {
            return unhex(hex);
        }
        expand(self.body.as_deref().unwrap_or_default()).into_bytes()
    }

    /// Refusals on `/v1/messages`, or on models with `anthropic-version`, speak Anthropic.
    fn anthropic(&self) -> bool {
        self.path.starts_with("/v1/messages") || self.headers.contains_key("anthropic-version")
    }
}

/// Expands `{{REPEAT:N:TEXT}}`.
fn expand(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("{{REPEAT:") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 9..];
        let end = after.find("}}").unwrap();
        let (n, text) = after[..end].split_once(':').unwrap();
        out.push_str(&text.repeat(n.parse().unwrap()));
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

fn corpus() -> Vec<Case> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/bad-requests.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn upstream_posts(fleet: &Fleet) -> usize {
    fleet
        .engines
        .iter()
        .map(|e| e.requests().iter().filter(|r| r.method == "POST").count())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_request_in_the_corpus_is_refused_before_the_engine() {
    let cases = corpus();
    assert!(
        cases.len() >= 250,
        "the corpus must hold at least 250 cases, has {}",
        cases.len()
    );
    let fleet = Fleet::start("llama-a", 2).await.unwrap();
    let config = json!({
        "version": 1,
        "backends": [fleet.backend_entry(150)],
        "models": [
            {"name": ALIAS, "routes": [{"backend": "llama-a", "upstream_model": UPSTREAM}]},
            {"name": "chat-only", "endpoints": ["chat"], "routes": [{"backend": "llama-a"}]},
        ],
        "limits": {"max_body_bytes": 65536},
    });
    let envoy = Envoy::start(config).await.unwrap();
    let c = client();
    let mut failures = Vec::new();
    for case in &cases {
        if let Err(why) = check(&c, &envoy, case).await {
            failures.push(format!("{}: {why}", case.name));
        }
        if upstream_posts(&fleet) != 0 {
            failures.push(format!("{}: reached an engine", case.name));
            fleet.reset();
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    // The gateway still routes after all of that, and no wasm VM failed or was replaced on the way.
    let (status, _, _) = post(&c, &envoy, &chat(None, "fine"), &[]).await;
    assert_eq!(status, 200);
    assert_wasm_healthy(&envoy).await;
}

/// Envoy's wasm counters for the filter's plugin show no failed, crashed or reloaded VM, and the filter's VMs
/// are live. Panics with the counters otherwise.
pub async fn assert_wasm_healthy(envoy: &Envoy) {
    if let Err(why) = wasm_failures(envoy).await {
        panic!("{why}");
    }
}

/// The check behind [`assert_wasm_healthy`]. With the plugin's `failure_policy: FAIL_RELOAD`, a VM that traps is
/// counted in `wasm.llmroute.vm_reload` (and `_success` or `_failure`); a runtime failure in `vm_reload_failure`.
/// On the native build there is no VM: the module catches a panic and logs it (docs/native.md), so the check
/// is that the filter logged none.
pub async fn wasm_failures(envoy: &Envoy) -> Result<(), String> {
    if envoy.runs_native() {
        let log = envoy.log();
        return match log.lines().find(|l| l.contains("llmroute: panic")) {
            Some(line) => Err(format!("the native filter panicked: {line}")),
            None => Ok(()),
        };
    }
    let text = reqwest::get(envoy.admin_url("/stats?filter=^wasm"))
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
    let stat = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    if stat("wasm.envoy.wasm.runtime.v8.active").unwrap_or(0) == 0 {
        return Err(format!("no live wasm VM:\n{text}"));
    }
    for name in [
        "wasm.llmroute.vm_reload",
        "wasm.llmroute.vm_reload_success",
        "wasm.llmroute.vm_reload_failure",
        "wasm.llmroute.vm_reload_backoff",
    ] {
        match stat(name) {
            Some(0) => {}
            other => return Err(format!("{name} is {other:?}:\n{text}")),
        }
    }
    Ok(())
}

async fn check(c: &reqwest::Client, envoy: &Envoy, case: &Case) -> Result<(), String> {
    let method = reqwest::Method::from_bytes(case.method.as_bytes()).unwrap();
    let mut req = c.request(method, envoy.url(&case.path));
    let mut headers = reqwest::header::HeaderMap::new();
    let named = |k: &str| reqwest::header::HeaderName::from_bytes(k.as_bytes()).unwrap();
    for (k, v) in &case.headers {
        let v = reqwest::header::HeaderValue::from_str(&expand(v)).unwrap();
        headers.insert(named(k), v);
    }
    for (k, hex) in &case.headers_hex {
        headers.insert(named(k), reqwest::header::HeaderValue::from_bytes(&unhex(hex)).unwrap());
    }
    for i in 0..case.many_headers {
        headers.insert(
            named(&format!("x-filler-{i}")),
            reqwest::header::HeaderValue::from_static("f"),
        );
    }
    let sent_id = headers.get("x-request-id").map(|v| v.as_bytes().to_vec());
    req = req.headers(headers);
    let body = case.body();
    if !body.is_empty() {
        req = req.body(body);
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    for (name, value) in resp.headers() {
        if !value
            .as_bytes()
            .iter()
            .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
        {
            return Err(format!("response header {name} is not visible ASCII: {value:?}"));
        }
        if name.as_str().contains("cookie") {
            return Err(format!("a response sets a cookie: {name}: {value:?}"));
        }
    }
    let header = |n: &str| resp.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
    let (error_code, request_id) = (header("x-llmroute-error"), header("x-request-id"));
    let v: Value = resp.json().await.map_err(|e| format!("body is not JSON: {e}"))?;
    if status != case.status || error_code.as_deref() != Some(case.code.as_str()) {
        return Err(format!(
            "got {status} {error_code:?}, want {} {}: {v}",
            case.status, case.code
        ));
    }
    let anthropic_ok = v["type"] == "error" && v["error"]["type"].is_string() && v["error"]["message"].is_string();
    let openai_ok = v["error"]["code"] == case.code.as_str()
        && v["error"]["message"].is_string()
        && v["error"].get("param").is_some();
    // Envoy's codec refuses before the path is known, so its reply may take either envelope.
    let envelope_ok = match (case.codec, case.anthropic()) {
        (true, _) => anthropic_ok || openai_ok,
        (false, true) => anthropic_ok,
        (false, false) => openai_ok,
    };
    if !envelope_ok {
        return Err(format!("wrong envelope: {v}"));
    }
    if let Some(id) = &request_id {
        if !id_ok(id.as_bytes()) {
            return Err(format!("the response's request id {id:?} is malformed"));
        }
    }
    if let Some(sent) = sent_id.filter(|s| !id_ok(s)) {
        if request_id.as_deref().map(str::as_bytes) == Some(&sent[..]) {
            return Err("a malformed client request id was echoed".into());
        }
    }
    match request_id {
        Some(id) if v["request_id"] == id.as_str() => Ok(()),
        None if case.codec && v["request_id"].is_null() => Ok(()),
        other => Err(format!(
            "request id {other:?} missing from the response or the body: {v}"
        )),
    }
}

#[test]
fn repeat_templates_expand() {
    assert_eq!(expand("a{{REPEAT:3:[}}b{{REPEAT:2:xy}}"), "a[[[bxyxy");
    assert_eq!(expand("plain"), "plain");
}

/// The wasm health check can fail: a VM that traps (the test-only module, `make build-trap`) shows up in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wasm_health_check_sees_a_trapped_vm() {
    let module = llmroute_harness::envoy::trap_wasm_module();
    assert!(
        module.exists(),
        "{} is missing: run `make build-trap`",
        module.display()
    );
    let fleet = Fleet::start("llama-a", 1).await.unwrap();
    let opts = llmroute_harness::envoy::EnvoyOptions {
        concurrency: 1,
        wasm: Some(module),
        ..Default::default()
    };
    let config = llmroute_harness::fleet::single_backend_config(&fleet, ALIAS, UPSTREAM, 150);
    let envoy = Envoy::start_with(config, opts).await.unwrap();
    wasm_failures(&envoy).await.unwrap();
    let resp = client()
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-llmroute-test-trap", "1")
        .body(chat(None, "trap").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    // The reload is counted once the next request meets the trapped VM.
    let seen = wait_for(Duration::from_secs(10), || async {
        let _ = post(&client(), &envoy, &chat(None, "after"), &[]).await;
        wasm_failures(&envoy).await.is_err()
    })
    .await;
    assert!(seen.is_some(), "a trapped VM went unnoticed");
}
