//! Config validation: `load_config` on fuzzed text, JSON (what the filter reads in `on_configure`) or YAML (what
//! the CLI reads), then one request routed through every alias of a config that loads.
//!
//! Input: the document. Beyond "no panic": every error names its field and a reason.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llmroute_core::{load_config, route, Api};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let cfg = match load_config(text) {
        Ok(cfg) => cfg,
        Err(errors) => {
            assert!(!errors.0.is_empty(), "a refused config with no error");
            for e in &errors.0 {
                assert!(
                    !e.field.is_empty() && !e.reason.is_empty(),
                    "an error without field or reason: {e:?}"
                );
            }
            let _ = errors.to_string();
            return;
        }
    };
    for alias in &cfg.models {
        let model = serde_json::Value::from(alias.name.as_str());
        let body = format!(r#"{{"model":{model},"messages":[{{"role":"user","content":"hi"}}],"max_tokens":8}}"#);
        let _ = route(&cfg, Api::Chat, body.as_bytes(), None);
    }
});
