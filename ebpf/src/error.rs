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
    /// The object lacks a program or map this crate expects.
    #[error("the eBPF object has no {0}")]
    Missing(&'static str),
}
