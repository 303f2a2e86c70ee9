//! `make bench-routing`: routing quality of llmroute against the peer routers and the oracle, in front of emulated
//! engines with a cost model.
//!
//! Per repeat, per workload, per policy, the bench starts a fresh fleet of emulated engines (cold prefix caches,
//! [`crate::emulator::cost`] on) and a fresh system in front of it, replays the workload's trace through it, and
//! reads back:
//! - the prefix-cache hit rate the engines report (cached ÷ prompt tokens, summed over the engines), next to the
//!   trace's oracle hit rate (infinite cache, perfect routing; on the tenants workloads, whose engines' slots each
//!   remember only their last prompt, the best the fleet's slots allow: [`Settings::oracle_hit_rate`]);
//! - TTFT p50 and p99, measured at the client;
//! - the busiest engine's request count ÷ the mean.
//!
//! Figures are medians over the repeats. Then it measures how many keys move when a host is added or removed
//! ([`movement`]), checks the goals ([`goals`]) and writes `bench/ROUTING.md` ([`report`]) and
//! `bench/routing.png` ([`plot`]).
//!
//! With replicated policies ([`policy::Policy::Replicas`]) it also reads which engine answered each request and
//! reports, per run, how many were served off their key's first host ([`agreement`]).
//!
//! - [`workload`]: the seeded traces and their oracle; [`policy`]: the systems; [`replay`]: the client.

pub mod agreement;
pub mod cli;
pub mod goals;
pub mod movement;
pub mod plot;
pub mod policy;
pub mod replay;
pub mod report;
pub mod workload;

use std::time::{Duration, Instant};

use crate::bench::overhead::progress;
use crate::bench::procstat;
use crate::bench::stats::{median_of, percentile};
use crate::emulator::cost::CostModel;
use crate::fleet::Fleet;

use movement::Movement;
use policy::{Policy, Running};
use replay::Sample;
use workload::{Shape, Trace, Workload};

/// What to run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub shape: Shape,
    pub seed: u64,
    pub repeats: usize,
    /// Engines in each fleet.
    pub engines: usize,
    /// The engines' cost model; the tenants workloads change it ([`Settings::cost_for`]).
    pub cost: CostModel,
    /// Prefix-cache capacity of each engine, in blocks of 16 tokens.
    pub cache_blocks: usize,
    pub workloads: Vec<Workload>,
    pub policies: Vec<Policy>,
    /// Keys replayed to measure movement; 0 skips it.
    pub movement_keys: usize,
    /// One fleet per repeat and workload, shared by every policy and reset (cold caches, zero counters) before
    /// each, instead of a fresh fleet per policy: every policy then sees the same engine ports, so the same host
    /// order for placement and the same ring, and their difference is the policies'.
    pub same_fleet: bool,
    pub quick: bool,
}

impl Settings {
    /// The default run: every workload and policy, 2 repeats, about 8 minutes on 2 cores.
    pub fn full(seed: u64) -> Settings {
        let shape = Shape::full();
        Settings {
            cache_blocks: shape.cache_blocks(),
            shape,
            seed,
            repeats: 2,
            engines: 3,
            cost: CostModel {
                prefill_ms_per_token: 0.05,
                decode_ms_per_token: 2.0,
                slots: 2,
                slot_cache: false,
            },
            workloads: Workload::ALL.to_vec(),
            policies: Policy::ALL.to_vec(),
            movement_keys: 240,
            same_fleet: false,
            quick: false,
        }
    }

    /// A sanity run: small traces, one repeat, about 2 minutes.
    pub fn quick(seed: u64) -> Settings {
        let shape = Shape::quick();
        Settings {
            cache_blocks: shape.cache_blocks(),
            shape,
            repeats: 1,
            movement_keys: 60,
            quick: true,
            ..Settings::full(seed)
        }
    }

    /// The engines' cost model for workload `w`: on the tenants workloads, `shape.tenant_slots` slots that each
    /// remember only the last prompt they served (`slot_cache`); elsewhere `cost`, with its shared LRU cache.
    pub fn cost_for(&self, w: Workload) -> CostModel {
        if w.slot_cache() {
            CostModel {
                slots: self.shape.tenant_slots,
                slot_cache: true,
                ..self.cost.clone()
            }
        } else {
            self.cost.clone()
        }
    }

    /// The oracle hit rate of `trace` on this bench's fleet: on engines with per-slot caches, the best that the
    /// fleet's slots allow ([`Trace::slot_oracle_hit_rate`] over engines × slots); otherwise the infinite cache's
    /// ([`Trace::oracle_hit_rate`]).
    pub fn oracle_hit_rate(&self, trace: &Trace) -> f64 {
        let cost = self.cost_for(trace.workload);
        if cost.slot_cache {
            trace.slot_oracle_hit_rate(self.engines * cost.slots)
        } else {
            trace.oracle_hit_rate()
        }
    }
}

impl Settings {
    /// On engines with per-slot caches, what LRU over the fleet's slots keeps warm behind a perfect router
    /// ([`Trace::slot_lru_hit_rate`]): the ceiling of a placement that cannot see the future. `None` elsewhere.
    pub fn online_ceiling(&self, trace: &Trace) -> Option<f64> {
        let cost = self.cost_for(trace.workload);
        cost.slot_cache
            .then(|| trace.slot_lru_hit_rate(self.engines * cost.slots))
    }
}

/// One replay of one workload through one policy.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// Engine-reported cached ÷ prompt tokens, over the whole fleet.
    pub hit_rate: Option<f64>,
    /// The same from the usage the client received, as a cross-check.
    pub client_hit_rate: Option<f64>,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    /// TTFT inside the engines (slot wait + prefill, from the cost model): what routing alone decides.
    pub engine_ttft_p50_ms: Option<f64>,
    pub engine_ttft_p99_ms: Option<f64>,
    /// First content delta to the end of the stream, p50, at the client. The engines spread the tokens over
    /// (output tokens − 1) × the decode time; a proxy that holds them back delivers them at once.
    pub spread_p50_ms: Option<f64>,
    /// Requests each engine served.
    pub per_engine: Vec<u64>,
    pub ok: usize,
    pub errors: usize,
    pub first_error: Option<String>,
    /// Mean wait for an engine slot, over all requests.
    pub queue_wait_ms: Option<f64>,
    /// Share of requests served by another engine than their key's first request ([`agreement::off_home`]).
    pub off_home: Option<f64>,
    /// With a placement store: what the replicas' new keys met in etcd.
    pub store: Option<policy::StoreCounts>,
    /// From the first request to the last answer.
    pub elapsed: Duration,
}

impl Run {
    /// The busiest engine's request count ÷ the mean.
    pub fn busiest_over_mean(&self) -> Option<f64> {
        let total: u64 = self.per_engine.iter().sum();
        let max = *self.per_engine.iter().max()?;
        (total > 0).then(|| max as f64 * self.per_engine.len() as f64 / total as f64)
    }
}

/// Every repeat of one workload through one policy.
#[derive(Debug, Clone)]
pub struct Cell {
    pub workload: Workload,
    pub policy: Policy,
    pub runs: Vec<Run>,
}

impl Cell {
    fn median(&self, f: impl Fn(&Run) -> Option<f64>) -> Option<f64> {
        median_of(self.runs.iter().map(f))
    }

    pub fn hit_rate(&self) -> Option<f64> {
        self.median(|r| r.hit_rate)
    }

    /// The lowest and highest of `f` over the repeats.
    fn range(&self, f: impl Fn(&Run) -> Option<f64>) -> Option<(f64, f64)> {
        let v: Vec<f64> = self.runs.iter().filter_map(f).collect();
        let lo = v.iter().copied().reduce(f64::min)?;
        Some((lo, v.iter().copied().fold(lo, f64::max)))
    }

    /// The lowest and highest hit rate over the repeats.
    pub fn hit_range(&self) -> Option<(f64, f64)> {
        self.range(|r| r.hit_rate)
    }

    pub fn client_hit_rate(&self) -> Option<f64> {
        self.median(|r| r.client_hit_rate)
    }

    pub fn ttft_p50_ms(&self) -> Option<f64> {
        self.median(|r| r.ttft_p50_ms)
    }

    pub fn ttft_p99_ms(&self) -> Option<f64> {
        self.median(|r| r.ttft_p99_ms)
    }

    pub fn engine_ttft_p50_ms(&self) -> Option<f64> {
        self.median(|r| r.engine_ttft_p50_ms)
    }

    pub fn engine_ttft_p99_ms(&self) -> Option<f64> {
        self.median(|r| r.engine_ttft_p99_ms)
    }

    pub fn spread_p50_ms(&self) -> Option<f64> {
        self.median(|r| r.spread_p50_ms)
    }

    pub fn busiest_over_mean(&self) -> Option<f64> {
        self.median(Run::busiest_over_mean)
    }

    pub fn queue_wait_ms(&self) -> Option<f64> {
        self.median(|r| r.queue_wait_ms)
    }

    pub fn off_home(&self) -> Option<f64> {
        self.median(|r| r.off_home)
    }

    /// The lowest and highest share off home over the repeats.
    pub fn off_home_range(&self) -> Option<(f64, f64)> {
        self.range(|r| r.off_home)
    }

    /// Store fallbacks summed over the repeats, and the keys stored; `None` without a store.
    pub fn store(&self) -> Option<policy::StoreCounts> {
        self.runs.iter().filter_map(|r| r.store).reduce(|a, b| a + b)
    }

    /// Errors over all repeats, and the first message.
    pub fn errors(&self) -> (usize, Option<&str>) {
        let n = self.runs.iter().map(|r| r.errors).sum();
        (n, self.runs.iter().find_map(|r| r.first_error.as_deref()))
    }
}

/// A policy that could not be measured, and why.
#[derive(Debug, Clone)]
pub struct Missing {
    pub policy: Policy,
    pub reason: String,
}

/// A trace's shape and oracle, for the report.
#[derive(Debug, Clone)]
pub struct TraceInfo {
    pub workload: Workload,
    pub requests: usize,
    pub keys: usize,
    pub prompt_tokens: u64,
    /// The ceiling on this fleet ([`Settings::oracle_hit_rate`]).
    pub oracle: f64,
    /// An infinite cache behind perfect routing: the same as `oracle` unless the engines have per-slot caches.
    pub unbounded_oracle: f64,
    /// On engines with per-slot caches, the same slots behind a perfect router that cannot see the future
    /// ([`Trace::slot_lru_hit_rate`]); `None` elsewhere.
    pub online_ceiling: Option<f64>,
    /// Distinct prefix-cache blocks in the trace.
    pub distinct_blocks: usize,
    pub summary: String,
}

/// Everything the run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub settings: Settings,
    pub traces: Vec<TraceInfo>,
    pub cells: Vec<Cell>,
    pub missing: Vec<Missing>,
    pub movement: Vec<Movement>,
    pub elapsed: Duration,
    pub load_before: Option<String>,
    pub load_after: Option<String>,
}

impl Outcome {
    pub fn cell(&self, workload: Workload, policy: Policy) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.workload == workload && c.policy == policy && !c.runs.is_empty())
    }

    pub fn trace(&self, workload: Workload) -> Option<&TraceInfo> {
        self.traces.iter().find(|t| t.workload == workload)
    }

    /// The policies that produced figures, in the settings' order.
    pub fn measured_policies(&self) -> Vec<Policy> {
        let s = &self.settings;
        s.policies
            .iter()
            .copied()
            .filter(|&p| s.workloads.iter().any(|&w| self.cell(w, p).is_some()))
            .collect()
    }
}

/// Runs the whole bench, printing progress lines.
pub async fn run(settings: Settings) -> Result<Outcome, String> {
    let started = Instant::now();
    let load_before = procstat::load_average();
    let traces: Vec<Trace> = settings
        .workloads
        .iter()
        .map(|&w| Trace::generate(w, &settings.shape, settings.seed))
        .collect();
    for t in &traces {
        let oracle = settings.oracle_hit_rate(t);
        let unbounded = t.oracle_hit_rate();
        let unbounded = if (unbounded - oracle).abs() > 5e-4 {
            format!(" (infinite cache: {unbounded:.3})")
        } else {
            String::new()
        };
        progress(
            Some(started),
            &format!(
                "{:<13} {} requests, {} keys, {} prompt tokens, oracle hit rate {oracle:.3}{unbounded}",
                t.workload.id(),
                t.requests,
                t.keys,
                t.prompt_tokens,
            ),
        );
    }
    let client = replay::client().map_err(|e| format!("building the HTTP client: {e}"))?;
    let mut cells: Vec<Cell> = Vec::new();
    let mut missing: Vec<Missing> = Vec::new();
    let n = settings.policies.len();
    for repeat in 0..settings.repeats {
        for trace in &traces {
            let shared = match settings.same_fleet {
                true => Some(cost_fleet(&settings, trace.workload).await?),
                false => None,
            };
            // Rotate the policy order per repeat, so slow drift of the machine hits every policy alike.
            for policy in (0..n).map(|i| settings.policies[(i + repeat) % n]) {
                if missing.iter().any(|m| m.policy == policy) {
                    continue;
                }
                let tag = format!(
                    "repeat {}/{} {:<13} {:<22}",
                    repeat + 1,
                    settings.repeats,
                    trace.workload.id(),
                    policy.label()
                );
                match run_one(&settings, policy, trace, &client, shared.as_ref()).await {
                    Ok(run) => {
                        let oracle = settings.oracle_hit_rate(trace);
                        progress(Some(started), &format!("{tag} {}", line(&run, oracle)));
                        let at = cells
                            .iter()
                            .position(|c| c.workload == trace.workload && c.policy == policy);
                        let at = at.unwrap_or_else(|| {
                            cells.push(Cell {
                                workload: trace.workload,
                                policy,
                                runs: Vec::new(),
                            });
                            cells.len() - 1
                        });
                        cells[at].runs.push(run);
                    }
                    Err(reason) if policy.peer().is_some() => {
                        progress(Some(started), &format!("{tag} MISSING from this run: {reason}"));
                        missing.push(Missing { policy, reason });
                    }
                    Err(reason) => return Err(format!("{}: {reason}", policy.label())),
                }
            }
        }
    }
    let movement = if settings.movement_keys > 0 {
        movement::measure(&settings, &missing, started).await?
    } else {
        Vec::new()
    };
    Ok(Outcome {
        traces: traces
            .iter()
            .map(|t| TraceInfo {
                workload: t.workload,
                requests: t.requests,
                keys: t.keys,
                prompt_tokens: t.prompt_tokens,
                oracle: settings.oracle_hit_rate(t),
                unbounded_oracle: t.oracle_hit_rate(),
                online_ceiling: settings.online_ceiling(t),
                distinct_blocks: t.distinct_blocks,
                summary: t.summary.clone(),
            })
            .collect(),
        settings,
        cells,
        missing,
        movement,
        elapsed: started.elapsed(),
        load_before,
        load_after: procstat::load_average(),
    })
}

/// A fleet of `settings.engines` emulated engines with the cost model of workload `w` on.
pub async fn cost_fleet(settings: &Settings, w: Workload) -> Result<Fleet, String> {
    let (cost, blocks) = (settings.cost_for(w), settings.cache_blocks);
    Fleet::start_with("engine", settings.engines, |o| {
        o.cost = Some(cost.clone());
        o.cache_blocks = blocks;
        o.total_slots = cost.slots as u32;
    })
    .await
    .map_err(|e| format!("starting the engines: {e}"))
}

/// One replay on a fresh system, in front of `shared` (reset) or a fresh fleet.
async fn run_one(
    settings: &Settings,
    policy: Policy,
    trace: &Trace,
    client: &reqwest::Client,
    shared: Option<&Fleet>,
) -> Result<Run, String> {
    let own = match shared {
        Some(_) => None,
        None => Some(cost_fleet(settings, trace.workload).await?),
    };
    let fleet = shared.or(own.as_ref()).ok_or("no fleet")?;
    let slots = settings.cost_for(trace.workload).slots;
    let system = Running::start(policy, &fleet.endpoints(), slots).await?;
    // The readiness probes went through the engines: forget them, and start from cold caches.
    fleet.reset();
    let start = Instant::now();
    let samples = replay::replay(client, &system.urls, trace, policy.sends_session(), settings.seed).await;
    let elapsed = start.elapsed();
    let store = system.store_counts().await;
    drop(system);
    let stats: Vec<_> = fleet.engines.iter().filter_map(|e| e.cost_stats()).collect();
    Ok(Run {
        off_home: agreement::off_home(&samples),
        store,
        ..summarize(&samples, &stats, elapsed)
    })
}

/// The figures of one replay, from the client's samples and the engines' counters.
pub fn summarize(samples: &[Sample], engines: &[crate::emulator::cost::EngineStats], elapsed: Duration) -> Run {
    let client_ttfts = micros(samples.iter().filter(|s| s.error.is_none()).filter_map(|s| s.ttft));
    let engine_ttfts = micros(engines.iter().flat_map(|e| e.ttfts.iter().copied()));
    let spreads = micros(
        samples
            .iter()
            .filter(|s| s.error.is_none())
            .filter_map(|s| Some(s.total?.saturating_sub(s.ttft?))),
    );
    let ms = |v: &[u32], q| percentile(v, q).map(|us| f64::from(us) / 1000.0);
    let prompt: u64 = engines.iter().map(|e| e.prompt_tokens).sum();
    let cached: u64 = engines.iter().map(|e| e.cached_tokens).sum();
    let requests: u64 = engines.iter().map(|e| e.requests).sum();
    let waited: Duration = engines.iter().map(|e| e.queue_wait_total).sum();
    let client_prompt: u64 = samples.iter().filter_map(|s| s.prompt_tokens).sum();
    let client_cached: u64 = samples.iter().filter_map(|s| s.cached_tokens).sum();
    let errors: Vec<&Sample> = samples.iter().filter(|s| s.error.is_some()).collect();
    Run {
        hit_rate: (prompt > 0).then(|| cached as f64 / prompt as f64),
        client_hit_rate: (client_prompt > 0).then(|| client_cached as f64 / client_prompt as f64),
        ttft_p50_ms: ms(&client_ttfts, 0.50),
        ttft_p99_ms: ms(&client_ttfts, 0.99),
        engine_ttft_p50_ms: ms(&engine_ttfts, 0.50),
        engine_ttft_p99_ms: ms(&engine_ttfts, 0.99),
        spread_p50_ms: ms(&spreads, 0.50),
        per_engine: engines.iter().map(|e| e.requests).collect(),
        ok: samples.len() - errors.len(),
        errors: errors.len(),
        first_error: errors.first().and_then(|s| s.error.clone()),
        queue_wait_ms: (requests > 0).then(|| waited.as_secs_f64() * 1000.0 / requests as f64),
        off_home: None,
        store: None,
        elapsed,
    }
}

/// Durations in µs, sorted.
fn micros(durations: impl Iterator<Item = Duration>) -> Vec<u32> {
    let mut v: Vec<u32> = durations
        .map(|d| d.as_micros().min(u128::from(u32::MAX)) as u32)
        .collect();
    v.sort_unstable();
    v
}

/// A progress line for one replay.
fn line(run: &Run, oracle: f64) -> String {
    let f = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
    let errors = match (&run.first_error, run.errors) {
        (Some(e), n) => format!("  {n} errors, first: {e}"),
        _ => String::new(),
    };
    let store = run.store.map_or(String::new(), |s| {
        format!(
            "  store: {} stored, {} fallbacks ({} timeouts, {} errors, {} not sent)",
            s.stored, s.fallbacks, s.timeouts, s.errors, s.not_sent
        )
    });
    format!(
        "hit {} (oracle {:.3})  ttft p50 {} p99 {} ms (engine {} / {})  busiest/mean {}  off home {}  per engine {:?}  {:.1} s{store}{errors}",
        f(run.hit_rate, 3),
        oracle,
        f(run.ttft_p50_ms, 1),
        f(run.ttft_p99_ms, 1),
        f(run.engine_ttft_p50_ms, 1),
        f(run.engine_ttft_p99_ms, 1),
        f(run.busiest_over_mean(), 2),
        f(run.off_home.map(|v| 100.0 * v), 1) + "%",
        run.per_engine,
        run.elapsed.as_secs_f64()
    )
}

#[cfg(test)]
pub(crate) mod sample {
    //! A small made-up outcome for the report, goals and plot tests.
    use super::movement::{Movement, Shift};
    use super::*;

    pub fn run(hit: f64, p50: f64, counts: [u64; 3]) -> Run {
        Run {
            hit_rate: Some(hit),
            client_hit_rate: Some(hit),
            ttft_p50_ms: Some(p50),
            ttft_p99_ms: Some(p50 * 4.0),
            engine_ttft_p50_ms: Some(p50 * 0.9),
            engine_ttft_p99_ms: Some(p50 * 3.5),
            spread_p50_ms: Some(6.0),
            per_engine: counts.to_vec(),
            ok: counts.iter().sum::<u64>() as usize,
            errors: 0,
            first_error: None,
            queue_wait_ms: Some(1.0),
            off_home: Some(0.0),
            store: None,
            elapsed: Duration::from_secs(5),
        }
    }

    pub fn outcome() -> Outcome {
        let mut settings = Settings::quick(7);
        settings.policies = vec![
            Policy::Chwbl(125),
            Policy::LeastRequest,
            Policy::SglangCacheAware,
            Policy::VllmConsistentHash,
        ];
        let mut cells = Vec::new();
        for &w in &settings.workloads {
            let sharing = if w.shares_prefixes() { 1.0 } else { 0.0 };
            for (p, hit, p50, counts) in [
                (Policy::Chwbl(125), 0.75, 8.0, [40, 30, 30]),
                (Policy::LeastRequest, 0.3, 20.0, [34, 33, 33]),
                (Policy::SglangCacheAware, 0.7, 9.0, [60, 20, 20]),
            ] {
                cells.push(Cell {
                    workload: w,
                    policy: p,
                    runs: vec![run(hit * sharing, p50, counts)],
                });
            }
        }
        let traces = settings
            .workloads
            .iter()
            .map(|&w| TraceInfo {
                workload: w,
                requests: 100,
                keys: 10,
                prompt_tokens: 10_000,
                oracle: if w.shares_prefixes() { 0.8 } else { 0.0 },
                unbounded_oracle: if w.shares_prefixes() { 0.9 } else { 0.0 },
                online_ceiling: w.slot_cache().then_some(0.4),
                distinct_blocks: 2000,
                summary: "made up".into(),
            })
            .collect();
        Outcome {
            settings,
            traces,
            cells,
            missing: vec![Missing {
                policy: Policy::VllmConsistentHash,
                reason: "not installed".into(),
            }],
            movement: vec![Movement {
                system: "llmroute chwbl 175".into(),
                keys: 60,
                added: Some(Shift {
                    moved: 0.26,
                    ideal: 0.25,
                    needless: 0.0,
                }),
                removed: Some(Shift {
                    moved: 0.33,
                    ideal: 0.33,
                    needless: 0.0,
                }),
                error: None,
            }],
            elapsed: Duration::from_secs(100),
            load_before: Some("1.0 1.0 1.0".into()),
            load_after: None,
        }
    }

    #[test]
    fn medians_and_balance() {
        let o = outcome();
        let c = o.cell(Workload::SharedPrefix, Policy::SglangCacheAware).unwrap();
        assert_eq!(c.hit_rate(), Some(0.7));
        assert!((c.busiest_over_mean().unwrap() - 1.8).abs() < 1e-9);
        assert_eq!(
            o.cell(Workload::SharedPrefix, Policy::VllmConsistentHash)
                .map(|c| c.policy),
            None
        );
        assert_eq!(
            o.measured_policies(),
            [Policy::Chwbl(125), Policy::LeastRequest, Policy::SglangCacheAware]
        );
    }

    #[test]
    fn tenants_workloads_get_per_slot_caches_and_a_slot_bound_oracle() {
        let s = Settings::full(42);
        assert_eq!(s.cost_for(Workload::Zipf), s.cost);
        let tenants = s.cost_for(Workload::Tenants12);
        assert!(tenants.slot_cache && !s.cost.slot_cache);
        assert_eq!((tenants.slots, s.engines), (2, 3));
        let zipf = Trace::generate(Workload::Zipf, &s.shape, 42);
        assert_eq!(s.oracle_hit_rate(&zipf), zipf.oracle_hit_rate());
        // 6 tenants in 6 slots: every tenant's first request is cold, as with an infinite cache. 12 tenants: less.
        let six = Trace::generate(Workload::Tenants6, &s.shape, 42);
        assert_eq!(s.oracle_hit_rate(&six), six.oracle_hit_rate());
        let twelve = Trace::generate(Workload::Tenants12, &s.shape, 42);
        assert!(s.oracle_hit_rate(&twelve) < twelve.oracle_hit_rate() - 0.1);
    }

    #[test]
    fn summarize_reads_engines_and_samples() {
        use crate::emulator::cost::EngineStats;
        let ms = Duration::from_millis;
        let samples: Vec<Sample> = (1..=100)
            .map(|i| Sample {
                ttft: Some(ms(i)),
                total: Some(ms(i + 6)),
                prompt_tokens: Some(100),
                cached_tokens: Some(50),
                ..Sample::default()
            })
            .chain([Sample {
                error: Some("boom".into()),
                ..Sample::default()
            }])
            .collect();
        let engine = |requests, cached| EngineStats {
            requests,
            prompt_tokens: requests * 100,
            cached_tokens: cached,
            queue_wait_total: ms(requests * 2),
            ttfts: (0..requests).map(ms).collect(),
            ..EngineStats::default()
        };
        let run = summarize(&samples, &[engine(60, 3000), engine(40, 2000)], ms(10));
        assert_eq!(run.hit_rate, Some(0.5));
        assert_eq!(run.client_hit_rate, Some(0.5));
        assert_eq!(run.ttft_p50_ms, Some(50.0));
        assert_eq!(run.ttft_p99_ms, Some(99.0));
        assert_eq!(run.engine_ttft_p50_ms, Some(24.0));
        assert_eq!(run.spread_p50_ms, Some(6.0));
        assert_eq!((run.ok, run.errors), (100, 1));
        assert_eq!(run.first_error.as_deref(), Some("boom"));
        assert_eq!(run.busiest_over_mean(), Some(1.2));
        assert_eq!(run.queue_wait_ms, Some(2.0));
    }
}
