//! Unpredictable upstream query IDs.
//!
//! With long-lived upstream sockets the source port changes only when a socket is rotated
//! (every few thousand queries), not per query, so the 16-bit ID is most of what an off-path
//! spoofer has to guess. IDs therefore come from the
//! kernel's CSPRNG (`getrandom`), fetched 256 at a time so a query costs a copy, not a syscall.

use std::hash::{BuildHasher, Hasher};

/// A per-task buffer of random IDs.
pub(crate) struct IdSource {
    buf: [u8; 512],
    pos: usize,
    /// Used only if the kernel's generator fails: SipHash over a counter with a random key.
    fallback: u64,
}

impl IdSource {
    /// An empty source; the first call fills it.
    pub(crate) fn new() -> Self {
        Self {
            buf: [0; 512],
            pos: 512,
            fallback: 0,
        }
    }

    /// The next random ID.
    pub(crate) fn next_id(&mut self) -> u16 {
        if self.pos + 2 > self.buf.len() {
            self.refill();
        }
        let id = u16::from_be_bytes([self.buf[self.pos], self.buf[self.pos + 1]]);
        self.pos += 2;
        id
    }

    fn refill(&mut self) {
        if getrandom::fill(&mut self.buf).is_err() {
            // Never seen on Linux; keep answering with keyed-hash IDs rather than stop.
            let state = std::collections::hash_map::RandomState::new();
            for chunk in self.buf.chunks_mut(8) {
                self.fallback = self.fallback.wrapping_add(1);
                let mut h = state.build_hasher();
                h.write_u64(self.fallback);
                let bytes = h.finish().to_be_bytes();
                chunk.copy_from_slice(&bytes[..chunk.len()]);
            }
        }
        self.pos = 0;
    }
}

/// Hashes the in-flight tables' `u16` keys: they are random already, so a multiply spreads
/// them over the hash's bits without SipHash's cost.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u16(&mut self, n: u16) {
        self.0 = u64::from(n);
    }
}

/// Builds [`IdHasher`]s.
pub(crate) type BuildIdHasher = std::hash::BuildHasherDefault<IdHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_not_sequential_and_cover_the_space() {
        let mut ids = IdSource::new();
        let v: Vec<u16> = (0..4096).map(|_| ids.next_id()).collect();
        let sequential = v
            .windows(2)
            .filter(|w| w[1] == w[0].wrapping_add(1))
            .count();
        assert!(sequential < 4);
        let distinct: std::collections::HashSet<_> = v.iter().collect();
        assert!(distinct.len() > 3500);
        assert!(v.iter().any(|&i| i > 0x8000) && v.iter().any(|&i| i < 0x8000));
    }
}
