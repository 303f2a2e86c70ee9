//! The shared placement store, host side (`affinity.placement_store.etcd`): the HTTP callouts to etcd's JSON
//! gateway through the `llmroute_placement_store` cluster. What to send and what an answer means is decided by
//! `llmroute_core::key_placement::store`; this module only sends and hands back.
//!
//! - **Request side.** For a key to share ([`store::decide`]: with `share_keys: returning` a key the local
//!   table holds but has not shared, a first sighting being placed locally; with `all` also a key it lacks), within
//!   this Envoy's create budget ([`take_create`]; keys kept local are counted in
//!   `llmroute_placement_store_kept_local_total{reason}`), [`begin`] sends the create-if-absent transaction with the
//!   host the local table would choose, conditional on the backend's keys being unchanged since the revision the
//!   table is known complete up to (shared data, written by the root's refresh and by won creates), and the
//!   request context pauses; an answer that finds that view stale is merged into the table, and the key chosen
//!   again and sent again (counted `stale_view`); for a known key whose host is down, the
//!   compare-and-swap that moves it off that host for the whole fleet. [`finish`] reads the answer (or Envoy's
//!   "no answer" after `timeout_ms`), counts the outcome in `llmroute_placement_store_total{outcome}`, and pins the
//!   request where the store says, or locally on a fallback. A swap that finds the key gone from etcd is sent
//!   again as a create-if-absent. Known shared keys on up hosts never reach this module.
//! - **Root side.** [`Syncer`]: once a second one root context per Envoy (a compare-and-swap lease in shared data)
//!   reads each backend's keys modified since the last revision it saw and merges them into the shared key table;
//!   once an epoch it grants a new etcd lease for new keys and re-attaches the keys its requests used; and it
//!   settles the keys placed locally while etcd failed (kept, or moved once to the host another replica stored;
//!   a stored host that is down here is swapped for the local one).
//!   A failed call is logged and retried on the next round; requests never wait for this side.
//! - **Authentication.** With `auth`, every call carries etcd's token, which the root side gets and renews (see
//!   `store_auth`); a new key's request meets no token only before the first authentication or after etcd forgot
//!   it, and is then placed locally, as during an outage.

use std::rc::Rc;

use llmroute_core::config::{BoundedKeys, KeyPlacement, PlacementStore};
use llmroute_core::envoy_contract::{shared, PLACEMENT_STORE_CLUSTER};
use llmroute_core::etcd_json;
use llmroute_core::key_placement::in_flight::CAS_ATTEMPTS;
use llmroute_core::key_placement::store::{
    self, CreateBudget, Decision, InView, Lease, Next, Outcome, Pending, Reply, Settled,
};
use llmroute_core::key_placement::{Bounds, HostView, KeyTable};
use llmroute_core::status::POLL_INTERVAL_MS;
use llmroute_core::Config;

use crate::host;
use crate::key_placement::{self, Pin};
use crate::metrics::Metrics;
use crate::store_auth::{self, Credentials};

/// How long the root side's calls may take; they never hold a request.
const SYNC_TIMEOUT_MS: u64 = 2000;

/// A request paused while etcd settles its key.
#[derive(Debug, Clone)]
pub struct Waiting {
    token: u32,
    /// The request's `bounded_keys` parameters, to pin it once the answer comes.
    keys: BoundedKeys,
    cluster: String,
    key: u64,
    /// What the key asked of the store.
    ask: store::Ask,
    /// The host this replica proposed, its id and `IP:PORT`.
    proposed: u32,
    address: String,
    /// The lease the proposal is attached to.
    lease: i64,
    /// The transaction, kept for one retry on another member.
    body: String,
    timeout_ms: u64,
    retried: bool,
    /// Transactions sent after the first ([`store::next`]).
    follow_ups: u8,
    /// Transactions sent again because the view they were proposed in was stale ([`store::after_stale`]).
    stale_retries: u8,
    /// The store has `auth`: every call carries the token.
    auth: bool,
}

/// What became of a paused request when its answer came.
pub enum Step {
    /// Placed (through the store or, on a fallback, locally): resume the request.
    Pinned(Option<Pin>),
    /// Sent once more, to another etcd member: keep waiting.
    Retrying,
}

impl Waiting {
    pub fn token(&self) -> u32 {
        self.token
    }

    /// Sends `body` (again); true when it went out, and the request keeps waiting for the new token.
    fn send_again(&mut self) -> bool {
        let sent = post(store::TXN_PATH, self.body.as_bytes(), self.auth, self.timeout_ms);
        if let Some(token) = sent {
            self.token = token;
        }
        sent.is_some()
    }
}

/// Sends the transaction for `key` in `cluster` when the store is configured and the key is to be shared
/// ([`store::decide`]: new, or come back unshared, within the create budget) or is held on a host that is down.
/// `None`: nothing to wait for; pin as usual (a key kept local, and a transaction that could not be sent, are
/// counted here).
pub fn begin(cfg: &Config, placement: &KeyPlacement, cluster: &str, key: u64, metrics: &Metrics) -> Option<Waiting> {
    let store = cfg.affinity.placement_store.as_ref()?;
    let keys = placement.bounded()?;
    let backend = cfg.backends.iter().find(|b| b.name == cluster)?;
    let now = host::now_ms();
    let hosts = llmroute_core::key_placement::views(backend, now, &host::SharedData)?;
    let bounds = Bounds::for_backend(keys, backend);
    // The revision first: the table is merged before the revision is written, so the table read after it holds
    // every key up to it.
    let view = read_revision(cluster);
    let table = KeyTable::decode(&host::shared_data(&shared::keys(cluster)).0.unwrap_or_default());
    let decision = store::decide(&table, &hosts, key, now, &bounds, store.share_keys)
        .within_budget(|| take_create(now, store.max_creates_per_s));
    let ask = match decision {
        Decision::Send(ask) => ask.in_view(view, keys.max_keys),
        Decision::Keep(why) => {
            metrics.placement_store_kept_local(why);
            return None;
        }
        Decision::Table => return None,
    };
    let host = hosts.get(store::proposal(&table, &hosts, key, now, &bounds)?)?;
    let lease = Lease::decode(&host::shared_data(shared::STORE_LEASE).0.unwrap_or_default());
    let body = store::ask_request(&ask, &store.prefix, cluster, key, &host.address, lease.id);
    let auth = store.auth.is_some();
    match post(store::TXN_PATH, body.as_bytes(), auth, store.timeout_ms) {
        Some(token) => Some(Waiting {
            token,
            keys: *keys,
            cluster: cluster.to_string(),
            key,
            ask,
            proposed: host.id(),
            address: host.address.clone(),
            lease: lease.id,
            body,
            timeout_ms: store.timeout_ms,
            retried: false,
            follow_ups: 0,
            stale_retries: 0,
            auth,
        }),
        None => {
            metrics.placement_store(Outcome::Fallback(store::Fallback::NotSent));
            note_pending(cluster, key);
            None
        }
    }
}

/// The answer to `w`'s transaction is being delivered (`body_size` bytes): send it once more if the member was
/// gone, or as a create-if-absent if a swap found the key gone from etcd; else count how the key was settled and
/// pin the request there.
pub fn finish(cfg: &Config, w: &mut Waiting, body_size: usize, metrics: &Metrics) -> Step {
    let body = call_body(body_size);
    if !w.retried && store::retry_once(reply(body.as_ref())) {
        w.retried = true;
        if w.send_again() {
            return Step::Retrying;
        }
    }
    // The revision this replica's own create committed at, in the view it was proposed in.
    let mut won_at = 0;
    let answered = match &w.ask {
        store::Ask::CreateInView { .. } => match store::create_in_view_outcome(reply(body.as_ref())) {
            InView::Stale(stale) => {
                if let Some(step) = stale_view(cfg, w, &stale, metrics) {
                    return step;
                }
                Some(Outcome::Fallback(store::Fallback::NotSent))
            }
            InView::Settled { outcome, revision } => {
                won_at = revision;
                Some(outcome)
            }
        },
        _ => store::ask_outcome(&w.ask, reply(body.as_ref())),
    };
    let outcome = match store::next(answered, &hosts_of(cfg, &w.cluster)) {
        Next::Done(o) => o,
        Next::Send(ask) if w.follow_ups < store::MAX_FOLLOW_UPS => {
            let prefix = cfg.affinity.placement_store.as_ref().map_or("", |s| s.prefix.as_str());
            w.body = store::ask_request(&ask, prefix, &w.cluster, w.key, &w.address, w.lease);
            w.ask = ask;
            w.follow_ups = w.follow_ups.saturating_add(1);
            if w.send_again() {
                return Step::Retrying;
            }
            Outcome::Fallback(store::Fallback::NotSent)
        }
        // The follow-ups are spent: a stored host that is down is passed on (the table places the key alone).
        Next::Send(_) => answered.unwrap_or(Outcome::Fallback(store::Fallback::Error)),
    };
    metrics.placement_store(outcome);
    if let Outcome::Fallback(f) = outcome {
        log::debug!("llmroute: placement store fallback ({f:?}) for a key of {}", w.cluster);
        note_pending(&w.cluster, w.key);
    }
    let pin = key_placement::pin_stored(
        cfg,
        &KeyPlacement::BoundedKeys(w.keys),
        &w.cluster,
        w.key,
        outcome.stored(w.proposed),
        true,
    );
    if outcome == Outcome::Won && won_at > 0 && pin.is_some() {
        // The table now holds this key, and no other placement of the backend was written between the view and it.
        advance_revision(&w.cluster, won_at);
    }
    Step::Pinned(pin)
}

/// `w`'s create found its view of the backend's keys stale: merges the keys the answer brought into the shared
/// table, chooses again from it, and sends the next create ([`store::after_stale`]), counting the retry.
/// `None` when it could not be sent (the request then falls back).
fn stale_view(cfg: &Config, w: &mut Waiting, stale: &etcd_json::RangeAnswer, metrics: &Metrics) -> Option<Step> {
    metrics.placement_store_stale_view();
    let st = cfg.affinity.placement_store.as_ref()?;
    let backend = cfg.backends.iter().find(|b| b.name == w.cluster)?;
    let now = host::now_ms();
    let prefix = store::backend_prefix(&st.prefix, &w.cluster);
    let merged = merge(&w.cluster, &prefix, &stale.kvs, now, w.keys.max_keys);
    if merged && !stale.more {
        advance_revision(&w.cluster, stale.revision);
    }
    // A table that every try to merge into lost its race holds no view: a plain create-if-absent, as when cut.
    let ask = match merged {
        true => store::after_stale(stale, w.stale_retries, w.keys.max_keys),
        false => store::Ask::Create,
    };
    let hosts = llmroute_core::key_placement::views(backend, now, &host::SharedData)?;
    let bounds = Bounds::for_backend(&w.keys, backend);
    let table = KeyTable::decode(&host::shared_data(&shared::keys(&w.cluster)).0.unwrap_or_default());
    let chosen = hosts.get(store::proposal(&table, &hosts, w.key, now, &bounds)?)?;
    w.proposed = chosen.id();
    w.address = chosen.address.clone();
    w.body = store::ask_request(&ask, &st.prefix, &w.cluster, w.key, &w.address, w.lease);
    w.ask = ask;
    w.stale_retries = w.stale_retries.saturating_add(1);
    w.send_again().then_some(Step::Retrying)
}

/// Spends one of this Envoy's `max` creates of the second at `now` (shared by its workers, with compare-and-swap).
/// False when they are spent, and when every try lost its race to other workers' creates (the key then waits for
/// a later request).
fn take_create(now: u64, max: u32) -> bool {
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = host::shared_data(shared::STORE_CREATES);
        let mut budget = CreateBudget::decode(&bytes.unwrap_or_default());
        if !budget.take(now, max) {
            return false;
        }
        if host::set_shared_data(shared::STORE_CREATES, &budget.encode(), cas) {
            return true;
        }
    }
    false
}

/// POSTs `body` to the store's `path`, with etcd's token when the store has `auth`. `None` when it was not sent,
/// also when `auth` has no token yet (the root side has not authenticated, or etcd forgot the token).
fn post(path: &str, body: &[u8], auth: bool, timeout_ms: u64) -> Option<u32> {
    let token = match auth {
        true => Some(store_auth::token()?),
        false => None,
    };
    host::dispatch_post(PLACEMENT_STORE_CLUSTER, path, body, token.as_deref(), timeout_ms)
}

/// The answer's body, when there is an answer (`None`: Envoy delivered none, such as after a timeout). A 401 is
/// etcd no longer knowing the token: it is forgotten, so the root side authenticates again.
fn call_body(body_size: usize) -> Option<(u32, Vec<u8>)> {
    let status = host::http_call_status()?;
    if status == 401 {
        store_auth::forget();
    }
    let body = match body_size {
        0 => Vec::new(),
        n => host::http_call_body(n.min(store::MAX_ANSWER_BYTES)).unwrap_or_default(),
    };
    Some((status, body))
}

fn reply(answer: Option<&(u32, Vec<u8>)>) -> Reply<'_> {
    match answer {
        Some((status, body)) => Reply::Answer { status: *status, body },
        None => Reply::NoAnswer,
    }
}

/// What a root context's outstanding call was for.
#[derive(Debug, Clone)]
enum Job {
    /// A new lease; the one it replaces.
    Grant { previous: Lease },
    /// A backend's keys modified after revision `seen`.
    Range { backend: String, seen: i64 },
    /// Keys re-attached to a new lease.
    Refresh,
    /// A key placed during an outage, proposed with the host the local table holds.
    Settle { backend: String, key: u64 },
    /// Such a key, stored on a host that is down here: swapped for the host the local table holds.
    SettleMove { backend: String, key: u64 },
    /// The user and password traded for a token.
    Authenticate,
}

/// One root context's side of the store (see the module doc).
#[derive(Default)]
pub struct Syncer {
    cfg: Option<Rc<Config>>,
    /// Calls in flight: token, job, when sent.
    calls: Vec<(u32, Job, u64)>,
    /// The store's user and password, with `auth`.
    credentials: Option<Credentials>,
    /// No authentication before this time (after etcd refused the password).
    authenticate_after_ms: u64,
}

fn due(last: u64, now: u64) -> bool {
    now.saturating_sub(last) >= POLL_INTERVAL_MS
}

impl Syncer {
    /// Starts syncing with `cfg` when it has a placement store (the root's status poller already ticks), as the
    /// user `credentials` when it has `auth`.
    pub fn start(&mut self, cfg: Rc<Config>, credentials: Option<Credentials>) {
        self.credentials = credentials;
        if cfg.affinity.placement_store.is_none() || cfg.bounded_keys().is_none() {
            return;
        }
        // Seeded once per process, so every later write of a pending list is a compare-and-swap (a first write
        // without one could drop another worker's key).
        for b in &cfg.backends {
            let key = shared::store_pending(&b.name);
            if host::shared_data(&key).1.is_none() {
                host::set_shared_data(&key, &[], None);
            }
        }
        self.cfg = Some(cfg);
    }

    pub fn on_tick(&mut self) {
        let Some(cfg) = self.cfg.clone() else { return };
        let (Some(st), Some(keys)) = (&cfg.affinity.placement_store, cfg.bounded_keys()) else {
            return;
        };
        let now = host::now_ms();
        // A call the host never answered is forgotten (a late answer is ignored).
        self.calls
            .retain(|(_, _, at)| now.saturating_sub(*at) <= SYNC_TIMEOUT_MS.saturating_add(POLL_INTERVAL_MS));
        if !self.calls.is_empty() || !crate::lease::claim(shared::STORE_SYNC_LEASE, now, due) {
            return;
        }
        if let Some(c) = &self.credentials {
            // Without a token every call would be refused: authenticate first, and the rest next round.
            if store_auth::token().is_none() {
                if now >= self.authenticate_after_ms {
                    let body = c.body();
                    let sent = host::dispatch_post(
                        PLACEMENT_STORE_CLUSTER,
                        etcd_json::AUTHENTICATE_PATH,
                        body.as_bytes(),
                        None,
                        SYNC_TIMEOUT_MS,
                    );
                    match sent {
                        Some(token) => self.calls.push((token, Job::Authenticate, now)),
                        None => log::debug!("llmroute: the placement store's cluster could not be called"),
                    }
                }
                return;
            }
        }
        let lease = Lease::decode(&host::shared_data(shared::STORE_LEASE).0.unwrap_or_default());
        if lease.due(now, keys.idle_ttl_ms) {
            let body = etcd_json::grant_body(store::lease_ttl_s(keys.idle_ttl_ms));
            self.send(store::GRANT_PATH, &body, Job::Grant { previous: lease }, now);
        }
        for b in &cfg.backends {
            if llmroute_core::key_placement::views(b, now, &host::SharedData).is_none() {
                continue;
            }
            let seen = read_revision(&b.name);
            let body = store::range_request(&st.prefix, &b.name, seen, keys.max_keys);
            let job = Job::Range {
                backend: b.name.clone(),
                seen,
            };
            self.send(store::RANGE_PATH, &body, job, now);
            self.settle_pending(st, b, lease.id, now);
        }
    }

    /// Proposes to the store the keys of `b` placed locally while it failed, a few per round.
    fn settle_pending(&mut self, st: &PlacementStore, b: &llmroute_core::config::Backend, lease: i64, now: u64) {
        let pending = Pending::decode(&host::shared_data(&shared::store_pending(&b.name)).0.unwrap_or_default());
        if pending.is_empty() {
            return;
        }
        let Some(hosts) = llmroute_core::key_placement::views(b, now, &host::SharedData) else {
            return;
        };
        let table = KeyTable::decode(&host::shared_data(&shared::keys(&b.name)).0.unwrap_or_default());
        for &key in pending.keys().iter().take(Pending::PER_ROUND) {
            let Some(address) = local_address(&table, &hosts, key) else {
                // Forgotten, or on a host no longer listed: a later request settles it afresh.
                update_pending(&b.name, |p| p.remove(key));
                continue;
            };
            let body = store::create_request(&st.prefix, &b.name, key, &address, lease);
            let job = Job::Settle {
                backend: b.name.clone(),
                key,
            };
            self.send(store::TXN_PATH, &body, job, now);
        }
    }

    fn send(&mut self, path: &str, body: &str, job: Job, now: u64) {
        let auth = self.credentials.is_some();
        match post(path, body.as_bytes(), auth, SYNC_TIMEOUT_MS) {
            Some(token) => self.calls.push((token, job, now)),
            None => log::debug!("llmroute: the placement store's cluster could not be called"),
        }
    }

    /// Keeps the token etcd gave for the user and password, or logs why there is none (never the password).
    fn authenticated(&mut self, answer: Option<&(u32, Vec<u8>)>, now: u64) {
        let user = self.credentials.as_ref().map_or("", |c| c.user.as_str());
        match answer {
            Some((200, body)) => match etcd_json::parse_authenticate(body) {
                Ok(token) => {
                    store_auth::keep(&token);
                    log::info!("llmroute: placement store: authenticated to etcd as user {user}");
                }
                Err(e) => log::warn!("llmroute: placement store: authenticating as etcd user {user}: {e}"),
            },
            Some((status, body)) => {
                self.authenticate_after_ms = now.saturating_add(store_auth::RETRY_REFUSED_MS);
                let said: String = String::from_utf8_lossy(body).chars().take(200).collect();
                log::warn!(
                    "llmroute: placement store: etcd refused user {user} (HTTP {status}: {said}); new keys are placed \
                     locally; trying again in {} s",
                    store_auth::RETRY_REFUSED_MS / 1000
                );
            }
            None => log::info!("llmroute: placement store: etcd did not answer the authentication of user {user}"),
        }
    }

    pub fn on_response(&mut self, token: u32, body_size: usize) {
        let Some(i) = self.calls.iter().position(|(t, _, _)| *t == token) else {
            return;
        };
        let (_, job, _) = self.calls.swap_remove(i);
        let Some(cfg) = self.cfg.clone() else { return };
        let (Some(st), Some(keys)) = (&cfg.affinity.placement_store, cfg.bounded_keys()) else {
            return;
        };
        let answer = call_body(body_size);
        match &job {
            Job::Authenticate => return self.authenticated(answer.as_ref(), host::now_ms()),
            Job::Settle { backend, key } => return self.settled(&cfg, st, backend, *key, reply(answer.as_ref())),
            Job::SettleMove { backend, key } => {
                return settle(backend, *key, store::settle_move_outcome(reply(answer.as_ref())));
            }
            _ => {}
        }
        let body = match &answer {
            Some((200, body)) => body.as_slice(),
            Some((status, _)) => return log::info!("llmroute: placement store answered {status} ({job:?})"),
            None => return log::info!("llmroute: placement store did not answer ({job:?})"),
        };
        let now = host::now_ms();
        match job {
            Job::Grant { previous } => match etcd_json::parse_grant(body) {
                Ok(id) => {
                    let lease = Lease { id, granted_ms: now };
                    host::set_shared_data(shared::STORE_LEASE, &lease.encode(), None);
                    if previous.id != 0 {
                        self.refresh(&cfg, st, previous.granted_ms, id, now);
                    }
                }
                Err(e) => log::info!("llmroute: placement store lease grant: {e}"),
            },
            Job::Range { backend, seen } => match etcd_json::parse_range(body) {
                Ok(range) => {
                    let prefix = store::backend_prefix(&st.prefix, &backend);
                    if merge(&backend, &prefix, &range.kvs, now, keys.max_keys) {
                        write_revision(&backend, store::next_revision(seen, &range));
                    }
                }
                Err(e) => log::info!("llmroute: placement store read of {backend}: {e}"),
            },
            Job::Refresh => {
                if let Err(e) = etcd_json::parse_puts(body) {
                    log::info!("llmroute: placement store lease refresh: {e}");
                }
            }
            Job::Settle { .. } | Job::SettleMove { .. } | Job::Authenticate => {}
        }
    }

    /// Applies the answer to a pending key's create-if-absent; when etcd holds a host that is down here, sends the
    /// swap for the host the local table holds instead (the key stays pending until that answer).
    fn settled(&mut self, cfg: &Config, st: &PlacementStore, backend: &str, key: u64, answer: Reply<'_>) {
        let now = host::now_ms();
        let hosts = hosts_of(cfg, backend);
        let Settled::Replace { from } = store::settle_outcome_in(answer, &hosts) else {
            return settle(backend, key, store::settle_outcome_in(answer, &hosts));
        };
        let table = KeyTable::decode(&host::shared_data(&shared::keys(backend)).0.unwrap_or_default());
        let Some(address) = local_address(&table, &hosts, key) else {
            update_pending(backend, |p| p.remove(key));
            return;
        };
        let lease = Lease::decode(&host::shared_data(shared::STORE_LEASE).0.unwrap_or_default());
        let body = store::move_request(&st.prefix, backend, key, &from, &address, lease.id);
        let job = Job::SettleMove {
            backend: backend.to_string(),
            key,
        };
        self.send(store::TXN_PATH, &body, job, now);
    }

    /// Re-attaches to lease `id` the keys this replica's requests used since `since_ms`.
    fn refresh(&mut self, cfg: &Config, st: &PlacementStore, since_ms: u64, id: i64, now: u64) {
        for b in &cfg.backends {
            let Some(hosts) = llmroute_core::key_placement::views(b, now, &host::SharedData) else {
                continue;
            };
            let table = KeyTable::decode(&host::shared_data(&shared::keys(&b.name)).0.unwrap_or_default());
            for body in store::refresh_batches(&table, &hosts, since_ms, &st.prefix, &b.name, id) {
                self.send(store::TXN_PATH, &body, Job::Refresh, now);
            }
        }
    }
}

/// Merges stored placements into `backend`'s shared table with compare-and-swap. False when every try lost its
/// race (the same keys are read again next round).
fn merge(backend: &str, prefix: &str, kvs: &[etcd_json::Kv], now: u64, max_keys: usize) -> bool {
    let key = shared::keys(backend);
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = host::shared_data(&key);
        let mut t = KeyTable::decode(&bytes.unwrap_or_default());
        if !store::merge(&mut t, prefix, kvs, now, max_keys) || host::set_shared_data(&key, &t.encode(), cas) {
            return true;
        }
    }
    false
}

/// The placement's view of `backend`'s hosts now; empty when it has none.
fn hosts_of(cfg: &Config, backend: &str) -> Vec<HostView> {
    cfg.backends
        .iter()
        .find(|b| b.name == backend)
        .and_then(|b| llmroute_core::key_placement::views(b, host::now_ms(), &host::SharedData))
        .unwrap_or_default()
}

/// The `IP:PORT` of the host the local `table` holds `key` on, when that host is listed.
fn local_address(table: &KeyTable, hosts: &[HostView], key: u64) -> Option<String> {
    let held = table.get(key)?.host;
    hosts.iter().find(|h| h.id() == held).map(|h| h.address.clone())
}

/// Applies a pending key's settlement: kept or moved once, then no longer pending; or left for the next round.
fn settle(backend: &str, key: u64, settled: Settled) {
    match settled {
        Settled::Retry | Settled::Replace { .. } => return,
        Settled::Kept => {}
        Settled::MoveTo(host) => {
            let table_key = shared::keys(backend);
            for _ in 0..CAS_ATTEMPTS {
                let (bytes, cas) = host::shared_data(&table_key);
                let mut t = KeyTable::decode(&bytes.unwrap_or_default());
                if !t.set_host(key, host) || host::set_shared_data(&table_key, &t.encode(), cas) {
                    break;
                }
            }
        }
    }
    update_pending(backend, |p| p.remove(key));
}

/// Remembers a key placed locally because the store failed, for the root to settle later.
fn note_pending(backend: &str, key: u64) {
    update_pending(backend, |p| p.add(key));
}

/// Changes `backend`'s pending list with compare-and-swap; `change` says whether it changed anything.
fn update_pending(backend: &str, change: impl Fn(&mut Pending) -> bool) {
    let key = shared::store_pending(backend);
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = host::shared_data(&key);
        let mut p = Pending::decode(&bytes.unwrap_or_default());
        if !change(&mut p) || host::set_shared_data(&key, &p.encode(), cas) {
            return;
        }
    }
}

fn read_revision(backend: &str) -> i64 {
    let bytes = host::shared_data(&shared::store_revision(backend))
        .0
        .unwrap_or_default();
    bytes
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, i64::from_le_bytes)
}

/// Raises `backend`'s view revision to `revision` (never lowers it: the root's refresh does that, when the store
/// was replaced). Not a compare-and-swap: a lost race leaves a lower revision, which only makes a view look older
/// than it is (one stale retry more), never newer.
fn advance_revision(backend: &str, revision: i64) {
    if revision > read_revision(backend) {
        write_revision(backend, revision);
    }
}

fn write_revision(backend: &str, revision: i64) {
    host::set_shared_data(&shared::store_revision(backend), &revision.to_le_bytes(), None);
}
