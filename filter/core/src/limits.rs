//! Request and token limits: the rate syntax, token buckets with continuous refill, and all-or-nothing admission
//! over several buckets kept in Envoy's shared data.
//!
//! **Syntax.** `"10-S,600-M"`: amounts per second, minute, hour or day, each unit at most once. Every rate is its
//! own bucket, and a request must fit all of them.
//!
//! **Arithmetic.** A bucket of `amount` per `period` ms holds up to `amount × period` *units*; one token costs
//! `period` units, and every elapsed millisecond adds `amount` units. So refill is continuous and exact in
//! integers: no rounding ever gives away or loses a token. A bucket's state is 16 bytes, the level in units
//! (signed: below zero while in debt, see **Tokens**) and the time of the last update in ms; a clock that goes back
//! refills nothing. [`Bucket::take`] refuses when the
//! level is short and says how long until it is not (`retry_after_ms`).
//!
//! **Exactness across workers.** Each bucket is one shared-data entry written with compare-and-swap: read the
//! state and its version, compute, write with that version. A mismatch means another worker wrote in between,
//! so the step is redone from a fresh read; nothing is applied twice or lost. [`CAS_ATTEMPTS`] bounds the
//! retries: every mismatch is another writer's success, and with a handful of workers per Envoy losing that many
//! races in a row does not happen in practice. If it ever does, the request is refused as `limit_contention`
//! (fail closed) after giving back what it took, and counted.
//!
//! **Failed reads.** A read the host fails is told apart from an absent entry ([`BucketStore::read`]). It never
//! counts as a full bucket: admission refuses the request as `limit_unavailable` (fail closed), and a settlement
//! step is skipped, so the bucket keeps the state it had. An absent entry is a bucket never used (all are seeded
//! at configure time, and shared data is never deleted), so it starts full; an entry that does not decode starts
//! empty.
//!
//! **Several buckets.** [`admit`] takes from each bucket in order; when one refuses, what was taken from the
//! others is given back, so a refused request holds nothing. Meanwhile another request may briefly see those
//! buckets lower and be refused; it is never admitted beyond a budget.
//!
//! **Tokens.** Admission reserves `input estimate + max_tokens` (or the block's `default_max_tokens`). When the
//! engine reports usage, [`settle`] moves each token bucket by `reserved − used`: unused tokens go back, and an
//! overrun is charged in full. A bucket may so fall below empty: the debt is carried, no request of that budget
//! is admitted until refill has repaid it, and the refusal's `retry_after_ms` counts the repayment. Without usage
//! (a cut stream) the reservation stays.

pub use crate::config::rates::{parse_rates, Rate, RateLimits, Unit, AMOUNT_MAX, DEFAULT_MAX_TOKENS};
use crate::config::Config;

/// Compare-and-swap tries for one bucket step before the request is refused as contention.
pub const CAS_ATTEMPTS: usize = 1000;

/// One bucket's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// In units: a token is `period_ms` units. Below zero while the bucket is in debt (an engine used more than
    /// was reserved); it then refills from there.
    pub level: i64,
    pub updated_ms: u64,
}

/// `n` as an `i64`, saturating.
fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Bucket {
    /// A full bucket at `now_ms`.
    pub fn full(rate: Rate, now_ms: u64) -> Bucket {
        Bucket {
            level: signed(rate.capacity()),
            updated_ms: now_ms,
        }
    }

    /// 16 bytes: the level (two's complement), then the update time, both little-endian. A level written by a
    /// version that kept it unsigned reads the same: no capacity reaches 2^63.
    pub fn encode(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.level.to_le_bytes());
        out[8..].copy_from_slice(&self.updated_ms.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Bucket> {
        let level = i64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        let updated_ms = u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?);
        (bytes.len() == 16).then_some(Bucket { level, updated_ms })
    }

    /// The state at `now_ms`, refilled; never past capacity (also after the rate was lowered).
    pub fn refilled(self, rate: Rate, now_ms: u64) -> Bucket {
        let elapsed = now_ms.saturating_sub(self.updated_ms);
        Bucket {
            level: self
                .level
                .saturating_add(signed(elapsed.saturating_mul(rate.amount)))
                .min(signed(rate.capacity())),
            updated_ms: self.updated_ms.max(now_ms),
        }
    }

    /// Whole tokens available at `now_ms`: 0 while in debt.
    pub fn tokens(self, rate: Rate, now_ms: u64) -> u64 {
        self.refilled(rate, now_ms).whole_tokens(rate)
    }

    /// Whole tokens in the bucket as it stands: 0 while in debt.
    fn whole_tokens(self, rate: Rate) -> u64 {
        // A period is never 0 ms; a checked division keeps the compiler's guard on the wasm path.
        u64::try_from(self.level)
            .unwrap_or(0)
            .checked_div(rate.unit.period_ms())
            .unwrap_or(0)
    }

    /// Takes `n` tokens at `now_ms`, or says in how many ms they will be there: more than a period when `n`
    /// exceeds the whole bucket, and the time to repay any debt first.
    pub fn take(self, rate: Rate, now_ms: u64, n: u64) -> Result<Bucket, u64> {
        let b = self.refilled(rate, now_ms);
        let cost = signed(n.saturating_mul(rate.unit.period_ms()));
        if b.level >= cost {
            return Ok(Bucket {
                level: b.level.saturating_sub(cost),
                ..b
            });
        }
        let short = u64::try_from(i128::from(cost).saturating_sub(i128::from(b.level))).unwrap_or(u64::MAX);
        Err(short.div_ceil(rate.amount.max(1)))
    }

    /// Gives `n` tokens back (up to capacity) or, with `charge`, takes `n` more: below empty when the bucket does
    /// not hold them, so an overrun is a debt that later refill repays, never forgiven.
    pub fn adjust(self, rate: Rate, now_ms: u64, n: u64, charge: bool) -> Bucket {
        let b = self.refilled(rate, now_ms);
        let units = signed(n.saturating_mul(rate.unit.period_ms()));
        let level = if charge {
            b.level.saturating_sub(units)
        } else {
            b.level.saturating_add(units).min(signed(rate.capacity()))
        };
        Bucket { level, ..b }
    }
}

/// What a bucket counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Requests,
    Tokens,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Requests => "requests",
            Kind::Tokens => "tokens",
        }
    }
}

/// Whose budget a bucket is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Alias,
    Key,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Alias => "alias",
            Scope::Key => "key",
        }
    }
}

/// One bucket a request must fit, with what it takes from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub scope: Scope,
    /// The alias or key name (config-defined).
    pub name: String,
    pub kind: Kind,
    pub rate: Rate,
    pub amount: u64,
}

impl Charge {
    /// The shared-data key: `llmroute.limit.<scope>.<name>.<kind>.<unit>`, config-defined names only.
    pub fn key(&self) -> String {
        bucket_key(self.scope, &self.name, self.kind, self.rate.unit)
    }
}

pub fn bucket_key(scope: Scope, name: &str, kind: Kind, unit: Unit) -> String {
    format!(
        "llmroute.limit.{}.{name}.{}.{}",
        scope.as_str(),
        kind.as_str(),
        unit.as_str()
    )
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// A bucket is short: which one, and in how many ms it will not be.
    Limited {
        scope: Scope,
        name: String,
        kind: Kind,
        retry_after_ms: u64,
    },
    /// [`CAS_ATTEMPTS`] writes in a row lost their race.
    Contention,
    /// The host failed a read of a bucket: refused rather than guessed (fail closed).
    Unreadable,
}

/// The host failed a read of shared data (as opposed to finding no entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadFailed;

/// Where the buckets live: Envoy's shared data, with its compare-and-swap versions.
pub trait BucketStore {
    /// The entry and its version; `Ok((None, _))` when there is no entry, `Err` when the host failed the read.
    fn read(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), ReadFailed>;
    /// Writes the entry; with `cas`, only if nobody wrote since that version. False when it was not written.
    fn write(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> bool;
}

/// Why a bucket step did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepFailed<E> {
    /// The step's own refusal.
    Refused(E),
    /// [`CAS_ATTEMPTS`] writes in a row lost their race.
    Contention,
    /// The host could not read the entry.
    Unreadable,
}

/// The state a read gives. No entry: a full bucket (every bucket is seeded at configure time and shared data is
/// never deleted, so an absent entry is one never used). An entry that does not decode: an empty bucket, which
/// refills; never a full one, so no read can hand out a budget that was spent.
fn current(bytes: Option<&[u8]>, rate: Rate, now_ms: u64) -> Bucket {
    match bytes {
        None => Bucket::full(rate, now_ms),
        Some(b) => Bucket::decode(b).unwrap_or(Bucket {
            level: 0,
            updated_ms: now_ms,
        }),
    }
}

/// One compare-and-swap step on a bucket: `f` maps the current state to the new state or a refusal. A read the
/// host fails is no state at all: the step fails closed rather than start from a full bucket.
fn cas_step<E>(
    store: &mut impl BucketStore,
    key: &str,
    rate: Rate,
    now_ms: u64,
    f: impl Fn(Bucket) -> Result<Bucket, E>,
) -> Result<Bucket, StepFailed<E>> {
    for _ in 0..CAS_ATTEMPTS {
        let (bytes, cas) = store.read(key).map_err(|ReadFailed| StepFailed::Unreadable)?;
        let next = f(current(bytes.as_deref(), rate, now_ms)).map_err(StepFailed::Refused)?;
        if store.write(key, &next.encode(), cas) {
            return Ok(next);
        }
    }
    Err(StepFailed::Contention)
}

/// Takes every charge, or none: on a refusal what was taken is given back. `Ok` holds the whole tokens each
/// bucket has left, in the order of `charges`.
pub fn admit(store: &mut impl BucketStore, charges: &[Charge], now_ms: u64) -> Result<Vec<u64>, Denied> {
    let mut left = Vec::with_capacity(charges.len());
    for (i, c) in charges.iter().enumerate() {
        let step = cas_step(store, &c.key(), c.rate, now_ms, |b| b.take(c.rate, now_ms, c.amount));
        let denied = match step {
            Ok(b) => {
                left.push(b.whole_tokens(c.rate));
                continue;
            }
            Err(StepFailed::Contention) => Denied::Contention,
            Err(StepFailed::Unreadable) => Denied::Unreadable,
            Err(StepFailed::Refused(retry_after_ms)) => Denied::Limited {
                scope: c.scope,
                name: c.name.clone(),
                kind: c.kind,
                retry_after_ms,
            },
        };
        for taken in charges.get(..i).unwrap_or_default() {
            give(store, taken, taken.amount, false, now_ms);
        }
        return Err(denied);
    }
    Ok(left)
}

/// Moves one bucket by `n` tokens: back (`charge` false) or further down. False on contention or a failed read
/// (the adjustment is then lost, and the bucket keeps the state it had; see the module doc).
pub fn give(store: &mut impl BucketStore, c: &Charge, n: u64, charge: bool, now_ms: u64) -> bool {
    if n == 0 {
        return true;
    }
    let step = cas_step::<()>(store, &c.key(), c.rate, now_ms, |b| {
        Ok(b.adjust(c.rate, now_ms, n, charge))
    });
    step.is_ok()
}

/// Settles the token charges of an admitted request on the `used` tokens the engine reported.
pub fn settle(store: &mut impl BucketStore, charges: &[Charge], used: u64, now_ms: u64) {
    for c in charges.iter().filter(|c| c.kind == Kind::Tokens) {
        if used < c.amount {
            give(store, c, c.amount.saturating_sub(used), false, now_ms);
        } else {
            give(store, c, used.saturating_sub(c.amount), true, now_ms);
        }
    }
}

/// The charges `limits` puts on a request for `name` in `scope` that reserves `tokens`.
pub fn charges(limits: &RateLimits, scope: Scope, name: &str, input: u64, max_output: Option<u64>) -> Vec<Charge> {
    let tokens = input.saturating_add(max_output.unwrap_or(limits.default_max_tokens));
    let one = |kind, rate, amount| Charge {
        scope,
        name: name.to_string(),
        kind,
        rate,
        amount,
    };
    let requests = limits.requests.iter().map(|&r| one(Kind::Requests, r, 1));
    requests
        .chain(limits.tokens.iter().map(|&r| one(Kind::Tokens, r, tokens)))
        .collect()
}

/// The limits blocks that charge a request for `alias` by `key` (when auth is on): the alias's, then the key's.
pub fn blocks<'c>(
    cfg: &'c Config,
    alias: &'c str,
    key: Option<&'c str>,
) -> [Option<(Scope, &'c str, &'c RateLimits)>; 2] {
    let by_alias = cfg
        .alias(alias)
        .and_then(|a| a.limits.as_ref())
        .map(|l| (Scope::Alias, alias, l));
    let by_key = match (cfg.auth.as_ref(), key) {
        (Some(a), Some(k)) => a.limits_for(k).map(|l| (Scope::Key, k, l)),
        _ => None,
    };
    [by_alias, by_key]
}

/// The charges an inference request by `key` takes when its headers arrive, before its body is read: the
/// request rates of the key's budget. A key over its request limit is so refused at once, its body never
/// buffered; its token rates, and the alias's limits, wait for the body ([`body_charges`]).
pub fn header_charges(cfg: &Config, key: &str) -> Vec<Charge> {
    let Some(l) = cfg.auth.as_ref().and_then(|a| a.limits_for(key)) else {
        return Vec::new();
    };
    l.requests
        .iter()
        .map(|&rate| Charge {
            scope: Scope::Key,
            name: key.to_string(),
            kind: Kind::Requests,
            rate,
            amount: 1,
        })
        .collect()
}

/// The charges an inference request for `alias` by `key` (when auth is on) takes once its body is read: the
/// alias's limits, then the key's token rates (its request rates were taken at the headers, [`header_charges`]).
/// `input` is the gateway's estimate; `max_output` what the request asks for.
pub fn body_charges(cfg: &Config, alias: &str, key: Option<&str>, input: u64, max_output: Option<u64>) -> Vec<Charge> {
    let mut out = Vec::new();
    for (scope, name, l) in blocks(cfg, alias, key).into_iter().flatten() {
        let later = |c: &Charge| scope == Scope::Alias || c.kind == Kind::Tokens;
        out.extend(charges(l, scope, name, input, max_output).into_iter().filter(later));
    }
    out
}

/// The output bound the gateway writes into a request for `alias` by `key` that names none, when a block that
/// charges it sets `inject_max_tokens`: the smallest `default_max_tokens` of those blocks, capped by the whole
/// tokens each token bucket that charges the request has left after the `input` estimate, and at least 1 (a
/// budget too short even for that refuses the request as it would any other). `left` reads a bucket's whole
/// tokens now, by its shared-data key; `None` (a failed read) caps nothing, and admission then refuses.
/// `None` when no block asks for a bound.
pub fn output_to_inject(
    cfg: &Config,
    alias: &str,
    key: Option<&str>,
    input: u64,
    mut left: impl FnMut(&str, Rate) -> Option<u64>,
) -> Option<u64> {
    let blocks = blocks(cfg, alias, key);
    let asked = blocks
        .iter()
        .flatten()
        .filter(|(_, _, l)| l.inject_max_tokens)
        .map(|(_, _, l)| l.default_max_tokens)
        .min()?;
    let mut bound = asked;
    for (scope, name, l) in blocks.iter().flatten() {
        for rate in &l.tokens {
            if let Some(n) = left(&bucket_key(*scope, name, Kind::Tokens, rate.unit), *rate) {
                bound = bound.min(n.saturating_sub(input));
            }
        }
    }
    Some(bound.max(1))
}

/// Whole tokens a bucket holds at `now_ms`, read from `store`; `None` when the host failed the read.
pub fn tokens_left(store: &impl BucketStore, key: &str, rate: Rate, now_ms: u64) -> Option<u64> {
    let (bytes, _) = store.read(key).ok()?;
    Some(current(bytes.as_deref(), rate, now_ms).tokens(rate, now_ms))
}

/// Every bucket `cfg` can use, for the key names in `keys`: seeded full at start so later writes can all use
/// compare-and-swap (a first write to a missing entry cannot).
pub fn all_buckets<'a>(cfg: &Config, keys: impl Iterator<Item = &'a str>) -> Vec<(String, Rate)> {
    let mut out = Vec::new();
    let mut add = |scope, name: &str, l: &RateLimits| {
        for (kind, rates) in [(Kind::Requests, &l.requests), (Kind::Tokens, &l.tokens)] {
            out.extend(rates.iter().map(|r| (bucket_key(scope, name, kind, r.unit), *r)));
        }
    };
    for a in &cfg.models {
        if let Some(l) = &a.limits {
            add(Scope::Alias, &a.name, l);
        }
    }
    if let Some(a) = &cfg.auth {
        for k in keys {
            if let Some(l) = a.limits_for(k) {
                add(Scope::Key, k, l);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PER_S: Rate = Rate {
        amount: 10,
        unit: Unit::S,
    };

    #[test]
    fn syntax() {
        assert_eq!(
            parse_rates("10-S, 600-M").unwrap(),
            vec![
                PER_S,
                Rate {
                    amount: 600,
                    unit: Unit::M
                }
            ]
        );
        for bad in ["", "10", "10-s", "0-S", "x-S", "10-S,5-S", "-1-S", "10000000001-D"] {
            assert!(parse_rates(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn refill_is_continuous_and_capped() {
        let b = Bucket::full(PER_S, 0);
        let b = b.take(PER_S, 0, 10).unwrap();
        assert_eq!(b.take(PER_S, 0, 1), Err(100));
        assert_eq!(b.tokens(PER_S, 99), 0);
        assert_eq!(b.tokens(PER_S, 100), 1);
        assert_eq!(b.tokens(PER_S, 10_000), 10);
        assert_eq!(b.take(PER_S, 0, 11), Err(1100));
    }

    #[test]
    fn encoding_round_trips() {
        let b = Bucket {
            level: 7,
            updated_ms: 9,
        };
        assert_eq!(Bucket::decode(&b.encode()), Some(b));
        assert_eq!(Bucket::decode(&[0; 15]), None);
        assert_eq!(Bucket::decode(&[0; 17]), None);
    }
}
