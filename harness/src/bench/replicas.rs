//! How often two Envoy replicas with bounded-keys placement disagree about where a key lives, when an L4 load
//! balancer in front splits the traffic between them.
//!
//! Each replica runs the filter's own placement function (`llmroute_core::key_placement::choose`) on its own
//! table, as the filter does in Envoy shared data, and sees only the requests sent to it. For every request, the
//! replica that receives it decides, and the other replica is asked, on a copy of its table, where it would have
//! sent the same key at that moment. A disagreement means the key's cache is warm on one host for one replica and
//! on another for the other. The ring-hash placement (`hash`) never disagrees: both replicas build the same ring
//! from the same endpoints. In-flight counts are left at zero, so only the key bound is compared.
//!
//! The key streams are seeded and synthetic, so the figures are exact for the seed and quick to recompute.

use llmroute_core::config::BoundedKeys;

use crate::rng::SplitMix64;
use llmroute_core::key_placement::{choose, live_keys, Bounds, HostView, KeyTable};

/// What the table shows, for the report.
pub const EXPLAINER: &str = "Two Envoy replicas behind an L4 load balancer, each running the filter's own placement \
function on its own key table and seeing only its share of the traffic. For every request, the other replica is \
asked where it would have sent the same key at that moment. A disagreement means the key is warm on one host for \
one replica and on another for the other, so the fleet keeps both warm. Ring-hash placement never disagrees (both \
replicas build the same ring), at the price of uneven key counts. Replicas that see the same requests in the same \
order always agree (last column).";

/// One simulated traffic mix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Case {
    pub name: &'static str,
    pub description: &'static str,
    /// Distinct keys, or 0 when every request has a key of its own.
    pub keys: usize,
    /// Zipf exponent over the keys; 0 for uniform.
    pub zipf: f64,
    pub requests: usize,
    /// Mean gap between requests, ms (exponential).
    pub gap_ms: f64,
}

pub const CASES: [Case; 6] = [
    Case {
        name: "tenants-6",
        description: "6 keys, uniform",
        keys: 6,
        zipf: 0.0,
        requests: 48,
        gap_ms: 50.0,
    },
    Case {
        name: "tenants-12",
        description: "12 keys, uniform",
        keys: 12,
        zipf: 0.0,
        requests: 48,
        gap_ms: 50.0,
    },
    Case {
        name: "zipf-64",
        description: "64 keys, Zipf s = 1",
        keys: 64,
        zipf: 1.0,
        requests: 448,
        gap_ms: 12.5,
    },
    Case {
        name: "many-keys",
        description: "2000 keys, Zipf s = 1.1",
        keys: 2000,
        zipf: 1.1,
        requests: 10_000,
        gap_ms: 10.0,
    },
    Case {
        name: "long-idle",
        description: "500 keys, Zipf s = 1, over 2 hours (keys expire after 300 s idle)",
        keys: 500,
        zipf: 1.0,
        requests: 7200,
        gap_ms: 1000.0,
    },
    Case {
        name: "unique",
        description: "every request a new key",
        keys: 0,
        zipf: 0.0,
        requests: 256,
        gap_ms: 20.0,
    },
];

/// The `key_balance_factor`s compared.
pub const FACTORS: [u32; 4] = [100, 125, 150, 200];

/// What one case gave at one factor.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub case: Case,
    pub hosts: usize,
    pub factor: u32,
    /// The busiest host's live keys over the mean, for one replica at the end (1.00 is even).
    pub key_imbalance: f64,
    /// Share of requests whose key the other replica would have sent to another host.
    pub requests_disagreeing: f64,
    /// Share of keys known to both replicas at the end whose homes differ.
    pub keys_disagreeing_at_end: f64,
    /// The same with both replicas seeing every request (a control: must be 0).
    pub same_traffic_disagreeing: f64,
}

/// The case's requests: (time in ms, key).
fn stream(case: &Case, seed: u64) -> Vec<(u64, u64)> {
    let mut rng = SplitMix64::new(seed);
    let weights: Vec<f64> = (1..=case.keys.max(1))
        .map(|r| 1.0 / (r as f64).powf(case.zipf))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut now = 0.0;
    (0..case.requests)
        .map(|i| {
            now += rng.exponential(case.gap_ms);
            let key = if case.keys == 0 {
                0x1000_0000 + i as u64
            } else {
                let mut pick = rng.unit() * total;
                let mut k = 0;
                while k + 1 < weights.len() && pick >= weights[k] {
                    pick -= weights[k];
                    k += 1;
                }
                k as u64
            };
            (now as u64, key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed)
        })
        .collect()
}

fn hosts(n: usize) -> Vec<HostView> {
    (0..n)
        .map(|i| HostView {
            address: format!("10.0.0.{}:8080", i + 1),
            up: true,
            weight: 1,
            in_flight: 0,
            queued: None,
        })
        .collect()
}

/// Runs one case with `n` hosts: the traffic split at random between two replicas, and the same-traffic control.
pub fn run(case: &Case, n: usize, factor: u32, seed: u64) -> Figures {
    let hosts = hosts(n);
    let keys = BoundedKeys {
        key_balance_factor: factor,
        ..BoundedKeys::default()
    };
    let bounds = Bounds::new(&keys, 150);
    let reqs = stream(case, seed);
    let mut split = SplitMix64::new(seed ^ 0x5eed);
    let mut tables = [KeyTable::default(), KeyTable::default()];
    let mut disagree = 0usize;
    for &(now, key) in &reqs {
        let who = (split.next_u64() & 1) as usize;
        let mut other = tables[1 - who].clone();
        let there = choose(&mut other, &hosts, key, now, &bounds).map(|c| c.host);
        let here = choose(&mut tables[who], &hosts, key, now, &bounds).map(|c| c.host);
        disagree += usize::from(here != there);
    }
    let end = reqs.last().map_or(0, |r| r.0);
    let (mut a, mut b) = (tables[0].clone(), tables[1].clone());
    a.expire(end, bounds.idle_ttl_ms);
    b.expire(end, bounds.idle_ttl_ms);
    let both: Vec<(u32, u32)> = a
        .entries()
        .iter()
        .filter_map(|e| b.get(e.key).map(|f| (e.host, f.host)))
        .collect();
    let differ = both.iter().filter(|(x, y)| x != y).count();
    let counts = live_keys(&a, &hosts);
    let live: u64 = counts.iter().sum();
    let key_imbalance = if live == 0 {
        1.0
    } else {
        counts.iter().copied().max().unwrap_or(0) as f64 * n as f64 / live as f64
    };

    let mut same = [KeyTable::default(), KeyTable::default()];
    let mut same_disagree = 0usize;
    for &(now, key) in &reqs {
        let x = choose(&mut same[0], &hosts, key, now, &bounds).map(|c| c.host);
        let y = choose(&mut same[1], &hosts, key, now, &bounds).map(|c| c.host);
        same_disagree += usize::from(x != y);
    }
    let share = |k: usize, of: usize| if of == 0 { 0.0 } else { k as f64 / of as f64 };
    Figures {
        case: *case,
        hosts: n,
        factor,
        key_imbalance,
        requests_disagreeing: share(disagree, reqs.len()),
        keys_disagreeing_at_end: share(differ, both.len()),
        same_traffic_disagreeing: share(same_disagree, reqs.len()),
    }
}

/// Every case on 3 and 8 hosts, at every factor.
pub fn run_all(seed: u64) -> Vec<Figures> {
    let mut out = Vec::new();
    for c in &CASES {
        for n in [3, 8] {
            out.extend(FACTORS.map(|f| run(c, n, f, seed)));
        }
    }
    out
}

/// The markdown table: one row per case and host count, one column per factor.
pub fn markdown(figures: &[Figures], seed: u64) -> String {
    let mut out = String::from("| traffic | hosts | requests |");
    for f in FACTORS {
        out.push_str(&format!(" factor {f} |"));
    }
    out.push_str("\n|---|---:|---:|");
    out.push_str(&"---:|".repeat(FACTORS.len()));
    out.push('\n');
    let mut rows: Vec<(&str, usize)> = Vec::new();
    for f in figures {
        if !rows.contains(&(f.case.name, f.hosts)) {
            rows.push((f.case.name, f.hosts));
        }
    }
    for (name, hosts) in rows {
        let cells: Vec<&Figures> = figures
            .iter()
            .filter(|f| f.case.name == name && f.hosts == hosts)
            .collect();
        let Some(first) = cells.first() else { continue };
        out.push_str(&format!(
            "| {} (`{name}`) | {hosts} | {} |",
            first.case.description, first.case.requests
        ));
        for f in FACTORS {
            match cells.iter().find(|c| c.factor == f) {
                Some(c) => out.push_str(&format!(
                    " {:.0}% / {:.0}% ({:.2}) |",
                    100.0 * c.requests_disagreeing,
                    100.0 * c.keys_disagreeing_at_end,
                    c.key_imbalance
                )),
                None => out.push_str(" |"),
            }
        }
        out.push('\n');
    }
    let control = figures.iter().map(|f| f.same_traffic_disagreeing).fold(0.0, f64::max);
    out.push_str(&format!(
        "\nEach cell: requests the other replica would have sent to another host / keys whose homes differ at the \
         end (busiest host's live keys ÷ the mean, one replica). Two replicas, each request sent to one of them at \
         random (seed {seed}); `key_idle_ttl_s` 300. With the same traffic on both replicas the disagreement is \
         {:.1}% in every cell. Ring-hash placement (`hash`) disagrees 0% by construction.\n",
        100.0 * control
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_traffic_never_disagrees_and_streams_are_seeded() {
        for case in &CASES[..3] {
            let f = run(case, 3, 125, 7);
            assert_eq!(f.same_traffic_disagreeing, 0.0, "{}", case.name);
            assert!(f.requests_disagreeing <= 1.0);
        }
        assert_eq!(stream(&CASES[2], 1), stream(&CASES[2], 1));
        assert_ne!(stream(&CASES[2], 1), stream(&CASES[2], 2));
    }

    #[test]
    fn zipf_favours_the_first_keys() {
        let s = stream(&CASES[2], 3);
        let first = s.iter().filter(|(_, k)| *k == 3).count();
        assert!(first > s.len() / 10, "{first}");
    }
}
