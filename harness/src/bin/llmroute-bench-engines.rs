//! `llmroute-bench-engines` (`make bench-engines`): llmroute and the peer routers side by side in front of three
//! real llama.cpp servers, on a shared-system-prompt workload; writes `bench/ENGINES.md`. See
//! `llmroute_harness::bench::engines`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use llmroute_harness::bench::engines::{self, Settings};
use llmroute_harness::bench::machine::Machine;
use llmroute_harness::bench::sections;
use llmroute_harness::envoy::repo_root;

#[derive(Parser)]
#[command(
    name = "llmroute-bench-engines",
    about = "Routers in front of real llama.cpp servers"
)]
struct Args {
    /// One run per system and tenant count instead of seven: a sanity check, not a result.
    #[arg(long)]
    quick: bool,
    /// Runs per system (the report gives medians).
    #[arg(long)]
    runs: Option<usize>,
    /// Workload seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Only these systems: chwbl, bounded_keys, least_request, round_robin, sglang_cache_aware, sglang_manual,
    /// vllm_consistent_hash, vllm_cache_aware, and (never in a default run) the Envoy replicas
    /// bounded_keys_x2_replicas and bounded_keys_etcd_x2_replicas (comma-separated).
    #[arg(long)]
    systems: Option<String>,
    /// Tenant counts, comma-separated: every system runs with each, one results table per count (default 6,12).
    #[arg(long)]
    tenants: Option<String>,
    /// Where to write the report (default bench/ENGINES.md).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The file whose section gets the results tables (default: RESULTS.md next to the report).
    #[arg(long)]
    results: Option<PathBuf>,
    /// The name of that section.
    #[arg(long, default_value = "placement-engines")]
    section: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let mut settings = if args.quick {
        Settings::quick(args.seed)
    } else {
        Settings::full(args.seed)
    };
    if let Some(runs) = args.runs {
        settings.runs = runs.max(1);
    }
    if let Some(list) = &args.systems {
        match engines::parse_systems(list) {
            Ok(s) => settings.systems = s,
            Err(e) => {
                eprintln!("llmroute-bench-engines: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(list) = &args.tenants {
        match engines::parse_tenants(list) {
            Ok(t) => settings.tenants = t,
            Err(e) => {
                eprintln!("llmroute-bench-engines: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let machine = Machine::probe();
    let outcome = match engines::run(settings).await {
        Ok(o) => o,
        Err(e) => {
            eprintln!("llmroute-bench-engines: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (name, v) in engines::summary(&outcome) {
        println!("{name:<56} {v}");
    }
    let out = args.out.unwrap_or_else(|| repo_root().join("bench/ENGINES.md"));
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("llmroute-bench-engines: creating {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    if let Err(e) = std::fs::write(&out, engines::markdown(&outcome, &machine)) {
        eprintln!("llmroute-bench-engines: writing {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", out.display());
    let summary = args.results.unwrap_or_else(|| out.with_file_name("RESULTS.md"));
    // The link from the summary to the report, relative when the report sits in or below the summary's folder.
    let canonical = |p: &std::path::Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let summary_dir = canonical(
        summary
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new(".")),
    );
    let report = canonical(&out);
    let link = report
        .strip_prefix(&summary_dir)
        .unwrap_or(&report)
        .display()
        .to_string();
    match sections::write(
        &summary,
        &args.section,
        &engines::results_section(&outcome, &machine, &link),
    ) {
        Ok(()) => println!("wrote the {} section of {}", args.section, summary.display()),
        Err(e) => {
            eprintln!("llmroute-bench-engines: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
