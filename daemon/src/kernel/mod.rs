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

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
use std::path::{Path, PathBuf};

use crate::{Context, Result};
use fqdnd_config::Cgroup;
use fqdnd_ebpf::{KernelDatapath, Loaded};
use fqdnd_ipcache::EndpointId;

use ipnet::IpNet;

mod cgroups;
mod interfaces;

pub use cgroups::Cgroups;
use cgroups::RealCgroups;
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
    /// Cgroup endpoints and the socket programs.
    cgroups: Cgroups,
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
            cgroups: Cgroups::default(),
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
        self.cgroups.endpoints()
    }

    /// Makes the endpoints-by-cgroup map hold `wanted` (see [`Cgroups::sync`]).
    pub fn sync_cgroups(&mut self, wanted: &[WantedCgroup], host_processes: bool) -> Result<()> {
        let mut ops = RealCgroups {
            loaded: &mut self.loaded,
            maps: &mut self.maps,
            pin_dir: &self.pin_dir,
        };
        self.cgroups.sync(&mut ops, wanted, host_processes)
    }

    /// Resolves each cgroup endpoint's directory again (see [`Cgroups::refresh`]).
    pub fn refresh_cgroups(&mut self) -> Result<usize> {
        let mut ops = RealCgroups {
            loaded: &mut self.loaded,
            maps: &mut self.maps,
            pin_dir: &self.pin_dir,
        };
        self.cgroups.refresh(&mut ops)
    }
}
