//! The native build's host (feature `native`): the one the native crate installs when Envoy loads it, and the
//! host that fails every call until then.

use super::{Host, HostError, HostResult, HostStatus};
use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType};
use std::time::Duration;

#[cfg(feature = "native")]
pub(super) static NATIVE: std::sync::OnceLock<&'static (dyn Host + Sync)> = std::sync::OnceLock::new();

/// Native build: makes `host` the host of every wrapper in this module, once per process. False when one was
/// already installed.
#[cfg(feature = "native")]
pub fn install(host: &'static (dyn Host + Sync)) -> bool {
    NATIVE.set(host).is_ok()
}

/// The native build's host before one is installed: every call fails with `InternalFailure`.
#[cfg(all(not(test), feature = "native"))]
pub struct Unavailable;

#[cfg(all(not(test), feature = "native"))]
impl Unavailable {
    fn fail<T>(call: &'static str) -> HostResult<T> {
        Err(HostError {
            call,
            status: HostStatus::InternalFailure,
        })
    }
}

#[cfg(all(not(test), feature = "native"))]
impl Host for Unavailable {
    fn log(&self, _: LogLevel, _: &str) -> HostResult<()> {
        Self::fail("log")
    }
    fn now_nanos(&self) -> HostResult<u64> {
        Self::fail("now")
    }
    fn set_tick_period_ms(&self, _: u32) -> HostResult<()> {
        Self::fail("set_tick_period")
    }
    fn get_buffer(&self, _: BufferType, _: usize, _: usize) -> HostResult<Option<Vec<u8>>> {
        Self::fail("get_buffer")
    }
    fn set_buffer(&self, _: BufferType, _: usize, _: usize, _: &[u8]) -> HostResult<()> {
        Self::fail("set_buffer")
    }
    fn get_map(&self, _: MapType) -> HostResult<Vec<(String, Vec<u8>)>> {
        Self::fail("get_map")
    }
    fn get_map_value(&self, _: MapType, _: &str) -> HostResult<Option<Vec<u8>>> {
        Self::fail("get_map_value")
    }
    fn set_map_value(&self, _: MapType, _: &str, _: Option<&str>) -> HostResult<()> {
        Self::fail("set_map_value")
    }
    fn get_property(&self, _: &[&str]) -> HostResult<Option<Vec<u8>>> {
        Self::fail("get_property")
    }
    fn set_property(&self, _: &[&str], _: &[u8]) -> HostResult<()> {
        Self::fail("set_property")
    }
    fn get_shared_data(&self, _: &str) -> HostResult<(Option<Vec<u8>>, Option<u32>)> {
        Self::fail("get_shared_data")
    }
    fn set_shared_data(&self, _: &str, _: &[u8], _: Option<u32>) -> HostResult<()> {
        Self::fail("set_shared_data")
    }
    fn send_local_response(&self, _: u32, _: &[(&str, &str)], _: &[u8]) -> HostResult<()> {
        Self::fail("send_local_response")
    }
    fn http_call(&self, _: &str, _: &[(&str, &str)], _: Option<&[u8]>, _: Duration) -> HostResult<u32> {
        Self::fail("http_call")
    }
    fn define_metric(&self, _: MetricType, _: &str) -> HostResult<u32> {
        Self::fail("define_metric")
    }
    fn increment_metric(&self, _: u32, _: i64) -> HostResult<()> {
        Self::fail("increment_metric")
    }
    fn record_metric(&self, _: u32, _: u64) -> HostResult<()> {
        Self::fail("record_metric")
    }
    fn get_metric(&self, _: u32) -> HostResult<u64> {
        Self::fail("get_metric")
    }
    fn resume_request(&self) -> HostResult<()> {
        Self::fail("resume_request")
    }
    fn set_effective_context(&self, _: u32) -> HostResult<()> {
        Self::fail("set_effective_context")
    }
}
