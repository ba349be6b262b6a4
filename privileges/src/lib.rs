//! Capability sets and dropping them in **every thread** of the process.
//!
//! Linux keeps capabilities per thread: `capset(2)` changes only the calling thread, and a new
//! thread inherits its creator's sets. A daemon whose runtime already runs worker threads (and
//! a blocking pool, and writer threads) therefore has to reach each of them. [`restrict`]
//! does what glibc does for `setuid(2)`: it sets the sets on the calling thread, then signals
//! every other thread (`tgkill`, a real-time signal whose handler does the same two system
//! calls), and checks `/proc/self/task/*/status` until every thread shows the wanted sets —
//! threads created meanwhile are caught by the next round.
//!
//! What each thread ends with: effective = permitted = the kept set, inheritable and ambient
//! empty, and the bounding set cut to the kept set (so even an `execve` as root cannot get the
//! others back).
//!
//! This is the crate's only job and its only `unsafe`: the system calls and the signal handler
//! (which uses nothing but those system calls and atomics: async-signal-safe).

#![allow(
    unsafe_code,
    reason = "capget/capset, prctl, tgkill and a signal handler: no safe wrapper exists for them"
)]

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Capability names by number (`linux/capability.h`), up to `CAP_CHECKPOINT_RESTORE`.
const NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// One capability, by its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cap(pub u8);

impl Cap {
    /// `CAP_NET_BIND_SERVICE`.
    pub const NET_BIND_SERVICE: Cap = Cap(10);
    /// `CAP_NET_ADMIN`.
    pub const NET_ADMIN: Cap = Cap(12);
    /// `CAP_NET_RAW`.
    pub const NET_RAW: Cap = Cap(13);
    /// `CAP_SYS_ADMIN`.
    pub const SYS_ADMIN: Cap = Cap(21);
    /// `CAP_PERFMON`.
    pub const PERFMON: Cap = Cap(38);
    /// `CAP_BPF`.
    pub const BPF: Cap = Cap(39);

    /// Its name, e.g. `CAP_NET_ADMIN` (`CAP_<n>` for numbers newer than this table).
    pub fn name(self) -> String {
        NAMES
            .get(usize::from(self.0))
            .map_or_else(|| format!("CAP_{}", self.0), |n| (*n).to_owned())
    }
}

/// A set of capabilities (the kernel's 64-bit mask).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CapSet(pub u64);

impl CapSet {
    /// The empty set.
    pub const EMPTY: CapSet = CapSet(0);

    /// The set of `caps`.
    pub fn of(caps: &[Cap]) -> Self {
        CapSet(caps.iter().fold(0, |m, c| m | (1u64 << c.0)))
    }

    /// Whether `cap` is in the set.
    pub fn contains(self, cap: Cap) -> bool {
        cap.0 < 64 && self.0 & (1u64 << cap.0) != 0
    }

    /// The capabilities in both.
    #[must_use]
    pub fn intersect(self, other: CapSet) -> CapSet {
        CapSet(self.0 & other.0)
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The names of its capabilities, in number order.
    pub fn names(self) -> Vec<String> {
        (0..64u8)
            .map(Cap)
            .filter(|c| self.contains(*c))
            .map(Cap::name)
            .collect()
    }
}

impl fmt::Display for CapSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&self.names().join(","))
    }
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A system call failed.
    #[error("{call} failed: {error}")]
    Sys {
        /// The call.
        call: &'static str,
        /// The error (in the message, so not a `source`).
        error: std::io::Error,
    },
    /// `/proc` could not be read.
    #[error("reading {path}: {error}")]
    Proc {
        /// The file.
        path: String,
        /// The error (in the message, so not a `source`).
        error: std::io::Error,
    },
    /// Some threads still hold other capabilities after every round.
    #[error("threads {threads:?} still hold capabilities beyond {kept}")]
    Stragglers {
        /// Their ids.
        threads: Vec<u32>,
        /// The set they should have.
        kept: CapSet,
    },
}

/// One thread's sets, as `/proc/<pid>/task/<tid>/status` shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThreadCaps {
    /// `CapEff`.
    pub effective: CapSet,
    /// `CapPrm`.
    pub permitted: CapSet,
    /// `CapInh`.
    pub inheritable: CapSet,
    /// `CapBnd`.
    pub bounding: CapSet,
    /// `CapAmb`.
    pub ambient: CapSet,
}

/// Parses the `Cap*` lines of a `status` file.
pub fn parse_status(text: &str) -> ThreadCaps {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .map(CapSet)
            .unwrap_or_default()
    };
    ThreadCaps {
        effective: field("CapEff:"),
        permitted: field("CapPrm:"),
        inheritable: field("CapInh:"),
        bounding: field("CapBnd:"),
        ambient: field("CapAmb:"),
    }
}

/// The sets of thread `tid` of this process.
pub fn thread_caps(tid: u32) -> Result<ThreadCaps, Error> {
    let path = format!("/proc/self/task/{tid}/status");
    std::fs::read_to_string(&path)
        .map(|t| parse_status(&t))
        .map_err(|source| Error::Proc {
            path,
            error: source,
        })
}

/// Every thread of this process.
pub fn threads() -> Result<Vec<u32>, Error> {
    let path = "/proc/self/task";
    let dir = std::fs::read_dir(path).map_err(|source| Error::Proc {
        path: path.to_owned(),
        error: source,
    })?;
    Ok(dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// The calling thread's sets.
pub fn current() -> Result<ThreadCaps, Error> {
    thread_caps(gettid())
}

fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    u32::try_from(tid).unwrap_or(0)
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The set every thread is to end with, and the highest capability the kernel knows.
static TARGET: AtomicU64 = AtomicU64::new(0);
static LAST_CAP: AtomicU32 = AtomicU32::new(40);
/// Threads whose `capset` in the handler failed.
static FAILED: AtomicU32 = AtomicU32::new(0);

/// Cuts the calling thread to `keep`: bounding set first (needs `CAP_SETPCAP`, so before the
/// capset), ambient set cleared, then effective = permitted = `keep`, inheritable empty.
/// Only system calls: safe to call from the signal handler.
fn apply_here(keep: u64, last_cap: u32) -> bool {
    for cap in 0..=last_cap.min(63) {
        if keep & (1u64 << cap) == 0 {
            // SAFETY: prctl with integer arguments; failure (already dropped, or no
            // CAP_SETPCAP) leaves the bounding set as it was and is reported by the caller's
            // check of /proc.
            unsafe {
                libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0);
            }
        }
    }
    // SAFETY: as above.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
    }
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the low and high 32-bit words of the mask"
    )]
    let data = [
        Data {
            effective: keep as u32,
            permitted: keep as u32,
            inheritable: 0,
        },
        Data {
            effective: (keep >> 32) as u32,
            permitted: (keep >> 32) as u32,
            inheritable: 0,
        },
    ];
    // SAFETY: capset reads a version-3 header and two data words, both valid for the call.
    let r = unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) };
    r == 0
}

extern "C" fn on_signal(_: libc::c_int) {
    if !apply_here(
        TARGET.load(Ordering::SeqCst),
        LAST_CAP.load(Ordering::SeqCst),
    ) {
        FAILED.fetch_add(1, Ordering::SeqCst);
    }
}

/// The signal the other threads are asked with: high in the real-time range, away from what
/// glibc reserves (the bottom) and what applications usually pick (`SIGRTMIN + n`).
fn signal() -> libc::c_int {
    libc::SIGRTMAX() - 3
}

fn install_handler() -> Result<(), Error> {
    // SAFETY: a zeroed sigaction is a valid starting value; the handler only makes system
    // calls and touches atomics (async-signal-safe); SA_RESTART keeps interrupted system
    // calls of the signalled threads going.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&raw mut action.sa_mask);
        if libc::sigaction(signal(), &raw const action, std::ptr::null_mut()) != 0 {
            return Err(Error::Sys {
                call: "sigaction",
                error: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(40)
}

/// Whether a thread's sets are what [`restrict`] leaves.
fn done(c: &ThreadCaps, keep: CapSet) -> bool {
    c.effective == keep
        && c.permitted == keep
        && c.inheritable.is_empty()
        && c.ambient.is_empty()
        && c.bounding.intersect(CapSet(!keep.0)).is_empty()
}

/// Leaves every thread of the process with exactly `keep ∩ permitted` (effective and
/// permitted), no inheritable or ambient capability, and the bounding set cut to it. Returns
/// the set kept. Without `CAP_SETPCAP` the bounding set cannot be cut: then only the other sets
/// are checked. `pause` is how long to wait between rounds (the caller owns the clock).
pub fn restrict(keep: CapSet, pause: impl Fn(Duration)) -> Result<CapSet, Error> {
    let me = current()?;
    let keep = keep.intersect(me.permitted);
    let can_cut_bounding = me.effective.contains(Cap(8));
    TARGET.store(keep.0, Ordering::SeqCst);
    LAST_CAP.store(last_cap(), Ordering::SeqCst);
    install_handler()?;
    let ok = |c: &ThreadCaps| {
        if can_cut_bounding {
            done(c, keep)
        } else {
            c.effective == keep && c.permitted == keep && c.ambient.is_empty()
        }
    };
    let pid = std::process::id();
    let mine = gettid();
    if !apply_here(keep.0, LAST_CAP.load(Ordering::SeqCst)) {
        return Err(Error::Sys {
            call: "capset",
            error: std::io::Error::last_os_error(),
        });
    }
    let mut left = Vec::new();
    for _round in 0..200 {
        left.clear();
        for tid in threads()? {
            // A thread that exited between the listing and the read is gone: fine.
            let Ok(caps) = thread_caps(tid) else { continue };
            if ok(&caps) {
                continue;
            }
            left.push(tid);
            if tid != mine {
                // SAFETY: tgkill with this process's id, one of its thread ids and a signal
                // whose handler is installed above; a thread gone meanwhile gives ESRCH.
                unsafe {
                    libc::syscall(
                        libc::SYS_tgkill,
                        libc::pid_t::try_from(pid).unwrap_or(0),
                        libc::pid_t::try_from(tid).unwrap_or(0),
                        signal(),
                    );
                }
            }
        }
        if left.is_empty() {
            return Ok(keep);
        }
        pause(Duration::from_millis(5));
    }
    Err(Error::Stragglers {
        threads: left,
        kept: keep,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_render_by_name() {
        let s = CapSet::of(&[Cap::NET_ADMIN, Cap::BPF]);
        assert_eq!(s.to_string(), "CAP_NET_ADMIN,CAP_BPF");
        assert_eq!(CapSet::EMPTY.to_string(), "none");
        assert!(s.contains(Cap::BPF) && !s.contains(Cap::SYS_ADMIN));
    }

    #[test]
    fn status_lines_parse() {
        let c = parse_status(
            "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t0000008000001000\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\n",
        );
        assert_eq!(c.effective, CapSet::of(&[Cap::NET_ADMIN, Cap::BPF]));
        assert_eq!(c.permitted.0, 0x1ff_ffff_ffff);
        assert!(c.ambient.is_empty());
    }
}
