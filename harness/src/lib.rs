//! llmroute's native side: the config renderer behind the CLI, the real-Envoy launcher, the engine emulators,
//! the fleet set-up shared by tests and the demo, real llama.cpp servers (`llama`), and the benches (`bench`,
//! run by `llmroute-bench`).

pub mod bench;
pub mod certs;
pub mod demo;
pub mod emulator;
pub mod envoy;
pub mod fleet;
pub mod gguf;
pub mod llama;
pub mod render;
pub mod rng;
pub mod sdk_clients;
