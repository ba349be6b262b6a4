//! Configurable map sizes, the layout check of pinned maps, and their migration to new sizes
//! ("maps are migrated, never flushed"): see [`crate::Loaded::load_with`] and
//! docs/ebpf-plan.md.

use std::collections::{HashMap as StdHashMap, HashSet};
use std::hash::Hash;
use std::path::{Path, PathBuf};

use aya::Pod;
use aya::maps::lpm_trie::Key;
use aya::maps::{Array, HashMap, LpmTrie, Map, MapData, MapError, MapInfo, MapType};

use crate::error::Error;
use crate::sys::{
    CtKey, CtValue, DnsProxy, EndpointValue, EpAddrKey, EpAddrValue, FragKey, FragValue,
    IpcacheKey4, IpcacheKey6, IpcacheValue, LbBackend, LbRevNat, LbSvcKey, LbSvcValue, OriginKey,
    PolicyData, PolicyKey, PolicyValue, Settings, SockCfg, SockOrigin,
};

/// `max_entries` of the maps whose size is configurable. [`Default`] = the sizes in
/// `include/fqdnd_maps.h` (the object's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MapSizes {
    /// `fqdnd_ipc4` and `fqdnd_ipc6` (LPM tries, each).
    pub ipcache: u32,
    /// `fqdnd_policy`.
    pub policy: u32,
    /// `fqdnd_ct` (LRU hash).
    pub conntrack: u32,
    /// `fqdnd_endpoints`.
    pub endpoints: u32,
    /// `fqdnd_clients4` and `fqdnd_clients6` (LPM tries, each).
    pub clients: u32,
    /// `fqdnd_lb_svc` (service entries and backend slots together) and `fqdnd_lb_revnat`.
    pub lb_services: u32,
    /// `fqdnd_lb_backends`.
    pub lb_backends: u32,
    /// `fqdnd_ep_addrs` (the addresses of endpoints with source validation).
    pub endpoint_addresses: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        MapSizes {
            ipcache: 512_000,
            policy: 65_536,
            conntrack: 262_144,
            endpoints: 65_536,
            clients: 65_536,
            lb_services: 65_536,
            lb_backends: 65_536,
            endpoint_addresses: 131_072,
        }
    }
}

/// The ring buffer's size in bytes (`FQDND_EVENTS_BYTES`; not configurable).
const EVENTS_BYTES: u32 = 256 * 1024;
/// The fragment map's size (`FQDND_FRAGS_MAX`; not configurable).
const FRAGS: u32 = 8192;
/// The cgroup endpoint map's size (`FQDND_CGROUPS_MAX`; not configurable).
const CGROUPS: u32 = 4096;
/// The redirected sockets' maps' size (`FQDND_SOCK_ORIGINS_MAX`; not configurable: LRU).
const SOCK_ORIGINS: u32 = 16384;
/// `BPF_F_NO_PREALLOC`.
const NO_PREALLOC: u32 = 1;

/// One map moved to a new size by [`crate::Loaded::load_with`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Migration {
    /// The map's name (its pin name).
    pub map: String,
    /// `max_entries` of the map that was pinned.
    pub from_max: u32,
    /// `max_entries` of the map pinned now.
    pub to_max: u32,
    /// Entries in the old map when it was copied (the first, complete pass).
    pub entries_before: usize,
    /// Entries in the new map once the switch is complete (conntrack can differ from
    /// `entries_before` by the flows packets created or the LRU evicted meanwhile).
    pub entries_after: usize,
}

/// How a map's entries are copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ipc4,
    Ipc6,
    Endpoints,
    Clients4,
    Clients6,
    DnsProxy,
    Policy,
    Ct,
    Events,
    LbSvc,
    LbBackends,
    LbRevNat,
    EpAddrs,
    Frags,
    Settings,
    Cgroups,
    SockDns,
    DnsOrigins,
    SockCfg,
}

/// What the object (with [`MapSizes`] applied) creates for one map.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MapSpec {
    pub(crate) name: &'static str,
    kind: Kind,
    map_type: MapType,
    key_size: u32,
    value_size: u32,
    flags: u32,
    pub(crate) max_entries: u32,
}

fn size<T>() -> u32 {
    u32::try_from(size_of::<T>()).unwrap_or(u32::MAX)
}

/// Every map of the object, as `bpf/lib/maps.h` declares it, with `sizes` applied. A test
/// (`kernel::map_specs_match_the_object`) compares it with the kernel's view of a fresh load.
pub(crate) fn specs(sizes: &MapSizes) -> [MapSpec; 19] {
    let s = |name, kind, map_type, key_size, value_size, flags, max_entries| MapSpec {
        name,
        kind,
        map_type,
        key_size,
        value_size,
        flags,
        max_entries,
    };
    [
        s(
            "fqdnd_ipc4",
            Kind::Ipc4,
            MapType::LpmTrie,
            size::<IpcacheKey4>(),
            size::<IpcacheValue>(),
            NO_PREALLOC,
            sizes.ipcache,
        ),
        s(
            "fqdnd_ipc6",
            Kind::Ipc6,
            MapType::LpmTrie,
            size::<IpcacheKey6>(),
            size::<IpcacheValue>(),
            NO_PREALLOC,
            sizes.ipcache,
        ),
        s(
            "fqdnd_endpoints",
            Kind::Endpoints,
            MapType::Hash,
            size::<u32>(),
            size::<EndpointValue>(),
            0,
            sizes.endpoints,
        ),
        s(
            "fqdnd_policy",
            Kind::Policy,
            MapType::LpmTrie,
            size::<PolicyKey>(),
            size::<PolicyValue>(),
            NO_PREALLOC,
            sizes.policy,
        ),
        s(
            "fqdnd_ct",
            Kind::Ct,
            MapType::LruHash,
            size::<CtKey>(),
            size::<CtValue>(),
            0,
            sizes.conntrack,
        ),
        s(
            "fqdnd_events",
            Kind::Events,
            MapType::RingBuf,
            0,
            0,
            0,
            EVENTS_BYTES,
        ),
        s(
            "fqdnd_clients4",
            Kind::Clients4,
            MapType::LpmTrie,
            size::<IpcacheKey4>(),
            size::<EndpointValue>(),
            NO_PREALLOC,
            sizes.clients,
        ),
        s(
            "fqdnd_clients6",
            Kind::Clients6,
            MapType::LpmTrie,
            size::<IpcacheKey6>(),
            size::<EndpointValue>(),
            NO_PREALLOC,
            sizes.clients,
        ),
        s(
            "fqdnd_dns_proxy",
            Kind::DnsProxy,
            MapType::Array,
            size::<u32>(),
            size::<DnsProxy>(),
            0,
            1,
        ),
        s(
            "fqdnd_lb_svc",
            Kind::LbSvc,
            MapType::Hash,
            size::<LbSvcKey>(),
            size::<LbSvcValue>(),
            NO_PREALLOC,
            sizes.lb_services,
        ),
        s(
            "fqdnd_lb_backends",
            Kind::LbBackends,
            MapType::Hash,
            size::<u16>(),
            size::<LbBackend>(),
            NO_PREALLOC,
            sizes.lb_backends,
        ),
        s(
            "fqdnd_lb_revnat",
            Kind::LbRevNat,
            MapType::Hash,
            size::<u16>(),
            size::<LbRevNat>(),
            NO_PREALLOC,
            sizes.lb_services,
        ),
        s(
            "fqdnd_ep_addrs",
            Kind::EpAddrs,
            MapType::Hash,
            size::<EpAddrKey>(),
            size::<EpAddrValue>(),
            NO_PREALLOC,
            sizes.endpoint_addresses,
        ),
        s(
            "fqdnd_frags",
            Kind::Frags,
            MapType::LruHash,
            size::<FragKey>(),
            size::<FragValue>(),
            0,
            FRAGS,
        ),
        s(
            "fqdnd_settings",
            Kind::Settings,
            MapType::Array,
            size::<u32>(),
            size::<Settings>(),
            0,
            1,
        ),
        s(
            "fqdnd_cgroups",
            Kind::Cgroups,
            MapType::Hash,
            size::<u64>(),
            size::<EndpointValue>(),
            NO_PREALLOC,
            CGROUPS,
        ),
        s(
            "fqdnd_sock_dns",
            Kind::SockDns,
            MapType::LruHash,
            size::<u64>(),
            size::<SockOrigin>(),
            0,
            SOCK_ORIGINS,
        ),
        s(
            "fqdnd_dns_origins",
            Kind::DnsOrigins,
            MapType::LruHash,
            size::<OriginKey>(),
            size::<SockOrigin>(),
            0,
            SOCK_ORIGINS,
        ),
        s(
            "fqdnd_sock_cfg",
            Kind::SockCfg,
            MapType::Array,
            size::<u32>(),
            size::<SockCfg>(),
            0,
            1,
        ),
    ]
}

impl MapSizes {
    /// Zero is refused for every size (the kernel would refuse the map).
    pub(crate) fn validate(&self) -> Result<(), Error> {
        for (map, size) in [
            ("ipcache", self.ipcache),
            ("policy", self.policy),
            ("conntrack", self.conntrack),
            ("endpoints", self.endpoints),
            ("clients", self.clients),
            ("lbServices", self.lb_services),
            ("lbBackends", self.lb_backends),
            ("endpointAddresses", self.endpoint_addresses),
        ] {
            if size == 0 {
                return Err(Error::InvalidMapSize { map, size });
            }
        }
        Ok(())
    }
}

fn describe(map_type: Option<MapType>, key: u32, value: u32, flags: u32) -> String {
    let t = map_type.map_or_else(|| "unknown type".to_owned(), |t| format!("{t:?}"));
    format!("{t}, key {key} B, value {value} B, flags {flags:#x}")
}

/// The pinned map's type, key and value size and flags equal what the object creates
/// (`max_entries` may differ: that is a migration, not a layout change).
pub(crate) fn check_layout(spec: &MapSpec, info: &MapInfo) -> Result<(), Error> {
    let t = info.map_type().ok();
    if t == Some(spec.map_type)
        && info.key_size() == spec.key_size
        && info.value_size() == spec.value_size
        && info.map_flags() == spec.flags
    {
        return Ok(());
    }
    Err(Error::MapLayout {
        map: spec.name.to_owned(),
        pinned: describe(t, info.key_size(), info.value_size(), info.map_flags()),
        wanted: describe(
            Some(spec.map_type),
            spec.key_size,
            spec.value_size,
            spec.flags,
        ),
    })
}

/// The directory in `pin_dir` where a migration creates the new maps before their pins
/// replace the canonical ones.
pub(crate) fn staging_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("migrating")
}

/// Removes a staging directory and every pin in it (missing is fine). Its maps were never
/// used by an attached program: the pins move out of it before any link is updated.
pub(crate) fn remove_staging(dir: &Path) -> Result<(), Error> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io {
            what: format!("removing the migration staging directory {}", dir.display()),
            error: source,
        }),
    }
}

/// Other map-layout versions next to `pin_dir` (`<parent>/v<N>` directories other than
/// `pin_dir` itself), sorted. Their maps are **not** migrated by [`crate::Loaded::load_with`]:
/// an ABI bump means the entries changed meaning, and no converter exists. Their pinned
/// links still run the old programs on their interfaces until removed
/// ([`crate::detach_pinned`] with that directory); the daemon should report them.
pub fn other_abi_dirs(pin_dir: &Path) -> Vec<PathBuf> {
    let Some(parent) = pin_dir.parent() else {
        return Vec::new();
    };
    let Ok(dir) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = dir
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.strip_prefix('v')
                    .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .map(|e| e.path())
        .filter(|p| p.as_path() != pin_dir)
        .collect();
    out.sort();
    out
}

fn skip_vanished<T>(r: Result<T, MapError>) -> Result<Option<T>, Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        // deleted (LRU eviction) between the key walk and the lookup
        Err(MapError::KeyNotFound) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn dump_hash<K: Pod + Eq + Hash, V: Pod>(m: &Map) -> Result<Vec<(K, V)>, Error> {
    let h: HashMap<&MapData, K, V> = m.try_into()?;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for r in h.iter() {
        // a key walk restarts from the first key when its cursor was deleted: skip repeats
        if let Some((k, v)) = skip_vanished(r)?
            && seen.insert(k)
        {
            out.push((k, v));
        }
    }
    Ok(out)
}

fn dump_lpm<K: Pod + Eq + Hash, V: Pod>(m: &Map) -> Result<Vec<(u32, K, V)>, Error> {
    let t: LpmTrie<&MapData, K, V> = m.try_into()?;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for r in t.iter() {
        if let Some((k, v)) = skip_vanished(r)? {
            let (len, data) = (k.prefix_len(), k.data());
            if seen.insert((len, data)) {
                out.push((len, data, v));
            }
        }
    }
    Ok(out)
}

/// A full map: the write failed for lack of room.
fn full(e: &MapError) -> bool {
    matches!(e, MapError::SyscallError(s)
        if matches!(s.io_error.raw_os_error(), Some(libc::E2BIG | libc::ENOSPC | libc::ENOMEM)))
}

fn too_small(name: &str, entries: usize, max_entries: u32) -> Error {
    Error::MapTooSmall {
        map: name.to_owned(),
        entries,
        max_entries,
    }
}

fn copy_hash<K: Pod + Eq + Hash, V: Pod>(
    name: &str,
    old: &Map,
    new: &mut Map,
    max: u32,
) -> Result<usize, Error> {
    let entries = dump_hash::<K, V>(old)?;
    let mut h: HashMap<&mut MapData, K, V> = new.try_into()?;
    for (k, v) in &entries {
        h.insert(k, v, 0).map_err(|e| {
            if full(&e) {
                too_small(name, entries.len(), max)
            } else {
                e.into()
            }
        })?;
    }
    Ok(entries.len())
}

fn copy_lpm<K: Pod + Eq + Hash, V: Pod>(
    name: &str,
    old: &Map,
    new: &mut Map,
    max: u32,
) -> Result<usize, Error> {
    let entries = dump_lpm::<K, V>(old)?;
    let mut t: LpmTrie<&mut MapData, K, V> = new.try_into()?;
    for (len, data, v) in &entries {
        t.insert(&Key::new(*len, *data), v, 0).map_err(|e| {
            if full(&e) {
                too_small(name, entries.len(), max)
            } else {
                e.into()
            }
        })?;
    }
    Ok(entries.len())
}

fn copy_array<V: Pod>(name: &str, old: &Map, new: &mut Map) -> Result<usize, Error> {
    let a: Array<&MapData, V> = old.try_into()?;
    let mut b: Array<&mut MapData, V> = new.try_into()?;
    if a.len() > b.len() {
        return Err(too_small(name, a.len() as usize, b.len()));
    }
    for i in 0..a.len() {
        b.set(i, a.get(&i, 0)?, 0)?;
    }
    Ok(a.len() as usize)
}

/// Copies every entry of `old` into `new` (the same layout); returns how many. A map too
/// small for them is [`Error::MapTooSmall`] (nothing is dropped silently); the ring buffer has
/// no entries to copy.
fn copy(spec: &MapSpec, old: &Map, new: &mut Map) -> Result<usize, Error> {
    let (n, max) = (spec.name, spec.max_entries);
    match spec.kind {
        Kind::Ipc4 => copy_lpm::<[u8; 4], IpcacheValue>(n, old, new, max),
        Kind::Ipc6 => copy_lpm::<[u8; 16], IpcacheValue>(n, old, new, max),
        Kind::Clients4 => copy_lpm::<[u8; 4], EndpointValue>(n, old, new, max),
        Kind::Clients6 => copy_lpm::<[u8; 16], EndpointValue>(n, old, new, max),
        Kind::Endpoints => copy_hash::<u32, EndpointValue>(n, old, new, max),
        Kind::Policy => copy_lpm::<PolicyData, PolicyValue>(n, old, new, max),
        Kind::Ct => copy_hash::<CtKey, CtValue>(n, old, new, max),
        Kind::DnsProxy => copy_array::<DnsProxy>(n, old, new),
        Kind::Events => Ok(0),
        Kind::LbSvc => copy_hash::<LbSvcKey, LbSvcValue>(n, old, new, max),
        Kind::LbBackends => copy_hash::<u16, LbBackend>(n, old, new, max),
        Kind::LbRevNat => copy_hash::<u16, LbRevNat>(n, old, new, max),
        Kind::EpAddrs => copy_hash::<EpAddrKey, EpAddrValue>(n, old, new, max),
        Kind::Frags => copy_hash::<FragKey, FragValue>(n, old, new, max),
        Kind::Settings => copy_array::<Settings>(n, old, new),
        Kind::Cgroups => copy_hash::<u64, EndpointValue>(n, old, new, max),
        Kind::SockDns => copy_hash::<u64, SockOrigin>(n, old, new, max),
        Kind::DnsOrigins => copy_hash::<OriginKey, SockOrigin>(n, old, new, max),
        Kind::SockCfg => copy_array::<SockCfg>(n, old, new),
    }
}

fn count_hash<K: Pod + Eq + Hash, V: Pod>(m: &Map) -> Result<usize, Error> {
    let h: HashMap<&MapData, K, V> = m.try_into()?;
    let mut seen = HashSet::new();
    for k in h.keys() {
        seen.insert(k?);
    }
    Ok(seen.len())
}

fn count_lpm<K: Pod + Eq + Hash, V: Pod>(m: &Map) -> Result<usize, Error> {
    let t: LpmTrie<&MapData, K, V> = m.try_into()?;
    let mut seen = HashSet::new();
    for k in t.keys() {
        let k = k?;
        seen.insert((k.prefix_len(), k.data()));
    }
    Ok(seen.len())
}

/// The number of entries in `m` (arrays: their length; the ring buffer: 0), from a walk of
/// the keys (one syscall per entry).
pub(crate) fn count(spec: &MapSpec, m: &Map) -> Result<usize, Error> {
    Ok(match spec.kind {
        Kind::Ipc4 => count_lpm::<[u8; 4], IpcacheValue>(m)?,
        Kind::Ipc6 => count_lpm::<[u8; 16], IpcacheValue>(m)?,
        Kind::Clients4 => count_lpm::<[u8; 4], EndpointValue>(m)?,
        Kind::Clients6 => count_lpm::<[u8; 16], EndpointValue>(m)?,
        Kind::Endpoints => count_hash::<u32, EndpointValue>(m)?,
        Kind::Policy => count_lpm::<PolicyData, PolicyValue>(m)?,
        Kind::Ct => count_hash::<CtKey, CtValue>(m)?,
        Kind::DnsProxy => {
            let a: Array<&MapData, DnsProxy> = m.try_into()?;
            a.len() as usize
        }
        Kind::Events => 0,
        Kind::LbSvc => count_hash::<LbSvcKey, LbSvcValue>(m)?,
        Kind::LbBackends => count_hash::<u16, LbBackend>(m)?,
        Kind::LbRevNat => count_hash::<u16, LbRevNat>(m)?,
        Kind::EpAddrs => count_hash::<EpAddrKey, EpAddrValue>(m)?,
        Kind::Frags => count_hash::<FragKey, FragValue>(m)?,
        Kind::Settings => {
            let a: Array<&MapData, Settings> = m.try_into()?;
            a.len() as usize
        }
        Kind::Cgroups => count_hash::<u64, EndpointValue>(m)?,
        Kind::SockDns => count_hash::<u64, SockOrigin>(m)?,
        Kind::DnsOrigins => count_hash::<OriginKey, SockOrigin>(m)?,
        Kind::SockCfg => {
            let a: Array<&MapData, SockCfg> = m.try_into()?;
            a.len() as usize
        }
    })
}

/// A pinned map whose size differs from the wanted one.
pub(crate) struct Pending {
    pub(crate) spec: MapSpec,
    /// The old map, held open by fd: its pin is replaced during the switch, and conntrack is
    /// copied from it a second time after the links were updated.
    pub(crate) old: Map,
    pub(crate) from_max: u32,
    pub(crate) entries_before: usize,
    /// Conntrack: the entries of the first copy, to find what changed since.
    pub(crate) ct_copied: StdHashMap<CtKey, CtValue>,
}

impl Pending {
    /// A map migrated from `old` (of `from_max` entries) to `spec`.
    pub(crate) fn new(spec: MapSpec, old: Map, from_max: u32) -> Self {
        Pending {
            spec,
            old,
            from_max,
            entries_before: 0,
            ct_copied: StdHashMap::new(),
        }
    }

    /// The first, complete copy into `new`. An LRU map that evicted while being filled (it
    /// can before it is full: per-CPU free lists) is refused like a full one.
    pub(crate) fn copy_into(&mut self, new: &mut Map) -> Result<(), Error> {
        if self.spec.kind != Kind::Ct {
            self.entries_before = copy(&self.spec, &self.old, new)?;
            return Ok(());
        }
        let (name, max) = (self.spec.name, self.spec.max_entries);
        let entries = dump_hash::<CtKey, CtValue>(&self.old)?;
        let mut h: HashMap<&mut MapData, CtKey, CtValue> = new.try_into()?;
        for (k, v) in &entries {
            h.insert(k, v, 0).map_err(|e| {
                if full(&e) {
                    too_small(name, entries.len(), max)
                } else {
                    e.into()
                }
            })?;
        }
        self.entries_before = entries.len();
        if count(&self.spec, new)? < self.entries_before {
            return Err(too_small(name, self.entries_before, max));
        }
        self.ct_copied = entries.into_iter().collect();
        Ok(())
    }

    /// After the links run the new programs: copies the conntrack entries the old programs
    /// created or refreshed since the first copy, unless the new map has a later `last_seen`
    /// for them (the new programs saw the flow since). Returns how many were written. Other
    /// maps are written only by the daemon, which is not running its writers during a load.
    pub(crate) fn recopy_changed(&self, new: &mut Map) -> Result<usize, Error> {
        if self.spec.kind != Kind::Ct {
            return Ok(0);
        }
        let old = dump_hash::<CtKey, CtValue>(&self.old)?;
        let mut h: HashMap<&mut MapData, CtKey, CtValue> = new.try_into()?;
        let mut n = 0;
        for (k, v) in old {
            if self.ct_copied.get(&k) == Some(&v) {
                continue;
            }
            let newer = match h.get(&k, 0) {
                Ok(c) => v.last_seen_ns > c.last_seen_ns,
                Err(MapError::KeyNotFound) => true,
                Err(e) => return Err(e.into()),
            };
            if newer {
                // full (LRU): the kernel evicts the least recently used, like any new flow
                h.insert(k, v, 0)?;
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_abi_dirs_lists_sibling_versions() {
        let root = std::env::temp_dir().join(format!("fqdnd-abi-{}", std::process::id()));
        for d in ["v1", "v2", "v10", "links", "vx", "v"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("v3"), b"a file").unwrap();
        let got = other_abi_dirs(&root.join("v2"));
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(got, vec![root.join("v1"), root.join("v10")]);
        assert!(other_abi_dirs(Path::new("/")).is_empty());
    }

    #[test]
    fn default_sizes_are_the_headers() {
        let h = include_str!("../include/fqdnd_maps.h");
        let define = |name: &str| -> u32 {
            h.lines()
                .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        let d = MapSizes::default();
        assert_eq!(d.ipcache, define("FQDND_IPCACHE_V4_MAX"));
        assert_eq!(d.ipcache, define("FQDND_IPCACHE_V6_MAX"));
        assert_eq!(d.policy, define("FQDND_POLICY_MAX"));
        assert_eq!(d.endpoints, define("FQDND_ENDPOINTS_MAX"));
        assert_eq!(d.conntrack, define("FQDND_CT_MAX"));
        assert_eq!(d.clients, define("FQDND_CLIENTS_MAX"));
        assert_eq!(d.lb_services, define("FQDND_LB_SERVICES_MAX"));
        assert_eq!(d.lb_backends, define("FQDND_LB_BACKENDS_MAX"));
        assert_eq!(d.endpoint_addresses, define("FQDND_EP_ADDRS_MAX"));
        assert_eq!(FRAGS, define("FQDND_FRAGS_MAX"));
        assert_eq!(CGROUPS, define("FQDND_CGROUPS_MAX"));
        assert_eq!(SOCK_ORIGINS, define("FQDND_SOCK_ORIGINS_MAX"));
        assert!(MapSizes { ipcache: 0, ..d }.validate().is_err());
        assert!(d.validate().is_ok());
    }
}
