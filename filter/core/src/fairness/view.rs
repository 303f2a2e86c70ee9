//! One backend's fair queue as the status page shows it: how many wait, how many tenants, how many run.

use super::{Capacity, FairQueue};

/// One backend's queue, as the status page shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueView {
    /// Requests waiting.
    pub waiting: usize,
    /// Tenants with a request waiting.
    pub tenants_waiting: usize,
    /// Requests admitted and not yet complete.
    pub in_flight: u64,
    /// The backend's `max_inflight`.
    pub capacity: u32,
    /// The backend's `host_max_inflight`, and how many hosts run that many now.
    pub per_host: Option<(u32, usize)>,
}

impl QueueView {
    pub fn of(q: &FairQueue, capacity: Capacity) -> QueueView {
        QueueView {
            waiting: q.depth(),
            tenants_waiting: q.tenants_waiting(),
            in_flight: q.running(),
            capacity: u32::try_from(capacity.backend).unwrap_or(u32::MAX),
            per_host: capacity
                .per_host
                .map(|m| (m, q.hosts.iter().filter(|h| h.running >= m).count())),
        }
    }
}

/// The status page's body with a `queue` object added to each backend named in `queues` (see `QueueView`); the
/// body unchanged when it does not parse.
pub fn add_to_status(body: Vec<u8>, queues: &[(&str, QueueView)]) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return body;
    };
    if let Some(backends) = v.get_mut("backends").and_then(|b| b.as_array_mut()) {
        for b in backends {
            let name = b.get("name").and_then(|n| n.as_str()).map(str::to_string);
            let view = queues.iter().find(|(n, _)| Some(*n) == name.as_deref()).map(|(_, q)| q);
            if let (Some(q), Some(obj)) = (view, b.as_object_mut()) {
                let mut queue = serde_json::json!({
                    "waiting": q.waiting,
                    "tenants_waiting": q.tenants_waiting,
                    "in_flight": q.in_flight,
                    "max_inflight": q.capacity,
                });
                if let (Some((bound, full)), Some(o)) = (q.per_host, queue.as_object_mut()) {
                    o.insert("host_max_inflight".into(), bound.into());
                    o.insert("hosts_full".into(), full.into());
                }
                obj.insert("queue".into(), queue);
            }
        }
    }
    serde_json::to_vec(&v).unwrap_or(body)
}
