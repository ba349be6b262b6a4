//! [`Datapath`] for [`KernelDatapath`]: a batch of ipcache and policy changes is applied whole
//! or not at all, every kernel write logged with how to undo it.

use fqdnd_ipcache::{Datapath, DatapathChange, DatapathError, Identity};
use ipnet::IpNet;

use super::KernelDatapath;
use super::ipcache::ipc_key_error;
use super::policy::Refs;
use crate::sys::PolicyKey;

/// One kernel write of a batch, as it is undone when a later write fails.
#[derive(Debug)]
pub(super) enum Undo {
    /// A policy entry's counts changed (and, when its value changed, the kernel entry was
    /// written or deleted): the counts and the entry go back to `before`.
    Policy {
        key: PolicyKey,
        before: Option<Refs>,
    },
    /// Resync: a policy entry present before the restart (with these flags) was confirmed
    /// (and its value written).
    ResyncPolicy(PolicyKey, u32),
    /// A new ipcache prefix was written: delete it.
    IpcWritten(IpNet),
    /// An ipcache prefix's identity was replaced: write the old one back.
    IpcReplaced(IpNet, Identity),
    /// An ipcache prefix was deleted: write it back.
    IpcDeleted(IpNet, Identity),
    /// Resync: a prefix present before the restart (with this identity) was confirmed or
    /// rewritten.
    ResyncIpc(IpNet, Identity),
}

/// An error of the batch that `change` (0-based, of `len`) of failed with, saying that the
/// `undone` writes before it were undone.
fn refused(e: DatapathError, change: usize, len: usize, undone: usize) -> DatapathError {
    match e {
        // The engine counts these per map; the batch is whole-or-nothing by contract.
        DatapathError::MapFull { map } => DatapathError::MapFull { map },
        DatapathError::Io { operation, error } => DatapathError::Io {
            operation,
            error: std::io::Error::new(
                error.kind(),
                format!(
                    "{error} (change {} of {len} in the batch; the {undone} kernel writes \
                     before it were undone: the maps hold what they held before the batch)",
                    change + 1
                ),
            ),
        },
        other => other,
    }
}

impl KernelDatapath {
    fn apply_one(
        &mut self,
        change: &DatapathChange,
        undo: &mut Vec<Undo>,
    ) -> Result<(), DatapathError> {
        match change {
            DatapathChange::PolicyUpsert { endpoint, key } => {
                self.policy_upsert(*endpoint, key, undo)
            }
            DatapathChange::PolicyDelete { endpoint, key } => {
                self.policy_delete(*endpoint, key, undo)
            }
            DatapathChange::IpcacheUpsert { prefix, identity } => {
                self.ipcache_upsert(prefix.trunc(), *identity, undo)
            }
            DatapathChange::IpcacheDelete { prefix } => self.ipcache_delete(prefix.trunc(), undo),
        }
    }

    /// Undoes a batch's writes, newest first. Every step is tried; the first failure is
    /// returned (the maps then hold part of the batch until the next resync).
    fn rollback(&mut self, undo: Vec<Undo>) -> Result<(), DatapathError> {
        let mut first = None;
        for u in undo.into_iter().rev() {
            let r = match u {
                Undo::Policy { key, before } => {
                    let now = self.refs.get(&key).copied().and_then(Refs::flags);
                    match before {
                        Some(refs) => self.refs.insert(key, refs),
                        None => self.refs.remove(&key),
                    };
                    self.policy_set(&key, now, before.and_then(Refs::flags))
                }
                Undo::ResyncPolicy(k, old) => {
                    let now = self.refs.remove(&k).and_then(Refs::flags);
                    if let Some(rs) = &mut self.resync {
                        rs.policy.insert(k);
                    }
                    self.policy_set(&k, now, Some(old))
                }
                Undo::IpcWritten(prefix) => self
                    .ipc_remove(&prefix)
                    .map(|_| ())
                    .map_err(|e| ipc_key_error(&prefix, "ipcache delete (rollback)", e)),
                Undo::IpcReplaced(prefix, old) | Undo::IpcDeleted(prefix, old) => self
                    .ipc_insert(&prefix, old, 0)
                    .map_err(|e| ipc_key_error(&prefix, "ipcache upsert (rollback)", e)),
                Undo::ResyncIpc(prefix, before) => {
                    if let Some(rs) = &mut self.resync {
                        rs.ipcache.insert(prefix, before);
                    }
                    Ok(())
                }
            };
            if let Err(e) = r
                && first.is_none()
            {
                first = Some(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Datapath for KernelDatapath {
    /// Whole or not at all: every kernel write is logged with how to undo it (a policy
    /// entry's count, an ipcache prefix's previous identity — read only when the prefix
    /// existed), and when a write fails the ones before it are undone, newest first, before
    /// the error (which names the change and says so) is returned. Deleting what is not
    /// there is not an error.
    fn apply(&mut self, changes: &[DatapathChange]) -> Result<(), DatapathError> {
        let stats = self.resync.as_ref().map(|r| r.stats);
        let mut undo = Vec::new();
        for (i, change) in changes.iter().enumerate() {
            if let Err(e) = self.apply_one(change, &mut undo) {
                let undone = undo.len();
                if let Err(r) = self.rollback(undo) {
                    return Err(DatapathError::Io {
                        operation: "rolling back a refused batch",
                        error: std::io::Error::other(format!(
                            "change {} of {} failed ({e}) and undoing the writes before it \
                             failed too ({r}): the maps hold part of the batch until the next \
                             restart's resync",
                            i + 1,
                            changes.len()
                        )),
                    });
                }
                if let (Some(rs), Some(stats)) = (&mut self.resync, stats) {
                    rs.stats = stats;
                }
                return Err(refused(e, i, changes.len(), undone));
            }
        }
        Ok(())
    }
}
