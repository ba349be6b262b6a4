//! IP fragment reassembly with bounds: at most `max_datagrams` datagrams in progress and
//! `max_bytes` buffered in all, each given up after `timeout` of capture time (Linux's
//! `ipfrag_time` is 30 s). etherparse's [`IpDefragBuf`] puts each datagram together.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use etherparse::IpFragOffset;
use etherparse::defrag::IpDefragBuf;

use crate::extract::{Counters, Limits};

/// What identifies the fragments of one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct FragKey {
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
    pub(crate) id: u32,
    pub(crate) proto: u8,
}

#[derive(Debug)]
struct Pending {
    buf: IpDefragBuf,
    first: Duration,
}

/// Datagrams being put together.
#[derive(Debug, Default)]
pub(crate) struct FragPool {
    pending: HashMap<FragKey, Pending>,
    bytes: usize,
    spare: Vec<Vec<u8>>,
    next_sweep: Duration,
}

impl FragPool {
    /// Adds a fragment; returns the whole datagram's payload when this completed it.
    #[allow(
        clippy::too_many_arguments,
        reason = "one fragment's fields, passed through"
    )]
    pub(crate) fn add(
        &mut self,
        key: FragKey,
        offset: IpFragOffset,
        more: bool,
        payload: &[u8],
        now: Duration,
        limits: &Limits,
        counters: &mut Counters,
    ) -> Option<Vec<u8>> {
        counters.ip_fragments += 1;
        if now >= self.next_sweep {
            self.expire(now, limits, counters);
            self.next_sweep = now + Duration::from_secs(1);
        }
        if !self.pending.contains_key(&key) && self.pending.len() >= limits.max_fragmented_datagrams
        {
            self.drop_oldest(counters);
        }
        let spare = &mut self.spare;
        let entry = self.pending.entry(key).or_insert_with(|| Pending {
            buf: IpDefragBuf::new(
                etherparse::IpNumber(key.proto),
                spare.pop().unwrap_or_default(),
                Vec::new(),
            ),
            first: now,
        });
        let before = entry.buf.data().len();
        let added = entry.buf.add(offset, more, payload);
        let after = entry.buf.data().len();
        let complete = entry.buf.is_complete();
        self.bytes = (self.bytes + after).saturating_sub(before);
        if added.is_err() || self.bytes > limits.max_fragment_bytes {
            counters.ip_fragments_dropped += 1;
            self.remove(&key);
            return None;
        }
        if !complete {
            return None;
        }
        let done = self.pending.remove(&key)?;
        let (data, _) = done.buf.take_bufs();
        self.bytes = self.bytes.saturating_sub(data.len());
        counters.ip_datagrams_reassembled += 1;
        Some(data)
    }

    /// Gives a finished datagram's buffer back for reuse.
    pub(crate) fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.spare.len() < 16 && buf.capacity() <= 1 << 16 {
            buf.clear();
            self.spare.push(buf);
        }
    }

    /// Forgets datagrams older than the timeout.
    pub(crate) fn expire(&mut self, now: Duration, limits: &Limits, counters: &mut Counters) {
        let old: Vec<FragKey> = self
            .pending
            .iter()
            .filter(|(_, p)| now.saturating_sub(p.first) > limits.fragment_timeout)
            .map(|(k, _)| *k)
            .collect();
        for key in old {
            counters.ip_fragments_dropped += 1;
            self.remove(&key);
        }
    }

    /// Datagrams in progress.
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    fn drop_oldest(&mut self, counters: &mut Counters) {
        if let Some(key) = self
            .pending
            .iter()
            .min_by_key(|(_, p)| p.first)
            .map(|(k, _)| *k)
        {
            counters.ip_fragments_dropped += 1;
            self.remove(&key);
        }
    }

    fn remove(&mut self, key: &FragKey) {
        if let Some(p) = self.pending.remove(key) {
            let (data, _) = p.buf.take_bufs();
            self.bytes = self.bytes.saturating_sub(data.len());
            self.recycle(data);
        }
    }
}
