//! `limits`: how much a client may send and how long it may take, each bound in its range.

use super::*;

/// `limits`: each bound in its range, with its default.
pub(in crate::config) fn limits(errs: &mut Diagnostics, raw: Option<&RawLimits>) -> Limits {
    let (max_body_bytes, max_assembled_bytes) = body_bounds(errs, raw);
    let request_timeout_ms = raw.and_then(|l| l.request_timeout_ms).unwrap_or(600_000);
    if request_timeout_ms == 0 || request_timeout_ms > 86_400_000 {
        errs.push(
            "limits.request_timeout_ms",
            request_timeout_ms,
            "must be between 1 and 86400000 (one day); 0 would time every request out at once",
        );
    }
    let (headers_timeout_ms, body_timeout_ms) = client_timeouts(errs, raw);
    let stream_idle_timeout_ms = ranged(
        errs,
        "stream_idle_timeout_ms",
        raw.and_then(|l| l.stream_idle_timeout_ms),
        300_000,
        (1_000, 3_600_000),
    );
    let max_concurrent_streams = ranged(
        errs,
        "max_concurrent_streams",
        raw.and_then(|l| l.max_concurrent_streams).map(u64::from),
        100,
        (1, 10_000),
    );
    let max_heap_bytes = ranged(
        errs,
        "max_heap_bytes",
        raw.and_then(|l| l.max_heap_bytes),
        2 << 30,
        (64 << 20, 1 << 40),
    );
    Limits {
        max_body_bytes,
        max_assembled_bytes,
        request_timeout_ms,
        headers_timeout_ms,
        body_timeout_ms,
        stream_idle_timeout_ms,
        max_concurrent_streams: u32::try_from(max_concurrent_streams).unwrap_or(100),
        max_heap_bytes,
    }
}

/// `limits.FIELD`, or `default` without it, between `lo` and `hi`.
pub(super) fn ranged(
    errs: &mut Diagnostics,
    field: &str,
    value: Option<u64>,
    default: u64,
    (lo, hi): (u64, u64),
) -> u64 {
    let v = value.unwrap_or(default);
    errs.range(&format!("limits.{field}"), v, lo, hi);
    v
}

/// `limits.max_body_bytes` and `limits.max_assembled_bytes`: the most the filter holds of a request, and of an
/// answer it rebuilds from a stream.
pub(super) fn body_bounds(errs: &mut Diagnostics, raw: Option<&RawLimits>) -> (usize, usize) {
    let max_body_bytes = raw.and_then(|l| l.max_body_bytes).unwrap_or(DEFAULT_MAX_BODY_BYTES);
    if !(1024..=MAX_MAX_BODY_BYTES).contains(&max_body_bytes) {
        errs.push(
            "limits.max_body_bytes",
            max_body_bytes,
            format!("must be between 1024 and {MAX_MAX_BODY_BYTES}"),
        );
    }
    let max_assembled_bytes = raw
        .and_then(|l| l.max_assembled_bytes)
        .unwrap_or(DEFAULT_MAX_ASSEMBLED_BYTES);
    if !(4096..=MAX_MAX_BODY_BYTES).contains(&max_assembled_bytes) {
        errs.push(
            "limits.max_assembled_bytes",
            max_assembled_bytes,
            format!("must be between 4096 and {MAX_MAX_BODY_BYTES}"),
        );
    }
    (max_body_bytes, max_assembled_bytes)
}

/// `limits.headers_timeout_ms` and `limits.body_timeout_ms`: how long a client may take to send its headers, and
/// its whole request, which cannot take less than its headers.
pub(super) fn client_timeouts(errs: &mut Diagnostics, raw: Option<&RawLimits>) -> (u64, u64) {
    let headers_timeout_ms = ranged(
        errs,
        "headers_timeout_ms",
        raw.and_then(|l| l.headers_timeout_ms),
        60_000,
        (1_000, 600_000),
    );
    let body_timeout_ms = ranged(
        errs,
        "body_timeout_ms",
        raw.and_then(|l| l.body_timeout_ms),
        120_000,
        (1_000, 3_600_000),
    );
    if body_timeout_ms < headers_timeout_ms {
        errs.push(
            "limits.body_timeout_ms",
            body_timeout_ms,
            format!("must be at least limits.headers_timeout_ms ({headers_timeout_ms}): it counts from the first header byte"),
        );
    }
    (headers_timeout_ms, body_timeout_ms)
}
