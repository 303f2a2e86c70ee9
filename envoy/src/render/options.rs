//! The options of one render that are not in `llmroute.yaml`: where Envoy finds the wasm module, with which
//! runtime, and whether the filter is rendered at all (the overhead bench's plain-Envoy baseline) or delivered by
//! ECDS. Also the one sizing constant every listener shares.

/// Slack above the filter's body limit, so Envoy's own 413 never fires first.
pub(crate) const BUFFER_SLACK: usize = 1 << 20;

/// Where the wasm module is, and how Envoy should load it.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    /// Path to `llmroute_filter.wasm`, as Envoy will see it.
    pub wasm_path: String,
    /// The wasm runtime. Default `envoy.wasm.runtime.v8`.
    pub runtime: String,
    /// Include the wasm filter. Default true. When false, the route sends everything to the first backend's
    /// cluster: plain Envoy, the baseline of the overhead bench.
    pub with_filter: bool,
    /// Deliver the listener's wasm filter through ECDS from this watched file instead of inline (see
    /// [`ecds`]). Default none.
    pub ecds_path: Option<String>,
    /// Render the native build instead of the wasm one: Envoy's dynamic-module filter loading
    /// `libllmroute_native.so` from this path, with the same configuration, role names and neighbours (see
    /// `filters::module_filter`). Default none (the wasm filter).
    pub module_path: Option<String>,
}

impl RenderOptions {
    pub fn new(wasm_path: impl Into<String>) -> Self {
        RenderOptions {
            wasm_path: wasm_path.into(),
            runtime: "envoy.wasm.runtime.v8".into(),
            with_filter: true,
            ecds_path: None,
            module_path: None,
        }
    }

    /// The same options rendering the native build: the dynamic module at `path` instead of the wasm filter.
    pub fn with_module(mut self, path: impl Into<String>) -> Self {
        self.module_path = Some(path.into());
        self
    }

    /// The same options with the listener's wasm filter discovered from the watched file `path`.
    pub fn with_ecds(mut self, path: impl Into<String>) -> Self {
        self.ecds_path = Some(path.into());
        self
    }

    /// The same options without the wasm filter.
    pub fn without_filter(mut self) -> Self {
        self.with_filter = false;
        self
    }
}
