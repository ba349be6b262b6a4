//! Per-endpoint policy resolution: which (identity, protocol, ports) each endpoint may reach.
//!
//! Rules are resolved into, per endpoint, a multiset of [`PolicyKey`]s (several rules may
//! allow the same key). Selector changes adjust the counts incrementally; a key reaches the
//! datapath when its count leaves zero and leaves it when the count returns to zero.

use std::collections::{BTreeMap, HashMap};

use crate::datapath::PolicyKey;
use crate::endpoint::{Endpoint, EndpointId};
use crate::identity::Identity;
use crate::policy::{PeerSelector, Protocol, Rule};
use crate::selector::SelectorIdx;

/// Protocol and port range of a policy key, without the identity.
pub(crate) type PortTemplate = (Protocol, u16, u16);

/// What one egress section contributes: a selector (or any destination) on some ports.
pub(crate) struct Contribution<'a> {
    pub(crate) peer: Option<&'a PeerSelector>,
    pub(crate) ports: Vec<PortTemplate>,
}

/// Whether the rules put `endpoint` under egress policy, and what they allow it.
pub(crate) fn contributions<'a>(
    rules: &'a [Rule],
    endpoint: &Endpoint,
) -> (bool, Vec<Contribution<'a>>) {
    let mut enforcing = false;
    let mut out = Vec::new();
    for rule in rules {
        if !rule.endpoint_selector.matches(endpoint.labels.iter()) {
            continue;
        }
        enforcing |= rule.default_deny_egress;
        for egress in &rule.egress {
            let mut ports: Vec<PortTemplate> = egress
                .ports
                .iter()
                .flat_map(|p| p.ports.iter())
                .map(|p| {
                    (
                        p.protocol,
                        p.port,
                        if p.port == 0 {
                            0
                        } else {
                            p.end_port.max(p.port)
                        },
                    )
                })
                .collect();
            if ports.is_empty() {
                ports.push((Protocol::Any, 0, 0));
            }
            if egress.peers.is_empty() {
                out.push(Contribution { peer: None, ports });
            } else {
                for peer in &egress.peers {
                    out.push(Contribution {
                        peer: Some(peer),
                        ports: ports.clone(),
                    });
                }
            }
        }
    }
    (enforcing, out)
}

/// An endpoint's resolved policy.
#[derive(Debug, Default)]
pub(crate) struct EndpointPolicy {
    pub(crate) enforcing: bool,
    pub(crate) entries: HashMap<PolicyKey, u32>,
    pub(crate) selectors: Vec<SelectorIdx>,
}

impl EndpointPolicy {
    pub(crate) fn add(
        &mut self,
        identity: Identity,
        ports: &[PortTemplate],
        mut changed: impl FnMut(PolicyKey, bool),
    ) {
        for &(protocol, port, end_port) in ports {
            let key = PolicyKey {
                identity,
                protocol,
                port,
                end_port,
            };
            let count = self.entries.entry(key).or_insert(0);
            *count += 1;
            if *count == 1 {
                changed(key, true);
            }
        }
    }

    pub(crate) fn remove(
        &mut self,
        identity: Identity,
        ports: &[PortTemplate],
        mut changed: impl FnMut(PolicyKey, bool),
    ) {
        for &(protocol, port, end_port) in ports {
            let key = PolicyKey {
                identity,
                protocol,
                port,
                end_port,
            };
            if let Some(count) = self.entries.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    self.entries.remove(&key);
                    changed(key, false);
                }
            }
        }
    }
}

/// Every endpoint's resolved policy and who uses which selector.
#[derive(Debug, Default)]
pub(crate) struct PolicyState {
    pub(crate) endpoints: BTreeMap<EndpointId, EndpointPolicy>,
    pub(crate) users: HashMap<SelectorIdx, Vec<(EndpointId, Vec<PortTemplate>)>>,
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
        for (ep, ports) in users {
            if let Some(policy) = self.endpoints.get_mut(ep) {
                let report = |k, up| changed(*ep, k, up);
                if gained {
                    policy.add(identity, ports, report);
                } else {
                    policy.remove(identity, ports, report);
                }
            }
        }
    }
}
