//! Instructions per request inside Envoy, counted by callgrind (`llmroute-bench instructions`, `make
//! bench-instructions`).
//!
//! The overhead bench times proxies on a shared 2-CPU machine, where two runs of one phase breakdown disagree by
//! more than most phases cost. An instruction count does not depend on what else the machine runs: each row here
//! is one Envoy under `valgrind --tool=callgrind`, sent the same requests one at a time, and its instructions are
//! counted per thread over a window of `requests` requests after a warm-up. The worker thread's count per request
//! is the figure (one worker: every request runs on it); the other threads (the main thread's stats flush, the
//! filter's periodic work) are shown beside it. Instructions are not time: a cache miss costs more than an add.
//! They say which code runs, and how much of it, repeatably.
//!
//! Rows: plain Envoy, the native build's phases (`make native-phases`, as in the phase breakdown of the overhead
//! bench: each row runs the filter up to that phase and routes statically), the shipped native build routed
//! statically and as it ships, and the shipped wasm filter (V8 under valgrind: slow, so with `--wasm` only).
//! For the shipped native row, callgrind's inclusive counts of the module's hooks and of Envoy's callbacks the
//! module calls say how much of the worker's count runs under the module, and which callbacks cost most.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use super::load::{self, Prepared};
use super::overhead::{prepare, progress};
use super::phases::{self, Build, SHIPPED_ROW};
use super::systems::{bench_config, CHAT_PATH};
use super::upstream::Upstreams;
use crate::envoy::{native_module, phases_native_module, wasm_module, Envoy, EnvoyOptions};

/// What to count.
pub struct Settings {
    /// Body sizes, each counted on every row's Envoy in turn.
    pub sizes: Vec<usize>,
    /// Requests counted per row.
    pub requests: usize,
    /// Requests sent before counting starts (the first ones uncounted and fast, then a few counted and dropped).
    pub warmup: usize,
    pub seed: u64,
    /// Count the wasm filter too.
    pub wasm: bool,
    /// Keep callgrind's files here (else a temporary directory).
    pub out_dir: Option<PathBuf>,
}

/// One row's counts at one body size.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    pub size: usize,
    /// The worker thread's instructions per request.
    pub worker: f64,
    /// Every other thread's, per request.
    pub others: f64,
    /// Inclusive instructions per request of the functions named in [`ATTRIBUTED`] (shipped native row only).
    pub functions: Vec<(String, f64)>,
}

/// The functions whose inclusive cost is listed for the shipped native build: the module's hooks and Envoy's
/// callbacks (both exported, so named in a stripped Envoy).
const ATTRIBUTED: [&str; 2] = ["envoy_dynamic_module_on_", "envoy_dynamic_module_callback_"];

/// glibc's thresholds above which memcpy and memset use `rep movsb` and `rep stosb`, set out of reach.
const NO_REP_STRINGS: &str =
    "glibc.cpu.x86_rep_movsb_threshold=4294967295:glibc.cpu.x86_rep_stosb_threshold=4294967295";

/// Envoy's stat callbacks (their inclusive count is Envoy's stats code).
const STATS: [&str; 4] = [
    "envoy_dynamic_module_callback_http_filter_config_increment",
    "envoy_dynamic_module_callback_http_filter_config_decrement",
    "envoy_dynamic_module_callback_http_filter_config_set_gauge",
    "envoy_dynamic_module_callback_http_filter_config_record_histogram",
];

/// The row whose functions are listed.
const SHIPPED: &str = SHIPPED_ROW;

/// Counts every row; one line of progress per row.
pub async fn run(settings: &Settings) -> Result<Vec<Row>, String> {
    let upstreams = Upstreams::start(1)
        .await
        .map_err(|e| format!("starting the upstream: {e}"))?;
    let phased = phases_native_module();
    if !phased.exists() {
        return Err(format!("{} is missing: run `make native-phases`", phased.display()));
    }
    let temp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dir = settings.out_dir.clone().unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let base = EnvoyOptions {
        concurrency: 1,
        log_level: "warning".into(),
        module: Some(native_module()),
        ..EnvoyOptions::default()
    };
    let mut rows = phases::rows(Build::Native, base.clone(), &phased);
    if settings.wasm {
        rows.push((
            "the shipped wasm filter".into(),
            EnvoyOptions {
                module: None,
                wasm: Some(wasm_module()),
                ..base.clone()
            },
        ));
    }
    let client = load::client(1).map_err(|e| format!("building the HTTP client: {e}"))?;
    let mut out = Vec::new();
    for (i, (name, opts)) in rows.into_iter().enumerate() {
        let attribute = name == SHIPPED;
        for row in count_row(settings, &dir, i, &name, opts, &upstreams, &client, attribute).await? {
            progress(
                None,
                &format!(
                    "{name}, {} B: {:.0} instructions per request on the worker, {:.0} on other threads",
                    row.size, row.worker, row.others
                ),
            );
            out.push(row);
        }
    }
    Ok(out)
}

/// One row's Envoy under callgrind, counted at every size: instrumentation is switched on after the first
/// warm-up, and each size's counters are zeroed after its own warm-up and dumped after its requests.
#[allow(clippy::too_many_arguments)]
async fn count_row(
    settings: &Settings,
    dir: &Path,
    index: usize,
    name: &str,
    mut opts: EnvoyOptions,
    upstreams: &Upstreams,
    client: &reqwest::Client,
    attribute: bool,
) -> Result<Vec<Row>, String> {
    let prefix = dir.join(format!("row{index}"));
    opts.wrapper = vec![
        "valgrind".into(),
        "--tool=callgrind".into(),
        "--instr-atstart=no".into(),
        "--separate-threads=yes".into(),
        // V8 writes and runs its own code (the wasm row).
        "--smc-check=all-non-file".into(),
        format!("--callgrind-out-file={}.%p", prefix.display()),
    ];
    // glibc copies and fills large blocks with `rep movsb` / `rep stosb`, which callgrind counts one instruction
    // per byte; its vector loops count about one per 32 bytes, nearer what such a copy costs.
    opts.env.push(("GLIBC_TUNABLES".into(), NO_REP_STRINGS.into()));
    progress(None, &format!("starting {name} under callgrind"));
    let envoy = Envoy::start_with(bench_config(&upstreams.endpoints()), opts)
        .await
        .map_err(|e| format!("{name} did not start: {e}"))?;
    let url = envoy.url(CHAT_PATH);
    let pid = envoy.pid();
    let failed = |e: String| format!("{name}: {e}");
    let mut rows = Vec::new();
    for (dump, &size) in settings.sizes.iter().enumerate() {
        let requests = prepare(size, 8, settings.seed);
        send(client, &url, &requests, settings.warmup).await.map_err(failed)?;
        if dump == 0 {
            control(pid, &["-i", "on"])?;
            send(client, &url, &requests, settings.warmup.div_ceil(4))
                .await
                .map_err(failed)?;
        }
        control(pid, &["-z"])?;
        send(client, &url, &requests, settings.requests).await.map_err(failed)?;
        control(pid, &["-d"])?;
        let files = dumps(dir, &format!("row{index}.{pid}.{}", dump + 1))?;
        rows.push(row_of(name, size, &files, settings.requests, attribute)?);
    }
    drop(envoy);
    Ok(rows)
}

/// A row from one dump's files (one per thread): the busiest thread is the worker.
fn row_of(name: &str, size: usize, files: &[PathBuf], requests: usize, attribute: bool) -> Result<Row, String> {
    let mut threads: Vec<(u64, &PathBuf)> = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        threads.push((totals(&text), f));
    }
    threads.sort_by_key(|t| std::cmp::Reverse(t.0));
    let n = requests.max(1) as f64;
    let Some(&(worker, worker_file)) = threads.first() else {
        return Err(format!("{name}: callgrind wrote no dump"));
    };
    let others: u64 = threads.iter().skip(1).map(|t| t.0).sum();
    let functions = match attribute {
        true => inclusive(worker_file)?
            .into_iter()
            .map(|(f, ir)| (f, ir as f64 / n))
            .collect(),
        false => Vec::new(),
    };
    Ok(Row {
        name: name.to_string(),
        size,
        worker: worker as f64 / n,
        others: others as f64 / n,
        functions,
    })
}

/// Sends `n` requests one at a time.
async fn send(client: &reqwest::Client, url: &str, requests: &Arc<[Prepared]>, n: usize) -> Result<(), String> {
    for i in 0..n {
        if let Some(r) = requests.get(i % requests.len().max(1)) {
            load::send(client, url, r).await?;
        }
    }
    Ok(())
}

/// `callgrind_control ARGS... PID`.
fn control(pid: u32, args: &[&str]) -> Result<(), String> {
    let out = Command::new("callgrind_control")
        .args(args)
        .arg(pid.to_string())
        .output()
        .map_err(|e| format!("callgrind_control (valgrind's): {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "callgrind_control {} {pid}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// The files of the dump `stem` (`<prefix>.<pid>.<dump>`, one file per thread).
fn dumps(dir: &Path, stem: &str) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name == stem || name.strip_prefix(stem).is_some_and(|rest| rest.starts_with('-')) {
            files.push(path);
        }
    }
    Ok(files)
}

/// A dump's instruction total (`totals:` or `summary:`).
fn totals(text: &str) -> u64 {
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Inclusive instructions of the [`ATTRIBUTED`] functions in a dump, from `callgrind_annotate --inclusive=yes`.
fn inclusive(file: &Path) -> Result<Vec<(String, u64)>, String> {
    let out = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(file)
        .output()
        .map_err(|e| format!("callgrind_annotate (valgrind's): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut found = Vec::new();
    for line in text.lines() {
        let Some((count, rest)) = line.trim().split_once(' ') else {
            continue;
        };
        let Ok(ir) = count.replace(',', "").parse::<u64>() else {
            continue;
        };
        // `file:function [object]`, after the count's percentage; a source line's count is not a function's.
        let function = rest.split_whitespace().find_map(|w| {
            let name = w.rsplit(':').next()?;
            let symbol = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            (symbol && ATTRIBUTED.iter().any(|p| name.starts_with(p))).then_some(name)
        });
        if let Some(name) = function {
            if !found.iter().any(|(f, _)| f == name) {
                found.push((name.to_string(), ir));
            }
        }
    }
    Ok(found)
}

/// The phases whose sum is the floor of any body-routing filter in this build (as in the phase breakdown).
const FLOOR: [&str; 3] = [
    "the filter up to phase `enter`",
    "the filter up to phase `copy`",
    "the filter up to phase `scan`",
];

/// The section of `bench/RESULTS.md`: per size, every row's worker count against plain Envoy's and the row above
/// it, the floor's phases summed, the instruction budget of the 0.9x goal, and the shipped row's functions.
pub fn markdown(rows: &[Row], settings: &Settings, when: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Instructions per request inside Envoy (`make bench-instructions`)\n"
    );
    let _ = writeln!(
        md,
        "Counted by callgrind on {when}: each row is one Envoy (one worker) under `valgrind --tool=callgrind`, sent \
         {} requests one at a time after a warm-up, its instructions counted per thread. The worker's count per \
         request is the figure; the other threads (stats flush, the filter's periodic work) run on timers and are \
         shown apart. Counts repeat from run to run, whatever else the machine does; instructions are not time \
         (the kernel's share of a request, its system calls, is not counted, and a simple loop such as the body \
         scan runs more instructions per cycle than Envoy's pointer-chasing code). glibc is kept from copying with \
         `rep movsb`, which callgrind would count one instruction per byte. The phase rows run the native build up \
         to that phase and route statically, as in the overhead bench's phase breakdown.\n",
        settings.requests
    );
    for &size in &settings.sizes {
        let of_size: Vec<&Row> = rows.iter().filter(|r| r.size == size).collect();
        let plain = of_size.first().map(|r| r.worker).unwrap_or(0.0);
        let _ = writeln!(md, "### {} bodies\n", super::body::size_label(size));
        let _ = writeln!(
            md,
            "| row | worker, per request | over plain | over the row above | other threads |"
        );
        let _ = writeln!(md, "|---|---:|---:|---:|---:|");
        let mut above = plain;
        for r in &of_size {
            let _ = writeln!(
                md,
                "| {} | {:.0} | {:+.0} | {:+.0} | {:.0} |",
                r.name,
                r.worker,
                r.worker - plain,
                r.worker - above,
                r.others
            );
            above = r.worker;
        }
        let added = |name: &str| -> Option<f64> {
            let at = of_size.iter().position(|r| r.name == name)?;
            let before = at.checked_sub(1).and_then(|b| of_size.get(b))?;
            Some(of_size.get(at)?.worker - before.worker)
        };
        let floor: Option<f64> = FLOOR.iter().map(|n| added(n)).sum();
        let shipped = of_size.iter().find(|r| r.name == SHIPPED);
        if let (Some(floor), Some(shipped), true) = (floor, shipped, plain > 0.0) {
            let over = shipped.worker - plain;
            let stats: f64 = shipped
                .functions
                .iter()
                .filter(|(f, _)| STATS.iter().any(|s| f.starts_with(s)))
                .map(|(_, ir)| ir)
                .sum();
            let _ = writeln!(
                md,
                "\nPlain Envoy runs {plain:.0} instructions per request on its worker; the shipped native build adds \
                 {over:.0} ({:.0}% of plain Envoy's). Of those, the floor (`enter`, `copy`, `scan`) is {floor:.0} \
                 ({:.0}%), and Envoy's own code behind the module's stat updates (a labelled counter or histogram \
                 named anew from its label values on each update) is {stats:.0} ({:.0}%). The goal of 0.9x plain \
                 Envoy's requests per second leaves about 11% of plain Envoy's cost for the filter, 0.8x 25%; an \
                 instruction share is a cost share only where both run at the same instructions per cycle, which \
                 the overhead bench's CPU columns measure.",
                100.0 * over / plain,
                100.0 * floor / over.max(1.0),
                100.0 * stats / over.max(1.0),
            );
        }
        for r in of_size.iter().filter(|r| !r.functions.is_empty()) {
            let _ = writeln!(
                md,
                "\n{}: inclusive instructions per request of the module's hooks and of the callbacks into Envoy it \
                 makes (a hook's count includes its callbacks):\n",
                r.name
            );
            let _ = writeln!(md, "| function | per request |");
            let _ = writeln!(md, "|---|---:|");
            for (f, ir) in &r.functions {
                let _ = writeln!(md, "| `{f}` | {ir:.0} |");
            }
        }
        let _ = writeln!(md);
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_total_is_read_from_its_totals_line() {
        assert_eq!(totals("events: Ir\nsummary: 1234\nfn=x\n0 3\ntotals: 5678\n"), 5678);
        assert_eq!(totals("events: Ir\nsummary: 1234\n"), 1234);
        assert_eq!(totals("nothing"), 0);
    }
}
