//! Per-API checks and content keys. Each API module reads the fields its dialect defines, refuses what its
//! dialect forbids, and says which text identifies the prompt family. The shared steps (JSON validity,
//! duplicate fields, alias resolution, explicit keys, the `model` rewrite) live in [`crate::route`].

mod chat;
mod completions;
mod embeddings;
mod messages;
mod responses;

use std::borrow::Cow;

use crate::affinity::{Affinity, AffinitySource, ContentKey};
use crate::config::AffinityConfig;
use crate::endpoint::Api;
use crate::error::GatewayError;
use crate::fields::Fields;
use crate::json::{nav, Kind, Member, Span};
use crate::message_index::MessageIndex;

/// What an API module found in a body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inspection {
    /// The content key (system prompt, else user prefix), already scoped by alias.
    pub content: Option<Affinity>,
    /// A dialect-specific explicit id (Responses `conversation`, Anthropic `metadata.user_id`), when enabled.
    pub explicit: Option<(String, AffinitySource)>,
    /// False for APIs whose requests must never be pinned (embeddings).
    pub sticky: bool,
}

/// What an API module needs besides the body.
pub struct Context<'a> {
    pub alias: &'a str,
    pub affinity: &'a AffinityConfig,
    /// The `messages` array as the validating pass indexed it (`None`: walk it).
    pub messages: Option<&'a MessageIndex<'a>>,
}

/// Runs the checks and key extraction of `api`.
pub fn inspect(api: Api, buf: &[u8], fields: &Fields, ctx: &Context) -> Result<Inspection, GatewayError> {
    match api {
        Api::Chat => chat::inspect(buf, fields, ctx),
        Api::Completions => completions::inspect(buf, fields, ctx),
        Api::Responses => responses::inspect(buf, fields, ctx),
        Api::Embeddings => embeddings::inspect(buf, fields),
        Api::Messages => messages::inspect(buf, fields, ctx),
        // Routed by `crate::decisions`, which reads nothing but `model`.
        Api::Decisions | Api::SystemOne => Ok(Inspection::sticky(None, None)),
    }
}

impl Inspection {
    /// A sticky request's findings.
    fn sticky(content: Option<Affinity>, explicit: Option<(String, AffinitySource)>) -> Self {
        Inspection {
            content,
            explicit,
            sticky: true,
        }
    }
}

/// The fallback key: a prefix of the first `user` message in `messages`.
fn first_user_key(buf: &[u8], messages: Span, ctx: &Context) -> Option<Affinity> {
    let mut key = ContentKey::user_prefix(ctx.alias, ctx.affinity.user_prefix_bytes);
    if !crate::content::feed_first_user(buf, messages, ctx.messages, &mut key) {
        return None;
    }
    key.finish()
}

/// A field that must be present.
fn require(fields: &Fields, field: &'static str) -> Result<Member, GatewayError> {
    fields.get(field).ok_or(GatewayError::MissingField { field })
}

fn invalid(field: &'static str, reason: &str) -> GatewayError {
    GatewayError::InvalidField {
        field,
        reason: reason.to_string(),
    }
}

/// A string member's decoded value.
pub fn string_value<'b>(buf: &'b [u8], m: Member, field: &'static str) -> Result<Cow<'b, str>, GatewayError> {
    if m.kind != Kind::String {
        return Err(invalid(field, "must be a string"));
    }
    nav::str_value(buf, m.value).ok_or_else(|| invalid(field, "must be a string"))
}

/// An explicit id read from a nested string (`conversation.id`, `metadata.user_id`), checked like a session id.
fn explicit_id(
    value: Option<Cow<'_, str>>,
    field: &'static str,
    source: AffinitySource,
) -> Result<Option<(String, AffinitySource)>, GatewayError> {
    let Some(v) = value else { return Ok(None) };
    if v.is_empty() {
        return Ok(None);
    }
    crate::affinity::check_explicit(v.as_bytes()).map_err(|r| invalid(field, r))?;
    Ok(Some((v.into_owned(), source)))
}
