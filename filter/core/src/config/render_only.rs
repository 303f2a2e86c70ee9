//! The fields of `llmroute.yaml` that only `llmroute render` reads: the listener's address (`listen`) and TLS
//! (`listen_tls`), the compressor (`compress_responses`), the route's retry policy (`retries`) and the access log
//! (`access_log`). Envoy itself acts on them; the filter never does.
//!
//! So the filter neither parses nor keeps them. [`RawRenderOnly`] gives them their shape and [`validate`] checks
//! their values, for `llmroute validate` and `llmroute render` alone (through [`super::load_document`]); the
//! renderer then embeds the document without them ([`strip`]). The filter's own [`super::RawConfig`] knows their
//! names only, so that a misspelled field is still refused and the whole `llmroute.yaml`, given to the filter,
//! is refused with a reason that says which document the filter takes ([`refused`]).

use std::net::SocketAddr;

use serde::Deserialize;

use super::raw::RawConfig;
use super::tls::{self, ListenTls, RawListenTls};
use super::validate::{limits, listen_addr};
use super::{resilience, ConfigError, Diagnostics, RawRetries, Retries};

/// The top-level fields only `llmroute render` reads, as written in the document.
pub const FIELDS: [&str; 5] = ["listen", "compress_responses", "listen_tls", "retries", "access_log"];

/// The renderer-only fields, as written. The other fields of the document are the filter's ([`RawConfig`]), which
/// refuses unknown names; here they are skipped.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RawRenderOnly {
    /// Where Envoy listens for clients, `IP:PORT`. Default `127.0.0.1:10000`.
    #[serde(default)]
    pub listen: Option<String>,
    /// Compress responses (gzip) toward clients that accept it, with Envoy's compressor filter, which
    /// `llmroute render` adds ahead of the wasm filter. Upstreams are always asked for `accept-encoding: identity`,
    /// so the filter reads usage and stream ends uncompressed. Default false.
    #[serde(default)]
    pub compress_responses: Option<bool>,
    /// Terminate TLS for clients (HTTP/1.1 and HTTP/2 by ALPN). Without it the listener is plain HTTP.
    #[serde(default)]
    pub listen_tls: Option<RawListenTls>,
    /// Retries before the first response byte.
    #[serde(default)]
    pub retries: Option<RawRetries>,
    /// The access log: one JSON line per request. Default: Envoy's standard output.
    #[serde(default)]
    pub access_log: Option<RawAccessLog>,
}

/// Where the access log goes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccessLog {
    /// An absolute file path Envoy appends the JSON lines to. Default: Envoy's standard output.
    #[serde(default)]
    pub path: Option<String>,
}

/// The renderer-only settings, validated, with their defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderOnly {
    pub listen: SocketAddr,
    /// Envoy compresses responses toward clients that accept gzip (`compress_responses`).
    pub compress_responses: bool,
    pub listen_tls: Option<ListenTls>,
    pub retries: Retries,
    /// The access log's file (`access_log.path`); `None` writes it to Envoy's standard output.
    pub access_log_path: Option<String>,
}

/// Checks the renderer-only fields of a document whose other fields are `filter`. Those are validated (and their
/// errors reported) by the filter's own validation; here they are read only where a value here depends on them:
/// `listen` may not take `admin`'s port, and a retry's timeout may not outlast `limits.request_timeout_ms`.
pub(super) fn validate(raw: &RawRenderOnly, filter: &RawConfig, errs: &mut Diagnostics) -> Option<RenderOnly> {
    let before = errs.errors.len();
    let mut theirs = Diagnostics::default();
    let admin = listen_addr(&mut theirs, "admin", filter.admin.as_deref(), super::DEFAULT_ADMIN);
    let request_timeout_ms = limits(&mut theirs, filter.limits.as_ref()).request_timeout_ms;

    let listen = listen_addr(errs, "listen", raw.listen.as_deref(), super::DEFAULT_LISTEN);
    if let (Some(l), Some(a)) = (listen, admin) {
        let overlap = l.ip() == a.ip() || l.ip().is_unspecified() || a.ip().is_unspecified();
        if l.port() == a.port() && overlap {
            errs.push("admin", a, "binds the same port as `listen`");
        }
    }
    let listen_tls = tls::listen_tls(raw.listen_tls.as_ref(), errs);
    let retries = resilience::retries(raw.retries.as_ref(), errs);
    if retries.per_try_timeout_ms > request_timeout_ms {
        errs.push(
            "retries.per_try_timeout_ms",
            retries.per_try_timeout_ms,
            format!(
                "must be at most limits.request_timeout_ms ({request_timeout_ms}): a try cannot outlast the whole \
                 request"
            ),
        );
    }
    let access_log_path = raw.access_log.as_ref().and_then(|a| a.path.clone());
    if let Some(path) = &access_log_path {
        super::validate::check_abs_path(errs, "access_log.path", path);
    }
    match (listen, errs.errors.len() == before) {
        (Some(listen), true) => Some(RenderOnly {
            listen,
            compress_responses: raw.compress_responses.unwrap_or(false),
            listen_tls,
            retries,
            access_log_path,
        }),
        _ => None,
    }
}

/// The top-level fields in the order validation reports them, the renderer's among the filter's.
const REPORT_ORDER: [&str; 14] = [
    "version",
    "listen",
    "admin",
    "backends",
    "models",
    "affinity",
    "limits",
    "listen_tls",
    "retries",
    "tokens",
    "auth",
    "access_log",
    "global_limits",
    "fairness",
];

/// Where a problem with `field` (a path such as `retries.attempts`) stands in [`REPORT_ORDER`].
fn report_rank(field: &str) -> usize {
    let top = field.split(['.', '[']).next().unwrap_or(field);
    REPORT_ORDER
        .iter()
        .position(|f| *f == top)
        .unwrap_or(REPORT_ORDER.len())
}

/// The filter's errors and the renderer's as one list in document order: each of the renderer's goes before the
/// first of the filter's that a later top-level field holds.
pub(super) fn in_document_order(filter: Vec<ConfigError>, render: Vec<ConfigError>) -> Vec<ConfigError> {
    let mut out = filter;
    for e in render {
        let rank = report_rank(&e.field);
        let at = out
            .iter()
            .position(|f| report_rank(&f.field) > rank)
            .unwrap_or(out.len());
        out.insert(at, e);
    }
    out
}

/// One error for each renderer-only field in a document given to the filter.
pub(super) fn refused(raw: &RawConfig) -> Vec<ConfigError> {
    let present = [
        ("listen", raw.listen.is_some()),
        ("compress_responses", raw.compress_responses.is_some()),
        ("listen_tls", raw.listen_tls.is_some()),
        ("retries", raw.retries.is_some()),
        ("access_log", raw.access_log.is_some()),
    ];
    present
        .into_iter()
        .filter(|(_, here)| *here)
        .map(|(field, _)| ConfigError {
            field: field.to_string(),
            value: String::new(),
            reason: "only `llmroute render` reads this field, to write Envoy's own config; the filter's \
                     configuration is the document without it, which `llmroute render` embeds (`llmroute render \
                     --target filter` prints it): use that, or remove the field"
                .into(),
        })
        .collect()
}

/// The document as a JSON object, without its renderer-only fields: what the filter is given.
pub fn strip(doc: &mut serde_json::Value) {
    if let Some(map) = doc.as_object_mut() {
        for field in FIELDS {
            map.remove(field);
        }
    }
}
