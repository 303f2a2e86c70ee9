//! The host's clock, the request ids made from it, and the root context's tick.

use super::*;

impl Envoy {
    fn now_nanos(&self) -> Option<u64> {
        logged(self.host().now_nanos(), "reading the clock")
    }

    /// A request id for a request that came without a usable one: unique per time and context, hex.
    pub fn fresh_request_id(&self, context_id: u32) -> String {
        let mut seed = self.now_nanos().unwrap_or(0).to_le_bytes().to_vec();
        seed.extend_from_slice(&context_id.to_le_bytes());
        format!("llmroute-{:016x}", xxhash_rust::xxh3::xxh3_64(&seed))
    }

    /// Milliseconds since the Unix epoch, by the host's clock; 0 when the host cannot tell.
    pub fn now_ms(&self) -> u64 {
        self.now_nanos().unwrap_or(0) / 1_000_000
    }

    /// Asks the host to call the root context's `on_tick` every `period_ms`.
    pub fn set_tick_period(&self, period_ms: u64) -> bool {
        let period = u32::try_from(period_ms).unwrap_or(u32::MAX);
        logged(self.host().set_tick_period_ms(period), "setting the tick period").is_some()
    }
}
