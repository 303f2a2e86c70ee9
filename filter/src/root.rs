//! The root context: loads and validates the plugin configuration, and hands it to each request.
//!
//! A bad configuration makes `on_configure` return false, which makes Envoy refuse the plugin; the errors are
//! logged one per line. `llmroute validate` runs the same validator before deployment.

use std::rc::Rc;

use llmroute_core::Config;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

use crate::host;
use crate::http::Http;

#[derive(Default)]
pub struct Root {
    config: Option<Rc<Config>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_vm_start(&mut self, _vm_configuration_size: usize) -> bool {
        log::info!("llmroute {} starting", llmroute_core::VERSION);
        true
    }

    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let Some(bytes) = host::plugin_configuration() else {
            log::error!("llmroute: no plugin configuration; embed llmroute.yaml as JSON (see `llmroute render`)");
            return false;
        };
        let Ok(text) = std::str::from_utf8(&bytes) else {
            log::error!("llmroute: the plugin configuration is not UTF-8");
            return false;
        };
        match llmroute_core::load_config(text) {
            Ok(cfg) => {
                log::info!(
                    "llmroute: configured {} backend(s), {} model alias(es)",
                    cfg.backends.len(),
                    cfg.models.len()
                );
                self.config = Some(Rc::new(cfg));
                true
            }
            Err(errs) => {
                for e in &errs.0 {
                    log::error!("llmroute config: {e}");
                }
                false
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Never `None`: the SDK panics on it. Envoy refuses a plugin whose `on_configure` failed, so a
        // missing config here is a host anomaly, and `Http` answers 503 for it.
        Some(Box::new(Http::new(self.config.clone(), context_id)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
