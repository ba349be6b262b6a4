//! TCP segments → replay's DNS-over-TCP stream reassembler
//! (`fqdnd_replay::fuzz::tcp_reassemble`).
//!
//! Two modes, by the first byte's low bit:
//! - **free**: arbitrary segments of up to four flows (sequence numbers, SYN/FIN/RST, times,
//!   payloads) under small limits, so that holes, overlaps, retransmissions, resyncs, caps and
//!   evictions all happen. Invariants: never panics, no message over 65535 bytes, the byte
//!   accounting behind the memory bound never drifts (checked after every segment).
//! - **exact**: one connection whose stream is a sequence of DNS-sized messages (each at least
//!   12 bytes), cut into segments that are delivered in any order, some of them twice, after
//!   the SYN. Invariant: the messages cut are exactly the stream's, in order, whatever the
//!   segmentation, reordering and duplication.
#![no_main]

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use fqdnd_replay::extract::Limits;
use fqdnd_replay::fuzz::{Segment, tcp_reassemble};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct FreeSegment {
    flow: u8,
    seq: u32,
    flags: u8,
    at_ms: u16,
    payload: Vec<u8>,
}

fn free(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
    let limits = Limits {
        tcp_max_streams: 3,
        tcp_max_stream_bytes: 600,
        tcp_max_total_bytes: 1500,
        tcp_hole_timeout: Duration::from_millis(500),
        tcp_idle_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let mut at = Duration::ZERO;
    let mut segments = Vec::new();
    for s in u.arbitrary_iter::<FreeSegment>()? {
        let s = s?;
        at += Duration::from_millis(u64::from(s.at_ms % 1000));
        segments.push(Segment {
            flow: s.flow % 4,
            seq: s.seq,
            syn: s.flags & 1 != 0,
            fin: s.flags & 2 != 0,
            rst: s.flags & 4 != 0,
            payload: s.payload,
            at,
        });
    }
    tcp_reassemble(&segments, &limits);
    Ok(())
}

fn exact(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
    let isn: u32 = u.arbitrary()?;
    // The messages: each 12..=600 bytes of fuzzer data.
    let mut messages: Vec<Vec<u8>> = Vec::new();
    let mut stream = Vec::new();
    for _ in 0..u.int_in_range(1..=8)? {
        let len = u.int_in_range(12..=600usize)?;
        let msg = u.bytes(len.min(u.len()))?.to_vec();
        if msg.len() < 12 {
            break;
        }
        stream.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        stream.extend_from_slice(&msg);
        messages.push(msg);
    }
    // Cut into segments at fuzzer-chosen sizes.
    let mut segments = Vec::new();
    let mut offset = 0usize;
    while offset < stream.len() {
        let len = u.int_in_range(1..=300usize)?.min(stream.len() - offset);
        segments.push(Segment {
            flow: 0,
            seq: isn.wrapping_add(1).wrapping_add(offset as u32),
            payload: stream[offset..offset + len].to_vec(),
            ..Segment::default()
        });
        offset += len;
    }
    // Reorder and duplicate some.
    let mut delivered = Vec::with_capacity(segments.len() * 2);
    for s in &segments {
        delivered.push(s.clone());
        if u.arbitrary::<u8>()? % 4 == 0 {
            delivered.push(s.clone());
        }
    }
    for i in (1..delivered.len()).rev() {
        let j = u.int_in_range(0..=i)?;
        delivered.swap(i, j);
    }
    let syn = Segment {
        flow: 0,
        seq: isn,
        syn: true,
        ..Segment::default()
    };
    delivered.insert(0, syn);
    let (out, _) = tcp_reassemble(&delivered, &Limits::default());
    let got: Vec<Vec<u8>> = out.into_iter().map(|(_, m)| m).collect();
    assert_eq!(
        got, messages,
        "reassembly lost, reordered or invented a message"
    );
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut u = Unstructured::new(rest);
    let _ = if mode & 1 == 0 {
        free(&mut u)
    } else {
        exact(&mut u)
    };
});
