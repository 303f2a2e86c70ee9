//! The module's and each filter configuration's hooks (`envoy_dynamic_module_on_program_init`,
//! `envoy_dynamic_module_on_http_filter_config_*`), and the root contexts.
//!
//! - One filter configuration (`config_new`, main thread) is validated once; Envoy refuses it when it is bad.
//!   Its main-thread root context is made and configured there too (a configuration it refuses is refused at
//!   load), and ticks from the configuration's scheduler (see `periodic`), with its callouts answered in
//!   `config_http_callout_done`.
//! - Each worker thread builds its own root context the first time one of its streams needs it (`with_root`).
//!
//! Every hook runs inside `catch_unwind`; a panic in a root context's tick or callout is logged and skipped.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use proxy_wasm::traits::{Context, RootContext};

use crate::abi::{self, EnvoyBuffer, EnvoyHeader, FilterConfigEnvoyPtr, FilterConfigModulePtr};
use crate::host::{self, CalloutAnswer, Current};
use crate::periodic::{self, Periodic};

/// One filter configuration: the filter name (`plugin_root_id`) and the plugin configuration bytes.
pub struct FilterConfig {
    pub id: u64,
    pub name: String,
    pub config: Vec<u8>,
    /// Envoy's configuration: the main thread's scheduler and callouts go through it.
    pub envoy: FilterConfigEnvoyPtr,
    /// The configuration has `fairness`: a waiting stream asks for its worker's tick.
    pub fairness: bool,
    pub periodic: Periodic,
    /// The filter's stat families, defined on Envoy's configuration (see `metrics`).
    pub families: crate::metrics::Families,
}

static NEXT_CONFIG: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's root context per configuration (`None` when it refused the configuration): the main
    /// thread's, made in `config_new`, and each worker's, made on first use.
    static ROOTS: RefCell<HashMap<u64, Option<Box<llmroute_filter::Root>>>> = RefCell::new(HashMap::new());
}

/// Logs through Envoy (the filter's logger may not be installed yet).
fn log_error(message: &str) {
    // SAFETY: the buffer describes `message`, alive for the call.
    unsafe { abi::envoy_dynamic_module_callback_log(4, abi::ModuleBuffer::of(message.as_bytes())) };
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    let ok = catch_unwind(|| {
        llmroute_filter::init_logging(log::LevelFilter::Info, |level, message| {
            let _ = llmroute_filter::Host::log(&host::HOST, level, message);
        });
        // After init_logging's hook: a panic is caught, so it costs one request, not a VM.
        std::panic::set_hook(Box::new(|info| {
            log::error!("llmroute: panic, the request fails closed with a 503: {info}");
        }));
    });
    match ok {
        Ok(()) => abi::ABI_VERSION.as_ptr(),
        Err(_) => std::ptr::null(),
    }
}

/// Reads an Envoy buffer as owned bytes.
fn owned(b: EnvoyBuffer) -> Vec<u8> {
    // SAFETY: Envoy's buffer, alive for the hook.
    unsafe { b.bytes() }.map(<[u8]>::to_vec).unwrap_or_default()
}

/// This thread's root context for `cfg` (`main`: the main thread's), made and configured on first use. `f`
/// gets `None` when the root refused the configuration, or when a root context of this thread is already busy
/// (a hook nested in another, which no hook here causes).
pub fn with_root<T>(cfg: &FilterConfig, main: bool, f: impl FnOnce(Option<&mut llmroute_filter::Root>) -> T) -> T {
    ROOTS.with(|roots| {
        let Ok(mut roots) = roots.try_borrow_mut() else {
            return f(None);
        };
        let root = roots.entry(cfg.id).or_insert_with(|| {
            let current = Current {
                config: cfg,
                main,
                ..Current::NONE
            };
            host::with_current(current, || {
                let envoy = llmroute_filter::Envoy::new(std::rc::Rc::new(host::NativeHost));
                let mut root = Box::new(llmroute_filter::Root::new(envoy));
                (root.on_vm_start(0) && root.on_configure(cfg.config.len())).then_some(root)
            })
        });
        f(root.as_deref_mut())
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: FilterConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> FilterConfigModulePtr {
    let made = catch_unwind(|| {
        let bytes = owned(config);
        let Ok(text) = std::str::from_utf8(&bytes) else {
            log_error("llmroute: the filter_config is not UTF-8");
            return std::ptr::null();
        };
        let fairness = match llmroute_core::load_config(text) {
            Ok(c) => c.fairness.is_some(),
            Err(errs) => {
                for e in &errs.0 {
                    log_error(&format!("llmroute config: {e}"));
                }
                return std::ptr::null();
            }
        };
        let cfg = Box::new(FilterConfig {
            id: NEXT_CONFIG.fetch_add(1, Ordering::Relaxed),
            name: String::from_utf8_lossy(&owned(name)).into_owned(),
            config: bytes,
            envoy: config_envoy,
            fairness,
            periodic: Periodic::default(),
            families: crate::metrics::define_all(config_envoy),
        });
        // The main thread's root: it configures (a refusal refuses the configuration), then ticks.
        if !with_root(&cfg, true, |root| root.is_some()) {
            drop_root(cfg.id);
            return std::ptr::null();
        }
        // No thread for a configuration with nothing to tick (the failover clusters' upstream filter).
        if cfg.periodic.asked() || cfg.fairness {
            cfg.periodic.start(config_envoy);
        }
        Box::into_raw(cfg).cast_const().cast::<c_void>()
    });
    made.unwrap_or(std::ptr::null())
}

fn drop_root(id: u64) {
    let root = ROOTS.with(|roots| roots.try_borrow_mut().ok().and_then(|mut r| r.remove(&id)));
    let _ = catch_unwind(AssertUnwindSafe(|| drop(root)));
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: FilterConfigModulePtr) {
    if config.is_null() {
        return;
    }
    // SAFETY: made by `Box::into_raw` in `config_new`, destroyed once by Envoy (on the main thread).
    let cfg = unsafe { Box::from_raw(config.cast::<FilterConfig>().cast_mut()) };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        cfg.periodic.stop();
        drop_root(cfg.id);
        drop(cfg);
    }));
}

/// Runs `f` on the main thread's root of the configuration behind `config`, as that root.
fn main_root(config: FilterConfigModulePtr, f: impl FnOnce(&FilterConfig, &mut llmroute_filter::Root)) {
    // SAFETY: made by `config_new`; Envoy runs the configuration's events only while it lives.
    let Some(cfg) = (unsafe { config.cast::<FilterConfig>().as_ref() }) else {
        return;
    };
    let current = Current {
        config: cfg,
        main: true,
        ..Current::NONE
    };
    let ran = host::with_current(current, || {
        catch_unwind(AssertUnwindSafe(|| with_root(cfg, true, |r| r.map(|r| f(cfg, r)))))
    });
    if ran.is_err() {
        log::error!("llmroute: the main thread's root context panicked; it carries on at its next tick");
    }
}

/// The configuration's tick event (main thread): the root's periodic jobs.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _config_envoy: FilterConfigEnvoyPtr,
    config: FilterConfigModulePtr,
    event_id: u64,
) {
    if event_id == periodic::EVENT_TICK {
        main_root(config, |cfg, root| {
            cfg.periodic.ticked();
            root.on_tick();
        });
    }
}

/// A callout of the main thread's root answered.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _config_envoy: FilterConfigEnvoyPtr,
    config: FilterConfigModulePtr,
    callout_id: u64,
    result: u32,
    headers: *const EnvoyHeader,
    headers_size: usize,
    body_chunks: *const EnvoyBuffer,
    body_chunks_size: usize,
) {
    let Ok(token) = u32::try_from(callout_id) else {
        return;
    };
    // SAFETY: Envoy's arrays of the sizes given, alive for this hook.
    let answer = unsafe { CalloutAnswer::of(result, headers, headers_size, body_chunks, body_chunks_size) };
    let (n, size) = (answer.headers.len(), answer.body.len());
    host::with_answer(answer, || {
        main_root(config, |_, root| root.on_http_call_response(token, n, size, 0));
    });
}

// Per-route configuration: not used.

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    std::ptr::null()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(_config: *const c_void) {}
