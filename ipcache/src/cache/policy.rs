//! What policy is made of and what follows from it: the endpoints, the node's own addresses
//! (the host identity) and the rules in, then the policy CIDRs' labels, the FQDN selectors'
//! pre-allocated identities and every endpoint's policy (rebuilt and diffed into pending
//! changes); and the read side of per-endpoint policy and the selector cache.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::IpCache;
use crate::datapath::{Datapath, PolicyKey};
use crate::endpoint::{Endpoint, EndpointId};
use crate::endpoint_policy::{EndpointPolicy, Use, contributions};
use crate::error::Error;
use crate::identity::{Identity, Scope};
use crate::labels::{Label, LabelId, LabelSet, LabelTable};
use crate::metadata::{OwnerKind, ResourceOwner, host_prefix};
use crate::policy::{Direction, PeerSelector, Rule};
use crate::selector::SelectorIdx;

impl<D: Datapath> IpCache<D> {
    /// Replaces the endpoints (or client groups). Unchanged endpoints keep their identities.
    pub fn set_endpoints(&mut self, endpoints: Vec<Endpoint>) -> Result<(), Error> {
        let mut touched = BTreeSet::new();
        for old in self.endpoints.values() {
            let owner = self.meta.owners.intern(&endpoint_owner(old.id));
            let owner = owner.ok_or(Error::OwnersExhausted)?;
            for addr in &old.addresses {
                if self.meta.remove(addr.trunc(), owner).is_some() {
                    touched.insert(addr.trunc());
                }
            }
        }
        for ep in &endpoints {
            let owner = self.owner_by_value(&endpoint_owner(ep.id))?;
            let labels: Arc<LabelSet> = Arc::new(
                ep.labels
                    .iter()
                    .map(|l| self.labels.intern(Label::Endpoint(l.clone())))
                    .collect(),
            );
            for addr in &ep.addresses {
                self.meta.upsert(addr.trunc(), owner, labels.clone());
                touched.insert(addr.trunc());
            }
        }
        self.meta.owners.forget_unclaimed_interned();
        self.endpoints = endpoints.into_iter().map(|ep| (ep.id, ep)).collect();
        for prefix in touched {
            self.resolve(prefix)?;
        }
        self.rebuild_policy();
        Ok(())
    }

    /// Replaces the node's own addresses: each gets the host identity (`reserved:host`, 1),
    /// which `toEntities`/`fromEntities` `host` and `cluster` select, unless an endpoint
    /// claims it. Returns whether anything changed; [`IpCache::commit`] writes it.
    ///
    /// An address that would need a new datapath entry when the datapath's room
    /// ([`Config::datapath_prefixes`](crate::Config::datapath_prefixes)) is used up is left
    /// out (it stays what it was, the world if nothing else): endpoints, policy CIDRs and
    /// learned names, there first, keep their entries. A warning names such addresses when they change; they are tried again at
    /// the next call.
    pub fn set_host_addresses(
        &mut self,
        addresses: impl IntoIterator<Item = IpAddr>,
    ) -> Result<bool, Error> {
        let wanted: BTreeSet<IpNet> = addresses.into_iter().map(host_prefix).collect();
        if wanted == self.host {
            self.host_no_room.clear();
            return Ok(false);
        }
        let mut changed = false;
        // The addresses gone first: their room goes to the new ones.
        let gone: Vec<IpNet> = self.host.difference(&wanted).copied().collect();
        for gone in gone {
            self.host.remove(&gone);
            changed = true;
            let owner = self.owner_by_value(&host_owner(&gone))?;
            if self.meta.remove(gone, owner).is_some() {
                self.resolve(gone)?;
            }
        }
        self.meta.owners.forget_unclaimed_interned();
        let mut no_room = BTreeSet::new();
        let new: Vec<IpNet> = wanted.difference(&self.host).copied().collect();
        for new in new {
            let family = usize::from(matches!(new, IpNet::V6(_)));
            let has_entry = self.meta.get(&new).is_some_and(|e| e.identity().is_some());
            if !has_entry
                && self
                    .config
                    .datapath_prefixes
                    .is_some_and(|room| self.written[family] >= room)
            {
                no_room.insert(new);
                continue;
            }
            let owner = self.owner_by_value(&host_owner(&new))?;
            self.meta.upsert(new, owner, Arc::new(LabelSet::new()));
            self.host.insert(new);
            changed = true;
            self.resolve(new)?;
        }
        if no_room != self.host_no_room {
            if !no_room.is_empty() {
                let left: Vec<String> = no_room.iter().map(|p| p.addr().to_string()).collect();
                tracing::warn!(
                    addresses = %left.join(", "),
                    "the datapath's ipcache is full: these node addresses are not the host identity (they stay the world's)"
                );
            }
            self.host_no_room = no_room;
        }
        Ok(changed)
    }

    /// The node's own addresses ([`IpCache::set_host_addresses`]).
    pub fn host_addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.host.iter().map(IpNet::addr)
    }

    /// Replaces the policy rules: CIDR labels, pre-allocated FQDN identities, selectors and
    /// every endpoint's policy follow.
    pub fn set_policy(&mut self, rules: Vec<Rule>) -> Result<(), Error> {
        self.rules = rules;
        self.sync_policy_cidrs()?;
        self.sync_preallocation()?;
        self.rebuild_policy();
        Ok(())
    }

    fn sync_policy_cidrs(&mut self) -> Result<(), Error> {
        let wanted: BTreeSet<IpNet> = self
            .rules
            .iter()
            .flat_map(Rule::peers)
            .filter_map(|p| match p {
                PeerSelector::Cidr { cidr, except } => Some(std::iter::once(cidr).chain(except)),
                _ => None,
            })
            .flatten()
            .map(IpNet::trunc)
            .collect();
        let mut affected = BTreeSet::new();
        for gone in self.policy_cidrs.difference(&wanted) {
            self.meta.clear_cidr_label(gone);
            let owner = self.meta.owners.intern(&policy_owner(gone));
            if let Some(owner) = owner {
                self.meta.remove(*gone, owner);
            }
            affected.insert(*gone);
        }
        for new in wanted.difference(&self.policy_cidrs) {
            let label = self.labels.intern(Label::Cidr(*new));
            self.meta.set_cidr_label(*new, label);
            let owner = self.meta.owners.intern(&policy_owner(new));
            let owner = owner.ok_or(Error::OwnersExhausted)?;
            self.meta.upsert(*new, owner, Arc::new(LabelSet::new()));
            affected.insert(*new);
        }
        self.meta.owners.forget_unclaimed_interned();
        self.policy_cidrs = wanted;
        let mut prefixes = BTreeSet::new();
        for cidr in affected {
            prefixes.extend(self.meta.descendants(cidr));
            prefixes.insert(cidr);
        }
        for prefix in prefixes {
            self.resolve(prefix)?;
        }
        Ok(())
    }

    fn sync_preallocation(&mut self) -> Result<(), Error> {
        let wanted: BTreeSet<LabelId> = if self.config.preallocate_fqdn_identities {
            let keys: BTreeSet<String> = self.fqdn_selector_keys().into_iter().collect();
            keys.iter()
                .map(|k| self.labels.intern(Label::fqdn(k)))
                .collect()
        } else {
            BTreeSet::new()
        };
        let gone: Vec<LabelId> = self
            .preallocated
            .keys()
            .filter(|l| !wanted.contains(l))
            .copied()
            .collect();
        for label in gone {
            if let Some(ids) = self.preallocated.remove(&label) {
                for id in ids {
                    self.identities().release(id);
                }
            }
        }
        for label in wanted {
            if self.preallocated.contains_key(&label) {
                continue;
            }
            let mut ids = [Identity::ANY; 2];
            for (slot, world) in [LabelTable::WORLD_IPV4, LabelTable::WORLD_IPV6]
                .into_iter()
                .enumerate()
            {
                let set: LabelSet = [label, world].into_iter().collect();
                ids[slot] = self.identities().acquire(&set, Scope::Local, false)?;
            }
            self.preallocated.insert(label, ids);
        }
        Ok(())
    }

    /// Re-resolves every endpoint's policy from the rules and diffs it into pending changes.
    fn rebuild_policy(&mut self) {
        let mut fresh: BTreeMap<EndpointId, EndpointPolicy> = BTreeMap::new();
        let mut users: HashMap<SelectorIdx, Vec<(EndpointId, Use)>> = HashMap::new();
        for endpoint in self.endpoints.values() {
            let (enforcing, contribs) = contributions(&self.rules, endpoint);
            let mut policy = EndpointPolicy::new(enforcing);
            for contrib in contribs {
                let d = usize::from(contrib.direction == Direction::Ingress);
                if !contrib.deny && !enforcing[d] {
                    // allows add nothing to an allow-all direction
                    continue;
                }
                match contrib.peer {
                    None => policy.add(
                        Identity::ANY,
                        &contrib.ports,
                        contrib.direction,
                        contrib.deny,
                        |_, _| {},
                    ),
                    Some(peer) => {
                        let all = self.alloc.iter().map(|(id, labels, _)| (id, labels));
                        let idx = self.selectors.register(peer, &mut self.labels, all);
                        policy.selectors.push(idx);
                        let ids: Vec<Identity> = self.selectors.identities(idx).collect();
                        for id in ids {
                            policy.add(
                                id,
                                &contrib.ports,
                                contrib.direction,
                                contrib.deny,
                                |_, _| {},
                            );
                        }
                        users.entry(idx).or_default().push((
                            endpoint.id,
                            (contrib.direction, contrib.deny, contrib.ports),
                        ));
                    }
                }
            }
            fresh.insert(endpoint.id, policy);
        }
        let old = std::mem::take(&mut self.policy.endpoints);
        for (ep, policy) in &old {
            let new_entries: BTreeSet<&PolicyKey> = fresh
                .get(ep)
                .map(|p| p.keys().collect())
                .unwrap_or_default();
            for key in policy.keys() {
                if !new_entries.contains(key) {
                    self.pending.policy_change(*ep, *key, false);
                }
            }
        }
        for (ep, policy) in &fresh {
            let old_entries: BTreeSet<&PolicyKey> =
                old.get(ep).map(|p| p.keys().collect()).unwrap_or_default();
            for key in policy.keys() {
                if !old_entries.contains(key) {
                    self.pending.policy_change(*ep, *key, true);
                }
            }
        }
        for idx in old.values().flat_map(|p| &p.selectors) {
            self.selectors.unregister(*idx);
        }
        self.policy.endpoints = fresh;
        self.policy.users = users;
    }
}

impl<D> IpCache<D> {
    /// The FQDN selector keys the current policy uses, sorted and deduplicated.
    pub fn fqdn_selector_keys(&self) -> Vec<String> {
        let keys: BTreeSet<&String> = self
            .rules
            .iter()
            .flat_map(Rule::peers)
            .filter_map(|p| match p {
                PeerSelector::Fqdn(key) => Some(key),
                _ => None,
            })
            .collect();
        keys.into_iter().cloned().collect()
    }

    /// The identities a peer selector selects (empty if policy does not use it).
    pub fn selected(&self, selector: &PeerSelector) -> Vec<Identity> {
        self.selectors
            .lookup(selector)
            .map(|idx| self.selectors.identities(idx).collect())
            .unwrap_or_default()
    }

    /// Every selector in use with the identities it selects.
    pub fn selectors(&self) -> impl Iterator<Item = (&PeerSelector, &BTreeSet<Identity>)> + '_ {
        self.selectors.iter()
    }

    /// An endpoint's egress policy keys as the datapath holds them, sorted; `None` for an
    /// unknown endpoint.
    pub fn endpoint_policy(&self, endpoint: EndpointId) -> Option<Vec<PolicyKey>> {
        self.endpoint_policy_dir(endpoint, Direction::Egress)
    }

    /// An endpoint's policy keys of one direction as the datapath holds them (allows, denies
    /// and the denies derived from overlaps), sorted; `None` for an unknown endpoint.
    pub fn endpoint_policy_dir(
        &self,
        endpoint: EndpointId,
        direction: Direction,
    ) -> Option<Vec<PolicyKey>> {
        self.policy.endpoints.get(&endpoint).map(|p| {
            let mut keys: Vec<PolicyKey> = p
                .keys()
                .filter(|k| k.direction == direction)
                .copied()
                .collect();
            keys.sort();
            keys
        })
    }

    /// Whether an endpoint is under egress policy (default deny); `None` if unknown.
    pub fn endpoint_enforcing(&self, endpoint: EndpointId) -> Option<bool> {
        self.policy.endpoints.get(&endpoint).map(|p| p.enforcing[0])
    }

    /// Whether the datapath must look at an endpoint's policy in `direction` (default deny
    /// there, or a deny to apply); `None` if unknown. This is the kernel's enforce flag.
    pub fn endpoint_under_policy(
        &self,
        endpoint: EndpointId,
        direction: Direction,
    ) -> Option<bool> {
        self.policy
            .endpoints
            .get(&endpoint)
            .map(|p| p.under_policy(direction))
    }

    /// The endpoints, by id.
    pub fn endpoints(&self) -> &BTreeMap<EndpointId, Endpoint> {
        &self.endpoints
    }

    /// The policy rules in force.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }
}

fn host_owner(prefix: &IpNet) -> ResourceOwner {
    ResourceOwner {
        kind: OwnerKind::Host,
        name: Arc::from(prefix.addr().to_string()),
    }
}

fn endpoint_owner(id: EndpointId) -> ResourceOwner {
    ResourceOwner {
        kind: OwnerKind::Endpoint,
        name: Arc::from(id.to_string()),
    }
}

fn policy_owner(cidr: &IpNet) -> ResourceOwner {
    ResourceOwner {
        kind: OwnerKind::Policy,
        name: Arc::from(cidr.to_string()),
    }
}
