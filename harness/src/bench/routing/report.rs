//! Writes `bench/ROUTING.md`: the machine, the versions, the settings and the seed, one table per workload, key
//! movement, the goals with a note for each one missed, and the caveats.

use std::fmt::Write;

use super::agreement;
use super::goals::{self, verdict};
use super::policy::Policy;
use super::workload::Workload;
use super::{Cell, Outcome};
use crate::bench::machine::Machine;
use crate::bench::report;
use crate::emulator::cost::BLOCK_TOKENS;

/// The whole file; `plot` is the PNG's file name, when one was drawn.
pub fn markdown(o: &Outcome, m: &Machine, plot: Option<&str>) -> String {
    let mut md = String::new();
    header(&mut md, o, m);
    settings(&mut md, o, m);
    summary(&mut md, o, plot);
    replicas(&mut md, o);
    for &w in &o.settings.workloads {
        workload_table(&mut md, o, w);
    }
    proxy_delay(&mut md, o);
    movement(&mut md, o);
    goals_section(&mut md, o);
    caveats(&mut md, o);
    md
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |v| format!("{v:.digits$}"))
}

fn header(md: &mut String, o: &Outcome, m: &Machine) {
    let s = &o.settings;
    report::title_and_machine(md, "Routing benchmark", "routing", s.seed, s.quick, o.elapsed, m);
}

fn settings(md: &mut String, o: &Outcome, m: &Machine) {
    let s = &o.settings;
    let c = &s.cost;
    let _ = writeln!(md, "## Settings\n");
    let _ = writeln!(
        md,
        "- **Engines.** {} emulated llama.cpp engines (`harness/src/emulator`) per run, with the cost model of \
         `harness/src/emulator/cost.rs`: {} slots each (like `llama-server -np {}`), a FIFO queue behind them, \
         {} ms per uncached prompt token of prefill, {} ms per output token of decode, and a prefix cache of {} \
         blocks of {BLOCK_TOKENS} tokens ({} tokens) with LRU eviction. TTFT = queue wait + uncached tokens × \
         prefill; the other tokens follow at the decode rate; a token is 4 bytes of prompt text.",
        s.engines,
        c.slots,
        c.slots,
        c.prefill_ms_per_token,
        c.decode_ms_per_token,
        s.cache_blocks,
        s.cache_blocks as u64 * BLOCK_TOKENS
    );
    let tenants: Vec<String> = s
        .workloads
        .iter()
        .filter(|w| w.slot_cache())
        .map(|w| format!("`{}`", w.id()))
        .collect();
    if !tenants.is_empty() {
        let _ = writeln!(
            md,
            "- **Engines of the tenants workloads** ({}): {} slots each and no shared cache. Each slot remembers \
             only the last prompt it served, like `llama-server -np {} -cram 0` (the real-engine bench's setting): \
             a request takes the free slot whose prompt shares the longest prefix with its own, else the least \
             recently used free slot, so a prefix is warm only in the slot that last served it.",
            tenants.join(", "),
            s.shape.tenant_slots,
            s.shape.tenant_slots
        );
    }
    let closed = if tenants.is_empty() {
        String::new()
    } else {
        format!(
            " The tenants workloads are a closed loop instead: {} requests in flight, the next leaving as soon as \
             one ends.",
            s.shape.tenant_in_flight
        )
    };
    let _ = writeln!(
        md,
        "- **Method.** Per repeat, per workload, per policy: {} and a freshly started \
         system, ready once it routes a probe (then the engines are reset), then the whole trace replayed through \
         it. Sessions start on the trace's schedule whatever the system does (open loop across sessions); a \
         conversation's next turn leaves after the previous answer plus the think time.{closed} {} repeat(s), \
         policy order rotated per repeat; every figure is the median over repeats. Seed {}.",
        if s.same_fleet {
            "one fleet per repeat and workload, the same for every policy (the same engine ports, so the same \
             host order and ring), reset to cold caches and zero counters"
        } else {
            "a fresh fleet (cold caches)"
        },
        s.repeats,
        s.seed
    );
    let _ = writeln!(
        md,
        "- **Figures.** *Hit rate*: cached ÷ prompt tokens as the engines counted them, over the fleet (the usage \
         chunks the client received agree). *Oracle*: an infinite cache behind perfect routing, from the trace \
         alone: every block seen before anywhere counts as cached (on the tenants workloads, the slot-limited \
         ceiling below). *TTFT*: send to first content delta, at the client. *Engine TTFT*: slot wait + prefill inside the engines, from the cost model: what the placement \
         alone decides, without the proxy's own delays. *Busiest ÷ mean*: the busiest engine's request count ÷ the mean count. *Slot wait*: the mean \
         time a request queued for a slot."
    );
    let load = |l: &Option<String>| l.clone().unwrap_or_else(|| "unknown".into());
    let _ = writeln!(
        md,
        "- **Machine load.** {} CPU(s), shared with other work: load average {} before and {} after. Nothing is \
         pinned: the proxies, the engines and the client share the CPUs.",
        m.nproc,
        load(&o.load_before),
        load(&o.load_after)
    );
    for missing in &o.missing {
        let reason: String = missing.reason.lines().take(3).collect::<Vec<_>>().join(" / ");
        let _ = writeln!(
            md,
            "- **{} is missing from this run**: {}",
            missing.policy.label(),
            reason.chars().take(300).collect::<String>()
        );
    }
    let _ = writeln!(
        md,
        "\n### Workloads\n\n| workload | shape | requests | keys | prompt tokens | distinct blocks | oracle hit rate |\n\
         |---|---|---:|---:|---:|---:|---:|"
    );
    for t in &o.traces {
        let _ = writeln!(
            md,
            "| {} (`{}`) | {} | {} | {} | {} | {} | {:.3} |",
            t.workload.title(),
            t.workload.id(),
            t.summary,
            t.requests,
            t.keys,
            t.prompt_tokens,
            t.distinct_blocks,
            t.oracle
        );
    }
    slot_oracle_note(md, o);
    let tenant_tokens = if tenants.is_empty() {
        String::new()
    } else {
        format!(" ({} on the tenants workloads)", s.shape.tenant_output_tokens)
    };
    let _ = writeln!(
        md,
        "\nEvery request is a streamed chat completion with `max_tokens: {}`{tenant_tokens} and \
         `stream_options.include_usage`. \
         llmroute gets no session header: it keys on the system prompt, else on the first 256 bytes of the first \
         user message (its documented contract). vllm-router's `consistent_hash` hashes `x-session-id`, so for it \
         alone each request carries the id that groups the same requests (the tenant, group, prompt or \
         conversation): the same key llmroute derives from the content. The others route on the body or on load.",
        s.shape.output_tokens
    );
    let _ = writeln!(md, "\n### Policies\n\n| policy | configuration |\n|---|---|");
    for p in &s.policies {
        let _ = writeln!(md, "| {} | {} |", p.label(), p.describe());
    }
    let _ = writeln!(md);
}

/// What the oracle means on the workloads whose engines keep one prompt per slot.
fn slot_oracle_note(md: &mut String, o: &Outcome) {
    let s = &o.settings;
    let figures: Vec<String> = o
        .traces
        .iter()
        .filter(|t| t.workload.slot_cache())
        .map(|t| {
            let online = t
                .online_ceiling
                .map(|c| format!(", {c:.3} for LRU over the slots"))
                .unwrap_or_default();
            format!(
                "`{}` {:.3} against {:.3} for an infinite cache{online}",
                t.workload.id(),
                t.oracle,
                t.unbounded_oracle
            )
        })
        .collect();
    if figures.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nOn the tenants workloads an infinite cache would miss only each tenant's first request, but the fleet \
         holds {} prompts at once ({} engines × {} slots, each remembering its last prompt). Their oracle is the \
         best those slots allow: a perfect router that knows the whole trace, serving it one request at a time in \
         its order, a tenant's request going to the slot that holds the tenant and otherwise evicting the slot \
         whose tenant comes back last (Belady). With a slot per tenant that is the infinite cache's figure; with \
         more tenants than slots it is lower: {}. It ignores the requests in flight together (two of one tenant at \
         once need two slots), so no system quite reaches it. *LRU over the slots* is the same perfect router \
         without knowledge of the future: a tenant not in any slot evicts the slot used least recently. With \
         tenants of equal traffic no online placement does much better: a tenant's repeat finds it warm about \
         slots ÷ tenants of the time however the keys are spread (docs/placement.md).",
        s.engines * s.shape.tenant_slots,
        s.engines,
        s.shape.tenant_slots,
        figures.join("; ")
    );
}

fn summary(md: &mut String, o: &Outcome, plot: Option<&str>) {
    let _ = writeln!(md, "## Hit rate at a glance\n");
    if let Some(png) = plot {
        let _ = writeln!(
            md,
            "![prefix-cache hit rate per policy and workload, with the oracle]({png})\n"
        );
    }
    glance_table(md, o);
}

/// The `placement-emulator` section of `bench/RESULTS.md`: the hit-rate table, with what it was measured on.
pub fn results_section(o: &Outcome, m: &Machine, title: &str, routing_md: &str) -> String {
    let mut md = format!("## {title}\n\n");
    let _ = writeln!(
        md,
        "Prefix-cache hit rate (cached ÷ prompt tokens, counted by the engines), the median of {} repeat(s), written \
         by `llmroute-bench routing` on {}. The `tenants-*` workloads run engines with 2 slots each and a prefix \
         cache per slot (llama.cpp `-np 2 -cram 0`), 48 requests (96 for 24 tenants) at 3 in flight; their oracle is a perfect router \
         over those slots. Settings and every other figure: [ROUTING.md]({}).\n",
        o.settings.repeats, m.date, routing_md
    );
    glance_table(&mut md, o);
    if agreement::has_replicas(o) {
        let _ = writeln!(md, "{REPLICAS_METHOD}\n");
        agreement::tables(&mut md, o);
    }
    md
}

/// How the replicated rows were run and what *off home* means.
const REPLICAS_METHOD: &str = "Replicated rows: that many Envoys with the same config, each request sent to one of \
them at random (seeded, so every replicated row sees the same split); `+etcd` rows share the key table through \
`affinity.placement_store.etcd`, a fresh 3-member etcd cluster on loopback per run. *Off home*: the share of \
requests answered by another engine than the one that answered the key's first request, on any replica, read from \
the engines' own answers (`x-emu-backend`), not from the filter. One Envoy shows what spills and retries alone \
move; *− one Envoy* is the hit rate against the same config on one Envoy in the same run. With `--same-fleet` \
(as `make bench-replicas` runs it) every row of a repeat runs in front of the same engines, reset in between.";

/// The replicas section of ROUTING.md, when the run has replicated policies.
fn replicas(md: &mut String, o: &Outcome) {
    if !agreement::has_replicas(o) {
        return;
    }
    let _ = writeln!(md, "## Replicas: agreement and quality\n\n{REPLICAS_METHOD}\n");
    agreement::tables(md, o);
}

fn glance_table(md: &mut String, o: &Outcome) {
    let policies = o.measured_policies();
    let head: Vec<String> = policies.iter().map(|p| p.label()).collect();
    let _ = writeln!(md, "| workload | oracle | {} |", head.join(" | "));
    let _ = writeln!(md, "|---|---:|{}", "---:|".repeat(policies.len()));
    for t in &o.traces {
        let cells: Vec<String> = policies
            .iter()
            .map(|&p| f(o.cell(t.workload, p).and_then(Cell::hit_rate), 3))
            .collect();
        let _ = writeln!(md, "| {} | {:.3} | {} |", t.workload.id(), t.oracle, cells.join(" | "));
    }
    let _ = writeln!(md);
}

fn workload_table(md: &mut String, o: &Outcome, w: Workload) {
    let Some(t) = o.trace(w) else { return };
    let _ = writeln!(md, "## {} (`{}`)\n", w.title(), w.id());
    let _ = writeln!(
        md,
        "| policy | hit rate (range) | ÷ oracle | TTFT p50 ms | TTFT p99 ms | engine TTFT p50 | engine TTFT p99 | busiest ÷ mean \
         | bound | slot wait ms | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let _ = writeln!(md, "| *oracle* | {:.3} | 1.00 | | | | | | | | |", t.oracle);
    for p in o.measured_policies() {
        let Some(c) = o.cell(w, p) else { continue };
        let ratio = c.hit_rate().map(|h| h / t.oracle).filter(|_| t.oracle > 0.0);
        let hit = match c.hit_range() {
            Some((lo, hi)) if c.runs.len() > 1 => format!("{} ({lo:.3}–{hi:.3})", f(c.hit_rate(), 3)),
            _ => f(c.hit_rate(), 3),
        };
        let (errors, first) = c.errors();
        let errors = match first {
            Some(e) => format!(
                "{errors} ({})",
                e.chars().take(80).collect::<String>().replace('|', "/")
            ),
            None => errors.to_string(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {errors} |",
            p.label(),
            hit,
            f(ratio, 2),
            f(c.ttft_p50_ms(), 1),
            f(c.ttft_p99_ms(), 1),
            f(c.engine_ttft_p50_ms(), 1),
            f(c.engine_ttft_p99_ms(), 1),
            f(c.busiest_over_mean(), 2),
            p.bound().map_or(String::new(), |b| format!("{b:.2}")),
            f(c.queue_wait_ms(), 1),
        );
    }
    let _ = writeln!(md);
}

/// Client TTFT p50 minus engine TTFT p50, per policy, median over workloads: what the proxy adds to TTFT.
fn proxy_delay(md: &mut String, o: &Outcome) {
    let shape = &o.settings.shape;
    let tenants = if o.settings.workloads.iter().any(|w| w.slot_cache()) {
        format!(
            " ({} tokens and {:.0} ms on the tenants workloads)",
            shape.tenant_output_tokens,
            f64::from(shape.tenant_output_tokens.saturating_sub(1)) * o.settings.cost.decode_ms_per_token
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        md,
        "## What each system adds to TTFT\n\n\
         Client TTFT p50 minus engine TTFT p50 (slot wait + prefill), median over the workloads: the time to the \
         first token that is not the engine's work. About 2 ms of it is common to every system here (the \
         request's transfer, the engine parsing it, the timer rounding the prefill pause up); the rest is the \
         proxy's own, not its routing's doing. The \
         engines send the {} output tokens {} ms apart, so a stream lasts at least {:.0} ms from its first token to \
         its end{tenants} (about 1.5× that here: the timer rounds each pause up to the next millisecond); a proxy \
         that holds the tokens back and delivers them together shows a much shorter spread.\n\n\
         | policy | added to TTFT p50, ms | first token to end of stream, p50 ms |\n|---|---:|---:|",
        o.settings.shape.output_tokens,
        o.settings.cost.decode_ms_per_token,
        f64::from(o.settings.shape.output_tokens.saturating_sub(1)) * o.settings.cost.decode_ms_per_token
    );
    for p in o.measured_policies() {
        let spread = crate::bench::stats::median_of(
            o.settings
                .workloads
                .iter()
                .map(|&w| o.cell(w, p).and_then(Cell::spread_p50_ms)),
        );
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            p.label(),
            f(added_ttft_ms(o, p), 1),
            f(spread, 1)
        );
    }
    let _ = writeln!(md);
}

/// The system's added TTFT p50 (client minus engine), median over workloads.
pub fn added_ttft_ms(o: &Outcome, p: Policy) -> Option<f64> {
    crate::bench::stats::median_of(o.settings.workloads.iter().map(|&w| {
        let c = o.cell(w, p)?;
        Some(c.ttft_p50_ms()? - c.engine_ttft_p50_ms()?)
    }))
}

fn movement(md: &mut String, o: &Outcome) {
    if o.movement.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Keys that move when a host is added or removed\n\n\
         Distinct system prompts (or, for vllm-router, `x-session-id` values) sent one at a time through a fresh \
         system in front of hosts 0-2, then 0-3 (one added), then 0-1 (host 2 removed); each key's owner is the \
         engine that answered. *Had to* is the share that must move: the keys the new host takes, or the removed \
         host's keys. *Needless* moved between two hosts that are in both sets.\n\n\
         | system | keys | host added: moved | had to | needless | host removed: moved | had to | needless |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|"
    );
    let pct = |v: f64| format!("{:.1}%", v * 100.0);
    for m in &o.movement {
        let cols = |s: &Option<super::movement::Shift>| {
            s.as_ref().map_or("– | – | –".into(), |s| {
                format!("{} | {} | {}", pct(s.moved), pct(s.ideal), pct(s.needless))
            })
        };
        let error = m.error.as_ref().map_or(String::new(), |e| format!(" (error: {e})"));
        let _ = writeln!(
            md,
            "| {}{error} | {} | {} | {} |",
            m.system,
            m.keys,
            cols(&m.added),
            cols(&m.removed)
        );
    }
    let needless = o
        .movement
        .iter()
        .filter(|m| m.system.starts_with("llmroute"))
        .flat_map(|m| [&m.added, &m.removed])
        .flatten()
        .map(|s| s.needless)
        .fold(0.0, f64::max);
    if needless > 0.02 {
        let _ = writeln!(
            md,
            "\nllmroute's needless moves come from Envoy's ring hash, not from the key: Envoy fills a ring of \
             `minimum_ring_size` (1024) points and gives each of N hosts ceil(1024 / N) of them, so 3 → 2 hosts \
             gives each remaining host 170 more points and 3 → 4 takes 86 away from each. Those points take over \
             arcs that belonged to other remaining hosts: about one key in ten moves between hosts that are in both \
             sets, a one-off cache loss at each change of the host count. No Envoy setting fixes the points per \
             host (the ring sizes only scale the count with N); vllm-router's ring has a fixed number of points \
             per worker, so only the keys that must move do."
        );
    }
    let _ = writeln!(md);
}

fn goals_section(md: &mut String, o: &Outcome) {
    let checks = goals::checks(o);
    let _ = writeln!(
        md,
        "## Goals\n\nFrom issue 4, on its four workloads (the tenants workloads only compare the policies), for each \
         llmroute balance factor. On the control, \"no loss\" compares with llmroute \
         `least_request` (the same proxy without affinity), with slack for this noisy machine.\n\n\
         | workload | policy | goal | measured | verdict |\n|---|---|---|---|---|"
    );
    for c in &checks {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            c.workload.id(),
            c.policy.label(),
            c.goal,
            c.measured,
            verdict(c.met)
        );
    }
    let missed: Vec<_> = checks.iter().filter(|c| c.met == Some(false)).collect();
    if missed.is_empty() {
        let _ = writeln!(md, "\nEvery goal that could be measured is met.\n");
        return;
    }
    let _ = writeln!(md, "\n### Missed goals: why, and what would close them\n");
    // One note per (workload, goal): the factors share the cause.
    let mut seen: Vec<(Workload, String)> = Vec::new();
    for c in missed {
        let goal = c.goal.clone();
        if seen.iter().any(|(w, g)| *w == c.workload && *g == goal) {
            continue;
        }
        let who: Vec<String> = checks
            .iter()
            .filter(|d| d.workload == c.workload && d.goal == goal && d.met == Some(false))
            .map(|d| format!("{} ({})", d.policy.label(), d.measured))
            .collect();
        let _ = writeln!(
            md,
            "- **{} — {}**: missed by {}. {}",
            c.workload.id(),
            goal,
            who.join(", "),
            c.note.clone().unwrap_or_default()
        );
        seen.push((c.workload, goal));
    }
    let _ = writeln!(md);
}

fn caveats(md: &mut String, o: &Outcome) {
    let s = &o.settings;
    let _ = writeln!(
        md,
        "## Caveats\n\n\
         - The engines are emulated. The cost model is linear and serial per slot: a real engine batches decode \
           across slots and its prefill cost grows with context. The costs are scaled down ({} ms per prefill \
           token) so that a run fits in minutes; the ratios between policies, not the milliseconds, are the result.\n\
         - Hit rates depend on the cache size: {} blocks per engine holds about half of the shared-prefix \
           workload's prefixes, so one engine cannot serve every prefix warm but a third of them fits. With \
           caches that hold everything, any sticky policy reaches the oracle; with tiny ones, none does.\n\
         - Envoy places hosts on its ring by address, and every run's engines listen on new ports, so which keys \
           share an engine changes from run to run; so do the hit rate and balance of the hashing policies (the \
           range in the tables). vllm-router's ring is keyed by worker URL the same way.\n\
         - The busiest ÷ mean figure counts requests over the whole run. Envoy's bound applies to requests in flight \
           at each pick, so the two differ when warm and cold requests take different times.\n\
         - sglang-router and vllm-router run with their default thresholds (for `cache_aware`: cache threshold 0.3, \
           and balancing to the least-loaded worker only once loads differ by more than 64 requests and 1.5×); \
           tuning them changes their figures. vllm-router's `cache_aware` reaches about round robin's hit rate on \
           these chat requests; why was not investigated.\n\
         - One Envoy worker thread (`--concurrency 1`); llmroute's placement does not depend on it, since every \
           worker computes the same key and ring.\n\
         - {} repeat(s){}; the figures are medians. The machine is shared (2 CPUs for the proxies, the engines and \
           the client), so TTFT p99 moves by a few milliseconds from run to run.",
        s.cost.prefill_ms_per_token,
        s.cache_blocks,
        s.repeats,
        if s.quick { ", --quick shapes" } else { "" },
    );
    if s.workloads.iter().any(|w| w.slot_cache()) {
        let _ = writeln!(
            md,
            "- On the tenants workloads the cache is the slots themselves, so the hit rate depends on which tenants \
             share an engine and on the order requests reach it. The real-engine bench (`make bench-engines`) runs \
             the same workload on `llama-server`; the emulator keeps one prompt per slot as llama.cpp does, but \
             picks a slot by whole blocks of 16 tokens, not tokens."
        );
    }
    let engine_spread = f64::from(s.shape.output_tokens.saturating_sub(1)) * s.cost.decode_ms_per_token;
    let held: Vec<String> = o
        .measured_policies()
        .into_iter()
        .filter_map(|p| {
            let spread = crate::bench::stats::median_of(
                s.workloads.iter().map(|&w| o.cell(w, p).and_then(Cell::spread_p50_ms)),
            )?;
            let added = added_ttft_ms(o, p)?;
            (added > 10.0 && spread < engine_spread / 2.0)
                .then(|| format!("{} (+{added:.0} ms, {spread:.1} ms from first token to end)", p.label()))
        })
        .collect();
    if !held.is_empty() {
        let _ = writeln!(
            md,
            "- {} add tens of milliseconds to TTFT p50 and deliver each stream's tokens together, where the \
             engines spread them over at least {engine_spread:.0} ms. That is consistent with Nagle's algorithm on \
             the router's connection to the client holding back small SSE writes until the client's delayed ACK \
             (40 ms on Linux). It is the router's transport, not its placement: the engine TTFT columns show the \
             placement alone.",
            held.join(" and ")
        );
    }
}

/// One line per goal for the terminal.
pub fn goal_lines(o: &Outcome) -> Vec<String> {
    goals::checks(o)
        .iter()
        .map(|c| {
            format!(
                "{:<7} {:<12} {:<22} {:<52} {}",
                verdict(c.met),
                c.workload.id(),
                c.policy.label(),
                c.goal,
                c.measured
            )
        })
        .collect()
}

/// The README's headline: llmroute chwbl `factor` against sglang cache_aware and the oracle per sharing workload.
pub fn headline(o: &Outcome, factor: u32) -> Vec<String> {
    o.settings
        .workloads
        .iter()
        .filter_map(|&w| {
            let t = o.trace(w)?;
            let ours = o.cell(w, Policy::Chwbl(factor))?;
            let sglang = o.cell(w, Policy::SglangCacheAware);
            Some(format!(
                "{}: hit {} (oracle {:.3}, sglang cache_aware {}), TTFT p50/p99 {}/{} ms (sglang {}/{}), busiest ÷ mean {}",
                w.id(),
                f(ours.hit_rate(), 3),
                t.oracle,
                f(sglang.and_then(Cell::hit_rate), 3),
                f(ours.ttft_p50_ms(), 1),
                f(ours.ttft_p99_ms(), 1),
                f(sglang.and_then(Cell::ttft_p50_ms), 1),
                f(sglang.and_then(Cell::ttft_p99_ms), 1),
                f(ours.busiest_over_mean(), 2),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::sample;
    use super::*;

    #[test]
    fn the_report_has_every_section() {
        let o = sample::outcome();
        let md = markdown(&o, &Machine::fixture(), Some("routing.png"));
        for needle in [
            "# Routing benchmark",
            "--quick",
            "## Settings",
            "### Workloads",
            "### Policies",
            "## Hit rate at a glance",
            "![prefix-cache hit rate",
            "## Generated shared prefix",
            "| llmroute chwbl 125 | 0.750 | 0.94 |",
            "## Keys that move",
            "| llmroute chwbl 175 | 60 | 26.0% | 25.0% | 0.0% |",
            "## Goals",
            "vllm consistent_hash is missing from this run",
            "## Caveats",
        ] {
            assert!(md.contains(needle), "missing {needle:?} in:\n{md}");
        }
        assert_eq!(goal_lines(&o).len(), goals::checks(&o).len());
        assert_eq!(headline(&o, 125).len(), o.settings.workloads.len());
        for needle in [
            "Engines of the tenants workloads",
            "closed loop instead: 3 requests in flight",
            "`tenants-12` 0.800 against 0.900 for an infinite cache, 0.400 for LRU over the slots",
            "(8 on the tenants workloads)",
        ] {
            assert!(md.contains(needle), "missing {needle:?} in:\n{md}");
        }
    }
}
