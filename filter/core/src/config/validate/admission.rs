//! `auth` and `global_limits`: who may send, and the limits shared through Envoy's rate-limit service.

use super::*;

pub(super) fn auth(errs: &mut Diagnostics, a: &RawAuth) -> Auth {
    let name = &a.keys_env;
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if !ok {
        errs.push(
            "auth.keys_env",
            name,
            "must be an environment variable name: A-Z a-z 0-9 _, not starting with a digit, at most 128 bytes; \
             the variable holds `name:token` pairs separated by commas",
        );
    }
    let mut key_limits: Vec<(String, RateLimits)> = Vec::new();
    let pairs = a.key_limits.as_ref().map_or(&[][..], |k| k.0.as_slice());
    if pairs.len() > crate::auth::MAX_KEYS {
        errs.push(
            "auth.key_limits",
            pairs.len(),
            format!(
                "names more keys than the {} a keys variable may hold",
                crate::auth::MAX_KEYS
            ),
        );
    }
    for (key, raw) in pairs {
        let field = format!("auth.key_limits.{key}");
        if !crate::auth::name_ok(key) {
            errs.push(
                &field,
                key,
                format!(
                    "a key name is 1 to {} characters of A-Z a-z 0-9 _ . -, as in the keys variable",
                    crate::auth::NAME_MAX
                ),
            );
        } else if key_limits.iter().any(|(k, _)| k == key) {
            errs.push(&field, key, "the key is named twice; give it one limits block");
        }
        if let Some(l) = rate_limits(errs, &field, Some(raw)) {
            key_limits.push((key.clone(), l));
        }
    }
    Auth {
        keys_env: name.clone(),
        limits: rate_limits(errs, "auth.limits", a.limits.as_ref()),
        key_limits,
    }
}

/// `global_limits`: the service's address, its domain, the timeout and what to do when it cannot answer.
pub(super) fn global_limits(errs: &mut Diagnostics, g: &RawGlobalLimits) -> Option<GlobalLimits> {
    let address = parse_endpoint(&g.address)
        .map_err(|reason| {
            errs.push(
                "global_limits.address",
                &g.address,
                match port_hint(&g.address, 8081, "the rate-limit service's gRPC port") {
                    Some(hint) => format!("{reason}{hint}"),
                    None => format!("{reason}; write the rate-limit service's gRPC address, such as 127.0.0.1:8081"),
                },
            )
        })
        .ok();
    let domain = g.domain.clone().unwrap_or_else(|| "llmroute".into());
    let domain_ok =
        (1..=64).contains(&domain.len()) && domain.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if !domain_ok {
        errs.push(
            "global_limits.domain",
            format!("{domain:?}"),
            "must be 1 to 64 characters of A-Z a-z 0-9 _ . - (the `domain` of the rate-limit service's config)",
        );
    }
    let timeout_ms = g.timeout_ms.unwrap_or(100);
    if !(1..=10_000).contains(&timeout_ms) {
        errs.push(
            "global_limits.timeout_ms",
            timeout_ms,
            "must be between 1 and 10000: every admitted request waits for the service this long at most",
        );
    }
    let failure_mode_allow = match g.failure_mode.as_deref() {
        None | Some("allow") => true,
        Some("deny") => false,
        Some(other) => {
            errs.push(
                "global_limits.failure_mode",
                other,
                "must be `allow` (requests go on when the service cannot answer) or `deny` (they get a 503)",
            );
            true
        }
    };
    let default_max_tokens = g.default_max_tokens.unwrap_or(super::rates::DEFAULT_MAX_TOKENS);
    if !(1..=10_000_000).contains(&default_max_tokens) {
        errs.push(
            "global_limits.default_max_tokens",
            default_max_tokens,
            "must be between 1 and 10000000 (output tokens charged when a request names no max_tokens and no usage is reported)",
        );
    }
    Some(GlobalLimits {
        address: address?,
        domain,
        timeout_ms,
        failure_mode_allow,
        default_max_tokens,
    })
}
