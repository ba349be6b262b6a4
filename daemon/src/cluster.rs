//! Cluster mode in the daemon (a `kind: Cluster` document): the glue between the cluster
//! crate's node side and the engine, for `fqdnd node` and `fqdnd gateway`.
//!
//! - At start ([`ClusterRuntime::open`]) the view persisted in `<stateDir>/cluster.state` is
//!   read: the engine is primed with its identity numbers and the other nodes' endpoints
//!   before it gets endpoints and policy ([`ClusterRuntime::prime`]), and its shared policy
//!   joins the configuration — so a restart while etcd is down changes nothing.
//! - The configuration in force is the files' plus the shared policy ([`ClusterRuntime::rules`],
//!   merged by the daemon skeleton in every apply); after every apply the endpoints in force
//!   are handed to the node side, which publishes them ([`ClusterRuntime::set_local`]), and so
//!   are the node's own addresses each time they are read ([`ClusterRuntime::set_addresses`]:
//!   published with the node's registration when they change).
//! - The node side's changes come back through [`EngineSink`]: numbers, remote endpoints and
//!   the other nodes' own addresses (the remote-node identity) to
//!   the engine, a changed shared policy through a reload of the whole configuration (applied
//!   atomically or not at all: [`Host::reload_all`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::{Context, Result, bail};
use fqdnd_cluster::node::{self, Local, LocalEndpoint, NodeConfig, NodeStatus, Sink};
use fqdnd_cluster::{
    Changes, Connect, Credentials, Label, Labels, Layout, RecordKind, ShareStatus, TlsFiles, View,
};
use fqdnd_config::{Config, Daemon, SharedPolicySet, SharedUpdate};
use fqdnd_engine::{ClusterUpdate, Engine, RemoteEndpoint, RemoteNode};
use fqdnd_ipcache::policy::Rule;
use fqdnd_ipcache::{Datapath, EndpointLabel, Identity, host_prefix};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::datapath::AnyDatapath;
use crate::ha::Ha;
pub use crate::host::Host;
use crate::store::StoreSource;

/// The shared policy as this node accepted it, document by document.
#[derive(Debug, Default, Clone)]
struct SharedRules {
    set: SharedPolicySet,
    /// Whether this node knows the shared policy: restored from the state directory, or read
    /// from etcd once. Until then its endpoints are in default deny ([`default_deny`]).
    established: bool,
    /// Why the last change was refused as a whole by the daemon (empty when it was not).
    reload_errors: Vec<String>,
    /// Documents refused (each text once).
    refused_total: u64,
}

impl SharedRules {
    /// The rules in force: the accepted documents', or default deny while the shared policy
    /// is not known.
    fn rules(&self) -> Vec<Rule> {
        if self.established {
            self.set.rules().cloned().collect()
        } else {
            vec![default_deny()]
        }
    }

    /// Each refused document with why, then the daemon's refusal if any.
    fn errors(&self) -> Vec<String> {
        self.set
            .refused()
            .flat_map(|(_, errors)| errors.iter().cloned())
            .chain(self.reload_errors.iter().cloned())
            .collect()
    }
}

/// A rule that puts every endpoint into default deny, both ways: what a node enforces while
/// it does not know the cluster's shared policy (no saved view, etcd not read yet) — never
/// more open than its policy.
fn default_deny() -> Rule {
    Rule {
        origin: "cluster: shared policy not known yet (default deny until etcd is read)".into(),
        endpoint_selector: fqdnd_ipcache::policy::LabelSelector::default(),
        egress: Vec::new(),
        default_deny_egress: true,
        ingress: Vec::new(),
        egress_deny: Vec::new(),
        ingress_deny: Vec::new(),
        default_deny_ingress: true,
    }
}

/// The file under `stateDir` holding the shared policy documents this node accepted (JSON:
/// name → text), so that a restart keeps the version in force of a document since broken.
const ACCEPTED_FILE: &str = "cluster-policy.json";

/// `fqdnd status`'s cluster section.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// This node's name in the cluster.
    pub node: String,
    /// The etcd members.
    pub endpoints: Vec<String>,
    /// The key prefix.
    pub prefix: String,
    /// Whether etcd answers.
    pub connected: bool,
    /// Seconds of daemon uptime at the last connection change.
    pub since_seconds: u64,
    /// The identity allocator in charge (the operator holding the lease).
    pub leader: Option<String>,
    /// The etcd revision last read.
    pub revision: i64,
    /// Global identities known.
    pub identities: usize,
    /// Endpoints of other nodes known.
    pub remote_endpoints: usize,
    /// Other nodes registered (their own addresses are the remote-node identity here).
    #[serde(default)]
    pub remote_nodes: usize,
    /// This node's endpoints published.
    pub published: usize,
    /// Full resynchronisations after a lost watch.
    pub resyncs: u64,
    /// The last error talking to etcd.
    pub last_error: Option<String>,
    /// Shared policy documents in force.
    pub shared_policies: usize,
    /// Shared policy documents refused, and why.
    pub shared_policy_errors: Vec<String>,
    /// Seconds the connection has been in its state (connected or not).
    #[serde(default)]
    pub state_seconds: u64,
    /// Whether the shared policy is known (else endpoints are in default deny).
    #[serde(default)]
    pub shared_policy_known: bool,
    /// Records refused as read, by kind (`fqdnd_cluster_records_rejected_total`); shared
    /// policy documents that do not load count as `policy`.
    #[serde(default)]
    pub rejected: BTreeMap<String, u64>,
    /// (number, labels) of the local label sets still waiting for a global identity.
    pub temporary_identities: Vec<(u32, String)>,
    /// The HA gateway group's sharing, with `gatewayGroup`.
    #[serde(default)]
    pub ha: Option<ShareStatus>,
}

/// Cluster mode of one daemon.
pub struct ClusterRuntime {
    doc: fqdnd_config::Cluster,
    node: String,
    layout: Layout,
    /// etcd, or the in-memory store handed in at start.
    store: StoreSource,
    state_file: Option<PathBuf>,
    /// Whether endpoints are published with their addresses (node: yes; a gateway's client
    /// groups are published without: their prefixes are not workloads).
    publish_addresses: bool,
    /// The view read at start (taken by the node side when it starts).
    initial: Mutex<Option<View>>,
    rules: Mutex<SharedRules>,
    /// Where the accepted shared policy is saved.
    state_dir: Option<PathBuf>,
    local: watch::Sender<Local>,
    status: watch::Sender<NodeStatus>,
    /// The HA gateway group (`fqdnd gateway` with `gatewayGroup`).
    ha: Option<Arc<Ha>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// This host's name (`/proc/sys/kernel/hostname`).
fn hostname() -> Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading the host name (set `nodeName` in the Cluster document)")?;
    Ok(name.trim().to_owned())
}

/// The name a `Cluster` document gives this member: `nodeName`, else the host name.
pub fn member_name(doc: &fqdnd_config::Cluster) -> Result<String> {
    let name = match &doc.node_name {
        Some(name) => name.clone(),
        None => hostname()?,
    };
    if !fqdnd_config::valid_node_name(&name) {
        bail!(
            "the host name {name:?} cannot name a cluster member: set `nodeName` in the Cluster document"
        );
    }
    Ok(name)
}

/// How to reach etcd, from the document (the password, with `auth`, read from its file).
pub fn connect_options(doc: &fqdnd_config::Cluster) -> Result<Connect> {
    let credentials = match &doc.auth {
        Some(auth) => Some(Credentials {
            user: auth.user.clone(),
            password: read_password(&auth.password_file)?,
        }),
        None => None,
    };
    Ok(Connect {
        endpoints: doc.endpoints.clone(),
        tls: doc.tls.as_ref().map(|t| TlsFiles {
            ca: t.ca.clone(),
            cert: t.cert.clone(),
            key: t.key.clone(),
        }),
        credentials,
        timeout: Duration::from_secs(3),
    })
}

/// The etcd password in `path`: its first line. Warns when others may read the file.
fn read_password(path: &std::path::Path) -> Result<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the etcd password file {}", path.display()))?;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o044 != 0
    {
        tracing::warn!(file = %path.display(), mode = format_args!("{:o}", meta.permissions().mode() & 0o7777), "the etcd password file is readable by its group or by everyone: make it readable by its owner only (chmod 600)");
    }
    let password = text.lines().next().unwrap_or_default().to_owned();
    if password.is_empty() {
        bail!("the etcd password file {} is empty", path.display());
    }
    Ok(password)
}

/// Where a shared document's errors and rules point: its key.
fn origin(layout: &Layout, name: &str) -> PathBuf {
    PathBuf::from(format!("etcd:{}", layout.policy(name)))
}

/// Logs what an update of the shared policy refused.
fn log_refused(update: &SharedUpdate) {
    for (name, errors) in &update.refused {
        let kept = update.kept_previous.contains(name);
        for e in errors {
            if kept {
                tracing::error!(policy = %name, error = %e, "a shared policy does not load: refused; its previous version stays in force");
            } else {
                tracing::error!(policy = %name, error = %e, "a shared policy does not load: refused (the others apply)");
            }
        }
    }
}

/// The accepted documents saved in `dir`, if any (`None`: no file).
fn load_accepted(dir: &std::path::Path) -> Option<BTreeMap<String, String>> {
    let path = dir.join(ACCEPTED_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::error!(file = %path.display(), error = %e, "reading the accepted shared policy");
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(docs) => Some(docs),
        Err(e) => {
            tracing::error!(file = %path.display(), error = %e, "the accepted shared policy file does not parse: ignored");
            None
        }
    }
}

/// Saves the accepted documents in `dir` (atomically: a temporary file, synced, renamed).
fn save_accepted(dir: &std::path::Path, set: &SharedPolicySet) {
    let docs: BTreeMap<&str, &str> = set.accepted().collect();
    let path = dir.join(ACCEPTED_FILE);
    let write = || -> std::io::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let tmp = path.with_extension("tmp");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&serde_json::to_vec(&docs).map_err(std::io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        crate::metrics::count_state_file_error();
        tracing::error!(file = %path.display(), error = %e, "saving the accepted shared policy");
    }
}

fn to_endpoint_labels(labels: &Labels) -> Vec<EndpointLabel> {
    labels
        .iter()
        .map(|l| EndpointLabel {
            source: l.source.clone(),
            key: l.key.clone(),
            value: l.value.clone(),
        })
        .collect()
}

fn to_labels(labels: &[EndpointLabel]) -> Labels {
    labels
        .iter()
        .map(|l| Label {
            source: l.source.clone(),
            key: l.key.clone(),
            value: l.value.clone(),
        })
        .collect()
}

/// What the engine does with the node side's changes.
fn to_update(changes: &Changes) -> ClusterUpdate {
    let mut update = ClusterUpdate {
        unassigned: changes
            .unassigned
            .iter()
            .map(|(l, _)| to_endpoint_labels(l))
            .collect(),
        assigned: changes
            .assigned
            .iter()
            .map(|(l, n)| (to_endpoint_labels(l), Identity(*n)))
            .collect(),
        remote_removed: changes.endpoints_removed.clone(),
        remote_upserted: Vec::new(),
        nodes_removed: changes.nodes_removed.clone(),
        nodes_upserted: changes
            .nodes_upserted
            .iter()
            .map(|n| RemoteNode {
                name: n.node.clone(),
                addresses: n.ips.clone(),
            })
            .collect(),
    };
    for (key, record) in &changes.endpoints_upserted {
        if record.ips.is_empty() {
            // Published without addresses (a gateway's client group): nothing to route to.
            update.remote_removed.push(key.clone());
            continue;
        }
        update.remote_upserted.push(RemoteEndpoint {
            name: key.clone(),
            addresses: record.ips.iter().map(|ip| host_prefix(*ip)).collect(),
            labels: to_endpoint_labels(&record.labels),
        });
    }
    update
}

impl ClusterRuntime {
    /// Cluster mode from the `Cluster` document, with the view `<stateDir>/cluster.state` held.
    /// A gateway in an HA group checks imported answers as queries to `listen` and holds them
    /// `max_ttl` seconds at most.
    pub fn open(
        doc: &fqdnd_config::Cluster,
        daemon: &Daemon,
        publish_addresses: bool,
        gateway: bool,
        clock: Clock,
        (listen, max_ttl): (&[std::net::SocketAddr], u32),
        memory: Option<fqdnd_cluster::MemoryStore>,
    ) -> Result<Arc<Self>> {
        let node = member_name(doc)?;
        let layout = Layout::new(&doc.prefix);
        let store = match memory {
            Some(store) => StoreSource::Memory(store),
            None => StoreSource::Etcd(connect_options(doc)?),
        };
        let ha = match &doc.gateway_group {
            Some(group) if gateway => Some(Ha::new(
                &node,
                group,
                layout.clone(),
                store.clone(),
                clock,
                (listen, max_ttl),
            )),
            Some(group) => {
                tracing::warn!(group, "`gatewayGroup` is for `fqdnd gateway`: ignored");
                None
            }
            None => None,
        };
        let state_file = daemon.state_dir.as_ref().map(|d| d.join("cluster.state"));
        if state_file.is_none() {
            tracing::warn!(
                "cluster mode without `stateDir`: a restart while etcd is unreachable starts without the cluster's identities, endpoints and shared policy"
            );
        }
        let (view, restored) = match &state_file {
            None => (View::default(), false),
            Some(path) => match View::load(path) {
                Ok(Some(view)) => {
                    tracing::info!(file = %path.display(), identities = view.identities.len(), remote_endpoints = view.endpoints.len(), policies = view.policies.len(), "cluster view restored");
                    (view, true)
                }
                Ok(None) => (View::default(), false),
                Err(e) => {
                    tracing::error!(error = %e, "the saved cluster view is unreadable: starting without it (it is rebuilt from etcd)");
                    (View::default(), false)
                }
            },
        };
        // The versions accepted before (they stay in force for a document since broken),
        // then the documents of the saved view on top.
        let mut shared = SharedRules::default();
        let dir = daemon.state_dir.as_deref();
        let accepted = dir.and_then(load_accepted);
        shared.established = accepted.is_some() || restored;
        if let Some(accepted) = &accepted {
            log_refused(&shared.set.update(accepted, |n| origin(&layout, n)));
        }
        if restored {
            let update = shared.set.update(&view.policies, |n| origin(&layout, n));
            shared.refused_total += update.refused.len() as u64;
            log_refused(&update);
        }
        if !shared.established {
            tracing::warn!(
                "cluster mode: the shared policy is not known yet (no saved view): every endpoint is in default deny until etcd is read"
            );
        }
        tracing::info!(node = %node, endpoints = ?doc.endpoints, prefix = %layout.prefix(), "cluster mode");
        Ok(Arc::new(Self {
            doc: doc.clone(),
            node,
            layout,
            store,
            state_file,
            publish_addresses,
            initial: Mutex::new(Some(view)),
            rules: Mutex::new(shared),
            state_dir: daemon.state_dir.clone(),
            local: watch::Sender::new(Local::default()),
            status: watch::Sender::new(NodeStatus::default()),
            ha,
        }))
    }

    /// Turns the engine's cluster mode on and gives it the restored view's numbers and remote
    /// endpoints, before it gets endpoints and policy.
    pub fn prime<D: Datapath>(&self, engine: &mut Engine<D>) {
        engine.enable_cluster();
        let view = lock(&self.initial).clone().unwrap_or_default();
        let update = to_update(&View::default().diff(&view));
        if let Err(e) = engine.apply_cluster(update) {
            tracing::warn!(error = %fqdnd_engine::error_chain(&e), "part of the saved cluster view was not applied");
        }
    }

    /// The shared policy's rules, as accepted (default deny while it is not known).
    pub fn rules(&self) -> Vec<Rule> {
        lock(&self.rules).rules()
    }

    /// Whether the shared policy is known (restored or read from etcd).
    pub fn established(&self) -> bool {
        lock(&self.rules).established
    }

    /// Waits until the shared policy is known, at most `limit` (the daemon waits before it
    /// serves, so that a node started without a saved view does not refuse what its policy
    /// allows while etcd answers); true if it is.
    pub async fn wait_established(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while !self.established() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// The endpoints in force (after an apply): what the node publishes.
    pub fn set_local(&self, config: &Config) {
        let endpoints: Vec<LocalEndpoint> = config
            .endpoints
            .iter()
            .map(|e| LocalEndpoint {
                id: e.id.0,
                name: e.name.clone(),
                labels: to_labels(&e.labels),
                ips: if self.publish_addresses {
                    e.addresses
                        .iter()
                        .filter(|a| a.prefix_len() == a.max_prefix_len())
                        .map(ipnet::IpNet::addr)
                        .collect()
                } else {
                    Vec::new()
                },
            })
            .collect();
        self.local.send_if_modified(|current| {
            if current.endpoints == endpoints {
                false
            } else {
                current.endpoints = endpoints;
                true
            }
        });
    }

    /// The node's own addresses as just read (those it gives the host identity): published
    /// with its registration, which the other nodes give the remote-node identity. Only a
    /// changed set wakes the node side.
    pub fn set_addresses(&self, addrs: &[std::net::IpAddr]) {
        let mut addrs = addrs.to_vec();
        addrs.sort_unstable();
        addrs.dedup();
        self.local.send_if_modified(|current| {
            if current.addresses == addrs {
                false
            } else {
                current.addresses = addrs;
                true
            }
        });
    }

    /// Starts the node side: connects (lazily: etcd may be down) and runs until stopped.
    pub async fn spawn(
        self: &Arc<Self>,
        host: Arc<dyn Host>,
        tasks: &mut JoinSet<Result<()>>,
        stopped: &watch::Receiver<bool>,
    ) -> Result<()> {
        let store = self
            .store
            .open()
            .await
            .context("setting up the etcd client")?;
        let config = NodeConfig {
            node: self.node.clone(),
            layout: self.layout.clone(),
            lease_ttl: self.doc.lease_ttl,
            state_file: self.state_file.clone(),
        };
        let view = lock(&self.initial).take().unwrap_or_default();
        if let Some(ha) = &self.ha {
            ha.spawn(&store, Arc::clone(&host), tasks, stopped);
        }
        let sink = Arc::new(EngineSink {
            runtime: Arc::clone(self),
            host,
        });
        let local = self.local.subscribe();
        let status = self.status.clone();
        let stop = stopped.clone();
        tasks.spawn(async move {
            node::run(store, config, view, sink, local, status, stop)
                .await
                .context("cluster node side")
        });
        Ok(())
    }

    /// The cluster section of `fqdnd status`.
    pub fn status(&self, engine: &Engine<AnyDatapath>) -> ClusterStatus {
        let s = self.status.borrow().clone();
        let state_seconds = s.in_state_for().as_secs();
        let rules = lock(&self.rules);
        ClusterStatus {
            node: self.node.clone(),
            endpoints: self.doc.endpoints.clone(),
            prefix: self.layout.prefix().to_owned(),
            connected: s.connected,
            since_seconds: s.since_seconds,
            leader: s.leader,
            revision: s.revision,
            identities: s.identities,
            // What the engine holds, not what was read: a record it refused is not counted.
            remote_endpoints: engine.ipcache.remote_endpoint_count(),
            remote_nodes: s.remote_nodes,
            published: s.published,
            resyncs: s.resyncs,
            last_error: s.last_error,
            shared_policies: rules.set.documents(),
            shared_policy_errors: rules.errors(),
            state_seconds,
            shared_policy_known: rules.established,
            rejected: s
                .rejected
                .iter()
                .map(|(kind, n)| (kind.as_str().to_owned(), *n))
                .chain(
                    (rules.refused_total > 0)
                        .then(|| ("policy_document".to_owned(), rules.refused_total)),
                )
                // An HA group's learned records (`cluster::learned`).
                .chain(
                    self.ha
                        .as_ref()
                        .map(|ha| ha.status().rejected)
                        .filter(|n| *n > 0)
                        .map(|n| (RecordKind::Learned.as_str().to_owned(), n)),
                )
                .collect(),
            temporary_identities: engine
                .ipcache
                .temporary_identities()
                .into_iter()
                .map(|(id, labels)| (id.0, labels))
                .collect(),
            ha: self.ha.as_ref().map(|ha| ha.status()),
        }
    }

    /// The HA gateway group, if this gateway is in one.
    pub fn ha(&self) -> Option<&Arc<Ha>> {
        self.ha.as_ref()
    }
}

/// The node side's changes, into the engine.
struct EngineSink {
    runtime: Arc<ClusterRuntime>,
    host: Arc<dyn Host>,
}

impl Sink for EngineSink {
    fn apply(&self, changes: &Changes) {
        let update = to_update(changes);
        if !update.is_empty() {
            match self.host.engine().lock() {
                Ok(mut engine) => {
                    if let Err(e) = engine.apply_cluster(update) {
                        tracing::warn!(error = %fqdnd_engine::error_chain(&e), "part of a cluster change was not applied");
                    }
                }
                Err(_) => tracing::error!("engine lock poisoned: cluster change dropped"),
            }
        }
        let mut shared = lock(&self.runtime.rules);
        let first = !shared.established;
        let before = shared.clone();
        let update = match &changes.policies {
            Some(docs) => {
                let layout = &self.runtime.layout;
                shared.set.update(docs, |n| origin(layout, n))
            }
            None => SharedUpdate::default(),
        };
        shared.refused_total += update.refused.len() as u64;
        log_refused(&update);
        if !update.rules_changed() && !first {
            return;
        }
        shared.established = true;
        shared.reload_errors.clear();
        let documents = shared.set.documents();
        // The daemon reads the rules back through `rules()`: the lock goes before it does.
        drop(shared);
        match self.host.reload_all() {
            Ok(()) => {
                if first {
                    tracing::info!(documents, "shared policy read from etcd: in force");
                } else {
                    tracing::info!(documents, applied = ?update.applied, removed = ?update.removed, "shared policy applied");
                }
                if let Some(dir) = &self.runtime.state_dir {
                    save_accepted(dir, &lock(&self.runtime.rules).set);
                }
            }
            Err(errors) => {
                for e in &errors {
                    tracing::error!(error = %e, "the configuration with the new shared policy was refused; the previous stays in force");
                }
                let mut shared = lock(&self.runtime.rules);
                let refused_total = shared.refused_total;
                *shared = before;
                shared.refused_total = refused_total;
                shared.reload_errors = errors;
            }
        }
    }
}
