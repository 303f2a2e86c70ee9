//! One HTTP call to etcd's JSON gateway through the `llmroute_placement_store` cluster, and reading its answer:
//! used alike by the request side and the root side.

use llmroute_core::envoy_contract::PLACEMENT_STORE_CLUSTER;
use llmroute_core::key_placement::store::{self, Reply};

use crate::host::Envoy;
use crate::store_auth::{self};

/// POSTs `body` to the store's `path`, with etcd's token when the store has `auth`. `None` when it was not sent,
/// also when `auth` has no token yet (the root side has not authenticated, or etcd forgot the token).
pub(super) fn post(envoy: &Envoy, path: &str, body: &[u8], auth: bool, timeout_ms: u64) -> Option<u32> {
    let token = match auth {
        true => Some(store_auth::token(envoy)?),
        false => None,
    };
    envoy.dispatch_post(PLACEMENT_STORE_CLUSTER, path, body, token.as_deref(), timeout_ms)
}

/// The answer's body, when there is an answer (`None`: Envoy delivered none, such as after a timeout). A 401 is
/// etcd no longer knowing the token: it is forgotten, so the root side authenticates again.
pub(super) fn call_body(envoy: &Envoy, body_size: usize) -> Option<(u32, Vec<u8>)> {
    let status = envoy.http_call_status()?;
    if status == 401 {
        store_auth::forget(envoy);
    }
    let body = match body_size {
        0 => Vec::new(),
        n => envoy.http_call_body(n.min(store::MAX_ANSWER_BYTES)).unwrap_or_default(),
    };
    Some((status, body))
}

pub(super) fn reply(answer: Option<&(u32, Vec<u8>)>) -> Reply<'_> {
    match answer {
        Some((status, body)) => Reply::Answer { status: *status, body },
        None => Reply::NoAnswer,
    }
}
