//! Small text helpers shared by the affinity key and the error messages.

/// The longest prefix of `s` that is at most `max` bytes and ends on a character boundary.
pub fn prefix_on_char_boundary(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    // Index 0 is always a boundary, so the walk stops there at the latest.
    while !s.is_char_boundary(end) {
        end = end.saturating_sub(1);
    }
    s.get(..end).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_keeps_short_strings() {
        assert_eq!(prefix_on_char_boundary("abc", 10), "abc");
        assert_eq!(prefix_on_char_boundary("abc", 3), "abc");
    }

    #[test]
    fn prefix_never_splits_a_character() {
        let s = "aé€😀";
        for max in 0..=s.len() {
            let p = prefix_on_char_boundary(s, max);
            assert!(p.len() <= max);
            assert!(s.starts_with(p));
        }
        assert_eq!(prefix_on_char_boundary(s, 2), "a");
        assert_eq!(prefix_on_char_boundary(s, 3), "aé");
    }
}
