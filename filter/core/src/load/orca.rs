//! An engine's ORCA load report, read from the `endpoint-load-metrics` response header.
//!
//! vLLM answers a request that carries `endpoint-load-metrics-format: JSON` with a header
//! `endpoint-load-metrics: JSON {"named_metrics": {"kv_cache_usage_perc": 0.4, "num_requests_waiting": 2.0}}`.
//! It is fresher than the last `/metrics` poll (it is the engine's state as it answered), so the filter folds it
//! into the host's reading between polls. Only the JSON form is read: Envoy's own ORCA parser expects TEXT as
//! `name:value`, while vLLM writes `name=value`. The header is the engine's, never the client's: the filter
//! removes it from every response it passes on.

use serde::Deserialize;

/// The longest header value read; a report is a few dozen bytes.
pub const MAX_HEADER_BYTES: usize = 4096;

/// The request header that asks the engine for a report, and its value.
pub const REQUEST_HEADER: &str = "endpoint-load-metrics-format";
pub const REQUEST_FORMAT: &str = "JSON";
/// The response header the report comes in.
pub const RESPONSE_HEADER: &str = "endpoint-load-metrics";

/// What one report says. Fields the engine did not report are `None`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OrcaReport {
    /// Requests waiting in the engine's queue.
    pub queued: Option<f64>,
    /// KV-cache use, 0 to 1.
    pub kv_usage: Option<f64>,
}

#[derive(Deserialize)]
struct Report {
    #[serde(default)]
    named_metrics: Named,
}

#[derive(Deserialize, Default)]
struct Named {
    num_requests_waiting: Option<f64>,
    kv_cache_usage_perc: Option<f64>,
}

/// The report in `value`, `None` when it is not a JSON report or does not parse.
pub fn parse(value: &[u8]) -> Option<OrcaReport> {
    if value.len() > MAX_HEADER_BYTES {
        return None;
    }
    let json = value.strip_prefix(b"JSON")?;
    let report: Report = serde_json::from_slice(json).ok()?;
    let finite = |v: Option<f64>| v.filter(|x| x.is_finite()).map(|x| x.max(0.0));
    Some(OrcaReport {
        queued: finite(report.named_metrics.num_requests_waiting),
        kv_usage: finite(report.named_metrics.kv_cache_usage_perc),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllms_json_report() {
        let v = br#"JSON {"named_metrics": {"kv_cache_usage_perc": 0.25, "num_requests_waiting": 3.0}}"#;
        let r = parse(v).unwrap();
        assert_eq!(r.queued, Some(3.0));
        assert_eq!(r.kv_usage, Some(0.25));
    }

    #[test]
    fn text_form_oversized_and_garbage_are_refused() {
        assert_eq!(parse(b"TEXT named_metrics.num_requests_waiting=3"), None);
        assert_eq!(parse(b"JSON {"), None);
        let mut big = b"JSON {\"named_metrics\": {}, \"x\": \"".to_vec();
        big.resize(MAX_HEADER_BYTES + 1, b'a');
        assert_eq!(parse(&big), None);
    }

    #[test]
    fn missing_metrics_read_as_none() {
        let r = parse(br#"JSON {"named_metrics": {"other": 1.0}}"#).unwrap();
        assert_eq!(
            r,
            OrcaReport {
                queued: None,
                kv_usage: None
            }
        );
        assert_eq!(parse(br#"JSON {}"#).unwrap().queued, None);
    }
}
