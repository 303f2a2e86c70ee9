//! How far llmroute trusts etcd, and what it shows etcd: the user and password it authenticates with (`auth`, in
//! `discovery.etcd` and `affinity.placement_store.etcd`), and what an instance registered under a discovered
//! backend's prefix may claim (`allow_loopback`, `max_weight`).
//!
//! - The password never enters the config: `auth.password_env` names the environment variable that holds it.
//!   Like a backend token, it must not cross the network in clear text, so `auth` needs `tls` unless every etcd
//!   endpoint is loopback.
//! - Anyone who can write under the prefix can register an address, so `llmroute discover` refuses addresses that
//!   would turn Envoy on itself or its host (loopback, link-local, unspecified, multicast, Envoy's own admin and
//!   listener). Loopback is the one a config may allow (a single-host fleet, tests, the demo). A registered weight
//!   above `max_weight` is cut to it, so one registration cannot draw most of the traffic.

use serde::Deserialize;

use super::{Diagnostics, Endpoint};

/// `discovery.etcd.auth` and `affinity.placement_store.etcd.auth`: etcd's own user authentication.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEtcdAuth {
    /// The etcd user name.
    pub user: String,
    /// The environment variable that holds the user's password.
    pub password_env: String,
}

/// A validated `auth` block: the user, and the name (never the value) of the password's variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    pub user: String,
    pub password_env: String,
}

/// Longest etcd user name accepted.
pub const MAX_USER: usize = 128;
/// Longest environment variable name accepted.
pub const MAX_ENV_NAME: usize = 128;
/// The most `max_weight` may be, and its default: the largest weight a registration may carry.
pub const MAX_WEIGHT: u32 = 1000;
/// Default `max_weight`: the largest `slots` a registration may carry, so a `slots`-weighted host is never cut.
pub const DEFAULT_MAX_WEIGHT: u32 = 256;

/// True for an environment variable name: `A-Z a-z 0-9 _`, not starting with a digit, 1 to [`MAX_ENV_NAME`] bytes.
pub fn env_name_ok(name: &str) -> bool {
    (1..=MAX_ENV_NAME).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// Validates the `auth` block of the etcd block at `at` (errors named `AT.auth.FIELD`). `endpoints` are the etcd
/// members; without `tls`, each must be loopback, or the password would cross the network in clear text.
pub fn etcd_auth(
    errs: &mut Diagnostics,
    at: &str,
    raw: Option<&RawEtcdAuth>,
    has_tls: bool,
    endpoints: &[Endpoint],
) -> Option<EtcdAuth> {
    let a = raw?;
    let user_ok = (1..=MAX_USER).contains(&a.user.len()) && !a.user.chars().any(|c| c.is_control());
    if !user_ok {
        errs.push(
            format!("{at}.auth.user"),
            format!("{:?}", a.user),
            format!("must be an etcd user name of 1 to {MAX_USER} bytes without control characters"),
        );
    }
    if !env_name_ok(&a.password_env) {
        errs.push(
            format!("{at}.auth.password_env"),
            &a.password_env,
            format!(
                "must be the name of the environment variable that holds the password: A-Z a-z 0-9 _, not \
                 starting with a digit, at most {MAX_ENV_NAME} bytes"
            ),
        );
    }
    if let (false, Some(e)) = (has_tls, endpoints.iter().find(|e| !super::tls::is_loopback(e))) {
        errs.push(
            format!("{at}.auth"),
            &a.user,
            format!(
                "without `tls` the password would reach {e} unencrypted, and that member is not loopback; add \
                 `tls: {{ ca_file: ... }}` to {at}, or remove `auth`"
            ),
        );
    }
    Some(EtcdAuth {
        user: a.user.clone(),
        password_env: a.password_env.clone(),
    })
}

/// `AT.max_weight`: 1 to [`MAX_WEIGHT`], default [`DEFAULT_MAX_WEIGHT`].
pub fn max_weight(errs: &mut Diagnostics, at: &str, raw: Option<u32>) -> u32 {
    let w = raw.unwrap_or(DEFAULT_MAX_WEIGHT);
    if !(1..=MAX_WEIGHT).contains(&w) {
        errs.push(
            format!("{at}.max_weight"),
            w,
            format!("must be between 1 and {MAX_WEIGHT} (the largest weight one registered instance may get)"),
        );
    }
    w
}
