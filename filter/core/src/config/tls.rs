//! Config for TLS and backend credentials: TLS to the engines (`backends[].tls`), TLS for clients (`listen_tls`),
//! and the engine token's environment variable (`backends[].credential_env`). One rule ties them: a backend token
//! never crosses the network in clear text, so `credential_env` needs `tls` unless every endpoint is loopback.

use serde::Deserialize;

use super::resilience::Checker;
use super::{Diagnostics, Endpoint};

/// `backends[].tls`: TLS to the engines.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamTls {
    /// Server name sent and verified. Default: none sent, and the certificate is checked against `ca_file` only.
    #[serde(default)]
    pub sni: Option<String>,
    /// PEM bundle of trusted CAs. Without it, the system's trust store is not used: give one.
    pub ca_file: String,
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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenTls {
    pub cert_file: String,
    pub key_file: String,
}

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
        Some(UpstreamTls {
            sni: t.sni.clone(),
            ca_file: t.ca_file.clone(),
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

/// Validates `listen_tls`.
pub fn listen_tls(raw: Option<&RawListenTls>, diag: &mut Diagnostics) -> Option<ListenTls> {
    let t = raw?;
    for (field, v) in [
        ("listen_tls.cert_file", &t.cert_file),
        ("listen_tls.key_file", &t.key_file),
    ] {
        if v.is_empty() {
            diag.push(field, "\"\"", "a PEM file path is needed");
        }
    }
    Some(ListenTls {
        cert_file: t.cert_file.clone(),
        key_file: t.key_file.clone(),
    })
}

/// True for an IP loopback literal (127.0.0.0/8, ::1) and for `localhost`.
pub fn is_loopback(e: &Endpoint) -> bool {
    if e.is_ip {
        return e.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    }
    e.host == "localhost"
}
