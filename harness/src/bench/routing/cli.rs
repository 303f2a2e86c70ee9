//! `llmroute-bench routing`: the arguments and the run, from the bench binary.

use std::path::PathBuf;
use std::process::ExitCode;

use super::policy::Policy;
use super::workload::Workload;
use super::{plot, report, Settings};
use crate::bench::machine::Machine;
use crate::bench::overhead::progress;
use crate::envoy::repo_root;

#[derive(clap::Args, Debug)]
pub struct RoutingArgs {
    /// A sanity run: small traces, one repeat, fewer movement keys (about 2 minutes).
    #[arg(long)]
    pub quick: bool,
    /// Seed of the traces.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Repeats of every workload × policy (default 2; 1 with --quick). Figures are medians over them.
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Only these workloads, comma-separated: shared-prefix, multi-turn, zipf-hot, low-sharing, tenants-6,
    /// tenants-12, tenants-24.
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Only these policies, comma-separated: chwbl-125, chwbl-175, chwbl-200, bounded-keys, least-request,
    /// sglang-cache-aware, sglang-round-robin, vllm-consistent-hash, vllm-cache-aware; and the replicated ones
    /// (N = 2 or 3, each request to a random replica): chwbl-175-xN-replicas, bounded-keys-xN-replicas,
    /// bounded-keys+etcd-xN-replicas (with the placement store on a 3-member etcd).
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Skip the key-movement measurement.
    #[arg(long)]
    pub no_movement: bool,
    /// One fleet per repeat and workload for every policy, reset before each, so that every policy sees the same
    /// engine ports (the same host order and ring); by default each policy gets a fresh fleet.
    #[arg(long)]
    pub same_fleet: bool,
    /// Where ROUTING.md and routing.png go.
    #[arg(long, default_value_os_t = repo_root().join("bench"))]
    pub out: PathBuf,
    /// The file whose section gets the hit-rate table (default: OUT/RESULTS.md).
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// The name of that section.
    #[arg(long, default_value = "placement-emulator")]
    pub section: String,
    /// The section's heading (default: "Placement on emulated engines (`make bench-routing`)").
    #[arg(long)]
    pub title: Option<String>,
}

/// Runs the bench and writes its files.
pub fn main(args: RoutingArgs) -> ExitCode {
    match settings(&args).and_then(|s| run(s, &args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llmroute-bench routing: {e}");
            ExitCode::FAILURE
        }
    }
}

fn settings(args: &RoutingArgs) -> Result<Settings, String> {
    let mut s = if args.quick {
        Settings::quick(args.seed)
    } else {
        Settings::full(args.seed)
    };
    s.repeats = args.repeats.unwrap_or(s.repeats).max(1);
    if !args.workloads.is_empty() {
        s.workloads = args
            .workloads
            .iter()
            .map(|id| Workload::parse(id).ok_or(format!("unknown workload {id:?}")))
            .collect::<Result<_, _>>()?;
    }
    if !args.policies.is_empty() {
        s.policies = args
            .policies
            .iter()
            .map(|id| Policy::parse(id).ok_or(format!("unknown policy {id:?}")))
            .collect::<Result<_, _>>()?;
    }
    if args.no_movement {
        s.movement_keys = 0;
    }
    s.same_fleet = args.same_fleet;
    Ok(s)
}

fn run(settings: Settings, args: &RoutingArgs) -> Result<(), String> {
    let out = args.out.as_path();
    let machine = Machine::probe();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    progress(
        None,
        &format!(
            "routing bench, seed {}, {} repeat(s), {} workloads × {} policies, results to {}",
            settings.seed,
            settings.repeats,
            settings.workloads.len(),
            settings.policies.len(),
            out.display()
        ),
    );
    let outcome = runtime.block_on(super::run(settings))?;
    std::fs::create_dir_all(out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let out = out.canonicalize().unwrap_or_else(|_| out.to_path_buf());
    let png = out.join("routing.png");
    let text = plot::draw(&outcome, &png)?;
    let results = out.join("ROUTING.md");
    std::fs::write(&results, report::markdown(&outcome, &machine, Some("routing.png")))
        .map_err(|e| format!("writing {}: {e}", results.display()))?;
    let summary = args.results.clone().unwrap_or_else(|| out.join("RESULTS.md"));
    let title = args
        .title
        .as_deref()
        .unwrap_or("Placement on emulated engines (`make bench-routing`)");
    // The link from the summary to this run's ROUTING.md, relative when it sits below the summary's folder.
    let summary_dir = summary.parent().and_then(|d| d.canonicalize().ok()).unwrap_or_default();
    let link = results
        .strip_prefix(&summary_dir)
        .unwrap_or(&results)
        .display()
        .to_string();
    let section = report::results_section(&outcome, &machine, title, &link);
    crate::bench::sections::write(&summary, &args.section, &section)?;
    println!("wrote the {} section of {}", args.section, summary.display());
    for line in report::goal_lines(&outcome) {
        println!("{line}");
    }
    for line in super::agreement::goal_lines(&outcome) {
        println!("replicas: {}", line.replace("**", ""));
    }
    for line in report::headline(&outcome, 175) {
        println!("chwbl 175 {line}");
    }
    crate::bench::report::print_written(&results, &png, text, outcome.elapsed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: RoutingArgs,
    }

    #[test]
    fn filters_parse() {
        let w = Wrap::parse_from([
            "x",
            "--quick",
            "--workloads",
            "zipf-hot,low-sharing",
            "--policies",
            "chwbl-125",
        ]);
        let s = settings(&w.args).unwrap();
        assert!(s.quick);
        assert_eq!(s.workloads, [Workload::Zipf, Workload::Control]);
        assert_eq!(s.policies, [Policy::Chwbl(125)]);
        let bad = Wrap::parse_from(["x", "--policies", "nope"]);
        assert!(settings(&bad.args).is_err());
        let tenants = Wrap::parse_from([
            "x",
            "--workloads",
            "tenants-6,tenants-12",
            "--policies",
            "chwbl-175,bounded-keys,sglang-cache-aware",
            "--repeats",
            "1",
            "--no-movement",
            "--same-fleet",
        ]);
        let s = settings(&tenants.args).unwrap();
        assert_eq!(s.workloads, [Workload::Tenants6, Workload::Tenants12]);
        assert_eq!(
            s.policies,
            [Policy::Chwbl(175), Policy::BoundedKeys(150), Policy::SglangCacheAware]
        );
        assert_eq!((s.repeats, s.movement_keys, s.same_fleet), (1, 0, true));
        assert!(!settings(&w.args).unwrap().same_fleet);
    }
}
