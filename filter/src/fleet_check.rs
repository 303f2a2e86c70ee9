//! The `/props` fleet check, host side: reading `GET /props` from every llama.cpp server of a backend and
//! warning when they disagree (see `llmroute_core::fleet_check`).
//!
//! It runs in the root contexts next to the status poll and shares its tick. A root context that finds a check
//! due claims it with a compare-and-swap on a lease in VM-wide shared data, so one root context per Envoy
//! process checks, every [`fleet_check::CHECK_INTERVAL_MS`]. It sends one `dispatch_http_call` per endpoint,
//! each to that endpoint's probe cluster, and compares the answers once all are in or
//! [`fleet_check::CHECK_TIMEOUT_MS`] has passed. Requests never wait for any of this.
//!
//! The hosts of a discovered backend are those of the status poll's latest fresh host list (see `status`),
//! taken when the check starts. Each call goes to the backend's original-destination probe cluster and names
//! its host in [`ORIGINAL_DST_HEADER`]: only this call sets that header, and only to an address the poll listed.
//! What they report is kept by address (`store_reported_slots_by_address`), since the list changes.

use std::rc::Rc;

use llmroute_core::envoy_contract::{metrics, ORIGINAL_DST_HEADER};
use llmroute_core::fleet_check::{self, ProbeTarget, ServerProps};
use llmroute_core::key_placement::table;
use llmroute_core::status::TICK_MS;
use llmroute_core::Config;

use crate::host::Envoy;

/// When the last check was claimed (see `lease`).
const LEASE_KEY: &str = llmroute_core::envoy_contract::shared::PROPS_LEASE;

/// One check in progress in this root context.
struct Round {
    started_ms: u64,
    /// What this check reads (the discovered hosts change from one check to the next).
    targets: Rc<[ProbeTarget]>,
    /// `(call token, index into targets)` of the calls not answered yet.
    pending: Vec<(u32, usize)>,
    /// `(index into targets, props)` of the servers that answered.
    answers: Vec<(usize, ServerProps)>,
}

/// One root context's side of the fleet check.
#[derive(Default)]
pub struct FleetCheck {
    /// Set when the config has anything to check (see `fleet_check::checks_anything`).
    cfg: Option<Rc<Config>>,
    round: Option<Round>,
    /// `llmroute_fleet_warnings_total`: one per finding logged.
    warnings: Option<u32>,
    /// `llmroute_fleet_checks_total`: checks completed, with or without findings.
    checks: Option<u32>,
    /// A probe cluster could not be called (a hand-written bootstrap without them); logged once.
    missing_logged: bool,
}

impl FleetCheck {
    /// Starts checking the llama.cpp backends of `cfg`, from `on_configure`. Does nothing without any.
    pub fn start(&mut self, envoy: &Envoy, cfg: Rc<Config>) {
        self.round = None;
        if !fleet_check::checks_anything(&cfg) {
            self.cfg = None;
            return;
        }
        self.cfg = Some(cfg);
        self.warnings = envoy.define_counter(metrics::FLEET_WARNINGS);
        self.checks = envoy.define_counter(metrics::FLEET_CHECKS);
        envoy.set_tick_period(TICK_MS);
    }

    pub fn on_tick(&mut self, envoy: &Envoy) {
        let Some(cfg) = self.cfg.clone() else {
            return;
        };
        let now = envoy.now_ms();
        if let Some(round) = &self.round {
            if now.saturating_sub(round.started_ms) <= fleet_check::CHECK_TIMEOUT_MS + TICK_MS {
                return;
            }
            // Some server never answered in time: compare those that did (a late answer is ignored).
            self.finish(envoy);
        }
        if !claim_check(envoy, now) {
            return;
        }
        let targets: Rc<[ProbeTarget]> = fleet_check::round_targets(&cfg, now, |b| stored_hosts(envoy, b)).into();
        if targets.is_empty() {
            // Nothing to read yet (a discovered backend before the first poll): give the lease back, so the check
            // runs as soon as a host list is stored rather than an interval later.
            envoy.set_shared_data(LEASE_KEY, &0u64.to_le_bytes(), None);
            return;
        }
        let mut pending = Vec::with_capacity(targets.len());
        for (i, t) in targets.iter().enumerate() {
            let token = match &t.original_dst {
                None => envoy.dispatch_get(&t.cluster, fleet_check::PROPS_PATH, fleet_check::CHECK_TIMEOUT_MS),
                Some(address) => envoy.dispatch_get_with(
                    &t.cluster,
                    fleet_check::PROPS_PATH,
                    address,
                    &[(ORIGINAL_DST_HEADER, address)],
                    fleet_check::CHECK_TIMEOUT_MS,
                ),
            };
            match token {
                Some(token) => pending.push((token, i)),
                None if !self.missing_logged => {
                    self.missing_logged = true;
                    log::info!(
                        "llmroute: fleet check: cluster {} cannot be called, so {} is not checked; \
                         `llmroute render` adds one probe cluster per llama.cpp endpoint, and one \
                         original-destination cluster per discovered llama.cpp backend",
                        t.cluster,
                        t.endpoint
                    );
                }
                None => {}
            }
        }
        self.round = Some(Round {
            started_ms: now,
            targets,
            pending,
            answers: Vec::new(),
        });
        if self.round.as_ref().is_some_and(|r| r.pending.is_empty()) {
            self.finish(envoy);
        }
    }

    pub fn on_response(&mut self, envoy: &Envoy, token: u32, body_size: usize) {
        let Some(round) = &mut self.round else {
            return;
        };
        let Some(pos) = round.pending.iter().position(|&(t, _)| t == token) else {
            return;
        };
        let (_, index) = round.pending.swap_remove(pos);
        let endpoint = round.targets.get(index).map_or("?", |t| t.endpoint.as_str());
        match envoy.http_call_status() {
            Some(200) => match envoy.http_call_body(body_size).map(|b| fleet_check::parse_props(&b)) {
                Some(Ok(props)) => round.answers.push((index, props)),
                Some(Err(e)) => log::debug!("llmroute: fleet check: /props of {endpoint}: {e}"),
                None => {}
            },
            Some(code) => log::debug!("llmroute: fleet check: /props of {endpoint} answered {code}"),
            None => log::debug!("llmroute: fleet check: /props of {endpoint} did not answer in time"),
        }
        if round.pending.is_empty() {
            self.finish(envoy);
        }
    }

    /// Compares the answers of the round in progress, logs and counts each finding, and ends the round.
    fn finish(&mut self, envoy: &Envoy) {
        let Some(round) = self.round.take() else {
            return;
        };
        for finding in fleet_check::check_round(&round.targets, &round.answers) {
            log::warn!("llmroute: fleet check: {finding}");
            envoy.increment(self.warnings);
        }
        for (backend, slots) in fleet_check::reported_slots(&round.targets, &round.answers) {
            crate::key_placement::store_reported_slots(envoy, &backend, &slots);
        }
        for (backend, slots) in fleet_check::reported_slots_by_address(&round.targets, &round.answers) {
            crate::key_placement::store_reported_slots_by_address(envoy, &backend, &slots);
        }
        envoy.increment(self.checks);
    }
}

/// The host list the status poll last stored for a discovered backend: `(taken_at_ms, sorted IP:PORTs)`.
fn stored_hosts(envoy: &Envoy, backend: &str) -> Option<(u64, Vec<String>)> {
    table::decode_down_hosts(
        &envoy
            .shared_data(&llmroute_core::envoy_contract::shared::hosts(backend))
            .0?,
    )
}

/// Claims the check due at `now`, if one is due and no other root context claimed it first.
fn claim_check(envoy: &Envoy, now: u64) -> bool {
    crate::lease::claim(envoy, LEASE_KEY, now, fleet_check::check_due)
}
