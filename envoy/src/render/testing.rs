//! What the renderer's unit tests share: the smallest document (one backend, one alias) and that document with more
//! fields after it, loaded as `llmroute render` loads it.

use llmroute_core::config::Document;

/// One llama.cpp backend `a` on `127.0.0.1:8081`, one alias `m` routed to it.
pub(crate) const ONE_BACKEND: &str = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081']\nmodels:\n  - name: m\n    routes: [{ backend: a }]\n";

/// [`ONE_BACKEND`] with `extra` (top-level YAML lines) after it, loaded whole.
pub(crate) fn one_backend(extra: &str) -> Document {
    llmroute_core::load_document(&format!("{ONE_BACKEND}{extra}")).unwrap()
}
