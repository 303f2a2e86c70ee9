//! `affinity`: where the affinity key comes from, how keys find hosts (`hash` or `bounded_keys`) and the key table
//! replicas share in etcd (`placement_store`).

use super::*;

/// `affinity.placement_store`: only with `bounded_keys`, whose table it shares.
pub(super) fn placement_store(
    errs: &mut Diagnostics,
    raw: Option<&RawAffinity>,
    bounded: bool,
) -> Option<PlacementStore> {
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
pub(super) fn store_sharing(errs: &mut Diagnostics, store: &RawPlacementStore) -> (ShareKeys, u32) {
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

/// The top-level affinity, and the `bounded_keys` parameters every alias that places keys that way uses.
pub(super) fn affinity(
    errs: &mut Diagnostics,
    raw: Option<&RawAffinity>,
    alias_bounded: bool,
) -> (AffinityConfig, BoundedKeys) {
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
pub(super) fn session_headers(errs: &mut Diagnostics, field: &str, headers: &[String]) -> Vec<String> {
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

pub(super) fn user_prefix_bytes(errs: &mut Diagnostics, field: &str, n: usize) -> usize {
    if n > MAX_USER_PREFIX_BYTES {
        errs.push(field, n, format!("must be at most {MAX_USER_PREFIX_BYTES}"));
    }
    n
}

/// True for `bounded_keys`, false for `hash`; anything else is an error at `field`.
pub(super) fn placement_name(errs: &mut Diagnostics, field: &str, name: &str) -> bool {
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

/// Settings that load but would do nothing: `slots`, `load.spill_queue` and `host_max_inflight` on a backend no
/// alias places keys on,
/// and bounded-keys
/// placement on a backend it cannot pin (not `chwbl`, or endpoints named by DNS, whose Envoy hosts carry resolved
/// addresses). A backend is placed on when the top-level placement is `bounded_keys`, or an alias whose own
/// placement is routes to it.
pub(super) fn placement_warnings(
    errs: &mut Diagnostics,
    affinity: &AffinityConfig,
    models: &[ModelAlias],
    backends: &[Backend],
) {
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
        if let (Some(n), false) = (b.host_max_inflight, bounded && b.lb == LbPolicy::Chwbl) {
            let reason = "needs affinity.placement: bounded_keys on an lb: chwbl backend (top-level, or an alias' own \
                          on a route here) to know each request's host; only max_inflight bounds this backend"
                .to_string();
            errs.warnings
                .push(warn(format!("backends[{i}].host_max_inflight"), n.to_string(), reason));
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
pub(super) fn placement(
    errs: &mut Diagnostics,
    raw: Option<&RawAffinity>,
    alias_bounded: bool,
) -> (KeyPlacement, BoundedKeys) {
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
