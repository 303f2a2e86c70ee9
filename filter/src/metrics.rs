//! The filter's own metrics. Envoy shows them on `/stats` as `wasmcustom.<name>` and on `/stats/prometheus` as
//! `<metric>{labels}`, summed over workers.
//!
//! Labels are encoded in the stat name (`<metric>;<label>=<value>...`, see `envoy_contract::metrics`) and cut out
//! again by the stats tags `llmroute render` adds. A stat is defined lazily, the first time its label combination
//! is used, and its id is cached per VM, so a combination costs one `define_metric` per worker; a known one is
//! found by hashing its parts in place, without building its name (see [`StatKey`]). Every value is a
//! config name (alias, backend, key name) or a member of a closed set (api, status class, affinity source,
//! outcome, reason), so the number of series is bounded by the config: see `docs/observability.md`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::rc::Rc;

use foldhash::fast::FixedState;

use llmroute_core::envoy_contract::metrics as names;
use llmroute_core::key_placement::store::{KeptLocal, Outcome as StoreOutcome};
use llmroute_core::key_placement::PlacementReason;
use llmroute_core::stream::{Outcome, Usage};
use proxy_wasm::types::MetricType;

use crate::host::Envoy;

/// The most distinct stats one VM defines; past it, new combinations are dropped (never expected with a sane
/// config, but it bounds memory whatever happens).
const MAX_STATS: usize = 20_000;

#[derive(Debug, Clone)]
pub struct Metrics {
    /// The host the stats are defined and recorded on.
    envoy: Envoy,
    /// Stat ids by the hash of their [`StatKey`]; each entry keeps its key's bytes, so a hash collision only
    /// costs a comparison, never a wrong stat.
    ids: Rc<RefCell<HashMap<u64, Vec<KnownStat>, FixedState>>>,
    /// How many stats this VM defined (the entries of `ids`).
    defined: Rc<std::cell::Cell<usize>>,
}

/// A defined stat: its [`StatKey::bytes`] and the id Envoy gave it (`None` when Envoy refused it).
type KnownStat = (Vec<u8>, Option<u32>);

/// A stat as the filter names it before Envoy does: the metric and its labels with their raw values. Looking a
/// known stat up builds nothing: the key is hashed and compared in place, and only a new one is turned into its
/// stat name (`envoy_contract::metrics::labelled`, which rewrites every value into a stat token).
struct StatKey<'a> {
    metric: &'a str,
    labels: &'a [(&'a str, &'a str)],
}

impl StatKey<'_> {
    /// The key's parts in order; each is stored behind its length, so no two keys run together.
    fn parts(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.metric.as_bytes())
            .chain(self.labels.iter().flat_map(|(l, v)| [l.as_bytes(), v.as_bytes()]))
    }

    /// A hash for this VM's table only (it is never stored or sent): foldhash, whose small writes are cheap where
    /// a streaming xxh3 pays for its 64-byte buffer on each of a key's dozen short parts.
    fn hash(&self) -> u64 {
        let mut h = FixedState::default().build_hasher();
        for p in self.parts() {
            h.write(&len_prefix(p));
            h.write(p);
        }
        h.finish()
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        for p in self.parts() {
            b.extend_from_slice(&len_prefix(p));
            b.extend_from_slice(p);
        }
        b
    }

    /// True when `stored` holds this key's [`StatKey::bytes`].
    fn is(&self, stored: &[u8]) -> bool {
        let mut rest = stored;
        for p in self.parts() {
            let Some(after) = rest
                .strip_prefix(len_prefix(p).as_slice())
                .and_then(|r| r.strip_prefix(p))
            else {
                return false;
            };
            rest = after;
        }
        rest.is_empty()
    }

    fn name(&self) -> String {
        names::labelled(self.metric, self.labels)
    }
}

fn len_prefix(part: &[u8]) -> [u8; 4] {
    u32::try_from(part.len()).unwrap_or(u32::MAX).to_le_bytes()
}

/// What one routed request contributes when it is over.
pub struct Finished<'a> {
    pub alias: &'a str,
    pub backend: &'a str,
    pub api: &'a str,
    pub status: u32,
    pub affinity_source: &'a str,
    pub ttfb_ms: Option<u64>,
    pub duration_ms: Option<u64>,
    pub usage: Usage,
}

impl Metrics {
    /// No stat defined yet, on `envoy`.
    pub fn new(envoy: Envoy) -> Metrics {
        Metrics {
            envoy,
            ids: Rc::default(),
            defined: Rc::default(),
        }
    }

    /// The id of the stat `key` names, defined on first use.
    fn id(&self, kind: MetricType, key: StatKey) -> Option<u32> {
        let Ok(mut ids) = self.ids.try_borrow_mut() else {
            return None;
        };
        let hash = key.hash();
        if let Some(id) = ids.get(&hash).and_then(|known| known.iter().find(|(k, _)| key.is(k))) {
            return id.1;
        }
        if self.defined.get() >= MAX_STATS {
            return None;
        }
        let id = self.envoy.define_metric(kind, &key.name());
        ids.entry(hash).or_default().push((key.bytes(), id));
        self.defined.set(self.defined.get().saturating_add(1));
        id
    }

    /// Adds `n` to the counter `metric` with `labels`.
    pub(crate) fn add(&self, metric: &str, labels: &[(&str, &str)], n: u64) {
        self.envoy
            .add(self.id(MetricType::Counter, StatKey { metric, labels }), n);
    }

    /// Records `v` in the histogram `metric` with `labels`.
    pub(crate) fn observe(&self, metric: &str, labels: &[(&str, &str)], v: u64) {
        self.envoy
            .observe(self.id(MetricType::Histogram, StatKey { metric, labels }), v);
    }

    /// Sets the gauge `metric` with `labels` to `v` (one value for every VM: the last set stands).
    pub(crate) fn set(&self, metric: &str, labels: &[(&str, &str)], v: u64) {
        self.envoy
            .set_gauge(self.id(MetricType::Gauge, StatKey { metric, labels }), v);
    }

    /// Raises `llmroute_vm_memory_bytes` to this VM's linear memory size, if that is larger. Every VM (the main
    /// thread's and each worker's) shares the one gauge, so it holds the largest of them. A wasm memory never
    /// shrinks, so the largest VM's size only rises: a soak that sees it grow after its warm-up sees a VM that
    /// keeps allocating. Native builds (tests) have no linear memory and leave the gauge alone.
    pub fn vm_memory_tick(&self) {
        let Some(bytes) = linear_memory_bytes() else { return };
        let id = self.id(
            MetricType::Gauge,
            StatKey {
                metric: names::VM_MEMORY_BYTES,
                labels: &[],
            },
        );
        if self.envoy.metric_value(id).is_none_or(|now| bytes > now) {
            self.envoy.set_gauge(id, bytes);
        }
    }

    /// Defines the closed-set series that alerts divide by, so they read 0 rather than nothing before the first
    /// event: each stream outcome, each placement reason when `bounded_keys` placement is on, and each placement
    /// store outcome when the store is configured.
    pub fn prime(&self, bounded_placement: bool, placement_store: bool) {
        for o in Outcome::ALL {
            self.add(names::STREAM_OUTCOMES, &[("outcome", o.as_str())], 0);
        }
        if bounded_placement {
            for r in PlacementReason::ALL {
                self.add(names::PLACEMENTS, &[("reason", r.as_str())], 0);
            }
        }
        if placement_store {
            for o in StoreOutcome::LABELS {
                self.add(names::PLACEMENT_STORE, &[("outcome", o)], 0);
            }
            for k in KeptLocal::ALL {
                self.add(names::PLACEMENT_STORE_KEPT_LOCAL, &[("reason", k.as_str())], 0);
            }
        }
    }

    /// Adds `n` to the counter `metric` with `labels` (the engine load poll's counters).
    pub fn count(&self, metric: &str, labels: &[(&str, &str)], n: u64) {
        self.add(metric, labels, n);
    }

    /// Sets the gauge `metric` with `labels` to `v` (the engine load poll's gauges).
    pub fn gauge(&self, metric: &str, labels: &[(&str, &str)], v: u64) {
        self.envoy
            .set_gauge(self.id(MetricType::Gauge, StatKey { metric, labels }), v);
    }

    /// A request the gateway answered itself with an error; `code` is the error body's `code` (a closed set).
    pub fn rejected(&self, code: &'static str) {
        self.add(names::REJECTIONS, &[("reason", code)], 1);
    }

    /// A request refused by a rate limit. `key` is the configured key's name (never its value); `kind` names the
    /// limit from a closed set (for example `requests` or `tokens`).
    pub fn rate_limited(&self, alias: &str, key: &str, kind: &'static str) {
        self.add(
            names::RATE_LIMITED,
            &[("alias", alias), ("key", key), ("kind", kind)],
            1,
        );
    }

    /// A request admitted under an API key (its configured name, never its value).
    pub fn key_request(&self, key: &str) {
        self.add(names::KEY_REQUESTS, &[("key", key)], 1);
    }

    /// A request Envoy's circuit breaker shed.
    pub fn overflow(&self) {
        self.add(names::OVERFLOW, &[], 1);
    }

    pub fn stream_outcome(&self, o: Outcome) {
        self.add(names::STREAM_OUTCOMES, &[("outcome", o.as_str())], 1);
    }

    pub fn placement(&self, r: PlacementReason) {
        self.add(names::PLACEMENTS, &[("reason", r.as_str())], 1);
    }

    /// A new key settled through the placement store, or placed locally when the store failed.
    pub fn placement_store(&self, o: StoreOutcome) {
        self.add(names::PLACEMENT_STORE, &[("outcome", o.as_str())], 1);
    }

    /// A key placed locally without asking the placement store, and why.
    pub fn placement_store_kept_local(&self, k: KeptLocal) {
        self.add(names::PLACEMENT_STORE_KEPT_LOCAL, &[("reason", k.as_str())], 1);
    }

    /// A new key's transaction sent again because the view it was proposed in was stale (`stale_view`).
    pub fn placement_store_stale_view(&self) {
        self.add(
            names::PLACEMENT_STORE,
            &[("outcome", llmroute_core::key_placement::store::STALE_VIEW)],
            1,
        );
    }

    /// A routed request is over: count it, its tokens, and record its timings and sizes.
    pub fn finished(&self, f: &Finished) {
        let class = names::code_class(f.status);
        let labels = [
            ("alias", f.alias),
            ("backend", f.backend),
            ("api", f.api),
            ("code_class", class),
            ("affinity_source", f.affinity_source),
        ];
        self.add(names::REQUESTS, &labels, 1);
        if let Some(ms) = f.ttfb_ms {
            self.observe(names::TTFB_MS, &[("alias", f.alias)], ms);
        }
        if let Some(ms) = f.duration_ms {
            self.observe(names::DURATION_MS, &[("alias", f.alias)], ms);
        }
        let u = f.usage;
        let by_kind = [
            ("input", u.prompt_tokens),
            ("output", u.completion_tokens),
            ("cached", u.cached_tokens),
        ];
        for (kind, n) in by_kind {
            if let Some(n) = n {
                self.add(
                    names::TOKENS,
                    &[("alias", f.alias), ("backend", f.backend), ("kind", kind)],
                    n,
                );
            }
        }
        if let Some(n) = u.prompt_tokens {
            self.observe(names::PROMPT_TOKENS, &[("alias", f.alias)], n);
        }
        if let Some(n) = u.completion_tokens {
            self.observe(names::COMPLETION_TOKENS, &[("alias", f.alias)], n);
        }
    }
}

/// This VM's linear memory (memory 0) in bytes: pages of 64 KiB.
#[cfg(target_arch = "wasm32")]
fn linear_memory_bytes() -> Option<u64> {
    let pages = u64::try_from(core::arch::wasm32::memory_size(0)).ok()?;
    pages.checked_mul(65_536)
}

#[cfg(not(target_arch = "wasm32"))]
fn linear_memory_bytes() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_key_is_only_itself() {
        let one = StatKey {
            metric: "m",
            labels: &[("alias", "a"), ("backend", "b")],
        };
        let same = StatKey {
            metric: "m",
            labels: &[("alias", "a"), ("backend", "b")],
        };
        // The same bytes run together differently: the length prefixes keep them apart.
        let run_together = StatKey {
            metric: "m",
            labels: &[("alias", "ab"), ("backend", "")],
        };
        let fewer = StatKey {
            metric: "m",
            labels: &[("alias", "a")],
        };
        let stored = one.bytes();
        assert!(same.is(&stored));
        assert_eq!(one.hash(), same.hash());
        for other in [&run_together, &fewer] {
            assert!(!other.is(&stored));
            assert!(!one.is(&other.bytes()));
        }
        assert_eq!(one.name(), names::labelled("m", &[("alias", "a"), ("backend", "b")]));
    }
}
