//! From captured frames to DNS messages: link layer, IP (with fragment reassembly), UDP and
//! TCP (with stream reassembly), filtered on the DNS ports.
//!
//! The API is small so that it can be fuzzed: an [`Extractor`] takes [`Frame`]s and hands
//! every DNS message it finds to a callback as a [`DnsPayload`] (timestamp, source,
//! destination, transport, bytes). It never panics, whatever the bytes; what it cannot use is
//! counted in [`Counters`] and skipped. [`extract_bytes`] runs the whole path, gzip and capture
//! format included, over bytes in memory.
//!
//! Link layers: Ethernet II with any number of 802.1Q/802.1ad tags (up to 4) and PPPoE
//! sessions, Linux cooked capture v1 and v2, BSD/OpenBSD loopback, raw IP. Network layer: IPv4
//! and IPv6 (with extension headers), sliced with etherparse's lax slicer so that frames cut
//! by the snap length are recognised (and counted, not used).

use std::io::Cursor;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use etherparse::{IpNumber, LaxIpSlice, TcpSlice, UdpSlice};
use serde::Serialize;

use crate::capture::{CaptureError, CaptureReader, Frame, linktype};
use crate::defrag::{FragKey, FragPool};
use crate::record::Note;
use crate::tcp::{Flags, FlowKey, Reassembler};

/// How a message travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// One UDP datagram.
    Udp,
    /// Cut out of a reassembled TCP stream.
    Tcp,
}

/// A DNS message found in the capture.
#[derive(Debug, Clone, Copy)]
pub struct DnsPayload<'a> {
    /// Capture time (since the Unix epoch) of the frame that completed the message.
    pub ts: Duration,
    /// Sender.
    pub src: SocketAddr,
    /// Receiver.
    pub dst: SocketAddr,
    /// UDP or TCP.
    pub transport: Transport,
    /// The DNS message (without the TCP length prefix).
    pub bytes: &'a [u8],
    /// What `fqdnd record` wrote beside the message (the comment of the frame that completed
    /// it), if the capture is one of its recordings.
    pub note: Option<Note<'a>>,
}

impl DnsPayload<'_> {
    /// How the message travelled: the transport the recording's note names, else the
    /// capture's (older recordings wrote a message that came over TCP as a datagram, with
    /// `transport=tcp` in its note).
    pub fn used_transport(&self) -> Transport {
        self.note.map_or(self.transport, |n| n.transport)
    }

    /// DoT or DoH, when the recording's note says the query came encrypted.
    pub fn encryption(&self) -> Option<crate::record::Encryption> {
        self.note.and_then(|n| n.encrypted)
    }

    /// The endpoint the recording's note says the kernel named for the client's socket (node
    /// mode's host processes, whose address is the host's), if any.
    pub fn socket_endpoint(&self) -> Option<u16> {
        self.note.filter(|n| n.by_socket).and_then(|n| n.endpoint)
    }
}

/// Bounds on reassembly state. The defaults hold a few tens of MiB at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// IP datagrams being reassembled at once.
    pub max_fragmented_datagrams: usize,
    /// Bytes buffered for IP reassembly in all.
    pub max_fragment_bytes: usize,
    /// A datagram whose fragments did not all come within this is dropped.
    pub fragment_timeout: Duration,
    /// TCP streams (one per direction) tracked at once.
    pub tcp_max_streams: usize,
    /// Bytes one stream may hold (unframed plus waiting behind a hole).
    pub tcp_max_stream_bytes: usize,
    /// Bytes all streams may hold.
    pub tcp_max_total_bytes: usize,
    /// A hole still open after this much capture time is skipped.
    pub tcp_hole_timeout: Duration,
    /// A stream with no segment for this long is forgotten.
    pub tcp_idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_fragmented_datagrams: 4096,
            max_fragment_bytes: 16 << 20,
            fragment_timeout: Duration::from_secs(30),
            tcp_max_streams: 65_536,
            tcp_max_stream_bytes: 256 << 10,
            tcp_max_total_bytes: 64 << 20,
            tcp_hole_timeout: Duration::from_secs(5),
            tcp_idle_timeout: Duration::from_secs(120),
        }
    }
}

/// What the extractor saw and skipped. Every field is a count since the start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Frames read.
    pub frames: u64,
    /// Bytes captured in those frames.
    pub frame_bytes: u64,
    /// Frames of a link type this reader does not decode.
    pub unsupported_link: u64,
    /// Frames that carry no IP (ARP, LLDP, …).
    pub not_ip: u64,
    /// Frames whose IP header does not decode.
    pub malformed_ip: u64,
    /// Frames cut short by the snap length before the end of their UDP or TCP payload.
    pub truncated: u64,
    /// IP packets that are neither UDP nor TCP on a DNS port.
    pub not_dns: u64,
    /// IP fragments seen.
    pub ip_fragments: u64,
    /// Datagrams put back together from fragments.
    pub ip_datagrams_reassembled: u64,
    /// Fragments' datagrams given up (timeout, bounds, inconsistent fragments).
    pub ip_fragments_dropped: u64,
    /// DNS messages in UDP datagrams.
    pub udp_messages: u64,
    /// TCP segments on a DNS port.
    pub tcp_segments: u64,
    /// TCP streams (directions) started.
    pub tcp_streams: u64,
    /// Of them, streams whose SYN was not captured.
    pub tcp_streams_without_syn: u64,
    /// Segments that arrived ahead of a missing one.
    pub tcp_out_of_order_segments: u64,
    /// Segments that carried only bytes already seen.
    pub tcp_retransmitted_segments: u64,
    /// Holes skipped (bytes the capture never had).
    pub tcp_gaps: u64,
    /// Bytes in those holes.
    pub tcp_gap_bytes: u64,
    /// Bytes dropped while looking for a message boundary, or left unframed at the end.
    pub tcp_skipped_bytes: u64,
    /// Times a stream lost its framing (a length prefix shorter than a DNS header).
    pub tcp_desyncs: u64,
    /// Bytes not kept because a bound was reached.
    pub tcp_dropped_bytes: u64,
    /// Streams evicted to make room.
    pub tcp_streams_evicted: u64,
    /// DNS messages cut out of TCP streams.
    pub tcp_messages: u64,
}

/// A set of ports, one bit each.
#[derive(Clone)]
pub struct PortSet(Box<[u64; 1024]>);

impl std::fmt::Debug for PortSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PortSet {
    /// The set of `ports`.
    pub fn new(ports: &[u16]) -> Self {
        let mut bits = Box::new([0u64; 1024]);
        for p in ports {
            bits[usize::from(*p) / 64] |= 1 << (p % 64);
        }
        Self(bits)
    }

    /// Whether `port` is in the set.
    pub fn contains(&self, port: u16) -> bool {
        self.0[usize::from(port) / 64] & (1 << (port % 64)) != 0
    }

    /// The ports, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        (0..=u16::MAX).filter(|p| self.contains(*p))
    }
}

/// Frames in, DNS messages out.
#[derive(Debug)]
pub struct Extractor {
    ports: PortSet,
    limits: Limits,
    frags: FragPool,
    tcp: Reassembler,
    counters: Counters,
}

impl Extractor {
    /// An extractor for DNS on `ports` (53 for standard DNS).
    pub fn new(ports: &[u16], limits: Limits) -> Self {
        Self {
            ports: PortSet::new(ports),
            limits,
            frags: FragPool::default(),
            tcp: Reassembler::default(),
            counters: Counters::default(),
        }
    }

    /// What was seen so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// TCP streams and fragmented datagrams held right now (for progress reports).
    pub fn state_size(&self) -> (usize, usize) {
        (self.tcp.len(), self.frags.len())
    }

    /// Takes one frame; `out` hears each DNS message it yields (TCP may yield several, or
    /// messages completed by this frame whose first bytes came earlier).
    pub fn frame(&mut self, frame: &Frame<'_>, out: &mut dyn FnMut(&DnsPayload<'_>)) {
        self.counters.frames += 1;
        self.counters.frame_bytes += frame.data.len() as u64;
        let Some(ip) = link_payload(frame.linktype, frame.data, &mut self.counters) else {
            return;
        };
        let note = frame.comment.and_then(Note::parse);
        self.ip(ip, frame.ts, note, out);
    }

    /// End of the capture: streams give up their holes and frame what they hold.
    pub fn finish(&mut self, out: &mut dyn FnMut(&DnsPayload<'_>)) {
        let mut emit = |key: FlowKey, ts: Duration, bytes: &[u8]| {
            out(&DnsPayload {
                ts,
                src: key.src,
                dst: key.dst,
                transport: Transport::Tcp,
                bytes,
                note: None,
            });
        };
        self.tcp.finish(&mut self.counters, &mut emit);
    }

    fn ip(
        &mut self,
        bytes: &[u8],
        ts: Duration,
        note: Option<Note<'_>>,
        out: &mut dyn FnMut(&DnsPayload<'_>),
    ) {
        let ip = match LaxIpSlice::from_slice(bytes) {
            Ok((ip, None)) => ip,
            Ok((_, Some(_))) | Err(_) => {
                self.counters.malformed_ip += 1;
                return;
            }
        };
        let (src, dst) = (ip.source_addr(), ip.destination_addr());
        let payload = ip.payload();
        if payload.fragmented {
            let Some((key, offset, more)) = fragment_of(&ip) else {
                self.counters.malformed_ip += 1;
                return;
            };
            if payload.incomplete {
                self.counters.truncated += 1;
                return;
            }
            let whole = self.frags.add(
                key,
                offset,
                more,
                payload.payload,
                ts,
                &self.limits,
                &mut self.counters,
            );
            if let Some(data) = whole {
                let at = (ts, note);
                self.transport(IpNumber(key.proto), src, dst, &data, false, at, out);
                self.frags.recycle(data);
            }
            return;
        }
        self.transport(
            payload.ip_number,
            src,
            dst,
            payload.payload,
            payload.incomplete,
            (ts, note),
            out,
        );
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "the decoded IP fields, passed through"
    )]
    fn transport(
        &mut self,
        proto: IpNumber,
        src: IpAddr,
        dst: IpAddr,
        payload: &[u8],
        incomplete: bool,
        (ts, note): (Duration, Option<Note<'_>>),
        out: &mut dyn FnMut(&DnsPayload<'_>),
    ) {
        match proto {
            IpNumber::UDP => {
                let Ok(udp) = UdpSlice::from_slice_lax(payload) else {
                    self.count_short(incomplete);
                    return;
                };
                let (sport, dport) = (udp.source_port(), udp.destination_port());
                if !self.ports.contains(sport) && !self.ports.contains(dport) {
                    self.counters.not_dns += 1;
                    return;
                }
                let declared = usize::from(udp.length()).saturating_sub(8);
                let body = udp.payload();
                if incomplete || (declared > body.len() && udp.length() != 0) {
                    self.counters.truncated += 1;
                    return;
                }
                self.counters.udp_messages += 1;
                out(&DnsPayload {
                    ts,
                    src: SocketAddr::new(src, sport),
                    dst: SocketAddr::new(dst, dport),
                    transport: Transport::Udp,
                    bytes: body,
                    note,
                });
            }
            IpNumber::TCP => {
                let Ok(tcp) = TcpSlice::from_slice(payload) else {
                    self.count_short(incomplete);
                    return;
                };
                let (sport, dport) = (tcp.source_port(), tcp.destination_port());
                if !self.ports.contains(sport) && !self.ports.contains(dport) {
                    self.counters.not_dns += 1;
                    return;
                }
                if incomplete {
                    self.counters.truncated += 1;
                    return;
                }
                let key = FlowKey {
                    src: SocketAddr::new(src, sport),
                    dst: SocketAddr::new(dst, dport),
                };
                let flags = Flags {
                    syn: tcp.syn(),
                    fin: tcp.fin(),
                    rst: tcp.rst(),
                };
                let this = key;
                let mut emit = |key: FlowKey, ts: Duration, bytes: &[u8]| {
                    out(&DnsPayload {
                        ts,
                        src: key.src,
                        dst: key.dst,
                        transport: Transport::Tcp,
                        bytes,
                        // The frame's note is about its own stream (others may be swept now).
                        note: note.filter(|_| key == this),
                    });
                };
                self.tcp.segment(
                    key,
                    tcp.sequence_number(),
                    flags,
                    tcp.payload(),
                    ts,
                    &self.limits,
                    &mut self.counters,
                    &mut emit,
                );
            }
            _ => self.counters.not_dns += 1,
        }
    }

    fn count_short(&mut self, incomplete: bool) {
        if incomplete {
            self.counters.truncated += 1;
        } else {
            self.counters.malformed_ip += 1;
        }
    }
}

/// The fragment identity, offset and more-fragments flag of a fragmenting packet.
fn fragment_of(ip: &LaxIpSlice<'_>) -> Option<(FragKey, etherparse::IpFragOffset, bool)> {
    match ip {
        LaxIpSlice::Ipv4(v4) => {
            let h = v4.header();
            Some((
                FragKey {
                    src: IpAddr::V4(h.source_addr()),
                    dst: IpAddr::V4(h.destination_addr()),
                    id: u32::from(h.identification()),
                    proto: v4.payload().ip_number.0,
                },
                h.fragments_offset(),
                h.more_fragments(),
            ))
        }
        LaxIpSlice::Ipv6(v6) => {
            let frag = v6
                .extensions()
                .clone()
                .into_iter()
                .find_map(|ext| match ext {
                    etherparse::Ipv6ExtensionSlice::Fragment(f) => Some(f.to_header()),
                    _ => None,
                })?;
            let h = v6.header();
            Some((
                FragKey {
                    src: IpAddr::V6(h.source_addr()),
                    dst: IpAddr::V6(h.destination_addr()),
                    id: frag.identification,
                    proto: v6.payload().ip_number.0,
                },
                frag.fragment_offset,
                frag.more_fragments,
            ))
        }
    }
}

/// The IP packet inside a frame, or `None` (counted) if there is none.
fn link_payload<'a>(linktype: i32, data: &'a [u8], counters: &mut Counters) -> Option<&'a [u8]> {
    let (ethertype, rest) = match linktype {
        linktype::ETHERNET => (be16(data, 12)?, data.get(14..)?),
        linktype::LINUX_SLL => (be16(data, 14)?, data.get(16..)?),
        linktype::LINUX_SLL2 => (be16(data, 0)?, data.get(20..)?),
        linktype::RAW | linktype::RAW_12 | linktype::RAW_14 | linktype::IPV4 | linktype::IPV6 => {
            return Some(data);
        }
        linktype::NULL | linktype::LOOP => {
            let rest = data.get(4..)?;
            return match rest.first().map(|b| b >> 4) {
                Some(4 | 6) => Some(rest),
                _ => {
                    counters.not_ip += 1;
                    None
                }
            };
        }
        _ => {
            counters.unsupported_link += 1;
            return None;
        }
    };
    let ip = ether_payload(ethertype, rest);
    if ip.is_none() {
        counters.not_ip += 1;
    }
    ip
}

/// Follows VLAN tags and PPPoE to the IP packet.
fn ether_payload(mut ethertype: u16, mut rest: &[u8]) -> Option<&[u8]> {
    for _ in 0..4 {
        match ethertype {
            0x0800 | 0x86dd => return Some(rest),
            // 802.1Q, 802.1ad, old QinQ: a 4-byte tag whose last two bytes are the next type.
            0x8100 | 0x88a8 | 0x9100 => {
                ethertype = be16(rest, 2)?;
                rest = rest.get(4..)?;
            }
            // PPPoE session: 6-byte header, then a 2-byte PPP protocol.
            0x8864 => {
                return match be16(rest, 6)? {
                    0x0021 | 0x0057 => rest.get(8..),
                    _ => None,
                };
            }
            _ => return None,
        }
    }
    None
}

fn be16(data: &[u8], at: usize) -> Option<u16> {
    let b = data.get(at..at + 2)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

/// The whole path over bytes in memory (a capture file, possibly gzipped): every DNS message
/// is handed to `out`. Returns the counters, and the error that stopped reading if any.
pub fn extract_bytes(
    bytes: &[u8],
    ports: &[u16],
    out: &mut dyn FnMut(&DnsPayload<'_>),
) -> (Counters, Option<CaptureError>) {
    let mut extractor = Extractor::new(ports, Limits::default());
    let mut reader = match CaptureReader::new(Cursor::new(bytes.to_vec())) {
        Ok(reader) => reader,
        Err(e) => return (Counters::default(), Some(e)),
    };
    let result = reader.for_each(|frame| extractor.frame(frame, out));
    extractor.finish(out);
    (extractor.counters, result.err())
}
