//! A small blocking client for etcd's v3 HTTP/JSON gateway (`/v3/kv/range`, `/v3/kv/put`, `/v3/watch`,
//! `/v3/lease/grant`, `/v3/lease/keepalive`, `/v3/lease/revoke`), enough for `llmroute discover` and
//! `llmroute register`. Keys and values travel base64-encoded; 64-bit integers arrive as JSON strings and proto3
//! leaves out zero values. Verified against etcd 3.4.
//!
//! Each call tries the configured endpoints in turn, starting with the last one that answered, so a cluster
//! member going away costs one failed connect. With a `tls` block the endpoints are `https://` and each connection
//! is verified (and presents a client certificate) as `crate::etcd_tls` says.

use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;
use std::time::Duration;

use llmroute_core::config::UpstreamTls;
use llmroute_core::etcd_json::{self, int};
use serde_json::Value;

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
    /// `endpoints` are base URLs (`http://HOST:PORT`, or `https://HOST:PORT` with `tls`); `timeout` bounds each
    /// call, `watch_idle` how long a watch waits for a change before it returns [`WatchEnd::Idle`]. Fails only
    /// when `tls` names a PEM file that cannot be read (the error names it).
    pub fn new(
        endpoints: Vec<String>,
        tls: Option<&UpstreamTls>,
        timeout: Duration,
        watch_idle: Duration,
    ) -> Result<Self, EtcdError> {
        let connector = match tls {
            Some(t) => Some(Arc::new(crate::etcd_tls::Connector::new(t).map_err(EtcdError)?)),
            None => None,
        };
        let with_tls = |b: ureq::AgentBuilder| match &connector {
            Some(c) => b.tls_connector(c.clone()),
            None => b,
        };
        let agent = with_tls(ureq::AgentBuilder::new().timeout(timeout)).build();
        let watch_agent = with_tls(
            ureq::AgentBuilder::new()
                .timeout_connect(timeout)
                .timeout_write(timeout)
                .timeout_read(watch_idle),
        )
        .build();
        Ok(Client {
            endpoints,
            agent,
            watch_agent,
            current: 0,
        })
    }

    /// The endpoint that answered last.
    pub fn endpoint(&self) -> &str {
        self.endpoints.get(self.current).map_or("", String::as_str)
    }

    /// POSTs `body` to `path` on each endpoint in turn until one answers.
    fn call(&mut self, agent: &ureq::Agent, path: &str, body: &str) -> Result<ureq::Response, EtcdError> {
        let n = self.endpoints.len().max(1);
        let mut last = EtcdError("no etcd endpoint configured".into());
        for step in 0..self.endpoints.len() {
            let i = (self.current + step) % n;
            let Some(base) = self.endpoints.get(i) else { continue };
            match agent
                .post(&format!("{base}{path}"))
                .set("content-type", "application/json")
                .send_string(body)
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

    fn json(&mut self, path: &str, body: &str) -> Result<Value, EtcdError> {
        let agent = self.agent.clone();
        let resp = self.call(&agent, path, body)?;
        let text = resp
            .into_string()
            .map_err(|e| EtcdError(format!("{path}: reading the answer: {e}")))?;
        serde_json::from_str(&text).map_err(|e| EtcdError(format!("{path}: not JSON: {e}")))
    }

    /// Every key under `prefix` (which should end with `/`).
    pub fn range_prefix(&mut self, prefix: &str) -> Result<Range, EtcdError> {
        let body = etcd_json::range_body(prefix, RANGE_LIMIT, 0);
        let agent = self.agent.clone();
        let resp = self.call(&agent, "/v3/kv/range", &body)?;
        let text = resp
            .into_string()
            .map_err(|e| EtcdError(format!("/v3/kv/range: reading the answer: {e}")))?;
        let r = etcd_json::parse_range(text.as_bytes()).map_err(|e| EtcdError(format!("/v3/kv/range: {e}")))?;
        let kvs = r
            .kvs
            .into_iter()
            .filter_map(|kv| {
                Some(Kv {
                    key: String::from_utf8(kv.key).ok()?,
                    value: kv.value,
                    lease: kv.lease,
                })
            })
            .collect();
        Ok(Range {
            kvs,
            revision: r.revision,
            more: r.more,
        })
    }

    pub fn put(&mut self, key: &str, value: &str, lease: i64) -> Result<(), EtcdError> {
        self.json("/v3/kv/put", &etcd_json::put_body(key, value, lease))
            .map(drop)
    }

    /// A new lease of `ttl_s` seconds; its id.
    pub fn grant(&mut self, ttl_s: u64) -> Result<i64, EtcdError> {
        let v = self.json("/v3/lease/grant", &etcd_json::grant_body(ttl_s))?;
        match int(&v["ID"]) {
            0 => Err(EtcdError(format!("lease grant: no lease id in {v}"))),
            id => Ok(id),
        }
    }

    /// Refreshes the lease; its remaining TTL in seconds, 0 when the lease no longer exists.
    pub fn keepalive(&mut self, id: i64) -> Result<i64, EtcdError> {
        let v = self.json("/v3/lease/keepalive", &etcd_json::keepalive_body(id))?;
        if let Some(err) = v.get("error") {
            return Err(EtcdError(format!("lease keepalive: {err}")));
        }
        Ok(int(&v["result"]["TTL"]))
    }

    /// Ends the lease: every key attached to it goes at once.
    pub fn revoke(&mut self, id: i64) -> Result<(), EtcdError> {
        self.json("/v3/lease/revoke", &etcd_json::revoke_body(id)).map(drop)
    }

    /// Watches `prefix` from `start_revision` until something changes, the stream stays idle, or it fails.
    pub fn watch(&mut self, prefix: &str, start_revision: i64) -> Result<WatchEnd, EtcdError> {
        let body = etcd_json::watch_body(prefix, start_revision);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_endpoint_is_an_error_not_a_panic() {
        let mut c = Client::new(Vec::new(), None, Duration::from_millis(100), Duration::from_millis(100)).unwrap();
        assert!(c.range_prefix("/p/").is_err());
    }
}
