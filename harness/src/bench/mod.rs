//! The benches behind `llmroute-bench`: the overhead of the filter inside Envoy against plain Envoy and the peer
//! routers (`make bench-overhead`), and the report that gathers them with the core's microbenchmarks.
//!
//! - [`body`]: chat bodies of an exact size, from a seed (shared with the core's criterion bench);
//! - [`upstream`]: a minimal upstream fast enough not to be the bottleneck;
//! - [`systems`]: starting llmroute, plain Envoy, sglang-router and vllm-router;
//! - [`load`]: the closed-loop load generator; [`stats`]: percentiles and medians; [`procstat`]: `/proc`;
//! - [`engines`]: routers side by side in front of real llama.cpp servers (`make bench-engines`); [`hot_tenant`]:
//!   its workload where one tenant floods the fleet;
//! - [`overhead`]: the interleaved rounds; [`goals`]: the goals, met or missed;
//! - [`phases`]: the filter's cost phase by phase inside Envoy, from a build with later phases switched off;
//! - [`ab`]: one lever, the filter built before it against the filter now, in interleaved rounds (`llmroute-bench ab`);
//! - [`profile`]: one case's CPU by thread of each proxy, and a `perf record` of it (`llmroute-bench profile`);
//! - [`glue`]: the filter's own code function by function, in node's V8 under a JavaScript host (`llmroute-bench glue`);
//! - [`machine`], [`micro`], [`report`], [`plot`]: `bench/RESULTS.md` and `bench/overhead.png`;
//! - [`routing`]: routing quality against the peers and the oracle (`make bench-routing`): `bench/ROUTING.md`;
//! - [`replicas`]: the two-replica disagreement simulation; [`new_key`]: what the placement store adds to a new
//!   key's first request (both `make bench-replicas`).

pub mod ab;
pub use llmroute_synth::body;
pub mod engines;
pub mod glue;
pub mod goals;
pub mod hot_tenant;
pub mod instructions;
pub mod load;
pub mod machine;
pub mod micro;
pub mod new_key;
pub mod overhead;
pub mod phases;
pub mod plot;
pub mod procstat;
pub mod profile;
pub mod replicas;
pub mod report;
pub mod routing;
pub mod sections;
pub mod stats;
pub mod systems;
pub mod upstream;
