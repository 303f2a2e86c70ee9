//! Stage two of the config: values, references and uniqueness.
//!
//! Validation never stops at the first problem: an operator fixing a file wants the whole list. Each error names
//! the field path, the value as written and the reason. Defaults are applied here, so the runtime config has no
//! `Option`s left to interpret.

use super::MAX_SLOTS;
use std::collections::HashMap;

use super::*;
use crate::api_kind::Api;

/// Longest backend (Envoy cluster) name. Envoy sets no limit of its own; Istio's names stay well below this.
const NAME_MAX: usize = 255;
const PATH_MAX: usize = 4096;
const MODEL_NAME_MAX: usize = 256;
/// Most session headers one list may name: each is looked up per request.
const MAX_SESSION_HEADERS: usize = 16;

/// The filter's document, checked whole: every problem, in document order, or the config with its defaults.
pub(super) fn validate(raw: RawConfig) -> Result<Config, ConfigErrors> {
    let mut errs = Diagnostics::default();
    if raw.version != SCHEMA_VERSION {
        errs.push(
            "version",
            raw.version,
            format!("unsupported schema version; this build reads version {SCHEMA_VERSION}"),
        );
    }
    let admin = listen_addr(&mut errs, "admin", raw.admin.as_deref(), DEFAULT_ADMIN);

    let (backends, backend_index) = backends(&mut errs, &raw);
    let (affinity, models) = aliases(&mut errs, &raw, &backend_index);
    placement_warnings(&mut errs, &affinity, &models, &backends);
    let (session_headers_shared, session_header_names) = session_header_names(&affinity, &models);
    let limits = limits(&mut errs, raw.limits.as_ref());
    let image_tokens = image_tokens(&mut errs, &raw);

    let auth = raw.auth.as_ref().map(|a| auth(&mut errs, a));
    let global_limits = raw.global_limits.as_ref().and_then(|g| global_limits(&mut errs, g));
    let fairness = raw
        .fairness
        .as_ref()
        .and_then(|f| super::fairness::fairness(&mut errs, f, auth.is_some(), &limits));

    match (errs.errors.is_empty(), admin) {
        (true, Some(admin)) => {
            let alias_index = models.iter().enumerate().map(|(i, m)| (m.name.clone(), i)).collect();
            Ok(Config {
                admin,
                backends,
                models,
                affinity,
                limits,
                debug_headers: raw.debug_headers.unwrap_or(false),
                image_tokens,
                stream_include_usage: raw.usage.as_ref().and_then(|u| u.stream_include_usage).unwrap_or(false),
                auth,
                global_limits,
                fairness,
                warnings: errs.warnings,
                alias_index,
                session_headers_shared,
                session_header_names,
            })
        }
        _ => Err(ConfigErrors(errs.errors)),
    }
}

/// `backends`, each one valid and named once; and every declared backend's index by name, valid or not, so that a
/// backend with its own error does not also make its routes look undefined (the indices match the list whenever
/// the config as a whole is valid).
fn backends<'r>(errs: &mut Diagnostics, raw: &'r RawConfig) -> (Vec<Backend>, HashMap<&'r str, usize>) {
    let backends: Vec<Backend> = raw
        .backends
        .iter()
        .enumerate()
        .filter_map(|(i, b)| backend(errs, i, b))
        .collect();
    if raw.backends.is_empty() {
        errs.push("backends", "[]", "at least one backend is needed");
    }
    check_unique(errs, "backends", raw.backends.iter().map(|b| b.name.as_str()));
    let index = raw
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| (b.name.as_str(), i))
        .collect();
    (backends, index)
}

/// The top-level `affinity` and `models`, each alias named once, its routes on declared backends, and its own
/// affinity over the top-level one.
fn aliases(
    errs: &mut Diagnostics,
    raw: &RawConfig,
    backend_index: &HashMap<&str, usize>,
) -> (AffinityConfig, Vec<ModelAlias>) {
    let alias_bounded = raw
        .models
        .iter()
        .any(|m| m.affinity.as_ref().and_then(|a| a.placement.as_deref()) == Some("bounded_keys"));
    // Checked ahead of the aliases, which inherit it, but reported after them, in document order.
    let mut affinity_errs = Diagnostics::default();
    let (affinity, bounded_keys) = affinity(&mut affinity_errs, raw.affinity.as_ref(), alias_bounded);
    let models: Vec<ModelAlias> = raw
        .models
        .iter()
        .enumerate()
        .filter_map(|(i, m)| model(errs, i, m, backend_index, (&affinity, bounded_keys)))
        .collect();
    if raw.models.is_empty() {
        errs.push("models", "[]", "at least one model alias is needed");
    }
    check_unique(errs, "models", raw.models.iter().map(|m| m.name.as_str()));
    errs.errors.append(&mut affinity_errs.errors);
    errs.warnings.append(&mut affinity_errs.warnings);
    (affinity, models)
}

/// Whether every alias reads the top-level session headers, and every session header name any of them reads, once
/// each, in document order.
fn session_header_names(affinity: &AffinityConfig, models: &[ModelAlias]) -> (bool, Vec<String>) {
    let shared = models
        .iter()
        .all(|m| m.affinity.session_headers == affinity.session_headers);
    let mut names: Vec<String> = Vec::new();
    for name in std::iter::once(affinity)
        .chain(models.iter().map(|m| &m.affinity))
        .flat_map(|a| &a.session_headers)
    {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    (shared, names)
}

/// `tokens.image_tokens`: the tokens one image counts for, at most 100000.
fn image_tokens(errs: &mut Diagnostics, raw: &RawConfig) -> u32 {
    let image_tokens = raw
        .tokens
        .as_ref()
        .and_then(|t| t.image_tokens)
        .unwrap_or(DEFAULT_IMAGE_TOKENS);
    if image_tokens > 100_000 {
        errs.push("tokens.image_tokens", image_tokens, "must be at most 100000");
    }
    image_tokens
}

pub(super) fn listen_addr(
    errs: &mut Diagnostics,
    field: &str,
    value: Option<&str>,
    default: &str,
) -> Option<SocketAddr> {
    let text = value.unwrap_or(default);
    parse_listen(text).map_err(|reason| errs.push(field, text, reason)).ok()
}

fn backend(errs: &mut Diagnostics, i: usize, b: &RawBackend) -> Option<Backend> {
    let at = |f: &str| format!("backends[{i}].{f}");
    let before = errs.errors.len();
    check_cluster_name(errs, &at("name"), &b.name);
    let kind = EngineKind::parse(&b.kind);
    if kind.is_none() {
        errs.push(
            at("kind"),
            &b.kind,
            format!("unknown engine kind; expected one of {}", EngineKind::NAMES),
        );
    }
    let (lb, balance_factor) = lb_policy(errs, i, b);
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
    let slots = slots(errs, i, b, listed, discovery.is_some());
    let kind_or_default = kind.unwrap_or(EngineKind::OpenAi);
    let load = b.load.as_ref().map(|l| load(errs, i, kind, l));
    let mut check = resilience::Checker {
        diag: &mut *errs,
        at: format!("backends[{i}]"),
    };
    let health = check.health(b.health.as_ref(), kind_or_default);
    // A discovered backend's size is unknown; do not warn about ejection limits for a size that may not hold.
    let outlier = check.outlier(b.outlier.as_ref(), if discovery.is_some() { 100 } else { listed });
    let tls = check.tls(b.tls.as_ref());
    let credential_env = check.credential_env(b.credential_env.as_deref());
    match &discovery {
        None => check.credential_needs_tls(credential_env.as_deref(), tls.is_some(), &endpoints),
        Some(d) => check.discovered_tls(credential_env.as_deref(), tls.as_ref(), d),
    }
    check.reserved(kind_or_default, b.kv_events, b.disaggregation.as_deref());
    match (kind, lb, errs.errors.len() == before) {
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
            load,
        }),
        _ => None,
    }
}

/// `backends[i].lb` and `balance_factor`: a known policy, and a factor of at least 100 only where it applies.
fn lb_policy(errs: &mut Diagnostics, i: usize, b: &RawBackend) -> (Option<LbPolicy>, u32) {
    let at = |f: &str| format!("backends[{i}].{f}");
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
    (lb, balance_factor)
}

/// `backends[i].slots`: one weight per listed endpoint, each within [`MAX_SLOTS`]; refused on a discovered backend.
fn slots(errs: &mut Diagnostics, i: usize, b: &RawBackend, listed: usize, discovered: bool) -> Option<Vec<u32>> {
    let at = |f: &str| format!("backends[{i}].{f}");
    let slots = b.slots.clone();
    if let (Some(list), true) = (&slots, discovered) {
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
    slots
}

/// `backends[i].load`: the poll interval and the queue bound in range, on an engine kind that reports its load.
fn load(errs: &mut Diagnostics, i: usize, kind: Option<EngineKind>, raw: &RawLoad) -> Load {
    let at = |f: &str| format!("backends[{i}].load{f}");
    if let Some(k) = kind.filter(|k| !k.reports_load()) {
        errs.push(
            at(""),
            k.as_str(),
            "this engine kind reports no load (only llamacpp, vllm and sglang do); remove `load`",
        );
    }
    let poll_ms = raw.poll_ms.unwrap_or(Load::DEFAULT_POLL_MS);
    if !Load::POLL_MS.contains(&poll_ms) {
        errs.push(
            at(".poll_ms"),
            poll_ms,
            format!(
                "must be between {} and {} milliseconds",
                Load::POLL_MS.start(),
                Load::POLL_MS.end()
            ),
        );
    }
    if let Some(q) = raw.spill_queue.filter(|q| *q > Load::MAX_SPILL_QUEUE) {
        errs.push(
            at(".spill_queue"),
            q,
            format!("must be between 0 and {} queued requests", Load::MAX_SPILL_QUEUE),
        );
    }
    Load {
        poll_ms,
        spill_queue: raw.spill_queue,
    }
}

/// The backend's listed endpoints, or its discovery settings: exactly one of the two.
fn hosts(errs: &mut Diagnostics, i: usize, b: &RawBackend) -> (Vec<Endpoint>, Option<Discovery>) {
    let at = |f: &str| format!("backends[{i}].{f}");
    match (&b.endpoints, &b.discovery) {
        (Some(list), None) => (endpoints(errs, i, list, EngineKind::parse(&b.kind)), None),
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
pub(super) fn check_abs_path(errs: &mut Diagnostics, field: &str, path: &str) {
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

fn discovery(errs: &mut Diagnostics, at: &str, d: &RawDiscovery) -> Discovery {
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
        mesh_tls: d.mesh_tls.unwrap_or(false),
    }
}

/// The etcd source of a discovered backend: client addresses normalised to `http://HOST:PORT` (`https://` with
/// `tls`), and a prefix that makes `<prefix>/<IP:PORT>` keys.
fn etcd(errs: &mut Diagnostics, at: &str, e: &RawEtcd) -> EtcdSource {
    let list = e.endpoints.clone().unwrap_or_default();
    let tls = resilience::Checker {
        diag: &mut *errs,
        at: at.to_string(),
    }
    .tls(e.tls.as_ref());
    let (scheme, url) = match tls {
        Some(_) => (EtcdScheme::Tls, "https"),
        None => (EtcdScheme::Plain, "http"),
    };
    let members = etcd_endpoints(errs, at, &list, scheme);
    let auth = etcd_trust::etcd_auth(errs, at, e.auth.as_ref(), tls.is_some(), &members);
    let endpoints = members.iter().map(|ep| format!("{url}://{ep}")).collect();
    let prefix = e.prefix.clone().unwrap_or_default();
    etcd_prefix(
        errs,
        &format!("{at}.prefix"),
        &prefix,
        "such as /llmroute/backends/llama-a (instances register as <prefix>/<IP:PORT>)",
    );
    EtcdSource {
        endpoints,
        prefix,
        tls,
        auth,
        allow_loopback: e.allow_loopback.unwrap_or(false),
        max_weight: etcd_trust::max_weight(errs, at, e.max_weight),
    }
}

/// Which schemes a list of etcd client addresses may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EtcdScheme {
    /// Without `tls`: `http://` or bare; `https://` asks for the `tls` block.
    Plain,
    /// With `tls`: `https://` or bare; `http://` contradicts it.
    Tls,
}

/// `AT.endpoints`, etcd client addresses of the block at `at`: `HOST:PORT` or `http://HOST:PORT`
/// (`https://HOST:PORT` with TLS), 1 to [`EtcdSource::MAX_ENDPOINTS`] of them.
fn etcd_endpoints(errs: &mut Diagnostics, at: &str, list: &[String], scheme: EtcdScheme) -> Vec<Endpoint> {
    let field = &format!("{at}.endpoints");
    if list.is_empty() || list.len() > EtcdSource::MAX_ENDPOINTS {
        errs.push(
            field,
            format!("{list:?}"),
            format!(
                "needs 1 to {} etcd client addresses, such as [\"127.0.0.1:2379\"]",
                EtcdSource::MAX_ENDPOINTS
            ),
        );
    }
    let mut endpoints = Vec::new();
    let (strip, example) = match scheme {
        EtcdScheme::Tls => ("https://", "HOST:PORT or https://HOST:PORT"),
        EtcdScheme::Plain => ("http://", "HOST:PORT or http://HOST:PORT"),
    };
    for (j, text) in list.iter().enumerate() {
        let field_at = format!("{field}[{j}]");
        let bare = text.strip_prefix(strip).unwrap_or(text);
        match (parse_endpoint(bare), scheme) {
            (Ok(ep), _) => endpoints.push(ep),
            (Err(_), EtcdScheme::Plain) if text.starts_with("https://") => errs.push(
                field_at,
                text,
                format!(
                    "https:// needs the CA that signed etcd's certificate: add `tls: {{ ca_file: ... }}` to {at}, or \
                     write http://HOST:PORT"
                ),
            ),
            (Err(_), EtcdScheme::Tls) if text.starts_with("http://") => errs.push(
                field_at,
                text,
                "with `tls` every member is reached over TLS; write https://HOST:PORT (or HOST:PORT), or remove \
                 `tls`",
            ),
            (Err(why), _) => match port_hint(bare, 2379, "etcd's client port") {
                Some(hint) => errs.push(field_at, text, format!("{why}{hint}")),
                None => errs.push(field_at, text, format!("{why}; write {example}")),
            },
        }
    }
    endpoints
}

/// An etcd key prefix: starts with `/`, no trailing `/`, bounded, no spaces or control characters.
fn etcd_prefix(errs: &mut Diagnostics, field: &str, prefix: &str, example: &str) {
    let ok = (2..=EtcdSource::MAX_PREFIX).contains(&prefix.len())
        && prefix.starts_with('/')
        && !prefix.ends_with('/')
        && !prefix.chars().any(|c| c.is_control() || c.is_whitespace());
    if !ok {
        errs.push(
            field,
            format!("{prefix:?}"),
            format!(
                "must start with `/`, not end with `/`, be at most {} bytes and hold no spaces or control \
                 characters, {example}",
                EtcdSource::MAX_PREFIX
            ),
        );
    }
}

/// `affinity.placement_store`: only with `bounded_keys`, whose table it shares.
fn placement_store(errs: &mut Diagnostics, raw: Option<&RawAffinity>, bounded: bool) -> Option<PlacementStore> {
    let store = raw.and_then(|a| a.placement_store.as_ref())?;
    let at = "affinity.placement_store.etcd";
    if !bounded {
        errs.push(
            "affinity.placement_store",
            "etcd",
            "shares the bounded_keys key table between replicas; set affinity.placement: bounded_keys, or remove it",
        );
    }
    let e = &store.etcd;
    let tls = resilience::Checker {
        diag: &mut *errs,
        at: at.to_string(),
    }
    .tls(e.tls.as_ref());
    let scheme = match tls {
        Some(_) => EtcdScheme::Tls,
        None => EtcdScheme::Plain,
    };
    let endpoints = etcd_endpoints(errs, at, &e.endpoints, scheme);
    let auth = etcd_trust::etcd_auth(errs, at, e.auth.as_ref(), tls.is_some(), &endpoints);
    let prefix = e
        .prefix
        .clone()
        .unwrap_or_else(|| PlacementStore::DEFAULT_PREFIX.to_string());
    etcd_prefix(
        errs,
        &format!("{at}.prefix"),
        &prefix,
        "such as /llmroute (keys live under <prefix>/keys/<backend>/)",
    );
    let timeout_ms = e.timeout_ms.unwrap_or(PlacementStore::DEFAULT_TIMEOUT_MS);
    if !(1..=PlacementStore::MAX_TIMEOUT_MS).contains(&timeout_ms) {
        errs.push(
            format!("{at}.timeout_ms"),
            timeout_ms,
            format!(
                "must be between 1 and {} (how long a new key's first request waits for etcd before it is placed \
                 locally)",
                PlacementStore::MAX_TIMEOUT_MS
            ),
        );
    }
    let (share_keys, max_creates_per_s) = store_sharing(errs, store);
    Some(PlacementStore {
        endpoints,
        prefix,
        timeout_ms,
        tls,
        auth,
        share_keys,
        max_creates_per_s,
    })
}

/// `affinity.placement_store.share_keys` and `max_creates_per_s`: which keys reach etcd, and how many a second.
fn store_sharing(errs: &mut Diagnostics, store: &RawPlacementStore) -> (ShareKeys, u32) {
    let share_name = store.share_keys.as_deref().unwrap_or("returning");
    let share_keys = ShareKeys::parse(share_name).unwrap_or_else(|| {
        errs.push(
            "affinity.placement_store.share_keys",
            share_name,
            format!(
                "expected one of {}: returning writes a key to etcd once it comes back, all writes every new key",
                ShareKeys::NAMES
            ),
        );
        ShareKeys::default()
    });
    let max_creates_per_s = store
        .max_creates_per_s
        .unwrap_or(PlacementStore::DEFAULT_MAX_CREATES_PER_S);
    if !(1..=PlacementStore::MAX_MAX_CREATES_PER_S).contains(&max_creates_per_s) {
        errs.push(
            "affinity.placement_store.max_creates_per_s",
            max_creates_per_s,
            format!(
                "must be between 1 and {} (keys this Envoy creates in etcd per second; past it a key is placed \
                 locally)",
                PlacementStore::MAX_MAX_CREATES_PER_S
            ),
        );
    }
    (share_keys, max_creates_per_s)
}

/// When `text` is a host without its port: the address to write instead, `text` with `port`, which `whose` names.
fn port_hint(text: &str, port: u16, whose: &str) -> Option<String> {
    with_port(text, port).map(|fixed| format!(", such as {fixed} ({whose})"))
}

fn endpoints(errs: &mut Diagnostics, i: usize, list: &[String], kind: Option<EngineKind>) -> Vec<Endpoint> {
    let (port, whose) = match kind {
        Some(k) => (k.default_port(), format!("{}'s default port", k.as_str())),
        None => (8080, "the engine's port".to_string()),
    };
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
            Err(reason) => errs.push(
                field,
                text,
                format!(
                    "malformed address: {reason}{}",
                    port_hint(text, port, &whose).unwrap_or_default()
                ),
            ),
        }
    }
    seen
}

fn model(
    errs: &mut Diagnostics,
    i: usize,
    m: &RawModel,
    backends: &HashMap<&str, usize>,
    (global, bounded_keys): (&AffinityConfig, BoundedKeys),
) -> Option<ModelAlias> {
    let before = errs.errors.len();
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
            None => errs.push(at("backend"), &r.backend, undefined_backend(&r.backend, backends)),
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
    let affinity = alias_affinity(errs, i, m.affinity.as_ref(), global, bounded_keys);
    (errs.errors.len() == before).then(|| ModelAlias {
        name: m.name.clone(),
        routes,
        endpoints,
        model_prefix_routing: m.model_prefix_routing.unwrap_or(false),
        limits,
        affinity,
        stream_upstream,
    })
}

/// Most backend names an undefined-backend error lists.
const LISTED_BACKENDS: usize = 16;

/// Why a route's backend is refused: what is defined (in document order), and the name closest to `name`.
fn undefined_backend(name: &str, backends: &HashMap<&str, usize>) -> String {
    let mut defined: Vec<(usize, &str)> = backends.iter().map(|(&n, &i)| (i, n)).collect();
    defined.sort_unstable();
    let names: Vec<&str> = defined.into_iter().map(|(_, n)| n).collect();
    if names.is_empty() {
        return "no backend with this name is defined, and `backends` defines none".into();
    }
    let hint = suggest::closest(name, names.iter().copied())
        .map(|n| format!(" (did you mean `{n}`?)"))
        .unwrap_or_default();
    let listed: Vec<String> = names.iter().take(LISTED_BACKENDS).map(|n| format!("`{n}`")).collect();
    let more = match names.len().saturating_sub(LISTED_BACKENDS) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    format!(
        "no backend with this name is defined{hint}; the backends are {}{more}",
        listed.join(", ")
    )
}

/// An alias' effective affinity: the top-level settings, with each field the alias sets checked like its
/// top-level namesake and put in its place. `bounded_keys` takes the top-level parameters.
fn alias_affinity(
    errs: &mut Diagnostics,
    i: usize,
    raw: Option<&RawAliasAffinity>,
    global: &AffinityConfig,
    bounded_keys: BoundedKeys,
) -> AffinityConfig {
    let mut a = global.clone();
    let Some(raw) = raw else { return a };
    let at = |f: &str| format!("models[{i}].affinity.{f}");
    if let Some(headers) = &raw.session_headers {
        a.session_headers = session_headers(errs, &at("session_headers"), headers);
    }
    if let Some(n) = raw.user_prefix_bytes {
        a.user_prefix_bytes = user_prefix_bytes(errs, &at("user_prefix_bytes"), n);
    }
    if let Some(name) = &raw.placement {
        a.placement = match placement_name(errs, &at("placement"), name) {
            true => KeyPlacement::BoundedKeys(bounded_keys),
            false => KeyPlacement::Hash,
        };
    }
    a
}

fn auth(errs: &mut Diagnostics, a: &RawAuth) -> Auth {
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
    let mut key_limits: Vec<(String, RateLimits)> = Vec::new();
    let pairs = a.key_limits.as_ref().map_or(&[][..], |k| k.0.as_slice());
    if pairs.len() > crate::auth::MAX_KEYS {
        errs.push(
            "auth.key_limits",
            pairs.len(),
            format!(
                "names more keys than the {} a keys variable may hold",
                crate::auth::MAX_KEYS
            ),
        );
    }
    for (key, raw) in pairs {
        let field = format!("auth.key_limits.{key}");
        if !crate::auth::name_ok(key) {
            errs.push(
                &field,
                key,
                format!(
                    "a key name is 1 to {} characters of A-Z a-z 0-9 _ . -, as in the keys variable",
                    crate::auth::NAME_MAX
                ),
            );
        } else if key_limits.iter().any(|(k, _)| k == key) {
            errs.push(&field, key, "the key is named twice; give it one limits block");
        }
        if let Some(l) = rate_limits(errs, &field, Some(raw)) {
            key_limits.push((key.clone(), l));
        }
    }
    Auth {
        keys_env: name.clone(),
        limits: rate_limits(errs, "auth.limits", a.limits.as_ref()),
        key_limits,
    }
}

/// `global_limits`: the service's address, its domain, the timeout and what to do when it cannot answer.
fn global_limits(errs: &mut Diagnostics, g: &RawGlobalLimits) -> Option<GlobalLimits> {
    let address = parse_endpoint(&g.address)
        .map_err(|reason| {
            errs.push(
                "global_limits.address",
                &g.address,
                match port_hint(&g.address, 8081, "the rate-limit service's gRPC port") {
                    Some(hint) => format!("{reason}{hint}"),
                    None => format!("{reason}; write the rate-limit service's gRPC address, such as 127.0.0.1:8081"),
                },
            )
        })
        .ok();
    let domain = g.domain.clone().unwrap_or_else(|| "llmroute".into());
    let domain_ok =
        (1..=64).contains(&domain.len()) && domain.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if !domain_ok {
        errs.push(
            "global_limits.domain",
            format!("{domain:?}"),
            "must be 1 to 64 characters of A-Z a-z 0-9 _ . - (the `domain` of the rate-limit service's config)",
        );
    }
    let timeout_ms = g.timeout_ms.unwrap_or(100);
    if !(1..=10_000).contains(&timeout_ms) {
        errs.push(
            "global_limits.timeout_ms",
            timeout_ms,
            "must be between 1 and 10000: every admitted request waits for the service this long at most",
        );
    }
    let failure_mode_allow = match g.failure_mode.as_deref() {
        None | Some("allow") => true,
        Some("deny") => false,
        Some(other) => {
            errs.push(
                "global_limits.failure_mode",
                other,
                "must be `allow` (requests go on when the service cannot answer) or `deny` (they get a 503)",
            );
            true
        }
    };
    let default_max_tokens = g.default_max_tokens.unwrap_or(super::rates::DEFAULT_MAX_TOKENS);
    if !(1..=10_000_000).contains(&default_max_tokens) {
        errs.push(
            "global_limits.default_max_tokens",
            default_max_tokens,
            "must be between 1 and 10000000 (output tokens charged when a request names no max_tokens and no usage is reported)",
        );
    }
    Some(GlobalLimits {
        address: address?,
        domain,
        timeout_ms,
        failure_mode_allow,
        default_max_tokens,
    })
}

/// A limits block: at least one of `requests` and `tokens`, each in the `AMOUNT-UNIT,...` syntax.
fn rate_limits(errs: &mut Diagnostics, field: &str, raw: Option<&RawRateLimits>) -> Option<RateLimits> {
    let raw = raw?;
    let mut parse = |f: &str, text: Option<&String>| match text {
        None => Vec::new(),
        Some(t) => super::rates::parse_rates(t).unwrap_or_else(|reason| {
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
    let default_max_tokens = raw.default_max_tokens.unwrap_or(super::rates::DEFAULT_MAX_TOKENS);
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
        inject_max_tokens: raw.inject_max_tokens.unwrap_or(false),
    })
}

fn endpoint_set(errs: &mut Diagnostics, i: usize, names: Option<&[String]>) -> ApiSet {
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

/// The top-level affinity, and the `bounded_keys` parameters every alias that places keys that way uses.
fn affinity(errs: &mut Diagnostics, raw: Option<&RawAffinity>, alias_bounded: bool) -> (AffinityConfig, BoundedKeys) {
    let headers = raw
        .and_then(|a| a.session_headers.clone())
        .unwrap_or_else(|| DEFAULT_SESSION_HEADERS.iter().map(|h| h.to_string()).collect());
    let session_headers = session_headers(errs, "affinity.session_headers", &headers);
    let user_prefix_bytes = user_prefix_bytes(
        errs,
        "affinity.user_prefix_bytes",
        raw.and_then(|a| a.user_prefix_bytes)
            .unwrap_or(DEFAULT_USER_PREFIX_BYTES),
    );
    let (placement, bounded_keys) = placement(errs, raw, alias_bounded);
    let placement_store = placement_store(errs, raw, alias_bounded || placement.bounded().is_some());
    let cfg = AffinityConfig {
        session_headers,
        user_prefix_bytes,
        conversation_id: raw.and_then(|a| a.conversation_id).unwrap_or(false),
        anthropic_user_id: raw.and_then(|a| a.anthropic_user_id).unwrap_or(false),
        placement,
        placement_store,
    };
    (cfg, bounded_keys)
}

/// A session-header list at `field`: valid, non-credential, client-owned names, each once; lower-cased.
fn session_headers(errs: &mut Diagnostics, field: &str, headers: &[String]) -> Vec<String> {
    for (i, h) in headers.iter().enumerate() {
        let field = format!("{field}[{i}]");
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
    if headers.len() > MAX_SESSION_HEADERS {
        errs.push(
            field,
            headers.len(),
            format!("at most {MAX_SESSION_HEADERS} session headers; list the ones your clients send"),
        );
    }
    check_unique(errs, field, headers.iter().map(String::as_str));
    headers.iter().map(|h| h.to_ascii_lowercase()).collect()
}

fn user_prefix_bytes(errs: &mut Diagnostics, field: &str, n: usize) -> usize {
    if n > MAX_USER_PREFIX_BYTES {
        errs.push(field, n, format!("must be at most {MAX_USER_PREFIX_BYTES}"));
    }
    n
}

/// True for `bounded_keys`, false for `hash`; anything else is an error at `field`.
fn placement_name(errs: &mut Diagnostics, field: &str, name: &str) -> bool {
    let bounded = name == "bounded_keys";
    if !bounded && name != "hash" {
        errs.push(
            field,
            name,
            format!("unknown placement; expected one of {}", KeyPlacement::NAMES),
        );
    }
    bounded
}

/// Settings that load but would do nothing: `slots` and `load.spill_queue` on a backend no alias places keys on,
/// and bounded-keys
/// placement on a backend it cannot pin (not `chwbl`, or endpoints named by DNS, whose Envoy hosts carry resolved
/// addresses). A backend is placed on when the top-level placement is `bounded_keys`, or an alias whose own
/// placement is routes to it.
fn placement_warnings(errs: &mut Diagnostics, affinity: &AffinityConfig, models: &[ModelAlias], backends: &[Backend]) {
    let global = affinity.placement.bounded().is_some();
    for (i, b) in backends.iter().enumerate() {
        let by_alias = models
            .iter()
            .position(|m| m.affinity.placement.bounded().is_some() && m.routes.iter().any(|r| r.backend == i));
        let (bounded, setting) = match (global, by_alias) {
            (true, _) => (true, "affinity.placement".to_string()),
            (false, Some(m)) => (true, format!("models[{m}].affinity.placement")),
            (false, None) => (false, String::new()),
        };
        let warn = |field: String, value: String, reason: String| ConfigError { field, value, reason };
        if let (Some(slots), false) = (&b.slots, bounded) {
            let reason =
                "only used by affinity.placement: bounded_keys (top-level, or an alias' own on a route here); ignored"
                    .to_string();
            errs.warnings
                .push(warn(format!("backends[{i}].slots"), format!("{slots:?}"), reason));
        }
        if let (Some(q), false) = (b.load.and_then(|l| l.spill_queue), bounded && b.lb == LbPolicy::Chwbl) {
            let reason = "only used by affinity.placement: bounded_keys on an lb: chwbl backend (top-level, or an \
                          alias' own on a route here); ignored"
                .to_string();
            errs.warnings
                .push(warn(format!("backends[{i}].load.spill_queue"), q.to_string(), reason));
        }
        if bounded && b.lb != LbPolicy::Chwbl {
            let reason = format!("{setting}: bounded_keys applies only to lb: chwbl; this backend is not pinned");
            errs.warnings
                .push(warn(format!("backends[{i}].lb"), b.lb.as_str().to_string(), reason));
        } else if bounded && !b.discovered() && b.endpoints.iter().any(|e| !e.is_ip) {
            let reason = format!("{setting}: bounded_keys needs IP endpoints; this backend keeps Envoy's ring hash");
            let names: Vec<String> = b.endpoints.iter().map(|e| e.to_string()).collect();
            errs.warnings
                .push(warn(format!("backends[{i}].endpoints"), names.join(", "), reason));
        }
    }
}

/// The top-level placement, and the `bounded_keys` parameters (checked when the top-level placement or any
/// alias' own is `bounded_keys`, refused otherwise since they would do nothing).
fn placement(errs: &mut Diagnostics, raw: Option<&RawAffinity>, alias_bounded: bool) -> (KeyPlacement, BoundedKeys) {
    let name = raw.and_then(|a| a.placement.as_deref()).unwrap_or("hash");
    let bounded = placement_name(errs, "affinity.placement", name);
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
        if !bounded && !alias_bounded {
            errs.push(
                field,
                v,
                format!("only applies to placement: bounded_keys (top-level or an alias' own), not {name}"),
            );
        } else if !(lo..=hi).contains(&v) {
            errs.push(field, v, format!("must be between {lo} and {hi} ({unit})"));
        }
    }
    let params = BoundedKeys {
        key_balance_factor: factor.unwrap_or(d.key_balance_factor),
        idle_ttl_ms: ttl_s.map_or(d.idle_ttl_ms, |s| s.saturating_mul(1000)),
        max_keys: max_keys.unwrap_or(d.max_keys),
    };
    let placement = match bounded {
        true => KeyPlacement::BoundedKeys(params),
        false => KeyPlacement::Hash,
    };
    (placement, params)
}

/// `limits`: each bound in its range, with its default.
pub(super) fn limits(errs: &mut Diagnostics, raw: Option<&RawLimits>) -> Limits {
    let (max_body_bytes, max_assembled_bytes) = body_bounds(errs, raw);
    let request_timeout_ms = raw.and_then(|l| l.request_timeout_ms).unwrap_or(600_000);
    if request_timeout_ms == 0 || request_timeout_ms > 86_400_000 {
        errs.push(
            "limits.request_timeout_ms",
            request_timeout_ms,
            "must be between 1 and 86400000 (one day); 0 would time every request out at once",
        );
    }
    let (headers_timeout_ms, body_timeout_ms) = client_timeouts(errs, raw);
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

/// `limits.FIELD`, or `default` without it, between `lo` and `hi`.
fn ranged(errs: &mut Diagnostics, field: &str, value: Option<u64>, default: u64, (lo, hi): (u64, u64)) -> u64 {
    let v = value.unwrap_or(default);
    errs.range(&format!("limits.{field}"), v, lo, hi);
    v
}

/// `limits.max_body_bytes` and `limits.max_assembled_bytes`: the most the filter holds of a request, and of an
/// answer it rebuilds from a stream.
fn body_bounds(errs: &mut Diagnostics, raw: Option<&RawLimits>) -> (usize, usize) {
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
    (max_body_bytes, max_assembled_bytes)
}

/// `limits.headers_timeout_ms` and `limits.body_timeout_ms`: how long a client may take to send its headers, and
/// its whole request, which cannot take less than its headers.
fn client_timeouts(errs: &mut Diagnostics, raw: Option<&RawLimits>) -> (u64, u64) {
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
    (headers_timeout_ms, body_timeout_ms)
}

/// Any name Envoy accepts as a cluster name and the filter can carry in its `x-llmroute-cluster` header:
/// printable ASCII without spaces (Istio's `outbound|8000||llama.ns.svc.cluster.local` included).
fn check_cluster_name(errs: &mut Diagnostics, field: &str, name: &str) {
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

fn check_model_name(errs: &mut Diagnostics, field: &str, name: &str) {
    let ok = (1..=MODEL_NAME_MAX).contains(&name.len()) && !name.chars().any(|c| c.is_control() || c.is_whitespace());
    if !ok {
        errs.push(
            field,
            format!("{name:?}"),
            format!("must be 1 to {MODEL_NAME_MAX} bytes without spaces or control characters"),
        );
    }
}

fn check_unique<'a>(errs: &mut Diagnostics, list: &str, names: impl Iterator<Item = &'a str>) {
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
