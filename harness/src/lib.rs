//! llmroute's test side: the real-Envoy launcher (rendering through `llmroute-envoy`), the engine emulators,
//! the fleet set-up shared by tests and the demo, real llama.cpp servers (`llama`), Docker Compose stacks for the
//! container checks (`compose`), and the benches (`bench`, run by `llmroute-bench`), and the chaos and soak runs
//! (`chaos`).

pub mod bench;
pub mod certs;
pub mod chaos;
pub mod compose;
pub mod demo;
pub mod emulator;
pub mod envoy;
pub mod etcd;
pub mod fleet;
pub mod gguf;
pub mod llama;
pub mod ratelimit_service;
pub use llmroute_envoy::render;
pub use llmroute_synth::rng;
pub mod sdk_clients;
