//! Starts a real Envoy with the real compiled filter, for tests, benches and the demo.
//!
//! The launcher takes an llmroute config document (as a JSON value), puts fresh listen and admin ports in it,
//! validates it with the same validator the filter uses, renders it with `render`, and starts
//! `.tools/bin/envoy`. It polls the admin `/ready` endpoint instead of sleeping. Ports are drawn from 10000 to
//! 30000, below the kernel's ephemeral range, and a start that loses a port race is retried on new ports.
//! Envoy's log is kept in a file and printed when the owning test panics; Envoy is killed on drop.
//! [`Envoy::start_bootstrap`] starts a bootstrap written elsewhere (a hand-written config, an ECDS bootstrap)
//! the same way.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::render::{bootstrap, bootstrap_yaml, RenderOptions};

/// The repository root, where `.tools/` and `target/` live.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Envoy binary: `$LLMROUTE_ENVOY`, else `.tools/bin/envoy`.
pub fn envoy_binary() -> PathBuf {
    std::env::var_os("LLMROUTE_ENVOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/bin/envoy"))
}

/// The filter module: `$LLMROUTE_WASM`, else the release build.
pub fn wasm_module() -> PathBuf {
    std::env::var_os("LLMROUTE_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/wasm32-wasip1/release/llmroute_filter.wasm"))
}

/// The test-only module that traps on a request header (`make build-trap`, feature `test-trap`).
pub fn trap_wasm_module() -> PathBuf {
    repo_root().join("target/wasm32-wasip1/release/llmroute_filter_trap.wasm")
}

/// The build the suite runs: `$LLMROUTE_BUILD` is `wasm` (default) or `native` (the dynamic module,
/// `make native`). With `native`, every test that does not name its own module loads [`native_module`].
pub fn native_build() -> bool {
    std::env::var("LLMROUTE_BUILD").is_ok_and(|b| b == "native")
}

/// What Envoy's `/stats/prometheus` puts before a filter metric's name on the native build: Envoy 1.40 does not
/// strip the dynamic modules' stats namespace as it strips the wasm one.
pub const NATIVE_PROMETHEUS_PREFIX: &str = "envoy_dynamicmodulescustom_";

/// A filter stat's name on the native build, from its wasm name: `wasmcustom.<metric>;<label>=<value>...` is
/// `dynamicmodulescustom.<metric>.<label>.<value>...` (the dynamic module's stats carry their labels as tags;
/// `/stats/prometheus` shows both builds' stats alike). `None` for a name that is not the filter's.
pub fn native_stat(name: &str) -> Option<String> {
    let rest = name.strip_prefix("wasmcustom.")?;
    let mut out = String::from("dynamicmodulescustom");
    for part in rest.split(';') {
        out.push('.');
        out.push_str(&part.replacen('=', ".", 1));
    }
    Some(out)
}

/// The native build: `$LLMROUTE_NATIVE`, else `make native`'s output.
pub fn native_module() -> PathBuf {
    std::env::var_os("LLMROUTE_NATIVE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/release/libllmroute_native.so"))
}

/// The test-only native build that panics on a request header (`make native-trap`, feature `test-trap`).
pub fn trap_native_module() -> PathBuf {
    repo_root().join("target/release/libllmroute_native_trap.so")
}

/// The bench-only native build whose later phases [`BENCH_PHASE_ENV`] switches off (`make native-phases`, feature
/// `bench-phases`).
pub fn phases_native_module() -> PathBuf {
    repo_root().join("target/release/libllmroute_native_phases.so")
}

pub use llmroute_core::envoy_contract::BENCH_PHASE_ENV;

/// The bench-only module whose later phases a VM configuration switches off (`make build-phases`, feature
/// `bench-phases`).
pub fn phases_wasm_module() -> PathBuf {
    repo_root().join("target/wasm32-wasip1/release/llmroute_filter_phases.wasm")
}

/// Sets every wasm VM's configuration to `vm_configuration`, and, given `cluster`, makes every route name it
/// instead of reading the filter's cluster header.
fn bench_edit(v: &mut Value, vm_configuration: Option<&str>, cluster: Option<&str>) {
    match v {
        Value::Object(map) => {
            if let (Some(cluster), Some(_)) = (cluster, map.remove("cluster_header")) {
                map.insert("cluster".into(), Value::from(cluster));
            }
            if let (Some(text), Some(Value::Object(vm))) = (vm_configuration, map.get_mut("vm_config")) {
                let value =
                    serde_json::json!({ "@type": "type.googleapis.com/google.protobuf.StringValue", "value": text });
                vm.insert("configuration".into(), value);
            }
            map.values_mut().for_each(|x| bench_edit(x, vm_configuration, cluster));
        }
        Value::Array(items) => items.iter_mut().for_each(|x| bench_edit(x, vm_configuration, cluster)),
        _ => {}
    }
}

/// How to start Envoy.
#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    /// Worker threads. Default 2, so the filter runs in more than one VM.
    pub concurrency: u32,
    /// Envoy's log level. Default `info`.
    pub log_level: String,
    /// Fixed listen/admin addresses instead of random ports (the demo uses this).
    pub fixed_ports: bool,
    /// Load the llmroute filter. Default true; false renders plain Envoy (see [`RenderOptions::with_filter`]).
    pub with_filter: bool,
    /// Pin Envoy to these CPUs (`taskset -c LIST`), e.g. `"0"`. Default none.
    pub cpu_list: Option<String>,
    /// Extra environment variables for the Envoy process only, e.g. the tokens that backends' `credential_env`
    /// names. Default none. They are passed to the process, never written to a file.
    pub env: Vec<(String, String)>,
    /// The filter module to load instead of [`wasm_module`] (the trap tests use [`trap_wasm_module`]).
    pub wasm: Option<PathBuf>,
    /// The native build to load instead of any wasm module (see [`native_module`]). Default none, or
    /// [`native_module`] when [`native_build`] and `wasm` is none.
    pub module: Option<PathBuf>,
    /// The wasm VM's configuration (`vm_config.configuration`), which only a bench build reads: the last phase
    /// of [`phases_wasm_module`] to run. Default none.
    pub vm_configuration: Option<String>,
    /// Route every request to the first backend's cluster, as plain Envoy does, even with the filter. The phase
    /// bench uses it, since a filter stopped before its headers phase names no cluster. Default false.
    pub static_route: bool,
    /// Run Envoy under this command (its program and arguments, Envoy's path appended), e.g. valgrind; it must
    /// keep Envoy's pid (exec it or run it in process). Envoy is given 10 times longer to become ready. Default
    /// none.
    pub wrapper: Vec<String>,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            concurrency: 2,
            log_level: "info".into(),
            fixed_ports: false,
            with_filter: true,
            cpu_list: None,
            env: Vec::new(),
            wasm: None,
            module: None,
            vm_configuration: None,
            static_route: false,
            wrapper: Vec::new(),
        }
    }
}

/// A running Envoy. Killed on drop.
pub struct Envoy {
    child: Child,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    log_path: PathBuf,
    bootstrap_path: PathBuf,
    /// It runs the native build: the filter's stats have their native names (see [`Envoy::stat`]).
    native: bool,
    _dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy for `config` (an llmroute document) with random ports.
    pub async fn start(config: Value) -> Result<Envoy, String> {
        Self::start_with(config, EnvoyOptions::default()).await
    }

    pub async fn start_with(config: Value, opts: EnvoyOptions) -> Result<Envoy, String> {
        let mut last_err = String::new();
        for attempt in 0..5 {
            let mut doc = config.clone();
            if !opts.fixed_ports {
                let (listen, admin) = random_ports(attempt);
                doc["listen"] = Value::from(format!("127.0.0.1:{listen}"));
                doc["admin"] = Value::from(format!("127.0.0.1:{admin}"));
            }
            match Self::start_once(&doc, &opts).await {
                Ok(envoy) => return Ok(envoy),
                Err(StartError::PortTaken(log)) if !opts.fixed_ports => last_err = log,
                Err(StartError::PortTaken(log) | StartError::Failed(log)) => return Err(log),
            }
        }
        Err(format!("Envoy could not bind ports after 5 attempts:\n{last_err}"))
    }

    async fn start_once(doc: &Value, opts: &EnvoyOptions) -> Result<Envoy, StartError> {
        let text = doc.to_string();
        let cfg =
            llmroute_core::load_document(&text).map_err(|e| StartError::Failed(format!("invalid config:\n{e}")))?;
        let module = match (&opts.module, &opts.wasm) {
            (Some(m), _) => Some(m.clone()),
            (None, None) if native_build() => Some(native_module()),
            _ => None,
        };
        let wasm = opts.wasm.clone().unwrap_or_else(wasm_module);
        let (file, make) = match &module {
            Some(m) => (m, "`make native` (and `make native-trap` for the panic test)"),
            None => (&wasm, "`make build` (and `make build-trap` for the trap tests)"),
        };
        if !file.exists() {
            return Err(StartError::Failed(format!("{} is missing: run {make}", file.display())));
        }
        let mut render = RenderOptions::new(wasm.display().to_string());
        render.module_path = module.map(|m| m.display().to_string());
        render.with_filter = opts.with_filter;
        let yaml = if opts.vm_configuration.is_some() || opts.static_route {
            let mut v = bootstrap(&cfg, &text, &render).map_err(StartError::Failed)?;
            let first = cfg.backends.first().map(|b| b.name.as_str()).unwrap_or_default();
            bench_edit(
                &mut v,
                opts.vm_configuration.as_deref(),
                opts.static_route.then_some(first),
            );
            // YAML is a superset of JSON: Envoy reads the JSON text from its `.yaml` file as it is.
            v.to_string()
        } else {
            bootstrap_yaml(&cfg, &text, &render).map_err(StartError::Failed)?
        };
        Self::spawn(&yaml, cfg.render_only.listen, cfg.admin, opts).await
    }

    /// Starts Envoy from a bootstrap text that `make(listen_port, admin_port)` writes (a hand-written config
    /// with its ports filled in), on random ports, retried on a port race like [`Envoy::start_with`]. Envoy must
    /// listen on 127.0.0.1 at both ports.
    pub async fn start_bootstrap(make: impl Fn(u16, u16) -> String, opts: EnvoyOptions) -> Result<Envoy, String> {
        let mut last_err = String::new();
        for attempt in 0..5 {
            let (listen, admin) = random_ports(attempt);
            let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
            match Self::spawn(&make(listen, admin), at(listen), at(admin), &opts).await {
                Ok(envoy) => return Ok(envoy),
                Err(StartError::PortTaken(log)) => last_err = log,
                Err(StartError::Failed(log)) => return Err(log),
            }
        }
        Err(format!("Envoy could not bind ports after 5 attempts:\n{last_err}"))
    }

    async fn spawn(
        yaml: &str,
        listen: SocketAddr,
        admin: SocketAddr,
        opts: &EnvoyOptions,
    ) -> Result<Envoy, StartError> {
        let envoy = envoy_binary();
        if !envoy.exists() {
            return Err(StartError::Failed(format!(
                "{} is missing: run `make envoy`",
                envoy.display()
            )));
        }
        let dir = tempfile::tempdir().map_err(|e| StartError::Failed(e.to_string()))?;
        let bootstrap = dir.path().join("envoy.yaml");
        let log_path = dir.path().join("envoy.log");
        std::fs::write(&bootstrap, yaml).map_err(|e| StartError::Failed(e.to_string()))?;
        let mut command = match opts.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = pinned_command(Path::new(program), opts.cpu_list.as_deref());
                c.args(args).arg(&envoy);
                c
            }
            None => pinned_command(&envoy, opts.cpu_list.as_deref()),
        };
        let child = command
            .arg("-c")
            .arg(&bootstrap)
            .args(["--concurrency", &opts.concurrency.to_string()])
            .args(["--log-level", &opts.log_level])
            .arg("--log-path")
            .arg(&log_path)
            // Envoy flushes its log file every 10 s by default; tests read it while Envoy runs.
            .args(["--file-flush-interval-msec", "100"])
            .arg("--disable-hot-restart")
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| StartError::Failed(format!("starting {}: {e}", envoy.display())))?;
        let mut envoy = Envoy {
            child,
            listen,
            admin,
            log_path,
            bootstrap_path: bootstrap,
            native: yaml.contains("dynamic_modules.v3.DynamicModuleFilter"),
            _dir: dir,
        };
        let slower = if opts.wrapper.is_empty() { 1 } else { 10 };
        envoy.wait_ready(Duration::from_secs(60 * slower)).await?;
        Ok(envoy)
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<(), StartError> {
        let client = reqwest::Client::new();
        let url = format!("http://{}/ready", self.admin);
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = self.log();
                let msg = format!("Envoy exited with {status} before it was ready. Its log:\n{log}");
                return Err(
                    if log.contains("Address already in use") || log.contains("cannot bind") {
                        StartError::PortTaken(msg)
                    } else {
                        StartError::Failed(msg)
                    },
                );
            }
            if let Ok(r) = client.get(&url).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(StartError::Failed(format!(
                    "Envoy was not ready within {limit:?}. Its log:\n{}",
                    self.log()
                )));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Envoy's process id (for `/proc/<pid>/...`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True when it runs the native build (the dynamic-module filter).
    pub fn runs_native(&self) -> bool {
        self.native
    }

    /// `http://127.0.0.1:PORT` of the listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    /// `http://127.0.0.1:PORT` of the admin interface.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// The bootstrap Envoy runs, as written to disk.
    pub fn bootstrap_yaml(&self) -> String {
        std::fs::read_to_string(&self.bootstrap_path).unwrap_or_default()
    }

    /// Envoy's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// One counter or gauge from the admin `/stats`, by exact name.
    /// Labelled filter metrics (`<metric>;<label>=<value>...`) are filtered by the part before the first `;`.
    /// On the native build a filter stat named the wasm way is read under its native name (see [`native_stat`]).
    pub async fn stat(&self, name: &str) -> Option<u64> {
        let native = self.native.then(|| native_stat(name)).flatten();
        let name = native.as_deref().unwrap_or(name);
        let stem = name.split(';').next().unwrap_or(name);
        let url = self.admin_url(&format!("/stats?filter=^{}", stem.replace('.', "\\.")));
        let text = reqwest::get(url).await.ok()?.text().await.ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Waits until the filter's own status snapshot (`/llmroute/status`, fresh) counts `n` healthy hosts of
    /// `backend` and every one of them up. Bounded-keys placement reads that snapshot, so a test that places keys
    /// before it is current may see a host that is merely slow to pass its first health check as down, and place
    /// every key elsewhere. Err carries the last status seen.
    pub async fn wait_snapshot_healthy(&self, backend: &str, n: u64, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut last = Value::Null;
        loop {
            if let Ok(r) = reqwest::get(self.url("/llmroute/status")).await {
                last = r.json().await.unwrap_or(Value::Null);
            }
            let fresh = last["snapshot"]["stale"] == false;
            let entry = last["backends"]
                .as_array()
                .and_then(|bs| bs.iter().find(|b| b["name"] == backend));
            let all_up = entry.is_some_and(|b| {
                b["healthy_hosts"].as_u64() == Some(n)
                    && b["hosts"]
                        .as_array()
                        .is_some_and(|hs| hs.iter().all(|h| h["up"] == true))
            });
            if fresh && all_up {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{backend}: not {n} healthy hosts in the filter's snapshot within {limit:?}: {last}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The health flags of each host of `cluster`, keyed by `IP:PORT`, from the admin `/clusters`:
    /// `healthy`, or flags such as `/failed_active_hc` and `/failed_outlier_check`.
    pub async fn host_health(&self, cluster: &str) -> std::collections::BTreeMap<String, String> {
        let text = match reqwest::get(self.admin_url("/clusters")).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let prefix = format!("{cluster}::");
        text.lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|l| l.split_once("::health_flags::"))
            .map(|(host, flags)| (host.to_string(), flags.trim().to_string()))
            .collect()
    }

    /// Stops Envoy now.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "----- Envoy log ({}) -----\n{}\n----- end of Envoy log -----",
                self.listen,
                self.log()
            );
        }
    }
}

/// `program`, run under `taskset -c LIST` when a CPU list is given. taskset execs, so the pid is the program's.
pub fn pinned_command(program: &Path, cpu_list: Option<&str>) -> Command {
    match cpu_list {
        Some(cpus) => {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", cpus]).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

enum StartError {
    PortTaken(String),
    Failed(String),
}

/// Two consecutive ports in 10000..30000, different per process and attempt, that nothing listens on now.
///
/// Envoy binds its listeners with `SO_REUSEPORT`, so a second Envoy given the port of a running one binds it too
/// and the kernel shares the connections between them: no "address in use" ever tells. A port is taken here only
/// if a plain bind of it succeeds, which fails while any process listens on it (with or without that option).
pub fn random_ports(attempt: u32) -> (u16, u16) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let draw = |n: u32| {
        let seed = xxhash_rust::xxh3::xxh3_64(
            &[
                nanos.to_le_bytes(),
                std::process::id().to_le_bytes(),
                attempt.to_le_bytes(),
                n.to_le_bytes(),
            ]
            .concat(),
        );
        10000 + (seed % 19_998) as u16
    };
    first_free_pair(draw, |port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
}

/// The first of 64 draws whose port and the next are both `free`, or the last draw.
fn first_free_pair(draw: impl Fn(u32) -> u16, free: impl Fn(u16) -> bool) -> (u16, u16) {
    let mut base = draw(0);
    for n in 1..64 {
        if free(base) && free(base + 1) {
            break;
        }
        base = draw(n);
    }
    (base, base + 1)
}

#[cfg(test)]
mod tests {
    use super::{first_free_pair, random_ports};
    use std::net::TcpListener;

    #[test]
    fn random_ports_skip_a_port_something_listens_on() {
        let held = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = held.local_addr().unwrap().port();
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        // Draws: the held port, then the port just below it (its pair holds the held one), then a free pair.
        let (a, b) = random_ports(0);
        let draws = [port, port - 1, a];
        assert_eq!(first_free_pair(|n| draws[n.min(2) as usize], free), (a, b));
        assert!(free(a) && free(b));
        // With nothing free, the last draw is given.
        assert_eq!(first_free_pair(|n| 20000 + n as u16, |_| false), (20063, 20064));
    }
}
