//! `POST /v1/embeddings`: `input` must be a non-empty string or a non-empty array of at most 2048 entries.
//! Embeddings have no reusable prefix state worth pinning, so they are never sticky: Envoy spreads them.

use super::{invalid, require, Inspection};
use crate::error::GatewayError;
use crate::fields::Fields;
use crate::json::{nav, Kind};

/// The most inputs one embeddings request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

pub fn inspect(buf: &[u8], fields: &Fields) -> Result<Inspection, GatewayError> {
    let input = require(fields, "input")?;
    match input.kind {
        Kind::String if input.value.len() > 2 => {}
        Kind::String => return Err(invalid("input", "must not be empty")),
        Kind::Array => {
            let n = nav::array_items(buf, input.value).take(MAX_INPUTS + 1).count();
            if n == 0 {
                return Err(invalid("input", "must not be an empty array"));
            }
            if n > MAX_INPUTS {
                return Err(invalid("input", "must have at most 2048 entries"));
            }
        }
        _ => return Err(invalid("input", "must be a string or an array")),
    }
    Ok(Inspection::default())
}
