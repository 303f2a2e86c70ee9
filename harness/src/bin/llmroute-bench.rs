//! `llmroute-bench`: the benches, and the chaos and soak runs.
//!
//! `llmroute-bench overhead` measures llmroute (Envoy + the filter) against plain Envoy, sglang-router and
//! vllm-router in front of the same fast upstreams, and writes `bench/RESULTS.md` and `bench/overhead.png`.
//! On a machine with two or more CPUs it pins the proxies to CPU 0 and itself (load generator and upstreams, one
//! tokio thread) to CPU 1, so the two never compete for a core.
//!
//! `llmroute-bench chaos` drives load through Envoy and the filter at an emulated fleet under a fault schedule and
//! checks the invariants; `llmroute-bench soak` drives it at a healthy fleet and fails when memory grows. Both
//! write a dated section of `bench/CHAOS.md` unless told not to.
//!
//! `llmroute-bench new-key` measures what the placement store (etcd) adds to a new key's first request, side by
//! side with the same Envoy without it, and writes its section of `bench/RESULTS.md`.
//!
//! `llmroute-bench ab` measures one lever: plain Envoy, the filter built before it and the filter now, in
//! interleaved rounds, and prints the median difference.
//!
//! `llmroute-bench profile` runs one case of the overhead bench system after system and prints each proxy's CPU
//! per request by thread, with a `perf record` of each when asked (method in `bench/README.md`).
//!
//! `llmroute-bench glue` drives the filter's .wasm through bench requests with a JavaScript proxy-wasm host in
//! node's V8, under its CPU profiler, and prints where the filter's own code spends its time.
//!
//! `llmroute-bench routing` replays workloads through llmroute and the peer routers' policies in front of emulated
//! engines with a cost model, against the oracle, and writes `bench/ROUTING.md` and `bench/routing.png`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand};
use llmroute_harness::bench::machine::Machine;
use llmroute_harness::bench::overhead::{self, progress, Settings};
use llmroute_harness::bench::report::{self, Micro};
use llmroute_harness::bench::systems::Kind;
use llmroute_harness::bench::{ab, glue, goals, instructions, micro, plot, profile, replicas, sections};
use llmroute_harness::chaos;
use llmroute_harness::envoy::repo_root;

#[derive(Parser)]
#[command(name = "llmroute-bench", version, about = "llmroute's benches")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The filter's overhead against plain Envoy and the peer routers; writes RESULTS.md and overhead.png.
    Overhead(OverheadArgs),
    /// Routing quality against the peer routers and the oracle, in front of emulated engines with a cost model;
    /// writes ROUTING.md and routing.png.
    Routing(llmroute_harness::bench::routing::cli::RoutingArgs),
    /// How often two replicas with `placement: bounded_keys` disagree when their traffic differs (a simulation
    /// with the filter's own placement function); writes its section of RESULTS.md.
    Replicas(ReplicasArgs),
    /// The added latency of a new key's first request with the placement store (a 3-member etcd on loopback),
    /// against the same Envoy without it; writes its section of RESULTS.md.
    NewKey(NewKeyArgs),
    /// Faults under load: ~200 requests/s at an emulated fleet that fails in every way, then the invariants.
    Chaos(ChaosArgs),
    /// Memory soak: load at a healthy fleet; fails when the filter's VM memory or Envoy's heap grows.
    Soak(SoakArgs),
    /// One case of the overhead bench, system after system: each proxy's CPU per request by thread, and a
    /// `perf record` of it with `--perf-dir`.
    Profile(ProfileArgs),
    /// One lever side by side: plain Envoy, the filter built before it (`--baseline`) and the filter now, in
    /// interleaved rounds at one body size and concurrency.
    Ab(AbArgs),
    /// The filter's own code function by function: the .wasm driven through bench requests by a JavaScript
    /// proxy-wasm host in node's V8, under its CPU profiler (build it with its names: `make bench-glue`).
    Glue(GlueArgs),
    /// Instructions per request inside Envoy, counted by callgrind: plain Envoy, the native build phase by phase
    /// and as shipped (and the wasm filter with `--wasm`), each sent the same requests one at a time.
    Instructions(InstructionsArgs),
}

#[derive(clap::Args)]
struct InstructionsArgs {
    /// Body sizes in bytes, each counted on every row.
    #[arg(long, value_delimiter = ',', default_values_t = [4096, 262144])]
    sizes: Vec<usize>,
    /// Requests counted per row.
    #[arg(long, default_value_t = 400)]
    requests: usize,
    /// Requests sent before counting.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Count the wasm filter too (V8 under valgrind: a few minutes more).
    #[arg(long)]
    wasm: bool,
    /// Keep callgrind's files in DIR, for callgrind_annotate.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// The file whose `instructions` section is written.
    #[arg(long, default_value_os_t = repo_root().join("bench/RESULTS.md"))]
    out: PathBuf,
    /// Print the result only; write no file.
    #[arg(long)]
    no_doc: bool,
}

#[derive(clap::Args)]
struct GlueArgs {
    /// The filter, built with its function names (`make bench-glue` builds and passes it).
    #[arg(long, default_value_os_t = repo_root().join("target/wasm32-wasip1/release/llmroute_filter_named.wasm"))]
    wasm: PathBuf,
    /// Body size in bytes.
    #[arg(long, default_value_t = 4096)]
    size: usize,
    /// Requests per round (7 rounds after a warm-up); default: about 80 MiB of bodies a round, fewer for a long
    /// stream, at least 200.
    #[arg(long)]
    requests: Option<usize>,
    /// Answer with a stream of this many content deltas (then the usage chunk and `[DONE]`), each chunk in its own
    /// body callback; 0: the bench upstream's JSON answer.
    #[arg(long, default_value_t = 0)]
    stream_events: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Functions listed by self time.
    #[arg(long, default_value_t = 30)]
    top: usize,
}

#[derive(clap::Args)]
struct ChaosArgs {
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Requests per second.
    #[arg(long, env = "CHAOS_RPS", default_value_t = 200)]
    rps: u32,
    /// Length of the load, in seconds.
    #[arg(long, env = "CHAOS_SECONDS", default_value_t = 60)]
    seconds: u64,
    /// Outlier ejection's base time, in ms.
    #[arg(long, default_value_t = 5000)]
    base_ejection_ms: u64,
    /// Print the result only; do not write bench/CHAOS.md.
    #[arg(long)]
    no_doc: bool,
}

#[derive(clap::Args)]
struct SoakArgs {
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Requests per second.
    #[arg(long, env = "SOAK_RPS", default_value_t = 200)]
    rps: u32,
    /// Length of the load, in seconds (default 30 minutes).
    #[arg(long, env = "SOAK_SECONDS", default_value_t = 1800)]
    seconds: u64,
    /// Seconds between memory samples (default: the run's length / 120, from 1 to 15).
    #[arg(long)]
    sample_seconds: Option<u64>,
    /// Print the result only; do not write bench/CHAOS.md.
    #[arg(long)]
    no_doc: bool,
}

#[derive(clap::Args)]
struct ReplicasArgs {
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// The file whose `replicas` section is written.
    #[arg(long, default_value_os_t = repo_root().join("bench/RESULTS.md"))]
    out: PathBuf,
}

#[derive(clap::Args)]
struct NewKeyArgs {
    /// A sanity run: 40 keys instead of 400.
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Fresh keys per Envoy (default 400; 40 with --quick).
    #[arg(long)]
    keys: Option<usize>,
    /// The file whose `placement-store-cost` section is written.
    #[arg(long, default_value_os_t = repo_root().join("bench/RESULTS.md"))]
    out: PathBuf,
}

#[derive(clap::Args)]
struct AbArgs {
    /// The filter built before the lever (a `.wasm`).
    #[arg(long)]
    baseline: PathBuf,
    /// Body size in bytes.
    #[arg(long, default_value_t = 4096)]
    size: usize,
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    #[arg(long, default_value_t = 15)]
    rounds: usize,
    /// Length of one round in ms.
    #[arg(long, default_value_t = 1200)]
    round_ms: u64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Then load every Envoy with 1 MiB bodies for this long and measure again (0: no second measurement).
    #[arg(long, default_value_t = 0)]
    age_seconds: u64,
    /// Answers streamed: this many content deltas (then the usage chunk and `[DONE]`), each chunk 1 ms after the
    /// last, so each is its own read; 0: the JSON answer.
    #[arg(long, default_value_t = 0)]
    stream_events: usize,
    /// Start the three Envoys afresh this many times, each for `--rounds` rounds; the lever is then the median over
    /// every round, and each repeat's own is printed too.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
}

#[derive(clap::Args)]
struct ProfileArgs {
    /// Systems to measure, one after the other: llmroute, plain, bounded, bk+etcd, sglang, vllm.
    #[arg(long, value_delimiter = ',', default_value = "plain,llmroute")]
    systems: Vec<String>,
    /// Body size in bytes.
    #[arg(long, default_value_t = 4096)]
    size: usize,
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Seconds of load per system.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Record each system with `perf record -g` into DIR/<system>-<fresh|aged>.perf.data.
    #[arg(long)]
    perf_dir: Option<PathBuf>,
    /// Measure each system again after this many seconds of load at concurrency 16 (0: fresh only).
    #[arg(long, default_value_t = 0)]
    age_seconds: u64,
    /// Body size in bytes of the ageing load.
    #[arg(long, default_value_t = 1 << 20)]
    age_size: usize,
}

#[derive(clap::Args)]
struct OverheadArgs {
    /// A fast sanity run (4 KiB and 256 KiB, concurrency 1 and 16, 2 short rounds), about a minute.
    #[arg(long)]
    quick: bool,
    /// Seed of the request bodies.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Interleaved rounds per case (default 5; 2 with --quick).
    #[arg(long)]
    rounds: Option<usize>,
    /// Length of one round in ms (default 1200; 1000 with --quick).
    #[arg(long)]
    round_ms: Option<u64>,
    /// Where RESULTS.md and overhead.png go.
    #[arg(long, default_value_os_t = repo_root().join("bench"))]
    out: PathBuf,
    /// Do not pin the proxies and the bench to separate CPUs.
    #[arg(long)]
    no_pin: bool,
}

fn main() -> ExitCode {
    let args = match Cli::parse().command {
        Cmd::Overhead(args) => args,
        Cmd::Routing(args) => return llmroute_harness::bench::routing::cli::main(args),
        Cmd::Replicas(args) => return replicas(&args),
        Cmd::NewKey(args) => return new_key(&args),
        Cmd::Chaos(args) => return chaos(&args),
        Cmd::Soak(args) => return soak(&args),
        Cmd::Profile(args) => return profile(&args),
        Cmd::Ab(args) => return ab(&args),
        Cmd::Glue(args) => return glue(&args),
        Cmd::Instructions(args) => return instructions(&args),
    };
    let machine = Machine::probe();
    let mut settings = if args.quick {
        Settings::quick(args.seed)
    } else {
        Settings::full(args.seed)
    };
    settings.rounds = args.rounds.unwrap_or(settings.rounds).max(1);
    if let Some(ms) = args.round_ms {
        settings.round = std::time::Duration::from_millis(ms.max(100));
    }
    if !args.no_pin && machine.cpus() >= 2 && pin_self("1") {
        settings.proxy_cpus = Some("0".into());
        settings.bench_cpus = Some("1".into());
    }
    match run(settings, &machine, &args.out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llmroute-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn replicas(args: &ReplicasArgs) -> ExitCode {
    let figures = replicas::run_all(args.seed);
    let table = replicas::markdown(&figures, args.seed);
    println!("{table}");
    let body = format!(
        "## Placement: how often two replicas disagree (`llmroute-bench replicas`)\n\n{}\n\n{table}",
        replicas::EXPLAINER
    );
    write_section(&args.out, "replicas", &body)
}

fn new_key(args: &NewKeyArgs) -> ExitCode {
    use llmroute_harness::bench::new_key;
    let mut settings = if args.quick {
        new_key::Settings::quick(args.seed)
    } else {
        new_key::Settings::full(args.seed)
    };
    settings.keys = args.keys.unwrap_or(settings.keys).max(1);
    let machine = Machine::probe();
    let outcome = match runtime().and_then(|rt| rt.block_on(new_key::run(settings))) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("llmroute-bench new-key: {e}");
            return ExitCode::FAILURE;
        }
    };
    let md = new_key::markdown(&outcome, &machine);
    println!("{md}");
    write_section(&args.out, "placement-store-cost", &md)
}

fn chaos_settings(seed: u64, rps: u32, seconds: u64, base_ejection_ms: u64) -> chaos::Settings {
    chaos::Settings {
        seed,
        rps: rps.max(1),
        duration: std::time::Duration::from_secs(seconds.max(1)),
        base_ejection: std::time::Duration::from_millis(base_ejection_ms),
        progress_every: std::time::Duration::from_secs(5),
    }
}

/// One tokio thread: the load benches pin the process to one CPU, load generator and upstreams together.
fn one_thread_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

/// Prints `text`, writes it to the results page's section `name` unless `no_doc`, and exits by `passed`.
fn finish(text: &str, name: &str, no_doc: bool, passed: bool) -> ExitCode {
    println!("\n{text}");
    if !no_doc {
        match chaos::write_results_section(name, text) {
            Ok(path) => println!("wrote the section {name} of {}", path.display()),
            Err(e) => {
                eprintln!("llmroute-bench: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if passed {
        println!("PASS");
        ExitCode::SUCCESS
    } else {
        println!("FAIL: an invariant does not hold (see above)");
        ExitCode::FAILURE
    }
}

fn chaos(args: &ChaosArgs) -> ExitCode {
    let settings = chaos_settings(args.seed, args.rps, args.seconds, args.base_ejection_ms);
    let report = match runtime().and_then(|rt| rt.block_on(chaos::run_chaos(settings))) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("llmroute-bench chaos: {e}");
            return ExitCode::FAILURE;
        }
    };
    let date = chaos::today();
    let text = report.markdown(&date, &chaos::machine_line());
    finish(&text, &format!("chaos-{date}"), args.no_doc, report.passed())
}

fn soak(args: &SoakArgs) -> ExitCode {
    let settings = chaos_settings(args.seed, args.rps, args.seconds, 5000);
    let every = args.sample_seconds.unwrap_or(args.seconds / 120).clamp(1, 15);
    let run = chaos::soak::run_soak(settings, std::time::Duration::from_secs(every));
    let report = match runtime().and_then(|rt| rt.block_on(run)) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("llmroute-bench soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    let date = chaos::today();
    let text = report.markdown(&date, &chaos::machine_line());
    finish(&text, &format!("soak-{date}"), args.no_doc, report.passed())
}

/// Pins this process (its only thread, so far) to `cpus`; threads started later inherit it.
fn ab(args: &AbArgs) -> ExitCode {
    let pinned = Machine::probe().cpus() >= 2 && pin_self("1");
    let settings = ab::Settings {
        baseline: args.baseline.clone(),
        size: args.size,
        concurrency: args.concurrency.max(1),
        rounds: args.rounds.max(1),
        round: std::time::Duration::from_millis(args.round_ms.max(100)),
        seed: args.seed,
        proxy_cpus: pinned.then(|| "0".to_string()),
        age_seconds: args.age_seconds,
        stream_events: args.stream_events,
        repeats: args.repeats.max(1),
    };
    match one_thread_runtime().and_then(|rt| rt.block_on(ab::run(&settings))) {
        Ok(c) => {
            if args.stream_events > 0 {
                println!(
                    "answers streamed: {} content deltas, the usage chunk and [DONE], each chunk its own read",
                    args.stream_events
                );
            }
            println!("{}", ab::summary(&c, &args.baseline.display().to_string()));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("llmroute-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn glue(args: &GlueArgs) -> ExitCode {
    let settings = glue::Settings {
        wasm: args.wasm.clone(),
        host: repo_root().join("harness/glue/host.mjs"),
        size: args.size.max(2),
        requests: args.requests.unwrap_or_else(|| {
            let by_body = ((80 << 20) / args.size.max(1)).clamp(200, 20_000);
            (by_body / (1 + args.stream_events / 10)).max(200)
        }),
        stream_events: args.stream_events,
        seed: args.seed,
        top: args.top,
    };
    match glue::run(&settings) {
        Ok(g) => {
            println!("{}", glue::summary(&g, &settings));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("llmroute-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn profile(args: &ProfileArgs) -> ExitCode {
    let mut systems = Vec::new();
    for name in &args.systems {
        match Kind::ALL.into_iter().find(|k| k.short() == name) {
            Some(kind) => systems.push(kind),
            None => {
                let known: Vec<&str> = Kind::ALL.iter().map(|k| k.short()).collect();
                eprintln!(
                    "llmroute-bench: --systems: unknown system {name:?}; known: {}",
                    known.join(", ")
                );
                return ExitCode::FAILURE;
            }
        }
    }
    let pinned = Machine::probe().cpus() >= 2 && pin_self("1");
    let settings = profile::Settings {
        systems,
        size: args.size,
        concurrency: args.concurrency.max(1),
        seconds: args.seconds.max(1),
        seed: args.seed,
        perf_dir: args.perf_dir.clone(),
        proxy_cpus: pinned.then(|| "0".to_string()),
        age_seconds: args.age_seconds,
        age_size: args.age_size,
    };
    if let Some(dir) = &settings.perf_dir {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("llmroute-bench: creating {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    match one_thread_runtime().and_then(|rt| rt.block_on(profile::run(&settings))) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llmroute-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the section `name` of `out` (see `sections`) and says so.
fn write_section(out: &Path, name: &str, body: &str) -> ExitCode {
    match sections::write(out, name, body) {
        Ok(()) => {
            println!("wrote the {name} section of {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("llmroute-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn instructions(args: &InstructionsArgs) -> ExitCode {
    let settings = instructions::Settings {
        sizes: args.sizes.clone(),
        requests: args.requests.max(1),
        warmup: args.warmup,
        seed: args.seed,
        wasm: args.wasm,
        out_dir: args.out_dir.clone(),
    };
    match one_thread_runtime().and_then(|rt| rt.block_on(instructions::run(&settings))) {
        Ok(rows) => {
            let m = Machine::probe();
            let when = format!("{} (Envoy {}, {})", m.date, m.envoy, m.cpu_model);
            let md = instructions::markdown(&rows, &settings, &when);
            println!("{md}");
            if args.no_doc {
                return ExitCode::SUCCESS;
            }
            write_section(&args.out, "instructions", &md)
        }
        Err(e) => {
            eprintln!("llmroute-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn pin_self(cpus: &str) -> bool {
    let pid = std::process::id().to_string();
    Command::new("taskset")
        .args(["-p", "-c", cpus, &pid])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run(settings: Settings, machine: &Machine, out: &Path) -> Result<(), String> {
    let runtime = one_thread_runtime()?;
    progress(
        None,
        &format!("overhead bench, seed {}, results to {}", settings.seed, out.display()),
    );
    let outcome = runtime.block_on(overhead::run(settings))?;
    let micro = Micro {
        criterion: micro::criterion_table(&criterion_dir()),
        alloc: micro::alloc_table(&out.join("out/alloc.md")),
    };
    std::fs::create_dir_all(out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let out = &out.canonicalize().unwrap_or_else(|_| out.to_path_buf());
    let results = out.join("RESULTS.md");
    // The sections other benches own (placement rows, replica disagreement) are carried over.
    let kept = sections::all(&std::fs::read_to_string(&results).unwrap_or_default());
    let text = format!("{}\n{kept}", report::markdown(&outcome, machine, &micro).trim_end());
    std::fs::write(&results, text.trim_end().to_string() + "\n")
        .map_err(|e| format!("writing {}: {e}", results.display()))?;
    let png = out.join("overhead.png");
    let text = plot::draw(&outcome, &png)?;
    print_goals(&outcome);
    report::print_written(&results, &png, text, outcome.elapsed);
    Ok(())
}

/// One line per goal: the verdict as measured, then on proxy CPU per request.
fn print_goals(outcome: &overhead::Outcome) {
    for check in goals::checks(outcome) {
        let by_cpu = check.by_cpu.map_or(String::new(), |(m, met)| {
            format!("  | on CPU: {m} {}", goals::verdict(met))
        });
        let verdict = goals::verdict(check.met);
        println!(
            "{verdict:<7} {:<14} {:<42} {}{by_cpu}",
            check.case, check.goal, check.measured
        );
    }
}

/// Criterion's output folder: `$CARGO_TARGET_DIR/criterion`, else `target/criterion`.
fn criterion_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
        .join("criterion")
}
