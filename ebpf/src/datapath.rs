//! [`KernelDatapath`]: ipcache and policy batches written into the pinned maps.

use std::collections::{HashMap as StdHashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::path::Path;
use std::time::Duration;

use aya::maps::lpm_trie::Key;
use aya::maps::{Array, HashMap, LpmTrie, Map, MapData, MapError, RingBuf};
use fqdnd_ipcache::policy::{Direction, Protocol};
use fqdnd_ipcache::{Datapath, DatapathChange, DatapathError, EndpointId, Identity};
use ipnet::IpNet;

use crate::error::Error;
use crate::sys::{
    self, CtKey, CtValue, DnsProxy, DropEvent, EndpointValue, EpAddrKey, EpAddrValue, IpcacheValue,
    OriginKey, PolicyData, PolicyKey, PolicyValue, Settings, SockCfg, SockOrigin,
};

fn open_map(pin_dir: &Path, name: &str) -> Result<Map, Error> {
    Ok(Map::from_map_data(MapData::from_pin(pin_dir.join(name))?)?)
}

/// What an endpoint (an interface, or a client prefix of a by-source interface) gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct EndpointFlags {
    /// Default deny for its egress: only what the policy map allows passes.
    pub enforce_egress: bool,
    /// UDP and TCP to port 53 go to the DNS proxy (and are dropped when there is none).
    pub redirect_dns: bool,
    /// Packets whose source is not one of the interface's addresses
    /// ([`KernelDatapath::set_endpoint_addresses`]) are dropped, before the DNS redirect.
    /// Interface endpoints only (a by-source interface finds its endpoints by source).
    pub check_source: bool,
    /// Its ingress goes through its ingress policy entries (default deny there, or denies).
    pub enforce_ingress: bool,
}

impl EndpointFlags {
    fn bits(self) -> u8 {
        let mut b = 0;
        if self.enforce_egress {
            b |= sys::EP_ENFORCE_EGRESS;
        }
        if self.redirect_dns {
            b |= sys::EP_REDIRECT_DNS;
        }
        if self.check_source {
            b |= sys::EP_CHECK_SOURCE;
        }
        if self.enforce_ingress {
            b |= sys::EP_ENFORCE_INGRESS;
        }
        b
    }

    fn from_bits(b: u8) -> Self {
        EndpointFlags {
            enforce_egress: b & sys::EP_ENFORCE_EGRESS != 0,
            redirect_dns: b & sys::EP_REDIRECT_DNS != 0,
            check_source: b & sys::EP_CHECK_SOURCE != 0,
            enforce_ingress: b & sys::EP_ENFORCE_INGRESS != 0,
        }
    }
}

/// How long a conntrack entry lives after a packet, by state (`fqdnd_settings`). Defaults:
/// Cilium's (TCP SYN 60 s, established 6 h, closing 10 s, other 60 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtLifetimes {
    /// A TCP flow that has seen only SYNs.
    pub tcp_syn: Duration,
    /// An established TCP flow (a packet without SYN seen).
    pub tcp_established: Duration,
    /// A closing TCP flow: FIN in both directions, or RST.
    pub tcp_closing: Duration,
    /// Every other protocol (UDP, ICMP echo).
    pub other: Duration,
}

impl Default for CtLifetimes {
    fn default() -> Self {
        CtLifetimes {
            tcp_syn: Duration::from_nanos(sys::CT_TCP_SYN_DEFAULT_NS),
            tcp_established: Duration::from_nanos(sys::CT_TCP_ESTABLISHED_DEFAULT_NS),
            tcp_closing: Duration::from_nanos(sys::CT_TCP_CLOSING_DEFAULT_NS),
            other: Duration::from_nanos(sys::CT_OTHER_DEFAULT_NS),
        }
    }
}

/// The state of a conntrack entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtState {
    /// TCP, only SYNs seen.
    TcpSyn,
    /// TCP, a packet without SYN seen.
    TcpEstablished,
    /// TCP, FIN both ways or RST.
    TcpClosing,
    /// Not TCP.
    Other,
}

impl CtState {
    /// The name `fqdnd bpf ct list` shows.
    pub fn name(self) -> &'static str {
        match self {
            CtState::TcpSyn => "syn",
            CtState::TcpEstablished => "established",
            CtState::TcpClosing => "closing",
            CtState::Other => "-",
        }
    }
}

/// One `fqdnd_endpoints` entry, read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndpointEntry {
    /// An interface that is one endpoint.
    Endpoint {
        /// Host-side interface index.
        ifindex: u32,
        /// The endpoint.
        id: EndpointId,
        /// Its flags.
        flags: EndpointFlags,
    },
    /// An interface whose endpoints are found by source prefix ([`KernelDatapath::client_entries`]).
    BySource {
        /// Interface index.
        ifindex: u32,
        /// Sources no prefix holds are dropped (else they pass untouched).
        enforce_unknown: bool,
    },
    /// A bridge whose ports are endpoints ([`KernelDatapath::set_bridge`]).
    Bridge {
        /// The bridge's interface index.
        ifindex: u32,
    },
}

/// One conntrack entry, read back. Addresses and ports as on the wire, in the direction of the
/// flow's first packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtEntry {
    /// Source address.
    pub src: IpAddr,
    /// Source port.
    pub sport: u16,
    /// Destination address.
    pub dst: IpAddr,
    /// Destination port.
    pub dport: u16,
    /// IP protocol (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6; ICMP echo: the identifier is `sport`
    /// of the request's tuple).
    pub proto: u8,
    /// `sys::CT_*` flags: [`sys::CT_EGRESS`] (opened by the endpoint) or [`sys::CT_INGRESS`],
    /// and the TCP state bits.
    pub flags: u32,
    /// Creation, `CLOCK_MONOTONIC` nanoseconds (`bpf_ktime_get_ns`).
    pub created_ns: u64,
    /// Last packet, `CLOCK_MONOTONIC` nanoseconds.
    pub last_seen_ns: u64,
    /// When the entry dies without another packet, `CLOCK_MONOTONIC` nanoseconds.
    pub expires_ns: u64,
    /// Rev-NAT index of the service of a load-balanced flow, 0 = none.
    pub rev_nat: u16,
    /// The backend a client → VIP flow is translated to, 0 = none.
    pub backend: u16,
    /// [`sys::CT_ZONE_INTERFACE`] (seen by the interface programs) or [`sys::CT_ZONE_SOCKET`]
    /// (a host process's flow, seen by the cgroup socket programs).
    pub zone: u8,
}

impl CtEntry {
    fn new(k: &CtKey, v: &CtValue) -> Option<Self> {
        let (src, dst) = match k.family {
            4 => {
                let a = |b: &[u8; 16]| IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]));
                (a(&k.saddr), a(&k.daddr))
            }
            6 => (
                IpAddr::V6(Ipv6Addr::from(k.saddr)),
                IpAddr::V6(Ipv6Addr::from(k.daddr)),
            ),
            _ => return None,
        };
        Some(CtEntry {
            src,
            sport: u16::from_be(k.sport),
            dst,
            dport: u16::from_be(k.dport),
            proto: k.proto,
            flags: v.flags,
            created_ns: v.created_ns,
            last_seen_ns: v.last_seen_ns,
            expires_ns: v.expires_ns,
            rev_nat: v.rev_nat,
            backend: v.backend,
            zone: k.zone,
        })
    }

    /// The entry's state.
    pub fn state(&self) -> CtState {
        if self.proto != sys::PROTO_TCP {
            CtState::Other
        } else if self.flags & sys::CT_TCP_RST != 0
            || self.flags & (sys::CT_TCP_FIN_FWD | sys::CT_TCP_FIN_REV)
                == sys::CT_TCP_FIN_FWD | sys::CT_TCP_FIN_REV
        {
            CtState::TcpClosing
        } else if self.flags & sys::CT_TCP_SEEN_NON_SYN != 0 {
            CtState::TcpEstablished
        } else {
            CtState::TcpSyn
        }
    }

    /// Whether the entry is alive at `now_ns` (`CLOCK_MONOTONIC`): the programs treat a dead
    /// one as absent.
    pub fn alive(&self, now_ns: u64) -> bool {
        self.expires_ns > now_ns
    }

    /// How long it lives without another packet, from `now_ns` (zero when dead).
    pub fn remaining(&self, now_ns: u64) -> Duration {
        Duration::from_nanos(self.expires_ns.saturating_sub(now_ns))
    }
}

/// What [`KernelDatapath::finish_resync`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResyncStats {
    /// Entries already in the kernel with the value the new state wrote (not rewritten).
    pub kept: usize,
    /// Entries written: new ones and ones whose value changed.
    pub added: usize,
    /// Entries the new state did not write, deleted.
    pub removed: usize,
}

/// The kernel entries recorded by [`KernelDatapath::begin_resync`] and not yet confirmed.
#[derive(Debug, Default)]
struct Resync {
    ipcache: StdHashMap<IpNet, Identity>,
    policy: HashSet<PolicyKey>,
    stats: ResyncStats,
}

/// `CLOCK_MONOTONIC` now in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> Result<u64, Error> {
    let t =
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_err(|e| Error::Io {
            what: "clock_gettime(CLOCK_MONOTONIC)".to_owned(),
            error: e.into(),
        })?;
    Ok(u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(t.tv_nsec()).unwrap_or(0))
}

/// The pinned maps, opened from their pins, with the reference counts that let overlapping
/// policy keys (expanded ranges, repeated entries) share kernel entries.
///
/// Opening changes nothing in the maps, so it is also how a CLI reads them while the daemon
/// runs (every `*_entries` function works from the pins alone, with no program loaded).
pub struct KernelDatapath {
    ipc4: LpmTrie<MapData, [u8; 4], IpcacheValue>,
    ipc6: LpmTrie<MapData, [u8; 16], IpcacheValue>,
    endpoints: HashMap<MapData, u32, EndpointValue>,
    clients4: LpmTrie<MapData, [u8; 4], EndpointValue>,
    clients6: LpmTrie<MapData, [u8; 16], EndpointValue>,
    policy: LpmTrie<MapData, PolicyData, PolicyValue>,
    ct: HashMap<MapData, CtKey, CtValue>,
    dns_proxy: Array<MapData, DnsProxy>,
    ep_addrs: HashMap<MapData, EpAddrKey, EpAddrValue>,
    settings: Array<MapData, Settings>,
    cgroups: HashMap<MapData, u64, EndpointValue>,
    sock_cfg: Array<MapData, SockCfg>,
    refs: StdHashMap<PolicyKey, Refs>,
    resync: Option<Resync>,
}

/// How many policy keys stand for one kernel entry, allowing and denying. The entry denies
/// while any deny does (a deny wins), else allows; it is absent while both are zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Refs {
    allow: u32,
    deny: u32,
}

impl Refs {
    /// The value the kernel entry has, `None` = no entry.
    fn flags(self) -> Option<u32> {
        if self.deny > 0 {
            Some(sys::POLICY_DENY)
        } else if self.allow > 0 {
            Some(sys::POLICY_ALLOW)
        } else {
            None
        }
    }
}

fn map_err(map: &'static str, operation: &'static str, e: MapError) -> DatapathError {
    if let MapError::SyscallError(s) = &e
        && matches!(s.io_error.raw_os_error(), Some(libc::E2BIG | libc::ENOSPC))
    {
        return DatapathError::MapFull { map };
    }
    DatapathError::Io {
        operation,
        source: std::io::Error::other(e.to_string()),
    }
}

fn datapath_to_error(e: DatapathError) -> Error {
    Error::Io {
        what: "reading the maps".to_owned(),
        error: std::io::Error::other(e.to_string()),
    }
}

/// A delete of a key that is not there (aya reports it as a failed syscall with ENOENT).
fn not_found(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// The prefixes that cover the ports `first..=last` exactly: `(first port, prefix bits)`,
/// bits 0..=16 (16 = one port, 0 = every port). At most 30 prefixes (1–65534: two per bit
/// but the last).
pub fn port_prefixes(first: u16, last: u16) -> Vec<(u16, u8)> {
    let (mut lo, hi) = (u32::from(first), u32::from(last));
    let mut out = Vec::new();
    while lo <= hi {
        // the largest aligned block starting at `lo` that stays within `hi`
        let mut size: u32 = if lo == 0 {
            1 << 16
        } else {
            lo & lo.wrapping_neg()
        };
        while lo + size - 1 > hi {
            size >>= 1;
        }
        let bits = 16 - size.trailing_zeros();
        out.push((lo as u16, bits as u8));
        lo += size;
    }
    out
}

/// The kernel entries one policy key stands for: one entry for every protocol and port (a
/// rule without ports: every protocol, ICMP included), or per protocol (TCP and UDP for
/// "any") one entry for every port or one per port prefix of its range. Every range is
/// representable.
fn expand(endpoint: EndpointId, key: &fqdnd_ipcache::PolicyKey) -> Vec<PolicyKey> {
    let direction = match key.direction {
        Direction::Egress => 0,
        Direction::Ingress => sys::POLICY_ID_INGRESS,
    };
    let base = PolicyData {
        identity: key.identity.0 | direction,
        endpoint: endpoint.0,
        ..PolicyData::default()
    };
    if key.port == 0 && key.protocol == Protocol::Any {
        return vec![PolicyKey::new(sys::POLICY_PREFIX_ANY_PROTO, base)];
    }
    let protos: &[u8] = match key.protocol {
        Protocol::Tcp => &[sys::PROTO_TCP],
        Protocol::Udp => &[sys::PROTO_UDP],
        Protocol::Any => &[sys::PROTO_TCP, sys::PROTO_UDP],
        // The ICMP type, exactly, as the destination port.
        Protocol::Icmp | Protocol::Icmpv6 => {
            let proto = if key.protocol == Protocol::Icmp {
                sys::PROTO_ICMP
            } else {
                sys::PROTO_ICMPV6
            };
            return vec![PolicyKey::new(
                sys::POLICY_PREFIX_FULL,
                PolicyData {
                    proto,
                    dport: key.port.to_be(),
                    ..base
                },
            )];
        }
    };
    let mut out = Vec::new();
    for &proto in protos {
        let data = PolicyData { proto, ..base };
        if key.port == 0 {
            out.push(PolicyKey::new(sys::POLICY_PREFIX_PROTO, data));
            continue;
        }
        for (port, bits) in port_prefixes(key.port, key.end_port.max(key.port)) {
            out.push(PolicyKey::new(
                sys::POLICY_PREFIX_PROTO + u32::from(bits),
                PolicyData {
                    dport: port.to_be(),
                    ..data
                },
            ));
        }
    }
    out
}

/// One kernel write of a batch, as it is undone when a later write fails.
#[derive(Debug)]
enum Undo {
    /// A policy entry's counts changed (and, when its value changed, the kernel entry was
    /// written or deleted): the counts and the entry go back to `before`.
    Policy {
        key: PolicyKey,
        before: Option<Refs>,
    },
    /// Resync: a policy entry present before the restart (with these flags) was confirmed
    /// (and its value written).
    ResyncPolicy(PolicyKey, u32),
    /// A new ipcache prefix was written: delete it.
    IpcWritten(IpNet),
    /// An ipcache prefix's identity was replaced: write the old one back.
    IpcReplaced(IpNet, Identity),
    /// An ipcache prefix was deleted: write it back.
    IpcDeleted(IpNet, Identity),
    /// Resync: a prefix present before the restart (with this identity) was confirmed or
    /// rewritten.
    ResyncIpc(IpNet, Identity),
}

/// An error of the batch that `change` (0-based, of `len`) of failed with, saying that the
/// `undone` writes before it were undone.
fn refused(e: DatapathError, change: usize, len: usize, undone: usize) -> DatapathError {
    match e {
        // The engine counts these per map; the batch is whole-or-nothing by contract.
        DatapathError::MapFull { map } => DatapathError::MapFull { map },
        DatapathError::Io { operation, source } => DatapathError::Io {
            operation,
            source: std::io::Error::new(
                source.kind(),
                format!(
                    "{source} (change {} of {len} in the batch; the {undone} kernel writes \
                     before it were undone: the maps hold what they held before the batch)",
                    change + 1
                ),
            ),
        },
        other => other,
    }
}

fn ipc_key_error(prefix: &IpNet, operation: &'static str, e: MapError) -> DatapathError {
    let map = if prefix.addr().is_ipv4() {
        "fqdnd_ipc4"
    } else {
        "fqdnd_ipc6"
    };
    match map_err(map, operation, e) {
        DatapathError::Io { operation, source } => DatapathError::Io {
            operation,
            source: std::io::Error::new(source.kind(), format!("{prefix}: {source}")),
        },
        other => other,
    }
}

fn policy_key_error(k: &PolicyKey, operation: &'static str, e: MapError) -> DatapathError {
    match map_err("fqdnd_policy", operation, e) {
        DatapathError::Io { operation, source } => DatapathError::Io {
            operation,
            source: std::io::Error::new(
                source.kind(),
                format!(
                    "endpoint {} identity {} proto {:?} ports {:?}: {source}",
                    k.endpoint,
                    k.identity,
                    k.protocol(),
                    k.ports()
                ),
            ),
        },
        other => other,
    }
}

/// The key already exists (a `BPF_NOEXIST` insert).
fn exists(e: &MapError) -> bool {
    matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::EEXIST))
}

const BPF_NOEXIST: u64 = 1;

fn ep_addr_key(ifindex: u32, addr: IpAddr) -> EpAddrKey {
    let mut k = EpAddrKey {
        ifindex,
        ..EpAddrKey::default()
    };
    match addr {
        IpAddr::V4(a) => {
            k.family = 4;
            k.addr[..4].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            k.family = 6;
            k.addr = a.octets();
        }
    }
    k
}

fn ep_addr_of(k: &EpAddrKey) -> Option<IpAddr> {
    match k.family {
        4 => Some(IpAddr::V4(Ipv4Addr::new(
            k.addr[0], k.addr[1], k.addr[2], k.addr[3],
        ))),
        6 => Some(IpAddr::V6(Ipv6Addr::from(k.addr))),
        _ => None,
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl std::fmt::Debug for KernelDatapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelDatapath")
            .field("policy_refs", &self.refs.len())
            .field("resync", &self.resync.is_some())
            .finish_non_exhaustive()
    }
}

fn lpm_key4(n: &ipnet::Ipv4Net) -> Key<[u8; 4]> {
    Key::new(n.prefix_len().into(), n.addr().octets())
}

fn lpm_key6(n: &ipnet::Ipv6Net) -> Key<[u8; 16]> {
    Key::new(n.prefix_len().into(), n.addr().octets())
}

fn ignore_absent(r: Result<(), MapError>) -> Result<(), MapError> {
    match r {
        Err(e) if not_found(&e) => Ok(()),
        r => r,
    }
}

impl KernelDatapath {
    /// Opens the maps pinned in `pin_dir` (by [`crate::Loaded::load`]); nothing in them is
    /// changed. Reference counts start empty: after a restart the caller re-applies its full
    /// state between [`Self::begin_resync`] and [`Self::finish_resync`].
    pub fn open(pin_dir: &Path) -> Result<Self, Error> {
        Ok(KernelDatapath {
            ipc4: open_map(pin_dir, "fqdnd_ipc4")?.try_into()?,
            ipc6: open_map(pin_dir, "fqdnd_ipc6")?.try_into()?,
            endpoints: open_map(pin_dir, "fqdnd_endpoints")?.try_into()?,
            clients4: open_map(pin_dir, "fqdnd_clients4")?.try_into()?,
            clients6: open_map(pin_dir, "fqdnd_clients6")?.try_into()?,
            policy: open_map(pin_dir, "fqdnd_policy")?.try_into()?,
            ct: open_map(pin_dir, "fqdnd_ct")?.try_into()?,
            dns_proxy: open_map(pin_dir, "fqdnd_dns_proxy")?.try_into()?,
            ep_addrs: open_map(pin_dir, "fqdnd_ep_addrs")?.try_into()?,
            settings: open_map(pin_dir, "fqdnd_settings")?.try_into()?,
            cgroups: open_map(pin_dir, "fqdnd_cgroups")?.try_into()?,
            sock_cfg: open_map(pin_dir, "fqdnd_sock_cfg")?.try_into()?,
            refs: StdHashMap::new(),
            resync: None,
        })
    }

    /// Registers the host-side veth `ifindex` as endpoint `id` with `flags`
    /// (`enforce_egress`: default deny, else its packets only feed conntrack; `redirect_dns`:
    /// its DNS goes to the proxy set by [`Self::set_dns_proxy`]).
    pub fn set_endpoint(
        &mut self,
        ifindex: u32,
        id: EndpointId,
        flags: EndpointFlags,
    ) -> Result<(), DatapathError> {
        let v = EndpointValue {
            endpoint: id.0,
            flags: flags.bits(),
            pad: 0,
        };
        self.endpoints
            .insert(ifindex, v, 0)
            .map_err(|e| map_err("fqdnd_endpoints", "endpoint upsert", e))
    }

    /// Registers `ifindex` as a by-source interface (gateway mode): each packet's endpoint is
    /// the client prefix ([`Self::set_client_prefix`]) holding its source address. Sources no
    /// prefix holds are dropped (with a `DROP_POLICY` event, endpoint 0) when
    /// `enforce_unknown`, else pass untouched.
    pub fn set_interface_by_source(
        &mut self,
        ifindex: u32,
        enforce_unknown: bool,
    ) -> Result<(), DatapathError> {
        let mut flags = sys::EP_BY_SOURCE;
        if enforce_unknown {
            flags |= sys::EP_ENFORCE_EGRESS;
        }
        let v = EndpointValue {
            endpoint: 0,
            flags,
            pad: 0,
        };
        self.endpoints
            .insert(ifindex, v, 0)
            .map_err(|e| map_err("fqdnd_endpoints", "endpoint upsert", e))
    }

    /// Registers the bridge `ifindex` whose ports are endpoints (node mode). Their packets are
    /// judged at their port; a DNS query's socket assignment made there does not survive the
    /// bridge, so the bridge's ingress assigns it again: for sources whose client prefix
    /// ([`Self::set_client_prefix`]) has `redirect_dns`. Everything else passes.
    pub fn set_bridge(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        let v = EndpointValue {
            endpoint: 0,
            flags: sys::EP_BY_SOURCE | sys::EP_DNS_ONLY,
            pad: 0,
        };
        self.endpoints
            .insert(ifindex, v, 0)
            .map_err(|e| map_err("fqdnd_endpoints", "endpoint upsert", e))
    }

    /// Source prefix → endpoint for by-source interfaces (longest prefix wins).
    pub fn set_client_prefix(
        &mut self,
        prefix: IpNet,
        id: EndpointId,
        flags: EndpointFlags,
    ) -> Result<(), DatapathError> {
        let v = EndpointValue {
            endpoint: id.0,
            flags: flags.bits(),
            pad: 0,
        };
        let r = match prefix.trunc() {
            IpNet::V4(n) => self.clients4.insert(&lpm_key4(&n), v, 0),
            IpNet::V6(n) => self.clients6.insert(&lpm_key6(&n), v, 0),
        };
        r.map_err(|e| map_err("fqdnd_clients", "client prefix upsert", e))
    }

    /// Forgets a client prefix (absent is fine).
    pub fn remove_client_prefix(&mut self, prefix: IpNet) -> Result<(), DatapathError> {
        let r = match prefix.trunc() {
            IpNet::V4(n) => self.clients4.remove(&lpm_key4(&n)),
            IpNet::V6(n) => self.clients6.remove(&lpm_key6(&n)),
        };
        ignore_absent(r).map_err(|e| map_err("fqdnd_clients", "client prefix delete", e))
    }

    /// Where the DNS proxy listens, per family (`None`: no proxy, redirected DNS of that
    /// family is dropped). The address is what the sockets are bound to: `0.0.0.0` / `::` for
    /// wildcard listeners, else their address (e.g. `127.0.0.1`). UDP and TCP share the port.
    pub fn set_dns_proxy(
        &mut self,
        v4: Option<SocketAddrV4>,
        v6: Option<SocketAddrV6>,
    ) -> Result<(), DatapathError> {
        let mut v = DnsProxy::default();
        if let Some(a) = v4 {
            v.addr4 = a.ip().octets();
            v.port4 = a.port().to_be();
        }
        if let Some(a) = v6 {
            v.addr6 = a.ip().octets();
            v.port6 = a.port().to_be();
        }
        self.dns_proxy
            .set(0, v, 0)
            .map_err(|e| map_err("fqdnd_dns_proxy", "dns proxy update", e))
    }

    /// The DNS proxy addresses the programs use.
    pub fn dns_proxy(&self) -> Result<(Option<SocketAddrV4>, Option<SocketAddrV6>), Error> {
        let v = self.dns_proxy.get(&0, 0)?;
        let v4 = (v.port4 != 0)
            .then(|| SocketAddrV4::new(Ipv4Addr::from(v.addr4), u16::from_be(v.port4)));
        let v6 = (v.port6 != 0)
            .then(|| SocketAddrV6::new(Ipv6Addr::from(v.addr6), u16::from_be(v.port6), 0, 0));
        Ok((v4, v6))
    }

    /// Every `fqdnd_endpoints` entry, sorted by interface index.
    pub fn endpoint_entries(&self) -> Result<Vec<EndpointEntry>, Error> {
        let mut out = Vec::new();
        for r in self.endpoints.iter() {
            let (ifindex, v) = r?;
            out.push(if v.flags & sys::EP_DNS_ONLY != 0 {
                EndpointEntry::Bridge { ifindex }
            } else if v.flags & sys::EP_BY_SOURCE != 0 {
                EndpointEntry::BySource {
                    ifindex,
                    enforce_unknown: v.flags & sys::EP_ENFORCE_EGRESS != 0,
                }
            } else {
                EndpointEntry::Endpoint {
                    ifindex,
                    id: EndpointId(v.endpoint),
                    flags: EndpointFlags::from_bits(v.flags),
                }
            });
        }
        out.sort_by_key(|e| match e {
            EndpointEntry::Endpoint { ifindex, .. }
            | EndpointEntry::BySource { ifindex, .. }
            | EndpointEntry::Bridge { ifindex } => *ifindex,
        });
        Ok(out)
    }

    /// Every client prefix of by-source interfaces, sorted.
    pub fn client_entries(&self) -> Result<Vec<(IpNet, EndpointId, EndpointFlags)>, Error> {
        let mut out = Vec::new();
        for r in self.clients4.iter() {
            let (k, v) = r?;
            if let Ok(n) = IpNet::new(Ipv4Addr::from(k.data()).into(), k.prefix_len() as u8) {
                out.push((n, EndpointId(v.endpoint), EndpointFlags::from_bits(v.flags)));
            }
        }
        for r in self.clients6.iter() {
            let (k, v) = r?;
            if let Ok(n) = IpNet::new(Ipv6Addr::from(k.data()).into(), k.prefix_len() as u8) {
                out.push((n, EndpointId(v.endpoint), EndpointFlags::from_bits(v.flags)));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Every conntrack entry (unordered).
    pub fn ct_entries(&self) -> Result<Vec<CtEntry>, Error> {
        let mut out = Vec::new();
        for r in self.ct.iter() {
            match r {
                Ok((k, v)) => out.extend(CtEntry::new(&k, &v)),
                // an entry deleted (LRU eviction, GC) between the key walk and the lookup
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    /// Destination addresses of the live flows endpoints opened (`CT_EGRESS`): entries not past
    /// their lifetime (which depends on their state: [`CtLifetimes`]). The "connections still
    /// use this IP" input of the name manager's GC: a zombie stays while such a flow lives.
    pub fn live_destinations(&self) -> Result<HashSet<IpAddr>, Error> {
        let now = monotonic_ns()?;
        Ok(self
            .ct_entries()?
            .into_iter()
            .filter(|e| e.flags & sys::CT_EGRESS != 0 && e.alive(now))
            .map(|e| e.dst)
            .collect())
    }

    /// Deletes the dead conntrack entries (past their lifetime; the programs already treat
    /// them as absent); returns how many. (The map is also LRU: when full, the kernel evicts
    /// the least recently used.)
    pub fn gc_conntrack(&mut self) -> Result<usize, Error> {
        let now = monotonic_ns()?;
        let mut dead = Vec::new();
        for r in self.ct.iter() {
            match r {
                Ok((k, v)) if v.expires_ns <= now => dead.push(k),
                Ok(_) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut n = 0;
        for k in &dead {
            // a packet may have revived it since the walk: delete only what is still dead
            match self.ct.get(k, 0) {
                Ok(v) if v.expires_ns > now => continue,
                Ok(_) => {}
                Err(e) if not_found(&e) => continue,
                Err(e) => return Err(e.into()),
            }
            match self.ct.remove(k) {
                Ok(()) => n += 1,
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(n)
    }

    /// Sets the conntrack lifetimes the programs use from their next packet on (entries keep
    /// the expiry their last packet gave them).
    pub fn set_ct_lifetimes(&mut self, l: &CtLifetimes) -> Result<(), DatapathError> {
        let v = Settings {
            ct_tcp_syn_ns: nanos(l.tcp_syn),
            ct_tcp_established_ns: nanos(l.tcp_established),
            ct_tcp_closing_ns: nanos(l.tcp_closing),
            ct_other_ns: nanos(l.other),
        };
        self.settings
            .set(0, v, 0)
            .map_err(|e| map_err("fqdnd_settings", "settings update", e))
    }

    /// The conntrack lifetimes the programs use (defaults for fields never set).
    pub fn ct_lifetimes(&self) -> Result<CtLifetimes, Error> {
        let v = self.settings.get(&0, 0)?;
        let d = CtLifetimes::default();
        let pick = |ns: u64, default: Duration| {
            if ns == 0 {
                default
            } else {
                Duration::from_nanos(ns)
            }
        };
        Ok(CtLifetimes {
            tcp_syn: pick(v.ct_tcp_syn_ns, d.tcp_syn),
            tcp_established: pick(v.ct_tcp_established_ns, d.tcp_established),
            tcp_closing: pick(v.ct_tcp_closing_ns, d.tcp_closing),
            other: pick(v.ct_other_ns, d.other),
        })
    }

    /// Makes `addrs` the addresses of interface `ifindex` (endpoint `id`), the sources its
    /// packets may have when it is flagged `check_source`: the new ones are written first,
    /// then the others removed, so a valid source never drops meanwhile.
    pub fn set_endpoint_addresses(
        &mut self,
        ifindex: u32,
        id: EndpointId,
        addrs: &[IpAddr],
    ) -> Result<(), DatapathError> {
        let wanted: HashSet<EpAddrKey> = addrs.iter().map(|a| ep_addr_key(ifindex, *a)).collect();
        let v = EpAddrValue {
            endpoint: id.0,
            pad: 0,
        };
        for k in &wanted {
            self.ep_addrs
                .insert(k, v, 0)
                .map_err(|e| map_err("fqdnd_ep_addrs", "endpoint address upsert", e))?;
        }
        for k in self.addresses_of(ifindex)? {
            if !wanted.contains(&k) {
                ignore_absent(self.ep_addrs.remove(&k))
                    .map_err(|e| map_err("fqdnd_ep_addrs", "endpoint address delete", e))?;
            }
        }
        Ok(())
    }

    /// The keys of `ifindex`'s addresses (a walk of the map).
    fn addresses_of(&self, ifindex: u32) -> Result<Vec<EpAddrKey>, DatapathError> {
        let mut out = Vec::new();
        for k in self.ep_addrs.keys() {
            let k = k.map_err(|e| map_err("fqdnd_ep_addrs", "endpoint address dump", e))?;
            if k.ifindex == ifindex {
                out.push(k);
            }
        }
        Ok(out)
    }

    /// Every endpoint address: (interface index, endpoint, address), sorted.
    pub fn endpoint_addresses(&self) -> Result<Vec<(u32, EndpointId, IpAddr)>, Error> {
        let mut out = Vec::new();
        for r in self.ep_addrs.iter() {
            match r {
                Ok((k, v)) => {
                    if let Some(a) = ep_addr_of(&k) {
                        out.push((k.ifindex, EndpointId(v.endpoint), a));
                    }
                }
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        out.sort();
        Ok(out)
    }

    /// Starts a resync (daemon restart): records every ipcache and policy entry in the kernel
    /// as unconfirmed and forgets the reference counts. The caller then applies its whole
    /// desired state as upserts: an entry already present with the same value is confirmed
    /// without a write (no packet sees a gap), others are written. [`Self::finish_resync`]
    /// deletes what was not confirmed. Entries are never flushed.
    pub fn begin_resync(&mut self) -> Result<(), Error> {
        let mut rs = Resync::default();
        for (net, id) in self.ipcache_entries().map_err(datapath_to_error)? {
            rs.ipcache.insert(net, id);
        }
        rs.policy = self
            .policy_entries()
            .map_err(datapath_to_error)?
            .into_iter()
            .collect();
        self.refs.clear();
        self.resync = Some(rs);
        Ok(())
    }

    /// Ends a resync: deletes every entry recorded by [`Self::begin_resync`] that the new
    /// state did not write again, and says what was kept, added and removed. Without a
    /// resync in progress it does nothing and returns zeroes.
    pub fn finish_resync(&mut self) -> Result<ResyncStats, Error> {
        let Some(rs) = self.resync.take() else {
            return Ok(ResyncStats::default());
        };
        let mut stats = rs.stats;
        for net in rs.ipcache.keys() {
            let r = match net {
                IpNet::V4(n) => self.ipc4.remove(&lpm_key4(n)),
                IpNet::V6(n) => self.ipc6.remove(&lpm_key6(n)),
            };
            ignore_absent(r)?;
            stats.removed += 1;
        }
        for k in &rs.policy {
            ignore_absent(self.policy.remove(&Key::new(k.prefixlen, k.data())))?;
            stats.removed += 1;
        }
        Ok(stats)
    }

    /// Makes the sockets of cgroup `cgroup_id` (a cgroup v2 id: [`crate::cgroup::cgroup_id`]) and
    /// of every cgroup below it endpoint `id` with `flags` for the cgroup socket programs
    /// (`enforce_egress`: default deny for what they send; `enforce_ingress`: what they receive
    /// from anywhere but loopback goes through the endpoint's ingress entries; `redirect_dns`:
    /// their DNS goes to the proxy set by [`Self::set_dns_proxy`]). `check_source` means
    /// nothing there (host processes share the host's addresses). A socket belongs to the deepest such cgroup above it.
    pub fn set_cgroup_endpoint(
        &mut self,
        cgroup_id: u64,
        id: EndpointId,
        flags: EndpointFlags,
    ) -> Result<(), DatapathError> {
        let v = EndpointValue {
            endpoint: id.0,
            flags: flags.bits() & !sys::EP_CHECK_SOURCE,
            pad: 0,
        };
        self.cgroups
            .insert(cgroup_id, v, 0)
            .map_err(|e| map_err("fqdnd_cgroups", "cgroup endpoint upsert", e))
    }

    /// Forgets a cgroup endpoint entry (absent is fine): its sockets are left alone again.
    pub fn remove_cgroup_endpoint(&mut self, cgroup_id: u64) -> Result<(), DatapathError> {
        ignore_absent(self.cgroups.remove(&cgroup_id))
            .map_err(|e| map_err("fqdnd_cgroups", "cgroup endpoint delete", e))
    }

    /// Every `fqdnd_cgroups` entry: (cgroup id, endpoint, flags), sorted.
    pub fn cgroup_entries(&self) -> Result<Vec<(u64, EndpointId, EndpointFlags)>, Error> {
        let mut out = Vec::new();
        for r in self.cgroups.iter() {
            match r {
                Ok((k, v)) => {
                    out.push((k, EndpointId(v.endpoint), EndpointFlags::from_bits(v.flags)));
                }
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        out.sort();
        Ok(out)
    }

    /// The socket programs' settings: the network namespace whose sockets the redirect
    /// applies to (the proxy's: [`crate::sys::netns_cookie`]; `0` = every namespace), and how
    /// many cgroup endpoints there are (while 0, every socket program returns at once, so the
    /// programs can stay attached for nothing but a lookup per call or packet).
    pub fn set_sock_settings(
        &mut self,
        netns_cookie: u64,
        endpoints: u32,
    ) -> Result<(), DatapathError> {
        let v = SockCfg {
            netns_cookie,
            endpoints,
            pad: 0,
        };
        self.sock_cfg
            .set(0, v, 0)
            .map_err(|e| map_err("fqdnd_sock_cfg", "socket settings update", e))
    }

    /// Forgets an interface: its packets pass untouched. Its addresses go after its entry.
    pub fn remove_endpoint(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        ignore_absent(self.endpoints.remove(&ifindex))
            .map_err(|e| map_err("fqdnd_endpoints", "endpoint delete", e))?;
        for k in self.addresses_of(ifindex)? {
            ignore_absent(self.ep_addrs.remove(&k))
                .map_err(|e| map_err("fqdnd_ep_addrs", "endpoint address delete", e))?;
        }
        Ok(())
    }

    /// The identity the kernel's ipcache gives `addr` (world when no prefix holds it).
    pub fn identity_of(&self, addr: IpAddr) -> Result<Identity, DatapathError> {
        let r = match addr {
            IpAddr::V4(a) => self.ipc4.get(&Key::new(32, a.octets()), 0),
            IpAddr::V6(a) => self.ipc6.get(&Key::new(128, a.octets()), 0),
        };
        match r {
            Ok(v) => Ok(Identity(v.identity)),
            Err(MapError::KeyNotFound) => Ok(Identity::world(addr.is_ipv4())),
            Err(e) => Err(map_err("ipcache", "ipcache lookup", e)),
        }
    }

    /// Every ipcache entry in the kernel, unordered.
    pub fn ipcache_entries(&self) -> Result<Vec<(IpNet, Identity)>, DatapathError> {
        let mut out = Vec::new();
        for r in self.ipc4.iter() {
            let (k, v) = r.map_err(|e| map_err("fqdnd_ipc4", "ipcache dump", e))?;
            let net = IpNet::new(Ipv4Addr::from(k.data()).into(), k.prefix_len() as u8);
            out.extend(net.ok().map(|n| (n, Identity(v.identity))));
        }
        for r in self.ipc6.iter() {
            let (k, v) = r.map_err(|e| map_err("fqdnd_ipc6", "ipcache dump", e))?;
            let net = IpNet::new(Ipv6Addr::from(k.data()).into(), k.prefix_len() as u8);
            out.extend(net.ok().map(|n| (n, Identity(v.identity))));
        }
        Ok(out)
    }

    /// Every policy entry in the kernel, sorted.
    pub fn policy_entries(&self) -> Result<Vec<PolicyKey>, DatapathError> {
        let mut out = Vec::new();
        for r in self.policy.iter() {
            let (k, _) = r.map_err(|e| map_err("fqdnd_policy", "policy dump", e))?;
            out.push(PolicyKey::new(k.prefix_len(), k.data()));
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn policy_write(&mut self, k: &PolicyKey, flags: u32) -> Result<(), DatapathError> {
        self.policy
            .insert(&Key::new(k.prefixlen, k.data()), PolicyValue { flags }, 0)
            .map_err(|e| policy_key_error(k, "policy upsert", e))
    }

    fn policy_remove(&mut self, k: &PolicyKey) -> Result<(), DatapathError> {
        ignore_absent(self.policy.remove(&Key::new(k.prefixlen, k.data())))
            .map_err(|e| policy_key_error(k, "policy delete", e))
    }

    /// Brings the kernel entry of `k` from the value of `before` to that of `after`.
    fn policy_set(
        &mut self,
        k: &PolicyKey,
        before: Option<u32>,
        after: Option<u32>,
    ) -> Result<(), DatapathError> {
        match (before, after) {
            (b, a) if b == a => Ok(()),
            (_, Some(flags)) => self.policy_write(k, flags),
            (_, None) => self.policy_remove(k),
        }
    }

    fn policy_upsert(
        &mut self,
        endpoint: EndpointId,
        key: &fqdnd_ipcache::PolicyKey,
        undo: &mut Vec<Undo>,
    ) -> Result<(), DatapathError> {
        for k in expand(endpoint, key) {
            let before = self.refs.get(&k).copied();
            let mut after = before.unwrap_or_default();
            if key.deny {
                after.deny += 1;
            } else {
                after.allow += 1;
            }
            if before.is_none()
                && let Some(rs) = &mut self.resync
                && rs.policy.remove(&k)
            {
                // present before the restart: confirmed, its value written as wanted
                let old = self
                    .policy
                    .get(&Key::new(k.prefixlen, k.data()), 0)
                    .map_or(sys::POLICY_ALLOW, |v| v.flags);
                rs.stats.kept += 1;
                undo.push(Undo::ResyncPolicy(k, old));
                self.refs.insert(k, after);
                if let Some(flags) = after.flags().filter(|f| *f != old) {
                    self.policy_write(&k, flags)?;
                }
                continue;
            }
            self.policy_set(&k, before.and_then(Refs::flags), after.flags())?;
            if before.is_none()
                && let Some(rs) = &mut self.resync
            {
                rs.stats.added += 1;
            }
            self.refs.insert(k, after);
            undo.push(Undo::Policy { key: k, before });
        }
        Ok(())
    }

    fn policy_delete(
        &mut self,
        endpoint: EndpointId,
        key: &fqdnd_ipcache::PolicyKey,
        undo: &mut Vec<Undo>,
    ) -> Result<(), DatapathError> {
        for k in expand(endpoint, key) {
            let Some(before) = self.refs.get(&k).copied() else {
                continue;
            };
            let mut after = before;
            if key.deny {
                after.deny = after.deny.saturating_sub(1);
            } else {
                after.allow = after.allow.saturating_sub(1);
            }
            self.policy_set(&k, before.flags(), after.flags())?;
            if after.flags().is_none() {
                self.refs.remove(&k);
            } else {
                self.refs.insert(k, after);
            }
            undo.push(Undo::Policy {
                key: k,
                before: Some(before),
            });
        }
        Ok(())
    }

    fn ipc_insert(
        &mut self,
        prefix: &IpNet,
        identity: Identity,
        flags: u64,
    ) -> Result<(), MapError> {
        let v = IpcacheValue {
            identity: identity.0,
        };
        match prefix {
            IpNet::V4(n) => self.ipc4.insert(&lpm_key4(n), v, flags),
            IpNet::V6(n) => self.ipc6.insert(&lpm_key6(n), v, flags),
        }
    }

    /// The value of the longest prefix of `prefix`'s length or shorter holding its address:
    /// `prefix`'s own when it exists (LPM lookups are not exact, deletes are).
    fn ipc_lookup(&self, prefix: &IpNet) -> Result<Option<Identity>, MapError> {
        let r = match prefix {
            IpNet::V4(n) => self.ipc4.get(&lpm_key4(n), 0),
            IpNet::V6(n) => self.ipc6.get(&lpm_key6(n), 0),
        };
        match r {
            Ok(v) => Ok(Some(Identity(v.identity))),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn ipc_remove(&mut self, prefix: &IpNet) -> Result<bool, MapError> {
        let r = match prefix {
            IpNet::V4(n) => self.ipc4.remove(&lpm_key4(n)),
            IpNet::V6(n) => self.ipc6.remove(&lpm_key6(n)),
        };
        match r {
            Ok(()) => Ok(true),
            Err(e) if not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// An ipcache upsert: a new prefix costs one write (`BPF_NOEXIST`); only when the prefix
    /// exists is its identity read (for the undo log) and, if different, replaced.
    fn ipcache_upsert(
        &mut self,
        prefix: IpNet,
        identity: Identity,
        undo: &mut Vec<Undo>,
    ) -> Result<(), DatapathError> {
        if let Some(rs) = &mut self.resync
            && let Some(before) = rs.ipcache.remove(&prefix)
        {
            undo.push(Undo::ResyncIpc(prefix, before));
            if before == identity {
                // present before the restart with this identity: confirmed
                rs.stats.kept += 1;
                return Ok(());
            }
        }
        match self.ipc_insert(&prefix, identity, BPF_NOEXIST) {
            Ok(()) => {
                undo.push(Undo::IpcWritten(prefix));
            }
            Err(e) if exists(&e) => {
                let old = self
                    .ipc_lookup(&prefix)
                    .map_err(|e| ipc_key_error(&prefix, "ipcache lookup", e))?;
                if old == Some(identity) {
                    if let Some(rs) = &mut self.resync {
                        rs.stats.kept += 1;
                    }
                    return Ok(());
                }
                self.ipc_insert(&prefix, identity, 0)
                    .map_err(|e| ipc_key_error(&prefix, "ipcache upsert", e))?;
                undo.push(match old {
                    Some(old) => Undo::IpcReplaced(prefix, old),
                    None => Undo::IpcWritten(prefix),
                });
            }
            Err(e) => return Err(ipc_key_error(&prefix, "ipcache upsert", e)),
        }
        if let Some(rs) = &mut self.resync {
            rs.stats.added += 1;
        }
        Ok(())
    }

    fn ipcache_delete(&mut self, prefix: IpNet, undo: &mut Vec<Undo>) -> Result<(), DatapathError> {
        if let Some(rs) = &mut self.resync
            && let Some(before) = rs.ipcache.remove(&prefix)
        {
            undo.push(Undo::ResyncIpc(prefix, before));
        }
        let old = self
            .ipc_lookup(&prefix)
            .map_err(|e| ipc_key_error(&prefix, "ipcache lookup", e))?;
        let removed = self
            .ipc_remove(&prefix)
            .map_err(|e| ipc_key_error(&prefix, "ipcache delete", e))?;
        // deleted: the exact entry existed, so the lookup above returned its identity
        if let (true, Some(old)) = (removed, old) {
            undo.push(Undo::IpcDeleted(prefix, old));
        }
        Ok(())
    }

    fn apply_one(
        &mut self,
        change: &DatapathChange,
        undo: &mut Vec<Undo>,
    ) -> Result<(), DatapathError> {
        match change {
            DatapathChange::PolicyUpsert { endpoint, key } => {
                self.policy_upsert(*endpoint, key, undo)
            }
            DatapathChange::PolicyDelete { endpoint, key } => {
                self.policy_delete(*endpoint, key, undo)
            }
            DatapathChange::IpcacheUpsert { prefix, identity } => {
                self.ipcache_upsert(prefix.trunc(), *identity, undo)
            }
            DatapathChange::IpcacheDelete { prefix } => self.ipcache_delete(prefix.trunc(), undo),
        }
    }

    /// Undoes a batch's writes, newest first. Every step is tried; the first failure is
    /// returned (the maps then hold part of the batch until the next resync).
    fn rollback(&mut self, undo: Vec<Undo>) -> Result<(), DatapathError> {
        let mut first = None;
        for u in undo.into_iter().rev() {
            let r = match u {
                Undo::Policy { key, before } => {
                    let now = self.refs.get(&key).copied().and_then(Refs::flags);
                    match before {
                        Some(refs) => self.refs.insert(key, refs),
                        None => self.refs.remove(&key),
                    };
                    self.policy_set(&key, now, before.and_then(Refs::flags))
                }
                Undo::ResyncPolicy(k, old) => {
                    let now = self.refs.remove(&k).and_then(Refs::flags);
                    if let Some(rs) = &mut self.resync {
                        rs.policy.insert(k);
                    }
                    self.policy_set(&k, now, Some(old))
                }
                Undo::IpcWritten(prefix) => self
                    .ipc_remove(&prefix)
                    .map(|_| ())
                    .map_err(|e| ipc_key_error(&prefix, "ipcache delete (rollback)", e)),
                Undo::IpcReplaced(prefix, old) | Undo::IpcDeleted(prefix, old) => self
                    .ipc_insert(&prefix, old, 0)
                    .map_err(|e| ipc_key_error(&prefix, "ipcache upsert (rollback)", e)),
                Undo::ResyncIpc(prefix, before) => {
                    if let Some(rs) = &mut self.resync {
                        rs.ipcache.insert(prefix, before);
                    }
                    Ok(())
                }
            };
            if let Err(e) = r
                && first.is_none()
            {
                first = Some(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Datapath for KernelDatapath {
    /// Whole or not at all: every kernel write is logged with how to undo it (a policy
    /// entry's count, an ipcache prefix's previous identity — read only when the prefix
    /// existed), and when a write fails the ones before it are undone, newest first, before
    /// the error (which names the change and says so) is returned. Deleting what is not
    /// there is not an error.
    fn apply(&mut self, changes: &[DatapathChange]) -> Result<(), DatapathError> {
        let stats = self.resync.as_ref().map(|r| r.stats);
        let mut undo = Vec::new();
        for (i, change) in changes.iter().enumerate() {
            if let Err(e) = self.apply_one(change, &mut undo) {
                let undone = undo.len();
                if let Err(r) = self.rollback(undo) {
                    return Err(DatapathError::Io {
                        operation: "rolling back a refused batch",
                        source: std::io::Error::other(format!(
                            "change {} of {} failed ({e}) and undoing the writes before it \
                             failed too ({r}): the maps hold part of the batch until the next \
                             restart's resync",
                            i + 1,
                            changes.len()
                        )),
                    });
                }
                if let (Some(rs), Some(stats)) = (&mut self.resync, stats) {
                    rs.stats = stats;
                }
                return Err(refused(e, i, changes.len(), undone));
            }
        }
        Ok(())
    }
}

/// Where a host process's redirected DNS message was going, as the cgroup socket programs
/// recorded it ([`DnsOrigins::lookup`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DnsOrigin {
    /// The destination the process asked for (an IPv6 socket's v4-mapped address as IPv4).
    pub server: SocketAddr,
    /// The endpoint of the process's cgroup.
    pub endpoint: EndpointId,
}

/// The proxy's handle on `fqdnd_dns_origins`: which socket a query from a local address came
/// from, where it was going, for which endpoint. Read on the DNS path: one map lookup, no
/// lock.
pub struct DnsOrigins {
    map: HashMap<MapData, OriginKey, SockOrigin>,
}

impl std::fmt::Debug for DnsOrigins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsOrigins").finish_non_exhaustive()
    }
}

impl DnsOrigins {
    /// Opens `fqdnd_dns_origins` pinned in `pin_dir`.
    pub fn open(pin_dir: &Path) -> Result<Self, Error> {
        Ok(DnsOrigins {
            map: open_map(pin_dir, "fqdnd_dns_origins")?.try_into()?,
        })
    }

    /// The record of the socket that sent the proxy a packet from `client` (its source
    /// address and port) over TCP or UDP, if a redirect wrote one.
    pub fn lookup(&self, client: SocketAddr, tcp: bool) -> Option<DnsOrigin> {
        let mut k = OriginKey {
            port: client.port().to_be(),
            proto: if tcp { sys::PROTO_TCP } else { sys::PROTO_UDP },
            ..OriginKey::default()
        };
        match client.ip() {
            IpAddr::V4(a) => {
                k.family = 4;
                k.addr[..4].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                k.family = 6;
                k.addr = a.octets();
            }
        }
        let o = self.map.get(&k, 0).ok()?;
        let ip = match o.family {
            4 => IpAddr::V4(Ipv4Addr::new(o.addr[0], o.addr[1], o.addr[2], o.addr[3])),
            6 => {
                let v6 = Ipv6Addr::from(o.addr);
                v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
            }
            _ => return None,
        };
        Some(DnsOrigin {
            server: SocketAddr::new(ip, u16::from_be(o.port)),
            endpoint: EndpointId(o.endpoint),
        })
    }
}

/// The drop-event ring buffer, opened from its pin.
pub struct Events {
    ring: RingBuf<MapData>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// Opens `fqdnd_events` pinned in `pin_dir`.
    pub fn open(pin_dir: &Path) -> Result<Self, Error> {
        Ok(Events {
            ring: open_map(pin_dir, "fqdnd_events")?.try_into()?,
        })
    }

    /// Takes every event waiting in the ring (non-blocking).
    pub fn drain(&mut self) -> Vec<DropEvent> {
        let mut out = Vec::new();
        while let Some(item) = self.ring.next() {
            out.extend(DropEvent::from_bytes(&item));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Whether prefix (base, bits) holds `port`.
    fn holds((base, bits): (u16, u8), port: u16) -> bool {
        bits == 0 || (port ^ base) >> (16 - bits) == 0
    }

    /// The prefixes tile `lo..=hi` exactly: each aligned, in order, each starting where the
    /// previous one ended, the first at `lo`, the last ending at `hi`.
    fn assert_tiles(lo: u16, hi: u16) -> Vec<(u16, u8)> {
        let p = port_prefixes(lo, hi);
        let mut next = u32::from(lo);
        for &(base, bits) in &p {
            let size = 1u32 << (16 - u32::from(bits));
            assert_eq!(u32::from(base), next, "{lo}-{hi}: {p:?}");
            assert_eq!(
                u32::from(base) % size,
                0,
                "{lo}-{hi}: unaligned {base}/{bits}"
            );
            next += size;
        }
        assert_eq!(next, u32::from(hi) + 1, "{lo}-{hi}: {p:?}");
        assert!(p.len() <= 30, "{lo}-{hi}: {} prefixes", p.len());
        p
    }

    #[test]
    fn well_known_ranges() {
        assert_eq!(port_prefixes(0, 65535), vec![(0, 0)]);
        assert_eq!(port_prefixes(443, 443), vec![(443, 16)]);
        assert_eq!(
            port_prefixes(1024, 65535),
            vec![
                (1024, 6),
                (2048, 5),
                (4096, 4),
                (8192, 3),
                (16384, 2),
                (32768, 1)
            ]
        );
        assert_eq!(assert_tiles(1, 65535).len(), 16);
        assert_eq!(assert_tiles(1, 65534).len(), 30);
        assert_eq!(port_prefixes(80, 82), vec![(80, 15), (82, 16)]);
    }

    #[test]
    fn every_small_range_tiles_exactly() {
        for lo in 0..=200u16 {
            for hi in lo..=200 {
                let p = assert_tiles(lo, hi);
                for port in lo.saturating_sub(2)..=hi + 2 {
                    let n = p.iter().filter(|&&q| holds(q, port)).count();
                    assert_eq!(
                        n,
                        usize::from((lo..=hi).contains(&port)),
                        "{lo}-{hi} port {port}"
                    );
                }
            }
        }
    }

    proptest! {
        /// Every port of a range is held by exactly one prefix, no port outside by any.
        #[test]
        fn prefixes_hold_exactly_the_range(a in any::<u16>(), b in any::<u16>(), probe in any::<u16>()) {
            let (lo, hi) = (a.min(b), a.max(b));
            let p = assert_tiles(lo, hi);
            for port in [lo, hi, lo.wrapping_sub(1), hi.wrapping_add(1), probe] {
                let n = p.iter().filter(|&&q| holds(q, port)).count();
                prop_assert_eq!(n, usize::from((lo..=hi).contains(&port)), "{}-{} port {}", lo, hi, port);
            }
        }

        /// The kernel keys of a policy key: its protocols, each with the range's prefixes.
        #[test]
        fn expansion_follows_the_prefixes(a in 1u16.., b in 1u16.., proto in 0u8..3) {
            let (lo, hi) = (a.min(b), a.max(b));
            let protocol = [Protocol::Tcp, Protocol::Udp, Protocol::Any][usize::from(proto)];
            let key = fqdnd_ipcache::PolicyKey { identity: Identity(9), protocol, port: lo, end_port: hi, ..Default::default() };
            let keys = expand(EndpointId(3), &key);
            let n = port_prefixes(lo, hi).len();
            prop_assert_eq!(keys.len(), if protocol == Protocol::Any { 2 * n } else { n });
            for k in &keys {
                prop_assert_eq!((k.identity, k.endpoint), (9, 3));
                let (first, last) = k.ports();
                prop_assert!(lo <= first && last <= hi);
                prop_assert!(matches!(k.protocol(), Some(sys::PROTO_TCP | sys::PROTO_UDP)));
            }
        }
    }

    #[test]
    fn rules_without_ports_match_every_protocol() {
        let any = expand(EndpointId(1), &fqdnd_ipcache::PolicyKey::ALLOW_ALL);
        assert_eq!(any.len(), 1);
        assert_eq!((any[0].protocol(), any[0].ports()), (None, (0, 65535)));
        let tcp = expand(
            EndpointId(1),
            &fqdnd_ipcache::PolicyKey {
                identity: Identity(5),
                protocol: Protocol::Tcp,
                port: 0,
                end_port: 0,
                ..Default::default()
            },
        );
        assert_eq!(
            (tcp.len(), tcp[0].protocol(), tcp[0].ports()),
            (1, Some(sys::PROTO_TCP), (0, 65535))
        );
    }
}
