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

use anyhow::{Context, Result, bail};
use fqdnd_cluster::node::{self, Local, LocalEndpoint, NodeConfig, NodeStatus, Sink};
use fqdnd_cluster::{
    Changes, Connect, EtcdStore, Label, Labels, Layout, LearnedRecord, ShareStatus, TlsFiles, View,
};
use fqdnd_config::{Config, Daemon};
use fqdnd_engine::{ClusterUpdate, Engine, RemoteEndpoint, RemoteNode};
use fqdnd_ipcache::policy::Rule;
use fqdnd_ipcache::{Datapath, EndpointLabel, Identity, host_prefix};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::datapath::AnyDatapath;
use crate::ha::Ha;

/// What the cluster glue needs from the running daemon.
pub(crate) trait Host: Send + Sync + 'static {
    /// The engine.
    fn engine(&self) -> &Mutex<Engine<AnyDatapath>>;
    /// Re-reads the configuration and applies it (files + the shared policy now accepted),
    /// whole or not at all; the errors if it was refused.
    fn reload_all(&self) -> std::result::Result<(), Vec<String>>;
    /// An HA gateway group's records learned by peers (or by this gateway before a restart):
    /// learned as the local policy (for a query to one of `servers`, the proxy's listen
    /// addresses) and breakers allow; how many were.
    fn import_learned(&self, records: &[LearnedRecord], servers: &[std::net::SocketAddr]) -> usize;
}

/// The shared policy as this node accepted it.
#[derive(Debug, Default)]
struct SharedRules {
    rules: Vec<Rule>,
    documents: usize,
    /// Why the last change was refused (empty when it was not).
    errors: Vec<String>,
}

/// `fqdnd status`'s cluster section.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ClusterStatus {
    pub(crate) node: String,
    pub(crate) endpoints: Vec<String>,
    pub(crate) prefix: String,
    pub(crate) connected: bool,
    /// Seconds of daemon uptime at the last connection change.
    pub(crate) since_seconds: u64,
    pub(crate) leader: Option<String>,
    pub(crate) revision: i64,
    pub(crate) identities: usize,
    pub(crate) remote_endpoints: usize,
    /// Other nodes registered (their own addresses are the remote-node identity here).
    #[serde(default)]
    pub(crate) remote_nodes: usize,
    pub(crate) published: usize,
    pub(crate) resyncs: u64,
    pub(crate) last_error: Option<String>,
    pub(crate) shared_policies: usize,
    pub(crate) shared_policy_errors: Vec<String>,
    /// (number, labels) of the local label sets still waiting for a global identity.
    pub(crate) temporary_identities: Vec<(u32, String)>,
    /// The HA gateway group's sharing, with `gatewayGroup`.
    #[serde(default)]
    pub(crate) ha: Option<ShareStatus>,
}

/// Cluster mode of one daemon.
pub(crate) struct ClusterRuntime {
    doc: fqdnd_config::Cluster,
    node: String,
    layout: Layout,
    state_file: Option<PathBuf>,
    /// Whether endpoints are published with their addresses (node: yes; a gateway's client
    /// groups are published without: their prefixes are not workloads).
    publish_addresses: bool,
    /// The view read at start (taken by the node side when it starts).
    initial: Mutex<Option<View>>,
    rules: Mutex<SharedRules>,
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
pub(crate) fn member_name(doc: &fqdnd_config::Cluster) -> Result<String> {
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

/// How to reach etcd, from the document.
pub(crate) fn connect_options(doc: &fqdnd_config::Cluster) -> Connect {
    Connect {
        endpoints: doc.endpoints.clone(),
        tls: doc.tls.as_ref().map(|t| TlsFiles {
            ca: t.ca.clone(),
            cert: t.cert.clone(),
            key: t.key.clone(),
        }),
        timeout: Duration::from_secs(3),
    }
}

/// The shared policy documents as rules, each loaded on its own and located by its key.
fn policy_rules(
    layout: &Layout,
    docs: &BTreeMap<String, String>,
) -> std::result::Result<Vec<Rule>, Vec<String>> {
    let origins: Vec<(PathBuf, &str)> = docs
        .iter()
        .map(|(name, text)| {
            (
                PathBuf::from(format!("etcd:{}", layout.policy(name))),
                text.as_str(),
            )
        })
        .collect();
    fqdnd_config::shared_rules(origins.iter().map(|(o, t)| (o.as_path(), *t)))
        .map_err(|errors| errors.iter().map(ToString::to_string).collect())
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
    pub(crate) fn open(
        doc: &fqdnd_config::Cluster,
        daemon: &Daemon,
        publish_addresses: bool,
        gateway: bool,
        clock: Clock,
        listen: &[std::net::SocketAddr],
    ) -> Result<Arc<Self>> {
        let node = member_name(doc)?;
        let layout = Layout::new(&doc.prefix);
        let ha = match &doc.gateway_group {
            Some(group) if gateway => Some(Ha::new(
                &node,
                group,
                layout.clone(),
                connect_options(doc),
                clock,
                listen,
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
        let view = match &state_file {
            None => View::default(),
            Some(path) => match View::load(path) {
                Ok(Some(view)) => {
                    tracing::info!(file = %path.display(), identities = view.identities.len(), remote_endpoints = view.endpoints.len(), policies = view.policies.len(), "cluster view restored");
                    view
                }
                Ok(None) => View::default(),
                Err(e) => {
                    tracing::error!(error = %e, "the saved cluster view is unreadable: starting without it (it is rebuilt from etcd)");
                    View::default()
                }
            },
        };
        let mut shared = SharedRules::default();
        match policy_rules(&layout, &view.policies) {
            Ok(rules) => {
                shared.rules = rules;
                shared.documents = view.policies.len();
            }
            Err(errors) => {
                for e in &errors {
                    tracing::error!(error = %e, "a saved shared policy does not load; the shared policy is left out");
                }
                shared.errors = errors;
            }
        }
        tracing::info!(node = %node, endpoints = ?doc.endpoints, prefix = %layout.prefix(), "cluster mode");
        Ok(Arc::new(Self {
            doc: doc.clone(),
            node,
            layout,
            state_file,
            publish_addresses,
            initial: Mutex::new(Some(view)),
            rules: Mutex::new(shared),
            local: watch::Sender::new(Local::default()),
            status: watch::Sender::new(NodeStatus::default()),
            ha,
        }))
    }

    /// Turns the engine's cluster mode on and gives it the restored view's numbers and remote
    /// endpoints, before it gets endpoints and policy.
    pub(crate) fn prime<D: Datapath>(&self, engine: &mut Engine<D>) {
        engine.enable_cluster();
        let view = lock(&self.initial).clone().unwrap_or_default();
        let update = to_update(&View::default().diff(&view));
        if let Err(e) = engine.apply_cluster(update) {
            tracing::warn!(error = %fqdnd_engine::error_chain(&e), "part of the saved cluster view was not applied");
        }
    }

    /// The shared policy's rules, as accepted.
    pub(crate) fn rules(&self) -> Vec<Rule> {
        lock(&self.rules).rules.clone()
    }

    /// The endpoints in force (after an apply): what the node publishes.
    pub(crate) fn set_local(&self, config: &Config) {
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
    pub(crate) fn set_addresses(&self, addrs: &[std::net::IpAddr]) {
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
    pub(crate) async fn spawn(
        self: &Arc<Self>,
        host: Arc<dyn Host>,
        tasks: &mut JoinSet<Result<()>>,
        stopped: &watch::Receiver<bool>,
    ) -> Result<()> {
        let store = EtcdStore::connect(&connect_options(&self.doc))
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
    pub(crate) fn status(&self, engine: &Engine<AnyDatapath>) -> ClusterStatus {
        let s = self.status.borrow().clone();
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
            remote_endpoints: s.remote_endpoints,
            remote_nodes: s.remote_nodes,
            published: s.published,
            resyncs: s.resyncs,
            last_error: s.last_error,
            shared_policies: rules.documents,
            shared_policy_errors: rules.errors.clone(),
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
    pub(crate) fn ha(&self) -> Option<&Arc<Ha>> {
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
        let Some(docs) = &changes.policies else {
            return;
        };
        match policy_rules(&self.runtime.layout, docs) {
            Ok(rules) => {
                {
                    let mut shared = lock(&self.runtime.rules);
                    shared.rules = rules;
                    shared.documents = docs.len();
                    shared.errors.clear();
                }
                match self.host.reload_all() {
                    Ok(()) => {
                        tracing::info!(documents = docs.len(), "shared policy applied");
                    }
                    Err(errors) => {
                        for e in &errors {
                            tracing::error!(error = %e, "the configuration with the new shared policy was refused; the previous stays in force");
                        }
                        lock(&self.runtime.rules).errors = errors;
                    }
                }
            }
            Err(errors) => {
                for e in &errors {
                    tracing::error!(error = %e, "a shared policy does not load on this node; the previous shared policy stays");
                }
                lock(&self.runtime.rules).errors = errors;
            }
        }
    }
}
