//! The top-level fields the gateway reads, found once, with duplicates refused.
//!
//! If a body carried `model` twice, or `model` and `MODEL`, the gateway and the engine could each act on a
//! different one (JSON parsers differ: first wins, last wins, or case-insensitive match). So every field the
//! gateway reads must appear exactly once in any letter case. Fields it does not read are not its business.

use crate::error::GatewayError;
use crate::json::{nav, Member};

/// Every field any endpoint reads. Their duplicates are refused on all endpoints.
pub const READ_FIELDS: [&str; 9] = [
    "model",
    "stream",
    "messages",
    "input",
    "prompt",
    "max_tokens",
    "system",
    "instructions",
    "prompt_cache_key",
];

/// The read fields of one body, each at most once, exact letter case.
#[derive(Debug, Clone, Default)]
pub struct Fields {
    found: [Option<Member>; READ_FIELDS.len()],
}

impl Fields {
    /// The member for `name`, one of [`READ_FIELDS`], if the body has it in exactly that case.
    pub fn get(&self, name: &str) -> Option<Member> {
        let i = READ_FIELDS.iter().position(|f| *f == name)?;
        self.found.get(i).copied().flatten()
    }
}

/// Picks the read fields out of the top-level members.
pub fn read_fields(buf: &[u8], members: &[Member]) -> Result<Fields, GatewayError> {
    let mut fields = Fields::default();
    let mut seen = [false; READ_FIELDS.len()];
    for m in members {
        let Some(key) = nav::str_value(buf, m.key) else {
            continue;
        };
        let Some(i) = READ_FIELDS.iter().position(|f| f.eq_ignore_ascii_case(&key)) else {
            continue;
        };
        if seen[i] {
            return Err(GatewayError::DuplicateField { field: READ_FIELDS[i] });
        }
        seen[i] = true;
        if key == READ_FIELDS[i] {
            fields.found[i] = Some(*m);
        }
    }
    Ok(fields)
}
