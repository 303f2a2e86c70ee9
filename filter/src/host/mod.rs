//! Host calls the filter makes, wrapped so that a host error is a value, never a trap.
//!
//! Every host call goes through here. Each context is given an [`Envoy`] when it is made, and the glue calls its
//! methods (`envoy.request_body(..)`, `envoy.set_shared_data(..)`, ...), which log a failure and return `None`,
//! `false` or nothing; they reach the host through the small [`Host`] trait: the operations the glue needs
//! (headers, bodies, shared data with its compare-and-swap version, local replies, HTTP callouts, properties, the
//! clock, logs, metrics), each returning a typed [`HostResult`]. Which host it is, the glue never asks:
//!
//! - In the filter, the root context is made with [`Envoy::abi`]: [`abi::Abi`], a unit struct over the
//!   proxy-wasm imports, called directly rather than through the SDK: the SDK's context convenience methods
//!   unwrap, and its `hostcalls` functions `panic!` on any status they do not expect; under `panic = "abort"`
//!   either kills the VM for every request on that worker.
//! - The native build (feature `native`) makes its roots with its own host (`native/src/host.rs`).
//! - Native tests make them with a [`fake::FakeHost`] (an in-memory Envoy: header maps, bodies, shared data with
//!   versions, a clock, recorded replies and callouts, and error injection). The contexts then run natively,
//!   unchanged: `filter/src/tests/` drives them the way Envoy would.
//!
//! The one SDK call left is `dispatch_http_call` (in [`abi::Abi`]'s `http_call`): the SDK's dispatcher must
//! register the call's token to deliver its answer, and that function maps every status Envoy's
//! `proxy_http_call` returns (`BadArgument`, `InternalFailure`) to an error.
//!
//! Logging goes through the logger of `logger.rs`, whose sink is given once at start (the ABI's `proxy_log` in
//! the filter), and which drops a message the host refuses instead of unwrapping.
//!
//! The wrappers, by capability: `stream.rs` (the request's and response's headers, bodies and properties, local
//! replies, access-log fields), `callouts.rs` (HTTP calls to Envoy clusters, resuming and switching contexts),
//! `shared.rs` (shared data), `metrics.rs`, `clock.rs` (the clock and the tick) and `logger.rs` (the logger).

// The native build (feature `native`) reaches Envoy through its own host, not through these imports.
#[cfg_attr(feature = "native", allow(dead_code))]
mod abi;
#[cfg(test)]
pub mod fake;

mod callouts;
mod clock;
mod logger;
mod metrics;
mod shared;
mod stream;

pub use abi::{HostError, HostResult, HostStatus};
pub use logger::init_logging;
pub use shared::*;
pub use stream::*;

use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType};
use std::rc::Rc;
use std::time::Duration;

/// What the glue asks of the host. Each call returns the host's status as a [`HostError`]; an absent value
/// (the host's `NotFound`) is `Ok(None)`.
pub trait Host {
    fn log(&self, level: LogLevel, message: &str) -> HostResult<()>;
    fn now_nanos(&self) -> HostResult<u64>;
    fn set_tick_period_ms(&self, period: u32) -> HostResult<()>;
    /// Bytes `start..start + max` of a buffer; `None` when the buffer is absent.
    fn get_buffer(&self, buffer: BufferType, start: usize, max: usize) -> HostResult<Option<Vec<u8>>>;
    /// Replaces bytes `start..start + size` of a buffer with `value` (`size` 0 at the end appends).
    fn set_buffer(&self, buffer: BufferType, start: usize, size: usize, value: &[u8]) -> HostResult<()>;
    fn get_map(&self, map: MapType) -> HostResult<Vec<(String, Vec<u8>)>>;
    fn get_map_value(&self, map: MapType, key: &str) -> HostResult<Option<Vec<u8>>>;
    /// Sets `key` to `value`, or removes it when `value` is `None`.
    fn set_map_value(&self, map: MapType, key: &str, value: Option<&str>) -> HostResult<()>;
    fn get_property(&self, path: &[&str]) -> HostResult<Option<Vec<u8>>>;
    /// Sets a property; a path Envoy does not know becomes filter state `wasm.<path>` for the rest of the request.
    fn set_property(&self, path: &[&str], value: &[u8]) -> HostResult<()>;
    /// A shared-data value and its compare-and-swap version (`None` when the key is absent).
    fn get_shared_data(&self, key: &str) -> HostResult<(Option<Vec<u8>>, Option<u32>)>;
    /// Writes shared data; with `cas`, only if the version is still `cas` (else `CasMismatch`).
    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> HostResult<()>;
    fn send_local_response(&self, status: u32, headers: &[(&str, &str)], body: &[u8]) -> HostResult<()>;
    /// Starts an HTTP call to an Envoy cluster, with an optional body; the answer comes to the calling context
    /// with the token.
    fn http_call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> HostResult<u32>;
    fn define_metric(&self, kind: MetricType, name: &str) -> HostResult<u32>;
    fn increment_metric(&self, id: u32, by: i64) -> HostResult<()>;
    fn record_metric(&self, id: u32, value: u64) -> HostResult<()>;
    fn get_metric(&self, id: u32) -> HostResult<u64>;
    /// Makes the calls that follow act on the request context `context_id` (the root context resumes or answers a
    /// request it holds no callback of: see `fair_queue`).
    fn set_effective_context(&self, context_id: u32) -> HostResult<()>;
    /// Resumes the request the filter paused (after an HTTP callout answered).
    fn resume_request(&self) -> HostResult<()>;
}

/// The host the glue calls, handed to each context when it is made: Envoy through the ABI in the filter, the
/// native crate's host in the native build, a fake in native tests. Every wrapper in this module is a method of
/// it; a clone shares the same host.
#[derive(Clone)]
pub struct Envoy(Rc<dyn Host>);

impl std::fmt::Debug for Envoy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Envoy")
    }
}

impl Envoy {
    #[cfg_attr(not(any(test, feature = "native")), allow(dead_code))]
    pub fn new(host: Rc<dyn Host>) -> Envoy {
        Envoy(host)
    }

    /// The proxy-wasm ABI: the filter's host in Envoy.
    #[cfg(any(test, not(feature = "native")))]
    pub fn abi() -> Envoy {
        Envoy(Rc::new(abi::Abi))
    }

    fn host(&self) -> &dyn Host {
        &*self.0
    }
}

/// The logger's sink in the filter: Envoy's `proxy_log`, through the ABI.
#[cfg(any(test, not(feature = "native")))]
pub fn abi_log(level: LogLevel, message: &str) {
    let _ = abi::Abi.log(level, message);
}

/// Logs a failed call at warning level and turns it into an `Option`.
fn logged<T>(r: HostResult<T>, what: impl std::fmt::Display) -> Option<T> {
    r.map_err(|e| log::warn!("llmroute: {what}: {e}")).ok()
}

#[cfg(test)]
mod sdk_imports;
#[cfg(test)]
mod tests;
