//! A request context's local replies: a refusal or a 503 gives back what the request took from the limit
//! buckets and is counted as a rejection; the reply itself is the core's `LocalReply`, sent as it is.

use llmroute_core::request_plan::LocalReply;
use llmroute_core::{BodyPatch, Envelope, GatewayError};
use proxy_wasm::types::Action;

use super::Http;
use crate::host::Envoy;

impl Http {
    /// Gives back what the request took from the limit buckets: a request the gateway refuses holds nothing.
    pub(super) fn release_charges(&mut self) {
        if !self.charges.is_empty() {
            crate::admission::give_back(&self.envoy, &std::mem::take(&mut self.charges));
        }
    }

    /// Counts a limit's refusal by alias (`none` before the body names one), key and kind.
    pub(super) fn count_limited(&self, e: &GatewayError, alias: &str) {
        if let GatewayError::RateLimited { kind, .. } = e {
            let key = self.key.as_deref().unwrap_or("none");
            self.metrics.rate_limited(alias, key, kind.as_str());
        }
    }

    /// Sends `reply`; a rejection first gives back what the request held, stops reading its body and is counted.
    pub(super) fn reply(&mut self, reply: LocalReply) -> Action {
        if let Some(reason) = reply.rejected {
            log::debug!("llmroute: refused with {} {reason}", reply.status);
            self.release_charges();
            self.reading = None;
            self.metrics.rejected(reason);
        }
        self.envoy.send_local_reply(&reply);
        Action::Pause
    }

    /// Refuses the request with `e`, in `envelope`.
    pub(super) fn refuse(&mut self, e: &GatewayError, envelope: Envelope) -> Action {
        let reply = LocalReply::refusal(e, envelope, self.request_id.as_deref());
        self.reply(reply)
    }

    /// The 503 of a host that failed the filter, in the request's envelope.
    pub(super) fn unavailable(&mut self) -> Action {
        let reply = LocalReply::unavailable(self.envelope, self.request_id.as_deref());
        self.reply(reply)
    }
}

/// Sends `patch` of the buffered request `body` to Envoy as a head edit (see `llmroute_core::patch`): no new body
/// is built in the VM. False when the patch does not fit the body or Envoy refused a call.
pub fn send_head_edit(envoy: &Envoy, patch: &BodyPatch, body: &[u8]) -> bool {
    patch.head_edit(body).is_some_and(|calls| {
        calls
            .iter()
            .filter(|c| !c.is_noop())
            .all(|c| envoy.replace_request_body(c.drain, c.bytes))
    })
}
