//! The per-request context: read what Envoy knows, ask the core for the phase's plan, apply it.
//!
//! Each request callback applies one plan from the core and decides nothing itself:
//!
//! - **Request headers** (`request.rs`): the headers plan (`llmroute_core::request_plan::headers`) names the
//!   headers to strip, the request id, the key, and what follows: a local reply, a status page, `/v1/models`, or
//!   the body to buffer once the key's request limit is admitted.
//! - **Request body** (`request.rs`): at end of stream (in the body or trailers callback, since HTTP/2 may end
//!   there) the body plan (`request_plan::body`) routes the request; the glue admits its token charges, sends the
//!   body edit, sets the headers and log fields the plan lists, and places the request: with bounded-keys
//!   placement it pins the host (`key_placement`, or the placement store first, where it may wait paused), and
//!   with `fairness` it takes its place in its backend's queue (`fair_queue`), where it may wait paused too.
//! - **Response** (`response.rs`): the response-header plan (`llmroute_core::response_plan`) names the headers
//!   and what to do with the body (relay, watch, rebuild, rewrite).
//! - **Log** (`log.rs`): placement, work in flight, limits and the fair queue's slot are given back; metrics
//!   are recorded.
//!
//! Every local reply goes out through `reply.rs`, which also gives back what the request held.

mod log;
mod reply;
mod request;
mod response;

use std::rc::Rc;

use llmroute_core::auth::Keys;
use llmroute_core::limits::Charge;
use llmroute_core::request_plan::headers::Tenant;
use llmroute_core::{Api, Config, Envelope, RouteDecision, SessionHeaders};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use crate::host;
use crate::key_placement::Pin;
use crate::metrics::Metrics;
use crate::phases::{self, Phase};
use crate::response::ResponseWatch;

pub use reply::send_head_edit;

pub struct Http {
    /// The host this request's calls go to.
    envoy: host::Envoy,
    cfg: Option<Rc<Config>>,
    /// The API keys, when `auth` is on.
    keys: Option<Rc<Keys>>,
    /// The name of the key the request presented.
    key: Option<String>,
    /// What the request took from the limit buckets, settled in the log phase.
    charges: Vec<Charge>,
    /// What the buckets had left after this request was admitted (debug headers).
    remaining: crate::admission::Remaining,
    /// With `global_limits`: what the rate-limit filter's stream-done call may charge.
    global: Option<crate::global_limits::Pending>,
    metrics: Metrics,
    context_id: u32,
    /// Set when Envoy shed the request (circuit breaker overflow) and the body is being replaced.
    replacing_overflow: bool,
    request_id: Option<String>,
    /// The request's `content-length` as the client sent it (Envoy has checked it is a number).
    sent_length: Option<Vec<u8>>,
    /// Set while an inference body is being buffered.
    reading: Option<(Api, SessionHeaders)>,
    body_size: usize,
    /// What was decided, for the response headers.
    routed: Option<RouteDecision>,
    /// Watches the response of a routed request.
    watch: Option<ResponseWatch>,
    /// The host bounded-keys placement pinned the request to.
    pin: Option<Pin>,
    /// The request's estimated prompt tokens and requested output, which its pin adds to its host's work in
    /// flight (with `load`), and that work, released in the log phase.
    estimate: (u64, Option<u64>),
    work: Option<crate::engine_load::Work>,
    /// The placement store's answer the paused request waits for.
    store_wait: Option<crate::placement_store::Waiting>,
    /// When the request started, and when the first response body byte came (host clock, ms).
    started_ms: u64,
    first_byte_ms: Option<u64>,
    /// The response's `:status`, as the response-header plan read it: the log phase's status.
    status: Option<u32>,
    /// The backend that served the routed request.
    backend: Option<String>,
    /// A backend error on `/v1/messages` is being buffered, to go out in the Anthropic envelope.
    rewriting_error: Option<u32>,
    /// The envelope of the request's route, once the headers phase knows it (OpenAI until then).
    envelope: Envelope,
    /// With `fairness`: the request's tenant, from the headers phase.
    tenant: Option<Tenant>,
    /// With `fairness`: the request's place in its backend's queue, given back in the log phase.
    ticket: Option<crate::fair_queue::Ticket>,
}

impl Http {
    pub fn new(
        envoy: host::Envoy,
        cfg: Option<Rc<Config>>,
        keys: Option<Rc<Keys>>,
        metrics: Metrics,
        context_id: u32,
    ) -> Self {
        Http {
            envoy,
            cfg,
            keys,
            key: None,
            charges: Vec::new(),
            remaining: Default::default(),
            global: None,
            metrics,
            context_id,
            replacing_overflow: false,
            request_id: None,
            sent_length: None,
            reading: None,
            body_size: 0,
            routed: None,
            watch: None,
            pin: None,
            estimate: (0, None),
            work: None,
            store_wait: None,
            started_ms: 0,
            first_byte_ms: None,
            status: None,
            backend: None,
            rewriting_error: None,
            envelope: Envelope::OpenAi,
            tenant: None,
            ticket: None,
        }
    }
}

impl Context for Http {
    fn on_http_call_response(&mut self, token_id: u32, _num_headers: usize, body_size: usize, _num_trailers: usize) {
        self.store_answered(token_id, body_size);
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if !phases::runs(Phase::Headers) {
            return Action::Continue;
        }
        self.started_ms = self.envoy.now_ms();
        match self.cfg.clone() {
            Some(cfg) => self.request_headers(&cfg, end_of_stream),
            None => self.unavailable(),
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.reading.is_none() {
            return Action::Continue;
        }
        match self.cfg.clone() {
            Some(cfg) => self.request_body(&cfg, body_size, end_of_stream),
            None => self.unavailable(),
        }
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if self.reading.is_none() {
            return Action::Continue;
        }
        match self.cfg.clone() {
            Some(cfg) => self.finish_body(&cfg),
            None => self.unavailable(),
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if !phases::runs(Phase::Response) {
            return Action::Continue;
        }
        self.response_headers()
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !phases::runs(Phase::Response) {
            return Action::Continue;
        }
        self.response_body(body_size, end_of_stream)
    }

    fn on_log(&mut self) {
        if !phases::runs(Phase::Response) {
            return;
        }
        self.log();
    }
}
