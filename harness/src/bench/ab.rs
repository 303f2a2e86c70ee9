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
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::load::Prepared;
use super::overhead::{prepare, Case, Measure, Rounds, RowRounds};
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
    /// 0: the bench upstream's JSON answer; otherwise a streamed answer of this many content deltas, each chunk
    /// its own read (`upstream::STREAM_EVENTS_HEADER`).
    pub stream_events: usize,
    /// Start the three Envoys afresh this many times, each time for `rounds` rounds: two fresh Envoys of one build
    /// differ by several µs per large body, so one set of Envoys can favour either build.
    pub repeats: usize,
}

/// The body size of the ageing load.
const AGE_SIZE: usize = 1 << 20;

/// The three rows, in order.
const ROWS: [&str; 3] = ["plain Envoy", "baseline", "current"];

/// The rows' rounds, fresh and, when asked for, after the ageing load.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Rows as [`ROWS`], every repeat's rounds together: the lever is `fresh.added_us(2)`, current minus baseline
    /// round by round.
    pub fresh: RowRounds,
    pub aged: Option<RowRounds>,
    /// Each repeat's own lever (its fresh rounds only).
    pub levers: Vec<Option<f64>>,
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
    let case = Case {
        size: s.size,
        concurrency: s.concurrency,
    };
    let requests = streamed(prepare(s.size, 8, s.seed), s.stream_events);
    let client = super::load::client(s.concurrency).map_err(|e| format!("building the HTTP client: {e}"))?;
    let started = Instant::now();
    let mut fresh = RowRounds::empty(case, ROWS.len());
    let mut aged: Option<RowRounds> = None;
    let mut levers = Vec::new();
    for repeat in 0..s.repeats.max(1) {
        if s.repeats > 1 {
            super::overhead::progress(
                Some(started),
                &format!("repeat {} of {}: fresh Envoys", repeat + 1, s.repeats),
            );
        }
        let set = EnvoySet {
            s,
            case,
            client: &client,
            requests: &requests,
            started,
        };
        let (rounds, after_ageing) = set.measure(&upstreams, &options).await?;
        levers.push(rounds.added_us(2));
        fresh.append(rounds);
        if let Some(rounds) = after_ageing {
            aged.get_or_insert_with(|| RowRounds::empty(case, ROWS.len()))
                .append(rounds);
        }
    }
    Ok(Comparison { fresh, aged, levers })
}

/// What every set of fresh Envoys is measured with.
struct EnvoySet<'a> {
    s: &'a Settings,
    case: Case,
    client: &'a reqwest::Client,
    requests: &'a Arc<[Prepared]>,
    started: Instant,
}

impl EnvoySet<'_> {
    /// Starts the three Envoys of `options`, warms them up and measures their rounds; with `age_seconds`, ages
    /// them and measures again. They stop when this returns.
    async fn measure(
        &self,
        upstreams: &Upstreams,
        options: &[EnvoyOptions],
    ) -> Result<(RowRounds, Option<RowRounds>), String> {
        let (s, case) = (self.s, self.case);
        let mut envoys = Vec::new();
        for (name, opts) in ROWS.iter().zip(options.iter().cloned()) {
            let envoy = Envoy::start_with(bench_config(&upstreams.endpoints()), opts)
                .await
                .map_err(|e| format!("{name} did not start: {e}"))?;
            envoys.push(envoy);
        }
        let targets: Vec<(String, u32)> = envoys.iter().map(|e| (e.url(CHAT_PATH), e.pid())).collect();
        for (url, _) in &targets {
            super::load::run(self.client, url, self.requests, s.concurrency, Duration::from_secs(1)).await;
        }
        let rounds = interleaved(s, case, self.client, self.requests, &targets, self.started).await?;
        let fresh = RowRounds { case, rounds };
        if s.age_seconds == 0 {
            return Ok((fresh, None));
        }
        let ageing = prepare(AGE_SIZE, 8, s.seed);
        let age_client = super::load::client(16).map_err(|e| format!("building the HTTP client: {e}"))?;
        for (i, (url, _)) in targets.iter().enumerate() {
            super::overhead::progress(
                Some(self.started),
                &format!(
                    "ageing {}: {} s of 1 MiB bodies at concurrency 16",
                    ROWS[i], s.age_seconds
                ),
            );
            super::load::run(&age_client, url, &ageing, 16, Duration::from_secs(s.age_seconds)).await;
        }
        let rounds = interleaved(s, case, self.client, self.requests, &targets, self.started).await?;
        Ok((fresh, Some(RowRounds { case, rounds })))
    }
}

/// `requests`, each asking the bench upstream for a stream of `deltas` content deltas (none when 0).
fn streamed(requests: Arc<[Prepared]>, deltas: usize) -> Arc<[Prepared]> {
    if deltas == 0 {
        return requests;
    }
    let value = reqwest::header::HeaderValue::from(deltas);
    requests
        .iter()
        .map(|r| Prepared {
            stream_events: Some(value.clone()),
            ..r.clone()
        })
        .collect()
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
    let mut out = table(&c.fresh, baseline);
    if c.levers.len() > 1 {
        let each: Vec<String> = c.levers.iter().map(|l| figure(*l, 1)).collect();
        let _ = write!(
            out,
            "\nby repeat (fresh Envoys each): {} µs; above, every repeat's rounds together",
            each.join(", ")
        );
    }
    if let Some(aged) = &c.aged {
        let _ = write!(out, "\nafter the ageing load:\n{}", table(aged, baseline));
        for (row, name) in ROWS.iter().enumerate() {
            let grew = aged.cpu_us(row).zip(c.fresh.cpu_us(row)).map(|(a, f)| a - f);
            let _ = write!(out, "\n{name}: aged - fresh {} µs/req", figure(grew, 1));
        }
    }
    out
}

fn figure(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".to_string(), |v| format!("{v:.digits$}"))
}

/// One set of rounds: each row's figures, then the lever.
fn table(r: &RowRounds, baseline: &str) -> String {
    let mut out = format!(
        "{}, {} rounds; baseline: {baseline}\n{:<12} {:>14} {:>18} {:>16}\n",
        r.case.label(),
        r.rounds.first().map_or(0, Vec::len),
        "",
        "CPU µs/req",
        "× plain by CPU",
        "× plain req/s"
    );
    for (row, name) in ROWS.iter().enumerate() {
        let _ = writeln!(
            out,
            "{name:<12} {:>14} {:>18} {:>16}",
            figure(r.cpu_us(row), 1),
            figure((row > 0).then(|| r.cpu_ratio(row)).flatten(), 3),
            figure((row > 0).then(|| r.ratio(row)).flatten(), 3),
        );
    }
    let _ = write!(
        out,
        "current - baseline: {} µs of proxy CPU per request (median over rounds of each round's difference)",
        figure(r.added_us(2), 1)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::overhead::measured as m;

    #[test]
    fn the_lever_is_the_median_of_each_rounds_difference() {
        let fresh = RowRounds {
            case: Case {
                size: 4096,
                concurrency: 16,
            },
            rounds: vec![
                vec![m(50.0, 200.0), m(60.0, 200.0), m(55.0, 200.0)],
                vec![m(100.0, 100.0), m(130.0, 90.0), m(110.0, 100.0)],
                vec![m(95.0, 110.0), m(120.0, 100.0), m(108.0, 100.0)],
            ],
        };
        assert!((fresh.added_us(2).unwrap() + 5.0).abs() < 1e-9);
        assert!((fresh.cpu_ratio(1).unwrap() - 0.5).abs() < 1e-9);
        assert!((fresh.ratio(2).unwrap() - 0.5).abs() < 1e-9);
        let c = Comparison {
            fresh: fresh.clone(),
            aged: None,
            levers: vec![fresh.added_us(2)],
        };
        let text = summary(&c, "old.wasm");
        assert!(text.contains("current - baseline: -5.0 µs"), "{text}");
        assert!(!text.contains("by repeat"), "{text}");
    }

    #[test]
    fn repeats_pool_their_rounds_and_each_keeps_its_own_lever() {
        let case = Case {
            size: 262144,
            concurrency: 16,
        };
        let one = RowRounds {
            case,
            rounds: vec![vec![m(100.0, 100.0)], vec![m(200.0, 50.0)], vec![m(190.0, 52.0)]],
        };
        let two = RowRounds {
            case,
            rounds: vec![vec![m(100.0, 100.0)], vec![m(200.0, 50.0)], vec![m(206.0, 48.0)]],
        };
        let levers = vec![one.added_us(2), two.added_us(2)];
        let mut fresh = RowRounds::empty(case, 3);
        fresh.append(one);
        fresh.append(two);
        assert_eq!(fresh.rounds.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2, 2]);
        // Each repeat's lever is its own (-10 and +6); the pooled median is that of both rounds' differences.
        let near = |got: Option<f64>, want: f64| got.is_some_and(|g| (g - want).abs() < 1e-6);
        assert!(near(levers[0], -10.0) && near(levers[1], 6.0), "{levers:?}");
        assert!(near(fresh.added_us(2), -2.0), "{:?}", fresh.added_us(2));
        let text = summary(
            &Comparison {
                fresh,
                aged: None,
                levers,
            },
            "old.wasm",
        );
        assert!(text.contains("by repeat (fresh Envoys each): -10.0, 6.0 µs"), "{text}");
    }
}
