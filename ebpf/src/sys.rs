//! `#[repr(C)]` mirrors of the structs in `include/fqdnd_maps.h`, the one header both the C
//! programs and this crate take their map layouts from. The tests compare every size and
//! offset here with what the C compiler reports for the header (a probe built by build.rs).
//!
//! This is the crate's only module with `unsafe`: aya requires map keys and values to
//! implement its `unsafe trait Pod` (plain old data: any bit pattern is valid, no padding
//! holes). Every struct below has explicit padding fields, so each impl is sound. The other
//! use is [`netns_cookie`]'s `getsockopt`, which neither nix nor socket2 wraps.
#![allow(
    unsafe_code,
    reason = "aya::Pod impls for plain-old-data map structs; getsockopt(SO_NETNS_COOKIE)"
)]

/// The map layout version, from `FQDND_MAPS_ABI_VERSION` in the header (build.rs).
pub const ABI_VERSION: &str = env!("FQDND_MAPS_ABI_VERSION");

/// Wildcard identity in policy keys.
pub const ID_ANY: u32 = 0;
/// `reserved:world-ipv4`.
pub const ID_WORLD_IPV4: u32 = 9;
/// `reserved:world-ipv6`.
pub const ID_WORLD_IPV6: u32 = 10;
/// "Every protocol" in the userspace view of policy keys (never stored in a kernel key: such an
/// entry's prefix ends before the protocol byte).
pub const PROTO_ANY: u8 = 0;
/// ICMP.
pub const PROTO_ICMP: u8 = 1;
/// TCP.
pub const PROTO_TCP: u8 = 6;
/// UDP.
pub const PROTO_UDP: u8 = 17;
/// ICMPv6.
pub const PROTO_ICMPV6: u8 = 58;
/// Endpoint flag: default deny for its egress (on a `EP_BY_SOURCE` interface entry: drop
/// sources no client prefix holds).
pub const EP_ENFORCE_EGRESS: u8 = 0x1;
/// Endpoint flag: UDP/TCP to port 53 is assigned to the DNS proxy's socket.
pub const EP_REDIRECT_DNS: u8 = 0x2;
/// Interface entry flag: the endpoint is the `fqdnd_clients4/6` entry of the source address.
pub const EP_BY_SOURCE: u8 = 0x4;
/// Endpoint flag: a packet whose source is not one of the interface's addresses
/// (`fqdnd_ep_addrs`) is dropped ([`DROP_SPOOFED`]).
pub const EP_CHECK_SOURCE: u8 = 0x8;
/// Interface entry flag (with [`EP_BY_SOURCE`]): a bridge whose ports are endpoints; its
/// ingress only redirects the DNS of sources whose client entry has [`EP_REDIRECT_DNS`].
pub const EP_DNS_ONLY: u8 = 0x20;
/// `skb->mark` of packets assigned to the proxy (within [`MARK_MASK`]).
pub const MARK_TO_PROXY: u32 = 0x200;
/// The mark bits fqdnd owns.
pub const MARK_MASK: u32 = 0xf00;
/// The routing table of the local-delivery route for marked packets.
pub const PROXY_TABLE: u32 = 2004;
/// Policy value flag: allow.
pub const POLICY_ALLOW: u32 = 0x1;
/// `FQDND_POLICY_DENY`: the entry drops what it matches (a deny wins over every allow).
pub const POLICY_DENY: u32 = 0x2;
/// `FQDND_POLICY_ID_INGRESS`: the identity bit of an ingress entry (the peer is the source).
pub const POLICY_ID_INGRESS: u32 = 0x8000_0000;
/// `FQDND_EP_ENFORCE_INGRESS`: the endpoint's ingress goes through its ingress policy.
pub const EP_ENFORCE_INGRESS: u8 = 0x10;
/// `FQDND_CT_DNS`: a DNS query the program redirected to the proxy (its answers pass).
pub const CT_DNS: u32 = 0x40;
/// Conntrack flag: opened by the endpoint.
pub const CT_EGRESS: u32 = 0x1;
/// Conntrack flag: opened towards the endpoint.
pub const CT_INGRESS: u32 = 0x2;
/// Conntrack TCP state: a packet without SYN was seen (established).
pub const CT_TCP_SEEN_NON_SYN: u32 = 0x4;
/// Conntrack TCP state: FIN in the key's direction.
pub const CT_TCP_FIN_FWD: u32 = 0x8;
/// Conntrack TCP state: FIN in the other direction.
pub const CT_TCP_FIN_REV: u32 = 0x10;
/// Conntrack TCP state: RST in either direction.
pub const CT_TCP_RST: u32 = 0x20;
/// Policy key prefix length of an entry for every protocol and port (identity + endpoint).
pub const POLICY_PREFIX_ANY_PROTO: u32 = 48;
/// Policy key prefix length of an entry for one protocol, every port.
pub const POLICY_PREFIX_PROTO: u32 = 64;
/// Policy key prefix length of an entry for one protocol and port (and of lookups).
pub const POLICY_PREFIX_FULL: u32 = 80;
/// Default conntrack lifetime of a TCP flow that has seen only SYNs (Cilium's).
pub const CT_TCP_SYN_DEFAULT_NS: u64 = 60_000_000_000;
/// Default conntrack lifetime of an established TCP flow (Cilium's: 6 h).
pub const CT_TCP_ESTABLISHED_DEFAULT_NS: u64 = 21_600_000_000_000;
/// Default conntrack lifetime of a closing TCP flow (FIN both ways or RST).
pub const CT_TCP_CLOSING_DEFAULT_NS: u64 = 10_000_000_000;
/// Default conntrack lifetime of a non-TCP flow.
pub const CT_OTHER_DEFAULT_NS: u64 = 60_000_000_000;
/// How long the later fragments of a datagram may follow its first.
pub const FRAG_LIFETIME_NS: u64 = 30_000_000_000;
/// IPv6 extension headers walked before the upper-layer header.
pub const IPV6_MAX_EXT_HEADERS: u32 = 8;
/// Drop reason: no policy entry allowed the packet.
pub const DROP_POLICY: u8 = 1;
/// Drop reason: an IP packet fqdnd cannot classify from an enforcing endpoint.
pub const DROP_UNHANDLED: u8 = 2;
/// Drop reason: DNS from a redirected endpoint and no proxy socket to assign it to.
pub const DROP_NO_PROXY: u8 = 3;
/// Drop reason: a new flow to a service VIP that has no backend.
pub const DROP_NO_BACKEND: u8 = 4;
/// Drop reason: the source is not one of the interface's addresses.
pub const DROP_SPOOFED: u8 = 5;
/// Drop reason: a later fragment whose first fragment did not pass (or was not seen).
pub const DROP_FRAGMENT: u8 = 6;
/// Drop reason: an ICMP type fqdnd does not pass, an error about no tracked flow, or an echo
/// reply to no request.
pub const DROP_ICMP: u8 = 7;
/// Drop reason: more IPv6 extension headers than the walk allows.
pub const DROP_EXT_HEADERS: u8 = 8;
/// Drop reason: a host process's DNS (port 53) that the socket hooks did not send to the
/// proxy (a socket connected before its cgroup became an endpoint).
pub const DROP_DNS_BYPASS: u8 = 9;
/// Drop event source: an interface program (`ifindex` names the interface).
pub const SOURCE_INTERFACE: u8 = 0;
/// Drop event source: a cgroup socket program (a host process of a cgroup endpoint).
pub const SOURCE_SOCKET: u8 = 1;
/// Conntrack zone of the flows the interface programs see.
pub const CT_ZONE_INTERFACE: u8 = 0;
/// Conntrack zone of the flows of host processes (cgroup socket programs).
pub const CT_ZONE_SOCKET: u8 = 1;
/// Cgroup levels below the root the socket programs walk to find a socket's endpoint.
pub const CGROUP_MAX_DEPTH: u32 = 32;

/// `struct fqdnd_ipcache_key4` (the map itself uses aya's identical `lpm_trie::Key<[u8; 4]>`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IpcacheKey4 {
    /// Prefix length in bits.
    pub prefixlen: u32,
    /// Address, network order.
    pub addr: [u8; 4],
}

/// `struct fqdnd_ipcache_key6`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IpcacheKey6 {
    /// Prefix length in bits.
    pub prefixlen: u32,
    /// Address, network order.
    pub addr: [u8; 16],
}

/// `struct fqdnd_ipcache_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IpcacheValue {
    /// Identity of the prefix.
    pub identity: u32,
}

/// `struct fqdnd_endpoint_value` (key: host-side veth ifindex, `u32`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EndpointValue {
    /// Endpoint id.
    pub endpoint: u16,
    /// `EP_*` flags.
    pub flags: u8,
    /// Padding.
    pub pad: u8,
}

/// `struct fqdnd_dns_proxy`: the one entry of the `fqdnd_dns_proxy` array.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DnsProxy {
    /// IPv4 address the proxy sockets are bound to (0.0.0.0 for a wildcard), network order.
    pub addr4: [u8; 4],
    /// IPv4 proxy port, network order; 0 = none.
    pub port4: u16,
    /// Padding.
    pub pad4: u16,
    /// IPv6 address the proxy sockets are bound to (:: for a wildcard), network order.
    pub addr6: [u8; 16],
    /// IPv6 proxy port, network order; 0 = none.
    pub port6: u16,
    /// Padding.
    pub pad6: u16,
}

/// `struct fqdnd_ep_addr_key`: an address of an interface's endpoint.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct EpAddrKey {
    /// Host-side interface index.
    pub ifindex: u32,
    /// 4 or 6.
    pub family: u8,
    /// Padding.
    pub pad: [u8; 3],
    /// Address, network order (IPv4 in the first 4 bytes, the rest zero).
    pub addr: [u8; 16],
}

/// `struct fqdnd_ep_addr_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EpAddrValue {
    /// The endpoint owning the address.
    pub endpoint: u16,
    /// Padding.
    pub pad: u16,
}

/// `struct fqdnd_policy_key`: an LPM key over (identity, endpoint, protocol, port).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct PolicyKey {
    /// Bits of the fields below that must match ([`POLICY_PREFIX_ANY_PROTO`] …
    /// [`POLICY_PREFIX_FULL`]).
    pub prefixlen: u32,
    /// Destination identity, `ID_ANY` for all.
    pub identity: u32,
    /// Endpoint id.
    pub endpoint: u16,
    /// IP protocol (not matched when `prefixlen` is [`POLICY_PREFIX_ANY_PROTO`]).
    pub proto: u8,
    /// Padding (zero, matched with `proto`).
    pub pad: u8,
    /// Destination port, network order: its `prefixlen - 64` high bits match.
    pub dport: u16,
    /// Padding (zero, beyond every prefix).
    pub pad2: u16,
}

/// The data of a [`PolicyKey`] after its prefix length: what aya's `lpm_trie::Key` holds
/// (`Key<PolicyData>` has the layout of [`PolicyKey`], asserted in the tests).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct PolicyData {
    /// Destination identity.
    pub identity: u32,
    /// Endpoint id.
    pub endpoint: u16,
    /// IP protocol.
    pub proto: u8,
    /// Padding.
    pub pad: u8,
    /// Destination port, network order.
    pub dport: u16,
    /// Padding.
    pub pad2: u16,
}

impl PolicyKey {
    /// The key's data without its prefix length.
    pub fn data(&self) -> PolicyData {
        PolicyData {
            identity: self.identity,
            endpoint: self.endpoint,
            proto: self.proto,
            pad: self.pad,
            dport: self.dport,
            pad2: self.pad2,
        }
    }

    /// The key of `prefixlen` bits of `data`.
    pub fn new(prefixlen: u32, data: PolicyData) -> Self {
        PolicyKey {
            prefixlen,
            identity: data.identity,
            endpoint: data.endpoint,
            proto: data.proto,
            pad: data.pad,
            dport: data.dport,
            pad2: data.pad2,
        }
    }

    /// The protocol this entry matches; `None` = every protocol.
    pub fn protocol(&self) -> Option<u8> {
        (self.prefixlen > POLICY_PREFIX_ANY_PROTO).then_some(self.proto)
    }

    /// The destination ports (host order) this entry matches, first and last.
    pub fn ports(&self) -> (u16, u16) {
        let bits = self.prefixlen.saturating_sub(POLICY_PREFIX_PROTO).min(16);
        let mask: u16 = if bits == 0 {
            0
        } else {
            u16::MAX << (16 - bits)
        };
        let first = u16::from_be(self.dport) & mask;
        (first, first | !mask)
    }
}

/// `struct fqdnd_policy_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PolicyValue {
    /// `POLICY_*` flags.
    pub flags: u32,
}

/// `struct fqdnd_ct_key`: the 5-tuple in the direction of the flow's first packet.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CtKey {
    /// Source address, network order (IPv4 in the first 4 bytes).
    pub saddr: [u8; 16],
    /// Destination address, network order.
    pub daddr: [u8; 16],
    /// Source port, network order.
    pub sport: u16,
    /// Destination port, network order.
    pub dport: u16,
    /// IP protocol.
    pub proto: u8,
    /// 4 or 6.
    pub family: u8,
    /// [`CT_ZONE_INTERFACE`] or [`CT_ZONE_SOCKET`].
    pub zone: u8,
    /// Padding.
    pub pad: u8,
}

/// `struct fqdnd_ct_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CtValue {
    /// Creation time, `bpf_ktime_get_ns`.
    pub created_ns: u64,
    /// Last packet, `bpf_ktime_get_ns`.
    pub last_seen_ns: u64,
    /// When the entry dies without another packet, `bpf_ktime_get_ns`.
    pub expires_ns: u64,
    /// `CT_*` flags (direction and TCP state).
    pub flags: u32,
    /// Rev-NAT index of the service of the flow, 0 = none.
    pub rev_nat: u16,
    /// Backend id the flow is translated to (its client → VIP entry), 0 = none.
    pub backend: u16,
}

/// `struct fqdnd_settings`: the one entry of the `fqdnd_settings` array (0 = default).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Settings {
    /// Conntrack lifetime of a TCP flow that has seen only SYNs, ns.
    pub ct_tcp_syn_ns: u64,
    /// Conntrack lifetime of an established TCP flow, ns.
    pub ct_tcp_established_ns: u64,
    /// Conntrack lifetime of a closing TCP flow, ns.
    pub ct_tcp_closing_ns: u64,
    /// Conntrack lifetime of a non-TCP flow, ns.
    pub ct_other_ns: u64,
}

/// `struct fqdnd_frag_key`: a fragmented datagram.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FragKey {
    /// Source address, network order (IPv4 in the first 4 bytes).
    pub saddr: [u8; 16],
    /// Destination address.
    pub daddr: [u8; 16],
    /// Identification as in the header (IPv4: 16 bits).
    pub id: u32,
    /// Upper-layer protocol.
    pub proto: u8,
    /// 4 or 6.
    pub family: u8,
    /// Padding.
    pub pad: [u8; 2],
}

/// `struct fqdnd_frag_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FragValue {
    /// When the first fragment passed.
    pub created_ns: u64,
    /// The datagram's source port, network order.
    pub sport: u16,
    /// Its destination port, network order.
    pub dport: u16,
    /// Backend the later fragments are translated to, 0 = none.
    pub backend: u16,
    /// Rev-NAT index whose VIP the later fragments get as source, 0 = none.
    pub rev_nat: u16,
}

/// `struct fqdnd_lb_svc_key`: a service (VIP, port, protocol) and one of its slots.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct LbSvcKey {
    /// VIP, network order (IPv4 in the first 4 bytes).
    pub addr: [u8; 16],
    /// Service port, network order.
    pub dport: u16,
    /// 0 = the service entry (count, rev-NAT), 1..=count = backend slots.
    pub slot: u16,
    /// `PROTO_TCP` or `PROTO_UDP`.
    pub proto: u8,
    /// 4 or 6.
    pub family: u8,
    /// Padding.
    pub pad: [u8; 2],
}

/// `struct fqdnd_lb_svc_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LbSvcValue {
    /// Slot 0: the number of backends.
    pub count: u16,
    /// Slot ≥ 1: the backend id.
    pub backend: u16,
    /// The service's rev-NAT index.
    pub rev_nat: u16,
    /// Padding.
    pub pad: u16,
}

/// `struct fqdnd_lb_backend` (key: backend id, `u16`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LbBackend {
    /// Address, network order (IPv4 in the first 4 bytes).
    pub addr: [u8; 16],
    /// Port, network order.
    pub port: u16,
    /// IP protocol.
    pub proto: u8,
    /// 4 or 6.
    pub family: u8,
}

/// `struct fqdnd_lb_revnat` (key: rev-NAT index, `u16`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LbRevNat {
    /// VIP, network order.
    pub addr: [u8; 16],
    /// Service port, network order.
    pub port: u16,
    /// 4 or 6.
    pub family: u8,
    /// Padding.
    pub pad: u8,
}

/// `struct fqdnd_sock_origin`: where a redirected socket's DNS message was going, and its
/// endpoint (value of `fqdnd_sock_dns`, keyed by socket cookie, and of `fqdnd_dns_origins`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SockOrigin {
    /// The destination the socket asked for, network order (IPv4 in the first 4 bytes; an
    /// IPv6 socket's v4-mapped address stays v4-mapped).
    pub addr: [u8; 16],
    /// Its port, network order.
    pub port: u16,
    /// The socket's endpoint.
    pub endpoint: u16,
    /// The socket's family: 4 or 6.
    pub family: u8,
    /// `PROTO_UDP` or `PROTO_TCP`.
    pub proto: u8,
    /// Padding.
    pub pad: [u8; 2],
}

/// `struct fqdnd_origin_key`: a redirected socket's source address and port as the proxy
/// sees them (key of `fqdnd_dns_origins`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OriginKey {
    /// Source address, network order (IPv4 in the first 4 bytes).
    pub addr: [u8; 16],
    /// Source port, network order.
    pub port: u16,
    /// `PROTO_UDP` or `PROTO_TCP`.
    pub proto: u8,
    /// The packet's family: 4 or 6.
    pub family: u8,
}

/// `struct fqdnd_sock_cfg`: the one entry of `fqdnd_sock_cfg`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SockCfg {
    /// The proxy's network namespace cookie (0 = every namespace).
    pub netns_cookie: u64,
    /// Entries in `fqdnd_cgroups` (0: every socket program returns at once).
    pub endpoints: u32,
    /// Padding.
    pub pad: u32,
}

/// `struct fqdnd_drop_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DropEvent {
    /// `bpf_ktime_get_ns` at the drop.
    pub ts_ns: u64,
    /// Interface the packet came in on.
    pub ifindex: u32,
    /// Destination identity (0 if not looked up).
    pub identity: u32,
    /// Endpoint id.
    pub endpoint: u16,
    /// Source port, host order.
    pub sport: u16,
    /// Destination port, host order.
    pub dport: u16,
    /// IP protocol.
    pub proto: u8,
    /// 4 or 6.
    pub family: u8,
    /// `DROP_*`.
    pub reason: u8,
    /// [`SOURCE_INTERFACE`] or [`SOURCE_SOCKET`].
    pub source: u8,
    /// Padding.
    pub pad: [u8; 6],
    /// Source address (IPv4 in the first 4 bytes).
    pub saddr: [u8; 16],
    /// Destination address.
    pub daddr: [u8; 16],
}

impl DropEvent {
    /// Decodes an event from ring-buffer bytes (native endian), without `unsafe`.
    pub fn from_bytes(b: &[u8]) -> Option<DropEvent> {
        use std::mem::offset_of;
        if b.len() < size_of::<DropEvent>() {
            return None;
        }
        let arr = |o: usize| -> [u8; 16] {
            let mut a = [0; 16];
            a.copy_from_slice(&b[o..o + 16]);
            a
        };
        let u16_at = |o: usize| u16::from_ne_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut ts = [0; 8];
        ts.copy_from_slice(&b[0..8]);
        Some(DropEvent {
            ts_ns: u64::from_ne_bytes(ts),
            ifindex: u32_at(offset_of!(DropEvent, ifindex)),
            identity: u32_at(offset_of!(DropEvent, identity)),
            endpoint: u16_at(offset_of!(DropEvent, endpoint)),
            sport: u16_at(offset_of!(DropEvent, sport)),
            dport: u16_at(offset_of!(DropEvent, dport)),
            proto: b[offset_of!(DropEvent, proto)],
            family: b[offset_of!(DropEvent, family)],
            reason: b[offset_of!(DropEvent, reason)],
            source: b[offset_of!(DropEvent, source)],
            pad: [0; 6],
            saddr: arr(offset_of!(DropEvent, saddr)),
            daddr: arr(offset_of!(DropEvent, daddr)),
        })
    }
}

/// The cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`, Linux 5.14): what
/// `bpf_get_netns_cookie` returns in the socket programs for sockets of this namespace.
pub fn netns_cookie() -> std::io::Result<u64> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let mut cookie: u64 = 0;
    let mut len = size_of::<u64>() as libc::socklen_t;
    // SAFETY: `fd` is an open socket for the whole call; `cookie` and `len` are valid for
    // writes of `len` bytes (a u64), as getsockopt(2) requires.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &raw mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cookie)
}

// SAFETY: each type is #[repr(C)], made only of integers and integer arrays, and has no
// implicit padding (asserted against the C layout in the tests below), so every bit pattern
// is a valid value and no uninitialised byte is ever read.
unsafe impl aya::Pod for IpcacheKey4 {}
// SAFETY: as above.
unsafe impl aya::Pod for IpcacheKey6 {}
// SAFETY: as above.
unsafe impl aya::Pod for IpcacheValue {}
// SAFETY: as above.
unsafe impl aya::Pod for EndpointValue {}
// SAFETY: as above.
unsafe impl aya::Pod for DnsProxy {}
// SAFETY: as above.
unsafe impl aya::Pod for PolicyKey {}
// SAFETY: as above.
unsafe impl aya::Pod for PolicyValue {}
// SAFETY: as above.
unsafe impl aya::Pod for PolicyData {}
// SAFETY: as above.
unsafe impl aya::Pod for EpAddrKey {}
// SAFETY: as above.
unsafe impl aya::Pod for EpAddrValue {}
// SAFETY: as above.
unsafe impl aya::Pod for Settings {}
// SAFETY: as above.
unsafe impl aya::Pod for FragKey {}
// SAFETY: as above.
unsafe impl aya::Pod for FragValue {}
// SAFETY: as above.
unsafe impl aya::Pod for CtKey {}
// SAFETY: as above.
unsafe impl aya::Pod for CtValue {}
// SAFETY: as above.
unsafe impl aya::Pod for DropEvent {}
// SAFETY: as above.
unsafe impl aya::Pod for LbSvcKey {}
// SAFETY: as above.
unsafe impl aya::Pod for LbSvcValue {}
// SAFETY: as above.
unsafe impl aya::Pod for LbBackend {}
// SAFETY: as above.
unsafe impl aya::Pod for LbRevNat {}
// SAFETY: as above.
unsafe impl aya::Pod for SockOrigin {}
// SAFETY: as above.
unsafe impl aya::Pod for OriginKey {}
// SAFETY: as above.
unsafe impl aya::Pod for SockCfg {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::mem::{offset_of, size_of};

    /// (struct, field) → (offset, size) as the C compiler lays out the header.
    fn c_layout() -> BTreeMap<(String, String), (usize, usize)> {
        include_str!(concat!(env!("OUT_DIR"), "/layout.txt"))
            .lines()
            .map(|l| {
                let v: Vec<&str> = l.split_whitespace().collect();
                (
                    (v[0].to_owned(), v[1].to_owned()),
                    (v[2].parse().unwrap(), v[3].parse().unwrap()),
                )
            })
            .collect()
    }

    macro_rules! check {
        ($c:expr, $cname:literal, $ty:ty, [$($f:ident),*]) => {{
            let c = &$c;
            let mut n = 0;
            assert_eq!(
                c[&($cname.to_owned(), "-".to_owned())].1,
                size_of::<$ty>(),
                "sizeof {}", $cname
            );
            $(
                let t: $ty = Default::default();
                let got = (offset_of!($ty, $f), std::mem::size_of_val(&t.$f));
                assert_eq!(c[&($cname.to_owned(), stringify!($f).to_owned())], got,
                    "{}.{}", $cname, stringify!($f));
                n += got.1;
            )*
            // The fields cover the struct: no implicit padding.
            assert_eq!(n, size_of::<$ty>(), "{} has implicit padding", $cname);
            // Every C field has a Rust mirror.
            let c_fields = c.keys().filter(|(s, f)| s == $cname && f != "-").count();
            assert_eq!(c_fields, [$(stringify!($f)),*].len(), "{} field count", $cname);
        }};
    }

    #[test]
    fn layouts_match_the_header() {
        let c = c_layout();
        check!(c, "fqdnd_ipcache_key4", IpcacheKey4, [prefixlen, addr]);
        check!(c, "fqdnd_ipcache_key6", IpcacheKey6, [prefixlen, addr]);
        check!(c, "fqdnd_ipcache_value", IpcacheValue, [identity]);
        check!(
            c,
            "fqdnd_endpoint_value",
            EndpointValue,
            [endpoint, flags, pad]
        );
        check!(
            c,
            "fqdnd_dns_proxy",
            DnsProxy,
            [addr4, port4, pad4, addr6, port6, pad6]
        );
        check!(
            c,
            "fqdnd_policy_key",
            PolicyKey,
            [prefixlen, identity, endpoint, proto, pad, dport, pad2]
        );
        check!(
            c,
            "fqdnd_ep_addr_key",
            EpAddrKey,
            [ifindex, family, pad, addr]
        );
        check!(c, "fqdnd_ep_addr_value", EpAddrValue, [endpoint, pad]);
        check!(c, "fqdnd_policy_value", PolicyValue, [flags]);
        check!(
            c,
            "fqdnd_ct_key",
            CtKey,
            [saddr, daddr, sport, dport, proto, family, zone, pad]
        );
        check!(
            c,
            "fqdnd_ct_value",
            CtValue,
            [
                created_ns,
                last_seen_ns,
                expires_ns,
                flags,
                rev_nat,
                backend
            ]
        );
        check!(
            c,
            "fqdnd_settings",
            Settings,
            [
                ct_tcp_syn_ns,
                ct_tcp_established_ns,
                ct_tcp_closing_ns,
                ct_other_ns
            ]
        );
        check!(
            c,
            "fqdnd_frag_key",
            FragKey,
            [saddr, daddr, id, proto, family, pad]
        );
        check!(
            c,
            "fqdnd_frag_value",
            FragValue,
            [created_ns, sport, dport, backend, rev_nat]
        );
        check!(
            c,
            "fqdnd_lb_svc_key",
            LbSvcKey,
            [addr, dport, slot, proto, family, pad]
        );
        check!(
            c,
            "fqdnd_lb_svc_value",
            LbSvcValue,
            [count, backend, rev_nat, pad]
        );
        check!(
            c,
            "fqdnd_lb_backend",
            LbBackend,
            [addr, port, proto, family]
        );
        check!(c, "fqdnd_lb_revnat", LbRevNat, [addr, port, family, pad]);
        check!(
            c,
            "fqdnd_drop_event",
            DropEvent,
            [
                ts_ns, ifindex, identity, endpoint, sport, dport, proto, family, reason, source,
                pad, saddr, daddr
            ]
        );
        check!(
            c,
            "fqdnd_sock_origin",
            SockOrigin,
            [addr, port, endpoint, family, proto, pad]
        );
        check!(
            c,
            "fqdnd_origin_key",
            OriginKey,
            [addr, port, proto, family]
        );
        check!(c, "fqdnd_sock_cfg", SockCfg, [netns_cookie, endpoints, pad]);
        // (struct size rows + fields) of every struct above
        assert_eq!(
            c.len(),
            [
                3, 3, 2, 4, 7, 8, 2, 5, 3, 9, 7, 5, 7, 6, 7, 5, 5, 5, 14, 7, 5, 4
            ]
            .iter()
            .sum::<usize>()
        );
    }

    #[test]
    fn policy_lpm_key_has_the_header_layout() {
        use aya::maps::lpm_trie::Key;
        assert_eq!(size_of::<Key<PolicyData>>(), size_of::<PolicyKey>());
        // Key<T> is packed: the data starts right after the 4-byte prefix length.
        assert_eq!(offset_of!(PolicyKey, identity), 4);
        assert_eq!(
            offset_of!(PolicyKey, endpoint) - 4,
            offset_of!(PolicyData, endpoint)
        );
        assert_eq!(
            offset_of!(PolicyKey, proto) - 4,
            offset_of!(PolicyData, proto)
        );
        assert_eq!(
            offset_of!(PolicyKey, dport) - 4,
            offset_of!(PolicyData, dport)
        );
        assert_eq!(
            offset_of!(PolicyKey, pad2) - 4,
            offset_of!(PolicyData, pad2)
        );
        assert_eq!(size_of::<PolicyData>() + 4, size_of::<PolicyKey>());
        let k = PolicyKey::new(
            POLICY_PREFIX_PROTO + 6,
            PolicyData {
                identity: 7,
                endpoint: 3,
                proto: PROTO_TCP,
                dport: 1024u16.to_be(),
                ..PolicyData::default()
            },
        );
        assert_eq!(k.data().identity, 7);
        assert_eq!(k.ports(), (1024, 2047));
        assert_eq!(k.protocol(), Some(PROTO_TCP));
        let any = PolicyKey {
            prefixlen: POLICY_PREFIX_ANY_PROTO,
            ..k
        };
        assert_eq!((any.protocol(), any.ports()), (None, (0, 65535)));
    }

    #[test]
    fn header_constants_match() {
        let h = include_str!("../include/fqdnd_maps.h");
        let define = |name: &str| -> String {
            h.lines()
                .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} not in the header"))
                .split("/*")
                .next()
                .unwrap()
                .trim()
                .to_owned()
        };
        let num = |name: &str| -> u64 { define(name).parse().unwrap() };
        assert_eq!(
            num("FQDND_POLICY_PREFIX_ANY_PROTO"),
            u64::from(POLICY_PREFIX_ANY_PROTO)
        );
        assert_eq!(
            num("FQDND_POLICY_PREFIX_PROTO"),
            u64::from(POLICY_PREFIX_PROTO)
        );
        assert_eq!(
            num("FQDND_POLICY_PREFIX_FULL"),
            u64::from(POLICY_PREFIX_FULL)
        );
        assert_eq!(
            num("FQDND_IPV6_MAX_EXT_HEADERS"),
            u64::from(IPV6_MAX_EXT_HEADERS)
        );
        assert_eq!(num("FQDND_CGROUP_MAX_DEPTH"), u64::from(CGROUP_MAX_DEPTH));
        for (name, value) in [
            ("FQDND_DROP_SPOOFED", DROP_SPOOFED),
            ("FQDND_DROP_FRAGMENT", DROP_FRAGMENT),
            ("FQDND_DROP_ICMP", DROP_ICMP),
            ("FQDND_DROP_EXT_HEADERS", DROP_EXT_HEADERS),
            ("FQDND_DROP_DNS_BYPASS", DROP_DNS_BYPASS),
            ("FQDND_SOURCE_INTERFACE", SOURCE_INTERFACE),
            ("FQDND_SOURCE_SOCKET", SOURCE_SOCKET),
            ("FQDND_CT_ZONE_INTERFACE", CT_ZONE_INTERFACE),
            ("FQDND_CT_ZONE_SOCKET", CT_ZONE_SOCKET),
        ] {
            assert_eq!(num(name), u64::from(value), "{name}");
        }
        let seconds = |name: &str| -> u64 {
            // "(60ULL * 1000000000ULL)"
            define(name)
                .trim_matches(|c| c == '(' || c == ')')
                .split('*')
                .map(|f| f.trim().trim_end_matches("ULL").parse::<u64>().unwrap())
                .product()
        };
        assert_eq!(
            seconds("FQDND_CT_TCP_SYN_DEFAULT_NS"),
            CT_TCP_SYN_DEFAULT_NS
        );
        assert_eq!(
            seconds("FQDND_CT_TCP_ESTABLISHED_DEFAULT_NS"),
            CT_TCP_ESTABLISHED_DEFAULT_NS
        );
        assert_eq!(
            seconds("FQDND_CT_TCP_CLOSING_DEFAULT_NS"),
            CT_TCP_CLOSING_DEFAULT_NS
        );
        assert_eq!(seconds("FQDND_CT_OTHER_DEFAULT_NS"), CT_OTHER_DEFAULT_NS);
        assert_eq!(seconds("FQDND_FRAG_LIFETIME_NS"), FRAG_LIFETIME_NS);
        assert_eq!(
            define("FQDND_EP_CHECK_SOURCE"),
            format!("{EP_CHECK_SOURCE:#x}")
        );
        assert_eq!(
            define("FQDND_EP_ENFORCE_INGRESS"),
            format!("{EP_ENFORCE_INGRESS:#x}")
        );
        assert_eq!(define("FQDND_POLICY_DENY"), format!("{POLICY_DENY:#x}"));
        assert_eq!(
            define("FQDND_POLICY_ID_INGRESS"),
            format!("{POLICY_ID_INGRESS:#x}")
        );
        assert_eq!(define("FQDND_CT_DNS"), format!("{CT_DNS:#x}"));
        assert_eq!(define("FQDND_EP_DNS_ONLY"), format!("{EP_DNS_ONLY:#x}"));
    }

    #[test]
    fn aya_lpm_keys_have_the_header_layout() {
        assert_eq!(
            size_of::<aya::maps::lpm_trie::Key<[u8; 4]>>(),
            size_of::<IpcacheKey4>()
        );
        assert_eq!(
            size_of::<aya::maps::lpm_trie::Key<[u8; 16]>>(),
            size_of::<IpcacheKey6>()
        );
    }

    #[test]
    fn abi_version_is_a_number() {
        assert!(ABI_VERSION.parse::<u32>().is_ok());
    }
}
