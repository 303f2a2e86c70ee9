//! How many keys move when a host is added or removed.
//!
//! Four plain emulated engines (no cost model) stand by. A set of keys (distinct system prompts) is sent one
//! request at a time, so no load bound interferes, through the system in front of hosts 0-2, then a fresh one in
//! front of hosts 0-3 (one added), then one in front of hosts 0-1 (host 2 removed). Each key's owner is the
//! engine that answered (`x-emu-backend`). Consistent hashing should move only the keys the new host takes
//! (about 1/4) or the keys of the removed host (about 1/3): anything else is a needless move, a cache lost for
//! nothing.
//!
//! llmroute keys on the system prompt. vllm-router's `consistent_hash` is measured the same way with the key in
//! `x-session-id`, when it is installed.

use std::time::Instant;

use bytes::Bytes;
use serde_json::json;

use super::policy::{Policy, Running};
use super::replay;
use super::workload::Request;
use super::{Missing, Settings};
use crate::bench::body::ALIAS;
use crate::bench::overhead::progress;
use crate::fleet::Fleet;

/// Keys that moved between two host sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Shift {
    /// Share of keys whose owner changed.
    pub moved: f64,
    /// The share that had to move: the keys the added host takes, or the keys of the removed host.
    pub ideal: f64,
    /// Share of keys that moved though they did not have to (between two hosts present in both sets).
    pub needless: f64,
}

/// One system's key movement.
#[derive(Debug, Clone)]
pub struct Movement {
    pub system: String,
    pub keys: usize,
    /// 3 hosts → 4 hosts.
    pub added: Option<Shift>,
    /// 3 hosts → 2 hosts.
    pub removed: Option<Shift>,
    pub error: Option<String>,
}

/// Measures llmroute (chwbl 175), and vllm-router's `consistent_hash` unless it is missing.
pub async fn measure(settings: &Settings, missing: &[Missing], started: Instant) -> Result<Vec<Movement>, String> {
    let fleet = Fleet::start("host", 4)
        .await
        .map_err(|e| format!("starting the engines: {e}"))?;
    let keys = settings.movement_keys;
    let mut out = Vec::new();
    let mut systems = vec![Policy::Chwbl(175)];
    if settings.policies.contains(&Policy::VllmConsistentHash)
        && !missing.iter().any(|m| m.policy == Policy::VllmConsistentHash)
    {
        systems.push(Policy::VllmConsistentHash);
    }
    for policy in systems {
        let m = match owners_by_set(policy, &fleet, keys).await {
            Ok([three, four, two]) => Movement {
                system: policy.label(),
                keys,
                added: Some(shift(&three, &four, |_| false, "host-3")),
                removed: Some(shift(&three, &two, |owner| owner == "host-2", "")),
                error: None,
            },
            Err(e) => Movement {
                system: policy.label(),
                keys,
                added: None,
                removed: None,
                error: Some(e),
            },
        };
        progress(Some(started), &line(&m));
        out.push(m);
    }
    Ok(out)
}

/// Each key's owner behind hosts 0-2, 0-3 and 0-1.
async fn owners_by_set(policy: Policy, fleet: &Fleet, keys: usize) -> Result<[Vec<String>; 3], String> {
    let endpoints = fleet.endpoints();
    let client = replay::client().map_err(|e| e.to_string())?;
    let requests: Vec<Request> = (0..keys).map(key_request).collect();
    let mut sets = Vec::new();
    for hosts in [3, 4, 2] {
        // The slot count only matters to `bounded_keys`, which is not measured here; 4 is the plain engines' own.
        let system = Running::start(policy, &endpoints[..hosts], 4).await?;
        let mut owners = Vec::with_capacity(keys);
        for request in &requests {
            let sample = replay::send(
                &client,
                system.urls.first().map_or("", String::as_str),
                request,
                policy.sends_session(),
            )
            .await;
            if let Some(e) = sample.error {
                return Err(format!("with {hosts} hosts: {e}"));
            }
            owners.push(sample.backend.ok_or("the answer names no engine (x-emu-backend)")?);
        }
        sets.push(owners);
    }
    let [three, four, two]: [Vec<String>; 3] = sets.try_into().map_err(|_| "three host sets".to_string())?;
    Ok([three, four, two])
}

/// A small streamed chat request whose system prompt is key `k`, with `k` as its session id.
fn key_request(k: usize) -> Request {
    let body = json!({
        "model": ALIAS,
        "messages": [
            {"role": "system", "content": format!("You are the assistant of tenant {k}; answer briefly.")},
            {"role": "user", "content": "Hello."},
        ],
        "max_tokens": 1,
        "stream": true,
    });
    Request {
        body: Bytes::from(body.to_string()),
        session: format!("tenant-{k}"),
        prompt_tokens: 0,
    }
}

/// Compares owners before and after. A key had to move if its old owner `gone` or it now sits on `new_host`.
fn shift(before: &[String], after: &[String], gone: impl Fn(&str) -> bool, new_host: &str) -> Shift {
    let n = before.len().max(1) as f64;
    let (mut moved, mut ideal, mut needless) = (0, 0, 0);
    for (b, a) in before.iter().zip(after) {
        let must = gone(b) || a == new_host;
        ideal += usize::from(must);
        if a != b {
            moved += 1;
            needless += usize::from(!must);
        }
    }
    Shift {
        moved: moved as f64 / n,
        ideal: ideal as f64 / n,
        needless: needless as f64 / n,
    }
}

fn line(m: &Movement) -> String {
    let f = |s: &Option<Shift>| {
        s.as_ref().map_or("-".into(), |s| {
            format!(
                "{:.1}% moved (had to: {:.1}%, needless {:.1}%)",
                s.moved * 100.0,
                s.ideal * 100.0,
                s.needless * 100.0
            )
        })
    };
    let error = m.error.as_ref().map_or(String::new(), |e| format!("  error: {e}"));
    format!(
        "key movement {:<22} {} keys; host added: {}; host removed: {}{error}",
        m.system,
        m.keys,
        f(&m.added),
        f(&m.removed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn adding_a_host_should_move_only_keys_to_it() {
        let before = v(&["host-0", "host-1", "host-2", "host-0"]);
        let after = v(&["host-3", "host-1", "host-0", "host-0"]);
        let s = shift(&before, &after, |_| false, "host-3");
        assert_eq!(s.moved, 0.5);
        assert_eq!(s.ideal, 0.25);
        assert_eq!(s.needless, 0.25);
    }

    #[test]
    fn removing_a_host_should_move_only_its_keys() {
        let before = v(&["host-0", "host-1", "host-2", "host-2"]);
        let after = v(&["host-0", "host-1", "host-0", "host-1"]);
        let s = shift(&before, &after, |o| o == "host-2", "");
        assert_eq!((s.moved, s.ideal, s.needless), (0.5, 0.5, 0.0));
    }
}
