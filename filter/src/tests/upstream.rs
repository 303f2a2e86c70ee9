//! The upstream role (`upstream.rs`): on a failover cluster, each attempt's body gets the model of the backend
//! Envoy picked, and a body that cannot carry it is a JSON 503.

use llmroute_core::envoy_contract::{METADATA_BACKEND, METADATA_NAMESPACE, UPSTREAM_ROOT_ID};
use proxy_wasm::types::Action;

use super::*;

/// Two priorities for one alias: the failover cluster's upstream filter rewrites the model per backend.
const FAILOVER: &str = r#"{
  "version": 1,
  "backends": [
    { "name": "llama-a", "kind": "llamacpp", "endpoints": ["127.0.0.1:8081"] },
    { "name": "vllm-b", "kind": "vllm", "endpoints": ["127.0.0.1:9001"] }
  ],
  "models": [ { "name": "chat", "routes": [
    { "backend": "llama-a", "upstream_model": "qwen3-0.6b", "priority": 1 },
    { "backend": "vllm-b", "upstream_model": "Qwen/Qwen3-32B", "priority": 2 } ] } ]
}"#;

fn upstream_root(fake: &Rc<FakeHost>) -> Root {
    fake.set_property_bytes(&["plugin_root_id"], UPSTREAM_ROOT_ID.as_bytes());
    root(fake, FAILOVER)
}

fn attempt(fake: &Rc<FakeHost>, root: &Root, backend: Option<&str>, body: &[u8]) -> (Vec<Action>, Exchange) {
    let path = [
        "xds",
        "upstream_host_metadata",
        "filter_metadata",
        METADATA_NAMESPACE,
        METADATA_BACKEND,
    ];
    match backend {
        Some(b) => fake.set_property_bytes(&path, b.as_bytes()),
        None => fake.set_property_bytes(&path, b""),
    }
    let mut x = Exchange::new(fake, root, 1);
    let headers = [&REQUEST_HEADERS[..], &[("x-llmroute-alias", "chat")]].concat();
    let actions = vec![x.request_headers(&headers, false), x.request_body(body, true)];
    (actions, x)
}

#[test]
fn each_attempt_carries_the_model_of_the_backend_envoy_picked() {
    let fake = FakeHost::new();
    let root = upstream_root(&fake);
    let body = br#"{"model":"qwen3-0.6b","messages":[]}"#;
    let (actions, x) = attempt(&fake, &root, Some("vllm-b"), body);
    assert_eq!(actions, vec![Action::Pause, Action::Continue]);
    let sent = x.request_buffer();
    assert_eq!(sent, br#"{"model":"Qwen/Qwen3-32B","messages":[]}"#.to_vec());
    assert_eq!(x.request_header("content-length"), Some(sent.len().to_string()));
    // Already the right model: untouched, its length set.
    let (_, x) = attempt(&fake, &root, Some("llama-a"), body);
    assert_eq!(
        (x.request_buffer(), x.request_header("content-length")),
        (body.to_vec(), Some(body.len().to_string()))
    );
}

#[test]
fn a_body_that_cannot_carry_the_model_is_a_json_503_and_unknown_hosts_pass() {
    let fake = FakeHost::new();
    let root = upstream_root(&fake);
    let (actions, x) = attempt(&fake, &root, Some("vllm-b"), b"{not json");
    assert_eq!(actions[1], Action::Pause);
    assert_eq!(fake.replies()[0].status, 503);
    assert_eq!(x.request_header("content-length"), None);
    // A host without the backend in its metadata: nothing to rewrite.
    let (actions, _) = attempt(&fake, &root, Some("elsewhere"), b"{}");
    assert_eq!(actions, vec![Action::Continue, Action::Continue]);
}
