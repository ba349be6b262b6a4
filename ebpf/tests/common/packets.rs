//! Packet builders for `BPF_PROG_TEST_RUN`: Ethernet + IPv4 (optionally a fragment) or IPv6
//! (optionally with extension headers) around TCP with any flags, UDP, ICMP or ICMPv6.
//! Checksums are left zero: the programs never verify them.
#![allow(dead_code, reason = "each test crate uses some builders")]

use std::net::IpAddr;

/// TCP flags.
pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;

/// IPv6 extension header types.
pub const HOPOPTS: u8 = 0;
pub const ROUTING: u8 = 43;
pub const FRAGMENT: u8 = 44;
pub const DSTOPTS: u8 = 60;
pub const AH: u8 = 51;
pub const ESP: u8 = 50;

/// A 20-byte TCP header.
pub fn tcp(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut h = Vec::with_capacity(20);
    h.extend(sport.to_be_bytes());
    h.extend(dport.to_be_bytes());
    h.extend([0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    h
}

/// A UDP header followed by `payload` bytes of zeros.
pub fn udp(sport: u16, dport: u16, payload: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(8 + payload);
    h.extend(sport.to_be_bytes());
    h.extend(dport.to_be_bytes());
    h.extend(u16::try_from(8 + payload).unwrap_or(u16::MAX).to_be_bytes());
    h.extend([0, 0]);
    h.resize(8 + payload, 0);
    h
}

/// An ICMP/ICMPv6 message: type, code, checksum, identifier, sequence, then `rest`.
pub fn icmp(ty: u8, code: u8, id: u16, rest: &[u8]) -> Vec<u8> {
    let mut h = vec![ty, code, 0, 0];
    h.extend(id.to_be_bytes());
    h.extend([0, 1]);
    h.extend_from_slice(rest);
    h
}

/// An ICMP error (destination unreachable, packet too big, ...): type, code, checksum, four
/// unused/MTU bytes, then the embedded packet (an IP packet without Ethernet).
pub fn icmp_error(ty: u8, code: u8, embedded: &[u8]) -> Vec<u8> {
    let mut h = vec![ty, code, 0, 0, 0, 0, 0x05, 0xdc];
    h.extend_from_slice(embedded);
    h
}

/// A bare IPv4 header (no options) around `l4`; `frag`: (id, offset in 8-byte units, MF).
pub fn ip4(
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    l4: &[u8],
    frag: Option<(u16, u16, bool)>,
) -> Vec<u8> {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src, dst) else {
        panic!("ip4 with IPv6 addresses")
    };
    let total = u16::try_from(20 + l4.len()).unwrap_or(u16::MAX);
    let mut p = vec![0x45, 0];
    p.extend(total.to_be_bytes());
    let (id, fo) = match frag {
        None => (0u16, 0x4000u16), // DF
        Some((id, off, mf)) => (id, off | if mf { 0x2000 } else { 0 }),
    };
    p.extend(id.to_be_bytes());
    p.extend(fo.to_be_bytes());
    p.extend([64, proto, 0, 0]);
    p.extend(s.octets());
    p.extend(d.octets());
    p.extend_from_slice(l4);
    p
}

/// A bare IPv6 header, the extension headers `ext` (type, body without its first two
/// bytes; padded to 8-byte units; a fragment header's body is its 6 bytes), then `l4`.
pub fn ip6(src: IpAddr, dst: IpAddr, ext: &[(u8, Vec<u8>)], proto: u8, l4: &[u8]) -> Vec<u8> {
    let (IpAddr::V6(s), IpAddr::V6(d)) = (src, dst) else {
        panic!("ip6 with IPv4 addresses")
    };
    let mut rest = Vec::new();
    for (i, (ty, body)) in ext.iter().enumerate() {
        let next = ext.get(i + 1).map_or(proto, |(t, _)| *t);
        let start = rest.len();
        rest.push(next);
        if *ty == FRAGMENT {
            rest.push(0);
            rest.extend_from_slice(body);
            rest.resize(start + 8, 0);
        } else if *ty == AH {
            // length in 4-byte units minus 2
            let len = (2 + body.len()).div_ceil(4).max(3);
            rest.push(u8::try_from(len - 2).unwrap_or(u8::MAX));
            rest.extend_from_slice(body);
            rest.resize(start + len * 4, 0);
        } else {
            let len = (2 + body.len()).div_ceil(8).max(1);
            rest.push(u8::try_from(len - 1).unwrap_or(u8::MAX));
            rest.extend_from_slice(body);
            rest.resize(start + len * 8, 0);
        }
    }
    rest.extend_from_slice(l4);
    let first = ext.first().map_or(proto, |(t, _)| *t);
    let mut p = vec![0x60, 0, 0, 0];
    p.extend(u16::try_from(rest.len()).unwrap_or(u16::MAX).to_be_bytes());
    p.extend([first, 64]);
    p.extend(s.octets());
    p.extend(d.octets());
    p.extend(rest);
    p
}

/// An IPv6 fragment header's body: offset (8-byte units), M flag, identification.
pub fn frag6(offset: u16, more: bool, id: u32) -> Vec<u8> {
    let mut b = ((offset << 3) | u16::from(more)).to_be_bytes().to_vec();
    b.extend(id.to_be_bytes());
    b
}

/// `ip` (an IPv4 or IPv6 packet) in an Ethernet frame.
pub fn eth(ip: &[u8]) -> Vec<u8> {
    let mut p = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    p.extend(if ip.first().is_some_and(|b| b >> 4 == 6) {
        [0x86, 0xdd]
    } else {
        [0x08, 0x00]
    });
    p.extend_from_slice(ip);
    p
}

/// An IPv4 or IPv6 packet (by the addresses) in an Ethernet frame.
pub fn frame(src: IpAddr, dst: IpAddr, proto: u8, l4: &[u8]) -> Vec<u8> {
    if src.is_ipv4() {
        eth(&ip4(src, dst, proto, l4, None))
    } else {
        eth(&ip6(src, dst, &[], proto, l4))
    }
}
