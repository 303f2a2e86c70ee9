//! A small blocking client for etcd's v3 HTTP/JSON gateway (`/v3/kv/range`, `/v3/kv/put`, `/v3/watch`,
//! `/v3/lease/grant`, `/v3/lease/keepalive`, `/v3/lease/revoke`), enough for `llmroute discover` and
//! `llmroute register`. Keys and values travel base64-encoded; 64-bit integers arrive as JSON strings and proto3
//! leaves out zero values. Verified against etcd 3.4.
//!
//! Each call tries the configured endpoints in turn, starting with the last one that answered, so a cluster
//! member going away costs one failed connect. Plain HTTP only: TLS to etcd is not supported.

use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};

/// Most keys one range read returns; a prefix holding more is cut, and the cut is reported.
pub const RANGE_LIMIT: u64 = 4096;
/// Longest line of a watch stream that is read; a longer one is an error and the watch starts again.
const WATCH_LINE_MAX: u64 = 1 << 20;

/// Why an etcd call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdError(pub String);

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One key of a range read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    /// The lease the key is attached to; 0 for none.
    pub lease: i64,
}

/// The keys under a prefix at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub kvs: Vec<Kv>,
    pub revision: i64,
    /// True when the prefix held more than [`RANGE_LIMIT`] keys.
    pub more: bool,
}

/// How a watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEnd {
    /// Some key under the prefix changed (or the watch was cancelled, e.g. after a compaction): read it again.
    Changed,
    /// Nothing changed for the idle time: read again anyway, which also proves etcd still answers.
    Idle,
}

pub struct Client {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    watch_agent: ureq::Agent,
    current: usize,
}

impl Client {
    /// `endpoints` are base URLs (`http://HOST:PORT`); `timeout` bounds each call, `watch_idle` how long a watch
    /// waits for a change before it returns [`WatchEnd::Idle`].
    pub fn new(endpoints: Vec<String>, timeout: Duration, watch_idle: Duration) -> Self {
        let agent = ureq::AgentBuilder::new().timeout(timeout).build();
        let watch_agent = ureq::AgentBuilder::new()
            .timeout_connect(timeout)
            .timeout_write(timeout)
            .timeout_read(watch_idle)
            .build();
        Client {
            endpoints,
            agent,
            watch_agent,
            current: 0,
        }
    }

    /// The endpoint that answered last.
    pub fn endpoint(&self) -> &str {
        self.endpoints.get(self.current).map_or("", String::as_str)
    }

    /// POSTs `body` to `path` on each endpoint in turn until one answers.
    fn call(&mut self, agent: &ureq::Agent, path: &str, body: &Value) -> Result<ureq::Response, EtcdError> {
        let n = self.endpoints.len().max(1);
        let mut last = EtcdError("no etcd endpoint configured".into());
        for step in 0..self.endpoints.len() {
            let i = (self.current + step) % n;
            let Some(base) = self.endpoints.get(i) else { continue };
            match agent
                .post(&format!("{base}{path}"))
                .set("content-type", "application/json")
                .send_string(&body.to_string())
            {
                Ok(resp) => {
                    self.current = i;
                    return Ok(resp);
                }
                Err(ureq::Error::Status(code, resp)) => {
                    // etcd answered: an error of the request itself, not of the endpoint; do not try another.
                    let text = resp.into_string().unwrap_or_default();
                    let msg: String = text.chars().take(200).collect();
                    return Err(EtcdError(format!("{base}{path}: HTTP {code}: {msg}")));
                }
                Err(e) => last = EtcdError(format!("{base}{path}: {e}")),
            }
        }
        Err(last)
    }

    fn json(&mut self, path: &str, body: &Value) -> Result<Value, EtcdError> {
        let agent = self.agent.clone();
        let resp = self.call(&agent, path, body)?;
        let text = resp
            .into_string()
            .map_err(|e| EtcdError(format!("{path}: reading the answer: {e}")))?;
        serde_json::from_str(&text).map_err(|e| EtcdError(format!("{path}: not JSON: {e}")))
    }

    /// Every key under `prefix` (which should end with `/`).
    pub fn range_prefix(&mut self, prefix: &str) -> Result<Range, EtcdError> {
        let v = self.json(
            "/v3/kv/range",
            &json!({ "key": b64(prefix), "range_end": b64(prefix_end(prefix)), "limit": RANGE_LIMIT }),
        )?;
        let kvs = v["kvs"].as_array().map(Vec::as_slice).unwrap_or_default();
        let kvs = kvs
            .iter()
            .filter_map(|kv| {
                Some(Kv {
                    key: String::from_utf8(unb64(kv["key"].as_str()?)?).ok()?,
                    value: kv["value"].as_str().and_then(unb64).unwrap_or_default(),
                    lease: int(&kv["lease"]),
                })
            })
            .collect();
        Ok(Range {
            kvs,
            revision: int(&v["header"]["revision"]),
            more: v["more"].as_bool().unwrap_or(false),
        })
    }

    pub fn put(&mut self, key: &str, value: &str, lease: i64) -> Result<(), EtcdError> {
        self.json(
            "/v3/kv/put",
            &json!({ "key": b64(key), "value": b64(value), "lease": lease.to_string() }),
        )
        .map(drop)
    }

    /// A new lease of `ttl_s` seconds; its id.
    pub fn grant(&mut self, ttl_s: u64) -> Result<i64, EtcdError> {
        let v = self.json("/v3/lease/grant", &json!({ "TTL": ttl_s.to_string() }))?;
        match int(&v["ID"]) {
            0 => Err(EtcdError(format!("lease grant: no lease id in {v}"))),
            id => Ok(id),
        }
    }

    /// Refreshes the lease; its remaining TTL in seconds, 0 when the lease no longer exists.
    pub fn keepalive(&mut self, id: i64) -> Result<i64, EtcdError> {
        let v = self.json("/v3/lease/keepalive", &json!({ "ID": id.to_string() }))?;
        if let Some(err) = v.get("error") {
            return Err(EtcdError(format!("lease keepalive: {err}")));
        }
        Ok(int(&v["result"]["TTL"]))
    }

    /// Ends the lease: every key attached to it goes at once.
    pub fn revoke(&mut self, id: i64) -> Result<(), EtcdError> {
        self.json("/v3/lease/revoke", &json!({ "ID": id.to_string() }))
            .map(drop)
    }

    /// Watches `prefix` from `start_revision` until something changes, the stream stays idle, or it fails.
    pub fn watch(&mut self, prefix: &str, start_revision: i64) -> Result<WatchEnd, EtcdError> {
        let body = json!({ "create_request": {
            "key": b64(prefix),
            "range_end": b64(prefix_end(prefix)),
            "start_revision": start_revision.to_string(),
        }});
        let agent = self.watch_agent.clone();
        let resp = self.call(&agent, "/v3/watch", &body)?;
        let mut lines = BufReader::new(resp.into_reader().take(u64::MAX));
        loop {
            let mut line = String::new();
            match (&mut lines).take(WATCH_LINE_MAX).read_line(&mut line) {
                Ok(0) => return Err(EtcdError("watch: etcd closed the stream".into())),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) => {
                    return Ok(WatchEnd::Idle)
                }
                Err(e) => return Err(EtcdError(format!("watch: {e}"))),
            }
            if !line.ends_with('\n') && line.len() as u64 >= WATCH_LINE_MAX {
                return Err(EtcdError("watch: answer line too long".into()));
            }
            let Ok(v) = serde_json::from_str::<Value>(line.trim()) else {
                continue;
            };
            if let Some(err) = v.get("error") {
                return Err(EtcdError(format!("watch: {err}")));
            }
            let r = &v["result"];
            let events = r["events"].as_array().is_some_and(|e| !e.is_empty());
            if events || r["canceled"].as_bool() == Some(true) {
                return Ok(WatchEnd::Changed);
            }
        }
    }
}

fn b64(s: impl AsRef<[u8]>) -> String {
    B64.encode(s.as_ref())
}

fn unb64(s: &str) -> Option<Vec<u8>> {
    B64.decode(s).ok()
}

/// An int64 as proto3 JSON writes it: a string, a number, or absent for 0.
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// The end of the key range holding every key that starts with `prefix`: the prefix with its last byte
/// incremented (bytes 0xff dropped first), or `"\0"` (every key) for a prefix of only 0xff bytes.
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0xff {
            bytes.push(last + 1);
            return bytes;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end("/llmroute/a/"), b"/llmroute/a0");
        assert_eq!(prefix_end("a"), b"b");
    }

    #[test]
    fn ints_come_as_strings_numbers_or_nothing() {
        assert_eq!(int(&json!("7587878")), 7_587_878);
        assert_eq!(int(&json!(12)), 12);
        assert_eq!(int(&Value::Null), 0);
        assert_eq!(int(&json!("x")), 0);
    }

    #[test]
    fn no_endpoint_is_an_error_not_a_panic() {
        let mut c = Client::new(Vec::new(), Duration::from_millis(100), Duration::from_millis(100));
        assert!(c.range_prefix("/p/").is_err());
    }
}
