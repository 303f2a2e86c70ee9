//! The soak: the chaos load on a healthy fleet, for a long time, while the filter's VM memory and Envoy's heap are
//! sampled; it fails when either grows.
//!
//! Growth is judged by [`growth`]: the samples of the warm-up (the first quarter of the run, at least 10 s) are
//! dropped, the rest are cut into four quarters, and the median of the last quarter is compared with the median
//! of the second. Medians ignore a single spike (a burst of buffers, a heap chunk taken and given back), and
//! skipping the first quarter after warm-up leaves caches, pools and the key table time to fill to their
//! steady size. A leak grows with the number of requests, so it shows as a rise from the second quarter to the
//! last, whatever the run's length. A rise counts when it exceeds an absolute floor plus a share of the level
//! (memory comes in pages and allocator chunks, so small steps are noise). Any sample over the hard bound also
//! fails, in case memory rises so early that the quarters miss it.

use std::time::{Duration, Instant};

use super::{checks, drive, Settings, Stack};

/// What a memory series may do.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A rise up to this many bytes is noise.
    pub floor: u64,
    /// ... plus this share of the second quarter's median.
    pub share: f64,
    /// No sample may exceed this.
    pub max: u64,
}

/// The three series a soak samples, with their limits.
pub const SERIES: [(&str, Limits); 3] = [
    // Wasm memory grows in 64 KiB pages and never shrinks: 1 MiB (16 pages) or 5% is room for one late
    // high-water mark, not for a leak of a few bytes per request over hundreds of thousands of requests.
    (
        "wasmcustom.llmroute_vm_memory_bytes",
        Limits {
            floor: 1 << 20,
            share: 0.05,
            max: 256 << 20,
        },
    ),
    // tcmalloc's bytes in use by Envoy: its stats, connection pools and buffers move with load by a few MiB.
    (
        "server.memory_allocated",
        Limits {
            floor: 8 << 20,
            share: 0.10,
            max: 1 << 30,
        },
    ),
    // The heap tcmalloc holds from the OS: grows in chunks and is rarely returned.
    (
        "server.memory_heap_size",
        Limits {
            floor: 16 << 20,
            share: 0.10,
            max: 2 << 30,
        },
    ),
];

/// The verdict on one series.
#[derive(Clone, Debug, PartialEq)]
pub struct Growth {
    pub second_quarter: u64,
    pub last_quarter: u64,
    pub max: u64,
    pub passed: bool,
    pub why: String,
}

fn median(values: &[u64]) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Judges `samples` (time since the start, value) of a run of `length`.
pub fn growth(samples: &[(Duration, u64)], length: Duration, limits: Limits) -> Growth {
    let warm_up = (length / 4).max(Duration::from_secs(10));
    let kept: Vec<u64> = samples.iter().filter(|(t, _)| *t >= warm_up).map(|(_, v)| *v).collect();
    let max = samples.iter().map(|(_, v)| *v).max().unwrap_or(0);
    let quarter = kept.len() / 4;
    if quarter < 2 {
        return Growth {
            second_quarter: 0,
            last_quarter: 0,
            max,
            passed: false,
            why: format!("too few samples after the warm-up ({}) to judge", kept.len()),
        };
    }
    let second = median(&kept[quarter..2 * quarter]);
    let last = median(&kept[kept.len() - quarter..]);
    let allowed = limits.floor + (second as f64 * limits.share) as u64;
    let rise = last.saturating_sub(second);
    let (passed, why) = if max > limits.max {
        (false, format!("a sample of {max} is over the bound {}", limits.max))
    } else if rise > allowed {
        (false, format!("rose {rise} bytes, more than the {allowed} allowed"))
    } else {
        (true, format!("rose {rise} bytes of {allowed} allowed"))
    };
    Growth {
        second_quarter: second,
        last_quarter: last,
        max,
        passed,
        why,
    }
}

/// What a soak found.
pub struct SoakReport {
    pub settings: Settings,
    pub sent: u64,
    pub elapsed: Duration,
    pub outcomes: std::collections::BTreeMap<String, u64>,
    /// Per series: its name, the verdict, and its first and last samples.
    pub series: Vec<(String, Growth, u64, u64)>,
    pub samples: usize,
    pub outcome_check: checks::Check,
}

impl SoakReport {
    pub fn passed(&self) -> bool {
        self.outcome_check.passed && self.series.iter().all(|(_, g, _, _)| g.passed)
    }

    pub fn markdown(&self, date: &str, machine: &str) -> String {
        let s = &self.settings;
        let mut out = format!(
            "### Soak of {date}\n\n{machine}. Seed {}, {} requests/s for {} s: {} sent in {:.1} s; {} samples \
             of each series. Outcomes: {:?}.\n\n| series | first | 2nd-quarter median | last-quarter median | \
             max | verdict |\n|---|---|---|---|---|---|\n",
            s.seed,
            s.rps,
            s.duration.as_secs(),
            self.sent,
            self.elapsed.as_secs_f64(),
            self.samples,
            self.outcomes,
        );
        for (name, g, first, _) in &self.series {
            let verdict = if g.passed { "pass" } else { "**FAIL**" };
            out.push_str(&format!(
                "| `{name}` | {} | {} | {} | {} | {verdict}: {} |\n",
                mib(*first),
                mib(g.second_quarter),
                mib(g.last_quarter),
                mib(g.max),
                g.why
            ));
        }
        let verdict = if self.outcome_check.passed { "pass" } else { "**FAIL**" };
        out.push_str(&format!("\nOutcomes: {verdict}: {}\n", self.outcome_check.detail));
        out
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Each sample: its time since the start and the value of each of [`SERIES`].
type Samples = std::sync::Arc<std::sync::Mutex<Vec<(Duration, Vec<u64>)>>>;

/// Runs the soak: a healthy 3-engine fleet, the load, and a sample of each series every `sample_every`.
pub async fn run_soak(settings: Settings, sample_every: Duration) -> Result<SoakReport, String> {
    let stack = std::sync::Arc::new(Stack::start(3, settings.base_ejection, |_, _| {}).await?);
    println!(
        "soak: seed {}, {} req/s for {} s, samples every {} s; Envoy on {}",
        settings.seed,
        settings.rps,
        settings.duration.as_secs(),
        sample_every.as_secs(),
        stack.envoy.listen
    );
    let start = Instant::now();
    let samples: Samples = Default::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sampler = {
        let (stack, samples) = (stack.clone(), samples.clone());
        tokio::spawn(async move {
            while !*stop_rx.borrow() {
                let stats = stack.stats().await;
                let values = SERIES
                    .iter()
                    .map(|(n, _)| stats.get(*n).copied().unwrap_or(0))
                    .collect();
                samples
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((start.elapsed(), values));
                tokio::time::sleep(sample_every).await;
            }
        })
    };
    let latest = samples.clone();
    let load = drive(&stack.envoy.url(""), &settings, move || {
        let s = latest.lock().unwrap_or_else(|p| p.into_inner());
        let Some((_, v)) = s.last() else { return String::new() };
        let parts: Vec<String> = SERIES
            .iter()
            .zip(v)
            .map(|((n, _), v)| format!("{n} {}", mib(*v)))
            .collect();
        format!("; {}", parts.join(", "))
    })
    .await?;
    let _ = stop_tx.send(true);
    let _ = sampler.await;
    let samples = samples.lock().unwrap_or_else(|p| p.into_inner()).clone();
    // The series are judged over the load's own time: the drain after it is left out.
    let series = SERIES
        .iter()
        .enumerate()
        .map(|(i, (name, limits))| {
            let points: Vec<(Duration, u64)> = samples
                .iter()
                .filter(|(t, _)| *t <= settings.duration)
                .map(|(t, v)| (*t, v.get(i).copied().unwrap_or(0)))
                .collect();
            let first = points.first().map_or(0, |p| p.1);
            let last = points.last().map_or(0, |p| p.1);
            (
                name.to_string(),
                growth(&points, settings.duration, *limits),
                first,
                last,
            )
        })
        .collect();
    let outcomes = checks::tally(load.records.iter().map(|r| &r.outcome));
    let complete = outcomes.get("complete").copied().unwrap_or(0);
    let outcome_check = checks::Check {
        name: "every request of a healthy fleet completes".into(),
        passed: complete == load.sent,
        detail: format!("{complete} of {} complete: {outcomes:?}", load.sent),
    };
    Ok(SoakReport {
        settings,
        sent: load.sent,
        elapsed: load.elapsed,
        outcomes,
        series,
        samples: samples.len(),
        outcome_check,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        floor: 100,
        share: 0.10,
        max: 10_000,
    };

    fn series(f: impl Fn(u64) -> u64) -> Vec<(Duration, u64)> {
        (0..60).map(|s| (Duration::from_secs(s), f(s))).collect()
    }

    #[test]
    fn flat_with_noise_and_a_spike_passes() {
        let flat = series(|s| 1000 + (s * 37 % 50) + if s == 40 { 3000 } else { 0 });
        let g = growth(&flat, Duration::from_secs(60), LIMITS);
        assert!(g.passed, "{g:?}");
    }

    #[test]
    fn a_warm_up_rise_is_forgiven() {
        let warm = series(|s| if s < 12 { 100 + s * 80 } else { 1000 });
        assert!(growth(&warm, Duration::from_secs(60), LIMITS).passed);
    }

    #[test]
    fn steady_growth_fails_and_so_does_the_bound() {
        let leak = series(|s| 1000 + s * 20);
        let g = growth(&leak, Duration::from_secs(60), LIMITS);
        assert!(!g.passed, "{g:?}");
        assert!(g.last_quarter > g.second_quarter);
        let high = series(|_| 20_000);
        assert!(!growth(&high, Duration::from_secs(60), LIMITS).passed);
        let few = series(|_| 1);
        assert!(!growth(&few[..12], Duration::from_secs(60), LIMITS).passed);
    }
}
