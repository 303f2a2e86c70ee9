//! Replays a [`Trace`] against one system and times each request at the client.
//!
//! Open loop (the default): every session runs as its own task: it waits for its start offset, then sends its
//! requests one after another, each `think` after the previous answer ended. Sessions do not wait for one another,
//! so the offered load is the trace's, whatever the system does with it. Closed loop ([`Trace::in_flight`] is
//! `Some(n)`): `n` workers take the sessions in the trace's order, each running one session to its end before it
//! takes the next, so `n` are in flight and a new one leaves as soon as one ends. Requests are streamed chat
//! completions; TTFT is from sending the request to the first non-empty content delta, and the usage chunk gives
//! the engine-reported prompt and cached tokens. All requests share one keep-alive HTTP/1.1 client with
//! `TCP_NODELAY`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::header::CONTENT_TYPE;
use serde_json::Value;

use super::workload::{Request, Session, Trace};

/// Longest one request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What one request saw.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Send to the first content delta.
    pub ttft: Option<Duration>,
    /// Send to the end of the stream.
    pub total: Option<Duration>,
    /// `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens`, as the engine reported them.
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// `x-emu-backend`, when the system passes it on.
    pub backend: Option<String>,
    /// The request's routing key as the trace knows it (its tenant, group, prompt or conversation).
    pub key: Option<String>,
    /// When it was sent.
    pub sent: Option<Instant>,
    pub error: Option<String>,
}

/// A client for the replay.
pub fn client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(30))
        .timeout(REQUEST_TIMEOUT)
        .build()
}

/// Replays `trace` against `urls`, in an open or a closed loop (see the module documentation); `with_session` adds
/// each request's session id as `x-session-id`. With several URLs (replicas), each request goes to one of them at
/// random ([`replica`], seeded by `seed`), as an L4 load balancer spreading connections would send it; the same
/// seed sends the same request to the same replica in every run. Returns one sample per request, session by
/// session.
pub async fn replay(
    client: &reqwest::Client,
    urls: &[String],
    trace: &Trace,
    with_session: bool,
    seed: u64,
) -> Vec<Sample> {
    let url: Arc<[String]> = Arc::from(urls);
    let tasks: Vec<_> = match trace.in_flight {
        None => {
            let start = Instant::now();
            trace
                .sessions
                .iter()
                .enumerate()
                .map(|(index, session)| {
                    let (client, url, session) = (client.clone(), url.clone(), session.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep_until((start + session.start).into()).await;
                        vec![(
                            index,
                            run_session(&client, (&url[..], index, seed), &session, with_session).await,
                        )]
                    })
                })
                .collect()
        }
        Some(in_flight) => {
            let sessions: Arc<[Session]> = trace.sessions.clone().into();
            let next = Arc::new(AtomicUsize::new(0));
            (0..in_flight.max(1))
                .map(|_| {
                    let (client, url, sessions, next) = (client.clone(), url.clone(), sessions.clone(), next.clone());
                    tokio::spawn(async move {
                        let mut done = Vec::new();
                        loop {
                            let index = next.fetch_add(1, Ordering::SeqCst);
                            let Some(session) = sessions.get(index) else {
                                return done;
                            };
                            done.push((
                                index,
                                run_session(&client, (&url[..], index, seed), session, with_session).await,
                            ));
                        }
                    })
                })
                .collect()
        }
    };
    let mut sessions: Vec<(usize, Vec<Sample>)> = Vec::with_capacity(trace.sessions.len());
    for task in tasks {
        match task.await {
            Ok(done) => sessions.extend(done),
            Err(e) => sessions.push((
                usize::MAX,
                vec![Sample {
                    error: Some(format!("replay task failed: {e}")),
                    ..Sample::default()
                }],
            )),
        }
    }
    sessions.sort_by_key(|(index, _)| *index);
    sessions.into_iter().flat_map(|(_, samples)| samples).collect()
}

/// Sends a session's requests one after another, each `think` after the previous answer.
async fn run_session(
    client: &reqwest::Client,
    (urls, index, seed): (&[String], usize, u64),
    session: &Session,
    with_session: bool,
) -> Vec<Sample> {
    let mut samples = Vec::with_capacity(session.requests.len());
    for (i, request) in session.requests.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(session.think).await;
        }
        let url = urls.get(replica(seed, index, i, urls.len())).map_or("", String::as_str);
        let mut sample = send(client, url, request, with_session).await;
        sample.key = Some(request.session.clone());
        samples.push(sample);
    }
    samples
}

/// The replica, of `n`, that request `i` of session `index` goes to: uniform, and fixed by `seed`.
pub fn replica(seed: u64, index: usize, i: usize, n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    let mut rng = crate::rng::SplitMix64::new(seed ^ ((index as u64) << 20) ^ i as u64 ^ 0x0072_6570_6c69_6361);
    (rng.next_u64() % n as u64) as usize
}

/// Sends one streamed request and reads the stream to its end.
pub async fn send(client: &reqwest::Client, url: &str, request: &Request, with_session: bool) -> Sample {
    let sent = Instant::now();
    let mut builder = client
        .post(url)
        .header(CONTENT_TYPE, "application/json")
        .body(request.body.clone());
    if with_session {
        builder = builder.header("x-session-id", request.session.as_str());
    }
    let mut sample = Sample {
        sent: Some(sent),
        ..Sample::default()
    };
    let response = match builder.send().await {
        Ok(r) => r,
        Err(e) => {
            sample.error = Some(format!("request failed: {e}"));
            return sample;
        }
    };
    sample.backend = response
        .headers()
        .get("x-emu-backend")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let status = response.status();
    if status != reqwest::StatusCode::OK {
        let text = response.text().await.unwrap_or_default();
        sample.error = Some(format!(
            "status {status}: {}",
            text.chars().take(200).collect::<String>()
        ));
        return sample;
    }
    let mut events = SseReader::default();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                sample.error = Some(format!("stream failed: {e}"));
                return sample;
            }
        };
        for data in events.push(&chunk) {
            read_event(&data, sent, &mut sample);
        }
    }
    sample.total = Some(sent.elapsed());
    if sample.ttft.is_none() {
        sample.error = Some("the stream carried no content".into());
    }
    sample
}

/// Notes the first content delta's time and the usage, from one `data:` payload.
fn read_event(data: &str, sent: Instant, sample: &mut Sample) {
    if data == "[DONE]" {
        return;
    }
    let Ok(event) = serde_json::from_str::<Value>(data) else {
        return;
    };
    let content = event.pointer("/choices/0/delta/content").and_then(Value::as_str);
    if sample.ttft.is_none() && content.is_some_and(|c| !c.is_empty()) {
        sample.ttft = Some(sent.elapsed());
    }
    if let Some(usage) = event.get("usage").filter(|u| u.is_object()) {
        sample.prompt_tokens = usage.get("prompt_tokens").and_then(Value::as_u64);
        sample.cached_tokens = usage
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64);
    }
}

/// Splits an SSE byte stream into the payloads of its `data:` lines.
#[derive(Default)]
struct SseReader {
    buffer: Vec<u8>,
}

impl SseReader {
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buffer.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if let Some(data) = line.strip_prefix("data:") {
                out.push(data.trim_start().to_string());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_loop_keeps_its_requests_in_flight() {
        use crate::emulator::cost::CostModel;
        use crate::emulator::{Emulator, EmulatorOptions};
        let mut opts = EmulatorOptions::new("closed");
        opts.cost = Some(CostModel {
            prefill_ms_per_token: 0.001,
            decode_ms_per_token: 2.0,
            slots: 8,
            slot_cache: true,
        });
        let engine = Emulator::spawn_with(opts).await.unwrap();
        let shape = super::super::workload::Shape::full();
        let trace = Trace::generate(super::super::workload::Workload::Tenants6, &shape, 1);
        let url = format!("http://{}/v1/chat/completions", engine.addr());
        let samples = replay(&client().unwrap(), &[url], &trace, false, 1).await;
        assert_eq!(samples.len(), 48);
        assert!(
            samples.iter().all(|s| s.error.is_none()),
            "{:?}",
            samples.iter().find(|s| s.error.is_some())
        );
        assert_eq!(engine.max_inflight(), 3, "3 in flight, never more");
        // The requests left in the trace's order, give or take those in flight beside them.
        let bodies: Vec<bytes::Bytes> = engine.chat_requests().into_iter().map(|r| r.body).collect();
        for (sent, session) in trace.sessions.iter().enumerate() {
            let at = bodies.iter().position(|b| *b == session.requests[0].body).unwrap();
            assert!(at.abs_diff(sent) <= 3, "request {sent} arrived {at}th");
        }
    }

    #[test]
    fn replicas_are_picked_at_random_but_fixed_by_the_seed() {
        let picks = |seed| (0..600).map(|s| replica(seed, s, 0, 3)).collect::<Vec<_>>();
        let a = picks(42);
        assert_eq!(a, picks(42));
        assert_ne!(a, picks(43));
        for r in 0..3 {
            let n = a.iter().filter(|&&x| x == r).count();
            assert!((150..250).contains(&n), "replica {r} got {n} of 600");
        }
        // Not in turn: some consecutive requests land on the same replica.
        assert!(a.windows(2).any(|w| w[0] == w[1]));
        assert_eq!(replica(42, 5, 1, 1), 0);
    }

    #[test]
    fn sse_lines_split_across_chunks() {
        let mut r = SseReader::default();
        assert!(r.push(b"data: {\"a\"").is_empty());
        assert_eq!(
            r.push(b":1}\n\n: keepalive\n\ndata: [DONE]\r\n"),
            ["{\"a\":1}", "[DONE]"]
        );
    }

    #[test]
    fn first_content_and_usage_are_read() {
        let sent = Instant::now();
        let mut s = Sample::default();
        read_event(
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            sent,
            &mut s,
        );
        assert!(s.ttft.is_none());
        read_event(r#"{"choices":[{"delta":{"content":"tok0 "}}]}"#, sent, &mut s);
        assert!(s.ttft.is_some());
        read_event(
            r#"{"choices":[],"usage":{"prompt_tokens":50,"prompt_tokens_details":{"cached_tokens":32}}}"#,
            sent,
            &mut s,
        );
        assert_eq!((s.prompt_tokens, s.cached_tokens), (Some(50), Some(32)));
        read_event("[DONE]", sent, &mut s);
    }
}
