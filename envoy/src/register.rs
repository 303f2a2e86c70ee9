//! `llmroute register`: keeps an engine registered in etcd while its health URL answers.
//!
//! Every interval it asks the health URL (a 2xx within the interval is healthy). Healthy and not registered: it
//! grants a lease of `ttl` seconds and puts `<prefix>/<IP:PORT>` with the metadata on it. Healthy and registered:
//! it refreshes the lease. A failed health check revokes the lease, so the key goes at once and `discover`
//! drops the host; a later passing check registers it again. When etcd cannot be reached the lease is not
//! refreshed and expires after `ttl`, which takes the host out too: a registration never outlives its proof of
//! life by more than `ttl`. The process holds no other state, so restarting it is safe; when it stops, its lease
//! expires after `ttl` (revoke it with `etcdctl lease revoke` to drain at once). With `--user` and
//! `--password-env`, it authenticates to etcd as that user, the password read from that environment variable.
//!
//! The key names an IP, the address Envoy connects to. `--addr` may give a DNS name instead, for engines whose
//! address is known only once they run (a container on a network whose addresses Docker assigns): the name is
//! resolved at each registration and must resolve to exactly one address, so that the key cannot name an address
//! the engine has on some other network ([`instance_address`]).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use llmroute_core::config::{env_name_ok, parse_endpoint, upstream_tls, Diagnostics, RawUpstreamTls, UpstreamTls};

use crate::etcd::{Client, Credentials, EtcdError};

/// What `register` was told.
#[derive(Debug, Clone)]
pub struct Registration {
    /// etcd base URLs, `http://HOST:PORT` (`https://HOST:PORT` with `tls`).
    pub etcd: Vec<String>,
    /// TLS to etcd (`--ca-file`, `--sni`, `--cert-file`, `--key-file`), checked by [`tls_flags`].
    pub tls: Option<UpstreamTls>,
    /// etcd's user authentication (`--user`, `--password-env`), read by [`auth_flags`].
    pub auth: Option<Credentials>,
    /// The key prefix, without a trailing `/`.
    pub prefix: String,
    /// The engine's `IP:PORT` as Envoy should reach it, or `HOST:PORT` whose name resolves to that one IP.
    pub addr: String,
    /// The engine's health URL (`http://`).
    pub health: String,
    /// The lease TTL, seconds.
    pub ttl_s: u64,
    /// The key's value: empty or a JSON object (`slots`, `weight`, `model`, `zone`).
    pub metadata: String,
    pub interval: Duration,
}

/// What one step did, for the log and for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Registered(i64),
    Refreshed,
    /// The engine failed its health check and the lease was revoked.
    Dropped(String),
    /// The engine is down and not registered.
    StillDown,
    /// etcd did not answer; the lease (if any) runs down meanwhile.
    EtcdFailed(String),
    /// `--addr` names a host that resolves to no address or to several: not registered.
    Unresolved(String),
}

pub struct Registrar {
    reg: Registration,
    client: Client,
    health: ureq::Agent,
    lease: Option<i64>,
    /// The key of the current registration (`<prefix>/<IP:PORT>`, the address as resolved then).
    key: Option<String>,
}

impl Registrar {
    /// Fails only when a `tls` PEM file cannot be read (the error names it).
    pub fn new(reg: Registration) -> Result<Self, String> {
        let timeout = reg.interval.clamp(Duration::from_millis(100), Duration::from_secs(5));
        let client = Client::new(reg.etcd.clone(), reg.tls.as_ref(), timeout, timeout)
            .map_err(|e| e.0)?
            .with_credentials(reg.auth.clone());
        let health = ureq::AgentBuilder::new().timeout(timeout).build();
        Ok(Registrar {
            reg,
            client,
            health,
            lease: None,
            key: None,
        })
    }

    /// What the log calls the registration: its key, or `<prefix>/<--addr>` before the first one.
    fn key(&self) -> String {
        self.key
            .clone()
            .unwrap_or_else(|| format!("{}/{}", self.reg.prefix, self.reg.addr))
    }

    fn healthy(&self) -> Result<(), String> {
        match self.health.get(&self.reg.health).call() {
            Ok(r) if (200..300).contains(&r.status()) => Ok(()),
            Ok(r) => Err(format!("health answered {}", r.status())),
            Err(ureq::Error::Status(code, _)) => Err(format!("health answered {code}")),
            Err(e) => Err(format!("health check failed: {e}")),
        }
    }

    /// One round: check the engine, then register, refresh or drop.
    pub fn step(&mut self) -> Step {
        match (self.healthy(), self.lease) {
            (Ok(()), None) => self.register(),
            (Ok(()), Some(id)) => match self.client.keepalive(id) {
                Ok(ttl) if ttl > 0 => Step::Refreshed,
                // The lease ran out (etcd unreachable for longer than the TTL): register again.
                Ok(_) => {
                    self.lease = None;
                    self.register()
                }
                Err(e) => Step::EtcdFailed(e.0),
            },
            (Err(why), Some(id)) => match self.client.revoke(id) {
                Ok(()) => {
                    self.lease = None;
                    Step::Dropped(why)
                }
                // Keep the id to try the revoke again; the lease is not refreshed, so it expires anyway.
                Err(e) => Step::EtcdFailed(format!("{why}; revoking the lease: {}", e.0)),
            },
            (Err(_), None) => Step::StillDown,
        }
    }

    /// Resolves `--addr`, grants a lease and puts the key on it.
    fn register(&mut self) -> Step {
        let addr = match instance_address(&self.reg.addr, resolve) {
            Ok(a) => a,
            Err(e) => return Step::Unresolved(e),
        };
        let key = format!("{}/{addr}", self.reg.prefix);
        match self.grant_and_put(&key) {
            Ok(id) => {
                self.lease = Some(id);
                self.key = Some(key);
                Step::Registered(id)
            }
            Err(e) => Step::EtcdFailed(e.0),
        }
    }

    fn grant_and_put(&mut self, key: &str) -> Result<i64, EtcdError> {
        let id = self.client.grant(self.reg.ttl_s)?;
        if let Err(e) = self.client.put(key, &self.reg.metadata, id) {
            let _ = self.client.revoke(id);
            return Err(e);
        }
        Ok(id)
    }

    /// Runs forever, logging each change of state.
    pub fn run(mut self) -> ! {
        let mut last = String::new();
        loop {
            let started = Instant::now();
            let step = self.step();
            let key = self.key();
            let line = match &step {
                Step::Registered(id) => format!("registered {key} with lease {id:x} (ttl {}s)", self.reg.ttl_s),
                Step::Refreshed => "refreshing".into(),
                Step::Dropped(why) => format!("{why}: revoked the lease; {key} is gone"),
                Step::StillDown => "engine still down; not registered".into(),
                Step::EtcdFailed(e) => format!("etcd: {e}"),
                Step::Unresolved(e) => format!("{e}; not registered"),
            };
            if line != last {
                eprintln!("llmroute register: {line}");
                last = line;
            }
            std::thread::sleep(self.reg.interval.saturating_sub(started.elapsed()));
        }
    }
}

/// The system resolver: every address `host` has, for `port`.
fn resolve(host: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
    Ok((host, port).to_socket_addrs()?.map(|a| a.ip()).collect())
}

/// The `IP:PORT` that the key of `addr` names: `addr` itself when it is an IP literal, else the one address its
/// name resolves to through `resolve`. No address, or several, is an error naming `--addr` and what it resolved
/// to: a key must name the address Envoy reaches, and a name with several cannot tell which.
pub fn instance_address(
    addr: &str,
    resolve: impl FnOnce(&str, u16) -> std::io::Result<Vec<IpAddr>>,
) -> Result<String, String> {
    let ep = parse_endpoint(addr).map_err(|e| format!("--addr {addr:?}: {e}"))?;
    if ep.is_ip {
        return Ok(addr.to_string());
    }
    let mut ips = resolve(&ep.host, ep.port).map_err(|e| format!("--addr {addr:?}: resolving {}: {e}", ep.host))?;
    ips.sort();
    ips.dedup();
    match ips.as_slice() {
        [ip] => Ok(SocketAddr::new(*ip, ep.port).to_string()),
        [] => Err(format!("--addr {addr:?}: {} resolves to no address", ep.host)),
        many => Err(format!(
            "--addr {addr:?}: {} resolves to {} addresses ({}); give a name that resolves to the engine's address \
             on Envoy's network only, or that IP",
            ep.host,
            many.len(),
            many.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// The TLS flags as the upstream `tls` block (`--ca-file` is `ca_file`, and so on), validated as the config file's
/// block is; `None` when none is given. The error names the flag, the value and the fix.
pub fn tls_flags(
    ca_file: Option<String>,
    sni: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
) -> Result<Option<UpstreamTls>, String> {
    if ca_file.is_none() && sni.is_none() && cert_file.is_none() && key_file.is_none() {
        return Ok(None);
    }
    let Some(ca_file) = ca_file else {
        return Err(
            "--ca-file: missing: TLS to etcd (--sni, --cert-file, --key-file) needs the CA that signed etcd's \
                    certificate"
                .into(),
        );
    };
    let raw = RawUpstreamTls {
        sni,
        ca_file,
        cert_file,
        key_file,
    };
    let mut diag = Diagnostics::default();
    let tls = upstream_tls(&raw, "etcd", &mut diag);
    match diag.errors.first() {
        None => Ok(Some(tls)),
        Some(e) => {
            let flag = |text: &str| {
                ["ca_file", "sni", "cert_file", "key_file"]
                    .iter()
                    .fold(text.replace("etcd.tls.", "").replace(": PATH`", " PATH`"), |t, f| {
                        t.replace(f, &format!("--{}", f.replace('_', "-")))
                    })
            };
            Err(format!("{} {}: {}", flag(&e.field), e.value, flag(&e.reason)))
        }
    }
}

/// `--user` and `--password-env`: both or neither; the password read from the variable. The error names the flag
/// and the variable, never the password.
pub fn auth_flags(user: Option<String>, password_env: Option<String>) -> Result<Option<Credentials>, String> {
    match (user, password_env) {
        (None, None) => Ok(None),
        (Some(u), None) => Err(format!(
            "--user {u}: needs --password-env VAR, the environment variable that holds the user's password"
        )),
        (None, Some(v)) => Err(format!("--password-env {v}: needs --user NAME, the etcd user")),
        (Some(u), Some(_)) if u.is_empty() || u.chars().any(char::is_control) => Err(format!(
            "--user {u:?}: must be an etcd user name without control characters"
        )),
        (Some(_), Some(v)) if !env_name_ok(&v) => Err(format!(
            "--password-env {v}: must be an environment variable name: A-Z a-z 0-9 _, not starting with a digit"
        )),
        (Some(u), Some(v)) => Credentials::from_var(&u, &v, "--password-env").map(Some),
    }
}

/// Checks the arguments; the error names the flag, the value and the fix.
pub fn check(reg: &Registration) -> Result<(), String> {
    if reg.etcd.is_empty() {
        return Err("--etcd: missing: give etcd's client URL, such as http://127.0.0.1:2379".into());
    }
    for e in &reg.etcd {
        match (e.starts_with("http://"), e.starts_with("https://"), reg.tls.is_some()) {
            (true, _, false) | (_, true, true) => {}
            (_, true, false) => {
                return Err(format!(
                    "--etcd {e:?}: https:// needs the CA that signed etcd's certificate: add --ca-file PATH, or \
                     write http://HOST:PORT"
                ))
            }
            (true, _, true) => {
                return Err(format!(
                    "--etcd {e:?}: with --ca-file every member is reached over TLS; write https://HOST:PORT, or \
                     remove --ca-file"
                ))
            }
            _ => {
                return Err(format!(
                    "--etcd {e:?}: must be an http:// URL (https:// with --ca-file), such as http://127.0.0.1:2379"
                ))
            }
        }
    }
    if let (Some(c), None) = (&reg.auth, &reg.tls) {
        let remote = reg.etcd.iter().find(|e| {
            let host = e.trim_start_matches("http://");
            !parse_endpoint(host).is_ok_and(|ep| llmroute_core::config::is_loopback(&ep))
        });
        if let Some(e) = remote {
            return Err(format!(
                "--user {}: without --ca-file the password would reach {e} unencrypted, and it is not loopback; \
                 reach etcd over TLS (https:// with --ca-file)",
                c.user
            ));
        }
    }
    let prefix_ok = reg.prefix.starts_with('/') && !reg.prefix.ends_with('/') && reg.prefix.len() >= 2;
    if !prefix_ok || reg.prefix.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "--prefix {:?}: must start with `/` and not end with `/`, as in the backend's discovery.etcd.prefix",
            reg.prefix
        ));
    }
    if parse_endpoint(&reg.addr).is_err() {
        return Err(format!(
            "--addr {:?}: must be the engine's IP:PORT as Envoy reaches it, or HOST:PORT whose name resolves to \
             that IP",
            reg.addr
        ));
    }
    if !reg.health.starts_with("http://") {
        return Err(format!(
            "--health {:?}: must be an http:// URL, such as http://{}/health",
            reg.health, reg.addr
        ));
    }
    if !(1..=3600).contains(&reg.ttl_s) {
        return Err(format!("--ttl {}: must be 1 to 3600 seconds", reg.ttl_s));
    }
    if reg.interval.as_secs() >= reg.ttl_s {
        return Err(format!(
            "--interval-ms {}: must be shorter than --ttl ({}s), or the lease expires between refreshes",
            reg.interval.as_millis(),
            reg.ttl_s
        ));
    }
    let meta = reg.metadata.trim();
    if !meta.is_empty() && !matches!(serde_json::from_str(meta), Ok(serde_json::Value::Object(_))) {
        return Err(format!(
            "--metadata {meta:?}: must be a JSON object, such as '{{\"slots\": 4}}'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg() -> Registration {
        Registration {
            etcd: vec!["http://127.0.0.1:2379".into()],
            tls: None,
            auth: None,
            prefix: "/llmroute/backends/a".into(),
            addr: "127.0.0.1:8080".into(),
            health: "http://127.0.0.1:8080/health".into(),
            ttl_s: 5,
            metadata: String::new(),
            interval: Duration::from_millis(500),
        }
    }

    #[test]
    fn arguments_are_checked_with_the_flag_named() {
        assert_eq!(check(&reg()), Ok(()));
        type Change = fn(&mut Registration);
        let cases: [(Change, &str); 8] = [
            (|r| r.etcd = vec!["https://x:1".into()], "--etcd"),
            (|r| r.etcd = vec!["x:1".into()], "--etcd"),
            (|r| r.prefix = "/a/".into(), "--prefix"),
            (|r| r.addr = "llama.local".into(), "--addr"),
            (|r| r.health = "localhost/health".into(), "--health"),
            (|r| r.ttl_s = 0, "--ttl"),
            (|r| r.interval = Duration::from_secs(5), "--interval-ms"),
            (|r| r.metadata = "[1]".into(), "--metadata"),
        ];
        for (change, flag) in cases {
            let mut r = reg();
            change(&mut r);
            let err = check(&r).unwrap_err();
            assert!(err.starts_with(flag), "{flag}: {err}");
        }
    }

    #[test]
    fn a_named_addr_registers_the_one_address_it_resolves_to() {
        let v4 = |s: &str| s.parse::<IpAddr>().unwrap();
        let never = |_: &str, _: u16| -> std::io::Result<Vec<IpAddr>> { panic!("an IP is not resolved") };
        assert_eq!(instance_address("10.0.0.5:8080", never), Ok("10.0.0.5:8080".into()));
        assert_eq!(instance_address("[fd00::5]:8080", never), Ok("[fd00::5]:8080".into()));
        let mut asked = None;
        let got = instance_address("Llama-R-0.engines:8080", |h, p| {
            asked = Some((h.to_string(), p));
            Ok(vec![v4("172.18.0.3"), v4("172.18.0.3")])
        });
        assert_eq!(got, Ok("172.18.0.3:8080".into()));
        assert_eq!(asked, Some(("llama-r-0.engines".into(), 8080)));
        assert_eq!(
            instance_address("e:8080", |_, _| Ok(vec![v4("fd00::5")])),
            Ok("[fd00::5]:8080".into())
        );
        let two = instance_address("e:8080", |_, _| Ok(vec![v4("172.19.0.4"), v4("172.18.0.3")])).unwrap_err();
        assert!(
            two.starts_with("--addr \"e:8080\": e resolves to 2 addresses (172.18.0.3, 172.19.0.4)"),
            "{two}"
        );
        let none = instance_address("e:8080", |_, _| Ok(vec![])).unwrap_err();
        assert!(none.contains("resolves to no address"), "{none}");
        let failed = instance_address("e:8080", |_, _| Err(std::io::Error::other("no such host"))).unwrap_err();
        assert!(failed.contains("resolving e: no such host"), "{failed}");
        let mut named = reg();
        named.addr = "llama-r-0:8080".into();
        assert_eq!(check(&named), Ok(()));
    }

    #[test]
    fn the_auth_flags_come_together_and_keep_the_password_off_the_network_in_clear() {
        assert_eq!(auth_flags(None, None), Ok(None));
        let cases = [
            (auth_flags(Some("llm".into()), None), "--user llm: needs --password-env"),
            (auth_flags(None, Some("PW".into())), "--password-env PW: needs --user"),
            (
                auth_flags(Some("llm".into()), Some("1PW".into())),
                "--password-env 1PW: must be",
            ),
            (
                auth_flags(Some("llm".into()), Some("LLMROUTE_TEST_REGISTER_PW_NEVER_SET".into())),
                "--password-env LLMROUTE_TEST_REGISTER_PW_NEVER_SET: the variable is not set",
            ),
        ];
        for (got, want) in cases {
            let err = got.unwrap_err();
            assert!(err.starts_with(want), "{want}: {err}");
        }
        let c = auth_flags(Some("llm".into()), Some("PATH".into())).unwrap().unwrap();
        assert_eq!(c.user, "llm");
        // Over plain HTTP, only to loopback.
        let mut r = reg();
        r.auth = Some(c);
        assert_eq!(check(&r), Ok(()));
        r.etcd = vec!["http://127.0.0.1:2379".into(), "http://10.0.0.10:2379".into()];
        let err = check(&r).unwrap_err();
        assert!(
            err.starts_with("--user llm: without --ca-file") && err.contains("10.0.0.10:2379"),
            "{err}"
        );
        r.tls = tls_flags(Some("/ca.pem".into()), None, None, None).unwrap();
        r.etcd = vec!["https://10.0.0.10:2379".into()];
        assert_eq!(check(&r), Ok(()));
    }

    #[test]
    fn the_tls_flags_are_the_tls_block_checked_the_same_way() {
        assert_eq!(tls_flags(None, None, None, None), Ok(None));
        let t = tls_flags(
            Some("/ca.pem".into()),
            None,
            Some("/c.pem".into()),
            Some("/c.key".into()),
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.client_cert.unwrap().key_file, "/c.key");
        let cases = [
            (tls_flags(None, None, Some("/c.pem".into()), Some("/c.key".into())), "--ca-file: missing"),
            (
                tls_flags(Some("/ca.pem".into()), None, Some("/c.pem".into()), None),
                "--cert-file /c.pem: a client certificate needs its private key: add `--key-file PATH` beside `--cert-file`",
            ),
            (tls_flags(Some("".into()), None, None, None), "--ca-file \"\": a CA bundle is needed"),
            (tls_flags(Some("/ca.pem".into()), Some("a b".into()), None, None), "--sni a b: must be a DNS name"),
        ];
        for (got, want) in cases {
            let err = got.unwrap_err();
            assert!(err.starts_with(want), "{want}: {err}");
        }
        // With TLS, https:// only.
        let mut r = reg();
        r.tls = tls_flags(Some("/ca.pem".into()), None, None, None).unwrap();
        assert!(check(&r)
            .unwrap_err()
            .contains("with --ca-file every member is reached over TLS"));
        r.etcd = vec!["https://127.0.0.1:2379".into()];
        assert_eq!(check(&r), Ok(()));
    }
}
