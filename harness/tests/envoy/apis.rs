//! Every inference API through real Envoy: routed, `model` rewritten byte-exactly, credentials stripped, the
//! token estimate and affinity source set; multi-turn conversations stay put; models in both dialects; the
//! request id on every response.

use llmroute_harness::emulator::RecordedRequest;
use llmroute_harness::envoy::Envoy;
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::*;

/// A captured SDK request: path, headers and the exact body bytes.
struct Capture {
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn capture(name: &str) -> Capture {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/sdk/");
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(format!("{dir}{name}.json")).unwrap()).unwrap();
    let headers = meta["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h[0].as_str().unwrap().to_string(), h[1].as_str().unwrap().to_string()))
        .filter(|(k, _)| k != "connection" && k != "accept-encoding")
        .collect();
    Capture {
        path: meta["path"].as_str().unwrap().to_string(),
        headers,
        body: std::fs::read(format!("{dir}{name}.body")).unwrap(),
    }
}

/// Two aliases on one fleet: `local-chat` (every API) and `embedder`.
async fn fleet_for_all_apis() -> (Fleet, Envoy) {
    let fleet = Fleet::start("llama-a", 3).await.unwrap();
    let config = json!({
        "version": 1,
        "backends": [fleet.backend_entry(150)],
        "models": [
            {"name": ALIAS, "routes": [{"backend": "llama-a", "upstream_model": UPSTREAM}]},
            {"name": "embedder", "endpoints": ["embeddings"], "routes": [{"backend": "llama-a", "upstream_model": "bge-small"}]},
            {"name": "passthrough", "model_prefix_routing": true, "routes": [{"backend": "llama-a"}]},
        ],
    });
    let envoy = Envoy::start(config).await.unwrap();
    (fleet, envoy)
}

fn only_request(fleet: &Fleet) -> RecordedRequest {
    let mut all: Vec<RecordedRequest> = fleet
        .engines
        .iter()
        .flat_map(|e| e.requests())
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(all.len(), 1, "exactly one upstream request");
    fleet.reset();
    all.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_is_routed_rewritten_and_cleaned() {
    let (fleet, envoy) = fleet_for_all_apis().await;
    let c = client();
    let cases = [
        ("chat-basic", "system", None, UPSTREAM),
        ("completions-basic", "user-prefix", None, UPSTREAM),
        (
            "responses-instructions-prompt-cache-key",
            "prompt-cache-key",
            Some("resp-1"),
            UPSTREAM,
        ),
        ("embeddings-two-inputs", "none", None, "bge-small"),
        ("messages-basic", "system", None, UPSTREAM),
        (
            "messages-tools-image-thinking-cache-control-claude-code",
            "session",
            Some("cc-sess-1"),
            UPSTREAM,
        ),
    ];
    for (name, source, echo, upstream) in cases {
        let cap = capture(name);
        let mut req = c.post(envoy.url(&cap.path)).body(cap.body.clone());
        for (k, v) in &cap.headers {
            req = req.header(k, v);
        }
        let resp = req.header("cookie", "session=secret").send().await.unwrap();
        let h = |n: &str| resp.headers().get(n).map(|v| v.to_str().unwrap().to_string());
        assert_eq!(h("x-llmroute-affinity-source").as_deref(), Some(source), "{name}");
        assert_eq!(h("x-multi-turn-session-id").as_deref(), echo, "{name}");
        assert!(h("x-request-id").is_some(), "{name}");
        let got = only_request(&fleet);
        assert_eq!(got.path, cap.path, "{name}");
        let client_model = serde_json::from_slice::<Value>(&cap.body).unwrap()["model"]
            .as_str()
            .unwrap()
            .to_string();
        let expected = String::from_utf8(cap.body.clone()).unwrap().replacen(
            &format!("\"{client_model}\""),
            &format!("\"{upstream}\""),
            1,
        );
        assert_eq!(
            String::from_utf8_lossy(&got.body),
            expected,
            "{name}: only model may change"
        );
        assert_eq!(
            got.header("content-length"),
            Some(expected.len().to_string().as_str()),
            "{name}"
        );
        for secret in ["authorization", "x-api-key", "cookie", "proxy-authorization"] {
            assert_eq!(got.header(secret), None, "{name}: {secret} reached the engine");
        }
        let tokens: u64 = got.header("x-input-tokens").unwrap().parse().unwrap();
        assert!(tokens >= 1, "{name}");
        assert_eq!(got.header("x-token-estimate"), got.header("x-input-tokens"), "{name}");
        assert_eq!(got.header("x-llmroute-affinity").is_some(), source != "none", "{name}");
        for kept in ["anthropic-version", "anthropic-beta", "user-agent"] {
            let sent = cap.headers.iter().find(|(k, _)| k == kept).map(|(_, v)| v.as_str());
            assert_eq!(got.header(kept), sent, "{name}: {kept} must pass through");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_token_estimates_are_replaced_by_the_gateways() {
    let (fleet, envoy) = fleet_for_all_apis().await;
    let (status, _, _) = post(
        &client(),
        &envoy,
        &chat(None, "hi"),
        &[
            ("x-input-tokens", "1"),
            ("x-token-estimate", "999999"),
            ("x-llmroute-affinity", "0"),
        ],
    )
    .await;
    assert_eq!(status, 200);
    let got = only_request(&fleet);
    assert_ne!(got.header("x-token-estimate"), Some("999999"));
    assert_eq!(got.header("x-token-estimate"), got.header("x-input-tokens"));
    assert_ne!(got.header("x-llmroute-affinity"), Some("0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_prefix_routing_sends_the_rest_upstream_unchanged() {
    let (fleet, envoy) = fleet_for_all_apis().await;
    let body = json!({"model": "passthrough/org/Model-7B:q4", "messages": [{"role": "user", "content": "x"}]});
    let (status, _, _) = post(&client(), &envoy, &body, &[]).await;
    assert_eq!(status, 200);
    let got: Value = serde_json::from_slice(&only_request(&fleet).body).unwrap();
    assert_eq!(got["model"], "org/Model-7B:q4");
}

/// Sends one turn, returns the backend that answered.
async fn turn(c: &reqwest::Client, envoy: &Envoy, path: &str, body: &Value) -> String {
    let r = post_json(c, envoy.url(path), body.to_string(), &[]).await;
    assert_eq!(
        r.header("x-llmroute-affinity-source"),
        Some("user-prefix"),
        "{path}: no system prompt, no session: the first user message keys it"
    );
    r.header("x-emu-backend").unwrap().to_string()
}

/// Ten turns, each resent with the whole history, as clients do; assistant turns carry reasoning text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_turn_conversation_stays_on_one_backend_in_every_dialect() {
    let (_fleet, envoy) = fleet_for_all_apis().await;
    let c = client();
    for conversation in 0..3 {
        let opener = format!("Conversation {conversation}: help me plan a trip to Lisbon.");
        let (mut chat_msgs, mut resp_items, mut anth_msgs) = (Vec::new(), Vec::new(), Vec::new());
        let mut seen = std::collections::BTreeSet::new();
        for t in 0..10 {
            let user = if t == 0 {
                opener.clone()
            } else {
                format!("Follow-up {t}")
            };
            chat_msgs.push(json!({"role": "user", "content": user}));
            resp_items.push(json!({"role": "user", "content": [{"type": "input_text", "text": user}]}));
            anth_msgs.push(json!({"role": "user", "content": [{"type": "text", "text": user}]}));
            let chat = json!({"model": ALIAS, "messages": chat_msgs});
            let resp = json!({"model": ALIAS, "input": resp_items});
            let anth = json!({"model": ALIAS, "max_tokens": 32, "messages": anth_msgs});
            seen.insert(("chat", turn(&c, &envoy, "/v1/chat/completions", &chat).await));
            turn(&c, &envoy, "/v1/responses", &resp).await;
            turn(&c, &envoy, "/v1/messages", &anth).await;
            let reply = format!("Answer {t}, after thinking hard about turn {t}.");
            chat_msgs.push(json!({"role": "assistant", "content": reply, "reasoning_content": "hmm"}));
            resp_items.push(json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]}));
            resp_items.push(json!({"role": "assistant", "content": [{"type": "output_text", "text": reply}]}));
            anth_msgs.push(json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": format!("reasoning {t}"), "signature": "s"},
                {"type": "text", "text": reply}]}));
        }
        assert_eq!(
            seen.len(),
            1,
            "conversation {conversation} moved between backends: {seen:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_messages_turns_stick_too() {
    let (fleet, envoy) = fleet_for_all_apis().await;
    let c = client();
    let mut items = Vec::new();
    let mut msgs = Vec::new();
    for t in 0..10 {
        items.push(json!({"role": "user", "content": format!("question {t} about Rust lifetimes")}));
        msgs.push(json!({"role": "user", "content": format!("question {t} about Rust lifetimes")}));
        turn(&c, &envoy, "/v1/responses", &json!({"model": ALIAS, "input": items})).await;
        turn(
            &c,
            &envoy,
            "/v1/messages",
            &json!({"model": ALIAS, "max_tokens": 8, "messages": msgs}),
        )
        .await;
        items.push(json!({"role": "assistant", "content": format!("answer {t}")}));
        msgs.push(json!({"role": "assistant", "content": format!("answer {t}")}));
    }
    let by_path = |path: &str| -> Vec<usize> {
        fleet
            .engines
            .iter()
            .map(|e| e.requests().iter().filter(|r| r.path == path).count())
            .collect()
    };
    for path in ["/v1/responses", "/v1/messages"] {
        let counts = by_path(path);
        assert!(counts.contains(&10), "{path}: {counts:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_speak_anthropic_when_asked_with_paging() {
    let (_fleet, envoy) = fleet_for_all_apis().await;
    let c = client();
    let openai = get_json(&c, envoy.url("/v1/models"), &[]).await.body;
    assert_eq!(openai["object"], "list");
    assert_eq!(openai["data"].as_array().unwrap().len(), 3);
    let anthropic = [("anthropic-version", "2023-06-01")];
    let page = |q: &'static str| get_json(&c, envoy.url(&format!("/v1/models{q}")), &anthropic);
    let first = page("?limit=2").await.body;
    assert_eq!(first["data"].as_array().unwrap().len(), 2);
    assert_eq!(first["has_more"], true);
    assert_eq!(first["first_id"], ALIAS);
    assert_eq!(first["data"][0]["type"], "model");
    let second = page("?limit=2&after_id=embedder").await.body;
    assert_eq!(second["data"][0]["id"], "passthrough");
    assert_eq!(second["has_more"], false);
    let one = get_json(&c, envoy.url("/v1/models/local-chat"), &anthropic).await.body;
    assert_eq!((one["type"].as_str(), one["id"].as_str()), (Some("model"), Some(ALIAS)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_kept_when_well_formed_and_replaced_otherwise() {
    let (fleet, envoy) = fleet_for_all_apis().await;
    let c = client();
    let ok = get_json(&c, envoy.url("/v1/models"), &[("x-request-id", "req-abc-123")]).await;
    assert_eq!(ok.header("x-request-id").unwrap(), "req-abc-123");
    let bad = post_json(
        &c,
        envoy.url("/v1/chat/completions"),
        "{}",
        &[("x-request-id", "has spaces; and \"quotes\"")],
    )
    .await;
    let replaced = bad.header("x-request-id").unwrap();
    assert!(replaced.starts_with("llmroute-"), "{replaced}");
    assert_eq!(bad.body["request_id"], replaced);
    let (status, _, _) = post(&c, &envoy, &chat(None, "x"), &[("x-request-id", "trace-42")]).await;
    assert_eq!(status, 200);
    assert_eq!(only_request(&fleet).header("x-request-id"), Some("trace-42"));
}
