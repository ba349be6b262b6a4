//! The ipcache (`fqdnd_ipc4/6`): prefixes and their identities, written one at a time with
//! what undoes each write, and read back.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::maps::MapError;
use aya::maps::lpm_trie::Key;
use fqdnd_ipcache::{DatapathError, Identity};
use ipnet::IpNet;

use super::batch::Undo;
use super::{KernelDatapath, lpm_key4, lpm_key6, map_err, not_found};
use crate::sys::IpcacheValue;

pub(super) fn ipc_key_error(prefix: &IpNet, operation: &'static str, e: MapError) -> DatapathError {
    let map = if prefix.addr().is_ipv4() {
        "fqdnd_ipc4"
    } else {
        "fqdnd_ipc6"
    };
    match map_err(map, operation, e) {
        DatapathError::Io { operation, error } => DatapathError::Io {
            operation,
            error: std::io::Error::new(error.kind(), format!("{prefix}: {error}")),
        },
        other => other,
    }
}

/// The key already exists (a `BPF_NOEXIST` insert).
fn exists(e: &MapError) -> bool {
    matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::EEXIST))
}

const BPF_NOEXIST: u64 = 1;

impl KernelDatapath {
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

    pub(super) fn ipc_insert(
        &mut self,
        prefix: &IpNet,
        identity: Identity,
        flags: u64,
    ) -> Result<(), MapError> {
        let v = IpcacheValue {
            identity: identity.0,
        };
        match prefix {
            IpNet::V4(n) => self.ipc4.insert(&lpm_key4(n), v, flags),
            IpNet::V6(n) => self.ipc6.insert(&lpm_key6(n), v, flags),
        }
    }

    /// The value of the longest prefix of `prefix`'s length or shorter holding its address:
    /// `prefix`'s own when it exists (LPM lookups are not exact, deletes are).
    fn ipc_lookup(&self, prefix: &IpNet) -> Result<Option<Identity>, MapError> {
        let r = match prefix {
            IpNet::V4(n) => self.ipc4.get(&lpm_key4(n), 0),
            IpNet::V6(n) => self.ipc6.get(&lpm_key6(n), 0),
        };
        match r {
            Ok(v) => Ok(Some(Identity(v.identity))),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) fn ipc_remove(&mut self, prefix: &IpNet) -> Result<bool, MapError> {
        let r = match prefix {
            IpNet::V4(n) => self.ipc4.remove(&lpm_key4(n)),
            IpNet::V6(n) => self.ipc6.remove(&lpm_key6(n)),
        };
        match r {
            Ok(()) => Ok(true),
            Err(e) if not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// An ipcache upsert: a new prefix costs one write (`BPF_NOEXIST`); only when the prefix
    /// exists is its identity read (for the undo log) and, if different, replaced.
    pub(super) fn ipcache_upsert(
        &mut self,
        prefix: IpNet,
        identity: Identity,
        undo: &mut Vec<Undo>,
    ) -> Result<(), DatapathError> {
        if let Some(rs) = &mut self.resync
            && let Some(before) = rs.ipcache.remove(&prefix)
        {
            undo.push(Undo::ResyncIpc(prefix, before));
            if before == identity {
                // present before the restart with this identity: confirmed
                rs.stats.kept += 1;
                return Ok(());
            }
        }
        match self.ipc_insert(&prefix, identity, BPF_NOEXIST) {
            Ok(()) => {
                undo.push(Undo::IpcWritten(prefix));
            }
            Err(e) if exists(&e) => {
                let old = self
                    .ipc_lookup(&prefix)
                    .map_err(|e| ipc_key_error(&prefix, "ipcache lookup", e))?;
                if old == Some(identity) {
                    if let Some(rs) = &mut self.resync {
                        rs.stats.kept += 1;
                    }
                    return Ok(());
                }
                self.ipc_insert(&prefix, identity, 0)
                    .map_err(|e| ipc_key_error(&prefix, "ipcache upsert", e))?;
                undo.push(match old {
                    Some(old) => Undo::IpcReplaced(prefix, old),
                    None => Undo::IpcWritten(prefix),
                });
            }
            Err(e) => return Err(ipc_key_error(&prefix, "ipcache upsert", e)),
        }
        if let Some(rs) = &mut self.resync {
            rs.stats.added += 1;
        }
        Ok(())
    }

    pub(super) fn ipcache_delete(
        &mut self,
        prefix: IpNet,
        undo: &mut Vec<Undo>,
    ) -> Result<(), DatapathError> {
        if let Some(rs) = &mut self.resync
            && let Some(before) = rs.ipcache.remove(&prefix)
        {
            undo.push(Undo::ResyncIpc(prefix, before));
        }
        let old = self
            .ipc_lookup(&prefix)
            .map_err(|e| ipc_key_error(&prefix, "ipcache lookup", e))?;
        let removed = self
            .ipc_remove(&prefix)
            .map_err(|e| ipc_key_error(&prefix, "ipcache delete", e))?;
        // deleted: the exact entry existed, so the lookup above returned its identity
        if let (true, Some(old)) = (removed, old) {
            undo.push(Undo::IpcDeleted(prefix, old));
        }
        Ok(())
    }
}
