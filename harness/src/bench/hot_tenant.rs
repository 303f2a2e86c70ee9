//! The hot-tenant workload of `make bench-engines`: does one tenant that floods the fleet starve the others?
//!
//! One tenant (tenant 0, "hot") sends half of all requests, in bursts of [`HotSettings::burst_size`] at once, each
//! with a long prompt: its system prompt and a long document of its own, so most of it must be prefilled. Five
//! quiet tenants send the other half, spread evenly over the run with seeded jitter, each with a short system prompt
//! of its own and a short question. The arrivals are open loop ([`run_timed`]): a slow answer holds back no later
//! request, as with real clients. Every request carries the tenant's name in [`TENANT_HEADER`], which only the
//! fair queue reads.
//!
//! Each run starts a fresh fleet of three `llama-server`s (as the shared-prompt workload: [`SLOTS`] slots each, no
//! host-RAM prompt cache) and a fresh router; the systems take turns within each round. The report pools every
//! run's requests per system and gives, per tenant and for the quiet tenants together, TTFT p50 and p99 (client
//! side, to the first content delta), the engines' cache-hit ratio (median over runs), and the refusals: every
//! answer that was not a complete stream, and among them those that came back before [`MAX_WAIT_MS`], the longest
//! the fair queue lets a request wait.
//!
//! Goals, printed met or missed with their figures for each llmroute row that reads the engines' load ([`goals`]):
//! the quiet tenants' TTFT p99 is at most half the best peer's (the routers that read neither load nor tenants,
//! [`is_peer`]); the cache hit is within 0.02 of the best row's; no request is refused before it has waited
//! [`MAX_WAIT_MS`].
//!
//! Beside them: the quiet tenants' p99 without each one's first request of a run (a cold prefill whatever the
//! router does), the filter's placement decisions by reason, and control rows with the quiet tenants alone
//! ([`ALONE`]), the floor the flooded rows are read against.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::engines::{
    engine_prompt_tokens, fmt, llama_version, tenant_order, Router, SystemKind, ALIAS, MAX_WAIT_MS, SLOTS,
    TENANT_HEADER,
};
use super::machine::Machine;
use super::stats::{median, quantile};
use crate::llama::workload::{chat_body, client, prompt_text, run_timed, tenant_system_prompt, ChatOutcome, Job};
use crate::llama::LlamaFleet;

const BACKEND: &str = "llama";

/// The systems of a default run: llmroute without and with load and fairness, Envoy's own balancers behind the
/// filter, and the peer routers' load-aware and affinity policies.
pub const SYSTEMS: [SystemKind; 9] = [
    SystemKind::LlmrouteBoundedKeys,
    SystemKind::LlmrouteLoad,
    SystemKind::LlmrouteLoadFairness,
    SystemKind::LlmrouteLoadFairnessAtSlots,
    SystemKind::LlmrouteLoadFairnessPerHost,
    SystemKind::LlmrouteChwbl,
    SystemKind::LlmrouteLeastRequest,
    SystemKind::SglangCacheAware,
    SystemKind::VllmConsistentHash,
];

/// The systems also run with the quiet tenants alone: llmroute reading the engines' load, and the best peer of the
/// runs so far.
pub const ALONE: [SystemKind; 2] = [SystemKind::LlmrouteLoad, SystemKind::SglangCacheAware];

/// The systems the goals compare with: every router that reads neither the engines' load nor tenants
/// (llmroute's own rows with load are shown, not compared with).
pub fn is_peer(kind: SystemKind) -> bool {
    !SystemKind::HOT.contains(&kind)
}

/// What to run.
#[derive(Debug, Clone)]
pub struct HotSettings {
    pub quiet_tenants: usize,
    pub bursts: usize,
    /// Requests of the hot tenant sent at once, per burst.
    pub burst_size: usize,
    pub burst_every: Duration,
    /// Words of the hot tenant's system prompt and of each of its documents (about 1.08 tokens a word).
    pub hot_system_words: usize,
    pub hot_doc_words: usize,
    /// Words of each quiet tenant's system prompt.
    pub quiet_system_words: usize,
    pub max_tokens: u32,
    pub runs: usize,
    pub seed: u64,
    pub servers: usize,
    pub systems: Vec<SystemKind>,
    /// Systems also run with the quiet tenants alone, the hot tenant's requests left out: what the quiet tenants'
    /// TTFT is on this machine and fleet with nobody flooding it, the floor no router can go under.
    pub alone: Vec<SystemKind>,
}

impl HotSettings {
    /// 3 bursts of 16 long requests 8 s apart, and 48 quiet requests over the same 24 s; 3 runs of 9 systems
    /// (about 25 s a run here, with the two rows of quiet tenants alone about 14 min).
    pub fn full(seed: u64) -> Self {
        HotSettings {
            quiet_tenants: 5,
            bursts: 3,
            burst_size: 16,
            burst_every: Duration::from_secs(8),
            hot_system_words: 920,
            hot_doc_words: 1500,
            quiet_system_words: 300,
            max_tokens: 8,
            runs: 3,
            seed,
            servers: 3,
            systems: SYSTEMS.to_vec(),
            alone: ALONE.to_vec(),
        }
    }

    /// One run of each system: a sanity check.
    pub fn quick(seed: u64) -> Self {
        HotSettings {
            runs: 1,
            ..HotSettings::full(seed)
        }
    }

    /// Requests per run: the hot tenant's and as many quiet ones.
    pub fn requests(&self) -> usize {
        2 * self.bursts * self.burst_size
    }
}

/// One request of the schedule: when it is sent (from the start of the run) and whose it is (0 is the hot tenant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub at: Duration,
    pub tenant: usize,
}

/// The run's arrivals in time order: the hot tenant's bursts at `0, every, 2 × every, ...`, and as many quiet
/// requests spread evenly over `bursts × every`, each moved by up to half its spacing (seeded), their tenants a
/// seeded shuffle with each quiet tenant equally often (±1).
pub fn schedule(s: &HotSettings) -> Vec<Arrival> {
    let hot = s.bursts * s.burst_size;
    let span = s.burst_every.saturating_mul(s.bursts as u32);
    let gap = span.checked_div(hot.max(1) as u32).unwrap_or_default();
    let mut out: Vec<Arrival> = (0..hot)
        .map(|i| Arrival {
            at: s.burst_every.saturating_mul((i / s.burst_size.max(1)) as u32),
            tenant: 0,
        })
        .collect();
    let tenants = tenant_order(s.quiet_tenants.max(1), hot, s.seed);
    let mut x = s.seed.wrapping_mul(0xa076_1d64_78bd_642f) | 1;
    for (i, t) in tenants.into_iter().enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Jitter in [-gap/2, +gap/2), in microseconds.
        let gap_us = gap.as_micros().max(1) as u64;
        let jitter = (x % gap_us) as i64 - (gap_us / 2) as i64;
        let base = gap.saturating_mul(i as u32).as_micros() as i64 + (gap_us / 2) as i64;
        out.push(Arrival {
            at: Duration::from_micros((base + jitter).max(0) as u64),
            tenant: 1 + t,
        });
    }
    out.sort_by_key(|a| a.at);
    out
}

/// One complete answer: whose, its TTFT, and whether it was its tenant's first request of the run (its system
/// prompt then is in no engine's cache, whatever the router does: a cold prefill).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answer {
    pub tenant: usize,
    pub ms: f64,
    pub first: bool,
    /// The engine served at least half of the prompt from its cache (`usage.prompt_tokens_details.cached_tokens`):
    /// its prefix was still in the slot it landed on.
    pub cached: bool,
}

/// One run's figures.
#[derive(Debug, Clone, Default)]
pub struct HotRun {
    /// Every complete answer.
    pub ttft_ms: Vec<Answer>,
    /// Engine-reported cached ÷ (prefilled + cached), from the servers' `/metrics`.
    pub cache_hit: f64,
    pub requests: usize,
    /// Answers that were not a complete stream.
    pub failed: usize,
    /// Of those, the ones that came back before [`MAX_WAIT_MS`].
    pub failed_early: usize,
    pub wall_s: f64,
    pub first_error: Option<String>,
    /// The filter's placement decisions by reason (`llmroute_placements_total`); empty for a peer router.
    pub placements: Vec<(&'static str, u64)>,
}

impl HotRun {
    fn of(outcomes: &[ChatOutcome], arrivals: &[Arrival], prefilled: u64, cached: u64, wall_s: f64) -> HotRun {
        let mut run = HotRun {
            requests: outcomes.len(),
            wall_s,
            cache_hit: if prefilled + cached == 0 {
                0.0
            } else {
                cached as f64 / (prefilled + cached) as f64
            },
            ..HotRun::default()
        };
        let mut seen = std::collections::HashSet::new();
        for (o, a) in outcomes.iter().zip(arrivals) {
            let first = seen.insert(a.tenant);
            match (o.ok, o.ttft) {
                (true, Some(t)) => run.ttft_ms.push(Answer {
                    tenant: a.tenant,
                    ms: t.as_secs_f64() * 1000.0,
                    first,
                    cached: o.prompt_tokens > 0 && 2 * o.cached_tokens >= o.prompt_tokens,
                }),
                _ => {
                    run.failed += 1;
                    if o.total < Duration::from_millis(MAX_WAIT_MS) {
                        run.failed_early += 1;
                    }
                    if run.first_error.is_none() {
                        run.first_error = o.error.clone().or_else(|| Some("no first token".into()));
                    }
                }
            }
        }
        run
    }
}

/// A system's runs.
#[derive(Debug, Clone)]
pub struct HotResult {
    pub kind: SystemKind,
    /// Run with the quiet tenants alone ([`HotSettings::alone`]).
    pub alone: bool,
    pub runs: Vec<HotRun>,
    /// Why it could not run, when it could not.
    pub missing: Option<String>,
}

impl HotResult {
    fn new(kind: SystemKind, alone: bool) -> HotResult {
        HotResult {
            kind,
            alone,
            runs: Vec::new(),
            missing: None,
        }
    }

    /// The row's name: the system's, and whether the quiet tenants ran alone.
    pub fn name(&self) -> String {
        if self.alone {
            format!("{} (quiet tenants alone)", self.kind.name())
        } else {
            self.kind.name().to_string()
        }
    }

    /// A row the goals judge or compare with: every system with the hot tenant.
    fn flooded(&self) -> bool {
        self.missing.is_none() && !self.alone
    }

    /// TTFT `q`-quantile over every run's answers of the tenants `which` picks.
    pub fn ttft(&self, which: impl Fn(usize) -> bool, q: f64) -> Option<f64> {
        self.ttft_of(|a| which(a.tenant), q)
    }

    /// TTFT `q`-quantile over every run's answers that `which` picks.
    pub fn ttft_of(&self, which: impl Fn(&Answer) -> bool, q: f64) -> Option<f64> {
        let mut v: Vec<f64> = self
            .runs
            .iter()
            .flat_map(|r| r.ttft_ms.iter())
            .filter(|a| which(a))
            .map(|a| a.ms)
            .collect();
        v.sort_by(f64::total_cmp);
        quantile(&v, q)
    }

    pub fn quiet_p99(&self) -> Option<f64> {
        self.ttft(|t| t > 0, 0.99)
    }

    /// The quiet tenants' TTFT p99 leaving out each one's first request of a run, whose system prompt no engine
    /// holds yet whatever the router does: tells a tail of cold prefills from one of the router's choices.
    pub fn quiet_warm_p99(&self) -> Option<f64> {
        self.ttft_of(|a| a.tenant > 0 && !a.first, 0.99)
    }

    /// The quiet tenants' TTFT p99 over the answers whose prefix the engine still held: what is left once no
    /// prefill of a system prompt is in the way.
    pub fn quiet_cached_p99(&self) -> Option<f64> {
        self.ttft_of(|a| a.tenant > 0 && a.cached, 0.99)
    }

    /// The quiet answers whose prefix the engine no longer (or not yet) held, and all quiet answers.
    pub fn quiet_misses(&self) -> (usize, usize) {
        let quiet = || self.runs.iter().flat_map(|r| r.ttft_ms.iter()).filter(|a| a.tenant > 0);
        (quiet().filter(|a| !a.cached).count(), quiet().count())
    }

    /// The median TTFT of the quiet tenants' first requests: the cold prefill's cost here.
    pub fn quiet_cold_p50(&self) -> Option<f64> {
        self.ttft_of(|a| a.tenant > 0 && a.first, 0.5)
    }

    pub fn cache_hit(&self) -> Option<f64> {
        median(&self.runs.iter().map(|r| r.cache_hit).collect::<Vec<_>>())
    }

    fn sum(&self, f: impl Fn(&HotRun) -> usize) -> usize {
        self.runs.iter().map(f).sum()
    }

    /// The placement decisions of every run, by reason, in the first run's order.
    pub fn placements(&self) -> Vec<(&'static str, u64)> {
        let mut out: Vec<(&'static str, u64)> = Vec::new();
        for (reason, n) in self.runs.iter().flat_map(|r| r.placements.iter()) {
            match out.iter_mut().find(|(r, _)| r == reason) {
                Some((_, total)) => *total += n,
                None => out.push((reason, *n)),
            }
        }
        out
    }
}

/// Everything the report needs.
pub struct HotOutcome {
    pub settings: HotSettings,
    pub results: Vec<HotResult>,
    pub llama_version: String,
    pub elapsed: Duration,
}

/// Runs the workload and prints a progress line per run.
pub async fn run(settings: HotSettings) -> Result<HotOutcome, String> {
    crate::llama::check_installed()?;
    let started = Instant::now();
    let mut results: Vec<HotResult> = (settings.systems.iter().map(|&k| HotResult::new(k, false)))
        .chain(settings.alone.iter().map(|&k| HotResult::new(k, true)))
        .collect();
    for round in 0..settings.runs {
        for result in results.iter_mut().filter(|r| r.missing.is_none()) {
            match run_once(&settings, result.kind, round, result.alone).await {
                Ok(r) => {
                    let one = HotResult {
                        runs: vec![r.clone()],
                        ..HotResult::new(result.kind, result.alone)
                    };
                    eprintln!(
                        "[{:>5.0}s] hot tenant run {}/{} {:<44} quiet ttft p50 {} ms p99 {} ms (without first \
                         requests {} ms, cached {} ms, misses {}), hot p99 {} ms, cache hit {:.3}, failed {}/{}{}",
                        started.elapsed().as_secs_f64(),
                        round + 1,
                        settings.runs,
                        result.name(),
                        fmt(one.ttft(|t| t > 0, 0.5), 0),
                        fmt(one.quiet_p99(), 0),
                        fmt(one.quiet_warm_p99(), 0),
                        fmt(one.quiet_cached_p99(), 0),
                        one.quiet_misses().0,
                        fmt(one.ttft(|t| t == 0, 0.99), 0),
                        r.cache_hit,
                        r.failed,
                        r.requests,
                        r.first_error
                            .as_deref()
                            .map_or(String::new(), |e| format!(" (first: {e})")),
                    );
                    result.runs.push(r);
                }
                Err(e) => {
                    eprintln!("{} (hot tenant): cannot run: {e}", result.name());
                    result.missing = Some(e);
                }
            }
        }
    }
    Ok(HotOutcome {
        settings,
        results,
        llama_version: llama_version(),
        elapsed: started.elapsed(),
    })
}

/// The request bodies and headers of `arrivals` for `kind`: each tenant's own system prompt; the hot tenant's
/// user message a long document of its own per request and round, the quiet tenants' a short question.
fn jobs(s: &HotSettings, kind: SystemKind, arrivals: &[Arrival], round: usize) -> Vec<(Duration, Job)> {
    let systems: Vec<String> = (0..=s.quiet_tenants)
        .map(|t| match t {
            0 => tenant_system_prompt(0, s.hot_system_words),
            t => tenant_system_prompt(t, s.quiet_system_words),
        })
        .collect();
    arrivals
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let n = (round * 10_000 + i) as u64;
            let user = match a.tenant {
                0 => format!(
                    "Document {i}: {} Summarise it.",
                    prompt_text(50_000 + n, s.hot_doc_words)
                ),
                _ => format!("Question {i}: {}", prompt_text(n, 12)),
            };
            let system = systems.get(a.tenant).map_or("", String::as_str);
            let mut headers = vec![(TENANT_HEADER.to_string(), format!("tenant-{}", a.tenant))];
            headers.extend(kind.header(a.tenant));
            let job = Job {
                body: chat_body(ALIAS, system, &user, s.max_tokens),
                headers,
            };
            (a.at, job)
        })
        .collect()
}

async fn run_once(s: &HotSettings, kind: SystemKind, round: usize, alone: bool) -> Result<HotRun, String> {
    let fleet = LlamaFleet::start(BACKEND, s.servers, |_, o| o.parallel = SLOTS).await?;
    let router = Router::start(kind, &fleet).await?;
    let url = router.urls.first().ok_or("the router has no URL")?.clone();
    let arrivals: Vec<Arrival> = schedule(s).into_iter().filter(|a| !alone || a.tenant > 0).collect();
    let t0 = Instant::now();
    let outcomes = run_timed(&client(), &url, jobs(s, kind, &arrivals, round)).await;
    let wall_s = t0.elapsed().as_secs_f64();
    let (prefilled, cached) = engine_prompt_tokens(&fleet).await?;
    Ok(HotRun {
        placements: router.placements().await,
        ..HotRun::of(&outcomes, &arrivals, prefilled, cached, wall_s)
    })
}

/// One llmroute row's goals, each as `(figure, met)`; `met` is `None` when a figure is missing.
#[derive(Debug, Clone, PartialEq)]
pub struct Goals {
    pub kind: SystemKind,
    /// The quiet tenants' TTFT p99 over the best peer's, and that peer.
    pub quiet_ratio: (Option<f64>, Option<SystemKind>),
    /// The same with each quiet tenant's first request of a run left out ([`HotResult::quiet_warm_p99`]): shown
    /// beside the goal, which it does not replace.
    pub warm_ratio: (Option<f64>, Option<SystemKind>),
    /// How far the cache hit is below the best row's.
    pub hit_gap: Option<f64>,
    /// Requests refused before `max_wait_ms`.
    pub refused_early: usize,
}

impl Goals {
    pub fn quiet_met(&self) -> Option<bool> {
        self.quiet_ratio.0.map(|r| r <= 0.5)
    }

    pub fn warm_met(&self) -> Option<bool> {
        self.warm_ratio.0.map(|r| r <= 0.5)
    }

    pub fn hit_met(&self) -> Option<bool> {
        self.hit_gap.map(|g| g <= 0.02)
    }
}

/// A row's figure over the lowest peer's ([`is_peer`]), and that peer.
fn over_best_peer(
    o: &HotOutcome,
    r: &HotResult,
    f: impl Fn(&HotResult) -> Option<f64>,
) -> (Option<f64>, Option<SystemKind>) {
    let best = o
        .results
        .iter()
        .filter(|p| p.flooded() && is_peer(p.kind))
        .filter_map(|p| Some((f(p)?, p.kind)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    match (f(r), best) {
        (Some(ours), Some((best, peer))) if best > 0.0 => (Some(ours / best), Some(peer)),
        _ => (None, None),
    }
}

/// The goals of every llmroute row that reads load ([`SystemKind::HOT`]), against the best peer ([`is_peer`]) for
/// the quiet tenants' TTFT p99 and against the best row for the cache hit.
pub fn goals(o: &HotOutcome) -> Vec<Goals> {
    let ran = || o.results.iter().filter(|r| r.flooded());
    let best_hit = ran().filter_map(HotResult::cache_hit).reduce(f64::max);
    ran()
        .filter(|r| !is_peer(r.kind))
        .map(|r| Goals {
            kind: r.kind,
            quiet_ratio: over_best_peer(o, r, HotResult::quiet_p99),
            warm_ratio: over_best_peer(o, r, HotResult::quiet_warm_p99),
            hit_gap: r.cache_hit().zip(best_hit).map(|(ours, best)| best - ours),
            refused_early: r.sum(|x| x.failed_early),
        })
        .collect()
}

fn mark(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "not measured",
    }
}

/// The section of `bench/ENGINES.md` this workload owns.
pub fn markdown(o: &HotOutcome, machine: &Machine) -> String {
    let s = &o.settings;
    let mut md = String::new();
    md.push_str("## Hot tenant\n\n");
    md.push_str(&format!(
        "Written by `llmroute-bench-engines` (`make bench-engines`) on {}, in {:.0} s. One tenant sends half of the \
         requests in bursts of long prompts; {} quiet tenants send the rest, spread over the run. Every figure pools \
         the requests of {} run(s) per system (the cache hit is the median over runs); every run starts a fresh \
         fleet and router.\n\n",
        machine.date,
        o.elapsed.as_secs_f64(),
        s.quiet_tenants,
        s.runs
    ));
    md.push_str(
        "### Goals\n\nFor each llmroute row that reads the engines' load: the quiet tenants' TTFT p99 over the best \
         peer's (a router that reads neither load nor tenants; goal ≤ 0.50), the cache hit's distance below the best \
         row's (goal ≤ 0.02), and the requests refused before they had waited `max_wait_ms` (goal 0). Beside the \
         first, not in its place: the same ratio with each quiet tenant's first request of a run left out, since \
         that request's system prompt is in no engine's cache whatever the router does (its cold prefill is the \
         *quiet first request p50* column below).\n\n| system | quiet p99 ÷ best peer | without first requests | \
         cache hit below the best | refused before max_wait_ms |\n|---|---|---|---|---|\n",
    );
    for g in goals(o) {
        md.push_str(&format!(
            "| {} | {} ({}): {} | {} ({}): {} | {}: {} | {}: {} |\n",
            g.kind.name(),
            fmt(g.quiet_ratio.0, 2),
            g.quiet_ratio.1.map_or("-", SystemKind::name),
            mark(g.quiet_met()),
            fmt(g.warm_ratio.0, 2),
            g.warm_ratio.1.map_or("-", SystemKind::name),
            mark(g.warm_met()),
            fmt(g.hit_gap, 3),
            mark(g.hit_met()),
            g.refused_early,
            mark(Some(g.refused_early == 0)),
        ));
    }
    md.push_str(
        "\n### Results\n\n| system | quiet TTFT p50 ms | quiet TTFT p99 ms | without first requests p99 ms | quiet \
         first request p50 ms | cached quiet p99 ms | quiet misses | worst quiet tenant p99 ms | hot TTFT p50 ms | \
         hot TTFT p99 ms | cache hit (engines) | refused | of them before max_wait_ms | requests |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &o.results {
        if let Some(why) = &r.missing {
            let why = why.lines().next().unwrap_or("").replace('|', "/");
            md.push_str(&format!("| {} | could not run: {why} |||||||||||||\n", r.name()));
            continue;
        }
        let worst = (1..=s.quiet_tenants)
            .filter_map(|t| r.ttft(|x| x == t, 0.99))
            .reduce(f64::max);
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} of {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.name(),
            fmt(r.ttft(|t| t > 0, 0.5), 0),
            fmt(r.quiet_p99(), 0),
            fmt(r.quiet_warm_p99(), 0),
            fmt(r.quiet_cold_p50(), 0),
            fmt(r.quiet_cached_p99(), 0),
            r.quiet_misses().0,
            r.quiet_misses().1,
            fmt(worst, 0),
            fmt(r.ttft(|t| t == 0, 0.5), 0),
            fmt(r.ttft(|t| t == 0, 0.99), 0),
            fmt(r.cache_hit(), 3),
            r.sum(|x| x.failed),
            r.sum(|x| x.failed_early),
            r.sum(|x| x.requests),
        ));
    }
    md.push_str("\n### TTFT p50 / p99 ms per tenant\n\n| system | tenant-0 (hot) |");
    for t in 1..=s.quiet_tenants {
        md.push_str(&format!(" tenant-{t} |"));
    }
    md.push_str("\n|---|---|");
    md.push_str(&"---|".repeat(s.quiet_tenants));
    md.push('\n');
    for r in o.results.iter().filter(|r| r.missing.is_none()) {
        md.push_str(&format!("| {} |", r.name()));
        for t in 0..=s.quiet_tenants {
            md.push_str(&format!(
                " {} / {} |",
                fmt(r.ttft(|x| x == t, 0.5), 0),
                fmt(r.ttft(|x| x == t, 0.99), 0)
            ));
        }
        md.push('\n');
    }
    let placed: Vec<&HotResult> = o
        .results
        .iter()
        .filter(|r| r.placements().iter().any(|(_, n)| *n > 0))
        .collect();
    if let Some(first) = placed.first() {
        md.push_str(
            "\n### Placement decisions\n\nThe filter's `llmroute_placements_total` by reason, summed over the runs \
             ([placement](../docs/placement.md)): how many requests stayed on their key's host, took a new one, or \
             left it for a moment (`queued`: the engine's queue over the bound; `host_full`: around a host full of \
             others' requests).\n\n| system |",
        );
        for (reason, _) in first.placements() {
            md.push_str(&format!(" {reason} |"));
        }
        md.push_str("\n|---|");
        md.push_str(&"---:|".repeat(first.placements().len()));
        md.push('\n');
        for r in &placed {
            md.push_str(&format!("| {} |", r.name()));
            for (_, n) in r.placements() {
                md.push_str(&format!(" {n} |"));
            }
            md.push('\n');
        }
    }
    md.push_str(&format!(
        "\n- **Workload**: per run, tenant-0 sends {} bursts of {} streamed chat requests at once, {} s apart, each \
         its system prompt of {} words and a document of {} words of its own (about {} prompt tokens, most of it \
         to prefill); tenant-1 to tenant-{} send {} requests over the same {} s (evenly spaced, seeded jitter, seed \
         {}), each its system prompt of {} words and a question of 12 words. `max_tokens` {}; open loop: every \
         request is sent at its time, whatever is still in flight. Every request carries `{TENANT_HEADER}: \
         tenant-N`, which only the fair queue reads.\n",
        s.bursts,
        s.burst_size,
        s.burst_every.as_secs(),
        s.hot_system_words,
        s.hot_doc_words,
        ((s.hot_system_words + s.hot_doc_words) as f64 * 1.08) as u64,
        s.quiet_tenants,
        s.bursts * s.burst_size,
        s.burst_every.as_secs() * s.bursts as u64,
        s.seed,
        s.quiet_system_words,
        s.max_tokens,
    ));
    md.push_str(&format!(
        "- **Engines and routers**: as in the tables above ({} servers × {SLOTS} slots).",
        s.servers
    ));
    for kind in s.systems.iter().filter(|k| !is_peer(**k)) {
        md.push_str(&format!(" `{}`: {}.", kind.name(), kind.key()));
    }
    md.push('\n');
    if !s.alone.is_empty() {
        md.push_str(
            "- **Quiet tenants alone**: the same run with the hot tenant's requests left out, on a fresh fleet and \
             router as every run: the quiet tenants' TTFT on this machine and fleet with nobody flooding it, the \
             floor for the rows above. These rows are neither judged nor compared with in the goals.\n",
        );
    }
    md.push_str(
        "- **Cached, misses**: an answer counts as cached when the engine reports at least half of its prompt \
         served from its cache (`usage.prompt_tokens_details.cached_tokens`); *cached quiet p99* is the quiet \
         tenants' TTFT p99 over those answers, *quiet misses* the quiet answers that were not (their tenant's \
         first request of a run, or a prefix its slot no longer held).\n",
    );
    md.push_str(
        "- **TTFT**: client-side, from sending the request to the first content delta, complete answers only. \
         **Refused**: answers that were not a complete stream (a 429 or 503, a cut stream); *before max_wait_ms* \
         counts those that came back sooner than the fair queue's longest wait.\n",
    );
    md.push_str(&format!(
        "- Machine: {} CPUs ({}), shared with other work: compare the systems with each other; llama-server {}.\n",
        machine.nproc, machine.cpu_model, o.llama_version
    ));
    md
}

/// The console summary: per system, the pooled figures as JSON.
pub fn summary(o: &HotOutcome) -> Vec<(String, Value)> {
    o.results
        .iter()
        .map(|r| {
            (
                format!("{}, hot tenant", r.name()),
                json!({
                    "quiet_ttft_p50_ms": r.ttft(|t| t > 0, 0.5),
                    "quiet_ttft_p99_ms": r.quiet_p99(),
                    "quiet_ttft_p99_without_first_ms": r.quiet_warm_p99(),
                    "quiet_first_request_ttft_p50_ms": r.quiet_cold_p50(),
                    "quiet_cached_ttft_p99_ms": r.quiet_cached_p99(),
                    "quiet_misses": r.quiet_misses().0,
                    "hot_ttft_p99_ms": r.ttft(|t| t == 0, 0.99),
                    "cache_hit": r.cache_hit(),
                    "refused": r.sum(|x| x.failed),
                    "refused_before_max_wait": r.sum(|x| x.failed_early),
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
    fn the_hot_tenant_sends_half_in_bursts_and_the_quiet_ones_spread() {
        let s = HotSettings::full(42);
        let a = schedule(&s);
        assert_eq!(a.len(), s.requests());
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at), "in time order");
        let hot: Vec<&Arrival> = a.iter().filter(|x| x.tenant == 0).collect();
        assert_eq!(hot.len(), s.requests() / 2);
        for b in 0..s.bursts {
            let at = s.burst_every * b as u32;
            assert_eq!(hot.iter().filter(|x| x.at == at).count(), s.burst_size, "burst {b}");
        }
        let span = s.burst_every * s.bursts as u32;
        let quiet: Vec<&Arrival> = a.iter().filter(|x| x.tenant > 0).collect();
        assert!(quiet.iter().all(|x| x.at < span && x.tenant <= s.quiet_tenants));
        for t in 1..=s.quiet_tenants {
            let n = quiet.iter().filter(|x| x.tenant == t).count();
            let even = quiet.len() / s.quiet_tenants;
            assert!(n.abs_diff(even) <= 1, "tenant {t}: {n} requests, {even} even");
        }
        // Spread: every second of the span but the first has a quiet request in its neighbourhood.
        for sec in 0..span.as_secs() {
            let lo = Duration::from_secs(sec);
            let hi = lo + Duration::from_secs(1);
            assert!(
                quiet.iter().any(|x| x.at >= lo && x.at < hi),
                "no quiet request in second {sec}"
            );
        }
        assert_eq!(schedule(&s), a, "seeded");
        assert_ne!(schedule(&HotSettings::full(7)), a);
    }

    fn outcome(results: Vec<HotResult>) -> HotOutcome {
        HotOutcome {
            settings: HotSettings::quick(1),
            results,
            llama_version: "test".into(),
            elapsed: Duration::from_secs(1),
        }
    }

    fn result(kind: SystemKind, quiet_ms: f64, cache_hit: f64, failed_early: usize) -> HotResult {
        HotResult {
            kind,
            alone: false,
            runs: vec![HotRun {
                ttft_ms: (1..=5)
                    .flat_map(|t| [(t, 3.0 * quiet_ms, true), (t, quiet_ms, false)])
                    .chain([(0, 900.0, true)])
                    .map(|(tenant, ms, first)| Answer {
                        tenant,
                        ms,
                        first,
                        cached: !first,
                    })
                    .collect(),
                cache_hit,
                requests: 11 + failed_early,
                failed: failed_early,
                failed_early,
                wall_s: 1.0,
                first_error: None,
                placements: vec![("pinned", 9), ("host_full", 1)],
            }],
            missing: None,
        }
    }

    #[test]
    fn the_goals_compare_with_the_best_peer() {
        let met = outcome(vec![
            result(SystemKind::LlmrouteBoundedKeys, 1000.0, 0.50, 0),
            result(SystemKind::LlmrouteLoad, 100.0, 0.45, 0),
            result(SystemKind::LlmrouteLoadFairness, 400.0, 0.49, 0),
            result(SystemKind::SglangCacheAware, 900.0, 0.40, 3),
        ]);
        let g = goals(&met);
        assert_eq!(g.len(), 2, "one line per llmroute row with load: {g:?}");
        let subject = g.iter().find(|x| x.kind == SystemKind::LlmrouteLoadFairness).unwrap();
        assert_eq!(
            subject.quiet_ratio.1,
            Some(SystemKind::SglangCacheAware),
            "llmroute + load is not a peer"
        );
        assert!((subject.quiet_ratio.0.unwrap() - 400.0 / 900.0).abs() < 1e-9);
        assert!((subject.warm_ratio.0.unwrap() - 400.0 / 900.0).abs() < 1e-9);
        let r = result(SystemKind::LlmrouteLoad, 100.0, 0.45, 0);
        assert_eq!(
            (r.quiet_p99(), r.quiet_warm_p99(), r.quiet_cold_p50()),
            (Some(300.0), Some(100.0), Some(300.0)),
            "the first requests are left out of the warm p99 and are the cold p50"
        );
        assert_eq!((r.quiet_cached_p99(), r.quiet_misses()), (Some(100.0), (5, 10)));
        assert_eq!((subject.quiet_met(), subject.hit_met()), (Some(true), Some(true)));
        let mut with_alone = met.results.clone();
        with_alone.push(HotResult {
            alone: true,
            ..result(SystemKind::SglangCacheAware, 10.0, 0.99, 0)
        });
        assert_eq!(
            goals(&outcome(with_alone)),
            g,
            "a row with the quiet tenants alone is neither judged nor compared with"
        );
        let missed = outcome(vec![
            result(SystemKind::LlmrouteChwbl, 600.0, 0.60, 0),
            result(SystemKind::LlmrouteLoadFairness, 400.0, 0.50, 2),
        ]);
        let g = goals(&missed);
        assert_eq!(
            (g[0].quiet_met(), g[0].hit_met(), g[0].refused_early),
            (Some(false), Some(false), 2)
        );
        let md = markdown(&missed, &Machine::probe());
        assert!(md.contains("**missed**") && md.contains("| llmroute chwbl |"), "{md}");
        assert!(md.contains("| pinned | host_full |") && md.contains(" 9 | 1 |"), "{md}");
        assert!(
            goals(&outcome(vec![result(SystemKind::LlmrouteLoadFairness, 1.0, 0.1, 0)]))[0]
                .quiet_met()
                .is_none()
        );
    }

    #[test]
    fn only_a_tenants_first_request_of_the_run_is_first() {
        let ok = ChatOutcome {
            ok: true,
            ttft: Some(Duration::from_millis(10)),
            ..ChatOutcome::default()
        };
        let arrivals = [1, 2, 1, 0, 2].map(|tenant| Arrival {
            at: Duration::ZERO,
            tenant,
        });
        let r = HotRun::of(
            &[ok.clone(), ok.clone(), ok.clone(), ok.clone(), ok],
            &arrivals,
            1,
            1,
            1.0,
        );
        let first: Vec<(usize, bool)> = r.ttft_ms.iter().map(|a| (a.tenant, a.first)).collect();
        assert_eq!(first, vec![(1, true), (2, true), (1, false), (0, true), (2, false)]);
    }

    #[test]
    fn an_answer_is_cached_when_the_engine_served_half_its_prompt_from_cache() {
        let answer = |prompt_tokens, cached_tokens| ChatOutcome {
            ok: true,
            ttft: Some(Duration::from_millis(10)),
            prompt_tokens,
            cached_tokens,
            ..ChatOutcome::default()
        };
        let arrivals = [1, 1, 1, 1].map(|tenant| Arrival {
            at: Duration::ZERO,
            tenant,
        });
        let r = HotRun::of(
            &[answer(372, 18), answer(372, 186), answer(372, 340), answer(0, 0)],
            &arrivals,
            1,
            1,
            1.0,
        );
        let cached: Vec<bool> = r.ttft_ms.iter().map(|a| a.cached).collect();
        assert_eq!(cached, vec![false, true, true, false]);
        let result = HotResult {
            runs: vec![r],
            ..HotResult::new(SystemKind::LlmrouteLoad, false)
        };
        assert_eq!(result.quiet_misses(), (2, 4));
    }

    #[test]
    fn a_failure_is_early_only_before_the_longest_wait() {
        let ok = ChatOutcome {
            ok: true,
            ttft: Some(Duration::from_millis(120)),
            ..ChatOutcome::default()
        };
        let refused = ChatOutcome {
            status: 429,
            total: Duration::from_millis(5),
            error: Some("status 429".into()),
            ..ChatOutcome::default()
        };
        let timed_out = ChatOutcome {
            total: Duration::from_millis(MAX_WAIT_MS + 1),
            ..refused.clone()
        };
        let arrivals = [0, 1, 2].map(|tenant| Arrival {
            at: Duration::ZERO,
            tenant,
        });
        let r = HotRun::of(&[ok, refused, timed_out], &arrivals, 30, 10, 1.0);
        assert_eq!((r.failed, r.failed_early), (2, 1));
        assert_eq!(
            r.ttft_ms,
            vec![Answer {
                tenant: 0,
                ms: 120.0,
                first: true,
                cached: false
            }]
        );
        assert!((r.cache_hit - 0.25).abs() < 1e-9);
        assert_eq!(r.first_error.as_deref(), Some("status 429"));
    }
}
