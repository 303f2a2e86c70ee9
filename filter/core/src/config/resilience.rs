//! Config for what Envoy does when engines fail or fill up: active health checks, outlier ejection, retries,
//! circuit breakers, TLS and backend credentials. Raw shapes and their validation live together here, because
//! each setting's defaults depend on the engine kind and the endpoint count.
//!
//! Settings that would silently do nothing are reported as warnings, not errors: the file still loads, and
//! `llmroute validate` prints them.

use serde::Deserialize;

use super::{ConfigError, Endpoint, EngineKind};

/// `backends[].health`: Envoy active health checking.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    /// `auto` (the default) picks the path by engine kind; `off` disables checks; otherwise a path like `/health`.
    #[serde(default)]
    pub path: Option<String>,
    /// Default 1000.
    #[serde(default)]
    pub interval_ms: Option<u64>,
    /// Default 1000.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Failed checks before a host leaves rotation. Default 2.
    #[serde(default)]
    pub unhealthy: Option<u32>,
    /// Passed checks before it returns. Default 1.
    #[serde(default)]
    pub healthy: Option<u32>,
}

/// `backends[].outlier`: passive ejection on consecutive 5xx.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOutlier {
    /// Consecutive 5xx that eject a host; 0 turns ejection off. Default 3.
    #[serde(default)]
    pub consecutive_5xx: Option<u32>,
    /// First ejection time; Envoy multiplies it by the number of ejections. Default 10000.
    #[serde(default)]
    pub base_ejection_ms: Option<u64>,
    /// The most of a backend that may be ejected at once, percent. Default 50.
    #[serde(default)]
    pub max_ejection_percent: Option<u32>,
}

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

/// `retries`: retries before the first response byte.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetries {
    /// Retries after the first attempt, each on a different host. Default 2; 0 turns retries off.
    #[serde(default)]
    pub attempts: Option<u32>,
    /// Timeout of each attempt, in milliseconds; 0 (the default) leaves attempts bounded by the route timeout only.
    #[serde(default)]
    pub per_try_timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub path: String,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub unhealthy: u32,
    pub healthy: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outlier {
    pub consecutive_5xx: u32,
    pub base_ejection_ms: u64,
    pub max_ejection_percent: u32,
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retries {
    pub attempts: u32,
    pub per_try_timeout_ms: u64,
}

/// The health path of each engine kind. llama.cpp answers 503 on `/health` while its model loads.
pub fn default_health_path(kind: EngineKind) -> &'static str {
    match kind {
        EngineKind::LlamaCpp | EngineKind::Vllm | EngineKind::Sglang => "/health",
        EngineKind::Ollama => "/api/version",
        EngineKind::OpenAi => "/v1/models",
    }
}

/// Collects errors and warnings for one backend's resilience settings.
pub struct Checker<'a> {
    pub errors: &'a mut Vec<ConfigError>,
    pub warnings: &'a mut Vec<ConfigError>,
    pub at: String,
}

impl Checker<'_> {
    fn error(&mut self, field: &str, value: impl ToString, reason: impl Into<String>) {
        self.errors.push(ConfigError {
            field: format!("{}.{field}", self.at),
            value: value.to_string(),
            reason: reason.into(),
        });
    }

    fn warn(&mut self, field: &str, value: impl ToString, reason: impl Into<String>) {
        self.warnings.push(ConfigError {
            field: format!("{}.{field}", self.at),
            value: value.to_string(),
            reason: reason.into(),
        });
    }

    fn range(&mut self, field: &str, v: u64, lo: u64, hi: u64) {
        if !(lo..=hi).contains(&v) {
            self.error(field, v, format!("must be between {lo} and {hi}"));
        }
    }

    /// `None` when checks are off.
    pub fn health(&mut self, raw: Option<&RawHealth>, kind: EngineKind) -> Option<Health> {
        let path = raw.and_then(|h| h.path.clone()).unwrap_or_else(|| "auto".into());
        let h = Health {
            path: match path.as_str() {
                "auto" => default_health_path(kind).to_string(),
                _ => path.clone(),
            },
            interval_ms: raw.and_then(|h| h.interval_ms).unwrap_or(1000),
            timeout_ms: raw.and_then(|h| h.timeout_ms).unwrap_or(1000),
            unhealthy: raw.and_then(|h| h.unhealthy).unwrap_or(2),
            healthy: raw.and_then(|h| h.healthy).unwrap_or(1),
        };
        if path == "off" {
            if raw.is_some_and(|r| r.interval_ms.is_some() || r.timeout_ms.is_some()) {
                self.warn(
                    "health",
                    "off",
                    "interval_ms and timeout_ms do nothing while health checks are off",
                );
            }
            return None;
        }
        if !h.path.starts_with('/') || h.path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            self.error(
                "health.path",
                &path,
                "must be auto, off, or an absolute path such as /health",
            );
        }
        self.range("health.interval_ms", h.interval_ms, 100, 600_000);
        self.range("health.timeout_ms", h.timeout_ms, 10, 600_000);
        self.range("health.unhealthy", h.unhealthy.into(), 1, 100);
        self.range("health.healthy", h.healthy.into(), 1, 100);
        Some(h)
    }

    /// `None` when ejection is off.
    pub fn outlier(&mut self, raw: Option<&RawOutlier>, endpoints: usize) -> Option<Outlier> {
        let o = Outlier {
            consecutive_5xx: raw.and_then(|o| o.consecutive_5xx).unwrap_or(3),
            base_ejection_ms: raw.and_then(|o| o.base_ejection_ms).unwrap_or(10_000),
            max_ejection_percent: raw.and_then(|o| o.max_ejection_percent).unwrap_or(50),
        };
        if o.consecutive_5xx == 0 {
            if raw.is_some_and(|r| r.base_ejection_ms.is_some() || r.max_ejection_percent.is_some()) {
                self.warn(
                    "outlier",
                    "consecutive_5xx: 0",
                    "ejection is off, so its other settings do nothing",
                );
            }
            return None;
        }
        self.range("outlier.consecutive_5xx", o.consecutive_5xx.into(), 1, 1000);
        self.range("outlier.base_ejection_ms", o.base_ejection_ms, 100, 86_400_000);
        self.range("outlier.max_ejection_percent", o.max_ejection_percent.into(), 1, 100);
        // Envoy ejects only while the ejected share stays within the maximum, so one host of n is 100/n percent.
        let one_host = 100u32.div_ceil(endpoints.max(1) as u32);
        // Only when the operator configured ejection: the default on a one-host backend is not worth a warning.
        if raw.is_some() && o.max_ejection_percent < one_host {
            self.warn(
                "outlier.max_ejection_percent",
                o.max_ejection_percent,
                format!("too low to ever eject one of {endpoints} host(s); it needs at least {one_host}"),
            );
        }
        Some(o)
    }

    pub fn tls(&mut self, raw: Option<&RawUpstreamTls>) -> Option<UpstreamTls> {
        let t = raw?;
        if t.ca_file.is_empty() {
            self.error("tls.ca_file", "\"\"", "a CA bundle is needed to verify the engines");
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

    /// KV-event routing and prefill/decode disaggregation: impossible on llama.cpp, reserved elsewhere.
    pub fn reserved(&mut self, kind: EngineKind, kv_events: Option<bool>, disaggregation: Option<&str>) {
        let used = [
            ("kv_events", kv_events.is_some()),
            ("disaggregation", disaggregation.is_some()),
        ];
        for (field, set) in used {
            match (set, kind) {
                (false, _) => {}
                (true, EngineKind::LlamaCpp) => self.error(
                    field,
                    "set",
                    "llama.cpp has neither a KV-event plane nor prefill/decode disaggregation",
                ),
                (true, _) => self.warn(field, "set", "reserved for a future release; it does nothing yet"),
            }
        }
    }
}

/// Validates `retries`.
pub fn retries(raw: Option<&RawRetries>, errors: &mut Vec<ConfigError>, warnings: &mut Vec<ConfigError>) -> Retries {
    let r = Retries {
        attempts: raw.and_then(|r| r.attempts).unwrap_or(2),
        per_try_timeout_ms: raw.and_then(|r| r.per_try_timeout_ms).unwrap_or(0),
    };
    if r.attempts > 10 {
        errors.push(ConfigError {
            field: "retries.attempts".into(),
            value: r.attempts.to_string(),
            reason: "must be at most 10".into(),
        });
    }
    if r.attempts == 0 && r.per_try_timeout_ms > 0 {
        warnings.push(ConfigError {
            field: "retries.per_try_timeout_ms".into(),
            value: r.per_try_timeout_ms.to_string(),
            reason: "applies to the single attempt only, since retries are off".into(),
        });
    }
    r
}

/// Validates `listen_tls`.
pub fn listen_tls(raw: Option<&RawListenTls>, errors: &mut Vec<ConfigError>) -> Option<ListenTls> {
    let t = raw?;
    for (field, v) in [
        ("listen_tls.cert_file", &t.cert_file),
        ("listen_tls.key_file", &t.key_file),
    ] {
        if v.is_empty() {
            errors.push(ConfigError {
                field: field.into(),
                value: "\"\"".into(),
                reason: "a PEM file path is needed".into(),
            });
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
