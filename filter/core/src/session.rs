//! Explicit session keys from request headers, read before the body names the alias and chosen after it.
//!
//! Each alias may read its own `session_headers` (`models[].affinity`), but the headers phase runs before the
//! body is buffered, so it cannot know the alias yet. It captures every header any alias reads
//! ([`Config::session_header_names`], at most 16 per list), each value checked once and kept only when it is a
//! valid key (1 to 256 bytes of visible ASCII, 0x21-0x7E), else only the reason it is not. Once the alias is
//! known, the first of *its* headers that the request carries is the key; a bad value there is the client's
//! error, and a bad value in a header the alias does not read is ignored. Header values are held to visible
//! ASCII, stricter than the body's keys: a space, an obs-text byte or UTF-8 is read differently by proxies and
//! SDKs on the way, so the same session could be keyed two ways. Cost: one look-up per configured name, per
//! request.

use crate::affinity::{self, Affinity, AffinitySource};
use crate::config::{AffinityConfig, Config};
use crate::error::GatewayError;

/// An explicit session id read from a request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionKey {
    pub value: String,
    pub affinity: Affinity,
}

/// The configured session headers a request carried, in [`Config::session_header_names`] order: for each, the
/// key, or why its value cannot be one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionHeaders(Vec<(String, Result<SessionKey, &'static str>)>);

impl SessionHeaders {
    /// Captures the configured session headers. `header` returns a header's value by lower-case name.
    pub fn read<'h>(cfg: &Config, header: impl Fn(&str) -> Option<&'h [u8]>) -> SessionHeaders {
        let found = cfg
            .session_header_names()
            .iter()
            .filter_map(|name| {
                let v = header(name)?;
                let key = check_value(v).map(|()| SessionKey {
                    value: String::from_utf8_lossy(v).into_owned(),
                    affinity: affinity::explicit(v, AffinitySource::SessionHeader),
                });
                Some((name.clone(), key))
            })
            .collect();
        SessionHeaders(found)
    }

    /// The key for a reader of `names` (lower case, in order): the first of them the request carried. Its value
    /// must be a valid key; the others are not looked at.
    pub fn first(&self, names: &[String]) -> Result<Option<SessionKey>, GatewayError> {
        let Some((name, key)) = names.iter().find_map(|n| self.0.iter().find(|(have, _)| have == n)) else {
            return Ok(None);
        };
        match key {
            Ok(k) => Ok(Some(k.clone())),
            Err(reason) => Err(GatewayError::InvalidSessionHeader {
                header: name.clone(),
                reason,
            }),
        }
    }
}

/// Checks a session header's value: a valid explicit key ([`affinity::check_explicit`]) made only of visible
/// ASCII (0x21-0x7E).
pub fn check_value(v: &[u8]) -> Result<(), &'static str> {
    affinity::check_explicit(v)?;
    if v.iter().any(|b| !(0x21..=0x7e).contains(b)) {
        return Err("the value has a space or a byte outside visible ASCII (0x21-0x7E)");
    }
    Ok(())
}

/// Where a request's explicit session key comes from, once its alias' affinity is known.
pub trait SessionSource {
    fn key_for(&self, affinity: &AffinityConfig) -> Result<Option<SessionKey>, GatewayError>;
}

/// The headers a request carried: the alias' own `session_headers` pick the key.
impl SessionSource for &SessionHeaders {
    fn key_for(&self, affinity: &AffinityConfig) -> Result<Option<SessionKey>, GatewayError> {
        self.first(&affinity.session_headers)
    }
}

/// A key chosen ahead of the alias (tools, tests, benches): used whatever the alias reads.
impl SessionSource for Option<&SessionKey> {
    fn key_for(&self, _: &AffinityConfig) -> Result<Option<SessionKey>, GatewayError> {
        Ok(self.cloned())
    }
}

/// The key the top-level `session_headers` give, which every alias without its own list reads.
pub fn session_from_headers<'h>(
    cfg: &Config,
    header: impl Fn(&str) -> Option<&'h [u8]>,
) -> Result<Option<SessionKey>, GatewayError> {
    SessionHeaders::read(cfg, header).first(&cfg.affinity.session_headers)
}
