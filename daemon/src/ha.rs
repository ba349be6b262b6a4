//! A highly available gateway group (`gatewayGroup` in the Cluster document, docs/ha-gateway.md):
//! the glue between the proxy's observer, the cluster crate's publisher and importer, and the
//! engine.
//!
//! - The observer hands every allowed, wholly learned answer to [`Ha::offer`] after it is
//!   learned (and journaled): a `try_send`, so the reply never waits on etcd.
//! - Before the proxy binds, [`Ha::import_before_serving`] reads the group's records and learns
//!   them (bounded: etcd may be down); then the publisher and the importer run as tasks.
//! - Imported records go through [`Host::import_learned`]: the daemon's engine, its DNS policy,
//!   its breakers and its journal; revocations through [`Host::revoke_learned`]; the answers the
//!   group lacks are found in [`Host::held_answers`] and published again.
//! - `fqdnd cache forget` on a gateway of a group also changes the group's keys
//!   ([`Ha::forget`]: through the publisher, which retries while etcd is unreachable).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::Result;
use fqdnd_cluster::learned::{self, Answer, Forget, Importer, Publish};
use fqdnd_cluster::{
    AnyStore, Held, Import, Layout, LearnedSink, Revision, Revocation, ShareConfig, ShareStatus,
    Wall,
};
use fqdnd_engine::Clock as _;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::host::Host;
use crate::store::StoreSource;

/// How many answers may wait for the publisher; beyond, they are dropped and counted.
const QUEUE: usize = 16_384;

/// How long a start waits for the group's records before serving without them.
const IMPORT_AT_START: Duration = Duration::from_secs(5);

/// How long `cache forget` waits for the group's keys to change before it reports them
/// pending (the publisher goes on trying).
const FORGET_WAIT: Duration = Duration::from_secs(5);

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
    fn import(&self, records: &[Import]) -> usize {
        self.host.import_learned(records, &self.servers)
    }

    fn revoke(&self, revocations: &[Revocation]) {
        self.host.revoke_learned(revocations);
    }

    fn held(&self) -> Vec<Held> {
        self.host.held_answers()
    }
}

/// What `fqdnd cache forget` did to the HA group's keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupForget {
    /// The group.
    pub group: String,
    /// Keys deleted.
    pub deleted: usize,
    /// Keys rewritten without the addresses forgotten.
    pub rewritten: usize,
    /// Other gateways' keys etcd refused to change (least-privilege roles).
    #[serde(default)]
    pub denied: usize,
    /// Whether etcd has not taken it yet (the publisher goes on trying).
    pub pending: bool,
}

/// One gateway's membership of an HA group.
pub struct Ha {
    config: ShareConfig,
    store: StoreSource,
    clock: Clock,
    /// The proxy's listen addresses: an imported answer is checked as a query to them.
    servers: Arc<[SocketAddr]>,
    publisher: mpsc::Sender<Publish>,
    receiver: Mutex<Option<mpsc::Receiver<Publish>>>,
    status: watch::Sender<ShareStatus>,
    /// The import before serving: what it read, and the revision it read at (the watch goes
    /// on from there).
    imported: Mutex<Option<(Importer<HostSink, ClockWall>, Revision)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Ha {
    /// Membership of `group` as gateway `gateway`, whose proxy listens on `servers` and holds
    /// an imported answer `max_ttl` seconds at most.
    pub fn new(
        gateway: &str,
        group: &str,
        layout: Layout,
        store: StoreSource,
        clock: Clock,
        (servers, max_ttl): (&[SocketAddr], u32),
    ) -> Arc<Self> {
        let (publisher, receiver) = mpsc::channel(QUEUE);
        tracing::info!(group, gateway, "HA gateway group: sharing learned answers");
        if servers.iter().any(|s| s.ip().is_unspecified()) {
            tracing::warn!(
                "HA gateway group: a wildcard listen address matches only DNS rules without a destination; peers' answers are checked as queries to the listen addresses (listen on the pair's virtual address)"
            );
        }
        let mut config = ShareConfig::new(gateway, group, layout);
        config.max_ttl = max_ttl;
        Arc::new(Self {
            config,
            store,
            clock,
            servers: servers.into(),
            publisher,
            receiver: Mutex::new(Some(receiver)),
            status: watch::Sender::new(ShareStatus::new(group)),
            imported: Mutex::new(None),
        })
    }

    /// Publishes an answer the observer learned for client group `client` (asynchronously:
    /// a full queue drops it and counts it).
    pub fn offer(&self, client: &str, name: &str, addrs: &[IpAddr], ttl: u32) {
        let answer = Answer {
            client: client.to_owned(),
            name: name.to_owned(),
            addrs: addrs.to_vec(),
            ttl,
            learned_ms: self.clock.unix_ms_of(self.clock.now()),
        };
        if self.publisher.try_send(Publish::Answer(answer)).is_err() {
            self.status.send_modify(|s| s.dropped += 1);
        }
    }

    /// What sharing reports.
    pub fn status(&self) -> ShareStatus {
        self.status.borrow().clone()
    }

    /// `fqdnd cache forget` for the group: its keys of `name` (of client group `client`, if
    /// given) lose `addrs` (every address when `None`) — deleted, or rewritten without them;
    /// what waits to be written loses them too. Waits [`FORGET_WAIT`] for etcd at most (then
    /// reports it pending: the publisher goes on trying).
    pub async fn forget(
        &self,
        name: &str,
        addrs: Option<&[IpAddr]>,
        client: Option<&str>,
    ) -> GroupForget {
        let mut out = GroupForget {
            group: self.config.group.clone(),
            pending: true,
            ..GroupForget::default()
        };
        let (reply, done) = oneshot::channel();
        let forget = Forget {
            name: name.to_owned(),
            addrs: addrs.map(<[IpAddr]>::to_vec),
            client: client.map(str::to_owned),
        };
        let sent = tokio::time::timeout(
            FORGET_WAIT,
            self.publisher.send(Publish::Forget(forget, Some(reply))),
        )
        .await;
        if !matches!(sent, Ok(Ok(()))) {
            tracing::warn!(name, "the HA group's publisher did not take the forget");
            return out;
        }
        if let Ok(Ok(revoked)) = tokio::time::timeout(FORGET_WAIT, done).await {
            out.deleted = revoked.deleted;
            out.rewritten = revoked.rewritten;
            out.denied = revoked.denied;
            out.pending = false;
        }
        out
    }

    /// Reads the group's records and learns them, before the proxy serves; gives up after
    /// [`IMPORT_AT_START`] (the importer task reads them once etcd answers).
    pub async fn import_before_serving(&self, host: Arc<dyn Host>) -> Result<()> {
        let store = self.store.open().await?;
        let mut importer = self.importer(host);
        let read = learned::import_all(&store, &mut importer);
        match tokio::time::timeout(IMPORT_AT_START, read).await {
            Ok(Ok(revision)) => {
                *lock(&self.imported) = Some((importer, revision));
                let s = self.status();
                tracing::info!(
                    records = s.startup_records,
                    imported = s.imported,
                    refused = s.import_refused,
                    rejected = s.rejected,
                    took_ms = s.startup_import_ms,
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

    fn importer(&self, host: Arc<dyn Host>) -> Importer<HostSink, ClockWall> {
        let sink = Arc::new(HostSink {
            host,
            servers: Arc::clone(&self.servers),
        });
        Importer::new(
            self.config.clone(),
            sink,
            Arc::new(ClockWall(self.clock)),
            self.status.clone(),
        )
    }

    /// Starts the publisher and the importer.
    pub fn spawn(
        &self,
        store: &AnyStore,
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
        let (importer, revision) = match lock(&self.imported).take() {
            Some((importer, revision)) => (importer, Some(revision)),
            None => (self.importer(host), None),
        };
        let importer = learned::import(
            store.clone(),
            importer,
            revision,
            self.publisher.clone(),
            stopped.clone(),
        );
        tasks.spawn(async move {
            importer.await;
            Ok(())
        });
    }
}
