//! A test stand-in for a rate-limit service: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over
//! gRPC (HTTP/2 cleartext), for the `global_limits` tests. It is not envoyproxy/ratelimit and is never deployed.
//!
//! It speaks the real protocol, so Envoy's own rate-limit filter talks to it unchanged: the few messages it needs
//! are declared by hand with `prost` (field numbers from Envoy's `rls.proto` and `ratelimit.proto`), and each
//! call is one length-prefixed message each way, with `grpc-status` in the trailers.
//!
//! It records every call (domain, descriptors with their entries and per-descriptor `hits_addend`, the request's
//! own `hits_addend`), and answers by one rule: a descriptor whose entries match a configured limit counts hits
//! against it (whatever the answer, as envoyproxy/ratelimit counts them); a call is OVER_LIMIT when any
//! descriptor passes its limit. An explicit `hits_addend` of 0 is a peek: over only when the limit is already used
//! up, as recent envoyproxy/ratelimit releases are said to read it. Over-limit statuses carry
//! `duration_until_reset`, so Envoy's `x-ratelimit-reset` (and the gateway's `Retry-After`) can be checked.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use http_body_util::StreamBody;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The gRPC method path Envoy calls.
pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct RateLimitRequest {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor` (without the limit override, field 2).
#[derive(Clone, PartialEq, Message)]
pub struct RateLimitDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// `google.protobuf.UInt64Value hits_addend = 3`: per descriptor, present (even when 0) or absent.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Entry {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse` (the fields Envoy's filter reads for these tests).
#[derive(Clone, PartialEq, Message)]
pub struct RateLimitResponse {
    /// 1 OK, 2 OVER_LIMIT.
    #[prost(int32, tag = "1")]
    pub overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
}

#[derive(Clone, PartialEq, Message)]
pub struct DescriptorStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<CurrentLimit>,
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<Duration>,
}

/// `RateLimitResponse.RateLimit`: requests per unit (2 = MINUTE).
#[derive(Clone, PartialEq, Message)]
pub struct CurrentLimit {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Duration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
}

const OK: i32 = 1;
const OVER_LIMIT: i32 = 2;
const MINUTE: i32 = 2;

/// One descriptor as received: its `(key, value)` entries and its own `hits_addend`, if sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenDescriptor {
    pub entries: Vec<(String, String)>,
    pub hits_addend: Option<u64>,
}

/// One `ShouldRateLimit` call as received, and the answer given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub domain: String,
    pub descriptors: Vec<SeenDescriptor>,
    pub hits_addend: u32,
    pub over_limit: bool,
}

#[derive(Default)]
struct Book {
    /// Limits by their descriptor entries, and what each has used.
    limits: HashMap<Vec<(String, String)>, (u64, u64)>,
    calls: Vec<Call>,
}

/// A running stand-in; stops when dropped.
pub struct RateLimitService {
    book: Arc<Mutex<Book>>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl RateLimitService {
    /// Starts on 127.0.0.1 and a port the kernel picks (the listener is kept, never re-bound).
    pub async fn spawn() -> io::Result<RateLimitService> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let book = Arc::new(Mutex::new(Book::default()));
        let (stop, mut stopped) = watch::channel(false);
        let app = Router::new()
            .route(PATH, post(should_rate_limit))
            .with_state(book.clone());
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stopped.wait_for(|s| *s).await;
        });
        let task = tokio::spawn(async move {
            let _ = server.await;
        });
        Ok(RateLimitService {
            book,
            addr,
            stop,
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Limits the descriptor with exactly these entries to `limit` hits.
    pub fn limit(&self, entries: &[(&str, &str)], limit: u64) {
        let key = entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        if let Ok(mut b) = self.book.lock() {
            b.limits.insert(key, (limit, 0));
        }
    }

    /// Hits counted so far against the limit on these entries.
    pub fn used(&self, entries: &[(&str, &str)]) -> Option<u64> {
        let key: Vec<(String, String)> = entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.book.lock().ok()?.limits.get(&key).map(|(_, used)| *used)
    }

    /// Every call so far, in arrival order.
    pub fn calls(&self) -> Vec<Call> {
        self.book.lock().map(|b| b.calls.clone()).unwrap_or_default()
    }

    /// Stops serving now; later calls fail to connect.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for RateLimitService {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

async fn should_rate_limit(State(book): State<Arc<Mutex<Book>>>, body: Bytes) -> Response {
    // One gRPC message: a compressed flag (0), a 4-byte big-endian length, the message.
    let Some(req) = body.get(5..).and_then(|m| RateLimitRequest::decode(m).ok()) else {
        return grpc_error(3, "malformed RateLimitRequest");
    };
    let answer = match book.lock() {
        Ok(mut b) => decide(&mut b, req),
        Err(_) => return grpc_error(13, "book poisoned"),
    };
    let msg = answer.encode_to_vec();
    let mut framed = Vec::with_capacity(msg.len() + 5);
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(msg.len()).unwrap_or(u32::MAX).to_be_bytes());
    framed.extend_from_slice(&msg);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let frames = futures_util::stream::iter([
        Ok::<_, io::Error>(http_body::Frame::data(Bytes::from(framed))),
        Ok(http_body::Frame::trailers(trailers)),
    ]);
    let mut resp = Response::new(Body::new(StreamBody::new(frames)));
    resp.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    resp
}

fn decide(book: &mut Book, req: RateLimitRequest) -> RateLimitResponse {
    let seen: Vec<SeenDescriptor> = req
        .descriptors
        .iter()
        .map(|d| SeenDescriptor {
            entries: d.entries.iter().map(|e| (e.key.clone(), e.value.clone())).collect(),
            hits_addend: d.hits_addend.as_ref().map(|h| h.value),
        })
        .collect();
    let request_hits = if req.hits_addend == 0 {
        1
    } else {
        u64::from(req.hits_addend)
    };
    let mut statuses = Vec::new();
    let mut over = false;
    let mut charges = Vec::new();
    for d in &seen {
        let hits = d.hits_addend.unwrap_or(request_hits);
        let status = match book.limits.get(&d.entries) {
            None => DescriptorStatus {
                code: OK,
                ..Default::default()
            },
            Some(&(limit, used)) => {
                let this_over = if hits == 0 { used >= limit } else { used + hits > limit };
                over |= this_over;
                charges.push((d.entries.clone(), hits));
                DescriptorStatus {
                    code: if this_over { OVER_LIMIT } else { OK },
                    current_limit: Some(CurrentLimit {
                        requests_per_unit: u32::try_from(limit).unwrap_or(u32::MAX),
                        unit: MINUTE,
                    }),
                    limit_remaining: u32::try_from(limit.saturating_sub(used)).unwrap_or(u32::MAX),
                    duration_until_reset: Some(Duration { seconds: 7 }),
                }
            }
        };
        statuses.push(status);
    }
    // Like envoyproxy/ratelimit, hits count whatever the answer: an over-limit call still adds them.
    for (entries, hits) in charges {
        if let Some((_, used)) = book.limits.get_mut(&entries) {
            *used += hits;
        }
    }
    book.calls.push(Call {
        domain: req.domain,
        descriptors: seen,
        hits_addend: req.hits_addend,
        over_limit: over,
    });
    RateLimitResponse {
        overall_code: if over { OVER_LIMIT } else { OK },
        statuses,
    }
}

/// A Trailers-Only gRPC error.
fn grpc_error(code: u16, message: &'static str) -> Response {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert("content-type", HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from(code));
    h.insert("grpc-message", HeaderValue::from_static(message));
    resp
}
