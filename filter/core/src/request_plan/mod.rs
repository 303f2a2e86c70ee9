//! The request plans: for each phase of a request, the core decides in one call what the filter does, and returns
//! it as plain data that the filter applies without deciding anything. Host state a decision depends on (the limit
//! buckets, the placement store, the fair queue) stays with the filter: a plan names what to charge and what to
//! place, and the filter asks the host.
//!
//! - **Headers** ([`headers::plan`]): the client's copies of gateway headers to remove, the request id (the
//!   client's when well formed, else a fresh one to set), the key the request presented, and what comes next: a
//!   refusal, a status page, a `/v1/models` answer ([`models_reply`]), or the body to read with the key's
//!   request-limit charges and the request's fair-queue tenant.
//! - **Body** ([`body::plan`]): the route decision, its token charges, the body edit (a head edit of Envoy's
//!   buffer, or a whole replacement when `/v1/messages` dropped `extra_headers`), the new `content-length`, the
//!   cluster, affinity, alias and token-estimate headers, the access-log fields, and the affinity hash to place.
//! - **Local replies** ([`LocalReply`]): every answer the gateway sends itself, with its status, headers, body and
//!   the rejection it counts; the request-id headers are written in one place.

pub mod body;
pub mod headers;
mod reply;

pub use reply::{models_reply, LocalReply, JSON};
