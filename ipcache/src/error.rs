//! Errors of the IpCache.

use ipnet::IpNet;

use crate::identity::Scope;

/// Which circuit breaker tripped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Breaker {
    /// Too many identities created from DNS answers.
    FqdnIdentities,
}

/// What can go wrong in the IpCache.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A circuit breaker rejected a DNS-driven change; existing state is untouched.
    #[error("circuit breaker {breaker:?} tripped at {limit} for {prefix}: mapping rejected")]
    BreakerTripped {
        /// The breaker.
        breaker: Breaker,
        /// Its configured limit.
        limit: usize,
        /// The prefix whose change was rejected.
        prefix: IpNet,
    },
    /// A DNS-driven change needs a new prefix and the datapath's ipcache is full (its
    /// configured size, [`crate::Config::datapath_prefixes`]); existing state is untouched.
    #[error("datapath map {map} is full ({limit} entries): {prefix} rejected")]
    DatapathFull {
        /// The map.
        map: &'static str,
        /// Its size.
        limit: usize,
        /// The prefix that found no room.
        prefix: IpNet,
    },
    /// No free identity number is left in the range.
    #[error("no free identity number left in the {scope:?} range")]
    IdentitiesExhausted {
        /// The range.
        scope: Scope,
    },
    /// Cluster mode: a number the cluster assigned stands for another label set here (the
    /// cluster's changes were applied out of order: a number must be released first).
    #[error("identity {identity} stands for another label set on this node")]
    IdentityTaken {
        /// The number.
        identity: crate::identity::Identity,
    },
    /// Cluster mode: a number the cluster assigned is outside the cluster range.
    #[error("identity {identity} is not in the cluster range (256-65535)")]
    NotClusterIdentity {
        /// The number.
        identity: crate::identity::Identity,
    },
    /// No owner id is left (2²⁹ registered at once).
    #[error("no resource owner id left")]
    OwnersExhausted,
    /// An owner was given up while it still had labels on prefixes; it stays registered.
    #[error("resource owner still has labels on {claims} prefixes")]
    OwnerInUse {
        /// Prefixes it still claims.
        claims: u32,
    },
    /// Metadata for an owner that is not registered (never, or given up).
    #[error("unknown resource owner")]
    UnknownOwner,
    /// The datapath refused a batch.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
}

/// A datapath failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DatapathError {
    /// A map has no room for a new entry (fail closed: the entry is not there).
    #[error("datapath map {map} is full")]
    MapFull {
        /// Map name.
        map: &'static str,
    },
    /// A kernel or I/O error.
    #[error("datapath {operation} failed: {error}")]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The underlying error (in the message, so not a `source`).
        error: std::io::Error,
    },
}
