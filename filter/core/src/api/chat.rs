//! `POST /v1/chat/completions`: `messages` must be a non-empty array. The content key is the leading
//! `system`/`developer` messages, else a prefix of the first `user` message.

use super::{invalid, require, Context, Inspection};
use crate::affinity::ContentKey;
use crate::content::{feed_leading, feed_message, first_user, is_non_empty_array};
use crate::error::GatewayError;
use crate::fields::Fields;

pub fn inspect(buf: &[u8], fields: &Fields, ctx: &Context) -> Result<Inspection, GatewayError> {
    let messages = require(fields, "messages")?.value;
    if !is_non_empty_array(buf, messages) {
        return Err(invalid("messages", "must be a non-empty array"));
    }
    let mut system = ContentKey::system(ctx.alias);
    feed_leading(buf, messages, &["system", "developer"], &mut system);
    let content = system.finish().or_else(|| {
        let msg = first_user(buf, messages)?;
        let mut key = ContentKey::user_prefix(ctx.alias, ctx.affinity.user_prefix_bytes);
        feed_message(buf, msg, &mut key);
        key.finish()
    });
    Ok(Inspection {
        content,
        explicit: None,
        sticky: true,
    })
}
