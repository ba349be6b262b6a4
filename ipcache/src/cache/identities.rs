//! Identities: the [`Identities`] helper every identity change goes through (a reference
//! taken or dropped on a label set's number, and the selectors and policy entries that
//! follow a number's coming and going), the restore of numbers after a restart, and what an
//! identity's labels are.

use std::collections::HashMap;

use super::cluster::ClusterState;
use super::{IpCache, Pending, Stats};
use crate::endpoint_policy::PolicyState;
use crate::error::Error;
use crate::identity::{Allocator, Identity, Scope};
use crate::labels::{Label, LabelSet, LabelTable};
use crate::selector::{SelectorCache, SelectorIdx};

/// The parts that identity changes touch, borrowed apart from the rest of the IpCache.
pub(super) struct Identities<'a> {
    pub(super) labels: &'a mut LabelTable,
    /// Give each prefix with `fqdn:` labels its own `cidr:<prefix>` label too (per-IP mode).
    pub(super) per_prefix: bool,
    pub(super) alloc: &'a mut Allocator,
    pub(super) selectors: &'a mut SelectorCache,
    pub(super) policy: &'a mut PolicyState,
    pub(super) pending: &'a mut Pending,
    pub(super) stats: &'a mut Stats,
    pub(super) scratch: &'a mut Vec<SelectorIdx>,
    /// Canonical label sets → the numbers they had before a restart.
    pub(super) restore: &'a HashMap<String, Identity>,
    /// Prefixes with an identity (written to the datapath), IPv4 and IPv6.
    pub(super) written: &'a mut [usize; 2],
    /// The datapath's room per family, if bounded.
    pub(super) capacity: Option<usize>,
    /// Cluster mode's numbers and index; `None` on a single node.
    pub(super) cluster: Option<&'a mut ClusterState>,
}

impl Identities<'_> {
    pub(super) fn acquire(
        &mut self,
        labels: &LabelSet,
        scope: Scope,
        from_dns: bool,
    ) -> Result<Identity, Error> {
        let requested = if scope == Scope::Reserved {
            reserved_number(labels)
        } else if self.restore.is_empty() || self.alloc.is_allocated(labels) {
            // A live label set keeps its number: no need to render it for the restore table
            // (once per prefix in a restore otherwise).
            None
        } else {
            self.restore.get(&self.labels.canonical(labels)).copied()
        };
        let allocation = self.alloc.allocate(labels, scope, requested, from_dns)?;
        // A reserved identity is in the selectors of its entities from their registration on
        // (`selector::reserved_of`): its allocation changes no selector.
        if allocation.created && scope != Scope::Reserved {
            self.added(allocation.identity, labels);
        }
        Ok(allocation.identity)
    }

    /// Cluster mode: a reference on the number the cluster assigned to `labels`.
    pub(super) fn acquire_exact(
        &mut self,
        labels: &LabelSet,
        id: Identity,
    ) -> Result<Identity, Error> {
        if self
            .alloc
            .lookup(labels)
            .is_some_and(|current| current != id)
        {
            self.alloc.detach(labels);
        }
        let allocation = self.alloc.allocate_exact(labels, id)?;
        if allocation.created {
            self.added(id, labels);
        }
        Ok(id)
    }

    /// Cluster mode: a reference on the temporary identity of `labels` (a new one if it has
    /// none, or only its former global number).
    pub(super) fn acquire_temporary(&mut self, labels: &LabelSet) -> Result<Identity, Error> {
        if self
            .alloc
            .lookup(labels)
            .is_some_and(|current| current.scope() != Some(Scope::Temporary))
        {
            self.alloc.detach(labels);
        }
        self.acquire(labels, Scope::Temporary, false)
    }

    /// A new identity: the selectors that select it, and the policy entries that follow.
    fn added(&mut self, id: Identity, labels: &LabelSet) {
        self.scratch.clear();
        self.selectors
            .identity_added(id, labels, &*self.labels, self.scratch);
        for idx in self.scratch.iter() {
            self.stats.selector_updates += 1;
            let pending = &mut *self.pending;
            self.policy.selector_changed(*idx, id, true, |ep, key, up| {
                pending.policy_change(ep, key, up);
            });
        }
    }

    pub(super) fn release(&mut self, id: Identity) {
        let Some(labels) = self.alloc.release(id) else {
            return;
        };
        if id.scope() == Some(Scope::Reserved) {
            return;
        }
        self.scratch.clear();
        self.selectors.identity_removed(id, &labels, self.scratch);
        for idx in self.scratch.iter() {
            self.stats.selector_updates += 1;
            let pending = &mut *self.pending;
            self.policy
                .selector_changed(*idx, id, false, |ep, key, up| {
                    pending.policy_change(ep, key, up);
                });
        }
    }
}

impl<D> IpCache<D> {
    /// Before a restore: every label set in `table` (canonical rendering, as
    /// [`IpCache::identities_canonical`] gives) gets its old number back when it is allocated
    /// again, and those numbers are withheld from every other label set until
    /// [`IpCache::finish_restore`]. Call before installing endpoints and policy.
    pub fn restore_identities(&mut self, table: impl IntoIterator<Item = (String, Identity)>) {
        self.restore.extend(table);
        self.alloc.withhold(self.restore.values().copied());
    }

    /// Ends the restore: numbers whose label sets did not come back are returned to ordinary
    /// allocation. Returns how many that was.
    pub fn finish_restore(&mut self) -> usize {
        let unused: Vec<Identity> = self
            .restore
            .values()
            .copied()
            .filter(|id| self.alloc.labels(*id).is_none())
            .collect();
        let ids: Vec<Identity> = self.restore.drain().map(|(_, id)| id).collect();
        self.alloc.unwithhold(ids);
        unused.len()
    }

    /// Every allocated identity with its labels rendered canonically (sorted text): what a
    /// checkpoint records to give the same numbers back after a restart.
    pub fn identities_canonical(&self) -> Vec<(String, Identity)> {
        self.alloc
            .iter()
            .map(|(id, set, _)| (self.labels.canonical(set), id))
            .collect()
    }

    /// The canonical rendering of one identity's labels.
    pub fn canonical_labels_of(&self, id: Identity) -> Option<String> {
        self.alloc.labels(id).map(|set| self.labels.canonical(set))
    }

    /// The labels of an identity, rendered `a,b,c`.
    pub fn labels_of(&self, id: Identity) -> Option<String> {
        self.alloc.labels(id).map(|set| self.labels.display(set))
    }

    /// Whether an identity's labels include any `fqdn:` label.
    pub fn has_fqdn_label(&self, id: Identity) -> bool {
        self.alloc.labels(id).is_some_and(|set| {
            set.iter()
                .any(|l| matches!(self.labels.label(l), Some(Label::Fqdn(_))))
        })
    }

    /// The identity allocator (read only).
    pub fn allocator(&self) -> &Allocator {
        &self.alloc
    }
}

/// The number of a reserved label set (`reserved:host` → 1, `reserved:remote-node` → 6).
fn reserved_number(labels: &LabelSet) -> Option<Identity> {
    if labels.len() != 1 {
        return None;
    }
    if labels.contains(LabelTable::HOST) {
        Some(Identity::HOST)
    } else if labels.contains(LabelTable::REMOTE_NODE) {
        Some(Identity::REMOTE_NODE)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::PolicyKey;
    use crate::endpoint::{EndpointId, EndpointLabel};
    use crate::endpoint_policy::EndpointPolicy;
    use crate::policy::{Direction, Entity, PeerSelector, Protocol};

    /// What an `Identities` borrows, owned by the test.
    #[derive(Default)]
    struct Parts {
        labels: LabelTable,
        alloc: Allocator,
        selectors: SelectorCache,
        policy: PolicyState,
        pending: Pending,
        stats: Stats,
        scratch: Vec<SelectorIdx>,
        restore: HashMap<String, Identity>,
        written: [usize; 2],
    }

    impl Parts {
        fn ids(&mut self) -> Identities<'_> {
            Identities {
                labels: &mut self.labels,
                per_prefix: false,
                alloc: &mut self.alloc,
                selectors: &mut self.selectors,
                policy: &mut self.policy,
                pending: &mut self.pending,
                stats: &mut self.stats,
                scratch: &mut self.scratch,
                restore: &self.restore,
                written: &mut self.written,
                capacity: None,
                cluster: None,
            }
        }

        /// An FQDN identity's labels: `fqdn:<key>` and the IPv4 world.
        fn fqdn_set(&mut self, key: &str) -> LabelSet {
            [self.labels.intern(Label::fqdn(key)), LabelTable::WORLD_IPV4]
                .into_iter()
                .collect()
        }

        /// Endpoint 1 may reach what `fqdn:<key>` selects on TCP 443.
        fn allow_egress_to(&mut self, key: &str) -> SelectorIdx {
            let selector = PeerSelector::Fqdn(key.to_string());
            let idx = self
                .selectors
                .register(&selector, &mut self.labels, std::iter::empty());
            self.policy
                .endpoints
                .insert(EndpointId(1), EndpointPolicy::new([true, false]));
            let ports = vec![(Protocol::Tcp, 443, 443)];
            self.policy
                .users
                .entry(idx)
                .or_default()
                .push((EndpointId(1), (Direction::Egress, false, ports)));
            idx
        }
    }

    fn tcp_443(identity: Identity) -> (EndpointId, PolicyKey) {
        let key = PolicyKey {
            identity,
            protocol: Protocol::Tcp,
            port: 443,
            end_port: 443,
            direction: Direction::Egress,
            deny: false,
        };
        (EndpointId(1), key)
    }

    #[test]
    fn selectors_and_policy_follow_the_first_and_the_last_reference_only() {
        let mut p = Parts::default();
        let idx = p.allow_egress_to("example.com");
        let set = p.fqdn_set("example.com");

        let id = p.ids().acquire(&set, Scope::Local, true).unwrap();
        assert_eq!(id.scope(), Some(Scope::Local));
        assert_eq!(p.selectors.identities(idx).collect::<Vec<_>>(), [id]);
        assert_eq!(p.pending.policy.get(&tcp_443(id)), Some(&true));
        assert_eq!(p.stats.selector_updates, 1);

        // More references on the same label set: the same number, nothing downstream.
        assert_eq!(p.ids().acquire(&set, Scope::Local, true).unwrap(), id);
        assert_eq!(p.ids().acquire(&set, Scope::Local, true).unwrap(), id);
        p.ids().release(id);
        p.ids().release(id);
        assert_eq!(p.alloc.refs(id), 1);
        assert_eq!(p.stats.selector_updates, 1);
        assert_eq!(p.selectors.identities(idx).collect::<Vec<_>>(), [id]);

        // The last reference: the selector lets it go, and the policy entry's removal
        // cancels its addition that the datapath never had.
        p.ids().release(id);
        assert_eq!(p.alloc.labels(id), None);
        assert_eq!(p.alloc.from_dns_live(), 0);
        assert_eq!(p.stats.selector_updates, 2);
        assert_eq!(p.selectors.identities(idx).count(), 0);
        assert!(p.pending.policy.is_empty());

        // A label set no selector selects changes no policy.
        let other = p.fqdn_set("other.example");
        let other_id = p.ids().acquire(&other, Scope::Local, true).unwrap();
        assert_ne!(other_id, id);
        assert_eq!(p.stats.selector_updates, 2);
        assert!(p.pending.policy.is_empty());
    }

    #[test]
    fn reserved_label_sets_take_their_fixed_numbers_and_touch_no_selector() {
        let mut p = Parts::default();
        let host_selector = PeerSelector::Entity(Entity::Host);
        let idx = p
            .selectors
            .register(&host_selector, &mut p.labels, std::iter::empty());
        let host: LabelSet = [LabelTable::HOST].into_iter().collect();
        let remote: LabelSet = [LabelTable::REMOTE_NODE].into_iter().collect();

        let id = p.ids().acquire(&host, Scope::Reserved, false).unwrap();
        assert_eq!(id, Identity::HOST);
        let id = p.ids().acquire(&remote, Scope::Reserved, false).unwrap();
        assert_eq!(id, Identity::REMOTE_NODE);
        assert_eq!(p.stats.selector_updates, 0);

        p.ids().release(Identity::HOST);
        assert_eq!(p.alloc.labels(Identity::HOST), None);
        assert_eq!(p.stats.selector_updates, 0);
        // The entity selects the host from its registration on, allocated or not.
        assert_eq!(
            p.selectors.identities(idx).collect::<Vec<_>>(),
            [Identity::HOST]
        );
    }

    #[test]
    fn a_restored_number_comes_back_to_its_label_set() {
        let mut p = Parts::default();
        let set = p.fqdn_set("example.com");
        let other = p.fqdn_set("other.example");
        let (first, _) = Scope::Local.range();
        let restored = Identity(first + 7);
        p.restore.insert(p.labels.canonical(&set), restored);
        p.alloc.withhold([restored]);

        // Another label set does not get the withheld number, even the first in range.
        let other_id = p.ids().acquire(&other, Scope::Local, true).unwrap();
        assert_ne!(other_id, restored);
        assert_eq!(p.ids().acquire(&set, Scope::Local, true).unwrap(), restored);
        // A live label set keeps its number whatever the table says.
        p.restore
            .insert(p.labels.canonical(&other), Identity(first + 9));
        assert_eq!(
            p.ids().acquire(&other, Scope::Local, true).unwrap(),
            other_id
        );
    }

    #[test]
    fn a_label_set_moves_between_temporary_and_global_numbers() {
        let mut p = Parts::default();
        let app = EndpointLabel {
            source: "k8s".into(),
            key: "app".into(),
            value: "web".into(),
        };
        let set: LabelSet = [p.labels.intern(Label::Endpoint(app))]
            .into_iter()
            .collect();
        let temporary = p.ids().acquire_temporary(&set).unwrap();
        assert_eq!(temporary.scope(), Some(Scope::Temporary));

        // The cluster's number: the set resolves to it, the temporary one lives on until
        // its prefixes let it go.
        let global = Identity(Scope::Cluster.range().0 + 44);
        assert_eq!(p.ids().acquire_exact(&set, global).unwrap(), global);
        assert_eq!(p.alloc.lookup(&set), Some(global));
        assert_eq!(p.alloc.labels(temporary), Some(&set));
        p.ids().release(temporary);
        assert_eq!(p.alloc.labels(temporary), None);
        assert_eq!(p.alloc.lookup(&set), Some(global));

        // The number withdrawn: a temporary identity again, not a reference on the global one.
        let again = p.ids().acquire_temporary(&set).unwrap();
        assert_eq!(again.scope(), Some(Scope::Temporary));
        assert_eq!(p.alloc.lookup(&set), Some(again));
        assert_eq!(p.alloc.refs(global), 1);
    }
}
