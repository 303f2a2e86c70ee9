//! The root context: loads and validates the plugin configuration, and hands it to each request. The main
//! role's root context also polls Envoy's admin API for the status endpoints (see `status`), checks that the
//! llama.cpp servers of each backend agree in `/props` (see `fleet_check`), and polls the engines' own load
//! (see `engine_load`).
//!
//! With `fairness`, the root context also releases its worker's requests waiting in the fair queue, on a shorter
//! tick (see `fair_queue`).
//!
//! A bad configuration makes `on_configure` return false, which makes Envoy refuse the plugin; the errors are
//! logged one per line. `llmroute validate` runs the same validator before deployment.

use std::rc::Rc;

use llmroute_core::auth::Keys;
use llmroute_core::Config;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

use crate::engine_load::LoadPoller;
use crate::fleet_check::FleetCheck;
use crate::host::Envoy;
use crate::http::Http;
use crate::metrics::Metrics;
use crate::placement_store::Syncer;
use crate::status::Poller;
use crate::upstream::Upstream;

use llmroute_core::envoy_contract::UPSTREAM_ROOT_ID;

pub struct Root {
    /// The host every context of this root calls.
    envoy: Envoy,
    config: Option<Rc<Config>>,
    /// The API keys, when `auth` is on.
    keys: Option<Rc<Keys>>,
    metrics: Metrics,
    /// True when this plugin instance is the failover clusters' upstream filter.
    upstream: bool,
    poller: Poller,
    /// The `/props` fleet check of the llama.cpp backends (see `fleet_check`).
    fleet_check: FleetCheck,
    /// The shared placement store's refresh (see `placement_store`).
    store: Syncer,
    /// The engine load poll of the backends with `load` (see `engine_load`).
    load: LoadPoller,
}

impl Root {
    /// A root context on `envoy`, not configured yet.
    pub fn new(envoy: Envoy) -> Root {
        let metrics = Metrics::new(envoy.clone());
        Root {
            load: LoadPoller::new(metrics.clone()),
            metrics,
            envoy,
            config: None,
            keys: None,
            upstream: false,
            poller: Poller::default(),
            fleet_check: FleetCheck::default(),
            store: Syncer::default(),
        }
    }
}

#[cfg(feature = "native")]
impl Root {
    /// A worker's own share of the tick, where another root context runs the periodic jobs (the native build: the
    /// main thread's root polls; each worker settles its key-table updates and releases its fair-queue waiters).
    pub fn on_worker_tick(&mut self) {
        crate::key_placement::settle(&self.envoy);
        if let (Some(cfg), false) = (&self.config, self.upstream) {
            crate::fair_queue::tick(&self.envoy, cfg, &self.metrics);
        }
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token_id: u32, _num_headers: usize, body_size: usize, _num_trailers: usize) {
        self.poller.on_response(&self.envoy, token_id, body_size);
        self.fleet_check.on_response(&self.envoy, token_id, body_size);
        self.store.on_response(&self.envoy, token_id, body_size);
        self.load.on_response(&self.envoy, token_id, body_size);
    }
}

impl RootContext for Root {
    fn on_vm_start(&mut self, _vm_configuration_size: usize) -> bool {
        log::info!("llmroute {} starting", llmroute_core::VERSION);
        #[cfg(feature = "bench-phases")]
        crate::phases::configure(self.envoy.vm_configuration().as_deref());
        true
    }

    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let Some(bytes) = self.envoy.plugin_configuration() else {
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
                let cfg = Rc::new(cfg);
                self.config = Some(cfg.clone());
                self.upstream = self.envoy.property_string(&["plugin_root_id"]).as_deref() == Some(UPSTREAM_ROOT_ID);
                if !self.upstream {
                    match crate::admission::load_keys(&cfg) {
                        Ok(keys) => self.keys = keys.map(Rc::new),
                        Err(e) => {
                            log::error!("llmroute config: {e}");
                            return false;
                        }
                    }
                    let credentials = match crate::store_auth::load(&cfg) {
                        Ok(c) => c,
                        Err(e) => {
                            log::error!("llmroute config: {e}");
                            return false;
                        }
                    };
                    crate::admission::seed(&self.envoy, &cfg, self.keys.as_deref());
                    let store = cfg.affinity.placement_store.is_some();
                    self.metrics.prime(cfg.any_bounded_keys(), store);
                    crate::key_placement::seed(&self.envoy, &cfg);
                    if let Some(cfg) = &self.config {
                        self.poller.start(&self.envoy, cfg.clone());
                        self.fleet_check.start(&self.envoy, cfg.clone());
                        self.store.start(&self.envoy, cfg.clone(), credentials);
                        self.load.start(&self.envoy, cfg.clone(), self.metrics.clone());
                        // Last: with `fairness`, it sets the shorter tick.
                        crate::fair_queue::start(&self.envoy, cfg, &self.metrics);
                    }
                }
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

    fn on_tick(&mut self) {
        crate::key_placement::settle(&self.envoy);
        self.poller.on_tick(&self.envoy);
        self.fleet_check.on_tick(&self.envoy);
        self.store.on_tick(&self.envoy);
        self.load.on_tick(&self.envoy);
        self.metrics.vm_memory_tick();
        if let (Some(cfg), false) = (&self.config, self.upstream) {
            crate::fair_queue::tick(&self.envoy, cfg, &self.metrics);
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Never `None`: the SDK panics on it. Envoy refuses a plugin whose `on_configure` failed, so a
        // missing config here is a host anomaly, and `Http` answers 503 for it.
        if self.upstream {
            return Some(Box::new(Upstream::new(self.envoy.clone(), self.config.clone())));
        }
        Some(Box::new(Http::new(
            self.envoy.clone(),
            self.config.clone(),
            self.keys.clone(),
            self.metrics.clone(),
            context_id,
        )))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
