//! The answer's way out: before a reply is released, the observer learns it (NameManager →
//! IpCache → datapath in the binary) and the proxy waits for it, up to the configured delay.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use fqdnd_dnswire::Decoded;

use crate::policy::Transport;

/// What the observer is shown about an answer.
#[derive(Debug, Clone, Copy)]
pub struct ResponseContext<'a> {
    /// The client that asked.
    pub client: SocketAddr,
    /// The address the client asked (see [`crate::QueryInfo::server`]).
    pub server: SocketAddr,
    /// The upstream that answered.
    pub upstream: SocketAddr,
    /// The tag the policy's [`crate::Verdict::Allow`] carried.
    pub tag: u64,
    /// The question's name, canonical.
    pub name: &'a str,
    /// The answer decoded (names canonical; every record checked), validated against the
    /// query (ID, question, upstream address).
    pub response: &'a Decoded,
    /// The answer's bytes as the client will get them (but for the ID, rewritten last).
    pub bytes: &'a [u8],
    /// How the client asked.
    pub transport: Transport,
    /// When the answer arrived (the receive batch's one clock read): an observer that
    /// timestamps what it learns needs no clock read of its own.
    pub answered: tokio::time::Instant,
}

/// Why the observer could not record an answer. The reply then gets the configured
/// [`crate::HoldFallback`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct ObserveError {
    /// What went wrong, for logs.
    pub reason: String,
}

/// A pending observation.
pub type ObserveFuture = Pin<Box<dyn Future<Output = Result<(), ObserveError>> + Send>>;

/// The observer's answer: finished already (the common case, no allocation), or a future the
/// proxy awaits before releasing the reply.
pub enum Observation {
    /// Done.
    Done(Result<(), ObserveError>),
    /// Still working.
    Pending(ObserveFuture),
}

impl std::fmt::Debug for Observation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Done(r) => f.debug_tuple("Done").field(r).finish(),
            Self::Pending(_) => f.write_str("Pending"),
        }
    }
}

/// Learns every answer before it is released.
pub trait ResponseObserver: Send + Sync + 'static {
    /// Called once per validated upstream answer to an allowed query.
    fn observe(&self, answer: &ResponseContext<'_>) -> Observation;
}
