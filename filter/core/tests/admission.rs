//! Admission arithmetic with a fake clock and a fake shared store: refill, all-or-nothing, settlement, lost
//! compare-and-swap races, and the constant-time key check.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
// Test helpers may unwrap and panic: a failing test should stop loudly (see clippy.toml).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;

use llmroute_core::auth::{ct_eq, parse_keys};
use llmroute_core::limits::{
    admit, give, settle, Bucket, BucketStore, Charge, Denied, Kind, Rate, ReadFailed, Scope, Unit,
};
use proptest::prelude::*;

/// Shared data with versions. `rival` takes this many tokens from every bucket between our read and our write,
/// `races` times, as another worker would. With `failing`, every read is a host error.
#[derive(Default)]
struct Store {
    map: HashMap<String, (Vec<u8>, u32)>,
    races: usize,
    rival: Option<(Rate, u64)>,
    failing: bool,
}

impl Store {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        match self.map.get(key) {
            Some((v, cas)) => (Some(v.clone()), Some(*cas)),
            None => (None, None),
        }
    }

    fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
        self.write(key, value, cas)
    }
}

impl BucketStore for Store {
    fn read(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), ReadFailed> {
        match self.failing {
            true => Err(ReadFailed),
            false => Ok(self.get(key)),
        }
    }

    fn write(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
        if self.races > 0 {
            self.races -= 1;
            if let (Some((rate, n)), Some((v, version))) = (self.rival, self.map.get_mut(key)) {
                let b = Bucket::decode(v).unwrap().take(rate, 0, n).unwrap();
                *v = b.encode().to_vec();
                *version += 1;
            }
        }
        let version = self.map.get(key).map(|(_, c)| *c);
        if cas.is_some() && cas != version {
            return false;
        }
        self.map
            .insert(key.to_string(), (value.to_vec(), version.unwrap_or(0) + 1));
        true
    }
}

fn charge(name: &str, kind: Kind, rate: Rate, amount: u64) -> Charge {
    Charge {
        scope: Scope::Alias,
        name: name.into(),
        kind,
        rate,
        amount,
    }
}

fn left(store: &Store, c: &Charge, now: u64) -> u64 {
    let (v, _) = store.get(&c.key());
    v.map_or(c.rate.amount, |v| Bucket::decode(&v).unwrap().tokens(c.rate, now))
}

const UNITS: [Unit; 4] = [Unit::S, Unit::M, Unit::H, Unit::D];

proptest! {
    /// Attempting one request every `step` ms from a full bucket admits exactly the capacity plus what the
    /// elapsed time refilled, in whole tokens.
    #[test]
    fn refill_admits_exactly_the_budget(amount in 1u64..50, unit in 0usize..4, step in 1u64..2000, n in 1usize..400) {
        let rate = Rate { amount, unit: UNITS[unit] };
        let mut b = Bucket::full(rate, 1_000);
        let mut admitted = 0u64;
        let mut now = 1_000;
        for _ in 0..n {
            if let Ok(next) = b.take(rate, now, 1) {
                b = next;
                admitted += 1;
            }
            now += step;
        }
        let last = now - step - 1_000;
        let period = rate.unit.period_ms();
        let ceiling = amount + last * amount / period;
        prop_assert!(admitted <= ceiling, "{admitted} > {ceiling}");
        // Refill is lost only while the bucket is full, and greedy taking empties a full bucket within one step:
        // at most one step of refill is lost per take (plus the last one), so a small bucket polled coarsely
        // admits fewer, by a bounded amount.
        let lost = (admitted + 1) * step * amount / period + 1;
        prop_assert!(admitted + lost >= ceiling.min(n as u64), "{admitted} + {lost} vs {ceiling}");
    }

    /// A refused request holds nothing: every bucket reads as before.
    #[test]
    fn admission_is_all_or_nothing(big in 1u64..100, small in 1u64..100, want in 1u64..200) {
        let a = charge("a", Kind::Tokens, Rate { amount: big, unit: Unit::M }, want);
        let b = charge("b", Kind::Tokens, Rate { amount: small, unit: Unit::M }, want);
        let mut store = Store::default();
        let result = admit(&mut store, &[a.clone(), b.clone()], 0);
        if want <= big && want <= small {
            prop_assert_eq!(result, Ok(vec![big - want, small - want]));
        } else {
            prop_assert!(
                matches!(result, Err(Denied::Limited { .. })),
                "{:?}",
                result
            );
            prop_assert_eq!((left(&store, &a, 0), left(&store, &b, 0)), (big, small));
        }
    }

    /// After settlement the bucket holds the budget minus what was used, whatever was reserved: below empty when
    /// the engine used more than the whole budget.
    #[test]
    fn settlement_charges_exactly_the_usage(reserve in 1u64..5000, used in 0u64..8000) {
        let budget = 5000;
        let rate = Rate { amount: budget, unit: Unit::D };
        let c = charge("m", Kind::Tokens, rate, reserve);
        let mut store = Store::default();
        admit(&mut store, std::slice::from_ref(&c), 0).unwrap();
        settle(&mut store, std::slice::from_ref(&c), used, 0);
        let level = Bucket::decode(&store.get(&c.key()).0.unwrap()).unwrap().level;
        prop_assert_eq!(level, (budget as i64 - used as i64) * 86_400_000);
        prop_assert_eq!(left(&store, &c, 0), budget.saturating_sub(used));
    }

    /// Over any run of requests that each reserve `reserve` and then use what the engine says, the tokens used
    /// by admitted requests never pass the budget plus what refilled meanwhile, plus one request's overrun: a
    /// debt is carried, so overruns cannot add up.
    #[test]
    fn overruns_never_add_up(
        reserve in 1u64..200,
        used in proptest::collection::vec(0u64..3000, 1..200),
        step in 0u64..400,
    ) {
        let budget = 1000;
        let rate = Rate { amount: budget, unit: Unit::M };
        let c = charge("m", Kind::Tokens, rate, reserve);
        let mut store = Store::default();
        let (mut now, mut spent, mut worst) = (0u64, 0u64, 0u64);
        for u in &used {
            if admit(&mut store, std::slice::from_ref(&c), now).is_ok() {
                settle(&mut store, std::slice::from_ref(&c), *u, now);
                spent += u;
                worst = worst.max(*u);
            }
            now += step;
        }
        let refilled = now * budget / 60_000;
        prop_assert!(spent <= budget + refilled + worst, "{} > {} + {} + {}", spent, budget, refilled, worst);
    }

    /// Lost races are redone from a fresh read: the rival's takes and ours all count.
    #[test]
    fn lost_races_lose_no_update(races in 0usize..50, rival in 1u64..10) {
        let rate = Rate { amount: 1000, unit: Unit::M };
        let c = charge("m", Kind::Requests, rate, 3);
        let mut store = Store::default();
        store.set(&c.key(), &Bucket::full(rate, 0).encode(), None);
        store.races = races;
        store.rival = Some((rate, rival));
        admit(&mut store, std::slice::from_ref(&c), 0).unwrap();
        prop_assert_eq!(left(&store, &c, 0), 1000 - 3 - races as u64 * rival);
    }

    #[test]
    fn ct_eq_is_plain_equality(a in proptest::collection::vec(any::<u8>(), 0..300), b in proptest::collection::vec(any::<u8>(), 0..300)) {
        let within = a.len() <= 256 && b.len() <= 256;
        prop_assert_eq!(ct_eq(&a, &b), within && a == b);
        prop_assert_eq!(ct_eq(&a, &a), a.len() <= 256);
    }
}

#[test]
fn refill_is_exact_over_a_fake_clock() {
    // 3 per second: one token every 333.3 ms, exactly 3 per 1000 ms, no drift over an hour.
    let rate = Rate {
        amount: 3,
        unit: Unit::S,
    };
    let mut b = Bucket::full(rate, 0);
    for _ in 0..3 {
        b = b.take(rate, 0, 1).unwrap();
    }
    assert_eq!(b.take(rate, 0, 1), Err(334));
    assert_eq!(b.tokens(rate, 333), 0);
    assert_eq!(b.tokens(rate, 334), 1);
    assert_eq!(b.tokens(rate, 1_000), 3);
    let mut taken = 0;
    for ms in 1..=3_600_000u64 {
        if let Ok(next) = b.take(rate, ms, 1) {
            b = next;
            taken += 1;
        }
    }
    assert_eq!(taken, 3 * 3_600);
    // A clock that goes back refills nothing.
    let drained = Bucket {
        level: 0,
        updated_ms: 10_000,
    };
    assert_eq!(drained.tokens(rate, 5_000), 0);
}

#[test]
fn contention_past_the_bound_refuses_and_holds_nothing() {
    let rate = Rate {
        amount: 1_000_000,
        unit: Unit::M,
    };
    let first = charge("a", Kind::Requests, rate, 1);
    let second = charge("b", Kind::Requests, rate, 1);
    let mut store = Store::default();
    for c in [&first, &second] {
        store.set(&c.key(), &Bucket::full(rate, 0).encode(), None);
    }
    admit(&mut store, std::slice::from_ref(&first), 0).unwrap();
    // From here every write loses its race.
    store.races = usize::MAX;
    store.rival = Some((rate, 0));
    let r = admit(&mut store, &[first.clone(), second.clone()], 0);
    assert_eq!(r, Err(Denied::Contention));
    store.races = 0;
    assert_eq!(left(&store, &first, 0), 1_000_000 - 1);
    assert_eq!(left(&store, &second, 0), 1_000_000);
}

#[test]
fn key_variable_errors_name_no_token() {
    let e = parse_keys("alice:short-secret").unwrap_err();
    assert!(e.contains("alice") && !e.contains("short-secret"), "{e}");
}

#[test]
fn x_api_key_is_accepted_on_every_path_and_authorization_wins() {
    use llmroute_core::auth::AuthRefusal;
    use llmroute_core::request::authenticate;
    use llmroute_core::GatewayError;
    let keys = parse_keys("alice:tok-aaaaaaaaaaaaaaaa,bob:tok-bbbbbbbbbbbbbbbb").unwrap();
    let h = |pairs: &[(&str, &str)]| -> Vec<(String, Vec<u8>)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect()
    };
    let api_key = h(&[("x-api-key", "tok-aaaaaaaaaaaaaaaa")]);
    for (method, path) in [
        ("GET", "/v1/models"),
        ("GET", "/v1/models/chat"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/messages"),
        ("GET", "/llmroute/status"),
    ] {
        let who = authenticate(&keys, method, path, &api_key).map_err(|r| r.error);
        assert_eq!(who, Ok(Some("alice".to_string())), "{method} {path}");
    }
    let both = h(&[
        ("authorization", "Bearer tok-bbbbbbbbbbbbbbbb"),
        ("x-api-key", "tok-aaaaaaaaaaaaaaaa"),
    ]);
    let who = authenticate(&keys, "GET", "/v1/models", &both).map_err(|r| r.error);
    assert_eq!(who, Ok(Some("bob".to_string())), "Authorization wins");
    let wrong_bearer = h(&[
        ("authorization", "Bearer tok-wrong-but-well-formed"),
        ("x-api-key", "tok-aaaaaaaaaaaaaaaa"),
    ]);
    let who = authenticate(&keys, "GET", "/v1/models", &wrong_bearer).map_err(|r| r.error);
    assert_eq!(who, Err(GatewayError::Unauthorized(AuthRefusal::Unknown)));
}

#[test]
fn a_failed_read_refuses_and_leaves_the_bucket_as_it_was() {
    let rate = Rate {
        amount: 10,
        unit: Unit::M,
    };
    let c = charge("m", Kind::Tokens, rate, 10);
    let mut store = Store::default();
    admit(&mut store, std::slice::from_ref(&c), 0).unwrap();
    let drained = store.get(&c.key());
    store.failing = true;
    assert_eq!(admit(&mut store, std::slice::from_ref(&c), 0), Err(Denied::Unreadable));
    assert!(!give(&mut store, &c, 10, false, 0), "no settlement on a guess");
    store.failing = false;
    assert_eq!(store.get(&c.key()), drained);
    assert!(matches!(
        admit(&mut store, std::slice::from_ref(&c), 0),
        Err(Denied::Limited { .. })
    ));
    // An entry that does not decode starts empty, not full.
    store.set(&c.key(), b"garbage", None);
    assert!(matches!(
        admit(&mut store, std::slice::from_ref(&c), 0),
        Err(Denied::Limited { .. })
    ));
}

#[test]
fn an_overrun_is_a_debt_and_the_retry_after_counts_its_repayment() {
    // 1000 tokens a minute: one token every 60 ms.
    let rate = Rate {
        amount: 1000,
        unit: Unit::M,
    };
    let c = charge("m", Kind::Tokens, rate, 100);
    let mut store = Store::default();
    admit(&mut store, std::slice::from_ref(&c), 0).unwrap();
    // The engine generated far past the reservation: 5000 tokens against a 1000-token bucket.
    settle(&mut store, std::slice::from_ref(&c), 5000, 0);
    let one = charge("m", Kind::Tokens, rate, 1);
    let retry = match admit(&mut store, std::slice::from_ref(&one), 0) {
        Err(Denied::Limited { retry_after_ms, .. }) => retry_after_ms,
        other => panic!("{other:?}"),
    };
    // 4000 tokens of debt, then one token: 4001 × 60 ms.
    assert_eq!(retry, 4001 * 60);
    assert!(admit(&mut store, std::slice::from_ref(&one), retry - 1).is_err());
    assert_eq!(admit(&mut store, std::slice::from_ref(&one), retry), Ok(vec![0]));
}

#[test]
fn a_bucket_written_unsigned_reads_the_same() {
    let b = Bucket {
        level: 86_400_000 * 10_000_000_000,
        updated_ms: 5,
    };
    let mut old = [0u8; 16];
    old[..8].copy_from_slice(&(86_400_000u64 * 10_000_000_000).to_le_bytes());
    old[8..].copy_from_slice(&5u64.to_le_bytes());
    assert_eq!(Bucket::decode(&old), Some(b));
    let debt = Bucket {
        level: -7,
        updated_ms: 1,
    };
    assert_eq!(Bucket::decode(&debt.encode()), Some(debt));
}

/// One alias `m` on a backend of `max_context` 4000 tokens, with these alias limits, and keys limited by `key`.
fn limited(alias: &str, key: &str) -> llmroute_core::Config {
    llmroute_core::config::load(&format!(
        r#"{{"version":1,"backends":[{{"name":"a","kind":"vllm","endpoints":["127.0.0.1:1"],"max_context":4000}}],
            "models":[{{"name":"m","routes":[{{"backend":"a"}}],"limits":{alias}}}],
            "auth":{{"keys_env":"K","limits":{key}}}}}"#
    ))
    .unwrap()
}

#[test]
fn the_injected_bound_is_the_smallest_default_capped_by_every_budget_left() {
    use llmroute_core::limits::output_to_inject;
    let cfg = limited(
        r#"{"tokens":"1000-M,5000-H","default_max_tokens":300,"inject_max_tokens":true}"#,
        r#"{"tokens":"800-M","default_max_tokens":200}"#,
    );
    let full = |_: &str, r: Rate| Some(r.amount);
    // The injecting block's default, capped by the key's 800 less the input (a block that does not inject
    // still caps).
    assert_eq!(output_to_inject(&cfg, "m", Some("k"), 50, full), Some(300));
    assert_eq!(output_to_inject(&cfg, "m", Some("k"), 600, full), Some(200));
    let mut read = Vec::new();
    let low = |key: &str, r: Rate| {
        read.push(key.to_string());
        Some(if r.unit == Unit::H { 120 } else { r.amount })
    };
    assert_eq!(output_to_inject(&cfg, "m", Some("k"), 20, low), Some(100));
    assert_eq!(
        read,
        [
            "llmroute.limit.alias.m.tokens.M",
            "llmroute.limit.alias.m.tokens.H",
            "llmroute.limit.key.k.tokens.M"
        ]
    );
    // Nothing left, or in debt: still 1, so admission refuses it with the time until it fits.
    assert_eq!(output_to_inject(&cfg, "m", Some("k"), 20, |_, _| Some(0)), Some(1));
    // A failed read caps nothing (admission then fails closed on it).
    assert_eq!(output_to_inject(&cfg, "m", Some("k"), 20, |_, _| None), Some(300));
    // No block asks: no bound, and no bucket read.
    let cfg = limited(
        r#"{"tokens":"1000-M"}"#,
        r#"{"tokens":"800-M","default_max_tokens":200}"#,
    );
    let none = output_to_inject(&cfg, "m", Some("k"), 20, |_, _| panic!("read"));
    assert_eq!(none, None);
}

#[test]
fn the_bound_is_written_in_the_apis_own_field_and_nothing_else_changes() {
    use llmroute_core::route::route_bounded;
    use llmroute_core::Api;
    let cfg = limited(
        r#"{"tokens":"1000-M","inject_max_tokens":true}"#,
        r#"{"requests":"1-S"}"#,
    );
    let decide = |api: Api, body: &str, bound: Option<u64>| {
        let d = route_bounded(&cfg, api, body.as_bytes(), None, |alias, _| {
            assert_eq!(alias, "m");
            bound
        })
        .unwrap();
        let out = d
            .patch
            .as_ref()
            .map_or(body.as_bytes().to_vec(), |p| p.apply(body.as_bytes()));
        assert_eq!(d.body_len(body.len()), Some(out.len()));
        (d.max_output_tokens, String::from_utf8(out).unwrap())
    };
    let chat = r#"{ "model" : "m", "messages":[{"role":"user","content":"hi"}] }"#;
    assert_eq!(
        decide(Api::Chat, chat, Some(77)),
        (
            Some(77),
            r#"{ "model" : "m", "messages":[{"role":"user","content":"hi"}] ,"max_tokens":77}"#.to_string()
        )
    );
    assert_eq!(decide(Api::Chat, chat, None), (None, chat.to_string()));
    let completions = r#"{"model":"m","prompt":"hi","max_tokens":null}"#;
    assert_eq!(
        decide(Api::Completions, completions, Some(5)).1,
        r#"{"model":"m","prompt":"hi","max_tokens":5}"#
    );
    let responses = r#"{"model":"m","input":"hi"}"#;
    assert_eq!(
        decide(Api::Responses, responses, Some(9)).1,
        r#"{"model":"m","input":"hi","max_output_tokens":9}"#
    );
    // The client's own bound stands.
    let asked = r#"{"model":"m","max_completion_tokens":3,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(decide(Api::Chat, asked, Some(77)), (Some(3), asked.to_string()));
    // A copy in another letter case is left alone: nothing is written.
    let other_case = r#"{"model":"m","MAX_TOKENS":null,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(decide(Api::Chat, other_case, Some(77)), (None, other_case.to_string()));
    // Embeddings take no bound.
    let embed = r#"{"model":"m","input":"hi"}"#;
    assert_eq!(decide(Api::Embeddings, embed, Some(77)), (None, embed.to_string()));
    // Capped by the context left after the input (4000 on this backend).
    let (bound, _) = decide(Api::Chat, chat, Some(1_000_000));
    assert!(bound.is_some_and(|b| b < 4000 && b > 3900), "{bound:?}");
}
