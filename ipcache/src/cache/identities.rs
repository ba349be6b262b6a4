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
