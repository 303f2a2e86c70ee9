//! A small blocking client for etcd's v3 HTTP/JSON gateway (`/v3/kv/range`, `/v3/kv/put`, `/v3/watch`,
//! `/v3/lease/grant`, `/v3/lease/keepalive`, `/v3/lease/revoke`), enough for `llmroute discover` and
//! `llmroute register`. Keys and values travel base64-encoded; 64-bit integers arrive as JSON strings and proto3
//! leaves out zero values. Verified against etcd 3.4.
//!
//! Each call tries the configured endpoints in turn, starting with the last one that answered, so a cluster
//! member going away costs one failed connect. With a `tls` block the endpoints are `https://` and each connection
//! is verified (and presents a client certificate) as `crate::etcd_tls` says.
//!
//! With [`Credentials`] (etcd's user authentication), the client first trades the user and password for a token
//! at `/v3/auth/authenticate`, then sends the token as `Authorization` on every call. A token etcd no longer knows
//! (HTTP 401, `invalid auth token`: a restart, an expiry) is traded again once, and the call repeated. The password
//! is never printed: not in errors, not in `Debug`.
//!
//! Redirects are never followed: an answer that is not etcd's own (a 3xx from something in front of a member)
//! is an error of that endpoint, so neither the password nor a token can be sent on to another server.

use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;
use std::time::Duration;

use llmroute_core::config::{EtcdAuth, UpstreamTls};
use llmroute_core::etcd_json::{self, int};
use serde_json::Value;

/// Most keys one range read returns; a prefix holding more is cut, and the cut is reported.
pub const RANGE_LIMIT: u64 = 4096;
/// Longest line of a watch stream that is read; a longer one is an error and the watch starts again.
const WATCH_LINE_MAX: u64 = 1 << 20;
/// The least time an authentication is given: etcd checks the password with bcrypt, which takes far longer than
/// a key read on a busy member, so a `register` calling every 200 ms would otherwise never get a token.
const AUTHENTICATE_TIMEOUT: Duration = Duration::from_secs(5);

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

/// An etcd user and its password. `Debug` shows the user only.
#[derive(Clone, PartialEq, Eq)]
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
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials {
            user: user.into(),
            password: password.into(),
        }
    }

    /// The `auth` block's user, with the password read from the variable it names; the error names the variable
    /// (as `at`.auth.password_env), never a value.
    pub fn from_env(auth: &EtcdAuth, at: &str) -> Result<Self, String> {
        Self::from_var(&auth.user, &auth.password_env, &format!("{at}.auth.password_env"))
    }

    /// `user`, with the password read from the environment variable `var`; `what` names the setting in the error.
    pub fn from_var(user: &str, var: &str, what: &str) -> Result<Self, String> {
        match std::env::var(var) {
            Ok(p) if !p.is_empty() => Ok(Credentials::new(user, p)),
            Ok(_) => Err(format!(
                "{what} {var}: the variable is empty; put etcd user {user}'s password in it"
            )),
            Err(_) => Err(format!(
                "{what} {var}: the variable is not set (or not UTF-8); put etcd user {user}'s password in it"
            )),
        }
    }
}

pub struct Client {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    watch_agent: ureq::Agent,
    current: usize,
    credentials: Option<Credentials>,
    /// The token the last authentication returned.
    token: Option<String>,
    /// Bounds an authentication: the call timeout, at least [`AUTHENTICATE_TIMEOUT`].
    authenticate_timeout: Duration,
}

/// How one endpoint took a call.
enum Attempt {
    /// etcd answered with success.
    Answered(Box<ureq::Response>),
    /// etcd answered with an error of the request itself: another member would answer the same.
    Refused(EtcdError),
    /// The endpoint is down, or did not answer as etcd: try the next one.
    Unreachable(EtcdError),
    /// etcd did not know the token (HTTP 401): authenticate again.
    TokenRefused(EtcdError),
}

impl Client {
    /// `endpoints` are base URLs (`http://HOST:PORT`, or `https://HOST:PORT` with `tls`); `timeout` bounds each
    /// call, `watch_idle` how long a watch waits for a change before it returns [`WatchEnd::Idle`]. Fails only
    /// when `tls` names a PEM file that cannot be read (the error names it). Authenticates with `credentials`
    /// when given (see [`Client::with_credentials`]).
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
        // A 3xx comes back as an answer, which `call` refuses, instead of being followed.
        let agent = with_tls(ureq::AgentBuilder::new().timeout(timeout).redirects(0)).build();
        let watch_agent = with_tls(
            ureq::AgentBuilder::new()
                .timeout_connect(timeout)
                .timeout_write(timeout)
                .timeout_read(watch_idle)
                .redirects(0),
        )
        .build();
        Ok(Client {
            endpoints,
            agent,
            watch_agent,
            current: 0,
            credentials: None,
            token: None,
            authenticate_timeout: timeout.max(AUTHENTICATE_TIMEOUT),
        })
    }

    /// The same client, authenticating as `credentials` (etcd's `auth enable`) before its first call.
    pub fn with_credentials(mut self, credentials: Option<Credentials>) -> Self {
        self.credentials = credentials;
        self.token = None;
        self
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
            let Some(base) = self.endpoints.get(i).cloned() else {
                continue;
            };
            match self.call_on(agent, &base, path, body) {
                Attempt::Answered(resp) => {
                    self.current = i;
                    return Ok(*resp);
                }
                Attempt::Refused(e) | Attempt::TokenRefused(e) => return Err(e),
                Attempt::Unreachable(e) => last = e,
            }
        }
        Err(last)
    }

    /// [`Client::call`] on one endpoint: authenticates first when there is no token, and once more when etcd
    /// no longer knows the token.
    fn call_on(&mut self, agent: &ureq::Agent, base: &str, path: &str, body: &str) -> Attempt {
        if self.credentials.is_some() && self.token.is_none() {
            match self.authenticate(base) {
                Ok(token) => self.token = Some(token),
                Err(a) => return a,
            }
        }
        match send(agent, base, path, body, self.token.as_deref()) {
            Attempt::TokenRefused(_) if self.credentials.is_some() => {
                self.token = None;
                match self.authenticate(base) {
                    Ok(token) => {
                        let again = send(agent, base, path, body, Some(&token));
                        self.token = Some(token);
                        again
                    }
                    Err(a) => a,
                }
            }
            other => other,
        }
    }

    /// Trades the user and password for a token at `base`.
    fn authenticate(&self, base: &str) -> Result<String, Attempt> {
        let Some(c) = &self.credentials else {
            return Err(Attempt::Refused(EtcdError("no etcd credentials".into())));
        };
        let body = etcd_json::authenticate_body(&c.user, &c.password);
        let timeout = Some(self.authenticate_timeout);
        let resp = match send_within(&self.agent, base, etcd_json::AUTHENTICATE_PATH, &body, None, timeout) {
            Attempt::Answered(resp) => resp,
            Attempt::Refused(e) | Attempt::TokenRefused(e) => {
                return Err(Attempt::Refused(EtcdError(format!(
                    "authenticating as etcd user {}: {e}",
                    c.user
                ))))
            }
            unreachable => return Err(unreachable),
        };
        let text = resp.into_string().unwrap_or_default();
        etcd_json::parse_authenticate(text.as_bytes()).map_err(|e| {
            Attempt::Refused(EtcdError(format!(
                "{base}{}: authenticating as etcd user {}: {e}",
                etcd_json::AUTHENTICATE_PATH,
                c.user
            )))
        })
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

/// One POST of `body` to `base` + `path`, with `token` as `Authorization` when given.
fn send(agent: &ureq::Agent, base: &str, path: &str, body: &str, token: Option<&str>) -> Attempt {
    send_within(agent, base, path, body, token, None)
}

/// [`send`], within `timeout` instead of the agent's when given.
fn send_within(
    agent: &ureq::Agent,
    base: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
    timeout: Option<Duration>,
) -> Attempt {
    let mut req = agent
        .post(&format!("{base}{path}"))
        .set("content-type", "application/json");
    if let Some(t) = token {
        req = req.set("authorization", t);
    }
    if let Some(t) = timeout {
        req = req.timeout(t);
    }
    match req.send_string(body) {
        Ok(resp) if (200..300).contains(&resp.status()) => Attempt::Answered(Box::new(resp)),
        Ok(resp) => {
            let to = resp
                .header("location")
                .unwrap_or("nowhere")
                .chars()
                .take(200)
                .collect::<String>();
            Attempt::Unreachable(EtcdError(format!(
                "{base}{path}: HTTP {} redirecting to {to}: not followed; give etcd's own client URL",
                resp.status()
            )))
        }
        Err(ureq::Error::Status(code, resp)) => {
            // etcd answered: an error of the request itself, not of the endpoint; do not try another. Its gateway
            // sends errors chunked with HTTP trailers, which ureq fails to read past: keep what came before.
            let mut bytes = Vec::new();
            let _ = resp.into_reader().take(4096).read_to_end(&mut bytes);
            let text = String::from_utf8_lossy(&bytes);
            let msg: String = text.chars().take(200).collect();
            if code == 401 {
                return Attempt::TokenRefused(EtcdError(format!("{base}{path}: HTTP 401: {msg}")));
            }
            let hint = match text.contains("user name is empty") {
                true => " (etcd has authentication on: give a user and its password)",
                false => "",
            };
            Attempt::Refused(EtcdError(format!("{base}{path}: HTTP {code}: {msg}{hint}")))
        }
        Err(e) => Attempt::Unreachable(EtcdError(format!("{base}{path}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::Write;
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    #[test]
    fn no_endpoint_is_an_error_not_a_panic() {
        let mut c = Client::new(Vec::new(), None, Duration::from_millis(100), Duration::from_millis(100)).unwrap();
        assert!(c.range_prefix("/p/").is_err());
    }

    /// One request as the fake server saw it: path, `authorization` header, body.
    type Seen = Arc<Mutex<Vec<(String, Option<String>, String)>>>;

    /// A fake etcd on loopback: each request gets `answer(path, authorization, body)` as (status, extra header
    /// line, body), on a connection closed after it. Its base URL and what it saw.
    fn fake(answer: impl Fn(&str, Option<&str>, &str) -> (u16, String, String) + Send + 'static) -> (String, Seen) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen: Seen = Arc::default();
        let log = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let path = line.split_whitespace().nth(1).unwrap_or_default().to_string();
                let (mut auth, mut len) = (None, 0);
                loop {
                    let mut h = String::new();
                    reader.read_line(&mut h).unwrap();
                    let h = h.trim_end();
                    if h.is_empty() {
                        break;
                    }
                    let (name, value) = h.split_once(':').unwrap();
                    match name.to_ascii_lowercase().as_str() {
                        "authorization" => auth = Some(value.trim().to_string()),
                        "content-length" => len = value.trim().parse().unwrap(),
                        _ => {}
                    }
                }
                let mut body = vec![0; len];
                reader.read_exact(&mut body).unwrap();
                let body = String::from_utf8(body).unwrap();
                let (status, extra, text) = answer(&path, auth.as_deref(), &body);
                log.lock().unwrap().push((path, auth, body));
                let head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n",
                    text.len()
                );
                let _ = conn.write_all(head.as_bytes());
                let _ = conn.write_all(text.as_bytes());
            }
        });
        (base, seen)
    }

    fn client(endpoints: Vec<String>) -> Client {
        Client::new(endpoints, None, Duration::from_secs(2), Duration::from_secs(2)).unwrap()
    }

    const RANGE_OK: &str = r#"{"header":{"revision":"7"}}"#;

    #[test]
    fn a_redirect_is_not_followed_and_the_next_member_is_tried() {
        for status in [302, 307] {
            let (elsewhere, elsewhere_seen) = fake(|_, _, _| (200, String::new(), RANGE_OK.into()));
            let to = elsewhere.clone();
            let (redirecting, _) = fake(move |path, _, _| (status, format!("location: {to}{path}\r\n"), String::new()));
            let err = client(vec![redirecting.clone()]).range_prefix("/p/").unwrap_err();
            assert!(
                err.0.contains(&format!("HTTP {status}")) && err.0.contains("not followed"),
                "{err}"
            );
            assert!(elsewhere_seen.lock().unwrap().is_empty(), "the {status} was followed");
            // A member that redirects is passed over like one that is down.
            let (good, _) = fake(|_, _, _| (200, String::new(), RANGE_OK.into()));
            let mut c = client(vec![redirecting, good.clone()]);
            assert_eq!(c.range_prefix("/p/").unwrap().revision, 7);
            assert_eq!(c.endpoint(), good);
        }
    }

    #[test]
    fn credentials_are_traded_for_a_token_again_when_etcd_forgets_it() {
        let issued = Arc::new(Mutex::new(0));
        let n = issued.clone();
        let (base, seen) = fake(move |path, auth, body| {
            let mut n = n.lock().unwrap();
            match path {
                "/v3/auth/authenticate" if body.contains(r#""password":"s3cret""#) => {
                    *n += 1;
                    (200, String::new(), format!(r#"{{"token":"tok{n}"}}"#))
                }
                "/v3/auth/authenticate" => (
                    400,
                    String::new(),
                    r#"{"error":"authentication failed","code":3}"#.into(),
                ),
                // The first token is forgotten (an etcd restart): only the second one is good.
                _ if auth == Some("tok2") => (200, String::new(), RANGE_OK.into()),
                _ => (
                    401,
                    String::new(),
                    r#"{"error":"etcdserver: invalid auth token","code":16}"#.into(),
                ),
            }
        });
        let mut c = client(vec![base.clone()]).with_credentials(Some(Credentials::new("llm", "s3cret")));
        assert_eq!(c.range_prefix("/p/").unwrap().revision, 7);
        assert_eq!(c.range_prefix("/p/").unwrap().revision, 7, "the token is kept");
        let paths: Vec<(String, Option<String>)> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|(p, a, _)| (p.clone(), a.clone()))
            .collect();
        let auth = "/v3/auth/authenticate".to_string();
        let range = "/v3/kv/range".to_string();
        assert_eq!(
            paths,
            [
                (auth.clone(), None),
                (range.clone(), Some("tok1".into())),
                (auth, None),
                (range.clone(), Some("tok2".into())),
                (range, Some("tok2".into())),
            ]
        );
        // A wrong password is an error that names the user, never the password.
        let mut wrong = client(vec![base]).with_credentials(Some(Credentials::new("llm", "wrong-pw")));
        let err = wrong.range_prefix("/p/").unwrap_err();
        assert!(
            err.0.contains("etcd user llm") && err.0.contains("authentication failed"),
            "{err}"
        );
        assert!(!err.0.contains("wrong-pw"), "{err}");
        assert!(!format!("{:?}", Credentials::new("llm", "wrong-pw")).contains("wrong-pw"));
    }

    #[test]
    fn without_credentials_an_etcd_with_authentication_says_so() {
        let (base, _) = fake(|_, _, _| {
            let text = r#"{"error":"etcdserver: user name is empty","code":3}"#;
            (400, String::new(), text.into())
        });
        let err = client(vec![base]).range_prefix("/p/").unwrap_err();
        assert!(err.0.contains("give a user and its password"), "{err}");
    }

    #[test]
    fn the_password_comes_from_the_named_variable() {
        let auth = EtcdAuth {
            user: "llm".into(),
            password_env: "LLMROUTE_TEST_ETCD_PW_NEVER_SET".into(),
        };
        let err = Credentials::from_env(&auth, "discovery.etcd").unwrap_err();
        assert!(
            err.starts_with(
                "discovery.etcd.auth.password_env LLMROUTE_TEST_ETCD_PW_NEVER_SET: the variable is not set"
            ),
            "{err}"
        );
        let path = std::env::var("PATH").unwrap();
        let c = Credentials::from_var("llm", "PATH", "--password-env").unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("llm", path.as_str()));
    }
}
