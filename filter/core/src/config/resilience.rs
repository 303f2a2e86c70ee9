//! Config for what Envoy does when engines fail or fill up: active health checks, outlier ejection, retries,
//! circuit breakers (TLS and backend credentials are in [`super::tls`]). Raw shapes and their validation live together here, because
//! each setting's defaults depend on the engine kind and the endpoint count.
//!
//! Settings that would silently do nothing are reported as warnings, not errors: the file still loads, and
//! `llmroute validate` prints them.

use serde::Deserialize;

use super::{Diagnostics, EngineKind};

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

/// The checks of one backend's settings, writing into the config's one [`Diagnostics`] with every field named
/// under `at` (`backends[2]`).
pub struct Checker<'a> {
    pub diag: &'a mut Diagnostics,
    pub at: String,
}

impl Checker<'_> {
    pub(super) fn error(&mut self, field: &str, value: impl ToString, reason: impl Into<String>) {
        self.diag.push(format!("{}.{field}", self.at), value, reason);
    }

    fn warn(&mut self, field: &str, value: impl ToString, reason: impl Into<String>) {
        self.diag.warn(format!("{}.{field}", self.at), value, reason);
    }

    fn range(&mut self, field: &str, v: u64, lo: u64, hi: u64) {
        self.diag.range(&format!("{}.{field}", self.at), v, lo, hi);
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
pub fn retries(raw: Option<&RawRetries>, diag: &mut Diagnostics) -> Retries {
    let r = Retries {
        attempts: raw.and_then(|r| r.attempts).unwrap_or(2),
        per_try_timeout_ms: raw.and_then(|r| r.per_try_timeout_ms).unwrap_or(0),
    };
    if r.attempts > 10 {
        diag.push("retries.attempts", r.attempts, "must be at most 10");
    }
    if r.attempts == 0 && r.per_try_timeout_ms > 0 {
        diag.warn(
            "retries.per_try_timeout_ms",
            r.per_try_timeout_ms,
            "applies to the single attempt only, since retries are off",
        );
    }
    r
}
