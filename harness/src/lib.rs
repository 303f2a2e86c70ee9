//! llmroute's native side: the config renderer behind the CLI, the real-Envoy launcher, the engine emulators,
//! and the fleet set-up shared by tests, benches and the demo.

pub mod emulator;
pub mod envoy;
pub mod fleet;
pub mod render;
