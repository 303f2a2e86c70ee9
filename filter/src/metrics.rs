//! The filter's own metrics, defined once per VM. Envoy shows them on `/stats` as `wasmcustom.<name>` and on
//! `/stats/prometheus` as `<name>`, summed over workers. Names carry no request data, only fixed reasons and
//! configured backend names (`llmroute.backend.<token>.*`, where the token is the name itself, or a sanitised
//! and hashed form for names with unusual bytes, see `llmroute_core::config::stat_token`; `llmroute render` adds a
//! stats tag that turns the token into a `llmroute_backend` label).

use std::collections::HashMap;
use std::rc::Rc;

use llmroute_core::key_placement::PlacementReason;
use llmroute_core::stream::{Outcome, Usage};
use llmroute_core::Config;

use crate::host;

#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Requests routed to a backend.
    pub routed: Option<u32>,
    /// Requests refused by the gateway (4xx before any engine).
    pub refused: Option<u32>,
    /// Requests shed by a backend's circuit breaker (503 with Retry-After).
    pub overflow: Option<u32>,
    /// Requests refused because they cannot fit any route's context window.
    pub context_exceeded: Option<u32>,
    /// Streamed responses by how they ended, indexed like [`Outcome::ALL`].
    outcomes: [Option<u32>; 6],
    /// Bounded-keys placements by reason, indexed like [`PlacementReason::ALL`].
    placements: [Option<u32>; 4],
    /// The largest wasm linear memory of the VMs, in bytes (see [`Metrics::vm_memory_tick`]).
    vm_memory: Option<u32>,
    backends: Rc<HashMap<String, BackendMetrics>>,
}

/// Usage per backend, and the realised prompt-cache hit rate (cached over prompt tokens, in permille).
#[derive(Debug, Clone, Copy, Default)]
struct BackendMetrics {
    prompt: Option<u32>,
    cached: Option<u32>,
    completion: Option<u32>,
    hit_permille: Option<u32>,
}

impl Metrics {
    pub fn define(cfg: &Config) -> Self {
        let backends = cfg
            .backends
            .iter()
            .map(|b| {
                let token = b.stat_token();
                let name = |m: &str| llmroute_core::envoy_contract::backend_metric(&token, m);
                let m = BackendMetrics {
                    prompt: host::define_counter(&name("prompt_tokens_total")),
                    cached: host::define_counter(&name("cached_tokens_total")),
                    completion: host::define_counter(&name("completion_tokens_total")),
                    hit_permille: host::define_gauge(&name("cache_hit_permille")),
                };
                (b.name.clone(), m)
            })
            .collect();
        Metrics {
            routed: host::define_counter("llmroute_requests_routed_total"),
            refused: host::define_counter("llmroute_requests_refused_total"),
            overflow: host::define_counter("llmroute_overflow_total"),
            context_exceeded: host::define_counter("llmroute_context_exceeded_total"),
            outcomes: Outcome::ALL.map(|o| host::define_counter(&format!("llmroute_stream_{}_total", o.as_str()))),
            placements: PlacementReason::ALL
                .map(|r| host::define_counter(&format!("llmroute_placement_{}_total", r.as_str()))),
            vm_memory: host::define_gauge("llmroute_vm_memory_bytes"),
            backends: Rc::new(backends),
        }
    }

    pub fn stream_outcome(&self, o: Outcome) {
        let i = Outcome::ALL.iter().position(|x| *x == o);
        host::increment(i.and_then(|i| self.outcomes.get(i).copied().flatten()));
    }

    pub fn placement(&self, r: PlacementReason) {
        let i = PlacementReason::ALL.iter().position(|x| *x == r);
        host::increment(i.and_then(|i| self.placements.get(i).copied().flatten()));
    }

    /// Raises `llmroute_vm_memory_bytes` to this VM's linear memory size, if that is larger. Every VM (the main
    /// thread's and each worker's) shares the one gauge, so it holds the largest of them. A wasm memory never
    /// shrinks, so the largest VM's size only rises: a soak that sees it grow after its warm-up sees a VM that
    /// keeps allocating. Native builds (tests) have no linear memory and leave the gauge alone.
    pub fn vm_memory_tick(&self) {
        let Some(bytes) = linear_memory_bytes() else { return };
        if host::metric_value(self.vm_memory).is_none_or(|now| bytes > now) {
            host::set_gauge(self.vm_memory, bytes);
        }
    }

    /// Adds a response's usage to its backend and refreshes the backend's hit rate.
    pub fn usage(&self, backend: &str, u: Usage) {
        let Some(m) = self.backends.get(backend) else { return };
        host::add(m.prompt, u.prompt_tokens.unwrap_or(0));
        host::add(m.cached, u.cached_tokens.unwrap_or(0));
        host::add(m.completion, u.completion_tokens.unwrap_or(0));
        let (prompt, cached) = (host::metric_value(m.prompt), host::metric_value(m.cached));
        if let (Some(p), Some(c)) = (prompt, cached) {
            if let Some(permille) = c.saturating_mul(1000).checked_div(p) {
                host::set_gauge(m.hit_permille, permille);
            }
        }
    }
}

/// This VM's linear memory (memory 0) in bytes: pages of 64 KiB.
#[cfg(target_arch = "wasm32")]
fn linear_memory_bytes() -> Option<u64> {
    let pages = u64::try_from(core::arch::wasm32::memory_size(0)).ok()?;
    pages.checked_mul(65_536)
}

#[cfg(not(target_arch = "wasm32"))]
fn linear_memory_bytes() -> Option<u64> {
    None
}
