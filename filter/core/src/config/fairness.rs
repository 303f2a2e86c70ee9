//! `fairness`: the fair queue's settings, as written ([`RawFairness`]) and validated ([`Fairness`]).
//!
//! With `fairness` set, a request to a backend that has reached its `max_inflight` waits in the filter instead of
//! getting Envoy's instant 503, and the waiting request of the tenant with the least weighted attained service goes
//! next (see [`crate::fairness`]). This module decides only what the settings mean: who a request's tenant is
//! (the name of the API key it presented, or the value of a header), how long a request may wait, how many may
//! wait per backend, and each tenant's share.
//!
//! Checks, each naming the field, the value and the fix: `by: api_key` needs `auth`; the tenant header is an HTTP
//! header name that is neither the gateway's own nor a credential; `max_wait_ms` stays under the stream idle
//! timeout (a waiting request sends no byte, and Envoy would close it first) and under the body timeout (Envoy's
//! `request_timeout` runs until the filter lets the request go); `max_queue` is bounded, since every
//! worker reads and writes the backend's whole queue; a weight names a tenant once and is `1` to [`MAX_WEIGHT`].

use serde::Deserialize;

use super::raw::NamedPairs;
use super::{Diagnostics, Limits};

/// The longest a request may wait by default.
pub const DEFAULT_MAX_WAIT_MS: u64 = 30_000;
/// The longest `max_wait_ms` may be: 10 minutes.
pub const MAX_MAX_WAIT_MS: u64 = 600_000;
/// Most requests waiting per backend, by default.
pub const DEFAULT_MAX_QUEUE: usize = 1024;
/// The largest `max_queue`: the queue is one shared-data value every worker reads and writes whole.
pub const MAX_MAX_QUEUE: usize = 4096;
/// The largest weight. The queue counts service in thousandths of a token per unit of weight
/// ([`crate::fairness::SCALE`]), so a tenant of this weight is still charged one unit per token.
pub const MAX_WEIGHT: u32 = 1000;
/// The most tenants remembered. Past this, the idle tenants with the least service are forgotten first (a
/// forgotten tenant that returns starts level with the others, as any returning tenant does).
pub const MAX_TENANTS: usize = 4096;
/// Most tenants `weights` may name: as many as the queue remembers.
pub const MAX_WEIGHTS: usize = MAX_TENANTS;
/// The longest tenant header value a weight may name.
pub const TENANT_VALUE_MAX: usize = 256;
/// The longest tenant header name.
const HEADER_NAME_MAX: usize = 128;

/// The requests a backend's circuit breaker lets through: `max_inflight`, or with `fairness` twice that. The fair
/// queue then holds the backend at `max_inflight` itself; Envoy gives a finished request's place in its breaker
/// back a moment after the filter sees the request end (when its upstream stream is deleted, at the end of that
/// event-loop turn), so a waiter resumed in that moment would meet a breaker still full and get Envoy's 503. The
/// breaker stays, as a backstop for requests the queue could not count.
pub fn circuit_breaker_limit(max_inflight: u32, fairness: bool) -> u32 {
    match fairness {
        true => max_inflight.saturating_mul(2),
        false => max_inflight,
    }
}

/// `fairness`, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFairness {
    /// Who a request belongs to: `api_key` (the name of the key it presented; needs `auth`), or
    /// `{ header: NAME }` (the value of that request header; requests without it share one tenant).
    pub by: RawTenantBy,
    /// The longest a request waits for a slot before a 429, in milliseconds. `1` to `600000`, and below
    /// `limits.stream_idle_timeout_ms`; default 30000. A client's `x-max-wait-ms` may only shorten it.
    #[serde(default)]
    pub max_wait_ms: Option<u64>,
    /// Most requests waiting per backend; past it a request is refused at once (429). `1` to `4096`; default 1024.
    #[serde(default)]
    pub max_queue: Option<u64>,
    /// Shares by tenant name (an API key's name, or a tenant header's value): a tenant of weight 2 is served twice
    /// the tokens of a tenant of weight 1 when both wait. `1` to `1000`; tenants not named weigh 1.
    #[serde(default)]
    pub weights: Option<RawWeights>,
}

/// `fairness.by`, as written: a name (`api_key` is the only one) or `{ header: NAME }`. The name is checked in
/// validation, which can say what it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawTenantBy {
    /// A plain name: `api_key`.
    Name(String),
    /// `{ header: NAME }`: the value of this request header.
    Header(String),
}

impl<'de> Deserialize<'de> for RawTenantBy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Shape;
        impl<'de> serde::de::Visitor<'de> for Shape {
            type Value = RawTenantBy;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`api_key`, or `{ header: NAME }`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawTenantBy, E> {
                Ok(RawTenantBy::Name(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<RawTenantBy, A::Error> {
                let mut header = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "header" if header.is_none() => header = Some(map.next_value::<String>()?),
                        "header" => return Err(serde::de::Error::duplicate_field("header")),
                        other => return Err(serde::de::Error::unknown_field(other, &["header"])),
                    }
                }
                header
                    .map(RawTenantBy::Header)
                    .ok_or_else(|| serde::de::Error::missing_field("header"))
            }
        }
        d.deserialize_any(Shape)
    }
}

/// `fairness.weights`: tenant name to weight.
pub type RawWeights = NamedPairs<u64>;

/// Who a request belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantBy {
    /// The name of the API key the request presented.
    ApiKey,
    /// The value of this request header (lower case).
    Header(String),
}

/// The validated `fairness`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fairness {
    pub by: TenantBy,
    pub max_wait_ms: u64,
    pub max_queue: usize,
    /// Tenant name and weight, sorted by name.
    pub weights: Vec<(String, u32)>,
}

impl Fairness {
    /// The weight of the tenant named `name`: its own, else 1.
    pub fn weight(&self, name: &[u8]) -> u32 {
        self.weights
            .binary_search_by(|(n, _)| n.as_bytes().cmp(name))
            .ok()
            .and_then(|i| self.weights.get(i))
            .map_or(1, |(_, w)| *w)
    }

    /// How long a request may wait: `max_wait_ms`, or the client's `x-max-wait-ms` when that is a number and
    /// smaller. A value that is not a plain number of at most 10 digits is ignored.
    pub fn wait_ms(&self, client: Option<&[u8]>) -> u64 {
        let asked = client
            .filter(|v| (1..=10).contains(&v.len()) && v.iter().all(u8::is_ascii_digit))
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse::<u64>().ok());
        asked.map_or(self.max_wait_ms, |a| a.min(self.max_wait_ms))
    }
}

/// Validates `fairness`. `auth` says whether API keys are configured; `limits` holds the timeouts a waiting
/// request must stay under.
pub(super) fn fairness(errs: &mut Diagnostics, raw: &RawFairness, auth: bool, limits: &Limits) -> Option<Fairness> {
    let before = errs.errors.len();
    let by = match &raw.by {
        RawTenantBy::Name(name) if name != "api_key" => {
            errs.push(
                "fairness.by",
                name,
                "must be `api_key` (the API key's name), or `{ header: NAME }` (a request header's value)",
            );
            TenantBy::ApiKey
        }
        RawTenantBy::Name(_) => {
            if !auth {
                errs.push(
                    "fairness.by",
                    "api_key",
                    "tenants by API key need `auth` (keys_env); configure auth, or name a tenant header with \
                     `by: { header: x-tenant-id }`",
                );
            }
            TenantBy::ApiKey
        }
        RawTenantBy::Header(h) => {
            header_name(errs, h);
            TenantBy::Header(h.to_ascii_lowercase())
        }
    };
    let max_wait_ms = raw.max_wait_ms.unwrap_or(DEFAULT_MAX_WAIT_MS);
    errs.range("fairness.max_wait_ms", max_wait_ms, 1, MAX_MAX_WAIT_MS);
    if max_wait_ms >= limits.stream_idle_timeout_ms {
        errs.push(
            "fairness.max_wait_ms",
            max_wait_ms,
            format!(
                "must be below limits.stream_idle_timeout_ms ({}): a waiting request sends no byte, and Envoy \
                 would close it as idle first; lower max_wait_ms or raise the idle timeout",
                limits.stream_idle_timeout_ms
            ),
        );
    }
    if max_wait_ms >= limits.body_timeout_ms {
        errs.push(
            "fairness.max_wait_ms",
            max_wait_ms,
            format!(
                "must be below limits.body_timeout_ms ({}): Envoy's request timeout runs, from the request's start, \
                 until the filter lets a waiting request go, and would answer 408 first; lower max_wait_ms or raise \
                 the body timeout",
                limits.body_timeout_ms
            ),
        );
    }
    let max_queue = raw.max_queue.unwrap_or(DEFAULT_MAX_QUEUE as u64);
    errs.range("fairness.max_queue", max_queue, 1, MAX_MAX_QUEUE as u64);
    let weights = weights(errs, raw.weights.as_ref(), &by);
    (errs.errors.len() == before).then(|| Fairness {
        by,
        max_wait_ms,
        max_queue: usize::try_from(max_queue).unwrap_or(DEFAULT_MAX_QUEUE),
        weights,
    })
}

fn header_name(errs: &mut Diagnostics, h: &str) {
    let lower = h.to_ascii_lowercase();
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if h.is_empty() || h.len() > HEADER_NAME_MAX || !h.bytes().all(token) {
        errs.push(
            "fairness.by.header",
            h,
            format!("not an HTTP header name (1 to {HEADER_NAME_MAX} token characters); name one such as x-tenant-id"),
        );
    } else if lower.starts_with("x-llmroute-") {
        errs.push(
            "fairness.by.header",
            h,
            "x-llmroute-* headers are the gateway's own and are stripped from clients; name one such as x-tenant-id",
        );
    } else if crate::headers::CREDENTIALS.contains(&lower.as_str()) {
        errs.push(
            "fairness.by.header",
            h,
            "this header carries a credential; with API keys use `by: api_key`, else name a header such as \
             x-tenant-id",
        );
    }
}

fn weights(errs: &mut Diagnostics, raw: Option<&RawWeights>, by: &TenantBy) -> Vec<(String, u32)> {
    let pairs = raw.map_or(&[][..], |w| w.0.as_slice());
    if pairs.len() > MAX_WEIGHTS {
        errs.push(
            "fairness.weights",
            pairs.len(),
            format!("names more tenants than the {MAX_WEIGHTS} the queue remembers"),
        );
    }
    let mut out: Vec<(String, u32)> = Vec::with_capacity(pairs.len());
    for (name, weight) in pairs {
        let field = format!("fairness.weights.{name}");
        let name_ok = match by {
            TenantBy::ApiKey => crate::auth::name_ok(name),
            TenantBy::Header(_) => {
                (1..=TENANT_VALUE_MAX).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_graphic())
            }
        };
        if !name_ok {
            let what = match by {
                TenantBy::ApiKey => format!(
                    "an API key's name: 1 to {} characters of A-Z a-z 0-9 _ . -, as in the keys variable",
                    crate::auth::NAME_MAX
                ),
                TenantBy::Header(_) => {
                    format!("a tenant header's value: 1 to {TENANT_VALUE_MAX} visible ASCII characters")
                }
            };
            errs.push(&field, name, format!("a weight names {what}"));
        } else if out.iter().any(|(n, _)| n == name) {
            errs.push(&field, name, "the tenant is named twice; give it one weight");
        }
        if !(1..=u64::from(MAX_WEIGHT)).contains(weight) {
            errs.push(
                &field,
                weight,
                format!("a weight is 1 to {MAX_WEIGHT}: the tenant's share against a tenant of weight 1"),
            );
        }
        if let Ok(w) = u32::try_from(*weight) {
            out.push((name.clone(), w));
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default limits: idle timeout 300000, body timeout 120000.
    fn limits() -> Limits {
        crate::config::load(
            r#"{"version":1,"backends":[{"name":"a","kind":"vllm","endpoints":["127.0.0.1:1"]}],
                "models":[{"name":"m","routes":[{"backend":"a"}]}]}"#,
        )
        .unwrap()
        .limits
    }

    fn raw(by: RawTenantBy) -> RawFairness {
        RawFairness {
            by,
            max_wait_ms: None,
            max_queue: None,
            weights: None,
        }
    }

    #[test]
    fn defaults_and_weights() {
        let mut errs = Diagnostics::default();
        let mut r = raw(RawTenantBy::Name("api_key".into()));
        r.weights = Some(NamedPairs(vec![("zed".into(), 3), ("alice".into(), 2)]));
        let f = fairness(&mut errs, &r, true, &limits()).unwrap();
        assert!(errs.errors.is_empty(), "{:?}", errs.errors);
        assert_eq!((f.max_wait_ms, f.max_queue), (DEFAULT_MAX_WAIT_MS, DEFAULT_MAX_QUEUE));
        assert_eq!(f.weight(b"alice"), 2);
        assert_eq!(f.weight(b"zed"), 3);
        assert_eq!(f.weight(b"bob"), 1);
    }

    #[test]
    fn the_client_may_only_shorten_the_wait() {
        let f = Fairness {
            by: TenantBy::ApiKey,
            max_wait_ms: 1000,
            max_queue: 1,
            weights: Vec::new(),
        };
        assert_eq!(f.wait_ms(None), 1000);
        assert_eq!(f.wait_ms(Some(b"250")), 250);
        assert_eq!(f.wait_ms(Some(b"0")), 0);
        assert_eq!(f.wait_ms(Some(b"99999")), 1000);
        for junk in [&b"-1"[..], b"1.5", b"", b" 5", b"12345678901", b"abc"] {
            assert_eq!(f.wait_ms(Some(junk)), 1000, "{junk:?}");
        }
    }

    #[test]
    fn refusals_name_the_field() {
        let fields = |r: &RawFairness, auth: bool| {
            let mut errs = Diagnostics::default();
            assert!(fairness(&mut errs, r, auth, &limits()).is_none());
            errs.errors.into_iter().map(|e| e.field).collect::<Vec<_>>()
        };
        assert_eq!(
            fields(&raw(RawTenantBy::Name("api_key".into())), false),
            ["fairness.by"]
        );
        assert_eq!(fields(&raw(RawTenantBy::Name("apikey".into())), true), ["fairness.by"]);
        for h in ["authorization", "x-llmroute-tenant", "bad header", ""] {
            assert_eq!(
                fields(&raw(RawTenantBy::Header(h.into())), true),
                ["fairness.by.header"],
                "{h}"
            );
        }
        let mut r = raw(RawTenantBy::Name("api_key".into()));
        r.max_wait_ms = Some(300_000);
        assert_eq!(
            fields(&r, true),
            ["fairness.max_wait_ms", "fairness.max_wait_ms"],
            "idle and body timeouts"
        );
        r.max_wait_ms = Some(120_000);
        assert_eq!(fields(&r, true), ["fairness.max_wait_ms"], "the body timeout");
        r.max_wait_ms = Some(0);
        assert_eq!(fields(&r, true), ["fairness.max_wait_ms"]);
        let mut r = raw(RawTenantBy::Name("api_key".into()));
        r.max_queue = Some(5000);
        assert_eq!(fields(&r, true), ["fairness.max_queue"]);
        r.max_queue = Some(0);
        assert_eq!(fields(&r, true), ["fairness.max_queue"]);
        let mut r = raw(RawTenantBy::Name("api_key".into()));
        r.weights = Some(NamedPairs(vec![
            ("a".into(), 2),
            ("a".into(), 3),
            ("b".into(), 0),
            ("no spaces".into(), 1),
        ]));
        assert_eq!(
            fields(&r, true),
            ["fairness.weights.a", "fairness.weights.b", "fairness.weights.no spaces"]
        );
    }
}
