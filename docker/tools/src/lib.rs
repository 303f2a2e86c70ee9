//! The decisions of llmroute's two container helpers, as plain functions (the binaries only do the I/O):
//!
//! - [`probe`]: `llmroute-probe URL`, a health check for images that have no shell and no curl. The compose file
//!   mounts the one static binary into every service, so one health check works in the local images
//!   (`FROM scratch`) and in the upstream ones alike.
//! - [`entrypoint`]: the `llmroute/envoy` image's entry point, which keeps the contract of the official
//!   `envoyproxy/envoy` image's `docker-entrypoint.sh` without a shell.

pub mod entrypoint;
pub mod probe;
