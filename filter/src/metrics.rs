//! The filter's own counters, defined once per VM. Envoy shows them on `/stats` as `wasmcustom.<name>` and on
//! `/stats/prometheus` as `<name>`, summed over workers. Names carry no request data, only fixed reasons.

use crate::host;

#[derive(Debug, Clone, Copy, Default)]
pub struct Metrics {
    /// Requests routed to a backend.
    pub routed: Option<u32>,
    /// Requests refused by the gateway (4xx before any engine).
    pub refused: Option<u32>,
    /// Requests shed by a backend's circuit breaker (503 with Retry-After).
    pub overflow: Option<u32>,
    /// Requests refused because they cannot fit any route's context window.
    pub context_exceeded: Option<u32>,
}

impl Metrics {
    pub fn define() -> Self {
        Metrics {
            routed: host::define_counter("llmroute_requests_routed_total"),
            refused: host::define_counter("llmroute_requests_refused_total"),
            overflow: host::define_counter("llmroute_overflow_total"),
            context_exceeded: host::define_counter("llmroute_context_exceeded_total"),
        }
    }
}
