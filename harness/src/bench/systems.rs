//! The proxies the overhead bench compares, each started once, in front of the same upstreams.
//!
//! - **llmroute**: Envoy with the filter, rendered from an llmroute config.
//! - **llmroute native**: the same render with the native build (`make native`, Envoy's dynamic-module filter
//!   loading `libllmroute_native.so`) in place of the wasm filter; and **llmroute native bounded_keys**, its
//!   `placement: bounded_keys` row, against which the native build's placement path is measured;
//! - **llmroute bounded_keys**, with and without the placement store: the same render with
//!   `affinity.placement: bounded_keys`; the store variant shares its key table through a 3-member etcd cluster on
//!   loopback, started with it and ready once Envoy sees every member healthy. After the warm-up every prompt
//!   family is a known key, so these rows show placement's steady-state cost against `hash` (the first row);
//! - **plain Envoy**: the same render minus the filter; its route names the cluster statically and hashes the
//!   client's `x-llmroute-affinity` header, so its load balancer does the same work.
//! - **sglang-router** and **vllm-router**: the PyPI wheels, from the venv `.tools/venv` (`$LLMROUTE_VENV`),
//!   with their default `cache_aware` policy, on loopback only.
//!
//! Every proxy can be pinned to a CPU list with `taskset`, and is stopped when its [`System`] is dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::body::{ALIAS, UPSTREAM_MODEL};
use super::upstream::Upstreams;
use crate::envoy::{native_module, pinned_command, random_ports, repo_root, wasm_module, Envoy, EnvoyOptions};
use crate::etcd::EtcdCluster;

/// The chat path every system serves.
pub const CHAT_PATH: &str = "/v1/chat/completions";
/// How long a peer router may take to answer its first chat request.
const PEER_START_LIMIT: Duration = Duration::from_secs(90);

/// Which system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The filter with `placement: hash` (Envoy's CHWBL).
    Llmroute,
    /// The native build (the dynamic module) with `placement: hash`.
    Native,
    PlainEnvoy,
    /// The filter with `placement: bounded_keys`, no store.
    BoundedKeys,
    /// The filter with `placement: bounded_keys` and `placement_store.etcd`.
    BoundedKeysStore,
    /// The native build with `placement: bounded_keys`, no store.
    NativeBoundedKeys,
    Sglang,
    Vllm,
}

impl Kind {
    /// Every system, in the order of each round.
    pub const ALL: [Kind; 8] = [
        Kind::Llmroute,
        Kind::Native,
        Kind::PlainEnvoy,
        Kind::BoundedKeys,
        Kind::BoundedKeysStore,
        Kind::NativeBoundedKeys,
        Kind::Sglang,
        Kind::Vllm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Llmroute => "llmroute (Envoy + filter)",
            Kind::Native => "llmroute native (Envoy + dynamic module)",
            Kind::PlainEnvoy => "plain Envoy",
            Kind::BoundedKeys => "llmroute bounded_keys",
            Kind::BoundedKeysStore => "llmroute bounded_keys + etcd store",
            Kind::NativeBoundedKeys => "llmroute native bounded_keys",
            Kind::Sglang => "sglang-router",
            Kind::Vllm => "vllm-router",
        }
    }

    /// A short name for the plot legend and progress lines.
    pub fn short(self) -> &'static str {
        match self {
            Kind::Llmroute => "llmroute",
            Kind::Native => "native",
            Kind::PlainEnvoy => "plain",
            Kind::BoundedKeys => "bounded",
            Kind::BoundedKeysStore => "bk+etcd",
            Kind::NativeBoundedKeys => "nbounded",
            Kind::Sglang => "sglang",
            Kind::Vllm => "vllm",
        }
    }

    /// True for the native build's rows.
    pub fn is_native(self) -> bool {
        matches!(self, Kind::Native | Kind::NativeBoundedKeys)
    }

    /// True for the rows with `placement: bounded_keys`.
    pub fn is_bounded_keys(self) -> bool {
        matches!(
            self,
            Kind::BoundedKeys | Kind::BoundedKeysStore | Kind::NativeBoundedKeys
        )
    }

    /// The same build with `placement: hash`, which a `bounded_keys` row is measured against.
    pub fn hash_row(self) -> Kind {
        if self.is_native() {
            Kind::Native
        } else {
            Kind::Llmroute
        }
    }
}

/// A running proxy.
pub struct System {
    pub kind: Kind,
    /// The chat URL.
    pub url: String,
    /// The proxy's process, for `/proc`.
    pub pid: u32,
    process: Process,
}

/// What keeps a system under test running; dropping it stops everything.
pub(crate) enum Process {
    /// The Envoys (one, or each replica), then the etcd cluster of their placement store (dropped after them).
    Envoy(Vec<Envoy>, Option<EtcdCluster>),
    /// Held only so that dropping the system kills the router.
    #[allow(dead_code)]
    Peer(Peer),
}

impl Process {
    /// Every Envoy (none for a peer router).
    pub(crate) fn envoys(&self) -> &[Envoy] {
        match self {
            Process::Envoy(e, _) => e,
            Process::Peer(_) => &[],
        }
    }

    /// True for Envoys that share a placement store.
    pub(crate) fn has_store(&self) -> bool {
        matches!(self, Process::Envoy(_, Some(_)))
    }
}

impl System {
    /// Starts `kind` in front of `upstreams`, pinned to `cpus` when given.
    pub async fn start(kind: Kind, upstreams: &Upstreams, cpus: Option<&str>) -> Result<System, String> {
        match kind {
            Kind::Sglang | Kind::Vllm => start_peer(kind, upstreams, cpus).await,
            _ => start_envoy(kind, upstreams, cpus).await,
        }
    }

    /// The Envoy behind this system, if it is one.
    pub fn envoy(&self) -> Option<&Envoy> {
        self.process.envoys().first()
    }
}

/// The llmroute config for the bench: one chwbl backend over `endpoints` (`HOST:PORT`), the alias rewritten.
pub fn bench_config(endpoints: &[String]) -> Value {
    json!({
        "version": 1,
        "backends": [{ "name": "bench", "kind": "llamacpp", "endpoints": endpoints, "lb": "chwbl" }],
        "models": [{ "name": ALIAS, "routes": [{ "backend": "bench", "upstream_model": UPSTREAM_MODEL }] }],
    })
}

/// [`bench_config`] with `placement: bounded_keys`, and the store on `etcd`'s members when given.
pub fn bounded_keys_config(endpoints: &[String], etcd: Option<&[String]>) -> Value {
    let mut config = bench_config(endpoints);
    config["affinity"] = json!({ "placement": "bounded_keys" });
    if let Some(members) = etcd {
        config["affinity"]["placement_store"] = json!({ "etcd": { "endpoints": members, "prefix": "/bench" } });
    }
    config
}

async fn start_envoy(kind: Kind, upstreams: &Upstreams, cpus: Option<&str>) -> Result<System, String> {
    // Each row names its build, whatever `LLMROUTE_BUILD` says.
    let (module, wasm) = match kind.is_native() {
        true => (Some(native_module()), None),
        false => (None, Some(wasm_module())),
    };
    let opts = EnvoyOptions {
        concurrency: 1,
        log_level: "warning".into(),
        with_filter: kind != Kind::PlainEnvoy,
        cpu_list: cpus.map(str::to_string),
        module,
        wasm,
        ..EnvoyOptions::default()
    };
    let etcd = match kind {
        Kind::BoundedKeysStore => Some(EtcdCluster::start().await?),
        _ => None,
    };
    let members = etcd.as_ref().map(EtcdCluster::urls);
    let endpoints = upstreams.endpoints();
    let config = match kind.is_bounded_keys() {
        true => bounded_keys_config(&endpoints, members.as_deref()),
        false => bench_config(&endpoints),
    };
    let envoy = Envoy::start_with(config, opts).await?;
    if let Some(members) = &members {
        wait_store_healthy(&envoy, members.len()).await?;
    }
    if kind.is_bounded_keys() {
        let n = endpoints.len() as u64;
        envoy.wait_snapshot_healthy("bench", n, Duration::from_secs(30)).await?;
    }
    Ok(System {
        kind,
        url: envoy.url(CHAT_PATH),
        pid: envoy.pid(),
        process: Process::Envoy(vec![envoy], etcd),
    })
}

/// Waits until Envoy's placement-store cluster has `n` healthy members, so that new keys reach etcd.
async fn wait_store_healthy(envoy: &Envoy, n: usize) -> Result<(), String> {
    let cluster = llmroute_core::envoy_contract::PLACEMENT_STORE_CLUSTER;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health = envoy.host_health(cluster).await;
        if health.len() == n && health.values().all(|f| f == "healthy") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the etcd members did not all turn healthy in Envoy: {health:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The venv holding the peer routers: `$LLMROUTE_VENV`, else `.tools/venv`.
pub fn venv() -> PathBuf {
    std::env::var_os("LLMROUTE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/venv"))
}

/// The installed version of a Python distribution in the venv, e.g. `sglang-router`.
pub fn peer_version(distribution: &str) -> Option<String> {
    let code = format!("import importlib.metadata as m; print(m.version('{distribution}'))");
    let out = Command::new(venv().join("bin/python"))
        .args(["-c", &code])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A peer router process (sglang-router or vllm-router); killed on drop.
pub(crate) struct Peer {
    pub(crate) child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Peer {
    /// Launches `python -m module` (pinned to `cpus` when given) on loopback `ports` (service, Prometheus) in
    /// front of `worker_urls` with `--policy policy`, its output going to a log in a temporary folder. `name`
    /// names the router in the error if it cannot be started.
    pub(crate) fn spawn(
        python: &Path,
        module: &str,
        cpus: Option<&str>,
        worker_urls: &[String],
        policy: &str,
        (port, metrics_port): (u16, u16),
        name: &str,
    ) -> Result<Peer, String> {
        let log_level = if module.starts_with("sglang") {
            "warn"
        } else {
            "warning"
        };
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let log = dir.path().join("router.log");
        let log_file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let log_err = log_file.try_clone().map_err(|e| e.to_string())?;
        let child = pinned_command(python, cpus)
            .args(["-m", module, "--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--worker-urls")
            .args(worker_urls)
            .args(["--policy", policy, "--log-level", log_level])
            .args([
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                &metrics_port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .spawn()
            .map_err(|e| format!("starting {name}: {e}"))?;
        Ok(Peer { child, log, _dir: dir })
    }

    /// The last `max` bytes of the router's log.
    pub(crate) fn log_tail(&self, max: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = log.len().saturating_sub(max);
        log.get(start..).unwrap_or_default().to_string()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The venv's Python, or an error saying how to install the peer routers.
pub(crate) fn peer_python() -> Result<PathBuf, String> {
    let python = venv().join("bin/python");
    if !python.exists() {
        return Err(format!("{} is missing: run `make bench-peers`", python.display()));
    }
    Ok(python)
}

/// The Python module that launches the peer router `kind`.
pub(crate) fn peer_module(kind: Kind) -> &'static str {
    match kind {
        Kind::Sglang => "sglang_router.launch_router",
        _ => "vllm_router.launch_router",
    }
}

async fn start_peer(kind: Kind, upstreams: &Upstreams, cpus: Option<&str>) -> Result<System, String> {
    let python = peer_python()?;
    let mut last = String::new();
    for attempt in 0..3 {
        let (port, metrics_port) = random_ports(attempt + 100);
        let mut peer = Peer::spawn(
            &python,
            peer_module(kind),
            cpus,
            &upstreams.urls(),
            "cache_aware",
            (port, metrics_port),
            kind.name(),
        )?;
        let url = format!("http://127.0.0.1:{port}{CHAT_PATH}");
        match wait_peer_ready(&mut peer, &url).await {
            Ok(()) => {
                return Ok(System {
                    kind,
                    url,
                    pid: peer.child.id(),
                    process: Process::Peer(peer),
                })
            }
            Err(e) => last = format!("{e}\n--- {} log (tail) ---\n{}", kind.short(), peer.log_tail(2000)),
        }
    }
    Err(last)
}

/// Polls with a small chat request until the router answers 200, exits, or the limit passes.
async fn wait_peer_ready(peer: &mut Peer, url: &str) -> Result<(), String> {
    let client = reqwest::Client::new();
    let body = json!({ "model": ALIAS, "messages": [{ "role": "user", "content": "ready?" }] }).to_string();
    let deadline = Instant::now() + PEER_START_LIMIT;
    loop {
        if let Ok(Some(status)) = peer.child.try_wait() {
            return Err(format!("the router exited with {status} before it answered"));
        }
        let answer = client
            .post(url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send();
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(2), answer).await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("the router did not answer 200 within {PEER_START_LIMIT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
