//! The module's native tests: the hooks driven as Envoy drives them, over a fake Envoy (`fake_envoy`) that
//! defines every callback the module calls.

use std::ffi::c_void;

use crate::abi;
use crate::config::{envoy_dynamic_module_on_http_filter_config_new, envoy_dynamic_module_on_program_init};

mod bodies;
mod budget;
mod fake_envoy;
mod metrics;
mod streams;

/// Loads the module and a filter configuration of `config`, as Envoy does.
fn config(config: &str) -> *const c_void {
    envoy_dynamic_module_on_program_init();
    // The module's panic hook logs through Envoy, which the fake drops: a test's failure is printed as usual.
    let _ = std::panic::take_hook();
    let buffer = |b: &[u8]| abi::EnvoyBuffer {
        ptr: b.as_ptr(),
        length: b.len(),
    };
    let cfg = envoy_dynamic_module_on_http_filter_config_new(
        std::ptr::NonNull::<c_void>::dangling().as_ptr(),
        buffer(b"llmroute"),
        buffer(config.as_bytes()),
    );
    assert!(!cfg.is_null(), "the test config loads");
    cfg
}
