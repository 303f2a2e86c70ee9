//! Engine load on the request path: the ORCA report a routed request asks a vLLM engine for and the one folded
//! in from its response, the work in flight a placed request adds to its host until its log phase (rebuilt from
//! the status snapshot), and the status page's view of the readings.

use super::*;

/// True when a request routed by `decision` may reach a vLLM backend that polls its load: it then asks the
/// engine for an ORCA report (`endpoint-load-metrics-format: JSON`).
fn asks_orca(cfg: &Config, decision: &RouteDecision) -> bool {
    let reports = |b: &Backend| b.kind == EngineKind::Vllm && b.load.is_some();
    match decision.known_backend() {
        Some(name) => cfg.backends.iter().any(|b| b.name == name && reports(b)),
        None => cfg
            .alias(&decision.alias)
            .is_some_and(|a| a.routes.iter().any(|r| cfg.backend(r.backend).is_some_and(reports))),
    }
}

/// Request side: asks a vLLM engine that polls its load for an ORCA report with its answer.
pub fn ask_report(envoy: &Envoy, cfg: &Config, decision: &RouteDecision) {
    if asks_orca(cfg, decision) {
        envoy.set_request_header(orca::REQUEST_HEADER, Some(orca::REQUEST_FORMAT));
    }
}

/// Response side: folds the ORCA report a vLLM engine of `backend` sent (header `value`) into its host's reading.
/// The header itself never reaches the client: the response plan removes it.
pub fn fold_report(envoy: &Envoy, cfg: &Config, backend: &str, value: &str) {
    let Some(b) = cfg.backends.iter().find(|b| b.name == backend) else {
        return;
    };
    let (Some(l), EngineKind::Vllm) = (b.load, b.kind) else {
        return;
    };
    let Some(report) = orca::parse(value.as_bytes()) else {
        return;
    };
    let Some(address) = envoy.property_string(&["upstream", "address"]) else {
        return;
    };
    let key = shared::load(&b.name);
    let now = envoy.now_ms();
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = envoy.shared_data(&key);
        let Some(v) = poll::fold_orca(&bytes.unwrap_or_default(), &address, report, now, l.poll_ms) else {
            return;
        };
        if envoy.set_shared_data(&key, &v, cas) {
            return;
        }
    }
}

/// A placed request's work in flight on its host: its estimated prompt tokens plus its requested output, kept
/// per host in shared data until the log phase releases it.
#[derive(Debug, Clone)]
pub struct Work {
    key: String,
    host: usize,
    hosts: usize,
    tokens: i64,
}

impl Work {
    /// Adds the request's tokens to the host `pin` chose, when its backend polls engine load.
    pub fn hold(envoy: &Envoy, cfg: &Config, pin: &Pin, input_tokens: u64, max_output: Option<u64>) -> Option<Work> {
        let (backend, host, hosts) = pin.place();
        cfg.backends.iter().find(|b| b.name == backend)?.load?;
        let tokens = i64::try_from(input_tokens.saturating_add(max_output.unwrap_or(0))).unwrap_or(i64::MAX);
        let work = Work {
            key: shared::work(backend),
            host,
            hosts,
            tokens,
        };
        crate::key_placement::add_through_ledger(envoy, &work.key, hosts, host, tokens);
        Some(work)
    }

    /// The request is over.
    pub fn release(&self, envoy: &Envoy) {
        crate::key_placement::add_through_ledger(envoy, &self.key, self.hosts, self.host, self.tokens.saturating_neg());
    }
}

/// At the status poll: a host of a backend with `load` that Envoy finds with no request in flight carries no
/// work either, whatever a worker that trapped never released (see `key_placement::rebuild_in_flight`).
pub fn rebuild_work(envoy: &Envoy, cfg: &Config, health: &BackendHealth, now_ms: u64) {
    let Some(b) = cfg.backends.iter().find(|b| b.name == health.name && b.load.is_some()) else {
        return;
    };
    let Some(addresses) = llmroute_core::key_placement::views::addresses(b, now_ms, &host::SharedData(envoy)) else {
        return;
    };
    let key = shared::work(&b.name);
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = envoy.shared_data(&key);
        let before = table::decode_host_counts(&bytes.unwrap_or_default(), addresses.len());
        let after: Vec<u32> = before
            .iter()
            .zip(&addresses)
            .map(|(w, a)| match health.active.iter().any(|(x, n)| x == a && *n > 0) {
                true => *w,
                false => 0,
            })
            .collect();
        if after == before || envoy.set_shared_data(&key, &table::encode_host_counts(&after), cas) {
            return;
        }
    }
}

/// What the status page shows of the engine load of each backend that polls it, read once per page.
pub struct StatusView {
    backends: Vec<BackendView>,
}

/// One backend with `load`, as stored: its readings, its hosts' problems, and its work in flight by address.
struct BackendView {
    name: String,
    readings: Vec<(String, EngineLoad)>,
    problems: Vec<poll::Noted>,
    work: Vec<(String, u64)>,
}

impl StatusView {
    pub fn read(envoy: &Envoy, cfg: &Config, now_ms: u64) -> StatusView {
        let read = |key: String| envoy.shared_data(&key).0.unwrap_or_default();
        let backends = poll::polled_backends(cfg)
            .map(|b| {
                let work = llmroute_core::key_placement::views::addresses(b, now_ms, &host::SharedData(envoy))
                    .map(|list| {
                        let counts = table::decode_host_counts(&read(shared::work(&b.name)), list.len());
                        list.into_iter().zip(counts.into_iter().map(u64::from)).collect()
                    })
                    .unwrap_or_default();
                BackendView {
                    name: b.name.clone(),
                    readings: load::decode(&read(shared::load(&b.name))),
                    problems: poll::decode_problems(&read(shared::load_problems(&b.name))),
                    work,
                }
            })
            .collect();
        StatusView { backends }
    }

    /// What is known of the load of the host at `address` of `backend`, when the backend polls engine load.
    pub fn host(&self, backend: &Backend, address: &str) -> Option<HostLoad> {
        let b = self.backends.iter().find(|v| v.name == backend.name)?;
        Some(HostLoad {
            reading: b.readings.iter().find(|(a, _)| a == address).map(|(_, r)| *r),
            problem: b
                .problems
                .iter()
                .find(|(a, ..)| a == address)
                .map(|(_, p, at)| (*p, *at)),
            work_tokens: b.work.iter().find(|(a, _)| a == address).map(|(_, w)| *w),
        })
    }
}
