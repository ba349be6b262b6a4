//! The interfaces the programs are attached to, and the endpoint entries, source addresses,
//! bridges and client prefixes written for them: brought to what the configuration wants,
//! and cleared of what an earlier run left. The logic runs over [`InterfaceOps`] — the kernel
//! ([`Real`]: the loaded programs and the pinned maps), or in tests a model of it — so every
//! reconciliation is tested without root.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::path::Path;

use crate::{Context, Result};
use fqdnd_ebpf::{EndpointEntry, EndpointFlags, KernelDatapath, Loaded};
use fqdnd_ipcache::EndpointId;
use ipnet::IpNet;

use super::{Attached, Enforcing, Wanted};

/// What reconciling interfaces does to the kernel.
pub trait InterfaceOps {
    /// The index of interface `name`.
    fn ifindex(&self, name: &str) -> Result<u32>;
    /// The bridge interface `name` is a port of, if any.
    fn bridge_of(&self, name: &str) -> Option<String>;
    /// Attaches the programs to `name` (or replaces them in place).
    fn attach(&mut self, name: &str) -> Result<()>;
    /// Detaches the programs from `name`.
    fn detach(&mut self, name: &str) -> Result<()>;
    /// The interfaces whose links are pinned (by this run or an earlier one).
    fn pinned_links(&self) -> Vec<String>;
    /// Writes the sources an endpoint's packets may have.
    fn set_endpoint_addresses(
        &mut self,
        ifindex: u32,
        id: EndpointId,
        addresses: &[IpAddr],
    ) -> Result<()>;
    /// Writes an interface's endpoint entry.
    fn set_endpoint(&mut self, ifindex: u32, id: EndpointId, flags: EndpointFlags) -> Result<()>;
    /// Removes an interface's entry and its source addresses.
    fn remove_endpoint(&mut self, ifindex: u32) -> Result<()>;
    /// Writes a bridge's entry.
    fn set_bridge(&mut self, ifindex: u32) -> Result<()>;
    /// Writes a by-source (LAN) interface's entry; sources no prefix holds are dropped.
    fn set_interface_by_source(&mut self, ifindex: u32) -> Result<()>;
    /// Every interface entry.
    fn endpoint_entries(&self) -> Result<Vec<EndpointEntry>>;
    /// Every (interface, endpoint, source address) written.
    fn endpoint_addresses(&self) -> Result<Vec<(u32, EndpointId, IpAddr)>>;
    /// Every client prefix.
    fn client_entries(&self) -> Result<Vec<(IpNet, EndpointId, EndpointFlags)>>;
    /// Writes a client prefix.
    fn set_client_prefix(
        &mut self,
        prefix: IpNet,
        id: EndpointId,
        flags: EndpointFlags,
    ) -> Result<()>;
    /// Removes a client prefix.
    fn remove_client_prefix(&mut self, prefix: IpNet) -> Result<()>;
}

/// The kernel: the loaded programs and a handle on the pinned maps.
pub(super) struct Real<'a> {
    pub(super) loaded: &'a mut Loaded,
    pub(super) maps: &'a mut KernelDatapath,
    pub(super) pin_dir: &'a Path,
}

impl InterfaceOps for Real<'_> {
    fn ifindex(&self, name: &str) -> Result<u32> {
        super::ifindex(name)
    }
    fn bridge_of(&self, name: &str) -> Option<String> {
        crate::links::link_info(name).bridge().map(str::to_owned)
    }
    fn attach(&mut self, name: &str) -> Result<()> {
        Ok(self.loaded.attach(name)?)
    }
    fn detach(&mut self, name: &str) -> Result<()> {
        Ok(self.loaded.detach(name)?)
    }
    fn pinned_links(&self) -> Vec<String> {
        fqdnd_ebpf::attached_interfaces(self.pin_dir)
    }
    fn set_endpoint_addresses(
        &mut self,
        ifindex: u32,
        id: EndpointId,
        addresses: &[IpAddr],
    ) -> Result<()> {
        Ok(self.maps.set_endpoint_addresses(ifindex, id, addresses)?)
    }
    fn set_endpoint(&mut self, ifindex: u32, id: EndpointId, flags: EndpointFlags) -> Result<()> {
        Ok(self.maps.set_endpoint(ifindex, id, flags)?)
    }
    fn remove_endpoint(&mut self, ifindex: u32) -> Result<()> {
        Ok(self.maps.remove_endpoint(ifindex)?)
    }
    fn set_bridge(&mut self, ifindex: u32) -> Result<()> {
        Ok(self.maps.set_bridge(ifindex)?)
    }
    fn set_interface_by_source(&mut self, ifindex: u32) -> Result<()> {
        Ok(self.maps.set_interface_by_source(ifindex, true)?)
    }
    fn endpoint_entries(&self) -> Result<Vec<EndpointEntry>> {
        Ok(self.maps.endpoint_entries()?)
    }
    fn endpoint_addresses(&self) -> Result<Vec<(u32, EndpointId, IpAddr)>> {
        Ok(self.maps.endpoint_addresses()?)
    }
    fn client_entries(&self) -> Result<Vec<(IpNet, EndpointId, EndpointFlags)>> {
        Ok(self.maps.client_entries()?)
    }
    fn set_client_prefix(
        &mut self,
        prefix: IpNet,
        id: EndpointId,
        flags: EndpointFlags,
    ) -> Result<()> {
        Ok(self.maps.set_client_prefix(prefix, id, flags)?)
    }
    fn remove_client_prefix(&mut self, prefix: IpNet) -> Result<()> {
        Ok(self.maps.remove_client_prefix(prefix)?)
    }
}

/// What this run attached and wrote.
#[derive(Debug, Default)]
pub struct Interfaces {
    /// Interface name → what is attached there.
    attached: BTreeMap<String, Attached>,
    /// Gateway LAN interfaces (by source) attached, name → index.
    lan: BTreeMap<String, u32>,
    /// Node: bridges whose ports are endpoints, attached, name → index.
    bridges: BTreeMap<String, u32>,
    /// Client prefixes written, with what they were written with.
    clients: BTreeMap<IpNet, (EndpointId, EndpointFlags)>,
}

impl Interfaces {
    /// The interfaces attached, with their endpoints.
    pub fn attached(&self) -> &BTreeMap<String, Attached> {
        &self.attached
    }

    /// Makes the kernel match `wanted`: writes each endpoint's addresses (the only sources
    /// its packets may have) and its endpoint entry, attaches (or replaces in place) the
    /// programs on its interface, then removes the endpoints and links no longer wanted,
    /// including what an earlier run left (its links, and the entries of endpoints this run
    /// does not have: [`Self::remove_stale_entries`]). Stops at the first failure; what was
    /// applied stays applied and the next sync retries the rest.
    pub fn sync(&mut self, ops: &mut impl InterfaceOps, wanted: &[Wanted]) -> Result<()> {
        for w in wanted {
            let index = ops.ifindex(&w.interface)?;
            let mut addresses = w.addresses.clone();
            addresses.sort();
            addresses.dedup();
            let bridge = match self.attached.get(&w.interface) {
                Some(old) if old.ifindex == index => old.bridge.clone(),
                _ => ops.bridge_of(&w.interface),
            };
            let entry = Attached {
                id: w.id,
                ifindex: index,
                enforcing: w.enforcing,
                addresses,
                bridge,
            };
            if self.attached.get(&w.interface) == Some(&entry) {
                continue;
            }
            if let Some(old) = self.attached.get(&w.interface)
                && old.ifindex != index
            {
                // The interface was recreated under the same name.
                let _ = ops.remove_endpoint(old.ifindex);
            }
            let flags = EndpointFlags {
                enforce_egress: w.enforcing.egress,
                redirect_dns: true,
                check_source: true,
                enforce_ingress: w.enforcing.ingress,
            };
            if entry.addresses.is_empty() {
                tracing::warn!(endpoint = %w.id, interface = %w.interface, "endpoint has no `addresses`: every packet from it is dropped as spoofed");
            }
            // Addresses first (new ones in before old ones out), then the endpoint entry: the
            // program passes traffic of unknown interfaces, so the entry must be there when
            // it starts seeing packets, and drops sources it does not know.
            ops.set_endpoint_addresses(index, w.id, &entry.addresses)
                .with_context(|| {
                    format!(
                        "writing the addresses of endpoint {} on {}",
                        w.id, w.interface
                    )
                })?;
            ops.set_endpoint(index, w.id, flags)
                .with_context(|| format!("registering endpoint {} on {}", w.id, w.interface))?;
            if !self.attached.contains_key(&w.interface) {
                ops.attach(&w.interface)
                    .with_context(|| format!("attaching the programs to {}", w.interface))?;
                tracing::info!(endpoint = %w.id, interface = %w.interface, ifindex = index, egress = w.enforcing.egress, ingress = w.enforcing.ingress, "endpoint attached");
            } else {
                tracing::info!(endpoint = %w.id, interface = %w.interface, egress = w.enforcing.egress, ingress = w.enforcing.ingress, "endpoint updated");
            }
            self.attached.insert(w.interface.clone(), entry);
        }
        let keep: HashSet<&str> = wanted.iter().map(|w| w.interface.as_str()).collect();
        let gone: Vec<String> = self
            .attached
            .keys()
            .filter(|name| !keep.contains(name.as_str()))
            .cloned()
            .collect();
        for name in gone {
            if let Some(old) = self.attached.remove(&name) {
                Self::detach(ops, &name, Some(old.ifindex))?;
            }
        }
        self.sync_bridges(ops)?;
        // Links pinned by an earlier run for interfaces no longer configured.
        for name in ops.pinned_links() {
            if !keep.contains(name.as_str())
                && !self.lan.contains_key(&name)
                && !self.bridges.contains_key(&name)
            {
                let index = ops.ifindex(&name).ok();
                Self::detach(ops, &name, index)?;
            }
        }
        self.remove_stale_entries(ops)
    }

    /// Removes the endpoint entries (and their source addresses) of interfaces that are no
    /// endpoint or bridge of this run, and the bridged endpoints' client prefixes this run did
    /// not write: what an earlier run left for an endpoint that went while no agent ran (a
    /// container removed meanwhile: its interface, and its link, went with it, and the
    /// entries were keyed by the gone interface's index, which a new interface may get).
    /// By-source interfaces' entries and prefixes (an enforcing gateway's) are left alone.
    fn remove_stale_entries(&mut self, ops: &mut impl InterfaceOps) -> Result<()> {
        let ours: HashSet<u32> = self.attached.values().map(|a| a.ifindex).collect();
        let bridges: HashSet<u32> = self.bridges.values().copied().collect();
        let mut stale: BTreeMap<u32, Option<EndpointId>> = BTreeMap::new();
        for entry in ops.endpoint_entries()? {
            match entry {
                EndpointEntry::Endpoint { ifindex, id, .. } if !ours.contains(&ifindex) => {
                    stale.insert(ifindex, Some(id));
                }
                EndpointEntry::Bridge { ifindex } if !bridges.contains(&ifindex) => {
                    stale.insert(ifindex, None);
                }
                _ => {}
            }
        }
        for (ifindex, id, _) in ops.endpoint_addresses()? {
            if !ours.contains(&ifindex) {
                stale.entry(ifindex).or_insert(Some(id));
            }
        }
        let prefixes: Vec<(IpNet, EndpointId)> = ops
            .client_entries()?
            .into_iter()
            .filter(|(prefix, _, flags)| {
                flags.redirect_dns && !flags.enforce_egress && !self.clients.contains_key(prefix)
            })
            .map(|(prefix, id, _)| (prefix, id))
            .collect();
        for (&ifindex, id) in &stale {
            ops.remove_endpoint(ifindex).with_context(|| {
                format!("removing the stale endpoint entry of interface index {ifindex}")
            })?;
            match id {
                Some(id) => {
                    tracing::info!(endpoint = %id, ifindex, "kernel entries of an endpoint this agent does not have removed (an earlier run's: its interface is gone)");
                }
                None => {
                    tracing::info!(ifindex, "an earlier run's bridge entry removed");
                }
            }
        }
        for (prefix, id) in prefixes {
            ops.remove_client_prefix(prefix)
                .with_context(|| format!("removing the stale client prefix {prefix}"))?;
            tracing::info!(endpoint = %id, prefix = %prefix, "an earlier run's bridged DNS redirect of an endpoint this agent does not have removed");
        }
        Ok(())
    }

    /// The bridges whose ports are endpoints. A DNS query's socket assignment made at the
    /// port does not survive the bridge (it passes the frame up to the IP layer as a packet of
    /// the bridge device), so the bridge's ingress assigns it again, for the bridged
    /// endpoints' addresses (client prefixes with `redirect_dns`; the port checked the source
    /// against them). Prefixes first, then the bridge's entry and programs.
    fn sync_bridges(&mut self, ops: &mut impl InterfaceOps) -> Result<()> {
        let mut prefixes = BTreeMap::new();
        let mut bridges = BTreeSet::new();
        for a in self.attached.values() {
            let Some(bridge) = &a.bridge else { continue };
            bridges.insert(bridge.clone());
            let flags = EndpointFlags {
                enforce_egress: false,
                redirect_dns: true,
                check_source: false,
                enforce_ingress: false,
            };
            for addr in &a.addresses {
                prefixes.insert(IpNet::from(*addr), (a.id, flags));
            }
        }
        self.sync_clients(ops, prefixes)?;
        for name in &bridges {
            if self.bridges.contains_key(name) {
                continue;
            }
            let index = ops.ifindex(name)?;
            ops.set_bridge(index)
                .with_context(|| format!("registering bridge {name}"))?;
            ops.attach(name)
                .with_context(|| format!("attaching the programs to bridge {name}"))?;
            tracing::info!(bridge = %name, ifindex = index, "DNS of the bridge's endpoint ports redirected at the bridge");
            self.bridges.insert(name.clone(), index);
        }
        let gone: Vec<(String, u32)> = self
            .bridges
            .iter()
            .filter(|(name, _)| !bridges.contains(*name))
            .map(|(name, index)| (name.clone(), *index))
            .collect();
        for (name, index) in gone {
            Self::detach(ops, &name, Some(index))?;
            self.bridges.remove(&name);
        }
        Ok(())
    }

    /// Makes the client prefixes (by-source endpoints) exactly `wanted`.
    fn sync_clients(
        &mut self,
        ops: &mut impl InterfaceOps,
        wanted: BTreeMap<IpNet, (EndpointId, EndpointFlags)>,
    ) -> Result<()> {
        for (prefix, entry) in &wanted {
            if self.clients.get(prefix) != Some(entry) {
                ops.set_client_prefix(*prefix, entry.0, entry.1)
                    .with_context(|| format!("writing client prefix {prefix}"))?;
                self.clients.insert(*prefix, *entry);
            }
        }
        let stale: Vec<IpNet> = self
            .clients
            .keys()
            .filter(|p| !wanted.contains_key(p))
            .copied()
            .collect();
        for prefix in stale {
            ops.remove_client_prefix(prefix)
                .with_context(|| format!("removing client prefix {prefix}"))?;
            self.clients.remove(&prefix);
        }
        Ok(())
    }

    fn detach(ops: &mut impl InterfaceOps, name: &str, index: Option<u32>) -> Result<()> {
        if let Some(index) = index {
            ops.remove_endpoint(index)
                .with_context(|| format!("removing the endpoint entry of {name}"))?;
        }
        ops.detach(name)
            .with_context(|| format!("detaching the programs from {name}"))?;
        tracing::info!(interface = %name, "endpoint detached");
        Ok(())
    }

    /// Gateway: attaches the programs to each LAN interface, where endpoints are client
    /// groups found by source prefix (a source in no group is dropped), and writes every
    /// client prefix. Prefixes first, then the interface entry, then the programs: a packet
    /// is never judged before its group is known.
    pub fn sync_gateway(
        &mut self,
        ops: &mut impl InterfaceOps,
        interfaces: &[String],
        clients: &[(IpNet, EndpointId, Enforcing)],
    ) -> Result<()> {
        let mut wanted = BTreeMap::new();
        for &(prefix, id, enforcing) in clients {
            let flags = EndpointFlags {
                enforce_egress: enforcing.egress,
                redirect_dns: false,
                check_source: false,
                enforce_ingress: enforcing.ingress,
            };
            wanted.insert(prefix.trunc(), (id, flags));
        }
        self.sync_clients(ops, wanted)?;
        for name in interfaces {
            if self.lan.contains_key(name) {
                continue;
            }
            let index = ops.ifindex(name)?;
            ops.set_interface_by_source(index)
                .with_context(|| format!("registering LAN interface {name}"))?;
            ops.attach(name)
                .with_context(|| format!("attaching the programs to {name}"))?;
            tracing::info!(interface = %name, ifindex = index, "LAN interface enforced");
            self.lan.insert(name.clone(), index);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::bail;

    /// The kernel as the reconciler sees it: interfaces (name → index, bridge), the pinned
    /// links, and the maps. It outlives an [`Interfaces`], as the kernel outlives a run.
    #[derive(Debug, Default)]
    struct Model {
        interfaces: BTreeMap<String, (u32, Option<String>)>,
        links: BTreeSet<String>,
        endpoints: BTreeMap<u32, EndpointEntry>,
        addresses: BTreeSet<(u32, EndpointId, IpAddr)>,
        clients: BTreeMap<IpNet, (EndpointId, EndpointFlags)>,
    }

    impl Model {
        fn interface(&mut self, name: &str, index: u32, bridge: Option<&str>) {
            self.interfaces
                .insert(name.into(), (index, bridge.map(Into::into)));
        }

        /// An interface gone (a container removed): its links go with it.
        fn remove_interface(&mut self, name: &str) {
            self.interfaces.remove(name);
            self.links.remove(name);
        }
    }

    impl InterfaceOps for Model {
        fn ifindex(&self, name: &str) -> Result<u32> {
            match self.interfaces.get(name) {
                Some((index, _)) => Ok(*index),
                None => bail!("no interface {name}"),
            }
        }
        fn bridge_of(&self, name: &str) -> Option<String> {
            self.interfaces.get(name).and_then(|(_, b)| b.clone())
        }
        fn attach(&mut self, name: &str) -> Result<()> {
            self.ifindex(name)?;
            self.links.insert(name.into());
            Ok(())
        }
        fn detach(&mut self, name: &str) -> Result<()> {
            self.links.remove(name);
            Ok(())
        }
        fn pinned_links(&self) -> Vec<String> {
            self.links.iter().cloned().collect()
        }
        fn set_endpoint_addresses(
            &mut self,
            ifindex: u32,
            id: EndpointId,
            addresses: &[IpAddr],
        ) -> Result<()> {
            self.addresses.retain(|(i, _, _)| *i != ifindex);
            self.addresses
                .extend(addresses.iter().map(|a| (ifindex, id, *a)));
            Ok(())
        }
        fn set_endpoint(
            &mut self,
            ifindex: u32,
            id: EndpointId,
            flags: EndpointFlags,
        ) -> Result<()> {
            self.endpoints
                .insert(ifindex, EndpointEntry::Endpoint { ifindex, id, flags });
            Ok(())
        }
        fn remove_endpoint(&mut self, ifindex: u32) -> Result<()> {
            self.endpoints.remove(&ifindex);
            self.addresses.retain(|(i, _, _)| *i != ifindex);
            Ok(())
        }
        fn set_bridge(&mut self, ifindex: u32) -> Result<()> {
            self.endpoints
                .insert(ifindex, EndpointEntry::Bridge { ifindex });
            Ok(())
        }
        fn set_interface_by_source(&mut self, ifindex: u32) -> Result<()> {
            self.endpoints.insert(
                ifindex,
                EndpointEntry::BySource {
                    ifindex,
                    enforce_unknown: true,
                },
            );
            Ok(())
        }
        fn endpoint_entries(&self) -> Result<Vec<EndpointEntry>> {
            Ok(self.endpoints.values().cloned().collect())
        }
        fn endpoint_addresses(&self) -> Result<Vec<(u32, EndpointId, IpAddr)>> {
            Ok(self.addresses.iter().copied().collect())
        }
        fn client_entries(&self) -> Result<Vec<(IpNet, EndpointId, EndpointFlags)>> {
            Ok(self
                .clients
                .iter()
                .map(|(p, (id, f))| (*p, *id, *f))
                .collect())
        }
        fn set_client_prefix(
            &mut self,
            prefix: IpNet,
            id: EndpointId,
            flags: EndpointFlags,
        ) -> Result<()> {
            self.clients.insert(prefix, (id, flags));
            Ok(())
        }
        fn remove_client_prefix(&mut self, prefix: IpNet) -> Result<()> {
            self.clients.remove(&prefix);
            Ok(())
        }
    }

    fn wanted(id: u16, interface: &str, address: &str) -> Wanted {
        Wanted {
            id: EndpointId(id),
            interface: interface.into(),
            enforcing: Enforcing {
                egress: true,
                ingress: false,
            },
            addresses: vec![address.parse().unwrap()],
        }
    }

    /// The endpoint ids the maps name, by interface index.
    fn ids(model: &Model) -> BTreeMap<u32, u16> {
        model
            .endpoints
            .values()
            .filter_map(|e| match e {
                EndpointEntry::Endpoint { ifindex, id, .. } => Some((*ifindex, id.0)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn endpoints_are_attached_written_and_removed_as_wanted() {
        let mut kernel = Model::default();
        kernel.interface("veth1", 4, None);
        kernel.interface("veth2", 5, None);
        let mut run = Interfaces::default();
        run.sync(
            &mut kernel,
            &[
                wanted(1, "veth1", "10.0.0.1"),
                wanted(2, "veth2", "10.0.0.2"),
            ],
        )
        .unwrap();
        assert_eq!(ids(&kernel), BTreeMap::from([(4, 1), (5, 2)]));
        assert_eq!(
            kernel.links,
            BTreeSet::from(["veth1".into(), "veth2".into()])
        );
        assert!(
            kernel
                .addresses
                .contains(&(5, EndpointId(2), "10.0.0.2".parse().unwrap()))
        );

        run.sync(&mut kernel, &[wanted(1, "veth1", "10.0.0.1")])
            .unwrap();
        assert_eq!(ids(&kernel), BTreeMap::from([(4, 1)]));
        assert_eq!(kernel.links, BTreeSet::from(["veth1".into()]));
        assert!(kernel.addresses.iter().all(|(i, _, _)| *i == 4));
    }

    #[test]
    fn an_interface_recreated_under_its_name_gets_its_entry_on_the_new_index() {
        let mut kernel = Model::default();
        kernel.interface("veth1", 4, None);
        let mut run = Interfaces::default();
        run.sync(&mut kernel, &[wanted(1, "veth1", "10.0.0.1")])
            .unwrap();
        kernel.interface("veth1", 9, None);
        run.sync(&mut kernel, &[wanted(1, "veth1", "10.0.0.1")])
            .unwrap();
        assert_eq!(ids(&kernel), BTreeMap::from([(9, 1)]));
        assert!(kernel.addresses.iter().all(|(i, _, _)| *i == 9));
    }

    #[test]
    fn a_restart_removes_what_an_earlier_run_left_for_endpoints_it_does_not_have() {
        // The earlier run: two bridged containers and one on a veth of its own.
        let mut kernel = Model::default();
        kernel.interface("br0", 3, None);
        kernel.interface("vethA", 7, Some("br0"));
        kernel.interface("vethB", 8, Some("br0"));
        kernel.interface("vethC", 10, None);
        let mut earlier = Interfaces::default();
        earlier
            .sync(
                &mut kernel,
                &[
                    wanted(1, "vethA", "198.51.100.3"),
                    wanted(2, "vethB", "198.51.100.4"),
                    wanted(3, "vethC", "198.51.100.5"),
                ],
            )
            .unwrap();
        assert_eq!(
            kernel.clients.len(),
            2,
            "the bridged endpoints' DNS redirects"
        );
        assert!(kernel.endpoints.contains_key(&3), "the bridge's entry");
        // While no agent ran, containers A and C were removed (their veths and links went).
        kernel.remove_interface("vethA");
        kernel.remove_interface("vethC");
        // This run has only B: nothing of A's or C's may stay, and an id the next container
        // gets must not find a source entry of theirs.
        let mut run = Interfaces::default();
        run.sync(&mut kernel, &[wanted(2, "vethB", "198.51.100.4")])
            .unwrap();
        assert_eq!(ids(&kernel), BTreeMap::from([(8, 2)]));
        assert!(
            kernel
                .addresses
                .iter()
                .all(|(i, id, _)| *i == 8 && id.0 == 2)
        );
        assert_eq!(
            kernel.clients.keys().copied().collect::<Vec<_>>(),
            ["198.51.100.4/32".parse::<IpNet>().unwrap()],
            "only B's bridged DNS redirect"
        );
        assert!(
            kernel.endpoints.contains_key(&3),
            "the bridge still has a port"
        );

        // B goes too: the bridge's entry, programs and redirects with it.
        run.sync(&mut kernel, &[]).unwrap();
        assert!(kernel.endpoints.is_empty());
        assert!(kernel.clients.is_empty());
        assert!(kernel.links.is_empty());
    }

    #[test]
    fn links_an_earlier_run_pinned_for_interfaces_no_longer_wanted_are_detached() {
        let mut kernel = Model::default();
        kernel.interface("veth1", 4, None);
        kernel.interface("old", 6, None);
        kernel.links.insert("old".into());
        kernel.endpoints.insert(
            6,
            EndpointEntry::Endpoint {
                ifindex: 6,
                id: EndpointId(9),
                flags: EndpointFlags::default(),
            },
        );
        Interfaces::default()
            .sync(&mut kernel, &[wanted(1, "veth1", "10.0.0.1")])
            .unwrap();
        assert_eq!(kernel.links, BTreeSet::from(["veth1".into()]));
        assert_eq!(ids(&kernel), BTreeMap::from([(4, 1)]));
    }

    #[test]
    fn a_gateway_s_lan_entries_and_prefixes_are_kept_and_synced() {
        let mut kernel = Model::default();
        kernel.interface("lan0", 2, None);
        let mut run = Interfaces::default();
        let office = (
            "10.1.0.0/24".parse().unwrap(),
            EndpointId(100),
            Enforcing {
                egress: true,
                ingress: false,
            },
        );
        run.sync_gateway(&mut kernel, &["lan0".into()], &[office])
            .unwrap();
        assert!(matches!(
            kernel.endpoints.get(&2),
            Some(EndpointEntry::BySource { .. })
        ));
        assert_eq!(kernel.clients.len(), 1);
        // A node sync of the same run leaves the LAN interface alone.
        run.sync(&mut kernel, &[]).unwrap();
        assert!(kernel.links.contains("lan0"));
        assert!(kernel.endpoints.contains_key(&2));
        // The group gone: its prefix with it.
        run.sync_gateway(&mut kernel, &["lan0".into()], &[])
            .unwrap();
        assert!(kernel.clients.is_empty());
    }
}
