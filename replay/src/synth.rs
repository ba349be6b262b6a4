//! Writing captures: a pcap writer, packet and DNS message builders, and a synthetic S3-like
//! trace generator for benchmarks. Tests use the builders to make the cases real captures do
//! not cover (fragments, out-of-order TCP, long runs of TTL expiry).
//!
//! Packets are written by hand: IPv4 with a correct header checksum, UDP and TCP without
//! checksums (the reader does not verify them, as tcpdump's offload captures often are not).

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::capture::linktype;

/// Writes a classic pcap file (microsecond timestamps, little-endian).
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header.
    ///
    /// # Errors
    /// Writing fails.
    pub fn new(mut out: W, linktype: i32) -> io::Result<Self> {
        out.write_all(&0xa1b2_c3d4u32.to_le_bytes())?;
        out.write_all(&2u16.to_le_bytes())?;
        out.write_all(&4u16.to_le_bytes())?;
        out.write_all(&0i32.to_le_bytes())?;
        out.write_all(&0u32.to_le_bytes())?;
        out.write_all(&262_144u32.to_le_bytes())?;
        out.write_all(&linktype.to_le_bytes())?;
        Ok(Self { out })
    }

    /// Writes one frame captured whole.
    ///
    /// # Errors
    /// Writing fails.
    pub fn packet(&mut self, ts: Duration, data: &[u8]) -> io::Result<()> {
        self.packet_cut(ts, data, data.len())
    }

    /// Writes one frame of `orig_len` bytes of which `data` were captured (a snap length cut).
    ///
    /// # Errors
    /// Writing fails.
    pub fn packet_cut(&mut self, ts: Duration, data: &[u8], orig_len: usize) -> io::Result<()> {
        let secs = u32::try_from(ts.as_secs()).unwrap_or(u32::MAX);
        self.out.write_all(&secs.to_le_bytes())?;
        self.out.write_all(&ts.subsec_micros().to_le_bytes())?;
        self.out
            .write_all(&u32::try_from(data.len()).unwrap_or(0).to_le_bytes())?;
        self.out
            .write_all(&u32::try_from(orig_len).unwrap_or(0).to_le_bytes())?;
        self.out.write_all(data)
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// TCP flag bits.
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

fn ipv4_header(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    len: usize,
    id: u16,
    frag: u16,
) -> [u8; 20] {
    let total = u16::try_from(20 + len).unwrap_or(u16::MAX);
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h[6..8].copy_from_slice(&frag.to_be_bytes());
    h[8] = 64;
    h[9] = proto;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    h
}

/// An IP packet (v4 or v6 after the source's family) around a transport payload.
pub fn ip_packet(src: IpAddr, dst: IpAddr, proto: u8, transport: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + transport.len());
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out.extend_from_slice(&ipv4_header(s, d, proto, transport.len(), 1, 0x4000));
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            out.extend_from_slice(&[0x60, 0, 0, 0]);
            out.extend_from_slice(&u16::try_from(transport.len()).unwrap_or(0).to_be_bytes());
            out.push(proto);
            out.push(64);
            out.extend_from_slice(&v6(s).octets());
            out.extend_from_slice(&v6(d).octets());
        }
    }
    out.extend_from_slice(transport);
    out
}

/// A UDP datagram (header and payload, no checksum).
pub fn udp(src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&src_port.to_be_bytes());
    out.extend_from_slice(&dst_port.to_be_bytes());
    out.extend_from_slice(&u16::try_from(8 + payload.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(payload);
    out
}

/// A TCP segment (20-byte header, no checksum).
pub fn tcp(src_port: u16, dst_port: u16, seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + payload.len());
    out.extend_from_slice(&src_port.to_be_bytes());
    out.extend_from_slice(&dst_port.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes());
    out.push(5 << 4);
    out.push(flags);
    out.extend_from_slice(&65_535u16.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(payload);
    out
}

/// An Ethernet II frame around an IP packet.
pub fn ethernet(ip: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(14 + ip.len());
    out.extend_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
    let ethertype: u16 = if ip.first().is_some_and(|b| b >> 4 == 6) {
        0x86dd
    } else {
        0x0800
    };
    out.extend_from_slice(&ethertype.to_be_bytes());
    out.extend_from_slice(ip);
    out
}

/// A UDP datagram in an Ethernet frame.
pub fn udp_frame(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    ethernet(&ip_packet(
        src.ip(),
        dst.ip(),
        17,
        &udp(src.port(), dst.port(), payload),
    ))
}

/// A TCP segment in an Ethernet frame.
pub fn tcp_frame(src: SocketAddr, dst: SocketAddr, seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    ethernet(&ip_packet(
        src.ip(),
        dst.ip(),
        6,
        &tcp(src.port(), dst.port(), seq, flags, payload),
    ))
}

/// IPv4 fragments (raw IP, no link header) of a UDP datagram, `chunk` payload bytes each
/// (rounded down to a multiple of 8).
pub fn ipv4_udp_fragments(
    src: SocketAddr,
    dst: SocketAddr,
    payload: &[u8],
    id: u16,
    chunk: usize,
) -> Vec<Vec<u8>> {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
        return Vec::new();
    };
    let datagram = udp(src.port(), dst.port(), payload);
    let chunk = (chunk / 8).max(1) * 8;
    let pieces: Vec<&[u8]> = datagram.chunks(chunk).collect();
    pieces
        .iter()
        .enumerate()
        .map(|(i, piece)| {
            let more = if i + 1 < pieces.len() { 0x2000 } else { 0 };
            let offset = u16::try_from(i * chunk / 8).unwrap_or(0);
            let mut p = ipv4_header(s, d, 17, piece.len(), id, more | offset).to_vec();
            p.extend_from_slice(piece);
            p
        })
        .collect()
}

/// One answer record for [`dns_message`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SynthRr {
    /// A or AAAA: owner, TTL, address.
    Addr(String, u32, IpAddr),
    /// CNAME: owner, TTL, target.
    Cname(String, u32, String),
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    for label in name
        .trim_end_matches('.')
        .split('.')
        .filter(|l| !l.is_empty())
    {
        let bytes = &label.as_bytes()[..label.len().min(63)];
        out.push(bytes.len() as u8);
        out.extend_from_slice(bytes);
    }
    out.push(0);
}

/// A DNS message (no name compression): a query when `answers` is `None`, else a response
/// with `rcode` and those answer records. QTYPE is A unless the name's first answer is AAAA.
pub fn dns_message(
    id: u16,
    qname: &str,
    qtype: u16,
    rcode: u8,
    answers: Option<&[SynthRr]>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&id.to_be_bytes());
    match answers {
        None => out.extend_from_slice(&[0x01, 0x00]),
        Some(_) => out.extend_from_slice(&[0x81, 0x80 | (rcode & 0x0f)]),
    }
    let count = answers.map_or(0, <[SynthRr]>::len);
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&u16::try_from(count).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    put_name(&mut out, qname);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    for rr in answers.unwrap_or_default() {
        let (owner, ttl) = match rr {
            SynthRr::Addr(o, t, _) | SynthRr::Cname(o, t, _) => (o, *t),
        };
        put_name(&mut out, owner);
        let (rtype, rdata) = match rr {
            SynthRr::Addr(_, _, IpAddr::V4(a)) => (1u16, a.octets().to_vec()),
            SynthRr::Addr(_, _, IpAddr::V6(a)) => (28u16, a.octets().to_vec()),
            SynthRr::Cname(_, _, target) => {
                let mut t = Vec::new();
                put_name(&mut t, target);
                (5u16, t)
            }
        };
        out.extend_from_slice(&rtype.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&u16::try_from(rdata.len()).unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&rdata);
    }
    out
}

/// A small deterministic generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The shape of a synthetic trace.
#[derive(Debug, Clone)]
pub struct SynthShape {
    /// Responses to write (each after its query).
    pub responses: u64,
    /// Responses per second of capture time.
    pub rate: u64,
    /// Client pods (10.0.<i/250>.<i%250+1>).
    pub clients: u32,
    /// `bucket-N.s3.amazonaws.com` names; each answer picks one of 256 IPs, TTL 5.
    pub buckets: u32,
    /// `host-N.example.com` names with one fixed IP each, TTL 300.
    pub hosts: u32,
    /// Seed.
    pub seed: u64,
}

impl Default for SynthShape {
    fn default() -> Self {
        Self {
            responses: 100_000,
            rate: 10_000,
            clients: 50,
            buckets: 1000,
            hosts: 5000,
            seed: 1,
        }
    }
}

/// Writes an S3-like trace: per response, 60 % an S3 bucket (one of 256 rotating IPs, TTL 5),
/// 20 % a host with a fixed IP (TTL 300), 5 % a CNAME chain into a CDN (two of 32 IPs,
/// TTL 20), 15 % NXDOMAIN from a Kubernetes search path. Every response follows its query.
///
/// # Errors
/// Writing fails.
pub fn s3_like_trace(out: impl Write, shape: &SynthShape) -> io::Result<u64> {
    let mut w = PcapWriter::new(
        io::BufWriter::with_capacity(1 << 20, out),
        linktype::ETHERNET,
    )?;
    let mut rng = Rng::new(shape.seed);
    let resolver = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)), 53);
    let start = Duration::from_secs(1_700_000_000);
    let step = Duration::from_nanos(1_000_000_000 / shape.rate.max(1));
    let mut written = 0;
    for i in 0..shape.responses {
        let ts = start + step.saturating_mul(u32::try_from(i).unwrap_or(u32::MAX));
        let c = u32::try_from(rng.below(u64::from(shape.clients.max(1)))).unwrap_or(0);
        let client_ip = Ipv4Addr::new(10, 0, (c / 250) as u8, (c % 250 + 1) as u8);
        let client = SocketAddr::new(IpAddr::V4(client_ip), 30_000 + (i % 30_000) as u16);
        let id = (i & 0xffff) as u16;
        let roll = rng.below(100);
        let (qname, rcode, answers) = if roll < 60 {
            let b = rng.below(u64::from(shape.buckets.max(1)));
            let name = format!("bucket-{b}.s3.amazonaws.com.");
            let ip = IpAddr::V4(Ipv4Addr::new(52, 216, (b % 4) as u8, rng.below(256) as u8));
            (name.clone(), 0, vec![SynthRr::Addr(name, 5, ip)])
        } else if roll < 80 {
            let h = rng.below(u64::from(shape.hosts.max(1)));
            let name = format!("host-{h}.example.com.");
            let ip = IpAddr::V4(Ipv4Addr::from(0xc000_0000u32 + 0x0002_0000 + h as u32));
            (name.clone(), 0, vec![SynthRr::Addr(name, 300, ip)])
        } else if roll < 85 {
            let name = "www.example.com.".to_owned();
            let edge = "e1234.a.akamaiedge.net.".to_owned();
            let a = rng.below(32) as u8;
            let answers = vec![
                SynthRr::Cname(name.clone(), 300, "www.example.com.edgekey.net.".into()),
                SynthRr::Cname("www.example.com.edgekey.net.".into(), 60, edge.clone()),
                SynthRr::Addr(edge.clone(), 20, IpAddr::V4(Ipv4Addr::new(23, 32, 0, a))),
                SynthRr::Addr(edge, 20, IpAddr::V4(Ipv4Addr::new(23, 32, 0, (a + 1) % 32))),
            ];
            (name, 0, answers)
        } else {
            let b = rng.below(u64::from(shape.buckets.max(1)));
            let name = format!("bucket-{b}.s3.amazonaws.com.default.svc.cluster.local.");
            (name, 3, Vec::new())
        };
        let query = dns_message(id, &qname, 1, 0, None);
        w.packet(ts, &udp_frame(client, resolver, &query))?;
        let response = dns_message(id, &qname, 1, rcode, Some(&answers));
        w.packet(
            ts + Duration::from_micros(300),
            &udp_frame(resolver, client, &response),
        )?;
        written += 1;
    }
    w.into_inner().flush()?;
    Ok(written)
}
