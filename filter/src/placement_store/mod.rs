//! The shared placement store, host side (`affinity.placement_store.etcd`): the HTTP callouts to etcd's JSON
//! gateway through the `llmroute_placement_store` cluster. What to send and what an answer means is decided by
//! `llmroute_core::key_placement::store`; this module only sends and hands back.
//!
//! - **Request side.** For a key to share (`llmroute_core::key_placement::store::decide`: with `share_keys:
//!   returning` a key the local table holds but has not shared, a first sighting being placed locally; with `all` also
//!   a key it lacks), within this Envoy's create budget (`request::take_create`; keys kept local are counted in
//!   `llmroute_placement_store_kept_local_total{reason}`), [`begin`] sends the create-if-absent transaction with the
//!   host the local table would choose, conditional on the backend's keys being unchanged since the revision the table
//!   is known complete up to (shared data, written by the root's refresh and by won creates), and the request context
//!   pauses; an answer that finds that view stale is merged into the table, and the key chosen again and sent again
//!   (counted `stale_view`); for a known key whose host is down, the compare-and-swap that moves it off that host for
//!   the whole fleet. [`finish`] reads the answer (or Envoy's "no answer" after `timeout_ms`), counts the outcome in
//!   `llmroute_placement_store_total{outcome}`, and pins the request where the store says, or locally on a fallback. A
//!   swap that finds the key gone from etcd is sent again as a create-if-absent. Known shared keys on up hosts never
//!   reach this module.
//! - **Root side.** [`Syncer`]: once a second one root context per Envoy (a compare-and-swap lease in shared data)
//!   reads each backend's keys modified since the last revision it saw and merges them into the shared key table;
//!   once an epoch it grants a new etcd lease for new keys and re-attaches the keys its requests used; and it
//!   settles the keys placed locally while etcd failed (kept, or moved once to the host another replica stored;
//!   a stored host that is down here is swapped for the local one).
//!   A failed call is logged and retried on the next round; requests never wait for this side.
//! - **Authentication.** With `auth`, every call carries etcd's token, which the root side gets and renews (see
//!   `store_auth`); a new key's request meets no token only before the first authentication or after etcd forgot
//!   it, and is then placed locally, as during an outage.
//!
//! The parts: [`request`] (a paused request's side), [`sync`] (the root side), [`etcd_call`] (one call and its
//! answer) and [`shared_state`] (what both sides keep in shared data).

mod etcd_call;
mod request;
mod shared_state;
mod sync;

pub use request::{begin, finish, Step, Waiting};
pub use sync::Syncer;
