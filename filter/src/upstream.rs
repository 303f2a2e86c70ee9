//! The upstream role: the same module, running as an Envoy upstream HTTP filter on an alias's failover cluster.
//!
//! After Envoy has picked the host for an attempt, this context reads the alias (request header set by the
//! downstream filter) and the host's backend (endpoint metadata), and rewrites `model` to that backend's
//! upstream model, setting `content-length` on every attempt. Requests without the alias header pass untouched.
//! When the body cannot be read, parsed or replaced, the attempt is answered with a JSON 503 instead: the
//! engine never gets another backend's model, nor a `content-length` that disagrees with the body.

use std::rc::Rc;

use llmroute_core::request_plan::LocalReply;
use llmroute_core::{headers, upstream, Config, Envelope};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use crate::host::Envoy;

pub struct Upstream {
    envoy: Envoy,
    cfg: Option<Rc<Config>>,
    /// The upstream model for this attempt, once known and the body must be rewritten.
    target: Option<String>,
    body_size: usize,
}

impl Upstream {
    pub fn new(envoy: Envoy, cfg: Option<Rc<Config>>) -> Self {
        Upstream {
            envoy,
            cfg,
            target: None,
            body_size: 0,
        }
    }

    fn rewrite(&mut self) -> Action {
        let Some(target) = self.target.take() else {
            return Action::Continue;
        };
        let Some(body) = self.envoy.request_body(self.body_size) else {
            return unavailable(&self.envoy);
        };
        match upstream::model_patch(&body, &target) {
            Ok(Some(patch)) => {
                // `content-length` follows the body only once the body has really changed: a length that
                // disagrees with the bytes sent is how requests get smuggled.
                let Some(len) = patch.new_len(body.len()) else {
                    return unavailable(&self.envoy);
                };
                if !crate::http::send_head_edit(&self.envoy, &patch, &body) {
                    return unavailable(&self.envoy);
                }
                self.envoy.set_request_header("content-length", Some(&len.to_string()));
            }
            Ok(None) => self
                .envoy
                .set_request_header("content-length", Some(&body.len().to_string())),
            Err(e) => {
                log::warn!("llmroute upstream: body not rewritten: {}", e.code());
                return unavailable(&self.envoy);
            }
        }
        Action::Continue
    }
}

/// The attempt cannot carry this backend's model: answer 503 in JSON rather than send the wrong model, or a
/// body whose length was never set to match it.
fn unavailable(envoy: &Envoy) -> Action {
    // A length an earlier attempt set no longer describes this body; without one, Envoy frames what it sends.
    envoy.set_request_header("content-length", None);
    let id = envoy.request_header(headers::REQUEST_ID);
    // The upstream role does not know the route's API; the OpenAI envelope is the default one.
    envoy.send_local_reply(&LocalReply::unavailable(Envelope::OpenAi, id.as_deref()));
    Action::Pause
}

impl Context for Upstream {}

impl HttpContext for Upstream {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let (Some(cfg), Some(alias)) = (&self.cfg, self.envoy.request_header(headers::ALIAS)) else {
            return Action::Continue;
        };
        let backend = self.envoy.upstream_backend();
        let target = backend.and_then(|b| upstream::upstream_model(cfg, &alias, &b).map(str::to_string));
        if target.is_none() || end_of_stream {
            return Action::Continue;
        }
        self.target = target;
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.target.is_none() {
            return Action::Continue;
        }
        self.body_size = body_size;
        if !end_of_stream {
            return Action::Pause;
        }
        self.rewrite()
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.rewrite()
    }
}
