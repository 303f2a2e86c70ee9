//! The overhead bench: llmroute, its wasm and its native build, against plain Envoy and the peer routers, side by
//! side in one run.
//!
//! Method. One set of fast upstreams ([`super::upstream`]) serves every system. For each case (body size ×
//! concurrency) every system is warmed up, then measured in interleaved rounds (A B C D, B C D A, ...), so slow
//! drift of the machine hits all systems alike. Per round and system we record requests/s, p50 and p99 latency,
//! and the proxy's CPU-seconds per request from `/proc`. Ratios and added latency are taken per round against the
//! plain-Envoy round next to it, and medians over rounds are quoted. One round straight to an upstream ("direct")
//! shows what the load generator and upstream manage without any proxy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use llmroute_core::Api;
use reqwest::header::HeaderValue;

use super::body::{chat_body, size_label, SIZES};
use super::load::{self, Prepared, Round};
use super::procstat;
use super::stats::{median, median_of};
use super::systems::{Kind, System, CHAT_PATH};
use super::upstream::Upstreams;

/// Upstream engines behind every system.
pub const UPSTREAMS: usize = 3;

/// What to run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub sizes: Vec<usize>,
    pub concurrencies: Vec<usize>,
    pub rounds: usize,
    pub round: Duration,
    pub warmup: Duration,
    /// Distinct prompt families (system prompts) per size.
    pub families: u64,
    pub seed: u64,
    /// CPUs the proxies are pinned to (`taskset -c`), if any.
    pub proxy_cpus: Option<String>,
    /// CPUs the bench itself (load generator and upstreams) runs on, if pinned.
    pub bench_cpus: Option<String>,
    pub quick: bool,
}

impl Settings {
    /// The full run: 5 sizes × concurrency 1 (unloaded latency), 16 and 64 × 5 rounds of 1.2 s for 8 systems,
    /// about 15 minutes.
    pub fn full(seed: u64) -> Self {
        Settings {
            sizes: SIZES.to_vec(),
            concurrencies: vec![1, 16, 64],
            rounds: 5,
            round: Duration::from_millis(1200),
            warmup: Duration::from_millis(500),
            families: 8,
            seed,
            proxy_cpus: None,
            bench_cpus: None,
            quick: false,
        }
    }

    /// A sanity run of about a minute: 4 KiB and 256 KiB at concurrency 1 and 16, 2 rounds of 1 s.
    pub fn quick(seed: u64) -> Self {
        Settings {
            sizes: vec![4 << 10, 256 << 10],
            concurrencies: vec![1, 16],
            rounds: 2,
            round: Duration::from_millis(1000),
            warmup: Duration::from_millis(500),
            quick: true,
            ..Settings::full(seed)
        }
    }

    fn cases(&self) -> Vec<Case> {
        let sizes = &self.sizes;
        self.concurrencies
            .iter()
            .flat_map(|&concurrency| sizes.iter().map(move |&size| Case { size, concurrency }))
            .collect()
    }
}

/// One body size at one concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    pub size: usize,
    pub concurrency: usize,
}

impl Case {
    pub fn label(&self) -> String {
        format!("{} c={}", size_label(self.size), self.concurrency)
    }
}

/// One round of one system.
#[derive(Debug, Clone)]
pub struct Measure {
    pub rps: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Proxy CPU-seconds per successful request.
    pub cpu_per_req: Option<f64>,
    pub ok: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Share of the round's wall time that the proxy's CPU spent on anything but the proxy.
    pub foreign_load: Option<f64>,
}

impl Measure {
    fn from_round(round: &Round, cpu: Option<f64>) -> Self {
        Measure {
            foreign_load: None,
            rps: round.rps(),
            p50_us: round.p50_us(),
            p99_us: round.p99_us(),
            // A proxy that answered requests spent CPU: none measured means another process answered them (a
            // port shared by mistake) or the reading failed, and the round has no CPU figure rather than a zero.
            cpu_per_req: cpu.filter(|c| round.ok > 0 && *c > 0.0).map(|c| c / round.ok as f64),
            ok: round.ok,
            errors: round.errors,
            first_error: round.first_error.clone(),
        }
    }
}

/// Every round of one system in one case, plus its resident memory at the end of the case.
#[derive(Debug, Clone)]
pub struct SystemRuns {
    pub kind: Kind,
    pub rounds: Vec<Measure>,
    pub rss_bytes: Option<u64>,
}

/// The figures of one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub case: Case,
    pub systems: Vec<SystemRuns>,
    /// The load generator straight to one upstream.
    pub direct: Measure,
    /// The filter's VM memory per worker at the end of the case (see [`VM_MEMORY_STAT`]).
    pub vm_bytes: Option<u64>,
}

impl CaseResult {
    pub fn runs(&self, kind: Kind) -> Option<&SystemRuns> {
        self.systems.iter().find(|s| s.kind == kind)
    }

    fn paired(&self, kind: Kind, f: impl Fn(&Measure, &Measure) -> Option<f64>) -> Option<f64> {
        self.paired_with(kind, Kind::PlainEnvoy, f)
    }

    /// Median over rounds of `f(kind's round, base's round of the same index)`.
    fn paired_with(&self, kind: Kind, base: Kind, f: impl Fn(&Measure, &Measure) -> Option<f64>) -> Option<f64> {
        let (sys, base) = (self.runs(kind)?, self.runs(base)?);
        median_of(sys.rounds.iter().zip(&base.rounds).map(|(s, b)| f(s, b)))
    }

    /// Against the same build with `placement: hash` ([`Kind::hash_row`]), per round: requests/s ÷ hash's, added
    /// p50 µs and added proxy CPU µs per request; medians over rounds.
    pub fn against_hash(&self, kind: Kind) -> (Option<f64>, Option<f64>, Option<f64>) {
        let base = kind.hash_row();
        (
            self.paired_with(kind, base, |s, b| (b.rps > 0.0).then(|| s.rps / b.rps)),
            self.paired_with(kind, base, |s, b| Some(s.p50_us? - b.p50_us?)),
            self.paired_with(kind, base, |s, b| Some((s.cpu_per_req? - b.cpu_per_req?) * 1e6)),
        )
    }

    fn own(&self, kind: Kind, f: impl Fn(&Measure) -> Option<f64>) -> Option<f64> {
        median_of(self.runs(kind)?.rounds.iter().map(f))
    }

    /// Median over rounds of requests/s ÷ plain Envoy's in the same round.
    pub fn ratio(&self, kind: Kind) -> Option<f64> {
        self.paired(kind, |s, p| (p.rps > 0.0).then(|| s.rps / p.rps))
    }

    /// Median over rounds of plain Envoy's proxy CPU per request ÷ this system's: the req/s ratio a CPU-bound
    /// proxy reaches on a core of its own.
    pub fn cpu_ratio(&self, kind: Kind) -> Option<f64> {
        self.paired(kind, |s, p| Some(p.cpu_per_req? / s.cpu_per_req?))
    }

    /// Median over rounds of p50 minus plain Envoy's p50, in µs.
    pub fn added_p50_us(&self, kind: Kind) -> Option<f64> {
        self.paired(kind, |s, p| Some(s.p50_us? - p.p50_us?))
    }

    /// Median over rounds of p99 minus plain Envoy's p99, in µs.
    pub fn added_p99_us(&self, kind: Kind) -> Option<f64> {
        self.paired(kind, |s, p| Some(s.p99_us? - p.p99_us?))
    }

    pub fn rps(&self, kind: Kind) -> Option<f64> {
        self.own(kind, |m| Some(m.rps))
    }

    pub fn p50_us(&self, kind: Kind) -> Option<f64> {
        self.own(kind, |m| m.p50_us)
    }

    pub fn p99_us(&self, kind: Kind) -> Option<f64> {
        self.own(kind, |m| m.p99_us)
    }

    /// Median proxy CPU per request, in µs.
    pub fn cpu_us(&self, kind: Kind) -> Option<f64> {
        self.own(kind, |m| m.cpu_per_req.map(|c| c * 1e6))
    }

    /// Errors over all rounds, and the first message.
    pub fn errors(&self, kind: Kind) -> (u64, Option<&str>) {
        let Some(runs) = self.runs(kind) else {
            return (0, None);
        };
        let total = runs.rounds.iter().map(|m| m.errors).sum();
        (total, runs.rounds.iter().find_map(|m| m.first_error.as_deref()))
    }
}

/// A system that could not be measured, and why.
#[derive(Debug, Clone)]
pub struct Missing {
    pub kind: Kind,
    pub reason: String,
}

/// The filter's gauge of its VM memory: the linear memory of the largest of its VMs (the main thread's and each
/// worker's; the request-serving worker's is the largest), raised on every timer tick (`filter/src/metrics.rs`).
pub const VM_MEMORY_STAT: &str = "wasmcustom.llmroute_vm_memory_bytes";

/// Memory of the two Envoys, idle after start and after the last case.
#[derive(Debug, Clone, Default)]
pub struct Memory {
    /// The filter's VM memory per worker after start, before any load.
    pub idle_vm: Option<u64>,
    pub idle_rss: Vec<(Kind, Option<u64>)>,
    pub end_rss: Vec<(Kind, Option<u64>)>,
    /// Envoy's own heap (`/memory` `allocated`), which excludes V8's pages.
    pub end_heap: Vec<(Kind, Option<u64>)>,
    /// Wasm-related gauges from the filter Envoy's admin `/stats`.
    pub wasm_stats: Vec<(String, String)>,
}

/// The core's decision, timed natively in this process, for one body size.
#[derive(Debug, Clone)]
pub struct NativeCost {
    pub size: usize,
    /// `route` of a chat body (parse, validate, extract, hash), µs per request.
    pub route_us: f64,
    /// `BodyPatch::head_edit`, µs per request.
    pub patch_us: f64,
}

/// Everything the run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub settings: Settings,
    pub cases: Vec<CaseResult>,
    pub missing: Vec<Missing>,
    pub memory: Memory,
    pub native: Vec<NativeCost>,
    /// The cost of each phase of the filter inside Envoy.
    pub phases: super::phases::Breakdown,
    /// The same for the native build.
    pub native_phases: super::phases::Breakdown,
    pub elapsed: Duration,
    /// `/proc/loadavg` before and after the run.
    pub load_before: Option<String>,
    pub load_after: Option<String>,
}

impl Outcome {
    /// Median and largest share of the proxy CPU's time taken by other work during measured rounds.
    pub fn foreign_load(&self) -> Option<(f64, f64)> {
        let all: Vec<f64> = self
            .cases
            .iter()
            .flat_map(|c| {
                c.systems
                    .iter()
                    .flat_map(|s| s.rounds.iter().filter_map(|m| m.foreign_load))
            })
            .collect();
        Some((median(&all)?, all.iter().copied().fold(0.0, f64::max)))
    }
}

/// Runs the whole bench, printing progress lines.
pub async fn run(settings: Settings) -> Result<Outcome, String> {
    let started = Instant::now();
    let load_before = procstat::load_average();
    let upstreams = Upstreams::start(UPSTREAMS)
        .await
        .map_err(|e| format!("starting upstreams: {e}"))?;
    let (systems, missing) = start_systems(&upstreams, settings.proxy_cpus.as_deref()).await;
    if !systems.iter().any(|s| s.kind == Kind::PlainEnvoy) || !systems.iter().any(|s| s.kind == Kind::Llmroute) {
        let why: Vec<String> = missing
            .iter()
            .map(|m| format!("{}: {}", m.kind.name(), m.reason))
            .collect();
        return Err(format!("Envoy did not start, nothing to compare:\n{}", why.join("\n")));
    }
    let mut memory = Memory {
        idle_rss: rss_of(&systems),
        idle_vm: idle_vm_memory(&systems).await,
        ..Memory::default()
    };
    let direct_url = format!("{}{CHAT_PATH}", upstreams.urls()[0]);
    let mut cases = Vec::new();
    for case in settings.cases() {
        cases.push(run_case(&settings, case, &systems, &direct_url, started).await?);
    }
    memory.end_rss = rss_of(&systems);
    read_envoy_memory(&systems, &mut memory).await;
    // The breakdown's Envoys are its own: the main run's stop first, so they share the proxy CPU with nothing.
    drop(systems);
    let phases = super::phases::run(&settings, &upstreams, started, super::phases::Build::Wasm).await;
    let native_phases = super::phases::run(&settings, &upstreams, started, super::phases::Build::Native).await;
    let native = settings.sizes.iter().map(|&s| native_cost(s, settings.seed)).collect();
    Ok(Outcome {
        settings,
        cases,
        missing,
        memory,
        native,
        phases,
        native_phases,
        elapsed: started.elapsed(),
        load_before,
        load_after: procstat::load_average(),
    })
}

async fn start_systems(upstreams: &Upstreams, cpus: Option<&str>) -> (Vec<System>, Vec<Missing>) {
    let mut systems = Vec::new();
    let mut missing = Vec::new();
    for kind in Kind::ALL {
        progress(None, &format!("starting {}", kind.name()));
        match System::start(kind, upstreams, cpus).await {
            Ok(s) => systems.push(s),
            Err(reason) => {
                progress(None, &format!("{} is MISSING from this run: {reason}", kind.name()));
                missing.push(Missing { kind, reason });
            }
        }
    }
    (systems, missing)
}

/// The chat bodies of one size, one per prompt family, with their affinity header values.
pub fn prepare(size: usize, families: u64, seed: u64) -> Arc<[Prepared]> {
    (0..families)
        .map(|family| Prepared {
            body: Bytes::from(chat_body(size, family, seed)),
            affinity: HeaderValue::from_str(&format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&family.to_le_bytes())))
                .unwrap_or(HeaderValue::from_static("0")),
            stream_events: None,
        })
        .collect()
}

async fn run_case(
    settings: &Settings,
    case: Case,
    systems: &[System],
    direct_url: &str,
    started: Instant,
) -> Result<CaseResult, String> {
    let requests = prepare(case.size, settings.families, settings.seed);
    let client = load::client(case.concurrency).map_err(|e| format!("building the HTTP client: {e}"))?;
    for system in systems {
        load::run(&client, &system.url, &requests, case.concurrency, settings.warmup).await;
    }
    let direct = load::run(&client, direct_url, &requests, case.concurrency, settings.round).await;
    let direct = Measure::from_round(&direct, None);
    report_round(started, case, "direct", 0, &direct);
    let targets: Vec<(String, u32)> = systems.iter().map(|s| (s.url.clone(), s.pid)).collect();
    let r = Rounds::of(settings, case, &client, &requests, started);
    let rounds = interleaved(&r, &targets, |i| systems.get(i).map_or("?", |s| s.kind.short())).await;
    let mut runs: Vec<SystemRuns> = systems
        .iter()
        .zip(rounds)
        .map(|(s, rounds)| SystemRuns {
            kind: s.kind,
            rounds,
            rss_bytes: None,
        })
        .collect();
    for (run, system) in runs.iter_mut().zip(systems) {
        run.rss_bytes = procstat::rss_bytes(system.pid);
    }
    let vm_bytes = match find(systems, Kind::Llmroute).and_then(System::envoy) {
        Some(envoy) => envoy.stat(VM_MEMORY_STAT).await,
        None => None,
    };
    Ok(CaseResult {
        case,
        systems: runs,
        direct,
        vm_bytes,
    })
}

/// One round against the proxy at `url` (process `pid`), with its CPU per request and the other work on its CPU.
pub(crate) async fn measure(
    client: &reqwest::Client,
    (url, pid): (&str, u32),
    requests: &Arc<[Prepared]>,
    concurrency: usize,
    duration: Duration,
    proxy_cpu: Option<usize>,
) -> Measure {
    let busy = || proxy_cpu.and_then(procstat::cpu_busy_seconds);
    let (busy_before, before) = (busy(), procstat::cpu_seconds(pid));
    let round = load::run(client, url, requests, concurrency, duration).await;
    let (busy_after, after) = (busy(), procstat::cpu_seconds(pid));
    let cpu = before.zip(after).map(|(b, a)| a - b);
    let mut m = Measure::from_round(&round, cpu);
    let busy = busy_before.zip(busy_after).map(|(b, a)| a - b);
    m.foreign_load = busy
        .zip(cpu)
        .map(|(busy, cpu)| ((busy - cpu) / round.elapsed.as_secs_f64()).max(0.0));
    m
}

/// What interleaved rounds of one case need besides their targets.
pub(crate) struct Rounds<'a> {
    pub client: &'a reqwest::Client,
    pub requests: &'a Arc<[Prepared]>,
    pub case: Case,
    pub rounds: usize,
    pub round: Duration,
    pub proxy_cpu: Option<usize>,
    pub started: Instant,
}

impl<'a> Rounds<'a> {
    /// The overhead bench's rounds of `case`, as `settings` sizes them.
    pub(crate) fn of(
        settings: &Settings,
        case: Case,
        client: &'a reqwest::Client,
        requests: &'a Arc<[Prepared]>,
        started: Instant,
    ) -> Self {
        Rounds {
            client,
            requests,
            case,
            rounds: settings.rounds,
            round: settings.round,
            proxy_cpu: settings.proxy_cpus.as_deref().and_then(|c| c.parse().ok()),
            started,
        }
    }
}

/// `r.rounds` interleaved rounds over `targets` (URL, pid), each round starting one target later (A B C, B C A,
/// ...), each measurement reported under `name(target)`: `out[target]`, one [`Measure`] per round.
pub(crate) async fn interleaved<'n>(
    r: &Rounds<'_>,
    targets: &[(String, u32)],
    name: impl Fn(usize) -> &'n str,
) -> Vec<Vec<Measure>> {
    let mut out: Vec<Vec<Measure>> = vec![Vec::new(); targets.len()];
    for round in 0..r.rounds {
        for i in (0..targets.len()).map(|i| (i + round) % targets.len()) {
            let (url, pid) = &targets[i];
            let m = measure(
                r.client,
                (url, *pid),
                r.requests,
                r.case.concurrency,
                r.round,
                r.proxy_cpu,
            )
            .await;
            report_round(r.started, r.case, name(i), round + 1, &m);
            out[i].push(m);
        }
    }
    out
}

/// Interleaved rounds of one case, `rounds[row]`, row 0 plain Envoy: each figure is a median over rounds, and each
/// comparison is taken per round, against the row measured within seconds of it.
#[derive(Debug, Clone)]
pub struct RowRounds {
    pub case: Case,
    pub rounds: Vec<Vec<Measure>>,
}

impl RowRounds {
    /// `rows` rows without a round yet.
    pub fn empty(case: Case, rows: usize) -> RowRounds {
        RowRounds {
            case,
            rounds: vec![Vec::new(); rows],
        }
    }

    /// Adds `other`'s rounds after this one's, row by row (rounds of fresh Envoys measured again).
    pub fn append(&mut self, other: RowRounds) {
        for (ours, theirs) in self.rounds.iter_mut().zip(other.rounds) {
            ours.extend(theirs);
        }
    }

    /// Median over rounds of `f(row's measure, other's measure)`.
    fn per_round(&self, row: usize, other: usize, f: impl Fn(&Measure, &Measure) -> Option<f64>) -> Option<f64> {
        let (ours, theirs) = (self.rounds.get(row)?, self.rounds.get(other)?);
        median_of(ours.iter().zip(theirs).map(|(s, o)| f(s, o)))
    }

    /// Median proxy CPU µs per request of `row`.
    pub fn cpu_us(&self, row: usize) -> Option<f64> {
        median_of(self.rounds.get(row)?.iter().map(|m| m.cpu_per_req.map(|c| c * 1e6)))
    }

    /// Median over rounds of `row`'s CPU per request minus the row above's, in µs.
    pub fn added_us(&self, row: usize) -> Option<f64> {
        self.per_round(row, row.checked_sub(1)?, |s, a| {
            Some((s.cpu_per_req? - a.cpu_per_req?) * 1e6)
        })
    }

    /// Median over rounds of `row`'s CPU per request minus plain Envoy's, in µs.
    pub fn over_plain_us(&self, row: usize) -> Option<f64> {
        self.per_round(row, 0, |s, p| Some((s.cpu_per_req? - p.cpu_per_req?) * 1e6))
    }

    /// Median p50 latency of `row`, in µs.
    pub fn p50_us(&self, row: usize) -> Option<f64> {
        median_of(self.rounds.get(row)?.iter().map(|m| m.p50_us))
    }

    /// Median over rounds of `row`'s p50 latency minus the row above's, in µs.
    pub fn added_p50_us(&self, row: usize) -> Option<f64> {
        self.per_round(row, row.checked_sub(1)?, |s, a| Some(s.p50_us? - a.p50_us?))
    }

    /// Median over rounds of `row`'s p50 latency minus plain Envoy's, in µs.
    pub fn over_plain_p50_us(&self, row: usize) -> Option<f64> {
        self.per_round(row, 0, |s, p| Some(s.p50_us? - p.p50_us?))
    }

    /// Median over rounds of req/s ÷ plain Envoy's.
    pub fn ratio(&self, row: usize) -> Option<f64> {
        self.per_round(row, 0, |s, p| (p.rps > 0.0).then(|| s.rps / p.rps))
    }

    /// Median over rounds of plain Envoy's CPU per request ÷ `row`'s.
    pub fn cpu_ratio(&self, row: usize) -> Option<f64> {
        self.per_round(row, 0, |s, p| Some(p.cpu_per_req? / s.cpu_per_req?))
    }
}

/// A round that measured `cpu_us` of proxy CPU per request at `rps`, for the tests of what reads rounds.
#[cfg(test)]
pub(crate) fn measured(cpu_us: f64, rps: f64) -> Measure {
    Measure {
        rps,
        p50_us: Some(100.0),
        p99_us: Some(300.0),
        cpu_per_req: Some(cpu_us / 1e6),
        ok: 1000,
        errors: 0,
        first_error: None,
        foreign_load: None,
    }
}

pub(crate) fn report_round(started: Instant, case: Case, who: &str, round: usize, m: &Measure) {
    let errors = match (&m.first_error, m.errors) {
        (Some(e), n) => format!("  {n} errors, first: {e}"),
        (None, _) => String::new(),
    };
    let cpu = m
        .cpu_per_req
        .map_or(String::new(), |c| format!("  cpu {:.0} µs/req", c * 1e6));
    progress(
        Some(started),
        &format!(
            "{:<14} round {round} {:<8} {:>8.0} req/s  p50 {:>7.0} µs  p99 {:>7.0} µs{cpu}{errors}",
            case.label(),
            who,
            m.rps,
            m.p50_us.unwrap_or(f64::NAN),
            m.p99_us.unwrap_or(f64::NAN),
        ),
    );
}

/// A progress line on stderr, with the time since the start.
pub fn progress(started: Option<Instant>, line: &str) {
    match started {
        Some(t) => eprintln!("[{:>5.1}s] {line}", t.elapsed().as_secs_f64()),
        None => eprintln!("[bench] {line}"),
    }
}

fn find(systems: &[System], kind: Kind) -> Option<&System> {
    systems.iter().find(|s| s.kind == kind)
}

/// The filter's VM memory once its first timer tick has set the gauge (within a few seconds of the start).
async fn idle_vm_memory(systems: &[System]) -> Option<u64> {
    let envoy = find(systems, Kind::Llmroute)?.envoy()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = envoy.stat(VM_MEMORY_STAT).await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn rss_of(systems: &[System]) -> Vec<(Kind, Option<u64>)> {
    systems.iter().map(|s| (s.kind, procstat::rss_bytes(s.pid))).collect()
}

async fn read_envoy_memory(systems: &[System], memory: &mut Memory) {
    for system in systems {
        let Some(envoy) = system.envoy() else { continue };
        memory
            .end_heap
            .push((system.kind, envoy.stat("server.memory_allocated").await));
        if system.kind == Kind::Llmroute {
            memory.wasm_stats = wasm_stats(envoy).await;
        }
    }
}

/// Every `/stats` line whose name mentions wasm.
async fn wasm_stats(envoy: &crate::envoy::Envoy) -> Vec<(String, String)> {
    let Ok(resp) = reqwest::get(envoy.admin_url("/stats?filter=wasm")).await else {
        return Vec::new();
    };
    let text = resp.text().await.unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Times the core's work for one body size natively: `route` (chat) and `BodyPatch::head_edit` (the rewrite as the
/// filter sends it), median of 7 batches.
pub fn native_cost(size: usize, seed: u64) -> NativeCost {
    let config = super::systems::bench_config(&["127.0.0.1:1".to_string()]);
    let cfg = llmroute_core::load_document(&config.to_string()).ok();
    let body = chat_body(size, 0, seed);
    let route = || {
        cfg.as_ref()
            .and_then(|c| llmroute_core::route(c, Api::Chat, &body, None).ok())
    };
    let decision = route();
    let patch = || {
        decision
            .as_ref()
            .and_then(|d| d.patch.as_ref())
            .and_then(|p| p.head_edit(&body))
            .map(|calls| calls.len())
    };
    NativeCost {
        size,
        route_us: time_per_call(size, || route().is_some()),
        patch_us: time_per_call(size, || patch().is_some()),
    }
}

/// Median µs per call over 7 batches of about 30 ms each.
fn time_per_call<T>(size: usize, mut f: impl FnMut() -> T) -> f64 {
    let per_batch = (30_000_000 / size.max(1)).clamp(3, 100_000);
    let batches: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per_batch {
                std::hint::black_box(f());
            }
            t.elapsed().as_secs_f64() * 1e6 / per_batch as f64
        })
        .collect();
    median(&batches).unwrap_or(f64::NAN)
}

/// A small made-up outcome for the report and plot tests.
#[cfg(test)]
pub(crate) mod sample {
    use super::*;

    fn measure(rps: f64, p50: f64, cpu_us: f64) -> Measure {
        Measure {
            rps,
            p50_us: Some(p50),
            p99_us: Some(p50 * 3.0),
            cpu_per_req: Some(cpu_us / 1e6),
            ok: 1000,
            errors: 0,
            first_error: None,
            foreign_load: Some(0.05),
        }
    }

    /// One case: the wasm build at `ours` × plain Envoy, the native build at `native` ×.
    fn case(size: usize, concurrency: usize, ours: f64, native: f64) -> CaseResult {
        let runs = |kind, rps: f64, p50, cpu| SystemRuns {
            kind,
            rounds: vec![measure(rps, p50, cpu); 3],
            rss_bytes: Some(100 << 20),
        };
        CaseResult {
            case: Case { size, concurrency },
            systems: vec![
                runs(Kind::Llmroute, 1000.0 * ours, 330.0, 100.0 / ours),
                runs(Kind::Native, 1000.0 * native, 310.0, 100.0 / native),
                runs(Kind::PlainEnvoy, 1000.0, 300.0, 100.0),
                runs(Kind::BoundedKeys, 1000.0 * ours * 0.95, 335.0, 100.0 / ours + 4.0),
                runs(
                    Kind::NativeBoundedKeys,
                    1000.0 * native * 0.98,
                    312.0,
                    100.0 / native + 1.0,
                ),
                runs(Kind::Sglang, 700.0, 400.0, 150.0),
            ],
            direct: measure(9000.0, 30.0, 0.0),
            vm_bytes: Some(2 << 20),
        }
    }

    /// 4 KiB and 256 KiB at concurrency 1 and 16; vllm-router missing.
    pub fn outcome() -> Outcome {
        let mut settings = Settings::quick(7);
        settings.proxy_cpus = Some("0".into());
        settings.bench_cpus = Some("1".into());
        Outcome {
            cases: vec![
                case(4 << 10, 1, 0.9, 0.95),
                case(256 << 10, 1, 0.5, 0.85),
                case(4 << 10, 16, 0.9, 0.95),
                case(256 << 10, 16, 0.5, 0.75),
            ],
            settings,
            missing: vec![Missing {
                kind: Kind::Vllm,
                reason: "not installed".into(),
            }],
            memory: Memory {
                idle_vm: Some(1 << 20),
                ..Memory::default()
            },
            phases: super::super::phases::Breakdown::Missing("not run".into()),
            native_phases: super::super::phases::Breakdown::Missing("not run".into()),
            native: vec![NativeCost {
                size: 4 << 10,
                route_us: 10.0,
                patch_us: 0.1,
            }],
            elapsed: Duration::from_secs(40),
            load_before: Some("0.10 0.20 0.30".into()),
            load_after: None,
        }
    }

    #[test]
    fn ratios_and_added_latency_are_paired_medians() {
        let o = outcome();
        let c = &o.cases[2];
        assert!((c.ratio(Kind::Llmroute).unwrap() - 0.9).abs() < 1e-9);
        assert!((c.cpu_ratio(Kind::Llmroute).unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(c.added_p50_us(Kind::Llmroute), Some(30.0));
        assert_eq!(c.ratio(Kind::Vllm), None);
        assert_eq!(c.errors(Kind::Llmroute), (0, None));
        assert_eq!(o.foreign_load(), Some((0.05, 0.05)));
        let (ratio, p50, cpu) = c.against_hash(Kind::BoundedKeys);
        assert!((ratio.unwrap() - 0.95).abs() < 1e-9);
        assert_eq!(p50, Some(5.0));
        assert!((cpu.unwrap() - 4.0).abs() < 1e-6);
        assert_eq!(c.against_hash(Kind::BoundedKeysStore), (None, None, None));
        // The native build's bounded_keys row is measured against the native hash row, not the wasm one.
        let (ratio, p50, cpu) = c.against_hash(Kind::NativeBoundedKeys);
        assert!((ratio.unwrap() - 0.98).abs() < 1e-9);
        assert_eq!(p50, Some(2.0));
        assert!((cpu.unwrap() - 1.0).abs() < 1e-6);
    }
}
