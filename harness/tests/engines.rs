//! Proves `make engines` works: the built `llama-server` serves the tiny model written by `llmroute-gguf`.
//!
//! Each test starts a real `llama-server` on loopback (a free port in 20000..30000, `--alias` set), polls
//! `/health` until it answers 200 (503 while loading), and talks to it over HTTP:
//! - chat completions, plain and streamed, answer with `model` equal to the alias;
//! - the same ~1k-token prompt sent twice shows the engine's own `timings.cache_n` > 0 the second time;
//! - the prefill time of a ~1.5k-token prompt is measured and printed (never asserted: times depend on the machine).
//!
//! A missing binary or model fails the test with a hint to run `make engines`; it never skips. The server is killed
//! on drop, and its log (kept in a file) is printed when a test fails. Run with `make engines-check`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use llmroute_harness::envoy::repo_root;
use serde_json::{json, Value};

fn llama_server_binary() -> PathBuf {
    repo_root().join(".tools/bin/llama-server")
}

fn tiny_model() -> PathBuf {
    repo_root().join(".tools/models/tiny-llama.gguf")
}

/// A running `llama-server`, killed on drop.
struct LlamaServer {
    child: Child,
    port: u16,
    alias: String,
    log_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl LlamaServer {
    /// Starts a server for the tiny model and waits until `/health` says it is ready.
    async fn start(alias: &str, threads: u32) -> LlamaServer {
        for need in [llama_server_binary(), tiny_model()] {
            assert!(need.exists(), "{} is missing: run `make engines`", need.display());
        }
        let mut last_log = String::new();
        for attempt in 0..5 {
            let mut server = Self::spawn(alias, threads, free_port(attempt));
            match server.wait_healthy(Duration::from_secs(60)).await {
                Ok(()) => return server,
                Err(log) if log.contains("bind") => last_log = log,
                Err(log) => panic!("llama-server did not start:\n{log}"),
            }
        }
        panic!("llama-server could not bind a port in 5 attempts:\n{last_log}");
    }

    fn spawn(alias: &str, threads: u32, port: u16) -> LlamaServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let log_path = dir.path().join("llama-server.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let child = Command::new(llama_server_binary())
            .arg("-m")
            .arg(tiny_model())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-c", "8192", "-np", "2", "-t", &threads.to_string()])
            .args(["--metrics", "--alias", alias, "-cram", "0"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("starting llama-server");
        LlamaServer {
            child,
            port,
            alias: alias.to_string(),
            log_path,
            _dir: dir,
        }
    }

    /// Polls `/health` until 200; on exit or timeout returns the server's log.
    async fn wait_healthy(&mut self, limit: Duration) -> Result<(), String> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("llama-server exited with {status}. Its log:\n{}", self.log()));
            }
            if let Ok(r) = client.get(self.url("/health")).send().await {
                if r.status() == reqwest::StatusCode::OK {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "llama-server was not healthy within {limit:?}. Its log:\n{}",
            self.log()
        ))
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "----- llama-server log (port {}) -----\n{}\n----- end -----",
                self.port,
                self.log()
            );
        }
    }
}

/// A port in 20000..30000 that was free a moment ago, different per process and attempt.
fn free_port(attempt: u16) -> u16 {
    let start = 20000 + (std::process::id() as u16 % 1000) * 10 + attempt * 7;
    (0..10000)
        .map(|i| 20000 + (start - 20000 + i) % 10000)
        .find(|&p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        .expect("a free port in 20000..30000")
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .expect("http client")
}

/// Deterministic English-like text of `words` words; about one Llama SPM token per word.
fn prompt_text(seed: u64, words: usize) -> String {
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

/// A non-streamed chat completion; returns the response body.
async fn chat(server: &LlamaServer, text: &str, max_tokens: u32) -> Value {
    let body = json!({
        "model": "anything",
        "messages": [{ "role": "user", "content": text }],
        "max_tokens": max_tokens,
    });
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("POST");
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    resp.json().await.expect("JSON body")
}

fn timing(resp: &Value, field: &str) -> f64 {
    resp["timings"][field]
        .as_f64()
        .unwrap_or_else(|| panic!("no timings.{field} in {resp}"))
}

#[tokio::test]
async fn chat_answers_with_the_alias_plain_and_streamed() {
    let server = LlamaServer::start("tiny-a", 1).await;
    let resp = chat(&server, "Say hello.", 8).await;
    assert_eq!(resp["model"], server.alias);
    assert_eq!(resp["object"], "chat.completion");
    assert!(resp["usage"]["completion_tokens"].as_u64().unwrap() >= 1, "{resp}");

    let body = json!({
        "model": "anything",
        "messages": [{ "role": "user", "content": "Say hello." }],
        "max_tokens": 8,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = resp.text().await.unwrap();
    let events: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks.len() >= 2, "{text}");
    assert!(chunks.iter().all(|c| c["model"] == server.alias), "{text}");
    assert!(
        chunks.iter().any(|c| c["usage"]["prompt_tokens"].as_u64().is_some()),
        "{text}"
    );
    println!("streamed {} chunks from {}", chunks.len(), server.alias);
}

#[tokio::test]
async fn a_repeated_prompt_hits_the_engine_prompt_cache() {
    let server = LlamaServer::start("tiny-cache", 1).await;
    let prompt = prompt_text(7, 1000);
    let first = chat(&server, &prompt, 4).await;
    let second = chat(&server, &prompt, 4).await;
    let (n1, c1, c2) = (
        timing(&first, "prompt_n"),
        timing(&first, "cache_n"),
        timing(&second, "cache_n"),
    );
    println!(
        "same ~1k-token prompt twice: first prompt_n={n1} cache_n={c1} prompt_ms={:.1}; \
         second prompt_n={} cache_n={c2} prompt_ms={:.1}",
        timing(&first, "prompt_ms"),
        timing(&second, "prompt_n"),
        timing(&second, "prompt_ms"),
    );
    assert!(n1 >= 800.0, "the prompt is about 1k tokens: {first}");
    assert_eq!(c1, 0.0, "a fresh server has nothing cached: {first}");
    assert!(c2 > 0.0, "the repeat reuses the cache: {second}");
    let cached = &second["usage"]["prompt_tokens_details"]["cached_tokens"];
    println!("second usage.prompt_tokens_details.cached_tokens = {cached}");

    let metrics = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("llamacpp:prompt_tokens_total"), "{metrics}");
}

#[tokio::test]
async fn prefill_of_a_1_5k_token_prompt_is_measured() {
    for threads in [1, 2] {
        let server = LlamaServer::start("tiny-prefill", threads).await;
        chat(&server, &prompt_text(100, 1500), 1).await; // warms the server up
        let mut runs = Vec::new();
        for seed in 1..=5 {
            let resp = chat(&server, &prompt_text(100 + seed, 1500), 1).await;
            runs.push((timing(&resp, "prompt_n"), timing(&resp, "prompt_ms")));
        }
        runs.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (n, median) = runs[runs.len() / 2];
        println!(
            "prefill with -t {threads}: {n} tokens, median {median:.1} ms, min {:.1} ms over {} cold prompts \
             (load average {})",
            runs[0].1,
            runs.len(),
            load_average(),
        );
        assert!(
            runs.iter().all(|r| (1300.0..=1800.0).contains(&r.0)),
            "about 1.5k tokens: {runs:?}"
        );
    }
}

/// The 1-minute load average, to read timings against.
fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().next().unwrap_or("?").to_string()
}
