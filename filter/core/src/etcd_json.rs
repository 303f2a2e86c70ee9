//! etcd's v3 HTTP/JSON gateway, as bytes: the request bodies llmroute sends and the answers it reads back.
//!
//! Both etcd clients share this: the `llmroute` CLI's blocking client (`envoy/src/etcd.rs`, for `discover` and
//! `register`) and the filter's HTTP callouts for the shared placement table (`key_placement::store`). The gateway
//! speaks proto3 JSON: keys and values travel base64-encoded, 64-bit integers arrive as JSON strings (sometimes
//! numbers), and zero values (a revision of 0, `succeeded: false`, an empty `kvs`) are left out. Verified against
//! etcd 3.4 and 3.5.
//!
//! Nothing here does I/O, and nothing panics on what etcd (or something pretending to be etcd) sends: an answer
//! that is not the expected JSON is an [`EtcdJsonError`], a field that is missing reads as its zero value.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};

/// Why an answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdJsonError {
    /// Not JSON at all.
    NotJson,
    /// JSON, but etcd reported an error (`{"error": ..., "code": N}`); the gRPC code.
    Etcd { code: i64 },
    /// JSON without the field the answer must have.
    Missing(&'static str),
}

impl std::fmt::Display for EtcdJsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdJsonError::NotJson => f.write_str("the answer is not JSON"),
            EtcdJsonError::Etcd { code } => write!(f, "etcd answered with error code {code}"),
            EtcdJsonError::Missing(field) => write!(f, "the answer has no `{field}`"),
        }
    }
}

/// Base64, as the gateway wants keys and values.
pub fn b64(bytes: impl AsRef<[u8]>) -> String {
    B64.encode(bytes.as_ref())
}

/// Reads a base64 field; `None` when it is not base64.
pub fn unb64(text: &str) -> Option<Vec<u8>> {
    B64.decode(text).ok()
}

/// An int64 as proto3 JSON writes it: a string, a number, or absent for 0. Anything else reads as 0.
pub fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// The end of the key range holding every key that starts with `prefix`: the prefix with its last byte
/// incremented (bytes 0xff dropped first), or `"\0"` (every key) for a prefix of only 0xff bytes.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut bytes = prefix.to_vec();
    while let Some(last) = bytes.pop() {
        if let Some(next) = last.checked_add(1) {
            bytes.push(next);
            return bytes;
        }
    }
    vec![0]
}

/// `/v3/kv/range`: every key under `prefix`, at most `limit`, and only those modified at or after
/// `min_mod_revision` (0: all).
pub fn range_body(prefix: &str, limit: u64, min_mod_revision: i64) -> String {
    let mut body = json!({
        "key": b64(prefix),
        "range_end": b64(prefix_end(prefix.as_bytes())),
        "limit": limit.to_string(),
    });
    if min_mod_revision > 0 {
        if let Some(fields) = body.as_object_mut() {
            fields.insert("min_mod_revision".into(), Value::from(min_mod_revision.to_string()));
        }
    }
    body.to_string()
}

/// `/v3/kv/put`: `key` = `value`, attached to `lease` (0: none).
pub fn put_body(key: &str, value: &str, lease: i64) -> String {
    json!({ "key": b64(key), "value": b64(value), "lease": lease.to_string() }).to_string()
}

/// `/v3/kv/txn`: create `key` = `value` (attached to `lease`, 0 for none) only if it does not exist
/// (`create_revision == 0`); otherwise read it. One round trip settles a race: exactly one writer succeeds, and
/// every other learns the winner's value from the same answer.
///
/// With `marker`, a successful create also puts that key (no lease, an empty value), so its `mod_revision` is the
/// revision of the last placement written under it ([`create_in_view_body`]).
pub fn create_if_absent_body(key: &str, value: &str, lease: i64, marker: Option<&str>) -> String {
    let k = b64(key);
    json!({
        "compare": [{ "key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
        "success": with_marker(json!({ "request_put": { "key": k, "value": b64(value), "lease": lease.to_string() } }), marker),
        "failure": [{ "request_range": { "key": k } }],
    })
    .to_string()
}

/// `put`, then a put of `marker` (no lease, empty value) when there is one: the success branch of a transaction
/// that writes a placement.
fn with_marker(put: Value, marker: Option<&str>) -> Value {
    let mut ops = vec![put];
    if let Some(m) = marker {
        ops.push(json!({ "request_put": { "key": b64(m), "value": "", "lease": "0" } }));
    }
    Value::Array(ops)
}

/// `/v3/kv/txn`: [`create_if_absent_body`] with `marker`, and only while no placement was written under `marker`
/// after revision `view` (a compare on the marker's `mod_revision < view + 1`; a marker never written compares
/// true). Every transaction that writes a placement of the range `[range_prefix, its end)` (a create, a move)
/// also puts the marker, and nothing else does: a lease's refresh of the same keys leaves it alone, and the
/// compare reads one key, not the range. Its failure branch reads `key` back and the keys of the range modified
/// after `view`, at most `limit` ([`parse_create_in_view`]). So a writer that chose `value` from a view of the
/// range's placements complete up to `view` either commits against exactly those placements, or learns both
/// whether the key exists and what it missed, in the same round trip.
pub fn create_in_view_body(
    key: &str,
    value: &str,
    lease: i64,
    range_prefix: &str,
    marker: &str,
    view: i64,
    limit: u64,
) -> String {
    let k = b64(key);
    let (start, end) = (b64(range_prefix), b64(prefix_end(range_prefix.as_bytes())));
    let after = view.max(0).saturating_add(1).to_string();
    json!({
        "compare": [
            { "key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0" },
            { "key": b64(marker), "target": "MOD", "result": "LESS", "mod_revision": after },
        ],
        "success": with_marker(json!({ "request_put": { "key": k, "value": b64(value), "lease": lease.to_string() } }), Some(marker)),
        "failure": [
            { "request_range": { "key": k } },
            { "request_range": {
                "key": start, "range_end": end, "limit": limit.to_string(), "min_mod_revision": after,
            } },
        ],
    })
    .to_string()
}

/// `/v3/kv/txn`: set `key` = `value` (attached to `lease`, 0 for none) only if it still holds `expected`
/// (compare on the value); otherwise read it. Its answer reads like [`create_if_absent_body`]'s
/// ([`parse_create`]): `Created` when the swap ran, `Exists` with the current value when it did not, and
/// `Exists` with no value when the key is gone (a missing key compares unequal).
///
/// With `marker`, a swap that runs also puts the marker, as a create does ([`create_if_absent_body`]).
pub fn swap_body(key: &str, expected: &str, value: &str, lease: i64, marker: Option<&str>) -> String {
    let k = b64(key);
    json!({
        "compare": [{ "key": k, "target": "VALUE", "result": "EQUAL", "value": b64(expected) }],
        "success": with_marker(json!({ "request_put": { "key": k, "value": b64(value), "lease": lease.to_string() } }), marker),
        "failure": [{ "request_range": { "key": k } }],
    })
    .to_string()
}

/// `/v3/kv/txn` without a condition: put every `(key, value)`, all attached to `lease`. etcd refuses a
/// transaction of more than its `--max-txn-ops` (128 by default) operations; [`MAX_TXN_OPS`] stays within it.
pub fn puts_body(pairs: &[(String, String)], lease: i64) -> String {
    let ops: Vec<Value> = pairs
        .iter()
        .map(|(k, v)| json!({ "request_put": { "key": b64(k), "value": b64(v), "lease": lease.to_string() } }))
        .collect();
    json!({ "success": ops }).to_string()
}

/// The most operations llmroute puts in one transaction: etcd's default `--max-txn-ops`.
pub const MAX_TXN_OPS: usize = 128;

/// `/v3/lease/grant`: a lease of `ttl_s` seconds.
pub fn grant_body(ttl_s: u64) -> String {
    json!({ "TTL": ttl_s.to_string() }).to_string()
}

/// `/v3/lease/keepalive` for lease `id`.
pub fn keepalive_body(id: i64) -> String {
    json!({ "ID": id.to_string() }).to_string()
}

/// `/v3/lease/revoke` for lease `id`.
pub fn revoke_body(id: i64) -> String {
    json!({ "ID": id.to_string() }).to_string()
}

/// etcd's authentication endpoint: a user name and password in, a token out.
pub const AUTHENTICATE_PATH: &str = "/v3/auth/authenticate";
/// The gRPC code etcd answers a token it no longer knows with (`invalid auth token`; HTTP 401 at the gateway):
/// authenticate again.
pub const UNAUTHENTICATED: i64 = 16;
/// Longest token accepted from etcd (a simple token is about 20 bytes, a JWT a few hundred).
pub const MAX_TOKEN: usize = 4096;

/// `/v3/auth/authenticate` for `user` with `password`.
pub fn authenticate_body(user: &str, password: &str) -> String {
    json!({ "name": user, "password": password }).to_string()
}

/// Reads a `/v3/auth/authenticate` answer: the token to send as `Authorization` on later calls. A token that is
/// empty, too long or not a visible-ASCII header value is refused.
pub fn parse_authenticate(text: &[u8]) -> Result<String, EtcdJsonError> {
    let v = parse(text)?;
    match at(&v, "/token").as_str() {
        Some(t) if (1..=MAX_TOKEN).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_graphic()) => Ok(t.to_string()),
        _ => Err(EtcdJsonError::Missing("token")),
    }
}

/// `/v3/watch` from `start_revision` on every key under `prefix`.
pub fn watch_body(prefix: &str, start_revision: i64) -> String {
    json!({ "create_request": {
        "key": b64(prefix),
        "range_end": b64(prefix_end(prefix.as_bytes())),
        "start_revision": start_revision.to_string(),
    }})
    .to_string()
}

/// One key as a range (or a transaction's range) returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// The lease the key is attached to; 0 for none.
    pub lease: i64,
    pub mod_revision: i64,
}

/// A range's answer: the keys, the store's revision when it was read, and whether `limit` cut it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeAnswer {
    pub kvs: Vec<Kv>,
    pub revision: i64,
    pub more: bool,
}

/// A create-if-absent transaction's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnAnswer {
    /// The key did not exist, and this write created it.
    Created { revision: i64 },
    /// The key existed: its current value (`None` if it vanished between the compare and the read).
    Exists { kv: Option<Kv>, revision: i64 },
}

/// The value at a JSON pointer (`/a/b`), `Null` when absent: reading never fails.
fn at<'a>(v: &'a Value, pointer: &str) -> &'a Value {
    v.pointer(pointer).unwrap_or(&Value::Null)
}

fn parse(text: &[u8]) -> Result<Value, EtcdJsonError> {
    let v: Value = serde_json::from_slice(text).map_err(|_| EtcdJsonError::NotJson)?;
    if v.get("error").is_some() || v.get("code").is_some_and(|c| int(c) != 0) {
        return Err(EtcdJsonError::Etcd {
            code: int(at(&v, "/code")),
        });
    }
    if !v.is_object() {
        return Err(EtcdJsonError::NotJson);
    }
    Ok(v)
}

fn kvs(v: &Value) -> Vec<Kv> {
    let list = v.as_array().map(Vec::as_slice).unwrap_or_default();
    list.iter()
        .filter_map(|kv| {
            Some(Kv {
                key: unb64(at(kv, "/key").as_str()?)?,
                value: at(kv, "/value").as_str().and_then(unb64).unwrap_or_default(),
                lease: int(at(kv, "/lease")),
                mod_revision: int(at(kv, "/mod_revision")),
            })
        })
        .collect()
}

fn revision(v: &Value) -> Result<i64, EtcdJsonError> {
    match int(at(v, "/header/revision")) {
        0 => Err(EtcdJsonError::Missing("header.revision")),
        r => Ok(r),
    }
}

/// Reads a `/v3/kv/range` answer.
pub fn parse_range(text: &[u8]) -> Result<RangeAnswer, EtcdJsonError> {
    let v = parse(text)?;
    Ok(RangeAnswer {
        kvs: kvs(at(&v, "/kvs")),
        revision: revision(&v)?,
        more: at(&v, "/more").as_bool().unwrap_or(false),
    })
}

/// Reads the answer to [`create_if_absent_body`].
pub fn parse_create(text: &[u8]) -> Result<TxnAnswer, EtcdJsonError> {
    let v = parse(text)?;
    let revision = revision(&v)?;
    if at(&v, "/succeeded").as_bool() == Some(true) {
        return Ok(TxnAnswer::Created { revision });
    }
    let responses = at(&v, "/responses").as_array().map(Vec::as_slice).unwrap_or_default();
    let kv = responses
        .iter()
        .find_map(|r| kvs(at(r, "/response_range/kvs")).into_iter().next());
    Ok(TxnAnswer::Exists { kv, revision })
}

/// The answer to [`create_in_view_body`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InViewAnswer {
    /// Created, at this revision: no other placement was written between the view and it.
    Created { revision: i64 },
    /// The key existed: its current value.
    Exists { kv: Kv, revision: i64 },
    /// The key did not exist, but the view was stale: the keys of the range modified after it (as a range read
    /// returns them, `revision` being the store's when the transaction ran).
    Stale(RangeAnswer),
}

/// Reads the answer to [`create_in_view_body`].
pub fn parse_create_in_view(text: &[u8]) -> Result<InViewAnswer, EtcdJsonError> {
    let v = parse(text)?;
    let revision = revision(&v)?;
    if at(&v, "/succeeded").as_bool() == Some(true) {
        return Ok(InViewAnswer::Created { revision });
    }
    if let Some(kv) = kvs(at(&v, "/responses/0/response_range/kvs")).into_iter().next() {
        return Ok(InViewAnswer::Exists { kv, revision });
    }
    let range = at(&v, "/responses/1/response_range");
    if !range.is_object() {
        return Err(EtcdJsonError::Missing("responses[1].response_range"));
    }
    Ok(InViewAnswer::Stale(RangeAnswer {
        kvs: kvs(at(range, "/kvs")),
        revision,
        more: at(range, "/more").as_bool().unwrap_or(false),
    }))
}

/// Reads the answer to [`puts_body`]: the revision it was written at.
pub fn parse_puts(text: &[u8]) -> Result<i64, EtcdJsonError> {
    let v = parse(text)?;
    match at(&v, "/succeeded").as_bool() {
        Some(true) => revision(&v),
        _ => Err(EtcdJsonError::Missing("succeeded")),
    }
}

/// Reads a `/v3/lease/grant` answer: the new lease's id.
pub fn parse_grant(text: &[u8]) -> Result<i64, EtcdJsonError> {
    let v = parse(text)?;
    match int(at(&v, "/ID")) {
        0 => Err(EtcdJsonError::Missing("ID")),
        id => Ok(id),
    }
}

/// Reads a `/v3/lease/keepalive` answer: the lease's remaining TTL in seconds, 0 when it no longer exists.
pub fn parse_keepalive(text: &[u8]) -> Result<i64, EtcdJsonError> {
    let v = parse(text)?;
    Ok(int(at(&v, "/result/TTL")))
}
