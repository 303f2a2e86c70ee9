//! Engine load readings: each engine kind's `/metrics` page, ORCA reports folded in, staleness, and the
//! shared-data encoding the poller and placement share.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use llmroute_core::config::EngineKind;
use llmroute_core::load::{self, orca, EngineLoad, ReadError};
use proptest::prelude::*;

/// The gauge part of a real llama-server `/metrics` page (started with `--metrics`).
const LLAMACPP: &str = "\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1432
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
";

const SGLANG: &str = "\
sglang:num_running_reqs{model_name=\"m\",engine_type=\"unified\"} 7.0
sglang:num_queue_reqs{model_name=\"m\",engine_type=\"unified\"} 0.0
sglang:token_usage{model_name=\"m\",engine_type=\"unified\"} 0.4567
";

#[test]
fn llamacpp_running_and_deferred() {
    let l = load::from_metrics(EngineKind::LlamaCpp, LLAMACPP.as_bytes(), 10).unwrap();
    assert_eq!(
        l,
        EngineLoad {
            running: 2,
            queued: 5,
            kv_permille: None,
            at_ms: 10
        }
    );
}

#[test]
fn sglang_reports_token_usage_as_kv() {
    let l = load::from_metrics(EngineKind::Sglang, SGLANG.as_bytes(), 0).unwrap();
    assert_eq!((l.running, l.queued, l.kv_permille), (7, 0, Some(457)));
}

#[test]
fn a_page_without_the_queue_gauge_names_it() {
    let err = load::from_metrics(EngineKind::LlamaCpp, b"llamacpp:requests_processing 1\n", 0).unwrap_err();
    assert_eq!(err, ReadError::MissingGauge("llamacpp:requests_deferred"));
    assert!(err.reason().contains("--metrics"));
    assert_eq!(
        load::from_metrics(EngineKind::Ollama, b"", 0),
        Err(ReadError::NoSignals)
    );
}

#[test]
fn a_page_is_read_only_up_to_its_cap() {
    let mut page = vec![b'#'; load::MAX_METRICS_BYTES];
    page.extend_from_slice(b"\nllamacpp:requests_deferred 1\n");
    assert!(load::from_metrics(EngineKind::LlamaCpp, &page, 0).is_err());
}

#[test]
fn orca_replaces_queue_and_kv_but_keeps_running() {
    let polled = EngineLoad {
        running: 4,
        queued: 0,
        kv_permille: Some(100),
        at_ms: 0,
    };
    let report =
        orca::parse(br#"JSON {"named_metrics": {"num_requests_waiting": 6.0, "kv_cache_usage_perc": 0.9}}"#).unwrap();
    let l = load::with_orca(Some(polled), report, 50).unwrap();
    assert_eq!(
        l,
        EngineLoad {
            running: 4,
            queued: 6,
            kv_permille: Some(900),
            at_ms: 50
        }
    );
    let empty = orca::parse(br#"JSON {"named_metrics": {}}"#).unwrap();
    assert_eq!(load::with_orca(None, empty, 50), None);
}

#[test]
fn a_reading_goes_stale_after_three_polls() {
    let l = EngineLoad {
        running: 0,
        queued: 0,
        kv_permille: None,
        at_ms: 1000,
    };
    assert!(l.is_fresh(1750, 250));
    assert!(!l.is_fresh(1751, 250));
    let addresses = vec!["10.0.0.1:80".to_string(), "10.0.0.2:80".to_string()];
    let readings = vec![("10.0.0.2:80".to_string(), l)];
    assert_eq!(load::fresh_at(&addresses, &readings, 1100, 250), vec![None, Some(l)]);
    assert_eq!(load::fresh_at(&addresses, &readings, 9000, 250), vec![None, None]);
}

#[test]
fn malformed_lines_are_skipped() {
    let bytes = b"10.0.0.1:80 1 2 - 3\nbad\n10.0.0.2:80 1 2 2000 3\n10.0.0.3:80 1 2 - 3 extra\n\xff";
    let got = load::decode(bytes);
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].1.kv_permille, Some(1000));
}

fn reading() -> impl Strategy<Value = (String, EngineLoad)> {
    (
        "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}:[0-9]{1,5}",
        any::<u32>(),
        any::<u32>(),
        proptest::option::of(0u16..=1000),
        any::<u64>(),
    )
        .prop_map(|(a, running, queued, kv_permille, at_ms)| {
            (
                a,
                EngineLoad {
                    running,
                    queued,
                    kv_permille,
                    at_ms,
                },
            )
        })
}

proptest! {
    #[test]
    fn encode_then_decode_is_the_identity(readings in proptest::collection::vec(reading(), 0..20)) {
        prop_assert_eq!(load::decode(&load::encode(&readings)), readings);
    }

    #[test]
    fn any_page_reads_without_panicking(page in proptest::collection::vec(any::<u8>(), 0..2000)) {
        for kind in [EngineKind::LlamaCpp, EngineKind::Vllm, EngineKind::Sglang] {
            let _ = load::from_metrics(kind, &page, 0);
        }
        let _ = orca::parse(&page);
        let _ = load::decode(&page);
    }
}

/// The config's rule for which kinds may have `load` follows the gauges this module knows.
#[test]
fn the_kinds_that_report_load_are_those_with_signals() {
    use llmroute_core::config::EngineKind;
    for kind in [
        EngineKind::LlamaCpp,
        EngineKind::Vllm,
        EngineKind::Sglang,
        EngineKind::Ollama,
        EngineKind::OpenAi,
    ] {
        assert_eq!(
            kind.reports_load(),
            llmroute_core::load::signals(kind).is_some(),
            "{kind:?}"
        );
    }
}
