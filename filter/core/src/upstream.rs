//! The upstream side of failover: when an alias's failover cluster moves a request to another backend, that
//! backend must receive its own `upstream_model`.
//!
//! The same wasm module runs a second time as an Envoy upstream HTTP filter on the failover cluster. On each
//! attempt, after Envoy has picked the host, it reads the alias (from the request header the downstream filter
//! set) and the host's backend (from endpoint metadata), and rewrites `model` for that backend. Each attempt
//! starts from the body as the downstream filter left it, so the rewrite is applied afresh every time.

use crate::config::Config;
use crate::error::GatewayError;
use crate::fields::read_fields;
use crate::json::{scan_object, Kind, MAX_DEPTH};
use crate::route::BodyPatch;

/// The upstream model of `alias` on `backend`, if the alias routes there.
pub fn upstream_model<'c>(cfg: &'c Config, alias: &str, backend: &str) -> Option<&'c str> {
    let alias = cfg.alias(alias)?;
    alias
        .routes
        .iter()
        .find(|r| cfg.backend(r.backend).is_some_and(|b| b.name == backend))
        .map(|r| r.upstream_model.as_str())
}

/// The edit that sets `model` to `upstream`; `None` when it already is.
pub fn model_patch(body: &[u8], upstream: &str) -> Result<Option<BodyPatch>, GatewayError> {
    let members = scan_object(body, MAX_DEPTH).map_err(GatewayError::InvalidJson)?;
    let fields = read_fields(body, &members)?;
    let model = fields
        .get("model")
        .filter(|m| m.kind == Kind::String)
        .ok_or(GatewayError::MissingField { field: "model" })?;
    let replacement = serde_json::Value::from(upstream).to_string();
    Ok((model.value.of(body) != replacement.as_bytes()).then_some(BodyPatch {
        span: model.value,
        replacement,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        crate::config::load(
            r#"{"version":1,
                "backends":[{"name":"a","kind":"llamacpp","endpoints":["127.0.0.1:1"]},
                            {"name":"b","kind":"vllm","endpoints":["127.0.0.1:2"]}],
                "models":[{"name":"m","routes":[{"backend":"a","upstream_model":"qwen-gguf","priority":1},
                                                 {"backend":"b","upstream_model":"Qwen/Qwen3","priority":2}]}]}"#,
        )
        .unwrap()
    }

    #[test]
    fn each_backend_has_its_own_model() {
        let c = cfg();
        assert_eq!(upstream_model(&c, "m", "a"), Some("qwen-gguf"));
        assert_eq!(upstream_model(&c, "m", "b"), Some("Qwen/Qwen3"));
        assert_eq!(upstream_model(&c, "m", "c"), None);
        assert_eq!(upstream_model(&c, "x", "a"), None);
    }

    #[test]
    fn repatch_replaces_whatever_model_is_there() {
        let body = br#"{"model":"qwen-gguf","messages":[]}"#;
        let p = model_patch(body, "Qwen/Qwen3").unwrap().unwrap();
        assert_eq!(p.apply(body), br#"{"model":"Qwen/Qwen3","messages":[]}"#.to_vec());
        assert_eq!(model_patch(body, "qwen-gguf").unwrap(), None);
    }
}
