//! Order statistics for the bench: percentiles of latency samples and medians across rounds.

/// The `q`-quantile (0.0..=1.0) of `sorted` by the nearest-rank method; `None` when empty.
pub fn percentile(sorted: &[u32], q: f64) -> Option<u32> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.saturating_sub(1).min(last)).copied()
}

/// The `q`-quantile (0.0..=1.0) of `sorted` samples by the nearest-rank method; `None` when empty.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.saturating_sub(1).min(last)).copied()
}

/// The median of `values` (mean of the middle two for an even count); `None` when empty or when a value is NaN.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// The median of the values that are present; `None` when none is.
pub fn median_of(values: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    median(&values.into_iter().flatten().collect::<Vec<_>>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[7], 0.99), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
        let f: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&f, 0.99), Some(99.0));
        assert_eq!(quantile(&f, 0.5), Some(50.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median_of([Some(1.0), None, Some(3.0)]), Some(2.0));
        assert_eq!(median_of([None]), None);
    }
}
