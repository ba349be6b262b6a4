//! The boundary to the datapath: ordered batches of ipcache and policy-map changes.
//!
//! The eBPF datapath and the in-memory one ([`MemoryDatapath`], for replay and tests) both
//! implement [`Datapath`]; ipcache knows neither. A batch is ordered as Cilium orders it:
//! new policy entries first, then ipcache entries flip, then stale policy entries go, so no
//! packet meets an identity its endpoint's policy has not learned yet.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use prefix_trie::joint::map::JointPrefixMap;

use crate::endpoint::EndpointId;
use crate::error::DatapathError;
use crate::identity::Identity;
use crate::metadata::host_prefix;
use crate::policy::{Direction, Protocol};

/// One entry of an endpoint's policy map, in one direction.
///
/// `identity` [`Identity::ANY`] matches every peer (destination for egress, source for
/// ingress); `protocol` [`Protocol::Any`] with `port == 0` matches every protocol and port,
/// with a port range TCP and UDP on those ports; TCP or UDP with `port == 0` every port of
/// that protocol, else `port..=end_port`; ICMP/ICMPv6 exactly the type in `port`.
///
/// A `deny` entry drops what it matches. The datapath looks the peer's identity up first and
/// [`Identity::ANY`] only when no entry of the identity matches; within one identity the most
/// specific entry decides. The IpCache writes, for every allow that a deny overlaps, a deny
/// entry for the overlap under the allow's identity, so that a deny always wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyKey {
    /// Peer identity.
    pub identity: Identity,
    /// L4 protocol.
    pub protocol: Protocol,
    /// First port, 0 for all (ICMP: the type).
    pub port: u16,
    /// Last port.
    pub end_port: u16,
    /// The direction this entry applies to.
    pub direction: Direction,
    /// Whether the entry denies.
    pub deny: bool,
}

impl Default for PolicyKey {
    fn default() -> Self {
        Self::ALLOW_ALL
    }
}

impl PolicyKey {
    /// The key that allows everything (egress).
    pub const ALLOW_ALL: PolicyKey = PolicyKey {
        identity: Identity::ANY,
        protocol: Protocol::Any,
        port: 0,
        end_port: 0,
        direction: Direction::Egress,
        deny: false,
    };

    /// The key that allows everything in `direction`.
    pub fn allow_all(direction: Direction) -> Self {
        Self {
            direction,
            ..Self::ALLOW_ALL
        }
    }

    /// Whether this entry matches a packet of `identity` on `protocol` (never
    /// [`Protocol::Any`]: a packet has one) and `port` (ICMP: its type), whatever its verdict
    /// and direction.
    pub fn matches(&self, identity: Identity, protocol: Protocol, port: u16) -> bool {
        (self.identity == Identity::ANY || self.identity == identity)
            && self.matches_port(protocol, port)
    }

    /// Whether the protocol and port part matches.
    pub fn matches_port(&self, protocol: Protocol, port: u16) -> bool {
        match self.protocol {
            Protocol::Any if self.port == 0 => true,
            Protocol::Any => {
                matches!(protocol, Protocol::Tcp | Protocol::Udp)
                    && (self.port..=self.end_port).contains(&port)
            }
            Protocol::Icmp | Protocol::Icmpv6 => self.protocol == protocol && self.port == port,
            p => p == protocol && (self.port == 0 || (self.port..=self.end_port).contains(&port)),
        }
    }

    /// Whether this entry allows a packet to `identity` on `protocol`/`port` (an allow entry
    /// that matches).
    pub fn allows(&self, identity: Identity, protocol: Protocol, port: u16) -> bool {
        !self.deny && self.matches(identity, protocol, port)
    }

    /// How specific the protocol and port part is: the datapath's longest prefix. Every
    /// protocol < one protocol with every port < a port range (smaller is more specific).
    pub fn specificity(&self) -> u32 {
        match self.protocol {
            Protocol::Any if self.port == 0 => 0,
            Protocol::Icmp | Protocol::Icmpv6 => 1 << 17,
            _ if self.port == 0 => 1,
            _ => 2 + 65_536 - u32::from(self.end_port.max(self.port) - self.port),
        }
    }

    /// The overlap of two entries' protocol and port parts (identity, direction and verdict
    /// from `self`), if any.
    pub fn intersect(&self, other: &PolicyKey) -> Option<PolicyKey> {
        let every = |k: &PolicyKey| k.protocol == Protocol::Any && k.port == 0;
        if every(other) {
            return Some(*self);
        }
        if every(self) {
            return Some(PolicyKey {
                protocol: other.protocol,
                port: other.port,
                end_port: other.end_port,
                ..*self
            });
        }
        let protocol = match (self.protocol, other.protocol) {
            (a, b) if a == b => a,
            (Protocol::Any, p @ (Protocol::Tcp | Protocol::Udp))
            | (p @ (Protocol::Tcp | Protocol::Udp), Protocol::Any) => p,
            _ => return None,
        };
        let range = |k: &PolicyKey| {
            if k.port == 0 && !k.protocol.is_icmp() {
                (0u16, u16::MAX)
            } else {
                (k.port, k.end_port.max(k.port))
            }
        };
        let (a_lo, a_hi) = range(self);
        let (b_lo, b_hi) = range(other);
        let (lo, hi) = (a_lo.max(b_lo), a_hi.min(b_hi));
        if lo > hi {
            return None;
        }
        let (port, end_port) = if (lo, hi) == (0, u16::MAX) && !protocol.is_icmp() {
            (0, 0)
        } else {
            (lo, hi)
        };
        Some(PolicyKey {
            protocol,
            port,
            end_port,
            ..*self
        })
    }
}

/// The datapath's verdict on a packet, given an endpoint's entries of one direction: the
/// entries of the peer's identity first, of any identity only when none of those matches;
/// among the matching entries of one level the most specific decides, a deny on a tie.
/// `None`: nothing matches (dropped under default deny).
pub fn verdict<'a>(
    keys: impl Iterator<Item = &'a PolicyKey> + Clone,
    direction: Direction,
    identity: Identity,
    protocol: Protocol,
    port: u16,
) -> Option<&'a PolicyKey> {
    let level = |id: Identity| {
        keys.clone()
            .filter(|k| k.direction == direction && k.identity == id)
            .filter(|k| k.matches_port(protocol, port))
            .max_by_key(|k| (k.specificity(), k.deny))
    };
    (identity != Identity::ANY)
        .then(|| level(identity))
        .flatten()
        .or_else(|| level(Identity::ANY))
}

/// One change in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatapathChange {
    /// Add an entry to an endpoint's policy map.
    PolicyUpsert {
        /// The endpoint.
        endpoint: EndpointId,
        /// The entry.
        key: PolicyKey,
    },
    /// Map a prefix to an identity.
    IpcacheUpsert {
        /// The prefix.
        prefix: IpNet,
        /// Its identity.
        identity: Identity,
    },
    /// Forget a prefix.
    IpcacheDelete {
        /// The prefix.
        prefix: IpNet,
    },
    /// Remove an entry from an endpoint's policy map.
    PolicyDelete {
        /// The endpoint.
        endpoint: EndpointId,
        /// The entry.
        key: PolicyKey,
    },
}

/// Where ipcache's decisions land.
pub trait Datapath {
    /// Applies an ordered batch, whole or not at all: on error the datapath holds what it held
    /// before the batch (the IpCache keeps the batch pending and sends it again with the next
    /// one). Deleting an entry that is not there is not an error.
    fn apply(&mut self, changes: &[DatapathChange]) -> Result<(), DatapathError>;
}

/// A datapath held in memory: an LPM ipcache and per-endpoint policy sets, with the same
/// lookup semantics as the kernel programs. Used by replay and tests.
///
/// Host prefixes (/32, /128: every address DNS taught) are kept in a hash map apart from the
/// LPM trie of the others: an exact address is the longest match there can be, and a
/// million of them go in without a trie walk each.
#[derive(Debug, Default)]
pub struct MemoryDatapath {
    hosts4: hashbrown::HashMap<u32, Identity>,
    hosts6: hashbrown::HashMap<u128, Identity>,
    ipcache: JointPrefixMap<IpNet, Identity>,
    policy: BTreeMap<EndpointId, BTreeSet<PolicyKey>>,
    batches: u64,
}

impl MemoryDatapath {
    /// The identity the datapath gives a destination address (world when unknown).
    pub fn identity_of(&self, addr: IpAddr) -> Identity {
        let host = match addr {
            IpAddr::V4(a) => self.hosts4.get(&a.to_bits()),
            IpAddr::V6(a) => self.hosts6.get(&a.to_bits()),
        };
        if let Some(id) = host {
            return *id;
        }
        let host = IpNet::from(addr);
        self.ipcache
            .get_lpm(&host)
            .map_or(Identity::world(addr.is_ipv4()), |(_, id)| *id)
    }

    /// Whether `endpoint` may send to `addr` on `protocol`/`port` (default deny).
    pub fn allows(
        &self,
        endpoint: EndpointId,
        addr: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> bool {
        self.allows_dir(endpoint, Direction::Egress, addr, protocol, port)
    }

    /// Whether the datapath passes a new flow of `endpoint` in `direction` with the peer
    /// `addr` (destination for egress, source for ingress), as the kernel programs decide
    /// (see [`verdict`]). An endpoint without entries in a direction is not under policy
    /// there only if it has an allow-all entry: the IpCache writes one for every endpoint
    /// not in default deny.
    pub fn allows_dir(
        &self,
        endpoint: EndpointId,
        direction: Direction,
        addr: IpAddr,
        protocol: Protocol,
        port: u16,
    ) -> bool {
        let identity = self.identity_of(addr);
        self.policy.get(&endpoint).is_some_and(|keys| {
            verdict(keys.iter(), direction, identity, protocol, port).is_some_and(|k| !k.deny)
        })
    }

    /// The ipcache entries, ordered by prefix.
    pub fn ipcache(&self) -> BTreeMap<IpNet, Identity> {
        let v4 = self
            .hosts4
            .iter()
            .map(|(a, id)| (host_prefix(Ipv4Addr::from_bits(*a).into()), *id));
        let v6 = self
            .hosts6
            .iter()
            .map(|(a, id)| (host_prefix(Ipv6Addr::from_bits(*a).into()), *id));
        let others = self.ipcache.iter().map(|(p, id)| (p, *id));
        others.chain(v4).chain(v6).collect()
    }

    /// An endpoint's policy entries.
    pub fn policy(&self, endpoint: EndpointId) -> Option<&BTreeSet<PolicyKey>> {
        self.policy.get(&endpoint)
    }

    /// Batches applied so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }
}

impl Datapath for MemoryDatapath {
    fn apply(&mut self, changes: &[DatapathChange]) -> Result<(), DatapathError> {
        self.batches += 1;
        // A batch larger than the host tables (a restore's commit) grows them once, not by
        // doubling; smaller ones (a commit per answer) are mostly updates and are not counted.
        if changes.len() > self.hosts4.len() + self.hosts6.len() {
            let (mut up4, mut up6) = (0usize, 0usize);
            for change in changes {
                if let DatapathChange::IpcacheUpsert { prefix, .. } = change {
                    match host(prefix) {
                        Some(IpAddr::V4(_)) => up4 += 1,
                        Some(IpAddr::V6(_)) => up6 += 1,
                        None => {}
                    }
                }
            }
            self.hosts4.reserve(up4.saturating_sub(self.hosts4.len()));
            self.hosts6.reserve(up6.saturating_sub(self.hosts6.len()));
        }
        for change in changes {
            match change {
                DatapathChange::PolicyUpsert { endpoint, key } => {
                    self.policy.entry(*endpoint).or_default().insert(*key);
                }
                DatapathChange::IpcacheUpsert { prefix, identity } => match host(prefix) {
                    Some(IpAddr::V4(a)) => {
                        self.hosts4.insert(a.to_bits(), *identity);
                    }
                    Some(IpAddr::V6(a)) => {
                        self.hosts6.insert(a.to_bits(), *identity);
                    }
                    None => {
                        self.ipcache.insert(*prefix, *identity);
                    }
                },
                DatapathChange::IpcacheDelete { prefix } => match host(prefix) {
                    Some(IpAddr::V4(a)) => {
                        self.hosts4.remove(&a.to_bits());
                    }
                    Some(IpAddr::V6(a)) => {
                        self.hosts6.remove(&a.to_bits());
                    }
                    None => {
                        self.ipcache.remove(prefix);
                    }
                },
                DatapathChange::PolicyDelete { endpoint, key } => {
                    if let Some(keys) = self.policy.get_mut(endpoint) {
                        keys.remove(key);
                        if keys.is_empty() {
                            self.policy.remove(endpoint);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// The address of a host prefix (/32, /128).
fn host(prefix: &IpNet) -> Option<IpAddr> {
    (prefix.prefix_len() == prefix.max_prefix_len()).then(|| prefix.addr())
}

/// A datapath that only counts what it is given: for measuring the engine's own memory.
#[derive(Debug, Default)]
pub struct CountingDatapath {
    /// Changes seen, of every kind.
    pub changes: u64,
}

impl Datapath for CountingDatapath {
    fn apply(&mut self, changes: &[DatapathChange]) -> Result<(), DatapathError> {
        self.changes += changes.len() as u64;
        Ok(())
    }
}
