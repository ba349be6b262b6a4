//! [`KernelDatapath`]: ipcache and policy batches written into the pinned maps.

use std::collections::{HashMap as StdHashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
use std::path::Path;
use std::time::Duration;

use aya::maps::lpm_trie::Key;
use aya::maps::{Array, HashMap, LpmTrie, Map, MapData, MapError, RingBuf};
use fqdnd_ipcache::policy::Protocol;
use fqdnd_ipcache::{Datapath, DatapathChange, DatapathError, EndpointId, Identity};
use ipnet::IpNet;

use crate::error::Error;
use crate::sys::{
    self, CtKey, CtValue, DnsProxy, DropEvent, EndpointValue, IpcacheValue, PolicyKey, PolicyValue,
};

/// The widest port range one policy key may cover: ranges are expanded into one map entry per
/// port (the policy map is a hash, not Cilium's LPM over ports). Wider ranges are refused.
pub const MAX_PORT_RANGE: u32 = 1024;

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
        b
    }

    fn from_bits(b: u8) -> Self {
        EndpointFlags {
            enforce_egress: b & sys::EP_ENFORCE_EGRESS != 0,
            redirect_dns: b & sys::EP_REDIRECT_DNS != 0,
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
    /// IP protocol (6 TCP, 17 UDP).
    pub proto: u8,
    /// `sys::CT_*` flags: [`sys::CT_EGRESS`] (opened by the endpoint) or [`sys::CT_INGRESS`].
    pub flags: u32,
    /// Creation, `CLOCK_MONOTONIC` nanoseconds (`bpf_ktime_get_ns`).
    pub created_ns: u64,
    /// Last packet, `CLOCK_MONOTONIC` nanoseconds.
    pub last_seen_ns: u64,
    /// Rev-NAT index of the service of a load-balanced flow, 0 = none.
    pub rev_nat: u16,
    /// The backend a client → VIP flow is translated to, 0 = none.
    pub backend: u16,
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
            rev_nat: v.rev_nat,
            backend: v.backend,
        })
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
fn monotonic_ns() -> Result<u64, Error> {
    let t =
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_err(|e| Error::Io {
            what: "clock_gettime(CLOCK_MONOTONIC)".to_owned(),
            source: e.into(),
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
    policy: HashMap<MapData, PolicyKey, PolicyValue>,
    ct: HashMap<MapData, CtKey, CtValue>,
    dns_proxy: Array<MapData, DnsProxy>,
    refs: StdHashMap<PolicyKey, u32>,
    resync: Option<Resync>,
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
        source: std::io::Error::other(e.to_string()),
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

fn proto(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => sys::PROTO_TCP,
        Protocol::Udp => sys::PROTO_UDP,
        Protocol::Any => sys::PROTO_ANY,
    }
}

/// Whether the kernel can hold `key`'s port range (one entry per port, at most
/// [`MAX_PORT_RANGE`]).
fn check_range(key: &fqdnd_ipcache::PolicyKey) -> Result<(), DatapathError> {
    let end = key.end_port.max(key.port);
    if key.port != 0 && u32::from(end - key.port) + 1 > MAX_PORT_RANGE {
        return Err(DatapathError::Io {
            operation: "expanding a policy port range",
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("ports {}-{end} exceed {MAX_PORT_RANGE} entries", key.port),
            ),
        });
    }
    Ok(())
}

/// The kernel entries one policy key stands for.
fn expand(
    endpoint: EndpointId,
    key: &fqdnd_ipcache::PolicyKey,
) -> Result<Vec<PolicyKey>, DatapathError> {
    let base = PolicyKey {
        identity: key.identity.0,
        endpoint: endpoint.0,
        dport: 0,
        proto: proto(key.protocol),
        pad: [0; 3],
    };
    if key.port == 0 {
        return Ok(vec![base]);
    }
    check_range(key)?;
    let end = key.end_port.max(key.port);
    Ok((key.port..=end)
        .map(|dport| PolicyKey { dport, ..base })
        .collect())
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
            out.push(if v.flags & sys::EP_BY_SOURCE != 0 {
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
            EndpointEntry::Endpoint { ifindex, .. } | EndpointEntry::BySource { ifindex, .. } => {
                *ifindex
            }
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

    /// Destination addresses of the flows endpoints opened (`CT_EGRESS`) with a packet within
    /// `idle` of now: the "connections still use this IP" input of the name manager's GC.
    pub fn live_destinations(&self, idle: Duration) -> Result<HashSet<IpAddr>, Error> {
        let now = monotonic_ns()?;
        let idle = u64::try_from(idle.as_nanos()).unwrap_or(u64::MAX);
        Ok(self
            .ct_entries()?
            .into_iter()
            .filter(|e| e.flags & sys::CT_EGRESS != 0)
            .filter(|e| now.saturating_sub(e.last_seen_ns) <= idle)
            .map(|e| e.dst)
            .collect())
    }

    /// Deletes conntrack entries with no packet for longer than `idle`; returns how many.
    /// (The map is also LRU: when full, the kernel evicts the least recently used.) A flow
    /// whose entry goes passes policy again on its next packet.
    pub fn gc_conntrack(&mut self, idle: Duration) -> Result<usize, Error> {
        let now = monotonic_ns()?;
        let idle = u64::try_from(idle.as_nanos()).unwrap_or(u64::MAX);
        let mut stale = Vec::new();
        for r in self.ct.iter() {
            match r {
                Ok((k, v)) if now.saturating_sub(v.last_seen_ns) > idle => stale.push(k),
                Ok(_) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut n = 0;
        for k in &stale {
            match self.ct.remove(k) {
                Ok(()) => n += 1,
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(n)
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
            ignore_absent(self.policy.remove(k))?;
            stats.removed += 1;
        }
        Ok(stats)
    }

    /// Forgets an interface: its packets pass untouched.
    pub fn remove_endpoint(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        ignore_absent(self.endpoints.remove(&ifindex))
            .map_err(|e| map_err("fqdnd_endpoints", "endpoint delete", e))
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
            out.push(k);
        }
        out.sort();
        Ok(out)
    }

    fn policy_upsert(
        &mut self,
        endpoint: EndpointId,
        key: &fqdnd_ipcache::PolicyKey,
    ) -> Result<(), DatapathError> {
        for k in expand(endpoint, key)? {
            if let Some(n) = self.refs.get_mut(&k) {
                *n += 1;
                continue;
            }
            if let Some(rs) = &mut self.resync
                && rs.policy.remove(&k)
            {
                // present before the restart (the value is always ALLOW): confirmed
                rs.stats.kept += 1;
                self.refs.insert(k, 1);
                continue;
            }
            let v = PolicyValue {
                flags: sys::POLICY_ALLOW,
            };
            self.policy
                .insert(k, v, 0)
                .map_err(|e| map_err("fqdnd_policy", "policy upsert", e))?;
            if let Some(rs) = &mut self.resync {
                rs.stats.added += 1;
            }
            self.refs.insert(k, 1);
        }
        Ok(())
    }

    fn policy_delete(
        &mut self,
        endpoint: EndpointId,
        key: &fqdnd_ipcache::PolicyKey,
    ) -> Result<(), DatapathError> {
        for k in expand(endpoint, key)? {
            let Some(n) = self.refs.get_mut(&k) else {
                continue;
            };
            *n -= 1;
            if *n == 0 {
                self.refs.remove(&k);
                match self.policy.remove(&k) {
                    Ok(()) => {}
                    Err(e) if not_found(&e) => {}
                    Err(e) => return Err(map_err("fqdnd_policy", "policy delete", e)),
                }
            }
        }
        Ok(())
    }
}

impl Datapath for KernelDatapath {
    fn apply(&mut self, changes: &[DatapathChange]) -> Result<(), DatapathError> {
        // What can be refused without the kernel is refused before anything is written, so a
        // refused batch leaves the maps as they were.
        for change in changes {
            if let DatapathChange::PolicyUpsert { key, .. }
            | DatapathChange::PolicyDelete { key, .. } = change
            {
                check_range(key)?;
            }
        }
        for change in changes {
            match change {
                DatapathChange::PolicyUpsert { endpoint, key } => {
                    self.policy_upsert(*endpoint, key)?
                }
                DatapathChange::PolicyDelete { endpoint, key } => {
                    self.policy_delete(*endpoint, key)?
                }
                DatapathChange::IpcacheUpsert { prefix, identity } => {
                    let prefix = prefix.trunc();
                    if let Some(rs) = &mut self.resync
                        && rs.ipcache.remove(&prefix) == Some(*identity)
                    {
                        // present before the restart with this identity: confirmed
                        rs.stats.kept += 1;
                        continue;
                    }
                    let v = IpcacheValue {
                        identity: identity.0,
                    };
                    match prefix {
                        IpNet::V4(n) => self
                            .ipc4
                            .insert(&lpm_key4(&n), v, 0)
                            .map_err(|e| map_err("fqdnd_ipc4", "ipcache upsert", e))?,
                        IpNet::V6(n) => self
                            .ipc6
                            .insert(&lpm_key6(&n), v, 0)
                            .map_err(|e| map_err("fqdnd_ipc6", "ipcache upsert", e))?,
                    }
                    if let Some(rs) = &mut self.resync {
                        rs.stats.added += 1;
                    }
                }
                DatapathChange::IpcacheDelete { prefix } => {
                    let prefix = prefix.trunc();
                    if let Some(rs) = &mut self.resync {
                        rs.ipcache.remove(&prefix);
                    }
                    let r = match prefix {
                        IpNet::V4(n) => self.ipc4.remove(&lpm_key4(&n)),
                        IpNet::V6(n) => self.ipc6.remove(&lpm_key6(&n)),
                    };
                    ignore_absent(r).map_err(|e| map_err("ipcache", "ipcache delete", e))?;
                }
            }
        }
        Ok(())
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
