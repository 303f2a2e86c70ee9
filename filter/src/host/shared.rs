//! Envoy's shared data, VM-wide: reads with their compare-and-swap version, and writes that lose a race as a
//! value, never an error.

use super::*;

impl Envoy {
    /// A value in the VM-wide shared data, with its compare-and-swap token.
    pub fn shared_data(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.try_shared_data(key).unwrap_or((None, None))
    }

    /// Reads shared data, telling an absent key (`Some((None, None))`) from a host error (`None`, logged).
    pub fn try_shared_data(&self, key: &str) -> Option<(Option<Vec<u8>>, Option<u32>)> {
        logged(
            self.host().get_shared_data(key),
            format_args!("reading shared data {key}"),
        )
    }

    /// Writes shared data; with `cas`, only if nobody wrote since it was read. False when it was not written.
    pub fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
        match self.host().set_shared_data(key, value, cas) {
            Ok(()) => true,
            Err(HostError {
                status: HostStatus::CasMismatch,
                ..
            }) => false,
            Err(e) => {
                log::warn!("llmroute: writing shared data {key}: {e}");
                false
            }
        }
    }
}

/// Envoy's shared data, as the core's compare-and-swap loops see it (the in-flight ledger, the limit buckets).
pub struct SharedData<'e>(pub &'e Envoy);

impl llmroute_core::key_placement::in_flight::SharedStore for SharedData<'_> {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.0.shared_data(key)
    }

    fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
        self.0.set_shared_data(key, value, cas)
    }
}
