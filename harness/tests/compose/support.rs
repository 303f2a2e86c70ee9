//! What both container checks share: an Envoy of the stack reached through its published ports, chat traffic that
//! records every answer, and polling.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llmroute_harness::compose::Stack;
use serde_json::{json, Value};

pub const ALIAS: &str = "local-chat";
const CHAT: &str = "/v1/chat/completions";

/// The image and port variables both compose files read: the local images (`make images`), every port left to
/// Docker.
pub const LOCAL: [(&str, &str); 12] = [
    ("ENVOY_IMAGE", "llmroute/envoy:dev"),
    ("LLAMA_IMAGE", "llmroute/llama-server:dev"),
    ("PROMETHEUS_IMAGE", "llmroute/prometheus:dev"),
    ("ETCD_IMAGE", "llmroute/etcd:dev"),
    ("LLMROUTE_IMAGE", "llmroute/llmroute:dev"),
    ("ENVOY_PORT", ""),
    ("ENVOY_ADMIN_PORT", ""),
    ("PROMETHEUS_PORT", ""),
    ("ENVOY_0_PORT", ""),
    ("ENVOY_0_ADMIN_PORT", ""),
    ("ENVOY_1_PORT", ""),
    ("ENVOY_1_ADMIN_PORT", ""),
];

/// Starts `file` with the local images under a fresh project name.
pub fn start(file: &str, name: &str) -> Stack {
    let stack = Stack::new(file, name, &LOCAL).unwrap_or_else(|e| panic!("{e}"));
    println!("{name}: project {}", stack.project());
    stack.up().unwrap_or_else(|e| panic!("{e}"));
    stack
}

/// Takes the stack down and checks that nothing of it is left.
pub fn take_down(stack: Stack) {
    let project = stack.project().to_string();
    stack.down().unwrap_or_else(|e| panic!("{e}"));
    println!("{project}: down; no container, network or volume left");
}

/// An Envoy of the stack, through the host ports Docker published its listener (10000) and admin (9901) on.
#[derive(Clone)]
pub struct Envoy {
    pub service: String,
    listen: u16,
    admin: u16,
}

impl Envoy {
    pub fn of(stack: &Stack, service: &str) -> Envoy {
        let port = |p| stack.host_port(service, p).unwrap_or_else(|e| panic!("{e}"));
        Envoy {
            service: service.to_string(),
            listen: port(10000),
            admin: port(9901),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.listen)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin)
    }

    async fn admin_text(&self, path: &str) -> String {
        match client().get(self.admin_url(path)).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Waits until the admin's `/ready` says `LIVE`.
    pub async fn wait_ready(&self, limit: Duration) {
        let ready = wait_for(limit, || async { self.admin_text("/ready").await.trim() == "LIVE" }).await;
        assert!(ready.is_some(), "{}: not ready within {limit:?}", self.service);
    }

    /// The health flags of each host of `cluster`, keyed by `IP:PORT` (`healthy`, or flags such as
    /// `/failed_active_hc`).
    pub async fn hosts(&self, cluster: &str) -> BTreeMap<String, String> {
        let text = self.admin_text("/clusters").await;
        let prefix = format!("{cluster}::");
        text.lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|l| l.split_once("::health_flags::"))
            .map(|(host, flags)| (host.to_string(), flags.trim().to_string()))
            .collect()
    }

    /// The healthy hosts of `cluster`.
    pub async fn healthy(&self, cluster: &str) -> BTreeSet<String> {
        self.hosts(cluster)
            .await
            .into_iter()
            .filter(|(_, flags)| flags == "healthy")
            .map(|(h, _)| h)
            .collect()
    }

    /// Waits until `cluster` has exactly `n` healthy hosts; returns them.
    pub async fn wait_healthy(&self, cluster: &str, n: usize, limit: Duration) -> BTreeSet<String> {
        let start = Instant::now();
        loop {
            let hosts = self.hosts(cluster).await;
            let healthy: BTreeSet<String> = hosts
                .iter()
                .filter(|(_, f)| *f == "healthy")
                .map(|(h, _)| h.clone())
                .collect();
            if healthy.len() == n {
                return healthy;
            }
            assert!(
                start.elapsed() < limit,
                "{}: {cluster} did not have {n} healthy hosts within {limit:?}: {hosts:?}",
                self.service
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One counter from the admin `/stats`, by exact name (a labelled filter metric by its full name).
    pub async fn stat(&self, name: &str) -> u64 {
        let stem = name.split(';').next().unwrap_or(name);
        let text = self
            .admin_text(&format!("/stats?filter=^{}", stem.replace('.', "\\.")))
            .await;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Sends one short chat whose affinity key is the session `key`.
    pub async fn chat(&self, c: &reqwest::Client, key: &str) -> Answer {
        let body = json!({
            "model": ALIAS,
            "messages": [{"role": "user", "content": format!("hello from {key}")}],
            "max_tokens": 4,
        });
        let sent = c
            .post(self.url(CHAT))
            .header("content-type", "application/json")
            .header("x-session-id", key)
            .body(body.to_string())
            .send()
            .await;
        match sent {
            Ok(r) => {
                let status = r.status().as_u16();
                let placement = r
                    .headers()
                    .get("x-llmroute-placement")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let text = r.text().await.unwrap_or_default();
                let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                Answer {
                    status: Some(status),
                    engine: body["model"].as_str().unwrap_or("").to_string(),
                    placement,
                    error: if status == 200 { String::new() } else { text },
                }
            }
            Err(e) => Answer {
                status: None,
                engine: String::new(),
                placement: None,
                error: e.to_string(),
            },
        }
    }
}

/// What one chat got back: every llama-server answers with `model` set to its `--alias`, so `engine` names the
/// engine that served it.
#[derive(Debug, Clone)]
pub struct Answer {
    /// `None`: no HTTP answer at all.
    pub status: Option<u16>,
    pub engine: String,
    /// `x-llmroute-placement` (`bounded_keys` only): `placed`, `pinned` or `spilled`.
    pub placement: Option<String>,
    pub error: String,
}

impl Answer {
    pub fn ok(&self) -> bool {
        self.status == Some(200) && !self.engine.is_empty()
    }

    /// The engine that holds the key: the one that served it, unless the request spilled off the key's host.
    pub fn placed_on(&self) -> Option<&str> {
        (self.ok() && self.placement.as_deref() != Some("spilled")).then_some(self.engine.as_str())
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        // Above the stacks' 30 s per-try timeout: a try stuck on a cut-off engine is retried, never timed out here.
        .timeout(Duration::from_secs(90))
        .build()
        .unwrap_or_default()
}

/// One request of a [`Traffic`] run.
#[derive(Debug, Clone)]
pub struct Sent {
    /// When it was sent.
    pub at: Instant,
    pub key: String,
    pub envoy: String,
    pub answer: Answer,
}

/// Chats sent without pause by `concurrency` workers, each to the next Envoy and the next key in turn, until
/// stopped; every answer is kept.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<Sent>>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    pub fn start(envoys: &[Envoy], keys: &[String], concurrency: usize) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let workers = (0..concurrency)
            .map(|w| {
                let (stop, sent) = (stop.clone(), sent.clone());
                let (envoys, keys) = (envoys.to_vec(), keys.to_vec());
                tokio::spawn(async move {
                    let c = client();
                    let mut n = w;
                    while !stop.load(Ordering::Relaxed) {
                        let envoy = &envoys[n % envoys.len()];
                        let key = &keys[(n / envoys.len()) % keys.len()];
                        let at = Instant::now();
                        let answer = envoy.chat(&c, key).await;
                        if let Ok(mut s) = sent.lock() {
                            s.push(Sent {
                                at,
                                key: key.clone(),
                                envoy: envoy.service.clone(),
                                answer,
                            });
                        }
                        n += concurrency;
                    }
                })
            })
            .collect();
        Traffic { stop, sent, workers }
    }

    /// The requests answered so far.
    pub fn sent(&self) -> Vec<Sent> {
        self.sent.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits until `done` holds for the requests answered so far; panics after `limit`, naming `what`.
    pub async fn wait(&self, what: &str, limit: Duration, done: impl Fn(&[Sent]) -> bool) -> Duration {
        let took = wait_for(limit, || async { done(&self.sent()) }).await;
        took.unwrap_or_else(|| {
            let sent = self.sent();
            panic!(
                "traffic: {what} did not happen within {limit:?}; {} requests, last: {:?}",
                sent.len(),
                sent.last()
            )
        })
    }

    /// Waits until `n` more requests sent after `since` were answered.
    pub async fn more(&self, since: Instant, n: usize) {
        self.wait(&format!("{n} answers after the change"), Duration::from_secs(60), |s| {
            s.iter().filter(|x| x.at >= since).count() >= n
        })
        .await;
    }

    /// Stops the workers once their requests in flight are answered; every request sent.
    pub async fn stop(mut self) -> Vec<Sent> {
        self.stop.store(true, Ordering::Relaxed);
        for w in std::mem::take(&mut self.workers) {
            let _ = w.await;
        }
        self.sent()
    }
}

/// The requests that did not get a 200 from an engine, described.
pub fn failures(sent: &[Sent]) -> Vec<String> {
    sent.iter()
        .filter(|s| !s.answer.ok())
        .map(|s| format!("{} via {}: {:?} {}", s.key, s.envoy, s.answer.status, s.answer.error))
        .collect()
}

/// Requests per engine.
pub fn per_engine(sent: &[Sent]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for s in sent.iter().filter(|s| s.answer.ok()) {
        *m.entry(s.answer.engine.clone()).or_insert(0) += 1;
    }
    m
}

/// Polls `check` every 100 ms until it holds or `limit` passes; how long it took, or `None`.
pub async fn wait_for<F, Fut>(limit: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// `n` session keys named after `prefix`.
pub fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}
