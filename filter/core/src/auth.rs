//! Inbound API keys: which credential a request presents, and which configured key, if any, it matches.
//!
//! The keys come from one environment variable (`auth.keys_env`), as `name:token` pairs separated by commas. The
//! *name* is config-like (`[A-Za-z0-9_.-]`, 1 to 64 bytes), so it may appear in limits, metric names and logs; the
//! *token* never leaves this module: errors about a token name the pair by its position and its key name only.
//!
//! What a request may present: `Authorization: Bearer <token>` or `x-api-key: <token>` (the Anthropic SDKs send
//! the latter, on every path, `GET /v1/models` included). When both are present, `Authorization` decides and
//! `x-api-key` is ignored. Two `Authorization` headers, a scheme other than Bearer, or a token with bytes outside the RFC 6750
//! token68 alphabet are refused as malformed, never guessed at.
//!
//! The comparison takes the same time whatever the presented token shares with any configured one: every key is
//! compared, over [`TOKEN_MAX`] bytes each, with a fold that never exits early. Its cost is
//! `keys × TOKEN_MAX` byte operations, at most 256 × 256 per request.

/// Longest key name.
pub const NAME_MAX: usize = 64;
/// Shortest token: anything shorter is guessable.
pub const TOKEN_MIN: usize = 16;
/// Longest token; also the fixed width every comparison runs over.
pub const TOKEN_MAX: usize = 256;
/// Most keys in one variable.
pub const MAX_KEYS: usize = 256;

/// One configured key.
#[derive(Clone, PartialEq, Eq)]
struct Key {
    name: String,
    token: Vec<u8>,
}

/// The configured keys. `Debug` shows names only.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Keys {
    keys: Vec<Key>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl Keys {
    /// The key names, in the order configured.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.name.as_str())
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The name of the key whose token is `presented`, compared in constant time against every key.
    pub fn find(&self, presented: &[u8]) -> Option<&str> {
        let mut found = None;
        for k in &self.keys {
            if ct_eq(&k.token, presented) {
                found = Some(k.name.as_str());
            }
        }
        found
    }
}

/// The names in `named` (such as `auth.key_limits`'s) that no configured key has: a typo there would give that
/// budget to nobody.
pub fn unknown_names<'n>(keys: &Keys, named: impl Iterator<Item = &'n str>) -> Vec<&'n str> {
    named.filter(|n| !keys.names().any(|k| k == *n)).collect()
}

/// True when a key name is usable in shared-data keys, metric names and logs.
pub fn name_ok(name: &str) -> bool {
    (1..=NAME_MAX).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// RFC 6750 `b64token` (token68) bytes.
fn token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/' | b'=')
}

/// Parses the variable's value. Errors name the pair by position (and name, when it has one), never the token.
pub fn parse_keys(text: &str) -> Result<Keys, String> {
    let mut keys: Vec<Key> = Vec::new();
    for (i, pair) in text.split(',').map(str::trim).enumerate() {
        if pair.is_empty() {
            continue;
        }
        let Some((name, token)) = pair.split_once(':') else {
            return Err(format!("pair {i} has no `:`; write `name:token`"));
        };
        let (name, token) = (name.trim(), token.trim());
        if !name_ok(name) {
            return Err(format!(
                "pair {i}: the key name must be 1 to {NAME_MAX} characters of A-Z a-z 0-9 _ . -"
            ));
        }
        if !(TOKEN_MIN..=TOKEN_MAX).contains(&token.len()) || !token.bytes().all(token_byte) {
            return Err(format!(
                "key `{name}`: the token must be {TOKEN_MIN} to {TOKEN_MAX} characters of A-Z a-z 0-9 - . _ ~ + / ="
            ));
        }
        if keys.iter().any(|k| k.name == name) {
            return Err(format!("key `{name}` appears twice"));
        }
        if keys.iter().any(|k| k.token == token.as_bytes()) {
            return Err(format!("key `{name}` has the same token as another key"));
        }
        keys.push(Key {
            name: name.to_string(),
            token: token.as_bytes().to_vec(),
        });
        if keys.len() > MAX_KEYS {
            return Err(format!("more than {MAX_KEYS} keys"));
        }
    }
    if keys.is_empty() {
        return Err("no keys; write `name:token` pairs separated by commas".to_string());
    }
    Ok(Keys { keys })
}

/// Equality over [`TOKEN_MAX`] bytes whatever the inputs, with no early exit. Longer inputs never match.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let at = |s: &[u8], i: usize| s.get(i).copied().unwrap_or(0);
    let diff = (0..TOKEN_MAX).fold(0u8, |acc, i| acc | (at(a, i) ^ at(b, i)));
    let lengths = (a.len() ^ b.len()) | usize::from(a.len() > TOKEN_MAX) | usize::from(b.len() > TOKEN_MAX);
    (usize::from(diff) | lengths) == 0
}

/// Why a request was refused a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthRefusal {
    /// No credential the endpoint accepts.
    Missing,
    /// A credential header that cannot be read: not Bearer, a bad token, or sent twice.
    Malformed,
    /// A well-formed token that matches no key.
    Unknown,
}

impl AuthRefusal {
    pub const ALL: [AuthRefusal; 3] = [AuthRefusal::Missing, AuthRefusal::Malformed, AuthRefusal::Unknown];

    /// The metric reason.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthRefusal::Missing => "missing",
            AuthRefusal::Malformed => "malformed",
            AuthRefusal::Unknown => "unknown",
        }
    }
}

/// The credential a request presents, by the rules in the module doc. `authorization` and `x_api_key` are every
/// value of those headers, as sent.
pub fn presented<'a>(authorization: &[&'a [u8]], x_api_key: &[&'a [u8]]) -> Result<&'a [u8], AuthRefusal> {
    match authorization {
        [] => {}
        [one] => return bearer(one),
        _ => return Err(AuthRefusal::Malformed),
    }
    match x_api_key {
        [] => Err(AuthRefusal::Missing),
        [one] => token(one),
        _ => Err(AuthRefusal::Malformed),
    }
}

/// The token of `Bearer <token>` (scheme in any case, one or more spaces).
fn bearer(value: &[u8]) -> Result<&[u8], AuthRefusal> {
    let scheme = value.get(..7).ok_or(AuthRefusal::Malformed)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return Err(AuthRefusal::Malformed);
    }
    let rest = value.get(7..).unwrap_or_default();
    let start = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
    token(rest.get(start..).unwrap_or_default())
}

fn token(t: &[u8]) -> Result<&[u8], AuthRefusal> {
    let t = t.trim_ascii();
    if t.is_empty() || t.len() > TOKEN_MAX || !t.iter().all(|&b| token_byte(b)) {
        return Err(AuthRefusal::Malformed);
    }
    Ok(t)
}

/// The whole check: the presented credential, then the key it matches. `Ok` holds the key's name.
pub fn check<'k>(keys: &'k Keys, authorization: &[&[u8]], x_api_key: &[&[u8]]) -> Result<&'k str, AuthRefusal> {
    let t = presented(authorization, x_api_key)?;
    keys.find(t).ok_or(AuthRefusal::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "tok-aaaaaaaaaaaaaaaa";
    const B: &str = "tok-bbbbbbbbbbbbbbbb";

    fn keys() -> Keys {
        parse_keys(&format!("alice:{A}, bob:{B}")).unwrap()
    }

    #[test]
    fn parses_pairs_and_hides_tokens() {
        let k = keys();
        assert_eq!(k.names().collect::<Vec<_>>(), ["alice", "bob"]);
        assert_eq!(format!("{k:?}"), r#"["alice", "bob"]"#);
        assert_eq!(k.find(A.as_bytes()), Some("alice"));
        assert_eq!(k.find(B.as_bytes()), Some("bob"));
        assert_eq!(k.find(b"tok-aaaaaaaaaaaaaaab"), None);
    }

    #[test]
    fn bad_variables_never_quote_a_token() {
        let secret = "sEcReT-0123456789abcdef";
        for text in [
            String::new(),
            " , ".to_string(),
            format!("nocolon{secret}"),
            format!("bad name:{secret}"),
            "a:short".to_string(),
            format!("a:{secret} x"),
            format!("a:{secret},a:{secret}x"),
            format!("a:{secret},b:{secret}"),
            format!("a:{}", "x".repeat(TOKEN_MAX + 1)),
        ] {
            let e = parse_keys(&text).unwrap_err();
            assert!(!e.contains("sEcReT"), "{e}");
        }
    }

    #[test]
    fn header_rules() {
        let bearer_a = format!("Bearer {A}");
        let a = bearer_a.as_bytes();
        let k = keys();
        assert_eq!(check(&k, &[a], &[]), Ok("alice"));
        assert_eq!(check(&k, &[b"bearer   tok-bbbbbbbbbbbbbbbb"], &[]), Ok("bob"));
        // x-api-key alone; Authorization wins over it.
        assert_eq!(check(&k, &[], &[B.as_bytes()]), Ok("bob"));
        assert_eq!(check(&k, &[a], &[B.as_bytes()]), Ok("alice"));
        assert_eq!(check(&k, &[a], &[b"junk"]), Ok("alice"));
        assert_eq!(check(&k, &[b"Basic x"], &[B.as_bytes()]), Err(AuthRefusal::Malformed));
        // Two headers, other schemes, bad tokens.
        assert_eq!(check(&k, &[a, a], &[]), Err(AuthRefusal::Malformed));
        assert_eq!(
            check(&k, &[], &[A.as_bytes(), A.as_bytes()]),
            Err(AuthRefusal::Malformed)
        );
        for bad in [
            &b"Basic YWxpY2U6eA=="[..],
            b"Bearer",
            b"Bearer ",
            b"Bearertok",
            b"Bearer a b",
            b"Bearer a,b",
        ] {
            assert_eq!(check(&k, &[bad], &[]), Err(AuthRefusal::Malformed), "{bad:?}");
        }
        assert_eq!(check(&k, &[], &[]), Err(AuthRefusal::Missing));
        assert_eq!(
            check(&k, &[b"Bearer tok-wrong-but-well-formed"], &[]),
            Err(AuthRefusal::Unknown)
        );
    }

    #[test]
    fn names_that_no_key_has_are_found() {
        let k = keys();
        assert_eq!(unknown_names(&k, ["bob", "alcie", "alice"].into_iter()), ["alcie"]);
    }

    #[test]
    fn ct_eq_is_equality() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abc\0"));
        assert!(!ct_eq(b"", b"a"));
        let long = vec![b'a'; TOKEN_MAX + 1];
        assert!(!ct_eq(&long, &long));
    }
}
