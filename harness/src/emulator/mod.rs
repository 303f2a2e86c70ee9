//! An in-process stand-in for llama.cpp's `llama-server`.
//!
//! Integration tests and the demo route real HTTP traffic through Envoy and the llmroute filter; they need
//! backends that answer like an inference engine, record what reached them, and fail on demand. [`Emulator`]
//! is such a backend: an axum server on a kernel-picked loopback port that serves `/health`, `/props`,
//! `/v1/models` and every inference API the gateway routes, each in its own dialect (plain and SSE):
//! `/v1/chat/completions`, `/v1/completions`, `/v1/responses` (OpenAI Responses), `/v1/embeddings` and
//! `/v1/messages` (Anthropic Messages). A small prefix-cache model makes cached-token counts behave plausibly.
//! An opt-in [`cost::CostModel`] adds engine slots with a FIFO queue, and prefill and decode time; with its
//! `slot_cache`, each slot remembers only the last prompt it served, in place of the shared cache.
//!
//! `POST /v1/decisions` and `/v1/systemone` (the NVCF seed's decision routes) answer 200 with the `model` their
//! body carried and its byte count, whatever else it holds.
//!
//! `GET /metrics` reports the load a test sets ([`Emulator::set_load`]) in the dialect of llama.cpp, vLLM or
//! SGLang, and with the `orca` option an inference request that asks for it gets vLLM's ORCA load report in
//! a response header (see [`load`]).
//!
//! Tests steer each inference request with `x-emu-*` headers: delays, error statuses, chunk counts, stream
//! faults, and self-checks of the model and backend the request was routed to. Every response names its
//! backend in `x-emu-backend`.
//!
//! | header | effect |
//! |---|---|
//! | `x-emu-delay-ms: M` | wait M ms before answering |
//! | `x-emu-status: S` | answer status S with the dialect's error envelope |
//! | `x-emu-error-shape: openai\|fastapi\|anthropic-with-id` | with `x-emu-status`, the error body's shape |
//! | `x-emu-chunks: N` | stream N content deltas (default 3); a non-streamed answer is then the same generation |
//! | `x-emu-chunk-delay-ms: M` | pause M ms before each content delta |
//! | `x-emu-cut-after: N` | N deltas, then abort the connection (a cut on an event boundary) |
//! | `x-emu-cut-mid: N` | N deltas, the first half of the next event's bytes, then abort |
//! | `x-emu-end-mid: N` | N deltas, the first half of the next event, then a clean end |
//! | `x-emu-error-after: N` | N deltas, the dialect's error event, then a clean end without the terminal event |
//! | `x-emu-garbage-after: N` | N deltas, bytes that are no event (`GARBAGE`), then a clean end without the terminal event |
//! | `x-emu-reset: 1` | drop the connection before any response byte |
//! | `x-emu-no-terminal: 1` | the whole stream but its terminal event, then a clean end |
//! | `x-emu-trickle-ms: M` | every byte its own body chunk, M ms after the one before |
//! | `x-emu-stall: 1` | the response head, then nothing until the client goes or the emulator stops |
//! | `x-emu-line-ending: crlf\|cr` | SSE lines end in `\r\n` or `\r` (default `lf`) |
//! | `x-emu-close-delimited: 1` | no length, no chunking: the body ends when the connection closes |
//! | `x-emu-expect-model: M`, `x-emu-expect-backend: B` | answer 500 unless the model or backend match |
//!
//! At most one of the five that stop a stream early may be sent. A stream carries a separate usage chunk
//! (chat, completions) only when the request sets `stream_options.include_usage`. Every byte of an answer is a
//! function of the request, the emulator's options, its prefix cache and its answer counter (both restarted by
//! [`Emulator::reset`]).
//!
//! Engine-wide faults for chaos runs (a seeded [`chaos::FaultPlan`], 5xx bursts, kill and restart) and the
//! per-`x-request-id` [`chaos::Journal`] of attempts are in [`chaos`].
//!
//! Dropping an [`Emulator`] stops it: the listener closes, idle connections close, and in-flight delays and
//! streams end by aborting the connection.

mod cache;
pub mod chaos;
pub mod cost;
mod dialect;
pub mod load;
mod serve;
mod sse;
#[cfg(test)]
mod tests;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::http::request::Parts;
use axum::http::HeaderValue;
use axum::serve::ListenerExt;
use axum::Router;
use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use cache::PrefixCache;
pub use dialect::Dialect;

/// How an emulator presents itself.
#[derive(Clone, Debug)]
pub struct EmulatorOptions {
    /// Backend name: `x-emu-backend`, `system_fingerprint`, recorded requests.
    pub name: String,
    /// Model reported by `/props` and `/v1/models`.
    pub model: String,
    /// Context size reported by `/props`.
    pub n_ctx: u32,
    /// Slot count reported by `/props`.
    pub total_slots: u32,
    /// Prefix cache capacity, in 64-byte blocks.
    pub cache_blocks: usize,
    /// Pause before each content chunk of a stream.
    pub chunk_delay_ms: u64,
    /// Port on 127.0.0.1; 0 (the default) lets the kernel pick a free one.
    pub port: u16,
    /// Send every stream close-delimited, as if each request had `x-emu-close-delimited: 1`.
    pub close_delimited: bool,
    /// Opt-in engine cost model: slots, queueing, prefill and decode time (see [`cost`]). Default `None`: answer
    /// at once.
    pub cost: Option<cost::CostModel>,
    /// Engine-wide seeded faults (see [`chaos`]). Default `None`.
    pub faults: Option<chaos::FaultPlan>,
    /// The journal inference attempts are recorded in; `None` (the default) gives the emulator its own. Share one
    /// across a fleet, and across restarts, to check retries fleet-wide.
    pub journal: Option<Arc<chaos::Journal>>,
    /// The dialect of `GET /metrics` (see [`load`]); `None` answers 501, as llama-server without `--metrics`.
    /// Default llama.cpp's.
    pub load_format: Option<load::LoadFormat>,
    /// Answer a request that carries `endpoint-load-metrics-format: JSON` with vLLM's ORCA report in
    /// `endpoint-load-metrics`. Default false.
    pub orca: bool,
}

impl EmulatorOptions {
    pub fn new(name: &str) -> Self {
        EmulatorOptions {
            name: name.to_string(),
            model: "emulated".to_string(),
            n_ctx: 4096,
            total_slots: 4,
            cache_blocks: 4096,
            chunk_delay_ms: 0,
            port: 0,
            close_delimited: false,
            cost: None,
            faults: None,
            journal: None,
            load_format: Some(load::LoadFormat::LlamaCpp),
            orca: false,
        }
    }
}

/// One request as the emulator received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    /// Path plus query, as received.
    pub path: String,
    /// Lowercase names in received order; values decoded lossily.
    pub headers: Vec<(String, String)>,
    /// The exact body bytes.
    pub body: Bytes,
    /// Name of the emulator that received it.
    pub backend: String,
}

impl RecordedRequest {
    /// First value of a header, matched case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The dialect of an inference request (a `POST` to a dialect's path); `None` for anything else.
    pub fn dialect(&self) -> Option<Dialect> {
        Dialect::from_path(path_only(&self.path)).filter(|_| self.method == "POST")
    }

    fn from_parts(parts: &Parts, body: Bytes, backend: &str) -> Self {
        let path = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_string(), |pq| pq.to_string());
        let headers = parts
            .headers
            .iter()
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.as_str().to_string(), value)
            })
            .collect();
        RecordedRequest {
            method: parts.method.to_string(),
            path,
            headers,
            body,
            backend: backend.to_string(),
        }
    }
}

/// A running emulator; stops when dropped.
pub struct Emulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Emulator {
    /// Starts an emulator with default options on 127.0.0.1 and a free port.
    pub async fn spawn(name: &str) -> io::Result<Emulator> {
        Self::spawn_with(EmulatorOptions::new(name)).await
    }

    /// Starts an emulator with the given options on 127.0.0.1.
    pub async fn spawn_with(opts: EmulatorOptions) -> io::Result<Emulator> {
        let backend_header = HeaderValue::from_str(&opts.name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "emulator name is not a valid header value"))?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, opts.port)).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared::new(opts, backend_header, stopped.clone()));
        let app = Router::new().fallback(serve::serve_request).with_state(shared.clone());
        let listener = listener.tap_io(|tcp| {
            // Small SSE frames must leave at once, not wait for Nagle.
            let _ = tcp.set_nodelay(true);
        });
        let server = axum::serve(listener, app).with_graceful_shutdown(stop_signal(stopped));
        let task = tokio::spawn(async move {
            let _ = server.await;
        });
        Ok(Emulator {
            shared,
            addr,
            stop,
            task,
        })
    }

    /// Starts an emulator whose streams are all close-delimited: an `HTTP/1.0` head with `connection: close`,
    /// neither `content-length` nor `transfer-encoding`, and a body that ends when the connection closes.
    pub async fn spawn_close_delimited(name: &str) -> io::Result<Emulator> {
        let mut opts = EmulatorOptions::new(name);
        opts.close_delimited = true;
        Self::spawn_with(opts).await
    }

    pub fn name(&self) -> &str {
        &self.shared.opts.name
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests().clone()
    }

    /// Only the `POST /v1/chat/completions` requests.
    pub fn chat_requests(&self) -> Vec<RecordedRequest> {
        self.requests_where(|r| r.dialect() == Some(Dialect::Chat))
    }

    /// Every inference request: the `POST`s to the paths of all dialects (chat, completions, responses,
    /// embeddings, messages).
    pub fn inference_requests(&self) -> Vec<RecordedRequest> {
        self.requests_where(|r| r.dialect().is_some())
    }

    fn requests_where(&self, keep: impl Fn(&RecordedRequest) -> bool) -> Vec<RecordedRequest> {
        self.shared.requests().iter().filter(|r| keep(r)).cloned().collect()
    }

    /// Inference requests being served right now.
    pub fn inflight(&self) -> usize {
        self.shared.inflight.load(Ordering::SeqCst)
    }

    /// Most inference requests served at once since start or the last reset.
    pub fn max_inflight(&self) -> usize {
        self.shared.max_inflight.load(Ordering::SeqCst)
    }

    /// Makes every inference request answer `status` (an error envelope) from now on; `None` heals.
    /// Unlike the per-request `x-emu-status`, this fails only this engine, as a broken backend would.
    pub fn set_fault_status(&self, status: Option<u16>) {
        self.shared.fault.store(status.unwrap_or(0), Ordering::SeqCst);
    }

    /// Makes the next `n` inference requests answer `status` (an error envelope), then heals: a 5xx burst.
    pub fn fail_next(&self, n: u32, status: u16) {
        self.shared.burst_status.store(status, Ordering::SeqCst);
        self.shared.burst_left.store(n, Ordering::SeqCst);
    }

    /// The journal this emulator records its inference attempts in.
    pub fn journal(&self) -> Arc<chaos::Journal> {
        self.shared.journal.clone()
    }

    /// The options to start this emulator again after a kill: the same port and the same journal.
    pub fn options(&self) -> EmulatorOptions {
        let mut opts = self.shared.opts.clone();
        opts.port = self.addr.port();
        opts.journal = Some(self.shared.journal.clone());
        opts
    }

    /// The load `GET /metrics` and ORCA reports show from now on.
    pub fn set_load(&self, reported: load::ReportedLoad) {
        *self.shared.load.reported.lock().unwrap_or_else(|p| p.into_inner()) = reported;
    }

    /// Makes `GET /metrics` answer `status` (an error) from now on; `None` heals.
    pub fn set_metrics_status(&self, status: Option<u16>) {
        self.shared.load.status.store(status.unwrap_or(0), Ordering::SeqCst);
    }

    /// How many times `GET /metrics` was asked for.
    pub fn metrics_reads(&self) -> usize {
        self.requests_where(|r| r.method == "GET" && path_only(&r.path) == "/metrics")
            .len()
    }

    /// Status that `GET /health` answers from now on.
    pub fn set_health_status(&self, status: u16) {
        self.shared.health.store(status, Ordering::SeqCst);
    }

    /// Forgets recorded requests, the inflight high-water mark and the prefix cache (or what the cost model's
    /// slots remember), and numbers answers from 1 again, so the same request after a reset gets the same bytes.
    pub fn reset(&self) {
        self.shared.requests().clear();
        self.shared.cache().clear();
        if let Some(cost) = &self.shared.cost {
            cost.reset();
        }
        self.shared.next_id.store(1, Ordering::SeqCst);
        let now = self.shared.inflight.load(Ordering::SeqCst);
        self.shared.max_inflight.store(now, Ordering::SeqCst);
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        // Ends in-flight delays and streams, and makes axum stop accepting
        // and close idle connections; aborting drops the listener promptly.
        self.stop.send_replace(true);
        self.task.abort();
    }
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator")
            .field("name", &self.name())
            .field("addr", &self.addr)
            .finish()
    }
}

/// Resolves once the emulator is stopped (or its handle is gone).
async fn stop_signal(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Sleeps for `delay` unless the emulator stops first; false if it stopped.
async fn pause(stopped: &watch::Receiver<bool>, delay: Duration) -> bool {
    let mut stopped = stopped.clone();
    if delay.is_zero() {
        return !*stopped.borrow();
    }
    tokio::select! {
        _ = tokio::time::sleep(delay) => true,
        _ = stopped.wait_for(|stop| *stop) => false,
    }
}

/// State shared by the handle and the request handlers.
struct Shared {
    opts: EmulatorOptions,
    backend_header: HeaderValue,
    stopped: watch::Receiver<bool>,
    requests: Mutex<Vec<RecordedRequest>>,
    cache: Mutex<PrefixCache>,
    cost: Option<cost::CostState>,
    health: AtomicU16,
    /// Status every inference request answers with (0: none), set by `set_fault_status`.
    fault: AtomicU16,
    /// Inference requests left in the current 5xx burst, and its status (see `fail_next`).
    burst_left: AtomicU32,
    burst_status: AtomicU16,
    journal: Arc<chaos::Journal>,
    /// What `/metrics` and ORCA reports show.
    load: load::LoadState,
    inflight: AtomicUsize,
    max_inflight: AtomicUsize,
    next_id: AtomicU64,
}

impl Shared {
    /// The engine-wide fault status, if one is set.
    fn fault_status(&self) -> Option<u16> {
        Some(self.fault.load(Ordering::SeqCst)).filter(|&s| s != 0)
    }

    /// The status of the current 5xx burst, taking one request off it; `None` when no burst is on.
    fn burst_status(&self) -> Option<u16> {
        let took = self
            .burst_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1));
        took.ok().map(|_| self.burst_status.load(Ordering::SeqCst))
    }

    fn new(opts: EmulatorOptions, backend_header: HeaderValue, stopped: watch::Receiver<bool>) -> Self {
        let cache = PrefixCache::new(opts.cache_blocks);
        let cost = opts.cost.clone().map(cost::CostState::new);
        let journal = opts.journal.clone().unwrap_or_default();
        Shared {
            opts,
            backend_header,
            stopped,
            requests: Mutex::new(Vec::new()),
            cache: Mutex::new(cache),
            cost,
            health: AtomicU16::new(200),
            fault: AtomicU16::new(0),
            burst_left: AtomicU32::new(0),
            burst_status: AtomicU16::new(503),
            journal,
            load: load::LoadState::default(),
            inflight: AtomicUsize::new(0),
            max_inflight: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        }
    }

    fn requests(&self) -> MutexGuard<'_, Vec<RecordedRequest>> {
        self.requests.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn cache(&self) -> MutexGuard<'_, PrefixCache> {
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Cached prefix tokens for a prompt in the engine's shared cache; then caches the prompt's blocks.
    fn cached_tokens(&self, prompt: &[u8]) -> u64 {
        let keys = cache::block_keys(prompt);
        let blocks = self.cache().match_and_insert(&keys);
        cache::cached_tokens(blocks, prompt)
    }
}

/// Counts an inference request as in flight for as long as it lives, and holds its cost-model slot, if any.
struct InflightGuard(Arc<Shared>, Option<cost::Slot>);

impl InflightGuard {
    fn enter(shared: &Arc<Shared>) -> Self {
        let now = shared.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_inflight.fetch_max(now, Ordering::SeqCst);
        InflightGuard(shared.clone(), None)
    }

    /// Keeps `slot` taken until the answer (or stream) ends.
    fn hold(&mut self, slot: Option<cost::Slot>) {
        self.1 = slot;
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn path_only(path_and_query: &str) -> &str {
    path_and_query.split_once('?').map_or(path_and_query, |(path, _)| path)
}
