//! A highly available gateway group (`gatewayGroup` in the Cluster document, docs/ha-gateway.md):
//! the glue between the proxy's observer, the cluster crate's publisher and importer, and the
//! engine.
//!
//! - The observer hands every allowed, wholly learned answer to [`Ha::offer`] after it is
//!   learned (and journaled): a `try_send`, so the reply never waits on etcd.
//! - Before the proxy binds, [`Ha::import_before_serving`] reads the group's records and learns
//!   them (bounded: etcd may be down); then the publisher and the importer run as tasks.
//! - Imported records go through [`Host::import_learned`]: the daemon's engine, its DNS policy,
//!   its breakers and its journal.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Result;
use fqdnd_cluster::learned::{self, Answer};
use fqdnd_cluster::{
    Connect, EtcdStore, Layout, LearnedRecord, LearnedSink, Revision, ShareConfig, ShareStatus,
    Wall,
};
use fqdnd_engine::Clock as _;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::cluster::Host;

/// How many answers may wait for the publisher; beyond, they are dropped and counted.
const QUEUE: usize = 16_384;

/// How long a start waits for the group's records before serving without them.
const IMPORT_AT_START: Duration = Duration::from_secs(5);

/// The wall clock, from the daemon's clock.
struct ClockWall(Clock);

impl Wall for ClockWall {
    fn unix_ms(&self) -> u64 {
        self.0.unix_ms_of(self.0.now())
    }
}

/// Imported records, into the daemon, checked as queries to `servers` (its listen
/// addresses).
struct HostSink {
    host: Arc<dyn Host>,
    servers: Arc<[SocketAddr]>,
}

impl LearnedSink for HostSink {
    fn import(&self, records: &[LearnedRecord]) -> usize {
        self.host.import_learned(records, &self.servers)
    }
}

/// One gateway's membership of an HA group.
pub(crate) struct Ha {
    config: ShareConfig,
    connect: Connect,
    clock: Clock,
    /// The proxy's listen addresses: an imported answer is checked as a query to them.
    servers: Arc<[SocketAddr]>,
    answers: mpsc::Sender<Answer>,
    receiver: Mutex<Option<mpsc::Receiver<Answer>>>,
    status: watch::Sender<ShareStatus>,
    /// The revision the import before serving read at (the watch goes on from there).
    revision: Mutex<Option<Revision>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Ha {
    /// Membership of `group` as gateway `gateway`, whose proxy listens on `servers`.
    pub(crate) fn new(
        gateway: &str,
        group: &str,
        layout: Layout,
        connect: Connect,
        clock: Clock,
        servers: &[SocketAddr],
    ) -> Arc<Self> {
        let (answers, receiver) = mpsc::channel(QUEUE);
        tracing::info!(group, gateway, "HA gateway group: sharing learned answers");
        if servers.iter().any(|s| s.ip().is_unspecified()) {
            tracing::warn!(
                "HA gateway group: a wildcard listen address matches only DNS rules without a destination; peers' answers are checked as queries to the listen addresses (listen on the pair's virtual address)"
            );
        }
        Arc::new(Self {
            config: ShareConfig::new(gateway, group, layout),
            connect,
            clock,
            servers: servers.into(),
            answers,
            receiver: Mutex::new(Some(receiver)),
            status: watch::Sender::new(ShareStatus::new(group)),
            revision: Mutex::new(None),
        })
    }

    /// Publishes an answer the observer learned for client group `client` (asynchronously:
    /// a full queue drops it and counts it).
    pub(crate) fn offer(&self, client: &str, name: &str, addrs: &[std::net::IpAddr], ttl: u32) {
        let answer = Answer {
            client: client.to_owned(),
            name: name.to_owned(),
            addrs: addrs.to_vec(),
            ttl,
            learned_ms: self.clock.unix_ms_of(self.clock.now()),
        };
        if self.answers.try_send(answer).is_err() {
            self.status.send_modify(|s| s.dropped += 1);
        }
    }

    /// What sharing reports.
    pub(crate) fn status(&self) -> ShareStatus {
        self.status.borrow().clone()
    }

    /// Reads the group's records and learns them, before the proxy serves; gives up after
    /// [`IMPORT_AT_START`] (the importer task reads them once etcd answers).
    pub(crate) async fn import_before_serving(&self, host: Arc<dyn Host>) -> Result<()> {
        let store = EtcdStore::connect(&self.connect).await?;
        let sink = Arc::new(HostSink {
            host,
            servers: Arc::clone(&self.servers),
        });
        let wall = Arc::new(ClockWall(self.clock));
        let read = learned::import_all(&store, &self.config, &sink, &wall, &self.status);
        match tokio::time::timeout(IMPORT_AT_START, read).await {
            Ok(Ok(revision)) => {
                *lock(&self.revision) = Some(revision);
                let s = self.status();
                self.status.send_modify(|s| s.initial_import_done = true);
                tracing::info!(
                    imported = s.imported,
                    refused = s.import_refused,
                    revision,
                    "HA group state imported before serving"
                );
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the HA group's state could not be read: serving without it (imported once etcd answers)");
            }
            Err(_) => {
                tracing::warn!(
                    "the HA group's state was not read within 5s: serving without it (imported once etcd answers)"
                );
            }
        }
        Ok(())
    }

    /// Starts the publisher and the importer.
    pub(crate) fn spawn(
        &self,
        store: &EtcdStore,
        host: Arc<dyn Host>,
        tasks: &mut JoinSet<Result<()>>,
        stopped: &watch::Receiver<bool>,
    ) {
        let wall = Arc::new(ClockWall(self.clock));
        if let Some(receiver) = lock(&self.receiver).take() {
            let publisher = learned::publish(
                store.clone(),
                self.config.clone(),
                Arc::clone(&wall),
                receiver,
                self.status.clone(),
                stopped.clone(),
            );
            tasks.spawn(async move {
                publisher.await;
                Ok(())
            });
        }
        let importer = learned::import(
            store.clone(),
            self.config.clone(),
            Arc::new(HostSink {
                host,
                servers: Arc::clone(&self.servers),
            }),
            wall,
            *lock(&self.revision),
            self.status.clone(),
            stopped.clone(),
        );
        tasks.spawn(async move {
            importer.await;
            Ok(())
        });
    }
}
