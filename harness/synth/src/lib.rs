//! Seeded synthetic inputs shared by the harness and the core's criterion benches: one generator (`rng`) and the
//! bench request bodies (`body`). Only `std` and `serde_json`, so the core's benches can use it without linking the
//! test stack.

pub mod body;
pub mod rng;
