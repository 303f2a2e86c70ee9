//! Shared helpers for the integration tests: configs, SDK fixtures, a deterministic generator.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(dead_code)]

use llmroute_core::json::{scan_object, Member, Span, MAX_DEPTH};
use llmroute_core::key_placement::{Bounds, HostView};
use llmroute_core::{
    load_config, load_document, route, Api, Config, Document, GatewayError, RouteDecision, SessionKey,
};

/// Two backends, four aliases. `local-chat` is renamed upstream, `same` is not, `big` has two routes whose
/// priorities reverse their listed order, `embedder` exists so the embeddings capture resolves.
pub const TWO_BACKENDS: &str = r#"{
  "version": 1,
  "backends": [
    { "name": "llama-a", "kind": "llamacpp", "endpoints": ["127.0.0.1:8081", "127.0.0.1:8082"] },
    { "name": "vllm-b", "kind": "vllm", "endpoints": ["10.0.0.5:8000"], "lb": "least_request" }
  ],
  "models": [
    { "name": "local-chat", "routes": [ { "backend": "llama-a", "upstream_model": "qwen3-0.6b" } ] },
    { "name": "big", "routes": [
        { "backend": "vllm-b", "upstream_model": "Qwen/Qwen3-32B", "priority": 5 },
        { "backend": "llama-a", "priority": 1 } ] },
    { "name": "same", "routes": [ { "backend": "vllm-b" } ] },
    { "name": "embedder", "routes": [ { "backend": "vllm-b", "upstream_model": "bge-m3" } ] }
  ]
}"#;

/// The README example (`testdata/configs/good-basic.yaml`) in its JSON form.
pub const README_EXAMPLE: &str = r#"{
  "version": 1,
  "listen": "127.0.0.1:10000",
  "admin": "127.0.0.1:9901",
  "backends": [
    {
      "name": "llama-a",
      "kind": "llamacpp",
      "endpoints": ["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"],
      "lb": "chwbl",
      "balance_factor": 175
    }
  ],
  "models": [
    { "name": "local-chat", "routes": [ { "backend": "llama-a", "upstream_model": "qwen3-0.6b", "priority": 10 } ] }
  ],
  "affinity": { "session_headers": ["x-session-id"], "user_prefix_bytes": 256 }
}"#;

pub fn config(text: &str) -> Config {
    match load_config(text) {
        Ok(c) => c,
        Err(e) => panic!("config should load:\n{e}"),
    }
}

/// A whole `llmroute.yaml`, the fields only the renderer reads included, as `llmroute validate` loads it.
pub fn document(text: &str) -> Document {
    match load_document(text) {
        Ok(c) => c,
        Err(e) => panic!("document should load:\n{e}"),
    }
}

pub fn two_backends() -> Config {
    config(TWO_BACKENDS)
}

/// [`TWO_BACKENDS`] with an `affinity` section.
pub fn two_backends_with_affinity(affinity_json: &str) -> Config {
    let text = TWO_BACKENDS.trim_end().trim_end_matches('}');
    config(&format!("{text}, \"affinity\": {affinity_json} }}"))
}

/// The captured SDK request bodies and their metadata, from `testdata/sdk/`.
pub fn sdk(name: &str) -> &'static [u8] {
    match name {
        "chat-basic.body" => include_bytes!("../../../../testdata/sdk/chat-basic.body"),
        "chat-basic.json" => include_bytes!("../../../../testdata/sdk/chat-basic.json"),
        "chat-stream-include-usage.body" => {
            include_bytes!("../../../../testdata/sdk/chat-stream-include-usage.body")
        }
        "chat-stream-include-usage.json" => {
            include_bytes!("../../../../testdata/sdk/chat-stream-include-usage.json")
        }
        "chat-tools-image-prompt-cache-key.body" => {
            include_bytes!("../../../../testdata/sdk/chat-tools-image-prompt-cache-key.body")
        }
        "chat-tools-image-prompt-cache-key.json" => {
            include_bytes!("../../../../testdata/sdk/chat-tools-image-prompt-cache-key.json")
        }
        "messages-tools-image-thinking-cache-control-claude-code.body" => {
            include_bytes!("../../../../testdata/sdk/messages-tools-image-thinking-cache-control-claude-code.body")
        }
        "messages-tools-image-thinking-cache-control-claude-code.json" => {
            include_bytes!("../../../../testdata/sdk/messages-tools-image-thinking-cache-control-claude-code.json")
        }
        "responses-instructions-prompt-cache-key.body" => {
            include_bytes!("../../../../testdata/sdk/responses-instructions-prompt-cache-key.body")
        }
        "responses-instructions-prompt-cache-key.json" => {
            include_bytes!("../../../../testdata/sdk/responses-instructions-prompt-cache-key.json")
        }
        "completions-basic.body" => include_bytes!("../../../../testdata/sdk/completions-basic.body"),
        "completions-basic.json" => include_bytes!("../../../../testdata/sdk/completions-basic.json"),
        "embeddings-two-inputs.body" => include_bytes!("../../../../testdata/sdk/embeddings-two-inputs.body"),
        "embeddings-two-inputs.json" => include_bytes!("../../../../testdata/sdk/embeddings-two-inputs.json"),
        "messages-basic.body" => include_bytes!("../../../../testdata/sdk/messages-basic.body"),
        "messages-basic.json" => include_bytes!("../../../../testdata/sdk/messages-basic.json"),
        "messages-stream.body" => include_bytes!("../../../../testdata/sdk/messages-stream.body"),
        "messages-stream.json" => include_bytes!("../../../../testdata/sdk/messages-stream.json"),
        "responses-string-input-conversation.body" => {
            include_bytes!("../../../../testdata/sdk/responses-string-input-conversation.body")
        }
        "responses-string-input-conversation.json" => {
            include_bytes!("../../../../testdata/sdk/responses-string-input-conversation.json")
        }
        other => panic!("no fixture {other}"),
    }
}

/// Every captured body, by name without extension.
pub const SDK_NAMES: [&str; 10] = [
    "chat-basic",
    "chat-stream-include-usage",
    "chat-tools-image-prompt-cache-key",
    "messages-tools-image-thinking-cache-control-claude-code",
    "responses-instructions-prompt-cache-key",
    "completions-basic",
    "embeddings-two-inputs",
    "messages-basic",
    "messages-stream",
    "responses-string-input-conversation",
];

pub fn sdk_body(name: &str) -> &'static [u8] {
    sdk(&format!("{name}.body"))
}

/// The `.json` metadata of a capture, parsed.
pub fn sdk_meta(name: &str) -> serde_json::Value {
    serde_json::from_slice(sdk(&format!("{name}.json"))).unwrap()
}

/// The captured request headers as `(name, value)` pairs.
pub fn sdk_headers(name: &str) -> Vec<(String, String)> {
    sdk_meta(name)["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            (
                pair[0].as_str().unwrap().to_string(),
                pair[1].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The API a capture was sent to, from its recorded path.
pub fn sdk_api(name: &str) -> Api {
    let meta = sdk_meta(name);
    let path = meta["path"].as_str().unwrap();
    Api::ALL
        .into_iter()
        .find(|a| a.path() == path)
        .unwrap_or_else(|| panic!("{name}: no API at {path}"))
}

/// A header lookup over `(name, value)` pairs, as `route::session_from_headers` and `request::start` take it.
pub fn lookup<'h>(headers: &'h [(&'h str, &'h str)]) -> impl Fn(&str) -> Option<&'h [u8]> + 'h {
    move |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_bytes())
}

/// Borrows owned header pairs for [`lookup`].
pub fn borrowed(owned: &[(String, String)]) -> Vec<(&str, &str)> {
    owned.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect()
}

/// Routes `body` for `api`, panicking with the body on refusal.
pub fn routes(cfg: &Config, api: Api, body: &[u8], session: Option<&SessionKey>) -> RouteDecision {
    match route(cfg, api, body, session) {
        Ok(d) => d,
        Err(e) => panic!("{} {} should route: {e:?}", api.name(), String::from_utf8_lossy(body)),
    }
}

/// Routes `body` for `api`, panicking if it is accepted.
pub fn refuses(cfg: &Config, api: Api, body: &[u8], session: Option<&SessionKey>) -> GatewayError {
    match route(cfg, api, body, session) {
        Ok(d) => panic!(
            "{} {} should be refused, got {d:?}",
            api.name(),
            String::from_utf8_lossy(body)
        ),
        Err(e) => e,
    }
}

/// The affinity header value of a decision, or `""` when there is no key.
pub fn hex_of(d: &RouteDecision) -> String {
    d.affinity.map(|a| a.header_value()).unwrap_or_default()
}

/// One backend `b` and one alias `m` with the given extra alias fields (a JSON object body without braces, or
/// empty), and an optional top-level `affinity` section.
pub fn one_alias(alias_fields: &str, affinity_json: Option<&str>) -> Config {
    let extra = if alias_fields.is_empty() {
        String::new()
    } else {
        format!(", {alias_fields}")
    };
    let affinity = affinity_json
        .map(|a| format!(r#", "affinity": {a}"#))
        .unwrap_or_default();
    config(&format!(
        r#"{{"version":1,"backends":[{{"name":"b","kind":"vllm","endpoints":["10.0.0.1:8000"]}}],
            "models":[{{"name":"m","routes":[{{"backend":"b","upstream_model":"up"}}]{extra}}}]{affinity}}}"#
    ))
}

/// Scans `body` with the production depth limit and panics on error.
pub fn members(body: &[u8]) -> Vec<Member> {
    match scan_object(body, MAX_DEPTH) {
        Ok(m) => m,
        Err(e) => panic!("{e}: {}", String::from_utf8_lossy(body)),
    }
}

/// The value span of the first top-level member named `name` (unescaped keys only).
pub fn member_span(body: &[u8], name: &str) -> Span {
    let quoted = format!("\"{name}\"");
    members(body)
        .into_iter()
        .find(|m| m.key.of(body) == quoted.as_bytes())
        .unwrap_or_else(|| panic!("no member {name}"))
        .value
}

/// The text of a span, for assertions.
pub fn text(body: &[u8], span: Span) -> &str {
    std::str::from_utf8(span.of(body)).unwrap()
}

/// A 64-bit LCG (Knuth's MMIX constants): deterministic, no dependency.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 ^ (self.0 >> 29)
    }

    /// Uniform-ish in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() >> 16) % n as u64) as usize
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The idle TTL of the placement tests' bounds.
pub const PLACEMENT_TTL: u64 = 300_000;

/// `n` equal, up, idle hosts `127.0.0.1:8001`, `:8002`, ...
pub fn hosts(n: usize) -> Vec<HostView> {
    (0..n)
        .map(|i| HostView {
            address: format!("127.0.0.1:{}", 8001 + i),
            up: true,
            weight: 1,
            in_flight: 0,
            queued: None,
        })
        .collect()
}

/// Placement bounds with `key_factor`, Envoy's in-flight factor 150, [`PLACEMENT_TTL`] and 4096 keys.
pub fn bounds(key_factor: u32) -> Bounds {
    Bounds {
        key_factor,
        in_flight_factor: 150,
        idle_ttl_ms: PLACEMENT_TTL,
        max_keys: 4096,
        spill_queue: None,
        host_max_inflight: None,
    }
}
