//! The transparent mode's socket work: `IP_TRANSPARENT` listeners, the original destination of
//! each UDP query (`IP_RECVORIGDSTADDR` / `IPV6_RECVORIGDSTADDR`), and UDP replies that leave
//! from that original destination through a send-only raw socket.
//!
//! Why `SOCK_RAW` with `IPPROTO_RAW` rather than Cilium's `IPPROTO_UDP` raw socket with
//! `IP_PKTINFO`: an `IPPROTO_RAW` socket never receives (Linux delivers nothing to it), so
//! there is no copy of every local UDP packet to filter away with a drop-all BPF program, and
//! it implies `IP_HDRINCL` on both families (IPv6 since Linux 4.5), so the reply's source
//! address and port are simply the ones written in the headers: no `IP_TRANSPARENT` and no
//! control message on the send side. The IPv4 and IPv6 + UDP headers are built with
//! `etherparse` (UDP checksum included; the kernel fills the IPv4 header checksum and, when
//! it is 0, the IPv4 ID). The price: the kernel does not fragment a header-included packet; a
//! reply larger than the route's MTU fails with `EMSGSIZE` and is sent again truncated (TC=1,
//! header and question only) so the client retries over TCP, whose replies need none of this.
//! Only `CAP_NET_RAW` is needed to open it.

use std::io;
use std::net::{IpAddr, SocketAddr};

use etherparse::PacketBuilder;
use nix::sys::socket::{setsockopt, sockopt};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// TTL (hop limit) of the replies the raw socket sends: Linux's default.
const TTL: u8 = 64;

/// IPv6 header + UDP header: the most a raw reply adds to the DNS message.
const MAX_HEADERS: usize = 40 + 8;

/// Enables `IP_TRANSPARENT` (the `SOL_IP` option also sets the bit `IPV6_TRANSPARENT` sets on
/// an IPv6 socket). Needs `CAP_NET_ADMIN` or `CAP_NET_RAW`.
pub(crate) fn set_transparent(socket: &Socket) -> io::Result<()> {
    socket.set_ip_transparent_v4(true)
}

/// Asks for the original destination of every datagram as a control message.
pub(crate) fn enable_orig_dst(socket: &Socket, ipv6: bool) -> io::Result<()> {
    let set = if ipv6 {
        setsockopt(socket, sockopt::Ipv6OrigDstAddr, &true)
    } else {
        setsockopt(socket, sockopt::Ipv4OrigDstAddr, &true)
    };
    set.map_err(io::Error::from)
}

/// Opens the send-only raw socket of one family. Needs `CAP_NET_RAW`.
pub(crate) fn open_raw(ipv6: bool) -> io::Result<AsyncFd<Socket>> {
    let domain = if ipv6 { Domain::IPV6 } else { Domain::IPV4 };
    let socket = Socket::new(
        domain,
        Type::RAW,
        Some(Protocol::from(nix::libc::IPPROTO_RAW)),
    )?;
    socket.set_nonblocking(true)?;
    #[allow(
        deprecated,
        reason = "the I/O-safety concern is a wrapper that does not own its descriptor; \
                  socket2::Socket owns it, and the replacement is unsafe, which this crate forbids"
    )]
    AsyncFd::with_interest(socket, Interest::WRITABLE)
}

/// The raw sockets of the transparent mode, one per family that has a UDP listener.
pub(crate) struct RawSender {
    pub(crate) v4: Option<AsyncFd<Socket>>,
    pub(crate) v6: Option<AsyncFd<Socket>>,
}

impl RawSender {
    /// Sends `payload` as one UDP datagram from `from` (any address and port) to `to`.
    pub(crate) async fn send(
        &self,
        from: SocketAddr,
        to: SocketAddr,
        payload: &[u8],
    ) -> io::Result<()> {
        let socket = match to {
            SocketAddr::V4(_) => self.v4.as_ref(),
            SocketAddr::V6(_) => self.v6.as_ref(),
        }
        .ok_or(io::ErrorKind::Unsupported)?;
        let mut packet = Vec::with_capacity(payload.len() + MAX_HEADERS);
        write_udp_packet(&mut packet, from, to, payload)?;
        // The port must be 0 on a raw socket; the IPv6 scope (link-local clients) is kept.
        let mut dest = to;
        dest.set_port(0);
        let dest = SockAddr::from(dest);
        socket
            .async_io(Interest::WRITABLE, |s| s.send_to(&packet, &dest))
            .await
            .map(drop)
    }
}

/// Writes an IPv4 or IPv6 header and a UDP header (checksum computed) followed by `payload`.
pub(crate) fn write_udp_packet(
    out: &mut Vec<u8>,
    from: SocketAddr,
    to: SocketAddr,
    payload: &[u8],
) -> io::Result<()> {
    let builder = match (from.ip(), to.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => PacketBuilder::ipv4(src.octets(), dst.octets(), TTL),
        (IpAddr::V6(src), IpAddr::V6(dst)) => PacketBuilder::ipv6(src.octets(), dst.octets(), TTL),
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "source and destination of different families",
            ));
        }
    };
    builder
        .udp(from.port(), to.port())
        .write_to_vec(out, payload)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
}

/// Whether a send failed because the packet exceeds the route's MTU.
pub(crate) fn is_too_big(e: &io::Error) -> bool {
    e.raw_os_error() == Some(nix::libc::EMSGSIZE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    use std::time::Duration;

    /// RFC 768 / RFC 8200 checksum over the pseudo-header, the UDP header and the payload,
    /// written independently of etherparse: 0 (or 0xffff) when the packet's checksum is right.
    fn udp_checksum_residue(src: IpAddr, dst: IpAddr, udp: &[u8]) -> u16 {
        let mut data = Vec::new();
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                data.extend_from_slice(&s.octets());
                data.extend_from_slice(&d.octets());
                data.extend_from_slice(&[0, 17]);
                data.extend_from_slice(&u16::try_from(udp.len()).unwrap().to_be_bytes());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                data.extend_from_slice(&s.octets());
                data.extend_from_slice(&d.octets());
                data.extend_from_slice(&u32::try_from(udp.len()).unwrap().to_be_bytes());
                data.extend_from_slice(&[0, 0, 0, 17]);
            }
            _ => unreachable!(),
        }
        data.extend_from_slice(udp);
        if data.len() % 2 == 1 {
            data.push(0);
        }
        let mut sum: u32 = data
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !u16::try_from(sum).unwrap()
    }

    fn check(from: SocketAddr, to: SocketAddr, payload: &[u8]) {
        let mut packet = Vec::new();
        write_udp_packet(&mut packet, from, to, payload).unwrap();
        let sliced = SlicedPacket::from_ip(&packet).unwrap();
        let ip_header_len = match sliced.net.as_ref().unwrap() {
            NetSlice::Ipv4(ip) => {
                let h = ip.header();
                assert_eq!(
                    h.source_addr(),
                    match from.ip() {
                        IpAddr::V4(a) => a,
                        IpAddr::V6(_) => unreachable!(),
                    }
                );
                assert_eq!(IpAddr::V4(h.destination_addr()), to.ip());
                assert_eq!(usize::from(h.total_len()), packet.len());
                assert_eq!(h.protocol(), etherparse::IpNumber::UDP);
                assert_eq!(h.ttl(), TTL);
                // The header checksum is right too (the kernel rewrites it anyway).
                assert_eq!(h.to_header().calc_header_checksum(), h.header_checksum());
                usize::from(h.ihl()) * 4
            }
            NetSlice::Ipv6(ip) => {
                let h = ip.header();
                assert_eq!(IpAddr::V6(h.source_addr()), from.ip());
                assert_eq!(IpAddr::V6(h.destination_addr()), to.ip());
                assert_eq!(usize::from(h.payload_length()), packet.len() - 40);
                assert_eq!(h.next_header(), etherparse::IpNumber::UDP);
                assert_eq!(h.hop_limit(), TTL);
                40
            }
            NetSlice::Arp(_) => unreachable!(),
        };
        let Some(TransportSlice::Udp(udp)) = sliced.transport else {
            panic!("not UDP");
        };
        assert_eq!(udp.source_port(), from.port());
        assert_eq!(udp.destination_port(), to.port());
        assert_eq!(usize::from(udp.length()), 8 + payload.len());
        assert_eq!(udp.payload(), payload);
        assert_ne!(udp.checksum(), 0, "a computed checksum, never 'none'");
        let residue = udp_checksum_residue(from.ip(), to.ip(), &packet[ip_header_len..]);
        assert!(
            residue == 0 || residue == 0xffff,
            "checksum: residue {residue:#x}"
        );
    }

    #[test]
    fn raw_packets_have_valid_lengths_and_checksums() {
        for payload in [&b""[..], b"x", b"odd length payload", &[0xff; 1232][..]] {
            check(
                "10.0.0.10:53".parse().unwrap(),
                "10.1.2.3:40000".parse().unwrap(),
                payload,
            );
            check(
                "[fd00::a]:53".parse().unwrap(),
                "[fd00:1::3]:40000".parse().unwrap(),
                payload,
            );
        }
    }

    /// Root runs it; otherwise skipped with a message, unless `FQDND_REQUIRE_PRIVILEGED=1`.
    fn privileged(test: &str) -> bool {
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        assert!(
            std::env::var("FQDND_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
            "{test} needs root (raw sockets) and FQDND_REQUIRE_PRIVILEGED=1"
        );
        eprintln!("skipping {test}: needs root (raw sockets)");
        false
    }

    #[tokio::test]
    async fn raw_socket_sends_from_any_local_source() {
        if !privileged("raw_socket_sends_from_any_local_source") {
            return;
        }
        let raw = RawSender {
            v4: Some(open_raw(false).unwrap()),
            v6: Some(open_raw(true).unwrap()),
        };
        for (client_ip, source) in [("127.0.0.1", "127.0.0.9:53"), ("::1", "[::1]:53")] {
            let client = tokio::net::UdpSocket::bind((client_ip, 0)).await.unwrap();
            let to = client.local_addr().unwrap();
            let source: SocketAddr = source.parse().unwrap();
            // Odd length: the checksum's padding matters. The kernel drops a datagram whose
            // checksum is wrong, so receiving it checks the checksum too.
            let payload = b"spoofed reply";
            raw.send(source, to, payload).await.unwrap();
            let mut buf = [0u8; 64];
            let (n, from) =
                tokio::time::timeout(Duration::from_secs(2), client.recv_from(&mut buf))
                    .await
                    .expect("the datagram arrives")
                    .unwrap();
            assert_eq!(from, source);
            assert_eq!(&buf[..n], payload);
        }
    }

    #[test]
    fn families_must_match() {
        let mut packet = Vec::new();
        let err = write_udp_packet(
            &mut packet,
            "10.0.0.10:53".parse().unwrap(),
            "[::1]:1".parse().unwrap(),
            b"x",
        )
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
