//! Reading gauges out of an engine's `/metrics` page (Prometheus' text exposition format), bounded.
//!
//! Engines report their load as gauges: `llamacpp:requests_deferred`, `vllm:num_requests_waiting`,
//! `sglang:num_queue_reqs` and so on. A page can hold several samples of one gauge (vLLM labels each served
//! model, and a data-parallel engine labels each rank), so a gauge's value is the sum of its samples. Only the
//! names asked for are read, in one pass over the page; comments (`# HELP`, `# TYPE`) and every other metric
//! are skipped. A value that is not a finite number (`NaN`, `+Inf`) leaves the gauge unread, as if it were
//! absent; a negative one counts as 0. The caller caps the page's size (see [`super::MAX_METRICS_BYTES`]), so the
//! cost is one linear scan of at most that many bytes.

/// The sum of each named gauge's samples in `page`, in `names` order; `None` for a name with no readable sample.
pub fn gauges(page: &[u8], names: &[&str]) -> Vec<Option<f64>> {
    let mut found: Vec<Option<f64>> = vec![None; names.len()];
    for line in page.split(|&b| b == b'\n') {
        let Some((name, value)) = sample(line) else {
            continue;
        };
        let Some(i) = names.iter().position(|n| n.as_bytes() == name) else {
            continue;
        };
        if let Some(slot) = found.get_mut(i) {
            *slot = Some(slot.unwrap_or(0.0) + value.max(0.0));
        }
    }
    found
}

/// The metric name and value of one sample line, `None` for a comment, a blank line or a line that does not
/// parse (`name{labels} value [timestamp]` or `name value [timestamp]`).
fn sample(line: &[u8]) -> Option<(&[u8], f64)> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let start = line.iter().position(|b| !b.is_ascii_whitespace())?;
    let line = line.get(start..)?;
    if line.first() == Some(&b'#') {
        return None;
    }
    let name_len = line.iter().position(|&b| b == b'{' || b == b' ' || b == b'\t')?;
    let (name, rest) = line.split_at(name_len);
    let rest = match rest.first() {
        Some(b'{') => rest.get(labels_end(rest)?..)?,
        _ => rest,
    };
    let text = std::str::from_utf8(rest).ok()?;
    let value: f64 = text.split_ascii_whitespace().next()?.parse().ok()?;
    value.is_finite().then_some((name, value))
}

/// The index just past the `}` that closes the label set `rest` opens, skipping quoted label values (which may
/// hold `}`, spaces and `\"`).
fn labels_end(rest: &[u8]) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, &b) in rest.iter().enumerate() {
        match (quoted, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => quoted = false,
            (false, _, b'"') => quoted = true,
            (false, _, b'}') => return i.checked_add(1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = "# HELP vllm:num_requests_waiting Number of requests waiting.\n\
# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"m {x} \\\"q\\\"\"} 3.0\n\
vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 2.0\n\
vllm:num_requests_waiting_total 99\n\
vllm:num_requests_running{model_name=\"m\"} 5 1712000000000\n\
vllm:kv_cache_usage_perc{model_name=\"m\"} NaN\n";

    #[test]
    fn sums_a_gauges_samples_and_skips_longer_names_and_comments() {
        let got = gauges(
            VLLM.as_bytes(),
            &["vllm:num_requests_waiting", "vllm:num_requests_running"],
        );
        assert_eq!(got, vec![Some(5.0), Some(5.0)]);
    }

    #[test]
    fn a_value_that_is_not_finite_reads_as_absent() {
        assert_eq!(gauges(VLLM.as_bytes(), &["vllm:kv_cache_usage_perc"]), vec![None]);
    }

    #[test]
    fn unlabelled_samples_negative_values_and_crlf() {
        let page = b"llamacpp:requests_deferred 4\r\nllamacpp:requests_processing -1\r\n";
        let got = gauges(
            page,
            &["llamacpp:requests_deferred", "llamacpp:requests_processing", "absent"],
        );
        assert_eq!(got, vec![Some(4.0), Some(0.0), None]);
    }

    #[test]
    fn an_unclosed_label_set_or_garbage_is_skipped() {
        let page = b"a{x=\"1\" 3\n\xff\xfe 2\na 7\na{x=\"}\"} 1\n";
        assert_eq!(gauges(page, &["a"]), vec![Some(8.0)]);
    }
}
