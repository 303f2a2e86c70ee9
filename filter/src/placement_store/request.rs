//! The placement store's request side: a new or moved key's request paused while etcd settles its host.
//!
//! [`begin`] decides whether the key goes to etcd at all (within this Envoy's create budget, [`take_create`]) and
//! sends the create-if-absent or the move; [`finish`] reads the answer (or Envoy's "no answer" after
//! `timeout_ms`), counts the outcome and pins the request where the store says, or locally on a fallback. A view
//! found stale is merged and the key sent again ([`stale_view`]).

use llmroute_core::config::{BoundedKeys, KeyPlacement};
use llmroute_core::envoy_contract::shared;
use llmroute_core::etcd_json;
use llmroute_core::key_placement::in_flight::CAS_ATTEMPTS;
use llmroute_core::key_placement::store::{self, CreateBudget, Decision, InView, Lease, Next, Outcome};
use llmroute_core::key_placement::{Bounds, KeyTable};
use llmroute_core::Config;

use super::etcd_call::{call_body, post, reply};
use super::shared_state::{advance_revision, hosts_of, merge, note_pending, read_revision};
use crate::host::{self, Envoy};
use crate::key_placement::{self, Pin};
use crate::metrics::Metrics;

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
    fn send_again(&mut self, envoy: &Envoy) -> bool {
        let sent = post(envoy, store::TXN_PATH, self.body.as_bytes(), self.auth, self.timeout_ms);
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
pub fn begin(
    envoy: &Envoy,
    cfg: &Config,
    placement: &KeyPlacement,
    cluster: &str,
    key: u64,
    metrics: &Metrics,
) -> Option<Waiting> {
    let store = cfg.affinity.placement_store.as_ref()?;
    let keys = placement.bounded()?;
    let backend = cfg.backends.iter().find(|b| b.name == cluster)?;
    let now = envoy.now_ms();
    let hosts = llmroute_core::key_placement::views(backend, now, &host::SharedData(envoy))?;
    let bounds = Bounds::for_backend(keys, backend);
    // The revision first: the table is merged before the revision is written, so the table read after it holds
    // every key up to it.
    let view = read_revision(envoy, cluster);
    let table = KeyTable::decode(&envoy.shared_data(&shared::keys(cluster)).0.unwrap_or_default());
    let decision = store::decide(&table, &hosts, key, now, &bounds, store.share_keys)
        .within_budget(|| take_create(envoy, now, store.max_creates_per_s));
    let ask = match decision {
        Decision::Send(ask) => ask.in_view(view, keys.max_keys),
        Decision::Keep(why) => {
            metrics.placement_store_kept_local(why);
            return None;
        }
        Decision::Table => return None,
    };
    let host = hosts.get(store::proposal(&table, &hosts, key, now, &bounds)?)?;
    let lease = Lease::decode(&envoy.shared_data(shared::STORE_LEASE).0.unwrap_or_default());
    let body = store::ask_request(&ask, &store.prefix, cluster, key, &host.address, lease.id);
    let auth = store.auth.is_some();
    match post(envoy, store::TXN_PATH, body.as_bytes(), auth, store.timeout_ms) {
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
            note_pending(envoy, cluster, key);
            None
        }
    }
}

/// The answer to `w`'s transaction is being delivered (`body_size` bytes): send it once more if the member was
/// gone, or as a create-if-absent if a swap found the key gone from etcd; else count how the key was settled and
/// pin the request there.
pub fn finish(envoy: &Envoy, cfg: &Config, w: &mut Waiting, body_size: usize, metrics: &Metrics) -> Step {
    let body = call_body(envoy, body_size);
    if !w.retried && store::retry_once(reply(body.as_ref())) {
        w.retried = true;
        if w.send_again(envoy) {
            return Step::Retrying;
        }
    }
    // The revision this replica's own create committed at, in the view it was proposed in.
    let mut won_at = 0;
    let answered = match &w.ask {
        store::Ask::CreateInView { .. } => match store::create_in_view_outcome(reply(body.as_ref())) {
            InView::Stale(stale) => {
                if let Some(step) = stale_view(envoy, cfg, w, &stale, metrics) {
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
    let outcome = match store::next(answered, &hosts_of(envoy, cfg, &w.cluster)) {
        Next::Done(o) => o,
        Next::Send(ask) if w.follow_ups < store::MAX_FOLLOW_UPS => {
            let prefix = cfg.affinity.placement_store.as_ref().map_or("", |s| s.prefix.as_str());
            w.body = store::ask_request(&ask, prefix, &w.cluster, w.key, &w.address, w.lease);
            w.ask = ask;
            w.follow_ups = w.follow_ups.saturating_add(1);
            if w.send_again(envoy) {
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
        note_pending(envoy, &w.cluster, w.key);
    }
    let pin = key_placement::pin_stored(
        envoy,
        cfg,
        &KeyPlacement::BoundedKeys(w.keys),
        &w.cluster,
        w.key,
        outcome.stored(w.proposed),
        true,
    );
    if outcome == Outcome::Won && won_at > 0 && pin.is_some() {
        // The table now holds this key, and no other placement of the backend was written between the view and it.
        advance_revision(envoy, &w.cluster, won_at);
    }
    Step::Pinned(pin)
}

/// `w`'s create found its view of the backend's keys stale: merges the keys the answer brought into the shared
/// table, chooses again from it, and sends the next create ([`store::after_stale`]), counting the retry.
/// `None` when it could not be sent (the request then falls back).
fn stale_view(
    envoy: &Envoy,
    cfg: &Config,
    w: &mut Waiting,
    stale: &etcd_json::RangeAnswer,
    metrics: &Metrics,
) -> Option<Step> {
    metrics.placement_store_stale_view();
    let st = cfg.affinity.placement_store.as_ref()?;
    let backend = cfg.backends.iter().find(|b| b.name == w.cluster)?;
    let now = envoy.now_ms();
    let prefix = store::backend_prefix(&st.prefix, &w.cluster);
    let merged = merge(envoy, &w.cluster, &prefix, &stale.kvs, now, w.keys.max_keys);
    if merged && !stale.more {
        advance_revision(envoy, &w.cluster, stale.revision);
    }
    // A table that every try to merge into lost its race holds no view: a plain create-if-absent, as when cut.
    let ask = match merged {
        true => store::after_stale(stale, w.stale_retries, w.keys.max_keys),
        false => store::Ask::Create,
    };
    let hosts = llmroute_core::key_placement::views(backend, now, &host::SharedData(envoy))?;
    let bounds = Bounds::for_backend(&w.keys, backend);
    let table = KeyTable::decode(&envoy.shared_data(&shared::keys(&w.cluster)).0.unwrap_or_default());
    let chosen = hosts.get(store::proposal(&table, &hosts, w.key, now, &bounds)?)?;
    w.proposed = chosen.id();
    w.address = chosen.address.clone();
    w.body = store::ask_request(&ask, &st.prefix, &w.cluster, w.key, &w.address, w.lease);
    w.ask = ask;
    w.stale_retries = w.stale_retries.saturating_add(1);
    w.send_again(envoy).then_some(Step::Retrying)
}

/// Spends one of this Envoy's `max` creates of the second at `now` (shared by its workers, with compare-and-swap).
/// False when they are spent, and when every try lost its race to other workers' creates (the key then waits for
/// a later request).
fn take_create(envoy: &Envoy, now: u64, max: u32) -> bool {
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = envoy.shared_data(shared::STORE_CREATES);
        let mut budget = CreateBudget::decode(&bytes.unwrap_or_default());
        if !budget.take(now, max) {
            return false;
        }
        if envoy.set_shared_data(shared::STORE_CREATES, &budget.encode(), cas) {
            return true;
        }
    }
    false
}
