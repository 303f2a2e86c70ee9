//! The filter's own code, function by function (`llmroute-bench glue`, `make bench-glue`): the .wasm driven
//! through bench requests by a proxy-wasm host written in JavaScript (`harness/glue/host.mjs`), in node's V8, the
//! engine Envoy embeds, under node's CPU profiler.
//!
//! `perf` on Envoy names no function inside the VM (V8 writes no perf map for wasm code, and Envoy's wheel is
//! stripped), so `make bench-profile` stops at "wasm code". Here the host side of each call is a few lines of
//! JavaScript, so the profile is mostly the filter: which Rust functions cost what, under which callback. A warm
//! loop in node is not Envoy (caches stay hot, the host's calls are cheaper than Envoy's), so the figures rank
//! the filter's costs and measure a change to its code; what a lever saves inside Envoy is `make bench-ab`'s.
//! The build needs its function names: `make bench-glue` builds the filter with its name section kept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use super::body::chat_body;
use super::systems::bench_config;
use super::upstream::{sse_chunks, COMPLETION};

/// What to run.
pub struct Settings {
    pub wasm: PathBuf,
    pub host: PathBuf,
    pub size: usize,
    pub requests: usize,
    /// 0: the bench upstream's JSON answer; otherwise a streamed answer of this many content deltas (then the usage
    /// chunk and `[DONE]`), each chunk in its own body callback.
    pub stream_events: usize,
    pub seed: u64,
    /// How many functions the self-time table lists.
    pub top: usize,
}

/// What the host printed.
#[derive(Debug, Deserialize)]
pub struct HostRun {
    pub us_per_request: f64,
    pub rounds: Vec<f64>,
    /// Host calls of one request, by kind.
    pub calls: BTreeMap<String, u32>,
}

/// A run and its profile.
#[derive(Debug)]
pub struct Glue {
    pub run: HostRun,
    /// Functions by their share of the profile's time, largest first.
    pub by_self: Vec<(String, f64)>,
    /// The filter's callbacks (`proxy_on_*`) by their share, callees included.
    pub by_callback: Vec<(String, f64)>,
}

/// Writes the bench body, config and answer, runs the host under the profiler and reads its profile.
pub fn run(s: &Settings) -> Result<Glue, String> {
    for (what, path) in [("the filter", &s.wasm), ("the host", &s.host)] {
        if !path.exists() {
            return Err(format!("{what} is not at {}", path.display()));
        }
    }
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let write = |name: &str, bytes: &[u8]| -> Result<PathBuf, String> {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(path)
    };
    let endpoints = ["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"].map(String::from);
    let body = write("body.json", &chat_body(s.size, 0, s.seed))?;
    let config = write("config.json", bench_config(&endpoints).to_string().as_bytes())?;
    let answer = match s.stream_events {
        0 => COMPLETION.to_string(),
        n => serde_json::Value::from(sse_chunks(n)).to_string(),
    };
    let answer = write("answer.json", answer.as_bytes())?;
    let prof = dir.path().join("prof");
    let out = Command::new("node")
        .arg("--no-warnings")
        .arg("--cpu-prof")
        .arg("--cpu-prof-dir")
        .arg(&prof)
        .arg(&s.host)
        .arg(&s.wasm)
        .args([&body, &config, &answer])
        .arg(s.requests.to_string())
        .output()
        .map_err(|e| format!("running node: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the host failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let run: HostRun = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "reading the host's result: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    let profile = read_profile(&prof)?;
    Ok(Glue {
        run,
        by_self: self_shares(&profile),
        by_callback: inclusive_shares(&profile, |name| name.starts_with("proxy_on_")),
    })
}

/// A `.cpuprofile` as node writes it: a call tree and, per sample, its leaf node and the time since the last.
#[derive(Debug, Deserialize)]
pub struct CpuProfile {
    pub nodes: Vec<Node>,
    pub samples: Vec<u64>,
    #[serde(rename = "timeDeltas")]
    pub time_deltas: Vec<i64>,
}

#[derive(Debug, Deserialize)]
pub struct Node {
    pub id: u64,
    #[serde(rename = "callFrame")]
    pub call_frame: CallFrame,
    #[serde(default)]
    pub children: Vec<u64>,
}

#[derive(Debug, Deserialize)]
pub struct CallFrame {
    #[serde(rename = "functionName")]
    pub function_name: String,
    /// The script or module: the host's frames come from `host.mjs`, the filter's from the .wasm.
    #[serde(default)]
    pub url: String,
}

impl CallFrame {
    /// The frame as the tables name it: a Rust function demangled without its hash, a host frame marked as such.
    fn name(&self) -> String {
        match self.url.ends_with("host.mjs") {
            true => format!("host: {}", function_name(&self.function_name)),
            false => function_name(&self.function_name),
        }
    }
}

fn read_profile(dir: &Path) -> Result<CpuProfile, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let path = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "cpuprofile"))
        .ok_or_else(|| format!("node wrote no .cpuprofile in {}", dir.display()))?;
    let text = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_slice(&text).map_err(|e| format!("parsing {}: {e}", path.display()))
}

/// A profile node's function, demangled and without its hash: `llmroute_filter::metrics::Metrics::id`.
pub fn function_name(raw: &str) -> String {
    let name = match raw {
        "" => "(anonymous)".to_string(),
        _ => format!("{:#}", rustc_demangle::demangle(raw)),
    };
    // V8 names its wasm-to-JS wrappers after the first import of the same signature, which misleads: one
    // wrapper serves every import of that shape.
    match name.starts_with("wasm-to-js:") {
        true => "(the host: a call from wasm into JavaScript)".to_string(),
        false => name,
    }
}

/// Each sample's time, by the node it landed in.
fn time_by_node(p: &CpuProfile) -> (BTreeMap<u64, f64>, f64) {
    let mut by = BTreeMap::new();
    let mut total = 0.0;
    for (node, dt) in p.samples.iter().zip(&p.time_deltas) {
        let dt = (*dt).max(0) as f64;
        *by.entry(*node).or_insert(0.0) += dt;
        total += dt;
    }
    (by, total)
}

/// Functions by their self time as a share of the profile, largest first.
pub fn self_shares(p: &CpuProfile) -> Vec<(String, f64)> {
    let names: BTreeMap<u64, String> = p.nodes.iter().map(|n| (n.id, n.call_frame.name())).collect();
    let (by_node, total) = time_by_node(p);
    let mut by_name: BTreeMap<String, f64> = BTreeMap::new();
    for (node, t) in by_node {
        let name = names.get(&node).cloned().unwrap_or_default();
        *by_name.entry(name).or_insert(0.0) += t;
    }
    sorted_shares(by_name, total)
}

/// The functions `wanted` picks by their time with their callees', as a share of the profile; a function that
/// calls itself counts once per sample.
pub fn inclusive_shares(p: &CpuProfile, wanted: impl Fn(&str) -> bool) -> Vec<(String, f64)> {
    let parent: BTreeMap<u64, u64> = p
        .nodes
        .iter()
        .flat_map(|n| n.children.iter().map(move |c| (*c, n.id)))
        .collect();
    let names: BTreeMap<u64, &str> = p
        .nodes
        .iter()
        .map(|n| (n.id, n.call_frame.function_name.as_str()))
        .collect();
    let (by_node, total) = time_by_node(p);
    let mut by_name: BTreeMap<String, f64> = BTreeMap::new();
    for (leaf, t) in by_node {
        let mut seen = Vec::new();
        let mut at = Some(leaf);
        while let Some(id) = at {
            let name = names.get(&id).copied().unwrap_or_default();
            if wanted(name) && !seen.contains(&name) {
                seen.push(name);
                *by_name.entry(function_name(name)).or_insert(0.0) += t;
            }
            at = parent.get(&id).copied();
        }
    }
    sorted_shares(by_name, total)
}

fn sorted_shares(by_name: BTreeMap<String, f64>, total: f64) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = by_name
        .into_iter()
        .map(|(n, t)| (n, if total > 0.0 { t / total } else { 0.0 }))
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// The report: time per request, host calls, then the two tables, each row also in µs per request.
pub fn summary(g: &Glue, s: &Settings) -> String {
    let us = g.run.us_per_request;
    let answer = match s.stream_events {
        0 => "a JSON answer".to_string(),
        n => format!("a streamed answer of {n} deltas"),
    };
    let mut out = format!(
        "{} bytes of chat body and {answer}, {} requests a round, best of {} rounds: {us:.2} µs per request in \
         node's V8 (the filter's code and this host's side of its calls)\n",
        s.size,
        s.requests,
        g.run.rounds.len()
    );
    let calls: Vec<String> = g.run.calls.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let total: u32 = g.run.calls.values().sum();
    out += &format!("host calls per request: {total} ({})\n\n", calls.join(", "));
    out += "| callback, callees included | share | µs per request |\n|---|---:|---:|\n";
    for (name, share) in &g.by_callback {
        out += &format!("| `{name}` | {:.1}% | {:.2} |\n", share * 100.0, share * us);
    }
    out += "\n| function, self time | share | µs per request |\n|---|---:|---:|\n";
    for (name, share) in g.by_self.iter().take(s.top) {
        out += &format!("| `{name}` | {:.1}% | {:.2} |\n", share * 100.0, share * us);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// root -> proxy_on_log -> id (2 samples of 10) and -> proxy_on_log -> proxy_on_log (recursion, 1 of 30);
    /// root -> a wasm-to-JS wrapper (1 of 60); root -> the host's `give` (1 of 10). 120 in all.
    fn profile() -> CpuProfile {
        let node = |id, name: &str, children: Vec<u64>| Node {
            id,
            call_frame: CallFrame {
                function_name: name.to_string(),
                url: match name {
                    "give" => "file:///repo/harness/glue/host.mjs".to_string(),
                    _ => String::new(),
                },
            },
            children,
        };
        CpuProfile {
            nodes: vec![
                node(1, "(root)", vec![2, 5, 6]),
                node(2, "proxy_on_log", vec![3, 4]),
                node(3, "_ZN15llmroute_filter7metrics7Metrics2id17h11a3b9a51076ad15E", vec![]),
                node(4, "proxy_on_log", vec![]),
                node(
                    5,
                    "wasm-to-js:iii:i-_ZN15llmroute_filter4host3abi9proxy_log17h14309a421e2f1b6fE",
                    vec![],
                ),
                node(6, "give", vec![]),
            ],
            samples: vec![3, 3, 4, 5, 6],
            time_deltas: vec![10, 10, 30, 60, 10],
        }
    }

    #[test]
    fn self_time_is_the_leafs_and_names_are_demangled() {
        let got = self_shares(&profile());
        assert_eq!(
            got,
            vec![
                ("(the host: a call from wasm into JavaScript)".to_string(), 60.0 / 120.0),
                ("proxy_on_log".to_string(), 30.0 / 120.0),
                ("llmroute_filter::metrics::Metrics::id".to_string(), 20.0 / 120.0),
                ("host: give".to_string(), 10.0 / 120.0),
            ]
        );
    }

    #[test]
    fn a_callback_counts_its_callees_and_itself_once() {
        let got = inclusive_shares(&profile(), |n| n.starts_with("proxy_on_"));
        assert_eq!(got, vec![("proxy_on_log".to_string(), 50.0 / 120.0)]);
    }
}
