//! The body phase's plan: what the filter does once a request's whole body is buffered.
//!
//! On `/v1/messages`, `extra_headers` members are dropped first (see `anthropic`). `route::route_bounded` then
//! decides the alias, cluster, affinity and the one body edit; a refusal ends the request. The plan names:
//!
//! - the token charges to admit (`limits::body_charges`), all or none, before anything is sent upstream;
//! - the body edit ([`Edit`]): unedited, the decision's patch goes to Envoy as a head edit (see `patch`), so no
//!   new body is built in the VM; a body that lost members is replaced whole;
//! - the new `content-length` ([`Length`]), only when it differs from the client's;
//! - the request headers the route and the engine read ([`RoutePlan::request_headers`]): the cluster,
//!   `accept-encoding: identity` (the filter reads usage from the engine's bytes), the affinity hash, the hash of
//!   an explicit session key, the alias on a failover cluster, and the token estimate twice;
//! - the access-log fields (alias, upstream model, affinity source), and the affinity hash that bounded-keys
//!   placement pins ([`RoutePlan::place`]; none on a failover cluster).

use crate::config::Config;
use crate::endpoint::Api;
use crate::envoy_contract::log_fields;
use crate::limits::{self, Charge};
use crate::route::{self, RouteDecision};
use crate::session::SessionHeaders;
use crate::{anthropic, headers};

use super::LocalReply;

/// What the filter does with a buffered body it may route.
#[derive(Debug)]
pub struct RoutePlan {
    pub decision: RouteDecision,
    /// The token-limit charges, admitted all or none.
    pub charges: Vec<Charge>,
    pub edit: Edit,
    pub length: Length,
    /// The token estimate, as the header value.
    tokens: String,
    /// The affinity header's value, when the request has an affinity key.
    affinity: Option<String>,
    /// The hash of the client's explicit session key, for `x-cache-affinity-key`.
    cache_key: Option<String>,
}

/// How the body in Envoy's buffer changes.
#[derive(Debug, PartialEq, Eq)]
pub enum Edit {
    /// It goes as received.
    Keep,
    /// The decision's patch, sent as a head edit of `body`, the body as received and still in Envoy's buffer.
    HeadEdit { body: Vec<u8> },
    /// The first `drain` bytes (the whole body received) are replaced with `body`.
    Replace { drain: usize, body: Vec<u8> },
}

/// The request's `content-length` after the edit.
#[derive(Debug, PartialEq, Eq)]
pub enum Length {
    /// The client's value still holds (or the request is chunked and stays so): no header call.
    Unchanged,
    Set(String),
    /// The patch does not fit the body: the request cannot go on (a 503).
    Unknown,
}

/// What the headers phase learnt about the request, as the body phase needs it.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub api: Api,
    /// The configured session headers it carried.
    pub session: &'a SessionHeaders,
    /// The API key's name.
    pub key: Option<&'a str>,
    /// The client's `content-length`.
    pub sent_length: Option<&'a [u8]>,
    /// The request's id, for a refusal.
    pub request_id: Option<&'a str>,
}

/// The plan for the buffered `body` of the request `r`; `bound` is the output bound to inject for an alias and
/// input size (see `output_bound`), or a refusal.
pub fn plan(
    cfg: &Config,
    r: &Facts,
    body: Vec<u8>,
    bound: impl FnOnce(&str, u64) -> Option<u64>,
) -> Result<RoutePlan, LocalReply> {
    let Facts {
        api,
        session,
        key,
        sent_length,
        request_id,
    } = *r;
    let received = body.len();
    let stripped = match api {
        Api::Messages => anthropic::strip_extra_headers(&body),
        _ => None,
    };
    let edited = stripped.is_some();
    let body = stripped.unwrap_or(body);
    let decision = route::route_bounded(cfg, api, &body, session, bound)
        .map_err(|e| LocalReply::refusal(&e, api.envelope(), request_id))?;
    let (input, max_output) = (decision.input_tokens, decision.max_output_tokens);
    let charges = limits::body_charges(cfg, &decision.alias, key, input, max_output);
    let length = match decision.body_len(body.len()) {
        None => Length::Unknown,
        Some(len) => headers::content_length_update(sent_length, len).map_or(Length::Unchanged, Length::Set),
    };
    let edit = match (&decision.patch, edited) {
        (Some(_), false) => Edit::HeadEdit { body },
        (Some(patch), true) => Edit::Replace {
            drain: received,
            body: patch.apply(&body),
        },
        (None, true) => Edit::Replace { drain: received, body },
        (None, false) => Edit::Keep,
    };
    Ok(RoutePlan {
        tokens: decision.input_tokens.to_string(),
        affinity: decision.affinity.map(|a| a.header_value()),
        cache_key: decision.cache_affinity_key(),
        decision,
        charges,
        edit,
        length,
    })
}

impl RoutePlan {
    /// The request headers to set, in order.
    pub fn request_headers(&self) -> Vec<(&'static str, &str)> {
        let d = &self.decision;
        let mut out = vec![(headers::CLUSTER, d.cluster.as_str()), ("accept-encoding", "identity")];
        if let Some(a) = &self.affinity {
            out.push((headers::AFFINITY, a));
        }
        if let Some(k) = &self.cache_key {
            out.push((headers::CACHE_AFFINITY_KEY, k));
        }
        if let Some(alias) = d.failover_alias() {
            out.push((headers::ALIAS, alias));
        }
        out.push((headers::INPUT_TOKENS, &self.tokens));
        out.push((headers::TOKEN_ESTIMATE, &self.tokens));
        out
    }

    /// The access-log fields to write.
    pub fn log_fields(&self) -> [(&'static str, &str); 3] {
        let d = &self.decision;
        [
            (log_fields::ALIAS, &d.alias),
            (log_fields::UPSTREAM_MODEL, &d.upstream_model),
            (log_fields::AFFINITY_SOURCE, self.affinity_source()),
        ]
    }

    /// The affinity source's name (`none` without a key), for the access log and the debug log.
    pub fn affinity_source(&self) -> &'static str {
        self.decision.affinity.map_or("none", |a| a.source.as_str())
    }

    /// The affinity hash that placement (`bounded_keys`, with or without a placement store) settles; `None`
    /// without an affinity key, and on a failover cluster, which Envoy balances itself.
    pub fn place(&self) -> Option<u64> {
        self.decision
            .affinity
            .filter(|_| !self.decision.failover)
            .map(|a| a.hash)
    }
}
