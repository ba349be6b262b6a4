//! Prefix metadata: for each prefix, which resource owners claim it with which labels.
//!
//! Prefixes live in an ordered map, so the prefixes inside a CIDR are one range scan away;
//! prefixes that carry their own `cidr:` label are also kept in an LPM trie, which answers
//! "the closest enclosing CIDR label" for label down-propagation.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use prefix_trie::joint::map::JointPrefixMap;
use smallvec::SmallVec;

use crate::identity::Identity;
use crate::labels::{LabelId, LabelSet};

/// Who writes a piece of metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OwnerKind {
    /// The NameManager, one owner per DNS name (`fqdn-name-manager/<name>`).
    NameManager,
    /// Policy: the CIDRs that selectors reference (`policy/<cidr>`).
    Policy,
    /// An endpoint or client group (`endpoint/<name>`).
    Endpoint,
    /// Cluster mode: an endpoint of another node (`remote-endpoint/<key>`).
    RemoteEndpoint,
    /// The node itself: its own addresses (`host/<address>`).
    Host,
}

/// A resource owner: a kind and a name. Each owner's labels on a prefix are kept apart and
/// the prefix's labels are their union, so owners never overwrite each other.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceOwner {
    /// The kind of owner.
    pub kind: OwnerKind,
    /// Its name within the kind (the DNS name for the NameManager).
    pub name: Arc<str>,
}

impl ResourceOwner {
    /// The NameManager's owner for one DNS name.
    pub fn name_manager(name: Arc<str>) -> Self {
        Self {
            kind: OwnerKind::NameManager,
            name,
        }
    }
}

impl fmt::Display for ResourceOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            OwnerKind::NameManager => "fqdn-name-manager",
            OwnerKind::Policy => "policy",
            OwnerKind::Endpoint => "endpoint",
            OwnerKind::RemoteEndpoint => "remote-endpoint",
            OwnerKind::Host => "host",
        };
        write!(f, "{kind}/{}", self.name)
    }
}

/// What is known about one prefix.
#[derive(Debug, Default)]
pub(crate) struct PrefixEntry {
    /// Owners and their labels; both shared (one `Arc` per DNS name serves all its IPs).
    pub(crate) owners: SmallVec<[(Arc<ResourceOwner>, Arc<LabelSet>); 1]>,
    pub(crate) identity: Option<Identity>,
}

impl PrefixEntry {
    /// Where `owner` is (or would go) in the owner list, which is kept sorted so that an IP
    /// shared by hundreds of names (S3 buckets on one region's addresses) is searched, not
    /// scanned.
    fn find(&self, owner: &ResourceOwner) -> Result<usize, usize> {
        self.owners
            .binary_search_by(|(o, _)| (o.kind, &*o.name).cmp(&(owner.kind, &*owner.name)))
    }

    /// Sets `owner`'s labels; returns what the owner had before.
    pub(crate) fn set_owner(
        &mut self,
        owner: &Arc<ResourceOwner>,
        labels: Arc<LabelSet>,
    ) -> Option<Arc<LabelSet>> {
        match self.find(owner) {
            Ok(at) => Some(std::mem::replace(&mut self.owners[at].1, labels)),
            Err(at) => {
                self.owners.insert(at, (owner.clone(), labels));
                None
            }
        }
    }

    /// Drops `owner`'s claim; returns its labels if it had one.
    pub(crate) fn remove_owner(&mut self, owner: &ResourceOwner) -> Option<Arc<LabelSet>> {
        let at = self.find(owner).ok()?;
        Some(self.owners.remove(at).1)
    }
}

/// The metadata store.
#[derive(Debug, Default)]
pub(crate) struct Metadata {
    pub(crate) prefixes: BTreeMap<IpNet, PrefixEntry>,
    pub(crate) cidr_labels: CidrLabels,
}

/// Prefixes that carry their own `cidr:` label, for longest-prefix lookups.
#[derive(Debug, Default)]
pub(crate) struct CidrLabels(JointPrefixMap<IpNet, LabelId>);

impl CidrLabels {
    /// The `cidr:` label of the longest labelled CIDR containing `prefix` (itself included).
    pub(crate) fn longest_match(&self, prefix: &IpNet) -> Option<LabelId> {
        if self.0.is_empty() {
            return None;
        }
        self.0.get_lpm(prefix).map(|(_, id)| *id)
    }
}

impl Metadata {
    pub(crate) fn get(&self, prefix: &IpNet) -> Option<&PrefixEntry> {
        self.prefixes.get(prefix)
    }

    pub(crate) fn len(&self) -> usize {
        self.prefixes.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&IpNet, &PrefixEntry)> + '_ {
        self.prefixes.iter()
    }

    /// Sets `owner`'s labels on `prefix`; returns what the owner had before.
    pub(crate) fn upsert(
        &mut self,
        prefix: IpNet,
        owner: &Arc<ResourceOwner>,
        labels: Arc<LabelSet>,
    ) -> Option<Arc<LabelSet>> {
        self.prefixes
            .entry(prefix)
            .or_default()
            .set_owner(owner, labels)
    }

    /// Drops `owner`'s claim on `prefix`; returns its labels if it had one.
    pub(crate) fn remove(
        &mut self,
        prefix: &IpNet,
        owner: &ResourceOwner,
    ) -> Option<Arc<LabelSet>> {
        self.prefixes.get_mut(prefix)?.remove_owner(owner)
    }

    /// Every known prefix inside `outer`, `outer` included.
    pub(crate) fn descendants(&self, outer: IpNet) -> Vec<IpNet> {
        let (lo, hi) = match outer {
            IpNet::V4(n) => (
                IpNet::V4(Ipv4Net::new_assert(n.network(), 0)),
                IpNet::V4(Ipv4Net::new_assert(n.broadcast(), 32)),
            ),
            IpNet::V6(n) => (
                IpNet::V6(Ipv6Net::new_assert(n.network(), 0)),
                IpNet::V6(Ipv6Net::new_assert(n.broadcast(), 128)),
            ),
        };
        self.prefixes
            .range(lo..=hi)
            .map(|(p, _)| *p)
            .filter(|p| p.prefix_len() >= outer.prefix_len() && outer.contains(p))
            .collect()
    }

    pub(crate) fn set_cidr_label(&mut self, prefix: IpNet, label: LabelId) {
        self.cidr_labels.0.insert(prefix, label);
    }

    pub(crate) fn clear_cidr_label(&mut self, prefix: &IpNet) {
        self.cidr_labels.0.remove(prefix);
    }
}

/// The host prefix (/32 or /128) of an address.
pub fn host_prefix(addr: IpAddr) -> IpNet {
    match addr {
        IpAddr::V4(a) => IpNet::V4(Ipv4Net::from(a)),
        IpAddr::V6(a) => IpNet::V6(Ipv6Net::from(a)),
    }
}
