//! Status for operators, host side: polling Envoy's admin API from the root context, and answering
//! `GET /llmroute/status`, `/healthz` and `/readyz` from the snapshot.
//!
//! Every root context (the main thread's and one per worker) ticks every [`status::TICK_MS`]. On a tick, a
//! root context that finds a poll due claims it with a compare-and-swap on a lease in VM-wide shared data, so
//! one process polls `GET /clusters?format=json` about once per [`status::POLL_INTERVAL_MS`] whatever its
//! worker count. The answer is parsed by the core into a `FleetStatus`, stored in shared data, and every
//! worker's request contexts read that one snapshot. A failed poll keeps the previous snapshot, which ages
//! until `/readyz` calls it stale. Whether polls fail, at which `admin:` address and why, is kept in shared data
//! too (`admin_poll::AdminFailure`): the pages show it, and the root context whose write changes it from working to
//! failing (or back) logs the one line, so a wrong admin address is named once, not once a poll or a worker. A
//! good poll also rebuilds bounded-keys placement's in-flight counts from Envoy's per-host `rq_active` (see
//! `key_placement::rebuild_in_flight`).
//!
//! The status page names hosts by ids keyed with a secret of the process (`status::IdKey`), drawn from the VM's
//! random source (WASI `random_get`, which Envoy serves from its CSPRNG) and the clock by the first root context
//! that configures, and kept in shared data so that every worker shows the same ids.

use std::rc::Rc;

use llmroute_core::admin_poll::{self, AdminFailure, Change, PollError};
use llmroute_core::request_plan::{LocalReply, JSON};
use llmroute_core::status::{self, FleetStatus, IdKey, StatusPage};
use llmroute_core::Config;
use proxy_wasm::types::Action;

use llmroute_core::envoy_contract::shared;

use crate::host::Envoy;

/// When the last poll was claimed (see `lease`).
const LEASE_KEY: &str = shared::STATUS_LEASE;
/// The latest `FleetStatus`, encoded by the core.
const SNAPSHOT_KEY: &str = shared::STATUS_SNAPSHOT;
/// The process's `IdKey`.
const ID_KEY: &str = shared::STATUS_ID_KEY;
/// The admin polls' `AdminFailure`, or `null`.
const ADMIN_KEY: &str = shared::STATUS_ADMIN;

/// One root context's side of the polling.
#[derive(Default)]
pub struct Poller {
    cfg: Option<Rc<Config>>,
    /// This root context's poll in progress: its call token and when it started.
    pending: Option<(u32, u64)>,
}

impl Poller {
    /// Starts ticking with `cfg`, from `on_configure`.
    pub fn start(&mut self, envoy: &Envoy, cfg: Rc<Config>) {
        self.cfg = Some(cfg);
        id_key(envoy);
        envoy.set_tick_period(status::TICK_MS);
    }

    pub fn on_tick(&mut self, envoy: &Envoy) {
        let now = envoy.now_ms();
        if let Some((_, since)) = self.pending {
            if now.saturating_sub(since) <= status::POLL_TIMEOUT_MS + status::TICK_MS {
                return;
            }
            // The host never answered in time; forget the call (a late answer is ignored).
            self.pending = None;
            self.record(
                envoy,
                Err(PollError::NoAnswer {
                    timeout_ms: status::POLL_TIMEOUT_MS,
                }),
            );
        }
        if self.cfg.is_none() || !claim_poll(envoy, now) {
            return;
        }
        match envoy.dispatch_get(status::ADMIN_CLUSTER, status::ADMIN_PATH, status::POLL_TIMEOUT_MS) {
            Some(token) => self.pending = Some((token, now)),
            None => {
                // Let another root context take the next tick's poll.
                envoy.set_shared_data(LEASE_KEY, &0u64.to_le_bytes(), None);
                self.record(envoy, Err(PollError::NotCalled));
            }
        }
    }

    pub fn on_response(&mut self, envoy: &Envoy, token: u32, body_size: usize) {
        if self.pending.map(|(t, _)| t) != Some(token) {
            return;
        }
        self.pending = None;
        let Some(cfg) = self.cfg.clone() else {
            return;
        };
        match envoy.http_call_status() {
            Some(200) => {}
            Some(code) => {
                // Only Envoy's own short local reply is quoted; read no more than that could be.
                let head = envoy
                    .http_call_body(body_size.min(admin_poll::MAX_ERROR_LEN))
                    .unwrap_or_default();
                return self.record(envoy, Err(admin_poll::answered(code, &head)));
            }
            None => {
                return self.record(
                    envoy,
                    Err(PollError::NoAnswer {
                        timeout_ms: status::POLL_TIMEOUT_MS,
                    }),
                )
            }
        }
        let Some(body) = envoy.http_call_body(body_size) else {
            return self.record(envoy, Err(PollError::Unreadable("its body could not be read".into())));
        };
        match status::parse_clusters(&body, &cfg, envoy.now_ms()) {
            Ok(fleet) => {
                envoy.set_shared_data(SNAPSHOT_KEY, &fleet.encode(), None);
                // Placement reads only its backend's down hosts, per request, without decoding the snapshot.
                for b in &fleet.backends {
                    crate::key_placement::store_down(envoy, &b.name, fleet.taken_at_ms, &b.down);
                    if cfg.backends.iter().any(|c| c.name == b.name && c.discovered()) {
                        crate::key_placement::store_hosts(envoy, &b.name, fleet.taken_at_ms, &b.hosts);
                        crate::key_placement::store_weights(envoy, &b.name, &b.weights);
                    }
                    crate::key_placement::rebuild_in_flight(envoy, &cfg, b, fleet.taken_at_ms);
                    crate::engine_load::rebuild_work(envoy, &cfg, b, fleet.taken_at_ms);
                }
                self.record(envoy, Ok(()));
            }
            Err(e) => self.record(envoy, Err(PollError::Unreadable(e.0))),
        }
    }

    /// Stores what a poll's `outcome` makes of the process's admin state, and logs the change if this write made
    /// it. A write that loses the compare-and-swap to another root context's logs nothing: that one's stands.
    fn record(&self, envoy: &Envoy, outcome: Result<(), PollError>) {
        let Some(cfg) = &self.cfg else {
            return;
        };
        let (stored, cas) = envoy.shared_data(ADMIN_KEY);
        let prev = stored.as_deref().and_then(AdminFailure::decode);
        let (next, change) = admin_poll::after_poll(prev.as_ref(), outcome, &cfg.admin.to_string(), envoy.now_ms());
        if stored.is_some() && next == prev {
            return;
        }
        if !envoy.set_shared_data(ADMIN_KEY, &AdminFailure::encode(next.as_ref()), cas) {
            return;
        }
        match change {
            Some(Change::Failing(line)) => log::warn!("{line}"),
            Some(Change::Recovered(line)) => log::info!("{line}"),
            None => {}
        }
    }
}

/// Whether the admin polls fail, as the last poll of any root context left it.
pub(crate) fn admin_failure(envoy: &Envoy) -> Option<AdminFailure> {
    envoy.shared_data(ADMIN_KEY).0.and_then(|b| AdminFailure::decode(&b))
}

/// Claims the poll due at `now`, if one is due and no other root context claimed it first.
fn claim_poll(envoy: &Envoy, now: u64) -> bool {
    crate::lease::claim(envoy, LEASE_KEY, now, status::poll_due)
}

/// The latest snapshot any root context stored, if one was.
pub(crate) fn latest(envoy: &Envoy) -> Option<FleetStatus> {
    envoy.shared_data(SNAPSHOT_KEY).0.and_then(|b| FleetStatus::decode(&b))
}

/// The process's key of the status page's host ids: the one in shared data, else a fresh one, stored there. Two
/// root contexts that both find none may both store theirs; the last write stands, and both read it back.
pub(crate) fn id_key(envoy: &Envoy) -> IdKey {
    let (stored, cas) = envoy.shared_data(ID_KEY);
    if let Some(key) = stored.as_deref().and_then(IdKey::decode) {
        return key;
    }
    let fresh = fresh_id_key(envoy.now_ms());
    envoy.set_shared_data(ID_KEY, &fresh.encode(), cas);
    envoy
        .shared_data(ID_KEY)
        .0
        .as_deref()
        .and_then(IdKey::decode)
        .unwrap_or(fresh)
}

/// 128 bits from the VM's random source (std's `RandomState` keys come from WASI `random_get`), mixed with the
/// clock.
fn fresh_id_key(now_ms: u64) -> IdKey {
    use std::hash::BuildHasher;
    let random = std::hash::RandomState::new();
    IdKey([random.hash_one((0u8, now_ms)), random.hash_one((1u8, now_ms))])
}

/// Answers a status page with a local reply. No request body is read; no authentication is asked.
pub fn answer(envoy: &Envoy, cfg: &Config, page: StatusPage, request_id: Option<&str>) -> Action {
    let now = envoy.now_ms();
    let (code, body) = match page {
        StatusPage::Healthz => (200, status::healthz_body()),
        StatusPage::Readyz => status::readyz(cfg, latest(envoy).as_ref(), admin_failure(envoy).as_ref(), now),
        StatusPage::Status => {
            let load = crate::engine_load::StatusView::read(envoy, cfg, now);
            let admin = admin_failure(envoy);
            let body = status::status_body_with_load(
                cfg,
                latest(envoy).as_ref(),
                admin.as_ref(),
                now,
                id_key(envoy),
                &|b, a| load.host(b, a),
            );
            (200, crate::fair_queue::with_queues(envoy, cfg, body))
        }
    };
    let headers = [JSON, ("cache-control", "no-store")];
    envoy.send_local_reply(&LocalReply::new(code, &headers, body, request_id, None));
    Action::Pause
}
