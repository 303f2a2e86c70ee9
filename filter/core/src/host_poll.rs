//! The timing and bounds of the filter's poll of Envoy's admin API for its hosts (`/clusters`): the path, how
//! often, how long one poll may take, how long a snapshot stays fresh, and how many hosts of one backend it keeps.
//!
//! A leaf of the core: the status page, the `/props` fleet check and the engine-load poller all time themselves
//! and bound their host lists by these numbers, so they live below all three.

/// What the filter asks the admin API for.
pub const ADMIN_PATH: &str = "/clusters?format=json";
/// How often the process polls the admin API.
pub const POLL_INTERVAL_MS: u64 = 1000;
/// How long one poll may take before it is abandoned.
pub const POLL_TIMEOUT_MS: u64 = 900;
/// How often each root context checks whether a poll is due: bounds the jitter of the interval.
pub const TICK_MS: u64 = 250;
/// A snapshot older than this no longer counts: `/readyz` answers 503 until a poll succeeds again.
pub const STALE_AFTER_MS: u64 = 5000;

/// Most hosts of one backend the snapshot keeps by address; beyond it a discovered backend is left to Envoy's
/// ring (see `key_placement`). Counts are never cut.
pub const MAX_HOSTS: usize = 1024;
