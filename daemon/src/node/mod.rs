//! `fqdnd node`: fqdnd as the sidecar-less DNS proxy and egress enforcer of the endpoints on
//! this host.
//!
//! The eBPF program on each endpoint's host-side interface assigns its DNS packets to the
//! proxy's transparent sockets (the client still talks to its own resolver) and checks every
//! other packet against the ipcache and the endpoint's policy. The proxy asks the
//! CiliumNetworkPolicy DNS rules, forwards allowed queries to their original destination, and
//! releases an answer only once the engine has written what it taught into the kernel maps.
//!
//! Host processes are endpoints too: an Endpoint naming a cgroup (or a systemd unit) instead
//! of an interface has the cgroup socket programs send its processes' DNS to the proxy's
//! loopback address (the kernel records where each query was going, the proxy reads the
//! record) and check their other egress against the same maps.
//!
//! What is the node's own: the `Node` document, the endpoint registry (files + admin API, the
//! latter kept in `<stateDir>/endpoints.yaml`, or without a `stateDir` in a file named after
//! the pin directory: [`Node::endpoints_file`]), the attachments, the services, the drop log.

mod drops;
mod services;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{Context, Result, bail, refused};
use fqdnd_config::{Config, Node};
use fqdnd_engine::endpoints::containers::{AddPlan, ContainerAttachment};
use fqdnd_engine::endpoints::{Added, Attachment, Registry, Source};
use fqdnd_ipcache::EndpointId;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::kernel::{self, Enforcing, Kernel, Wanted, WantedCgroup};
use crate::skeleton::{
    self, Desired, Loaded, ModeHooks, Prepared, Running, Shared, SharedKernel, StartOptions, lock,
};
pub use drops::{DropLog, DropPage};
pub use services::ServiceRow;
use services::Services;

/// One row of `fqdnd endpoint list`.
#[derive(Debug, Serialize, Deserialize)]
pub struct EndpointRow {
    /// The endpoint id.
    pub id: u16,
    /// Its name.
    pub name: String,
    /// Its addresses (prefixes).
    pub addresses: Vec<String>,
    /// Its labels, `source:key=value`, sorted.
    pub labels: Vec<String>,
    /// The interface it is attached on (empty for host processes).
    pub interface: String,
    /// That interface's index, when it exists.
    pub ifindex: Option<u32>,
    /// An endpoint of host processes: its cgroup as configured (`/a/b`, or `x.service` for a
    /// systemd unit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The cgroup directory it resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_path: Option<String>,
    /// The cgroup's id in the endpoints-by-cgroup map (`None` while the directory does not
    /// exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_id: Option<u64>,
    /// The identity its addresses have (what peers and `ipcache list` see); `None` for host
    /// processes, which share the host's addresses (identity 1, `reserved:host`).
    #[serde(default)]
    pub identity: Option<u32>,
    /// Its policy is in the kernel and applies to its traffic (false while `waiting`).
    pub enforcing: bool,
    /// A cgroup endpoint whose cgroup does not exist (yet): nothing is enforced until it
    /// does (the agent looks again every 500 ms).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub waiting: bool,
    /// `config` or `api`.
    pub source: String,
}

/// Node mode as the daemon skeleton sees it.
pub struct NodeMode(pub Arc<NodeRuntime>);

impl ModeHooks for NodeMode {
    fn name(&self) -> &'static str {
        "node"
    }

    fn sync(
        &self,
        kernel: Option<&SharedKernel>,
        config: &Config,
        enforcing: &BTreeMap<EndpointId, Enforcing>,
    ) -> Result<()> {
        self.0.sync(kernel, config, enforcing)
    }

    fn reload(&self, paths: &[PathBuf], _demo: bool) -> Result<Loaded> {
        self.0.reload(paths)
    }

    fn proxy_bound(&self, kernel: Option<&SharedKernel>) -> Result<()> {
        self.0.proxy_bound(kernel)
    }

    fn host_addresses(&self) -> Option<Vec<std::net::IpAddr>> {
        match kernel::host_addresses() {
            Ok(addrs) => Some(addrs),
            Err(e) => {
                tracing::warn!(error = %crate::chain(&e), "reading the node's addresses failed");
                None
            }
        }
    }

    fn spawn_tasks(
        &self,
        tasks: &mut JoinSet<Result<()>>,
        stopped: &watch::Receiver<bool>,
    ) -> Result<()> {
        self.0.spawn_tasks(tasks, stopped)
    }

    fn leaves(&self) -> &'static str {
        " (programs stay attached)"
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn publishes_cluster_addresses(&self) -> bool {
        true
    }

    fn kept_without_state_dir(&self) -> Option<String> {
        Some(format!(
            "the endpoints added at run time are kept in {}",
            self.0.added_file.display()
        ))
    }
}

/// How often cgroup endpoints' directories are resolved again.
const CGROUP_REFRESH: Duration = Duration::from_millis(500);

/// `POST /v1/cni`: what the CNI plugin tells the agent on ADD.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CniAttachment {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`: the interface inside the container (one endpoint per attachment).
    pub ifname: String,
    /// The host-side interface (from the previous plugin's result).
    pub interface: String,
    /// The container's addresses.
    pub addresses: Vec<std::net::IpAddr>,
    /// Its labels (`key` or `source:key` → value).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// The node's own state.
pub struct NodeRuntime {
    node: Node,
    pin_dir: PathBuf,
    registry: Mutex<Registry>,
    /// Where the endpoints added through the API are saved ([`Node::endpoints_file`]).
    added_file: PathBuf,
    /// Policy drops, for metrics and `fqdnd monitor`.
    pub drops: DropLog,
    services: Mutex<Services>,
    /// The kernel side, once the proxy is bound (for the cgroup refresh task).
    kernel: std::sync::OnceLock<SharedKernel>,
}

impl std::fmt::Debug for NodeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeRuntime")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Loads the configuration files; a missing `Node` document means the defaults.
fn load(paths: &[PathBuf]) -> Result<(Config, Node)> {
    let config = fqdnd_config::load(paths).map_err(|errors| refused!("{errors}"))?;
    skeleton::log_warnings(&config);
    if config.gateway.is_some() {
        tracing::warn!("the `kind: Gateway` document is ignored by `fqdnd node`");
    }
    let node = config.node.clone().unwrap_or_default();
    Ok((config, node))
}

/// Reads the endpoints saved by an earlier run into `registry`; those whose interface is
/// gone are dropped (a CNI plugin would add them again).
fn load_added(registry: &mut Registry, path: &std::path::Path) -> Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    for parsed in Registry::parse_saved(&text) {
        match parsed {
            Ok(Added {
                endpoint,
                attachment: Attachment::Interface(interface),
                ..
            }) if kernel::ifindex(&interface).is_err() => {
                tracing::warn!(endpoint = %endpoint.id, interface = %interface, "saved endpoint dropped: its interface is gone");
            }
            Ok(a) => {
                let (id, attachment) = (a.endpoint.id, a.attachment.clone());
                match registry.restore(a) {
                    Ok(()) => {
                        tracing::info!(endpoint = %id, attached = %attachment, "endpoint added through the API restored");
                    }
                    Err(e) => {
                        tracing::warn!(endpoint = %id, error = %fqdnd_engine::error_chain(&e), "a saved endpoint conflicts with the configuration files and is dropped");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %fqdnd_engine::error_chain(&e), "a saved endpoint does not load");
            }
        }
    }
    Ok(())
}

impl NodeRuntime {
    /// Everything the node needs before the engine: its document, the kernel programs, the
    /// services (reconciled first: established flows use their translations), the endpoints
    /// saved by an earlier run (part of the desired state from the first write on, so the
    /// reconciliation keeps their entries).
    fn prepare(paths: &[PathBuf]) -> Result<Prepared> {
        let (config, node) = load(paths)?;
        crate::perms::check(paths, &config, &node.daemon, &[]);
        skeleton::create_state_dir(&node.daemon)?;
        let pin_dir = node
            .pin_dir
            .clone()
            .unwrap_or_else(fqdnd_ebpf::default_pin_dir);
        if let Some(idle) = node.conntrack_idle_timeout {
            tracing::warn!(
                conntrack_idle_timeout = ?idle,
                "`conntrackIdleTimeout` is deprecated: it sets every conntrack lifetime that \
                 `conntrack: {{tcpSyn, tcpEstablished, tcpClosing, other}}` does not"
            );
        }
        let kernel = Kernel::load(
            &pin_dir,
            &node.daemon.map_sizes,
            &node.daemon.conntrack,
            true,
        )?;
        let mut services = Services::open(&pin_dir, node.daemon.state_dir.as_deref())?;
        services.apply(&config.services, true)?;
        let lb = services.shared();
        let added_file = node.endpoints_file(&pin_dir);
        let mut registry = Registry::new(config);
        load_added(&mut registry, &added_file)?;
        let config = registry.merged();
        let listen = vec![
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, node.dns_proxy_port)),
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, node.dns_proxy_port)),
        ];
        let redirects = skeleton::SocketRedirects {
            origins: fqdnd_ebpf::DnsOrigins::open(&pin_dir)
                .context("opening the redirected sockets' records")?,
            port: node.dns_proxy_port,
        };
        let runtime = Arc::new(Self {
            pin_dir: pin_dir.clone(),
            registry: Mutex::new(registry),
            added_file,
            drops: DropLog::default(),
            services: Mutex::new(services),
            node: node.clone(),
            kernel: std::sync::OnceLock::new(),
        });
        if let Err(e) = runtime.save_added() {
            tracing::warn!(error = %crate::chain(&e), "the endpoints restored are in force, but a restart may not find them");
        }
        Ok(Prepared {
            config,
            daemon: node.daemon.clone(),
            kernel: Some((kernel, pin_dir)),
            proxy: fqdnd_dnsproxy::Config {
                listen_udp: listen.clone(),
                listen_tcp: listen,
                upstreams: Vec::new(),
                transparent: true,
                forward_to_original_destination: true,
                ..fqdnd_dnsproxy::Config::default()
            },
            services: Some(lb),
            redirects: Some(redirects),
            admin_socket: node.daemon.admin_socket.clone(),
            mode: Box::new(NodeMode(runtime)),
        })
    }

    /// The kernel's endpoint entries and attachments, then the services, to `config`.
    pub fn sync(
        &self,
        kernel: Option<&SharedKernel>,
        config: &Config,
        enforcing: &BTreeMap<EndpointId, Enforcing>,
    ) -> Result<()> {
        let kernel = kernel.context("node mode without its kernel side")?;
        let enforced = |id| enforcing.get(&id).copied().unwrap_or_default();
        let cgroups: Vec<WantedCgroup> = config
            .endpoints
            .iter()
            .filter_map(|e| {
                Some(WantedCgroup {
                    id: e.id,
                    cgroup: config.cgroups.get(&e.id)?.clone(),
                    enforcing: enforced(e.id),
                })
            })
            .collect();
        let wanted: Vec<Wanted> = config
            .endpoints
            .iter()
            .filter(|e| !config.cgroups.contains_key(&e.id))
            .filter_map(|e| {
                let Some(interface) = config.interfaces.get(&e.id) else {
                    tracing::warn!(endpoint = %e.id, name = %e.name, "endpoint has no `interface` or `cgroup`: its DNS is not redirected and its policy not enforced by this node");
                    return None;
                };
                let mut addresses = Vec::new();
                for net in &e.addresses {
                    if net.prefix_len() == net.max_prefix_len() {
                        addresses.push(net.addr());
                    } else {
                        tracing::warn!(endpoint = %e.id, prefix = %net, "an endpoint address that is not a single address is not a valid source on its interface");
                    }
                }
                Some(Wanted {
                    id: e.id,
                    interface: interface.clone(),
                    enforcing: enforced(e.id),
                    addresses,
                })
            })
            .collect();
        {
            let mut kernel = lock(kernel, "kernel")?;
            kernel.sync(&wanted)?;
            kernel.sync_cgroups(&cgroups, self.node.host_processes)?;
        }
        self.drops.set_names(
            config
                .endpoints
                .iter()
                .map(|e| (e.id.0, e.name.clone()))
                .collect(),
        );
        lock(&self.services, "services")?.apply(&config.services, false)
    }

    /// Re-reads the configuration files for a reload, with the run-time endpoints.
    pub fn reload(self: &Arc<Self>, paths: &[PathBuf]) -> Result<Loaded> {
        let (files, node) = load(paths)?;
        crate::perms::check(paths, &files, &node.daemon, &[]);
        if node != self.node {
            tracing::warn!(
                "the `kind: Node` document changes only on restart; the running settings stay"
            );
        }
        let mut next = lock(&self.registry, "endpoints")?.clone();
        next.replace_files(files.clone());
        let config = next.merged();
        let runtime = Arc::clone(self);
        Ok(Loaded {
            desired: Desired {
                config,
                lists: node.daemon.lists,
            },
            commit: Box::new(move || {
                if let Ok(mut registry) = runtime.registry.lock() {
                    registry.replace_files(files);
                }
            }),
        })
    }

    /// Adds (or replaces, same id) an endpoint given as an `Endpoint` document.
    pub fn add_endpoint(&self, shared: &Shared, document: &str) -> Result<EndpointRow> {
        let new = Added::parse(document).map_err(engine_error)?;
        let _changes = lock(&shared.changes, "changes")?;
        self.add_locked(shared, new)
    }

    /// Adds `new`; the caller holds `shared.changes`.
    fn add_locked(&self, shared: &Shared, new: Added) -> Result<EndpointRow> {
        if let Attachment::Interface(interface) = &new.attachment {
            kernel::ifindex(interface)?;
        }
        let (id, name) = (new.endpoint.id, new.endpoint.name.clone());
        let (previous, config) = {
            let mut registry = lock(&self.registry, "endpoints")?;
            let previous = registry.add(new).map_err(engine_error)?;
            (previous, registry.merged())
        };
        // Saved before it is enforced: an endpoint a restart would not find is refused (the
        // restarted agent would detach its programs from it).
        let applied = self.save_added().and_then(|()| self.apply(shared, config));
        if let Err(e) = applied {
            lock(&self.registry, "endpoints")?.undo_add(id, previous);
            if let Err(again) = self.save_added() {
                tracing::warn!(error = %crate::chain(&again), "saving the endpoints after a refused change failed");
            }
            return Err(e);
        }
        tracing::info!(endpoint = %id, name = %name, "endpoint added through the admin API");
        self.row(shared, id)
    }

    /// The listing row of endpoint `id`.
    fn row(&self, shared: &Shared, id: EndpointId) -> Result<EndpointRow> {
        self.rows(shared)?
            .into_iter()
            .find(|r| r.id == id.0)
            .context("the endpoint vanished while being added")
    }

    /// CNI ADD: the endpoint of the container's attachment through `ifname`
    /// ([`fqdnd_engine::endpoints::containers`]: one per attachment, its other attachments
    /// untouched). Asked again for the same attachment (a runtime retrying), it changes
    /// nothing.
    pub fn cni_add(&self, shared: &Shared, attachment: &CniAttachment) -> Result<EndpointRow> {
        let wanted = ContainerAttachment {
            container_id: attachment.container_id.clone(),
            ifname: attachment.ifname.clone(),
            interface: attachment.interface.clone(),
            addresses: attachment.addresses.clone(),
            labels: attachment
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        let _changes = lock(&shared.changes, "changes")?;
        let plan = lock(&self.registry, "endpoints")?
            .container_add(&wanted)
            .map_err(engine_error)?;
        match plan {
            AddPlan::Unchanged(id) => self.row(shared, id),
            AddPlan::Add(new) => self.add_locked(shared, new),
        }
    }

    /// CNI DEL: removes the endpoint of the container's attachment through `ifname` (`None`:
    /// of every attachment); nothing to remove is not an error (DEL may come more than once,
    /// or for an ADD that failed).
    pub fn cni_del(&self, shared: &Shared, container_id: &str, ifname: Option<&str>) -> Result<()> {
        let _changes = lock(&shared.changes, "changes")?;
        let ids = lock(&self.registry, "endpoints")?
            .container_endpoints(container_id, ifname)
            .map_err(engine_error)?;
        for id in ids {
            self.remove_locked(shared, id)?;
        }
        Ok(())
    }

    /// CNI CHECK: the endpoint of the container's attachment through `ifname`, if the agent
    /// has it.
    pub fn cni_get(
        &self,
        shared: &Shared,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<EndpointRow>> {
        let ids = lock(&self.registry, "endpoints")?
            .container_endpoints(container_id, Some(ifname))
            .map_err(engine_error)?;
        ids.first().map(|id| self.row(shared, *id)).transpose()
    }

    /// Removes an endpoint added through the admin API.
    pub fn remove_endpoint(&self, shared: &Shared, id: EndpointId) -> Result<()> {
        let _changes = lock(&shared.changes, "changes")?;
        self.remove_locked(shared, id)
    }

    /// Removes endpoint `id`; the caller holds `shared.changes`.
    fn remove_locked(&self, shared: &Shared, id: EndpointId) -> Result<()> {
        let (removed, config) = {
            let mut registry = lock(&self.registry, "endpoints")?;
            let removed = registry.remove(id).map_err(engine_error)?;
            (removed, registry.merged())
        };
        if let Err(e) = self.apply(shared, config) {
            lock(&self.registry, "endpoints")?.undo_remove(removed);
            return Err(e);
        }
        if let Err(e) = self.save_added() {
            tracing::warn!(error = %crate::chain(&e), "the endpoint is removed, but a restart may bring it back while its interface exists");
        }
        tracing::info!(endpoint = %id, "endpoint removed through the admin API");
        Ok(())
    }

    /// Applies `config` with the lists in force.
    fn apply(&self, shared: &Shared, config: Config) -> Result<()> {
        let lists = shared.desired()?.lists;
        shared.apply(Desired { config, lists })
    }

    /// Saves the endpoints added through the API (temp file, fsync, rename), so a restart
    /// brings them back.
    ///
    /// # Errors
    /// The file could not be written (counted in `fqdnd_checkpoint_errors_total`).
    fn save_added(&self) -> Result<()> {
        let path = &self.added_file;
        let (text, none) = {
            let registry = lock(&self.registry, "endpoints")?;
            (registry.saved(), registry.added().next().is_none())
        };
        if none && !path.exists() {
            return Ok(());
        }
        // Without a `stateDir`, its directory is made for the first endpoint.
        if let Some(dir) = path.parent() {
            std::os::unix::fs::DirBuilderExt::mode(
                std::fs::DirBuilder::new().recursive(true),
                0o700,
            )
            .create(dir)
            .with_context(|| {
                format!(
                    "creating {}, where the endpoints added at run time are kept (`stateDir` \
                     says where else)",
                    dir.display()
                )
            })?;
        }
        let tmp = path.with_extension("yaml.tmp");
        let result = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                std::io::Write::write_all(&mut f, text.as_bytes())?;
                f.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, path));
        result.map_err(|e| {
            crate::metrics::count_state_file_error();
            refused!(
                "saving the endpoints added at run time in {} failed: {e}",
                path.display()
            )
        })
    }

    /// Every endpoint with its kernel state.
    pub fn rows(&self, shared: &Shared) -> Result<Vec<EndpointRow>> {
        let registry = lock(&self.registry, "endpoints")?;
        let merged = registry.merged();
        let (attached, cgroups) = match &shared.kernel {
            Some(k) => {
                let k = lock(k, "kernel")?;
                (k.attached().clone(), k.cgroups().clone())
            }
            None => (BTreeMap::new(), BTreeMap::new()),
        };
        let engine = lock(&shared.engine, "engine")?;
        Ok(merged
            .endpoints
            .iter()
            .map(|e| {
                let interface = merged.interfaces.get(&e.id).cloned().unwrap_or_default();
                let cgroup = merged.cgroups.get(&e.id).map(|c| match c {
                    fqdnd_config::Cgroup::Path(p) | fqdnd_config::Cgroup::Unit(p) => p.clone(),
                });
                let resolved = cgroups.get(&e.id);
                let waiting = cgroup.is_some() && resolved.and_then(|c| c.cgroup_id).is_none();
                let mut labels: Vec<String> = e
                    .labels
                    .iter()
                    .map(|l| format!("{}:{}={}", l.source, l.key, l.value))
                    .collect();
                labels.sort();
                EndpointRow {
                    id: e.id.0,
                    name: e.name.clone(),
                    addresses: e.addresses.iter().map(ToString::to_string).collect(),
                    labels,
                    ifindex: attached.get(&interface).map(|a| a.ifindex),
                    interface,
                    cgroup,
                    cgroup_path: resolved.map(|c| c.path.display().to_string()),
                    cgroup_id: resolved.and_then(|c| c.cgroup_id),
                    identity: e
                        .addresses
                        .first()
                        .and_then(|a| engine.ipcache.identity_of(&a.trunc()))
                        .map(|i| i.0),
                    enforcing: !waiting && engine.ipcache.endpoint_enforcing(e.id).unwrap_or(false),
                    waiting,
                    source: registry
                        .source(e.id)
                        .unwrap_or(Source::Config)
                        .as_str()
                        .to_owned(),
                }
            })
            .collect())
    }

    /// Adds or replaces a service given as a `Service` document.
    pub fn set_service(&self, document: &str) -> Result<ServiceRow> {
        let parsed = fqdnd_config::load_str(document, std::path::Path::new("<request>"))
            .map_err(|errors| refused!("{errors}"))?;
        let [service] = parsed.services.as_slice() else {
            bail!(
                "the request must hold exactly one `kind: Service` document (it has {})",
                parsed.services.len()
            );
        };
        let files = lock(&self.registry, "endpoints")?.files().services.clone();
        let mut services = lock(&self.services, "services")?;
        services.add(service.clone(), &files)?;
        services
            .rows(&files)?
            .into_iter()
            .find(|r| r.name == service.name)
            .context("the service vanished while being set")
    }

    /// Removes a service added through the admin API.
    pub fn remove_service(&self, name: &str) -> Result<()> {
        let files = lock(&self.registry, "endpoints")?.files().services.clone();
        lock(&self.services, "services")?.remove(name, &files)
    }

    /// Every service with its backend ids.
    pub fn service_rows(&self) -> Result<Vec<ServiceRow>> {
        let files = lock(&self.registry, "endpoints")?.files().services.clone();
        lock(&self.services, "services")?.rows(&files)
    }

    /// Once the proxy listens: points the DNS redirect at it.
    pub fn proxy_bound(&self, kernel: Option<&SharedKernel>) -> Result<()> {
        let kernel = kernel.context("node mode without its kernel side")?;
        let _ = self.kernel.set(Arc::clone(kernel));
        lock(kernel, "kernel")?.set_dns_proxy(self.node.dns_proxy_port)?;
        tracing::info!(pin_dir = %self.pin_dir.display(), "DNS redirect points at the proxy");
        Ok(())
    }

    /// The node's own tasks: draining the datapath's drop events, and resolving cgroup
    /// endpoints' directories again ([`Kernel::refresh_cgroups`]: a cgroup created or
    /// re-created since is matched within [`CGROUP_REFRESH`]).
    pub fn spawn_tasks(
        self: &Arc<Self>,
        tasks: &mut JoinSet<Result<()>>,
        stopped: &watch::Receiver<bool>,
    ) -> Result<()> {
        let runtime = Arc::clone(self);
        let mut events =
            fqdnd_ebpf::Events::open(&self.pin_dir).context("opening the drop events")?;
        let mut stop = stopped.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    _ = tick.tick() => runtime.drops.record(&events.drain()),
                    _ = stop.changed() => return Ok(()),
                }
            }
        });
        if let Some(kernel) = self.kernel.get().cloned() {
            let mut stop = stopped.clone();
            tasks.spawn(async move {
                let mut tick = tokio::time::interval(CGROUP_REFRESH);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {
                            let refreshed = lock(&kernel, "kernel").and_then(|mut k| k.refresh_cgroups());
                            if let Err(e) = refreshed {
                                tracing::warn!(error = %crate::chain(&e), "resolving the cgroup endpoints' cgroups again failed");
                            }
                        }
                        _ = stop.changed() => return Ok(()),
                    }
                }
            });
        }
        Ok(())
    }
}

/// An engine error as the admin API reports it.
fn engine_error(e: fqdnd_engine::Error) -> crate::Error {
    refused!("{}", fqdnd_engine::error_chain(&e))
}

/// Starts the node agent.
pub async fn start(options: StartOptions) -> Result<Running> {
    let clock = Clock::start();
    let prepared = NodeRuntime::prepare(&options.paths)?;
    skeleton::start(prepared, options, clock).await
}
