//! Config validation: `load_config` (what the filter reads in `on_configure`) and `load_document` (what the CLI
//! reads, the renderer's fields included) on fuzzed text, JSON or YAML, then one request routed through every
//! alias of a config that loads.
//!
//! Input: the document. Beyond "no panic": every error names its field and a reason.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llmroute_core::{load_config, load_document, route, Api, ConfigErrors};

/// Every error names its field and a reason.
fn check(errors: &ConfigErrors) {
    assert!(!errors.0.is_empty(), "a refused config with no error");
    for e in &errors.0 {
        assert!(
            !e.field.is_empty() && !e.reason.is_empty(),
            "an error without field or reason: {e:?}"
        );
    }
    let _ = errors.to_string();
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(errors) = load_document(text) {
        check(&errors);
    }
    let cfg = match load_config(text) {
        Ok(cfg) => cfg,
        Err(errors) => {
            check(&errors);
            return;
        }
    };
    for alias in &cfg.models {
        let model = serde_json::Value::from(alias.name.as_str());
        let body = format!(r#"{{"model":{model},"messages":[{{"role":"user","content":"hi"}}],"max_tokens":8}}"#);
        let _ = route(&cfg, Api::Chat, body.as_bytes(), None);
    }
});
