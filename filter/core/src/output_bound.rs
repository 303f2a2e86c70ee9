//! The output bound the gateway writes into a request that names none, when a limits block asks for it
//! (`inject_max_tokens`; the amount is [`crate::limits::output_to_inject`]'s).
//!
//! Without a bound, an engine may generate until its context is full, and the token budget learns of it only
//! when the usage comes back. With one, the engine stops there, so a request costs at most what was reserved.
//! The field is the API's own: `max_tokens` on chat, completions and messages (where it is required anyway),
//! `max_output_tokens` on Responses; embeddings and the decision routes take none. It is written as one member
//! before the body's closing brace, or in place of the field's `null`; every other byte stays as sent. A copy of
//! the field in another letter case is left alone and nothing is written: an engine might read either copy.
//!
//! The amount is also capped by the context the engines have left after the input (`max_context` of every
//! backend the request may reach), since an engine such as vLLM refuses a bound past its context.

use crate::config::{Config, ModelAlias};
use crate::endpoint::Api;
use crate::fields::folds_to;
use crate::json::{nav, Kind, Member, Span};
use crate::patch::Edit;
use crate::route_choice::RouteChoice;

/// The API's output-bound field, if it takes one.
pub fn field(api: Api) -> Option<&'static str> {
    match api {
        Api::Chat | Api::Completions | Api::Messages => Some("max_tokens"),
        Api::Responses => Some("max_output_tokens"),
        Api::Embeddings | Api::Decisions | Api::SystemOne => None,
    }
}

/// The edit that sets `field` to `n` in a body whose top-level `members` name no bound: the field's `null`
/// replaced, else a member added before the closing brace. `None` when the field is there with a value, or in
/// another letter case.
pub(crate) fn edit(body: &[u8], members: &[Member], field: &'static str, n: u64) -> Option<Edit> {
    let present = members
        .iter()
        .find(|m| nav::str_value(body, m.key).is_some_and(|k| folds_to(&k, field)));
    match present {
        Some(m) if m.kind == Kind::Null && nav::key_eq(body, m.key, field) => Some(Edit {
            span: m.value,
            text: n.to_string(),
        }),
        Some(_) => None,
        None => {
            let at = body.iter().rposition(|&b| b == b'}')?;
            Some(Edit {
                span: Span { start: at, end: at },
                text: format!(",\"{field}\":{n}"),
            })
        }
    }
}

/// The most output tokens every engine the request may reach has room for after `input` tokens: the smallest
/// `max_context` of the chosen backend (of every route's, on a failover cluster), less the input. `u64::MAX` when
/// none declares one.
pub fn context_room(cfg: &Config, alias: &ModelAlias, choice: &RouteChoice, input: u64) -> u64 {
    let limit = match choice.failover {
        true => alias
            .routes
            .iter()
            .filter_map(|r| cfg.backend(r.backend).and_then(|b| b.max_context))
            .min(),
        false => choice.backend.max_context,
    };
    limit.map_or(u64::MAX, |l| u64::from(l).saturating_sub(input))
}
