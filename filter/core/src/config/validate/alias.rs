//! `models[]`: each alias' routes (on declared backends, by priority), the APIs it serves, its limits and its own
//! affinity over the top-level one.

use super::*;

pub(super) fn model(
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
pub(super) const LISTED_BACKENDS: usize = 16;

/// Why a route's backend is refused: what is defined (in document order), and the name closest to `name`.
pub(super) fn undefined_backend(name: &str, backends: &HashMap<&str, usize>) -> String {
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
pub(super) fn alias_affinity(
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

/// A limits block: at least one of `requests` and `tokens`, each in the `AMOUNT-UNIT,...` syntax.
pub(super) fn rate_limits(errs: &mut Diagnostics, field: &str, raw: Option<&RawRateLimits>) -> Option<RateLimits> {
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

pub(super) fn endpoint_set(errs: &mut Diagnostics, i: usize, names: Option<&[String]>) -> ApiSet {
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
