//! An in-process stand-in for llama.cpp's `llama-server`.
//!
//! Integration tests and the demo route real HTTP traffic through Envoy and
//! the llmroute filter; they need backends that answer like an inference
//! engine, record what reached them, and fail on demand. [`Emulator`] is such
//! a backend: an axum server on a kernel-picked loopback port that serves
//! `/health`, `/props`, `/v1/models` and `/v1/chat/completions` (plain and
//! SSE), with a small prefix-cache model so `cache_n` behaves plausibly.
//!
//! Tests steer each chat request with `x-emu-*` headers: delays, error
//! statuses, chunk counts, a cut stream, and self-checks of the model and
//! backend the request was routed to. Every response names its backend in
//! `x-emu-backend`.
//!
//! Dropping an [`Emulator`] stops it: the listener closes, idle connections
//! close, and in-flight delays and streams end by aborting the connection.

mod cache;
mod reply;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use axum::Router;
use bytes::Bytes;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use cache::PrefixCache;
use reply::{Answer, Frame};

/// Pause before aborting a stream, so what precedes the cut is flushed.
const FLUSH_BEFORE_ABORT: Duration = Duration::from_millis(5);

/// Largest request body the emulator reads.
const BODY_LIMIT: usize = 64 * 1024 * 1024;

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
        let app = Router::new().fallback(serve_request).with_state(shared.clone());
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
        self.shared
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && path_only(&r.path) == CHAT_PATH)
            .cloned()
            .collect()
    }

    /// Chat requests being served right now.
    pub fn inflight(&self) -> usize {
        self.shared.inflight.load(Ordering::SeqCst)
    }

    /// Most chat requests served at once since start or the last reset.
    pub fn max_inflight(&self) -> usize {
        self.shared.max_inflight.load(Ordering::SeqCst)
    }

    /// Status that `GET /health` answers from now on.
    pub fn set_health_status(&self, status: u16) {
        self.shared.health.store(status, Ordering::SeqCst);
    }

    /// Forgets recorded requests, the inflight high-water mark and the
    /// prefix cache.
    pub fn reset(&self) {
        self.shared.requests().clear();
        self.shared.cache().clear();
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
    health: AtomicU16,
    inflight: AtomicUsize,
    max_inflight: AtomicUsize,
    next_id: AtomicU64,
}

impl Shared {
    fn new(opts: EmulatorOptions, backend_header: HeaderValue, stopped: watch::Receiver<bool>) -> Self {
        let cache = PrefixCache::new(opts.cache_blocks);
        Shared {
            opts,
            backend_header,
            stopped,
            requests: Mutex::new(Vec::new()),
            cache: Mutex::new(cache),
            health: AtomicU16::new(200),
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

    /// Cached prefix tokens for a prompt; then caches the prompt's blocks.
    fn cached_tokens(&self, prompt: &[u8]) -> u64 {
        let keys = cache::block_keys(prompt);
        let blocks = self.cache().match_and_insert(&keys) as u64;
        (blocks * cache::BLOCK_TOKENS).min(cache::token_count(prompt))
    }
}

/// Counts a chat request as in flight for as long as it lives.
struct InflightGuard(Arc<Shared>);

impl InflightGuard {
    fn enter(shared: &Arc<Shared>) -> Self {
        let now = shared.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_inflight.fetch_max(now, Ordering::SeqCst);
        InflightGuard(shared.clone())
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

const CHAT_PATH: &str = "/v1/chat/completions";

fn path_only(path_and_query: &str) -> &str {
    path_and_query.split_once('?').map_or(path_and_query, |(path, _)| path)
}

/// The single handler: records the request, routes it, names the backend.
async fn serve_request(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let mut response = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(body) => {
            let recorded = RecordedRequest::from_parts(&parts, body.clone(), &shared.opts.name);
            shared.requests().push(recorded);
            route(&shared, &parts, body).await
        }
        Err(err) => error_response(400, &format!("could not read request body: {err}")),
    };
    response
        .headers_mut()
        .insert("x-emu-backend", shared.backend_header.clone());
    response
}

async fn route(shared: &Arc<Shared>, parts: &Parts, body: Bytes) -> Response {
    let opts = &shared.opts;
    match (parts.method.as_str(), parts.uri.path()) {
        ("GET", "/health") => health(shared),
        ("GET", "/props") => json_response(200, &reply::props_body(&opts.model, opts.n_ctx, opts.total_slots)),
        ("GET", "/v1/models") => json_response(200, &reply::models_body(&opts.model, opts.n_ctx)),
        ("POST", CHAT_PATH) => chat(shared, &parts.headers, &body).await,
        (method, path) => error_response(404, &format!("no route for {method} {path}")),
    }
}

fn health(shared: &Shared) -> Response {
    let status = shared.health.load(Ordering::SeqCst);
    json_response(status, &reply::health_body(status))
}

fn json_response(status: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = [(CONTENT_TYPE, "application/json; charset=utf-8")];
    (status, content_type, body.to_string()).into_response()
}

fn error_response(status: u16, message: &str) -> Response {
    Refusal::error(status, message).into_response()
}

/// An error answer that a chat request ends with: status and JSON body.
#[derive(Debug)]
struct Refusal {
    status: u16,
    body: Value,
}

impl Refusal {
    /// The usual error envelope, typed after the status.
    fn error(status: u16, message: &str) -> Self {
        let body = reply::error_body(status, message, reply::error_kind(status));
        Refusal { status, body }
    }

    /// A failed `x-emu-expect-*` self-check.
    fn expectation(message: String) -> Self {
        let body = serde_json::json!({"error": {
            "message": format!("emulator expectation failed: {message}"),
            "type": "expectation_failed"
        }});
        Refusal { status: 500, body }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        json_response(self.status, &self.body)
    }
}

/// A response whose body fails at once, so hyper drops the connection,
/// normally before the head is written; used when the emulator stops while
/// a request waits.
fn aborted_response() -> Response {
    let failure = futures_util::stream::once(async { Err::<Bytes, io::Error>(io::Error::other("emulator stopped")) });
    Response::new(Body::from_stream(failure))
}

/// Per-request behaviour chosen by `x-emu-*` headers.
#[derive(Debug, Default)]
struct Faults {
    delay_ms: u64,
    status: Option<u16>,
    chunk_delay_ms: Option<u64>,
    chunks: Option<u32>,
    cut_after: Option<u32>,
}

impl Faults {
    fn from_headers(headers: &HeaderMap) -> Result<Self, Refusal> {
        Ok(Faults {
            delay_ms: control(headers, "x-emu-delay-ms")?.unwrap_or(0),
            status: control(headers, "x-emu-status")?,
            chunk_delay_ms: control(headers, "x-emu-chunk-delay-ms")?,
            chunks: control(headers, "x-emu-chunks")?,
            cut_after: control(headers, "x-emu-cut-after")?,
        })
    }
}

/// Parses a numeric control header; a malformed one is a 400.
fn control<T: FromStr>(headers: &HeaderMap, name: &str) -> Result<Option<T>, Refusal> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let parsed = value.to_str().ok().and_then(|text| text.trim().parse().ok());
    match parsed {
        Some(number) => Ok(Some(number)),
        None => Err(Refusal::error(400, &format!("emulator: bad {name} header {value:?}"))),
    }
}

fn text_header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// Checks `x-emu-expect-model` and `x-emu-expect-backend`.
fn check_expectations(shared: &Shared, headers: &HeaderMap, request: &Value) -> Result<(), Refusal> {
    if let Some(expected) = text_header(headers, "x-emu-expect-model") {
        let model = request.get("model").and_then(Value::as_str);
        if model != Some(expected) {
            let was = model.unwrap_or("<missing>");
            return Err(Refusal::expectation(format!("model was {was}, expected {expected}")));
        }
    }
    if let Some(expected) = text_header(headers, "x-emu-expect-backend") {
        let name = &shared.opts.name;
        if name != expected {
            return Err(Refusal::expectation(format!("backend was {name}, expected {expected}")));
        }
    }
    Ok(())
}

async fn chat(shared: &Arc<Shared>, headers: &HeaderMap, body: &[u8]) -> Response {
    let guard = InflightGuard::enter(shared);
    match chat_answer(shared, headers, body, guard).await {
        Ok(response) => response,
        Err(refusal) => refusal.into_response(),
    }
}

/// Serves one chat request; `Err` is the error it ends with.
async fn chat_answer(
    shared: &Arc<Shared>,
    headers: &HeaderMap,
    body: &[u8],
    guard: InflightGuard,
) -> Result<Response, Refusal> {
    let faults = Faults::from_headers(headers)?;
    if !pause(&shared.stopped, Duration::from_millis(faults.delay_ms)).await {
        return Ok(aborted_response());
    }
    let request: Value = serde_json::from_slice(body)
        .map_err(|err| Refusal::error(400, &format!("request body is not valid JSON: {err}")))?;
    check_expectations(shared, headers, &request)?;
    if let Some(status) = faults.status {
        return Err(Refusal::error(
            status,
            &format!("emulated failure with status {status}"),
        ));
    }
    let answer = build_answer(shared, &request, &faults);
    if request.get("stream").and_then(Value::as_bool).unwrap_or(false) {
        return Ok(stream_response(shared, &answer, &faults, guard));
    }
    Ok(json_response(200, &reply::completion_body(&answer)))
}

fn build_answer(shared: &Shared, request: &Value, faults: &Faults) -> Answer {
    let prompt = cache::prompt_text(request);
    let model = request.get("model").and_then(Value::as_str);
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    let chunk_delay_ms = faults.chunk_delay_ms.unwrap_or(shared.opts.chunk_delay_ms);
    Answer {
        id: format!("chatcmpl-emu-{id}"),
        model: model.unwrap_or(&shared.opts.model).to_string(),
        backend: shared.opts.name.clone(),
        prompt_tokens: cache::token_count(prompt.as_bytes()),
        cached_tokens: shared.cached_tokens(prompt.as_bytes()),
        chunk_delay: Duration::from_millis(chunk_delay_ms),
    }
}

fn stream_response(shared: &Shared, answer: &Answer, faults: &Faults, guard: InflightGuard) -> Response {
    let chunks = faults.chunks.unwrap_or(reply::DEFAULT_CHUNKS);
    let plan = reply::stream_plan(answer, chunks, faults.cut_after);
    let frames = SseFrames {
        frames: plan.frames.into(),
        abort: plan.abort,
        stopped: shared.stopped.clone(),
        guard: Some(guard),
    };
    let body = futures_util::stream::unfold(frames, |mut frames| async move {
        let item = frames.next().await?;
        Some((item, frames))
    });
    let headers = [(CONTENT_TYPE, "text/event-stream"), (CACHE_CONTROL, "no-cache")];
    (StatusCode::OK, headers, Body::from_stream(body)).into_response()
}

/// Plays a [`reply::StreamPlan`] out as body items, pausing before frames.
///
/// The inflight guard is released as the last item is handed out (or when
/// the body is dropped early), so a client that has read the whole stream
/// already sees the request as finished.
struct SseFrames {
    frames: std::collections::VecDeque<Frame>,
    abort: bool,
    stopped: watch::Receiver<bool>,
    guard: Option<InflightGuard>,
}

impl SseFrames {
    async fn next(&mut self) -> Option<Result<Bytes, io::Error>> {
        let Some(frame) = self.frames.pop_front() else {
            return self.take_abort().await;
        };
        if !pause(&self.stopped, frame.delay).await {
            self.frames.clear();
            self.abort = true;
            return self.take_abort().await;
        }
        if self.frames.is_empty() && !self.abort {
            self.guard = None;
        }
        Some(Ok(frame.bytes))
    }

    /// The error that aborts the connection, once, if the plan calls for it.
    ///
    /// It waits a moment first: hyper flushes what it has buffered while the
    /// body is pending, so the head and the frames before the cut reach the
    /// client before the connection drops.
    async fn take_abort(&mut self) -> Option<Result<Bytes, io::Error>> {
        self.guard = None;
        if !std::mem::take(&mut self.abort) {
            return None;
        }
        tokio::time::sleep(FLUSH_BEFORE_ABORT).await;
        Some(Err(io::Error::other("emulated stream cut")))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use serde_json::json;

    fn url(emulator: &Emulator, path: &str) -> String {
        format!("http://{}{path}", emulator.addr())
    }

    fn chat_body(model: &str, content: &str, stream: bool) -> String {
        json!({
            "model": model,
            "stream": stream,
            "messages": [{"role": "user", "content": content}]
        })
        .to_string()
    }

    async fn post_chat(emulator: &Emulator, body: String, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut request = reqwest::Client::new()
            .post(url(emulator, CHAT_PATH))
            .header("content-type", "application/json")
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.unwrap()
    }

    async fn chat_json(emulator: &Emulator, content: &str) -> Value {
        let response = post_chat(emulator, chat_body("m", content, false), &[]).await;
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }

    fn backend_of(response: &reqwest::Response) -> &str {
        response.headers()["x-emu-backend"].to_str().unwrap()
    }

    #[tokio::test]
    async fn non_stream_answer_is_recorded_exactly() {
        let emulator = Emulator::spawn("alpha").await.unwrap();
        let body = chat_body("tiny", "hi there", false);
        let response = reqwest::Client::new()
            .post(url(&emulator, "/v1/chat/completions?trace=1"))
            .header("content-type", "application/json")
            .header("X-Custom", "Yes")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(backend_of(&response), "alpha");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["object"], "chat.completion");
        assert_eq!(answer["model"], "tiny");
        assert_eq!(answer["system_fingerprint"], "alpha");
        assert_eq!(answer["choices"][0]["message"]["content"], "Hello from alpha.");
        // "user:hi there" is 13 bytes: 4 tokens.
        assert_eq!(answer["usage"]["prompt_tokens"], 4);
        assert_eq!(answer["usage"]["completion_tokens"], 3);
        assert_eq!(answer["usage"]["total_tokens"], 7);

        let recorded = emulator.chat_requests();
        assert_eq!(recorded.len(), 1);
        assert_eq!(recorded[0].method, "POST");
        assert_eq!(recorded[0].path, "/v1/chat/completions?trace=1");
        assert_eq!(recorded[0].body, Bytes::from(body));
        assert_eq!(recorded[0].header("x-custom"), Some("Yes"));
        assert_eq!(recorded[0].header("X-CUSTOM"), Some("Yes"));
        assert_eq!(recorded[0].backend, "alpha");
        assert!(recorded[0].headers.iter().any(|(name, _)| name == "x-custom"));
    }

    #[tokio::test]
    async fn stream_follows_llama_order() {
        let emulator = Emulator::spawn("beta").await.unwrap();
        let response = post_chat(
            &emulator,
            chat_body("m", "stream me", true),
            &[("x-emu-chunks", "4"), ("x-emu-chunk-delay-ms", "5")],
        )
        .await;
        assert_eq!(response.status(), 200);
        assert_eq!(backend_of(&response), "beta");
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        assert_eq!(response.headers()["cache-control"], "no-cache");
        let text = response.text().await.unwrap();

        assert!(text.ends_with("\n\ndata: [DONE]\n\n"));
        let events: Vec<&str> = text.split_terminator("\n\n").collect();
        assert_eq!(events.len(), 8, "{text}");
        assert_eq!(events[1], ": keepalive");
        assert!(text.contains("\n\n: keepalive\n\ndata: "));
        let chunk = |event: &str| -> Value { serde_json::from_str(event.strip_prefix("data: ").unwrap()).unwrap() };
        let first = chunk(events[0]);
        assert_eq!(first["object"], "chat.completion.chunk");
        assert_eq!(
            first["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        assert_eq!(first["choices"][0]["finish_reason"], Value::Null);
        for (index, event) in events[2..6].iter().enumerate() {
            let content = chunk(event)["choices"][0]["delta"]["content"].clone();
            assert_eq!(content, format!("tok{index} "));
        }
        let last = chunk(events[6]);
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert_eq!(last["usage"]["completion_tokens"], 4);
        assert_eq!(last["timings"]["predicted_n"], 4);
        assert_eq!(events[7], "data: [DONE]");
        assert_eq!(emulator.inflight(), 0);
    }

    #[tokio::test]
    async fn cut_after_aborts_the_body() {
        let emulator = Emulator::spawn("gamma").await.unwrap();
        let response = post_chat(&emulator, chat_body("m", "cut me", true), &[("x-emu-cut-after", "1")]).await;
        assert_eq!(response.status(), 200);
        let mut received = Vec::new();
        let mut failed = false;
        let mut body = response.bytes_stream();
        while let Some(item) = body.next().await {
            match item {
                Ok(bytes) => received.extend_from_slice(&bytes),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        assert!(failed, "the body should end with an error");
        let text = String::from_utf8(received).unwrap();
        assert!(text.contains("tok0 "));
        assert!(!text.contains("tok1 "));
        assert!(!text.contains("[DONE]"));
        // The same request without the cut finishes cleanly.
        let whole = post_chat(&emulator, chat_body("m", "cut me", true), &[]).await;
        assert!(whole.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    }

    #[tokio::test]
    async fn health_follows_the_set_status() {
        let emulator = Emulator::spawn("delta").await.unwrap();
        let client = reqwest::Client::new();
        let response = client.get(url(&emulator, "/health")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(backend_of(&response), "delta");
        assert_eq!(response.text().await.unwrap(), r#"{"status":"ok"}"#);

        emulator.set_health_status(503);
        let response = client.get(url(&emulator, "/health")).send().await.unwrap();
        assert_eq!(response.status(), 503);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["message"], "Loading model");
        assert_eq!(body["error"]["type"], "unavailable_error");

        emulator.set_health_status(200);
        let response = client.get(url(&emulator, "/health")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let recorded = emulator.requests();
        assert_eq!(recorded.len(), 3);
        assert!(recorded.iter().all(|r| r.path == "/health" && r.method == "GET"));
        assert!(emulator.chat_requests().is_empty());
    }

    #[tokio::test]
    async fn props_models_and_unknown_paths() {
        let mut opts = EmulatorOptions::new("eps");
        opts.model = "qwen-tiny".into();
        opts.n_ctx = 8192;
        opts.total_slots = 2;
        let emulator = Emulator::spawn_with(opts).await.unwrap();
        let client = reqwest::Client::new();
        let props: Value = client
            .get(url(&emulator, "/props"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(props["default_generation_settings"]["n_ctx"], 8192);
        assert_eq!(props["total_slots"], 2);
        assert_eq!(props["model_path"], "qwen-tiny.gguf");
        assert_eq!(props["build_info"], "emulator");
        let models: Value = client
            .get(url(&emulator, "/v1/models"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(models["object"], "list");
        assert_eq!(models["data"][0]["id"], "qwen-tiny");

        let missing = client.get(url(&emulator, "/nope")).send().await.unwrap();
        assert_eq!(missing.status(), 404);
        assert_eq!(backend_of(&missing), "eps");
        let body: Value = missing.json().await.unwrap();
        assert_eq!(body["error"]["code"], 404);
        let wrong_method = client.get(url(&emulator, CHAT_PATH)).send().await.unwrap();
        assert_eq!(wrong_method.status(), 404);
    }

    #[tokio::test]
    async fn cache_n_grows_for_a_repeated_prefix() {
        let emulator = Emulator::spawn("zeta").await.unwrap();
        // "user:" plus 300 bytes: 305 bytes, 77 tokens, 4 complete blocks.
        let long = "a".repeat(300);
        let first = chat_json(&emulator, &long).await;
        assert_eq!(first["usage"]["prompt_tokens"], 77);
        assert_eq!(first["timings"]["cache_n"], 0);
        assert_eq!(first["timings"]["prompt_n"], 77);

        let second = chat_json(&emulator, &long).await;
        assert_eq!(second["timings"]["cache_n"], 64);
        assert_eq!(second["timings"]["prompt_n"], 13);
        assert_eq!(second["usage"]["prompt_tokens_details"]["cached_tokens"], 64);

        let other = chat_json(&emulator, &"b".repeat(300)).await;
        assert_eq!(other["timings"]["cache_n"], 0);

        // A longer prompt sharing the prefix reuses its blocks.
        let extended = chat_json(&emulator, &format!("{long}{}", "c".repeat(100))).await;
        assert_eq!(extended["timings"]["cache_n"], 64);

        emulator.reset();
        let after_reset = chat_json(&emulator, &long).await;
        assert_eq!(after_reset["timings"]["cache_n"], 0);
        assert_eq!(emulator.requests().len(), 1);
    }

    #[tokio::test]
    async fn expectations_and_faults() {
        let emulator = Emulator::spawn("eta").await.unwrap();
        let body = || chat_body("small", "x", false);

        let ok = post_chat(&emulator, body(), &[("x-emu-expect-model", "small")]).await;
        assert_eq!(ok.status(), 200);

        let wrong = post_chat(&emulator, body(), &[("x-emu-expect-model", "big")]).await;
        assert_eq!(wrong.status(), 500);
        assert_eq!(backend_of(&wrong), "eta");
        let error: Value = wrong.json().await.unwrap();
        assert_eq!(error["error"]["type"], "expectation_failed");
        assert_eq!(
            error["error"]["message"],
            "emulator expectation failed: model was small, expected big"
        );

        let elsewhere = post_chat(&emulator, body(), &[("x-emu-expect-backend", "theta")]).await;
        assert_eq!(elsewhere.status(), 500);
        let here = post_chat(&emulator, body(), &[("x-emu-expect-backend", "eta")]).await;
        assert_eq!(here.status(), 200);

        let failing = post_chat(&emulator, body(), &[("x-emu-status", "503")]).await;
        assert_eq!(failing.status(), 503);
        let error: Value = failing.json().await.unwrap();
        assert_eq!(error["error"]["code"], 503);

        let not_json = post_chat(&emulator, "{oops".to_string(), &[]).await;
        assert_eq!(not_json.status(), 400);
        let error: Value = not_json.json().await.unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error");

        let bad_header = post_chat(&emulator, body(), &[("x-emu-delay-ms", "soon")]).await;
        assert_eq!(bad_header.status(), 400);
        assert_eq!(emulator.chat_requests().len(), 7);
    }

    #[tokio::test]
    async fn max_inflight_counts_concurrent_requests() {
        let emulator = Emulator::spawn("iota").await.unwrap();
        let started = std::time::Instant::now();
        let requests =
            (0..3).map(|_| post_chat(&emulator, chat_body("m", "wait", false), &[("x-emu-delay-ms", "300")]));
        let responses = futures_util::future::join_all(requests).await;
        assert!(responses.iter().all(|r| r.status() == 200));
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(emulator.max_inflight(), 3);
        assert_eq!(emulator.inflight(), 0);
        emulator.reset();
        assert_eq!(emulator.max_inflight(), 0);
    }

    #[tokio::test]
    async fn a_slow_stream_counts_as_inflight_until_done() {
        let mut opts = EmulatorOptions::new("kappa");
        opts.chunk_delay_ms = 100;
        let emulator = Emulator::spawn_with(opts).await.unwrap();
        let response = post_chat(&emulator, chat_body("m", "slow", true), &[]).await;
        let mut body = response.bytes_stream();
        let first = body.next().await.unwrap().unwrap();
        assert!(first.starts_with(b"data: "));
        assert_eq!(emulator.inflight(), 1);
        while let Some(item) = body.next().await {
            item.unwrap();
        }
        assert_eq!(emulator.inflight(), 0);
        assert_eq!(emulator.max_inflight(), 1);
    }

    #[tokio::test]
    async fn dropping_stops_the_server_and_open_streams() {
        let mut opts = EmulatorOptions::new("lambda");
        opts.chunk_delay_ms = 200;
        let emulator = Emulator::spawn_with(opts).await.unwrap();
        let addr = emulator.addr();
        let response = post_chat(&emulator, chat_body("m", "x", true), &[]).await;
        let mut body = response.bytes_stream();
        body.next().await.unwrap().unwrap();
        drop(emulator);

        let mut ended_with_error = false;
        while let Some(item) = body.next().await {
            if item.is_err() {
                ended_with_error = true;
                break;
            }
        }
        assert!(ended_with_error);
        let mut refused = false;
        for _ in 0..50 {
            if tokio::net::TcpStream::connect(addr).await.is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(refused, "the port should close after drop");
    }

    #[tokio::test]
    async fn dropping_fails_a_request_still_waiting() {
        let emulator = Emulator::spawn("mu").await.unwrap();
        let pending = post_chat_result(url(&emulator, CHAT_PATH), &[("x-emu-delay-ms", "5000")]);
        let stop = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(emulator.inflight(), 1);
            drop(emulator);
        };
        let (outcome, ()) = tokio::join!(pending, stop);
        assert!(outcome.is_err(), "{outcome:?}");
    }

    async fn post_chat_result(target: String, headers: &[(&str, &str)]) -> reqwest::Result<bytes::Bytes> {
        let mut request = reqwest::Client::new().post(target).body(chat_body("m", "x", false));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await?.bytes().await
    }
}
