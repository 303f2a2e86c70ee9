//! Where a proxy spends its CPU under one case of the overhead bench (`llmroute-bench profile`): the proxy's
//! threads, each one's CPU per request, and optionally a `perf record` of the proxy for the same load.
//!
//! The overhead bench gives one figure per proxy (`utime + stime` of the whole process); this says which of its
//! threads spent it (Envoy's worker, its main thread, which runs the admin API, the stats flush and the filter's
//! main-thread root context, and its helper threads), and `perf` says in which code. Systems are measured one
//! after the other, each for the same length of load, so compare them only within one run.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::load;
use super::overhead::{prepare, progress};
use super::systems::{Kind, System};
use super::upstream::Upstreams;

/// What to profile.
pub struct Settings {
    pub systems: Vec<Kind>,
    pub size: usize,
    pub concurrency: usize,
    pub seconds: u64,
    pub seed: u64,
    /// Where to write `<system>.perf.data`; `None`: no `perf`.
    pub perf_dir: Option<PathBuf>,
    pub proxy_cpus: Option<String>,
    /// Age each system before a second measurement: this many seconds of load at concurrency 16 with bodies of
    /// `age_size` bytes (0: measure fresh only).
    pub age_seconds: u64,
    pub age_size: usize,
}

/// One thread's share of a measured run.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadCost {
    pub name: String,
    pub us_per_request: f64,
}

/// One system's measured run.
#[derive(Debug, Clone)]
pub struct Profile {
    pub kind: Kind,
    /// "fresh", or "aged" after [`Settings::age_seconds`] of load.
    pub when: &'static str,
    pub requests: u64,
    pub rps: f64,
    pub threads: Vec<ThreadCost>,
    pub perf_data: Option<PathBuf>,
    /// From `perf report --sort dso`: each object's (Envoy, the kernel, V8's JIT code, libc) CPU per request.
    pub objects: Vec<ThreadCost>,
    /// From the recorded stacks: the wasm code itself, the host calls it made, and everything outside the VM.
    pub origins: Vec<ThreadCost>,
}

impl Profile {
    pub fn total_us_per_request(&self) -> f64 {
        self.threads.iter().map(|t| t.us_per_request).sum()
    }
}

/// Starts every system, then measures them one after the other.
pub async fn run(settings: &Settings) -> Result<Vec<Profile>, String> {
    let upstreams = Upstreams::start(3)
        .await
        .map_err(|e| format!("starting upstreams: {e}"))?;
    let requests = prepare(settings.size, 8, settings.seed);
    let client = load::client(settings.concurrency).map_err(|e| format!("building the HTTP client: {e}"))?;
    let mut out = Vec::new();
    for &kind in &settings.systems {
        progress(None, &format!("starting {}", kind.name()));
        let system = System::start(kind, &upstreams, settings.proxy_cpus.as_deref()).await?;
        load::run(
            &client,
            &system.url,
            &requests,
            settings.concurrency,
            Duration::from_secs(1),
        )
        .await;
        let profile = measure(settings, &system, &client, &requests, "fresh").await?;
        progress(None, &summary(&profile));
        out.push(profile);
        if settings.age_seconds > 0 {
            progress(
                None,
                &format!(
                    "ageing it: {} s of {}-byte bodies at concurrency 16",
                    settings.age_seconds, settings.age_size
                ),
            );
            let aging = prepare(settings.age_size, 8, settings.seed);
            let age_client = load::client(16).map_err(|e| format!("building the HTTP client: {e}"))?;
            load::run(
                &age_client,
                &system.url,
                &aging,
                16,
                Duration::from_secs(settings.age_seconds),
            )
            .await;
            let profile = measure(settings, &system, &client, &requests, "aged").await?;
            progress(None, &summary(&profile));
            out.push(profile);
        }
    }
    Ok(out)
}

/// One measured run of `system`, with `perf` when asked.
async fn measure(
    settings: &Settings,
    system: &System,
    client: &reqwest::Client,
    requests: &std::sync::Arc<[load::Prepared]>,
    when: &'static str,
) -> Result<Profile, String> {
    let kind = system.kind;
    let perf_data = settings
        .perf_dir
        .as_deref()
        .map(|dir| dir.join(format!("{}-{when}.perf.data", kind.short())));
    let perf = match &perf_data {
        Some(path) => Some(start_perf(system.pid, path)?),
        None => None,
    };
    let before = thread_ticks(system.pid);
    let round = load::run(
        client,
        &system.url,
        requests,
        settings.concurrency,
        Duration::from_secs(settings.seconds),
    )
    .await;
    let after = thread_ticks(system.pid);
    if let Some(child) = perf {
        stop_perf(child)?;
    }
    let (objects, origins) = match &perf_data {
        Some(path) => (by_object(path, round.ok)?, by_origin(path, round.ok)?),
        None => (Vec::new(), Vec::new()),
    };
    if round.errors > 0 {
        return Err(format!(
            "{}: {} errors, first: {}",
            kind.name(),
            round.errors,
            round.first_error.unwrap_or_default()
        ));
    }
    Ok(Profile {
        kind,
        when,
        requests: round.ok,
        rps: round.rps(),
        threads: per_request(&before, &after, round.ok),
        perf_data,
        objects,
        origins,
    })
}

/// A line per thread, after a line for the system.
pub fn summary(p: &Profile) -> String {
    let mut text = format!(
        "{} ({}): {:.0} req/s, {} requests, {:.1} µs CPU per request",
        p.kind.name(),
        p.when,
        p.rps,
        p.requests,
        p.total_us_per_request()
    );
    for t in &p.threads {
        text.push_str(&format!("\n    {:<20} {:>8.1} µs/req", t.name, t.us_per_request));
    }
    if let Some(path) = &p.perf_data {
        text.push_str(&format!("\n  by object (perf, {}):", path.display()));
    }
    for o in &p.objects {
        text.push_str(&format!("\n    {:<20} {:>8.1} µs/req", o.name, o.us_per_request));
    }
    if !p.origins.is_empty() {
        text.push_str("\n  by origin (perf stacks):");
    }
    for o in &p.origins {
        text.push_str(&format!("\n    {:<32} {:>8.1} µs/req", o.name, o.us_per_request));
    }
    text
}

/// `utime + stime` in clock ticks of every thread of `pid`, by thread name (threads of one name summed).
fn thread_ticks(pid: u32) -> BTreeMap<String, u64> {
    let mut ticks = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return ticks;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        if let Some((name, t)) = parse_thread(&stat) {
            *ticks.entry(name).or_insert(0) += t;
        }
    }
    ticks
}

/// The thread's name (`comm`) and its `utime + stime`.
fn parse_thread(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    Some((name, super::procstat::parse_cpu_ticks(stat)?))
}

fn per_request(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, requests: u64) -> Vec<ThreadCost> {
    let tick_us = 1e6 / super::procstat::clock_ticks() as f64;
    let mut threads: Vec<ThreadCost> = after
        .iter()
        .map(|(name, &a)| {
            let spent = a.saturating_sub(before.get(name).copied().unwrap_or(0));
            ThreadCost {
                name: name.clone(),
                us_per_request: spent as f64 * tick_us / requests.max(1) as f64,
            }
        })
        .filter(|t| t.us_per_request > 0.0)
        .collect();
    threads.sort_by(|a, b| b.us_per_request.total_cmp(&a.us_per_request));
    threads
}

fn start_perf(pid: u32, out: &Path) -> Result<Child, String> {
    Command::new("perf")
        .args(["record", "-e", "cpu-clock", "-F", "4999", "-g", "-o"])
        .arg(out)
        .args(["-p", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting perf (Debian's linux-perf): {e}"))
}

fn stop_perf(child: Child) -> Result<(), String> {
    let pid = child.id().to_string();
    Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .map_err(|e| format!("stopping perf: {e}"))?;
    let out = child.wait_with_output().map_err(|e| format!("waiting for perf: {e}"))?;
    // perf writes its data on SIGINT and then dies of it.
    if out.status.success() || out.status.signal() == Some(2) || out.status.code() == Some(130) {
        Ok(())
    } else {
        Err(format!("perf record failed ({})", out.status))
    }
}

/// Each object's sampled CPU per request, from `perf report --sort dso --show-total-period` (periods in ns).
fn by_object(data: &Path, requests: u64) -> Result<Vec<ThreadCost>, String> {
    let report = perf(
        &[
            "report",
            "--no-children",
            "--sort",
            "dso",
            "--stdio",
            "-g",
            "none",
            "--show-total-period",
        ],
        data,
    )?;
    Ok(parse_report(&report, requests))
}

/// What `perf <args> -i <data>` prints on stdout.
fn perf(args: &[&str], data: &Path) -> Result<String, String> {
    let out = Command::new("perf")
        .args(args)
        .arg("-i")
        .arg(data)
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("perf {}: {e}", args.first().unwrap_or(&"")))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Lines such as `  55.69%    3053410560  envoy`; a JIT object (`[JIT] tid 7105`) is named `[JIT]`.
fn parse_report(report: &str, requests: u64) -> Vec<ThreadCost> {
    report
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            fields.next()?.strip_suffix('%')?;
            let ns: f64 = fields.next()?.parse().ok()?;
            let name = fields.next()?;
            Some(ThreadCost {
                name: name.to_string(),
                us_per_request: ns / 1e3 / requests.max(1) as f64,
            })
        })
        .collect()
}

/// Where a sample's stack says its CPU went. V8's compiled code sits in anonymous memory that perf attributes to
/// `/tmp/perf-<pid>.map`; with frame pointers, a stack reaches from the leaf through it into Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Origin {
    /// The leaf is JIT code: the filter's wasm (and V8's wasm wrappers).
    Wasm,
    /// The leaf is outside the JIT code, under a JIT frame: a host call the wasm made (Envoy's side of the ABI).
    HostCall,
    /// No JIT frame: Envoy itself, the kernel and libc, on its own work or entering the VM.
    Outside,
}

impl Origin {
    fn name(self) -> &'static str {
        match self {
            Origin::Wasm => "wasm code (JIT)",
            Origin::HostCall => "host calls from wasm",
            Origin::Outside => "outside the VM",
        }
    }
}

fn by_origin(data: &Path, requests: u64) -> Result<Vec<ThreadCost>, String> {
    Ok(parse_origins(
        &perf(&["script", "-F", "period,ip,dso"], data)?,
        requests,
    ))
}

/// `perf script -F period,ip,dso` prints each sample as its period, then one frame per line, leaf first, and a
/// blank line.
fn parse_origins(script: &str, requests: u64) -> Vec<ThreadCost> {
    let mut ns: BTreeMap<Origin, f64> = BTreeMap::new();
    for sample in script.split("\n\n") {
        let mut lines = sample.lines().map(str::trim).filter(|l| !l.is_empty());
        let Some(period) = lines
            .next()
            .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        else {
            continue;
        };
        let jit: Vec<bool> = lines
            .map(|frame| frame.contains("/perf-") || frame.contains("[JIT]"))
            .collect();
        let origin = match (jit.first(), jit.iter().skip(1).any(|&j| j)) {
            (None, _) => continue,
            (Some(true), _) => Origin::Wasm,
            (Some(false), true) => Origin::HostCall,
            (Some(false), false) => Origin::Outside,
        };
        *ns.entry(origin).or_insert(0.0) += period;
    }
    ns.into_iter()
        .map(|(o, n)| ThreadCost {
            name: o.name().to_string(),
            us_per_request: n / 1e3 / requests.max(1) as f64,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_threads_name_and_ticks() {
        let stat = "77 (wrk:worker_0) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 100 1000 50";
        assert_eq!(parse_thread(stat), Some(("wrk:worker_0".into(), 325)));
    }

    #[test]
    fn charges_each_thread_what_it_spent_per_request() {
        let before = BTreeMap::from([("a".to_string(), 100), ("b".to_string(), 5)]);
        let after = BTreeMap::from([("a".to_string(), 300), ("b".to_string(), 5), ("c".to_string(), 10)]);
        let t = per_request(&before, &after, 1000);
        let tick = 1e6 / crate::bench::procstat::clock_ticks() as f64;
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].name, "a");
        assert!((t[0].us_per_request - 200.0 * tick / 1000.0).abs() < 1e-9);
        assert_eq!(t[1].name, "c");
    }

    #[test]
    fn reads_perfs_report_by_object() {
        let report = "# Samples\n#\n    55.69%    3053410560  envoy            \n    12.15%     666333240  [JIT] tid 7105   \n\n";
        let o = parse_report(report, 1000);
        assert_eq!(o.len(), 2);
        assert_eq!(o[0].name, "envoy");
        assert!((o[0].us_per_request - 3053.41056).abs() < 1e-6);
        assert_eq!(o[1].name, "[JIT]");
    }

    #[test]
    fn sorts_samples_by_where_their_stack_was() {
        let script = "  2000\n\t 7f01 [unknown] (/tmp/perf-7.map)\n\t 32da [unknown] (/x/envoy)\n\n\
                      3000\n\t 2fac [unknown] (/x/envoy)\n\t 7f02 [unknown] (/tmp/perf-7.map)\n\t 55e6 [unknown] (/x/envoy)\n\n\
                      5000\n\t 55a8 [unknown] (/x/envoy)\n\t 5b68 [unknown] (/x/envoy)\n\n\
                      1000\n\t ffff81 copy_page [unknown] ([kernel.kallsyms])\n\n";
        let o = parse_origins(script, 2);
        let get = |name: &str| o.iter().find(|t| t.name == name).map(|t| t.us_per_request);
        assert_eq!(get("wasm code (JIT)"), Some(1.0));
        assert_eq!(get("host calls from wasm"), Some(1.5));
        assert_eq!(get("outside the VM"), Some(3.0));
    }

    #[test]
    fn reads_this_process_threads() {
        assert!(!thread_ticks(std::process::id()).is_empty());
    }
}
