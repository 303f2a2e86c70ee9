//! "Did you mean": the name closest to a misspelled one, for errors about unknown fields and undefined backends.
//!
//! Closeness is the Damerau-Levenshtein distance normalised by the longer name (`strsim`), so a transposed or
//! dropped letter is close whatever the length. A name is suggested only when it is at least [`MIN_SIMILARITY`]
//! alike: a guess far from what was written would mislead more than it helps. Runs only when a config is refused.

/// The least normalised similarity, 0 to 1, at which a name is suggested.
const MIN_SIMILARITY: f64 = 0.7;

/// The candidate most like `word`, when one is alike enough; the first listed wins a tie.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut best: Option<(&str, f64)> = None;
    for c in candidates {
        let score = strsim::normalized_damerau_levenshtein(word, c);
        if score >= MIN_SIMILARITY && best.is_none_or(|(_, s)| score > s) {
            best = Some((c, score));
        }
    }
    best.map(|(c, _)| c)
}

/// serde's refusal of an unknown field (``unknown field `X`, expected one of `A`, `B` ...``, or ``expected `A` ``)
/// with ``(did you mean `A`?)`` after the field's name when one expected name is close to it. Any other message
/// comes back unchanged.
pub fn unknown_field_hint(message: &str) -> String {
    const HEAD: &str = "unknown field `";
    let Some(rest) = message.strip_prefix(HEAD) else {
        return message.to_string();
    };
    let Some((word, expected)) = rest.split_once('`') else {
        return message.to_string();
    };
    // The names serde expected are the code spans after the field's own.
    let names = expected.split('`').skip(1).step_by(2);
    match closest(word, names) {
        Some(name) => format!("{HEAD}{word}` (did you mean `{name}`?){expected}"),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_added_or_swapped_letter_is_close() {
        let fields = ["version", "listen", "admin", "backends", "models"];
        assert_eq!(closest("listn", fields), Some("listen"));
        assert_eq!(closest("lsiten", fields), Some("listen"));
        assert_eq!(closest("backend", fields), Some("backends"));
        assert_eq!(closest("modelss", fields), Some("models"));
    }

    #[test]
    fn nothing_is_suggested_for_a_name_unlike_any() {
        assert_eq!(closest("weight", ["name", "kind", "endpoints", "slots"]), None);
        assert_eq!(closest("x", ["name"]), None);
        assert_eq!(closest("anything", []), None);
    }

    #[test]
    fn the_hint_goes_after_the_unknown_field() {
        let serde = "unknown field `endpoint`, expected one of `name`, `kind`, `endpoints`, `discovery`";
        assert_eq!(
            unknown_field_hint(serde),
            "unknown field `endpoint` (did you mean `endpoints`?), expected one of `name`, `kind`, `endpoints`, \
             `discovery`"
        );
        let one = "unknown field `etc`, expected `etcd`";
        assert_eq!(
            unknown_field_hint(one),
            "unknown field `etc` (did you mean `etcd`?), expected `etcd`"
        );
        for unchanged in [
            "unknown field `weight`, expected one of `name`, `kind`",
            "unknown field `x`, there are no fields",
            "invalid type: string \"1\", expected u32",
        ] {
            assert_eq!(unknown_field_hint(unchanged), unchanged);
        }
    }
}
