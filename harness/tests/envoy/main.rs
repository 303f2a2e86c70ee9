//! Integration tests through the real compiled filter in a real Envoy, in front of emulated llama.cpp engines.
//!
//! Every test starts its own Envoy on random ports (see `llmroute_harness::envoy`), polls readiness, and prints
//! Envoy's log if it fails. Engines are self-checking emulators: they record the exact bytes they received and
//! answer with the header `x-emu-backend`, so each assertion is about what really crossed Envoy.
//! One test binary, one module per capability.

mod admission;
mod apis;
mod chat;
mod corpus;
mod credentials;
mod deployments;
mod discovery;
mod edge;
mod etcd_discovery;
mod failure;
mod fair_hosts;
mod fairness;
mod fleet_check;
mod global_limits;
mod istio;
mod load;
mod native;
mod nvcf;
mod observability;
mod placement;
mod replicas;
mod resilience;
mod smuggling;
mod status;
mod stream_upstream;
mod streams;
mod support;
mod tls;
