//! The boundary to the datapath: ordered batches of ipcache and policy-map changes.
//!
//! The eBPF datapath and the in-memory one ([`MemoryDatapath`], for replay and tests) both
//! implement [`Datapath`]; ipcache knows neither. A batch is ordered as Cilium orders it:
//! new policy entries first, then ipcache entries flip, then stale policy entries go, so no
//! packet meets an identity its endpoint's policy has not learned yet.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use prefix_trie::joint::map::JointPrefixMap;

use crate::endpoint::EndpointId;
use crate::error::DatapathError;
use crate::identity::Identity;
use crate::policy::Protocol;

/// One entry of an endpoint's egress policy map.
///
/// `identity` [`Identity::ANY`] matches every destination; `port == 0` matches every port,
/// else `port..=end_port`; `protocol` [`Protocol::Any`] matches TCP and UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyKey {
    /// Destination identity.
    pub identity: Identity,
    /// L4 protocol.
    pub protocol: Protocol,
    /// First port, 0 for all.
    pub port: u16,
    /// Last port.
    pub end_port: u16,
}

impl PolicyKey {
    /// The key that allows everything.
    pub const ALLOW_ALL: PolicyKey = PolicyKey {
        identity: Identity::ANY,
        protocol: Protocol::Any,
        port: 0,
        end_port: 0,
    };

    /// Whether this entry allows a packet to `identity` on `protocol`/`port`.
    pub fn allows(&self, identity: Identity, protocol: Protocol, port: u16) -> bool {
        (self.identity == Identity::ANY || self.identity == identity)
            && (self.protocol == Protocol::Any || self.protocol == protocol)
            && (self.port == 0 || (self.port..=self.end_port).contains(&port))
    }
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
#[derive(Debug, Default)]
pub struct MemoryDatapath {
    ipcache: JointPrefixMap<IpNet, Identity>,
    policy: BTreeMap<EndpointId, BTreeSet<PolicyKey>>,
    batches: u64,
}

impl MemoryDatapath {
    /// The identity the datapath gives a destination address (world when unknown).
    pub fn identity_of(&self, addr: IpAddr) -> Identity {
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
        let identity = self.identity_of(addr);
        self.policy
            .get(&endpoint)
            .is_some_and(|keys| keys.iter().any(|k| k.allows(identity, protocol, port)))
    }

    /// The ipcache entries, ordered by prefix.
    pub fn ipcache(&self) -> BTreeMap<IpNet, Identity> {
        self.ipcache.iter().map(|(p, id)| (p, *id)).collect()
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
        for change in changes {
            match change {
                DatapathChange::PolicyUpsert { endpoint, key } => {
                    self.policy.entry(*endpoint).or_default().insert(*key);
                }
                DatapathChange::IpcacheUpsert { prefix, identity } => {
                    self.ipcache.insert(*prefix, *identity);
                }
                DatapathChange::IpcacheDelete { prefix } => {
                    self.ipcache.remove(prefix);
                }
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
