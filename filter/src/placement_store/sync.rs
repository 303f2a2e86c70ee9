//! The placement store's root side ([`Syncer`]): once a second one root context per Envoy (a shared-data lease)
//! reads each backend's keys modified since the last revision it saw and merges them into the shared key table;
//! once an epoch it grants a new etcd lease and re-attaches the keys in use; it settles the keys placed locally
//! while etcd failed; and with `auth` it gets and renews etcd's token. A failed call is retried next round;
//! requests never wait for this side.

use std::rc::Rc;

use llmroute_core::config::PlacementStore;
use llmroute_core::envoy_contract::{shared, PLACEMENT_STORE_CLUSTER};
use llmroute_core::etcd_json;
use llmroute_core::key_placement::in_flight::CAS_ATTEMPTS;
use llmroute_core::key_placement::store::{self, Lease, Pending, Reply, Settled};
use llmroute_core::key_placement::{HostView, KeyTable};
use llmroute_core::status::POLL_INTERVAL_MS;
use llmroute_core::Config;

use super::etcd_call::{call_body, post, reply};
use super::shared_state::{hosts_of, merge, read_revision, update_pending, write_revision};
use crate::host::{self, Envoy};
use crate::store_auth::{self, Credentials};

/// How long the root side's calls may take; they never hold a request.
const SYNC_TIMEOUT_MS: u64 = 2000;

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
    pub fn start(&mut self, envoy: &Envoy, cfg: Rc<Config>, credentials: Option<Credentials>) {
        self.credentials = credentials;
        if cfg.affinity.placement_store.is_none() || cfg.bounded_keys().is_none() {
            return;
        }
        // Seeded once per process, so every later write of a pending list is a compare-and-swap (a first write
        // without one could drop another worker's key).
        for b in &cfg.backends {
            let key = shared::store_pending(&b.name);
            if envoy.shared_data(&key).1.is_none() {
                envoy.set_shared_data(&key, &[], None);
            }
        }
        self.cfg = Some(cfg);
    }

    pub fn on_tick(&mut self, envoy: &Envoy) {
        let Some(cfg) = self.cfg.clone() else { return };
        let (Some(st), Some(keys)) = (&cfg.affinity.placement_store, cfg.bounded_keys()) else {
            return;
        };
        let now = envoy.now_ms();
        // A call the host never answered is forgotten (a late answer is ignored).
        self.calls
            .retain(|(_, _, at)| now.saturating_sub(*at) <= SYNC_TIMEOUT_MS.saturating_add(POLL_INTERVAL_MS));
        if !self.calls.is_empty() || !crate::lease::claim(envoy, shared::STORE_SYNC_LEASE, now, due) {
            return;
        }
        if let Some(c) = &self.credentials {
            // Without a token every call would be refused: authenticate first, and the rest next round.
            if store_auth::token(envoy).is_none() {
                if now >= self.authenticate_after_ms {
                    let body = c.body();
                    let sent = envoy.dispatch_post(
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
        let lease = Lease::decode(&envoy.shared_data(shared::STORE_LEASE).0.unwrap_or_default());
        if lease.due(now, keys.idle_ttl_ms) {
            let body = etcd_json::grant_body(store::lease_ttl_s(keys.idle_ttl_ms));
            self.send(envoy, store::GRANT_PATH, &body, Job::Grant { previous: lease }, now);
        }
        for b in &cfg.backends {
            if llmroute_core::key_placement::views(b, now, &host::SharedData(envoy)).is_none() {
                continue;
            }
            let seen = read_revision(envoy, &b.name);
            let body = store::range_request(&st.prefix, &b.name, seen, keys.max_keys);
            let job = Job::Range {
                backend: b.name.clone(),
                seen,
            };
            self.send(envoy, store::RANGE_PATH, &body, job, now);
            self.settle_pending(envoy, st, b, lease.id, now);
        }
    }

    /// Proposes to the store the keys of `b` placed locally while it failed, a few per round.
    fn settle_pending(
        &mut self,
        envoy: &Envoy,
        st: &PlacementStore,
        b: &llmroute_core::config::Backend,
        lease: i64,
        now: u64,
    ) {
        let pending = Pending::decode(&envoy.shared_data(&shared::store_pending(&b.name)).0.unwrap_or_default());
        if pending.is_empty() {
            return;
        }
        let Some(hosts) = llmroute_core::key_placement::views(b, now, &host::SharedData(envoy)) else {
            return;
        };
        let table = KeyTable::decode(&envoy.shared_data(&shared::keys(&b.name)).0.unwrap_or_default());
        for &key in pending.keys().iter().take(Pending::PER_ROUND) {
            let Some(address) = local_address(&table, &hosts, key) else {
                // Forgotten, or on a host no longer listed: a later request settles it afresh.
                update_pending(envoy, &b.name, |p| p.remove(key));
                continue;
            };
            let body = store::create_request(&st.prefix, &b.name, key, &address, lease);
            let job = Job::Settle {
                backend: b.name.clone(),
                key,
            };
            self.send(envoy, store::TXN_PATH, &body, job, now);
        }
    }

    fn send(&mut self, envoy: &Envoy, path: &str, body: &str, job: Job, now: u64) {
        let auth = self.credentials.is_some();
        match post(envoy, path, body.as_bytes(), auth, SYNC_TIMEOUT_MS) {
            Some(token) => self.calls.push((token, job, now)),
            None => log::debug!("llmroute: the placement store's cluster could not be called"),
        }
    }

    /// Keeps the token etcd gave for the user and password, or logs why there is none (never the password).
    fn authenticated(&mut self, envoy: &Envoy, answer: Option<&(u32, Vec<u8>)>, now: u64) {
        let user = self.credentials.as_ref().map_or("", |c| c.user.as_str());
        match answer {
            Some((200, body)) => match etcd_json::parse_authenticate(body) {
                Ok(token) => {
                    store_auth::keep(envoy, &token);
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

    pub fn on_response(&mut self, envoy: &Envoy, token: u32, body_size: usize) {
        let Some(i) = self.calls.iter().position(|(t, _, _)| *t == token) else {
            return;
        };
        let (_, job, _) = self.calls.swap_remove(i);
        let Some(cfg) = self.cfg.clone() else { return };
        let (Some(st), Some(keys)) = (&cfg.affinity.placement_store, cfg.bounded_keys()) else {
            return;
        };
        let answer = call_body(envoy, body_size);
        match &job {
            Job::Authenticate => return self.authenticated(envoy, answer.as_ref(), envoy.now_ms()),
            Job::Settle { backend, key } => {
                return self.settled(envoy, &cfg, st, backend, *key, reply(answer.as_ref()))
            }
            Job::SettleMove { backend, key } => {
                return settle(envoy, backend, *key, store::settle_move_outcome(reply(answer.as_ref())));
            }
            _ => {}
        }
        let body = match &answer {
            Some((200, body)) => body.as_slice(),
            Some((status, _)) => return log::info!("llmroute: placement store answered {status} ({job:?})"),
            None => return log::info!("llmroute: placement store did not answer ({job:?})"),
        };
        let now = envoy.now_ms();
        match job {
            Job::Grant { previous } => match etcd_json::parse_grant(body) {
                Ok(id) => {
                    let lease = Lease { id, granted_ms: now };
                    envoy.set_shared_data(shared::STORE_LEASE, &lease.encode(), None);
                    if previous.id != 0 {
                        self.refresh(envoy, &cfg, st, previous.granted_ms, id, now);
                    }
                }
                Err(e) => log::info!("llmroute: placement store lease grant: {e}"),
            },
            Job::Range { backend, seen } => match etcd_json::parse_range(body) {
                Ok(range) => {
                    let prefix = store::backend_prefix(&st.prefix, &backend);
                    if merge(envoy, &backend, &prefix, &range.kvs, now, keys.max_keys) {
                        write_revision(envoy, &backend, store::next_revision(seen, &range));
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
    fn settled(
        &mut self,
        envoy: &Envoy,
        cfg: &Config,
        st: &PlacementStore,
        backend: &str,
        key: u64,
        answer: Reply<'_>,
    ) {
        let now = envoy.now_ms();
        let hosts = hosts_of(envoy, cfg, backend);
        let Settled::Replace { from } = store::settle_outcome_in(answer, &hosts) else {
            return settle(envoy, backend, key, store::settle_outcome_in(answer, &hosts));
        };
        let table = KeyTable::decode(&envoy.shared_data(&shared::keys(backend)).0.unwrap_or_default());
        let Some(address) = local_address(&table, &hosts, key) else {
            update_pending(envoy, backend, |p| p.remove(key));
            return;
        };
        let lease = Lease::decode(&envoy.shared_data(shared::STORE_LEASE).0.unwrap_or_default());
        let body = store::move_request(&st.prefix, backend, key, &from, &address, lease.id);
        let job = Job::SettleMove {
            backend: backend.to_string(),
            key,
        };
        self.send(envoy, store::TXN_PATH, &body, job, now);
    }

    /// Re-attaches to lease `id` the keys this replica's requests used since `since_ms`.
    fn refresh(&mut self, envoy: &Envoy, cfg: &Config, st: &PlacementStore, since_ms: u64, id: i64, now: u64) {
        for b in &cfg.backends {
            let Some(hosts) = llmroute_core::key_placement::views(b, now, &host::SharedData(envoy)) else {
                continue;
            };
            let table = KeyTable::decode(&envoy.shared_data(&shared::keys(&b.name)).0.unwrap_or_default());
            for body in store::refresh_batches(&table, &hosts, since_ms, &st.prefix, &b.name, id) {
                self.send(envoy, store::TXN_PATH, &body, Job::Refresh, now);
            }
        }
    }
}

/// The `IP:PORT` of the host the local `table` holds `key` on, when that host is listed.
fn local_address(table: &KeyTable, hosts: &[HostView], key: u64) -> Option<String> {
    let held = table.get(key)?.host;
    hosts.iter().find(|h| h.id() == held).map(|h| h.address.clone())
}

/// Applies a pending key's settlement: kept or moved once, then no longer pending; or left for the next round.
fn settle(envoy: &Envoy, backend: &str, key: u64, settled: Settled) {
    match settled {
        Settled::Retry | Settled::Replace { .. } => return,
        Settled::Kept => {}
        Settled::MoveTo(host) => {
            let table_key = shared::keys(backend);
            for _ in 0..CAS_ATTEMPTS {
                let (bytes, cas) = envoy.shared_data(&table_key);
                let mut t = KeyTable::decode(&bytes.unwrap_or_default());
                if !t.set_host(key, host) || envoy.set_shared_data(&table_key, &t.encode(), cas) {
                    break;
                }
            }
        }
    }
    update_pending(envoy, backend, |p| p.remove(key));
}
