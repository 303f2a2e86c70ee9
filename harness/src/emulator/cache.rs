//! Token estimate and a bounded LRU prefix cache.
//!
//! llama.cpp reports how much of a prompt it could reuse from its KV cache
//! (`cache_n`, `cached_tokens`). Routing tests need that number to move the
//! way a real engine's does: it grows when a backend sees the same prefix
//! again and stays at zero for prompts it has never seen. This module keeps a
//! cheap model of that. Each dialect says what its prompt text is; this
//! module only sees bytes.
//!
//! The prompt is cut into 64-byte blocks (16 "tokens" at four bytes per
//! token). Each block's key hashes the previous block's key together with the
//! block's bytes, so a key stands for the whole prefix up to and including
//! that block. Only complete blocks are keyed. The cache is an LRU set of
//! keys with a fixed capacity.

use std::collections::{HashMap, VecDeque};

use xxhash_rust::xxh3::xxh3_64;

/// Bytes per cache block.
pub const BLOCK_BYTES: usize = 64;
/// Bytes per estimated token.
pub const BYTES_PER_TOKEN: usize = 4;
/// Tokens per cache block.
pub const BLOCK_TOKENS: u64 = (BLOCK_BYTES / BYTES_PER_TOKEN) as u64;

/// Estimated token count: one token per four bytes, rounded up.
pub fn token_count(prompt: &[u8]) -> u64 {
    prompt.len().div_ceil(BYTES_PER_TOKEN) as u64
}

/// Chained keys of the prompt's complete blocks, first block first.
pub fn block_keys(prompt: &[u8]) -> Vec<u64> {
    let mut keys = Vec::with_capacity(prompt.len() / BLOCK_BYTES);
    let mut previous = 0u64;
    let mut input = [0u8; 8 + BLOCK_BYTES];
    for block in prompt.chunks_exact(BLOCK_BYTES) {
        input[..8].copy_from_slice(&previous.to_le_bytes());
        input[8..].copy_from_slice(block);
        previous = xxh3_64(&input);
        keys.push(previous);
    }
    keys
}

/// How many leading keys two chained key lists share: the blocks of the longer common prefix of their prompts.
pub fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The prompt tokens `blocks` cached leading blocks cover, at most the prompt's token count.
pub fn cached_tokens(blocks: usize, prompt: &[u8]) -> u64 {
    (blocks as u64 * BLOCK_TOKENS).min(token_count(prompt))
}

/// An LRU set of block keys with a fixed capacity.
///
/// Recency is a generation number per key. Every touch appends
/// `(key, generation)` to a queue; queue entries whose generation is no
/// longer the key's current one are stale and skipped. Eviction pops from
/// the front, and the queue is compacted when stale entries pile up, so
/// every operation is amortised O(1) and memory stays bounded.
#[derive(Debug)]
pub struct PrefixCache {
    capacity: usize,
    generation: u64,
    current: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
}

impl PrefixCache {
    pub fn new(capacity: usize) -> Self {
        PrefixCache {
            capacity,
            generation: 0,
            current: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub fn contains(&self, key: u64) -> bool {
        self.current.contains_key(&key)
    }

    pub fn clear(&mut self) {
        self.current.clear();
        self.order.clear();
    }

    /// Counts the leading keys already cached, then touches every key.
    ///
    /// Keys are touched last block first, so a prompt's head ends up the
    /// most recent: under pressure the cache drops prompt tails before the
    /// heads that the tails depend on.
    pub fn match_and_insert(&mut self, keys: &[u64]) -> usize {
        let matched = keys.iter().take_while(|key| self.contains(**key)).count();
        for key in keys.iter().rev() {
            self.touch(*key);
        }
        matched
    }

    /// Marks `key` as the most recently used, inserting it if missing.
    pub fn touch(&mut self, key: u64) {
        if self.capacity == 0 {
            return;
        }
        self.generation += 1;
        self.current.insert(key, self.generation);
        self.order.push_back((key, self.generation));
        self.evict_over_capacity();
        self.compact_if_stale();
    }

    fn evict_over_capacity(&mut self) {
        while self.current.len() > self.capacity {
            let Some((key, generation)) = self.order.pop_front() else {
                return;
            };
            if self.current.get(&key) == Some(&generation) {
                self.current.remove(&key);
            }
        }
    }

    fn compact_if_stale(&mut self) {
        if self.order.len() <= 2 * self.capacity + 16 {
            return;
        }
        let current = &self.current;
        self.order
            .retain(|(key, generation)| current.get(key) == Some(generation));
    }
}

#[cfg(test)]
impl PrefixCache {
    fn len(&self) -> usize {
        self.current.len()
    }

    fn is_empty(&self) -> bool {
        self.current.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_up() {
        assert_eq!(token_count(b""), 0);
        assert_eq!(token_count(b"a"), 1);
        assert_eq!(token_count(b"abcd"), 1);
        assert_eq!(token_count(b"abcde"), 2);
    }

    #[test]
    fn only_complete_blocks_are_keyed() {
        assert!(block_keys(&[b'a'; 63]).is_empty());
        assert_eq!(block_keys(&[b'a'; 64]).len(), 1);
        assert_eq!(block_keys(&[b'a'; 200]).len(), 3);
    }

    #[test]
    fn keys_chain_over_the_whole_prefix() {
        let base = vec![b'x'; 192];
        let mut changed_head = base.clone();
        changed_head[0] = b'y';
        let mut changed_tail = base.clone();
        changed_tail[150] = b'y';

        let a = block_keys(&base);
        let head = block_keys(&changed_head);
        let tail = block_keys(&changed_tail);
        // Identical blocks at different depths get different keys.
        assert_ne!(a[0], a[1]);
        assert!(a.iter().zip(&head).all(|(x, y)| x != y));
        assert_eq!(a[..2], tail[..2]);
        assert_ne!(a[2], tail[2]);
    }

    #[test]
    fn common_prefix_counts_leading_equal_keys() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[9, 2], &[1, 2]), 0);
        // 3 blocks of a 40-byte prompt would be 48 tokens: capped at its 10.
        assert_eq!(cached_tokens(3, &[b'a'; 40]), 10);
        assert_eq!(cached_tokens(2, &[b'a'; 200]), 32);
    }

    #[test]
    fn match_counts_leading_hits_only() {
        let mut cache = PrefixCache::new(16);
        assert_eq!(cache.match_and_insert(&[1, 2, 3]), 0);
        assert_eq!(cache.match_and_insert(&[1, 2, 3]), 3);
        assert_eq!(cache.match_and_insert(&[1, 2, 9, 3]), 2);
        assert_eq!(cache.match_and_insert(&[7, 1, 2]), 0);
        assert_eq!(cache.len(), 5);
    }

    #[test]
    fn evicts_least_recently_used() {
        let mut cache = PrefixCache::new(3);
        cache.touch(1);
        cache.touch(2);
        cache.touch(3);
        cache.touch(1);
        cache.touch(4);
        assert!(!cache.contains(2));
        assert!(cache.contains(1) && cache.contains(3) && cache.contains(4));
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn prompt_tails_are_evicted_before_heads() {
        let mut cache = PrefixCache::new(3);
        cache.match_and_insert(&[10, 11, 12]);
        cache.touch(99);
        assert!(cache.contains(10) && cache.contains(11));
        assert!(!cache.contains(12));
        assert_eq!(cache.match_and_insert(&[10, 11, 12]), 2);
    }

    #[test]
    fn repeated_touches_keep_the_queue_bounded() {
        let mut cache = PrefixCache::new(4);
        for round in 0..10_000u64 {
            cache.touch(round % 3);
        }
        assert_eq!(cache.len(), 3);
        assert!(cache.order.len() <= 2 * 4 + 16 + 1);
    }

    #[test]
    fn zero_capacity_holds_nothing_and_clear_empties() {
        let mut zero = PrefixCache::new(0);
        assert_eq!(zero.match_and_insert(&[1]), 0);
        assert_eq!(zero.match_and_insert(&[1]), 0);
        assert!(zero.is_empty());

        let mut cache = PrefixCache::new(8);
        cache.match_and_insert(&[1, 2]);
        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(cache.match_and_insert(&[1, 2]), 0);
    }
}
