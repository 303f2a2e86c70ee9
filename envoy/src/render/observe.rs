//! Observability pieces of the bootstrap: the stats tags that turn the labels encoded in the filter's metric
//! names into Prometheus labels, and the JSON access log.
//!
//! Every name comes from `envoy_contract` (metric labels, filter-state keys), so the filter and the renderer
//! cannot drift. The access log reads Envoy's own fields (request id, upstream host, status, timings) and the
//! fields the filter writes as filter state (`wasm.llmroute.*`): alias, upstream model, backend, affinity source,
//! placement reason, key name, token counts and the stream's outcome. Field names follow the OpenTelemetry GenAI
//! and HTTP semantic conventions where one exists; the rest are `llmroute.*`. Nothing in it is prompt text, a
//! credential, a key value or a URL.

use llmroute_core::config::Document;
use llmroute_core::envoy_contract::{self as contract, log_fields, metrics};
use serde_json::{json, Map, Value};

/// `stats_config` with one tag per metric label.
pub(crate) fn stats_config() -> Value {
    let tags: Vec<Value> = metrics::stats_tags()
        .into_iter()
        .map(|(name, regex)| json!({ "tag_name": name, "regex": regex }))
        .collect();
    json!({ "stats_tags": tags })
}

fn filter_state(key: &str) -> String {
    format!("%FILTER_STATE({}:PLAIN)%", log_fields::filter_state(key))
}

/// The access log's fields, in order: `(field, Envoy format command)`.
pub fn log_format_fields() -> Vec<(&'static str, String)> {
    vec![
        ("start_time", "%START_TIME%".into()),
        ("request_id", "%REQ(X-REQUEST-ID)%".into()),
        ("gen_ai.request.model", filter_state(log_fields::ALIAS)),
        ("gen_ai.response.model", filter_state(log_fields::UPSTREAM_MODEL)),
        ("llmroute.backend", filter_state(log_fields::BACKEND)),
        ("llmroute.upstream_host", "%UPSTREAM_HOST%".into()),
        ("llmroute.affinity_source", filter_state(log_fields::AFFINITY_SOURCE)),
        ("llmroute.placement", filter_state(log_fields::PLACEMENT)),
        ("llmroute.key", filter_state(log_fields::KEY)),
        ("gen_ai.usage.input_tokens", filter_state(log_fields::INPUT_TOKENS)),
        ("gen_ai.usage.output_tokens", filter_state(log_fields::OUTPUT_TOKENS)),
        ("llmroute.usage.cached_tokens", filter_state(log_fields::CACHED_TOKENS)),
        ("llmroute.time_to_first_byte_ms", "%RESPONSE_DURATION%".into()),
        ("llmroute.duration_ms", "%DURATION%".into()),
        ("llmroute.stream_outcome", filter_state(log_fields::STREAM_OUTCOME)),
        ("llmroute.queue_wait_ms", filter_state(log_fields::QUEUE_WAIT_MS)),
        ("http.response.status_code", "%RESPONSE_CODE%".into()),
        // The gateway's own error code on a refusal (a closed set, from the `x-llmroute-error` response header).
        ("llmroute.error", format!("%RESP({})%", contract::ERROR)),
        ("llmroute.response_code_details", "%RESPONSE_CODE_DETAILS%".into()),
    ]
}

/// The connection manager's `access_log`: one JSON line per request, to `access_log.path` or standard output.
pub(crate) fn access_log(cfg: &Document) -> Value {
    let format: Map<String, Value> = log_format_fields()
        .into_iter()
        .map(|(k, v)| (k.to_string(), Value::String(v)))
        .collect();
    let log_format = json!({ "json_format": format, "json_format_options": { "sort_properties": false } });
    let logger = match &cfg.render_only.access_log_path {
        Some(path) => json!({
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": path,
                "log_format": log_format,
            },
        }),
        None => json!({
            "name": "envoy.access_loggers.stdout",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
                "log_format": log_format,
            },
        }),
    };
    json!([logger])
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::render::testing::one_backend as cfg;

    #[test]
    fn every_label_gets_a_tag_whose_regex_cuts_only_its_own_part() {
        let v = stats_config();
        let tags = v["stats_tags"].as_array().unwrap();
        assert_eq!(tags.len(), metrics::LABELS.len());
        let name = format!(
            "wasmcustom.{}",
            metrics::labelled(
                metrics::REQUESTS,
                &[("alias", "m"), ("backend", "outbound|80||x.ns"), ("api", "chat")]
            )
        );
        for (label, want) in [("alias", "m"), ("backend", "outbound|80||x.ns"), ("api", "chat")] {
            let tag = tags.iter().find(|t| t["tag_name"] == label).unwrap();
            let re = regex::Regex::new(tag["regex"].as_str().unwrap()).unwrap();
            let caps = re.captures(&name).unwrap();
            assert_eq!(&caps[1], format!(";{label}={want}"));
            assert_eq!(&caps[2], want);
        }
        let outcome = tags.iter().find(|t| t["tag_name"] == "outcome").unwrap();
        let re = regex::Regex::new(outcome["regex"].as_str().unwrap()).unwrap();
        assert!(re.captures(&name).is_none());
        assert!(re.captures("cluster.a.upstream_rq_total;outcome=x").is_none());
    }

    #[test]
    fn access_log_goes_to_stdout_by_default_and_to_the_configured_path() {
        let v = access_log(&cfg(""));
        assert_eq!(v[0]["name"], "envoy.access_loggers.stdout");
        let v = access_log(&cfg("access_log: { path: /tmp/llmroute/access.json }\n"));
        assert_eq!(v[0]["name"], "envoy.access_loggers.file");
        assert_eq!(v[0]["typed_config"]["path"], "/tmp/llmroute/access.json");
        let fields = &v[0]["typed_config"]["log_format"]["json_format"];
        assert_eq!(
            fields["gen_ai.request.model"],
            "%FILTER_STATE(wasm.llmroute.alias:PLAIN)%"
        );
        for f in [
            "gen_ai.response.model",
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "request_id",
        ] {
            assert!(fields.get(f).is_some(), "{f}");
        }
        // Nothing that could carry prompt text or a credential: no body, no path, no request headers but the id.
        let text = fields.to_string();
        assert_eq!(text.matches("%REQ(").count(), 1, "{text}");
        for bad in ["PATH", "AUTHORIZATION", "BODY", "QUERY"] {
            assert!(!text.to_ascii_uppercase().contains(bad), "{bad} in {text}");
        }
    }
}
