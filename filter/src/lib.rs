//! The llmroute proxy-wasm filter: thin glue between Envoy and `llmroute-core`.
//!
//! The contexts here only read from the host and apply decisions made by the core crate. Nothing in this crate
//! decides anything that a native test could not check on the core crate directly.

// Tests may index and do plain arithmetic; the code that ships may not (see [lints.clippy] in Cargo.toml).
#![cfg_attr(test, allow(clippy::indexing_slicing, clippy::arithmetic_side_effects))]

mod admission;
mod engine_load;
mod fair_queue;
mod fleet_check;
mod global_limits;
mod host;
mod http;
mod key_placement;
mod lease;
mod metrics;
mod phases;
mod placement_store;
mod response;
mod root;
mod status;
mod store_auth;
#[cfg(feature = "test-trap")]
mod trap;
mod upstream;

#[cfg(test)]
mod tests;

// The native build (feature `native`, the `native/` crate) drives the same contexts through Envoy's
// dynamic-module ABI: it makes a `Root` per worker itself, on its own host.
#[cfg(feature = "native")]
pub use host::{init_logging, Envoy, Host, HostError, HostResult, HostStatus};
#[cfg(feature = "native")]
pub use root::Root;

#[cfg(not(feature = "native"))]
proxy_wasm::main! {{
    host::init_logging(log::LevelFilter::Info, host::abi_log);
    proxy_wasm::set_root_context(|_| Box::new(root::Root::new(host::Envoy::abi())));
}}
