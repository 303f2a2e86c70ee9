//! The headers phase: `request::start` on a fuzzed method, path and headers, then what `filter/src/http/`
//! answers from headers alone: the `/v1/models` bodies, a refusal's body and headers, the request id check and
//! the list of client headers to strip.
//!
//! Input: text lines, `METHOD`, `PATH`, then `name: value` headers (see `llmroute_core_fuzz::head`).
//! Beyond "no panic": every body the gateway writes is JSON, and every header value it writes is header-safe.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llmroute_core::request::{self, Refusal};
use llmroute_core::{headers, models, Endpoint};
use llmroute_core_fuzz::{config, head, header_safe};

fn is_json(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body).is_ok()
}

fuzz_target!(|data: &[u8]| {
    let Some(cfg) = config() else {
        panic!("the fuzz config does not load");
    };
    let h = head(data);
    let find = |name: &str| h.headers.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let _ = headers::to_strip(h.headers.iter().map(|(n, _)| n.as_str()));
    let request_id = find(headers::REQUEST_ID)
        .filter(|v| request::request_id_ok(v))
        .map(|v| String::from_utf8_lossy(v).into_owned());
    if let Some(id) = &request_id {
        assert!(header_safe(id.as_bytes()));
    }
    let method = std::str::from_utf8(h.method).unwrap_or_default();
    let path = std::str::from_utf8(h.path).unwrap_or_default();
    let refused = match request::start(cfg, method, path, find) {
        Ok(start) => {
            if let Ok(Some(s)) = start.session.first(&cfg.affinity.session_headers) {
                assert!(header_safe(s.value.as_bytes()));
            }
            let query = path.split_once('?').map_or("", |(_, q)| q);
            let body = match &start.endpoint {
                Endpoint::GetModel(id) => models::get_body(cfg, start.envelope, id),
                Endpoint::ListModels => models::list_body(cfg, start.envelope, query),
                _ => return,
            };
            match body {
                Ok(b) => {
                    assert!(is_json(&b), "models body is not JSON");
                    return;
                }
                Err(e) => (e, start.envelope),
            }
        }
        Err(Refusal { error, envelope }) => (error, envelope),
    };
    let (e, envelope) = refused;
    assert!(
        is_json(&e.body(envelope, request_id.as_deref())),
        "refusal body is not JSON"
    );
    assert!(header_safe(e.code().as_bytes()));
    for (_, v) in e.headers() {
        assert!(header_safe(v.as_bytes()));
    }
});
