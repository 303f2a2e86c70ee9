//! `POST /v1/messages` (Anthropic): `max_tokens` must be a positive integer and `messages` a non-empty array.
//! The content key is the top-level `system` (a string or text blocks), else a prefix of the first user
//! message. With `affinity.anthropic_user_id`, `metadata.user_id` is an explicit key.

use super::{explicit_id, first_user_key, invalid, require, Context, Inspection};
use crate::affinity::{AffinitySource, ContentKey};
use crate::content::{feed_content, is_non_empty_array};
use crate::error::GatewayError;
use crate::fields::Fields;
use crate::json::{nav, Kind};

pub fn inspect(buf: &[u8], fields: &Fields, ctx: &Context) -> Result<Inspection, GatewayError> {
    let max_tokens = require(fields, "max_tokens")?;
    let positive = max_tokens.kind == Kind::Number
        && std::str::from_utf8(max_tokens.value.of(buf)).is_ok_and(|n| n.parse::<u64>().is_ok_and(|v| v > 0));
    if !positive {
        return Err(invalid("max_tokens", "must be a positive integer"));
    }
    let messages = require(fields, "messages")?.value;
    if !is_non_empty_array(buf, messages, ctx.messages) {
        return Err(invalid("messages", "must be a non-empty array"));
    }
    let mut system = ContentKey::system(ctx.alias);
    if let Some(s) = fields.get("system") {
        if !matches!(s.kind, Kind::String | Kind::Array | Kind::Null) {
            return Err(invalid("system", "must be a string or an array of text blocks"));
        }
        feed_content(buf, s.value, &mut system);
    }
    let content = system.finish().or_else(|| first_user_key(buf, messages, ctx));
    let explicit = if ctx.affinity.anthropic_user_id {
        user_id(buf, fields)?
    } else {
        None
    };
    Ok(Inspection::sticky(content, explicit))
}

fn user_id(buf: &[u8], fields: &Fields) -> Result<Option<(String, AffinitySource)>, GatewayError> {
    let Some(metadata) = fields.get("metadata") else {
        return Ok(None);
    };
    if metadata.kind != Kind::Object {
        return Ok(None);
    }
    let value = nav::get(buf, metadata.value, "user_id").and_then(|v| nav::str_value(buf, v));
    explicit_id(value, "metadata", AffinitySource::UserId)
}
