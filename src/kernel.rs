//! The daemon's kernel side, for both modes: the loaded programs, the endpoint map, the
//! interfaces the programs are attached to, conntrack, and (node) the DNS proxy's entry in the
//! redirect map or (gateway) the client prefixes of by-source LAN interfaces.
//!
//! Programs and links are pinned: they keep enforcing while the daemon is stopped or
//! restarting, and a restart replaces each program inside its link (never a moment without
//! one). Stopping the daemon therefore leaves enforcement in place; `fqdnd bpf unload` removes
//! it.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use fqdnd_ebpf::{EndpointFlags, KernelDatapath, Loaded};
use fqdnd_ipcache::EndpointId;

use ipnet::IpNet;

/// One endpoint as the kernel knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attached {
    /// The endpoint.
    pub(crate) id: EndpointId,
    /// Its host-side interface index.
    pub(crate) ifindex: u32,
    /// Under egress policy.
    pub(crate) enforcing: bool,
    /// The sources its packets may have (anything else is dropped as spoofed).
    pub(crate) addresses: Vec<IpAddr>,
}

/// What an endpoint needs from the kernel.
#[derive(Debug, Clone)]
pub(crate) struct Wanted {
    /// The endpoint.
    pub(crate) id: EndpointId,
    /// Its host-side interface.
    pub(crate) interface: String,
    /// Under egress policy.
    pub(crate) enforcing: bool,
    /// Its addresses: the only sources its packets may have.
    pub(crate) addresses: Vec<IpAddr>,
}

/// The loaded programs and the handles the daemon keeps on the pinned maps.
pub(crate) struct Kernel {
    loaded: Loaded,
    /// A handle on the maps for endpoints, conntrack and listings (the engine owns another
    /// one for ipcache and policy batches).
    maps: KernelDatapath,
    /// Interface name → what is attached there.
    attached: BTreeMap<String, Attached>,
    /// Gateway LAN interfaces (by source) attached, name → index.
    lan: BTreeMap<String, u32>,
    /// Client prefixes written, with what they were written with.
    clients: BTreeMap<IpNet, (EndpointId, EndpointFlags)>,
    pin_dir: PathBuf,
    /// The map sizes loaded with.
    sizes: fqdnd_ebpf::MapSizes,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("pin_dir", &self.pin_dir)
            .field("attached", &self.attached)
            .finish_non_exhaustive()
    }
}

/// The names pinned in a directory (its maps, and `links` for the link pins), sorted.
fn pinned_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The interface index of `name`.
pub(crate) fn ifindex(name: &str) -> Result<u32> {
    nix::net::if_::if_nametoindex(name)
        .with_context(|| format!("interface {name} does not exist (or cannot be read)"))
}

impl Kernel {
    /// Loads the programs (reusing pinned maps), opens the maps and sets the conntrack
    /// lifetimes; with `redirect_dns` installs the local-delivery routes the DNS redirect
    /// needs.
    pub(crate) fn load(
        pin_dir: &Path,
        sizes: &fqdnd_config::MapSizes,
        conntrack: &fqdnd_config::Conntrack,
        redirect_dns: bool,
    ) -> Result<Self> {
        fqdnd_ebpf::ensure_bpffs(Path::new(fqdnd_ebpf::BPFFS_ROOT)).context("mounting bpffs")?;
        let defaults = fqdnd_ebpf::MapSizes::default();
        let sizes = fqdnd_ebpf::MapSizes {
            ipcache: sizes.ipcache.unwrap_or(defaults.ipcache),
            policy: sizes.policy.unwrap_or(defaults.policy),
            conntrack: sizes.conntrack.unwrap_or(defaults.conntrack),
            endpoints: sizes.endpoints.unwrap_or(defaults.endpoints),
            clients: sizes.clients.unwrap_or(defaults.clients),
            lb_services: sizes.lb_services.unwrap_or(defaults.lb_services),
            lb_backends: sizes.lb_backends.unwrap_or(defaults.lb_backends),
            endpoint_addresses: sizes
                .endpoint_addresses
                .unwrap_or(defaults.endpoint_addresses),
        };
        for old in fqdnd_ebpf::other_abi_dirs(pin_dir) {
            let maps = pinned_names(&old);
            let interfaces = fqdnd_ebpf::attached_interfaces(&old);
            tracing::warn!(
                dir = %old.display(),
                maps = %maps.join(","),
                interfaces = %interfaces.join(","),
                "maps of another layout version are pinned there and are not migrated (their \
                 programs still run on those interfaces); `fqdnd bpf unload --pin-dir` removes them"
            );
        }
        let (loaded, migrations) = Loaded::load_with(pin_dir, &sizes).with_context(|| {
            format!(
                "loading the eBPF programs with maps pinned in {} (needs root: CAP_BPF, \
                 CAP_NET_ADMIN, CAP_SYS_ADMIN)",
                pin_dir.display()
            )
        })?;
        for m in &migrations {
            tracing::warn!(
                map = %m.map,
                from = m.from_max,
                to = m.to_max,
                entries_before = m.entries_before,
                entries_after = m.entries_after,
                "map migrated to its new size"
            );
        }
        if redirect_dns {
            fqdnd_ebpf::route::install_local_delivery()
                .context("installing the local-delivery routes for the DNS redirect")?;
        }
        let mut maps = KernelDatapath::open(pin_dir).context("opening the pinned maps")?;
        maps.set_ct_lifetimes(&fqdnd_ebpf::CtLifetimes {
            tcp_syn: conntrack.tcp_syn,
            tcp_established: conntrack.tcp_established,
            tcp_closing: conntrack.tcp_closing,
            other: conntrack.other,
        })
        .context("writing the conntrack lifetimes")?;
        Ok(Self {
            loaded,
            maps,
            attached: BTreeMap::new(),
            lan: BTreeMap::new(),
            clients: BTreeMap::new(),
            pin_dir: pin_dir.to_path_buf(),
            sizes,
        })
    }

    /// Points the DNS redirect at the proxy's wildcard-bound sockets on `port`.
    pub(crate) fn set_dns_proxy(&mut self, port: u16) -> Result<()> {
        self.maps
            .set_dns_proxy(
                Some(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)),
                Some(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0)),
            )
            .context("writing the DNS proxy's address into the redirect map")
    }

    /// Makes the kernel match `wanted`: writes each endpoint's addresses (the only sources
    /// its packets may have) and its endpoint entry, attaches (or replaces in place) the
    /// programs on its interface, then removes the endpoints and links no longer wanted,
    /// including links pinned by an earlier run. Stops at the first failure; what was applied
    /// stays applied and the next sync retries the rest.
    pub(crate) fn sync(&mut self, wanted: &[Wanted]) -> Result<()> {
        for w in wanted {
            let index = ifindex(&w.interface)?;
            let mut addresses = w.addresses.clone();
            addresses.sort();
            addresses.dedup();
            let entry = Attached {
                id: w.id,
                ifindex: index,
                enforcing: w.enforcing,
                addresses,
            };
            if self.attached.get(&w.interface) == Some(&entry) {
                continue;
            }
            if let Some(old) = self.attached.get(&w.interface)
                && old.ifindex != index
            {
                // The interface was recreated under the same name.
                let _ = self.maps.remove_endpoint(old.ifindex);
            }
            let flags = EndpointFlags {
                enforce_egress: w.enforcing,
                redirect_dns: true,
                check_source: true,
            };
            if entry.addresses.is_empty() {
                tracing::warn!(endpoint = %w.id, interface = %w.interface, "endpoint has no `addresses`: every packet from it is dropped as spoofed");
            }
            // Addresses first (new ones in before old ones out), then the endpoint entry: the
            // program passes traffic of unknown interfaces, so the entry must be there when
            // it starts seeing packets, and drops sources it does not know.
            self.maps
                .set_endpoint_addresses(index, w.id, &entry.addresses)
                .with_context(|| {
                    format!(
                        "writing the addresses of endpoint {} on {}",
                        w.id, w.interface
                    )
                })?;
            self.maps
                .set_endpoint(index, w.id, flags)
                .with_context(|| format!("registering endpoint {} on {}", w.id, w.interface))?;
            if !self.attached.contains_key(&w.interface) {
                self.loaded
                    .attach(&w.interface)
                    .with_context(|| format!("attaching the programs to {}", w.interface))?;
                tracing::info!(endpoint = %w.id, interface = %w.interface, ifindex = index, enforcing = w.enforcing, "endpoint attached");
            } else {
                tracing::info!(endpoint = %w.id, interface = %w.interface, enforcing = w.enforcing, "endpoint updated");
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
                self.detach(&name, Some(old.ifindex))?;
            }
        }
        // Links pinned by an earlier run for interfaces no longer configured.
        for name in fqdnd_ebpf::attached_interfaces(&self.pin_dir) {
            if !keep.contains(name.as_str()) && !self.lan.contains_key(&name) {
                let index = ifindex(&name).ok();
                self.detach(&name, index)?;
            }
        }
        Ok(())
    }

    fn detach(&mut self, name: &str, index: Option<u32>) -> Result<()> {
        if let Some(index) = index {
            self.maps
                .remove_endpoint(index)
                .with_context(|| format!("removing the endpoint entry of {name}"))?;
        }
        self.loaded
            .detach(name)
            .with_context(|| format!("detaching the programs from {name}"))?;
        tracing::info!(interface = %name, "endpoint detached");
        Ok(())
    }

    /// Gateway: attaches the programs to each LAN interface, where endpoints are client
    /// groups found by source prefix (a source in no group is dropped), and writes every
    /// client prefix. Prefixes first, then the interface entry, then the programs: a packet
    /// is never judged before its group is known.
    pub(crate) fn sync_gateway(
        &mut self,
        interfaces: &[String],
        clients: &[(IpNet, EndpointId, bool)],
    ) -> Result<()> {
        let mut wanted = BTreeMap::new();
        for &(prefix, id, enforcing) in clients {
            let flags = EndpointFlags {
                enforce_egress: enforcing,
                redirect_dns: false,
                check_source: false,
            };
            wanted.insert(prefix.trunc(), (id, flags));
        }
        for (prefix, entry) in &wanted {
            if self.clients.get(prefix) != Some(entry) {
                self.maps
                    .set_client_prefix(*prefix, entry.0, entry.1)
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
            self.maps
                .remove_client_prefix(prefix)
                .with_context(|| format!("removing client prefix {prefix}"))?;
            self.clients.remove(&prefix);
        }
        for name in interfaces {
            if self.lan.contains_key(name) {
                continue;
            }
            let index = ifindex(name)?;
            self.maps
                .set_interface_by_source(index, true)
                .with_context(|| format!("registering LAN interface {name}"))?;
            self.loaded
                .attach(name)
                .with_context(|| format!("attaching the programs to {name}"))?;
            tracing::info!(interface = %name, ifindex = index, "LAN interface enforced");
            self.lan.insert(name.clone(), index);
        }
        Ok(())
    }

    /// Destination addresses of the flows alive in conntrack (not past the lifetime of their
    /// state): what keeps zombies alive.
    pub(crate) fn live_destinations(&self) -> Result<HashSet<IpAddr>> {
        Ok(self.maps.live_destinations()?)
    }

    /// Removes the dead conntrack entries; returns how many.
    pub(crate) fn gc_conntrack(&mut self) -> Result<usize> {
        Ok(self.maps.gc_conntrack()?)
    }

    /// The map sizes loaded with.
    pub(crate) fn sizes(&self) -> &fqdnd_ebpf::MapSizes {
        &self.sizes
    }

    /// Conntrack entries now (a walk of the map: sample it, don't poll it).
    pub(crate) fn conntrack_entries(&self) -> Result<usize> {
        Ok(self.maps.ct_entries()?.len())
    }

    /// The interfaces attached, with their endpoints.
    pub(crate) fn attached(&self) -> &BTreeMap<String, Attached> {
        &self.attached
    }
}
