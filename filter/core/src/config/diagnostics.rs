//! The one accumulator of config problems. Every check writes here: an error refuses the file, a warning lets it
//! load and is printed by `llmroute validate` (a setting that would silently do nothing). Each names the field,
//! the value as written, and the reason with its fix.

use super::ConfigError;

/// Errors and warnings found so far, in the order the checks ran.
#[derive(Debug, Default)]
pub struct Diagnostics {
    pub errors: Vec<ConfigError>,
    pub warnings: Vec<ConfigError>,
}

fn problem(field: impl Into<String>, value: impl ToString, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

impl Diagnostics {
    /// Records an error: the file is refused.
    pub fn push(&mut self, field: impl Into<String>, value: impl ToString, reason: impl Into<String>) {
        self.errors.push(problem(field, value, reason));
    }

    /// Records a warning: the file loads.
    pub fn warn(&mut self, field: impl Into<String>, value: impl ToString, reason: impl Into<String>) {
        self.warnings.push(problem(field, value, reason));
    }

    /// Records an error unless `lo <= v <= hi`.
    pub fn range(&mut self, field: &str, v: u64, lo: u64, hi: u64) {
        if !(lo..=hi).contains(&v) {
            self.push(field, v, format!("must be between {lo} and {hi}"));
        }
    }
}
