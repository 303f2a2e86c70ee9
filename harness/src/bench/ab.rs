//! One lever measured side by side (`llmroute-bench ab`, `make bench-ab`): plain Envoy, the filter built before
//! the lever (`--baseline`, any `.wasm`) and the filter as built now, in the same interleaved rounds as the
//! overhead bench, at one body size and concurrency.
//!
//! The overhead bench compares llmroute with plain Envoy on one run; two runs, hours apart on a shared machine,
//! differ by more than a lever of a few µs changes. Here the two builds share every round, so what the lever
//! saves is the median over rounds of their difference in proxy CPU per request, each round's pair measured
//! within seconds of each other.

use std::fmt::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::overhead::{prepare, Case, Measure, Rounds};
use super::stats::median_of;
use super::systems::{bench_config, CHAT_PATH};
use super::upstream::Upstreams;
use crate::envoy::{Envoy, EnvoyOptions};

/// What to compare.
pub struct Settings {
    pub baseline: PathBuf,
    pub size: usize,
    pub concurrency: usize,
    pub rounds: usize,
    pub round: Duration,
    pub seed: u64,
    pub proxy_cpus: Option<String>,
    /// After the rounds, load every Envoy with 1 MiB bodies for this long (each in turn, concurrency 16), then
    /// measure the rounds again: what a long-lived Envoy costs against a fresh one. 0: no second measurement.
    pub age_seconds: u64,
}

/// The body size of the ageing load.
const AGE_SIZE: usize = 1 << 20;

/// The three rows, in order.
const ROWS: [&str; 3] = ["plain Envoy", "baseline", "current"];

/// Every round of each row.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub case: Case,
    /// `rounds[row]`, rows as [`ROWS`].
    pub rounds: Vec<Vec<Measure>>,
    /// The same rounds after the ageing load, when asked for.
    pub aged: Option<Box<Comparison>>,
}

impl Comparison {
    fn cpu_us(&self, row: usize) -> Option<f64> {
        median_of(self.rounds.get(row)?.iter().map(|m| m.cpu_per_req.map(|c| c * 1e6)))
    }

    /// Median over rounds of `row` minus `other`, by `f`.
    fn diff(&self, row: usize, other: usize, f: impl Fn(&Measure, &Measure) -> Option<f64>) -> Option<f64> {
        let (a, b) = (self.rounds.get(row)?, self.rounds.get(other)?);
        median_of(a.iter().zip(b).map(|(x, y)| f(x, y)))
    }

    /// Median over rounds of `row`'s CPU per request minus `other`'s, in µs.
    pub fn cpu_diff_us(&self, row: usize, other: usize) -> Option<f64> {
        self.diff(row, other, |x, y| Some((x.cpu_per_req? - y.cpu_per_req?) * 1e6))
    }

    /// Median over rounds of plain Envoy's CPU per request ÷ `row`'s.
    pub fn cpu_ratio(&self, row: usize) -> Option<f64> {
        self.diff(0, row, |p, x| Some(p.cpu_per_req? / x.cpu_per_req?))
    }

    /// Median over rounds of `row`'s req/s ÷ plain Envoy's.
    pub fn ratio(&self, row: usize) -> Option<f64> {
        self.diff(row, 0, |x, p| (p.rps > 0.0).then(|| x.rps / p.rps))
    }
}

/// Starts the three Envoys and measures them in interleaved rounds.
pub async fn run(s: &Settings) -> Result<Comparison, String> {
    if !s.baseline.exists() {
        return Err(format!("--baseline {} does not exist", s.baseline.display()));
    }
    let upstreams = Upstreams::start(3)
        .await
        .map_err(|e| format!("starting upstreams: {e}"))?;
    let base = EnvoyOptions {
        concurrency: 1,
        log_level: "warning".into(),
        cpu_list: s.proxy_cpus.clone(),
        ..EnvoyOptions::default()
    };
    let options = [
        EnvoyOptions {
            with_filter: false,
            ..base.clone()
        },
        EnvoyOptions {
            wasm: Some(s.baseline.clone()),
            ..base.clone()
        },
        base,
    ];
    let mut envoys = Vec::new();
    for (name, opts) in ROWS.iter().zip(options) {
        let envoy = Envoy::start_with(bench_config(&upstreams.endpoints()), opts)
            .await
            .map_err(|e| format!("{name} did not start: {e}"))?;
        envoys.push(envoy);
    }
    let case = Case {
        size: s.size,
        concurrency: s.concurrency,
    };
    let requests = prepare(s.size, 8, s.seed);
    let client = super::load::client(s.concurrency).map_err(|e| format!("building the HTTP client: {e}"))?;
    let targets: Vec<(String, u32)> = envoys.iter().map(|e| (e.url(CHAT_PATH), e.pid())).collect();
    for (url, _) in &targets {
        super::load::run(&client, url, &requests, s.concurrency, Duration::from_secs(1)).await;
    }
    let started = Instant::now();
    let rounds = interleaved(s, case, &client, &requests, &targets, started).await?;
    let mut aged = None;
    if s.age_seconds > 0 {
        let ageing = prepare(AGE_SIZE, 8, s.seed);
        let age_client = super::load::client(16).map_err(|e| format!("building the HTTP client: {e}"))?;
        for (i, (url, _)) in targets.iter().enumerate() {
            super::overhead::progress(
                Some(started),
                &format!(
                    "ageing {}: {} s of 1 MiB bodies at concurrency 16",
                    ROWS[i], s.age_seconds
                ),
            );
            super::load::run(&age_client, url, &ageing, 16, Duration::from_secs(s.age_seconds)).await;
        }
        let rounds = interleaved(s, case, &client, &requests, &targets, started).await?;
        aged = Some(Box::new(Comparison {
            case,
            rounds,
            aged: None,
        }));
    }
    Ok(Comparison { case, rounds, aged })
}

/// `s.rounds` interleaved rounds of every target (`rounds[target]`); an error in any round fails the comparison.
async fn interleaved(
    s: &Settings,
    case: Case,
    client: &reqwest::Client,
    requests: &std::sync::Arc<[super::load::Prepared]>,
    targets: &[(String, u32)],
    started: Instant,
) -> Result<Vec<Vec<Measure>>, String> {
    let r = Rounds {
        client,
        requests,
        case,
        rounds: s.rounds,
        round: s.round,
        proxy_cpu: s.proxy_cpus.as_deref().and_then(|c| c.parse().ok()),
        started,
    };
    let rounds = super::overhead::interleaved(&r, targets, |i| ROWS.get(i).copied().unwrap_or("?")).await;
    for (name, measures) in ROWS.iter().zip(&rounds) {
        if let Some(m) = measures.iter().find(|m| m.errors > 0) {
            return Err(format!("{name}: {} errors, first: {:?}", m.errors, m.first_error));
        }
    }
    Ok(rounds)
}

/// The comparison as a few lines of text.
pub fn summary(c: &Comparison, baseline: &str) -> String {
    let f = |v: Option<f64>, digits: usize| v.map_or("–".to_string(), |v| format!("{v:.digits$}"));
    let mut out = format!(
        "{}, {} rounds; baseline: {baseline}\n{:<12} {:>14} {:>18} {:>16}\n",
        c.case.label(),
        c.rounds.first().map_or(0, Vec::len),
        "",
        "CPU µs/req",
        "× plain by CPU",
        "× plain req/s"
    );
    for (row, name) in ROWS.iter().enumerate() {
        let _ = writeln!(
            out,
            "{name:<12} {:>14} {:>18} {:>16}",
            f(c.cpu_us(row), 1),
            f((row > 0).then(|| c.cpu_ratio(row)).flatten(), 3),
            f((row > 0).then(|| c.ratio(row)).flatten(), 3),
        );
    }
    let _ = write!(
        out,
        "current - baseline: {} µs of proxy CPU per request (median over rounds of each round's difference)",
        f(c.cpu_diff_us(2, 1), 1)
    );
    if let Some(aged) = &c.aged {
        let _ = write!(out, "\nafter the ageing load:\n{}", summary(aged, baseline));
        for (row, name) in ROWS.iter().enumerate() {
            let grew = aged.cpu_us(row).zip(c.cpu_us(row)).map(|(a, f)| a - f);
            let _ = write!(out, "\n{name}: aged - fresh {} µs/req", f(grew, 1));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(cpu_us: f64, rps: f64) -> Measure {
        Measure {
            rps,
            p50_us: None,
            p99_us: None,
            cpu_per_req: Some(cpu_us / 1e6),
            ok: 1,
            errors: 0,
            first_error: None,
            foreign_load: None,
        }
    }

    #[test]
    fn the_lever_is_the_median_of_each_rounds_difference() {
        let c = Comparison {
            case: Case {
                size: 4096,
                concurrency: 16,
            },
            rounds: vec![
                vec![m(50.0, 200.0), m(60.0, 200.0), m(55.0, 200.0)],
                vec![m(100.0, 100.0), m(130.0, 90.0), m(110.0, 100.0)],
                vec![m(95.0, 110.0), m(120.0, 100.0), m(108.0, 100.0)],
            ],
            aged: None,
        };
        assert!((c.cpu_diff_us(2, 1).unwrap() + 5.0).abs() < 1e-9);
        assert!((c.cpu_ratio(1).unwrap() - 0.5).abs() < 1e-9);
        assert!((c.ratio(2).unwrap() - 0.5).abs() < 1e-9);
        let text = summary(&c, "old.wasm");
        assert!(text.contains("current - baseline: -5.0 µs"), "{text}");
    }
}
