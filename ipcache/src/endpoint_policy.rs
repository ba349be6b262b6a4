//! Per-endpoint policy resolution: which (direction, identity, protocol, ports) each endpoint
//! may reach or be reached by, and which it may not.
//!
//! Rules are resolved into, per endpoint, a multiset of raw [`PolicyKey`]s (several rules may
//! allow the same key) — allows and denies of both directions. What reaches the datapath is
//! the *effective* set derived from it per (direction, identity): the raw keys, plus, for every
//! allow a deny overlaps (a deny of the same identity or of any identity), a deny key for the
//! overlap under the allow's identity — so the datapath's "the peer's identity first, the most
//! specific entry decides" always lets a deny win, as Cilium's deny policies do. A raw change
//! of one identity recomputes that identity's effective keys; a change of a deny of any
//! identity recomputes every identity of its direction.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::datapath::PolicyKey;
use crate::endpoint::{Endpoint, EndpointId};
use crate::identity::Identity;
use crate::policy::{Direction, EgressRule, Entity, PeerSelector, Protocol, Rule};
use crate::selector::SelectorIdx;

/// Protocol and port range of a policy key, without the identity.
pub(crate) type PortTemplate = (Protocol, u16, u16);

/// What one section contributes: a selector (or any peer) on some ports, in one direction,
/// allowing or denying.
pub(crate) struct Contribution<'a> {
    pub(crate) peer: Option<&'a PeerSelector>,
    pub(crate) ports: Vec<PortTemplate>,
    pub(crate) direction: Direction,
    pub(crate) deny: bool,
}

/// The (direction, deny) a user of a selector resolves it in, and its ports.
pub(crate) type Use = (Direction, bool, Vec<PortTemplate>);

fn templates(section: &EgressRule) -> Vec<PortTemplate> {
    let mut ports: Vec<PortTemplate> = section
        .ports
        .iter()
        .flat_map(|p| p.ports.iter())
        .map(|p| {
            let end = if p.protocol.is_icmp() {
                p.port
            } else if p.port == 0 {
                0
            } else {
                p.end_port.max(p.port)
            };
            (p.protocol, p.port, end)
        })
        .collect();
    if ports.is_empty() {
        ports.push((Protocol::Any, 0, 0));
    }
    ports
}

/// Whether the rules put `endpoint` under policy in each direction (egress, ingress), and
/// what they allow and deny it.
pub(crate) fn contributions<'a>(
    rules: &'a [Rule],
    endpoint: &Endpoint,
) -> ([bool; 2], Vec<Contribution<'a>>) {
    let mut enforcing = [false; 2];
    let mut out = Vec::new();
    for rule in rules {
        if !rule.endpoint_selector.matches(endpoint.labels.iter()) {
            continue;
        }
        for (d, direction) in Direction::BOTH.into_iter().enumerate() {
            let (allows, denies, default_deny) = rule.direction(direction);
            enforcing[d] |= default_deny;
            for (sections, deny) in [(allows, false), (denies, true)] {
                for section in sections {
                    let ports = templates(section);
                    if section.peers.is_empty() {
                        out.push(Contribution {
                            peer: None,
                            ports,
                            direction,
                            deny,
                        });
                        continue;
                    }
                    for peer in &section.peers {
                        // `all` is every peer: the same as no peer.
                        let peer = (*peer != PeerSelector::Entity(Entity::All)).then_some(peer);
                        out.push(Contribution {
                            peer,
                            ports: ports.clone(),
                            direction,
                            deny,
                        });
                    }
                }
            }
        }
    }
    (enforcing, out)
}

/// An endpoint's resolved policy.
#[derive(Debug, Default)]
pub(crate) struct EndpointPolicy {
    /// Default deny per direction (egress, ingress).
    pub(crate) enforcing: [bool; 2],
    /// Raw keys with their counts.
    pub(crate) raw: HashMap<PolicyKey, u32>,
    /// Raw keys per (direction, identity).
    by_identity: HashMap<(Direction, Identity), BTreeSet<PolicyKey>>,
    /// What the datapath holds, per (direction, identity).
    pub(crate) effective: HashMap<(Direction, Identity), BTreeSet<PolicyKey>>,
    pub(crate) selectors: Vec<SelectorIdx>,
}

impl EndpointPolicy {
    /// An empty policy with default deny per direction; a direction without it gets an
    /// allow-all entry (denies still apply there).
    pub(crate) fn new(enforcing: [bool; 2]) -> Self {
        let mut policy = Self {
            enforcing,
            ..Self::default()
        };
        for (d, direction) in Direction::BOTH.into_iter().enumerate() {
            if !enforcing[d] {
                policy.add_key(PolicyKey::allow_all(direction), &mut |_, _| {});
            }
        }
        policy
    }

    /// Whether the endpoint's kernel entry must make the datapath look at its policy in
    /// `direction`: default deny, or a deny entry to apply.
    pub(crate) fn under_policy(&self, direction: Direction) -> bool {
        let d = usize::from(direction == Direction::Ingress);
        self.enforcing[d]
            || self
                .effective
                .iter()
                .any(|((dir, _), keys)| *dir == direction && keys.iter().any(|k| k.deny))
    }

    /// Every effective key.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &PolicyKey> + '_ {
        self.effective.values().flatten()
    }

    pub(crate) fn add(
        &mut self,
        identity: Identity,
        ports: &[PortTemplate],
        direction: Direction,
        deny: bool,
        mut changed: impl FnMut(PolicyKey, bool),
    ) {
        for &(protocol, port, end_port) in ports {
            let key = PolicyKey {
                identity,
                protocol,
                port,
                end_port,
                direction,
                deny,
            };
            self.add_key(key, &mut changed);
        }
    }

    pub(crate) fn remove(
        &mut self,
        identity: Identity,
        ports: &[PortTemplate],
        direction: Direction,
        deny: bool,
        mut changed: impl FnMut(PolicyKey, bool),
    ) {
        for &(protocol, port, end_port) in ports {
            let key = PolicyKey {
                identity,
                protocol,
                port,
                end_port,
                direction,
                deny,
            };
            self.remove_key(key, &mut changed);
        }
    }

    fn add_key(&mut self, key: PolicyKey, changed: &mut impl FnMut(PolicyKey, bool)) {
        let count = self.raw.entry(key).or_insert(0);
        *count += 1;
        if *count == 1 {
            self.by_identity
                .entry((key.direction, key.identity))
                .or_default()
                .insert(key);
            self.refresh(key, changed);
        }
    }

    fn remove_key(&mut self, key: PolicyKey, changed: &mut impl FnMut(PolicyKey, bool)) {
        let Some(count) = self.raw.get_mut(&key) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        self.raw.remove(&key);
        let group = (key.direction, key.identity);
        if let Some(set) = self.by_identity.get_mut(&group) {
            set.remove(&key);
            if set.is_empty() {
                self.by_identity.remove(&group);
            }
        }
        self.refresh(key, changed);
    }

    /// Recomputes the effective keys a raw change of `key` may affect.
    fn refresh(&mut self, key: PolicyKey, changed: &mut impl FnMut(PolicyKey, bool)) {
        if key.identity == Identity::ANY && key.deny {
            let groups: Vec<(Direction, Identity)> = self
                .by_identity
                .keys()
                .chain(self.effective.keys())
                .filter(|(d, _)| *d == key.direction)
                .copied()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            for group in groups {
                self.refresh_group(group, changed);
            }
            // The ANY group itself may have no raw keys left.
            self.refresh_group((key.direction, Identity::ANY), changed);
        } else {
            self.refresh_group((key.direction, key.identity), changed);
        }
    }

    fn refresh_group(
        &mut self,
        group: (Direction, Identity),
        changed: &mut impl FnMut(PolicyKey, bool),
    ) {
        let fresh = self.effective_of(group);
        let old = if fresh.is_empty() {
            self.effective.remove(&group).unwrap_or_default()
        } else {
            self.effective
                .insert(group, fresh.clone())
                .unwrap_or_default()
        };
        for k in fresh.difference(&old) {
            changed(*k, true);
        }
        for k in old.difference(&fresh) {
            changed(*k, false);
        }
    }

    /// The effective keys of one (direction, identity): its raw keys, and a deny for every
    /// overlap of one of its allows with a deny of its own or of any identity. An allow and a
    /// deny of the same key: only the deny.
    fn effective_of(&self, group: (Direction, Identity)) -> BTreeSet<PolicyKey> {
        let empty = BTreeSet::new();
        let own = self.by_identity.get(&group).unwrap_or(&empty);
        let any = if group.1 == Identity::ANY {
            &empty
        } else {
            self.by_identity
                .get(&(group.0, Identity::ANY))
                .unwrap_or(&empty)
        };
        let denies: Vec<&PolicyKey> = own.iter().chain(any).filter(|k| k.deny).collect();
        let mut out: BTreeSet<PolicyKey> = own.iter().filter(|k| k.deny).copied().collect();
        for allow in own.iter().filter(|k| !k.deny) {
            let mut shadowed = false;
            for deny in &denies {
                if let Some(overlap) = allow.intersect(deny) {
                    shadowed |= overlap == *allow;
                    out.insert(PolicyKey {
                        deny: true,
                        ..overlap
                    });
                }
            }
            if !shadowed {
                out.insert(*allow);
            }
        }
        out
    }
}

/// Every endpoint's resolved policy and who uses which selector.
#[derive(Debug, Default)]
pub(crate) struct PolicyState {
    pub(crate) endpoints: BTreeMap<EndpointId, EndpointPolicy>,
    pub(crate) users: HashMap<SelectorIdx, Vec<(EndpointId, Use)>>,
}

impl PolicyState {
    /// A selector started (`gained`) or stopped selecting `identity`: every endpoint using it
    /// adjusts its key counts; `changed` hears each key that appears or disappears.
    pub(crate) fn selector_changed(
        &mut self,
        idx: SelectorIdx,
        identity: Identity,
        gained: bool,
        mut changed: impl FnMut(EndpointId, PolicyKey, bool),
    ) {
        let Some(users) = self.users.get(&idx) else {
            return;
        };
        for (ep, (direction, deny, ports)) in users {
            if let Some(policy) = self.endpoints.get_mut(ep) {
                let report = |k, up| changed(*ep, k, up);
                if gained {
                    policy.add(identity, ports, *direction, *deny, report);
                } else {
                    policy.remove(identity, ports, *direction, *deny, report);
                }
            }
        }
    }
}
