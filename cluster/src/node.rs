//! The node side ([`run`]): keeps a node's [`View`] of the cluster current and publishes its
//! endpoints.
//!
//! - **Watch.** A snapshot of the whole prefix, then a watch from the revision after it: one
//!   ordered stream, so an endpoint's global identity is always known before the remote
//!   endpoint that carries it. Each batch's [`Changes`] go to the [`Sink`] (the daemon's
//!   engine). On any error the node keeps what it knows, retries, and on reconnection reads a
//!   snapshot and hands the sink only the difference (no flush).
//! - **Publish.** Each local endpoint is one key `<p>/endpoints/<labels>/<node>/<id>` under the
//!   node's lease, carrying its global identity once the view has one (a temporary identity
//!   never leaves the node); the node's registration `<p>/nodes/<node>`, under the same lease,
//!   carries its own addresses (the other nodes' remote-node identity), put again only when
//!   they change. Published keys are diffed against the wanted ones after every
//!   local change and every identity change; when the lease is lost, everything is put again
//!   under a new one. Stopping does not revoke the lease: a restarted node takes its keys
//!   over before the lease expires, so other nodes never see them go.
//! - **Persist.** The view is written to the state file when it changed, at most once a
//!   second and, for a large view, at most 1 % of the time spent encoding it (encoded here,
//!   written and synced on a blocking thread: the watch goes on); and at once when the store
//!   becomes unreachable — before the status says so — or the node stops.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, StoreError};
use crate::keys::{EndpointRecord, Layout, NodeRecord};
use crate::labels::Labels;
use crate::reject::{RecordKind, Rejections};
use crate::store::{LeaseId, Op, Store, Txn, Watch};
use crate::view::{Changes, View, write_state};

/// Operations per publishing transaction (etcd allows 128 by default).
const PUBLISH_BATCH: usize = 100;

/// One endpoint of this node, as it is published.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LocalEndpoint {
    /// Its id on this node.
    pub id: u16,
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: Labels,
    /// Its addresses (none for a gateway's client groups).
    pub ips: Vec<IpAddr>,
}

/// What the node publishes, as the daemon has it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Local {
    /// Its endpoints.
    pub endpoints: Vec<LocalEndpoint>,
    /// Its own addresses (those it gives the host identity; none for a gateway).
    pub addresses: Vec<IpAddr>,
}

/// Where the node's view goes: the daemon's engine.
pub trait Sink: Send + Sync + 'static {
    /// Applies what changed in the view. Called from a blocking thread, one call at a time,
    /// in order (the first call, made once the store was read even if nothing changed,
    /// brings the view the node started from to the store's).
    fn apply(&self, changes: &Changes);
}

/// How the node side runs.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's name.
    pub node: String,
    /// The key layout.
    pub layout: Layout,
    /// The TTL of the lease its endpoints are published under.
    pub lease_ttl: Duration,
    /// Where the view is persisted, if anywhere.
    pub state_file: Option<PathBuf>,
}

/// What the node side reports (`fqdnd status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeStatus {
    /// Whether the watch is running.
    pub connected: bool,
    /// Seconds (on the node's clock) of the last connection change.
    pub since_seconds: u64,
    /// When the connection state last changed (what "connected/unreachable for N s" counts
    /// from).
    #[serde(skip)]
    pub changed_at: Option<Instant>,
    /// The allocator leader, as last seen.
    pub leader: Option<String>,
    /// The revision the view holds.
    pub revision: i64,
    /// Global identities known.
    pub identities: usize,
    /// Endpoints of other nodes known.
    pub remote_endpoints: usize,
    /// Other nodes registered.
    pub remote_nodes: usize,
    /// Shared policy documents.
    pub policies: usize,
    /// Endpoints of this node published.
    pub published: usize,
    /// Times the view was read again after an error.
    pub resyncs: u64,
    /// The last error.
    pub last_error: Option<String>,
    /// Records refused as read (not well formed, key and value disagreeing), by kind.
    pub rejected: BTreeMap<RecordKind, u64>,
}

impl NodeStatus {
    /// How long the connection has been in its current state.
    pub fn in_state_for(&self) -> Duration {
        self.changed_at.map(|at| at.elapsed()).unwrap_or_default()
    }
}

/// The publishing state.
struct Publisher {
    lease: Option<LeaseId>,
    /// Key → (value, lease) as the store holds it, as far as we know.
    published: BTreeMap<String, (Vec<u8>, LeaseId)>,
}

/// Runs the node side until `stop`, starting from `view` (what the state file held, or
/// empty). `local` carries the node's endpoints and addresses as the daemon has them.
///
/// # Errors
/// Only an invalid node name; store failures are retried.
pub async fn run<S: Store, K: Sink>(
    store: S,
    config: NodeConfig,
    mut view: View,
    sink: Arc<K>,
    mut local: watch::Receiver<Local>,
    status: watch::Sender<NodeStatus>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), Error> {
    if !crate::keys::valid_name(&config.node) {
        return Err(Error::InvalidName { name: config.node });
    }
    let started = Instant::now();
    let root = config.layout.root();
    let mut publisher = Publisher {
        lease: None,
        published: BTreeMap::new(),
    };
    let mut saver = Saver::new(config.state_file.clone());
    let mut rejected = Rejections::default();
    let mut backoff = Duration::from_millis(200);
    let mut first = true;
    // What it knows before it reaches the store (the state file's view).
    let registration = config.layout.node(&config.node);
    let describe = |s: &mut NodeStatus, view: &View, publisher: &Publisher| {
        s.leader.clone_from(&view.leader);
        s.revision = view.revision;
        s.identities = view.identities.len();
        s.remote_endpoints = view.endpoints.len();
        s.remote_nodes = view.nodes.len();
        s.policies = view.policies.len();
        s.published = publisher.published.len()
            - usize::from(publisher.published.contains_key(&registration));
    };
    status.send_modify(|s| describe(s, &view, &publisher));
    loop {
        if *stop.borrow() {
            saver.now(&view).await;
            return Ok(());
        }
        // Connect: a snapshot, the difference to what we hold, the watch after it.
        let connected = async {
            let snapshot = store.range(&root).await?;
            let w = store.watch(&root, snapshot.revision + 1).await?;
            Ok::<_, StoreError>((snapshot, w))
        }
        .await;
        let (snapshot, mut w) = match connected {
            Ok(c) => c,
            Err(e) => {
                // Saved before it is reported: "unreachable" means the view is on disk.
                saver.now(&view).await;
                disconnected(&status, &e, started);
                retry_pause(&mut backoff, &mut stop).await;
                continue;
            }
        };
        backoff = Duration::from_millis(200);
        let (fresh, own) =
            View::from_snapshot(&config.layout, &config.node, &snapshot, &mut rejected);
        let changes = view.diff(&fresh);
        view = fresh;
        if !changes.is_empty() {
            saver.dirty = true;
        }
        // The first sync is handed over even when nothing changed: the sink learns that the
        // view is now the store's.
        if !changes.is_empty() || first {
            apply(&sink, changes).await;
        }
        publisher.published = own
            .into_iter()
            .map(|(k, kv)| (k, (kv.value, kv.lease)))
            .collect();
        status.send_modify(|s| {
            if !s.connected || s.changed_at.is_none() {
                s.since_seconds = started.elapsed().as_secs();
                s.changed_at = Some(Instant::now());
            }
            s.connected = true;
            s.last_error = None;
            s.rejected.clone_from(rejected.counts());
            if !first {
                s.resyncs += 1;
            }
            describe(s, &view, &publisher);
        });
        first = false;
        tracing::info!(node = %config.node, revision = view.revision, identities = view.identities.len(), remote_endpoints = view.endpoints.len(), "cluster view in sync");
        let keep_period = (config.lease_ttl / 3).max(Duration::from_millis(100));
        let mut keep = tokio::time::interval(keep_period);
        keep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut save = tokio::time::interval(Duration::from_secs(1));
        save.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut wanted = true;
        let failure = loop {
            if wanted {
                let local = local.borrow_and_update().clone();
                if let Err(e) = publish(&store, &config, &view, &local, &mut publisher).await {
                    break e;
                }
                status.send_modify(|s| describe(s, &view, &publisher));
                wanted = false;
            }
            tokio::select! {
                next = w.next() => match next {
                    Ok(batch) => {
                        let before = rejected.total();
                        let (changes, own) = view.apply(&config.layout, &config.node, &batch.events, &mut rejected);
                        if rejected.total() != before {
                            status.send_modify(|s| s.rejected.clone_from(rejected.counts()));
                        }
                        for (key, present) in own {
                            if !present && publisher.published.remove(&key).is_some() {
                                wanted = true;
                            }
                        }
                        if changes.identities_changed() {
                            wanted = true;
                        }
                        if !changes.is_empty() {
                            saver.dirty = true;
                            apply(&sink, changes).await;
                        }
                        // The revision moves with every batch, changes or not.
                        status.send_modify(|s| describe(s, &view, &publisher));
                    }
                    Err(e) => break e,
                },
                changed = local.changed() => {
                    if changed.is_err() {
                        // The daemon is going away.
                        saver.now(&view).await;
                        return Ok(());
                    }
                    wanted = true;
                }
                _ = keep.tick() => {
                    if let Some(lease) = publisher.lease {
                        match store.keep_alive(lease).await {
                            Ok(true) => {}
                            Ok(false) => {
                                tracing::warn!(node = %config.node, "the node's lease expired: publishing its endpoints again");
                                publisher.lease = None;
                                wanted = true;
                            }
                            Err(e) => break e,
                        }
                    }
                }
                _ = save.tick() => saver.start(&view),
                _ = stop.changed() => {
                    saver.now(&view).await;
                    return Ok(());
                }
            }
        };
        saver.now(&view).await;
        disconnected(&status, &failure, started);
        tracing::warn!(node = %config.node, error = %failure, "cluster store unreachable: enforcing with what is known");
    }
}

/// Waits `backoff` (or until `stop` changes) before trying the store again, and doubles it up
/// to 2 s.
pub(crate) async fn retry_pause(backoff: &mut Duration, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = tokio::time::sleep(*backoff) => {}
        _ = stop.changed() => {}
    }
    *backoff = (*backoff * 2).min(Duration::from_secs(2));
}

fn disconnected(status: &watch::Sender<NodeStatus>, error: &StoreError, started: Instant) {
    status.send_modify(|s| {
        if s.connected || s.changed_at.is_none() {
            s.since_seconds = started.elapsed().as_secs();
            s.changed_at = Some(Instant::now());
        }
        s.connected = false;
        s.last_error = Some(error.to_string());
    });
}

/// The share of the node's time the periodic save may spend encoding: a large view (100k
/// remote endpoints: 16 MB) is saved less often than once a second.
const SAVE_BUDGET: u32 = 100;

/// Saves the view to the state file: encoded on the node's task, written and synced on a
/// blocking thread, one write at a time — so a large view's write never holds up the watch.
struct Saver {
    path: Option<PathBuf>,
    /// The view changed since the last write started.
    dirty: bool,
    writing: Option<tokio::task::JoinHandle<()>>,
    /// Set by a write that failed (the view is dirty again).
    failed: Arc<AtomicBool>,
    /// No periodic save before this: at least a second, and 100 times the last encoding,
    /// after the last one.
    next: Option<Instant>,
}

impl Saver {
    fn new(path: Option<PathBuf>) -> Self {
        Self {
            path,
            dirty: false,
            writing: None,
            failed: Arc::new(AtomicBool::new(false)),
            next: None,
        }
    }

    /// Starts writing `view` if it changed, no write is under way and its time has come (the
    /// periodic save).
    fn start(&mut self, view: &View) {
        if self.writing.as_ref().is_some_and(|w| !w.is_finished())
            || self.next.is_some_and(|next| Instant::now() < next)
        {
            return;
        }
        self.writing = None;
        let began = Instant::now();
        if let Some(write) = self.write(view) {
            let took = began.elapsed();
            self.next = Some(began + (took * SAVE_BUDGET).max(Duration::from_secs(1)));
            self.writing = Some(tokio::task::spawn_blocking(write));
        }
    }

    /// Writes `view` now if it changed, after the write under way: before the node reports
    /// etcd unreachable, and when it stops.
    async fn now(&mut self, view: &View) {
        if let Some(writing) = self.writing.take() {
            let _ = writing.await;
        }
        if let Some(write) = self.write(view) {
            let _ = tokio::task::spawn_blocking(write).await;
        }
    }

    /// The write of `view`, if there is a state file and something to write.
    fn write(&mut self, view: &View) -> Option<impl FnOnce() + Send + 'static> {
        let path = self.path.clone()?;
        if self.failed.swap(false, Ordering::Relaxed) {
            self.dirty = true;
        }
        if !self.dirty {
            return None;
        }
        let bytes = match view.encode(&path) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(error = %e, "saving the cluster view failed");
                return None;
            }
        };
        self.dirty = false;
        let failed = Arc::clone(&self.failed);
        Some(move || {
            if let Err(e) = write_state(&path, &bytes) {
                tracing::warn!(error = %e, "saving the cluster view failed");
                failed.store(true, Ordering::Relaxed);
            }
        })
    }
}

async fn apply<K: Sink>(sink: &Arc<K>, changes: Changes) {
    let sink = Arc::clone(sink);
    if let Err(e) = tokio::task::spawn_blocking(move || sink.apply(&changes)).await {
        tracing::error!(error = %e, "applying the cluster view panicked");
    }
}

/// The keys and values this node should have published: its endpoints and its registration.
pub fn wanted(config: &NodeConfig, view: &View, local: &Local) -> BTreeMap<String, Vec<u8>> {
    let mut ips = local.addresses.clone();
    ips.sort_unstable();
    ips.dedup();
    let registration = NodeRecord {
        node: config.node.clone(),
        ips,
    };
    let registration = (
        config.layout.node(&config.node),
        serde_json::to_vec(&registration).unwrap_or_default(),
    );
    local
        .endpoints
        .iter()
        .map(|e| {
            let record = EndpointRecord {
                node: config.node.clone(),
                id: e.id,
                name: e.name.clone(),
                labels: e.labels.clone(),
                ips: e.ips.clone(),
                identity: view.identities.get(&e.labels).copied(),
            };
            (
                config.layout.endpoint(&e.labels, &config.node, e.id),
                serde_json::to_vec(&record).unwrap_or_default(),
            )
        })
        .chain(std::iter::once(registration))
        .collect()
}

/// Brings the published keys to the wanted ones: puts under the lease (a new one if needed),
/// deletes of what is no longer wanted.
async fn publish<S: Store>(
    store: &S,
    config: &NodeConfig,
    view: &View,
    local: &Local,
    publisher: &mut Publisher,
) -> Result<(), StoreError> {
    let want = wanted(config, view, local);
    for _attempt in 0..3 {
        let lease = match publisher.lease {
            Some(lease) => lease,
            None => {
                let lease = store.grant(config.lease_ttl).await?;
                publisher.lease = Some(lease);
                lease
            }
        };
        let mut ops: Vec<Op> = Vec::new();
        for (key, value) in &want {
            if publisher.published.get(key) != Some(&(value.clone(), lease)) {
                ops.push(Op::Put {
                    key: key.clone(),
                    value: value.clone(),
                    lease: Some(lease),
                });
            }
        }
        for key in publisher.published.keys() {
            if !want.contains_key(key) {
                ops.push(Op::Delete { key: key.clone() });
            }
        }
        let mut lost = false;
        for chunk in ops.chunks(PUBLISH_BATCH) {
            match store
                .txn(Txn {
                    compares: Vec::new(),
                    ops: chunk.to_vec(),
                })
                .await
            {
                Ok(_) => {
                    for op in chunk {
                        match op {
                            Op::Put { key, value, .. } => {
                                publisher
                                    .published
                                    .insert(key.clone(), (value.clone(), lease));
                            }
                            Op::Delete { key } => {
                                publisher.published.remove(key);
                            }
                        }
                    }
                }
                Err(StoreError::LeaseNotFound { .. }) => {
                    lost = true;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if !lost {
            return Ok(());
        }
        publisher.lease = None;
    }
    Err(StoreError::Unavailable {
        reason: "the node's lease kept expiring while publishing".to_owned(),
    })
}
