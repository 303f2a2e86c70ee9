//! llmroute's decisions, as plain functions over plain data.
//!
//! Nothing here calls the proxy-wasm host: the filter crate reads inputs from Envoy, calls these functions and
//! applies what they return. That keeps every decision testable natively, and identical between the native
//! CLI and the wasm build.

// Tests may index and do plain arithmetic; the code that ships may not (see [lints.clippy] in Cargo.toml).
#![cfg_attr(test, allow(clippy::indexing_slicing, clippy::arithmetic_side_effects))]

pub mod admin_poll;
pub mod affinity;
pub mod anthropic;
pub mod api;
pub mod api_kind;
pub mod auth;
pub mod config;
pub mod content;
pub mod decisions;
pub mod endpoint;
pub mod envoy_contract;
pub mod error;
pub mod estimate;
pub mod etcd_json;
pub mod fairness;
pub mod fields;
pub mod fleet_check;
pub mod global_limits;
pub mod headers;
pub mod host_poll;
pub mod json;
pub mod key_placement;
pub mod limits;
pub mod load;
pub mod message_index;
pub mod models;
pub mod output_bound;
pub mod patch;
pub mod probe;
pub mod request;
pub mod request_plan;
pub mod response_plan;
pub mod route;
pub mod route_choice;
pub mod session;
pub mod status;
pub mod stream;
pub mod stream_always;
pub mod text;
pub mod upstream;

pub use affinity::{Affinity, AffinitySource};
pub use config::{load as load_config, load_document, Config, ConfigError, ConfigErrors, Document};
pub use endpoint::{classify, Api, Endpoint, Envelope};
pub use error::GatewayError;
pub use route::{route, BodyPatch, RouteDecision};
pub use session::{session_from_headers, SessionHeaders, SessionKey, SessionSource};

/// The version reported by the CLI and logged by the filter at VM start.
pub use envoy_contract::VERSION;
