//! The per-request context: read headers and body from Envoy, ask the core for a decision, apply it.
//!
//! Flow for chat: strip the client's `x-llmroute-*` and credential headers, classify the endpoint, read the
//! session header, pause; buffer the body up to the limit; at end of stream (in the body or trailers callback,
//! since HTTP/2 may end there), decide once; then rewrite `model`, set `content-length`, and set the cluster and
//! affinity headers that the route's `cluster_header` and `hash_policy` read.

use std::rc::Rc;

use llmroute_core::{headers, models, route_chat, session_from_headers, Affinity, Config, Endpoint, GatewayError};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use crate::host;

pub struct Http {
    cfg: Option<Rc<Config>>,
    /// Set while a chat body is being buffered.
    reading_body: bool,
    body_size: usize,
    session: Option<Affinity>,
    /// What was decided, for the debug response headers.
    routed: Option<(String, Option<Affinity>)>,
}

impl Http {
    pub fn new(cfg: Option<Rc<Config>>) -> Self {
        Http {
            cfg,
            reading_body: false,
            body_size: 0,
            session: None,
            routed: None,
        }
    }

    fn refuse(&mut self, e: &GatewayError) -> Action {
        log::debug!("llmroute: refused with {} {}", e.status(), e.code());
        self.reading_body = false;
        let mut hdrs = vec![("content-type", "application/json"), (headers::ERROR, e.code())];
        hdrs.extend(e.headers());
        host::send_reply(e.status(), &hdrs, &e.openai_body());
        Action::Pause
    }

    fn reply_json(&mut self, body: &[u8]) -> Action {
        host::send_reply(200, &[("content-type", "application/json")], body);
        Action::Pause
    }

    /// Decides and applies, once the whole body is buffered.
    fn finish_body(&mut self, cfg: &Config) -> Action {
        self.reading_body = false;
        let Some(body) = host::request_body(self.body_size) else {
            return self.unavailable();
        };
        let decision = match route_chat(cfg, &body, self.session) {
            Ok(d) => d,
            Err(e) => return self.refuse(&e),
        };
        if let Some(patch) = &decision.patch {
            if !host::replace_request_body(body.len(), &patch.apply(&body)) {
                return self.unavailable();
            }
        }
        host::set_request_header("content-length", Some(&decision.body_len(body.len()).to_string()));
        host::set_request_header(headers::CLUSTER, Some(&decision.cluster));
        if let Some(a) = &decision.affinity {
            host::set_request_header(headers::AFFINITY, Some(&a.header_value()));
        }
        log::debug!(
            "llmroute: chat cluster={} affinity={}",
            decision.cluster,
            decision.affinity.map_or("none", |a| a.source.as_str())
        );
        self.routed = Some((decision.cluster, decision.affinity));
        Action::Continue
    }

    fn unavailable(&mut self) -> Action {
        self.reading_body = false;
        let body = br#"{"error":{"message":"The gateway could not process the request.","type":"server_error","param":null,"code":"gateway_error"}}"#;
        host::send_reply(
            503,
            &[("content-type", "application/json"), (headers::ERROR, "gateway_error")],
            body,
        );
        Action::Pause
    }
}

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(cfg) = self.cfg.clone() else {
            return self.unavailable();
        };
        let all = host::request_headers();
        for name in headers::to_strip(all.iter().map(|(n, _)| n.as_str())) {
            host::set_request_header(name, None);
        }
        let find = |name: &str| all.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice());
        let text = |name: &str| find(name).and_then(|v| std::str::from_utf8(v).ok()).unwrap_or_default();
        let endpoint = match llmroute_core::classify(text(":method"), text(":path")) {
            Ok(e) => e,
            Err(e) => return self.refuse(&e),
        };
        match endpoint {
            Endpoint::ListModels => self.reply_json(&models::list_body(&cfg)),
            Endpoint::GetModel(id) => match models::get_body(&cfg, &id) {
                Ok(body) => self.reply_json(&body),
                Err(e) => self.refuse(&e),
            },
            Endpoint::ChatCompletions => {
                match session_from_headers(&cfg, find) {
                    Ok(s) => self.session = s,
                    Err(e) => return self.refuse(&e),
                }
                if end_of_stream {
                    return self.refuse(&GatewayError::InvalidJson(llmroute_core::json::JsonError::Empty));
                }
                self.reading_body = true;
                Action::Pause
            }
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.reading_body {
            return Action::Continue;
        }
        let Some(cfg) = self.cfg.clone() else {
            return self.unavailable();
        };
        self.body_size = body_size;
        if body_size > cfg.limits.max_body_bytes {
            let limit = cfg.limits.max_body_bytes;
            return self.refuse(&GatewayError::BodyTooLarge { limit });
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.finish_body(&cfg)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if !self.reading_body {
            return Action::Continue;
        }
        match self.cfg.clone() {
            Some(cfg) => self.finish_body(&cfg),
            None => self.unavailable(),
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let debug = self.cfg.as_ref().is_some_and(|c| c.debug_headers);
        if let (true, Some((cluster, affinity))) = (debug, &self.routed) {
            host::set_response_header(headers::CLUSTER, cluster);
            let source = affinity.map_or("none", |a| a.source.as_str());
            host::set_response_header(headers::AFFINITY_SOURCE, source);
            if let Some(addr) = host::property_string(&["upstream", "address"]) {
                host::set_response_header(headers::UPSTREAM, &addr);
            }
        }
        Action::Continue
    }
}
