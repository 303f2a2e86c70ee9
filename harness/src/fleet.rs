//! A fleet of emulated engines plus the llmroute config that fronts them: the common set-up of tests, benches
//! and the demo.

use serde_json::{json, Value};

use crate::emulator::{Emulator, EmulatorOptions};

/// Emulators named `<backend>-0`, `<backend>-1`, ...
pub struct Fleet {
    pub backend: String,
    pub engines: Vec<Emulator>,
}

impl Fleet {
    /// Starts `n` emulators for one backend.
    pub async fn start(backend: &str, n: usize) -> std::io::Result<Fleet> {
        Self::start_with(backend, n, |_| {}).await
    }

    /// Starts `n` emulators, letting `tune` adjust each one's options.
    pub async fn start_with(backend: &str, n: usize, tune: impl Fn(&mut EmulatorOptions)) -> std::io::Result<Fleet> {
        let mut engines = Vec::with_capacity(n);
        for i in 0..n {
            let mut opts = EmulatorOptions::new(&format!("{backend}-{i}"));
            tune(&mut opts);
            engines.push(Emulator::spawn_with(opts).await?);
        }
        Ok(Fleet {
            backend: backend.to_string(),
            engines,
        })
    }

    /// `["127.0.0.1:P", ...]` for the config.
    pub fn endpoints(&self) -> Vec<String> {
        self.engines.iter().map(|e| e.addr().to_string()).collect()
    }

    /// A backend entry for this fleet: llamacpp, chwbl with the given balance factor.
    pub fn backend_entry(&self, balance_factor: u32) -> Value {
        json!({
            "name": self.backend,
            "kind": "llamacpp",
            "endpoints": self.endpoints(),
            "lb": "chwbl",
            "balance_factor": balance_factor,
        })
    }

    /// How many chat requests each engine received, in engine order.
    pub fn chat_counts(&self) -> Vec<usize> {
        self.engines.iter().map(|e| e.chat_requests().len()).collect()
    }

    /// How many inference requests (every dialect: chat, completions, responses, embeddings, messages) each
    /// engine received, in engine order.
    pub fn inference_counts(&self) -> Vec<usize> {
        self.engines.iter().map(|e| e.inference_requests().len()).collect()
    }

    pub fn reset(&self) {
        for e in &self.engines {
            e.reset();
        }
    }
}

/// A one-backend config: alias `alias` to `fleet` with `upstream_model`.
pub fn single_backend_config(fleet: &Fleet, alias: &str, upstream_model: &str, balance_factor: u32) -> Value {
    json!({
        "version": 1,
        "backends": [fleet.backend_entry(balance_factor)],
        "models": [{ "name": alias, "routes": [{ "backend": fleet.backend, "upstream_model": upstream_model }] }],
        "affinity": { "session_headers": ["x-session-id"], "user_prefix_bytes": 256 },
    })
}
