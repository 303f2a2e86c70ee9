//! Stage two of the config: values, references and uniqueness.
//!
//! Validation never stops at the first problem: an operator fixing a file wants the whole list. Each error names
//! the field path, the value as written and the reason. Defaults are applied here, so the runtime config has no
//! `Option`s left to interpret.

use crate::key_placement::MAX_SLOTS;
use std::collections::HashMap;

use super::*;
use crate::endpoint::Api;

/// Longest backend (Envoy cluster) name. Envoy sets no limit of its own; Istio's names stay well below this.
const NAME_MAX: usize = 255;
const PATH_MAX: usize = 4096;
const MODEL_NAME_MAX: usize = 256;

struct Errors(Vec<ConfigError>, Vec<ConfigError>);

impl Errors {
    fn push(&mut self, field: impl Into<String>, value: impl ToString, reason: impl Into<String>) {
        self.0.push(ConfigError {
            field: field.into(),
            value: value.to_string(),
            reason: reason.into(),
        });
    }
}

pub(super) fn validate(raw: RawConfig) -> Result<Config, ConfigErrors> {
    let mut errs = Errors(Vec::new(), Vec::new());
    if raw.version != SCHEMA_VERSION {
        errs.push(
            "version",
            raw.version,
            format!("unsupported schema version; this build reads version {SCHEMA_VERSION}"),
        );
    }
    let listen = listen_addr(&mut errs, "listen", raw.listen.as_deref(), "127.0.0.1:10000");
    let admin = listen_addr(&mut errs, "admin", raw.admin.as_deref(), "127.0.0.1:9901");
    if let (Some(l), Some(a)) = (listen, admin) {
        let overlap = l.ip() == a.ip() || l.ip().is_unspecified() || a.ip().is_unspecified();
        if l.port() == a.port() && overlap {
            errs.push("admin", a, "binds the same port as `listen`");
        }
    }

    let backends: Vec<Backend> = raw
        .backends
        .iter()
        .enumerate()
        .filter_map(|(i, b)| backend(&mut errs, i, b))
        .collect();
    if raw.backends.is_empty() {
        errs.push("backends", "[]", "at least one backend is needed");
    }
    check_unique(&mut errs, "backends", raw.backends.iter().map(|b| b.name.as_str()));
    // Indexed over every declared backend, valid or not, so a backend with its own error does not also make
    // its routes look undefined. The indices match `backends` whenever the config as a whole is valid.
    let backend_index: HashMap<&str, usize> = raw
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| (b.name.as_str(), i))
        .collect();

    let models: Vec<ModelAlias> = raw
        .models
        .iter()
        .enumerate()
        .filter_map(|(i, m)| model(&mut errs, i, m, &backend_index))
        .collect();
    if raw.models.is_empty() {
        errs.push("models", "[]", "at least one model alias is needed");
    }
    check_unique(&mut errs, "models", raw.models.iter().map(|m| m.name.as_str()));

    let affinity = affinity(&mut errs, raw.affinity.as_ref());
    placement_warnings(&mut errs, &affinity, &backends);
    let limits = limits(&mut errs, raw.limits.as_ref());
    let listen_tls = resilience::listen_tls(raw.listen_tls.as_ref(), &mut errs.0);
    let retries = resilience::retries(raw.retries.as_ref(), &mut errs.0, &mut errs.1);
    if retries.per_try_timeout_ms > limits.request_timeout_ms {
        errs.push(
            "retries.per_try_timeout_ms",
            retries.per_try_timeout_ms,
            format!(
                "must be at most limits.request_timeout_ms ({}): a try cannot outlast the whole request",
                limits.request_timeout_ms
            ),
        );
    }
    let image_tokens = raw
        .tokens
        .as_ref()
        .and_then(|t| t.image_tokens)
        .unwrap_or(DEFAULT_IMAGE_TOKENS);
    if image_tokens > 100_000 {
        errs.push("tokens.image_tokens", image_tokens, "must be at most 100000");
    }

    let auth = raw.auth.as_ref().map(|a| auth(&mut errs, a));
    let access_log_path = raw.access_log.as_ref().and_then(|a| a.path.clone());
    if let Some(path) = &access_log_path {
        check_abs_path(&mut errs, "access_log.path", path);
    }

    match (errs.0.is_empty(), listen, admin) {
        (true, Some(listen), Some(admin)) => {
            let alias_index = models.iter().enumerate().map(|(i, m)| (m.name.clone(), i)).collect();
            Ok(Config {
                listen,
                admin,
                backends,
                models,
                affinity,
                limits,
                debug_headers: raw.debug_headers.unwrap_or(false),
                compress_responses: raw.compress_responses.unwrap_or(false),
                image_tokens,
                listen_tls,
                retries,
                stream_include_usage: raw.usage.as_ref().and_then(|u| u.stream_include_usage).unwrap_or(false),
                auth,
                access_log_path,
                warnings: errs.1,
                alias_index,
            })
        }
        _ => Err(ConfigErrors(errs.0)),
    }
}

fn listen_addr(errs: &mut Errors, field: &str, value: Option<&str>, default: &str) -> Option<SocketAddr> {
    let text = value.unwrap_or(default);
    parse_listen(text).map_err(|reason| errs.push(field, text, reason)).ok()
}

fn backend(errs: &mut Errors, i: usize, b: &RawBackend) -> Option<Backend> {
    let at = |f: &str| format!("backends[{i}].{f}");
    let before = errs.0.len();
    check_cluster_name(errs, &at("name"), &b.name);
    let kind = EngineKind::parse(&b.kind);
    if kind.is_none() {
        errs.push(
            at("kind"),
            &b.kind,
            format!("unknown engine kind; expected one of {}", EngineKind::NAMES),
        );
    }
    let lb_text = b.lb.as_deref().unwrap_or("chwbl");
    let lb = LbPolicy::parse(lb_text);
    if lb.is_none() {
        errs.push(
            at("lb"),
            lb_text,
            format!("unknown load-balancing policy; expected one of {}", LbPolicy::NAMES),
        );
    }
    let balance_factor = b.balance_factor.unwrap_or(DEFAULT_BALANCE_FACTOR);
    if balance_factor < 100 {
        errs.push(
            at("balance_factor"),
            balance_factor,
            "must be >= 100 (percent of the mean load a host may take)",
        );
    }
    if b.balance_factor.is_some() && lb.is_some_and(|l| l != LbPolicy::Chwbl) {
        errs.push(
            at("balance_factor"),
            balance_factor,
            format!("only applies to lb: chwbl, not {lb_text}"),
        );
    }
    let connect_timeout_ms = b.connect_timeout_ms.unwrap_or(2000);
    if !(1..=600_000).contains(&connect_timeout_ms) {
        errs.push(
            at("connect_timeout_ms"),
            connect_timeout_ms,
            "must be between 1 and 600000",
        );
    }
    let (endpoints, discovery) = hosts(errs, i, b);
    let listed = b.endpoints.as_ref().map_or(0, Vec::len);
    let max_inflight = b.max_inflight.unwrap_or(DEFAULT_MAX_INFLIGHT);
    if max_inflight == 0 {
        errs.push(at("max_inflight"), 0, "must be at least 1");
    }
    if b.max_context == Some(0) {
        errs.push(at("max_context"), 0, "must be at least 1 token");
    }
    let slots = b.slots.clone();
    if let (Some(list), true) = (&slots, discovery.is_some()) {
        errs.push(
            at("slots"),
            format!("{list:?}"),
            "needs listed endpoints; a discovered backend's hosts change at run time, so weigh them by the \
             `total_slots` llama.cpp reports, or remove `slots`",
        );
    } else if let Some(list) = &slots {
        if list.len() != listed {
            errs.push(
                at("slots"),
                format!("{list:?}"),
                format!("needs one entry per endpoint ({listed} endpoints)"),
            );
        }
        for (j, n) in list.iter().enumerate() {
            if !(1..=MAX_SLOTS).contains(n) {
                errs.push(
                    at(&format!("slots[{j}]")),
                    n,
                    format!("must be between 1 and {MAX_SLOTS} (the most slots one host can weigh)"),
                );
            }
        }
    }
    let kind_or_default = kind.unwrap_or(EngineKind::OpenAi);
    let Errors(errors, warnings) = &mut *errs;
    let mut check = resilience::Checker {
        errors,
        warnings,
        at: format!("backends[{i}]"),
    };
    let health = check.health(b.health.as_ref(), kind_or_default);
    // A discovered backend's size is unknown; do not warn about ejection limits for a size that may not hold.
    let outlier = check.outlier(b.outlier.as_ref(), if discovery.is_some() { 100 } else { listed });
    let tls = check.tls(b.tls.as_ref());
    let credential_env = check.credential_env(b.credential_env.as_deref());
    check.credential_needs_tls(credential_env.as_deref(), tls.is_some(), &endpoints);
    check.reserved(kind_or_default, b.kv_events, b.disaggregation.as_deref());
    match (kind, lb, errs.0.len() == before) {
        (Some(kind), Some(lb), true) => Some(Backend {
            name: b.name.clone(),
            kind,
            endpoints,
            discovery,
            lb,
            balance_factor,
            connect_timeout_ms,
            max_inflight,
            max_context: b.max_context,
            health,
            outlier,
            tls,
            credential_env,
            slots,
        }),
        _ => None,
    }
}

/// The backend's listed endpoints, or its discovery settings: exactly one of the two.
fn hosts(errs: &mut Errors, i: usize, b: &RawBackend) -> (Vec<Endpoint>, Option<Discovery>) {
    let at = |f: &str| format!("backends[{i}].{f}");
    match (&b.endpoints, &b.discovery) {
        (Some(list), None) => (endpoints(errs, i, list), None),
        (None, Some(d)) => (Vec::new(), Some(discovery(errs, &at("discovery"), d))),
        (Some(list), Some(_)) => {
            errs.push(
                at("endpoints"),
                format!("{list:?}"),
                "set either `endpoints` (a fixed list) or `discovery` (hosts learned from Envoy), not both",
            );
            (Vec::new(), None)
        }
        (None, None) => {
            errs.push(
                at("endpoints"),
                "",
                "missing: list the engines' `HOST:PORT` addresses, or set `discovery: {}` when Envoy discovers \
                 the hosts (EDS, Istio)",
            );
            (Vec::new(), None)
        }
    }
}

/// An absolute file path: not a directory, bounded, without control characters.
fn check_abs_path(errs: &mut Errors, field: &str, path: &str) {
    let ok = (2..=PATH_MAX).contains(&path.len())
        && path.starts_with('/')
        && !path.ends_with('/')
        && !path.chars().any(char::is_control);
    if !ok {
        errs.push(
            field,
            format!("{path:?}"),
            format!("must be an absolute file path of at most {PATH_MAX} bytes, without control characters"),
        );
    }
}

fn discovery(errs: &mut Errors, at: &str, d: &RawDiscovery) -> Discovery {
    let field = format!("{at}.eds_path");
    if let Some(path) = &d.eds_path {
        check_abs_path(errs, &field, path);
    }
    let etcd = d.etcd.as_ref().map(|e| etcd(errs, &format!("{at}.etcd"), e));
    if etcd.is_some() && d.eds_path.is_none() {
        errs.push(
            field,
            "",
            "missing: `llmroute discover` writes the hosts it finds in etcd to this file and the rendered cluster \
             reads it; set an absolute path such as /var/lib/llmroute/<backend>.eds.json",
        );
    }
    Discovery {
        eds_path: d.eds_path.clone(),
        etcd,
    }
}

/// The etcd source of a discovered backend: client addresses normalised to `http://HOST:PORT`, and a prefix
/// that makes `<prefix>/<IP:PORT>` keys.
fn etcd(errs: &mut Errors, at: &str, e: &RawEtcd) -> EtcdSource {
    let list = e.endpoints.clone().unwrap_or_default();
    if list.is_empty() || list.len() > EtcdSource::MAX_ENDPOINTS {
        errs.push(
            format!("{at}.endpoints"),
            format!("{list:?}"),
            format!(
                "needs 1 to {} etcd client addresses, such as [\"127.0.0.1:2379\"]",
                EtcdSource::MAX_ENDPOINTS
            ),
        );
    }
    let mut endpoints = Vec::new();
    for (j, text) in list.iter().enumerate() {
        let bare = text.strip_prefix("http://").unwrap_or(text);
        match parse_endpoint(bare) {
            Ok(ep) => endpoints.push(format!("http://{ep}")),
            Err(_) if text.starts_with("https://") => errs.push(
                format!("{at}.endpoints[{j}]"),
                text,
                "TLS to etcd is not supported; reach etcd over http:// (or HOST:PORT) on a trusted network",
            ),
            Err(why) => errs.push(
                format!("{at}.endpoints[{j}]"),
                text,
                format!("{why}; write HOST:PORT or http://HOST:PORT"),
            ),
        }
    }
    let prefix = e.prefix.clone().unwrap_or_default();
    let ok = (2..=EtcdSource::MAX_PREFIX).contains(&prefix.len())
        && prefix.starts_with('/')
        && !prefix.ends_with('/')
        && !prefix.chars().any(|c| c.is_control() || c.is_whitespace());
    if !ok {
        errs.push(
            format!("{at}.prefix"),
            format!("{prefix:?}"),
            format!(
                "must start with `/`, not end with `/`, be at most {} bytes and hold no spaces or control \
                 characters, such as /llmroute/backends/llama-a (instances register as <prefix>/<IP:PORT>)",
                EtcdSource::MAX_PREFIX
            ),
        );
    }
    EtcdSource { endpoints, prefix }
}

fn endpoints(errs: &mut Errors, i: usize, list: &[String]) -> Vec<Endpoint> {
    if list.is_empty() {
        errs.push(
            format!("backends[{i}].endpoints"),
            "[]",
            "a backend needs at least one endpoint",
        );
    }
    let mut seen = Vec::new();
    for (j, text) in list.iter().enumerate() {
        let field = format!("backends[{i}].endpoints[{j}]");
        match parse_endpoint(text) {
            Ok(ep) if seen.contains(&ep) => errs.push(field, text, "duplicate endpoint in this backend"),
            Ok(ep) => seen.push(ep),
            Err(reason) => errs.push(field, text, format!("malformed address: {reason}")),
        }
    }
    seen
}

fn model(errs: &mut Errors, i: usize, m: &RawModel, backends: &HashMap<&str, usize>) -> Option<ModelAlias> {
    let before = errs.0.len();
    check_model_name(errs, &format!("models[{i}].name"), &m.name);
    if m.routes.is_empty() {
        errs.push(format!("models[{i}].routes"), "[]", "an alias needs at least one route");
    }
    let mut routes = Vec::new();
    for (j, r) in m.routes.iter().enumerate() {
        let at = |f: &str| format!("models[{i}].routes[{j}].{f}");
        let upstream_model = r.upstream_model.clone().unwrap_or_else(|| m.name.clone());
        if r.upstream_model.is_some() {
            check_model_name(errs, &at("upstream_model"), &upstream_model);
        }
        match backends.get(r.backend.as_str()) {
            Some(&backend) if routes.iter().any(|x: &Route| x.backend == backend) => errs.push(
                at("backend"),
                &r.backend,
                "duplicate route to the same backend in this alias",
            ),
            Some(&backend) => routes.push(Route {
                backend,
                upstream_model,
                priority: r.priority.unwrap_or(0),
            }),
            None => errs.push(at("backend"), &r.backend, "no backend with this name is defined"),
        }
    }
    routes.sort_by_key(|r| r.priority);
    let endpoints = endpoint_set(errs, i, m.endpoints.as_deref());
    let limits = rate_limits(errs, &format!("models[{i}].limits"), m.limits.as_ref());
    let stream_upstream = match m.stream_upstream.as_deref() {
        None => StreamUpstream::AsSent,
        Some(s) => StreamUpstream::parse(s).unwrap_or_else(|| {
            errs.push(
                format!("models[{i}].stream_upstream"),
                s,
                format!("unknown value; use one of: {}", StreamUpstream::NAMES),
            );
            StreamUpstream::AsSent
        }),
    };
    (errs.0.len() == before).then(|| ModelAlias {
        name: m.name.clone(),
        routes,
        endpoints,
        model_prefix_routing: m.model_prefix_routing.unwrap_or(false),
        limits,
        stream_upstream,
    })
}

fn auth(errs: &mut Errors, a: &RawAuth) -> Auth {
    let name = &a.keys_env;
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if !ok {
        errs.push(
            "auth.keys_env",
            name,
            "must be an environment variable name: A-Z a-z 0-9 _, not starting with a digit, at most 128 bytes; \
             the variable holds `name:token` pairs separated by commas",
        );
    }
    Auth {
        keys_env: name.clone(),
        limits: rate_limits(errs, "auth.limits", a.limits.as_ref()),
    }
}

/// A limits block: at least one of `requests` and `tokens`, each in the `AMOUNT-UNIT,...` syntax.
fn rate_limits(errs: &mut Errors, field: &str, raw: Option<&RawRateLimits>) -> Option<RateLimits> {
    let raw = raw?;
    let mut parse = |f: &str, text: Option<&String>| match text {
        None => Vec::new(),
        Some(t) => crate::limits::parse_rates(t).unwrap_or_else(|reason| {
            errs.push(
                format!("{field}.{f}"),
                t,
                format!("{reason}; write rates such as \"10-S,600-M\" (units S, M, H, D, each once)"),
            );
            Vec::new()
        }),
    };
    let requests = parse("requests", raw.requests.as_ref());
    let tokens = parse("tokens", raw.tokens.as_ref());
    if raw.requests.is_none() && raw.tokens.is_none() {
        errs.push(
            field,
            "{}",
            "set `requests`, `tokens` or both, such as requests: \"10-S,600-M\"",
        );
    }
    let default_max_tokens = raw.default_max_tokens.unwrap_or(crate::limits::DEFAULT_MAX_TOKENS);
    if !(1..=10_000_000).contains(&default_max_tokens) {
        errs.push(
            format!("{field}.default_max_tokens"),
            default_max_tokens,
            "must be between 1 and 10000000 (output tokens reserved when a request names no max_tokens)",
        );
    }
    Some(RateLimits {
        requests,
        tokens,
        default_max_tokens,
    })
}

fn endpoint_set(errs: &mut Errors, i: usize, names: Option<&[String]>) -> ApiSet {
    let Some(names) = names else { return ApiSet::DEFAULT };
    if names.is_empty() {
        errs.push(
            format!("models[{i}].endpoints"),
            "[]",
            "an alias must serve at least one endpoint",
        );
    }
    let mut set = ApiSet::EMPTY;
    for (j, name) in names.iter().enumerate() {
        match Api::parse(name) {
            Some(api) => set = set.with(api),
            None => errs.push(
                format!("models[{i}].endpoints[{j}]"),
                name,
                format!("unknown endpoint; expected one of {}", Api::NAMES),
            ),
        }
    }
    set
}

fn affinity(errs: &mut Errors, raw: Option<&RawAffinity>) -> AffinityConfig {
    let headers = raw
        .and_then(|a| a.session_headers.clone())
        .unwrap_or_else(|| DEFAULT_SESSION_HEADERS.iter().map(|h| h.to_string()).collect());
    for (i, h) in headers.iter().enumerate() {
        let field = format!("affinity.session_headers[{i}]");
        if h.is_empty() || h.len() > 128 || !h.bytes().all(is_token_byte) {
            errs.push(field, h, "not a valid HTTP header name");
        } else if h.to_ascii_lowercase().starts_with("x-llmroute-") {
            errs.push(
                field,
                h,
                "x-llmroute-* headers are the gateway's own and are stripped from clients",
            );
        } else if h.starts_with(':') {
            errs.push(field, h, "pseudo-headers cannot carry a session id");
        } else if crate::headers::CREDENTIALS.contains(&h.to_ascii_lowercase().as_str()) {
            errs.push(
                field,
                h,
                "this header carries a credential, and the session id is echoed back in x-multi-turn-session-id; \
                 name a header such as x-session-id instead",
            );
        }
    }
    check_unique(errs, "affinity.session_headers", headers.iter().map(String::as_str));
    let user_prefix_bytes = raw
        .and_then(|a| a.user_prefix_bytes)
        .unwrap_or(DEFAULT_USER_PREFIX_BYTES);
    if user_prefix_bytes > MAX_USER_PREFIX_BYTES {
        errs.push(
            "affinity.user_prefix_bytes",
            user_prefix_bytes,
            format!("must be at most {MAX_USER_PREFIX_BYTES}"),
        );
    }
    AffinityConfig {
        session_headers: headers.iter().map(|h| h.to_ascii_lowercase()).collect(),
        user_prefix_bytes,
        conversation_id: raw.and_then(|a| a.conversation_id).unwrap_or(false),
        anthropic_user_id: raw.and_then(|a| a.anthropic_user_id).unwrap_or(false),
        placement: placement(errs, raw),
    }
}

/// Settings that load but would do nothing: `slots` without bounded-keys placement, and bounded-keys placement
/// on a backend it cannot pin (not `chwbl`, or endpoints named by DNS, whose Envoy hosts carry resolved
/// addresses).
fn placement_warnings(errs: &mut Errors, affinity: &AffinityConfig, backends: &[Backend]) {
    let bounded = affinity.placement.bounded().is_some();
    for (i, b) in backends.iter().enumerate() {
        let warn = |field: String, value: String, reason: &str| ConfigError {
            field,
            value,
            reason: reason.to_string(),
        };
        if let (Some(slots), false) = (&b.slots, bounded) {
            let reason = "only used by affinity.placement: bounded_keys; ignored";
            errs.1
                .push(warn(format!("backends[{i}].slots"), format!("{slots:?}"), reason));
        }
        if bounded && b.lb != LbPolicy::Chwbl {
            let reason = "affinity.placement: bounded_keys applies only to lb: chwbl; this backend is not pinned";
            errs.1
                .push(warn(format!("backends[{i}].lb"), b.lb.as_str().to_string(), reason));
        } else if bounded && !b.discovered() && b.endpoints.iter().any(|e| !e.is_ip) {
            let reason = "affinity.placement: bounded_keys needs IP endpoints; this backend keeps Envoy's ring hash";
            let names: Vec<String> = b.endpoints.iter().map(|e| e.to_string()).collect();
            errs.1
                .push(warn(format!("backends[{i}].endpoints"), names.join(", "), reason));
        }
    }
}

fn placement(errs: &mut Errors, raw: Option<&RawAffinity>) -> KeyPlacement {
    let name = raw.and_then(|a| a.placement.as_deref()).unwrap_or("hash");
    let bounded = name == "bounded_keys";
    if !bounded && name != "hash" {
        errs.push(
            "affinity.placement",
            name,
            format!("unknown placement; expected one of {}", KeyPlacement::NAMES),
        );
    }
    let d = BoundedKeys::default();
    let factor = raw.and_then(|a| a.key_balance_factor);
    let ttl_s = raw.and_then(|a| a.key_idle_ttl_s);
    let max_keys = raw.and_then(|a| a.max_keys);
    let checks: [(&str, Option<u64>, u64, u64, &str); 3] = [
        (
            "key_balance_factor",
            factor.map(u64::from),
            100,
            1000,
            "percent of a host's share of live keys",
        ),
        ("key_idle_ttl_s", ttl_s, 1, 86_400, "seconds"),
        ("max_keys", max_keys.map(|n| n as u64), 16, 65_536, "keys per backend"),
    ];
    for (field, value, lo, hi, unit) in checks {
        let Some(v) = value else { continue };
        let field = format!("affinity.{field}");
        if !bounded {
            errs.push(field, v, format!("only applies to placement: bounded_keys, not {name}"));
        } else if !(lo..=hi).contains(&v) {
            errs.push(field, v, format!("must be between {lo} and {hi} ({unit})"));
        }
    }
    if !bounded {
        return KeyPlacement::Hash;
    }
    KeyPlacement::BoundedKeys(BoundedKeys {
        key_balance_factor: factor.unwrap_or(d.key_balance_factor),
        idle_ttl_ms: ttl_s.map_or(d.idle_ttl_ms, |s| s.saturating_mul(1000)),
        max_keys: max_keys.unwrap_or(d.max_keys),
    })
}

fn limits(errs: &mut Errors, raw: Option<&RawLimits>) -> Limits {
    let max_body_bytes = raw.and_then(|l| l.max_body_bytes).unwrap_or(DEFAULT_MAX_BODY_BYTES);
    if !(1024..=MAX_MAX_BODY_BYTES).contains(&max_body_bytes) {
        errs.push(
            "limits.max_body_bytes",
            max_body_bytes,
            format!("must be between 1024 and {MAX_MAX_BODY_BYTES}"),
        );
    }
    let max_assembled_bytes = raw
        .and_then(|l| l.max_assembled_bytes)
        .unwrap_or(DEFAULT_MAX_ASSEMBLED_BYTES);
    if !(4096..=MAX_MAX_BODY_BYTES).contains(&max_assembled_bytes) {
        errs.push(
            "limits.max_assembled_bytes",
            max_assembled_bytes,
            format!("must be between 4096 and {MAX_MAX_BODY_BYTES}"),
        );
    }
    let request_timeout_ms = raw.and_then(|l| l.request_timeout_ms).unwrap_or(600_000);
    if request_timeout_ms == 0 || request_timeout_ms > 86_400_000 {
        errs.push(
            "limits.request_timeout_ms",
            request_timeout_ms,
            "must be between 1 and 86400000 (one day); 0 would time every request out at once",
        );
    }
    let ranged = |errs: &mut Errors, field: &str, value: Option<u64>, default: u64, (lo, hi): (u64, u64)| {
        let v = value.unwrap_or(default);
        if !(lo..=hi).contains(&v) {
            errs.push(format!("limits.{field}"), v, format!("must be between {lo} and {hi}"));
        }
        v
    };
    let headers_timeout_ms = ranged(
        errs,
        "headers_timeout_ms",
        raw.and_then(|l| l.headers_timeout_ms),
        60_000,
        (1_000, 600_000),
    );
    let body_timeout_ms = ranged(
        errs,
        "body_timeout_ms",
        raw.and_then(|l| l.body_timeout_ms),
        120_000,
        (1_000, 3_600_000),
    );
    if body_timeout_ms < headers_timeout_ms {
        errs.push(
            "limits.body_timeout_ms",
            body_timeout_ms,
            format!("must be at least limits.headers_timeout_ms ({headers_timeout_ms}): it counts from the first header byte"),
        );
    }
    let stream_idle_timeout_ms = ranged(
        errs,
        "stream_idle_timeout_ms",
        raw.and_then(|l| l.stream_idle_timeout_ms),
        300_000,
        (1_000, 3_600_000),
    );
    let max_concurrent_streams = ranged(
        errs,
        "max_concurrent_streams",
        raw.and_then(|l| l.max_concurrent_streams).map(u64::from),
        100,
        (1, 10_000),
    );
    let max_heap_bytes = ranged(
        errs,
        "max_heap_bytes",
        raw.and_then(|l| l.max_heap_bytes),
        2 << 30,
        (64 << 20, 1 << 40),
    );
    Limits {
        max_body_bytes,
        max_assembled_bytes,
        request_timeout_ms,
        headers_timeout_ms,
        body_timeout_ms,
        stream_idle_timeout_ms,
        max_concurrent_streams: u32::try_from(max_concurrent_streams).unwrap_or(100),
        max_heap_bytes,
    }
}

/// Any name Envoy accepts as a cluster name and the filter can carry in its `x-llmroute-cluster` header:
/// printable ASCII without spaces (Istio's `outbound|8000||llama.ns.svc.cluster.local` included).
fn check_cluster_name(errs: &mut Errors, field: &str, name: &str) {
    let ok = (1..=NAME_MAX).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_graphic());
    if !ok {
        errs.push(
            field,
            format!("{name:?}"),
            format!("must be 1 to {NAME_MAX} printable ASCII characters without spaces (an Envoy cluster name)"),
        );
    } else if name
        .to_ascii_lowercase()
        .starts_with(crate::envoy_contract::RESERVED_CLUSTER_PREFIX)
    {
        // The gateway's own clusters: `llmroute_admin` (status polling), `llmroute-probe-*` (`/props` checks),
        // `llmroute-failover-*` (priority failover).
        errs.push(
            field,
            name,
            "reserved: names starting with `llmroute` are the gateway's own clusters (admin polling, probes, failover)",
        );
    }
}

fn check_model_name(errs: &mut Errors, field: &str, name: &str) {
    let ok = (1..=MODEL_NAME_MAX).contains(&name.len()) && !name.chars().any(|c| c.is_control() || c.is_whitespace());
    if !ok {
        errs.push(
            field,
            format!("{name:?}"),
            format!("must be 1 to {MODEL_NAME_MAX} bytes without spaces or control characters"),
        );
    }
}

fn check_unique<'a>(errs: &mut Errors, list: &str, names: impl Iterator<Item = &'a str>) {
    let mut first: HashMap<String, usize> = HashMap::new();
    for (i, name) in names.enumerate() {
        let key = name.to_ascii_lowercase();
        match first.get(&key) {
            Some(j) => errs.push(
                format!("{list}[{i}]"),
                name,
                format!("duplicate name; {list}[{j}] already uses it"),
            ),
            None => {
                first.insert(key, i);
            }
        }
    }
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
