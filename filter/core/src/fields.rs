//! The top-level fields the gateway reads, found once, with duplicates refused.
//!
//! If a body carried `model` twice, or `model` and `MODEL`, the gateway and the engine could each act on a
//! different one (JSON parsers differ: first wins, last wins, or case-insensitive match). So every field the
//! gateway reads must appear exactly once in any letter case. Fields it does not read are not its business.

use crate::error::GatewayError;
use crate::json::{nav, Member};

/// Every field any endpoint reads. Their duplicates are refused on all endpoints.
pub const READ_FIELDS: [&str; 13] = [
    "model",
    "stream",
    "messages",
    "input",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "system",
    "instructions",
    "prompt_cache_key",
    "conversation",
    "metadata",
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
        let slot = READ_FIELDS
            .iter()
            .zip(seen.iter_mut())
            .zip(fields.found.iter_mut())
            .find(|((field, _), _)| folds_to(&key, field));
        let Some(((&field, seen), found)) = slot else {
            continue;
        };
        if *seen {
            return Err(GatewayError::DuplicateField { field });
        }
        *seen = true;
        if key == field {
            *found = Some(*m);
        }
    }
    Ok(fields)
}

/// True when `key` equals the ASCII field name `field` under Unicode simple case folding.
pub(crate) fn folds_to(key: &str, field: &str) -> bool {
    let mut chars = key.chars();
    for f in field.bytes() {
        let folded = match chars.next() {
            Some('\u{17f}') => 's',
            Some('\u{212a}') => 'k',
            Some(c) => c.to_ascii_lowercase(),
            None => return false,
        };
        if folded != f.to_ascii_lowercase() as char {
            return false;
        }
    }
    chars.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::folds_to;

    #[test]
    fn folding_matches_go_encoding_json() {
        assert!(folds_to("model", "model"));
        assert!(folds_to("MODEL", "model"));
        assert!(folds_to("meſſages", "messages"));
        assert!(folds_to("max_to\u{212a}ens", "max_tokens"));
        assert!(!folds_to("models", "model"));
        assert!(!folds_to("mode", "model"));
        assert!(!folds_to("modél", "model"));
    }
}
