//! Where cluster mode's state lives: the `Cluster` document's etcd, or an in-memory store
//! handed in at start ([`crate::skeleton::StartOptions::cluster_store`]: the daemon in-process
//! in tests, the same code above it).

use fqdnd_cluster::{AnyStore, Connect, EtcdStore, MemoryStore, StoreError};

/// The store cluster mode connects to.
#[derive(Clone)]
pub enum StoreSource {
    /// etcd, as the `Cluster` document says.
    Etcd(Connect),
    /// An in-memory store.
    Memory(MemoryStore),
}

impl StoreSource {
    /// A client of the store (etcd's connects lazily: it may be down).
    ///
    /// # Errors
    /// The etcd client cannot be set up (TLS files, credentials).
    pub async fn open(&self) -> Result<AnyStore, StoreError> {
        Ok(match self {
            Self::Etcd(connect) => AnyStore::Etcd(Box::new(EtcdStore::connect(connect).await?)),
            Self::Memory(store) => AnyStore::Memory(store.clone()),
        })
    }
}
