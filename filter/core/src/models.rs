//! `GET /v1/models` and `GET /v1/models/{id}`, answered from config in the OpenAI shape.
//!
//! The list is the configured aliases, in config order: what a client may send, never the upstream names.

use serde_json::{json, Value};

use crate::config::Config;
use crate::error::GatewayError;

fn model_object(name: &str) -> Value {
    json!({ "id": name, "object": "model", "created": 0, "owned_by": "llmroute" })
}

/// The OpenAI list body.
pub fn list_body(cfg: &Config) -> Vec<u8> {
    let data: Vec<Value> = cfg.models.iter().map(|m| model_object(&m.name)).collect();
    json!({ "object": "list", "data": data }).to_string().into_bytes()
}

/// One model's body, or 404 `model_not_found`.
pub fn get_body(cfg: &Config, id: &str) -> Result<Vec<u8>, GatewayError> {
    match cfg.alias(id) {
        Some(m) => Ok(model_object(&m.name).to_string().into_bytes()),
        None => Err(GatewayError::UnknownModel { model: id.to_string() }),
    }
}
