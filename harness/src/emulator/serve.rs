//! The emulator's HTTP side: one handler that records every request, routes it, and names the backend.
//!
//! Inference requests (every [`Dialect`]) go through the same steps: count as in flight, apply the
//! `x-emu-*` faults and self-checks, parse the JSON, look the prompt up in the prefix cache, then answer in the
//! dialect, plain or as a stream (with the stream faults, played out by `sse`). Errors are answered in the
//! dialect's envelope.

use std::io;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;

use super::chaos::EngineFault;
use super::dialect::{self, Answer, Dialect, Envelope, LineEnding, Stop, StreamFaults};
use super::{cache, cost, load, pause, sse, InflightGuard, RecordedRequest, Shared};

/// Largest request body the emulator reads.
const BODY_LIMIT: usize = 64 * 1024 * 1024;

/// The single handler: records the request, routes it, names the backend.
pub(super) async fn serve_request(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let mut response = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(body) => {
            let recorded = RecordedRequest::from_parts(&parts, body.clone(), &shared.opts.name);
            shared.requests().push(recorded);
            let mut response = route(&shared, &parts, body).await;
            orca(&shared, &parts, &mut response);
            response
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
        ("GET", "/metrics") => metrics(shared),
        ("GET", "/v1/models") => json_response(200, &dialect::models_body(&opts.model, opts.n_ctx)),
        ("POST", "/v1/decisions" | "/v1/systemone") => decision_echo(&body),
        (method, path) => error_response(path, 404, &format!("no route for {method} {path}")),
    }
}

/// The decision-model routes (NVCF seed beta): the body is opaque; the answer names the `model` it carried and
/// how many bytes arrived, so a test can see the rewrite.
fn decision_echo(body: &[u8]) -> Response {
    let model = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("model").cloned())
        .unwrap_or(Value::Null);
    let answer = serde_json::json!({"object": "decision", "model": model, "received_bytes": body.len()});
    json_response(200, &answer)
}

/// `GET /metrics`: the reported load in the emulator's dialect, 501 without one (llama-server without
/// `--metrics`), or the status `set_metrics_status` set.
fn metrics(shared: &Shared) -> Response {
    let fault = shared.load.status.load(Ordering::SeqCst);
    let Some(format) = shared.opts.load_format.filter(|_| fault == 0) else {
        let status = if fault == 0 { 501 } else { fault };
        return error_response("/metrics", status, "This server does not support metrics endpoint.");
    };
    let reported = shared.load.reported();
    let running = reported
        .running
        .unwrap_or_else(|| u32::try_from(shared.inflight.load(Ordering::SeqCst)).unwrap_or(u32::MAX));
    let page = load::metrics_page(format, &shared.opts.model, reported, running);
    (StatusCode::OK, [(CONTENT_TYPE, "text/plain; version=0.0.4")], page).into_response()
}

/// With the `orca` option, answers an inference request that asks for it with vLLM's ORCA load report.
fn orca(shared: &Shared, parts: &Parts, response: &mut Response) {
    let asked = parts.headers.get(load::ORCA_REQUEST).and_then(|v| v.to_str().ok()) == Some("JSON");
    if !(shared.opts.orca && asked && Dialect::from_path(parts.uri.path()).is_some()) {
        return;
    }
    if let Ok(v) = HeaderValue::from_str(&load::orca_report(shared.load.reported())) {
        response.headers_mut().insert(load::ORCA_RESPONSE, v);
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

    /// The error `x-emu-status` asks for, in the shape `x-emu-error-shape` names (default: the dialect's own).
    /// `openai` and `fastapi` are what vLLM sends on `/v1/messages`; `anthropic-with-id` carries a backend
    /// `request_id` of `req_emulated`.
    fn shaped(headers: &HeaderMap, envelope: Envelope, status: u16, message: &str) -> Self {
        let shape = headers.get("x-emu-error-shape").and_then(|v| v.to_str().ok());
        let body = match shape {
            Some("openai") => Envelope::OpenAi.error_for(status, message),
            Some("fastapi") => serde_json::json!({"detail": [
                {"type": "missing", "loc": ["body", "max_tokens"], "msg": "Field required", "input": null},
            ]}),
            Some("anthropic-with-id") => {
                let mut body = Envelope::Anthropic.error_for(status, message);
                body["request_id"] = Value::from("req_emulated");
                body
            }
            _ => envelope.error_for(status, message),
        };
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

/// Marks a response that drops the connection before its head is written; the journal records no status.
#[derive(Clone, Copy, Debug)]
struct NoHead;

/// A response whose body fails at once, so hyper drops the connection before the head is written; used when
/// the emulator stops while a request waits, and for `x-emu-reset`.
fn aborted_response() -> Response {
    let failure = futures_util::stream::once(async { Err::<Bytes, io::Error>(io::Error::other("emulator stopped")) });
    let mut response = Response::new(Body::from_stream(failure));
    response.extensions_mut().insert(NoHead);
    response
}

/// Per-request behaviour chosen by `x-emu-*` headers.
#[derive(Debug)]
struct Faults {
    delay_ms: u64,
    status: Option<u16>,
    chunk_delay_ms: Option<u64>,
    stream: StreamFaults,
    close_delimited: bool,
    /// Drop the connection before any response byte.
    reset: bool,
}

/// Makes a [`Stop`] from a header's delta count.
type MakeStop = fn(u32) -> Stop;

/// The headers that stop a stream early; a request may carry one of them.
const STOPS: [(&str, MakeStop); 5] = [
    ("x-emu-cut-after", Stop::CutAfter),
    ("x-emu-cut-mid", Stop::CutMid),
    ("x-emu-end-mid", Stop::EndMid),
    ("x-emu-error-after", Stop::ErrorAfter),
    ("x-emu-garbage-after", Stop::GarbageAfter),
];

impl Faults {
    fn from_headers(headers: &HeaderMap, envelope: Envelope) -> Result<Self, Refusal> {
        let chunks = control(headers, "x-emu-chunks", envelope)?.unwrap_or(dialect::DEFAULT_CHUNKS);
        let stream = StreamFaults {
            stop: stop(headers, envelope)?,
            no_terminal: flag(headers, "x-emu-no-terminal", envelope)?,
            line_ending: line_ending(headers, envelope)?,
            trickle: control(headers, "x-emu-trickle-ms", envelope)?.map(Duration::from_millis),
            stall: flag(headers, "x-emu-stall", envelope)?,
            ..StreamFaults::new(chunks)
        };
        Ok(Faults {
            delay_ms: control(headers, "x-emu-delay-ms", envelope)?.unwrap_or(0),
            status: control(headers, "x-emu-status", envelope)?,
            chunk_delay_ms: control(headers, "x-emu-chunk-delay-ms", envelope)?,
            stream,
            close_delimited: flag(headers, "x-emu-close-delimited", envelope)?,
            reset: flag(headers, "x-emu-reset", envelope)?,
        })
    }

    /// Adds an engine-wide fault (see `chaos`). Stream faults apply only where the request sets none of its own.
    fn add(&mut self, fault: EngineFault) {
        match fault {
            EngineFault::SlowHeaders(delay) => {
                let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                self.delay_ms = self.delay_ms.saturating_add(ms);
            }
            EngineFault::Reset => self.reset = true,
            EngineFault::Garbage => {
                self.stream.stop = self.stream.stop.or(Some(Stop::GarbageAfter(1)));
            }
            EngineFault::Cut => self.stream.stop = self.stream.stop.or(Some(Stop::CutMid(1))),
        }
    }
}

/// The one early stop among [`STOPS`], if any; two are a 400.
fn stop(headers: &HeaderMap, envelope: Envelope) -> Result<Option<Stop>, Refusal> {
    let mut found = None;
    for (name, make) in STOPS {
        let Some(deltas) = control(headers, name, envelope)? else {
            continue;
        };
        if found.is_some() {
            let names = STOPS.map(|(name, _)| name).join(", ");
            return Err(Refusal::error(
                envelope,
                400,
                &format!("emulator: at most one of {names}"),
            ));
        }
        found = Some(make(deltas));
    }
    Ok(found)
}

/// A `0`/`1` control header; absent is off.
fn flag(headers: &HeaderMap, name: &str, envelope: Envelope) -> Result<bool, Refusal> {
    Ok(control::<u8>(headers, name, envelope)?.is_some_and(|value| value != 0))
}

/// `x-emu-line-ending`: `lf` (the default), `crlf` or `cr`.
fn line_ending(headers: &HeaderMap, envelope: Envelope) -> Result<LineEnding, Refusal> {
    let Some(value) = headers.get("x-emu-line-ending") else {
        return Ok(LineEnding::Lf);
    };
    let ending = value.to_str().ok().and_then(LineEnding::parse);
    ending.ok_or_else(|| bad_header(envelope, "x-emu-line-ending", value))
}

fn bad_header(envelope: Envelope, name: &str, value: &HeaderValue) -> Refusal {
    Refusal::error(envelope, 400, &format!("emulator: bad {name} header {value:?}"))
}

/// Parses a numeric control header; a malformed one is a 400.
fn control<T: FromStr>(headers: &HeaderMap, name: &str, envelope: Envelope) -> Result<Option<T>, Refusal> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let parsed = value.to_str().ok().and_then(|text| text.trim().parse().ok());
    parsed.map(Some).ok_or_else(|| bad_header(envelope, name, value))
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

/// Serves one inference request, counted as in flight until its answer (or stream) ends, and records the attempt
/// in the journal by its `x-request-id`, with the status of the head it sent (none for a dropped connection).
async fn infer(shared: &Arc<Shared>, dialect: Dialect, headers: &HeaderMap, body: &[u8]) -> Response {
    let arrived = Instant::now();
    let guard = InflightGuard::enter(shared);
    let response = match answer(shared, dialect, headers, body, guard).await {
        Ok(response) => response,
        Err(refusal) => refusal.into_response(),
    };
    if let Some(id) = text_header(headers, "x-request-id") {
        let head = match response.extensions().get::<NoHead>() {
            Some(NoHead) => None,
            None => Some(response.status().as_u16()),
        };
        shared.journal.record(id, &shared.opts.name, arrived, head);
    }
    response
}

/// The engine-wide fault of this request, if the engine has a fault plan and the request an id.
fn engine_fault(shared: &Shared, headers: &HeaderMap) -> Option<EngineFault> {
    let plan = shared.opts.faults.as_ref()?;
    let id = text_header(headers, "x-request-id")?;
    let name = &shared.opts.name;
    plan.pick(name, id, shared.journal.seen(name, id))
}

/// The answer to one inference request; `Err` is the error it ends with.
async fn answer(
    shared: &Arc<Shared>,
    dialect: Dialect,
    headers: &HeaderMap,
    body: &[u8],
    mut guard: InflightGuard,
) -> Result<Response, Refusal> {
    let envelope = dialect.envelope();
    let mut faults = Faults::from_headers(headers, envelope)?;
    if let Some(fault) = engine_fault(shared, headers) {
        faults.add(fault);
    }
    if faults.reset {
        return Ok(aborted_response());
    }
    if !pause(&shared.stopped, Duration::from_millis(faults.delay_ms)).await {
        return Ok(aborted_response());
    }
    let request: Value = serde_json::from_slice(body)
        .map_err(|err| Refusal::error(envelope, 400, &format!("request body is not valid JSON: {err}")))?;
    check_expectations(shared, headers, &request, envelope)?;
    let engine_status = || shared.fault_status().or_else(|| shared.burst_status());
    if let Some(status) = faults.status.or_else(engine_status) {
        let message = format!("emulated failure with status {status}");
        return Err(Refusal::shaped(headers, envelope, status, &message));
    }
    dialect
        .check(&request)
        .map_err(|message| Refusal::error(envelope, 400, &message))?;
    // The cost model, if on: wait for a slot, then look the prompt up and spend its prefill.
    let Ok(mut slot) = cost::admit(shared, dialect).await else {
        return Ok(aborted_response());
    };
    let mut answer = build_answer(shared, dialect, &request, &faults, slot.as_mut());
    let mut stream = faults.stream;
    if let Some(slot) = &slot {
        let explicit_chunks = headers.contains_key("x-emu-chunks");
        if !slot
            .prefill(shared, &request, explicit_chunks, &mut answer, &mut stream)
            .await
        {
            return Ok(aborted_response());
        }
    }
    answer.plain_chunks = headers.contains_key("x-emu-chunks").then_some(stream.chunks);
    let wants_stream = request.get("stream").and_then(Value::as_bool).unwrap_or(false);
    match dialect.events() {
        Some(events) if wants_stream => {
            let mut plan = dialect::stream_plan(events, &answer, &stream);
            if slot.is_some() {
                cost::first_token_at_once(&mut plan);
            }
            guard.hold(slot);
            let close_delimited = faults.close_delimited || shared.opts.close_delimited;
            Ok(sse::stream_response(
                plan,
                close_delimited,
                shared.stopped.clone(),
                guard,
            ))
        }
        _ => {
            if let Some(slot) = slot {
                if !slot.decode_plain(shared).await {
                    return Ok(aborted_response());
                }
            }
            Ok(json_response(200, &dialect.body(&answer, &request)))
        }
    }
}

/// The answer's fields; looks the prompt up in the prefix cache: the memory of the slot it takes when the cost
/// model has `slot_cache`, else the engine's shared cache.
fn build_answer(
    shared: &Shared,
    dialect: Dialect,
    request: &Value,
    faults: &Faults,
    slot: Option<&mut cost::Slot>,
) -> Answer {
    let prompt = dialect.prompt_text(request);
    let model = request.get("model").and_then(Value::as_str);
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    let chunk_delay_ms = faults.chunk_delay_ms.unwrap_or(shared.opts.chunk_delay_ms);
    let cached_tokens = if dialect.uses_cache() {
        let prompt = prompt.as_bytes();
        slot.and_then(|slot| slot.cached_tokens(prompt))
            .unwrap_or_else(|| shared.cached_tokens(prompt))
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
        include_usage: request.pointer("/stream_options/include_usage") == Some(&Value::Bool(true)),
        plain_chunks: None,
    }
}
