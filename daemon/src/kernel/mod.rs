//! The daemon's kernel side, for both modes: the loaded programs, the endpoint map, the
//! interfaces the programs are attached to, conntrack, and (node) the DNS proxy's entry in the
//! redirect map and the cgroups of host-process endpoints, or (gateway) the client prefixes of
//! by-source LAN interfaces.
//!
//! Cgroup endpoints: the first one attaches the cgroup socket programs at the root of the
//! cgroup v2 hierarchy (after the start-up checks: a v2 mount of the whole hierarchy, no
//! cgroup v1 net_cls / net_prio in use, fqdnd itself outside every endpoint's cgroup); each
//! endpoint's cgroup directory is resolved to its id for the endpoints-by-cgroup map, again
//! by [`Kernel::refresh_cgroups`] (a cgroup created later, or removed and created again as a
//! restarted systemd unit's is); the last one detaches the programs.
//!
//! Programs and links are pinned: they keep enforcing while the daemon is stopped or
//! restarting, and a restart replaces each program inside its link (never a moment without
//! one). Stopping the daemon therefore leaves enforcement in place; `fqdnd bpf unload` removes
//! it.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
use std::path::{Path, PathBuf};

use crate::{Context, Result, bail};
use fqdnd_config::Cgroup;
use fqdnd_ebpf::{EndpointFlags, KernelDatapath, Loaded};
use fqdnd_ipcache::EndpointId;

use ipnet::IpNet;

mod interfaces;

pub use interfaces::Interfaces;
use interfaces::Real;

/// Whether an endpoint is under policy in each direction: the kernel's enforce flags (default
/// deny there, or a deny to apply).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Enforcing {
    /// Its egress.
    pub egress: bool,
    /// Its ingress.
    pub ingress: bool,
}

/// One endpoint as the kernel knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// The endpoint.
    pub id: EndpointId,
    /// Its host-side interface index.
    pub ifindex: u32,
    /// Under policy, per direction.
    pub enforcing: Enforcing,
    /// The sources its packets may have (anything else is dropped as spoofed).
    pub addresses: Vec<IpAddr>,
    /// The bridge its interface is a port of (found when attached), where its DNS is
    /// redirected again.
    pub bridge: Option<String>,
}

/// What an endpoint needs from the kernel.
#[derive(Debug, Clone)]
pub struct Wanted {
    /// The endpoint.
    pub id: EndpointId,
    /// Its host-side interface.
    pub interface: String,
    /// Under policy, per direction.
    pub enforcing: Enforcing,
    /// Its addresses: the only sources its packets may have.
    pub addresses: Vec<IpAddr>,
}

/// What a cgroup endpoint needs from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedCgroup {
    /// The endpoint.
    pub id: EndpointId,
    /// Its cgroup (or systemd unit).
    pub cgroup: Cgroup,
    /// Under policy, per direction.
    pub enforcing: Enforcing,
}

/// A cgroup endpoint as the kernel knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupAttached {
    /// What was asked.
    pub wanted: WantedCgroup,
    /// Its directory under the cgroup v2 mount.
    pub path: PathBuf,
    /// The cgroup id written to the map; `None` while the directory does not exist.
    pub cgroup_id: Option<u64>,
}

/// The loaded programs and the handles the daemon keeps on the pinned maps.
pub struct Kernel {
    loaded: Loaded,
    /// A handle on the maps for endpoints, conntrack and listings (the engine owns another
    /// one for ipcache and policy batches).
    maps: KernelDatapath,
    /// The interfaces the programs are attached to and the entries written for them.
    interfaces: Interfaces,
    pin_dir: PathBuf,
    /// The map sizes loaded with.
    sizes: fqdnd_ebpf::MapSizes,
    /// Cgroup endpoints, by endpoint.
    cgroups: BTreeMap<EndpointId, CgroupAttached>,
    /// The cgroup v2 mount the socket programs are attached at (by this run), once they are.
    cgroup_root: Option<PathBuf>,
    /// This process's network namespace cookie (the proxy's), once read.
    netns_cookie: Option<u64>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("pin_dir", &self.pin_dir)
            .field("attached", self.interfaces.attached())
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

/// The node's own addresses (of every interface of the agent's network namespace), but
/// loopback and link-local ones: the sources the host's own traffic towards an endpoint has,
/// and the destinations of an endpoint's traffic to the host — the `host` entity.
pub fn host_addresses() -> Result<Vec<IpAddr>> {
    let mut out: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .context("listing the node's addresses")?
        .filter_map(|a| {
            let addr = a.address?;
            let ip = match (addr.as_sockaddr_in(), addr.as_sockaddr_in6()) {
                (Some(v4), _) => IpAddr::V4(v4.ip()),
                (_, Some(v6)) => IpAddr::V6(v6.ip()),
                _ => return None,
            };
            let link_local = match ip {
                IpAddr::V4(v4) => v4.is_link_local(),
                IpAddr::V6(v6) => v6.is_unicast_link_local(),
            };
            (!ip.is_loopback() && !ip.is_unspecified() && !ip.is_multicast() && !link_local)
                .then_some(ip)
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The interface index of `name`.
pub fn ifindex(name: &str) -> Result<u32> {
    nix::net::if_::if_nametoindex(name)
        .with_context(|| format!("interface {name} does not exist (or cannot be read)"))
}

impl Kernel {
    /// Loads the programs (reusing pinned maps), opens the maps and sets the conntrack
    /// lifetimes; with `redirect_dns` installs the local-delivery routes the DNS redirect
    /// needs.
    pub fn load(
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
            interfaces: Interfaces::default(),
            pin_dir: pin_dir.to_path_buf(),
            sizes,
            cgroups: BTreeMap::new(),
            cgroup_root: None,
            netns_cookie: None,
        })
    }

    /// Points the DNS redirect at the proxy's wildcard-bound sockets on `port`.
    pub fn set_dns_proxy(&mut self, port: u16) -> Result<()> {
        self.maps
            .set_dns_proxy(
                Some(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)),
                Some(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0)),
            )
            .context("writing the DNS proxy's address into the redirect map")
    }

    /// Makes the kernel match `wanted` (see [`Interfaces::sync`]).
    pub fn sync(&mut self, wanted: &[Wanted]) -> Result<()> {
        let mut ops = Real {
            loaded: &mut self.loaded,
            maps: &mut self.maps,
            pin_dir: &self.pin_dir,
        };
        self.interfaces.sync(&mut ops, wanted)
    }

    /// Gateway: the LAN interfaces and their client prefixes (see
    /// [`Interfaces::sync_gateway`]).
    pub fn sync_gateway(
        &mut self,
        interfaces: &[String],
        clients: &[(IpNet, EndpointId, Enforcing)],
    ) -> Result<()> {
        let mut ops = Real {
            loaded: &mut self.loaded,
            maps: &mut self.maps,
            pin_dir: &self.pin_dir,
        };
        self.interfaces.sync_gateway(&mut ops, interfaces, clients)
    }

    /// A handle of its own on the conntrack map, for walks that must not hold the kernel's
    /// lock (GC, occupancy sampling).
    pub fn conntrack(&self) -> Result<fqdnd_ebpf::Conntrack> {
        fqdnd_ebpf::Conntrack::open(&self.pin_dir).context("opening the conntrack map")
    }

    /// The map sizes loaded with.
    pub fn sizes(&self) -> &fqdnd_ebpf::MapSizes {
        &self.sizes
    }

    /// The interfaces attached, with their endpoints.
    pub fn attached(&self) -> &BTreeMap<String, Attached> {
        self.interfaces.attached()
    }

    /// The cgroup endpoints, with their directories and ids.
    pub fn cgroups(&self) -> &BTreeMap<EndpointId, CgroupAttached> {
        &self.cgroups
    }

    /// Makes the endpoints-by-cgroup map hold `wanted`. The cgroup socket programs are
    /// attached (after the start-up checks) when the first cgroup endpoint comes, or at the
    /// first sync with `host_processes`; once attached by this run they stay (attaching a
    /// cgroup skb program needs CAP_NET_ADMIN, which the node drops after start-up), doing
    /// nothing but a lookup while no cgroup endpoint is left. Programs an earlier run left
    /// attached are replaced, or detached when this run wants none. Entries are written
    /// before the programs run with them; entries no endpoint wants (removed endpoints, an
    /// earlier run's) are removed. A cgroup whose directory does not exist yet gets its entry
    /// once it does ([`Self::refresh_cgroups`]).
    pub fn sync_cgroups(&mut self, wanted: &[WantedCgroup], host_processes: bool) -> Result<()> {
        if wanted.is_empty() && !host_processes && self.cgroup_root.is_none() {
            self.cgroups.clear();
            self.remove_unwanted_cgroup_entries()?;
            if fqdnd_ebpf::cgroup_attached(&self.pin_dir) {
                self.loaded
                    .detach_cgroup()
                    .context("detaching the cgroup socket programs an earlier run attached")?;
                tracing::info!("cgroup socket programs detached: no cgroup endpoint");
            }
            return Ok(());
        }
        let root = match &self.cgroup_root {
            Some(root) => root.clone(),
            None => cgroup_checks()?,
        };
        let mut next = BTreeMap::new();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .context("reading /proc/self/mountinfo")?;
        for w in wanted {
            let path = cgroup_dir(&root, &w.cgroup)?;
            if let Cgroup::Path(below) = &w.cgroup {
                // a path that can never match is refused (saying what to write); one that
                // does not exist yet is matched once it does
                fqdnd_ebpf::cgroup::check_endpoint_path(
                    &root,
                    below,
                    &mountinfo,
                    fqdnd_ebpf::cgroup::found,
                )
                .with_context(|| format!("endpoint {}", w.id))?;
            }
            if let Some(own) = own_cgroup(&root)
                && own.starts_with(&path)
            {
                bail!(
                    "endpoint {} ({}): fqdnd itself runs in {}, inside that cgroup: its own \
                     upstream queries would be redirected to itself; run fqdnd outside the \
                     endpoint's cgroup",
                    w.id,
                    w.cgroup,
                    own.display()
                );
            }
            let kept = self
                .cgroups
                .get(&w.id)
                .filter(|old| old.wanted == *w && old.path == path)
                .and_then(|old| old.cgroup_id);
            next.insert(
                w.id,
                CgroupAttached {
                    wanted: w.clone(),
                    path,
                    cgroup_id: kept,
                },
            );
        }
        // The entries of endpoints gone or changed go first, so an id is never claimed twice.
        for (id, old) in &self.cgroups {
            let stays = next.get(id).and_then(|n| n.cgroup_id);
            if let Some(cgroup_id) = old.cgroup_id
                && stays != Some(cgroup_id)
            {
                self.maps
                    .remove_cgroup_endpoint(cgroup_id)
                    .with_context(|| format!("removing the cgroup entry of endpoint {id}"))?;
                tracing::info!(endpoint = %id, cgroup_id, "cgroup endpoint entry removed");
            }
        }
        self.cgroups = next;
        self.refresh_cgroups()?;
        for (id, entry) in &self.cgroups {
            if entry.cgroup_id.is_none() {
                tracing::warn!(endpoint = %id, cgroup = %entry.path.display(), "the endpoint's cgroup does not exist (yet): its processes are matched once it does");
            }
        }
        self.remove_unwanted_cgroup_entries()?;
        self.write_sock_settings()?;
        if self.cgroup_root.is_none() {
            self.loaded.attach_cgroup(&root).with_context(|| {
                format!(
                    "attaching the cgroup socket programs at {} (a node that has dropped its \
                     capabilities cannot: with `hostProcesses: true` in the Node document, or a \
                     cgroup Endpoint in the files, they are attached at start-up)",
                    root.display()
                )
            })?;
            tracing::info!(root = %root.display(), "cgroup socket programs attached");
            self.cgroup_root = Some(root);
        }
        Ok(())
    }

    /// The socket programs' settings: the proxy's network namespace and how many cgroup
    /// endpoint entries there are (none: the programs return at once).
    fn write_sock_settings(&mut self) -> Result<()> {
        let cookie = match self.netns_cookie {
            Some(c) => c,
            None => *self.netns_cookie.insert(
                fqdnd_ebpf::sys::netns_cookie()
                    .context("reading the proxy's network namespace cookie")?,
            ),
        };
        let entries = self
            .cgroups
            .values()
            .filter(|c| c.cgroup_id.is_some())
            .count();
        self.maps
            .set_sock_settings(cookie, u32::try_from(entries).unwrap_or(u32::MAX))
            .context("writing the socket programs' settings")
    }

    /// Removes the map's entries of cgroups no endpoint has now.
    fn remove_unwanted_cgroup_entries(&mut self) -> Result<()> {
        let ours: HashSet<u64> = self.cgroups.values().filter_map(|c| c.cgroup_id).collect();
        let entries = self
            .maps
            .cgroup_entries()
            .context("reading the cgroup endpoint map")?;
        for (cgroup_id, id, _) in entries {
            if !ours.contains(&cgroup_id) {
                self.maps
                    .remove_cgroup_endpoint(cgroup_id)
                    .with_context(|| format!("removing the cgroup entry of endpoint {id}"))?;
                tracing::info!(endpoint = %id, cgroup_id, "cgroup entry no endpoint has removed");
            }
        }
        Ok(())
    }

    /// Resolves each cgroup endpoint's directory to its id again and writes what changed: a
    /// directory created since, or removed and created again (a new id), or gone (its entry
    /// removed). Returns how many entries changed.
    pub fn refresh_cgroups(&mut self) -> Result<usize> {
        let mut changed = 0;
        for (id, entry) in &mut self.cgroups {
            let now = fqdnd_ebpf::cgroup::cgroup_id(&entry.path).ok();
            if now == entry.cgroup_id {
                continue;
            }
            if let Some(old) = entry.cgroup_id {
                self.maps
                    .remove_cgroup_endpoint(old)
                    .with_context(|| format!("removing the cgroup entry of endpoint {id}"))?;
            }
            match now {
                Some(cgroup_id) => {
                    let flags = EndpointFlags {
                        enforce_egress: entry.wanted.enforcing.egress,
                        redirect_dns: true,
                        check_source: false,
                        enforce_ingress: entry.wanted.enforcing.ingress,
                    };
                    self.maps
                        .set_cgroup_endpoint(cgroup_id, *id, flags)
                        .with_context(|| format!("writing the cgroup entry of endpoint {id}"))?;
                    tracing::info!(endpoint = %id, cgroup = %entry.path.display(), cgroup_id, egress = entry.wanted.enforcing.egress, ingress = entry.wanted.enforcing.ingress, "cgroup endpoint in force");
                }
                None => {
                    tracing::warn!(endpoint = %id, cgroup = %entry.path.display(), "the endpoint's cgroup does not exist (yet): its processes are matched once it does");
                }
            }
            entry.cgroup_id = now;
            changed += 1;
        }
        if changed > 0 {
            self.write_sock_settings()?;
        }
        Ok(changed)
    }
}

/// The start-up checks of cgroup endpoints: the cgroup v2 mount of the whole hierarchy, and
/// no cgroup v1 net_cls / net_prio in use. Returns the mount.
fn cgroup_checks() -> Result<PathBuf> {
    let root = fqdnd_ebpf::cgroup::v2_root().context("finding the cgroup v2 hierarchy")?;
    let unseen = fqdnd_ebpf::cgroup::check_v1_net()
        .context("checking the cgroup v1 net_cls / net_prio controllers")?;
    for controller in unseen {
        tracing::warn!(
            controller,
            "cgroup v1 {controller} is bound to a hierarchy this mount namespace does not show:              fqdnd cannot check that it is unused (if it is used, cgroup endpoints may not match              their sockets)"
        );
    }
    Ok(root)
}

/// The directory of `cgroup` under the v2 mount `root`.
fn cgroup_dir(root: &Path, cgroup: &Cgroup) -> Result<PathBuf> {
    let below = match cgroup {
        Cgroup::Path(p) => p.clone(),
        Cgroup::Unit(u) => fqdnd_ebpf::cgroup::unit_path(u)
            .with_context(|| format!("finding the cgroup of {u}"))?,
    };
    Ok(root.join(below.trim_start_matches('/')))
}

/// This process's cgroup v2 directory under `root`, if `/proc/self/cgroup` says.
fn own_cgroup(root: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let below = fqdnd_ebpf::cgroup::v2_path_of(&text)?;
    Some(root.join(below.trim_start_matches('/')))
}
