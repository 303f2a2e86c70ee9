//! One seeded generator for every synthetic input the harness makes: bench bodies, workload traces, the tiny
//! model's weights, the replica simulation. SplitMix64: well mixed, reproducible on every platform, no dependency.

/// SplitMix64.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An exponential gap with mean `mean`.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -(1.0 - self.unit()).ln() * mean
    }

    /// Fisher-Yates.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }

    /// `head` followed by random lower-case words (2 to 10 letters, space-separated), `len` bytes in all, or
    /// `head` alone if it is longer.
    pub fn text(&mut self, head: &str, len: usize) -> String {
        let mut out = String::with_capacity(len + 12);
        out.push_str(head);
        while out.len() < len {
            let word = 2 + (self.next_u64() % 9) as usize;
            out.extend((0..word).map(|_| char::from(b'a' + (self.next_u64() % 26) as u8)));
            out.push(' ');
        }
        out.truncate(len.max(head.len()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_and_sized() {
        assert_eq!(SplitMix64::new(7).next_u64(), SplitMix64::new(7).next_u64());
        assert_ne!(SplitMix64::new(7).next_u64(), SplitMix64::new(8).next_u64());
        let mut r = SplitMix64::new(1);
        assert!((0..1000).map(|_| r.unit()).all(|u| (0.0..1.0).contains(&u)));
        assert_eq!(r.text("ab ", 16).len(), 16);
        assert_eq!(r.text("a long head", 4), "a long head");
        let mut v: Vec<u32> = (0..50).collect();
        r.shuffle(&mut v);
        v.sort_unstable();
        assert_eq!(v, (0..50).collect::<Vec<_>>());
    }
}
