//! The contract between the filter and the renderer: every name both sides must spell alike.
//!
//! The filter (the wasm module) and `llmroute render` (the `llmroute-envoy` crate) never talk to each other; they
//! meet only in Envoy's configuration. A root id, a header, a metadata path or a cluster name typed twice would
//! drift silently and show up as a failing end-to-end test at best. So each such name is defined here once, and
//! both sides import it from this module: a rename is a compile error on the side that was forgotten, not a
//! misrouted request.
//!
//! What lives here: the plugin's root ids (which are also its VM ids), the headers the route and Envoy's own
//! filters read or write, the endpoint metadata path, the names of the clusters the renderer adds for the filter,
//! the filter's metric names and the stats tag that labels them, and the shared-data keys the filter's VMs share
//! (one VM per worker, so these are a contract between workers of the same module).

pub use crate::headers::{
    AFFINITY, AFFINITY_SOURCE, ALIAS, CLUSTER, ERROR, INPUT_TOKENS, LOCAL_REPLY, PLACEMENT, REQUEST_ID, SESSION_ECHO,
    TOKEN_ESTIMATE, UPSTREAM,
};

/// The downstream role's root id, which is also its plugin name and `vm_id`.
pub const ROOT_ID: &str = "llmroute";
/// The upstream role's root id and `vm_id`: the filter on the failover aggregates, which rewrites `model` per
/// chosen host.
pub const UPSTREAM_ROOT_ID: &str = "llmroute_upstream";

/// `bounded_keys` placement names the chosen host (base64 `IP:PORT`) in this request header, which Envoy's
/// stateful-session filter reads; Envoy writes it back on responses, and the filter removes it there.
pub const SESSION_HEADER: &str = "x-llmroute-endpoint";

/// The endpoint and cluster metadata namespace (`filter_metadata.llmroute`).
pub const METADATA_NAMESPACE: &str = "llmroute";
/// The endpoint metadata key naming the backend a host belongs to (`filter_metadata.llmroute.backend`); the
/// upstream role reads it to pick the backend's `upstream_model`.
pub const METADATA_BACKEND: &str = "backend";
/// The cluster metadata key naming the engine kind (`filter_metadata.llmroute.kind`).
pub const METADATA_KIND: &str = "kind";

/// The cluster the filter polls for Envoy's view of its hosts (`/llmroute/status`, `/readyz`, discovered hosts).
pub const ADMIN_CLUSTER: &str = "llmroute_admin";
/// The name prefix of the single-host clusters through which the filter reads llama.cpp `/props`.
pub const PROBE_CLUSTER_PREFIX: &str = "llmroute-probe-";
/// The name prefix of the original-destination clusters through which the filter reads llama.cpp `/props` from
/// the hosts of a discovered backend (one cluster per such backend, see [`discovered_probe_cluster`]). Distinct
/// from [`PROBE_CLUSTER_PREFIX`], so no backend name makes the two kinds of name collide.
pub const DISCOVERED_PROBE_CLUSTER_PREFIX: &str = "llmroute-dst-probe-";
/// The request header that names the host (`IP:PORT`) an original-destination probe cluster connects to. It is
/// Envoy's default name (`original_dst_lb_config.http_header_name`), rendered explicitly. Only the filter's own
/// calls set it: they do not pass through the listener's filters, and no route names a probe cluster.
pub const ORIGINAL_DST_HEADER: &str = "x-envoy-original-dst-host";
/// The name prefix of the failover aggregate clusters.
pub const FAILOVER_CLUSTER_PREFIX: &str = "llmroute-failover-";
/// Cluster names a backend may not take, since the renderer adds clusters under this prefix.
pub const RESERVED_CLUSTER_PREFIX: &str = "llmroute";

/// The probe cluster of endpoint `index` of `backend`.
pub fn probe_cluster(backend: &str, index: usize) -> String {
    format!("{PROBE_CLUSTER_PREFIX}{backend}-{index}")
}

/// The original-destination probe cluster of the discovered backend `backend`.
pub fn discovered_probe_cluster(backend: &str) -> String {
    format!("{DISCOVERED_PROBE_CLUSTER_PREFIX}{backend}")
}

/// The failover aggregate of the alias at `index` in the config's `models`.
pub fn failover_cluster(index: usize) -> String {
    format!("{FAILOVER_CLUSTER_PREFIX}{index}")
}

/// The filter's metric names start with this; Envoy shows them as `wasmcustom.<name>`.
pub const METRIC_PREFIX: &str = "llmroute";
/// The stats tag that turns the backend token inside per-backend metric names into a label.
pub const BACKEND_STATS_TAG: &str = "llmroute_backend";
/// The regex of that tag, matching [`backend_metric`] names as Envoy shows them.
pub const BACKEND_STATS_TAG_REGEX: &str = "^wasmcustom\\.llmroute\\.backend\\.((.+)\\.)[a-z_]+$";

/// The name of a per-backend metric; `token` is the backend's stat token (`Backend::stat_token`).
pub fn backend_metric(token: &str, metric: &str) -> String {
    format!("{METRIC_PREFIX}.backend.{token}.{metric}")
}

/// Shared-data keys, one family per piece of state the workers share.
pub mod shared {
    /// A backend's `bounded_keys` key table.
    pub fn keys(backend: &str) -> String {
        format!("llmroute.keys.{backend}")
    }
    /// A backend's in-flight counts per host.
    pub fn in_flight(backend: &str) -> String {
        format!("llmroute.inflight.{backend}")
    }
    /// The hosts of a backend that the latest status poll found down.
    pub fn down(backend: &str) -> String {
        format!("llmroute.down.{backend}")
    }
    /// Every host Envoy listed for a discovered backend at the latest poll.
    pub fn hosts(backend: &str) -> String {
        format!("llmroute.hosts.{backend}")
    }
    /// The `total_slots` each llama.cpp server of a backend last reported.
    pub fn slots(backend: &str) -> String {
        format!("llmroute.slots.{backend}")
    }
    /// The `total_slots` each llama.cpp server of a discovered backend last reported, by its `IP:PORT`.
    pub fn slots_by_address(backend: &str) -> String {
        format!("llmroute.slotsat.{backend}")
    }
    /// The lease that lets one worker at a time run the status poll.
    pub const STATUS_LEASE: &str = "llmroute.status.lease";
    /// The status poll's latest snapshot.
    pub const STATUS_SNAPSHOT: &str = "llmroute.status.snapshot";
    /// The lease that lets one worker at a time run the `/props` check.
    pub const PROPS_LEASE: &str = "llmroute.props.lease";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_cluster_names_are_reserved() {
        assert!(probe_cluster("a", 0).starts_with(RESERVED_CLUSTER_PREFIX));
        assert!(failover_cluster(3).starts_with(RESERVED_CLUSTER_PREFIX));
        assert!(discovered_probe_cluster("a").starts_with(RESERVED_CLUSTER_PREFIX));
        assert!(!discovered_probe_cluster("a-0").starts_with(PROBE_CLUSTER_PREFIX));
        assert!(ADMIN_CLUSTER.starts_with(RESERVED_CLUSTER_PREFIX));
        assert_eq!(failover_cluster(3), "llmroute-failover-3");
        assert_eq!(probe_cluster("a", 1), "llmroute-probe-a-1");
    }
}
