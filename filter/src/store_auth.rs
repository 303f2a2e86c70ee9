//! The placement store's etcd user authentication, host side (`affinity.placement_store.etcd.auth`).
//!
//! - The password is read once per VM, at configuration, from the variable `auth.password_env` names (Envoy serves
//!   it to WASI's `environ_get` when the wasm `vm_config.environment_variables.host_env_keys` lists it, which
//!   `llmroute render` does). Unset or empty, the configuration is refused, naming the variable, and Envoy does
//!   not start. It stays in the root context: it is sent only in the body of `/v3/auth/authenticate`, and never
//!   logged, put in shared data, or shown on the status page.
//! - The token etcd trades for it is shared data ([`shared::STORE_TOKEN`]), so every worker's calls to the store
//!   carry it as `Authorization`. The root context that holds the store's sync lease authenticates when there is
//!   no token. Any call answered 401 (`invalid auth token`: etcd restarted, or the token expired) forgets it, so
//!   the next round authenticates again. A refused password is logged (never the password) and tried again after
//!   [`RETRY_REFUSED_MS`].
//! - While there is no token, a new key's request does not wait for etcd: it is placed locally and settled once
//!   the store answers, as during an outage.

use llmroute_core::envoy_contract::shared;
use llmroute_core::etcd_json;
use llmroute_core::Config;

use crate::host::Envoy;

/// How long after etcd refused the user and password the root context tries again.
pub const RETRY_REFUSED_MS: u64 = 10_000;

/// The etcd user and its password. `Debug` shows the user only.
pub struct Credentials {
    pub user: String,
    password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// The `/v3/auth/authenticate` body.
    pub fn body(&self) -> String {
        etcd_json::authenticate_body(&self.user, &self.password)
    }
}

/// The store's credentials, when it has `auth`; the error names the variable, never a value.
pub fn load(cfg: &Config) -> Result<Option<Credentials>, String> {
    let Some(a) = cfg.affinity.placement_store.as_ref().and_then(|s| s.auth.as_ref()) else {
        return Ok(None);
    };
    let var = &a.password_env;
    match std::env::var(var) {
        Ok(password) if !password.is_empty() => Ok(Some(Credentials {
            user: a.user.clone(),
            password,
        })),
        _ => Err(format!(
            "affinity.placement_store.etcd.auth.password_env: the variable {var} is not set in the VM's environment \
             (or empty, or not UTF-8); set it to etcd user {}'s password in Envoy's environment and list it in the \
             wasm vm_config's environment_variables.host_env_keys (`llmroute render` does)",
            a.user
        )),
    }
}

/// The token the store's calls carry, when there is one.
pub fn token(envoy: &Envoy) -> Option<String> {
    let bytes = envoy.shared_data(shared::STORE_TOKEN).0?;
    String::from_utf8(bytes).ok().filter(|t| !t.is_empty())
}

/// Keeps the token etcd gave for every worker's calls.
pub fn keep(envoy: &Envoy, token: &str) {
    envoy.set_shared_data(shared::STORE_TOKEN, token.as_bytes(), None);
}

/// etcd no longer knows the token (it answered 401): forget it, so the root context authenticates again.
pub fn forget(envoy: &Envoy) {
    envoy.set_shared_data(shared::STORE_TOKEN, b"", None);
}
