//! `llmroute-bench new-key`: what the placement store adds to a new key's first request, side by side with the
//! same Envoy config without it.
//!
//! One fleet of instant emulated engines, one 3-member etcd cluster on loopback ([`EtcdCluster`]), and two Envoys
//! with `placement: bounded_keys` in front of the same engines: one with `affinity.placement_store.etcd` (default
//! `timeout_ms` 50, and `share_keys: all`, so that each new key's first request goes to etcd), one without. For
//! each of `keys` fresh keys (a system prompt never sent before), the client sends the key's first request to one
//! Envoy and then a second request for the same key (now known), then both to the other Envoy; which Envoy goes
//! first alternates from key to key, so drift of the machine hits both alike. Each request is a small
//! non-streamed chat completion, timed from send to the last byte of the answer.
//! The figures are the p50 and p99 of each group, and the added latency is the store's percentile minus the
//! plain one's. With the store, a known key reads the local table, so its row is the control: it should add
//! nothing. etcd's own status (`/v3/maintenance/status`: database size and revision) before and after gives the
//! bytes and the revisions each new key costs it.

use std::fmt::Write;
use std::time::{Duration, Instant};

use serde_json::json;

use super::body::ALIAS;
use super::machine::Machine;
use super::overhead::progress;
use super::procstat;
use super::routing::policy::{self, llmroute_config, Placement, Policy, StoreCounts};
use super::stats::percentile;
use super::systems::CHAT_PATH;
use crate::etcd::EtcdCluster;
use crate::fleet::Fleet;

/// What to run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Fresh keys sent to each Envoy.
    pub keys: usize,
    pub seed: u64,
    pub quick: bool,
}

impl Settings {
    pub fn full(seed: u64) -> Settings {
        Settings {
            keys: 400,
            seed,
            quick: false,
        }
    }

    pub fn quick(seed: u64) -> Settings {
        Settings {
            keys: 40,
            seed,
            quick: true,
        }
    }
}

/// Latencies in µs, sorted: a key's first request and its second, through one Envoy.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    pub first: Vec<u32>,
    pub known: Vec<u32>,
}

/// Everything the run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub settings: Settings,
    pub without: Latencies,
    pub with: Latencies,
    /// The store Envoy's outcomes for its new keys.
    pub store: StoreCounts,
    /// etcd's (database bytes, revision) before and after the keys.
    pub etcd_before: Option<(u64, u64)>,
    pub etcd_after: Option<(u64, u64)>,
    pub errors: usize,
    pub first_error: Option<String>,
    pub elapsed: Duration,
    pub load_before: Option<String>,
    pub load_after: Option<String>,
}

/// The percentile `q` of `v` (µs), in ms.
fn ms(v: &[u32], q: f64) -> Option<f64> {
    percentile(v, q).map(|us| f64::from(us) / 1000.0)
}

impl Outcome {
    /// The store's percentile minus the plain one's, in ms, for first requests (`first`) or known keys.
    pub fn added_ms(&self, first: bool, q: f64) -> Option<f64> {
        let pick = |l: &Latencies| if first { l.first.clone() } else { l.known.clone() };
        Some(ms(&pick(&self.with), q)? - ms(&pick(&self.without), q)?)
    }
}

/// Runs the bench, printing progress lines.
pub async fn run(settings: Settings) -> Result<Outcome, String> {
    let started = Instant::now();
    let load_before = procstat::load_average();
    let fleet = Fleet::start("engine", 3)
        .await
        .map_err(|e| format!("starting the engines: {e}"))?;
    let etcd = EtcdCluster::start().await?;
    let endpoints = fleet.endpoints();
    let members = etcd.urls();
    let plain_config = llmroute_config(Policy::BoundedKeys(150), &endpoints, 2, None);
    let mut store_config = llmroute_config(
        Policy::Replicas(Placement::Store, 150, 1),
        &endpoints,
        2,
        Some(&members),
    );
    // Every new key goes to etcd on its first request, which is what this measures (with the default
    // `share_keys: returning` a first request never waits for etcd).
    store_config["affinity"]["placement_store"]["share_keys"] = json!("all");
    let plain = policy::start_envoy(&plain_config, endpoints.len(), 0).await?;
    let store = policy::start_envoy(&store_config, endpoints.len(), members.len()).await?;
    progress(
        Some(started),
        &format!(
            "two Envoys ready (bounded_keys, with and without the store on {} etcd members); {} fresh keys each",
            members.len(),
            settings.keys
        ),
    );
    let client = reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let urls = [plain.url(CHAT_PATH), store.url(CHAT_PATH)];
    let etcd_before = etcd_status(&client, &members).await;
    let mut lat = [Latencies::default(), Latencies::default()];
    let (mut errors, mut first_error) = (0usize, None);
    for i in 0..settings.keys {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for who in order {
            // A key of its own per Envoy, so that the store Envoy never finds a key the plain one made.
            let body = json!({
                "model": ALIAS,
                "messages": [
                    { "role": "system", "content": format!("New-key bench {} key {i} on Envoy {who}.", settings.seed) },
                    { "role": "user", "content": "hi" }
                ],
                "max_tokens": 1
            })
            .to_string();
            for known in [false, true] {
                match timed(&client, &urls[who], &body).await {
                    Ok(us) if known => lat[who].known.push(us),
                    Ok(us) => lat[who].first.push(us),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        if (i + 1) % 100 == 0 {
            progress(Some(started), &format!("{} keys", i + 1));
        }
    }
    let store_counts = policy::store_counts(std::slice::from_ref(&store)).await;
    let etcd_after = etcd_status(&client, &members).await;
    drop((plain, store, etcd, fleet));
    let [mut without, mut with] = lat;
    for l in [&mut without, &mut with] {
        l.first.sort_unstable();
        l.known.sort_unstable();
    }
    Ok(Outcome {
        settings,
        without,
        with,
        store: store_counts,
        etcd_before,
        etcd_after,
        errors,
        first_error,
        elapsed: started.elapsed(),
        load_before,
        load_after: procstat::load_average(),
    })
}

/// The first member's database size in bytes (in use, when etcd tells) and the cluster's revision, from etcd's JSON gateway.
async fn etcd_status(client: &reqwest::Client, members: &[String]) -> Option<(u64, u64)> {
    let url = format!("{}/v3/maintenance/status", members.first()?);
    let answer: serde_json::Value = client.post(url).body("{}").send().await.ok()?.json().await.ok()?;
    // The gateway writes 64-bit integers as strings.
    let int = |v: &serde_json::Value| v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_u64());
    let size = int(&answer["dbSizeInUse"]).or_else(|| int(&answer["dbSize"]))?;
    Some((size, int(&answer["header"]["revision"])?))
}

impl Outcome {
    /// etcd's database growth per new key stored, in bytes, and its revisions per new key.
    pub fn etcd_per_key(&self) -> Option<(f64, f64)> {
        let ((size0, rev0), (size1, rev1)) = (self.etcd_before?, self.etcd_after?);
        let keys = self.store.stored.max(1) as f64;
        Some((
            size1.saturating_sub(size0) as f64 / keys,
            rev1.saturating_sub(rev0) as f64 / keys,
        ))
    }
}

/// One request, send to the answer's last byte, in µs.
async fn timed(client: &reqwest::Client, url: &str, body: &str) -> Result<u32, String> {
    let sent = Instant::now();
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    r.bytes().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("status {status}"));
    }
    Ok(sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32)
}

/// The `placement-store-cost` section of `bench/RESULTS.md`.
pub fn markdown(o: &Outcome, m: &Machine) -> String {
    let f = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
    let d = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:+.2}"));
    let mut md = String::from("## Cost of a new key with the placement store (`llmroute-bench new-key`)\n\n");
    let _ = writeln!(
        md,
        "Written by `llmroute-bench new-key` on {}, {} (seed {}{}, {:.0} s). Two Envoys with `placement: \
         bounded_keys` in front of the same 3 instant emulated engines, one with `affinity.placement_store.etcd` \
         (a 3-member etcd cluster on loopback, `timeout_ms` 50, `share_keys: all`) and one without. Per Envoy, {} \
         fresh keys: each key's first request, then a second request for it (known, read from the local table); the Envoy that goes \
         first alternates per key. A small non-streamed chat completion, timed at the client from send to the \
         last byte. *Added* is the store's percentile minus the plain one's. {} CPU(s) shared with other work \
         (load average {} before, {} after): on this loaded machine the milliseconds are indicative, the \
         difference between the columns is the result.\n",
        m.date,
        m.cpu_model,
        o.settings.seed,
        if o.settings.quick { ", --quick" } else { "" },
        o.elapsed.as_secs_f64(),
        o.settings.keys,
        m.nproc,
        o.load_before.as_deref().unwrap_or("unknown"),
        o.load_after.as_deref().unwrap_or("unknown"),
    );
    let _ = writeln!(
        md,
        "| request | without the store p50 / p99 ms | with the store p50 / p99 ms | added p50 / p99 ms |\n\
         |---|---:|---:|---:|"
    );
    for (name, first) in [("a new key's first request", true), ("a known key (control)", false)] {
        let pick = |l: &Latencies| if first { l.first.clone() } else { l.known.clone() };
        let (a, b) = (pick(&o.without), pick(&o.with));
        let _ = writeln!(
            md,
            "| {name} | {} / {} | {} / {} | {} / {} |",
            f(ms(&a, 0.5)),
            f(ms(&a, 0.99)),
            f(ms(&b, 0.5)),
            f(ms(&b, 0.99)),
            d(o.added_ms(first, 0.5)),
            d(o.added_ms(first, 0.99)),
        );
    }
    let error = o.first_error.as_deref().map_or(String::new(), |e| {
        format!(" (first: {})", e.chars().take(120).collect::<String>())
    });
    let etcd = o.etcd_per_key().map_or(String::new(), |(bytes, revisions)| {
        format!(
            " etcd's database grew by {bytes:.0} bytes per stored key (`dbSizeInUse`, in whole bbolt pages; \
             every revision kept, no compaction ran), and its revision by {revisions:.2} per stored key (one transaction per new key, plus \
             the lease grants and refreshes of the run)."
        )
    });
    let _ = writeln!(
        md,
        "\nThe store Envoy's new keys: {} stored in etcd (created or adopted), {} placed locally after a fallback \
         ({} etcd not answering within `timeout_ms`, {} an error answer or Envoy's 503, {} not sent).{etcd} \
         Failed requests: {}{error}.",
        o.store.stored, o.store.fallbacks, o.store.timeouts, o.store.errors, o.store.not_sent, o.errors
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_shows_both_rows_and_the_added_latency() {
        let us = |v: &[u32]| v.iter().map(|x| x * 1000).collect::<Vec<_>>();
        let o = Outcome {
            settings: Settings::quick(1),
            without: Latencies {
                first: us(&[1, 1, 2, 3]),
                known: us(&[1, 1, 1, 2]),
            },
            with: Latencies {
                first: us(&[2, 3, 3, 9]),
                known: us(&[1, 1, 1, 2]),
            },
            store: StoreCounts {
                stored: 40,
                fallbacks: 2,
                timeouts: 1,
                errors: 1,
                not_sent: 0,
            },
            etcd_before: Some((20_480, 10)),
            etcd_after: Some((40_960, 52)),
            errors: 0,
            first_error: None,
            elapsed: Duration::from_secs(3),
            load_before: None,
            load_after: None,
        };
        let md = markdown(&o, &Machine::fixture());
        assert_eq!(o.added_ms(false, 0.5), Some(0.0));
        let row = md.lines().find(|l| l.starts_with("| a new key")).unwrap();
        assert!(row.ends_with("| 3.00 / 9.00 | +2.00 / +6.00 |"), "{row}");
        assert!(
            md.contains("| a known key (control) | 1.00 / 2.00 | 1.00 / 2.00 | +0.00 / +0.00 |"),
            "{md}"
        );
        assert!(md.contains("40 stored in etcd"), "{md}");
        assert!(
            md.contains("2 placed locally after a fallback (1 etcd not answering within `timeout_ms`, 1 an error"),
            "{md}"
        );
        assert!(md.contains("grew by 512 bytes per stored key"), "{md}");
        assert!(md.contains("revision by 1.05 per stored key"), "{md}");
    }
}
