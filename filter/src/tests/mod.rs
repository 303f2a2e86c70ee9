//! Native tests of the glue: the root and request contexts, placement, the status poll and the `/props` check,
//! driven the way Envoy drives them, against the in-memory host of `host::fake`.
//!
//! What these tests own: phase order and pauses, what each phase leaves in Envoy (headers, bodies, local replies,
//! shared data, callouts, metrics, access-log fields), and that a host error at any call neither panics nor
//! loses the request. What only Envoy can show (its codecs, routing, retries, the stateful-session filter, the
//! real ABI) stays in the e2e tests of `harness/tests/envoy/`. The core's decisions have their own tests in
//! `filter/core/tests/`.

mod admission;
mod assemble;
mod budget;
mod engine_load;
mod fair_queue;
mod fleet_check;
mod global_limits;
mod http;
mod key_placement;
#[cfg(feature = "bench-phases")]
mod phases;
mod placement_store;
mod status;
mod upstream;

use std::rc::Rc;

use proxy_wasm::traits::{HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, MapType};

use crate::host::fake::FakeHost;
use crate::root::Root;

/// A fleet of two llama.cpp servers behind one alias, placed by Envoy's ring (`hash`).
pub const CONFIG: &str = r#"{
  "version": 1,
  "backends": [
    { "name": "llama-a", "kind": "llamacpp", "endpoints": ["127.0.0.1:8081", "127.0.0.1:8082"] }
  ],
  "models": [ { "name": "chat", "routes": [ { "backend": "llama-a", "upstream_model": "qwen3-0.6b" } ] } ],
  "affinity": { "session_headers": ["x-session-id"] }
}"#;

/// [`CONFIG`] with `bounded_keys` placement and debug headers.
pub fn bounded_config() -> String {
    CONFIG.replace(
        r#""affinity": { "session_headers": ["x-session-id"] }"#,
        r#""affinity": { "session_headers": ["x-session-id"], "placement": "bounded_keys" }, "debug_headers": true"#,
    )
}

/// A configured root context (the main role), made with `fake` as its host.
pub fn root(fake: &Rc<FakeHost>, config: &str) -> Root {
    fake.set_buffer_bytes(BufferType::PluginConfiguration, config.as_bytes());
    let mut root = Root::new(fake.envoy());
    assert!(root.on_configure(config.len()), "the test config loads");
    root
}

/// A chat request's body; its system prompt is the affinity key.
pub const CHAT: &str = r#"{"model":"chat","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"PROMPT-TEXT-7f3a"}]}"#;

pub fn chat(stream: bool) -> String {
    match stream {
        true => CHAT.replacen('{', r#"{"stream":true,"#, 1),
        false => CHAT.to_string(),
    }
}

pub const REQUEST_HEADERS: [(&str, &str); 5] = [
    (":method", "POST"),
    (":path", "/v1/chat/completions"),
    (":authority", "gw"),
    ("content-type", "application/json"),
    ("x-request-id", "req-0001"),
];

/// One HTTP stream through one request context, as Envoy runs it: callbacks in order, the body buffered while
/// the filter pauses and passed on chunk by chunk once it continues.
pub struct Exchange {
    pub fake: Rc<FakeHost>,
    pub ctx: Box<dyn HttpContext>,
    request_paused: bool,
    response_paused: bool,
    /// The response bytes the client got.
    pub delivered: Vec<u8>,
}

impl Exchange {
    pub fn new(fake: &Rc<FakeHost>, root: &Root, context_id: u32) -> Exchange {
        let ctx = root.create_http_context(context_id).expect("a request context");
        Exchange {
            fake: fake.clone(),
            ctx,
            request_paused: false,
            response_paused: false,
            delivered: Vec::new(),
        }
    }

    pub fn request_headers(&mut self, headers: &[(&str, &str)], end_of_stream: bool) -> Action {
        self.fake.set_map(MapType::HttpRequestHeaders, headers);
        self.fake.set_buffer_bytes(BufferType::HttpRequestBody, b"");
        let a = self.ctx.on_http_request_headers(headers.len(), end_of_stream);
        self.request_paused = a == Action::Pause;
        a
    }

    pub fn request_body(&mut self, chunk: &[u8], end_of_stream: bool) -> Action {
        if !self.request_paused {
            self.fake.set_buffer_bytes(BufferType::HttpRequestBody, b"");
        }
        let size = self.fake.append_buffer(BufferType::HttpRequestBody, chunk);
        let a = self.ctx.on_http_request_body(size, end_of_stream);
        self.request_paused = a == Action::Pause;
        a
    }

    pub fn request_trailers(&mut self) -> Action {
        self.ctx.on_http_request_trailers(0)
    }

    pub fn response_headers(&mut self, headers: &[(&str, &str)], end_of_stream: bool) -> Action {
        self.fake.set_map(MapType::HttpResponseHeaders, headers);
        self.fake.set_buffer_bytes(BufferType::HttpResponseBody, b"");
        self.ctx.on_http_response_headers(headers.len(), end_of_stream)
    }

    pub fn response_body(&mut self, chunk: &[u8], end_of_stream: bool) -> Action {
        if !self.response_paused {
            self.fake.set_buffer_bytes(BufferType::HttpResponseBody, b"");
        }
        let size = self.fake.append_buffer(BufferType::HttpResponseBody, chunk);
        let a = self.ctx.on_http_response_body(size, end_of_stream);
        self.response_paused = a == Action::Pause;
        if a == Action::Continue {
            self.delivered.extend(self.fake.buffer(BufferType::HttpResponseBody));
        }
        a
    }

    pub fn log(&mut self) {
        self.ctx.on_log();
    }

    pub fn request_header(&self, name: &str) -> Option<String> {
        self.fake.header(MapType::HttpRequestHeaders, name)
    }

    pub fn response_header(&self, name: &str) -> Option<String> {
        self.fake.header(MapType::HttpResponseHeaders, name)
    }

    pub fn request_buffer(&self) -> Vec<u8> {
        self.fake.buffer(BufferType::HttpRequestBody)
    }
}

/// An engine's streamed answer, usage included, ending with `[DONE]`.
pub const SSE: [&str; 3] = [
    "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3}}\n\n",
    "data: [DONE]\n\n",
];

pub const JSON_ANSWER: &str = r#"{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#;

/// Runs a whole chat exchange: the request in two body chunks, a 200 answer (SSE in three chunks, or JSON),
/// then the log phase. Returns the request-phase actions.
pub fn run_chat(x: &mut Exchange, stream: bool) -> Vec<Action> {
    let body = chat(stream);
    let (a, b) = body.as_bytes().split_at(body.len() / 2);
    let mut actions = vec![x.request_headers(&REQUEST_HEADERS, false)];
    if actions[0] == Action::Pause && x.fake.replies().is_empty() {
        actions.push(x.request_body(a, false));
        actions.push(x.request_body(b, true));
    }
    if x.fake.replies().is_empty() {
        let content_type = if stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        x.response_headers(&[(":status", "200"), ("content-type", content_type)], false);
        x.fake.set_property_bytes(&["response", "code"], &200u64.to_le_bytes());
        if stream {
            for (i, chunk) in SSE.iter().enumerate() {
                x.response_body(chunk.as_bytes(), i == SSE.len() - 1);
            }
        } else {
            x.response_body(JSON_ANSWER.as_bytes(), true);
        }
    }
    x.log();
    actions
}
