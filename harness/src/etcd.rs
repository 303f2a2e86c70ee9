//! A real single-member etcd for tests and the demo (Debian `etcd-server`, `make etcd`), on random loopback
//! ports, its data in a temporary directory, killed on drop. [`Etcd::stop`] and [`Etcd::restart`] keep the data
//! and the ports, so a test can take etcd away and bring it back. [`EtcdCluster`] runs three such members as one
//! cluster, so a test can kill one and keep the quorum. [`Etcd::start_tls`] serves clients over TLS with a
//! certificate from `certs` (etcd's `--cert-file` and `--key-file`); [`Etcd::start_mtls`] also requires a client
//! certificate signed by the same CA (`--client-cert-auth --trusted-ca-file`). [`Etcd::enable_auth`] turns on
//! etcd's user authentication with a user limited to one prefix. Also: the `llmroute` CLI's long-running
//! subcommands (`discover`, `register`) as child processes killed on drop, with their logs kept.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::certs::PkiFiles;
use crate::envoy::{random_ports, repo_root};

pub struct Etcd {
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
    runs: u32,
    /// The certificate clients are served over TLS with; `None`: plain HTTP.
    tls: Option<PkiFiles>,
    /// With `tls`: clients must present a certificate signed by its CA.
    client_auth: bool,
    /// After [`Etcd::enable_auth`]: `root:PASSWORD`, which `etcdctl` then authenticates as.
    root: Option<String>,
}

impl Etcd {
    /// Starts etcd on random ports and waits until `/health` answers.
    pub async fn start() -> Result<Etcd, String> {
        Self::start_with(None, false).await
    }

    /// Starts etcd serving its clients over TLS with `files`' certificate and key, and waits until it is healthy
    /// (checked with `etcdctl --cacert`, which trusts `files`' CA).
    pub async fn start_tls(files: PkiFiles) -> Result<Etcd, String> {
        Self::start_with(Some(files), false).await
    }

    /// [`Etcd::start_tls`], and every client must present a certificate signed by `files`' CA; a handshake
    /// without one is refused. [`Etcd::etcdctl`] presents `files`' client certificate.
    pub async fn start_mtls(files: PkiFiles) -> Result<Etcd, String> {
        Self::start_with(Some(files), true).await
    }

    async fn start_with(tls: Option<PkiFiles>, client_auth: bool) -> Result<Etcd, String> {
        let mut last = String::new();
        for attempt in 0..5 {
            // Different ports from an Envoy started at the same moment: offset the attempt.
            let (client_port, peer_port) = random_ports(attempt + 100);
            let mut etcd = Etcd {
                child: None,
                client_port,
                peer_port,
                dir: tempfile::tempdir().map_err(|e| e.to_string())?,
                runs: 0,
                tls: tls.clone(),
                client_auth,
                root: None,
            };
            match etcd.spawn_and_wait().await {
                Ok(()) => return Ok(etcd),
                Err(log) => last = log,
            }
        }
        Err(format!("etcd did not start after 5 attempts:\n{last}"))
    }

    /// `http://127.0.0.1:PORT` (`https://` with TLS), etcd's client URL.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join(format!("etcd-{}.log", self.runs))
    }

    /// Every run's log so far.
    pub fn log(&self) -> String {
        (1..=self.runs)
            .map(|r| std::fs::read_to_string(self.dir.path().join(format!("etcd-{r}.log"))).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n----- etcd restarted -----\n")
    }

    async fn spawn_and_wait(&mut self) -> Result<(), String> {
        self.runs += 1;
        let client = self.url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let initial = format!("llmroute-test={peer}");
        let ports = (self.client_port, self.peer_port);
        let data = self.dir.path().join("data");
        let child = spawn_member(
            "llmroute-test",
            &data,
            ports,
            &initial,
            &self.log_path(),
            self.tls.as_ref().map(|t| (t, self.client_auth)),
        )?;
        self.child = Some(child);
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!("etcd exited with {status}:\n{}", self.log()));
            }
            let up = match &self.tls {
                None => healthy(&http, &client).await,
                Some(_) => self.ctl(&["endpoint", "health"]).is_ok(),
            };
            if up {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(format!("etcd was not healthy within 20 s:\n{}", self.log()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills etcd; its data and ports are kept for [`Etcd::restart`].
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same ports and data.
    pub async fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.spawn_and_wait().await
    }

    /// Turns on etcd's user authentication: a `root` user (with `root_password`, which [`Etcd::etcdctl`] then
    /// uses) and `user` with `password`, allowed to read and write only under `prefix`.
    pub fn enable_auth(&mut self, root_password: &str, user: &str, password: &str, prefix: &str) -> Result<(), String> {
        self.ctl(&["user", "add", "root", "--new-user-password", root_password])?;
        self.ctl(&["user", "add", user, "--new-user-password", password])?;
        self.ctl(&["role", "add", user])?;
        self.ctl(&["role", "grant-permission", user, "--prefix=true", "readwrite", prefix])?;
        self.ctl(&["user", "grant-role", user, user])?;
        self.ctl(&["auth", "enable"])?;
        self.root = Some(format!("root:{root_password}"));
        Ok(())
    }

    /// `etcdctl` (API v3) pointed at this etcd; the caller adds the arguments.
    pub fn etcdctl(&self) -> Command {
        let mut c = Command::new("etcdctl");
        c.env("ETCDCTL_API", "3").args(["--endpoints", &self.url()]);
        if let Some(root) = &self.root {
            c.arg("--user").arg(root);
        }
        if let Some(t) = &self.tls {
            c.arg("--cacert").arg(&t.ca_file);
            if self.client_auth {
                c.arg("--cert").arg(&t.client_cert_file);
                c.arg("--key").arg(&t.client_key_file);
            }
        }
        c
    }

    /// Runs `etcdctl ARGS`; its standard output, or an error with its standard error.
    pub fn ctl(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .etcdctl()
            .args(args)
            .output()
            .map_err(|e| format!("etcdctl: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// `etcdctl lease grant TTL`: the lease id, in hex as etcdctl writes it.
    pub fn grant(&self, ttl_s: u64) -> Result<String, String> {
        let out = self.ctl(&["lease", "grant", &ttl_s.to_string()])?;
        // "lease 694d77aa9e38260f granted with TTL(30s)"
        out.split_whitespace()
            .nth(1)
            .map(str::to_string)
            .ok_or_else(|| format!("unexpected etcdctl answer: {out}"))
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("----- etcd log -----\n{}\n----- end of etcd log -----", self.log());
        }
    }
}

/// A 3-member etcd cluster on loopback, each member on its own random ports and data directory; killed on drop.
pub struct EtcdCluster {
    children: Vec<Option<Child>>,
    ports: Vec<(u16, u16)>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    pub const MEMBERS: usize = 3;

    /// Starts three members and waits until every one reports itself healthy (a leader is elected).
    pub async fn start() -> Result<EtcdCluster, String> {
        let mut last = String::new();
        for attempt in 0..5 {
            let ports = (0..Self::MEMBERS as u32)
                .map(|i| random_ports(attempt * 10 + 200 + i))
                .collect::<Vec<_>>();
            let unique: std::collections::BTreeSet<u16> = ports.iter().flat_map(|(a, b)| [*a, *b]).collect();
            if unique.len() != Self::MEMBERS * 2 {
                continue;
            }
            let mut c = EtcdCluster {
                children: Vec::new(),
                ports,
                dir: tempfile::tempdir().map_err(|e| e.to_string())?,
            };
            match c.spawn_and_wait().await {
                Ok(()) => return Ok(c),
                Err(log) => last = log,
            }
        }
        Err(format!("the etcd cluster did not start after 5 attempts:\n{last}"))
    }

    /// Every member's client URL, `http://127.0.0.1:PORT`.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|(c, _)| format!("http://127.0.0.1:{c}"))
            .collect()
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("etcd-{i}.log"))
    }

    /// Every member's log.
    pub fn log(&self) -> String {
        (0..self.ports.len())
            .map(|i| {
                format!(
                    "--- member {i} ---\n{}",
                    std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn spawn_and_wait(&mut self) -> Result<(), String> {
        let initial = self
            .ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        for (i, ports) in self.ports.clone().into_iter().enumerate() {
            let data = self.dir.path().join(format!("data-{i}"));
            let child = spawn_member(&format!("m{i}"), &data, ports, &initial, &self.log_path(i), None)?;
            self.children.push(Some(child));
        }
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        for url in self.urls() {
            loop {
                if healthy(&http, &url).await {
                    break;
                }
                if Instant::now() > deadline {
                    let log = self.log();
                    self.stop_all();
                    return Err(format!("the etcd cluster was not healthy within 30 s:\n{log}"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// Kills member `i` (its data stays).
    pub fn stop_member(&mut self, i: usize) {
        if let Some(mut c) = self.children.get_mut(i).and_then(Option::take) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn stop_all(&mut self) {
        for i in 0..self.children.len() {
            self.stop_member(i);
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop_all();
        if std::thread::panicking() {
            eprintln!(
                "----- etcd cluster log -----\n{}\n----- end of etcd cluster log -----",
                self.log()
            );
        }
    }
}

/// Starts one etcd member named `name` with its data in `data`, on loopback `(client, peer)` ports, in the cluster
/// `initial` (`name=peer-url,...`), writing its output to `log`. With `tls`, clients are served over TLS, and with
/// its `true` they must present a certificate signed by its CA.
fn spawn_member(
    name: &str,
    data: &Path,
    (client, peer): (u16, u16),
    initial: &str,
    log: &Path,
    tls: Option<(&PkiFiles, bool)>,
) -> Result<Child, String> {
    let bin = which("etcd").ok_or("`etcd` is not on PATH: run `make etcd`")?;
    let out = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let client = format!("{scheme}://127.0.0.1:{client}");
    let peer = format!("http://127.0.0.1:{peer}");
    let mut cmd = Command::new(bin);
    if let Some((t, client_auth)) = tls {
        cmd.arg("--cert-file").arg(&t.cert_file);
        cmd.arg("--key-file").arg(&t.key_file);
        if client_auth {
            // etcd 3.4's own gateway then dials the gRPC port presenting the server certificate as a client one,
            // which is why the test server certificate also carries the clientAuth usage (`certs`).
            cmd.arg("--client-cert-auth").arg("--trusted-ca-file").arg(&t.ca_file);
        }
    }
    cmd.args(["--name", name])
        .arg("--data-dir")
        .arg(data)
        .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", initial, "--initial-cluster-state", "new"])
        .args(["--log-level", "warn"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("starting etcd: {e}"))
}

/// True when the member at `url` says it is healthy (it has a leader).
async fn healthy(http: &reqwest::Client, url: &str) -> bool {
    match http.get(format!("{url}/health")).send().await {
        Ok(r) => r.text().await.is_ok_and(|t| t.contains("\"true\"")),
        Err(_) => false,
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The `llmroute` CLI (`make cli`), or `LLMROUTE_CLI` when set.
pub fn cli_binary() -> PathBuf {
    std::env::var_os("LLMROUTE_CLI")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/release/llmroute"))
}

/// A long-running `llmroute` subcommand, killed on drop; its log printed if the test fails.
pub struct CliProcess {
    child: Child,
    log_path: PathBuf,
    _dir: tempfile::TempDir,
    name: String,
}

impl CliProcess {
    /// Starts `llmroute ARGS` with its standard error going to a log file.
    pub fn start(args: &[&str]) -> Result<CliProcess, String> {
        Self::start_with_env(args, &[])
    }

    /// [`CliProcess::start`], with `env` added to the process's environment.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Result<CliProcess, String> {
        let bin = cli_binary();
        if !bin.exists() {
            return Err(format!("{} is missing: run `make cli`", bin.display()));
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let log_path = dir.path().join("llmroute.log");
        let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
        let child = Command::new(&bin)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        Ok(CliProcess {
            child,
            log_path,
            _dir: dir,
            name: args.first().copied().unwrap_or("llmroute").to_string(),
        })
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The log path, for the demo to show.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
}

impl Drop for CliProcess {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "----- llmroute {} log -----\n{}\n----- end -----",
                self.name,
                self.log()
            );
        }
    }
}
