//! The store the allocator and the node sync run on: etcd's v3 data model (revisions,
//! transactions with compares, leases, ordered watches) behind a trait, so their algorithms are
//! tested against [`MemoryStore`](crate::MemoryStore) — the same semantics in memory, on a
//! virtual clock — and run against etcd through [`EtcdStore`](crate::EtcdStore).

use std::future::Future;
use std::time::Duration;

use crate::error::StoreError;
use crate::keys::prefix_end;

/// A store revision: every change of the store has a higher one than the changes before it.
pub type Revision = i64;

/// A lease id; keys put under a lease vanish when it expires or is revoked.
pub type LeaseId = i64;

/// A key and its value with etcd's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    /// The key (UTF-8: every key of the layout is).
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// The revision that created the key (0 for a key that does not exist).
    pub create_revision: Revision,
    /// The revision that last changed it.
    pub mod_revision: Revision,
    /// Changes since creation (1 on creation).
    pub version: i64,
    /// The lease it is attached to (0: none).
    pub lease: LeaseId,
}

/// What happened to a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Created or changed: the key as it is now.
    Put(Kv),
    /// Deleted (or its lease expired).
    Delete {
        /// The key.
        key: String,
        /// The revision of the deletion.
        revision: Revision,
    },
}

impl Event {
    /// The key the event is about.
    pub fn key(&self) -> &str {
        match self {
            Self::Put(kv) => &kv.key,
            Self::Delete { key, .. } => key,
        }
    }

    /// The revision the event happened at.
    pub fn revision(&self) -> Revision {
        match self {
            Self::Put(kv) => kv.mod_revision,
            Self::Delete { revision, .. } => *revision,
        }
    }
}

/// The comparison of a [`Compare`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `==`.
    Equal,
    /// `!=`.
    NotEqual,
    /// `<`.
    Less,
    /// `>`.
    Greater,
}

/// What a [`Compare`] looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The create revision (0 when the key does not exist).
    CreateRevision(Revision),
    /// The last modification's revision (0 when the key does not exist).
    ModRevision(Revision),
    /// The version (0 when the key does not exist).
    Version(i64),
    /// The value (a missing key never compares true).
    Value(Vec<u8>),
}

/// One condition of a transaction, on a key or on every key under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    /// The key, or the prefix when `prefix` is set.
    pub key: String,
    /// Whether `key` is a prefix: the compare holds for every key under it (and, for all but
    /// a value compare, for an empty range compared as a missing key — etcd's rule).
    pub prefix: bool,
    /// How to compare.
    pub op: CmpOp,
    /// With what.
    pub target: Target,
}

impl Compare {
    /// `key` does not exist.
    pub fn missing(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            prefix: false,
            op: CmpOp::Equal,
            target: Target::CreateRevision(0),
        }
    }

    /// `key` was created at `revision` (fencing on a key one created).
    pub fn created_at(key: impl Into<String>, revision: Revision) -> Self {
        Self {
            key: key.into(),
            prefix: false,
            op: CmpOp::Equal,
            target: Target::CreateRevision(revision),
        }
    }

    /// `key` was last changed at `revision`.
    pub fn modified_at(key: impl Into<String>, revision: Revision) -> Self {
        Self {
            key: key.into(),
            prefix: false,
            op: CmpOp::Equal,
            target: Target::ModRevision(revision),
        }
    }

    /// No key under `prefix` was created or changed after `revision`.
    pub fn unchanged_since(prefix: impl Into<String>, revision: Revision) -> Self {
        Self {
            key: prefix.into(),
            prefix: true,
            op: CmpOp::Less,
            target: Target::ModRevision(revision + 1),
        }
    }

    /// Whether `kv` (or a missing key, `None`) satisfies the compare.
    pub(crate) fn holds_for(&self, kv: Option<&Kv>) -> bool {
        let ordering = match (&self.target, kv) {
            (Target::Value(_), None) => return false,
            (Target::Value(v), Some(kv)) => kv.value.as_slice().cmp(v.as_slice()),
            (Target::CreateRevision(r), kv) => kv.map_or(0, |k| k.create_revision).cmp(r),
            (Target::ModRevision(r), kv) => kv.map_or(0, |k| k.mod_revision).cmp(r),
            (Target::Version(v), kv) => kv.map_or(0, |k| k.version).cmp(v),
        };
        match self.op {
            CmpOp::Equal => ordering.is_eq(),
            CmpOp::NotEqual => ordering.is_ne(),
            CmpOp::Less => ordering.is_lt(),
            CmpOp::Greater => ordering.is_gt(),
        }
    }

    /// The range end of a prefix compare.
    pub(crate) fn range_end(&self) -> Option<Vec<u8>> {
        self.prefix.then(|| prefix_end(&self.key))
    }
}

/// A change a transaction makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Sets `key` to `value`, attached to `lease` (or to none).
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
        /// The lease, if any.
        lease: Option<LeaseId>,
    },
    /// Deletes `key` (nothing if it does not exist).
    Delete {
        /// The key.
        key: String,
    },
}

/// A transaction: if every compare holds, every op applies, at one revision; else nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    /// The conditions.
    pub compares: Vec<Compare>,
    /// The changes.
    pub ops: Vec<Op>,
}

/// What a transaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnOutcome {
    /// Whether the compares held (and the ops were applied).
    pub succeeded: bool,
    /// The store's revision after it (the revision of the changes when it succeeded and
    /// changed something).
    pub revision: Revision,
}

/// Every key under a prefix at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The keys, sorted.
    pub kvs: Vec<Kv>,
    /// The revision they were read at.
    pub revision: Revision,
}

/// Events of a watch, in revision order; a revision's events always come in one batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchBatch {
    /// The events.
    pub events: Vec<Event>,
    /// The store's revision when the batch was sent (at least the last event's).
    pub revision: Revision,
}

/// A stream of changes under a prefix.
pub trait Watch: Send {
    /// The next batch. An error ends the watch: [`StoreError::Compacted`] when the revision
    /// asked for is gone (read a snapshot and watch again), anything else when the store is
    /// unreachable.
    fn next(&mut self) -> impl Future<Output = Result<WatchBatch, StoreError>> + Send;
}

/// etcd's v3 data model, as the cluster code uses it.
pub trait Store: Clone + Send + Sync + 'static {
    /// The watch this store hands out.
    type Watch: Watch + 'static;

    /// Every key under `prefix`, and the revision of the read.
    fn range(&self, prefix: &str) -> impl Future<Output = Result<Snapshot, StoreError>> + Send;

    /// Runs a transaction.
    fn txn(&self, txn: Txn) -> impl Future<Output = Result<TxnOutcome, StoreError>> + Send;

    /// A new lease of `ttl`.
    fn grant(&self, ttl: Duration) -> impl Future<Output = Result<LeaseId, StoreError>> + Send;

    /// Renews a lease; `false` if it no longer exists (expired or revoked).
    fn keep_alive(&self, lease: LeaseId) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Revokes a lease: its keys are deleted at once.
    fn revoke(&self, lease: LeaseId) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The changes under `prefix` from revision `from` on (inclusive).
    fn watch(
        &self,
        prefix: &str,
        from: Revision,
    ) -> impl Future<Output = Result<Self::Watch, StoreError>> + Send;
}
