//! [`KernelDatapath`]: ipcache and policy batches written into the pinned maps.

use std::collections::HashMap as StdHashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use aya::maps::lpm_trie::Key;
use aya::maps::{HashMap, LpmTrie, Map, MapData, MapError, RingBuf};
use fqdnd_ipcache::policy::Protocol;
use fqdnd_ipcache::{Datapath, DatapathChange, DatapathError, EndpointId, Identity};
use ipnet::IpNet;

use crate::error::Error;
use crate::sys::{self, DropEvent, EndpointValue, IpcacheValue, PolicyKey, PolicyValue};

/// The widest port range one policy key may cover: ranges are expanded into one map entry per
/// port (the policy map is a hash, not Cilium's LPM over ports). Wider ranges are refused.
pub const MAX_PORT_RANGE: u32 = 1024;

fn open_map(pin_dir: &Path, name: &str) -> Result<Map, Error> {
    Ok(Map::from_map_data(MapData::from_pin(pin_dir.join(name))?)?)
}

/// The ipcache and policy maps, opened from their pins, with the reference counts that let
/// overlapping policy keys (expanded ranges, repeated entries) share kernel entries.
#[derive(Debug)]
pub struct KernelDatapath {
    ipc4: LpmTrie<MapData, [u8; 4], IpcacheValue>,
    ipc6: LpmTrie<MapData, [u8; 16], IpcacheValue>,
    endpoints: HashMap<MapData, u32, EndpointValue>,
    policy: HashMap<MapData, PolicyKey, PolicyValue>,
    refs: StdHashMap<PolicyKey, u32>,
}

fn map_err(map: &'static str, operation: &'static str, e: MapError) -> DatapathError {
    if let MapError::SyscallError(s) = &e
        && matches!(s.io_error.raw_os_error(), Some(libc::E2BIG | libc::ENOSPC))
    {
        return DatapathError::MapFull { map };
    }
    DatapathError::Io {
        operation,
        source: std::io::Error::other(e.to_string()),
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

fn proto(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => sys::PROTO_TCP,
        Protocol::Udp => sys::PROTO_UDP,
        Protocol::Any => sys::PROTO_ANY,
    }
}

/// The kernel entries one policy key stands for.
fn expand(
    endpoint: EndpointId,
    key: &fqdnd_ipcache::PolicyKey,
) -> Result<Vec<PolicyKey>, DatapathError> {
    let base = PolicyKey {
        identity: key.identity.0,
        endpoint: endpoint.0,
        dport: 0,
        proto: proto(key.protocol),
        pad: [0; 3],
    };
    if key.port == 0 {
        return Ok(vec![base]);
    }
    let end = key.end_port.max(key.port);
    if u32::from(end - key.port) + 1 > MAX_PORT_RANGE {
        return Err(DatapathError::Io {
            operation: "expanding a policy port range",
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("ports {}-{end} exceed {MAX_PORT_RANGE} entries", key.port),
            ),
        });
    }
    Ok((key.port..=end)
        .map(|dport| PolicyKey { dport, ..base })
        .collect())
}

impl KernelDatapath {
    /// Opens the maps pinned in `pin_dir` (by [`crate::Loaded::load`]). Reference counts
    /// start empty: after a restart the caller re-applies its full policy state.
    pub fn open(pin_dir: &Path) -> Result<Self, Error> {
        Ok(KernelDatapath {
            ipc4: open_map(pin_dir, "fqdnd_ipc4")?.try_into()?,
            ipc6: open_map(pin_dir, "fqdnd_ipc6")?.try_into()?,
            endpoints: open_map(pin_dir, "fqdnd_endpoints")?.try_into()?,
            policy: open_map(pin_dir, "fqdnd_policy")?.try_into()?,
            refs: StdHashMap::new(),
        })
    }

    /// Registers the host-side veth `ifindex` of `endpoint`; `enforce` puts its egress under
    /// default deny (else its packets only feed conntrack).
    pub fn set_endpoint(
        &mut self,
        ifindex: u32,
        endpoint: EndpointId,
        enforce: bool,
    ) -> Result<(), DatapathError> {
        let flags = if enforce { sys::EP_ENFORCE_EGRESS } else { 0 };
        let v = EndpointValue {
            endpoint: endpoint.0,
            flags,
            pad: 0,
        };
        self.endpoints
            .insert(ifindex, v, 0)
            .map_err(|e| map_err("fqdnd_endpoints", "endpoint upsert", e))
    }

    /// Forgets an interface: its packets pass untouched.
    pub fn remove_endpoint(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        match self.endpoints.remove(&ifindex) {
            Ok(()) => Ok(()),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(map_err("fqdnd_endpoints", "endpoint delete", e)),
        }
    }

    /// The identity the kernel's ipcache gives `addr` (world when no prefix holds it).
    pub fn identity_of(&self, addr: IpAddr) -> Result<Identity, DatapathError> {
        let r = match addr {
            IpAddr::V4(a) => self.ipc4.get(&Key::new(32, a.octets()), 0),
            IpAddr::V6(a) => self.ipc6.get(&Key::new(128, a.octets()), 0),
        };
        match r {
            Ok(v) => Ok(Identity(v.identity)),
            Err(MapError::KeyNotFound) => Ok(Identity::world(addr.is_ipv4())),
            Err(e) => Err(map_err("ipcache", "ipcache lookup", e)),
        }
    }

    /// Every ipcache entry in the kernel, unordered.
    pub fn ipcache_entries(&self) -> Result<Vec<(IpNet, Identity)>, DatapathError> {
        let mut out = Vec::new();
        for r in self.ipc4.iter() {
            let (k, v) = r.map_err(|e| map_err("fqdnd_ipc4", "ipcache dump", e))?;
            let net = IpNet::new(Ipv4Addr::from(k.data()).into(), k.prefix_len() as u8);
            out.extend(net.ok().map(|n| (n, Identity(v.identity))));
        }
        for r in self.ipc6.iter() {
            let (k, v) = r.map_err(|e| map_err("fqdnd_ipc6", "ipcache dump", e))?;
            let net = IpNet::new(Ipv6Addr::from(k.data()).into(), k.prefix_len() as u8);
            out.extend(net.ok().map(|n| (n, Identity(v.identity))));
        }
        Ok(out)
    }

    /// Every policy entry in the kernel, sorted.
    pub fn policy_entries(&self) -> Result<Vec<PolicyKey>, DatapathError> {
        let mut out = Vec::new();
        for r in self.policy.iter() {
            let (k, _) = r.map_err(|e| map_err("fqdnd_policy", "policy dump", e))?;
            out.push(k);
        }
        out.sort();
        Ok(out)
    }

    fn policy_upsert(
        &mut self,
        endpoint: EndpointId,
        key: &fqdnd_ipcache::PolicyKey,
    ) -> Result<(), DatapathError> {
        for k in expand(endpoint, key)? {
            if let Some(n) = self.refs.get_mut(&k) {
                *n += 1;
                continue;
            }
            let v = PolicyValue {
                flags: sys::POLICY_ALLOW,
            };
            self.policy
                .insert(k, v, 0)
                .map_err(|e| map_err("fqdnd_policy", "policy upsert", e))?;
            self.refs.insert(k, 1);
        }
        Ok(())
    }

    fn policy_delete(
        &mut self,
        endpoint: EndpointId,
        key: &fqdnd_ipcache::PolicyKey,
    ) -> Result<(), DatapathError> {
        for k in expand(endpoint, key)? {
            let Some(n) = self.refs.get_mut(&k) else {
                continue;
            };
            *n -= 1;
            if *n == 0 {
                self.refs.remove(&k);
                match self.policy.remove(&k) {
                    Ok(()) => {}
                    Err(e) if not_found(&e) => {}
                    Err(e) => return Err(map_err("fqdnd_policy", "policy delete", e)),
                }
            }
        }
        Ok(())
    }
}

impl Datapath for KernelDatapath {
    fn apply(&mut self, changes: &[DatapathChange]) -> Result<(), DatapathError> {
        for change in changes {
            match change {
                DatapathChange::PolicyUpsert { endpoint, key } => {
                    self.policy_upsert(*endpoint, key)?
                }
                DatapathChange::PolicyDelete { endpoint, key } => {
                    self.policy_delete(*endpoint, key)?
                }
                DatapathChange::IpcacheUpsert { prefix, identity } => {
                    let v = IpcacheValue {
                        identity: identity.0,
                    };
                    match prefix.trunc() {
                        IpNet::V4(n) => self
                            .ipc4
                            .insert(&Key::new(n.prefix_len().into(), n.addr().octets()), v, 0)
                            .map_err(|e| map_err("fqdnd_ipc4", "ipcache upsert", e))?,
                        IpNet::V6(n) => self
                            .ipc6
                            .insert(&Key::new(n.prefix_len().into(), n.addr().octets()), v, 0)
                            .map_err(|e| map_err("fqdnd_ipc6", "ipcache upsert", e))?,
                    }
                }
                DatapathChange::IpcacheDelete { prefix } => {
                    let r = match prefix.trunc() {
                        IpNet::V4(n) => self
                            .ipc4
                            .remove(&Key::new(n.prefix_len().into(), n.addr().octets())),
                        IpNet::V6(n) => self
                            .ipc6
                            .remove(&Key::new(n.prefix_len().into(), n.addr().octets())),
                    };
                    match r {
                        Ok(()) => {}
                        Err(e) if not_found(&e) => {}
                        Err(e) => return Err(map_err("ipcache", "ipcache delete", e)),
                    }
                }
            }
        }
        Ok(())
    }
}

/// The drop-event ring buffer, opened from its pin.
pub struct Events {
    ring: RingBuf<MapData>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// Opens `fqdnd_events` pinned in `pin_dir`.
    pub fn open(pin_dir: &Path) -> Result<Self, Error> {
        Ok(Events {
            ring: open_map(pin_dir, "fqdnd_events")?.try_into()?,
        })
    }

    /// Takes every event waiting in the ring (non-blocking).
    pub fn drain(&mut self) -> Vec<DropEvent> {
        let mut out = Vec::new();
        while let Some(item) = self.ring.next() {
            out.extend(DropEvent::from_bytes(&item));
        }
        out
    }
}
