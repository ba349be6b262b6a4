//! `#[repr(C)]` mirrors of the structs in `include/fqdnd_maps.h`, the one header both the C
//! programs and this crate take their map layouts from. The tests compare every size and
//! offset here with what the C compiler reports for the header (a probe built by build.rs).
//!
//! This is the crate's only module with `unsafe`: aya requires map keys and values to
//! implement its `unsafe trait Pod` (plain old data: any bit pattern is valid, no padding
//! holes). Every struct below has explicit padding fields, so each impl is sound.
#![allow(unsafe_code, reason = "aya::Pod impls for plain-old-data map structs")]

/// The map layout version, from `FQDND_MAPS_ABI_VERSION` in the header (build.rs).
pub const ABI_VERSION: &str = env!("FQDND_MAPS_ABI_VERSION");

/// Wildcard identity in policy keys.
pub const ID_ANY: u32 = 0;
/// `reserved:world-ipv4`.
pub const ID_WORLD_IPV4: u32 = 9;
/// `reserved:world-ipv6`.
pub const ID_WORLD_IPV6: u32 = 10;
/// Policy key protocol: TCP and UDP.
pub const PROTO_ANY: u8 = 0;
/// TCP.
pub const PROTO_TCP: u8 = 6;
/// UDP.
pub const PROTO_UDP: u8 = 17;
/// Endpoint flag: default deny for its egress (on a `EP_BY_SOURCE` interface entry: drop
/// sources no client prefix holds).
pub const EP_ENFORCE_EGRESS: u8 = 0x1;
/// Endpoint flag: UDP/TCP to port 53 is assigned to the DNS proxy's socket.
pub const EP_REDIRECT_DNS: u8 = 0x2;
/// Interface entry flag: the endpoint is the `fqdnd_clients4/6` entry of the source address.
pub const EP_BY_SOURCE: u8 = 0x4;
/// `skb->mark` of packets assigned to the proxy (within [`MARK_MASK`]).
pub const MARK_TO_PROXY: u32 = 0x200;
/// The mark bits fqdnd owns.
pub const MARK_MASK: u32 = 0xf00;
/// The routing table of the local-delivery route for marked packets.
pub const PROXY_TABLE: u32 = 2004;
/// Policy value flag: allow.
pub const POLICY_ALLOW: u32 = 0x1;
/// Conntrack flag: opened by the endpoint.
pub const CT_EGRESS: u32 = 0x1;
/// Conntrack flag: opened towards the endpoint.
pub const CT_INGRESS: u32 = 0x2;
/// Drop reason: no policy entry allowed the packet.
pub const DROP_POLICY: u8 = 1;
/// Drop reason: an IP packet fqdnd cannot classify from an enforcing endpoint.
pub const DROP_UNHANDLED: u8 = 2;
/// Drop reason: DNS from a redirected endpoint and no proxy socket to assign it to.
pub const DROP_NO_PROXY: u8 = 3;
/// Drop reason: a new flow to a service VIP that has no backend.
pub const DROP_NO_BACKEND: u8 = 4;

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

/// `struct fqdnd_policy_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct PolicyKey {
    /// Destination identity, `ID_ANY` for all.
    pub identity: u32,
    /// Endpoint id.
    pub endpoint: u16,
    /// Destination port (host order), 0 for all.
    pub dport: u16,
    /// `PROTO_*`.
    pub proto: u8,
    /// Padding.
    pub pad: [u8; 3],
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
    /// Padding.
    pub pad: [u8; 2],
}

/// `struct fqdnd_ct_value`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CtValue {
    /// Creation time, `bpf_ktime_get_ns`.
    pub created_ns: u64,
    /// Last packet, `bpf_ktime_get_ns`.
    pub last_seen_ns: u64,
    /// `CT_*` flags.
    pub flags: u32,
    /// Rev-NAT index of the service of the flow, 0 = none.
    pub rev_nat: u16,
    /// Backend id the flow is translated to (its client → VIP entry), 0 = none.
    pub backend: u16,
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
    /// Padding.
    pub pad: [u8; 7],
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
            pad: [0; 7],
            saddr: arr(offset_of!(DropEvent, saddr)),
            daddr: arr(offset_of!(DropEvent, daddr)),
        })
    }
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
            [identity, endpoint, dport, proto, pad]
        );
        check!(c, "fqdnd_policy_value", PolicyValue, [flags]);
        check!(
            c,
            "fqdnd_ct_key",
            CtKey,
            [saddr, daddr, sport, dport, proto, family, pad]
        );
        check!(
            c,
            "fqdnd_ct_value",
            CtValue,
            [created_ns, last_seen_ns, flags, rev_nat, backend]
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
                ts_ns, ifindex, identity, endpoint, sport, dport, proto, family, reason, pad,
                saddr, daddr
            ]
        );
        assert_eq!(
            c.len(),
            10 + 2 + 2 + 1 + 3 + 6 + 5 + 1 + 7 + 5 + 12 + 7 + 5 + 5 + 5
        );
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
