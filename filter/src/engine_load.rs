//! Engine load, host side: the poller that reads each engine's `/metrics`, the vLLM ORCA reports folded in on
//! the response path, the work in flight each placed request adds to its host, and the status page's view of it
//! all (see `llmroute_core::load` and `llmroute_core::load::poll` for what is decided).
//!
//! The poller runs in the root contexts next to the status poll. For each backend with `load`, a root context
//! that finds a round due claims it with a compare-and-swap on the backend's lease in shared data, so one root
//! context per Envoy process polls it, every `poll_ms`, however many workers Envoy runs. A round sends one
//! `GET /metrics` per host through the probe clusters `llmroute render` adds (a discovered backend's hosts
//! through its original-destination cluster, at the addresses the status poll listed); when all have answered
//! or the round's time is up, the readings are merged into the backend's shared value with compare-and-swap (a
//! worker's ORCA fold may write it too), each host's gauges are set, and the hosts that gave none are noted for
//! the status page. Requests never wait for it: placement reads the stored value once per request, and only on
//! a backend with `load`.

use std::rc::Rc;

use llmroute_core::config::{Backend, Config, EngineKind};
use llmroute_core::envoy_contract::metrics as names;
use llmroute_core::envoy_contract::{shared, ORIGINAL_DST_HEADER};
use llmroute_core::key_placement::in_flight::CAS_ATTEMPTS;
use llmroute_core::key_placement::table;
use llmroute_core::load::poll::{self, HostLoad, Problem, Target};
use llmroute_core::load::{self, orca, EngineLoad, METRICS_PATH};
use llmroute_core::status::{self, BackendHealth, TICK_MS};
use llmroute_core::RouteDecision;

use crate::host::{self, Envoy};
use crate::key_placement::Pin;
use crate::metrics::Metrics;

/// One backend's round in progress in this root context.
struct Round {
    /// Index into the config's backends.
    backend: usize,
    started_ms: u64,
    targets: Vec<Target>,
    /// `(call token, index into targets)` of the calls not answered yet.
    pending: Vec<(u32, usize)>,
    readings: Vec<(String, EngineLoad)>,
    failed: Vec<(String, Problem)>,
}

/// One root context's side of the engine load poll.
pub struct LoadPoller {
    /// Set when some backend has `load`.
    cfg: Option<Rc<Config>>,
    metrics: Metrics,
    rounds: Vec<Round>,
    /// A probe cluster could not be called (a hand-written bootstrap without it); logged once.
    missing_logged: bool,
}

impl LoadPoller {
    /// Not polling yet; `metrics` are the root context's.
    pub fn new(metrics: Metrics) -> LoadPoller {
        LoadPoller {
            cfg: None,
            metrics,
            rounds: Vec::new(),
            missing_logged: false,
        }
    }

    /// Starts polling the backends of `cfg` that have `load`, from `on_configure`; does nothing without any. The
    /// root ticks at least as often as the shortest `poll_ms`.
    pub fn start(&mut self, envoy: &Envoy, cfg: Rc<Config>, metrics: Metrics) {
        self.rounds.clear();
        let Some(shortest) = poll::polled_backends(&cfg)
            .filter_map(|b| b.load)
            .map(|l| l.poll_ms)
            .min()
        else {
            self.cfg = None;
            return;
        };
        // The stale counters read 0, not nothing, before the first stale reading.
        for b in poll::polled_backends(&cfg) {
            metrics.count(names::ENGINE_LOAD_STALE, &[("backend", &b.name)], 0);
        }
        self.cfg = Some(cfg);
        self.metrics = metrics;
        envoy.set_tick_period(shortest.min(TICK_MS));
    }

    pub fn on_tick(&mut self, envoy: &Envoy) {
        let Some(cfg) = self.cfg.clone() else {
            return;
        };
        let now = envoy.now_ms();
        for (i, b) in cfg.backends.iter().enumerate() {
            let Some(l) = b.load else { continue };
            if let Some(pos) = self.rounds.iter().position(|r| r.backend == i) {
                let started = self.rounds.get(pos).map_or(0, |r| r.started_ms);
                if now.saturating_sub(started) <= poll::timeout_ms(l.poll_ms).saturating_add(TICK_MS) {
                    continue;
                }
                // Some host never answered, not even with a timeout: finish with what came.
                let round = self.rounds.swap_remove(pos);
                self.finish(envoy, &cfg, round);
            }
            let due = |last: u64, now: u64| poll::due(last, now, l.poll_ms);
            if crate::lease::claim(envoy, &shared::load_lease(&b.name), now, due) {
                self.begin(envoy, &cfg, i, b, now);
            }
        }
    }

    /// Sends a round's calls to the hosts of `b` (backend `index`).
    fn begin(&mut self, envoy: &Envoy, cfg: &Config, index: usize, b: &Backend, now: u64) {
        let Some(l) = b.load else { return };
        let hosts = match b.discovered() {
            true => envoy
                .shared_data(&shared::hosts(&b.name))
                .0
                .and_then(|v| table::decode_down_hosts(&v)),
            false => None,
        };
        let targets = poll::targets(b, now, hosts);
        let stored = load::decode(&envoy.shared_data(&shared::load(&b.name)).0.unwrap_or_default());
        let stale = poll::stale_count(&targets, &stored, now, l.poll_ms);
        if stale > 0 {
            self.metrics.count(
                names::ENGINE_LOAD_STALE,
                &[("backend", &b.name)],
                u64::try_from(stale).unwrap_or(u64::MAX),
            );
        }
        let mut round = Round {
            backend: index,
            started_ms: now,
            targets,
            pending: Vec::new(),
            readings: Vec::new(),
            failed: Vec::new(),
        };
        let timeout = poll::timeout_ms(l.poll_ms);
        for (i, t) in round.targets.iter().enumerate() {
            let token = match t.original_dst {
                false => envoy.dispatch_get(&t.cluster, METRICS_PATH, timeout),
                true => envoy.dispatch_get_with(
                    &t.cluster,
                    METRICS_PATH,
                    &t.address,
                    &[(ORIGINAL_DST_HEADER, &t.address)],
                    timeout,
                ),
            };
            match token {
                Some(token) => round.pending.push((token, i)),
                None => {
                    if !self.missing_logged {
                        self.missing_logged = true;
                        log::warn!(
                            "llmroute: engine load: cluster {} cannot be called, so {} of {} is not polled; \
                             `llmroute render` adds one probe cluster per polled endpoint",
                            t.cluster,
                            t.address,
                            b.name
                        );
                    }
                    round.failed.push((t.address.clone(), Problem::NoCluster));
                }
            }
        }
        match round.pending.is_empty() {
            true => self.finish(envoy, cfg, round),
            false => self.rounds.push(round),
        }
    }

    pub fn on_response(&mut self, envoy: &Envoy, token: u32, body_size: usize) {
        let Some(cfg) = self.cfg.clone() else {
            return;
        };
        let Some(pos) = self
            .rounds
            .iter()
            .position(|r| r.pending.iter().any(|(t, _)| *t == token))
        else {
            return;
        };
        let Some(round) = self.rounds.get_mut(pos) else {
            return;
        };
        let Some(kind) = cfg.backends.get(round.backend).map(|b| b.kind) else {
            return;
        };
        let Some(at) = round.pending.iter().position(|(t, _)| *t == token) else {
            return;
        };
        let (_, index) = round.pending.swap_remove(at);
        let address = round.targets.get(index).map(|t| t.address.clone()).unwrap_or_default();
        let status = envoy.http_call_status();
        let page = match status {
            Some(200) => envoy
                .http_call_body(body_size.min(load::MAX_METRICS_BYTES))
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        match poll::read_answer(kind, status, &page, envoy.now_ms()) {
            Ok(reading) => round.readings.push((address, reading)),
            Err(p) => round.failed.push((address, p)),
        }
        if round.pending.is_empty() {
            let round = self.rounds.swap_remove(pos);
            self.finish(envoy, &cfg, round);
        }
    }

    /// Stores a round's readings and problems, and sets each host's gauges.
    fn finish(&mut self, envoy: &Envoy, cfg: &Config, mut round: Round) {
        let Some(b) = cfg.backends.get(round.backend) else {
            return;
        };
        let Some(l) = b.load else { return };
        // The calls still pending never answered.
        for (_, i) in std::mem::take(&mut round.pending) {
            if let Some(t) = round.targets.get(i) {
                round.failed.push((t.address.clone(), Problem::Timeout));
            }
        }
        let now = envoy.now_ms();
        let key = shared::load(&b.name);
        if !round.readings.is_empty() {
            let written = (0..CAS_ATTEMPTS).any(|_| {
                let (bytes, cas) = envoy.shared_data(&key);
                let merged = poll::merge(&bytes.unwrap_or_default(), &round.readings, now, l.poll_ms);
                envoy.set_shared_data(&key, &merged, cas)
            });
            if !written {
                log::debug!("llmroute: engine load of {} not stored this round (contention)", b.name);
            }
        }
        let notes = shared::load_problems(&b.name);
        let ok: Vec<String> = round.readings.iter().map(|(a, _)| a.clone()).collect();
        let stored = envoy.shared_data(&notes).0.unwrap_or_default();
        if let Some(v) = poll::merge_problems(&stored, &ok, &round.failed, now, l.poll_ms) {
            envoy.set_shared_data(&notes, &v, None);
        }
        let ids = crate::status::id_key(envoy);
        for (address, r) in &round.readings {
            let host_id = status::shown_host(ids, address);
            let labels = [("backend", b.name.as_str()), ("host", host_id.as_str())];
            self.metrics.gauge(names::ENGINE_QUEUE, &labels, u64::from(r.queued));
            self.metrics.gauge(names::ENGINE_RUNNING, &labels, u64::from(r.running));
            if let Some(kv) = r.kv_permille {
                self.metrics.gauge(names::ENGINE_KV_PERMILLE, &labels, u64::from(kv));
            }
        }
        let count = |outcome: &str, n: usize| {
            if n > 0 {
                let labels = [("backend", b.name.as_str()), ("outcome", outcome)];
                self.metrics
                    .count(names::ENGINE_LOAD_READS, &labels, u64::try_from(n).unwrap_or(u64::MAX));
            }
        };
        count("ok", round.readings.len());
        for outcome in ["error", "timeout", "no_gauge"] {
            count(
                outcome,
                round.failed.iter().filter(|(_, p)| p.outcome() == outcome).count(),
            );
        }
    }
}

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
