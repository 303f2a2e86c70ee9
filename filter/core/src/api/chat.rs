//! `POST /v1/chat/completions`: `messages` must be a non-empty array. The content key is the leading
//! `system`/`developer` messages, else a prefix of the first `user` message.

use super::{first_user_key, invalid, require, Context, Inspection};
use crate::affinity::ContentKey;
use crate::content::{feed_leading, is_non_empty_array};
use crate::error::GatewayError;
use crate::fields::Fields;

pub fn inspect(buf: &[u8], fields: &Fields, ctx: &Context) -> Result<Inspection, GatewayError> {
    let messages = require(fields, "messages")?.value;
    if !is_non_empty_array(buf, messages, ctx.messages) {
        return Err(invalid("messages", "must be a non-empty array"));
    }
    let mut system = ContentKey::system(ctx.alias);
    feed_leading(buf, messages, ctx.messages, &["system", "developer"], &mut system);
    let content = system.finish().or_else(|| first_user_key(buf, messages, ctx));
    Ok(Inspection::sticky(content, None))
}
