//! `llmroute-bench-engines` (`make bench-engines`): llmroute and the peer routers side by side in front of three
//! real llama.cpp servers, on a shared-system-prompt workload and on a hot-tenant one; writes `bench/ENGINES.md`.
//! See `llmroute_harness::bench::engines` and `llmroute_harness::bench::hot_tenant`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use llmroute_harness::bench::engines::{self, Settings};
use llmroute_harness::bench::hot_tenant::{self, HotSettings};
use llmroute_harness::bench::machine::Machine;
use llmroute_harness::bench::sections;
use llmroute_harness::envoy::repo_root;

#[derive(Parser)]
#[command(
    name = "llmroute-bench-engines",
    about = "Routers in front of real llama.cpp servers"
)]
struct Args {
    /// One run per system and tenant count instead of seven (three for the hot tenant): a sanity check, not a
    /// result.
    #[arg(long)]
    quick: bool,
    /// The workloads, comma-separated: `shared_prompt` (tenants sharing system prompts; the report's main tables)
    /// and `hot_tenant` (one tenant floods the fleet; its own section of the report). Default both.
    #[arg(long, default_value = "shared_prompt,hot_tenant")]
    workload: String,
    /// Runs per system (the report gives medians).
    #[arg(long)]
    runs: Option<usize>,
    /// Workload seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Only these systems: chwbl, bounded_keys, least_request, round_robin, sglang_cache_aware, sglang_manual,
    /// vllm_consistent_hash, vllm_cache_aware, load_fairness (the hot tenant's by default), and (never in a default
    /// run) the Envoy replicas bounded_keys_x2_replicas and bounded_keys_etcd_x2_replicas (comma-separated).
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
    let (mut shared, mut hot) = (false, false);
    for w in args.workload.split(',').map(str::trim) {
        match w {
            "shared_prompt" => shared = true,
            "hot_tenant" => hot = true,
            other => {
                eprintln!("llmroute-bench-engines: unknown workload {other:?} (known: shared_prompt, hot_tenant)");
                return ExitCode::FAILURE;
            }
        }
    }
    let systems = match args.systems.as_deref().map(engines::parse_systems).transpose() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("llmroute-bench-engines: {e}");
            return ExitCode::FAILURE;
        }
    };
    let out = args.out.clone().unwrap_or_else(|| repo_root().join("bench/ENGINES.md"));
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("llmroute-bench-engines: creating {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    if shared {
        if let Err(e) = shared_prompt(&args, systems.clone(), &out).await {
            eprintln!("llmroute-bench-engines: {e}");
            return ExitCode::FAILURE;
        }
    }
    if hot {
        let mut settings = if args.quick {
            HotSettings::quick(args.seed)
        } else {
            HotSettings::full(args.seed)
        };
        if let Some(runs) = args.runs {
            settings.runs = runs.max(1);
        }
        if let Some(s) = systems {
            settings.systems = s;
        }
        let machine = Machine::probe();
        let outcome = match hot_tenant::run(settings).await {
            Ok(o) => o,
            Err(e) => {
                eprintln!("llmroute-bench-engines: {e}");
                return ExitCode::FAILURE;
            }
        };
        for (name, v) in hot_tenant::summary(&outcome) {
            println!("{name:<56} {v}");
        }
        match sections::write(&out, "hot-tenant", &hot_tenant::markdown(&outcome, &machine)) {
            Ok(()) => println!("wrote the hot-tenant section of {}", out.display()),
            Err(e) => {
                eprintln!("llmroute-bench-engines: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// The shared-prompt workload: `out` rewritten whole (the sections other workloads own carried over), and its
/// summary section in the results file.
async fn shared_prompt(args: &Args, systems: Option<Vec<engines::SystemKind>>, out: &Path) -> Result<(), String> {
    let mut settings = if args.quick {
        Settings::quick(args.seed)
    } else {
        Settings::full(args.seed)
    };
    if let Some(runs) = args.runs {
        settings.runs = runs.max(1);
    }
    if let Some(s) = systems {
        settings.systems = s;
    }
    if let Some(list) = &args.tenants {
        settings.tenants = engines::parse_tenants(list)?;
    }
    let machine = Machine::probe();
    let outcome = engines::run(settings).await?;
    for (name, v) in engines::summary(&outcome) {
        println!("{name:<56} {v}");
    }
    let kept = sections::all(&std::fs::read_to_string(out).unwrap_or_default());
    let doc = format!("{}\n{kept}", engines::markdown(&outcome, &machine).trim_end());
    std::fs::write(out, doc.trim_end().to_string() + "\n").map_err(|e| format!("writing {}: {e}", out.display()))?;
    println!("wrote {}", out.display());
    let summary = args.results.clone().unwrap_or_else(|| out.with_file_name("RESULTS.md"));
    // The link from the summary to the report, relative when the report sits in or below the summary's folder.
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let summary_dir = canonical(
        summary
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new(".")),
    );
    let report = canonical(out);
    let link = report
        .strip_prefix(&summary_dir)
        .unwrap_or(&report)
        .display()
        .to_string();
    sections::write(
        &summary,
        &args.section,
        &engines::results_section(&outcome, &machine, &link),
    )?;
    println!("wrote the {} section of {}", args.section, summary.display());
    Ok(())
}
