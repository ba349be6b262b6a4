//! [`KernelDatapath`]: ipcache and policy batches written into the pinned maps, and every
//! other map fqdnd writes or reads back, one module per concern:
//!
//! - `policy`: policy keys as kernel entries (port ranges as port prefixes), shared by
//!   reference counts; `ipcache`: prefixes and their identities;
//! - `batch`: [`fqdnd_ipcache::Datapath`], a batch whole or not at all (an undo log);
//!   `resync`: a restart's re-apply without a flush;
//! - `endpoints`: interfaces, client prefixes, source addresses; `sockets`: the cgroup
//!   endpoints and settings of the socket programs; `redirect`: the DNS proxy's address and
//!   the redirected sockets' records ([`DnsOrigins`]);
//! - `conntrack`: lifetimes, listing, live destinations, GC by expiry;
//! - `events`: the drop-event ring buffer ([`Events`]).

mod batch;
mod conntrack;
mod endpoints;
mod events;
mod ipcache;
mod policy;
mod redirect;
mod resync;
mod sockets;

use std::collections::HashMap as StdHashMap;
use std::path::Path;

use aya::maps::lpm_trie::Key;
use aya::maps::{Array, HashMap, LpmTrie, Map, MapData, MapError};
use fqdnd_ipcache::DatapathError;

pub use conntrack::{Conntrack, CtEntry, CtLifetimes, CtState, monotonic_ns};
pub use endpoints::{EndpointEntry, EndpointFlags};
pub use events::Events;
pub use policy::port_prefixes;
pub use redirect::{DnsOrigin, DnsOrigins};
pub use resync::ResyncStats;

use crate::error::Error;
use crate::sys::{
    CtKey, CtValue, DnsProxy, EndpointValue, EpAddrKey, EpAddrValue, IpcacheValue, PolicyData,
    PolicyKey, PolicyValue, Settings, SockCfg,
};
use policy::Refs;
use resync::Resync;

fn open_map(pin_dir: &Path, name: &str) -> Result<Map, Error> {
    Ok(Map::from_map_data(MapData::from_pin(pin_dir.join(name))?)?)
}

/// The pinned maps, opened from their pins, with the reference counts that let overlapping
/// policy keys (expanded ranges, repeated entries) share kernel entries.
///
/// Opening changes nothing in the maps, so it is also how a CLI reads them while the daemon
/// runs (every `*_entries` function works from the pins alone, with no program loaded).
pub struct KernelDatapath {
    ipc4: LpmTrie<MapData, [u8; 4], IpcacheValue>,
    ipc6: LpmTrie<MapData, [u8; 16], IpcacheValue>,
    endpoints: HashMap<MapData, u32, EndpointValue>,
    clients4: LpmTrie<MapData, [u8; 4], EndpointValue>,
    clients6: LpmTrie<MapData, [u8; 16], EndpointValue>,
    policy: LpmTrie<MapData, PolicyData, PolicyValue>,
    ct: HashMap<MapData, CtKey, CtValue>,
    dns_proxy: Array<MapData, DnsProxy>,
    ep_addrs: HashMap<MapData, EpAddrKey, EpAddrValue>,
    settings: Array<MapData, Settings>,
    cgroups: HashMap<MapData, u64, EndpointValue>,
    sock_cfg: Array<MapData, SockCfg>,
    refs: StdHashMap<PolicyKey, Refs>,
    resync: Option<Resync>,
}

impl std::fmt::Debug for KernelDatapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelDatapath")
            .field("policy_refs", &self.refs.len())
            .field("resync", &self.resync.is_some())
            .finish_non_exhaustive()
    }
}

impl KernelDatapath {
    /// Opens the maps pinned in `pin_dir` (by [`crate::Loaded::load`]); nothing in them is
    /// changed. Reference counts start empty: after a restart the caller re-applies its full
    /// state between [`Self::begin_resync`] and [`Self::finish_resync`].
    pub fn open(pin_dir: &Path) -> Result<Self, Error> {
        Ok(KernelDatapath {
            ipc4: open_map(pin_dir, "fqdnd_ipc4")?.try_into()?,
            ipc6: open_map(pin_dir, "fqdnd_ipc6")?.try_into()?,
            endpoints: open_map(pin_dir, "fqdnd_endpoints")?.try_into()?,
            clients4: open_map(pin_dir, "fqdnd_clients4")?.try_into()?,
            clients6: open_map(pin_dir, "fqdnd_clients6")?.try_into()?,
            policy: open_map(pin_dir, "fqdnd_policy")?.try_into()?,
            ct: open_map(pin_dir, "fqdnd_ct")?.try_into()?,
            dns_proxy: open_map(pin_dir, "fqdnd_dns_proxy")?.try_into()?,
            ep_addrs: open_map(pin_dir, "fqdnd_ep_addrs")?.try_into()?,
            settings: open_map(pin_dir, "fqdnd_settings")?.try_into()?,
            cgroups: open_map(pin_dir, "fqdnd_cgroups")?.try_into()?,
            sock_cfg: open_map(pin_dir, "fqdnd_sock_cfg")?.try_into()?,
            refs: StdHashMap::new(),
            resync: None,
        })
    }
}

fn map_err(map: &'static str, operation: &'static str, e: MapError) -> DatapathError {
    if let MapError::SyscallError(s) = &e
        && matches!(s.io_error.raw_os_error(), Some(libc::E2BIG | libc::ENOSPC))
    {
        return DatapathError::MapFull { map };
    }
    DatapathError::Io {
        operation,
        error: std::io::Error::other(e.to_string()),
    }
}

/// A delete of a key that is not there (aya reports it as a failed syscall with ENOENT).
fn not_found(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

fn ignore_absent(r: Result<(), MapError>) -> Result<(), MapError> {
    match r {
        Err(e) if not_found(&e) => Ok(()),
        r => r,
    }
}

fn lpm_key4(n: &ipnet::Ipv4Net) -> Key<[u8; 4]> {
    Key::new(n.prefix_len().into(), n.addr().octets())
}

fn lpm_key6(n: &ipnet::Ipv6Net) -> Key<[u8; 16]> {
    Key::new(n.prefix_len().into(), n.addr().octets())
}
