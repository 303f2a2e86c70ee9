//! Config for TLS and backend credentials: TLS to the engines (`backends[].tls`, also the placement store's etcd
//! `tls`), TLS for clients (`listen_tls`), and the engine token's environment variable (`backends[].credential_env`).
//! One rule ties them: a backend token never crosses the network in clear text, so `credential_env` needs `tls`
//! unless every endpoint is loopback. A discovered backend has no endpoints to check, so it needs `tls`, or, for
//! a cluster defined outside the rendered bootstrap, the user's statement that the mesh encrypts
//! (`discovery.mesh_tls`). Its `tls` needs `sni`: its hosts are unknown when the bootstrap is rendered, so every
//! host is verified under that one name. The upstream `tls` block may carry a client certificate (`cert_file` and
//! `key_file`, both or neither) for servers that require one, such as etcd with `--client-cert-auth`.

use serde::Deserialize;

use super::resilience::Checker;
use super::{Diagnostics, Discovery, Endpoint};

/// `backends[].tls` and `affinity.placement_store.etcd.tls`: TLS to the engines, or to the etcd members.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamTls {
    /// Server name sent and verified. Default: none sent, and the certificate is checked against `ca_file` only.
    #[serde(default)]
    pub sni: Option<String>,
    /// PEM bundle of trusted CAs. Without it, the system's trust store is not used: give one.
    pub ca_file: String,
    /// PEM client certificate (chain) Envoy presents to servers that ask for one. Needs `key_file`.
    #[serde(default)]
    pub cert_file: Option<String>,
    /// PEM private key of `cert_file`. Needs `cert_file`.
    #[serde(default)]
    pub key_file: Option<String>,
}

/// `listen_tls`: TLS termination for clients.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListenTls {
    pub cert_file: String,
    pub key_file: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    pub sni: Option<String>,
    pub ca_file: String,
    /// The client certificate presented to the servers; `None`: none (a server that requires one refuses).
    pub client_cert: Option<CertKey>,
}

/// A certificate and its private key, PEM files Envoy reads at start-up: the listener's own (`listen_tls`), or a
/// client certificate (`tls.cert_file` and `tls.key_file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertKey {
    pub cert_file: String,
    pub key_file: String,
}

/// `listen_tls`: the certificate served to clients.
pub type ListenTls = CertKey;

impl Checker<'_> {
    pub fn tls(&mut self, raw: Option<&RawUpstreamTls>) -> Option<UpstreamTls> {
        let t = raw?;
        if t.ca_file.is_empty() {
            self.error(
                "tls.ca_file",
                "\"\"",
                "a CA bundle is needed to verify the servers' certificates",
            );
        }
        if let Some(sni) = &t.sni {
            if sni.is_empty()
                || sni.len() > 253
                || sni.bytes().any(|b| !(b.is_ascii_alphanumeric() || b"-.".contains(&b)))
            {
                self.error("tls.sni", sni, "must be a DNS name");
            }
        }
        let client_cert = match (&t.cert_file, &t.key_file) {
            (Some(cert), Some(key)) => Some(cert_key(&mut *self.diag, &format!("{}.tls", self.at), cert, key)),
            (Some(cert), None) => {
                self.error(
                    "tls.cert_file",
                    cert,
                    "a client certificate needs its private key: add `key_file: PATH` beside `cert_file`, or \
                     remove `cert_file`",
                );
                None
            }
            (None, Some(key)) => {
                self.error(
                    "tls.key_file",
                    key,
                    "a private key needs its client certificate: add `cert_file: PATH` beside `key_file`, or \
                     remove `key_file`",
                );
                None
            }
            (None, None) => None,
        };
        Some(UpstreamTls {
            sni: t.sni.clone(),
            ca_file: t.ca_file.clone(),
            client_cert,
        })
    }

    pub fn credential_env(&mut self, raw: Option<&str>) -> Option<String> {
        let name = raw?;
        let ok = !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !name.as_bytes().first().is_some_and(u8::is_ascii_digit);
        if !ok {
            self.error(
                "credential_env",
                name,
                "must be an environment variable name: A-Z a-z 0-9 _, not starting with a digit",
            );
        }
        Some(name.to_string())
    }

    /// A backend token must never cross the network in clear text: `credential_env` without `tls` is refused
    /// unless every endpoint is loopback (an IP loopback literal, or `localhost`).
    pub fn credential_needs_tls(&mut self, credential_env: Option<&str>, has_tls: bool, endpoints: &[Endpoint]) {
        let (Some(var), false) = (credential_env, has_tls) else {
            return;
        };
        if let Some(e) = endpoints.iter().find(|e| !is_loopback(e)) {
            self.error(
                "credential_env",
                var,
                format!(
                    "the backend has no `tls`, so its token would reach {e} unencrypted, and that endpoint is not \
                     loopback; add `tls: {{ ca_file: ... }}` to the backend, or remove `credential_env`"
                ),
            );
        }
    }
}

impl Checker<'_> {
    /// The TLS rules of a discovered backend (`d`): `tls` names its hosts by `sni`; `mesh_tls` only where the
    /// mesh, not `llmroute render`, writes the cluster, and not beside `tls`; `credential_env` only with one of
    /// the two.
    pub fn discovered_tls(&mut self, credential_env: Option<&str>, tls: Option<&UpstreamTls>, d: &Discovery) {
        if tls.is_some_and(|t| t.sni.is_none()) {
            self.error(
                "tls.sni",
                "",
                "missing: a discovered backend's hosts are not known when `llmroute render` runs, so each is \
                 verified under one DNS name; set `sni` to the name the engines' certificates carry",
            );
        }
        if d.mesh_tls && d.eds_path.is_some() {
            self.error(
                "discovery.mesh_tls",
                true,
                "only for a cluster defined outside the rendered bootstrap (`discovery: {}`): with `eds_path`, \
                 `llmroute render` writes this cluster, and only its `tls` encrypts it; use `tls` instead",
            );
        } else if d.mesh_tls && tls.is_some() {
            self.error(
                "discovery.mesh_tls",
                true,
                "set one of `tls` (llmroute's clusters verify the engines) and `mesh_tls` (the mesh encrypts), not \
                 both",
            );
        }
        // `mesh_tls` beside `eds_path` encrypts nothing, so it does not carry the credential either.
        let mesh_encrypts = d.mesh_tls && d.eds_path.is_none();
        let (Some(var), None, false) = (credential_env, tls, mesh_encrypts) else {
            return;
        };
        self.error(
            "credential_env",
            var,
            "the backend's hosts are discovered, so none can be checked to be loopback, and without `tls` its token \
             would cross the network unencrypted; add `tls: { ca_file: ..., sni: ... }`, or, for a cluster defined \
             elsewhere whose traffic the mesh encrypts (Istio mTLS), set `discovery: { mesh_tls: true }`; or remove \
             `credential_env`",
        );
    }
}

/// Validates an upstream `tls` block found at `at` (its errors are named `AT.tls.FIELD`), for a caller outside
/// the config file, such as `llmroute register`'s flags.
pub fn upstream_tls(raw: &RawUpstreamTls, at: &str, diag: &mut Diagnostics) -> UpstreamTls {
    let mut check = Checker {
        diag,
        at: at.to_string(),
    };
    let checked = check.tls(Some(raw));
    checked.unwrap_or_else(|| UpstreamTls {
        sni: None,
        ca_file: raw.ca_file.clone(),
        client_cert: None,
    })
}

/// Validates `listen_tls`.
pub fn listen_tls(raw: Option<&RawListenTls>, diag: &mut Diagnostics) -> Option<ListenTls> {
    let t = raw?;
    Some(cert_key(diag, "listen_tls", &t.cert_file, &t.key_file))
}

/// `AT.cert_file` and `AT.key_file`, a certificate and its key: each must name a file (Envoy reads and checks the
/// PEM itself, at start-up, and refuses to start when it is missing or does not parse).
fn cert_key(diag: &mut Diagnostics, at: &str, cert_file: &str, key_file: &str) -> CertKey {
    for (field, v) in [("cert_file", cert_file), ("key_file", key_file)] {
        if v.is_empty() {
            diag.push(format!("{at}.{field}"), "\"\"", "a PEM file path is needed");
        }
    }
    CertKey {
        cert_file: cert_file.to_string(),
        key_file: key_file.to_string(),
    }
}

/// True for an IP loopback literal (127.0.0.0/8, ::1) and for `localhost`.
pub fn is_loopback(e: &Endpoint) -> bool {
    if e.is_ip {
        return e.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    }
    e.host == "localhost"
}
