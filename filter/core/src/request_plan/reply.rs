//! The gateway's own answers: a refusal, a 503, a `/v1/models` answer, a status page. Each is a [`LocalReply`]
//! that the filter sends as it is; the request-id headers every one carries are written here only.
//!
//! The request id goes out as `x-request-id` on every reply. An answer in the route's own envelope (a
//! refusal, a 503) on `/v1/messages` also carries it as Anthropic's `request-id`.

use crate::anthropic;
use crate::config::Config;
use crate::config::ModelAlias;
use crate::endpoint::{Endpoint, Envelope};
use crate::error::{unavailable_body, GatewayError};
use crate::headers::{ERROR, REQUEST_ID};
use crate::models::{self, ModelAnswer, ModelState};

/// The `content-type` of every local reply.
pub const JSON: (&str, &str) = ("content-type", "application/json");

/// A local reply: the upstream is never contacted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    /// The reason `llmroute_rejections_total` counts it under; `None` for an answer that refuses nothing.
    pub rejected: Option<&'static str>,
}

impl LocalReply {
    /// A reply with `headers`, then the request id; `envelope` is the route's, for an answer in it (the API's own
    /// request-id header), `None` for the gateway's own answers.
    pub fn new(
        status: u32,
        headers: &[(&'static str, &str)],
        body: Vec<u8>,
        request_id: Option<&str>,
        envelope: Option<Envelope>,
    ) -> LocalReply {
        let mut all: Vec<(&'static str, String)> = headers.iter().map(|&(n, v)| (n, v.to_string())).collect();
        if let Some(id) = request_id {
            all.push((REQUEST_ID, id.to_string()));
            if envelope == Some(Envelope::Anthropic) {
                all.push((anthropic::REQUEST_ID_HEADER, id.to_string()));
            }
        }
        LocalReply {
            status,
            headers: all,
            body,
            rejected: None,
        }
    }

    /// The refusal `e` in `envelope`: its status, `x-llmroute-error`, its own headers, `Retry-After` when it has
    /// one, and the request id.
    pub fn refusal(e: &GatewayError, envelope: Envelope, request_id: Option<&str>) -> LocalReply {
        let retry_after = e.retry_after().map(|s| s.to_string());
        let mut headers = vec![JSON, (ERROR, e.code())];
        headers.extend(e.headers());
        if let Some(s) = &retry_after {
            headers.push(("retry-after", s));
        }
        let body = e.body(envelope, request_id);
        LocalReply {
            rejected: Some(e.metric_reason()),
            ..LocalReply::new(e.status(), &headers, body, request_id, Some(envelope))
        }
    }

    /// The 503 of a host that failed the filter (`gateway_error`), in `envelope`.
    pub fn unavailable(envelope: Envelope, request_id: Option<&str>) -> LocalReply {
        let body = unavailable_body(envelope, request_id);
        LocalReply {
            rejected: Some("gateway_error"),
            ..LocalReply::new(503, &[JSON, (ERROR, "gateway_error")], body, request_id, Some(envelope))
        }
    }
}

/// The answer to `GET /v1/models` (`query` is the path's query) or `GET /v1/models/{id}`, in `envelope`: the
/// list, the model, a 503 `model_unavailable` for a model with no healthy backend, or a refusal. `state` tells
/// whether an alias can serve now.
pub fn models_reply(
    cfg: &Config,
    endpoint: &Endpoint,
    envelope: Envelope,
    query: &str,
    state: &dyn Fn(&ModelAlias) -> ModelState,
    request_id: Option<&str>,
) -> LocalReply {
    let answer = match endpoint {
        Endpoint::GetModel(id) => models::get_answer(cfg, envelope, id, state, request_id),
        _ => models::list_body_with(cfg, envelope, query, state).map(ModelAnswer::Found),
    };
    match answer {
        Ok(ModelAnswer::Found(body)) => LocalReply::new(200, &[JSON], body, request_id, None),
        Ok(ModelAnswer::Unavailable(body)) => {
            let headers = [
                JSON,
                ("retry-after", models::RETRY_AFTER_S),
                (ERROR, "model_unavailable"),
            ];
            LocalReply::new(503, &headers, body, request_id, Some(envelope))
        }
        Err(e) => LocalReply::refusal(&e, envelope, request_id),
    }
}
