//! The table of bad requests in `testdata/bad-requests.json`, replayed through real Envoy.
//!
//! Each case names its method, path, headers and body, and the status and `code` the gateway must answer with.
//! Bodies may use `{{REPEAT:N:TEXT}}` to stay readable (deep nesting, huge strings), or `body_hex` for bytes
//! that are not UTF-8. Every refusal must come in its route's envelope, carry the request id, and leave every
//! engine untouched.

use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::Fleet;
use serde::Deserialize;
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
    status: u16,
    code: String,
}

impl Case {
    fn body(&self) -> Vec<u8> {
        if let Some(hex) = &self.body_hex {
            return (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
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
        cases.len() >= 80,
        "the corpus must hold at least 80 cases, has {}",
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
    // The gateway still routes after all of that.
    let (status, _, _) = post(&c, &envoy, &chat(None, "fine"), &[]).await;
    assert_eq!(status, 200);
}

async fn check(c: &reqwest::Client, envoy: &Envoy, case: &Case) -> Result<(), String> {
    let method = reqwest::Method::from_bytes(case.method.as_bytes()).unwrap();
    let mut req = c.request(method, envoy.url(&case.path));
    for (k, v) in &case.headers {
        req = req.header(k, v);
    }
    let body = case.body();
    if !body.is_empty() {
        req = req.body(body);
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let header = |n: &str| resp.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
    let (error_code, request_id) = (header("x-llmroute-error"), header("x-request-id"));
    let v: Value = resp.json().await.map_err(|e| format!("body is not JSON: {e}"))?;
    if status != case.status || error_code.as_deref() != Some(case.code.as_str()) {
        return Err(format!(
            "got {status} {error_code:?}, want {} {}: {v}",
            case.status, case.code
        ));
    }
    let envelope_ok = if case.anthropic() {
        v["type"] == "error" && v["error"]["type"].is_string() && v["error"]["message"].is_string()
    } else {
        v["error"]["code"] == case.code.as_str()
            && v["error"]["message"].is_string()
            && v["error"].get("param").is_some()
    };
    if !envelope_ok {
        return Err(format!("wrong envelope: {v}"));
    }
    match request_id {
        Some(id) if v["request_id"] == id.as_str() => Ok(()),
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
