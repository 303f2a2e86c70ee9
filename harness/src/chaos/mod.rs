//! Faults under load (`make chaos`) and the memory soak (`make soak`): an open-loop load of mixed chat and
//! Anthropic Messages traffic, streamed and not, with a few affinity keys, through a real Envoy with the real
//! filter, in front of an emulated llama.cpp fleet; then checks.
//!
//! `llmroute-bench chaos` runs four engines under a seeded fault schedule:
//! - `chaos-0`: a [`FaultPlan`]: slow response heads, garbage streams, streams cut inside an event, and
//!   connection resets before any byte, each on a few percent of its requests;
//! - `chaos-1`: 5xx bursts (five 503s in a row, then healthy) at four moments of the run, plus a few slow heads;
//! - `chaos-2`: killed (listener gone, in-flight streams cut) twice for a few seconds, then restarted on its port;
//! - `chaos-3`: `/health` passes while every inference request fails with 500.
//!
//! It then checks the four invariants (see [`checks`]): every request ends as exactly one well-formed outcome
//! ([`outcome`]); nothing is retried after its first byte (from the engines' shared [`Journal`]); the client's
//! counts, Envoy's `http.llmroute.downstream_rq_*` and the filter's `wasmcustom.*` counters agree; and the failing
//! engine, once ejected, gets no request until its cool-down has passed.
//!
//! `llmroute-bench soak` runs the same load on a healthy fleet and samples the filter's VM memory
//! (`wasmcustom.llmroute_vm_memory_bytes`) and Envoy's heap (`server.memory_allocated`,
//! `server.memory_heap_size`); it fails on growth (see [`soak`]).
//!
//! All traffic is on 127.0.0.1; every loop is bounded in count and time.

pub mod checks;
pub mod outcome;
pub mod soak;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use llmroute_core::envoy_contract::metrics as names;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::emulator::chaos::{FaultPlan, Journal};
use crate::emulator::{Emulator, EmulatorOptions};
use crate::envoy::Envoy;
use crate::rng::SplitMix64;
use checks::{Check, Equation};
use outcome::{classify, Outcome, Seen};

/// The backend (and Envoy cluster) of the emulated fleet.
pub const BACKEND: &str = "chaos";
/// The model alias clients ask for.
pub const ALIAS: &str = "chaos-model";
/// Requests in flight at most; past it the load waits (and the achieved rate drops, which the summary shows).
const MAX_INFLIGHT: usize = 512;
/// Longest one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Most of a body the client keeps.
const BODY_CAP: usize = 1 << 20;

/// What to run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub seed: u64,
    pub rps: u32,
    pub duration: Duration,
    /// Outlier ejection's base time (`backends[].outlier.base_ejection_ms`).
    pub base_ejection: Duration,
    /// How often progress is printed.
    pub progress_every: Duration,
}

/// One request as the client saw it.
#[derive(Clone, Debug)]
pub struct Record {
    pub outcome: Outcome,
    pub streamed: bool,
    pub status: Option<u16>,
}

/// The running stack: the fleet (each engine may be down), its journal, and Envoy.
pub struct Stack {
    pub engines: Vec<Arc<tokio::sync::Mutex<Option<Emulator>>>>,
    /// Each engine's options, to restart it on its port.
    pub options: Vec<EmulatorOptions>,
    pub addrs: Vec<String>,
    pub journal: Arc<Journal>,
    pub envoy: Envoy,
}

impl Stack {
    /// Starts `n` engines (`tune` adjusts each one's options) sharing one journal, and Envoy in front.
    pub async fn start(
        n: usize,
        base_ejection: Duration,
        tune: impl Fn(usize, &mut EmulatorOptions),
    ) -> Result<Stack, String> {
        let journal = Arc::new(Journal::default());
        let mut engines = Vec::new();
        let mut options = Vec::new();
        let mut addrs = Vec::new();
        for i in 0..n {
            let mut opts = EmulatorOptions::new(&format!("{BACKEND}-{i}"));
            opts.journal = Some(journal.clone());
            opts.chunk_delay_ms = 10;
            tune(i, &mut opts);
            let emulator = Emulator::spawn_with(opts)
                .await
                .map_err(|e| format!("starting an engine: {e}"))?;
            addrs.push(emulator.addr().to_string());
            options.push(emulator.options());
            engines.push(Arc::new(tokio::sync::Mutex::new(Some(emulator))));
        }
        let config = json!({
            "version": 1,
            "backends": [{
                "name": BACKEND,
                "kind": "llamacpp",
                "endpoints": addrs,
                "lb": "chwbl",
                "balance_factor": 150,
                "health": {"interval_ms": 1000, "timeout_ms": 500, "unhealthy": 2, "healthy": 1},
                "outlier": {
                    "consecutive_5xx": 3,
                    "base_ejection_ms": u64::try_from(base_ejection.as_millis()).unwrap_or(u64::MAX),
                    "max_ejection_percent": 50,
                },
            }],
            "models": [{ "name": ALIAS, "routes": [{ "backend": BACKEND, "upstream_model": "emulated" }] }],
            "affinity": { "session_headers": ["x-session-id"], "user_prefix_bytes": 256 },
        });
        let envoy = Envoy::start(config).await?;
        Ok(Stack {
            engines,
            options,
            addrs,
            journal,
            envoy,
        })
    }

    /// Stops engine `i` as a crash would: its listener closes and its in-flight streams break.
    pub async fn kill(&self, i: usize) {
        if let Some(slot) = self.engines.get(i) {
            slot.lock().await.take();
        }
    }

    /// Starts engine `i` again on its port; retries a bind that loses a race for a moment.
    pub async fn restart(&self, i: usize) -> Result<(), String> {
        let (Some(slot), Some(opts)) = (self.engines.get(i), self.options.get(i)) else {
            return Err(format!("no engine {i}"));
        };
        let mut last = String::new();
        for _ in 0..40 {
            match Emulator::spawn_with(opts.clone()).await {
                Ok(emulator) => {
                    *slot.lock().await = Some(emulator);
                    return Ok(());
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!("restarting engine {i} on {}: {last}", opts.port))
    }

    /// Runs `f` on engine `i` if it is up.
    pub async fn with_engine(&self, i: usize, f: impl FnOnce(&Emulator)) {
        if let Some(slot) = self.engines.get(i) {
            if let Some(emulator) = slot.lock().await.as_ref() {
                f(emulator);
            }
        }
    }

    /// Every counter and gauge of the admin `/stats`, by name.
    pub async fn stats(&self) -> HashMap<String, u64> {
        let text = match reqwest::get(self.envoy.admin_url("/stats")).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        text.lines()
            .filter_map(|l| l.split_once(": "))
            .filter_map(|(k, v)| v.trim().parse().ok().map(|v| (k.to_string(), v)))
            .collect()
    }

    /// Waits (bounded) until Envoy has no downstream request active, so its counters are final.
    pub async fn settle(&self) -> HashMap<String, u64> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let stats = self.stats().await;
            let active = stats.get("http.llmroute.downstream_rq_active").copied();
            if active == Some(0) || Instant::now() > deadline {
                // The filter counts stream outcomes in its log phase, just after the request ends.
                tokio::time::sleep(Duration::from_millis(300)).await;
                return self.stats().await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One request to send.
struct Planned {
    path: &'static str,
    body: String,
    streamed: bool,
    anthropic: bool,
    session: Option<String>,
    request_id: String,
}

/// The `n`th request of a run: 15% Anthropic Messages (half streamed), else chat (65% streamed); 75% carry one of
/// eight session keys, the rest have their own prompt (their affinity comes from the prompt's prefix).
fn plan_request(rng: &mut SplitMix64, seed: u64, n: u64) -> Planned {
    let anthropic = rng.unit() < 0.15;
    let streamed = rng.unit() < if anthropic { 0.5 } else { 0.65 };
    let session = (rng.unit() < 0.75).then(|| format!("tenant-{}", rng.next_u64() % 8));
    let prompt = match &session {
        Some(key) => format!("{key}: summarise the state of the fleet, request {n}"),
        None => format!("q{n:x}-{:x}: what is the weather like on loopback?", rng.next_u64()),
    };
    let (path, body) = if anthropic {
        let body = json!({"model": ALIAS, "stream": streamed, "max_tokens": 16,
            "messages": [{"role": "user", "content": prompt}]});
        ("/v1/messages", body)
    } else {
        let body = json!({"model": ALIAS, "stream": streamed,
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": prompt}]});
        ("/v1/chat/completions", body)
    };
    Planned {
        path,
        body: body.to_string(),
        streamed,
        anthropic,
        session,
        request_id: format!("chaos-{seed:x}-{n}"),
    }
}

async fn send(client: &reqwest::Client, url: &str, planned: Planned) -> Record {
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .header("x-request-id", &planned.request_id)
        .body(planned.body);
    if let Some(key) = &planned.session {
        request = request.header("x-session-id", key);
    }
    let mut seen = Seen {
        streamed: planned.streamed,
        anthropic: planned.anthropic,
        ..Seen::default()
    };
    if let Ok(response) = request.send().await {
        seen.status = Some(response.status().as_u16());
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        seen.content_type = header("content-type").unwrap_or_default();
        seen.request_id = header("x-request-id");
        let mut body = response.bytes_stream();
        while let Some(item) = body.next().await {
            match item {
                Ok(bytes) if seen.body.len() + bytes.len() <= BODY_CAP => seen.body.extend_from_slice(&bytes),
                Ok(_) => {}
                Err(_) => {
                    seen.body_failed = true;
                    break;
                }
            }
        }
    }
    Record {
        outcome: classify(&seen),
        streamed: seen.streamed,
        status: seen.status,
    }
}

/// The client's view of a whole run.
#[derive(Default)]
pub struct Load {
    pub records: Vec<Record>,
    pub sent: u64,
    pub elapsed: Duration,
}

/// Sends `rps` requests a second for `duration`, open loop (at most [`MAX_INFLIGHT`] in flight), and prints
/// progress every `progress_every`, with `extra()`'s line appended. Returns once every answer is in.
pub async fn drive(url_base: &str, settings: &Settings, mut extra: impl FnMut() -> String) -> Result<Load, String> {
    let client = reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(MAX_INFLIGHT)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| e.to_string())?;
    let total = u64::from(settings.rps).saturating_mul(settings.duration.as_secs().max(1));
    let gap = Duration::from_secs(1) / settings.rps.max(1);
    let records: Arc<Mutex<Vec<Record>>> = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let slots = Arc::new(Semaphore::new(MAX_INFLIGHT));
    let mut rng = SplitMix64::new(settings.seed);
    let start = Instant::now();
    let mut next_progress = start + settings.progress_every;
    for n in 0..total {
        tokio::time::sleep_until((start + gap * (n as u32)).into()).await;
        let permit = slots.clone().acquire_owned().await.map_err(|e| e.to_string())?;
        let planned = plan_request(&mut rng, settings.seed, n);
        let url = format!("{url_base}{}", planned.path);
        let (client, sink) = (client.clone(), records.clone());
        tokio::spawn(async move {
            let record = send(&client, &url, planned).await;
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(record);
            drop(permit);
        });
        if Instant::now() >= next_progress {
            next_progress += settings.progress_every;
            let (done, counts) = {
                let done = records.lock().unwrap_or_else(|p| p.into_inner());
                (done.len(), checks::tally(done.iter().map(|r| &r.outcome)))
            };
            let secs = start.elapsed().as_secs_f64();
            println!(
                "[{secs:5.1}s] sent {} ({:.0}/s), done {}: {counts:?}{}",
                n + 1,
                (n + 1) as f64 / secs.max(1e-9),
                done,
                extra()
            );
        }
    }
    let all = u32::try_from(MAX_INFLIGHT).unwrap_or(u32::MAX);
    tokio::time::timeout(REQUEST_TIMEOUT + Duration::from_secs(5), slots.acquire_many(all))
        .await
        .map_err(|_| "requests still in flight after the timeout".to_string())?
        .map_err(|e| e.to_string())?
        .forget();
    let elapsed = start.elapsed();
    let records = std::mem::take(&mut *records.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(Load {
        records,
        sent: total,
        elapsed,
    })
}

/// One scheduled fault.
#[derive(Clone, Copy, Debug)]
enum Action {
    Kill(usize),
    Restart(usize),
    Burst(usize),
}

/// The fault schedule over `duration`, from `seed`: four 5xx bursts on engine 1, two kills of engine 2 for a
/// few seconds each. Times jitter by up to a second.
fn schedule(seed: u64, duration: Duration) -> Vec<(Duration, Action)> {
    let mut rng = SplitMix64::new(seed ^ 0x0005_eedc_4a05);
    let d = duration.as_secs_f64();
    let mut at = |frac: f64| Duration::from_secs_f64((d * frac + rng.unit()).max(0.5));
    let down = Duration::from_secs_f64((d / 12.0).clamp(1.0, 5.0));
    let mut events = vec![];
    for frac in [0.15, 0.35, 0.55, 0.8] {
        events.push((at(frac), Action::Burst(1)));
    }
    for frac in [0.25, 0.6] {
        let kill = at(frac);
        events.push((kill, Action::Kill(2)));
        events.push((kill + down, Action::Restart(2)));
    }
    events.sort_by_key(|(t, _)| *t);
    events
}

/// What a chaos run found.
pub struct ChaosReport {
    pub settings: Settings,
    pub load: Load,
    pub outcomes: BTreeMap<String, u64>,
    pub checks: Vec<Check>,
    pub attempts: usize,
}

impl ChaosReport {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }

    /// The summary, as markdown.
    pub fn markdown(&self, date: &str, machine: &str) -> String {
        let s = &self.settings;
        let mut out = format!(
            "### Chaos run of {date}\n\n{machine}. Seed {}, {} requests/s for {} s: {} sent in {:.1} s \
             ({:.0}/s achieved); {} attempts reached the engines.\n\n| outcome | requests |\n|---|---|\n",
            s.seed,
            s.rps,
            s.duration.as_secs(),
            self.load.sent,
            self.load.elapsed.as_secs_f64(),
            self.load.sent as f64 / self.load.elapsed.as_secs_f64().max(1e-9),
            self.attempts,
        );
        for (label, n) in &self.outcomes {
            out.push_str(&format!("| `{label}` | {n} |\n"));
        }
        out.push_str("\n| invariant | result | detail |\n|---|---|---|\n");
        for c in &self.checks {
            let verdict = if c.passed { "pass" } else { "**FAIL**" };
            out.push_str(&format!(
                "| {} | {verdict} | {} |\n",
                c.name,
                c.detail.replace('\n', "<br>")
            ));
        }
        out
    }
}

/// The engine that passes `/health` while its inference fails.
const ZOMBIE: usize = 3;

/// Runs the chaos scenario and checks its invariants.
pub async fn run_chaos(settings: Settings) -> Result<ChaosReport, String> {
    let seed = settings.seed;
    let stack = Arc::new(
        Stack::start(4, settings.base_ejection, |i, opts| {
            opts.faults = match i {
                0 => Some(FaultPlan {
                    seed,
                    slow_headers_permille: 30,
                    slow_headers: Duration::from_millis(800),
                    garbage_permille: 30,
                    cut_permille: 30,
                    reset_permille: 30,
                }),
                1 => Some(FaultPlan {
                    seed,
                    slow_headers_permille: 20,
                    slow_headers: Duration::from_millis(1500),
                    ..FaultPlan::default()
                }),
                _ => None,
            };
        })
        .await?,
    );
    stack.with_engine(ZOMBIE, |e| e.set_fault_status(Some(500))).await;
    let zombie_addr = stack.addrs.get(ZOMBIE).cloned().unwrap_or_default();
    println!(
        "chaos: seed {seed}, {} req/s for {} s; engines {:?} (0: seeded faults, 1: 5xx bursts, 2: killed and \
         restarted, 3: /health passes, inference fails); Envoy on {}",
        settings.rps,
        settings.duration.as_secs(),
        stack.addrs,
        stack.envoy.listen
    );

    // The fault schedule.
    let events = schedule(seed, settings.duration);
    let epoch = stack.journal.epoch();
    let faults = {
        let stack = stack.clone();
        tokio::spawn(async move {
            let mut log = Vec::new();
            for (at, action) in events {
                tokio::time::sleep_until((epoch + at).into()).await;
                match action {
                    Action::Kill(i) => stack.kill(i).await,
                    Action::Restart(i) => {
                        if let Err(e) = stack.restart(i).await {
                            log.push(e);
                        }
                    }
                    Action::Burst(i) => stack.with_engine(i, |e| e.fail_next(5, 503)).await,
                }
                println!("[{:5.1}s] fault: {action:?}", epoch.elapsed().as_secs_f64());
            }
            log
        })
    };

    // The zombie's health flags, every 100 ms, until the load is over.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let samples: Arc<Mutex<Vec<checks::HostSample>>> = Arc::default();
    let monitor = {
        let (stack, samples, addr) = (stack.clone(), samples.clone(), zombie_addr.clone());
        tokio::spawn(async move {
            while !*stop_rx.borrow() {
                let at = epoch.elapsed();
                let flags = stack.envoy.host_health(BACKEND).await;
                let ejected = flags.get(&addr).is_some_and(|f| f.contains("failed_outlier_check"));
                let panic = stack
                    .envoy
                    .stat(&format!("cluster.{BACKEND}.lb_healthy_panic"))
                    .await
                    .unwrap_or(0);
                samples
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((at, ejected, panic));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let counter = samples.clone();
    let load = drive(&stack.envoy.url(""), &settings, move || {
        let s = counter.lock().unwrap_or_else(|p| p.into_inner());
        let out = s.last().is_some_and(|(_, e, _)| *e);
        format!("; {ZOMBIE_NAME} ejected now: {out}")
    })
    .await?;
    let _ = stop_tx.send(true);
    let _ = monitor.await;
    let restart_errors = faults.await.unwrap_or_default();
    let stats = stack.settle().await;

    let outcomes = checks::tally(load.records.iter().map(|r| &r.outcome));
    let malformed: Vec<String> = load
        .records
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Malformed(why) => Some(why.clone()),
            _ => None,
        })
        .collect();
    let attempts = stack.journal.attempts();
    let samples = samples.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let stat = |name: &str| stats.get(name).copied().unwrap_or(0);
    let enforced = stat(&format!("cluster.{BACKEND}.outlier_detection.ejections_enforced_total"));
    let zombie_name = format!("{BACKEND}-{ZOMBIE}");
    let mut checks = vec![
        checks::one_outcome_each(load.sent, &outcomes, &malformed),
        checks::no_retry_after_first_byte(&attempts),
        checks::counters_add_up(&equations(&load, &stats)),
        checks::ejected_host_stays_out(
            &samples,
            &stack.journal.arrivals(&zombie_name),
            enforced,
            settings.base_ejection,
            Duration::from_millis(250),
            Duration::from_millis(300),
        ),
    ];
    if !restart_errors.is_empty() {
        checks.push(Check {
            name: "the fault schedule ran".into(),
            passed: false,
            detail: restart_errors.join("; "),
        });
    }
    let attempts = stack.journal.len();
    Ok(ChaosReport {
        settings,
        load,
        outcomes,
        checks,
        attempts,
    })
}

const ZOMBIE_NAME: &str = "chaos-3";

/// The counter equations of a run (each is stated in its text).
pub fn equations(load: &Load, stats: &HashMap<String, u64>) -> Vec<Equation> {
    let stat = |name: &str| stats.get(name).copied().unwrap_or(0);
    let count = |keep: &dyn Fn(&Record) -> bool| load.records.iter().filter(|r| keep(r)).count() as u64;
    let class = |lo: u16| count(&|r: &Record| r.status.is_some_and(|s| (lo..lo + 100).contains(&s)));
    let streams_200 = count(&|r: &Record| r.streamed && r.outcome.had_200_head());
    let stream_stat = |o: &str| {
        stat(&format!(
            "wasmcustom.{}",
            names::labelled(names::STREAM_OUTCOMES, &[("outcome", o)])
        ))
    };
    // A labelled metric summed over every label combination the filter defined.
    let total = |metric: &str| -> u64 {
        let base = format!("wasmcustom.{metric}");
        let semi = format!("{base};");
        stats
            .iter()
            .filter(|(k, _)| **k == base || k.starts_with(&semi))
            .map(|(_, v)| *v)
            .sum()
    };
    let stream_sum: u64 = [
        "complete",
        "missing_terminal",
        "upstream_error",
        "upstream_cut",
        "client_cancel",
        "timeout",
    ]
    .iter()
    .map(|o| stream_stat(o))
    .sum();
    vec![
        Equation::new(
            "http.llmroute.downstream_rq_total = requests sent",
            stat("http.llmroute.downstream_rq_total"),
            load.sent,
        ),
        Equation::new(
            "downstream_rq_2xx = client answers with a 200 head",
            stat("http.llmroute.downstream_rq_2xx"),
            class(200),
        ),
        Equation::new(
            "downstream_rq_4xx = client 4xx",
            stat("http.llmroute.downstream_rq_4xx"),
            class(400),
        ),
        Equation::new(
            "downstream_rq_5xx = client 5xx",
            stat("http.llmroute.downstream_rq_5xx"),
            class(500),
        ),
        Equation::new(
            "llmroute_requests_total (routed) + llmroute_rejections_total (refused), over all labels = requests sent",
            total(names::REQUESTS) + total(names::REJECTIONS),
            load.sent,
        ),
        Equation::new(
            "sum of llmroute_stream_outcomes_total{outcome} = client streams with a 200 head",
            stream_sum,
            streams_200,
        ),
        Equation::new(
            "llmroute_stream_outcomes_total{outcome=complete} = client streams complete",
            stream_stat("complete"),
            count(&|r: &Record| r.streamed && r.outcome == Outcome::Complete),
        ),
        Equation::new(
            "outcome=missing_terminal + outcome=upstream_error = client streams ending in an error event",
            stream_stat("missing_terminal") + stream_stat("upstream_error"),
            count(&|r: &Record| r.outcome == Outcome::StreamErrorEvent),
        ),
        Equation::new(
            "outcome=upstream_cut = client streams cut",
            stream_stat("upstream_cut"),
            count(&|r: &Record| r.outcome == Outcome::StreamCut),
        ),
        Equation::new(
            "outcome=client_cancel + outcome=timeout = 0",
            stream_stat("client_cancel") + stream_stat("timeout"),
            0,
        ),
    ]
}

/// Today's UTC date, `YYYY-MM-DD`.
pub fn today() -> String {
    crate::bench::machine::Machine::probe().date
}

/// A one-line description of the machine.
pub fn machine_line() -> String {
    let m = crate::bench::machine::Machine::probe();
    format!(
        "{} CPUs ({}), Linux {}, Envoy {}",
        m.nproc, m.cpu_model, m.kernel, m.envoy
    )
}

/// The page the runs write their results to, one dated section each; `docs/chaos-and-soak.md` says what they do.
pub const RESULTS_PAGE: &str = "bench/CHAOS.md";

/// The start of [`RESULTS_PAGE`] when a run creates it.
const RESULTS_HEADER: &str = "# Faults under load and the memory soak: results\n\n\
    Written by `make chaos` and `make soak`, one dated section per run (a rerun on the same day replaces that \
    day's), with the machine it ran on. What the runs do and how they judge: \
    [chaos and soak](../docs/chaos-and-soak.md).\n\n";

/// Writes the section `name` of [`RESULTS_PAGE`] (replacing a section of the same name; the page is created when
/// missing).
pub fn write_results_section(name: &str, body: &str) -> Result<std::path::PathBuf, String> {
    let root = crate::envoy::repo_root();
    let path = root.canonicalize().unwrap_or(root).join(RESULTS_PAGE);
    let doc = match std::fs::read_to_string(&path) {
        Ok(doc) => doc,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => RESULTS_HEADER.to_string(),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let text = crate::bench::sections::upsert(&doc, name, body);
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_schedule_is_seeded_and_inside_the_run() {
        let d = Duration::from_secs(60);
        let a = schedule(1, d);
        assert_eq!(format!("{a:?}"), format!("{:?}", schedule(1, d)));
        assert_ne!(format!("{a:?}"), format!("{:?}", schedule(2, d)));
        assert_eq!(a.len(), 8);
        assert!(a.iter().all(|(t, _)| *t < d));
        assert!(a.windows(2).all(|w| w[0].0 <= w[1].0));
    }

    #[test]
    fn the_request_mix_is_seeded() {
        let mut rng = SplitMix64::new(3);
        let plans: Vec<Planned> = (0..1000).map(|n| plan_request(&mut rng, 3, n)).collect();
        let messages = plans.iter().filter(|p| p.anthropic).count();
        let streamed = plans.iter().filter(|p| p.streamed).count();
        let keyed = plans.iter().filter(|p| p.session.is_some()).count();
        assert!((100..=200).contains(&messages), "{messages}");
        assert!((550..=700).contains(&streamed), "{streamed}");
        assert!((700..=800).contains(&keyed), "{keyed}");
        assert!(plans.iter().all(|p| serde_json::from_str::<Value>(&p.body).is_ok()));
        assert_eq!(plans[7].request_id, "chaos-3-7");
    }
}
