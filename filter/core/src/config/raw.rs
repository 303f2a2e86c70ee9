//! Stage one of the config: the document exactly as written in `llmroute.yaml`.
//!
//! These structs only give the file its shape. Unknown fields are rejected here, by serde, so a typo never
//! silently falls back to a default. Everything about *values* (ranges, references, addresses, duplicates) is
//! checked in stage two, [`super::validate`], which can report every problem at once.

use serde::de::IgnoredAny;
use serde::Deserialize;

pub use super::etcd_trust::RawEtcdAuth;
pub use super::resilience::{RawHealth, RawOutlier};
pub use super::tls::RawUpstreamTls;

/// The `llmroute.yaml` document as the filter reads it, schema version 1: every field but those only
/// `llmroute render` reads ([`super::RawRenderOnly`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Schema version. Only `1` exists.
    pub version: u32,
    /// Where Envoy's admin interface listens, `IP:PORT`. Default `127.0.0.1:9901`.
    #[serde(default)]
    pub admin: Option<String>,
    /// The engine fleets. Each one becomes an Envoy cluster of the same name.
    pub backends: Vec<RawBackend>,
    /// The model aliases clients may send, and where each one goes.
    pub models: Vec<RawModel>,
    /// How the affinity key is found.
    #[serde(default)]
    pub affinity: Option<RawAffinity>,
    /// Bounds on what a client may send.
    #[serde(default)]
    pub limits: Option<RawLimits>,
    /// Add `x-llmroute-*` response headers that show how a request was routed. Default false.
    #[serde(default)]
    pub debug_headers: Option<bool>,
    /// How the gateway estimates input tokens.
    #[serde(default)]
    pub tokens: Option<RawTokens>,
    /// Usage accounting.
    #[serde(default)]
    pub usage: Option<RawUsage>,
    /// Inbound API keys. Without it, anyone who reaches the listener is served.
    #[serde(default)]
    pub auth: Option<RawAuth>,
    /// Limits shared by several Envoys, through Envoy's rate-limit filter and a rate-limit service such as
    /// envoyproxy/ratelimit. Off without it.
    #[serde(default)]
    pub global_limits: Option<RawGlobalLimits>,
    /// The fair queue: a request to a full backend waits, and the least-served tenant goes next. Off without it.
    #[serde(default)]
    pub fairness: Option<super::RawFairness>,
    // The fields only `llmroute render` reads (`super::render_only`): known by name, so that a misspelling is
    // still refused, and skipped unread. The filter refuses each one present; `load_document` reads them.
    #[serde(default)]
    pub listen: Option<IgnoredAny>,
    #[serde(default)]
    pub compress_responses: Option<IgnoredAny>,
    #[serde(default)]
    pub listen_tls: Option<IgnoredAny>,
    #[serde(default)]
    pub retries: Option<IgnoredAny>,
    #[serde(default)]
    pub access_log: Option<IgnoredAny>,
}

/// Envoy's rate-limit filter, in front of a gRPC rate-limit service (`docs/admission.md`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGlobalLimits {
    /// The service's gRPC address, `HOST:PORT` (an IP literal or a DNS name). Envoy speaks HTTP/2 to it.
    pub address: String,
    /// The rate-limit domain, as in the service's config. `A-Z a-z 0-9 _ . -`, 1 to 64; default `llmroute`.
    #[serde(default)]
    pub domain: Option<String>,
    /// How long Envoy waits for the service, in milliseconds. `1` to `10000`; default 100.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// When the service cannot answer: `allow` (the request goes on, the default) or `deny` (503).
    #[serde(default)]
    pub failure_mode: Option<String>,
    /// Output tokens charged for a request that names no `max_tokens` and whose response reports no usage.
    /// `1` to `10000000`; default 1024.
    #[serde(default)]
    pub default_max_tokens: Option<u64>,
}

/// Inbound API keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    /// The environment variable, in Envoy's environment, holding `name:token` pairs separated by commas. The
    /// tokens never appear in config or rendered files; the names identify clients in limits and metrics.
    pub keys_env: String,
    /// Limits applied to each key alone.
    #[serde(default)]
    pub limits: Option<RawRateLimits>,
    /// A budget of its own for the keys named here (by key name), in place of `limits`.
    #[serde(default)]
    pub key_limits: Option<RawKeyLimits>,
}

/// `auth.key_limits`: key name to limits block.
pub type RawKeyLimits = NamedPairs<RawRateLimits>;

/// A map from names to values, kept as pairs in the document's order, so that a name written twice reaches
/// validation (a JSON object read into a map would keep only the last).
#[derive(Debug, Clone)]
pub struct NamedPairs<V>(pub Vec<(String, V)>);

impl<V> Default for NamedPairs<V> {
    fn default() -> Self {
        NamedPairs(Vec::new())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for NamedPairs<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Pairs<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Pairs<V> {
            type Value = NamedPairs<V>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map from names to values")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<NamedPairs<V>, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry::<String, V>()? {
                    pairs.push(pair);
                }
                Ok(NamedPairs(pairs))
            }
        }
        d.deserialize_map(Pairs(std::marker::PhantomData))
    }
}

/// Request and token rates, such as `requests: "10-S,600-M"`: amounts per S, M, H or D, refilled continuously.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimits {
    /// Requests per unit, e.g. `"10-S,600-M"`.
    #[serde(default)]
    pub requests: Option<String>,
    /// Tokens (input estimate plus output) per unit, e.g. `"1000-S,50000-M"`.
    #[serde(default)]
    pub tokens: Option<String>,
    /// Output tokens reserved for a request without `max_tokens` (or its variants). Default 1024.
    #[serde(default)]
    pub default_max_tokens: Option<u64>,
    /// Write an output bound into a request that names none (`max_tokens`, or `max_output_tokens` on Responses):
    /// `default_max_tokens`, capped by what the token budget has left. Default false.
    #[serde(default)]
    pub inject_max_tokens: Option<bool>,
}

/// Usage accounting.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUsage {
    /// Add `stream_options.include_usage: true` to streamed chat and completions requests that lack
    /// `stream_options`, so every stream reports its usage; the extra usage chunk is removed from the client's
    /// stream. Default false.
    #[serde(default)]
    pub stream_include_usage: Option<bool>,
}

/// One fleet of engines of the same kind serving the same models.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBackend {
    /// The Envoy cluster name: 1 to 255 printable ASCII characters without spaces, for example `llama` or
    /// Istio's `outbound|8000||llama.ns.svc.cluster.local`. Names starting with `llmroute` are reserved.
    pub name: String,
    /// Engine kind: `llamacpp`, `vllm`, `sglang`, `ollama` or `openai`.
    pub kind: String,
    /// Engine addresses, `HOST:PORT` (an IP literal or a DNS name; IPv6 in brackets). Leave it out, and set
    /// `discovery`, when Envoy learns the hosts itself (EDS, Istio).
    #[serde(default)]
    pub endpoints: Option<Vec<String>>,
    /// The hosts come from Envoy at run time instead of `endpoints`: `{}` when the cluster is defined outside
    /// the rendered bootstrap (CDS, Istio), or `{ eds_path: FILE }` to render an EDS cluster fed from a watched
    /// file. The filter learns the hosts and their health from Envoy's admin API.
    #[serde(default)]
    pub discovery: Option<RawDiscovery>,
    /// Load balancing: `chwbl` (ring hash with bounded load, the default), `least_request` or `round_robin`.
    #[serde(default)]
    pub lb: Option<String>,
    /// The CHWBL bound, in percent of the mean load: a host takes at most this share before keys spill. `>= 100`.
    #[serde(default)]
    pub balance_factor: Option<u32>,
    /// Upstream connect timeout in milliseconds. Default 2000.
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
    /// Most concurrent requests to this backend (Envoy circuit breaker); beyond it, a quick 503 with
    /// `Retry-After`. Default 1024.
    #[serde(default)]
    pub max_inflight: Option<u32>,
    /// With `fairness`: most requests this Envoy runs at once on one host of the backend (with bounded-keys
    /// placement, which names the host); a request whose host is full waits in the fair queue. `1` to `100000`.
    #[serde(default)]
    pub host_max_inflight: Option<u32>,
    /// The engines' context window in tokens; requests that cannot fit are refused or sent elsewhere.
    #[serde(default)]
    pub max_context: Option<u32>,
    /// Active health checks. On by default, with the path chosen by `kind`.
    #[serde(default)]
    pub health: Option<RawHealth>,
    /// Ejection of hosts that return consecutive 5xx. On by default.
    #[serde(default)]
    pub outlier: Option<RawOutlier>,
    /// TLS to the engines: `ca_file` (required), optional `sni`, optional client certificate (`cert_file` with
    /// `key_file`).
    #[serde(default)]
    pub tls: Option<RawUpstreamTls>,
    /// An environment variable holding a bearer token that Envoy sends to this backend.
    #[serde(default)]
    pub credential_env: Option<String>,
    /// Cache slots per endpoint (llama.cpp `-np`). With `affinity.placement: bounded_keys` an endpoint's share
    /// of keys is proportional to its slots. `1` to `256`; default: every endpoint counts the same.
    #[serde(default)]
    pub slots: Option<Vec<u32>>,
    /// Engine-reported load, polled from each host's `/metrics` through Envoy: `{ poll_ms, spill_queue }`. Only
    /// for `llamacpp` (started with `--metrics`), `vllm` and `sglang`. Off without it.
    #[serde(default)]
    pub load: Option<RawLoad>,
    /// Reserved: routing on engine KV-cache events (refused for llamacpp).
    #[serde(default)]
    pub kv_events: Option<bool>,
    /// Reserved: prefill/decode disaggregation (refused for llamacpp).
    #[serde(default)]
    pub disaggregation: Option<String>,
}

/// Engine-reported load of a backend (`backends[].load`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLoad {
    /// How often each host's `/metrics` is read, in milliseconds. `50` to `60000`; default 1000. A reading older
    /// than three polls is stale, and placement then counts that host's requests in flight only.
    #[serde(default)]
    pub poll_ms: Option<u64>,
    /// With `bounded_keys` placement: a request for a known key whose host reports more queued requests than this
    /// goes to the next host in the key's order (the key stays). `0` to `100000`; default: never.
    #[serde(default)]
    pub spill_queue: Option<u32>,
}

/// Where a backend's hosts come from when they are not listed in `endpoints`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDiscovery {
    /// An absolute path to an EDS file (a `DiscoveryResponse` holding one `ClusterLoadAssignment`) that Envoy
    /// watches; replace it atomically (write, then rename) to change the hosts. Without it, `llmroute render`
    /// leaves the cluster out and it must come from elsewhere (CDS, Istio).
    #[serde(default)]
    pub eds_path: Option<String>,
    /// The hosts are registered in etcd under `<prefix>/<IP:PORT>` with a lease; `llmroute discover` watches
    /// the prefix and writes `eds_path`, which is then required.
    #[serde(default)]
    pub etcd: Option<RawEtcd>,
    /// `true` states that the mesh encrypts the traffic to these hosts (Istio mTLS), so `credential_env` is
    /// accepted without `tls`. Only for a cluster defined outside the rendered bootstrap (no `eds_path`).
    /// Default `false`.
    #[serde(default)]
    pub mesh_tls: Option<bool>,
}

/// An etcd prefix that lists a backend's live instances.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEtcd {
    /// etcd client addresses, `HOST:PORT` or `http://HOST:PORT` (with `tls`: `HOST:PORT` or `https://HOST:PORT`),
    /// tried in order.
    #[serde(default)]
    pub endpoints: Option<Vec<String>>,
    /// The key prefix: each instance registers as `<prefix>/<IP:PORT>`. Starts with `/`, no trailing `/`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// TLS to the members, the same block as a backend's `tls`: `ca_file` (required), optional `sni`, optional
    /// client certificate (`cert_file` with `key_file`). `llmroute discover` reads it.
    #[serde(default)]
    pub tls: Option<RawUpstreamTls>,
    /// etcd's user authentication: `{ user, password_env }`, the password read from that environment variable.
    /// Needs `tls` unless every endpoint is loopback.
    #[serde(default)]
    pub auth: Option<RawEtcdAuth>,
    /// Accept instances registered on a loopback address (127.0.0.0/8, ::1): a fleet on Envoy's own host, tests.
    /// Default `false`: refused, like link-local, unspecified, multicast and Envoy's own addresses always are.
    #[serde(default)]
    pub allow_loopback: Option<bool>,
    /// The largest weight one registered instance gets; a larger `weight` or `slots` is cut to it. `1` to
    /// `1000`; default 256.
    #[serde(default)]
    pub max_weight: Option<u32>,
}

/// A model alias and its routes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// The alias clients send in `model`.
    pub name: String,
    /// Where the alias may go. The lowest `priority` wins; ties go to the first listed.
    pub routes: Vec<RawRoute>,
    /// The APIs this alias serves: `chat`, `completions`, `responses`, `embeddings`, `messages`. Default: all.
    #[serde(default)]
    pub endpoints: Option<Vec<String>>,
    /// Accept `model: "<alias>/<upstream-name>"`: the prefix picks this alias and the rest goes upstream as is.
    #[serde(default)]
    pub model_prefix_routing: Option<bool>,
    /// Request and token limits for this alias, shared by all its clients.
    #[serde(default)]
    pub limits: Option<RawRateLimits>,
    /// How chat and responses requests go upstream: `as_sent` (the default) or `always`, which sends a
    /// non-streamed request with `stream: true` and rebuilds one JSON answer from the stream for the client.
    #[serde(default)]
    pub stream_upstream: Option<String>,
    /// This alias' own affinity settings (its routing method); each field left out is the top-level
    /// `affinity`'s.
    #[serde(default)]
    pub affinity: Option<RawAliasAffinity>,
}

/// The affinity settings one alias may set for itself. Same names, values and checks as in [`RawAffinity`];
/// the `bounded_keys` parameters (`key_balance_factor`, `key_idle_ttl_s`, `max_keys`) stay top-level, because
/// the key table they shape belongs to the backend, which several aliases may share.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAliasAffinity {
    /// `hash` or `bounded_keys`, as `affinity.placement`.
    #[serde(default)]
    pub placement: Option<String>,
    /// As `affinity.user_prefix_bytes`.
    #[serde(default)]
    pub user_prefix_bytes: Option<usize>,
    /// As `affinity.session_headers`: replaces the top-level list for this alias.
    #[serde(default)]
    pub session_headers: Option<Vec<String>>,
}

/// One way to serve an alias.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    /// The backend name.
    pub backend: String,
    /// The `model` value the engine expects. Default: the alias itself, and the body is left untouched.
    #[serde(default)]
    pub upstream_model: Option<String>,
    /// Lower is preferred. Default 0.
    #[serde(default)]
    pub priority: Option<i32>,
}

/// Where the affinity key comes from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAffinity {
    /// Request headers that carry an explicit session id, checked in order.
    /// Default `["x-session-id", "x-multi-turn-session-id", "x-claude-code-session-id"]`.
    #[serde(default)]
    pub session_headers: Option<Vec<String>>,
    /// Use the Responses API's `conversation` id as an explicit key. Default false.
    #[serde(default)]
    pub conversation_id: Option<bool>,
    /// Use Anthropic's `metadata.user_id` as an explicit key. Default false.
    #[serde(default)]
    pub anthropic_user_id: Option<bool>,
    /// How many bytes of the first user message form the fallback key. `0` turns the fallback off. Default 256.
    #[serde(default)]
    pub user_prefix_bytes: Option<usize>,
    /// How keys find hosts in a `chwbl` backend: `hash` (Envoy's ring alone, the default) or `bounded_keys`
    /// (the filter places each new key on a host that holds no more than its share of live keys, and keeps it
    /// there; Envoy's ring is the fallback).
    #[serde(default)]
    pub placement: Option<String>,
    /// `bounded_keys`: most live keys a host may hold when a new key is placed, in percent of its share of
    /// all live keys (weighted by `slots`). `100` to `1000`; default 125.
    #[serde(default)]
    pub key_balance_factor: Option<u32>,
    /// `bounded_keys`: a key not seen for this many seconds is forgotten, and its host's share frees up.
    /// `1` to `86400`; default 300.
    #[serde(default)]
    pub key_idle_ttl_s: Option<u64>,
    /// `bounded_keys`: most keys remembered per backend; past it the least recently seen is forgotten.
    /// `16` to `65536`; default 4096.
    #[serde(default)]
    pub max_keys: Option<usize>,
    /// `bounded_keys`: one key table shared by every Envoy replica, in etcd, so replicas place each key alike.
    /// Without it each Envoy keeps its own table.
    #[serde(default)]
    pub placement_store: Option<RawPlacementStore>,
}

/// Where the shared key table lives.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlacementStore {
    /// etcd, reached through its HTTP/JSON gateway by the filter's HTTP callouts.
    pub etcd: RawStoreEtcd,
    /// Which keys reach etcd: `returning` (the default: a key seen again within its idle TTL; a first sighting is
    /// placed locally, as without a store) or `all` (every new key, on its first request).
    #[serde(default)]
    pub share_keys: Option<String>,
    /// Most keys one Envoy creates in etcd per second; past it a key is placed locally. `1` to `10000`; default 20.
    #[serde(default)]
    pub max_creates_per_s: Option<u32>,
}

/// The etcd cluster that holds the shared key table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStoreEtcd {
    /// etcd client addresses, `IP:PORT` or `http://IP:PORT` (`https://IP:PORT` with `tls`), 1 to 16;
    /// `llmroute render` makes them one cluster.
    pub endpoints: Vec<String>,
    /// The key prefix: keys live under `<prefix>/keys/<backend>/`. Starts with `/`, no trailing `/`.
    /// Default `/llmroute`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// How long a new key's first request waits for etcd before it is placed locally, in milliseconds.
    /// `1` to `10000`; default 50.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// TLS to the members, the same block as a backend's `tls`: `ca_file` (required), optional `sni`, and an optional
    /// client certificate (`cert_file` with `key_file`) for an etcd that requires one (`--client-cert-auth`).
    #[serde(default)]
    pub tls: Option<RawUpstreamTls>,
    /// etcd's user authentication: `{ user, password_env }`, the password read from that variable of Envoy's
    /// environment. Needs `tls` unless every endpoint is loopback.
    #[serde(default)]
    pub auth: Option<RawEtcdAuth>,
}

/// Input bounds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Largest request body the filter buffers, in bytes; beyond it, 413. Default 8 MiB, at most 64 MiB.
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
    /// `stream_upstream: always`: most bytes of one answer the filter holds while it rebuilds it from the
    /// stream (text, tool-call arguments, the final response object); beyond it, 502. Default 4 MiB,
    /// `4096` to `67108864` (64 MiB).
    #[serde(default)]
    pub max_assembled_bytes: Option<usize>,
    /// Route timeout for a whole request, in milliseconds. `1` to `86400000`; default 600000 (10 minutes).
    #[serde(default)]
    pub request_timeout_ms: Option<u64>,
    /// How long a client may take to send its request headers, in milliseconds (Envoy's
    /// `request_headers_timeout`); past it the connection is closed. `1000` to `600000`; default 60000.
    #[serde(default)]
    pub headers_timeout_ms: Option<u64>,
    /// How long a client may take to send its whole request, headers and body, in milliseconds (Envoy's
    /// `request_timeout`, which stops counting once the request is in); past it, 408. At least
    /// `headers_timeout_ms`, at most 3600000; default 120000.
    #[serde(default)]
    pub body_timeout_ms: Option<u64>,
    /// A stream with no bytes in either direction for this long is reset, in milliseconds (Envoy's
    /// `stream_idle_timeout`; also a connection's idle timeout). `1000` to `3600000`; default 300000.
    #[serde(default)]
    pub stream_idle_timeout_ms: Option<u64>,
    /// Most concurrent HTTP/2 streams on one client connection. `1` to `10000`; default 100.
    #[serde(default)]
    pub max_concurrent_streams: Option<u32>,
    /// Envoy's heap budget in bytes for the overload manager: at 95% it shrinks its heap, at 98% it stops
    /// accepting requests. `67108864` (64 MiB) to `1099511627776` (1 TiB); default 2147483648 (2 GiB).
    #[serde(default)]
    pub max_heap_bytes: Option<u64>,
}

/// Input-token estimation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTokens {
    /// Tokens counted for each image, whatever its size. Default 768.
    #[serde(default)]
    pub image_tokens: Option<u32>,
}
