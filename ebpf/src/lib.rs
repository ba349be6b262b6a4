//! fqdnd's kernel datapath: the C eBPF programs in `bpf/` (compiled by build.rs with clang-19),
//! their maps pinned under a versioned bpffs directory, and [`KernelDatapath`], the
//! [`fqdnd_ipcache::Datapath`] that writes ipcache and policy batches into those maps. The
//! programs are the tc pair of interface endpoints and the cgroup v2 socket programs of host
//! processes ([`Loaded::attach_cgroup`]); [`cgroup`] finds where those attach and what the
//! host must not be doing for them to work.
//!
//! Map layouts come from one header, `include/fqdnd_maps.h`; [`sys`] mirrors it and its tests
//! compare both layouts field by field.
//!
//! The C side is one object, `obj/policy.o`, from one compilation unit, `bpf/policy.c`, which
//! includes the tc programs (`bpf/bpf_tc.c`), the cgroup socket programs (`bpf/bpf_sock.c`)
//! and the headers they share in `bpf/lib/` (maps, parsing, conntrack, policy, events,
//! endpoints, DNS redirect, load balancing, fragments, and the egress/ingress verdicts). On
//! the Rust side, [`KernelDatapath`] is cut by concern into the modules of `src/datapath/`
//! (policy, ipcache, batch, resync, endpoints, sockets, redirect, conntrack, events).
#![deny(unsafe_code)]

pub mod cgroup;
mod datapath;
mod error;
mod lb;
mod loader;
mod migrate;
pub mod route;
pub mod sys;

pub use datapath::{
    Conntrack, CtEntry, CtLifetimes, CtState, DnsOrigin, DnsOrigins, EndpointEntry, EndpointFlags,
    Events, KernelDatapath, ResyncStats, monotonic_ns, port_prefixes,
};
pub use error::Error;
pub use lb::{LbMaps, LbSyncStats};
pub use loader::{
    BPFFS_ROOT, FROM_ENDPOINT, Loaded, OBJECT, SOCK_ADDR_PROGRAMS, SOCK_SKB_PROGRAMS, TO_ENDPOINT,
    attached_ifindexes, attached_interfaces, cgroup_attached, cgroup_links_dir, default_pin_dir,
    detach_cgroup_pinned, detach_pinned, ensure_bpffs, links_dir, map_names,
};
pub use migrate::{MapSizes, Migration, other_abi_dirs};
