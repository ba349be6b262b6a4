//! Cluster mode: the global numbers the cluster assigns to endpoint label sets (a prefix
//! follows its set's number, a local endpoint waits on a temporary one), other nodes'
//! endpoints and own addresses as remote owners, and the index from a label set to its
//! prefixes that finds them when a number changes.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::IpCache;
use crate::datapath::Datapath;
use crate::endpoint::EndpointLabel;
use crate::error::Error;
use crate::identity::{Identity, Scope};
use crate::labels::{Label, LabelSet};
use crate::metadata::{OwnerId, OwnerKind, ResourceOwner, host_prefix};

/// Cluster mode's state: the numbers the cluster assigned, the other nodes' endpoints, and
/// which prefixes carry which endpoint label set (to find them when a number changes).
#[derive(Debug, Default)]
pub(super) struct ClusterState {
    /// Endpoint label set → its global number.
    pub(super) assigned: HashMap<LabelSet, Identity>,
    /// Prefixes with endpoint owners (local or remote), by their label set.
    by_labels: HashMap<LabelSet, BTreeSet<IpNet>>,
    labels_of: HashMap<IpNet, LabelSet>,
    /// Remote endpoints: name → their prefixes.
    remote: HashMap<Arc<str>, BTreeSet<IpNet>>,
    /// Other nodes: name → their own addresses' prefixes.
    nodes: HashMap<Arc<str>, BTreeSet<IpNet>>,
    /// One shared `Arc` per remote label set.
    remote_sets: HashMap<LabelSet, Arc<LabelSet>>,
}

impl ClusterState {
    /// Records that `prefix` carries endpoint labels `labels` (or none).
    pub(super) fn track(&mut self, prefix: IpNet, labels: Option<&LabelSet>) {
        if self.labels_of.get(&prefix) == labels {
            return;
        }
        if let Some(old) = self.labels_of.remove(&prefix)
            && let Some(set) = self.by_labels.get_mut(&old)
        {
            set.remove(&prefix);
            if set.is_empty() {
                self.by_labels.remove(&old);
            }
        }
        if let Some(new) = labels {
            self.labels_of.insert(prefix, new.clone());
            self.by_labels
                .entry(new.clone())
                .or_default()
                .insert(prefix);
        }
    }
}

impl<D: Datapath> IpCache<D> {
    /// Turns cluster mode on: endpoint label sets take the numbers the cluster assigns
    /// ([`IpCache::assign_cluster_identities`]), a local endpoint's label set without one a
    /// temporary identity, and other nodes' endpoints can be added
    /// ([`IpCache::upsert_remote_endpoint`]). CIDR and FQDN identities stay node-local. Call
    /// before any endpoint is installed.
    pub fn enable_cluster(&mut self) {
        if self.cluster.is_none() {
            self.cluster = Some(ClusterState::default());
        }
    }

    /// Sets (`Some`) or removes (`None`) the global numbers of endpoint label sets, and moves
    /// every prefix of those sets to its new identity: a temporary one is replaced by the
    /// global one (policy for the new number first, then the ipcache flip, then the old
    /// number's policy goes — one ordered batch at the next commit), a set that lost its number
    /// goes back to a temporary identity (local endpoints) or out of the ipcache (remote ones).
    /// Nothing on a single node.
    ///
    /// A number taken from one label set and given to another must be committed in two steps
    /// (removal, commit, assignment): the same number never means two label sets in one batch.
    ///
    /// # Errors
    /// A number outside the cluster range (that change alone is not made), or one that still
    /// stands for another label set here ([`Error::IdentityTaken`]); the other changes are
    /// made either way.
    pub fn assign_cluster_identities(
        &mut self,
        changes: impl IntoIterator<Item = (Vec<EndpointLabel>, Option<Identity>)>,
    ) -> Result<(), Error> {
        let Some(cluster) = self.cluster.as_mut() else {
            return Ok(());
        };
        let mut bad = None;
        let changes: Vec<(Vec<EndpointLabel>, Option<Identity>)> = changes
            .into_iter()
            .filter(|(_, n)| match n {
                Some(n) if n.scope() != Some(Scope::Cluster) => {
                    bad.get_or_insert(*n);
                    false
                }
                _ => true,
            })
            .collect();
        let mut affected = BTreeSet::new();
        for (labels, number) in changes {
            let set: LabelSet = labels
                .into_iter()
                .map(|l| self.labels.intern(Label::Endpoint(l)))
                .collect();
            let changed = match number {
                Some(n) => cluster.assigned.insert(set.clone(), n) != Some(n),
                None => cluster.assigned.remove(&set).is_some(),
            };
            if changed {
                affected.extend(cluster.by_labels.get(&set).into_iter().flatten().copied());
            }
        }
        self.resolve_all(affected)?;
        match bad {
            Some(identity) => Err(Error::NotClusterIdentity { identity }),
            None => Ok(()),
        }
    }

    /// Adds or changes another node's endpoint `name`: its addresses carry its labels, with
    /// the global identity of its label set (none until the cluster assigned one). Nothing on a
    /// single node.
    ///
    /// # Errors
    /// A number assigned to its label set stands for another label set here.
    pub fn upsert_remote_endpoint(
        &mut self,
        name: &str,
        addresses: &[IpNet],
        labels: &[EndpointLabel],
    ) -> Result<(), Error> {
        if self.cluster.is_none() {
            return Ok(());
        }
        let name: Arc<str> = Arc::from(name);
        let owner = self.owner_by_value(&remote_endpoint_owner(Arc::clone(&name)))?;
        let set: LabelSet = labels
            .iter()
            .map(|l| self.labels.intern(Label::Endpoint(l.clone())))
            .collect();
        let Some(cluster) = self.cluster.as_mut() else {
            return Ok(());
        };
        let set = Arc::clone(
            cluster
                .remote_sets
                .entry(set.clone())
                .or_insert_with(|| Arc::new(set)),
        );
        let addresses: BTreeSet<IpNet> = addresses.iter().map(IpNet::trunc).collect();
        let old = cluster.remote.insert(name, addresses.clone());
        self.move_claims(owner, old, &addresses, &set, true)
    }

    /// Sets another node's own addresses (those it registered: what it gives the host
    /// identity): each gets the remote-node identity (`reserved:remote-node`, 6), which
    /// `toEntities`/`fromEntities` `remote-node` and `cluster` select — unless an endpoint
    /// (local or remote) or this node itself claims the address. Addresses it no longer has
    /// go back to what else claims them. Nothing on a single node.
    ///
    /// # Errors
    /// As [`IpCache::upsert_remote_endpoint`], for the prefixes it touched (every one is
    /// tried).
    pub fn upsert_remote_node(&mut self, node: &str, addresses: &[IpAddr]) -> Result<(), Error> {
        if self.cluster.is_none() {
            return Ok(());
        }
        let name: Arc<str> = Arc::from(node);
        let owner = self.owner_by_value(&remote_node_owner(Arc::clone(&name)))?;
        let Some(cluster) = self.cluster.as_mut() else {
            return Ok(());
        };
        let addresses: BTreeSet<IpNet> = addresses.iter().copied().map(host_prefix).collect();
        let old = cluster.nodes.insert(name, addresses.clone());
        self.move_claims(owner, old, &addresses, &Arc::new(LabelSet::new()), false)
    }

    /// Forgets another node's own addresses (its registration went). Nothing if unknown or
    /// on a single node.
    ///
    /// # Errors
    /// As [`IpCache::upsert_remote_node`].
    pub fn remove_remote_node(&mut self, node: &str) -> Result<(), Error> {
        let Some(cluster) = self.cluster.as_mut() else {
            return Ok(());
        };
        let Some(addresses) = cluster.nodes.remove(node) else {
            return Ok(());
        };
        let owner = self.owner_by_value(&remote_node_owner(Arc::from(node)))?;
        self.drop_claims(owner, addresses)
    }

    /// Removes another node's endpoint. Nothing if unknown or on a single node.
    ///
    /// # Errors
    /// As [`IpCache::upsert_remote_endpoint`], for what its addresses fall back to.
    pub fn remove_remote_endpoint(&mut self, name: &str) -> Result<(), Error> {
        let Some(cluster) = self.cluster.as_mut() else {
            return Ok(());
        };
        let Some(addresses) = cluster.remote.remove(name) else {
            return Ok(());
        };
        let owner = self.owner_by_value(&remote_endpoint_owner(Arc::from(name)))?;
        self.drop_claims(owner, addresses)
    }

    /// Moves a remote owner's claims from the prefixes it had (`old`) to `addresses`: the
    /// ones it lost are dropped, the new ones (every one with `relabel`) get `labels`; an
    /// owner left without prefixes is forgotten. Re-resolves every prefix touched (each is
    /// tried, the first error is returned).
    fn move_claims(
        &mut self,
        owner: OwnerId,
        old: Option<BTreeSet<IpNet>>,
        addresses: &BTreeSet<IpNet>,
        labels: &Arc<LabelSet>,
        relabel: bool,
    ) -> Result<(), Error> {
        let mut touched = BTreeSet::new();
        for gone in old.iter().flatten().filter(|a| !addresses.contains(a)) {
            if self.meta.remove(*gone, owner).is_some() {
                touched.insert(*gone);
            }
        }
        for addr in addresses {
            if relabel || old.as_ref().is_none_or(|old| !old.contains(addr)) {
                self.meta.upsert(*addr, owner, Arc::clone(labels));
                touched.insert(*addr);
            }
        }
        if addresses.is_empty() {
            // Claims nothing: removal succeeds.
            let _ = self.meta.owners.remove(owner);
        }
        self.resolve_all(touched)
    }

    /// Drops a remote owner's claims on `addresses` (all it had) and forgets it.
    fn drop_claims(&mut self, owner: OwnerId, addresses: BTreeSet<IpNet>) -> Result<(), Error> {
        let none = Arc::new(LabelSet::new());
        self.move_claims(owner, Some(addresses), &BTreeSet::new(), &none, false)
    }
}

impl<D> IpCache<D> {
    /// Whether cluster mode is on.
    pub fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// Cluster mode: the global number the cluster assigned to an endpoint label set.
    pub fn cluster_identity_of(&self, labels: &[EndpointLabel]) -> Option<Identity> {
        let cluster = self.cluster.as_ref()?;
        let set: Option<LabelSet> = labels
            .iter()
            .map(|l| self.labels.get(&Label::Endpoint(l.clone())))
            .collect();
        cluster.assigned.get(&set?).copied()
    }

    /// Cluster mode: the other nodes' endpoints known.
    pub fn remote_endpoint_count(&self) -> usize {
        self.cluster.as_ref().map_or(0, |c| c.remote.len())
    }

    /// Cluster mode: the temporary identities in use (label sets waiting for a global number),
    /// with their labels rendered `a,b,c`, by number.
    pub fn temporary_identities(&self) -> Vec<(Identity, String)> {
        let mut out: Vec<(Identity, String)> = self
            .alloc
            .iter()
            .filter(|(id, _, _)| id.scope() == Some(Scope::Temporary))
            .map(|(id, labels, _)| (id, self.labels.display(labels)))
            .collect();
        out.sort();
        out
    }
}

fn remote_node_owner(node: Arc<str>) -> ResourceOwner {
    ResourceOwner {
        kind: OwnerKind::RemoteNode,
        name: node,
    }
}

fn remote_endpoint_owner(name: Arc<str>) -> ResourceOwner {
    ResourceOwner {
        kind: OwnerKind::RemoteEndpoint,
        name,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::labels::LabelId;

    fn set(ids: &[u32]) -> LabelSet {
        ids.iter().map(|i| LabelId(*i)).collect()
    }

    fn prefix(n: u8) -> IpNet {
        IpNet::from(IpAddr::from([10, 0, 0, n]))
    }

    #[test]
    fn a_prefix_is_indexed_under_its_latest_label_set_only() {
        let (web, db) = (set(&[10]), set(&[11, 12]));
        let mut cluster = ClusterState::default();
        cluster.track(prefix(1), Some(&web));
        cluster.track(prefix(2), Some(&web));
        assert_eq!(
            cluster.by_labels[&web],
            BTreeSet::from([prefix(1), prefix(2)])
        );

        cluster.track(prefix(1), Some(&db));
        assert_eq!(cluster.by_labels[&web], BTreeSet::from([prefix(2)]));
        assert_eq!(cluster.by_labels[&db], BTreeSet::from([prefix(1)]));
        assert_eq!(cluster.labels_of[&prefix(1)], db);

        // The last prefix of a set gone: the set leaves the index.
        cluster.track(prefix(2), None);
        assert!(!cluster.by_labels.contains_key(&web));
        assert!(!cluster.labels_of.contains_key(&prefix(2)));
        // A prefix without endpoint labels that was never tracked: nothing.
        cluster.track(prefix(3), None);
        assert_eq!(cluster.labels_of.len(), 1);
        assert_eq!(cluster.by_labels.len(), 1);
    }

    proptest! {
        #[test]
        fn the_index_is_the_inverse_of_the_last_labels_tracked(
            ops in proptest::collection::vec((0u8..6, proptest::option::of(0u32..4)), 1..100)
        ) {
            let mut cluster = ClusterState::default();
            let mut model: BTreeMap<IpNet, LabelSet> = BTreeMap::new();
            for (n, labels) in ops {
                let labels = labels.map(|l| set(&[l, 100]));
                cluster.track(prefix(n), labels.as_ref());
                match labels {
                    Some(labels) => model.insert(prefix(n), labels),
                    None => model.remove(&prefix(n)),
                };
                let labels_of: BTreeMap<IpNet, LabelSet> =
                    cluster.labels_of.iter().map(|(p, l)| (*p, l.clone())).collect();
                prop_assert_eq!(&labels_of, &model);
                let mut inverse: HashMap<LabelSet, BTreeSet<IpNet>> = HashMap::new();
                for (p, l) in &model {
                    inverse.entry(l.clone()).or_default().insert(*p);
                }
                prop_assert_eq!(&cluster.by_labels, &inverse);
            }
        }
    }
}
