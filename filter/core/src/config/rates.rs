//! Rates as the config writes them: `"10-S,600-M"`, amounts per second, minute, hour or day, each unit at most
//! once, and the limits block (`limits:` on an alias, `auth.limits`, per-key limits) they make up.
//!
//! This is config data, so it sits with the config at the bottom of the core: validation parses rates here, and
//! the token buckets that enforce them (`crate::limits`) read the parsed [`Rate`]s.

/// The largest amount one rate may name: 10^10, so `amount × period` fits in 64 bits for a day.
pub const AMOUNT_MAX: u64 = 10_000_000_000;

/// The period of a rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    S,
    M,
    H,
    D,
}

impl Unit {
    pub fn period_ms(self) -> u64 {
        match self {
            Unit::S => 1_000,
            Unit::M => 60_000,
            Unit::H => 3_600_000,
            Unit::D => 86_400_000,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Unit::S => "S",
            Unit::M => "M",
            Unit::H => "H",
            Unit::D => "D",
        }
    }

    fn parse(s: &str) -> Option<Unit> {
        Some(match s {
            "S" => Unit::S,
            "M" => Unit::M,
            "H" => Unit::H,
            "D" => Unit::D,
            _ => return None,
        })
    }
}

/// `amount` per `unit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub amount: u64,
    pub unit: Unit,
}

impl Rate {
    pub(crate) fn capacity(self) -> u64 {
        self.amount.saturating_mul(self.unit.period_ms())
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.amount, self.unit.as_str())
    }
}

/// Parses `"10-S,600-M"`. The error says what is wrong with which part.
pub fn parse_rates(text: &str) -> Result<Vec<Rate>, String> {
    let mut rates: Vec<Rate> = Vec::new();
    for part in text.split(',').map(str::trim) {
        let Some((n, u)) = part.split_once('-') else {
            return Err(format!("`{part}` is not AMOUNT-UNIT, such as 10-S or 600-M"));
        };
        let unit = Unit::parse(u.trim()).ok_or_else(|| format!("`{part}`: the unit must be S, M, H or D"))?;
        let amount = n
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|a| (1..=AMOUNT_MAX).contains(a))
            .ok_or_else(|| format!("`{part}`: the amount must be a whole number from 1 to {AMOUNT_MAX}"))?;
        if rates.iter().any(|r| r.unit == unit) {
            return Err(format!("the unit {} appears twice", unit.as_str()));
        }
        rates.push(Rate { amount, unit });
    }
    Ok(rates)
}

/// A request's limits, as configured on an alias or for every key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimits {
    pub requests: Vec<Rate>,
    pub tokens: Vec<Rate>,
    /// Output tokens reserved for a request that names no `max_tokens`.
    pub default_max_tokens: u64,
    /// Write the output bound into a request that names none (see `limits::output_to_inject`).
    pub inject_max_tokens: bool,
}

/// Default `default_max_tokens`.
pub const DEFAULT_MAX_TOKENS: u64 = 1024;
