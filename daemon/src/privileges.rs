//! After start-up the daemon keeps only the capabilities its run-time operations need, in
//! every thread (see the `fqdnd-privileges` crate for why every thread).
//!
//! What each mode does after start-up, and what that needs (found by running the end-to-end
//! tests with the reduced sets):
//! - gateway, with or without `enforceInterfaces`: answers on sockets already open, opens
//!   ordinary upstream sockets (TCP retries, probes), writes the kernel maps through file
//!   descriptors it already holds, rotates journal files in its own state directory: **none**.
//! - node: attaches the programs to the interfaces of endpoints added at run time and detaches
//!   them (a TCX link created from a program it already holds, pinned or unpinned in its own
//!   bpffs directory), writes the maps through descriptors it already holds, forwards to
//!   original destinations over ordinary sockets (the transparent listeners and the raw reply
//!   socket were opened at start): **none** either. Tested on Linux 6.18 (tests/node: every
//!   end-to-end flow, endpoints added after the drop): since 6.5 the `bpf()` commands on objects
//!   a process already holds check no capability, and creating a TCX link checks none. A
//!   kernel that did would refuse `fqdnd endpoint add` with EPERM (reported to the caller).

use crate::{Context, Result};
use fqdnd_privileges::{Cap, CapSet};

/// What the node agent keeps.
pub const NODE: &[Cap] = &[];
/// What the gateway keeps.
pub const GATEWAY: &[Cap] = &[];

/// Drops every capability but `keep` in every thread; logs what was kept and dropped.
pub fn drop_all_but(mode: &str, keep: &[Cap]) -> Result<()> {
    let before = fqdnd_privileges::current().context("reading the process's capabilities")?;
    let kept = fqdnd_privileges::restrict(CapSet::of(keep), crate::clock::pause)
        .context("dropping the capabilities not needed at run time")?;
    let dropped = CapSet(before.permitted.0 & !kept.0);
    tracing::info!(mode, kept = %kept, dropped = %dropped, "capabilities dropped after start-up: only what run-time operations need is kept");
    Ok(())
}
