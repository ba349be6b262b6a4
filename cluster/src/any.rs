//! A store chosen at run time: etcd, or the in-memory store (the daemon in-process in tests,
//! with the same code above it).

use std::time::Duration;

use crate::error::StoreError;
use crate::etcd::{EtcdStore, EtcdWatch};
use crate::memory::{MemoryStore, MemoryWatch};
use crate::store::{LeaseId, Revision, Snapshot, Store, Txn, TxnOutcome, Watch, WatchBatch};

/// etcd or the in-memory store.
#[derive(Clone)]
pub enum AnyStore {
    /// A real etcd.
    Etcd(Box<EtcdStore>),
    /// The in-memory store.
    Memory(MemoryStore),
}

/// The watch of an [`AnyStore`].
pub enum AnyWatch {
    /// etcd's.
    Etcd(EtcdWatch),
    /// The in-memory store's.
    Memory(MemoryWatch),
}

impl Watch for AnyWatch {
    async fn next(&mut self) -> Result<WatchBatch, StoreError> {
        match self {
            Self::Etcd(w) => w.next().await,
            Self::Memory(w) => w.next().await,
        }
    }
}

impl Store for AnyStore {
    type Watch = AnyWatch;

    async fn range(&self, prefix: &str) -> Result<Snapshot, StoreError> {
        match self {
            Self::Etcd(s) => s.range(prefix).await,
            Self::Memory(s) => s.range(prefix).await,
        }
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome, StoreError> {
        match self {
            Self::Etcd(s) => s.txn(txn).await,
            Self::Memory(s) => s.txn(txn).await,
        }
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        match self {
            Self::Etcd(s) => s.grant(ttl).await,
            Self::Memory(s) => s.grant(ttl).await,
        }
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<bool, StoreError> {
        match self {
            Self::Etcd(s) => s.keep_alive(lease).await,
            Self::Memory(s) => s.keep_alive(lease).await,
        }
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        match self {
            Self::Etcd(s) => s.revoke(lease).await,
            Self::Memory(s) => s.revoke(lease).await,
        }
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<AnyWatch, StoreError> {
        Ok(match self {
            Self::Etcd(s) => AnyWatch::Etcd(s.watch(prefix, from).await?),
            Self::Memory(s) => AnyWatch::Memory(s.watch(prefix, from).await?),
        })
    }
}
