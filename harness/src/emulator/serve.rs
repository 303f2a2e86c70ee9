//! The emulator's HTTP side: one handler that records every request, routes it, and names the backend.
//!
//! Inference requests (every [`Dialect`]) go through the same steps: count as in flight, apply the
//! `x-emu-*` faults and self-checks, parse the JSON, look the prompt up in the prefix cache, then answer in the
//! dialect, plain or as a stream. Errors are answered in the dialect's envelope.

use std::io;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::watch;

use super::dialect::{self, Answer, Dialect, Envelope, EventStream, Frame};
use super::{cache, pause, InflightGuard, RecordedRequest, Shared};

/// Pause before aborting a stream, so what precedes the cut is flushed.
const FLUSH_BEFORE_ABORT: Duration = Duration::from_millis(5);

/// Largest request body the emulator reads.
const BODY_LIMIT: usize = 64 * 1024 * 1024;

/// The single handler: records the request, routes it, names the backend.
pub(super) async fn serve_request(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let mut response = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(body) => {
            let recorded = RecordedRequest::from_parts(&parts, body.clone(), &shared.opts.name);
            shared.requests().push(recorded);
            route(&shared, &parts, body).await
        }
        Err(err) => error_response(parts.uri.path(), 400, &format!("could not read request body: {err}")),
    };
    response
        .headers_mut()
        .insert("x-emu-backend", shared.backend_header.clone());
    response
}

async fn route(shared: &Arc<Shared>, parts: &Parts, body: Bytes) -> Response {
    let opts = &shared.opts;
    let inference = Dialect::from_path(parts.uri.path()).filter(|_| parts.method == Method::POST);
    if let Some(dialect) = inference {
        return infer(shared, dialect, &parts.headers, &body).await;
    }
    match (parts.method.as_str(), parts.uri.path()) {
        ("GET", "/health") => health(shared),
        ("GET", "/props") => json_response(200, &dialect::props_body(&opts.model, opts.n_ctx, opts.total_slots)),
        ("GET", "/v1/models") => json_response(200, &dialect::models_body(&opts.model, opts.n_ctx)),
        (method, path) => error_response(path, 404, &format!("no route for {method} {path}")),
    }
}

fn health(shared: &Shared) -> Response {
    let status = shared.health.load(Ordering::SeqCst);
    json_response(status, &dialect::health_body(status))
}

fn json_response(status: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = [(CONTENT_TYPE, "application/json; charset=utf-8")];
    (status, content_type, body.to_string()).into_response()
}

/// An error outside any dialect's handler, in the envelope of the API whose path it was (else OpenAI's).
fn error_response(path: &str, status: u16, message: &str) -> Response {
    let envelope = Dialect::from_path(path).map_or(Envelope::OpenAi, Dialect::envelope);
    Refusal::error(envelope, status, message).into_response()
}

/// An error answer that an inference request ends with: status and JSON body.
#[derive(Debug)]
struct Refusal {
    status: u16,
    body: Value,
}

impl Refusal {
    /// The envelope's usual error, typed after the status.
    fn error(envelope: Envelope, status: u16, message: &str) -> Self {
        let body = envelope.error_for(status, message);
        Refusal { status, body }
    }

    /// A failed `x-emu-expect-*` self-check.
    fn expectation(envelope: Envelope, message: &str) -> Self {
        let message = format!("emulator expectation failed: {message}");
        let body = envelope.error(500, "expectation_failed", &message);
        Refusal { status: 500, body }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        json_response(self.status, &self.body)
    }
}

/// A response whose body fails at once, so hyper drops the connection, normally before the head is written;
/// used when the emulator stops while a request waits.
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
    fn from_headers(headers: &HeaderMap, envelope: Envelope) -> Result<Self, Refusal> {
        Ok(Faults {
            delay_ms: control(headers, "x-emu-delay-ms", envelope)?.unwrap_or(0),
            status: control(headers, "x-emu-status", envelope)?,
            chunk_delay_ms: control(headers, "x-emu-chunk-delay-ms", envelope)?,
            chunks: control(headers, "x-emu-chunks", envelope)?,
            cut_after: control(headers, "x-emu-cut-after", envelope)?,
        })
    }
}

/// Parses a numeric control header; a malformed one is a 400.
fn control<T: FromStr>(headers: &HeaderMap, name: &str, envelope: Envelope) -> Result<Option<T>, Refusal> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let parsed = value.to_str().ok().and_then(|text| text.trim().parse().ok());
    match parsed {
        Some(number) => Ok(Some(number)),
        None => Err(Refusal::error(
            envelope,
            400,
            &format!("emulator: bad {name} header {value:?}"),
        )),
    }
}

fn text_header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// Checks `x-emu-expect-model` and `x-emu-expect-backend`.
fn check_expectations(
    shared: &Shared,
    headers: &HeaderMap,
    request: &Value,
    envelope: Envelope,
) -> Result<(), Refusal> {
    if let Some(expected) = text_header(headers, "x-emu-expect-model") {
        let model = request.get("model").and_then(Value::as_str);
        if model != Some(expected) {
            let was = model.unwrap_or("<missing>");
            return Err(Refusal::expectation(
                envelope,
                &format!("model was {was}, expected {expected}"),
            ));
        }
    }
    if let Some(expected) = text_header(headers, "x-emu-expect-backend") {
        let name = &shared.opts.name;
        if name != expected {
            return Err(Refusal::expectation(
                envelope,
                &format!("backend was {name}, expected {expected}"),
            ));
        }
    }
    Ok(())
}

/// Serves one inference request, counted as in flight until its answer (or stream) ends.
async fn infer(shared: &Arc<Shared>, dialect: Dialect, headers: &HeaderMap, body: &[u8]) -> Response {
    let guard = InflightGuard::enter(shared);
    match answer(shared, dialect, headers, body, guard).await {
        Ok(response) => response,
        Err(refusal) => refusal.into_response(),
    }
}

/// The answer to one inference request; `Err` is the error it ends with.
async fn answer(
    shared: &Arc<Shared>,
    dialect: Dialect,
    headers: &HeaderMap,
    body: &[u8],
    guard: InflightGuard,
) -> Result<Response, Refusal> {
    let envelope = dialect.envelope();
    let faults = Faults::from_headers(headers, envelope)?;
    if !pause(&shared.stopped, Duration::from_millis(faults.delay_ms)).await {
        return Ok(aborted_response());
    }
    let request: Value = serde_json::from_slice(body)
        .map_err(|err| Refusal::error(envelope, 400, &format!("request body is not valid JSON: {err}")))?;
    check_expectations(shared, headers, &request, envelope)?;
    if let Some(status) = faults.status.or_else(|| shared.fault_status()) {
        let message = format!("emulated failure with status {status}");
        return Err(Refusal::error(envelope, status, &message));
    }
    dialect
        .check(&request)
        .map_err(|message| Refusal::error(envelope, 400, &message))?;
    let answer = build_answer(shared, dialect, &request, &faults);
    let wants_stream = request.get("stream").and_then(Value::as_bool).unwrap_or(false);
    match dialect.events() {
        Some(events) if wants_stream => Ok(stream_response(shared, events, &answer, &faults, guard)),
        _ => Ok(json_response(200, &dialect.body(&answer, &request))),
    }
}

fn build_answer(shared: &Shared, dialect: Dialect, request: &Value, faults: &Faults) -> Answer {
    let prompt = dialect.prompt_text(request);
    let model = request.get("model").and_then(Value::as_str);
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    let chunk_delay_ms = faults.chunk_delay_ms.unwrap_or(shared.opts.chunk_delay_ms);
    let cached_tokens = if dialect.uses_cache() {
        shared.cached_tokens(prompt.as_bytes())
    } else {
        0
    };
    Answer {
        id: dialect.answer_id(id),
        model: model.unwrap_or(&shared.opts.model).to_string(),
        backend: shared.opts.name.clone(),
        prompt_tokens: cache::token_count(prompt.as_bytes()),
        cached_tokens,
        chunk_delay: Duration::from_millis(chunk_delay_ms),
    }
}

fn stream_response(
    shared: &Shared,
    events: &dyn EventStream,
    answer: &Answer,
    faults: &Faults,
    guard: InflightGuard,
) -> Response {
    let chunks = faults.chunks.unwrap_or(dialect::DEFAULT_CHUNKS);
    let plan = dialect::stream_plan(events, answer, chunks, faults.cut_after);
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

/// Plays a planned stream (see [`dialect::stream_plan`]) out as body items, pausing before frames.
///
/// The inflight guard is released as the last item is handed out (or when the body is dropped early), so a
/// client that has read the whole stream already sees the request as finished.
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
    /// It waits a moment first: hyper flushes what it has buffered while the body is pending, so the head and
    /// the frames before the cut reach the client before the connection drops.
    async fn take_abort(&mut self) -> Option<Result<Bytes, io::Error>> {
        self.guard = None;
        if !std::mem::take(&mut self.abort) {
            return None;
        }
        tokio::time::sleep(FLUSH_BEFORE_ABORT).await;
        Some(Err(io::Error::other("emulated stream cut")))
    }
}
