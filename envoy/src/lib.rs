//! llmroute's deployment side: everything that turns `llmroute.yaml` into Envoy configuration.
//!
//! It also holds `discover` and `register`, which read and write etcd through its HTTP/JSON gateway (`etcd`, a
//! small blocking client on ureq). It depends on the core (the one validator the filter also runs), serde, clap
//! and ureq (with rustls on ring for TLS to etcd, `etcd_tls`; no system trust store), and nothing of the test
//! stack, so the shipped `llmroute` CLI stays small.
//! The harness (emulators, launchers, benches) uses it to render the bootstraps its tests run.

pub mod discover;
pub mod etcd;
pub mod etcd_tls;
pub mod instance_address;
pub mod register;
pub mod render;
