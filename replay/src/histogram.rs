//! A fixed-size log-linear histogram of nanosecond durations: 32 sub-buckets per power of two
//! (≤ 3.2 % relative error), constant memory whatever the number of samples.

const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
const GROUPS: usize = 64 - SUB_BITS as usize + 1;

/// Durations in nanoseconds.
#[derive(Debug, Clone)]
pub(crate) struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; GROUPS * SUB],
            total: 0,
            sum: 0,
            max: 0,
        }
    }
}

fn bucket(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - SUB_BITS;
    let group = (shift + 1) as usize;
    let sub = ((v >> shift) as usize) & (SUB - 1);
    group * SUB + sub
}

/// The smallest value that lands in bucket `i`.
fn lower_bound(i: usize) -> u64 {
    let (group, sub) = (i / SUB, (i % SUB) as u64);
    if group == 0 {
        return sub;
    }
    let shift = (group - 1) as u32;
    (SUB as u64 + sub) << shift
}

impl Histogram {
    /// Adds a sample.
    pub(crate) fn record(&mut self, ns: u64) {
        if let Some(c) = self.counts.get_mut(bucket(ns)) {
            *c += 1;
        }
        self.total += 1;
        self.sum += u128::from(ns);
        self.max = self.max.max(ns);
    }

    /// The value at quantile `q` (0..=1), as the lower bound of its bucket (the largest sample
    /// for the last rank); 0 when empty.
    pub(crate) fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        if rank >= self.total {
            return self.max;
        }
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return lower_bound(i).min(self.max);
            }
        }
        self.max
    }

    /// The mean; 0 when empty.
    pub(crate) fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// The largest sample.
    pub(crate) fn max(&self) -> u64 {
        self.max
    }

    /// The sum of all samples.
    pub(crate) fn sum(&self) -> u128 {
        self.sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_the_bucket_error() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 - 5000.0).abs() / 5000.0 < 0.04, "{p50}");
        assert!((p99 - 9900.0).abs() / 9900.0 < 0.04, "{p99}");
        assert_eq!(h.max(), 10_000);
        for i in 0..GROUPS * SUB {
            assert_eq!(bucket(lower_bound(i)), i);
        }
        h.record(u64::MAX);
        assert_eq!(h.quantile(1.0), u64::MAX);
    }
}
