//! `POST /v1/completions`: `prompt` must be present (a string, or an array of strings or of token ids).
//! There is no system prompt, so the content key is a bounded prefix of the prompt (of its first element when
//! it is an array; token ids count by their JSON text).

use super::{invalid, require, Context, Inspection};
use crate::affinity::ContentKey;
use crate::error::GatewayError;
use crate::fields::Fields;
use crate::json::{nav, Kind};

pub fn inspect(buf: &[u8], fields: &Fields, ctx: &Context) -> Result<Inspection, GatewayError> {
    let prompt = require(fields, "prompt")?;
    let first = match prompt.kind {
        Kind::String => Some(prompt.value),
        Kind::Array => {
            let first = nav::array_items(buf, prompt.value).next();
            if first.is_none() {
                return Err(invalid("prompt", "must not be an empty array"));
            }
            first
        }
        _ => return Err(invalid("prompt", "must be a string or an array")),
    };
    let mut key = ContentKey::user_prefix(ctx.alias, ctx.affinity.user_prefix_bytes);
    if let Some(span) = first {
        match nav::str_value(buf, span) {
            Some(text) => key.feed(&text),
            None => key.feed(std::str::from_utf8(span.of(buf)).unwrap_or_default()),
        };
    }
    Ok(Inspection {
        content: key.finish(),
        explicit: None,
        sticky: true,
    })
}
