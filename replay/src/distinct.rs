//! Counting distinct names and addresses in bounded memory: exact (a set of 64-bit hashes)
//! up to a limit, then a HyperLogLog estimate (2^14 registers, about 0.8 % standard error),
//! so that a capture with a new name in every query (tunnels, exfiltration) does not make
//! memory grow with its length.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// Registers: 2^PRECISION.
const PRECISION: u32 = 14;
const REGISTERS: usize = 1 << PRECISION;

/// Distinct values seen, exact up to `limit`.
#[derive(Debug, Clone)]
pub(crate) struct Distinct {
    exact: Option<HashSet<u64, BuildHasherDefault<Identity>>>,
    limit: usize,
    registers: Vec<u8>,
}

/// The keys are already hashes.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Identity(u64);

impl Hasher for Identity {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A 64-bit hash of `value` with well-mixed bits (folded-multiply words, SplitMix64 finish).
pub(crate) fn hash64(value: &(impl Hash + ?Sized)) -> u64 {
    let mut h = Words(0);
    value.hash(&mut h);
    let mut z = h.0;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Words(u64);

impl Hasher for Words {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Words {
    /// Folded multiply (as in wyhash/foldhash): both halves of the 128-bit product, so a
    /// difference anywhere in the word reaches every bit.
    fn add(&mut self, word: u64) {
        let p = u128::from(self.0 ^ word ^ 0x2d35_8dcc_aa6c_78a5)
            * u128::from(0x9e37_79b9_7f4a_7c15u64);
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
}

impl Distinct {
    /// Exact up to `limit` distinct values.
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            exact: Some(HashSet::default()),
            limit,
            registers: vec![0; REGISTERS],
        }
    }

    /// Notes a value by its [`hash64`]; returns whether it was new (always `true` once only
    /// the estimate is kept and the value's register grew, else a best guess).
    pub(crate) fn insert(&mut self, hash: u64) -> bool {
        let index = (hash >> (64 - PRECISION)) as usize;
        let rank = ((hash << PRECISION) | (1 << (PRECISION - 1))).leading_zeros() as u8 + 1;
        let grew = match self.registers.get_mut(index) {
            Some(r) if *r < rank => {
                *r = rank;
                true
            }
            _ => false,
        };
        match &mut self.exact {
            Some(set) => {
                let new = set.insert(hash);
                if set.len() > self.limit {
                    self.exact = None;
                }
                new
            }
            None => grew,
        }
    }

    /// Whether the count is exact.
    pub(crate) fn is_exact(&self) -> bool {
        self.exact.is_some()
    }

    /// The number of distinct values (exact, or the HyperLogLog estimate).
    pub(crate) fn count(&self) -> usize {
        if let Some(set) = &self.exact {
            return set.len();
        }
        let m = REGISTERS as f64;
        let sum: f64 = self
            .registers
            .iter()
            .map(|r| 2f64.powi(-i32::from(*r)))
            .sum();
        let alpha = 0.7213 / (1.0 + 1.079 / m);
        let raw = alpha * m * m / sum;
        let zeros = self.registers.iter().filter(|r| **r == 0).count();
        let estimate = if raw <= 2.5 * m && zeros > 0 {
            m * (m / zeros as f64).ln()
        } else {
            raw
        };
        estimate.round() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_differ_in_one_byte_do_not_collide() {
        let mut seen = HashSet::new();
        for i in 0..200_000u32 {
            assert!(seen.insert(hash64(format!("host-{i}.example.com.").as_str())));
            assert!(seen.insert(hash64(format!("bucket-{i}.s3.amazonaws.com.").as_str())));
        }
    }

    #[test]
    fn exact_below_the_limit_then_estimated_within_two_percent() {
        let mut d = Distinct::new(1000);
        for i in 0..1000u32 {
            d.insert(hash64(&format!("name-{i}.example.com.")));
            d.insert(hash64(&format!("name-{i}.example.com.")));
        }
        assert!(d.is_exact());
        assert_eq!(d.count(), 1000);
        for i in 1000..200_000u32 {
            d.insert(hash64(&format!("name-{i}.example.com.")));
        }
        assert!(!d.is_exact());
        let n = d.count() as f64;
        assert!((n - 200_000.0).abs() / 200_000.0 < 0.02, "{n}");
    }
}
