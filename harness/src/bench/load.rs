//! A closed-loop HTTP load generator: `concurrency` workers, each sending its next request as soon as the last
//! answer has been read in full, for a fixed time.
//!
//! All workers share one `reqwest` client over HTTP/1.1 keep-alive, with a pool as large as the concurrency, so
//! after the first round no connection is opened during a measurement. Bodies are prepared `Bytes`: sending one
//! is a reference-count increment, not a copy. Each request's latency (send to last response byte) is recorded
//! in microseconds; any status but 200, or a transport error, counts as an error and is not timed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{HeaderValue, CONTENT_TYPE};

use super::stats::percentile;

/// The routing header plain Envoy hashes on. The filter removes a client's copy and sets its own.
pub const AFFINITY_HEADER: &str = "x-llmroute-affinity";
/// Longest a single request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// One request ready to send: the body, its affinity header value and, to be answered with a stream, the
/// bench upstream's stream header (`upstream::STREAM_EVENTS_HEADER`).
#[derive(Clone)]
pub struct Prepared {
    pub body: Bytes,
    pub affinity: HeaderValue,
    pub stream_events: Option<HeaderValue>,
}

/// What one round of load measured.
#[derive(Debug, Default, Clone)]
pub struct Round {
    pub ok: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Latencies of the successful requests, in µs, sorted.
    pub latencies_us: Vec<u32>,
    /// From the start to the last answer.
    pub elapsed: Duration,
}

impl Round {
    /// Successful requests per second.
    pub fn rps(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn p50_us(&self) -> Option<f64> {
        percentile(&self.latencies_us, 0.50).map(f64::from)
    }

    pub fn p99_us(&self) -> Option<f64> {
        percentile(&self.latencies_us, 0.99).map(f64::from)
    }

    fn merge(&mut self, other: Round) {
        self.ok += other.ok;
        self.errors += other.errors;
        self.first_error = self.first_error.take().or(other.first_error);
        self.latencies_us.extend(other.latencies_us);
    }
}

/// A client for `concurrency` parallel keep-alive HTTP/1.1 connections with `TCP_NODELAY`.
pub fn client(concurrency: usize) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(concurrency)
        .pool_idle_timeout(None)
        .timeout(REQUEST_TIMEOUT)
        .build()
}

/// Runs `concurrency` closed-loop workers against `url` for `duration`; worker `w` sends `requests[w]`,
/// `requests[w + concurrency]`, ... cycling.
pub async fn run(
    client: &reqwest::Client,
    url: &str,
    requests: &Arc<[Prepared]>,
    concurrency: usize,
    duration: Duration,
) -> Round {
    let start = Instant::now();
    let deadline = start + duration;
    let url: Arc<str> = Arc::from(url);
    let workers: Vec<_> = (0..concurrency)
        .map(|w| {
            tokio::spawn(worker(
                client.clone(),
                url.clone(),
                requests.clone(),
                w,
                concurrency,
                deadline,
            ))
        })
        .collect();
    let mut total = Round::default();
    for w in workers {
        match w.await {
            Ok(round) => total.merge(round),
            Err(e) => total.merge(failed(format!("load worker failed: {e}"))),
        }
    }
    total.elapsed = start.elapsed();
    total.latencies_us.sort_unstable();
    total
}

async fn worker(
    client: reqwest::Client,
    url: Arc<str>,
    requests: Arc<[Prepared]>,
    first: usize,
    step: usize,
    deadline: Instant,
) -> Round {
    let mut round = Round::default();
    let mut next = first;
    while Instant::now() < deadline && !requests.is_empty() {
        let request = &requests[next % requests.len()];
        next += step;
        let sent = Instant::now();
        match send(&client, &url, request).await {
            Ok(()) => {
                round.ok += 1;
                round
                    .latencies_us
                    .push(sent.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }
            Err(e) => round.merge(failed(e)),
        }
    }
    round
}

pub async fn send(client: &reqwest::Client, url: &str, request: &Prepared) -> Result<(), String> {
    let mut post = client
        .post(url)
        .header(CONTENT_TYPE, "application/json")
        .header(AFFINITY_HEADER, request.affinity.clone());
    if let Some(n) = &request.stream_events {
        post = post.header(super::upstream::STREAM_EVENTS_HEADER, n.clone());
    }
    let response = post
        .body(request.body.clone())
        .send()
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .map_err(|e| format!("reading the answer failed: {e}"))?;
    if status != reqwest::StatusCode::OK {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err(format!("status {status}: {text}"));
    }
    Ok(())
}

fn failed(message: String) -> Round {
    Round {
        errors: 1,
        first_error: Some(message),
        ..Round::default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::upstream::Upstreams;
    use super::*;

    #[tokio::test]
    async fn a_short_round_against_the_bench_upstream() {
        let up = Upstreams::start(1).await.unwrap();
        let url = format!("{}/v1/chat/completions", up.urls()[0]);
        let requests: Arc<[Prepared]> = Arc::from(vec![Prepared {
            body: Bytes::from_static(b"{}"),
            affinity: HeaderValue::from_static("0123456789abcdef"),
            stream_events: None,
        }]);
        let round = run(&client(4).unwrap(), &url, &requests, 4, Duration::from_millis(200)).await;
        assert!(round.ok > 10, "{round:?}");
        assert_eq!(round.errors, 0);
        assert_eq!(round.latencies_us.len() as u64, round.ok);
        assert!(round.p50_us().unwrap() <= round.p99_us().unwrap());
        assert!(round.rps() > 0.0);
    }

    #[tokio::test]
    async fn errors_are_counted_with_the_first_message() {
        let requests: Arc<[Prepared]> = Arc::from(vec![Prepared {
            body: Bytes::from_static(b"{}"),
            affinity: HeaderValue::from_static("k"),
            stream_events: None,
        }]);
        // Port 9 (discard) is closed on loopback here: every request fails to connect.
        let round = run(
            &client(1).unwrap(),
            "http://127.0.0.1:9/",
            &requests,
            1,
            Duration::from_millis(50),
        )
        .await;
        assert_eq!(round.ok, 0);
        assert!(round.errors > 0);
        assert!(round.first_error.unwrap().contains("request failed"));
    }
}
