//! Where the filter's cost goes, measured inside Envoy: the filter built with its later phases switched off
//! (`make build-phases`, see `filter/src/phases.rs`), one Envoy per phase, side by side with plain Envoy and the
//! whole filter in the same interleaved rounds. Every row is an Envoy started for the breakdown once the main run's
//! have stopped, so all rows are equally fresh.
//!
//! Each phase's Envoy runs the filter up to and including that phase; every later phase returns at once. So the
//! proxy CPU per request of one row minus the row above is what that phase adds, taken per round (the rows of one
//! round ran within seconds of each other) and then the median over rounds. Every phase Envoy routes to the
//! backend's cluster statically, like plain Envoy, because a filter stopped early names no cluster. Two rows
//! follow: the shipped build routed the same way (`static`: against `response` it shows what the bench build's
//! switches cost, which should be nothing), and the shipped filter routing on its own `x-llmroute-cluster` header
//! (against `static`: what that routing adds in Envoy).
//!
//! The floor: a filter that routes on the body in a wasm VM must enter the VM, have Envoy buffer the body and copy
//! it in, and read it. The first, third and fourth phases are that; what they cost over plain Envoy bounds the
//! best throughput ratio any such filter reaches on this machine, whatever its host calls.
//!
//! One request at a time (4 KiB, concurrency 1, when the run has it), the same rows give each phase's share of the
//! unloaded added latency: the floor's share bounds the added p50 any such filter reaches here.
//!
//! The native build gets the same breakdown ([`Build::Native`]): its bench build (`make native-phases`) reads the
//! last phase from the Envoy process's environment, as a dynamic module has no VM configuration. Its floor is
//! entering the module, Envoy buffering the body and the module reading it once, and the scan.

use std::fmt::Write;
use std::path::Path;
use std::time::Instant;

use super::overhead::{interleaved, prepare, progress, Case, Rounds, RowRounds, Settings};
use super::systems::bench_config;
use super::upstream::Upstreams;
use crate::envoy::{native_module, phases_native_module, phases_wasm_module, Envoy, EnvoyOptions, BENCH_PHASE_ENV};

/// The build a breakdown measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    Wasm,
    Native,
}

impl Build {
    /// What the `enter` and `copy` phases add in this build (the other phases add the same in both).
    fn what(self, phase: &'static str, wasm: &'static str) -> &'static str {
        match (self, phase) {
            (Build::Native, "enter") => {
                "calling into the module: the stream's context and each hook, returning at once"
            }
            (Build::Native, "copy") => "the body buffered by Envoy and read out of its slices once",
            _ => wasm,
        }
    }

    /// Where the filter runs, for the section's sentences.
    fn runs_in(self) -> &'static str {
        match self {
            Build::Wasm => "in a wasm VM",
            Build::Native => "as a dynamic module",
        }
    }

    /// The section's title.
    fn title(self) -> &'static str {
        match self {
            Build::Wasm => "Where the filter's cost goes, phase by phase, inside Envoy",
            Build::Native => "Where the native build's cost goes, phase by phase, inside Envoy",
        }
    }

    /// The goal for the added p50 unloaded that the latency table is read against (issues 13 and 28).
    fn p50_goal_us(self) -> u32 {
        match self {
            Build::Wasm => 50,
            Build::Native => 25,
        }
    }
}

/// The filter's phases in the order it runs them, with what each adds (the names `filter/src/phases.rs` reads).
pub const PHASES: [(&str, &str); 7] = [
    (
        "enter",
        "entering the VM: the HTTP context and each callback, returning at once",
    ),
    (
        "headers",
        "request headers read whole, client headers stripped, the request classified",
    ),
    ("copy", "the body buffered by Envoy and copied into the VM"),
    (
        "scan",
        "the core's decision: one pass over the body, fields, affinity key",
    ),
    ("patch", "the head edit of `model` and its `content-length`"),
    ("request", "route, affinity and estimate headers, access-log fields"),
    (
        "response",
        "the response path: header plan, usage read from the answer, `on_log` metrics",
    ),
];

/// The phases whose sum is the floor of any body-routing wasm filter.
const FLOOR: [&str; 3] = ["enter", "copy", "scan"];

/// The rows after the phases: the shipped build routed as the phase Envoys are, then as it ships.
const STATIC: &str = "the shipped build, routed statically like the phase Envoys";
const SHIPPED: &str = "shipped filter, routed on its cluster header";

/// Body sizes the breakdown runs at (those of the run's sizes that are here).
const SIZES: [usize; 2] = [4 << 10, 256 << 10];

/// The rounds of one case: `rounds[row]`, row 0 plain Envoy, then each phase, then the shipped build routed
/// statically, then the shipped filter.
pub type PhaseCase = RowRounds;

/// The row of each floor phase.
fn floor_rows() -> impl Iterator<Item = Option<usize>> {
    FLOOR
        .iter()
        .map(|name| PHASES.iter().position(|(n, _)| n == name).map(|i| i + 1))
}

impl PhaseCase {
    /// The floor's CPU per request over plain Envoy: the sum of the [`FLOOR`] phases' medians.
    pub fn floor_us(&self) -> Option<f64> {
        floor_rows().map(|r| r.and_then(|r| self.added_us(r))).sum()
    }

    /// The floor's p50 latency over plain Envoy: the sum of the [`FLOOR`] phases' medians.
    pub fn floor_p50_us(&self) -> Option<f64> {
        floor_rows().map(|r| r.and_then(|r| self.added_p50_us(r))).sum()
    }
}

/// The case measured one request at a time, for latency.
const LATENCY: Case = Case {
    size: 4 << 10,
    concurrency: 1,
};

/// The breakdown, or why it could not run.
#[derive(Debug, Clone)]
pub enum Breakdown {
    Ran(Vec<PhaseCase>),
    Missing(String),
}

/// Runs the breakdown at 4 KiB and 256 KiB (those of `settings.sizes`), at concurrency 16 (or the highest run),
/// then at 4 KiB one request at a time when the run has that case.
/// Every row is an Envoy started for it, at the same moment, so none carries the main run's load: an Envoy that
/// has buffered ten minutes of bodies up to 1 MiB costs more per large body than a fresh one.
pub async fn run(settings: &Settings, upstreams: &Upstreams, started: Instant, build: Build) -> Breakdown {
    let (phased, make) = match build {
        Build::Wasm => (phases_wasm_module(), "make build-phases"),
        Build::Native => (phases_native_module(), "make native-phases"),
    };
    if !phased.exists() {
        return Breakdown::Missing(format!("{} is missing: run `{make}`", phased.display()));
    }
    let base = EnvoyOptions {
        concurrency: 1,
        log_level: "warning".into(),
        cpu_list: settings.proxy_cpus.clone(),
        module: (build == Build::Native).then(native_module),
        ..EnvoyOptions::default()
    };
    let rows = rows(build, base, &phased);
    let mut envoys = Vec::new();
    for (what, opts) in rows {
        progress(None, &format!("starting {what}"));
        match Envoy::start_with(bench_config(&upstreams.endpoints()), opts).await {
            Ok(e) => envoys.push(e),
            Err(e) => return Breakdown::Missing(format!("{what} did not start: {e}")),
        }
    }
    let targets: Vec<(String, u32)> = envoys
        .iter()
        .map(|e| (e.url(super::systems::CHAT_PATH), e.pid()))
        .collect();
    let concurrency = settings
        .concurrencies
        .iter()
        .copied()
        .find(|&c| c >= 16)
        .or(settings.concurrencies.iter().copied().max())
        .unwrap_or(16);
    let mut cases = Vec::new();
    for size in SIZES.into_iter().filter(|s| settings.sizes.contains(s)) {
        let case = Case { size, concurrency };
        match run_case(settings, case, &targets, started).await {
            Ok(c) => cases.push(c),
            Err(e) => return Breakdown::Missing(e),
        }
    }
    let measured = |c: &Case| cases.iter().any(|p: &PhaseCase| p.case == *c);
    if settings.sizes.contains(&LATENCY.size)
        && settings.concurrencies.contains(&LATENCY.concurrency)
        && !measured(&LATENCY)
    {
        match run_case(settings, LATENCY, &targets, started).await {
            Ok(c) => cases.push(c),
            Err(e) => return Breakdown::Missing(e),
        }
    }
    Breakdown::Ran(cases)
}

/// The breakdown's Envoys, each with what it runs: plain Envoy, then `build` up to each phase (the bench build
/// `phased`, routed statically), then the shipped build `base` loads routed statically and as it ships.
pub fn rows(build: Build, base: EnvoyOptions, phased: &Path) -> Vec<(String, EnvoyOptions)> {
    let mut rows: Vec<(String, EnvoyOptions)> = vec![(
        "plain Envoy".into(),
        EnvoyOptions {
            with_filter: false,
            ..base.clone()
        },
    )];
    for (name, _) in PHASES {
        let opts = match build {
            Build::Wasm => EnvoyOptions {
                wasm: Some(phased.to_path_buf()),
                vm_configuration: Some(name.to_string()),
                static_route: true,
                ..base.clone()
            },
            Build::Native => EnvoyOptions {
                module: Some(phased.to_path_buf()),
                env: vec![(BENCH_PHASE_ENV.to_string(), name.to_string())],
                static_route: true,
                ..base.clone()
            },
        };
        rows.push((format!("the filter up to phase `{name}`"), opts));
    }
    let statically = EnvoyOptions {
        static_route: true,
        ..base.clone()
    };
    rows.push((STATIC_ROW.into(), statically));
    rows.push((SHIPPED_ROW.into(), base));
    rows
}

/// The names of the last two rows of [`rows`].
pub const STATIC_ROW: &str = "the shipped filter routed statically";
pub const SHIPPED_ROW: &str = "the shipped filter";

/// A row's short name in the progress lines: the table's name, plain Envoy shortened.
fn row_name(row: usize) -> &'static str {
    match row {
        0 => "plain",
        r => row_label(r).0,
    }
}

async fn run_case(
    settings: &Settings,
    case: Case,
    targets: &[(String, u32)],
    started: Instant,
) -> Result<PhaseCase, String> {
    let requests = prepare(case.size, settings.families, settings.seed);
    let client = super::load::client(case.concurrency).map_err(|e| format!("building the HTTP client: {e}"))?;
    for (url, _) in targets {
        super::load::run(&client, url, &requests, case.concurrency, settings.warmup).await;
    }
    let r = Rounds::of(settings, case, &client, &requests, started);
    let rounds = interleaved(&r, targets, row_name).await;
    Ok(PhaseCase { case, rounds })
}

/// The section of `RESULTS.md`.
pub fn markdown(md: &mut String, b: &Breakdown, build: Build) {
    let _ = writeln!(md, "## {}\n", build.title());
    let cases = match b {
        Breakdown::Missing(why) => {
            let _ = writeln!(md, "Not measured in this run: {}\n", why.lines().next().unwrap_or(why));
            return;
        }
        Breakdown::Ran(cases) => cases,
    };
    let (latency, cases): (Vec<&PhaseCase>, Vec<&PhaseCase>) =
        cases.iter().partition(|c| c.case.concurrency == LATENCY.concurrency);
    let _ = writeln!(
        md,
        "The {} built with its later phases switched off (`make {}`), one Envoy per phase, measured \
         in the same interleaved rounds as plain Envoy and the shipped filter; every row is an Envoy started for \
         this section, after the main run's have stopped. Each phase's Envoy runs the filter up \
         to that phase; \"adds\" is its proxy CPU per request minus the row above's, per round, then the median over \
         rounds (so the column need not sum exactly). Phase Envoys route to the cluster statically, like plain \
         Envoy. `static` is the shipped build routed the same way (what it adds over `response` is the bench \
         build's own switches, noise when small); the last row is the shipped filter routing on its own cluster \
         header, so what it adds over `static` is what that routing costs Envoy. Method: \
         [bench/README.md](README.md#where-the-cost-goes-the-phase-breakdown).\n",
        match build {
            Build::Wasm => "filter",
            Build::Native => "native build",
        },
        match build {
            Build::Wasm => "build-phases",
            Build::Native => "native-phases; the last phase comes from the Envoy process's environment",
        },
    );
    let mut head = String::from("| phase | what it adds |");
    let mut rule = String::from("|---|---|");
    for c in &cases {
        let l = c.case.label();
        let _ = write!(head, " {l}: CPU µs/req | {l}: adds µs | {l}: × plain req/s |");
        rule.push_str("---:|---:|---:|");
    }
    let _ = writeln!(md, "{head}\n{rule}");
    for row in 0..ROWS {
        let (name, what) = row_label(row);
        let _ = write!(md, "| {name} | {} |", build.what(name, what));
        for c in &cases {
            let added = if row == 0 {
                "–".into()
            } else {
                num(c.added_us(row), 1)
            };
            let ratio = if row == 0 { "–".into() } else { num(c.ratio(row), 2) };
            let _ = write!(md, " {} | {added} | {ratio} |", num(c.cpu_us(row), 1));
        }
        md.push('\n');
    }
    md.push('\n');
    for c in &cases {
        let plain = c.cpu_us(0);
        let floor = c.floor_us();
        let whole = c.over_plain_us(PHASES.len());
        let shipped = c.over_plain_us(PHASES.len() + 2);
        let ratio = |over: Option<f64>| plain.zip(over).map(|(p, o)| p / (p + o));
        let _ = writeln!(
            md,
            "- **{}.** The filter adds {} µs of proxy CPU per request over plain Envoy's {} µs (up to `response`). \
             The floor (`enter` + `copy` + `scan`: what any filter that routes on the body {} pays) is {} \
             µs, so on proxy CPU the best ratio to plain Envoy is {}×; the whole filter reaches {}× up to `response` \
             and {}× as shipped, routed on its header. The rest, {} µs, is the header and property calls, the head \
             edit and the response path.",
            c.case.label(),
            num(whole, 1),
            num(plain, 1),
            build.runs_in(),
            num(floor, 1),
            num(ratio(floor), 2),
            num(ratio(whole), 2),
            num(ratio(shipped), 2),
            num(whole.zip(floor).map(|(w, f)| w - f), 1),
        );
    }
    md.push('\n');
    for c in latency {
        latency_markdown(md, c, build);
    }
}

/// Rows of a case: plain Envoy, the phases, `static`, `shipped`.
const ROWS: usize = PHASES.len() + 3;

fn row_label(row: usize) -> (&'static str, &'static str) {
    match row {
        0 => ("plain Envoy", "no filter"),
        r if r <= PHASES.len() => PHASES.get(r - 1).copied().unwrap_or(("?", "?")),
        r if r == PHASES.len() + 1 => ("static", STATIC),
        _ => ("shipped", SHIPPED),
    }
}

/// The latency table of the case run one request at a time, and what its floor says of the 50 µs goal.
fn latency_markdown(md: &mut String, c: &PhaseCase, build: Build) {
    let l = c.case.label();
    let _ = writeln!(
        md,
        "**One request at a time ({l}).** The same rows, unloaded: each phase's share of the added latency, the \
         median over rounds of each round's p50 minus the row above's.\n"
    );
    let _ = writeln!(
        md,
        "| phase | p50 µs | adds at p50 µs | CPU µs/req | adds CPU µs |\n|---|---:|---:|---:|---:|"
    );
    for row in 0..ROWS {
        let (name, _) = row_label(row);
        let dash = |v: Option<f64>| if row == 0 { "–".to_string() } else { num(v, 1) };
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} |",
            num(c.p50_us(row), 0),
            dash(c.added_p50_us(row)),
            num(c.cpu_us(row), 1),
            dash(c.added_us(row)),
        );
    }
    let _ = writeln!(
        md,
        "\n- **{l}.** The filter adds {} µs at p50 over plain Envoy's {} µs up to `response` ({} as shipped). The \
         floor's phases (`enter` + `copy` + `scan`) add {} µs at p50 ({} µs of CPU): the least unloaded added \
         latency a filter that routes on the body {} reaches on this machine, against the goal of {} µs.\n",
        num(c.over_plain_p50_us(PHASES.len()), 0),
        num(c.p50_us(0), 0),
        num(c.over_plain_p50_us(PHASES.len() + 2), 0),
        num(c.floor_p50_us(), 0),
        num(c.floor_us(), 1),
        build.runs_in(),
        build.p50_goal_us(),
    );
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.filter(|v| v.is_finite())
        .map_or("n/a".into(), |v| format!("{v:.digits$}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::overhead::measured as m;

    /// Plain 50 µs, then each phase 10 µs more than the one above, the statically routed shipped build 1 µs more
    /// than `response`, the shipped filter 5 µs more than that.
    fn sample() -> PhaseCase {
        let mut rounds = Vec::new();
        for row in 0..=PHASES.len() {
            let cpu = 50.0 + 10.0 * row as f64;
            rounds.push(vec![m(cpu, 1e6 / cpu); 3]);
        }
        for extra in [1.0, 6.0] {
            let cpu = 50.0 + 10.0 * PHASES.len() as f64 + extra;
            rounds.push(vec![m(cpu, 1e6 / cpu); 3]);
        }
        PhaseCase {
            case: Case {
                size: 4 << 10,
                concurrency: 16,
            },
            rounds,
        }
    }

    #[test]
    fn each_phase_is_the_difference_from_the_row_above() {
        let c = sample();
        for row in 1..=PHASES.len() {
            assert!((c.added_us(row).unwrap() - 10.0).abs() < 1e-6);
        }
        assert!((c.added_us(PHASES.len() + 1).unwrap() - 1.0).abs() < 1e-6);
        assert!((c.added_us(PHASES.len() + 2).unwrap() - 5.0).abs() < 1e-6);
        assert_eq!(row_name(PHASES.len() + 1), "static");
        assert_eq!(row_name(PHASES.len() + 2), "shipped");
        assert_eq!(c.added_us(0), None);
        assert!((c.floor_us().unwrap() - 30.0).abs() < 1e-6);
        assert!((c.over_plain_us(PHASES.len()).unwrap() - 70.0).abs() < 1e-6);
        assert!((c.ratio(1).unwrap() - 50.0 / 60.0).abs() < 1e-6);
    }

    #[test]
    fn the_section_names_every_phase_and_the_floor() {
        let mut md = String::new();
        markdown(&mut md, &Breakdown::Ran(vec![sample()]), Build::Wasm);
        for (name, _) in PHASES {
            assert!(md.contains(&format!("| {name} |")), "{name} missing in:\n{md}");
        }
        assert!(md.contains("| plain Envoy | no filter | 50.0 | – | – |"), "{md}");
        assert!(md.contains("| enter | "), "{md}");
        assert!(
            md.contains("| static | the shipped build, routed statically like the phase Envoys | 121.0 | 1.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| shipped | shipped filter, routed on its cluster header | 126.0 | 5.0 |"),
            "{md}"
        );
        assert!(
            md.contains("is 30.0 µs, so on proxy CPU the best ratio to plain Envoy is 0.62×"),
            "{md}"
        );
        // Plain 50 µs; up to `response` 70 µs more, shipped 76 µs more.
        assert!(
            md.contains("reaches 0.42× up to `response` and 0.40× as shipped"),
            "{md}"
        );
        assert!(
            !md.contains("One request at a time"),
            "no concurrency-1 case, no latency table"
        );
        let mut missing = String::new();
        markdown(&mut missing, &Breakdown::Missing("no module\nmore".into()), Build::Wasm);
        assert!(missing.contains("Not measured in this run: no module\n"));
    }

    #[test]
    fn the_case_run_one_at_a_time_gets_a_latency_table_and_floor() {
        // p50 = 200 µs + 4× the CPU above plain: each phase adds 40 µs at p50, the floor's three phases 120.
        let mut latency = sample();
        latency.case.concurrency = 1;
        for m in latency.rounds.iter_mut().flatten() {
            let over = m.cpu_per_req.unwrap() * 1e6 - 50.0;
            m.p50_us = Some(200.0 + 4.0 * over);
        }
        let mut md = String::new();
        markdown(&mut md, &Breakdown::Ran(vec![sample(), latency.clone()]), Build::Wasm);
        assert!(md.contains("**One request at a time (4 KiB c=1).**"), "{md}");
        assert!(md.contains("| plain Envoy | 200 | – | 50.0 | – |"), "{md}");
        assert!(md.contains("| enter | 240 | 40.0 | 60.0 | 10.0 |"), "{md}");
        assert!(
            md.contains("The filter adds 280 µs at p50 over plain Envoy's 200 µs up to `response` (304 as shipped)"),
            "{md}"
        );
        assert!(md.contains("add 120 µs at p50 (30.0 µs of CPU)"), "{md}");
        // The throughput table keeps only the loaded case's columns.
        assert_eq!(md.matches(": adds µs |").count(), 1, "{md}");
        assert!(md.contains("against the goal of 50 µs"), "{md}");

        let mut native = String::new();
        markdown(&mut native, &Breakdown::Ran(vec![sample(), latency]), Build::Native);
        assert!(native.starts_with("## Where the native build's cost goes"), "{native}");
        assert!(native.contains("`make native-phases;"), "{native}");
        assert!(native.contains("| enter | calling into the module"), "{native}");
        assert!(
            native.contains("routes on the body as a dynamic module reaches"),
            "{native}"
        );
        assert!(
            native.contains("against the goal of 25 µs") && !native.contains("wasm VM"),
            "{native}"
        );
    }
}
