//! Process-wide state: what the wasm build keeps in Envoy's shared data and stats, here in plain Rust behind a
//! lock, shared by every worker thread of the process.
//!
//! - Shared data: the key table, in-flight counts, limit buckets and status snapshot the glue reads and writes
//!   with compare-and-swap versions. Same contract as Envoy's proxy-wasm shared data: a version per key, bumped
//!   on each write; a write with a stale version is refused (`CasMismatch`); a write without one always lands.
//! - Metrics: the filter's counters and gauges by name, summed over workers (as Envoy sums a wasm stat over VMs).
//!   They are this process's own: they are not exported to Envoy's `/stats` yet.
//!
//! A poisoned lock (a panic while it was held, which no code here can cause) is recovered: the data it guards
//! is written whole under the lock, so it is never half-updated.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use llmroute_filter::{HostError, HostResult, HostStatus};

/// A shared-data value and its version.
type Entry = (Vec<u8>, u32);

static DATA: Mutex<Option<HashMap<String, Entry>>> = Mutex::new(None);

/// Metric names by id (id = index + 1) and their values.
static METRICS: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// The most distinct metrics one process defines; the glue bounds its own per worker, this bounds them all.
const MAX_METRICS: usize = 100_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn get(key: &str) -> (Option<Vec<u8>>, Option<u32>) {
    let data = lock(&DATA);
    match data.as_ref().and_then(|d| d.get(key)) {
        Some((value, version)) => (Some(value.clone()), Some(*version)),
        None => (None, None),
    }
}

pub fn set(key: &str, value: &[u8], cas: Option<u32>) -> HostResult<()> {
    let mut data = lock(&DATA);
    let map = data.get_or_insert_with(HashMap::new);
    let version = map.get(key).map(|(_, v)| *v);
    if let Some(expected) = cas.filter(|&c| c != 0) {
        if version != Some(expected) {
            return Err(HostError {
                call: "set_shared_data",
                status: HostStatus::CasMismatch,
            });
        }
    }
    let next = version.unwrap_or(0).wrapping_add(1).max(1);
    map.insert(key.to_string(), (value.to_vec(), next));
    Ok(())
}

/// The id of metric `name`, defined on first use.
pub fn define_metric(name: &str) -> HostResult<u32> {
    let mut metrics = lock(&METRICS);
    let at = match metrics.iter().position(|(n, _)| n == name) {
        Some(at) => at,
        None if metrics.len() < MAX_METRICS => {
            metrics.push((name.to_string(), 0));
            metrics.len().saturating_sub(1)
        }
        None => {
            return Err(HostError {
                call: "define_metric",
                status: HostStatus::InternalFailure,
            })
        }
    };
    u32::try_from(at.saturating_add(1)).map_err(|_| HostError {
        call: "define_metric",
        status: HostStatus::InternalFailure,
    })
}

fn with_metric<T>(id: u32, call: &'static str, f: impl FnOnce(&mut u64) -> T) -> HostResult<T> {
    let mut metrics = lock(&METRICS);
    let at = usize::try_from(id).ok().and_then(|i| i.checked_sub(1));
    match at.and_then(|i| metrics.get_mut(i)) {
        Some((_, value)) => Ok(f(value)),
        None => Err(HostError {
            call,
            status: HostStatus::NotFound,
        }),
    }
}

pub fn increment_metric(id: u32, by: i64) -> HostResult<()> {
    with_metric(id, "increment_metric", |v| {
        *v = v.saturating_add_signed(by);
    })
}

pub fn record_metric(id: u32, value: u64) -> HostResult<()> {
    with_metric(id, "record_metric", |v| *v = value)
}

pub fn get_metric(id: u32) -> HostResult<u64> {
    with_metric(id, "get_metric", |v| *v)
}
