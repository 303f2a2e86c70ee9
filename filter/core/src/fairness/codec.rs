//! The fair queue as bytes, the form it takes in Envoy shared data so every worker reads one queue. Malformed
//! bytes, or bytes of another version, read as an empty queue: a queue that cannot be read must never stop a
//! request.

use super::{FairQueue, HostRunning, Tenant, Waiter};

/// Version 2 added each waiter's host and the requests running per host.
const VERSION: u8 = 2;
const HEADER_BYTES: usize = 21;
const TENANT_BYTES: usize = 20;
const WAITER_BYTES: usize = 44;
const HOST_BYTES: usize = 8;

/// The queue as bytes: a version byte, `floor: u64`, the tenant, waiter and host counts (`u32` each), then
/// tenants (`id: u64, counter: u64, active: u32`), waiters (`id, tenant: u64, weight, input_tokens: u32,
/// arrived_ms, deadline_ms: u64, host: u32`) and hosts (`id, running: u32`), little-endian.
pub fn encode(q: &FairQueue) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        HEADER_BYTES
            .saturating_add(q.tenants.len().saturating_mul(TENANT_BYTES))
            .saturating_add(q.waiters.len().saturating_mul(WAITER_BYTES))
            .saturating_add(q.hosts.len().saturating_mul(HOST_BYTES)),
    );
    out.push(VERSION);
    out.extend_from_slice(&q.floor.to_le_bytes());
    for n in [q.tenants.len(), q.waiters.len(), q.hosts.len()] {
        out.extend_from_slice(&u32::try_from(n).unwrap_or(0).to_le_bytes());
    }
    for t in &q.tenants {
        out.extend_from_slice(&t.id.to_le_bytes());
        out.extend_from_slice(&t.counter.to_le_bytes());
        out.extend_from_slice(&t.active.to_le_bytes());
    }
    for w in &q.waiters {
        for v in [w.id, w.tenant] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [w.weight, w.input_tokens] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [w.arrived_ms, w.deadline_ms] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&w.host.to_le_bytes());
    }
    for h in &q.hosts {
        out.extend_from_slice(&h.id.to_le_bytes());
        out.extend_from_slice(&h.running.to_le_bytes());
    }
    out
}

/// Reads [`encode`]'s bytes. Empty or malformed bytes read as an empty queue.
pub fn decode(bytes: &[u8]) -> FairQueue {
    decode_checked(bytes).unwrap_or_default()
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take::<8>().map(u64::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_le_bytes)
    }
    fn count(&mut self) -> Option<usize> {
        usize::try_from(self.u32()?).ok()
    }
}

/// True when `ids` rise strictly.
fn rising<T: PartialOrd>(ids: impl Iterator<Item = T>) -> bool {
    let mut last = None;
    for id in ids {
        if last.as_ref().is_some_and(|l| *l >= id) {
            return false;
        }
        last = Some(id);
    }
    true
}

fn decode_checked(bytes: &[u8]) -> Option<FairQueue> {
    let mut r = Reader(bytes);
    if r.take::<1>()? != [VERSION] {
        return None;
    }
    let floor = r.u64()?;
    let (tenants, waiters, hosts) = (r.count()?, r.count()?, r.count()?);
    let need = tenants
        .checked_mul(TENANT_BYTES)?
        .checked_add(waiters.checked_mul(WAITER_BYTES)?)?
        .checked_add(hosts.checked_mul(HOST_BYTES)?)?;
    if r.0.len() != need {
        return None;
    }
    let mut q = FairQueue {
        tenants: Vec::with_capacity(tenants),
        waiters: Vec::with_capacity(waiters),
        floor,
        hosts: Vec::with_capacity(hosts),
    };
    for _ in 0..tenants {
        q.tenants.push(Tenant {
            id: r.u64()?,
            counter: r.u64()?,
            active: r.u32()?,
        });
    }
    for _ in 0..waiters {
        q.waiters.push(Waiter {
            id: r.u64()?,
            tenant: r.u64()?,
            weight: r.u32()?,
            input_tokens: r.u32()?,
            arrived_ms: r.u64()?,
            deadline_ms: r.u64()?,
            host: r.u32()?,
        });
    }
    for _ in 0..hosts {
        q.hosts.push(HostRunning {
            id: r.u32()?,
            running: r.u32()?,
        });
    }
    let sorted = rising(q.tenants.iter().map(|t| t.id)) && rising(q.hosts.iter().map(|h| h.id));
    sorted.then_some(q)
}
