//! The datapath behind the engine: in memory (gateway without enforcement, simulate, tests) or
//! the kernel's pinned maps (node, enforcing gateway). One enum rather than a trait object so
//! the daemon can still reach the kernel handle (resync, listings) through the engine lock.

use fqdnd_ebpf::KernelDatapath;
use fqdnd_ipcache::{Datapath, DatapathChange, DatapathError, MemoryDatapath};

/// Where the engine's ipcache and policy batches go.
#[derive(Debug)]
pub(crate) enum AnyDatapath {
    /// Held in memory only.
    Memory(Box<MemoryDatapath>),
    /// The pinned BPF maps.
    Kernel(Box<KernelDatapath>),
}

impl Datapath for AnyDatapath {
    fn apply(&mut self, changes: &[DatapathChange]) -> Result<(), DatapathError> {
        match self {
            Self::Memory(d) => d.apply(changes),
            Self::Kernel(d) => d.apply(changes),
        }
    }
}
