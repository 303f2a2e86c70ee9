//! The filter's metrics as Envoy stats.
//!
//! The glue names a stat the wasm way, `<metric>;<label>=<value>...` (`envoy_contract::metrics::labelled`), and
//! defines it the first time that combination is used. Envoy's dynamic-module ABI only lets a configuration
//! define stats while it is being created (`config_new`), and a defined stat may carry labels whose values come
//! with each update. So each configuration defines, once, every metric family the filter has ([`FAMILIES`]:
//! the metric, its kind and its label names in the glue's order), and each stat the glue defines later is
//! mapped to its family and its label values; every update goes to Envoy with them.
//!
//! Envoy then shows a stat on `/stats` as `dynamicmodulescustom.<metric>.<label>.<value>...` and on
//! `/stats/prometheus` as `<metric>{<label>="<value>",...}`: the wasm build's Prometheus names and labels. A stat
//! of no family (a metric added to the glue and not here) is logged when defined and kept in the process only
//! (`shared.rs` keeps every value, for `get_metric`, either way).

use std::sync::{Mutex, MutexGuard};

use llmroute_core::envoy_contract::metrics as names;

use crate::abi::{self, FilterConfigEnvoyPtr, ModuleBuffer};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

use Kind::{Counter, Gauge, Histogram};

/// Every metric family of the filter: name, kind, label names in the order the glue gives them.
pub const FAMILIES: &[(&str, Kind, &[&str])] = &[
    (
        names::REQUESTS,
        Counter,
        &["alias", "backend", "api", "code_class", "affinity_source"],
    ),
    (names::REJECTIONS, Counter, &["reason"]),
    (names::RATE_LIMITED, Counter, &["alias", "key", "kind"]),
    (names::TOKENS, Counter, &["alias", "backend", "kind"]),
    (names::STREAM_OUTCOMES, Counter, &["outcome"]),
    (names::PLACEMENTS, Counter, &["reason"]),
    (names::OVERFLOW, Counter, &[]),
    (names::TTFB_MS, Histogram, &["alias"]),
    (names::DURATION_MS, Histogram, &["alias"]),
    (names::PROMPT_TOKENS, Histogram, &["alias"]),
    (names::COMPLETION_TOKENS, Histogram, &["alias"]),
    (names::KEY_REQUESTS, Counter, &["key"]),
    (names::PLACEMENT_STORE, Counter, &["outcome"]),
    (names::FLEET_WARNINGS, Counter, &[]),
    (names::FLEET_CHECKS, Counter, &[]),
    (names::PLACEMENT_STORE_KEPT_LOCAL, Counter, &["reason"]),
    (names::VM_MEMORY_BYTES, Gauge, &[]),
    (names::QUEUE_DEPTH, Gauge, &["backend"]),
    (names::QUEUE_WAIT_MS, Histogram, &["backend"]),
    (names::QUEUE_TIMEOUTS, Counter, &["backend"]),
    (names::QUEUE_REFUSALS, Counter, &["backend", "reason"]),
    (names::QUEUE_ABANDONED, Counter, &["backend"]),
    (names::ENGINE_QUEUE, Gauge, &["backend", "host"]),
    (names::ENGINE_RUNNING, Gauge, &["backend", "host"]),
    (names::ENGINE_KV_PERMILLE, Gauge, &["backend", "host"]),
    (names::ENGINE_LOAD_READS, Counter, &["backend", "outcome"]),
    (names::ENGINE_LOAD_STALE, Counter, &["backend"]),
];

/// A family's key: the metric and its label names, `;`-separated (tests read it).
#[cfg(test)]
fn family_key<'a>(metric: &str, labels: impl Iterator<Item = &'a str>) -> String {
    let mut key = String::from(metric);
    for l in labels {
        key.push(';');
        key.push_str(l);
    }
    key
}

/// A configuration's families, by their index in [`FAMILIES`]: kind and Envoy's id, `None` where Envoy refused
/// it. An update finds its family by index, hashing no name.
#[derive(Default)]
pub struct Families(Vec<Option<(Kind, usize)>>);

/// Defines every family on Envoy's configuration `envoy` (in `config_new`, before Envoy freezes its stats).
pub fn define_all(envoy: FilterConfigEnvoyPtr) -> Families {
    let mut out = Families::default();
    for (metric, kind, labels) in FAMILIES {
        let label_bufs: Vec<ModuleBuffer> = labels.iter().map(|l| ModuleBuffer::of(l.as_bytes())).collect();
        let mut id = 0usize;
        let name = ModuleBuffer::of(metric.as_bytes());
        let (labels_ptr, n) = (label_bufs.as_ptr(), label_bufs.len());
        // SAFETY: every buffer outlives the call; `envoy` is Envoy's configuration, being created.
        let result = unsafe {
            match kind {
                Counter => abi::envoy_dynamic_module_callback_http_filter_config_define_counter(
                    envoy, name, labels_ptr, n, &mut id,
                ),
                Gauge => abi::envoy_dynamic_module_callback_http_filter_config_define_gauge(
                    envoy, name, labels_ptr, n, &mut id,
                ),
                Histogram => abi::envoy_dynamic_module_callback_http_filter_config_define_histogram(
                    envoy, name, labels_ptr, n, &mut id,
                ),
            }
        };
        if result == abi::METRICS_SUCCESS {
            out.0.push(Some((*kind, id)));
        } else {
            out.0.push(None);
            log::warn!("llmroute: Envoy refused the stat {metric} (result {result}); it stays in the process only");
        }
    }
    out
}

/// The family key and label values of a glue stat name (tests read it).
#[cfg(test)]
pub fn family_of(name: &str) -> Option<(String, Vec<String>)> {
    let e = parse(name)?;
    let (metric, _, labels) = FAMILIES.get(e.family)?;
    Some((family_key(metric, labels.iter().copied()), e.values))
}

/// The most label values a family has ([`FAMILIES`]); an update passes them from the stack.
const MAX_LABELS: usize = 8;

/// A glue stat's family (its index in [`FAMILIES`]) and label values.
struct Export {
    family: usize,
    values: Vec<String>,
}

/// By the glue's stat id (id - 1), as `shared.rs` numbers them.
static EXPORTS: Mutex<Vec<Option<Export>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Splits a glue stat name into its family and label values; `None` when it is not `metric(;label=value)*` of
/// a family in [`FAMILIES`].
fn parse(name: &str) -> Option<Export> {
    let mut parts = name.split(';');
    let metric = parts.next()?;
    let mut labels = Vec::new();
    let mut values = Vec::new();
    for p in parts {
        let (l, v) = p.split_once('=')?;
        labels.push(l);
        values.push(v.to_string());
    }
    if values.len() > MAX_LABELS {
        return None;
    }
    let family = FAMILIES.iter().position(|(m, _, ls)| {
        *m == metric && ls.len() == labels.len() && ls.iter().zip(&labels).all(|(a, b)| a == b)
    })?;
    Some(Export { family, values })
}

/// What an update does.
#[derive(Clone, Copy)]
pub enum Op {
    /// A counter's or a gauge's increment (negative: a gauge's decrement).
    Add(i64),
    /// A gauge's value, or a histogram's sample.
    Record(u64),
}

/// The glue defined stat `id` as `name`: it is exported from now on, and a counter or gauge shows at 0 at once,
/// as a wasm stat does when defined.
pub fn defined(id: u32, name: &str, families: &Families, envoy: FilterConfigEnvoyPtr) {
    let Some(at) = usize::try_from(id).ok().and_then(|i| i.checked_sub(1)) else {
        return;
    };
    let export = parse(name);
    if !export
        .as_ref()
        .is_some_and(|e| families.0.get(e.family).is_some_and(Option::is_some))
    {
        log::warn!("llmroute: the stat {name} has no Envoy family; it stays in the process only");
    }
    {
        let mut exports = lock(&EXPORTS);
        if exports.len() <= at {
            exports.resize_with(at.saturating_add(1), || None);
        }
        if let Some(slot) = exports.get_mut(at) {
            *slot = export;
        }
    }
    update(id, Op::Add(0), families, envoy);
}

/// Sends `op` on stat `id` to Envoy, through the families of the configuration `envoy`.
pub fn update(id: u32, op: Op, families: &Families, envoy: FilterConfigEnvoyPtr) {
    let Some(at) = usize::try_from(id).ok().and_then(|i| i.checked_sub(1)) else {
        return;
    };
    let exports = lock(&EXPORTS);
    let Some(Some(export)) = exports.get(at) else {
        return;
    };
    let Some(&Some((kind, envoy_id))) = families.0.get(export.family) else {
        return;
    };
    let mut values = [ModuleBuffer::NULL; MAX_LABELS];
    for (slot, v) in values.iter_mut().zip(&export.values) {
        *slot = ModuleBuffer::of(v.as_bytes());
    }
    let (v, n) = (values.as_ptr(), export.values.len().min(MAX_LABELS));
    // SAFETY: every buffer outlives the call; `envoy` is a live configuration; Envoy's stats are thread-safe.
    unsafe {
        match (kind, op) {
            (Counter, Op::Add(by)) => {
                abi::envoy_dynamic_module_callback_http_filter_config_increment_counter(
                    envoy,
                    envoy_id,
                    v,
                    n,
                    by.unsigned_abs(),
                );
            }
            (Gauge, Op::Add(by)) if by < 0 => {
                abi::envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
                    envoy,
                    envoy_id,
                    v,
                    n,
                    by.unsigned_abs(),
                );
            }
            (Gauge, Op::Add(by)) => {
                abi::envoy_dynamic_module_callback_http_filter_config_increment_gauge(
                    envoy,
                    envoy_id,
                    v,
                    n,
                    by.unsigned_abs(),
                );
            }
            (Gauge, Op::Record(value)) => {
                abi::envoy_dynamic_module_callback_http_filter_config_set_gauge(envoy, envoy_id, v, n, value);
            }
            (Histogram, Op::Record(value)) => {
                abi::envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
                    envoy, envoy_id, v, n, value,
                );
            }
            (Histogram, Op::Add(_)) | (Counter, Op::Record(_)) => {}
        }
    }
}
