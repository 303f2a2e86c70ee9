//! `backends[]`: each engine fleet's name, kind, load balancing, hosts (listed, or discovered through EDS or etcd),
//! slots, engine-load polling, and what Envoy does when its engines fail (through `super::resilience`).

use super::*;

/// `backends[i]`, checked whole; `None` when any of its fields is refused.
pub(super) fn backend(errs: &mut Diagnostics, i: usize, b: &RawBackend) -> Option<Backend> {
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
    if let Some(n) = b.host_max_inflight.filter(|n| !(1..=MAX_HOST_INFLIGHT).contains(n)) {
        errs.push(
            at("host_max_inflight"),
            n,
            format!("must be between 1 and {MAX_HOST_INFLIGHT} requests"),
        );
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
            host_max_inflight: b.host_max_inflight,
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

/// The largest `host_max_inflight`.
const MAX_HOST_INFLIGHT: u32 = 100_000;

/// `backends[i].lb` and `balance_factor`: a known policy, and a factor of at least 100 only where it applies.
pub(super) fn lb_policy(errs: &mut Diagnostics, i: usize, b: &RawBackend) -> (Option<LbPolicy>, u32) {
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
pub(super) fn slots(
    errs: &mut Diagnostics,
    i: usize,
    b: &RawBackend,
    listed: usize,
    discovered: bool,
) -> Option<Vec<u32>> {
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
pub(super) fn load(errs: &mut Diagnostics, i: usize, kind: Option<EngineKind>, raw: &RawLoad) -> Load {
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
pub(super) fn hosts(errs: &mut Diagnostics, i: usize, b: &RawBackend) -> (Vec<Endpoint>, Option<Discovery>) {
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

pub(super) fn discovery(errs: &mut Diagnostics, at: &str, d: &RawDiscovery) -> Discovery {
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
pub(super) fn etcd(errs: &mut Diagnostics, at: &str, e: &RawEtcd) -> EtcdSource {
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
pub(super) enum EtcdScheme {
    /// Without `tls`: `http://` or bare; `https://` asks for the `tls` block.
    Plain,
    /// With `tls`: `https://` or bare; `http://` contradicts it.
    Tls,
}

/// `AT.endpoints`, etcd client addresses of the block at `at`: `HOST:PORT` or `http://HOST:PORT`
/// (`https://HOST:PORT` with TLS), 1 to [`EtcdSource::MAX_ENDPOINTS`] of them.
pub(super) fn etcd_endpoints(errs: &mut Diagnostics, at: &str, list: &[String], scheme: EtcdScheme) -> Vec<Endpoint> {
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
pub(super) fn etcd_prefix(errs: &mut Diagnostics, field: &str, prefix: &str, example: &str) {
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

pub(super) fn endpoints(errs: &mut Diagnostics, i: usize, list: &[String], kind: Option<EngineKind>) -> Vec<Endpoint> {
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
