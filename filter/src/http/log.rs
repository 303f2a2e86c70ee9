//! The log phase of a request context: the fair queue's slot, placement's in-flight count and work in flight
//! are given back, the limits settled on the answer's usage, and the exchange's metrics recorded.

use llmroute_core::stream::Usage;

use super::Http;
use crate::metrics::Finished;
use crate::response::ResponseWatch;

impl Http {
    /// The log phase.
    pub(super) fn log(&mut self) {
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
            if !crate::fair_queue::end(&self.envoy, &cfg, t, &usage, &self.metrics) {
                // It waited and never got a slot: it holds nothing in the limit buckets either.
                self.release_charges();
            }
        }
    }

    /// The log phase of the exchange: placement's in-flight count, the limits' settlement, and the metrics.
    fn log_exchange(&mut self) {
        if let Some(p) = self.pin.take() {
            p.release(&self.envoy);
        }
        if let Some(w) = self.work.take() {
            w.release(&self.envoy);
        }
        if !self.charges.is_empty() {
            // Without reported usage (a cut stream, an error) the reservation stands.
            if let Some(used) = self.watch.as_ref().and_then(ResponseWatch::used_tokens) {
                crate::admission::settle(&self.envoy, &self.charges, used);
            }
        }
        let Some(d) = &self.routed else {
            return;
        };
        let details = || {
            self.envoy
                .property_string(&["response", "code_details"])
                .unwrap_or_default()
        };
        let (outcome, usage) = self
            .watch
            .as_ref()
            .map_or((None, Usage::default()), |w| w.summary(details));
        if let Some(o) = outcome {
            self.metrics.stream_outcome(o);
        }
        // The status the response headers had; `response.code` only when they never came (a reply cut before them).
        let status = self.status.or_else(|| self.envoy.response_code()).unwrap_or(0);
        let now = self.envoy.now_ms();
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
