//! Errors of loading and opening the datapath.

/// A failure to load, pin or open the eBPF datapath.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file-system or mount operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Loading the object or creating its maps failed.
    #[error("loading the eBPF object: {0}")]
    Ebpf(#[from] Box<aya::EbpfError>),
    /// Loading or attaching a program failed.
    #[error("eBPF program: {0}")]
    Program(#[from] aya::programs::ProgramError),
    /// Opening or converting a map failed.
    #[error("eBPF map: {0}")]
    Map(#[from] aya::maps::MapError),
    /// Opening, replacing or converting a (pinned) link failed.
    #[error("eBPF link: {0}")]
    Link(#[from] aya::programs::links::LinkError),
    /// Pinning a link failed.
    #[error("pinning an eBPF link: {0}")]
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
