//! The request side of a request context: the headers plan and the body plan, applied, then placement (the
//! placement store's answer included) and the fair queue.

use llmroute_core::envoy_contract::log_fields;
use llmroute_core::request_plan;
use llmroute_core::request_plan::body::{self, Edit, Facts, Length, RoutePlan};
use llmroute_core::request_plan::headers::{self as headers_plan, Next};
use llmroute_core::{fairness, headers, models, Config, Endpoint, GatewayError};
use proxy_wasm::types::Action;

use super::Http;
use crate::fair_queue::Gate;
use crate::host::Envoy;
use crate::key_placement::{self, Pin};
use crate::phases::{self, Phase};
use crate::placement_store::Step;

impl Http {
    /// Applies the headers plan.
    pub(super) fn request_headers(&mut self, cfg: &Config, end_of_stream: bool) -> Action {
        let Some(all) = self.envoy.request_headers() else {
            return self.unavailable();
        };
        let context_id = self.context_id;
        let keys = self.keys.clone();
        let plan = headers_plan::plan(cfg, keys.as_deref(), &all, end_of_stream, || {
            self.envoy.fresh_request_id(context_id)
        });
        for name in &plan.remove {
            self.envoy.set_request_header(name, None);
        }
        if plan.fresh_id {
            self.envoy
                .set_request_header(headers::REQUEST_ID, Some(&plan.request_id));
        }
        self.request_id = Some(plan.request_id);
        if let Some(n) = &plan.key {
            // The key's configured name (never its value) identifies the client in the access log.
            self.envoy.set_log_field(log_fields::KEY, n);
        }
        self.key = plan.key;
        self.envelope = plan.envelope;
        let read = match plan.next {
            Next::Reply(reply) => return self.reply(reply),
            Next::Status(page) => return crate::status::answer(&self.envoy, cfg, page, self.request_id.as_deref()),
            Next::Models { endpoint, query } => return self.models(cfg, &endpoint, &query),
            Next::Read(read) => read,
        };
        // A key's request limit is decided here, before its body is read or buffered.
        match crate::admission::admit(&self.envoy, &read.charges) {
            Ok(left) => self.remaining = left,
            Err(e) => {
                self.count_limited(&e, "none");
                return self.refuse(&e, plan.envelope);
            }
        }
        self.charges = read.charges;
        self.tenant = read.tenant;
        self.sent_length = read.sent_length;
        if !phases::runs(Phase::Copy) {
            return Action::Continue;
        }
        self.reading = Some((read.api, read.session));
        Action::Pause
    }

    fn models(&mut self, cfg: &Config, endpoint: &Endpoint, query: &str) -> Action {
        let fleet = crate::status::latest(&self.envoy);
        let now = self.envoy.now_ms();
        let state = |a: &llmroute_core::config::ModelAlias| models::ModelState::of(cfg, fleet.as_ref(), now, a);
        let id = self.request_id.as_deref();
        let reply = request_plan::models_reply(cfg, endpoint, self.envelope, query, &state, id);
        self.reply(reply)
    }

    /// A chunk of the body being buffered: refused over the size limit, decided at its end.
    pub(super) fn request_body(&mut self, cfg: &Config, body_size: usize, end_of_stream: bool) -> Action {
        let Some((api, _)) = &self.reading else {
            return Action::Continue;
        };
        let envelope = api.envelope();
        self.body_size = body_size;
        if body_size > cfg.limits.max_body_bytes {
            let limit = cfg.limits.max_body_bytes;
            return self.refuse(&GatewayError::BodyTooLarge { limit }, envelope);
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.finish_body(cfg)
    }

    /// Decides once the whole body is buffered, and applies the body plan.
    pub(super) fn finish_body(&mut self, cfg: &Config) -> Action {
        let Some((api, session)) = self.reading.take() else {
            return Action::Continue;
        };
        let Some(received) = self.envoy.request_body(self.body_size) else {
            return self.unavailable();
        };
        if !phases::runs(Phase::Scan) {
            return Action::Continue;
        }
        let key = self.key.as_deref();
        let facts = Facts {
            api,
            session: &session,
            key,
            sent_length: self.sent_length.as_deref(),
            request_id: self.request_id.as_deref(),
        };
        let bound = |alias: &str, input: u64| crate::admission::output_bound(&self.envoy, cfg, alias, key, input);
        let mut plan = match body::plan(cfg, &facts, received, bound) {
            Ok(p) => p,
            Err(reply) => return self.reply(reply),
        };
        if !phases::runs(Phase::Patch) {
            return Action::Continue;
        }
        if let Err(e) = self.admit_tokens(cfg, &mut plan) {
            return self.refuse(&e, api.envelope());
        }
        if !apply_edit(&self.envoy, &plan) {
            return self.unavailable();
        }
        match &plan.length {
            Length::Unchanged => {}
            Length::Set(v) => self.envoy.set_request_header("content-length", Some(v)),
            Length::Unknown => return self.unavailable(),
        }
        if !phases::runs(Phase::Request) {
            return Action::Continue;
        }
        for (name, value) in plan.request_headers() {
            self.envoy.set_request_header(name, Some(value));
        }
        for (key, value) in plan.log_fields() {
            self.envoy.set_log_field(key, value);
        }
        crate::engine_load::ask_report(&self.envoy, cfg, &plan.decision);
        let d = &plan.decision;
        self.estimate = (d.input_tokens, d.max_output_tokens);
        log::debug!(
            "llmroute: {} cluster={} affinity={}",
            api.name(),
            d.cluster,
            plan.affinity_source()
        );
        if let Some(hash) = plan.place() {
            // A key new to a replica with a placement store waits for etcd (see `placement_store`).
            self.store_wait =
                crate::placement_store::begin(&self.envoy, cfg, &d.placement, &d.cluster, hash, &self.metrics);
            if self.store_wait.is_none() {
                self.pinned(key_placement::pin(&self.envoy, cfg, &d.placement, &d.cluster, hash));
            }
        }
        self.routed = Some(plan.decision);
        match self.store_wait {
            Some(_) => Action::Pause,
            None => self.enter_queue(cfg),
        }
    }

    /// Admits the plan's token charges, all or none, and with `global_limits` asks the rate-limit filter for its
    /// share; counts the key's request.
    fn admit_tokens(&mut self, cfg: &Config, plan: &mut RoutePlan) -> Result<(), GatewayError> {
        let d = &plan.decision;
        match crate::admission::admit(&self.envoy, &plan.charges) {
            Ok(left) => self.remaining = self.remaining.least(left),
            Err(e) => {
                self.count_limited(&e, &d.alias);
                return Err(e);
            }
        }
        self.charges.append(&mut plan.charges);
        if let Some(g) = &cfg.global_limits {
            let key = self.key.as_deref();
            self.global = Some(crate::global_limits::admit(
                &self.envoy,
                g,
                &d.alias,
                key,
                d.input_tokens,
                d.max_output_tokens,
            ));
        }
        if let Some(k) = &self.key {
            self.metrics.key_request(k);
        }
        Ok(())
    }

    /// Keeps the request's pin and adds its work in flight; its reason is counted once the fair queue has placed
    /// it (`count_placement`).
    pub(super) fn pinned(&mut self, pin: Option<Pin>) {
        self.pin = pin;
        if let Some(p) = &self.pin {
            if let Some(cfg) = &self.cfg {
                self.work = crate::engine_load::Work::hold(&self.envoy, cfg, p, self.estimate.0, self.estimate.1);
            }
        }
    }

    /// The placement store answered the call `token`: the request is pinned and goes on (or waits in the fair
    /// queue), or the call is retried.
    pub(super) fn store_answered(&mut self, token: u32, body_size: usize) {
        let (Some(mut w), Some(cfg)) = (self.store_wait.take(), self.cfg.clone()) else {
            return;
        };
        if w.token() != token {
            self.store_wait = Some(w);
            return;
        }
        match crate::placement_store::finish(&self.envoy, &cfg, &mut w, body_size, &self.metrics) {
            Step::Retrying => self.store_wait = Some(w),
            Step::Pinned(pin) => {
                self.pinned(pin);
                if self.enter_queue(&cfg) == Action::Continue {
                    self.envoy.resume_request();
                }
            }
        }
    }

    /// With `fairness`, the routed request takes its place in its backend's queue (see `fair_queue`): it goes on,
    /// waits paused until the root context resumes or refuses it, or is refused now.
    pub(super) fn enter_queue(&mut self, cfg: &Config) -> Action {
        let Some(d) = &self.routed else {
            return Action::Continue;
        };
        let id = self.request_id.as_deref();
        let host = self.pin.as_ref().map_or(fairness::NO_HOST, |p| p.host_id);
        let alternates = self.pin.as_ref().map(Pin::alternate_ids).unwrap_or_default();
        let queued = crate::fair_queue::Queued {
            tenant: self.tenant,
            host,
            context_id: self.context_id,
            request_id: id,
            alternates: &alternates,
        };
        let action = match crate::fair_queue::enter(&self.envoy, cfg, d, queued, &self.metrics) {
            Gate::Go(ticket) => {
                self.ticket = ticket;
                Action::Continue
            }
            Gate::Moved(ticket, to) => {
                self.ticket = Some(ticket);
                self.go_around(cfg, to);
                Action::Continue
            }
            Gate::Wait(ticket) => {
                self.ticket = Some(ticket);
                Action::Pause
            }
            Gate::Refuse(e) => {
                let envelope = d.api.envelope();
                self.routed = None;
                self.refuse(&e, envelope)
            }
        };
        self.count_placement();
        action
    }

    /// The fair queue admitted this request on another host than its pin's (`fairness::arrive_around`): the pin,
    /// and the work in flight it holds, move there.
    fn go_around(&mut self, cfg: &Config, to: u32) {
        let Some(pin) = self.pin.as_mut() else {
            return;
        };
        if !pin.move_to(&self.envoy, to) {
            return;
        }
        if let Some(w) = self.work.take() {
            w.release(&self.envoy);
        }
        if let Some(p) = &self.pin {
            self.work = crate::engine_load::Work::hold(&self.envoy, cfg, p, self.estimate.0, self.estimate.1);
        }
    }

    /// Counts the pin's placement reason, once the fair queue has had its say (it may move the request).
    fn count_placement(&self) {
        if let Some(p) = &self.pin {
            self.metrics.placement(p.choice.reason);
            self.envoy
                .set_log_field(log_fields::PLACEMENT, p.choice.reason.as_str());
        }
    }
}

/// Sends the plan's body edit to Envoy. False when Envoy refused a call or the patch does not fit.
fn apply_edit(envoy: &Envoy, plan: &RoutePlan) -> bool {
    match &plan.edit {
        Edit::Keep => true,
        Edit::HeadEdit { body } => plan
            .decision
            .patch
            .as_ref()
            .is_some_and(|p| super::send_head_edit(envoy, p, body)),
        Edit::Replace { drain, body } => envoy.replace_request_body(*drain, body),
    }
}
