//! Stage two of the config: values, references and uniqueness.
//!
//! Validation never stops at the first problem: an operator fixing a file wants the whole list. Each error names
//! the field path, the value as written and the reason. Defaults are applied here, so the runtime config has no
//! `Option`s left to interpret.
//!
//! This file checks the document as a whole and holds the checks several blocks share (names, paths,
//! uniqueness); each block has its own file: `backend`, `alias`, `affinity`, `admission` and `request_limits`.

use super::MAX_SLOTS;
use std::collections::HashMap;

use super::*;
use crate::api_kind::Api;

mod admission;
mod affinity;
mod alias;
mod backend;
mod request_limits;

use admission::*;
use affinity::*;
use alias::*;
use backend::*;
pub(super) use request_limits::limits;

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
    if raw.fairness.is_none() {
        host_bound_needs_fairness(&mut errs, &raw);
    }

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

/// `backends[].host_max_inflight` bounds a host through the fair queue: refused without `fairness`.
fn host_bound_needs_fairness(errs: &mut Diagnostics, raw: &RawConfig) {
    for (i, b) in raw.backends.iter().enumerate() {
        if let Some(n) = b.host_max_inflight {
            errs.push(
                format!("backends[{i}].host_max_inflight"),
                n,
                "is kept by the fair queue: add a `fairness` block (docs/load-and-fairness.md), or remove it",
            );
        }
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

/// When `text` is a host without its port: the address to write instead, `text` with `port`, which `whose` names.
fn port_hint(text: &str, port: u16, whose: &str) -> Option<String> {
    with_port(text, port).map(|fixed| format!(", such as {fixed} ({whose})"))
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
