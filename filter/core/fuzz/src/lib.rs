//! What the fuzz targets share: the fixed config they route with, and the small input formats that let one
//! byte string carry several arguments (an API choice, chunk boundaries, header lines).
//!
//! The targets call the core exactly as the filter does (`filter/src/http/`, `response.rs`,
//! `key_placement.rs`); the oracle is Rust's own checks (bounds, overflow, debug assertions) and any panic,
//! plus the few invariants each target asserts because the filter relies on them.

use std::sync::OnceLock;

use llmroute_core::{Api, Config};

/// One config with every feature the request path branches on: a renamed alias with two routes (failover
/// cluster, `max_context` placement, `stream_upstream: always`), an alias left as is, prefix routing, an alias limited to some APIs, an
/// embeddings alias, explicit keys from the body, and the gateway's include-usage option. The aliases match the
/// SDK captures in `testdata/sdk/`, so the seeds reach the API modules.
pub const CONFIG: &str = r#"{
  "version": 1,
  "backends": [
    { "name": "llama-a", "kind": "llamacpp", "endpoints": ["127.0.0.1:8081", "127.0.0.1:8082"], "max_context": 4096 },
    { "name": "vllm-b", "kind": "vllm", "endpoints": ["10.0.0.5:8000"], "lb": "least_request" }
  ],
  "models": [
    { "name": "local-chat", "routes": [
        { "backend": "llama-a", "upstream_model": "qwen3-0.6b", "priority": 1 },
        { "backend": "vllm-b", "upstream_model": "Qwen/Qwen3-8B", "priority": 2 } ],
      "stream_upstream": "always" },
    { "name": "same", "routes": [ { "backend": "vllm-b" } ] },
    { "name": "p", "model_prefix_routing": true, "routes": [ { "backend": "vllm-b", "upstream_model": "base" } ] },
    { "name": "chat-only", "endpoints": ["chat", "messages"], "routes": [ { "backend": "llama-a" } ] },
    { "name": "embedder", "endpoints": ["embeddings"], "routes": [ { "backend": "vllm-b", "upstream_model": "bge-m3" } ] }
  ],
  "affinity": {
    "session_headers": ["x-session-id", "x-multi-turn-session-id"],
    "conversation_id": true,
    "anthropic_user_id": true,
    "user_prefix_bytes": 64
  },
  "usage": { "stream_include_usage": true }
}"#;

/// [`CONFIG`], loaded once per process. `None` only if the core refused it, which the targets report as a crash.
pub fn config() -> Option<&'static Config> {
    static CFG: OnceLock<Option<Config>> = OnceLock::new();
    CFG.get_or_init(|| llmroute_core::load_config(CONFIG).ok()).as_ref()
}

/// The API named by a selector byte.
pub fn api(selector: u8) -> Api {
    let all = Api::ALL;
    all[usize::from(selector) % all.len()]
}

/// Splits `data` into chunks: the first byte says how many cuts (0 to 15), each cut is one more byte giving the
/// next chunk's length (0 to 255), and whatever is left after the last cut is the last chunk. With no cut the
/// whole rest is one chunk, so a raw capture prefixed by a zero byte is a valid input.
pub fn chunks(data: &[u8]) -> Vec<&[u8]> {
    let Some((&n, rest)) = data.split_first() else {
        return vec![data];
    };
    let cuts = usize::from(n & 0x0f).min(rest.len());
    let (lens, mut body) = rest.split_at(cuts);
    let mut out = Vec::with_capacity(cuts + 1);
    for &len in lens {
        let (head, tail) = body.split_at(usize::from(len).min(body.len()));
        out.push(head);
        body = tail;
    }
    out.push(body);
    out
}

/// A request head as text lines: the method, the path, then `name: value` headers (names as sent; Envoy gives
/// the filter lower-case ones). Values are bytes, as the host returns them.
pub struct Head<'a> {
    pub method: &'a [u8],
    pub path: &'a [u8],
    pub headers: Vec<(String, &'a [u8])>,
}

pub fn head(data: &[u8]) -> Head<'_> {
    let mut lines = data.split(|&b| b == b'\n');
    let method = lines.next().unwrap_or_default();
    let path = lines.next().unwrap_or_default();
    let headers = lines
        .filter_map(|line| {
            let colon = line.iter().position(|&b| b == b':')?;
            let (name, value) = line.split_at(colon);
            let value = value.get(1..).unwrap_or_default();
            let value = value.strip_prefix(b" ").unwrap_or(value);
            Some((String::from_utf8_lossy(name).to_ascii_lowercase(), value))
        })
        .collect();
    Head { method, path, headers }
}

/// True when `v` can go into a header value: no CR, LF or NUL.
pub fn header_safe(v: &[u8]) -> bool {
    !v.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0))
}
