//! Writes `bench/RESULTS.md`: the machine, the versions, the settings, one table per concurrency, the goals,
//! memory, the core's cost natively against its cost inside Envoy, and the microbenchmarks when they ran.

use std::fmt::Write;

use super::body::size_label;
use super::goals;
use super::machine::Machine;
use super::overhead::{CaseResult, Outcome, UPSTREAMS};
use super::systems::Kind;

/// What `make bench-micro` left, already rendered as markdown tables.
#[derive(Debug, Clone, Default)]
pub struct Micro {
    pub criterion: Option<String>,
    pub alloc: Option<String>,
}

/// The whole results file.
pub fn markdown(outcome: &Outcome, machine: &Machine, micro: &Micro) -> String {
    let mut md = String::new();
    header(&mut md, outcome, machine);
    settings(&mut md, outcome, machine);
    for &c in &outcome.settings.concurrencies {
        table(&mut md, outcome, c);
    }
    goals_section(&mut md, outcome);
    native_build(&mut md, outcome);
    placement(&mut md, outcome);
    memory(&mut md, outcome);
    native(&mut md, outcome);
    super::phases::markdown(&mut md, &outcome.phases, super::phases::Build::Wasm);
    super::phases::markdown(&mut md, &outcome.native_phases, super::phases::Build::Native);
    micro_section(&mut md, micro);
    md
}

fn header(md: &mut String, o: &Outcome, m: &Machine) {
    let s = &o.settings;
    title_and_machine(md, "Benchmark results", "overhead", s.seed, s.quick, o.elapsed, m);
}

/// Prints the closing line of a bench run: the results file and the plot written (`text`: whether the plot has
/// text), and how long the run took.
pub fn print_written(results: &std::path::Path, png: &std::path::Path, text: bool, elapsed: std::time::Duration) {
    let note = if text {
        ""
    } else {
        " (no font found: drawn without text)"
    };
    println!(
        "wrote {} and {}{note} in {:.0} s",
        results.display(),
        png.display(),
        elapsed.as_secs_f64()
    );
}

/// The title, a line on how the file was written (`make bench-<command>`), and the machine and versions table;
/// shared by every bench's results file.
pub(crate) fn title_and_machine(
    md: &mut String,
    title: &str,
    command: &str,
    seed: u64,
    quick: bool,
    elapsed: std::time::Duration,
    m: &Machine,
) {
    let quick = if quick {
        " (--quick: a sanity run, not for quoting)"
    } else {
        ""
    };
    let _ = writeln!(
        md,
        "# {title}\n\nWritten by `make bench-{command}` (`llmroute-bench {command} --seed {seed}`) on {}{quick}, \
         in {:.0} s. Regenerate it rather than editing it.\n",
        m.date,
        elapsed.as_secs_f64()
    );
    let _ = writeln!(md, "## Machine and versions\n\n| | |\n|---|---|");
    let _ = writeln!(md, "| CPUs (`nproc`) | {} |\n| CPU model | {} |", m.nproc, m.cpu_model);
    let _ = writeln!(md, "| Linux kernel | {} |\n| Envoy | {} |", m.kernel, m.envoy);
    for (kind, version) in &m.peers {
        let _ = writeln!(md, "| {} | {version} |", kind.name());
    }
    let _ = writeln!(md, "| rustc | {} |\n", m.rustc);
}

fn settings(md: &mut String, o: &Outcome, m: &Machine) {
    let s = &o.settings;
    let pin = match (&s.proxy_cpus, &s.bench_cpus) {
        (Some(p), Some(b)) => format!(
            "Each proxy is pinned to CPU {p} (`taskset -c {p}`); the load generator and the upstreams share CPU {b} \
             (one tokio thread, pinned by the bench itself)."
        ),
        _ => format!("Nothing is pinned ({} CPU(s) seen, or no `taskset`).", m.nproc),
    };
    let sizes: Vec<String> = s.sizes.iter().map(|&b| size_label(b)).collect();
    let _ = writeln!(md, "## Settings\n");
    let _ = writeln!(
        md,
        "- **Proxies.** Envoy runs with `--concurrency 1` (one worker thread), with the wasm filter, with the native \
         build (`make native`: the same render with Envoy's dynamic-module filter loading `libllmroute_native.so` \
         in its place), and without either (the same render minus the filter; its route names the cluster and \
         hashes the client's `x-llmroute-affinity`, which every request carries). The peers run their default \
         `cache_aware` policy. {pin}"
    );
    let _ = writeln!(
        md,
        "- **Upstream.** {UPSTREAMS} minimal bench upstreams (`harness/src/bench/upstream.rs`), not the engine \
         emulator: they read each body to the end without keeping it and answer a fixed ~300-byte non-streamed \
         chat completion. The emulator records every body and parses it, which at these rates would cost more than \
         the proxies under test. The \"direct\" row is the load generator straight to one upstream: the most this \
         client and upstream manage on their CPU."
    );
    let _ = writeln!(
        md,
        "- **Load.** Closed loop, HTTP/1.1 keep-alive, concurrency {}; chat bodies of {} (a system prompt plus a \
         padded user message, `model` = the alias), {} prompt families, seed {}.",
        join(&s.concurrencies),
        sizes.join(", "),
        s.families,
        s.seed
    );
    let _ = writeln!(
        md,
        "- **Rounds.** Per case, a {:.1} s warm-up of each system, one direct round, then {} interleaved rounds \
         (A B C ..., B C ... A, ...) of {:.1} s each. Ratios and added latency are per round against the plain-Envoy \
         round beside it; every figure is the median over rounds.",
        s.warmup.as_secs_f64(),
        s.rounds,
        s.round.as_secs_f64()
    );
    let _ = writeln!(
        md,
        "- **Proxy CPU** is `utime + stime` of the proxy process (all threads) from `/proc/<pid>/stat` over a round, \
         divided by the requests it served."
    );
    let load = |l: &Option<String>| l.clone().unwrap_or_else(|| "unknown".into());
    let foreign = o.foreign_load().map_or(String::new(), |(median, max)| {
        format!(
            " During measured rounds, other work took a median {:.0}% (at most {:.0}%) of the proxies' CPU.",
            median * 100.0,
            max * 100.0
        )
    });
    let _ = writeln!(
        md,
        "- **Noise.** Load average {} before the run and {} after.{foreign} The machine is shared; ratios are \
         taken per round for that reason.",
        load(&o.load_before),
        load(&o.load_after)
    );
    for missing in &o.missing {
        let _ = writeln!(
            md,
            "- **Missing: {}.** {}",
            missing.kind.name(),
            first_line(&missing.reason)
        );
    }
    md.push('\n');
}

fn table(md: &mut String, o: &Outcome, concurrency: usize) {
    let _ = writeln!(md, "## Overhead at concurrency {concurrency}\n");
    if concurrency == 1 {
        md.push_str(
            "One request at a time: nothing queues, so the latencies are each proxy's unloaded per-request cost.\n\n",
        );
    }
    let _ = writeln!(
        md,
        "| body | system | req/s | × plain | × plain by CPU | p50 µs | p99 µs | added p50 µs | added p99 µs | \
         proxy CPU µs/req | RSS MiB | VM MiB per worker | errors |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for c in o.cases.iter().filter(|c| c.case.concurrency == concurrency) {
        let size = size_label(c.case.size);
        for kind in Kind::ALL {
            if c.runs(kind).is_some() {
                let _ = writeln!(md, "| {size} | {} |", row(c, kind));
            }
        }
        let d = &c.direct;
        let _ = writeln!(
            md,
            "| {size} | *direct (no proxy)* | {:.0} | | | {} | {} | | | | | | {} |",
            d.rps,
            num(d.p50_us, 0),
            num(d.p99_us, 0),
            d.errors
        );
    }
    md.push('\n');
}

fn row(c: &CaseResult, kind: Kind) -> String {
    let (errors, _) = c.errors(kind);
    let rss = c
        .runs(kind)
        .and_then(|r| r.rss_bytes)
        .map(|b| b as f64 / (1 << 20) as f64);
    let baseline = kind == Kind::PlainEnvoy;
    let vs_plain = |v: Option<f64>, digits| if baseline { "–".to_string() } else { num(v, digits) };
    let vm = match kind {
        Kind::Llmroute => num(c.vm_bytes.map(|b| b as f64 / (1 << 20) as f64), 2),
        _ => "–".into(),
    };
    format!(
        "{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {vm} | {errors}",
        kind.name(),
        num(c.rps(kind), 0),
        vs_plain(c.ratio(kind), 2),
        vs_plain(c.cpu_ratio(kind), 2),
        num(c.p50_us(kind), 0),
        num(c.p99_us(kind), 0),
        vs_plain(c.added_p50_us(kind), 0),
        vs_plain(c.added_p99_us(kind), 0),
        num(c.cpu_us(kind), 1),
        num(rss, 0),
    )
}

/// The native build beside the wasm filter, case by case, against plain Envoy and sglang-router; the goals it is
/// held to are in the goals section (prefixed `native:`).
fn native_build(md: &mut String, o: &Outcome) {
    if !o.cases.iter().any(|c| c.runs(Kind::Native).is_some()) {
        return;
    }
    let min: Vec<String> = goals::NATIVE_MIN_RATIO
        .iter()
        .map(|(size, m)| format!("{m}× plain Envoy's at {}", size_label(*size)))
        .collect();
    let _ = writeln!(
        md,
        "## The native build against plain Envoy and the wasm filter\n\n\
         The same filter as an Envoy dynamic module (`docs/native.md`), measured in the same interleaved rounds. \
         Its goals (issue 28): req/s at least {} (loaded), added p50 at most {:.0} µs unloaded, \
         and less proxy CPU per request than sglang-router at every size; each is judged in the goals table \
         above.\n\n\
         | case | native × plain | native × plain by CPU | wasm × plain | native added p50 µs | wasm added p50 µs | \
         native CPU µs/req | wasm CPU µs/req | plain CPU µs/req | sglang-router CPU µs/req |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        min.join(" and "),
        goals::NATIVE_MAX_ADDED_P50_US
    );
    for c in &o.cases {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.case.label(),
            num(c.ratio(Kind::Native), 2),
            num(c.cpu_ratio(Kind::Native), 2),
            num(c.ratio(Kind::Llmroute), 2),
            num(c.added_p50_us(Kind::Native), 0),
            num(c.added_p50_us(Kind::Llmroute), 0),
            num(c.cpu_us(Kind::Native), 1),
            num(c.cpu_us(Kind::Llmroute), 1),
            num(c.cpu_us(Kind::PlainEnvoy), 1),
            num(c.cpu_us(Kind::Sglang), 1),
        );
    }
    md.push('\n');
}

/// `bounded_keys`, with and without the placement store, against `hash`: what placement costs on known keys.
fn placement(md: &mut String, o: &Outcome) {
    let kinds = [Kind::BoundedKeys, Kind::BoundedKeysStore, Kind::NativeBoundedKeys];
    if !o.cases.iter().any(|c| kinds.iter().any(|&k| c.runs(k).is_some())) {
        return;
    }
    let _ = writeln!(
        md,
        "## Placement: `bounded_keys` against `hash`\n\n\
         The same Envoy and filter with `placement: bounded_keys`, without and with the placement store (a \
         3-member etcd cluster on loopback), against `placement: hash` (the *llmroute (Envoy + filter)* rows), \
         round by round; the native build's `bounded_keys` against its own `hash` rows (*llmroute native*). The \
         chosen host reaches Envoy as the stateful-session header in both builds. After the warm-up each of the {} prompt families is a known key, read from the local \
         table: this is the steady-state cost. A new key's first request, which waits for etcd, is measured apart \
         ([`llmroute-bench new-key`](#cost-of-a-new-key-with-the-placement-store-llmroute-bench-new-key)).\n\n\
         | case | system | req/s × hash | added p50 µs | added proxy CPU µs/req |\n|---|---|---:|---:|---:|",
        o.settings.families
    );
    for c in &o.cases {
        for kind in kinds {
            if c.runs(kind).is_none() {
                continue;
            }
            let (ratio, p50, cpu) = c.against_hash(kind);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                c.case.label(),
                kind.name(),
                num(ratio, 2),
                num(p50, 0),
                num(cpu, 1)
            );
        }
    }
    md.push('\n');
}

fn goals_section(md: &mut String, o: &Outcome) {
    let checks = goals::checks(o);
    let met = checks.iter().filter(|c| c.met == Some(true)).count();
    let cpu_met = checks
        .iter()
        .filter(|c| c.by_cpu.as_ref().is_some_and(|(_, m)| *m == Some(true)))
        .count();
    let cpu_total = checks.iter().filter(|c| c.by_cpu.is_some()).count();
    let _ = writeln!(
        md,
        "## Goals: {met} of {} met as measured; {cpu_met} of {cpu_total} on proxy CPU per request\n",
        checks.len()
    );
    let _ = writeln!(
        md,
        "The latency goal is judged at concurrency 1, where nothing queues. Throughput goals are judged as \
         measured and on proxy CPU per request (plain Envoy's ÷ ours: the ratio a CPU-bound proxy reaches on a \
         core of its own, and the steadier figure when other work shares the proxies' CPU).\n"
    );
    let _ = writeln!(
        md,
        "| case | goal | measured | | on CPU per request | |\n|---|---|---|---|---|---|"
    );
    for c in &checks {
        let (cpu, cpu_met): (String, &str) = c
            .by_cpu
            .clone()
            .map_or(("–".into(), ""), |(m, v)| (m, goals::verdict(v)));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {cpu} | {cpu_met} |",
            c.case,
            c.goal,
            c.measured,
            goals::verdict(c.met)
        );
    }
    md.push('\n');
}

fn memory(md: &mut String, o: &Outcome) {
    let m = &o.memory;
    let mib = |v: &[(Kind, Option<u64>)], k: Kind| {
        let b = v.iter().find(|(kind, _)| *kind == k).and_then(|(_, b)| *b);
        b.map(|b| b as f64 / (1 << 20) as f64)
    };
    let _ = writeln!(md, "## Memory\n");
    let vm = |b: Option<u64>| num(b.map(|b| b as f64 / (1 << 20) as f64), 2);
    let peak = o.cases.iter().filter_map(|c| c.vm_bytes).max();
    let _ = writeln!(
        md,
        "**VM memory per worker** (`{}`: the linear memory of the filter's largest VM, which is the worker's that \
         serves the requests; the filter raises it on every timer tick): {} MiB after start, before any load, and \
         {} MiB at most after the load; after each case it is the overhead tables' \"VM MiB per worker\" column. \
         The goal is at most {} MiB, steady under load.\n",
        super::overhead::VM_MEMORY_STAT,
        vm(m.idle_vm),
        vm(peak),
        goals::VM_MEMORY_GOAL >> 20
    );
    let _ = writeln!(
        md,
        "The wasm VM's memory is measured as the difference in resident memory (`VmRSS`) between the Envoy with \
         the filter and the plain Envoy, which differ only by the filter. Envoy's own heap \
         (`server.memory_allocated`) does not include V8's pages.\n"
    );
    let _ = writeln!(
        md,
        "| | llmroute Envoy | plain Envoy | difference | native Envoy | native − plain |\n\
         |---|---:|---:|---:|---:|---:|"
    );
    for (what, values) in [
        ("RSS after start, MiB", &m.idle_rss),
        ("RSS after the run, MiB", &m.end_rss),
        ("Envoy heap after the run, MiB", &m.end_heap),
    ] {
        let (a, b, n) = (
            mib(values, Kind::Llmroute),
            mib(values, Kind::PlainEnvoy),
            mib(values, Kind::Native),
        );
        let less = |x: Option<f64>| x.zip(b).map(|(x, b)| x - b);
        let _ = writeln!(
            md,
            "| {what} | {} | {} | {} | {} | {} |",
            num(a, 1),
            num(b, 1),
            num(less(a), 1),
            num(n, 1),
            num(less(n), 1)
        );
    }
    md.push('\n');
    if !m.wasm_stats.is_empty() {
        let stats: Vec<String> = m.wasm_stats.iter().map(|(k, v)| format!("`{k}: {v}`")).collect();
        let _ = writeln!(
            md,
            "Wasm stats on the admin `/stats` after the run: {}.\n",
            stats.join(", ")
        );
    }
}

fn native(md: &mut String, o: &Outcome) {
    let loaded = o.settings.concurrencies.iter().find(|&&c| c >= 16);
    let Some(&c) = loaded.or(o.settings.concurrencies.first()) else {
        return;
    };
    let _ = writeln!(md, "## The filter's work: natively against inside Envoy\n");
    let _ = writeln!(
        md,
        "The core's decision timed natively in the bench process (median of 7 batches), against the proxy CPU the \
         filter adds per request inside Envoy (llmroute minus plain Envoy, concurrency {c}). The difference is the \
         price of the wasm VM and its host calls: copying the body out of Envoy, the V8-compiled core, Envoy copying \
         in the edited head of the body (up to the end of `model`), and the header calls. The native build's column \
         is the same difference for the dynamic module, which has no VM: what is left is its host calls and Envoy's \
         own work for the filter.\n"
    );
    let _ = writeln!(
        md,
        "| body | `route` (chat) µs (native) | `BodyPatch::head_edit` µs (native) | added proxy CPU µs/req in Envoy | \
         Envoy ÷ native | added proxy CPU µs/req, native build |\n|---|---:|---:|---:|---:|---:|"
    );
    for n in &o.native {
        let case = o
            .cases
            .iter()
            .find(|r| r.case.size == n.size && r.case.concurrency == c);
        let over_plain =
            |kind| case.and_then(|r: &CaseResult| r.cpu_us(kind).zip(r.cpu_us(Kind::PlainEnvoy)).map(|(a, b)| a - b));
        let added = over_plain(Kind::Llmroute);
        let ratio = added.map(|a| a / (n.route_us + n.patch_us));
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.1} | {} | {} | {} |",
            size_label(n.size),
            n.route_us,
            n.patch_us,
            num(added, 1),
            num(ratio, 1),
            num(over_plain(Kind::Native), 1)
        );
    }
    md.push('\n');
}

fn micro_section(md: &mut String, micro: &Micro) {
    let _ = writeln!(md, "## Microbenchmarks (`make bench-micro`)\n");
    match &micro.criterion {
        Some(t) => {
            let _ = writeln!(
                md,
                "Criterion, `filter/core/benches/core.rs`, native, one thread:\n\n{t}"
            );
        }
        None => md.push_str("Criterion has not run on this machine: run `make bench-micro`, then this bench.\n\n"),
    }
    match &micro.alloc {
        Some(t) => {
            let _ = writeln!(md, "Allocations per request, `filter/core/benches/alloc.rs`:\n\n{t}");
        }
        None => md.push_str("The allocation counter has not run: run `make bench-micro`, then this bench.\n"),
    }
}

/// A number with `digits` decimals, or `n/a`.
fn num(v: Option<f64>, digits: usize) -> String {
    v.filter(|v| v.is_finite())
        .map_or("n/a".into(), |v| format!("{v:.digits$}"))
}

fn join(v: &[usize]) -> String {
    v.iter().map(usize::to_string).collect::<Vec<_>>().join(" and ")
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::super::overhead::sample;
    use super::*;

    #[test]
    fn results_file_has_every_section() {
        let md = markdown(&sample::outcome(), &Machine::fixture(), &Micro::default());
        for part in [
            "## Machine and versions",
            "| CPU model | Test CPU |",
            "## Overhead at concurrency 1",
            "## Overhead at concurrency 16",
            "| 4 KiB | llmroute (Envoy + filter) | 900 | 0.90 | 0.90 |",
            "| 100 | 2.00 | 0 |",
            "| every case | VM memory per worker ≤ 8 MiB, steady under load | 2.00 MiB at most; 2.00 MiB after c=1, \
             grew 0.00 MiB after | met |",
            "1.00 MiB after start, before any load, and 2.00 MiB at most",
            "## Where the filter's cost goes, phase by phase, inside Envoy",
            "**Missing: vllm-router.** not installed",
            "## Goals: ",
            "| 4 KiB c=1 | added p50 ≤ 50 µs at 4 KiB | 30 µs (p50 330 µs against plain Envoy's 300 µs) | met |",
            "| 256 KiB c=16 | req/s ≥ 0.6× plain Envoy at 256 KiB | 0.50× | MISSED | 0.50× | MISSED |",
            "peer not measured",
            "## Memory",
            "## Placement: `bounded_keys` against `hash`",
            "| 4 KiB c=16 | llmroute bounded_keys | 0.95 | 5 | 4.0 |",
            "| 4 KiB c=16 | llmroute native bounded_keys | 0.98 | 2 | 1.0 |",
            "## The native build against plain Envoy and the wasm filter",
            "req/s at least 0.9× plain Envoy's at 4 KiB and 0.8× plain Envoy's at 256 KiB (loaded), added p50 at most \
             25 µs",
            "| 4 KiB c=16 | 0.95 | 0.95 | 0.90 | 10 | 30 | 105.3 | 111.1 | 100.0 | 150.0 |",
            "| 256 KiB c=16 | native: req/s ≥ 0.8× plain Envoy at 256 KiB | 0.75× | MISSED | 0.75× | MISSED |",
            "| 4 KiB c=1 | native: added p50 ≤ 25 µs unloaded | 10 µs (p50 310 µs against plain Envoy's 300 µs) | met |",
            "| 4 KiB | llmroute native (Envoy + dynamic module) | 950 | 0.95 | 0.95 |",
            "| | llmroute Envoy | plain Envoy | difference | native Envoy | native − plain |",
            "run `make bench-micro`",
        ] {
            assert!(md.contains(part), "missing {part:?} in:\n{md}");
        }
        assert!(
            !md.contains("| 4 KiB c=16 | added p50"),
            "latency is judged unloaded when c=1 ran"
        );
    }
}
