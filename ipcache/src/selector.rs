//! The selector cache: for every peer selector that policy uses, the identities it selects,
//! kept current as identities come and go.
//!
//! FQDN selectors are found through an index on their `fqdn:` label, so a new identity costs a
//! lookup per label, not a scan of every selector. CIDR and endpoint selectors are few (they
//! come from policy text) and are tested one by one.

use std::collections::{BTreeSet, HashMap};

use ipnet::IpNet;

use crate::identity::{Identity, Scope};
use crate::labels::{Label, LabelId, LabelSet, LabelTable};
use crate::policy::{Entity, LabelSelector, PeerSelector};

/// Index of a selector in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SelectorIdx(usize);

#[derive(Debug)]
enum Compiled {
    Fqdn(LabelId),
    Cidr { cidr: IpNet, except: Vec<IpNet> },
    Endpoints(LabelSelector),
    Entity(Entity),
}

#[derive(Debug)]
struct Entry {
    selector: PeerSelector,
    compiled: Compiled,
    refs: u32,
    identities: BTreeSet<Identity>,
}

#[derive(Debug, Default)]
pub(crate) struct SelectorCache {
    slots: Vec<Option<Entry>>,
    free: Vec<usize>,
    index: HashMap<PeerSelector, SelectorIdx>,
    by_fqdn_label: HashMap<LabelId, SelectorIdx>,
    scanned: Vec<SelectorIdx>,
}

impl SelectorCache {
    /// Takes a reference on `selector`, computing its identities from `all` if it is new.
    pub(crate) fn register<'a>(
        &mut self,
        selector: &PeerSelector,
        table: &mut LabelTable,
        all: impl Iterator<Item = (Identity, &'a LabelSet)>,
    ) -> SelectorIdx {
        if let Some(idx) = self.index.get(selector).copied() {
            if let Some(entry) = self.entry_mut(idx) {
                entry.refs += 1;
            }
            return idx;
        }
        let compiled = match selector {
            PeerSelector::Fqdn(key) => Compiled::Fqdn(table.intern(Label::fqdn(key))),
            PeerSelector::Cidr { cidr, except } => Compiled::Cidr {
                cidr: *cidr,
                except: except.clone(),
            },
            PeerSelector::Endpoints(sel) => Compiled::Endpoints(sel.clone()),
            PeerSelector::Entity(entity) => Compiled::Entity(*entity),
        };
        let mut identities: BTreeSet<Identity> = all
            .filter(|(id, labels)| matches(&compiled, *id, labels, table))
            .map(|(id, _)| id)
            .collect();
        if let Compiled::Cidr { cidr, .. } = &compiled
            && cidr.prefix_len() == 0
        {
            identities.insert(Identity::world(matches!(cidr, IpNet::V4(_))));
        }
        if let Compiled::Entity(entity) = &compiled {
            identities.extend(reserved_of(*entity));
        }
        let entry = Entry {
            selector: selector.clone(),
            compiled,
            refs: 1,
            identities,
        };
        let idx = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(entry);
                SelectorIdx(slot)
            }
            None => {
                self.slots.push(Some(entry));
                SelectorIdx(self.slots.len() - 1)
            }
        };
        match self.entry(idx).map(|e| &e.compiled) {
            Some(Compiled::Fqdn(label)) => {
                self.by_fqdn_label.insert(*label, idx);
            }
            _ => self.scanned.push(idx),
        }
        self.index.insert(selector.clone(), idx);
        idx
    }

    /// Drops a reference; the selector is forgotten when none is left.
    pub(crate) fn unregister(&mut self, idx: SelectorIdx) {
        let Some(entry) = self.entry_mut(idx) else {
            return;
        };
        entry.refs = entry.refs.saturating_sub(1);
        if entry.refs > 0 {
            return;
        }
        let Some(entry) = self.slots.get_mut(idx.0).and_then(Option::take) else {
            return;
        };
        self.index.remove(&entry.selector);
        match entry.compiled {
            Compiled::Fqdn(label) => {
                self.by_fqdn_label.remove(&label);
            }
            _ => self.scanned.retain(|i| *i != idx),
        }
        self.free.push(idx.0);
    }

    /// Records a new identity; pushes every selector that now selects it onto `out`.
    pub(crate) fn identity_added(
        &mut self,
        id: Identity,
        labels: &LabelSet,
        table: &LabelTable,
        out: &mut Vec<SelectorIdx>,
    ) {
        let start = out.len();
        for label in labels.iter() {
            if let Some(idx) = self.by_fqdn_label.get(&label) {
                out.push(*idx);
            }
        }
        for idx in &self.scanned {
            if let Some(entry) = self.slots.get(idx.0).and_then(Option::as_ref)
                && matches(&entry.compiled, id, labels, table)
            {
                out.push(*idx);
            }
        }
        for idx in &out[start..] {
            if let Some(entry) = self.slots.get_mut(idx.0).and_then(Option::as_mut) {
                entry.identities.insert(id);
            }
        }
    }

    /// Records a freed identity; pushes every selector that selected it onto `out`.
    pub(crate) fn identity_removed(
        &mut self,
        id: Identity,
        labels: &LabelSet,
        out: &mut Vec<SelectorIdx>,
    ) {
        let start = out.len();
        for label in labels.iter() {
            if let Some(idx) = self.by_fqdn_label.get(&label) {
                out.push(*idx);
            }
        }
        out.extend(self.scanned.iter().copied());
        let mut keep = start;
        for i in start..out.len() {
            let idx = out[i];
            if let Some(entry) = self.slots.get_mut(idx.0).and_then(Option::as_mut)
                && entry.identities.remove(&id)
            {
                out[keep] = idx;
                keep += 1;
            }
        }
        out.truncate(keep);
    }

    /// The identities `idx` selects.
    pub(crate) fn identities(&self, idx: SelectorIdx) -> impl Iterator<Item = Identity> + '_ {
        self.entry(idx)
            .into_iter()
            .flat_map(|e| e.identities.iter().copied())
    }

    /// The index of a registered selector.
    pub(crate) fn lookup(&self, selector: &PeerSelector) -> Option<SelectorIdx> {
        self.index.get(selector).copied()
    }

    /// Every registered selector with its identities.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&PeerSelector, &BTreeSet<Identity>)> + '_ {
        self.slots
            .iter()
            .flatten()
            .map(|e| (&e.selector, &e.identities))
    }

    fn entry(&self, idx: SelectorIdx) -> Option<&Entry> {
        self.slots.get(idx.0).and_then(Option::as_ref)
    }

    fn entry_mut(&mut self, idx: SelectorIdx) -> Option<&mut Entry> {
        self.slots.get_mut(idx.0).and_then(Option::as_mut)
    }
}

const HOST: Identity = Identity::HOST;
const REMOTE_NODE: Identity = Identity::REMOTE_NODE;

/// The reserved identities an entity selects. They are selected whether or not they are
/// allocated (the host's is once the node tells its addresses): a reserved identity's
/// allocation never changes what a selector holds.
pub(crate) fn reserved_of(entity: Entity) -> Vec<Identity> {
    match entity {
        Entity::World => vec![Identity::WORLD_IPV4, Identity::WORLD_IPV6],
        Entity::WorldIpv4 => vec![Identity::WORLD_IPV4],
        Entity::WorldIpv6 => vec![Identity::WORLD_IPV6],
        // `all` is resolved as "any identity"; the selector is never registered for it, but
        // if it were it would hold every reserved number fqdnd uses.
        Entity::All => vec![
            Identity::WORLD_IPV4,
            Identity::WORLD_IPV6,
            HOST,
            REMOTE_NODE,
        ],
        Entity::Host => vec![HOST],
        Entity::Cluster => vec![HOST, REMOTE_NODE],
        Entity::RemoteNode => vec![REMOTE_NODE],
    }
}

fn matches(compiled: &Compiled, id: Identity, labels: &LabelSet, table: &LabelTable) -> bool {
    match compiled {
        Compiled::Entity(entity) => match entity {
            Entity::World => {
                labels.contains(LabelTable::WORLD_IPV4) || labels.contains(LabelTable::WORLD_IPV6)
            }
            Entity::WorldIpv4 => labels.contains(LabelTable::WORLD_IPV4),
            Entity::WorldIpv6 => labels.contains(LabelTable::WORLD_IPV6),
            Entity::All => true,
            // Every endpoint of the cluster: local and remote ones by their cluster-scope
            // number, and in cluster mode a local endpoint still on its temporary identity.
            Entity::Cluster => matches!(id.scope(), Some(Scope::Cluster | Scope::Temporary)),
            Entity::Host | Entity::RemoteNode => false,
        },
        Compiled::Fqdn(label) => labels.contains(*label),
        Compiled::Cidr { cidr, except } => labels.iter().any(|l| match table.label(l) {
            Some(Label::Cidr(net)) => cidr.contains(net) && !except.iter().any(|e| e.contains(net)),
            _ => false,
        }),
        Compiled::Endpoints(sel) => {
            matches!(id.scope(), Some(Scope::Cluster | Scope::Temporary))
                && sel.matches(labels.iter().filter_map(|l| match table.label(l) {
                    Some(Label::Endpoint(el)) => Some(el),
                    _ => None,
                }))
        }
    }
}
