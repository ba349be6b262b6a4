//! The datapath behind the engine: none (a gateway without enforcement: the engine's IpCache
//! is the only copy, what the admin API lists) or the kernel's pinned maps (node, enforcing
//! gateway). One enum rather than a trait object so the daemon can still reach the kernel
//! handle (resync, listings) through the engine lock.

use fqdnd_ebpf::KernelDatapath;
use fqdnd_ipcache::{Datapath, DatapathChange, DatapathError};

/// Where the engine's ipcache and policy batches go.
#[derive(Debug)]
pub enum AnyDatapath {
    /// Nowhere: nothing enforces, and nothing reads a copy (a 1M-entry restore spent ~10 % of
    /// its time writing one that nothing read).
    Unenforced,
    /// The pinned BPF maps.
    Kernel(Box<KernelDatapath>),
}

impl Datapath for AnyDatapath {
    fn apply(&mut self, changes: &[DatapathChange]) -> Result<(), DatapathError> {
        match self {
            Self::Unenforced => Ok(()),
            Self::Kernel(d) => d.apply(changes),
        }
    }
}
