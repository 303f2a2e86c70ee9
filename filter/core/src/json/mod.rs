//! JSON handling for request bodies: a validating one-pass scanner ([`scan_object`]) and allocation-free
//! navigation inside what it validated ([`nav`]).

pub mod nav;
mod scan;
pub mod skip;

pub use scan::{kind_of, scan_object, scan_object_with, JsonError, Kind, Member, Span, Visit};

/// The deepest nesting a request body may have.
pub const MAX_DEPTH: usize = 64;
