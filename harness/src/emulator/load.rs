//! The load an emulated engine reports: a `GET /metrics` page in the dialect of llama.cpp (`--metrics`), vLLM or
//! SGLang, and vLLM's ORCA load report in a response header when the request asks for one.
//!
//! Tests set the figures ([`Emulator::set_load`](super::Emulator::set_load)): requests queued, requests running
//! (by default the inference requests in flight), and KV-cache use. A page without a format (`None`) answers 501,
//! as llama-server does when started without `--metrics`; `set_metrics_status` makes the page fail on demand.

use std::sync::Mutex;

/// The `/metrics` dialect an emulator speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadFormat {
    /// `llamacpp:requests_processing`, `llamacpp:requests_deferred`.
    LlamaCpp,
    /// `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`, one sample per
    /// served model.
    Vllm,
    /// `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`.
    Sglang,
}

/// The figures an emulator reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReportedLoad {
    pub queued: u32,
    /// `None`: the inference requests in flight.
    pub running: Option<u32>,
    /// KV-cache use, 0 to 1; `None` reports 0.
    pub kv_usage: Option<f64>,
}

/// The request header that asks for an ORCA report, and the response header that carries it.
pub const ORCA_REQUEST: &str = "endpoint-load-metrics-format";
pub const ORCA_RESPONSE: &str = "endpoint-load-metrics";

/// What the handle and the handlers share.
#[derive(Debug, Default)]
pub(super) struct LoadState {
    pub(super) reported: Mutex<ReportedLoad>,
    /// Status `/metrics` answers with instead of the page (0: none).
    pub(super) status: std::sync::atomic::AtomicU16,
}

impl LoadState {
    pub(super) fn reported(&self) -> ReportedLoad {
        *self.reported.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The `/metrics` page of `format` for `load`, with `running` requests running.
pub fn metrics_page(format: LoadFormat, model: &str, load: ReportedLoad, running: u32) -> String {
    let kv = load.kv_usage.unwrap_or(0.0);
    let q = load.queued;
    match format {
        LoadFormat::LlamaCpp => format!(
            "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n\
             # TYPE llamacpp:prompt_tokens_total counter\n\
             llamacpp:prompt_tokens_total 0\n\
             # HELP llamacpp:requests_processing Number of requests processing.\n\
             # TYPE llamacpp:requests_processing gauge\n\
             llamacpp:requests_processing {running}\n\
             # HELP llamacpp:requests_deferred Number of requests deferred.\n\
             # TYPE llamacpp:requests_deferred gauge\n\
             llamacpp:requests_deferred {q}\n"
        ),
        LoadFormat::Vllm => format!(
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
             # TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{engine=\"0\",model_name=\"{model}\"}} {running}.0\n\
             # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
             # TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{{engine=\"0\",model_name=\"{model}\"}} {q}.0\n\
             # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
             # TYPE vllm:kv_cache_usage_perc gauge\n\
             vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"{model}\"}} {kv}\n"
        ),
        LoadFormat::Sglang => format!(
            "sglang:num_running_reqs{{model_name=\"{model}\",engine_type=\"unified\"}} {running}.0\n\
             sglang:num_queue_reqs{{model_name=\"{model}\",engine_type=\"unified\"}} {q}.0\n\
             sglang:token_usage{{model_name=\"{model}\",engine_type=\"unified\"}} {kv}\n"
        ),
    }
}

/// vLLM's ORCA report of `load`, the `endpoint-load-metrics` value.
pub fn orca_report(load: ReportedLoad) -> String {
    format!(
        "JSON {{\"named_metrics\": {{\"kv_cache_usage_perc\": {}, \"num_requests_waiting\": {}.0}}}}",
        load.kv_usage.unwrap_or(0.0),
        load.queued
    )
}
