//! Numeric identities and the allocator that hands one out per unique label set.
//!
//! Number ranges (see shared/design/001): reserved 1–255, cluster (endpoints) 256–65535,
//! node-local CIDR/FQDN identities 2^24 … 2^24 + 2^16 − 1, and in cluster mode temporary
//! identities 0x01010000–0x010103FF for local endpoints whose label set has no global number
//! yet (they never leave the node). Numbers are handed out round-robin (next-fit, wrapping),
//! so a released number is not reused at once, and never while anything still holds it.
//! Withheld numbers are skipped by ordinary allocation so a restore can give each label set
//! back its old number. In cluster mode, cluster-scope numbers are not chosen here: the
//! cluster assigns them ([`Allocator::allocate_exact`]).

use std::fmt;

// foldhash-seeded maps: both are read on every learned address and every release.
use hashbrown::{HashMap, HashSet};

use crate::error::Error;
use crate::labels::LabelSet;

/// A numeric security identity: what the datapath's ipcache and policy maps hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity(pub u32);

impl Identity {
    /// Wildcard in policy keys: any identity.
    pub const ANY: Identity = Identity(0);
    /// `reserved:host`: the node's own addresses.
    pub const HOST: Identity = Identity(1);
    /// `reserved:remote-node`: in cluster mode, the other nodes' own addresses (those each
    /// node registers: what it gives the host identity), unless an endpoint or this node
    /// claims the address.
    pub const REMOTE_NODE: Identity = Identity(6);
    /// `reserved:world-ipv4`: IPv4 addresses the ipcache knows nothing about.
    pub const WORLD_IPV4: Identity = Identity(9);
    /// `reserved:world-ipv6`: IPv6 addresses the ipcache knows nothing about.
    pub const WORLD_IPV6: Identity = Identity(10);

    /// The scope the number belongs to.
    pub fn scope(self) -> Option<Scope> {
        [
            Scope::Reserved,
            Scope::Cluster,
            Scope::Local,
            Scope::Temporary,
        ]
        .into_iter()
        .find(|s| s.contains(self))
    }

    /// The world identity of an address family.
    pub fn world(is_ipv4: bool) -> Self {
        if is_ipv4 {
            Self::WORLD_IPV4
        } else {
            Self::WORLD_IPV6
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Identity number ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// 1–255, fixed meanings.
    Reserved,
    /// 256–65535: endpoints and client groups (label sets of workloads).
    Cluster,
    /// 2^24 … 2^24 + 2^16 − 1: node-local CIDR and FQDN label sets.
    Local,
    /// 0x01010000–0x010103FF (cluster mode): a local endpoint's label set until the cluster
    /// assigns it a global number; never published.
    Temporary,
}

impl Scope {
    /// First and last number of the range.
    pub fn range(self) -> (u32, u32) {
        match self {
            Self::Reserved => (1, 255),
            Self::Cluster => (256, 65_535),
            Self::Local => (1 << 24, (1 << 24) + (1 << 16) - 1),
            Self::Temporary => (0x0101_0000, 0x0101_03FF),
        }
    }

    /// Whether `id` lies in this range.
    pub fn contains(self, id: Identity) -> bool {
        let (lo, hi) = self.range();
        (lo..=hi).contains(&id.0)
    }
}

#[derive(Debug)]
struct Entry {
    labels: LabelSet,
    refs: u32,
    /// Created by a DNS-driven upsert; counts against the FQDN identity breaker.
    from_dns: bool,
}

/// Allocation result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// The identity now referenced once more.
    pub identity: Identity,
    /// Whether it was created by this call.
    pub created: bool,
}

/// Reference-counted allocator of identities for label sets, one range per [`Scope`].
#[derive(Debug, Default)]
pub struct Allocator {
    by_id: HashMap<Identity, Entry>,
    by_labels: HashMap<LabelSet, Identity>,
    next_cluster: u32,
    next_local: u32,
    next_temporary: u32,
    withheld: HashSet<Identity>,
    from_dns_live: usize,
    created_total: u64,
    peak_live: usize,
}

impl Allocator {
    /// The identity of `labels`, if allocated.
    pub fn lookup(&self, labels: &LabelSet) -> Option<Identity> {
        self.by_labels.get(labels).copied()
    }

    /// The labels of `id`, if allocated.
    pub fn labels(&self, id: Identity) -> Option<&LabelSet> {
        self.by_id.get(&id).map(|e| &e.labels)
    }

    /// References held on `id` (0 if not allocated).
    pub fn refs(&self, id: Identity) -> u32 {
        self.by_id.get(&id).map_or(0, |e| e.refs)
    }

    /// Every allocated identity with its labels and reference count, unordered.
    pub fn iter(&self) -> impl Iterator<Item = (Identity, &LabelSet, u32)> + '_ {
        self.by_id.iter().map(|(id, e)| (*id, &e.labels, e.refs))
    }

    /// Allocated identities.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether nothing is allocated.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Live identities created by DNS-driven upserts.
    pub fn from_dns_live(&self) -> usize {
        self.from_dns_live
    }

    /// Identities created since start.
    pub fn created_total(&self) -> u64 {
        self.created_total
    }

    /// Most identities live at once since start.
    pub fn peak_live(&self) -> usize {
        self.peak_live
    }

    /// Whether `labels` has a live identity: [`Allocator::allocate`] then takes a reference on
    /// it whatever number is requested.
    pub fn is_allocated(&self, labels: &LabelSet) -> bool {
        self.by_labels
            .get(labels)
            .is_some_and(|id| self.by_id.contains_key(id))
    }

    /// Takes a reference on the identity of `labels`, creating it in `scope` if needed.
    ///
    /// `requested` asks for a specific number (a restore); it is honoured when free, even if
    /// withheld. `from_dns` marks a newly created identity as DNS-driven.
    pub fn allocate(
        &mut self,
        labels: &LabelSet,
        scope: Scope,
        requested: Option<Identity>,
        from_dns: bool,
    ) -> Result<Allocation, Error> {
        if let Some(id) = self.by_labels.get(labels).copied()
            && let Some(entry) = self.by_id.get_mut(&id)
        {
            entry.refs += 1;
            return Ok(Allocation {
                identity: id,
                created: false,
            });
        }
        let id = match requested.filter(|id| scope.contains(*id) && !self.by_id.contains_key(id)) {
            Some(id) => id,
            None => self.next_free(scope)?,
        };
        self.by_id.insert(
            id,
            Entry {
                labels: labels.clone(),
                refs: 1,
                from_dns,
            },
        );
        self.by_labels.insert(labels.clone(), id);
        self.from_dns_live += usize::from(from_dns);
        self.created_total += 1;
        self.peak_live = self.peak_live.max(self.by_id.len());
        Ok(Allocation {
            identity: id,
            created: true,
        })
    }

    /// Takes a reference on number `id` for `labels`, creating it with exactly that number if
    /// needed (cluster mode: the number the cluster assigned). If `labels` resolved to another
    /// number, that number keeps its references and labels but `labels` resolves to `id` from
    /// now on (the switch from a temporary identity to the global one).
    ///
    /// # Errors
    /// [`Error::IdentityTaken`] if `id` stands for another label set here.
    pub fn allocate_exact(&mut self, labels: &LabelSet, id: Identity) -> Result<Allocation, Error> {
        if let Some(entry) = self.by_id.get_mut(&id) {
            if entry.labels != *labels {
                return Err(Error::IdentityTaken { identity: id });
            }
            entry.refs += 1;
            self.by_labels.insert(labels.clone(), id);
            return Ok(Allocation {
                identity: id,
                created: false,
            });
        }
        self.by_id.insert(
            id,
            Entry {
                labels: labels.clone(),
                refs: 1,
                from_dns: false,
            },
        );
        self.by_labels.insert(labels.clone(), id);
        self.created_total += 1;
        self.peak_live = self.peak_live.max(self.by_id.len());
        Ok(Allocation {
            identity: id,
            created: true,
        })
    }

    /// Makes `labels` resolve to no number, leaving the number it had alive (with its
    /// references) until they are released: the next allocation for `labels` creates a new one.
    pub fn detach(&mut self, labels: &LabelSet) {
        self.by_labels.remove(labels);
    }

    /// Takes one more reference on an allocated identity; false if it is not allocated.
    pub fn acquire(&mut self, id: Identity) -> bool {
        match self.by_id.get_mut(&id) {
            Some(entry) => {
                entry.refs += 1;
                true
            }
            None => false,
        }
    }

    /// Drops a reference; returns the labels when this freed the identity.
    pub fn release(&mut self, id: Identity) -> Option<LabelSet> {
        let entry = self.by_id.get_mut(&id)?;
        entry.refs = entry.refs.saturating_sub(1);
        if entry.refs > 0 {
            return None;
        }
        let entry = self.by_id.remove(&id)?;
        // A detached label set may resolve to another number already.
        if self.by_labels.get(&entry.labels) == Some(&id) {
            self.by_labels.remove(&entry.labels);
        }
        self.from_dns_live -= usize::from(entry.from_dns);
        Some(entry.labels)
    }

    /// Keeps `ids` out of ordinary allocation until [`Allocator::unwithhold`].
    pub fn withhold(&mut self, ids: impl IntoIterator<Item = Identity>) {
        self.withheld.extend(ids);
    }

    /// Returns withheld numbers to ordinary allocation.
    pub fn unwithhold(&mut self, ids: impl IntoIterator<Item = Identity>) {
        for id in ids {
            self.withheld.remove(&id);
        }
    }

    fn next_free(&mut self, scope: Scope) -> Result<Identity, Error> {
        let (lo, hi) = scope.range();
        let cursor = match scope {
            Scope::Cluster => &mut self.next_cluster,
            Scope::Local => &mut self.next_local,
            Scope::Temporary => &mut self.next_temporary,
            Scope::Reserved => return Err(Error::IdentitiesExhausted { scope }),
        };
        // Local identities start at 2^24 + 1, as Cilium's do.
        let first = if scope == Scope::Local { lo + 1 } else { lo };
        let size = hi - first + 1;
        if !(first..=hi).contains(cursor) {
            *cursor = first;
        }
        let mut withheld_fallback = None;
        for step in 0..size {
            let n = first + (*cursor - first + step) % size;
            let id = Identity(n);
            if self.by_id.contains_key(&id) {
                continue;
            }
            if self.withheld.contains(&id) {
                withheld_fallback.get_or_insert(id);
                continue;
            }
            *cursor = if n == hi { first } else { n + 1 };
            return Ok(id);
        }
        match withheld_fallback {
            Some(id) => {
                tracing::warn!(
                    identity = id.0,
                    "identity space full: taking a withheld number"
                );
                Ok(id)
            }
            None => Err(Error::IdentitiesExhausted { scope }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::LabelId;
    use proptest::prelude::*;

    fn set(ids: &[u32]) -> LabelSet {
        ids.iter().map(|n| LabelId(n + 10)).collect()
    }

    #[test]
    fn one_identity_per_label_set_with_refcounts() {
        let mut a = Allocator::default();
        let x = a.allocate(&set(&[1]), Scope::Local, None, true).unwrap();
        let y = a.allocate(&set(&[1]), Scope::Local, None, true).unwrap();
        assert!(x.created && !y.created);
        assert_eq!(x.identity, y.identity);
        assert_eq!(x.identity, Identity((1 << 24) + 1));
        assert_eq!(a.refs(x.identity), 2);
        assert!(a.release(x.identity).is_none());
        assert!(a.release(x.identity).is_some());
        assert_eq!(a.from_dns_live(), 0);
        // Next-fit: the freed number is not handed out again at once.
        let z = a.allocate(&set(&[1]), Scope::Local, None, false).unwrap();
        assert_ne!(z.identity, x.identity);
    }

    #[test]
    fn withheld_numbers_are_skipped_but_can_be_requested() {
        let mut a = Allocator::default();
        let first = Identity((1 << 24) + 1);
        a.withhold([first]);
        let x = a.allocate(&set(&[1]), Scope::Local, None, false).unwrap();
        assert_ne!(x.identity, first);
        let y = a
            .allocate(&set(&[2]), Scope::Local, Some(first), false)
            .unwrap();
        assert_eq!(y.identity, first);
    }

    #[test]
    fn cluster_scope_exhaustion_is_an_error() {
        let mut a = Allocator::default();
        let (lo, hi) = Scope::Cluster.range();
        for n in lo..=hi {
            a.allocate(&set(&[n]), Scope::Cluster, None, false).unwrap();
        }
        assert!(matches!(
            a.allocate(&set(&[0]), Scope::Cluster, None, false),
            Err(Error::IdentitiesExhausted {
                scope: Scope::Cluster
            })
        ));
    }

    #[test]
    fn an_exact_number_switches_a_label_set_while_the_old_number_lives_on() {
        let mut a = Allocator::default();
        let temp = a
            .allocate(&set(&[1]), Scope::Temporary, None, false)
            .unwrap();
        assert_eq!(temp.identity, Identity(0x0101_0000));
        assert_eq!(temp.identity.scope(), Some(Scope::Temporary));
        a.detach(&set(&[1]));
        let global = a.allocate_exact(&set(&[1]), Identity(300)).unwrap();
        assert!(global.created);
        assert_eq!(a.lookup(&set(&[1])), Some(Identity(300)));
        assert_eq!(a.labels(temp.identity), Some(&set(&[1])), "still held");
        // Releasing the old number does not unmap the label set from the new one.
        assert!(a.release(temp.identity).is_some());
        assert_eq!(a.lookup(&set(&[1])), Some(Identity(300)));
        assert!(matches!(
            a.allocate_exact(&set(&[2]), Identity(300)),
            Err(Error::IdentityTaken {
                identity: Identity(300)
            })
        ));
        let again = a.allocate_exact(&set(&[1]), Identity(300)).unwrap();
        assert!(!again.created);
        assert_eq!(a.refs(Identity(300)), 2);
    }

    #[test]
    fn temporary_numbers_run_out_after_1024() {
        let mut a = Allocator::default();
        for n in 0..1024 {
            let got = a
                .allocate(&set(&[n]), Scope::Temporary, None, false)
                .unwrap();
            assert_eq!(got.identity.scope(), Some(Scope::Temporary));
        }
        assert!(matches!(
            a.allocate(&set(&[5000]), Scope::Temporary, None, false),
            Err(Error::IdentitiesExhausted {
                scope: Scope::Temporary
            })
        ));
    }

    proptest! {
        /// Allocate/release sequences stay balanced and never give one number to two sets.
        #[test]
        fn numbers_are_never_shared(ops in proptest::collection::vec((0u32..6, any::<bool>()), 1..200)) {
            let mut a = Allocator::default();
            let mut held: Vec<(u32, Identity)> = Vec::new();
            for (s, alloc) in ops {
                if alloc || held.is_empty() {
                    let got = a.allocate(&set(&[s]), Scope::Local, None, false).unwrap();
                    if let Some((_, other)) = held.iter().find(|(o, _)| *o != s).filter(|(_, id)| *id == got.identity) {
                        prop_assert!(false, "number {other} shared by two label sets");
                    }
                    held.push((s, got.identity));
                } else {
                    let (_, id) = held.remove(0);
                    a.release(id);
                }
                for (s, id) in &held {
                    prop_assert_eq!(a.lookup(&set(&[*s])), Some(*id));
                }
                let distinct: HashSet<u32> = held.iter().map(|(s, _)| *s).collect();
                prop_assert_eq!(a.len(), distinct.len());
            }
        }
    }
}
