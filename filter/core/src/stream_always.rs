//! `models[].stream_upstream: always`: which requests go upstream streamed although the client did not ask,
//! and the minimal body edits that make them so.
//!
//! Only chat and responses requests are converted, and only when the client did not send `stream: true`. The
//! edits are splices like the `model` rewrite, so every other byte reaches the engine as sent:
//! - a `stream` member (`false`, `null`, or anything but `true`) gets the value `true`; a body without one gets
//!   `,"stream":true` before its closing brace;
//! - a chat body without `stream_options` (in any letter case) also gets
//!   `,"stream_options":{"include_usage":true}`, so the stream reports the usage the rebuilt answer carries.
//!
//! The response is then rebuilt into one JSON answer by [`crate::stream::assemble`]. Cost: one pass over the
//! top-level members, already scanned by the route decision.

use crate::endpoint::Api;
use crate::json::Member;
use crate::patch::{Edit, INCLUDE_USAGE};

/// The value a converted request's `stream` member gets, and the member added when there is none.
const STREAM_TRUE: &str = "true";
const ADD_STREAM: &str = ",\"stream\":true";

/// The edits that send this request upstream streamed; `None` when it is left as sent (another API, or the
/// client already streams). `stream` is the body's `stream` member; `has_options` tells whether the body has
/// `stream_options` in any letter case.
pub(crate) fn edits(api: Api, body: &[u8], stream: Option<Member>, has_options: bool) -> Option<Vec<Edit>> {
    if !matches!(api, Api::Chat | Api::Responses) {
        return None;
    }
    if stream.is_some_and(|m| m.value.of(body) == STREAM_TRUE.as_bytes()) {
        return None;
    }
    let close = body.iter().rposition(|&b| b == b'}')?;
    let mut edits = Vec::new();
    let mut insert = String::new();
    match stream {
        Some(m) => edits.push(Edit {
            span: m.value,
            text: STREAM_TRUE.to_string(),
        }),
        None => insert.push_str(ADD_STREAM),
    }
    if api == Api::Chat && !has_options {
        insert.push_str(INCLUDE_USAGE);
    }
    if !insert.is_empty() {
        edits.push(Edit::insert(close, &insert));
    }
    Some(edits)
}
