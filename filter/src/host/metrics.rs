//! Metrics: defined once per VM, then counted, observed and read; a metric the host refused is skipped.

use super::*;
use proxy_wasm::types::MetricType;

impl Envoy {
    /// A metric of `kind`; `None` when the host refuses (the metric is then skipped).
    pub fn define_metric(&self, kind: MetricType, name: &str) -> Option<u32> {
        logged(
            self.host().define_metric(kind, name),
            format_args!("defining metric {name}"),
        )
    }

    /// A counter, defined once per VM; `None` when the host refuses (metrics are then skipped).
    pub fn define_counter(&self, name: &str) -> Option<u32> {
        logged(
            self.host().define_metric(MetricType::Counter, name),
            format_args!("defining metric {name}"),
        )
    }

    pub fn increment(&self, metric: Option<u32>) {
        self.add(metric, 1);
    }

    pub fn add(&self, metric: Option<u32>, n: u64) {
        if let (Some(id), Ok(n)) = (metric, i64::try_from(n)) {
            let _ = self.host().increment_metric(id, n);
        }
    }

    /// A metric's current value (summed over the VMs), if it was defined and the host answers.
    pub fn metric_value(&self, metric: Option<u32>) -> Option<u64> {
        self.host().get_metric(metric?).ok()
    }

    /// Records one observation `v` of a histogram (the same ABI call as a gauge's level, `record_metric`).
    pub fn observe(&self, metric: Option<u32>, v: u64) {
        if let Some(id) = metric {
            let _ = self.host().record_metric(id, v);
        }
    }

    pub fn set_gauge(&self, metric: Option<u32>, v: u64) {
        if let Some(id) = metric {
            let _ = self.host().record_metric(id, v);
        }
    }
}
