//! `POST /v1/completions`: `prompt` must be present (a string, or an array of strings or of token ids).
//! There is no system prompt, so the content key is a bounded prefix of the prompt: of the string, of the token
//! array (by its JSON text), or of the first element of a batch.

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
        match nav::kind(buf, span) {
            Some(Kind::String) => {
                if let Some(text) = nav::str_prefix(buf, span, key.room()) {
                    key.feed(&text);
                }
            }
            // A prompt of token ids is one array of numbers: its prefix is the start of that array. A batch of
            // token prompts is an array of arrays: the start of the first.
            Some(Kind::Number) => feed_raw(buf, prompt.value, &mut key),
            _ => feed_raw(buf, span, &mut key),
        }
    }
    Ok(Inspection::sticky(key.finish(), None))
}

/// Feeds the JSON text of `span` (token ids and separators), bounded like any prefix.
fn feed_raw(buf: &[u8], span: crate::json::Span, key: &mut ContentKey) {
    key.feed(std::str::from_utf8(span.of(buf)).unwrap_or_default());
}
