//! Errors of loading and opening the datapath.
//!
//! Each cause is printed once: an I/O error (a leaf: its text says everything) is part of its
//! variant's message and not its `source`; an aya error (which has causes of its own, say the
//! errno under "`bpf_link_create` failed") is the variant's `source` and not part of its
//! message, so that a chain renderer (anyhow's `{:#}`) prints each once.

/// A failure to load, pin or open the eBPF datapath.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file-system or mount operation failed.
    #[error("{what}: {error}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error (in the message, so not a `source`).
        error: std::io::Error,
    },
    /// Loading the object or creating its maps failed.
    #[error("loading the eBPF object")]
    Ebpf(#[from] Box<aya::EbpfError>),
    /// Loading or attaching a program failed.
    #[error("eBPF program")]
    Program(#[from] aya::programs::ProgramError),
    /// Opening or converting a map failed.
    #[error("eBPF map")]
    Map(#[from] aya::maps::MapError),
    /// Opening, replacing or converting a (pinned) link failed.
    #[error("eBPF link")]
    Link(#[from] aya::programs::links::LinkError),
    /// Pinning a link failed.
    #[error("pinning an eBPF link")]
    Pin(#[from] aya::pin::PinError),
    /// An external command (`ip`) failed.
    #[error("`{command}` failed: {message}")]
    Command {
        /// The command line.
        command: String,
        /// Its stderr (or why it could not run).
        message: String,
    },
    /// A pinned map's type, key size, value size or flags differ from what the object creates
    /// in the same layout version: not migratable (only `max_entries` changes are); the
    /// pinned map is left untouched.
    #[error(
        "the pinned map {map} is {pinned} but this build wants {wanted}: a layout change \
         needs a new FQDND_MAPS_ABI_VERSION (pin directory); the pinned map was left untouched"
    )]
    MapLayout {
        /// The map.
        map: String,
        /// What is pinned.
        pinned: String,
        /// What the object creates.
        wanted: String,
    },
    /// A migration to a smaller map was refused: its entries do not fit. The old map is
    /// still pinned and in use, unchanged.
    #[error(
        "map {map} holds {entries} entries, more than the new max_entries {max_entries}: \
         migration refused, the old map is kept"
    )]
    MapTooSmall {
        /// The map.
        map: String,
        /// Entries in the old map.
        entries: usize,
        /// The size asked for.
        max_entries: u32,
    },
    /// A configured map size is not usable.
    #[error("map size {size} for {map} is invalid")]
    InvalidMapSize {
        /// The size field ([`crate::MapSizes`]).
        map: &'static str,
        /// The value.
        size: u32,
    },
    /// The object lacks a program or map this crate expects.
    #[error("the eBPF object has no {0}")]
    Missing(&'static str),
    /// No cgroup v2 hierarchy is mounted: the socket programs of cgroup endpoints attach
    /// only to cgroup v2.
    #[error(
        "no cgroup v2 hierarchy is mounted (no `cgroup2` line in /proc/self/mountinfo): cgroup \
         endpoints need one (mount it with `mount -t cgroup2 none /sys/fs/cgroup/unified`, or \
         boot with systemd.unified_cgroup_hierarchy)"
    )]
    CgroupV2Missing,
    /// The cgroup v2 mount this process sees is not the hierarchy's root (a container's view):
    /// programs attached there would miss every socket outside that subtree.
    #[error(
        "the cgroup v2 hierarchy is mounted at {mount} from {root}, not from its root: fqdnd \
         runs in a container's view of the cgroups and would attach where sockets outside \
         {root} never pass; run it on the host (or with the host's cgroup2 mount)"
    )]
    CgroupV2NotRoot {
        /// The mount point.
        mount: std::path::PathBuf,
        /// The directory of the hierarchy it shows.
        root: String,
    },
    /// A systemd unit was named on a host systemd does not manage: its cgroup cannot be
    /// found.
    #[error(
        "unit {unit}: systemd does not run on this host (no /run/systemd/system), so the \
         unit has no cgroup; name the cgroup itself (`spec.cgroup`, `--cgroup PATH`)"
    )]
    SystemdNotRunning {
        /// The unit.
        unit: String,
    },
    /// A cgroup endpoint's path that can never match (the root cgroup, a file, a path of a
    /// cgroup file system written out), with what to write instead.
    #[error("cgroup {path}: {reason}")]
    CgroupPath {
        /// The path as configured.
        path: String,
        /// Why it can never match, and what to write.
        reason: String,
    },
    /// A cgroup v1 net_cls or net_prio hierarchy is in use: on such hosts a socket's cgroup
    /// v2 data can be overwritten by its v1 tags, and the socket programs would silently not
    /// match it.
    #[error(
        "cgroup v1 {controller} is in use ({file} holds {value:?}): once a v1 net_cls classid \
         or net_prio priority is set, the kernel can lose the cgroup v2 membership of sockets \
         and the socket programs of cgroup endpoints would silently not match them; stop \
         using {controller} (reset the value, unmount the hierarchy) or enforce these \
         processes through an interface endpoint"
    )]
    CgroupV1InUse {
        /// `net_cls` or `net_prio`.
        controller: &'static str,
        /// The file that shows it in use.
        file: std::path::PathBuf,
        /// Its contents (trimmed).
        value: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error and its causes as anyhow's `{:#}` prints them.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        text
    }

    #[test]
    fn each_cause_is_printed_once() {
        // What `fqdnd endpoint add --cgroup` printed when the node could not attach:
        // "eBPF program: `bpf_link_create` failed: `bpf_link_create` failed: …".
        let program = Error::Program(aya::programs::ProgramError::SyscallError(
            aya::sys::SyscallError {
                call: "bpf_link_create",
                io_error: std::io::Error::from_raw_os_error(1),
            },
        ));
        assert_eq!(
            chain(&program),
            "eBPF program: `bpf_link_create` failed: Operation not permitted (os error 1)"
        );
        let io = Error::Io {
            what: "reading /proc/cgroups".to_owned(),
            error: std::io::Error::from_raw_os_error(2),
        };
        assert_eq!(
            chain(&io),
            "reading /proc/cgroups: No such file or directory (os error 2)"
        );
    }
}
