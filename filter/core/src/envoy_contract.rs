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

/// Headers the route, Envoy's own filters and the access log read or write.
/// The route's `hash_policy` header: the affinity hash, 16 hex digits.
pub const AFFINITY: &str = "x-llmroute-affinity";
/// Debug response header: where the affinity key came from.
pub const AFFINITY_SOURCE: &str = "x-llmroute-affinity-source";
/// Upstream request header naming the alias, for the failover cluster's upstream filter.
pub const ALIAS: &str = "x-llmroute-alias";
/// The route's `cluster_header`: the backend (Envoy cluster) chosen for the request.
pub const CLUSTER: &str = "x-llmroute-cluster";
/// Local replies name their reason code here.
pub const ERROR: &str = "x-llmroute-error";
/// Upstream request headers with the gateway's input-token estimate (both carry the same value).
pub const INPUT_TOKENS: &str = "x-input-tokens";
/// Request header the filter sets just before it answers a request itself. Envoy's `local_reply_config` rewrites
/// every other local reply into the JSON envelope, and skips those that carry this header, whose bodies are
/// already the gateway's own. Client copies are stripped with the rest of the `x-llmroute-` namespace.
pub const LOCAL_REPLY: &str = "x-llmroute-local-reply";
/// Debug response header: why bounded-keys placement chose the host (`pinned`, `placed`, `moved`, `spilled`).
pub const PLACEMENT: &str = "x-llmroute-placement";
/// Envoy's request id, kept on every response and in every error body.
pub const REQUEST_ID: &str = "x-request-id";
/// Response header echoing an explicit session key, so clients can pin later turns.
pub const SESSION_ECHO: &str = "x-multi-turn-session-id";
pub const TOKEN_ESTIMATE: &str = "x-token-estimate";
/// Debug response header: the upstream host that answered.
pub const UPSTREAM: &str = "x-llmroute-upstream";

/// The release both sides were built from: the renderer stamps it on what it writes, the filter reports it on its
/// status page.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The name a backend takes inside metric names (`llmroute.backend.<token>.<metric>`). A name made only of
/// `A-Z a-z 0-9 . _ - | :` is kept as is, so Istio's `outbound|8000||llama.ns.svc.cluster.local` reads the same
/// in Prometheus as in Envoy's own cluster stats. Any other byte becomes `_`, and eight hex digits of the name's
/// xxh3 are appended after `~`, so two names that differ only in such bytes still get distinct tokens.
pub fn stat_token(name: &str) -> String {
    let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'|' | b':');
    if !name.is_empty() && name.bytes().all(plain) {
        return name.to_string();
    }
    let safe: String = name.bytes().map(|b| if plain(b) { b as char } else { '_' }).collect();
    format!("{safe}~{:08x}", xxhash_rust::xxh3::xxh3_64(name.as_bytes()) as u32)
}

/// The native bench build's last phase of a request (`make native-phases`): a dynamic module has no VM
/// configuration, so the overhead bench names the phase in this environment variable of the Envoy process.
pub const BENCH_PHASE_ENV: &str = "LLMROUTE_BENCH_PHASE";

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
/// The cluster through which the filter reaches etcd's HTTP/JSON gateway for the shared placement table
/// (`affinity.placement_store.etcd`).
pub const PLACEMENT_STORE_CLUSTER: &str = "llmroute_placement_store";
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

/// Metric names and their labels.
///
/// A label-carrying metric is defined under one Envoy stat per label combination, named
/// `<metric>;<label>=<value>;<label>=<value>...` (for example `llmroute_rejections_total;reason=model_not_found`).
/// The renderer adds one `stats_tags` regex per label ([`metrics::stats_tags`]); Envoy cuts each `;label=value`
/// out of the name and turns it into a tag, so `/stats/prometheus` shows `llmroute_rejections_total{reason="..."}`.
/// Values never contain `;` or `=`: each goes through [`stat_token`], and they are either names
/// from the config or members of closed sets, so the regexes cannot be fooled and the number of series is bounded
/// by the config (see `docs/observability.md`).
pub mod metrics {
    use crate::envoy_contract::stat_token;

    /// Routed requests, once each, when the exchange is over: `{alias, backend, api, code_class, affinity_source}`.
    pub const REQUESTS: &str = "llmroute_requests_total";
    /// Requests the gateway answered itself with an error (4xx/5xx before any engine): `{reason}`.
    pub const REJECTIONS: &str = "llmroute_rejections_total";
    /// Requests refused by a rate limit: `{alias, key, kind}`.
    pub const RATE_LIMITED: &str = "llmroute_rate_limited_total";
    /// Tokens reported by the engines: `{alias, backend, kind=input|output|cached}`.
    pub const TOKENS: &str = "llmroute_tokens_total";
    /// Streamed responses by how they ended: `{outcome}`.
    pub const STREAM_OUTCOMES: &str = "llmroute_stream_outcomes_total";
    /// Bounded-keys placements: `{reason}`.
    pub const PLACEMENTS: &str = "llmroute_placements_total";
    /// Requests shed by a backend's circuit breaker (503 with Retry-After); no labels.
    pub const OVERFLOW: &str = "llmroute_overflow_total";
    /// Histogram: time from the request's start to the first response body byte, per alias, in milliseconds.
    pub const TTFB_MS: &str = "llmroute_time_to_first_byte_milliseconds";
    /// Histogram: time from the request's start to the end of the exchange, per alias, in milliseconds.
    pub const DURATION_MS: &str = "llmroute_request_duration_milliseconds";
    /// Histogram: prompt (input) tokens per request, per alias, as the engine reported them.
    pub const PROMPT_TOKENS: &str = "llmroute_request_prompt_tokens";
    /// Histogram: completion (output) tokens per request, per alias, as the engine reported them.
    pub const COMPLETION_TOKENS: &str = "llmroute_request_completion_tokens";
    /// Counter: requests admitted under an API key, by the key's configured name (`key`).
    pub const KEY_REQUESTS: &str = "llmroute_key_requests_total";
    /// New keys settled through the shared placement store, by how: `{outcome=won|adopted|timeout|not_sent|error}`;
    /// the last three are fallbacks to local placement.
    pub const PLACEMENT_STORE: &str = "llmroute_placement_store_total";
    /// Fleet-check findings logged (a served model or a slot count that does not match the config).
    pub const FLEET_WARNINGS: &str = "llmroute_fleet_warnings_total";
    /// Fleet checks completed, with or without findings.
    pub const FLEET_CHECKS: &str = "llmroute_fleet_checks_total";
    /// Keys the placement store would take but which were placed locally without asking it:
    /// `{reason=first_sighting|over_budget}`.
    pub const PLACEMENT_STORE_KEPT_LOCAL: &str = "llmroute_placement_store_kept_local_total";
    /// Gauge: the largest wasm linear memory among the filter's VMs, in bytes (the soak watches it).
    pub const VM_MEMORY_BYTES: &str = "llmroute_vm_memory_bytes";
    /// Gauge: requests waiting in a backend's fair queue (`fairness`): `{backend}`.
    pub const QUEUE_DEPTH: &str = "llmroute_queue_depth";
    /// Histogram: how long each request that waited in a backend's fair queue waited before it was admitted, in
    /// milliseconds: `{backend}`.
    pub const QUEUE_WAIT_MS: &str = "llmroute_queue_wait_milliseconds";
    /// Requests refused with a 429 after waiting as long as they could: `{backend}`.
    pub const QUEUE_TIMEOUTS: &str = "llmroute_queue_timeouts_total";
    /// Requests refused at once by a backend's fair queue: `{backend, reason=queue_full|no_wait}`.
    pub const QUEUE_REFUSALS: &str = "llmroute_queue_refusals_total";
    /// Requests whose client left while they waited (removed, charged nothing): `{backend}`.
    pub const QUEUE_ABANDONED: &str = "llmroute_queue_abandoned_total";
    /// Gauge: requests waiting in an engine's own queue, at its last `/metrics` read: `{backend, host}` (the host
    /// as the status page names it).
    pub const ENGINE_QUEUE: &str = "llmroute_engine_queue";
    /// Gauge: requests an engine is running, at its last read: `{backend, host}`.
    pub const ENGINE_RUNNING: &str = "llmroute_engine_running";
    /// Gauge: an engine's KV-cache use in thousandths, at its last read, when it reports one: `{backend, host}`.
    pub const ENGINE_KV_PERMILLE: &str = "llmroute_engine_kv_cache_permille";
    /// Engine `/metrics` reads, by how they ended: `{backend, outcome=ok|error|timeout|no_gauge}`.
    pub const ENGINE_LOAD_READS: &str = "llmroute_engine_load_reads_total";
    /// Hosts whose load reading was found stale at a poll (placement then counts their requests in flight only):
    /// `{backend}`, one per host and poll for as long as it stays stale.
    pub const ENGINE_LOAD_STALE: &str = "llmroute_engine_load_stale_total";

    /// Every label any filter metric carries. Each gets one stats tag.
    pub const LABELS: [&str; 10] = [
        "alias",
        "backend",
        "api",
        "code_class",
        "affinity_source",
        "reason",
        "key",
        "kind",
        "outcome",
        "host",
    ];

    /// The Envoy stat name of `metric` with `labels`, in the order given. Values go through `stat_token`.
    pub fn labelled(metric: &str, labels: &[(&str, &str)]) -> String {
        let mut name = String::from(metric);
        for (label, value) in labels {
            name.push(';');
            name.push_str(label);
            name.push('=');
            name.push_str(&stat_token(value));
        }
        name
    }

    /// The stats tag regex of `label`: its first group (`;label=value`) is cut from the name, its second is the
    /// value. Anchored on the filter's own stats, which Envoy prefixes with `wasmcustom.`.
    pub fn tag_regex(label: &str) -> String {
        format!("^wasmcustom\\.llmroute_[a-z_]+(?:;[a-z_]+=[^;]*)*?(;{label}=([^;]*))")
    }

    /// `(tag_name, regex)` for every label, for the bootstrap's `stats_config.stats_tags`.
    pub fn stats_tags() -> Vec<(&'static str, String)> {
        LABELS.iter().map(|l| (*l, tag_regex(l))).collect()
    }

    /// The status class label value of an HTTP status: `2xx`, `4xx`, `5xx`, ... (`other` outside 100..=599).
    pub fn code_class(status: u32) -> &'static str {
        match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            500..=599 => "5xx",
            _ => "other",
        }
    }
}

/// The filter-state keys the filter writes for the access log (`set_property`); Envoy stores each as
/// `wasm.<key>` and the rendered access log reads it with `%FILTER_STATE(wasm.<key>:PLAIN)%`.
pub mod log_fields {
    /// The alias the client asked for (`gen_ai.request.model`).
    pub const ALIAS: &str = "llmroute.alias";
    /// The model name sent upstream (`gen_ai.response.model`).
    pub const UPSTREAM_MODEL: &str = "llmroute.upstream_model";
    /// The backend that served the request.
    pub const BACKEND: &str = "llmroute.backend";
    /// Where the affinity key came from.
    pub const AFFINITY_SOURCE: &str = "llmroute.affinity_source";
    /// Why bounded-keys placement chose the host.
    pub const PLACEMENT: &str = "llmroute.placement";
    /// The name (never the value) of the API key the request used.
    pub const KEY: &str = "llmroute.key";
    /// Tokens the engine reported.
    pub const INPUT_TOKENS: &str = "llmroute.input_tokens";
    pub const OUTPUT_TOKENS: &str = "llmroute.output_tokens";
    pub const CACHED_TOKENS: &str = "llmroute.cached_tokens";
    /// How a streamed response ended.
    pub const STREAM_OUTCOME: &str = "llmroute.stream_outcome";
    /// How long the request waited in its backend's fair queue, in milliseconds (only requests that waited).
    pub const QUEUE_WAIT_MS: &str = "llmroute.queue_wait_ms";
    /// Every key, for the renderer.
    pub const ALL: [&str; 11] = [
        ALIAS,
        UPSTREAM_MODEL,
        BACKEND,
        AFFINITY_SOURCE,
        PLACEMENT,
        KEY,
        INPUT_TOKENS,
        OUTPUT_TOKENS,
        CACHED_TOKENS,
        STREAM_OUTCOME,
        QUEUE_WAIT_MS,
    ];
    /// How Envoy names the filter state a wasm filter sets with `set_property([key])`.
    pub fn filter_state(key: &str) -> String {
        format!("wasm.{key}")
    }
}

/// Envoy's rate-limit filter (`global_limits`): what the filter sets after admission, and what the renderer's
/// route `rate_limits` read. Descriptor values are config-defined names only (an alias, an API key's name), so
/// their number is bounded by the config; clients cannot set the headers, which are in the stripped
/// `x-llmroute-` namespace.
pub mod global {
    /// Request header: the alias the request was admitted under.
    pub const ALIAS_HEADER: &str = "x-llmroute-limit-alias";
    /// Request header: the name of the API key the request presented (set only with `auth`).
    pub const KEY_HEADER: &str = "x-llmroute-limit-key";
    /// The first entry of every descriptor: `(KIND, REQUESTS)` or `(KIND, TOKENS)`.
    pub const KIND: &str = "llmroute";
    pub const REQUESTS: &str = "requests";
    pub const TOKENS: &str = "tokens";
    /// The second entry's key: the alias, or the key name.
    pub const ALIAS: &str = "alias";
    pub const KEY: &str = "key";
    /// Filter state (`set_property`) with the tokens to charge when the stream is done; the stream-done rate
    /// limit reads it as `%FILTER_STATE(wasm.llmroute.tokens_charged:PLAIN)%` (see [`super::log_fields::filter_state`]).
    pub const TOKENS_CHARGED: &str = "llmroute.tokens_charged";
    /// The cluster of the rate-limit service (HTTP/2).
    pub const CLUSTER: &str = "llmroute_ratelimit";
    /// Envoy's rate-limit filter.
    pub const FILTER: &str = "envoy.filters.http.ratelimit";
    /// `response.code_details` of the rate-limit filter's own replies: over a limit, and the service failing
    /// with `failure_mode: deny`.
    pub const DETAILS_LIMITED: &str = "request_rate_limited";
    pub const DETAILS_SERVICE_ERROR: &str = "rate_limiter_error";
    /// Envoy's response flags for the same two replies (`local_reply_config` matches on them).
    pub const FLAG_LIMITED: &str = "RL";
    pub const FLAG_SERVICE_ERROR: &str = "RLSE";
    /// The response header Envoy's rate-limit filter sets from the service's `duration_until_reset` (seconds).
    pub const RESET_HEADER: &str = "x-ratelimit-reset";
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
    /// Envoy's weight of each host of a discovered backend that weighs more than 1, by its `IP:PORT`.
    pub fn weights(backend: &str) -> String {
        format!("llmroute.weights.{backend}")
    }
    /// The engine load readings of a backend's hosts (`load::encode`).
    pub fn load(backend: &str) -> String {
        format!("llmroute.load.{backend}")
    }
    /// The lease that lets one worker at a time poll a backend's engine load.
    pub fn load_lease(backend: &str) -> String {
        format!("llmroute.loadlease.{backend}")
    }
    /// Why the last load read of each of a backend's hosts gave no reading (`load::poll::encode_problems`).
    pub fn load_problems(backend: &str) -> String {
        format!("llmroute.loadnote.{backend}")
    }
    /// A backend's work in flight per host: prompt tokens plus requested output of the requests placed there.
    pub fn work(backend: &str) -> String {
        format!("llmroute.work.{backend}")
    }
    /// The lease that lets one worker at a time run the status poll.
    pub const STATUS_LEASE: &str = "llmroute.status.lease";
    /// The status poll's latest snapshot.
    pub const STATUS_SNAPSHOT: &str = "llmroute.status.snapshot";
    /// The process's key of the host ids the status page shows (`status::IdKey`).
    pub const STATUS_ID_KEY: &str = "llmroute.status.idkey";
    /// Whether the status polls of the admin API fail, and where (`admin_poll::AdminFailure`, or `null`).
    pub const STATUS_ADMIN: &str = "llmroute.status.admin";
    /// The lease that lets one worker at a time run the `/props` check.
    pub const PROPS_LEASE: &str = "llmroute.props.lease";
    /// The lease that lets one worker at a time refresh the key tables from the placement store.
    pub const STORE_SYNC_LEASE: &str = "llmroute.store.sync";
    /// The etcd lease new keys are attached to (`key_placement::store::Lease`).
    pub const STORE_LEASE: &str = "llmroute.store.lease";
    /// The keys this Envoy created in etcd in the current second (`key_placement::store::CreateBudget`).
    pub const STORE_CREATES: &str = "llmroute.store.creates";
    /// The token etcd gave for the placement store's user (`affinity.placement_store.etcd.auth`); empty: none.
    pub const STORE_TOKEN: &str = "llmroute.store.token";
    /// A backend's keys placed locally while the placement store failed, to settle once it answers.
    pub fn store_pending(backend: &str) -> String {
        format!("llmroute.store.pending.{backend}")
    }
    /// A backend's fair queue (`llmroute_core::fairness::encode`): its tenants' counters and its waiters.
    pub fn fair_queue(backend: &str) -> String {
        format!("llmroute.fairq.{backend}")
    }
    /// The etcd revision up to which a backend's keys were read from the placement store.
    pub fn store_revision(backend: &str) -> String {
        format!("llmroute.store.rev.{backend}")
    }
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
        assert!(PLACEMENT_STORE_CLUSTER.starts_with(RESERVED_CLUSTER_PREFIX));
        assert_eq!(failover_cluster(3), "llmroute-failover-3");
        assert_eq!(probe_cluster("a", 1), "llmroute-probe-a-1");
    }

    #[test]
    fn labelled_names_keep_values_free_of_separators() {
        let n = metrics::labelled(
            metrics::REQUESTS,
            &[("alias", "a;b=c"), ("backend", "outbound|80||x.ns")],
        );
        assert!(n.starts_with("llmroute_requests_total;alias=a_b_c~"), "{n}");
        assert!(n.ends_with(";backend=outbound|80||x.ns"), "{n}");
        assert_eq!(n.matches(';').count(), 2);
        assert_eq!(n.matches('=').count(), 2);
    }

    #[test]
    fn every_label_has_a_tag_and_metric_names_are_prometheus_style() {
        assert_eq!(metrics::stats_tags().len(), metrics::LABELS.len());
        for (label, re) in metrics::stats_tags() {
            assert!(re.contains(&format!("(;{label}=([^;]*))")), "{re}");
        }
        for c in [
            metrics::REQUESTS,
            metrics::REJECTIONS,
            metrics::RATE_LIMITED,
            metrics::TOKENS,
        ] {
            assert!(c.starts_with("llmroute_") && c.ends_with("_total"), "{c}");
        }
        assert_eq!(metrics::code_class(503), "5xx");
        assert_eq!(metrics::code_class(200), "2xx");
        assert_eq!(metrics::code_class(0), "other");
    }
}
