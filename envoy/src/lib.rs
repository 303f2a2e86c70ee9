//! llmroute's deployment side: everything that turns `llmroute.yaml` into Envoy configuration.
//!
//! It depends on the core (the one validator the filter also runs), serde and clap, and nothing of the test
//! stack, so the shipped `llmroute` CLI stays small. The harness (emulators, launchers, benches) uses it to render
//! the bootstraps its tests run.

pub mod render;
