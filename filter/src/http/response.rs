//! The response side of a request context: the response-header plan (`llmroute_core::response_plan`) applied,
//! then the body as that plan says: relayed, watched for usage and the stream's end, rebuilt into one JSON
//! answer, or rewritten (a backend error on `/v1/messages`, Envoy's overflow reply).

use llmroute_core::envoy_contract::log_fields;
use llmroute_core::load::orca;
use llmroute_core::response_plan::{self, BodyPlan};
use llmroute_core::{anthropic, Envelope};
use proxy_wasm::types::Action;

use super::Http;
use crate::host;
use crate::response::{Hold, ResponseWatch};

impl Http {
    /// Applies the response-header plan, and sets up what happens to the body.
    pub(super) fn response_headers(&mut self) -> Action {
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
        let response_headers = host::ResponseHeaders::new(&self.envoy);
        let plan = response_plan::plan(&settings, routed.as_ref(), &|name| response_headers.get(name), &|| {
            self.envoy.property_string(&["upstream", "address"])
        });
        self.status = plan.status;
        for name in &plan.remove {
            self.envoy.remove_response_header(name);
        }
        for (name, value) in &plan.set {
            self.envoy.set_response_header(name, value);
        }
        let Some(d) = &self.routed else {
            return Action::Continue;
        };
        if let Some(refusal) = self
            .global
            .as_ref()
            .and_then(|g| g.on_response_headers(&self.envoy, &response_headers))
        {
            // Envoy's rate-limit filter answered (its body is already in the route's envelope): it costs nothing.
            self.global = None;
            self.metrics.rejected(refusal.metric_reason());
            if refusal == llmroute_core::global_limits::Refusal::OverLimit {
                let key = self.key.as_deref().unwrap_or("none");
                self.metrics.rate_limited(&d.alias, key, "global");
            }
            if !self.charges.is_empty() {
                crate::admission::settle(&self.envoy, &self.charges, 0);
            }
            self.charges.clear();
            return Action::Continue;
        }
        let backend = match d.known_backend() {
            Some(b) => b.to_string(),
            None => self.envoy.upstream_backend().unwrap_or_else(|| d.cluster.clone()),
        };
        self.envoy.set_log_field(log_fields::BACKEND, &backend);
        if let (Some(report), Some(cfg)) = (response_headers.get(orca::RESPONSE_HEADER), &self.cfg) {
            crate::engine_load::fold_report(&self.envoy, cfg, &backend, &report);
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

    /// A chunk of the response body: rewritten, replaced or watched as the response-header plan said.
    pub(super) fn response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if let Some(status) = self.rewriting_error {
            if !end_of_stream {
                return Action::Pause;
            }
            self.rewriting_error = None;
            let read = body_size.min(anthropic::ERROR_BODY_MAX + 1);
            let got = match read {
                0 => Vec::new(),
                _ => self.envoy.response_body(read).unwrap_or_default(),
            };
            let (body, shape) = anthropic::backend_error_body(status, &got, self.request_id.as_deref());
            log::debug!("llmroute: backend error {status} on /v1/messages: {shape:?}");
            self.envoy.replace_response_body(body_size, &body);
            return Action::Continue;
        }
        if !self.replacing_overflow {
            if body_size > 0 && self.first_byte_ms.is_none() {
                self.first_byte_ms = Some(self.envoy.now_ms());
            }
            if let Some(w) = &mut self.watch {
                let hold = w.on_body(&self.envoy, body_size, end_of_stream, self.request_id.as_deref());
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
        self.envoy.replace_response_body(body_size, &body);
        Action::Continue
    }

    /// Writes the outcome and usage seen so far to the access-log fields. Called when the response ends and when
    /// it starts (a stream that is then cut never ends, and the access log may be written before `on_log`).
    fn publish_summary(&self) {
        let Some(w) = &self.watch else { return };
        let (outcome, usage) = w.summary(String::new);
        if let Some(o) = outcome {
            self.envoy.set_log_field(log_fields::STREAM_OUTCOME, o.as_str());
        }
        let fields = [
            (log_fields::INPUT_TOKENS, usage.prompt_tokens),
            (log_fields::OUTPUT_TOKENS, usage.completion_tokens),
            (log_fields::CACHED_TOKENS, usage.cached_tokens),
        ];
        for (key, n) in fields {
            if let Some(n) = n {
                self.envoy.set_log_field(key, &n.to_string());
            }
        }
        if let (Some(g), Some(used)) = (&self.global, w.used_tokens()) {
            g.publish(&self.envoy, Some(used));
        }
    }
}
