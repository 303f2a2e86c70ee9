//! Chat request bodies of an exact byte size, reproducible from a seed.
//!
//! A body is `{"model":ALIAS,"messages":[system, user],"max_tokens":16}`. The system prompt (about 300 bytes) is
//! different for each prompt family, so affinity keys spread over the engines; the user message is padded with
//! pseudo-random lower-case words until the serialized body is exactly the requested size. Only ASCII letters and
//! spaces are used, so nothing is escaped and the size is exact.
//!
//! The core's criterion benches use the same bodies, through this crate, so both benches measure alike.

use crate::rng::SplitMix64;
use serde_json::json;

/// The alias every bench body asks for.
pub const ALIAS: &str = "local-chat";
/// What the filter rewrites the alias to.
pub const UPSTREAM_MODEL: &str = "qwen3-0.6b";
/// The body sizes of the issue: 1 KiB, 4 KiB, 64 KiB, 256 KiB, 1 MiB.
pub const SIZES: [usize; 5] = [1 << 10, 4 << 10, 64 << 10, 256 << 10, 1 << 20];

/// Target length of the system prompt, kept under a quarter of the body so small bodies fit.
const SYSTEM_BYTES: usize = 300;

/// A chat body of exactly `size` bytes (or the smallest possible body, if `size` is smaller than that).
pub fn chat_body(size: usize, family: u64, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed ^ family.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut system = format!("You are assistant {family} of bench seed {seed}. ");
    system.push_str(&rng.text("", SYSTEM_BYTES.min(size / 4).saturating_sub(system.len())));
    let base = render(&system, "").len();
    let user = rng.text("", size.saturating_sub(base));
    render(&system, &user)
}

/// A human-readable size: `1 KiB`, `256 KiB`, `1 MiB`.
pub fn size_label(size: usize) -> String {
    if size >= 1 << 20 && size & ((1 << 20) - 1) == 0 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    }
}

/// The id of a size in bench names and criterion's folders: `1KiB`, `4KiB`, ..., `1MiB`.
pub fn size_id(size: usize) -> String {
    size_label(size).replace(' ', "")
}

fn render(system: &str, user: &str) -> Vec<u8> {
    let body = json!({
        "model": ALIAS,
        "messages": [
            { "role": "system", "content": system },
            { "role": "user", "content": user },
        ],
        "max_tokens": 16,
    });
    body.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_the_exact_size_and_are_valid_chat_json() {
        for size in SIZES {
            let body = chat_body(size, 3, 42);
            assert_eq!(body.len(), size);
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["model"], ALIAS);
            assert_eq!(v["messages"][0]["role"], "system");
        }
    }

    #[test]
    fn same_seed_same_body_other_family_other_system_prompt() {
        assert_eq!(chat_body(4096, 1, 7), chat_body(4096, 1, 7));
        let system = |b: Vec<u8>| serde_json::from_slice::<serde_json::Value>(&b).unwrap()["messages"][0].clone();
        assert_ne!(system(chat_body(4096, 1, 7)), system(chat_body(4096, 2, 7)));
    }

    #[test]
    fn labels() {
        assert_eq!(size_label(1024), "1 KiB");
        assert_eq!(size_label(256 << 10), "256 KiB");
        assert_eq!(size_label(1 << 20), "1 MiB");
        assert_eq!(size_id(1 << 10), "1KiB");
    }
}
