//! Labels and label sets.
//!
//! Labels are interned in a [`LabelTable`] owned by the IpCache, so a [`LabelSet`] is a short
//! sorted vector of small ids: cheap to build, hash and compare on the per-answer path.

use std::collections::HashMap;
use std::fmt;

use ipnet::IpNet;
use smallvec::SmallVec;

use crate::endpoint::EndpointLabel;

/// Interned label id, valid for the [`LabelTable`] that produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelId(pub(crate) u32);

/// Reserved labels the IpCache adds itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reserved {
    /// Outside the cluster, IPv4 (`reserved:world-ipv4`).
    WorldIpv4,
    /// Outside the cluster, IPv6 (`reserved:world-ipv6`).
    WorldIpv6,
    /// The node's own addresses (`reserved:host`).
    Host,
    /// Cluster mode: the other nodes' own addresses (`reserved:remote-node`).
    RemoteNode,
}

/// A label: what a prefix is known as.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Label {
    /// `reserved:world-ipv4` / `reserved:world-ipv6`.
    Reserved(Reserved),
    /// `cidr:<prefix>`: the prefix lies inside a CIDR that policy selects.
    Cidr(IpNet),
    /// `fqdn:<selector>`: a name matching the selector resolved to this prefix.
    Fqdn(Box<str>),
    /// An endpoint label, `source:key=value`.
    Endpoint(EndpointLabel),
}

impl Label {
    /// The `fqdn:` label of a selector key.
    pub fn fqdn(key: &str) -> Self {
        Self::Fqdn(key.into())
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Reserved(Reserved::WorldIpv4) => f.write_str("reserved:world-ipv4"),
            Self::Reserved(Reserved::WorldIpv6) => f.write_str("reserved:world-ipv6"),
            Self::Reserved(Reserved::Host) => f.write_str("reserved:host"),
            Self::Reserved(Reserved::RemoteNode) => f.write_str("reserved:remote-node"),
            Self::Cidr(net) => write!(f, "cidr:{net}"),
            Self::Fqdn(key) => write!(f, "fqdn:{key}"),
            Self::Endpoint(l) if l.value.is_empty() => write!(f, "{}:{}", l.source, l.key),
            Self::Endpoint(l) => write!(f, "{}:{}={}", l.source, l.key, l.value),
        }
    }
}

/// Interning table. Labels come from policy, selectors and endpoints (bounded by
/// configuration), never from DNS data, so the table is never garbage-collected.
#[derive(Debug)]
pub struct LabelTable {
    labels: Vec<Label>,
    ids: HashMap<Label, LabelId>,
}

impl Default for LabelTable {
    fn default() -> Self {
        let mut table = Self {
            labels: Vec::new(),
            ids: HashMap::new(),
        };
        // Fixed ids for the reserved labels, in this order.
        table.intern(Label::Reserved(Reserved::WorldIpv4));
        table.intern(Label::Reserved(Reserved::WorldIpv6));
        table.intern(Label::Reserved(Reserved::Host));
        table.intern(Label::Reserved(Reserved::RemoteNode));
        table
    }
}

impl LabelTable {
    /// `reserved:world-ipv4`.
    pub const WORLD_IPV4: LabelId = LabelId(0);
    /// `reserved:world-ipv6`.
    pub const WORLD_IPV6: LabelId = LabelId(1);
    /// `reserved:host`.
    pub const HOST: LabelId = LabelId(2);
    /// `reserved:remote-node`.
    pub const REMOTE_NODE: LabelId = LabelId(3);

    /// The id of `label`, interning it if new.
    pub fn intern(&mut self, label: Label) -> LabelId {
        if let Some(id) = self.ids.get(&label) {
            return *id;
        }
        let id = LabelId(u32::try_from(self.labels.len()).unwrap_or(u32::MAX));
        self.labels.push(label.clone());
        self.ids.insert(label, id);
        id
    }

    /// The id of `label` if it was interned.
    pub fn get(&self, label: &Label) -> Option<LabelId> {
        self.ids.get(label).copied()
    }

    /// The label behind `id`.
    pub fn label(&self, id: LabelId) -> Option<&Label> {
        self.labels.get(id.0 as usize)
    }

    /// The world label of an address family.
    pub fn world(is_ipv4: bool) -> LabelId {
        if is_ipv4 {
            Self::WORLD_IPV4
        } else {
            Self::WORLD_IPV6
        }
    }

    /// Renders a set as `a,b,c` in the set's order.
    pub fn display(&self, set: &LabelSet) -> String {
        let mut out = String::new();
        for (i, id) in set.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            if let Some(label) = self.label(id) {
                out.push_str(&label.to_string());
            }
        }
        out
    }
}

impl LabelTable {
    /// Renders a set as its labels sorted by text, `a,b,c`: the same string for the same set
    /// whatever order the labels were interned in (what a restore matches on).
    pub fn canonical(&self, set: &LabelSet) -> String {
        let mut texts: SmallVec<[String; 4]> = set
            .iter()
            .filter_map(|id| self.label(id).map(ToString::to_string))
            .collect();
        texts.sort_unstable();
        texts.join(",")
    }
}

/// A set of interned labels, kept sorted and free of duplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelSet(SmallVec<[LabelId; 4]>);

impl LabelSet {
    /// The empty set.
    pub fn new() -> Self {
        Self(SmallVec::new())
    }

    /// Adds a label; returns whether it was new.
    pub fn insert(&mut self, id: LabelId) -> bool {
        match self.0.binary_search(&id) {
            Ok(_) => false,
            Err(at) => {
                self.0.insert(at, id);
                true
            }
        }
    }

    /// Removes a label; returns whether it was there.
    pub fn remove(&mut self, id: LabelId) -> bool {
        match self.0.binary_search(&id) {
            Ok(at) => {
                self.0.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether the set holds `id`.
    pub fn contains(&self, id: LabelId) -> bool {
        self.0.binary_search(&id).is_ok()
    }

    /// Whether every label of `self` is in `other`.
    pub fn is_subset(&self, other: &LabelSet) -> bool {
        self.0.iter().all(|id| other.contains(*id))
    }

    /// Adds every label of `other`.
    pub fn extend(&mut self, other: &LabelSet) {
        for id in other.iter() {
            self.insert(id);
        }
    }

    /// Keeps the labels for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(LabelId) -> bool) {
        self.0.retain(|id| keep(*id));
    }

    /// The labels, in id order.
    pub fn iter(&self) -> std::iter::Copied<std::slice::Iter<'_, LabelId>> {
        self.0.iter().copied()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl FromIterator<LabelId> for LabelSet {
    fn from_iter<I: IntoIterator<Item = LabelId>>(iter: I) -> Self {
        let mut set = Self::new();
        for id in iter {
            set.insert(id);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_is_stable_and_reserved_ids_are_fixed() {
        let mut t = LabelTable::default();
        let a = t.intern(Label::fqdn("*.cilium.io."));
        let b = t.intern(Label::fqdn("*.cilium.io."));
        assert_eq!(a, b);
        assert_eq!(
            t.get(&Label::Reserved(Reserved::WorldIpv4)),
            Some(LabelTable::WORLD_IPV4)
        );
        assert_eq!(
            t.label(a).map(ToString::to_string).as_deref(),
            Some("fqdn:*.cilium.io.")
        );
    }

    #[test]
    fn sets_are_sorted_and_deduplicated() {
        let mut s = LabelSet::new();
        assert!(s.insert(LabelId(5)));
        assert!(s.insert(LabelId(1)));
        assert!(!s.insert(LabelId(5)));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![LabelId(1), LabelId(5)]);
        assert_eq!(s, [LabelId(5), LabelId(1)].into_iter().collect());
        assert!(s.remove(LabelId(1)));
        assert_eq!(s.len(), 1);
    }
}
