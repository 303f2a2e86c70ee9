//! Workloads for real llama.cpp servers: seeded prompts, and streamed chat requests that report what the engine
//! itself says about its prompt cache.
//!
//! llama-server ends a stream (with `stream_options.include_usage`) with a chunk carrying
//! `usage.prompt_tokens` (every prompt token), `usage.prompt_tokens_details.cached_tokens` (those taken from the
//! slot's KV cache) and `timings.{prompt_n, cache_n}` (prefilled, cached). So the cache-hit ratio of a run is
//! `sum(cached_tokens) / sum(prompt_tokens)` = cached ÷ (prefilled + cached), as the engines report it.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

/// Deterministic English-like text of `words` words, about 1.1 Llama SPM tokens per word.
pub fn prompt_text(seed: u64, words: usize) -> String {
    const WORDS: [&str; 32] = [
        "the", "cache", "route", "engine", "prompt", "token", "model", "request", "fleet", "server", "warm", "cold",
        "key", "hash", "ring", "load", "send", "keep", "same", "each", "every", "first", "system", "user", "reply",
        "stream", "slot", "batch", "queue", "time", "fast", "small",
    ];
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(words);
    for _ in 0..words {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(WORDS[(x >> 40) as usize % WORDS.len()]);
    }
    out.join(" ")
}

/// Tenant `tenant`'s system prompt of about `words` words: the same text every time for one tenant.
pub fn tenant_system_prompt(tenant: usize, words: usize) -> String {
    format!(
        "You are the assistant of tenant {tenant}. {}",
        prompt_text(10_000 + tenant as u64, words)
    )
}

/// A streamed chat body: `system` then `user`, at most `max_tokens` generated, usage in the last chunk.
pub fn chat_body(alias: &str, system: &str, user: &str, max_tokens: u32) -> Value {
    json!({
        "model": alias,
        "messages": [{ "role": "system", "content": system }, { "role": "user", "content": user }],
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": { "include_usage": true },
    })
}

/// An HTTP client for workloads: one connection pool, `TCP_NODELAY`, 120 s per request.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap_or_default()
}

/// What one streamed chat request gave.
#[derive(Debug, Clone, Default)]
pub struct ChatOutcome {
    /// 200, a complete stream (`[DONE]`) and a usage chunk.
    pub ok: bool,
    pub status: u16,
    /// The `model` of the chunks: the answering server's `--alias`.
    pub model: String,
    /// When the request was sent, relative to the start of its run.
    pub sent_at: Duration,
    /// Time to the first generated token (the first chunk with `delta.content`).
    pub ttft: Option<Duration>,
    pub total: Duration,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: u64,
    /// `timings.cache_n`, when the engine sent timings.
    pub cache_n: Option<u64>,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

/// Sends one streamed chat request to `url` with extra `headers`, reading the stream to its end.
pub async fn stream_chat(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    headers: &[(String, String)],
) -> ChatOutcome {
    let start = Instant::now();
    let mut out = ChatOutcome::default();
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(format!("send: {e}"));
            out.total = start.elapsed();
            return out;
        }
    };
    out.status = resp.status().as_u16();
    if out.status != 200 {
        let text = resp.text().await.unwrap_or_default();
        out.error = Some(format!(
            "status {}: {}",
            out.status,
            text.chars().take(300).collect::<String>()
        ));
        out.total = start.elapsed();
        return out;
    }
    let mut buf = Vec::new();
    let mut done = false;
    let mut usage = false;
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                out.error = Some(format!("stream cut: {e}"));
                break;
            }
        };
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
                if data.trim() == "[DONE]" {
                    done = true;
                    continue;
                }
                let Ok(v) = serde_json::from_str::<Value>(data) else {
                    out.error = Some(format!("not JSON: {data}"));
                    continue;
                };
                if let Some(m) = v["model"].as_str() {
                    out.model = m.to_string();
                }
                let first_token = v["choices"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["delta"]["content"].is_string()));
                if first_token && out.ttft.is_none() {
                    out.ttft = Some(start.elapsed());
                }
                if let Some(p) = v["usage"]["prompt_tokens"].as_u64() {
                    usage = true;
                    out.prompt_tokens = p;
                    out.cached_tokens = v["usage"]["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap_or(0);
                }
                if let Some(c) = v["timings"]["cache_n"].as_u64() {
                    out.cache_n = Some(c);
                }
            }
        }
    }
    out.total = start.elapsed();
    if out.error.is_none() && !done {
        out.error = Some("the stream ended without [DONE]".into());
    }
    if out.error.is_none() && !usage {
        out.error = Some("no usage chunk".into());
    }
    out.ok = out.error.is_none();
    out
}

/// One request of a workload: its body and extra headers.
#[derive(Debug, Clone)]
pub struct Job {
    pub body: Value,
    pub headers: Vec<(String, String)>,
}

/// Sends `jobs` to `url` in order with at most `concurrency` in flight; the outcomes are in job order.
pub async fn run_jobs(client: &reqwest::Client, url: &str, jobs: Vec<Job>, concurrency: usize) -> Vec<ChatOutcome> {
    run_jobs_on(client, &[url.to_string()], |_| 0, jobs, concurrency).await
}

/// [`run_jobs`] in front of several routers (Envoy replicas): job `i` goes to `urls[pick(i)]` (the first URL when
/// `pick` names none).
pub async fn run_jobs_on(
    client: &reqwest::Client,
    urls: &[String],
    pick: impl Fn(usize) -> usize,
    jobs: Vec<Job>,
    concurrency: usize,
) -> Vec<ChatOutcome> {
    let run_start = Instant::now();
    let first = urls.first().map_or("", String::as_str);
    let picked: Vec<&str> = (0..jobs.len())
        .map(|i| urls.get(pick(i)).map_or(first, String::as_str))
        .collect();
    futures_util::stream::iter(jobs.into_iter().zip(picked))
        .map(|(job, url)| async move {
            let sent_at = run_start.elapsed();
            let mut out = stream_chat(client, url, &job.body, &job.headers).await;
            out.sent_at = sent_at;
            out
        })
        .buffered(concurrency.max(1))
        .collect()
        .await
}

/// Sends each job at its own time after the start (open loop: a slow answer delays no later request), job `i` to
/// `url`; the outcomes are in job order, each with the time it was really sent.
pub async fn run_timed(client: &reqwest::Client, url: &str, jobs: Vec<(Duration, Job)>) -> Vec<ChatOutcome> {
    let run_start = tokio::time::Instant::now();
    let sends = jobs.into_iter().map(|(at, job)| async move {
        tokio::time::sleep_until(run_start + at).await;
        let sent_at = run_start.elapsed();
        let mut out = stream_chat(client, url, &job.body, &job.headers).await;
        out.sent_at = sent_at;
        out
    });
    futures_util::future::join_all(sends).await
}

/// Sums over outcomes: the engine-reported cache-hit ratio, cached ÷ prompt tokens of the successful requests.
pub fn cache_hit_ratio(outcomes: &[ChatOutcome]) -> f64 {
    let (prompt, cached) = outcomes
        .iter()
        .filter(|o| o.ok)
        .fold((0u64, 0u64), |(p, c), o| (p + o.prompt_tokens, c + o.cached_tokens));
    if prompt == 0 {
        0.0
    } else {
        cached as f64 / prompt as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_deterministic_and_distinct_per_tenant() {
        assert_eq!(prompt_text(7, 50), prompt_text(7, 50));
        assert_ne!(prompt_text(7, 50), prompt_text(8, 50));
        assert_eq!(prompt_text(7, 50).split(' ').count(), 50);
        assert_eq!(tenant_system_prompt(2, 100), tenant_system_prompt(2, 100));
        assert_ne!(tenant_system_prompt(2, 100), tenant_system_prompt(3, 100));
    }

    #[test]
    fn the_ratio_counts_successful_requests_only() {
        let ok = |p, c| ChatOutcome {
            ok: true,
            prompt_tokens: p,
            cached_tokens: c,
            ..ChatOutcome::default()
        };
        let failed = ChatOutcome {
            prompt_tokens: 1000,
            ..ChatOutcome::default()
        };
        assert_eq!(cache_hit_ratio(&[ok(100, 0), ok(100, 50), failed]), 0.25);
        assert_eq!(cache_hit_ratio(&[]), 0.0);
    }
}
