//! Errors of the DNS proxy.

use std::io;
use std::net::SocketAddr;

use crate::policy::Transport;

/// What can go wrong binding or running the proxy. Per-query failures never surface here: they
/// are answered (SERVFAIL, FORMERR, …), counted and logged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration cannot work.
    #[error("invalid DNS proxy configuration: {reason}")]
    InvalidConfig {
        /// What is wrong, naming the field.
        reason: String,
    },
    /// A listener could not be created or bound.
    #[error("cannot listen for DNS over {transport} on {addr}: {error}")]
    Bind {
        /// UDP or TCP.
        transport: Transport,
        /// The address asked for.
        addr: SocketAddr,
        /// The system's error (in the message, so not a `source`).
        error: io::Error,
    },
    /// The transparent mode needs a capability the process lacks: `IP_TRANSPARENT` needs
    /// `CAP_NET_ADMIN` or `CAP_NET_RAW`, the raw reply socket `CAP_NET_RAW`.
    #[error("cannot {what} for DNS on {addr}: {capability} is missing ({error})")]
    MissingCapability {
        /// What could not be done, e.g. `set IP_TRANSPARENT on the UDP listener`.
        what: &'static str,
        /// The listen address it was for.
        addr: SocketAddr,
        /// The capability needed, e.g. `CAP_NET_RAW`.
        capability: &'static str,
        /// The system's error (EPERM) (in the message, so not a `source`).
        error: io::Error,
    },
    /// A socket towards an upstream could not be created, bound or connected.
    #[error("cannot open a UDP socket to upstream {upstream}: {error}")]
    UpstreamSocket {
        /// The upstream.
        upstream: SocketAddr,
        /// The system's error (in the message, so not a `source`).
        error: io::Error,
    },
    /// The trust store of the encrypted upstreams cannot be read.
    #[error("cannot read the CA bundle for encrypted DNS upstreams {}: {reason}", path.display())]
    UpstreamCa {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it, and which setting names it.
        reason: String,
    },
    /// A listener failed while running (not a per-packet error).
    #[error("DNS {transport} listener on {addr} failed: {error}")]
    Listener {
        /// UDP or TCP.
        transport: Transport,
        /// Its local address.
        addr: SocketAddr,
        /// The system's error (in the message, so not a `source`).
        error: io::Error,
    },
    /// A socket towards an upstream failed while running.
    #[error("UDP socket to upstream {upstream} failed: {error}")]
    Upstream {
        /// The upstream.
        upstream: SocketAddr,
        /// The system's error (in the message, so not a `source`).
        error: io::Error,
    },
    /// The UDP path's threads (`udp_threads`) could not be started.
    #[error("cannot start the DNS proxy's UDP threads: {error}")]
    Threads {
        /// The system's error (in the message, so not a `source`).
        error: io::Error,
    },
    /// A thread of the UDP path could no longer wait for its sockets.
    #[error("DNS proxy UDP thread {thread} failed: {error}")]
    Thread {
        /// Which thread (`fqdnd-dns-N`).
        thread: usize,
        /// The system's error (in the message, so not a `source`).
        error: io::Error,
    },
    /// One of the proxy's tasks panicked.
    #[error("DNS proxy task {task} panicked: {reason}")]
    TaskPanicked {
        /// Which task.
        task: &'static str,
        /// The panic message, if any.
        reason: String,
    },
}
