//! An in-memory Envoy for native tests: the [`Host`] a test makes with [`FakeHost::new`] and gives its contexts.
//!
//! It keeps what Envoy keeps for one request and one VM: the request, response and callout header maps, the body
//! buffers, properties (and the access-log fields the filter sets as `wasm.<key>` filter state), shared data with
//! a version per key, a clock the test moves, the tick period, metrics, and a record of every local reply, HTTP
//! callout, resumed request and log line. Every call except logging (and resuming) is counted by [`Kind`], in
//! order, so a test can fail the Nth call ([`FakeHost::fail_nth`]), every call of one kind
//! ([`FakeHost::fail_kind`]), or assert how many calls a request makes ([`FakeHost::counts`]). Log lines are
//! recorded, never counted or failed: whether one reaches the host depends on the log level, which Envoy sets,
//! not on the filter.
//!
//! Buffer and map semantics follow Envoy's where the filter relies on them: a header set replaces every value of
//! that name, `set_buffer` splices (start 0 and the whole size replaces, size 0 at the end appends), a
//! compare-and-swap write with a stale version is `CasMismatch`, and a missing value is `NotFound` (`Ok(None)`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::time::Duration;

use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType};

use super::abi::{HostError, HostResult, HostStatus};
use super::Host;

mod calls;

thread_local! {
    /// The fake made last on this thread, which records the filter's log lines: the `log` facade is
    /// process-wide, and each test runs on its own thread.
    static LOGS_TO: RefCell<Weak<FakeHost>> = const { RefCell::new(Weak::new()) };
}

/// The logger's sink in native tests: the log lines go to the fake made last on this thread, else to the ABI
/// (whose imports `host/tests.rs` answers).
pub fn log_sink(level: LogLevel, message: &str) {
    match LOGS_TO.with(|l| l.borrow().upgrade()) {
        Some(fake) => {
            let _ = fake.log(level, message);
        }
        None => super::abi_log(level, message),
    }
}

/// The kinds of host call, one per [`Host`] method but `log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Time,
    TickPeriod,
    GetBuffer,
    SetBuffer,
    GetMap,
    GetMapValue,
    SetMapValue,
    GetProperty,
    SetProperty,
    GetShared,
    SetShared,
    LocalResponse,
    HttpCall,
    DefineMetric,
    IncrementMetric,
    RecordMetric,
    GetMetric,
    Effective,
}

/// A local reply the filter sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The request context the root context made effective to send it (`set_effective_context`), if any.
    pub context: Option<u32>,
    pub status: u32,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// An HTTP callout the filter started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callout {
    pub token: u32,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    pub timeout: Duration,
}

#[derive(Default)]
struct State {
    now_ns: u64,
    tick_ms: Option<u32>,
    maps: HashMap<MapType, Vec<(String, Vec<u8>)>>,
    buffers: HashMap<BufferType, Vec<u8>>,
    properties: HashMap<String, Vec<u8>>,
    shared: HashMap<String, (Vec<u8>, u32)>,
    replies: Vec<Reply>,
    callouts: Vec<Callout>,
    metrics: Vec<(MetricType, String, u64)>,
    logs: Vec<(LogLevel, String)>,
    calls: Vec<Kind>,
    fail_nth: Option<(usize, HostStatus)>,
    fail_kind: Vec<(Kind, HostStatus)>,
    /// Per key, how many more compare-and-swap writes another worker beats.
    races: HashMap<String, usize>,
    /// How many times the filter resumed a paused request (`proxy_continue_stream`).
    resumes: usize,
    /// The context the filter made effective last (`set_effective_context`); resumes and replies record it.
    effective: Option<u32>,
    /// The effective context at each resume.
    resumed: Vec<Option<u32>>,
}

/// See the module doc.
#[derive(Default)]
pub struct FakeHost {
    state: RefCell<State>,
}

/// A property path as the fake keys it: the segments joined by `.`.
fn path_key(path: &[&str]) -> String {
    path.join(".")
}

impl FakeHost {
    /// A fresh fake, which records the log lines of this thread; the clock reads 1 000 000 ms.
    pub fn new() -> Rc<FakeHost> {
        let fake = Rc::new(FakeHost::default());
        fake.set_now_ms(1_000_000);
        LOGS_TO.with(|l| *l.borrow_mut() = Rc::downgrade(&fake));
        // Every level reaches the host, so tests see every line the filter could ever log.
        super::init_logging(log::LevelFilter::Trace, log_sink);
        log::set_max_level(log::LevelFilter::Trace);
        fake
    }

    /// The host the contexts of a test are made with: this fake.
    pub fn envoy(self: &Rc<Self>) -> super::Envoy {
        super::Envoy::new(self.clone())
    }

    fn state(&self) -> std::cell::RefMut<'_, State> {
        self.state.borrow_mut()
    }

    /// Counts one call of `kind`, and fails it when the test asked for that.
    fn call(&self, kind: Kind, name: &'static str) -> HostResult<()> {
        let mut s = self.state();
        let index = s.calls.len();
        s.calls.push(kind);
        let status = match s.fail_nth {
            Some((n, status)) if n == index => Some(status),
            _ => s.fail_kind.iter().find(|(k, _)| *k == kind).map(|(_, st)| *st),
        };
        match status {
            Some(status) => Err(HostError { call: name, status }),
            None => Ok(()),
        }
    }

    // --- What the test sets up and moves.

    pub fn set_now_ms(&self, ms: u64) {
        self.state().now_ns = ms.saturating_mul(1_000_000);
    }

    pub fn advance_ms(&self, ms: u64) {
        let mut s = self.state();
        s.now_ns = s.now_ns.saturating_add(ms.saturating_mul(1_000_000));
    }

    pub fn set_map(&self, map: MapType, pairs: &[(&str, &str)]) {
        let pairs = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        self.state().maps.insert(map, pairs);
    }

    pub fn set_buffer_bytes(&self, buffer: BufferType, bytes: &[u8]) {
        self.state().buffers.insert(buffer, bytes.to_vec());
    }

    /// Appends to a buffer, as Envoy does while a filter pauses a body; returns the buffer's new length.
    pub fn append_buffer(&self, buffer: BufferType, bytes: &[u8]) -> usize {
        let mut s = self.state();
        let b = s.buffers.entry(buffer).or_default();
        b.extend_from_slice(bytes);
        b.len()
    }

    pub fn set_property_bytes(&self, path: &[&str], value: &[u8]) {
        self.state().properties.insert(path_key(path), value.to_vec());
    }

    /// The `n`th counted call from now on (0 is the next) fails with `status`.
    pub fn fail_nth(&self, n: usize, status: HostStatus) {
        let mut s = self.state();
        let at = s.calls.len().saturating_add(n);
        s.fail_nth = Some((at, status));
    }

    /// Every call of `kind` fails with `status`, until [`FakeHost::heal`].
    pub fn fail_kind(&self, kind: Kind, status: HostStatus) {
        self.state().fail_kind.push((kind, status));
    }

    /// The next `n` compare-and-swap writes of `key` lose a race: another worker wrote it between the filter's
    /// read and its write (the version moves on, the write is `CasMismatch`).
    pub fn race(&self, key: &str, n: usize) {
        self.state().races.insert(key.to_string(), n);
    }

    pub fn heal(&self) {
        let mut s = self.state();
        s.fail_nth = None;
        s.fail_kind.clear();
    }

    // --- What the test reads back.

    pub fn header(&self, map: MapType, name: &str) -> Option<String> {
        let s = self.state.borrow();
        let pairs = s.maps.get(&map)?;
        let (_, v) = pairs.iter().find(|(n, _)| n == name)?;
        Some(String::from_utf8_lossy(v).into_owned())
    }

    pub fn map(&self, map: MapType) -> Vec<(String, String)> {
        let s = self.state.borrow();
        let pairs = s.maps.get(&map).cloned().unwrap_or_default();
        pairs
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect()
    }

    pub fn buffer(&self, buffer: BufferType) -> Vec<u8> {
        self.state.borrow().buffers.get(&buffer).cloned().unwrap_or_default()
    }

    /// An access-log field the filter set (`host::set_log_field`).
    pub fn log_field(&self, key: &str) -> Option<String> {
        let s = self.state.borrow();
        s.properties.get(key).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    pub fn shared(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.state.borrow().shared.get(key).cloned()
    }

    pub fn replies(&self) -> Vec<Reply> {
        self.state.borrow().replies.clone()
    }

    pub fn callouts(&self) -> Vec<Callout> {
        self.state.borrow().callouts.clone()
    }

    /// How many times the filter resumed a paused request.
    pub fn resumes(&self) -> usize {
        self.state.borrow().resumes
    }

    /// The context made effective (`set_effective_context`) at each resume, in order; `None` for a request that
    /// resumed itself.
    pub fn resumed_contexts(&self) -> Vec<Option<u32>> {
        self.state.borrow().resumed.clone()
    }

    /// Ends the callback in progress, as the host does: the next calls act on the calling context again.
    pub fn end_callback(&self) {
        self.state().effective = None;
    }

    pub fn tick_ms(&self) -> Option<u32> {
        self.state.borrow().tick_ms
    }

    /// The value of the metric named `name` (as defined, labels included), if it was defined.
    pub fn metric(&self, name: &str) -> Option<u64> {
        let s = self.state.borrow();
        s.metrics.iter().find(|(_, n, _)| n == name).map(|(_, _, v)| *v)
    }

    pub fn logs(&self) -> Vec<(LogLevel, String)> {
        self.state.borrow().logs.clone()
    }

    /// Every counted call so far, in order.
    pub fn calls(&self) -> Vec<Kind> {
        self.state.borrow().calls.clone()
    }

    /// Counted calls per kind, sorted by kind; kinds never called are left out.
    pub fn counts(&self) -> Vec<(Kind, usize)> {
        let mut counts: Vec<(Kind, usize)> = Vec::new();
        for k in self.calls() {
            match counts.iter_mut().find(|(c, _)| *c == k) {
                Some((_, n)) => *n += 1,
                None => counts.push((k, 1)),
            }
        }
        counts.sort();
        counts
    }

    /// Forgets the counted calls (not the state), so a test can count one phase.
    pub fn reset_calls(&self) {
        let mut s = self.state();
        s.calls.clear();
        s.fail_nth = None;
    }
}
