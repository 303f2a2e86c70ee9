//! The per-request context: read headers and body from Envoy, ask the core for a decision, apply it.
//!
//! Headers phase: strip the client's `x-llmroute-*`, token-estimate and credential headers, make sure the
//! request id is usable, and let the core classify the request (refusals and `/v1/models` are answered here; so
//! is a key over its request limit, before any body byte is read).
//! For an inference API, pause and buffer the body up to the limit. At end of stream (in the body or trailers
//! callback, since HTTP/2 may end there) decide once, then rewrite `model`, set `content-length`, the
//! cluster and affinity headers the route reads, and the token estimate; with bounded-keys placement, also pin
//! the host (see `key_placement`); with `fairness`, take the request's place in its backend's queue, where it may
//! wait paused (see `fair_queue`). The response headers follow the core's plan (`llmroute_core::response_plan`):
//! the affinity source, an echoed session key, debug headers, and what to do with the body.

use std::rc::Rc;

use llmroute_core::auth::Keys;
use llmroute_core::limits::{self, Charge};
use llmroute_core::request::{self, Refusal, RequestStart};
use llmroute_core::response_plan::{self, BodyPlan};
use llmroute_core::{
    anthropic, headers, models, route, Api, BodyPatch, Config, Endpoint, Envelope, GatewayError, RouteDecision,
    SessionHeaders,
};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use llmroute_core::envoy_contract::log_fields;
use llmroute_core::load::orca;
use llmroute_core::stream::Usage;

use crate::fair_queue::Gate;
use crate::host;
use crate::key_placement::{self, Pin};
use crate::metrics::{Finished, Metrics};
use crate::phases::{self, Phase};
use crate::response::{Hold, ResponseWatch};

pub struct Http {
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
    tenant: Option<crate::fair_queue::Tenant>,
    /// With `fairness`: the request's place in its backend's queue, given back in the log phase.
    ticket: Option<crate::fair_queue::Ticket>,
}

impl Http {
    pub fn new(cfg: Option<Rc<Config>>, keys: Option<Rc<Keys>>, metrics: Metrics, context_id: u32) -> Self {
        Http {
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

    /// Gives back what the request took from the limit buckets: a request the gateway refuses holds nothing.
    fn release_charges(&mut self) {
        if !self.charges.is_empty() {
            crate::admission::give_back(&std::mem::take(&mut self.charges));
        }
    }

    /// Counts a limit's refusal by alias (`none` before the body names one), key and kind.
    fn count_limited(&self, e: &GatewayError, alias: &str) {
        if let GatewayError::RateLimited { kind, .. } = e {
            let key = self.key.as_deref().unwrap_or("none");
            self.metrics.rate_limited(alias, key, kind.as_str());
        }
    }

    fn refuse(&mut self, e: &GatewayError, envelope: Envelope) -> Action {
        log::debug!("llmroute: refused with {} {}", e.status(), e.code());
        self.release_charges();
        self.reading = None;
        self.metrics.rejected(e.metric_reason());
        send_refusal(e, envelope, self.request_id.as_deref());
        Action::Pause
    }

    /// With `fairness`, the routed request takes its place in its backend's queue (see `fair_queue`): it goes on,
    /// waits paused until the root context resumes or refuses it, or is refused now.
    fn enter_queue(&mut self, cfg: &Config) -> Action {
        let Some(d) = &self.routed else {
            return Action::Continue;
        };
        let gate = crate::fair_queue::enter(
            cfg,
            self.tenant,
            d,
            self.context_id,
            self.request_id.as_deref(),
            &self.metrics,
        );
        match gate {
            Gate::Go(ticket) => {
                self.ticket = ticket;
                Action::Continue
            }
            Gate::Wait(ticket) => {
                self.ticket = Some(ticket);
                Action::Pause
            }
            Gate::Refuse(e) => {
                let envelope = d.api.envelope();
                self.routed = None;
                self.refuse(&e, envelope)
            }
        }
    }

    fn reply_json(&mut self, body: &[u8]) -> Action {
        let mut hdrs = vec![("content-type", "application/json")];
        if let Some(id) = &self.request_id {
            hdrs.push((headers::REQUEST_ID, id));
        }
        host::send_reply(200, &hdrs, body);
        Action::Pause
    }

    /// Keeps a well-formed request id; replaces a missing or malformed one.
    fn settle_request_id(&mut self, sent: Option<&[u8]>) {
        let id = match sent {
            Some(v) if request::request_id_ok(v) => String::from_utf8_lossy(v).into_owned(),
            _ => {
                let id = host::fresh_request_id(self.context_id);
                host::set_request_header(headers::REQUEST_ID, Some(&id));
                id
            }
        };
        self.request_id = Some(id);
    }

    fn models(&mut self, cfg: &Config, start: &RequestStart, query: &str) -> Action {
        let fleet = crate::status::latest();
        let now = host::now_ms();
        let state = |a: &llmroute_core::config::ModelAlias| models::ModelState::of(cfg, fleet.as_ref(), now, a);
        let answer = match &start.endpoint {
            Endpoint::GetModel(id) => models::get_answer(cfg, start.envelope, id, &state, self.request_id.as_deref()),
            _ => models::list_body_with(cfg, start.envelope, query, &state).map(models::ModelAnswer::Found),
        };
        match answer {
            Ok(models::ModelAnswer::Found(body)) => self.reply_json(&body),
            Ok(models::ModelAnswer::Unavailable(body)) => {
                let mut hdrs = vec![
                    ("content-type", "application/json"),
                    ("retry-after", models::RETRY_AFTER_S),
                    (headers::ERROR, "model_unavailable"),
                ];
                if let Some(id) = &self.request_id {
                    hdrs.push((headers::REQUEST_ID, id));
                    if start.envelope == Envelope::Anthropic {
                        hdrs.push((anthropic::REQUEST_ID_HEADER, id));
                    }
                }
                host::send_reply(503, &hdrs, &body);
                Action::Pause
            }
            Err(e) => self.refuse(&e, start.envelope),
        }
    }

    /// Decides and applies, once the whole body is buffered.
    fn finish_body(&mut self, cfg: &Config) -> Action {
        let Some((api, session)) = self.reading.take() else {
            return Action::Continue;
        };
        let Some(body) = host::request_body(self.body_size) else {
            return self.unavailable();
        };
        if !phases::runs(Phase::Scan) {
            return Action::Continue;
        }
        let received_len = body.len();
        // Messages: `extra_headers` members never reach the engine (see `anthropic`).
        let stripped = match api {
            Api::Messages => anthropic::strip_extra_headers(&body),
            _ => None,
        };
        let edited = stripped.is_some();
        let body = stripped.unwrap_or(body);
        let key = self.key.as_deref();
        let bound = |alias: &str, input: u64| crate::admission::output_bound(cfg, alias, key, input);
        let decision = match route::route_bounded(cfg, api, &body, &session, bound) {
            Ok(d) => d,
            Err(e) => return self.refuse(&e, api.envelope()),
        };
        if !phases::runs(Phase::Patch) {
            return Action::Continue;
        }
        let charges = limits::body_charges(
            cfg,
            &decision.alias,
            self.key.as_deref(),
            decision.input_tokens,
            decision.max_output_tokens,
        );
        match crate::admission::admit(&charges) {
            Ok(left) => self.remaining = self.remaining.least(left),
            Err(e) => {
                self.count_limited(&e, &decision.alias);
                return self.refuse(&e, api.envelope());
            }
        }
        self.charges.extend(charges);
        if let Some(g) = &cfg.global_limits {
            let (input, max_output) = (decision.input_tokens, decision.max_output_tokens);
            let key = self.key.as_deref();
            self.global = Some(crate::global_limits::admit(g, &decision.alias, key, input, max_output));
        }
        if let Some(k) = &self.key {
            self.metrics.key_request(k);
        }
        // Envoy's buffer still holds the body as received. Unedited, the patch goes as a head edit (see
        // `llmroute_core::patch`): no new body is built in the VM, and Envoy copies only the bytes up to the span.
        let replaced = match (&decision.patch, edited) {
            (Some(patch), false) => send_head_edit(patch, &body),
            (Some(patch), true) => host::replace_request_body(received_len, &patch.apply(&body)),
            (None, true) => host::replace_request_body(received_len, &body),
            (None, false) => true,
        };
        if !replaced {
            return self.unavailable();
        }
        let Some(len) = decision.body_len(body.len()) else {
            return self.unavailable();
        };
        if let Some(v) = headers::content_length_update(self.sent_length.as_deref(), len) {
            host::set_request_header("content-length", Some(&v));
        }
        if !phases::runs(Phase::Request) {
            return Action::Continue;
        }
        host::set_request_header(headers::CLUSTER, Some(&decision.cluster));
        // The filter reads usage and stream ends from the engine's bytes: ask for them uncompressed.
        host::set_request_header("accept-encoding", Some("identity"));
        crate::engine_load::ask_report(cfg, &decision);
        self.estimate = (decision.input_tokens, decision.max_output_tokens);
        if let Some(a) = &decision.affinity {
            host::set_request_header(headers::AFFINITY, Some(&a.header_value()));
            if !decision.failover {
                // A key new to a replica with a placement store waits for etcd (see `placement_store`).
                self.store_wait =
                    crate::placement_store::begin(cfg, &decision.placement, &decision.cluster, a.hash, &self.metrics);
                if self.store_wait.is_none() {
                    self.pinned(key_placement::pin(cfg, &decision.placement, &decision.cluster, a.hash));
                }
            }
        }
        if let Some(key) = decision.cache_affinity_key() {
            host::set_request_header(headers::CACHE_AFFINITY_KEY, Some(&key));
        }
        if let Some(alias) = decision.failover_alias() {
            host::set_request_header(headers::ALIAS, Some(alias));
        }
        host::set_log_field(log_fields::ALIAS, &decision.alias);
        host::set_log_field(log_fields::UPSTREAM_MODEL, &decision.upstream_model);
        let source = decision.affinity.map_or("none", |a| a.source.as_str());
        host::set_log_field(log_fields::AFFINITY_SOURCE, source);
        let tokens = decision.input_tokens.to_string();
        host::set_request_header(headers::INPUT_TOKENS, Some(&tokens));
        host::set_request_header(headers::TOKEN_ESTIMATE, Some(&tokens));
        log::debug!(
            "llmroute: {} cluster={} affinity={}",
            api.name(),
            decision.cluster,
            decision.affinity.map_or("none", |a| a.source.as_str())
        );
        self.routed = Some(decision);
        match self.store_wait {
            Some(_) => Action::Pause,
            None => self.enter_queue(cfg),
        }
    }

    fn pinned(&mut self, pin: Option<Pin>) {
        self.pin = pin;
        if let Some(p) = &self.pin {
            self.metrics.placement(p.choice.reason);
            host::set_log_field(log_fields::PLACEMENT, p.choice.reason.as_str());
            if let Some(cfg) = &self.cfg {
                self.work = crate::engine_load::Work::hold(cfg, p, self.estimate.0, self.estimate.1);
            }
        }
    }

    /// Writes the outcome and usage seen so far to the access-log fields. Called when the response ends and when
    /// it starts (a stream that is then cut never ends, and the access log may be written before `on_log`).
    fn publish_summary(&self) {
        let Some(w) = &self.watch else { return };
        let (outcome, usage) = w.summary(String::new);
        if let Some(o) = outcome {
            host::set_log_field(log_fields::STREAM_OUTCOME, o.as_str());
        }
        let fields = [
            (log_fields::INPUT_TOKENS, usage.prompt_tokens),
            (log_fields::OUTPUT_TOKENS, usage.completion_tokens),
            (log_fields::CACHED_TOKENS, usage.cached_tokens),
        ];
        for (key, n) in fields {
            if let Some(n) = n {
                host::set_log_field(key, &n.to_string());
            }
        }
        if let (Some(g), Some(used)) = (&self.global, w.used_tokens()) {
            g.publish(Some(used));
        }
    }

    fn unavailable(&mut self) -> Action {
        self.release_charges();
        self.reading = None;
        self.metrics.rejected("gateway_error");
        let mut hdrs = vec![("content-type", "application/json"), (headers::ERROR, "gateway_error")];
        if let Some(id) = &self.request_id {
            hdrs.push((headers::REQUEST_ID, id));
            if self.envelope == Envelope::Anthropic {
                hdrs.push((anthropic::REQUEST_ID_HEADER, id));
            }
        }
        let body = llmroute_core::error::unavailable_body(self.envelope, self.request_id.as_deref());
        host::send_reply(503, &hdrs, &body);
        Action::Pause
    }
}

/// Answers the request with the refusal `e` in `envelope`: its status, `x-llmroute-error`, `Retry-After` when it
/// has one, and the request id.
pub(crate) fn send_refusal(e: &GatewayError, envelope: Envelope, request_id: Option<&str>) {
    let mut hdrs = vec![("content-type", "application/json"), (headers::ERROR, e.code())];
    hdrs.extend(e.headers());
    let retry_after = e.retry_after().map(|s| s.to_string());
    if let Some(s) = &retry_after {
        hdrs.push(("retry-after", s));
    }
    if let Some(id) = request_id {
        hdrs.push((headers::REQUEST_ID, id));
        if envelope == Envelope::Anthropic {
            hdrs.push((anthropic::REQUEST_ID_HEADER, id));
        }
    }
    host::send_reply(e.status(), &hdrs, &e.body(envelope, request_id));
}

/// Sends `patch` of the buffered request `body` to Envoy as a head edit (see `llmroute_core::patch`): no new body
/// is built in the VM. False when the patch does not fit the body or Envoy refused a call.
pub(crate) fn send_head_edit(patch: &BodyPatch, body: &[u8]) -> bool {
    patch.head_edit(body).is_some_and(|calls| {
        calls
            .iter()
            .filter(|c| !c.is_noop())
            .all(|c| host::replace_request_body(c.drain, c.bytes))
    })
}

impl Context for Http {
    fn on_http_call_response(&mut self, token_id: u32, _num_headers: usize, body_size: usize, _num_trailers: usize) {
        let (Some(mut w), Some(cfg)) = (self.store_wait.take(), self.cfg.clone()) else {
            return;
        };
        if w.token() != token_id {
            self.store_wait = Some(w);
            return;
        }
        match crate::placement_store::finish(&cfg, &mut w, body_size, &self.metrics) {
            crate::placement_store::Step::Retrying => self.store_wait = Some(w),
            crate::placement_store::Step::Pinned(pin) => {
                self.pinned(pin);
                if self.enter_queue(&cfg) == Action::Continue {
                    host::resume_request();
                }
            }
        }
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if !phases::runs(Phase::Headers) {
            return Action::Continue;
        }
        self.started_ms = host::now_ms();
        let Some(cfg) = self.cfg.clone() else {
            return self.unavailable();
        };
        let Some(all) = host::request_headers() else {
            return self.unavailable();
        };
        for name in headers::to_strip(all.iter().map(|(n, _)| n.as_str())) {
            host::set_request_header(name, None);
        }
        let find = |name: &str| all.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice());
        self.settle_request_id(find(headers::REQUEST_ID));
        let text = |name: &str| find(name).and_then(|v| std::str::from_utf8(v).ok()).unwrap_or_default();
        let path = text(":path");
        if let Some(keys) = self.keys.clone() {
            match request::authenticate(&keys, text(":method"), path, &all) {
                Ok(name) => {
                    // The key's configured name (never its value) identifies the client in the access log.
                    if let Some(n) = &name {
                        host::set_log_field(log_fields::KEY, n);
                    }
                    self.key = name;
                }
                Err(Refusal { error, envelope }) => return self.refuse(&error, envelope),
            }
        }
        let start = match request::start(&cfg, text(":method"), path, find) {
            Ok(s) => s,
            Err(Refusal { error, envelope }) => return self.refuse(&error, envelope),
        };
        self.envelope = start.envelope;
        if let Endpoint::Status(page) = start.endpoint {
            return crate::status::answer(&cfg, page, self.request_id.as_deref());
        }
        let Endpoint::Inference(api) = start.endpoint else {
            let query = path.split_once('?').map_or("", |(_, q)| q);
            return self.models(&cfg, &start, query);
        };
        if end_of_stream {
            let empty = GatewayError::InvalidJson(llmroute_core::json::JsonError::Empty);
            return self.refuse(&empty, start.envelope);
        }
        // A key's request limit is decided here, before its body is read or buffered.
        let charges = match self.key.as_deref() {
            Some(k) => limits::header_charges(&cfg, k),
            None => Vec::new(),
        };
        match crate::admission::admit(&charges) {
            Ok(left) => self.remaining = left,
            Err(e) => {
                self.count_limited(&e, "none");
                return self.refuse(&e, start.envelope);
            }
        }
        self.charges = charges;
        self.tenant = crate::fair_queue::tenant(&cfg, self.key.as_deref(), find);
        self.sent_length = find("content-length").map(<[u8]>::to_vec);
        if !phases::runs(Phase::Copy) {
            return Action::Continue;
        }
        self.reading = Some((api, start.session));
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some((api, _)) = &self.reading else {
            return Action::Continue;
        };
        let envelope = api.envelope();
        let Some(cfg) = self.cfg.clone() else {
            return self.unavailable();
        };
        self.body_size = body_size;
        if body_size > cfg.limits.max_body_bytes {
            let limit = cfg.limits.max_body_bytes;
            return self.refuse(&GatewayError::BodyTooLarge { limit }, envelope);
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.finish_body(&cfg)
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
        if self.ticket.as_ref().is_some_and(crate::fair_queue::Ticket::timed_out) {
            // The fair queue answered it (a 429): no engine did.
            self.routed = None;
        }
        let settings = response_plan::Settings {
            debug_headers: self.cfg.as_ref().is_some_and(|c| c.debug_headers),
            request_id: self.request_id.as_deref(),
        };
        let routed = self.routed.as_ref().map(|d| response_plan::Routed {
            api: d.api,
            cluster: &d.cluster,
            affinity: d.affinity.map(|a| a.source),
            echo_session: d.echo_session.as_deref(),
            placement: self.pin.as_ref().map(|p| p.choice.reason),
            requests_remaining: self.remaining.requests,
            tokens_remaining: self.remaining.tokens,
            assemble: d.assemble,
        });
        let response_headers = host::ResponseHeaders::default();
        let plan = response_plan::plan(&settings, routed.as_ref(), &|name| response_headers.get(name), &|| {
            host::property_string(&["upstream", "address"])
        });
        self.status = plan.status;
        for name in &plan.remove {
            host::remove_response_header(name);
        }
        for (name, value) in &plan.set {
            host::set_response_header(name, value);
        }
        let Some(d) = &self.routed else {
            return Action::Continue;
        };
        if let Some(refusal) = self
            .global
            .as_ref()
            .and_then(|g| g.on_response_headers(&response_headers))
        {
            // Envoy's rate-limit filter answered (its body is already in the route's envelope): it costs nothing.
            self.global = None;
            self.metrics.rejected(refusal.metric_reason());
            if refusal == llmroute_core::global_limits::Refusal::OverLimit {
                let key = self.key.as_deref().unwrap_or("none");
                self.metrics.rate_limited(&d.alias, key, "global");
            }
            if !self.charges.is_empty() {
                crate::admission::settle(&self.charges, 0);
            }
            self.charges.clear();
            return Action::Continue;
        }
        let backend = match d.known_backend() {
            Some(b) => b.to_string(),
            None => host::upstream_backend().unwrap_or_else(|| d.cluster.clone()),
        };
        host::set_log_field(log_fields::BACKEND, &backend);
        if let (Some(report), Some(cfg)) = (response_headers.get(orca::RESPONSE_HEADER), &self.cfg) {
            crate::engine_load::fold_report(cfg, &backend, &report);
        }
        self.backend = Some(backend);
        match plan.body {
            BodyPlan::Relay => {}
            BodyPlan::ReplaceOverflow => {
                self.metrics.overflow();
                self.replacing_overflow = true;
            }
            BodyPlan::RewriteError(status) => self.rewriting_error = Some(status),
            BodyPlan::Watch(media) => {
                self.watch = Some(ResponseWatch::start(d.api, media, d.strip_usage_chunk));
                self.publish_summary();
            }
            BodyPlan::Assemble => {
                // The client asked for one JSON answer: hold the headers until it is rebuilt from the stream.
                let limit = self.cfg.as_ref().map_or(0, |c| c.limits.max_assembled_bytes);
                self.watch = Some(ResponseWatch::assemble(d.api, limit));
                self.publish_summary();
                return Action::Pause;
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !phases::runs(Phase::Response) {
            return Action::Continue;
        }
        if let Some(status) = self.rewriting_error {
            if !end_of_stream {
                return Action::Pause;
            }
            self.rewriting_error = None;
            let read = body_size.min(anthropic::ERROR_BODY_MAX + 1);
            let got = match read {
                0 => Vec::new(),
                _ => host::response_body(read).unwrap_or_default(),
            };
            let (body, shape) = anthropic::backend_error_body(status, &got, self.request_id.as_deref());
            log::debug!("llmroute: backend error {status} on /v1/messages: {shape:?}");
            host::replace_response_body(body_size, &body);
            return Action::Continue;
        }
        if !self.replacing_overflow {
            if body_size > 0 && self.first_byte_ms.is_none() {
                self.first_byte_ms = Some(host::now_ms());
            }
            if let Some(w) = &mut self.watch {
                let hold = w.on_body(body_size, end_of_stream, self.request_id.as_deref());
                if end_of_stream {
                    self.publish_summary();
                }
                if let Hold::Wait = hold {
                    return Action::Pause;
                }
            }
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.replacing_overflow = false;
        let envelope = self.routed.as_ref().map_or(Envelope::OpenAi, |d| d.api.envelope());
        let body = llmroute_core::error::overloaded_body(envelope, self.request_id.as_deref());
        host::replace_response_body(body_size, &body);
        Action::Continue
    }

    fn on_log(&mut self) {
        if !phases::runs(Phase::Response) {
            return;
        }
        if self.ticket.as_ref().is_some_and(crate::fair_queue::Ticket::timed_out) {
            self.routed = None;
        }
        self.log_exchange();
        // Last: giving the slot back may resume another request, whose context the calls that follow act on.
        if let (Some(t), Some(cfg)) = (self.ticket.take(), self.cfg.clone()) {
            let usage = self
                .watch
                .as_ref()
                .map_or(Usage::default(), |w| w.summary(String::new).1);
            if !crate::fair_queue::end(&cfg, t, &usage, &self.metrics) {
                // It waited and never got a slot: it holds nothing in the limit buckets either.
                self.release_charges();
            }
        }
    }
}

impl Http {
    /// The log phase of the exchange: placement's in-flight count, the limits' settlement, and the metrics.
    fn log_exchange(&mut self) {
        if let Some(p) = self.pin.take() {
            p.release();
        }
        if let Some(w) = self.work.take() {
            w.release();
        }
        if !self.charges.is_empty() {
            // Without reported usage (a cut stream, an error) the reservation stands.
            if let Some(used) = self.watch.as_ref().and_then(ResponseWatch::used_tokens) {
                crate::admission::settle(&self.charges, used);
            }
        }
        let Some(d) = &self.routed else {
            return;
        };
        let details = || host::property_string(&["response", "code_details"]).unwrap_or_default();
        let (outcome, usage) = self
            .watch
            .as_ref()
            .map_or((None, Usage::default()), |w| w.summary(details));
        if let Some(o) = outcome {
            self.metrics.stream_outcome(o);
        }
        // The status the response headers had; `response.code` only when they never came (a reply cut before them).
        let status = self.status.or_else(host::response_code).unwrap_or(0);
        let now = host::now_ms();
        let since_start = |t: u64| (self.started_ms > 0).then(|| t.saturating_sub(self.started_ms));
        let backend = self.backend.as_deref().unwrap_or(&d.cluster);
        self.metrics.finished(&Finished {
            alias: &d.alias,
            backend,
            api: d.api.name(),
            status,
            affinity_source: d.affinity.map_or("none", |a| a.source.as_str()),
            ttfb_ms: self.first_byte_ms.and_then(since_start),
            duration_ms: since_start(now),
            usage,
        });
    }
}
