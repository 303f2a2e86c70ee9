//! The validated runtime config, and the one entry point that builds it from text.
//!
//! The same [`load`] runs in the native CLI (`llmroute validate`, `llmroute render`) and in the filter's
//! `on_configure`, so a file that validates on a laptop is exactly the file the filter accepts.
//! Look-up tables (alias to routes) are compiled once here, never per request.

mod address;
mod diagnostics;
mod env;
mod etcd_trust;
mod fairness;
pub mod rates;
mod raw;
mod render_only;
mod resilience;
mod suggest;
mod tls;
mod validate;

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;

pub use address::{parse_endpoint, parse_listen, with_port, Endpoint};
pub use diagnostics::Diagnostics;
pub use env::{env_problems, EnvHolds, EnvVar};
pub use etcd_trust::{env_name_ok, EtcdAuth, RawEtcdAuth};
pub use fairness::{circuit_breaker_limit, Fairness, RawFairness, RawTenantBy, RawWeights, TenantBy, MAX_TENANTS};
pub use raw::{
    RawAffinity, RawAliasAffinity, RawAuth, RawBackend, RawConfig, RawDiscovery, RawEtcd, RawGlobalLimits, RawLimits,
    RawLoad, RawModel, RawPlacementStore, RawRateLimits, RawRoute, RawStoreEtcd, RawTokens, RawUpstreamTls, RawUsage,
};
pub use render_only::{strip as strip_render_only, RawAccessLog, RawRenderOnly, RenderOnly};
pub use resilience::{default_health_path, Health, Outlier, RawRetries, Retries};
pub use tls::{is_loopback, upstream_tls, CertKey, ListenTls, RawListenTls, UpstreamTls};

use crate::api_kind::ApiSet;
pub use crate::envoy_contract::stat_token;
pub use rates::RateLimits;

/// The only schema version.
pub const SCHEMA_VERSION: u32 = 1;
/// Where Envoy listens for clients unless `listen` says otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:10000";
/// Where Envoy's admin interface listens unless `admin` says otherwise.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9901";
/// The top-level fields only `llmroute render` reads; the renderer leaves them out of the filter's document.
pub use render_only::FIELDS as RENDER_ONLY_FIELDS;
/// Default body bound: 8 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;
/// The most a body bound may be raised to: 64 MiB.
pub const MAX_MAX_BODY_BYTES: usize = 64 << 20;
/// Default bound on an answer rebuilt from a stream: 4 MiB.
pub const DEFAULT_MAX_ASSEMBLED_BYTES: usize = 4 << 20;
/// Default CHWBL bound, percent of the mean load.
pub const DEFAULT_BALANCE_FACTOR: u32 = 150;
/// Default first-user-message prefix for the affinity fallback.
pub const DEFAULT_USER_PREFIX_BYTES: usize = 256;
/// Default session headers, checked in order.
pub const DEFAULT_SESSION_HEADERS: [&str; 3] = ["x-session-id", "x-multi-turn-session-id", "x-claude-code-session-id"];
/// Default circuit-breaker limit (Envoy's own default).
pub const DEFAULT_MAX_INFLIGHT: u32 = 1024;
/// Default tokens counted per image.
pub const DEFAULT_IMAGE_TOKENS: u32 = 768;
/// Largest allowed `user_prefix_bytes`.
pub const MAX_USER_PREFIX_BYTES: usize = 64 << 10;

/// One problem in a config file: which field, what value, and why it is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// A path such as `backends[1].balance_factor`.
    pub field: String,
    /// The offending value as written (may be empty when the field is missing).
    pub value: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}", self.field, self.reason)
        } else {
            write!(f, "{} = {}: {}", self.field, self.value, self.reason)
        }
    }
}

/// All problems found in one file, in document order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// The engine software behind a backend. It decides health paths and dialect checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    LlamaCpp,
    Vllm,
    Sglang,
    Ollama,
    OpenAi,
}

impl EngineKind {
    pub const NAMES: &'static str = "llamacpp, vllm, sglang, ollama, openai";

    /// True for the kinds whose engines report their queue on `/metrics` (the gauges are named in
    /// `crate::load::signals`, whose tests keep the two in step).
    pub fn reports_load(self) -> bool {
        matches!(self, EngineKind::LlamaCpp | EngineKind::Vllm | EngineKind::Sglang)
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "llamacpp" => Self::LlamaCpp,
            "vllm" => Self::Vllm,
            "sglang" => Self::Sglang,
            "ollama" => Self::Ollama,
            "openai" => Self::OpenAi,
            _ => return None,
        })
    }

    /// The port the engine's server listens on unless told otherwise (an API behind TLS for `openai`).
    pub fn default_port(self) -> u16 {
        match self {
            Self::LlamaCpp => 8080,
            Self::Vllm => 8000,
            Self::Sglang => 30000,
            Self::Ollama => 11434,
            Self::OpenAi => 443,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::LlamaCpp => "llamacpp",
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
            Self::Ollama => "ollama",
            Self::OpenAi => "openai",
        }
    }
}

/// How Envoy picks a host inside a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbPolicy {
    /// Ring hash on the affinity header with `hash_balance_factor`: consistent hashing with bounded loads.
    Chwbl,
    LeastRequest,
    RoundRobin,
}

impl LbPolicy {
    pub const NAMES: &'static str = "chwbl, least_request, round_robin";

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chwbl => "chwbl",
            Self::LeastRequest => "least_request",
            Self::RoundRobin => "round_robin",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "chwbl" => Self::Chwbl,
            "least_request" => Self::LeastRequest,
            "round_robin" => Self::RoundRobin,
            _ => return None,
        })
    }
}

/// A backend whose hosts Envoy discovers: the filter learns them, with their health, from the admin poll.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Discovery {
    /// The EDS file `llmroute render` points the cluster at; `None` when the cluster is defined elsewhere.
    pub eds_path: Option<String>,
    /// Set when `llmroute discover` fills `eds_path` from etcd.
    pub etcd: Option<EtcdSource>,
    /// The user states that the mesh encrypts the traffic to these hosts (`discovery: {}` only).
    pub mesh_tls: bool,
}

/// An etcd prefix holding a backend's instances, as `llmroute discover` and `llmroute register` use it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EtcdSource {
    /// Base URLs, `http://HOST:PORT` (`https://HOST:PORT` with `tls`), tried in order.
    pub endpoints: Vec<String>,
    /// Without a trailing `/`; an instance's key is `<prefix>/<IP:PORT>`.
    pub prefix: String,
    /// TLS to the members, verified as a backend's `tls` is, with the client certificate when one is given.
    pub tls: Option<UpstreamTls>,
    /// etcd's user authentication, when etcd has it on.
    pub auth: Option<EtcdAuth>,
    /// Instances registered on a loopback address are accepted.
    pub allow_loopback: bool,
    /// The largest weight one registered instance gets.
    pub max_weight: u32,
}

impl EtcdSource {
    /// Most etcd endpoints one backend may list.
    pub const MAX_ENDPOINTS: usize = 16;
    /// Longest prefix, in bytes.
    pub const MAX_PREFIX: usize = 256;

    /// The key an instance at `addr` (`IP:PORT`) registers under.
    pub fn key(&self, addr: &str) -> String {
        format!("{}/{addr}", self.prefix)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// The Envoy cluster name, as written.
    pub name: String,
    pub kind: EngineKind,
    /// Empty when [`Backend::discovery`] is set.
    pub endpoints: Vec<Endpoint>,
    /// Set when the hosts come from Envoy at run time instead of `endpoints`.
    pub discovery: Option<Discovery>,
    pub lb: LbPolicy,
    /// Percent of the mean load; only meaningful for [`LbPolicy::Chwbl`].
    pub balance_factor: u32,
    pub connect_timeout_ms: u64,
    pub max_inflight: u32,
    /// With `fairness` and bounded-keys placement: most requests in flight per host (see `crate::fairness`).
    pub host_max_inflight: Option<u32>,
    pub max_context: Option<u32>,
    /// `None` when active health checks are off.
    pub health: Option<Health>,
    /// `None` when outlier ejection is off.
    pub outlier: Option<Outlier>,
    pub tls: Option<UpstreamTls>,
    pub credential_env: Option<String>,
    /// Cache slots per endpoint, in `endpoints` order; `None` when every endpoint counts the same.
    pub slots: Option<Vec<u32>>,
    /// Engine-reported load polling; `None` when off.
    pub load: Option<Load>,
}

/// A backend's engine-load polling (`backends[].load`, see `crate::load`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Milliseconds between two reads of a host's `/metrics`.
    pub poll_ms: u64,
    /// The queue past which a known key's request goes to another host; `None`: never.
    pub spill_queue: Option<u32>,
}

impl Load {
    pub const DEFAULT_POLL_MS: u64 = 1000;
    pub const POLL_MS: std::ops::RangeInclusive<u64> = 50..=60_000;
    pub const MAX_SPILL_QUEUE: u32 = 100_000;
}

impl Backend {
    /// True when the hosts come from Envoy at run time.
    pub fn discovered(&self) -> bool {
        self.discovery.is_some()
    }

    /// The token that names this backend inside metric names: see [`stat_token`].
    pub fn stat_token(&self) -> String {
        stat_token(&self.name)
    }
}

/// The most slots one host can weigh, whether from the config's `slots` or a server's `/props` `total_slots`.
/// Placement shares keys in proportion to slots, so a server that reported `u32::MAX` would otherwise take every
/// new key; 256 is well above any real `-np`.
pub const MAX_SLOTS: u32 = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Index into [`Config::backends`].
    pub backend: usize,
    pub upstream_model: String,
    pub priority: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelAlias {
    pub name: String,
    /// Sorted by priority, lowest first; stable for ties.
    pub routes: Vec<Route>,
    pub endpoints: ApiSet,
    pub model_prefix_routing: bool,
    pub limits: Option<RateLimits>,
    /// The alias' effective affinity: the top-level `affinity` with the alias' own `affinity` fields over it,
    /// merged once at load so a request reads one struct.
    pub affinity: AffinityConfig,
    pub stream_upstream: StreamUpstream,
}

/// How an alias's chat and responses requests go upstream (`models[].stream_upstream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamUpstream {
    /// As the client sent them.
    #[default]
    AsSent,
    /// Streamed, whatever the client asked; a non-streamed request gets one JSON answer rebuilt from the stream.
    Always,
}

impl StreamUpstream {
    pub const NAMES: &'static str = "as_sent, always";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "as_sent" => Some(Self::AsSent),
            "always" => Some(Self::Always),
            _ => None,
        }
    }
}

/// Inbound API keys: where they are, and the limits each key has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth {
    /// The environment variable holding the keys (read by the filter at start, never by the renderer).
    pub keys_env: String,
    /// The budget of every key not named in `key_limits`.
    pub limits: Option<RateLimits>,
    /// Keys with a budget of their own, by key name (unique).
    pub key_limits: Vec<(String, RateLimits)>,
}

impl Auth {
    /// The budget of the key named `key`: its own, else the one every key has.
    pub fn limits_for(&self, key: &str) -> Option<&RateLimits> {
        self.key_limits
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, l)| l)
            .or(self.limits.as_ref())
    }
}

/// `global_limits`: where the rate-limit service is, and how Envoy treats it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalLimits {
    pub address: Endpoint,
    pub domain: String,
    pub timeout_ms: u64,
    /// Let requests through when the service cannot answer.
    pub failure_mode_allow: bool,
    pub default_max_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffinityConfig {
    /// Lower-case header names, checked in order.
    pub session_headers: Vec<String>,
    pub user_prefix_bytes: usize,
    pub conversation_id: bool,
    pub anthropic_user_id: bool,
    pub placement: KeyPlacement,
    /// `affinity.placement_store`: the key table shared by every replica (only with `bounded_keys`).
    pub placement_store: Option<PlacementStore>,
}

/// The etcd cluster that holds the key table every replica shares (see `key_placement::store`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementStore {
    /// etcd client addresses; the renderer makes them the endpoints of the store's cluster.
    pub endpoints: Vec<Endpoint>,
    /// Without a trailing `/`.
    pub prefix: String,
    /// How long a new key's first request waits for etcd.
    pub timeout_ms: u64,
    /// TLS to the members, verified as a backend's `tls` is (`ca_file`, and `sni` or each member's own host), with
    /// the client certificate when one is given.
    pub tls: Option<UpstreamTls>,
    /// etcd's user authentication, when etcd has it on.
    pub auth: Option<EtcdAuth>,
    /// Which keys are shared through etcd.
    pub share_keys: ShareKeys,
    /// Most keys this Envoy creates in etcd per second.
    pub max_creates_per_s: u32,
}

impl PlacementStore {
    pub const DEFAULT_PREFIX: &'static str = "/llmroute";
    pub const DEFAULT_TIMEOUT_MS: u64 = 50;
    pub const MAX_TIMEOUT_MS: u64 = 10_000;
    pub const DEFAULT_MAX_CREATES_PER_S: u32 = 20;
    pub const MAX_MAX_CREATES_PER_S: u32 = 10_000;
}

/// `affinity.placement_store.share_keys`: which keys a replica writes to etcd (see `key_placement::store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShareKeys {
    /// A key seen again within its idle TTL; its first request is placed locally, as without a store.
    #[default]
    Returning,
    /// Every new key, on its first request.
    All,
}

impl ShareKeys {
    pub const NAMES: &'static str = "returning, all";

    pub fn parse(name: &str) -> Option<ShareKeys> {
        match name {
            "returning" => Some(ShareKeys::Returning),
            "all" => Some(ShareKeys::All),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ShareKeys::Returning => "returning",
            ShareKeys::All => "all",
        }
    }
}

/// How an affinity key finds its host inside a `chwbl` backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPlacement {
    /// Envoy's ring hash on the key, with its in-flight bound.
    Hash,
    /// The filter places keys under a live-key bound and pins them (see `key_placement`).
    BoundedKeys(BoundedKeys),
}

impl KeyPlacement {
    pub const NAMES: &'static str = "hash, bounded_keys";

    pub fn bounded(&self) -> Option<&BoundedKeys> {
        match self {
            KeyPlacement::BoundedKeys(b) => Some(b),
            KeyPlacement::Hash => None,
        }
    }
}

/// The parameters of [`KeyPlacement::BoundedKeys`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundedKeys {
    /// Percent of a host's share of live keys that it may hold when it takes a new key.
    pub key_balance_factor: u32,
    /// A key idle this long is forgotten.
    pub idle_ttl_ms: u64,
    /// Most keys remembered per backend.
    pub max_keys: usize,
}

impl Default for BoundedKeys {
    fn default() -> Self {
        BoundedKeys {
            key_balance_factor: 125,
            idle_ttl_ms: 300_000,
            max_keys: 4096,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub max_body_bytes: usize,
    /// Most bytes of one answer held while it is rebuilt from a stream (`stream_upstream: always`).
    pub max_assembled_bytes: usize,
    pub request_timeout_ms: u64,
    pub headers_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub stream_idle_timeout_ms: u64,
    pub max_concurrent_streams: u32,
    pub max_heap_bytes: u64,
}

/// The validated config, as the filter reads it: every field but those only `llmroute render` reads
/// ([`RenderOnly`]). Build it with [`load`] or [`Config::try_from`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub admin: SocketAddr,
    pub backends: Vec<Backend>,
    pub models: Vec<ModelAlias>,
    pub affinity: AffinityConfig,
    pub limits: Limits,
    pub debug_headers: bool,
    pub image_tokens: u32,
    /// Ask streamed chat/completions for usage on the client's behalf.
    pub stream_include_usage: bool,
    /// `None`: no key is asked for.
    pub auth: Option<Auth>,
    /// Envoy's rate-limit filter and its service (`global_limits`); `None`: limits are this Envoy's alone.
    pub global_limits: Option<GlobalLimits>,
    /// The fair queue (`fairness`); `None`: a full backend refuses at once (Envoy's circuit breaker).
    pub fairness: Option<Fairness>,
    /// Settings that load but do nothing; `llmroute validate` prints them.
    pub warnings: Vec<ConfigError>,
    alias_index: HashMap<String, usize>,
    session_header_names: Vec<String>,
    session_headers_shared: bool,
}

impl Config {
    /// True when any alias places keys with `bounded_keys` (the top-level setting or its own): the filter then
    /// keeps key tables, and the renderer adds the stateful-session filter that turns its pin into the host.
    pub fn any_bounded_keys(&self) -> bool {
        self.bounded_keys().is_some()
    }

    /// The `bounded_keys` parameters, when the top level or any alias places keys that way. They are set at the
    /// top level only (the key table is the backend's, shared by its aliases), so every alias that places keys
    /// carries the same ones.
    pub fn bounded_keys(&self) -> Option<&BoundedKeys> {
        self.affinity
            .placement
            .bounded()
            .or_else(|| self.models.iter().find_map(|m| m.affinity.placement.bounded()))
    }

    /// Every session header any alias reads, lower case, each once: the top-level list first, then the aliases'
    /// own, in order. The headers phase captures these before the body names the alias.
    pub fn session_header_names(&self) -> &[String] {
        &self.session_header_names
    }

    /// True when no alias has its own `session_headers`: every request reads the top-level list, so the headers
    /// phase can pick (and refuse) the key before the body.
    pub fn session_headers_shared(&self) -> bool {
        self.session_headers_shared
    }

    /// The alias a client named, if it exists.
    pub fn alias(&self, name: &str) -> Option<&ModelAlias> {
        self.alias_index.get(name).and_then(|&i| self.models.get(i))
    }

    /// Resolves a client's `model`: an alias by exact name, else `<alias>/<rest>` for an alias with
    /// `model_prefix_routing`, in which case `rest` goes upstream unchanged.
    pub fn resolve<'m>(&self, model: &'m str) -> Option<(&ModelAlias, Option<&'m str>)> {
        if let Some(alias) = self.alias(model) {
            return Some((alias, None));
        }
        let (prefix, rest) = model.split_once('/')?;
        let alias = self
            .alias(prefix)
            .filter(|a| a.model_prefix_routing && !rest.is_empty())?;
        Some((alias, Some(rest)))
    }

    pub fn backend(&self, index: usize) -> Option<&Backend> {
        self.backends.get(index)
    }
}

impl TryFrom<RawConfig> for Config {
    type Error = ConfigErrors;

    fn try_from(raw: RawConfig) -> Result<Self, Self::Error> {
        validate::validate(raw)
    }
}

/// The whole `llmroute.yaml`, validated: the filter's [`Config`] and the fields only `llmroute render` reads. What
/// `llmroute validate` checks and `llmroute render` renders from; it reads as its [`Config`] too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    pub config: Config,
    pub render_only: RenderOnly,
}

impl std::ops::Deref for Document {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.config
    }
}

/// Parses and validates the filter's configuration: the document `llmroute render` embeds, which leaves out the
/// fields only the renderer reads. Each of those present is refused, with the reason. JSON is always accepted;
/// YAML when built with the `yaml` feature.
pub fn load(text: &str) -> Result<Config, ConfigErrors> {
    let raw = parse(text)?;
    let refused = render_only::refused(&raw);
    match Config::try_from(raw) {
        Ok(cfg) if refused.is_empty() => Ok(cfg),
        Ok(_) => Err(ConfigErrors(refused)),
        Err(ConfigErrors(errs)) => Err(ConfigErrors(render_only::in_document_order(errs, refused))),
    }
}

/// Parses and validates a whole `llmroute.yaml`, the renderer-only fields included (`llmroute validate`,
/// `llmroute render`). Every problem is reported at once, in document order.
pub fn load_document(text: &str) -> Result<Document, ConfigErrors> {
    let raw = parse(text)?;
    let raw_render: RawRenderOnly = parse_as(text)?;
    let mut diag = Diagnostics::default();
    let render_only = render_only::validate(&raw_render, &raw, &mut diag);
    match (Config::try_from(raw), render_only) {
        (Ok(mut config), Some(render_only)) if diag.errors.is_empty() => {
            config.warnings.append(&mut diag.warnings);
            Ok(Document { config, render_only })
        }
        (Ok(_), _) => Err(ConfigErrors(diag.errors)),
        (Err(ConfigErrors(errs)), _) => Err(ConfigErrors(render_only::in_document_order(errs, diag.errors))),
    }
}

/// Stage one only: the document's shape, with unknown fields rejected and the path of the offending field named.
pub fn parse(text: &str) -> Result<RawConfig, ConfigErrors> {
    parse_as(text)
}

fn parse_as<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ConfigErrors> {
    if text.trim_start().starts_with('{') {
        let mut de = serde_json::Deserializer::from_str(text);
        return serde_path_to_error::deserialize(&mut de).map_err(|e| shape_error(e.path(), e.inner()));
    }
    parse_yaml(text)
}

#[cfg(feature = "yaml")]
fn parse_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ConfigErrors> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| shape_error(e.path(), e.inner()))
}

#[cfg(not(feature = "yaml"))]
fn parse_yaml<T>(_text: &str) -> Result<T, ConfigErrors> {
    Err(ConfigErrors(vec![ConfigError {
        field: "(document)".into(),
        value: String::new(),
        reason: "the filter reads the JSON form of llmroute.yaml; `llmroute render` embeds it".into(),
    }]))
}

/// The longest parser message kept; a non-config file can otherwise be quoted back whole.
const REASON_MAX: usize = 400;

fn shape_error(path: &serde_path_to_error::Path, inner: &dyn fmt::Display) -> ConfigErrors {
    let field = match path.to_string() {
        p if p == "." || p == "?" || p.is_empty() => "(document)".to_string(),
        p => p,
    };
    let message = inner.to_string();
    // The YAML parser prefixes its own copy of the path (or of its parent); keep one.
    let reason = match message.split_once(": ") {
        Some((prefix, rest)) if field.starts_with(prefix) => rest,
        _ => &message,
    };
    let reason = suggest::unknown_field_hint(reason);
    let reason = reason.as_str();
    let cut = crate::text::prefix_on_char_boundary(reason, REASON_MAX);
    let reason = if cut.len() < reason.len() {
        format!("{cut}...")
    } else {
        reason.to_string()
    };
    ConfigErrors(vec![ConfigError {
        field,
        value: String::new(),
        reason,
    }])
}
