//! llmroute's test side: the real-Envoy launcher (rendering through `llmroute-envoy`), the engine emulators,
//! the fleet set-up shared by tests and the demo, real llama.cpp servers (`llama`), and the benches (`bench`,
//! run by `llmroute-bench`).

pub mod bench;
pub mod certs;
pub mod demo;
pub mod emulator;
pub mod envoy;
pub mod etcd;
pub mod fleet;
pub mod gguf;
pub mod llama;
pub use llmroute_envoy::render;
pub mod rng;
pub mod sdk_clients;
