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
}
