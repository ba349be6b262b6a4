//! The crate's errors: what the store said, and what the cluster code concluded.

use std::path::PathBuf;

use crate::store::{LeaseId, Revision};

/// A store operation that did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store cannot be reached (no member answers, a timeout, a broken stream). Retried.
    #[error("the store is unreachable: {reason}")]
    Unavailable {
        /// What failed, as the client said it.
        reason: String,
    },
    /// The revision a watch asked for was compacted away: read a snapshot, watch again.
    #[error("revision {requested} was compacted (the oldest kept is {compacted})")]
    Compacted {
        /// The revision asked for.
        requested: Revision,
        /// The compaction revision.
        compacted: Revision,
    },
    /// A write named a lease that no longer exists (it expired or was revoked).
    #[error("lease {lease:x} does not exist")]
    LeaseNotFound {
        /// The lease.
        lease: LeaseId,
    },
    /// The store refused the request as invalid (too large, a key twice in one transaction).
    #[error("the store refused the request: {reason}")]
    Refused {
        /// Why.
        reason: String,
    },
    /// The store refused the user: authentication failed, or the user's roles do not allow
    /// the request (etcd's `permission denied`). Retried: an administrator may fix the roles.
    #[error(
        "etcd refused the request: {reason} (check the user and its roles: docs/manual/cluster-and-ha.md, \"Who is trusted\")"
    )]
    Denied {
        /// What etcd said.
        reason: String,
    },
    /// The client could not be set up (a bad endpoint URL, unreadable TLS files).
    #[error("setting up the etcd client: {reason}")]
    Setup {
        /// Why.
        reason: String,
    },
}

impl StoreError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }
}

/// Everything else that can go wrong in cluster mode.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A value under a key of the layout does not parse; the key is ignored.
    #[error("the value of {key} does not parse: {reason}")]
    Decode {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The cluster identity range (256–65535) has no free number left.
    #[error("every cluster identity number (256-65535) is in use")]
    IdentitiesExhausted,
    /// This allocator is no longer the leader (its lease expired, or another took over).
    #[error("leadership lost (leader key no longer created at revision {revision})")]
    LostLeadership {
        /// The revision our leader key was created at.
        revision: Revision,
    },
    /// A node or allocator name that cannot be part of a key.
    #[error("{name:?} is not a valid name (1-63 of A-Z a-z 0-9 . _ -)")]
    InvalidName {
        /// The name.
        name: String,
    },
    /// The state file could not be read or written.
    #[error("{op} {}: {error}", path.display())]
    State {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error (in the message, so not a `source`).
        error: std::io::Error,
    },
    /// The state file holds something else (another format version, damage).
    #[error("{} is not a cluster state file of this version: {reason}", path.display())]
    StateFormat {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}
