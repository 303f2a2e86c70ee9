//! The machine and the versions a bench ran with, for the results file.

use std::process::Command;

use super::systems::{peer_version, Kind};
use crate::envoy::envoy_binary;

/// Where and with what a bench ran.
#[derive(Debug, Clone)]
pub struct Machine {
    /// `nproc`, read before the bench pins itself.
    pub nproc: String,
    pub cpu_model: String,
    pub kernel: String,
    pub envoy: String,
    pub rustc: String,
    pub peers: Vec<(Kind, String)>,
    /// UTC date, `YYYY-MM-DD`.
    pub date: String,
}

impl Machine {
    /// Reads it all now. Anything unreadable is `unknown`.
    pub fn probe() -> Machine {
        let envoy = envoy_binary();
        Machine {
            nproc: output("nproc", &[]),
            cpu_model: cpu_model(),
            kernel: output("uname", &["-r"]),
            envoy: first_line(&output(&envoy.display().to_string(), &["--version"]))
                .rsplit("version: ")
                .next()
                .unwrap_or("unknown")
                .to_string(),
            rustc: output("rustc", &["--version"]),
            peers: [(Kind::Sglang, "sglang-router"), (Kind::Vllm, "vllm-router")]
                .into_iter()
                .map(|(k, dist)| (k, peer_version(dist).unwrap_or_else(|| "not installed".into())))
                .collect(),
            date: output("date", &["-u", "+%Y-%m-%d"]),
        }
    }

    /// A fixed machine for report tests: 2 CPUs, sglang-router 0.3.2 installed and vllm-router not.
    #[cfg(test)]
    pub fn fixture() -> Machine {
        Machine {
            nproc: "2".into(),
            cpu_model: "Test CPU".into(),
            kernel: "6.0".into(),
            envoy: "1.40.0".into(),
            rustc: "rustc 1.95.0".into(),
            peers: vec![(Kind::Sglang, "0.3.2".into()), (Kind::Vllm, "not installed".into())],
            date: "2026-01-01".into(),
        }
    }

    /// The number of online CPUs, from `nproc`.
    pub fn cpus(&self) -> usize {
        self.nproc.parse().unwrap_or(1)
    }
}

fn output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

fn first_line(s: &str) -> &str {
    s.lines().find(|l| !l.trim().is_empty()).unwrap_or(s)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}
