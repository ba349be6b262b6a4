//! Entry points for the cargo-fuzz targets in `fuzz/`; not an API. They drive the private
//! DNS-over-TCP stream reassembler directly, without a capture around it.

use std::net::SocketAddr;
use std::time::Duration;

use crate::extract::{Counters, Limits};
use crate::tcp::{Flags, FlowKey, Reassembler};

/// One TCP segment of one of a few flows.
#[derive(Debug, Clone, Default)]
pub struct Segment {
    /// Which flow (a few distinct connections are made from it).
    pub flow: u8,
    /// Sequence number of its first byte (of the SYN, when `syn`).
    pub seq: u32,
    /// SYN flag.
    pub syn: bool,
    /// FIN flag.
    pub fin: bool,
    /// RST flag.
    pub rst: bool,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Capture time.
    pub at: Duration,
}

/// The flow key of flow `n`: 192.0.2.1:(1024 + n) → 192.0.2.53:53.
fn key(n: u8) -> FlowKey {
    FlowKey {
        src: SocketAddr::from(([192, 0, 2, 1], 1024 + u16::from(n))),
        dst: SocketAddr::from(([192, 0, 2, 53], 53)),
    }
}

/// Feeds `segments` to the reassembler (then ends the trace) and returns every message cut,
/// with its flow. Panics if the reassembler's byte accounting, on which its memory bound
/// rests, ever disagrees with what its streams hold, or if a message is longer than 65535
/// bytes.
pub fn tcp_reassemble(segments: &[Segment], limits: &Limits) -> (Vec<(u8, Vec<u8>)>, Counters) {
    let mut reassembler = Reassembler::default();
    let mut counters = Counters::default();
    let mut messages = Vec::new();
    let mut out = |k: FlowKey, _: Duration, msg: &[u8]| {
        assert!(
            msg.len() <= 65_535,
            "a message longer than its framing allows"
        );
        let flow = u8::try_from(k.src.port() - 1024).unwrap_or(u8::MAX);
        messages.push((flow, msg.to_vec()));
    };
    for s in segments {
        let flags = Flags {
            syn: s.syn,
            fin: s.fin,
            rst: s.rst,
        };
        reassembler.segment(
            key(s.flow),
            s.seq,
            flags,
            &s.payload,
            s.at,
            limits,
            &mut counters,
            &mut out,
        );
        assert!(reassembler.accounting_holds(), "byte accounting drifted");
    }
    reassembler.finish(&mut counters, &mut out);
    (messages, counters)
}
