//! Admission glue: the API keys, read once per VM from the environment, and the limit buckets, kept in Envoy's
//! shared data through compare-and-swap. The decisions are `llmroute_core::auth` and `llmroute_core::limits`.
//!
//! The keys reach the VM through the Wasm VM's `environment_variables.host_env_keys` (see `llmroute render`),
//! which Envoy serves to WASI's `environ_get`, so `std::env::var` reads them. Only key *names* are ever logged
//! or used in metric names.

use llmroute_core::auth::{self, Keys};
use llmroute_core::limits::{self, Charge, Denied, Kind};

use llmroute_core::{Config, GatewayError};

use crate::host::Envoy;

/// The fewest requests and tokens left in the buckets a request was charged to.
#[derive(Debug, Clone, Copy, Default)]
pub struct Remaining {
    pub requests: Option<u64>,
    pub tokens: Option<u64>,
}

impl Remaining {
    /// The fewest of both.
    pub fn least(self, other: Remaining) -> Remaining {
        let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Remaining {
            requests: min(self.requests, other.requests),
            tokens: min(self.tokens, other.tokens),
        }
    }
}

/// The configured keys, from the variable `auth.keys_env` names. The error names the variable, never a value.
pub fn load_keys(cfg: &Config) -> Result<Option<Keys>, String> {
    let Some(a) = &cfg.auth else { return Ok(None) };
    let var = &a.keys_env;
    let text = std::env::var(var).map_err(|_| {
        format!(
            "auth.keys_env: the variable {var} is not set in the VM's environment (or not UTF-8); set it in Envoy's \
             environment and list it in the wasm vm_config's environment_variables.host_env_keys (`llmroute \
             render` does)"
        )
    })?;
    let keys = auth::parse_keys(&text).map_err(|reason| format!("auth.keys_env: the variable {var}: {reason}"))?;
    for name in auth::unknown_names(&keys, a.key_limits.iter().map(|(n, _)| n.as_str())) {
        log::warn!("llmroute: auth.key_limits.{name}: no key of that name in {var}; its budget applies to nobody");
    }
    Ok(Some(keys))
}

/// The limit buckets in Envoy's shared data. A failed read is an error, never an absent (full) bucket.
struct Buckets<'e>(&'e Envoy);

impl limits::BucketStore for Buckets<'_> {
    fn read(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), limits::ReadFailed> {
        self.0.try_shared_data(key).ok_or(limits::ReadFailed)
    }

    fn write(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
        self.0.set_shared_data(key, value, cas)
    }
}

/// Seeds every bucket full, once per process: only an entry the host says is absent is written, so neither an
/// entry already there nor one the host failed to read is reset.
pub fn seed(envoy: &Envoy, cfg: &Config, keys: Option<&Keys>) {
    let now = envoy.now_ms();
    let names: Vec<&str> = keys.map(|k| k.names().collect()).unwrap_or_default();
    for (key, rate) in limits::all_buckets(cfg, names.into_iter()) {
        if let Some((None, _)) = envoy.try_shared_data(&key) {
            envoy.set_shared_data(&key, &limits::Bucket::full(rate, now).encode(), None);
        }
    }
}

/// The output bound to write into a request that names none (`inject_max_tokens`): see
/// `limits::output_to_inject`. Reads the request's token buckets only when a block asks for a bound.
pub fn output_bound(envoy: &Envoy, cfg: &Config, alias: &str, key: Option<&str>, input: u64) -> Option<u64> {
    limits::output_to_inject(cfg, alias, key, input, |bucket, rate| {
        limits::tokens_left(&Buckets(envoy), bucket, rate, envoy.now_ms())
    })
}

/// Takes every charge or none. A refusal becomes the 429 (or the 503 of contention) to send; the request
/// context counts it (`llmroute_rate_limited_total`, `llmroute_rejections_total`). `Ok` holds the fewest
/// requests and tokens left in any bucket charged, for the debug headers.
pub fn admit(envoy: &Envoy, charges: &[Charge]) -> Result<Remaining, GatewayError> {
    if charges.is_empty() {
        return Ok(Remaining::default());
    }
    match limits::admit(&mut Buckets(envoy), charges, envoy.now_ms()) {
        Ok(left) => {
            let least = |kind| {
                charges
                    .iter()
                    .zip(&left)
                    .filter(|(c, _)| c.kind == kind)
                    .map(|(_, &n)| n)
                    .min()
            };
            Ok(Remaining {
                requests: least(Kind::Requests),
                tokens: least(Kind::Tokens),
            })
        }
        Err(Denied::Limited {
            scope,
            name,
            kind,
            retry_after_ms,
        }) => Err(GatewayError::RateLimited {
            scope,
            name,
            kind,
            retry_after_s: retry_after_ms.div_ceil(1000).max(1),
        }),
        Err(Denied::Contention) => {
            log::warn!("llmroute: limit buckets under contention; request refused");
            Err(GatewayError::LimitContention)
        }
        Err(Denied::Unreadable) => {
            log::warn!("llmroute: a limit bucket could not be read; request refused");
            Err(GatewayError::LimitUnavailable)
        }
    }
}

/// Gives back everything `charges` took, for a request the gateway refused after taking them (it holds nothing).
pub fn give_back(envoy: &Envoy, charges: &[Charge]) {
    let now = envoy.now_ms();
    for c in charges {
        limits::give(&mut Buckets(envoy), c, c.amount, false, now);
    }
}

/// Settles an admitted request's token charges on the tokens the engine reported.
pub fn settle(envoy: &Envoy, charges: &[Charge], used: u64) {
    limits::settle(&mut Buckets(envoy), charges, used, envoy.now_ms());
}
