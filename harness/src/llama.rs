//! Real llama.cpp `llama-server` processes (from `make engines`) for the real-engine tests, the demo and the
//! engine bench.
//!
//! [`LlamaServer::start`] runs `.tools/bin/llama-server -m MODEL --host 127.0.0.1 --port P -c N -np S -t T
//! --metrics --alias NAME -cram 0` on a free loopback port in 20000..30000 (or a fixed one), with its log in a
//! file, and polls `/health` until it answers 200 (it answers 503 while the model loads). The server is killed
//! when dropped, and its log is printed when the owning test panics. `-cram 0` turns off llama.cpp's host-RAM
//! prompt cache, so the only warm prefixes are those in a slot: what a router's affinity keeps warm.
//!
//! [`LlamaFleet`] starts several at once, named `<backend>-0`, `<backend>-1`, ... (the `--alias`, which
//! llama-server reports as `model` in every answer, so a client sees which server answered). The workload
//! helpers (prompts, a streamed chat with its engine-reported cache figures) are in [`workload`].

pub mod workload;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::envoy::repo_root;

/// The server binary: `$LLMROUTE_LLAMA_SERVER`, else `.tools/bin/llama-server`.
pub fn llama_server_binary() -> PathBuf {
    std::env::var_os("LLMROUTE_LLAMA_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/bin/llama-server"))
}

/// The tiny random-weight model `make engines` writes.
pub fn tiny_model() -> PathBuf {
    repo_root().join(".tools/models/tiny-llama.gguf")
}

/// The vocab-only GGUF `make engines` copies from llama.cpp (the tokenizer of [`tiny_model`]).
pub fn vocab() -> PathBuf {
    repo_root().join(".tools/models/ggml-vocab-llama-spm.gguf")
}

/// Fails with a hint to run `make engines` when the binary or the model is missing. Never skips.
pub fn check_installed() -> Result<(), String> {
    for need in [llama_server_binary(), tiny_model()] {
        if !need.exists() {
            return Err(format!("{} is missing: run `make engines`", need.display()));
        }
    }
    Ok(())
}

/// How to start one server.
#[derive(Debug, Clone)]
pub struct LlamaOptions {
    /// `--alias`: the `model` of every answer.
    pub alias: String,
    /// `-m`. Default [`tiny_model`].
    pub model: PathBuf,
    /// `-c`: the context of all slots together (each slot gets `ctx / parallel`). Default 8192.
    pub ctx: u32,
    /// `-np`: slots, i.e. requests served at once. Default 2.
    pub parallel: u32,
    /// `-t`: threads. Default 1.
    pub threads: u32,
    /// A fixed port; `None` picks a free one in 20000..30000.
    pub port: Option<u16>,
    /// More arguments, appended last.
    pub extra_args: Vec<String>,
    /// How long `/health` may take to answer 200. Default 60 s.
    pub ready_limit: Duration,
}

impl LlamaOptions {
    pub fn new(alias: &str) -> Self {
        LlamaOptions {
            alias: alias.to_string(),
            model: tiny_model(),
            ctx: 8192,
            parallel: 2,
            threads: 1,
            port: None,
            extra_args: Vec::new(),
            ready_limit: Duration::from_secs(60),
        }
    }
}

/// A running `llama-server`. Killed on drop.
pub struct LlamaServer {
    child: Child,
    opts: LlamaOptions,
    port: u16,
    log_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl LlamaServer {
    /// Starts a server and waits until `/health` says it is ready. A free port that another process takes
    /// first is retried on another port (5 attempts); with a fixed port, a bind failure is an error.
    pub async fn start(opts: LlamaOptions) -> Result<LlamaServer, String> {
        check_installed()?;
        let mut last = String::new();
        for _ in 0..5 {
            let port = match opts.port {
                Some(p) => p,
                None => free_port()?,
            };
            let mut server = Self::spawn(&opts, port)?;
            match server.wait_healthy(opts.ready_limit).await {
                Ok(()) => return Ok(server),
                Err(log) if opts.port.is_none() && lost_port_race(&log) => last = log,
                Err(log) => return Err(log),
            }
        }
        Err(format!("llama-server could not bind a port in 5 attempts:\n{last}"))
    }

    /// Starts a server on `port` without waiting for it to be ready (see [`LlamaServer::wait_healthy`]).
    pub fn spawn(opts: &LlamaOptions, port: u16) -> Result<LlamaServer, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let log_path = dir.path().join("llama-server.log");
        let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let log_err = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(llama_server_binary())
            .arg("-m")
            .arg(&opts.model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-c", &opts.ctx.to_string(), "-np", &opts.parallel.to_string()])
            .args(["-t", &opts.threads.to_string()])
            .args(["--metrics", "--alias", &opts.alias, "-cram", "0"])
            .args(&opts.extra_args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", llama_server_binary().display()))?;
        Ok(LlamaServer {
            child,
            opts: opts.clone(),
            port,
            log_path,
            _dir: dir,
        })
    }

    /// Polls `/health` until 200 (503 while the model loads). On an exit or a timeout, the error holds the log.
    pub async fn wait_healthy(&mut self, limit: Duration) -> Result<(), String> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "llama-server {} exited with {status}. Its log:\n{}",
                    self.opts.alias,
                    self.log()
                ));
            }
            if let Ok(r) = client.get(self.url("/health")).send().await {
                if r.status() == reqwest::StatusCode::OK {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(format!(
            "llama-server {} was not healthy within {limit:?}. Its log:\n{}",
            self.opts.alias,
            self.log()
        ))
    }

    pub fn alias(&self) -> &str {
        &self.opts.alias
    }

    pub fn options(&self) -> &LlamaOptions {
        &self.opts
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `127.0.0.1:PORT`, for an llmroute config's `endpoints`.
    pub fn endpoint(&self) -> String {
        self.addr().to_string()
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Kills the server now (SIGKILL, as a crash would) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "----- llama-server {} log (port {}) -----\n{}\n----- end of llama-server log -----",
                self.opts.alias,
                self.port,
                self.log()
            );
        }
    }
}

fn lost_port_race(log: &str) -> bool {
    log.contains("bind") || log.contains("Address already in use")
}

/// A port in 20000..30000 that was free a moment ago. Successive calls in one process start their search at
/// different places, so concurrent starts rarely pick the same port (a start that does is retried).
pub fn free_port() -> Result<u16, String> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let start = (std::process::id().wrapping_mul(7919) + n.wrapping_mul(613)) % 10_000;
    (0..10_000u32)
        .map(|i| 20_000 + ((start + i) % 10_000) as u16)
        .find(|&p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        .ok_or_else(|| "no free port in 20000..30000".to_string())
}

/// Servers `<backend>-0`, `<backend>-1`, ... for one llmroute backend.
pub struct LlamaFleet {
    pub backend: String,
    pub servers: Vec<LlamaServer>,
}

impl LlamaFleet {
    /// Starts `n` servers at once with the default options; `tune(i, opts)` adjusts server `i`'s.
    pub async fn start(backend: &str, n: usize, tune: impl Fn(usize, &mut LlamaOptions)) -> Result<LlamaFleet, String> {
        check_installed()?;
        let starts = (0..n).map(|i| {
            let mut opts = LlamaOptions::new(&format!("{backend}-{i}"));
            tune(i, &mut opts);
            LlamaServer::start(opts)
        });
        let servers = futures_util::future::join_all(starts)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, String>>()?;
        Ok(LlamaFleet {
            backend: backend.to_string(),
            servers,
        })
    }

    /// `["127.0.0.1:P", ...]` for the config.
    pub fn endpoints(&self) -> Vec<String> {
        self.servers.iter().map(LlamaServer::endpoint).collect()
    }

    /// The server whose alias is `model` (what an answer reports), by index.
    pub fn index_of(&self, model: &str) -> Option<usize> {
        self.servers.iter().position(|s| s.alias() == model)
    }

    /// A `llamacpp` backend entry for this fleet with load balancer `lb` (`chwbl`, `least_request`,
    /// `round_robin`).
    pub fn backend_entry(&self, lb: &str) -> Value {
        json!({ "name": self.backend, "kind": "llamacpp", "endpoints": self.endpoints(), "lb": lb })
    }

    /// A one-backend llmroute config: alias `alias` to this fleet, with `lb`.
    pub fn config(&self, alias: &str, lb: &str) -> Value {
        json!({
            "version": 1,
            "backends": [self.backend_entry(lb)],
            "models": [{ "name": alias, "routes": [{ "backend": self.backend }] }],
            "affinity": { "session_headers": ["x-session-id"] },
            "debug_headers": true,
        })
    }
}
