//! The shared placement store: one key table for every Envoy replica, kept in etcd
//! (`affinity.placement_store.etcd`), so that replicas behind a balancer place each key alike.
//!
//! Without it each replica's table lives in its own shared data, and two replicas that see different traffic place
//! the same new key on different hosts. With it:
//!
//! - **Which keys reach etcd** ([`decide`]). With `share_keys: returning` (the default) a key's first request
//!   on a replica ([`KeptLocal::FirstSighting`]) is placed by the local table alone, as without a store, and the
//!   table remembers it as not shared; only when it comes back within its idle TTL is it created in etcd. So a
//!   stream of one-off keys (random session ids, `prompt_cache_key` values, prompts) writes nothing to etcd and
//!   pauses no request. With `share_keys: all` every new key is created on its first request. Either way each
//!   Envoy creates at most `max_creates_per_s` keys a second ([`CreateBudget`], [`Decision::within_budget`]);
//!   past it a key is placed locally ([`KeptLocal::OverBudget`]) and created on a later request.
//! - **A known key** (shared) is read from the local table, as before: no extra latency.
//! - **A key to share** (unknown to the local table, idled out of it, or held but not shared yet) costs one etcd
//!   transaction, [`etcd_json::create_in_view_body`] ([`Ask::CreateInView`]): create `<prefix>/keys/<backend>/<key as 16 hex
//!   digits>` = the local choice's `IP:PORT`, unless it exists, in which case read it; and only if no placement
//!   of the backend was written in etcd after the revision the replica's local view is known complete up to (its
//!   last refresh, or its own last create). Every create and move of the backend also puts its marker key
//!   ([`marker_path`]), so the condition reads one key, however many the backend holds, and a lease's refresh of
//!   the keys (which moves nothing) does not make other views stale. The replica that created it uses its own choice ([`Outcome::Won`]); one
//!   that lost the race adopts the stored host ([`Outcome::Adopted`]). Only the request that shares a key
//!   waits for etcd: its first on a replica with `share_keys: all`, the one it comes back with otherwise.
//! - **A stale view** ([`InView::Stale`]): the same answer brings the backend's keys changed since the view; the
//!   replica [`merge`]s them, chooses again, and sends the create in the new view ([`after_stale`], at most
//!   [`MAX_STALE_RETRIES`] times, then a plain [`etcd_json::create_if_absent_body`]). So every key is created
//!   from a view that holds every key etcd held at that moment: replicas place new keys as one table placing
//!   them in etcd's commit order would, however many arrive at once. Each retry follows another key's write to
//!   the backend, so a burst of new keys costs its last one a retry per key committed before it. The
//!   proposal counts the shared keys only ([`proposal`]): those are etcd's, the same on every replica, while the
//!   keys a replica placed alone differ from one replica to the next. A key placed locally on its first sighting
//!   may so be proposed on another host when it comes back; wherever etcd settles it, every replica follows
//!   ([`super::choose_stored`]).
//! - **When etcd is slow or gone** (no answer within `timeout_ms`, an error, an unreadable answer), the request is
//!   placed locally and proceeds ([`Outcome::Fallback`], counted by reason). When etcd is back and holds another
//!   host for that key, the stored placement wins at the next refresh ([`merge`]): the key moves once.
//! - **Keys placed during an outage** are remembered per backend ([`Pending`]). Once etcd answers again, the
//!   root context settles each with the same create-if-absent transaction, proposing the host the local table
//!   holds ([`settle_outcome`]): the first replica to reach etcd stores its host, and every other one adopts it.
//!   So a key moves at most once, and replicas agree again without waiting for the key to idle out.
//! - **The local view**: every second one root context per replica reads the keys modified since the revision it
//!   last saw ([`range_request`], [`next_revision`]) and [`merge`]s them into the local table, so the key-count
//!   bounds of new placements see the whole fleet's keys, and a new key's create is rarely stale. A key this
//!   replica placed alone on its first sighting, and another replica shared, moves to the stored host then.
//! - **Idle expiry**: keys are attached to a lease that one root context per replica grants every [`epoch_ms`],
//!   with a TTL of `key_idle_ttl_s` plus one epoch ([`lease_ttl_s`]). At each new lease the replica re-attaches
//!   the keys its own requests touched during the last epoch ([`refresh_batches`]). A key no replica uses is
//!   deleted by etcd between `key_idle_ttl_s` and `key_idle_ttl_s` plus two epochs after its last request.
//!
//! - **A key whose host is down** moves once for the whole fleet ([`Ask::Move`]): a compare-and-swap transaction,
//!   [`etcd_json::swap_body`], stores the host the local table would move it to if etcd still holds the down
//!   host ([`Outcome::Moved`]); otherwise this replica adopts what etcd holds ([`Outcome::MoveAdopted`]), since
//!   another replica moved it first. A key etcd no longer holds is proposed with create-if-absent instead, and a
//!   stored host that is down here is swapped in turn ([`next`], at most [`MAX_FOLLOW_UPS`] more transactions).
//!   When etcd fails the local move stands and the key is settled later like
//!   an outage's keys: if etcd then still holds the down host, the settlement swaps it for the local host
//!   ([`Settled::Replace`]).
//!
//! The in-flight spill and Envoy's health checks, ejection and retries are unchanged: they act on the host the
//! table holds, exactly as with a local table (see [`super::choose_stored`]). Everything here is pure: the
//! filter's `placement_store` module sends the bodies and hands the answers back.

use super::{host_id, Bounds, HostView, KeyTable};
use crate::config::ShareKeys;
use crate::etcd_json::{self, EtcdJsonError, InViewAnswer, Kv, RangeAnswer, TxnAnswer};

/// The gateway path of a transaction.
pub const TXN_PATH: &str = "/v3/kv/txn";
/// The gateway path of a range read.
pub const RANGE_PATH: &str = "/v3/kv/range";
/// The gateway path of a lease grant.
pub const GRANT_PATH: &str = "/v3/lease/grant";
/// The largest callout answer the filter reads; a range of `max_keys` (at most 65 536) keys of about 150 bytes
/// each fits.
pub const MAX_ANSWER_BYTES: usize = 16 << 20;
/// At most this many refresh transactions (of [`etcd_json::MAX_TXN_OPS`] keys each) per backend and epoch: keys
/// touched beyond them are not re-attached and idle out one epoch early.
pub const MAX_REFRESH_BATCHES: usize = 64;

/// The etcd prefix under which `backend`'s keys live: `<prefix>/keys/<backend>/`.
pub fn backend_prefix(prefix: &str, backend: &str) -> String {
    format!("{prefix}/keys/{backend}/")
}

/// The etcd key of affinity key `key` in `backend`.
pub fn key_path(prefix: &str, backend: &str, key: u64) -> String {
    format!("{}{key:016x}", backend_prefix(prefix, backend))
}

/// The affinity key an etcd key under `backend_prefix` names; `None` for anything else.
pub fn key_of(backend_prefix: &str, etcd_key: &[u8]) -> Option<u64> {
    let rest = etcd_key.strip_prefix(backend_prefix.as_bytes())?;
    if rest.len() != 16 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(rest).ok()?, 16).ok()
}

/// The etcd key whose `mod_revision` is the revision of `backend`'s last placement write (a create or a move):
/// `<prefix>/placed/<backend>`, outside the backend's key range. See [`etcd_json::create_in_view_body`].
pub fn marker_path(prefix: &str, backend: &str) -> String {
    format!("{prefix}/placed/{backend}")
}

/// The body of a new key's create-if-absent transaction: the key, stored as the `IP:PORT` of `address`.
pub fn create_request(prefix: &str, backend: &str, key: u64, address: &str, lease: i64) -> String {
    let marker = marker_path(prefix, backend);
    etcd_json::create_if_absent_body(&key_path(prefix, backend, key), address, lease, Some(&marker))
}

/// True when `key` must be settled with the store before it is placed: the local table does not hold it, holds
/// it past its idle TTL (the placement would forget it and place it afresh), or holds it without having shared
/// it (placed locally on its first sighting, or over the create budget).
pub fn needs_store(table: &KeyTable, key: u64, now_ms: u64, b: &Bounds) -> bool {
    live(table, key, now_ms, b).is_none_or(|e| !e.shared)
}

/// The table's entry for `key`, unless it idled out by `now_ms`.
fn live(table: &KeyTable, key: u64, now_ms: u64, b: &Bounds) -> Option<super::Entry> {
    table
        .get(key)
        .filter(|e| now_ms.saturating_sub(e.last_ms) < b.idle_ttl_ms)
}

/// The body of a new key's create-if-absent transaction that also requires `backend`'s keys unchanged since
/// revision `view` ([`etcd_json::create_in_view_body`]); its failure branch reads at most `limit` changed keys.
pub fn create_in_view_request(
    prefix: &str,
    backend: &str,
    key: u64,
    address: &str,
    lease: i64,
    view: i64,
    limit: usize,
) -> String {
    etcd_json::create_in_view_body(
        &key_path(prefix, backend, key),
        address,
        lease,
        &backend_prefix(prefix, backend),
        &marker_path(prefix, backend),
        view,
        limit as u64,
    )
}

/// What a request's key asks of the store before it is placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// The local table lacks the key (or it idled out): create-if-absent ([`create_request`]).
    Create,
    /// [`Ask::Create`], proposed from a local view of the backend's keys complete up to etcd revision `view`: it
    /// commits only if none of them changed since ([`create_in_view_request`]; at most `limit` changed keys are
    /// read back when some did).
    CreateInView { view: i64, limit: usize },
    /// The table holds the key on a listed host that is down, at `from` (`IP:PORT`, as etcd stores it): move it
    /// with a compare-and-swap ([`move_request`]).
    Move { from: String },
}

impl Ask {
    /// This ask, for a replica whose local view of the backend's keys is complete up to revision `view`: a
    /// create becomes [`Ask::CreateInView`]; a move stays as it is.
    pub fn in_view(self, view: i64, limit: usize) -> Ask {
        match self {
            Ask::Create => Ask::CreateInView { view, limit },
            other => other,
        }
    }
}

/// What `key` asks of the store at `now_ms`, every key being shared (`share_keys: all`; [`decide`] applies the
/// setting): `None` when the local table places it alone (a known shared key on an up host, or on a host no
/// longer listed, whose address the swap could not name), and when no host is up.
pub fn ask(table: &KeyTable, hosts: &[HostView], key: u64, now_ms: u64, b: &Bounds) -> Option<Ask> {
    if !hosts.iter().any(|h| h.up) {
        return None;
    }
    if needs_store(table, key, now_ms, b) {
        return Some(Ask::Create);
    }
    let held = table.get(key)?.host;
    let host = hosts.iter().find(|h| h.id() == held)?;
    (!host.up).then(|| Ask::Move {
        from: host.address.clone(),
    })
}

/// The body of a moving key's compare-and-swap: stored as `to` if etcd still holds `from`, else read back.
pub fn move_request(prefix: &str, backend: &str, key: u64, from: &str, to: &str, lease: i64) -> String {
    let marker = marker_path(prefix, backend);
    etcd_json::swap_body(&key_path(prefix, backend, key), from, to, lease, Some(&marker))
}

/// The body `ask` sends for `key`, proposing `address`.
pub fn ask_request(ask: &Ask, prefix: &str, backend: &str, key: u64, address: &str, lease: i64) -> String {
    match ask {
        Ask::Create => create_request(prefix, backend, key, address, lease),
        Ask::CreateInView { view, limit } => {
            create_in_view_request(prefix, backend, key, address, lease, *view, *limit)
        }
        Ask::Move { from } => move_request(prefix, backend, key, from, address, lease),
    }
}

/// Why a key that the store would take is placed locally instead, without asking it (counted per reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptLocal {
    /// `share_keys: returning`, and the local table does not hold the key: its first request, placed as without
    /// a store. It reaches etcd if it comes back within its idle TTL.
    FirstSighting,
    /// The key would be created in etcd, but this Envoy already created `max_creates_per_s` keys this second.
    OverBudget,
}

impl KeptLocal {
    pub const ALL: [KeptLocal; 2] = [KeptLocal::FirstSighting, KeptLocal::OverBudget];

    /// The metric label (`reason`).
    pub fn as_str(self) -> &'static str {
        match self {
            KeptLocal::FirstSighting => "first_sighting",
            KeptLocal::OverBudget => "over_budget",
        }
    }
}

/// What a request's key does with the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Send this transaction first, then place the key where the store says.
    Send(Ask),
    /// Placed locally without asking the store, for this reason.
    Keep(KeptLocal),
    /// Placed by the local table alone, as ever: a known shared key on an up host, or no host up ([`ask`]).
    Table,
}

impl Decision {
    /// This decision once the create budget is consulted: a create ([`Ask::Create`], [`Ask::CreateInView`])
    /// spends one through `take`, and stays local ([`KeptLocal::OverBudget`]) when `take` finds none left. Moves
    /// and local placements spend nothing (a move follows a key already in etcd whose host went down).
    pub fn within_budget(self, take: impl FnOnce() -> bool) -> Decision {
        let creates = matches!(self, Decision::Send(Ask::Create | Ask::CreateInView { .. }));
        match creates && !take() {
            true => Decision::Keep(KeptLocal::OverBudget),
            false => self,
        }
    }
}

/// What `key` does with the store at `now_ms` under `share` ([`ShareKeys`]): [`ask`]'s answer, except that with
/// `share_keys: returning` a key the local table does not hold (live) is a first sighting, placed locally. A key
/// the table holds but has not shared (its first sighting, or a create over budget) came back: it is created.
pub fn decide(table: &KeyTable, hosts: &[HostView], key: u64, now_ms: u64, b: &Bounds, share: ShareKeys) -> Decision {
    match ask(table, hosts, key, now_ms, b) {
        None => Decision::Table,
        Some(Ask::Create) if share == ShareKeys::Returning && live(table, key, now_ms, b).is_none() => {
            Decision::Keep(KeptLocal::FirstSighting)
        }
        Some(a) => Decision::Send(a),
    }
}

/// Keys created in etcd this second, per Envoy (shared by its workers): the `max_creates_per_s` budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CreateBudget {
    /// The second (`now_ms / 1000`) `used` counts.
    pub second: u64,
    pub used: u32,
}

impl CreateBudget {
    /// Spends one create at `now_ms` if fewer than `max` were spent this second. True when spent.
    pub fn take(&mut self, now_ms: u64, max: u32) -> bool {
        let second = now_ms / 1000;
        if second != self.second {
            *self = CreateBudget { second, used: 0 };
        }
        if self.used >= max {
            return false;
        }
        self.used = self.used.saturating_add(1);
        true
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.second.to_le_bytes().to_vec();
        out.extend_from_slice(&self.used.to_le_bytes());
        out
    }

    /// Reads [`CreateBudget::encode`]'s bytes; anything else is an unspent budget.
    pub fn decode(bytes: &[u8]) -> CreateBudget {
        let (Some(second), Some(used)) = (bytes.get(..8), bytes.get(8..12)) else {
            return CreateBudget::default();
        };
        CreateBudget {
            second: u64::from_le_bytes(second.try_into().unwrap_or_default()),
            used: u32::from_le_bytes(used.try_into().unwrap_or_default()),
        }
    }
}

/// Where the local table would place `key` if its view held only the shared keys, without changing the table:
/// the host this replica proposes in its transaction. Every replica's shared keys are etcd's (up to its view), so
/// replicas propose from the same view whatever keys each placed alone. `None` when no host is up.
pub fn proposal(table: &KeyTable, hosts: &[HostView], key: u64, now_ms: u64, b: &Bounds) -> Option<usize> {
    let mut scratch = table.shared_only();
    super::choose(&mut scratch, hosts, key, now_ms, b).map(|c| c.host)
}

/// What came back from a callout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// An HTTP answer.
    Answer { status: u32, body: &'a [u8] },
    /// No answer, or the connection failed (Envoy delivers no headers). A callout past its timeout is answered
    /// by Envoy with a 504 instead, read as a timeout too.
    NoAnswer,
    /// The callout could not even be sent (the store's cluster is missing, the host refused).
    NotSent,
}

/// Why a request was placed locally instead of through the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// etcd did not answer within `timeout_ms` (or could not be connected to).
    Timeout,
    /// The callout could not be sent.
    NotSent,
    /// etcd answered with an error, or with something that is not a transaction's answer.
    Error,
}

/// How the store settled a new key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// This replica created the key with its own choice.
    Won,
    /// The key existed: the host with this id holds it.
    Adopted { host: u32 },
    /// A key whose host was down: this replica's swap stored its own choice.
    Moved,
    /// A key whose host was down: etcd no longer held the down host (another replica moved it first), so the
    /// key follows the host with this id.
    MoveAdopted { host: u32 },
    /// Placed locally; the request proceeds.
    Fallback(Fallback),
}

impl Outcome {
    /// Every metric label value, for priming the counters: the outcomes, and [`STALE_VIEW`].
    pub const LABELS: [&'static str; 8] = [
        "won",
        "adopted",
        "moved",
        "move_adopted",
        "timeout",
        "not_sent",
        "error",
        STALE_VIEW,
    ];

    /// The metric label (`outcome`) of this outcome.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Won => "won",
            Outcome::Adopted { .. } => "adopted",
            Outcome::Moved => "moved",
            Outcome::MoveAdopted { .. } => "move_adopted",
            Outcome::Fallback(Fallback::Timeout) => "timeout",
            Outcome::Fallback(Fallback::NotSent) => "not_sent",
            Outcome::Fallback(Fallback::Error) => "error",
        }
    }

    /// The host id the store settled on, given the one this replica proposed; `None` for a fallback.
    pub fn stored(self, proposed: u32) -> Option<u32> {
        match self {
            Outcome::Won | Outcome::Moved => Some(proposed),
            Outcome::Adopted { host } | Outcome::MoveAdopted { host } => Some(host),
            Outcome::Fallback(_) => None,
        }
    }
}

/// The metric label (`outcome`) counted once per [`Ask::CreateInView`] that found its view stale and was sent
/// again ([`after_stale`]): not an outcome, since the key is settled by the transaction that follows.
pub const STALE_VIEW: &str = "stale_view";

/// The body of a `200` answer, or the fallback any other reply is.
fn answer_body(reply: Reply<'_>) -> Result<&[u8], Outcome> {
    match reply {
        Reply::NotSent => Err(Outcome::Fallback(Fallback::NotSent)),
        Reply::NoAnswer => Err(Outcome::Fallback(Fallback::Timeout)),
        Reply::Answer { status: 200, body } => Ok(body),
        // Envoy answers a callout that outlives its timeout with a 504 of its own (and etcd's gateway maps a
        // deadline it missed to 504 too): a timeout either way, not an error.
        Reply::Answer { status: 504, .. } => Err(Outcome::Fallback(Fallback::Timeout)),
        Reply::Answer { .. } => Err(Outcome::Fallback(Fallback::Error)),
    }
}

/// Reads a create-if-absent transaction's reply.
pub fn create_outcome(reply: Reply<'_>) -> Outcome {
    let body = match answer_body(reply) {
        Ok(body) => body,
        Err(fallback) => return fallback,
    };
    match etcd_json::parse_create(body) {
        Ok(TxnAnswer::Created { .. }) => Outcome::Won,
        Ok(TxnAnswer::Exists { kv: Some(kv), .. }) => match stored_host(&kv) {
            Some(host) => Outcome::Adopted { host },
            None => Outcome::Fallback(Fallback::Error),
        },
        Ok(TxnAnswer::Exists { kv: None, .. }) | Err(_) => Outcome::Fallback(Fallback::Error),
    }
}

/// What a [`Ask::CreateInView`] transaction's reply says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InView {
    /// Settled as a create-if-absent is ([`create_outcome`]). `revision`: the revision the key was created at,
    /// for [`Outcome::Won`] (the replica's view, holding its own key, is then complete up to it: nothing else in
    /// the backend was placed in between); 0 otherwise.
    Settled { outcome: Outcome, revision: i64 },
    /// The key is absent, but the view was stale: merge these keys ([`merge`]), choose again, and send
    /// [`after_stale`]'s transaction.
    Stale(RangeAnswer),
}

/// Reads a [`Ask::CreateInView`] transaction's reply.
pub fn create_in_view_outcome(reply: Reply<'_>) -> InView {
    let settled = |outcome| InView::Settled { outcome, revision: 0 };
    let body = match answer_body(reply) {
        Ok(body) => body,
        Err(fallback) => return settled(fallback),
    };
    match etcd_json::parse_create_in_view(body) {
        Ok(InViewAnswer::Created { revision }) => InView::Settled {
            outcome: Outcome::Won,
            revision,
        },
        Ok(InViewAnswer::Exists { kv, .. }) => {
            settled(stored_host(&kv).map_or(Outcome::Fallback(Fallback::Error), |host| Outcome::Adopted { host }))
        }
        Ok(InViewAnswer::Stale(range)) => InView::Stale(range),
        Err(_) => settled(Outcome::Fallback(Fallback::Error)),
    }
}

/// The most times a new key's transaction is sent again because its view was stale ([`InView::Stale`]). Each
/// such retry follows another key's write to the backend's range after the view, so a burst of up to this many
/// plus one new keys across the fleet is placed exactly as one table would; past it the key is proposed with a
/// plain create-if-absent, so a busy fleet never livelocks.
pub const MAX_STALE_RETRIES: u8 = 6;

/// The transaction to send after a stale view's answer, when `retries` stale retries were already sent: the
/// create in the view the answer brought (its revision), or a plain create-if-absent when the retries are spent
/// or the answer was cut at its `limit` (`more`: the merged keys are not the whole change, so no view is complete).
pub fn after_stale(stale: &RangeAnswer, retries: u8, limit: usize) -> Ask {
    if stale.more || retries >= MAX_STALE_RETRIES {
        Ask::Create
    } else {
        Ask::CreateInView {
            view: stale.revision,
            limit,
        }
    }
}

/// Reads a moving key's compare-and-swap reply ([`move_request`]). `None`: etcd no longer holds the key (it idled
/// out there, or was never stored), so the replica proposes it with create-if-absent instead.
pub fn move_outcome(reply: Reply<'_>) -> Option<Outcome> {
    let Reply::Answer { status: 200, body } = reply else {
        return Some(create_outcome(reply));
    };
    Some(match etcd_json::parse_create(body) {
        Ok(TxnAnswer::Created { .. }) => Outcome::Moved,
        Ok(TxnAnswer::Exists { kv: Some(kv), .. }) => match stored_host(&kv) {
            Some(host) => Outcome::MoveAdopted { host },
            None => Outcome::Fallback(Fallback::Error),
        },
        Ok(TxnAnswer::Exists { kv: None, .. }) => return None,
        Err(_) => Outcome::Fallback(Fallback::Error),
    })
}

/// What a key's transaction answer means, for what it asked: [`create_outcome`] or [`move_outcome`].
pub fn ask_outcome(ask: &Ask, reply: Reply<'_>) -> Option<Outcome> {
    match ask {
        Ask::Create => Some(create_outcome(reply)),
        // A stale view is handled before this ([`create_in_view_outcome`]); here it reads as an error.
        Ask::CreateInView { .. } => Some(match create_in_view_outcome(reply) {
            InView::Settled { outcome, .. } => outcome,
            InView::Stale(_) => Outcome::Fallback(Fallback::Error),
        }),
        Ask::Move { .. } => move_outcome(reply),
    }
}

/// What to do with a key's answered transaction ([`ask_outcome`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Settled: pin the request by this outcome.
    Done(Outcome),
    /// Send this transaction next, for the same request.
    Send(Ask),
}

/// The most transactions a request sends after its first ([`Next::Send`]); past them the last answer stands.
pub const MAX_FOLLOW_UPS: u8 = 2;

/// What an answer leads to, given the backend's `hosts`: a swap that found the key gone from etcd is sent again as
/// a create-if-absent; a stored host that is listed here but down is swapped for this replica's choice (a key
/// created on a host that has since gone down, or moved by another replica to one that went down too). Every
/// other outcome is final.
pub fn next(answered: Option<Outcome>, hosts: &[HostView]) -> Next {
    let Some(outcome) = answered else {
        return Next::Send(Ask::Create);
    };
    let stored = match outcome {
        Outcome::Adopted { host } | Outcome::MoveAdopted { host } => host,
        _ => return Next::Done(outcome),
    };
    match hosts.iter().find(|h| h.id() == stored && !h.up) {
        Some(down) => Next::Send(Ask::Move {
            from: down.address.clone(),
        }),
        None => Next::Done(outcome),
    }
}

/// True when a new key's transaction should be sent once more, to another etcd member, before falling back: the
/// answer was a 503, which is what Envoy answers when the member it picked refused the connection or had just
/// died (and what etcd answers without a leader). Each new key is retried at most once, so a dead member costs a
/// new key one more round trip until Envoy's health checks take it out, instead of a fallback.
pub fn retry_once(reply: Reply<'_>) -> bool {
    matches!(reply, Reply::Answer { status: 503, .. })
}

/// The host id a stored value names: its `IP:PORT` text, hashed as the table names hosts. `None` for a value that
/// is not a short printable address.
fn stored_host(kv: &Kv) -> Option<u32> {
    let text = std::str::from_utf8(&kv.value).ok()?;
    let ok = (3..=64).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| host_id(text))
}

/// The body of the refresh read of `backend`'s keys: those modified after revision `seen` (all when `seen` is 0),
/// at most `max_keys`.
pub fn range_request(prefix: &str, backend: &str, seen: i64, max_keys: usize) -> String {
    let min = if seen > 0 { seen.saturating_add(1) } else { 0 };
    etcd_json::range_body(&backend_prefix(prefix, backend), max_keys as u64, min)
}

/// Reads a refresh read's reply.
pub fn range_answer(reply: Reply<'_>) -> Result<RangeAnswer, EtcdJsonError> {
    match reply {
        Reply::Answer { status: 200, body } => etcd_json::parse_range(body),
        Reply::Answer { .. } | Reply::NoAnswer | Reply::NotSent => Err(EtcdJsonError::NotJson),
    }
}

/// The revision to read from next time, after an answer read at `answer_revision` when `seen` was the last one.
/// A store whose revision went backwards was replaced (restored from a snapshot, or wiped): read it all again.
/// A cut answer (`more`) is read again from the same revision, so nothing is skipped.
pub fn next_revision(seen: i64, answer: &RangeAnswer) -> i64 {
    if answer.revision < seen {
        0
    } else if answer.more {
        seen
    } else {
        answer.revision
    }
}

/// Brings the stored placements of `kvs` (read under `backend_prefix`) into the local table, each marked shared:
/// a key the table lacks is added (on probation, seen at `now_ms`); a key it holds on another host moves to the
/// stored host (the stored placement wins). A key the table holds on the same host keeps its `last_ms`, which
/// still says when this replica's own requests last used it. True when the table changed.
pub fn merge(table: &mut KeyTable, backend_prefix: &str, kvs: &[Kv], now_ms: u64, max_keys: usize) -> bool {
    let mut changed = false;
    for kv in kvs {
        let (Some(key), Some(host)) = (key_of(backend_prefix, &kv.key), stored_host(kv)) else {
            continue;
        };
        match table.get(key) {
            Some(_) => changed |= table.set_host(key, host),
            None => {
                table.insert(key, host, now_ms, max_keys);
                changed = true;
            }
        }
        changed |= table.mark_shared(key);
    }
    changed
}

/// How often a replica grants a new lease for the keys it creates and refreshes: a quarter of the idle TTL, at
/// least a second.
pub fn epoch_ms(idle_ttl_ms: u64) -> u64 {
    (idle_ttl_ms / 4).max(1000)
}

/// The TTL of each epoch's lease, in seconds: the idle TTL plus one epoch, so a key created late in an epoch still
/// lives at least the idle TTL.
pub fn lease_ttl_s(idle_ttl_ms: u64) -> u64 {
    idle_ttl_ms.saturating_add(epoch_ms(idle_ttl_ms)).div_ceil(1000)
}

/// The lease new keys are attached to, as one replica's workers share it: its id and when it was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lease {
    pub id: i64,
    pub granted_ms: u64,
}

impl Lease {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.id.to_le_bytes().to_vec();
        out.extend_from_slice(&self.granted_ms.to_le_bytes());
        out
    }

    /// Reads [`Lease::encode`]'s bytes; anything else is no lease (id 0, which etcd reads as "no lease").
    pub fn decode(bytes: &[u8]) -> Lease {
        let (Some(id), Some(at)) = (bytes.get(..8), bytes.get(8..16)) else {
            return Lease::default();
        };
        Lease {
            id: i64::from_le_bytes(id.try_into().unwrap_or_default()),
            granted_ms: u64::from_le_bytes(at.try_into().unwrap_or_default()),
        }
    }

    /// True when a new lease should be granted at `now_ms`: there is none, or this one is an epoch old.
    pub fn due(&self, now_ms: u64, idle_ttl_ms: u64) -> bool {
        self.id == 0 || now_ms.saturating_sub(self.granted_ms) >= epoch_ms(idle_ttl_ms)
    }
}

/// The transactions that re-attach, to a new lease, the keys of the table that this replica's own requests used
/// since `since_ms` (established shared keys seen at or after it), each stored as its host's `IP:PORT`. Keys on
/// hosts not in `hosts` are skipped, and so are keys never shared: a refresh creates no key. At most [`MAX_REFRESH_BATCHES`] bodies of [`etcd_json::MAX_TXN_OPS`] keys.
pub fn refresh_batches(
    table: &KeyTable,
    hosts: &[HostView],
    since_ms: u64,
    prefix: &str,
    backend: &str,
    lease: i64,
) -> Vec<String> {
    let pairs: Vec<(String, String)> = table
        .entries()
        .iter()
        .filter(|e| e.established && e.shared && e.last_ms >= since_ms)
        .filter_map(|e| {
            let host = hosts.iter().find(|h| h.id() == e.host)?;
            Some((key_path(prefix, backend, e.key), host.address.clone()))
        })
        .collect();
    pairs
        .chunks(etcd_json::MAX_TXN_OPS)
        .take(MAX_REFRESH_BATCHES)
        .map(|batch| etcd_json::puts_body(batch, lease))
        .collect()
}

/// Keys of one backend placed locally while the store failed, waiting to be settled with it: little-endian `u64`s,
/// at most [`Pending::MAX`] (past it the oldest are dropped: those keys stay where this replica put them until
/// another replica stores them or they idle out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    keys: Vec<u64>,
}

impl Pending {
    pub const MAX: usize = 1024;
    /// Keys settled per root round.
    pub const PER_ROUND: usize = 32;

    pub fn keys(&self) -> &[u64] {
        &self.keys
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Adds `key` (once). True when the list changed.
    pub fn add(&mut self, key: u64) -> bool {
        if self.keys.contains(&key) {
            return false;
        }
        self.keys.push(key);
        if self.keys.len() > Self::MAX {
            self.keys.remove(0);
        }
        true
    }

    /// Removes `key`. True when it was there.
    pub fn remove(&mut self, key: u64) -> bool {
        let before = self.keys.len();
        self.keys.retain(|k| *k != key);
        self.keys.len() != before
    }

    pub fn encode(&self) -> Vec<u8> {
        self.keys.iter().flat_map(|k| k.to_le_bytes()).collect()
    }

    /// Reads [`Pending::encode`]'s bytes; ragged bytes read as an empty list.
    pub fn decode(bytes: &[u8]) -> Pending {
        if !bytes.len().is_multiple_of(8) {
            return Pending::default();
        }
        let keys = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .take(Self::MAX)
            .collect();
        Pending { keys }
    }
}

/// What settling a key placed during an outage does to the local table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Stored with this replica's host: nothing moves.
    Kept,
    /// Another replica stored it first: the key moves to the host with this id (once).
    MoveTo(u32),
    /// etcd holds a host that is down here, at this `IP:PORT` (the key was moved off it while etcd failed):
    /// swap it for this replica's host ([`move_request`]), then read that answer with [`settle_move_outcome`].
    Replace { from: String },
    /// The store still fails: try again next round.
    Retry,
}

/// Reads the reply to a pending key's create-if-absent transaction.
pub fn settle_outcome(reply: Reply<'_>) -> Settled {
    settle_outcome_in(reply, &[])
}

/// [`settle_outcome`], knowing the backend's `hosts`: a stored host that is down here is replaced, not adopted.
pub fn settle_outcome_in(reply: Reply<'_>, hosts: &[HostView]) -> Settled {
    match create_outcome(reply) {
        Outcome::Won | Outcome::Moved => Settled::Kept,
        Outcome::Adopted { host } | Outcome::MoveAdopted { host } => {
            match hosts.iter().find(|h| h.id() == host && !h.up) {
                Some(down) => Settled::Replace {
                    from: down.address.clone(),
                },
                None => Settled::MoveTo(host),
            }
        }
        Outcome::Fallback(_) => Settled::Retry,
    }
}

/// Reads the reply to a pending key's swap ([`Settled::Replace`]): kept when the swap ran, moved (once) when
/// another replica swapped first; retried next round when the store fails or the key vanished meanwhile.
pub fn settle_move_outcome(reply: Reply<'_>) -> Settled {
    match move_outcome(reply) {
        Some(Outcome::Won | Outcome::Moved) => Settled::Kept,
        Some(Outcome::Adopted { host } | Outcome::MoveAdopted { host }) => Settled::MoveTo(host),
        Some(Outcome::Fallback(_)) | None => Settled::Retry,
    }
}
