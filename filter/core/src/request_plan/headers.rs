//! The headers phase's plan: what the filter does when a request's headers arrive, before any body byte is read.
//!
//! In order: the client's copies of gateway headers are removed (`headers::to_strip`); the request id is kept when
//! well formed, else replaced with a fresh one; the API key is checked (`request::authenticate`); the method and
//! path are classified (`request::start`). A refusal, a status page or a `/v1/models` answer ends the request
//! here. An inference request with no body is refused; else the filter admits the key's request-limit charges
//! (`limits::header_charges`) and reads the body, with the request's fair-queue tenant ([`Tenant`]) and the
//! `content-length` the client sent.

use crate::auth::Keys;
use crate::config::Config;
use crate::config::TenantBy;
use crate::endpoint::{Api, Endpoint, Envelope};
use crate::error::GatewayError;
use crate::json::JsonError;
use crate::limits::{self, Charge};
use crate::request::{self, Refusal};
use crate::session::SessionHeaders;
use crate::status::StatusPage;
use crate::{fairness, headers};

use super::LocalReply;

/// What the filter does with a request's headers.
#[derive(Debug)]
pub struct HeadersPlan<'h> {
    /// The client's copies of gateway headers, removed first.
    pub remove: Vec<&'h str>,
    /// The request's id: the client's when well formed, else a fresh one.
    pub request_id: String,
    /// The id is fresh: the filter sets it on the request, for the engine and the access log.
    pub fresh_id: bool,
    /// The configured name (never the value) of the API key the request presented, for the access log.
    pub key: Option<String>,
    /// The envelope of the request's API, once it is classified (OpenAI until then).
    pub envelope: Envelope,
    pub next: Next,
}

/// What follows the headers.
#[derive(Debug)]
pub enum Next {
    /// Send this reply: the request is refused.
    Reply(LocalReply),
    /// Answer a status page.
    Status(StatusPage),
    /// Answer `/v1/models` (see `request_plan::models_reply`); `query` is the path's query.
    Models { endpoint: Endpoint, query: String },
    /// Charge the key's request limits and read the body.
    Read(ReadBody),
}

/// An inference request whose body the filter reads.
#[derive(Debug)]
pub struct ReadBody {
    pub api: Api,
    /// The configured session headers it carried.
    pub session: SessionHeaders,
    /// The key's request-limit charges, admitted all or none before the body is read.
    pub charges: Vec<Charge>,
    /// With `fairness`, the request's tenant.
    pub tenant: Option<Tenant>,
    /// The `content-length` the client sent (Envoy has checked it is a number).
    pub sent_length: Option<Vec<u8>>,
}

/// A request's fair-queue tenant and how long it may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant {
    pub id: u64,
    pub weight: u32,
    pub wait_ms: u64,
}

/// The plan for a request with headers `all` (lower-case names). `keys` are the API keys when `auth` is on;
/// `end_of_stream` says the headers came without a body; `fresh_id` makes a request id, called only when the
/// client's is missing or malformed.
pub fn plan<'h>(
    cfg: &Config,
    keys: Option<&Keys>,
    all: &'h [(String, Vec<u8>)],
    end_of_stream: bool,
    fresh_id: impl FnOnce() -> String,
) -> HeadersPlan<'h> {
    let find = |name: &str| all.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice());
    let text = |name: &str| find(name).and_then(|v| std::str::from_utf8(v).ok()).unwrap_or_default();
    let (request_id, fresh_id) = match find(headers::REQUEST_ID) {
        Some(v) if request::request_id_ok(v) => (String::from_utf8_lossy(v).into_owned(), false),
        _ => (fresh_id(), true),
    };
    let refuse =
        |error: &GatewayError, envelope: Envelope| Next::Reply(LocalReply::refusal(error, envelope, Some(&request_id)));
    let (method, path) = (text(":method"), text(":path"));
    let mut key = None;
    let started = match keys {
        Some(keys) => request::authenticate(keys, method, path, all).map(|name| key = name),
        None => Ok(()),
    }
    .and_then(|()| request::start(cfg, method, path, find));
    let (envelope, next) = match started {
        Err(Refusal { error, envelope }) => (Envelope::OpenAi, refuse(&error, envelope)),
        Ok(start) => {
            let next = match start.endpoint {
                Endpoint::Status(page) => Next::Status(page),
                Endpoint::Inference(_) if end_of_stream => {
                    refuse(&GatewayError::InvalidJson(JsonError::Empty), start.envelope)
                }
                Endpoint::Inference(api) => Next::Read(ReadBody {
                    api,
                    session: start.session,
                    charges: key.as_deref().map_or_else(Vec::new, |k| limits::header_charges(cfg, k)),
                    tenant: tenant(cfg, key.as_deref(), find),
                    sent_length: find("content-length").map(<[u8]>::to_vec),
                }),
                endpoint => Next::Models {
                    endpoint,
                    query: path.split_once('?').map_or("", |(_, q)| q).to_string(),
                },
            };
            (start.envelope, next)
        }
    };
    HeadersPlan {
        remove: headers::to_strip(all.iter().map(|(n, _)| n.as_str())),
        request_id,
        fresh_id,
        key,
        envelope,
        next,
    }
}

/// The tenant of a request, with `fairness` on: the API key's name (`key`) or the tenant header's value (`find`
/// reads a request header), hashed; and its wait, `fairness.max_wait_ms` or the client's shorter
/// `x-max-wait-ms`. `None` without `fairness`.
pub fn tenant<'h>(cfg: &Config, key: Option<&str>, find: impl Fn(&str) -> Option<&'h [u8]>) -> Option<Tenant> {
    let f = cfg.fairness.as_ref()?;
    let name: &[u8] = match &f.by {
        TenantBy::ApiKey => key.map_or(&[], str::as_bytes),
        TenantBy::Header(h) => find(h).unwrap_or_default(),
    };
    Some(Tenant {
        id: fairness::tenant_id(name),
        weight: f.weight(name),
        wait_ms: f.wait_ms(find(fairness::MAX_WAIT_HEADER)),
    })
}
