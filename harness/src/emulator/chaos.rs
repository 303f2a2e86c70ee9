//! Engine-wide faults for chaos runs, and the journal that lets a run check itself.
//!
//! The `x-emu-*` headers fail one request wherever it lands; the faults here belong to an engine, as a broken
//! server's would, so a request that Envoy retries on another host meets that host's behaviour, not its own.
//!
//! - [`FaultPlan`]: a seeded share of this engine's inference requests get slow response headers, a garbage
//!   stream, a stream cut inside an event, or a connection reset before any response byte. The pick is a pure
//!   function of the seed, the engine's name, the request's `x-request-id` and how often this engine has already
//!   seen that id, so a run replays exactly given its seed and its traffic.
//! - 5xx bursts ([`crate::emulator::Emulator::fail_next`]) and an engine whose `/health` passes while inference
//!   fails ([`crate::emulator::Emulator::set_fault_status`]) are switched by the run's schedule.
//! - Kill and restart: drop the [`crate::emulator::Emulator`], later start one from its
//!   [`crate::emulator::Emulator::options`] (same port, same journal).
//!
//! The [`Journal`] records every inference attempt by `x-request-id`: which engine, when, and the status of the
//! response head it sent (none for a reset before any byte). One journal shared by a fleet, and kept across
//! restarts, answers "was anything retried after its first byte?" for the whole fleet.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A fault an engine plays on one inference request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineFault {
    /// Wait this long before the response head.
    SlowHeaders(Duration),
    /// A stream: one delta, then garbage, then a clean end without the terminal event. Plain answers are whole.
    Garbage,
    /// A stream: one delta, half of the next event, then the connection aborts. Plain answers are whole.
    Cut,
    /// The connection drops before any response byte.
    Reset,
}

/// How often, in permille of an engine's inference requests, each [`EngineFault`] happens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    pub seed: u64,
    pub slow_headers_permille: u32,
    /// The delay of a slow head.
    pub slow_headers: Duration,
    pub garbage_permille: u32,
    pub cut_permille: u32,
    pub reset_permille: u32,
}

impl FaultPlan {
    /// The fault for the `nth` (from 0) arrival of `request_id` at `engine`, if any. The four shares are laid
    /// end to end on a roll of 0..1000; their sum is capped by the roll, so shares past 1000 never happen.
    pub fn pick(&self, engine: &str, request_id: &str, nth: u32) -> Option<EngineFault> {
        let mut key = Vec::with_capacity(engine.len() + request_id.len() + 13);
        key.extend_from_slice(&self.seed.to_le_bytes());
        key.extend_from_slice(engine.as_bytes());
        key.push(0);
        key.extend_from_slice(request_id.as_bytes());
        key.extend_from_slice(&nth.to_le_bytes());
        let roll = (xxhash_rust::xxh3::xxh3_64(&key) % 1000) as u32;
        let shares = [
            (self.slow_headers_permille, EngineFault::SlowHeaders(self.slow_headers)),
            (self.garbage_permille, EngineFault::Garbage),
            (self.cut_permille, EngineFault::Cut),
            (self.reset_permille, EngineFault::Reset),
        ];
        let mut upto = 0u32;
        for (share, fault) in shares {
            upto = upto.saturating_add(share);
            if roll < upto {
                return Some(fault);
            }
        }
        None
    }
}

/// One inference request as one engine saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub engine: String,
    /// Arrival, since the journal was made.
    pub at: Duration,
    /// Status of the response head the engine sent; `None` when it dropped the connection before any byte.
    pub head: Option<u16>,
}

/// Every inference attempt, by `x-request-id`, in arrival order per id.
#[derive(Debug)]
pub struct Journal {
    epoch: Instant,
    attempts: Mutex<HashMap<String, Vec<Attempt>>>,
}

impl Default for Journal {
    fn default() -> Self {
        Journal {
            epoch: Instant::now(),
            attempts: Mutex::new(HashMap::new()),
        }
    }
}

impl Journal {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Attempt>>> {
        self.attempts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// When the journal was made: the zero of every [`Attempt::at`].
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// How many times `engine` has already seen `request_id`.
    pub fn seen(&self, engine: &str, request_id: &str) -> u32 {
        let attempts = self.lock();
        let count = attempts
            .get(request_id)
            .map_or(0, |list| list.iter().filter(|a| a.engine == engine).count());
        u32::try_from(count).unwrap_or(u32::MAX)
    }

    /// Records one attempt that arrived at `at`.
    pub fn record(&self, request_id: &str, engine: &str, at: Instant, head: Option<u16>) {
        let attempt = Attempt {
            engine: engine.to_string(),
            at: at.saturating_duration_since(self.epoch),
            head,
        };
        self.lock().entry(request_id.to_string()).or_default().push(attempt);
    }

    /// A copy of every attempt, by request id.
    pub fn attempts(&self) -> HashMap<String, Vec<Attempt>> {
        self.lock().clone()
    }

    /// Arrival times of the attempts at `engine`, sorted.
    pub fn arrivals(&self, engine: &str) -> Vec<Duration> {
        let mut at: Vec<Duration> = self
            .lock()
            .values()
            .flatten()
            .filter(|a| a.engine == engine)
            .map(|a| a.at)
            .collect();
        at.sort_unstable();
        at
    }

    /// Attempts recorded in all.
    pub fn len(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
