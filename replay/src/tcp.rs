//! DNS over TCP: per-direction stream reassembly and the 2-byte length framing (RFC 7766).
//!
//! Each direction of a connection is a stream keyed by (source, destination). A stream starts
//! at its SYN, or at the first segment seen when the capture began mid-connection. In-order
//! bytes are appended to a buffer from which whole messages are cut; segments ahead of the
//! next expected byte wait in an ordered map; overlaps and retransmissions are trimmed.
//!
//! A hole (a segment the capture never saw) is skipped when the stream closes (FIN or RST),
//! when the data waiting behind it exceeds the per-stream cap, when it has stayed open for
//! [`Limits::tcp_hole_timeout`] of capture time, or at the end of the trace. The partial message
//! before the hole is dropped and the stream *resyncs*: it looks for a length prefix followed
//! by a plausible header and a message that decodes whole ([`crate::dns::is_whole_message`]),
//! which is also how a stream without a SYN finds its first boundary.
//!
//! Memory is bounded: bytes per stream, bytes in all, and the number of streams (the least
//! recently seen are evicted first); idle streams are forgotten after
//! [`Limits::tcp_idle_timeout`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use crate::dns::{is_whole_message, plausible_header};
use crate::extract::{Counters, Limits};

/// One direction of a TCP connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct FlowKey {
    pub(crate) src: SocketAddr,
    pub(crate) dst: SocketAddr,
}

/// The flags of a segment that matter here.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Flags {
    pub(crate) syn: bool,
    pub(crate) fin: bool,
    pub(crate) rst: bool,
}

#[derive(Debug, Default)]
struct Stream {
    /// Sequence number of relative offset 0.
    base: u32,
    /// Relative offset of the next expected byte.
    next: u32,
    /// In-order bytes not yet cut into messages.
    buf: Vec<u8>,
    /// Segments ahead of `next`, by relative offset.
    ahead: BTreeMap<u32, Vec<u8>>,
    ahead_bytes: usize,
    /// Whether `buf` starts at a message boundary.
    synced: bool,
    /// Unsynced: offsets of `buf` below this are known not to start a message.
    scan_from: usize,
    last_seen: Duration,
    hole_since: Option<Duration>,
    /// FIN or RST seen: later data is a retransmission.
    closed: bool,
}

impl Stream {
    fn held(&self) -> usize {
        self.buf.len() + self.ahead_bytes
    }
}

/// Every stream.
#[derive(Debug, Default)]
pub(crate) struct Reassembler {
    streams: HashMap<FlowKey, Stream>,
    bytes: usize,
    next_sweep: Duration,
}

impl Reassembler {
    /// Streams held.
    pub(crate) fn len(&self) -> usize {
        self.streams.len()
    }

    /// Whether the running byte count equals what the streams hold (the memory bound relies
    /// on it; checked by the fuzz target).
    pub(crate) fn accounting_holds(&self) -> bool {
        self.bytes == self.streams.values().map(Stream::held).sum::<usize>()
    }

    /// Takes one segment; `out` hears every message it completes.
    #[allow(
        clippy::too_many_arguments,
        reason = "one segment's fields, passed through"
    )]
    pub(crate) fn segment(
        &mut self,
        key: FlowKey,
        seq: u32,
        flags: Flags,
        payload: &[u8],
        now: Duration,
        limits: &Limits,
        counters: &mut Counters,
        out: &mut dyn FnMut(FlowKey, Duration, &[u8]),
    ) {
        counters.tcp_segments += 1;
        if now >= self.next_sweep {
            self.sweep(now, limits, counters, out);
            self.next_sweep = now + Duration::from_secs(10);
        }
        if !self.streams.contains_key(&key) {
            if payload.is_empty() && !flags.syn {
                return;
            }
            if self.streams.len() >= limits.tcp_max_streams {
                self.evict(now, limits, counters, out);
            }
            counters.tcp_streams += 1;
            let (base, synced) = if flags.syn {
                (seq.wrapping_add(1), true)
            } else {
                counters.tcp_streams_without_syn += 1;
                (seq, false)
            };
            self.streams.insert(
                key,
                Stream {
                    base,
                    synced,
                    last_seen: now,
                    ..Stream::default()
                },
            );
        }
        let Some(stream) = self.streams.get_mut(&key) else {
            return;
        };
        // This stream's bytes are taken out of the total while it changes.
        let others = self.bytes - stream.held();
        if flags.syn && seq.wrapping_add(1) != stream.base {
            // A new connection on the same ports: start over.
            *stream = Stream {
                base: seq.wrapping_add(1),
                synced: true,
                last_seen: now,
                ..Stream::default()
            };
            counters.tcp_streams += 1;
        }
        stream.last_seen = now;
        if stream.closed {
            if !payload.is_empty() {
                counters.tcp_retransmitted_segments += 1;
            }
            self.bytes = others + stream.held();
            return;
        }
        let start = if flags.syn { seq.wrapping_add(1) } else { seq };
        if !payload.is_empty() {
            add_data(stream, others, start, payload, now, limits, counters);
        }
        frame(stream, key, now, false, counters, out);
        let hole_too_old = stream
            .hole_since
            .is_some_and(|since| now.saturating_sub(since) > limits.tcp_hole_timeout);
        if hole_too_old || stream.held() > limits.tcp_max_stream_bytes {
            skip_hole(stream, key, now, counters, out);
        }
        if flags.fin || flags.rst {
            close(stream, key, now, counters, out);
        }
        self.bytes = others + stream.held();
    }

    /// End of the trace: every stream gives up its holes and what it can still frame.
    pub(crate) fn finish(
        &mut self,
        counters: &mut Counters,
        out: &mut dyn FnMut(FlowKey, Duration, &[u8]),
    ) {
        for (key, stream) in &mut self.streams {
            let at = stream.last_seen;
            close(stream, *key, at, counters, out);
        }
        self.streams.clear();
        self.bytes = 0;
    }

    fn sweep(
        &mut self,
        now: Duration,
        limits: &Limits,
        counters: &mut Counters,
        out: &mut dyn FnMut(FlowKey, Duration, &[u8]),
    ) {
        let bytes = &mut self.bytes;
        self.streams.retain(|key, stream| {
            if now.saturating_sub(stream.last_seen) <= limits.tcp_idle_timeout {
                return true;
            }
            *bytes -= stream.held();
            let at = stream.last_seen;
            close(stream, *key, at, counters, out);
            false
        });
    }

    /// Makes room for a new stream: forgets idle ones, then the least recently seen eighth.
    fn evict(
        &mut self,
        now: Duration,
        limits: &Limits,
        counters: &mut Counters,
        out: &mut dyn FnMut(FlowKey, Duration, &[u8]),
    ) {
        self.sweep(now, limits, counters, out);
        if self.streams.len() < limits.tcp_max_streams {
            return;
        }
        let mut ages: Vec<(Duration, FlowKey)> = self
            .streams
            .iter()
            .map(|(k, s)| (s.last_seen, *k))
            .collect();
        let n = (ages.len() / 8).max(1);
        ages.select_nth_unstable_by_key(n - 1, |(seen, _)| *seen);
        for (_, key) in ages.into_iter().take(n) {
            if let Some(mut stream) = self.streams.remove(&key) {
                self.bytes -= stream.held();
                let at = stream.last_seen;
                close(&mut stream, key, at, counters, out);
                counters.tcp_streams_evicted += 1;
            }
        }
    }
}

/// Places a segment's bytes. `others`: bytes held by every other stream.
fn add_data(
    stream: &mut Stream,
    others: usize,
    seq: u32,
    payload: &[u8],
    now: Duration,
    limits: &Limits,
    counters: &mut Counters,
) {
    let rel = seq.wrapping_sub(stream.base);
    let ahead = rel.wrapping_sub(stream.next) as i32;
    let len = payload.len();
    if i64::from(ahead) + len as i64 <= 0 {
        counters.tcp_retransmitted_segments += 1;
        return;
    }
    if ahead <= 0 {
        let skip = ahead.unsigned_abs() as usize;
        let fresh = &payload[skip..];
        if others + stream.held() + fresh.len() > limits.tcp_max_total_bytes {
            counters.tcp_dropped_bytes += fresh.len() as u64;
            return;
        }
        if skip > 0 {
            counters.tcp_retransmitted_segments += 1;
        }
        stream.buf.extend_from_slice(fresh);
        stream.next = stream.next.wrapping_add(fresh.len() as u32);
        // Segments that waited for this one.
        while let Some(entry) = stream.ahead.first_entry() {
            let at = *entry.key();
            let d = at.wrapping_sub(stream.next) as i32;
            if d > 0 {
                break;
            }
            let data = entry.remove();
            stream.ahead_bytes -= data.len();
            let skip = d.unsigned_abs() as usize;
            if let Some(fresh) = data.get(skip..) {
                stream.buf.extend_from_slice(fresh);
                stream.next = stream.next.wrapping_add(fresh.len() as u32);
            }
        }
        stream.hole_since = if stream.ahead.is_empty() {
            None
        } else {
            stream.hole_since.or(Some(now))
        };
        return;
    }
    counters.tcp_out_of_order_segments += 1;
    if others + stream.held() + len > limits.tcp_max_total_bytes {
        counters.tcp_dropped_bytes += len as u64;
        return;
    }
    let slot = stream.ahead.entry(rel).or_default();
    if slot.len() < len {
        stream.ahead_bytes += len - slot.len();
        slot.clear();
        slot.extend_from_slice(payload);
    }
    stream.hole_since = stream.hole_since.or(Some(now));
}

/// Cuts whole messages out of the buffer. `forced`: no more bytes will come before a hole or
/// the end, so a candidate boundary that needs more bytes is not one.
fn frame(
    stream: &mut Stream,
    key: FlowKey,
    now: Duration,
    forced: bool,
    counters: &mut Counters,
    out: &mut dyn FnMut(FlowKey, Duration, &[u8]),
) {
    let mut pos = 0;
    loop {
        if !stream.synced {
            match resync(&stream.buf, pos.max(stream.scan_from), forced) {
                Resync::Found(at) => {
                    counters.tcp_skipped_bytes += (at - pos) as u64;
                    pos = at;
                    stream.synced = true;
                    stream.scan_from = 0;
                }
                Resync::Wait(at) => {
                    counters.tcp_skipped_bytes += (at - pos) as u64;
                    pos = at;
                    stream.scan_from = 0;
                    break;
                }
            }
        }
        let rest = &stream.buf[pos..];
        let Some(prefix) = rest.get(..2) else { break };
        let len = usize::from(u16::from_be_bytes([prefix[0], prefix[1]]));
        if len < 12 {
            // Not a DNS message boundary: the stream lost its framing.
            stream.synced = false;
            stream.scan_from = pos + 1;
            counters.tcp_desyncs += 1;
            continue;
        }
        let Some(msg) = rest.get(2..2 + len) else {
            break;
        };
        counters.tcp_messages += 1;
        out(key, now, msg);
        pos += 2 + len;
    }
    if pos > 0 {
        stream.scan_from = stream.scan_from.saturating_sub(pos);
        stream.buf.drain(..pos);
    }
}

enum Resync {
    /// A message starts here.
    Found(usize),
    /// Nothing before this offset starts one; wait for more bytes.
    Wait(usize),
}

/// Looks for a message boundary in `buf` from `from`.
fn resync(buf: &[u8], from: usize, forced: bool) -> Resync {
    let mut at = from;
    while at + 14 <= buf.len() {
        let len = usize::from(u16::from_be_bytes([buf[at], buf[at + 1]]));
        if plausible_header(&buf[at + 2..], len) {
            match buf.get(at + 2..at + 2 + len) {
                Some(msg) if is_whole_message(msg) => return Resync::Found(at),
                Some(_) => {}
                None if !forced => return Resync::Wait(at),
                None => {}
            }
        }
        at += 1;
    }
    Resync::Wait(if forced { buf.len() } else { at })
}

/// Gives up on the hole before the first waiting segment: drops the partial message and
/// continues (unsynced) from that segment.
fn skip_hole(
    stream: &mut Stream,
    key: FlowKey,
    now: Duration,
    counters: &mut Counters,
    out: &mut dyn FnMut(FlowKey, Duration, &[u8]),
) {
    while let Some((at, data)) = stream.ahead.pop_first() {
        stream.ahead_bytes -= data.len();
        let d = at.wrapping_sub(stream.next) as i32;
        if d > 0 {
            counters.tcp_gaps += 1;
            counters.tcp_gap_bytes += u64::from(d.unsigned_abs());
            frame(stream, key, now, true, counters, out);
            counters.tcp_skipped_bytes += stream.buf.len() as u64;
            stream.buf.clear();
            stream.synced = false;
            stream.scan_from = 0;
            stream.next = at;
        }
        let skip = d.min(0).unsigned_abs() as usize;
        if let Some(fresh) = data.get(skip..) {
            stream.buf.extend_from_slice(fresh);
            stream.next = stream.next.wrapping_add(fresh.len() as u32);
        }
        frame(stream, key, now, false, counters, out);
    }
    stream.hole_since = None;
}

/// FIN, RST, eviction or the end: skip every hole, frame what is left, free the buffers.
fn close(
    stream: &mut Stream,
    key: FlowKey,
    now: Duration,
    counters: &mut Counters,
    out: &mut dyn FnMut(FlowKey, Duration, &[u8]),
) {
    skip_hole(stream, key, now, counters, out);
    frame(stream, key, now, true, counters, out);
    counters.tcp_skipped_bytes += stream.buf.len() as u64;
    stream.buf = Vec::new();
    stream.ahead.clear();
    stream.ahead_bytes = 0;
    stream.closed = true;
}
