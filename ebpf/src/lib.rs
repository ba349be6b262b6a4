//! fqdnd's kernel datapath: the C eBPF programs in `bpf/` (compiled by build.rs with clang-19),
//! their maps pinned under a versioned bpffs directory, and [`KernelDatapath`], the
//! [`fqdnd_ipcache::Datapath`] that writes ipcache and policy batches into those maps.
//!
//! Map layouts come from one header, `include/fqdnd_maps.h`; [`sys`] mirrors it and its tests
//! compare both layouts field by field.
#![deny(unsafe_code)]

mod datapath;
mod error;
mod loader;
pub mod sys;

pub use datapath::{Events, KernelDatapath, MAX_PORT_RANGE};
pub use error::Error;
pub use loader::{
    BPFFS_ROOT, FROM_ENDPOINT, Loaded, OBJECT, TO_ENDPOINT, default_pin_dir, ensure_bpffs,
    map_names,
};
