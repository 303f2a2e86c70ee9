//! Test builds only: with the cargo feature `test-trap` (`make build-trap`), a request that carries the header
//! [`TRAP_HEADER`] makes the filter panic in its request-headers callback, which traps the VM. The real-Envoy
//! tests use it to check the VM failure policy. `make build` never enables the feature, and a test checks that
//! the release module does not contain [`TRAP_MESSAGE`].

/// The request header that triggers the trap.
pub const TRAP_HEADER: &str = "x-llmroute-test-trap";
/// The panic message, which the release-artifact check looks for.
pub const TRAP_MESSAGE: &str = "llmroute test trap triggered";

/// Panics when the request headers carry [`TRAP_HEADER`].
#[allow(clippy::panic)]
pub fn maybe_trap(headers: &[(String, Vec<u8>)]) {
    if headers.iter().any(|(name, _)| name == TRAP_HEADER) {
        panic!("{TRAP_MESSAGE}");
    }
}
