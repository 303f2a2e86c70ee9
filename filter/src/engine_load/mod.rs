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
//!
//! The request path's side (the ORCA ask and fold, work in flight, the status page's view) is in `requests.rs`.

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

mod requests;
pub use requests::{ask_report, fold_report, rebuild_work, StatusView, Work};

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
