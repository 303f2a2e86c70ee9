//! The headers-phase decision: what a request asks for, in which error dialect, whether its media type is
//! acceptable, and its explicit session key, all before any body byte is buffered.
//!
//! Content-Type must be JSON and Content-Encoding absent or `identity`: the gateway reads the body, and it
//! must read exactly what the engine will read, so compressed or non-JSON bodies are refused with 415.

use crate::auth::{self, Keys};
use crate::config::Config;
use crate::endpoint::{classify, Api, Endpoint, Envelope};
use crate::error::GatewayError;
use crate::session::SessionHeaders;
use crate::status::StatusPage;

/// A request the filter will handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestStart {
    pub endpoint: Endpoint,
    pub envelope: Envelope,
    /// The configured session headers it carried; the alias, known from the body, picks its key.
    pub session: SessionHeaders,
}

/// A request refused in the headers phase, with the dialect to refuse it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub error: GatewayError,
    pub envelope: Envelope,
}

/// The longest request id kept as sent.
pub const REQUEST_ID_MAX: usize = 128;

/// Decides what to do with a request from its method, path and headers (`header` looks up lower-case names).
pub fn start<'h>(
    cfg: &Config,
    method: &str,
    path: &str,
    header: impl Fn(&str) -> Option<&'h [u8]>,
) -> Result<RequestStart, Refusal> {
    let wants_anthropic = header("anthropic-version").is_some();
    let bare = path.split(['?', '#']).next().unwrap_or_default();
    let fallback = match Api::ALL.into_iter().find(|a| a.path() == bare) {
        Some(api) => api.envelope(),
        None => Envelope::OpenAi,
    };
    let refuse = |error, envelope| Refusal { error, envelope };
    let endpoint = classify(method, path).map_err(|e| refuse(e, fallback))?;
    let envelope = match &endpoint {
        Endpoint::Inference(api) => api.envelope(),
        _ if wants_anthropic => Envelope::Anthropic,
        _ => Envelope::OpenAi,
    };
    let mut session = SessionHeaders::default();
    if let Endpoint::Inference(_) = endpoint {
        check_media_type(header("content-type"), header("content-encoding")).map_err(|e| refuse(e, envelope))?;
        session = SessionHeaders::read(cfg, &header);
        if cfg.session_headers_shared() {
            // Every alias reads the top-level list: a bad value is refused before any body byte is buffered.
            session
                .first(&cfg.affinity.session_headers)
                .map_err(|e| refuse(e, envelope))?;
        }
    }
    Ok(RequestStart {
        endpoint,
        envelope,
        session,
    })
}

/// The API-key check of the headers phase, before anything else is decided. `Ok(None)`: the path is open
/// (`/healthz`, `/readyz`) and no key is asked for; `Ok(Some(name))`: the key's name. `headers` are every request
/// header as sent (lower-case names), duplicates included. A refusal is a 401 in the path's dialect.
pub fn authenticate(
    keys: &Keys,
    method: &str,
    path: &str,
    headers: &[(String, Vec<u8>)],
) -> Result<Option<String>, Refusal> {
    let bare = path.split(['?', '#']).next().unwrap_or_default();
    if let Ok(Endpoint::Status(StatusPage::Healthz | StatusPage::Readyz)) = classify(method, path) {
        return Ok(None);
    }
    let values = |name: &str| -> Vec<&[u8]> {
        headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
            .collect()
    };
    let messages = bare == Api::Messages.path();
    match auth::check(keys, &values("authorization"), &values("x-api-key")) {
        Ok(name) => Ok(Some(name.to_string())),
        Err(reason) => {
            let anthropic = messages || headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("anthropic-version"));
            Err(Refusal {
                error: GatewayError::Unauthorized(reason),
                envelope: if anthropic {
                    Envelope::Anthropic
                } else {
                    Envelope::OpenAi
                },
            })
        }
    }
}

/// Content-Type must be `application/json` (parameters allowed); Content-Encoding absent or `identity`.
pub fn check_media_type(content_type: Option<&[u8]>, encoding: Option<&[u8]>) -> Result<(), GatewayError> {
    let text = |v: &[u8]| String::from_utf8_lossy(v).trim().to_ascii_lowercase();
    let ct = content_type.map(text).unwrap_or_default();
    let media = ct.split(';').next().unwrap_or_default().trim();
    if media != "application/json" {
        return Err(GatewayError::UnsupportedMediaType {
            header: "content-type",
            value: if ct.is_empty() {
                "(none)".to_string()
            } else {
                ct.clone()
            },
        });
    }
    if let Some(enc) = encoding.map(text) {
        if !enc.is_empty() && enc != "identity" {
            return Err(GatewayError::UnsupportedMediaType {
                header: "content-encoding",
                value: enc,
            });
        }
    }
    Ok(())
}

/// True for a request id worth keeping: 1 to 128 characters of `A-Z a-z 0-9 - _ . :`.
pub fn request_id_ok(v: &[u8]) -> bool {
    (1..=REQUEST_ID_MAX).contains(&v.len())
        && v.iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types() {
        assert!(check_media_type(Some(b"application/json"), None).is_ok());
        assert!(check_media_type(Some(b"Application/JSON; charset=utf-8"), None).is_ok());
        assert!(check_media_type(Some(b"application/json"), Some(b"identity")).is_ok());
        for bad in [
            &b"text/plain"[..],
            b"application/x-www-form-urlencoded",
            b"application/jsonl",
            b"",
        ] {
            let e = check_media_type(Some(bad), None).unwrap_err();
            assert_eq!(e.status(), 415);
        }
        assert_eq!(check_media_type(None, None).unwrap_err().status(), 415);
        assert_eq!(
            check_media_type(Some(b"application/json"), Some(b"gzip"))
                .unwrap_err()
                .status(),
            415
        );
    }

    #[test]
    fn request_ids() {
        assert!(request_id_ok(b"0f1e2d3c-aaaa-bbbb-cccc-1234567890ab"));
        assert!(request_id_ok(b"req_01:abc.def"));
        assert!(!request_id_ok(b""));
        assert!(!request_id_ok(b"has space"));
        assert!(!request_id_ok(b"quote\"d"));
        assert!(!request_id_ok(&[b'a'; 129]));
    }
}
