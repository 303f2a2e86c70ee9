//! llmroute as an Envoy dynamic module (`libllmroute_native.so`): the same filter as the wasm build, run natively
//! inside Envoy through its dynamic-module ABI (`envoy.filters.http.dynamic_modules`).
//!
//! Nothing here decides anything. The core (`llmroute-core`) and the glue (`llmroute-filter`, built with its
//! `native` feature) are shared unchanged; this crate only
//! - declares the part of Envoy's ABI it uses (`abi`),
//! - implements the glue's `Host` trait over it (`host`), with process-wide shared data and metrics (`shared`),
//! - exports the event hooks Envoy calls and drives the glue's contexts from them, catching any panic: the
//!   configuration's and the root contexts' (`config`), the streams' (`hooks`);
//! - runs the periodic work from the configuration's scheduler on the main thread (`periodic`), and lets one
//!   stream's hook resume or answer another (the fair queue) through the streams' own schedulers (`streams`).
//!
//! See docs/native.md for what the native build does and does not do yet.

// Code that runs inside Envoy: no unchecked indexing or arithmetic (see [lints.clippy] in Cargo.toml); tests may.
#![cfg_attr(test, allow(clippy::indexing_slicing, clippy::arithmetic_side_effects))]

mod abi;
mod body;
mod config;
mod current;
mod events;
mod head_edit;
mod hooks;
mod host;
mod metrics;
mod periodic;
mod shared;
mod streams;
#[cfg(test)]
mod tests;
mod wasm_imports;
