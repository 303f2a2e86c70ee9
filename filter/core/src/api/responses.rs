//! `POST /v1/responses`: `input` must be present (a string or an array of items). The content key is
//! `instructions`, else a prefix of the first input item (the string input itself, or the first item's text).
//! With `affinity.conversation_id`, the `conversation` id (a string or `{"id": ...}`) is an explicit key.

use super::{explicit_id, invalid, require, string_value, Context, Inspection};
use crate::affinity::{AffinitySource, ContentKey};
use crate::content::{feed_content, feed_message};
use crate::error::GatewayError;
use crate::fields::Fields;
use crate::json::{nav, Kind};

pub fn inspect(buf: &[u8], fields: &Fields, ctx: &Context) -> Result<Inspection, GatewayError> {
    let input = require(fields, "input")?;
    if !matches!(input.kind, Kind::String | Kind::Array) {
        return Err(invalid("input", "must be a string or an array of input items"));
    }
    let mut system = ContentKey::system(ctx.alias);
    if let Some(m) = fields.get("instructions").filter(|m| m.kind != Kind::Null) {
        system.feed(&string_value(buf, m, "instructions")?);
    }
    let content = system.finish().or_else(|| {
        let mut key = ContentKey::user_prefix(ctx.alias, ctx.affinity.user_prefix_bytes);
        match input.kind {
            Kind::String => feed_content(buf, input.value, &mut key),
            _ => {
                let item = nav::array_items(buf, input.value).next()?;
                match nav::kind(buf, item) {
                    Some(Kind::String) => feed_content(buf, item, &mut key),
                    _ => feed_message(buf, item, &mut key),
                }
            }
        }
        key.finish()
    });
    let explicit = if ctx.affinity.conversation_id {
        conversation(buf, fields)?
    } else {
        None
    };
    Ok(Inspection::sticky(content, explicit))
}

fn conversation(buf: &[u8], fields: &Fields) -> Result<Option<(String, AffinitySource)>, GatewayError> {
    let Some(c) = fields.get("conversation") else {
        return Ok(None);
    };
    let value = match c.kind {
        Kind::String => nav::str_value(buf, c.value),
        Kind::Object => nav::get(buf, c.value, "id").and_then(|v| nav::str_value(buf, v)),
        _ => None,
    };
    explicit_id(value, "conversation", AffinitySource::Conversation)
}
