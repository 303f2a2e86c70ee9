//! The environment variables a config names, and whether an environment holds what Envoy will need.
//!
//! `auth.keys_env` and `backends[].credential_env` name variables that Envoy reads from its own environment when
//! it starts: without the keys (or with keys the filter cannot parse) `on_configure` fails, and a bootstrap whose
//! credential variable is unset is refused (`Environment variable doesn't exist`). Either way Envoy does not start.
//! An empty credential variable is worse: Envoy starts, and answers every request for that backend with 401.
//! The validator cannot see Envoy's environment, so these checks take the environment to read as a function:
//! `llmroute validate` and `llmroute render` pass their own and print what is missing. A problem names the field
//! and the variable, never a value.

use super::{Config, ConfigError};
use crate::auth;

/// What a variable must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvHolds {
    /// `auth.keys_env`: `name:token` pairs separated by commas, read by the filter.
    ApiKeys,
    /// `backends[].credential_env`: the bearer token Envoy sends to that backend.
    BearerToken,
}

/// One environment variable the config names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvVar<'c> {
    /// The field that names it, such as `backends[1].credential_env`.
    pub field: String,
    /// The variable's name.
    pub name: &'c str,
    pub holds: EnvHolds,
}

impl Config {
    /// Every environment variable Envoy must have for this config, in document order.
    pub fn env_vars(&self) -> Vec<EnvVar<'_>> {
        let mut vars: Vec<EnvVar<'_>> = self
            .backends
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                b.credential_env.as_deref().map(|name| EnvVar {
                    field: format!("backends[{i}].credential_env"),
                    name,
                    holds: EnvHolds::BearerToken,
                })
            })
            .collect();
        if let Some(a) = &self.auth {
            vars.push(EnvVar {
                field: "auth.keys_env".into(),
                name: &a.keys_env,
                holds: EnvHolds::ApiKeys,
            });
        }
        vars
    }
}

/// The variables of [`Config::env_vars`] that an environment lacks, or holds in a form the filter refuses, each
/// with the reason Envoy would not start. `lookup` returns a variable's value, `None` when it is unset.
pub fn env_problems(cfg: &Config, lookup: impl Fn(&str) -> Option<String>) -> Vec<ConfigError> {
    let problem = |v: &EnvVar<'_>, reason: String| ConfigError {
        field: v.field.clone(),
        value: v.name.to_string(),
        reason,
    };
    cfg.env_vars()
        .iter()
        .filter_map(|v| match (v.holds, lookup(v.name)) {
            (EnvHolds::ApiKeys, None) => Some(problem(
                v,
                "not set in this environment; the filter refuses to start without it, so Envoy needs it in its own \
                 environment: `name:token` pairs separated by commas"
                    .into(),
            )),
            (EnvHolds::ApiKeys, Some(text)) => auth::parse_keys(&text).err().map(|reason| {
                problem(
                    v,
                    format!("the filter would refuse this variable's value, and Envoy would not start: {reason}"),
                )
            }),
            (EnvHolds::BearerToken, None) => Some(problem(
                v,
                "not set in this environment; Envoy refuses to start without it (`Environment variable doesn't \
                 exist`), so Envoy needs it in its own environment: the backend's bearer token"
                    .into(),
            )),
            (EnvHolds::BearerToken, Some(token)) if token.is_empty() => Some(problem(
                v,
                "empty in this environment; with it empty Envoy starts, but answers every request for this backend \
                 with 401 and never reaches the engine"
                    .into(),
            )),
            (EnvHolds::BearerToken, Some(_)) => None,
        })
        .collect()
}
