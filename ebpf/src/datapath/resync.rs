//! A daemon restart's resync: the ipcache and policy entries already in the kernel are
//! confirmed by the re-applied state without a write, the rest deleted; nothing is flushed.

use std::collections::{HashMap as StdHashMap, HashSet};

use aya::maps::lpm_trie::Key;
use fqdnd_ipcache::{DatapathError, Identity};
use ipnet::IpNet;

use super::{KernelDatapath, ignore_absent, lpm_key4, lpm_key6};
use crate::error::Error;
use crate::sys::PolicyKey;

/// What [`KernelDatapath::finish_resync`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResyncStats {
    /// Entries already in the kernel with the value the new state wrote (not rewritten).
    pub kept: usize,
    /// Entries written: new ones and ones whose value changed.
    pub added: usize,
    /// Entries the new state did not write, deleted.
    pub removed: usize,
}

/// The kernel entries recorded by [`KernelDatapath::begin_resync`] and not yet confirmed.
#[derive(Debug, Default)]
pub(super) struct Resync {
    pub(super) ipcache: StdHashMap<IpNet, Identity>,
    pub(super) policy: HashSet<PolicyKey>,
    pub(super) stats: ResyncStats,
}

fn datapath_to_error(e: DatapathError) -> Error {
    Error::Io {
        what: "reading the maps".to_owned(),
        error: std::io::Error::other(e.to_string()),
    }
}

impl KernelDatapath {
    /// Starts a resync (daemon restart): records every ipcache and policy entry in the kernel
    /// as unconfirmed and forgets the reference counts. The caller then applies its whole
    /// desired state as upserts: an entry already present with the same value is confirmed
    /// without a write (no packet sees a gap), others are written. [`Self::finish_resync`]
    /// deletes what was not confirmed. Entries are never flushed.
    pub fn begin_resync(&mut self) -> Result<(), Error> {
        let mut rs = Resync::default();
        for (net, id) in self.ipcache_entries().map_err(datapath_to_error)? {
            rs.ipcache.insert(net, id);
        }
        rs.policy = self
            .policy_entries()
            .map_err(datapath_to_error)?
            .into_iter()
            .collect();
        self.refs.clear();
        self.resync = Some(rs);
        Ok(())
    }

    /// Ends a resync: deletes every entry recorded by [`Self::begin_resync`] that the new
    /// state did not write again, and says what was kept, added and removed. Without a
    /// resync in progress it does nothing and returns zeroes.
    pub fn finish_resync(&mut self) -> Result<ResyncStats, Error> {
        let Some(rs) = self.resync.take() else {
            return Ok(ResyncStats::default());
        };
        let mut stats = rs.stats;
        for net in rs.ipcache.keys() {
            let r = match net {
                IpNet::V4(n) => self.ipc4.remove(&lpm_key4(n)),
                IpNet::V6(n) => self.ipc6.remove(&lpm_key6(n)),
            };
            ignore_absent(r)?;
            stats.removed += 1;
        }
        for k in &rs.policy {
            ignore_absent(self.policy.remove(&Key::new(k.prefixlen, k.data())))?;
            stats.removed += 1;
        }
        Ok(stats)
    }
}
