//! llama.cpp's own endpoints: `GET /health`, `GET /props` and `GET /v1/models`.

use serde_json::{json, Value};

use super::Envelope;

/// `GET /health` body for a status.
pub fn health_body(status: u16) -> Value {
    match status {
        200 => json!({"status": "ok"}),
        503 => Envelope::OpenAi.error(503, "unavailable_error", "Loading model"),
        other => Envelope::OpenAi.error_for(other, "emulated health failure"),
    }
}

/// `GET /props` body.
pub fn props_body(model: &str, n_ctx: u32, total_slots: u32) -> Value {
    json!({
        "default_generation_settings": {
            "id": 0,
            "n_ctx": n_ctx,
            "is_processing": false,
            "speculative": false,
            "params": {"n_predict": -1, "temperature": 0.8, "top_k": 40, "top_p": 0.95}
        },
        "total_slots": total_slots,
        "model_path": format!("{model}.gguf"),
        "chat_template": "{{ messages }}",
        "modalities": {"vision": false, "audio": false},
        "build_info": "emulator"
    })
}

/// `GET /v1/models` body.
pub fn models_body(model: &str, n_ctx: u32) -> Value {
    json!({
        "object": "list",
        "data": [{
            "id": model,
            "object": "model",
            "created": 0,
            "owned_by": "llamacpp",
            "meta": {"n_ctx_train": n_ctx}
        }]
    })
}
