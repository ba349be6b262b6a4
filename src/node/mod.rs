//! `fqdnd node`: fqdnd as the sidecar-less DNS proxy and egress enforcer of the endpoints on
//! this host.
//!
//! The eBPF program on each endpoint's host-side interface assigns its DNS packets to the
//! proxy's transparent sockets (the client still talks to its own resolver) and checks every
//! other packet against the ipcache and the endpoint's policy. The proxy asks the
//! CiliumNetworkPolicy DNS rules, forwards allowed queries to their original destination, and
//! releases an answer only once the engine has written what it taught into the kernel maps.
//!
//! Endpoints come from the configuration files and from the admin API at run time (as a CNI
//! plugin would add and remove them); both survive a policy reload.

mod drops;
pub(crate) mod services;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use fqdnd_config::{Config, Node};
use fqdnd_dnsproxy::{DnsProxy, QueryLog};
use fqdnd_ipcache::{Endpoint, EndpointId};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::admin::{self, AdminMode, AdminState};
use crate::clock::Clock;
use crate::datapath::AnyDatapath;
use crate::engine::Engine;
use crate::gateway::observer::{EngineObserver, SharedEngine};
use crate::gateway::policy::{CompiledPolicy, GatewayPolicy};
use crate::kernel::{self, Kernel, Wanted};
pub(crate) use drops::{DropLog, DropPage};
pub(crate) use services::ServiceRow;
use services::Services;

/// An endpoint added through the admin API.
#[derive(Debug, Clone)]
struct Added {
    endpoint: Endpoint,
    interface: String,
    /// The `Endpoint` document as received (what is saved for restarts).
    document: String,
}

/// Parses one `Endpoint` document (the admin API's request body, or a saved one).
fn parse_added(document: &str) -> Result<Added> {
    let parsed = fqdnd_config::load_str(document, std::path::Path::new("<request>"))
        .map_err(|errors| anyhow!("{errors}"))?;
    let [endpoint] = parsed.endpoints.as_slice() else {
        bail!(
            "the request must hold exactly one `kind: Endpoint` document (it has {})",
            parsed.endpoints.len()
        );
    };
    let Some(interface) = parsed.interfaces.get(&endpoint.id).cloned() else {
        bail!("endpoint {} has no `spec.interface`", endpoint.name);
    };
    Ok(Added {
        endpoint: endpoint.clone(),
        interface,
        document: document.trim().to_owned(),
    })
}

/// One row of `fqdnd endpoint list`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct EndpointRow {
    pub(crate) id: u16,
    pub(crate) name: String,
    pub(crate) addresses: Vec<String>,
    pub(crate) labels: Vec<String>,
    pub(crate) interface: String,
    pub(crate) ifindex: Option<u32>,
    pub(crate) enforcing: bool,
    /// `config` or `api`.
    pub(crate) source: String,
}

/// The node's state beyond the engine: the kernel side, the endpoints, the drop log.
pub(crate) struct NodeRuntime {
    node: Node,
    kernel: Mutex<Kernel>,
    /// The configuration files as last loaded without error.
    files: Mutex<Config>,
    /// Endpoints added through the admin API.
    added: Mutex<BTreeMap<EndpointId, Added>>,
    /// Where they are saved so a restart brings them back (`<stateDir>/endpoints.yaml`).
    added_file: Option<PathBuf>,
    /// Policy drops, for metrics and `fqdnd monitor`.
    pub(crate) drops: DropLog,
    /// The load balancer's services.
    services: Mutex<Services>,
}

impl std::fmt::Debug for NodeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeRuntime")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    m.lock().map_err(|_| anyhow!("node state lock poisoned"))
}

/// Loads the configuration files; a missing `Node` document means the defaults.
pub(crate) fn load(paths: &[PathBuf]) -> Result<(Config, Node)> {
    let config = fqdnd_config::load(paths).map_err(|errors| anyhow!("{errors}"))?;
    if config.gateway.is_some() {
        tracing::warn!("the `kind: Gateway` document is ignored by `fqdnd node`");
    }
    let node = config.node.clone().unwrap_or_default();
    Ok((config, node))
}

impl NodeRuntime {
    /// The files' configuration with the endpoints added at run time.
    fn merged(&self) -> Result<Config> {
        let mut config = lock(&self.files)?.clone();
        for added in lock(&self.added)?.values() {
            config.endpoints.push(added.endpoint.clone());
            config
                .interfaces
                .insert(added.endpoint.id, added.interface.clone());
        }
        Ok(config)
    }

    /// Brings engine, DNS policy and kernel to `config`: endpoints and policy into the engine
    /// (so policy entries exist before an endpoint is enforced), then the kernel's endpoint
    /// entries and program attachments, then the DNS policy.
    fn apply(
        &self,
        config: &Config,
        engine: &SharedEngine,
        policy: &GatewayPolicy,
        clock: Clock,
    ) -> Result<()> {
        let compiled = CompiledPolicy::compile(config, &self.node.daemon.lists)?;
        let wanted = {
            let mut engine = engine.lock().map_err(|_| anyhow!("engine lock poisoned"))?;
            engine.ipcache.set_endpoints(config.endpoints.clone())?;
            engine.set_policy(config.rules.clone(), clock.now())?;
            wanted(config, &engine)
        };
        lock(&self.kernel)?.sync(&wanted)?;
        lock(&self.services)?.apply(&config.services, false)?;
        policy.replace(compiled);
        Ok(())
    }

    /// Adds or replaces a service given as a `Service` document.
    pub(crate) fn set_service(&self, document: &str) -> Result<ServiceRow> {
        let parsed = fqdnd_config::load_str(document, std::path::Path::new("<request>"))
            .map_err(|errors| anyhow!("{errors}"))?;
        let [service] = parsed.services.as_slice() else {
            bail!(
                "the request must hold exactly one `kind: Service` document (it has {})",
                parsed.services.len()
            );
        };
        let files = lock(&self.files)?.services.clone();
        let mut services = lock(&self.services)?;
        services.add(service.clone(), &files)?;
        services
            .rows(&files)?
            .into_iter()
            .find(|r| r.name == service.name)
            .context("the service vanished while being set")
    }

    /// Removes a service added through the admin API.
    pub(crate) fn remove_service(&self, name: &str) -> Result<()> {
        let files = lock(&self.files)?.services.clone();
        lock(&self.services)?.remove(name, &files)
    }

    /// Every service with its backend ids.
    pub(crate) fn service_rows(&self) -> Result<Vec<ServiceRow>> {
        let files = lock(&self.files)?.services.clone();
        lock(&self.services)?.rows(&files)
    }

    /// Re-reads the configuration files and applies them with the run-time endpoints.
    pub(crate) fn reload(&self, state: &AdminState) -> Result<()> {
        let (config, node) = load(&state.paths)?;
        crate::perms::check(&state.paths, &config, &node.daemon, &[]);
        if node != self.node {
            tracing::warn!(
                "the `kind: Node` document changes only on restart; the running settings stay"
            );
        }
        let previous = std::mem::replace(&mut *lock(&self.files)?, config);
        let merged = self.merged()?;
        if let Err(e) = self.apply(&merged, &state.engine, &state.policy, state.clock) {
            *lock(&self.files)? = previous;
            return Err(e);
        }
        Ok(())
    }

    /// Adds (or replaces, same id) an endpoint given as an `Endpoint` document.
    pub(crate) fn add_endpoint(&self, document: &str, state: &AdminState) -> Result<EndpointRow> {
        let new = parse_added(document)?;
        let (endpoint, interface) = (&new.endpoint, new.interface.clone());
        kernel::ifindex(&interface)?;
        let files = lock(&self.files)?.clone();
        if files.endpoints.iter().any(|e| e.id == endpoint.id) {
            bail!(
                "endpoint id {} is declared in the configuration files; change it there",
                endpoint.id
            );
        }
        let mut others: Vec<(Endpoint, Option<String>)> = files
            .endpoints
            .iter()
            .map(|e| (e.clone(), files.interfaces.get(&e.id).cloned()))
            .collect();
        others.extend(
            lock(&self.added)?
                .values()
                .filter(|a| a.endpoint.id != endpoint.id)
                .map(|a| (a.endpoint.clone(), Some(a.interface.clone()))),
        );
        for (other, other_if) in &others {
            if other.name == endpoint.name {
                bail!(
                    "endpoint name {} is taken by id {}",
                    endpoint.name,
                    other.id
                );
            }
            if other_if.as_deref() == Some(interface.as_str()) {
                bail!(
                    "interface {interface} belongs to endpoint {} ({})",
                    other.name,
                    other.id
                );
            }
            if let Some(addr) = endpoint
                .addresses
                .iter()
                .find(|a| other.addresses.contains(a))
            {
                bail!(
                    "address {addr} belongs to endpoint {} ({})",
                    other.name,
                    other.id
                );
            }
        }
        let id = endpoint.id;
        let name = endpoint.name.clone();
        let previous = lock(&self.added)?.insert(id, new);
        let merged = self.merged()?;
        if let Err(e) = self.apply(&merged, &state.engine, &state.policy, state.clock) {
            let mut added = lock(&self.added)?;
            match previous {
                Some(p) => added.insert(id, p),
                None => added.remove(&id),
            };
            return Err(e);
        }
        self.save_added();
        tracing::info!(endpoint = %id, name = %name, "endpoint added through the admin API");
        self.rows(&state.engine)?
            .into_iter()
            .find(|r| r.id == id.0)
            .context("the endpoint vanished while being added")
    }

    /// Removes an endpoint added through the admin API.
    pub(crate) fn remove_endpoint(&self, id: EndpointId, state: &AdminState) -> Result<()> {
        let Some(removed) = lock(&self.added)?.remove(&id) else {
            if lock(&self.files)?.endpoints.iter().any(|e| e.id == id) {
                bail!("endpoint {id} is declared in the configuration files; remove it there");
            }
            bail!("no endpoint {id}");
        };
        let merged = self.merged()?;
        if let Err(e) = self.apply(&merged, &state.engine, &state.policy, state.clock) {
            lock(&self.added)?.insert(id, removed);
            return Err(e);
        }
        self.save_added();
        tracing::info!(endpoint = %id, "endpoint removed through the admin API");
        Ok(())
    }

    /// Saves the endpoints added through the API (temp file + rename), so a restart brings
    /// them back; a failure is logged (they stay in force until the restart).
    fn save_added(&self) {
        let Some(path) = &self.added_file else {
            return;
        };
        let Ok(added) = lock(&self.added) else {
            return;
        };
        let text: Vec<&str> = added.values().map(|a| a.document.as_str()).collect();
        let tmp = path.with_extension("yaml.tmp");
        let result = std::fs::write(&tmp, text.join("\n---\n") + "\n")
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = result {
            tracing::warn!(file = %path.display(), error = %e, "saving the endpoints added through the API failed: they will not come back after a restart");
        }
    }

    /// Loads the endpoints saved by an earlier run; those whose interface is gone are
    /// dropped (a CNI plugin would add them again).
    fn load_added(&self) -> Result<()> {
        let Some(path) = &self.added_file else {
            return Ok(());
        };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let mut added = lock(&self.added)?;
        for document in text.split("\n---\n").filter(|d| !d.trim().is_empty()) {
            match parse_added(document) {
                Ok(a) if kernel::ifindex(&a.interface).is_ok() => {
                    tracing::info!(endpoint = %a.endpoint.id, interface = %a.interface, "endpoint added through the API restored");
                    added.insert(a.endpoint.id, a);
                }
                Ok(a) => {
                    tracing::warn!(endpoint = %a.endpoint.id, interface = %a.interface, "saved endpoint dropped: its interface is gone")
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %format!("{e:#}"), "a saved endpoint does not load")
                }
            }
        }
        Ok(())
    }

    /// Every endpoint with its kernel state.
    pub(crate) fn rows(&self, engine: &SharedEngine) -> Result<Vec<EndpointRow>> {
        let merged = self.merged()?;
        let added = lock(&self.added)?;
        let kernel = lock(&self.kernel)?;
        let engine = engine.lock().map_err(|_| anyhow!("engine lock poisoned"))?;
        Ok(merged
            .endpoints
            .iter()
            .map(|e| {
                let interface = merged.interfaces.get(&e.id).cloned().unwrap_or_default();
                EndpointRow {
                    id: e.id.0,
                    name: e.name.clone(),
                    addresses: e.addresses.iter().map(ToString::to_string).collect(),
                    labels: e
                        .labels
                        .iter()
                        .map(|l| format!("{}:{}={}", l.source, l.key, l.value))
                        .collect(),
                    ifindex: kernel.attached().get(&interface).map(|a| a.ifindex),
                    interface,
                    enforcing: engine.ipcache.endpoint_enforcing(e.id).unwrap_or(false),
                    source: if added.contains_key(&e.id) {
                        "api".to_owned()
                    } else {
                        "config".to_owned()
                    },
                }
            })
            .collect())
    }
}

/// What the kernel must hold for `config`'s endpoints.
fn wanted(config: &Config, engine: &Engine<AnyDatapath>) -> Vec<Wanted> {
    config
        .endpoints
        .iter()
        .filter_map(|e| {
            let Some(interface) = config.interfaces.get(&e.id) else {
                tracing::warn!(endpoint = %e.id, name = %e.name, "endpoint has no `interface`: its DNS is not redirected and its egress not enforced by this node");
                return None;
            };
            Some(Wanted {
                id: e.id,
                interface: interface.clone(),
                enforcing: engine.ipcache.endpoint_enforcing(e.id).unwrap_or(false),
            })
        })
        .collect()
}

fn proxy_config(config: &Config, node: &Node) -> fqdnd_dnsproxy::Config {
    let listen = vec![
        SocketAddr::from((Ipv4Addr::UNSPECIFIED, node.dns_proxy_port)),
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, node.dns_proxy_port)),
    ];
    fqdnd_dnsproxy::Config {
        listen_udp: listen.clone(),
        listen_tcp: listen,
        upstreams: Vec::new(),
        transparent: true,
        forward_to_original_destination: true,
        ..crate::daemon::proxy_config(&config.settings, &node.daemon)
    }
}

/// A running node agent.
pub(crate) struct RunningNode {
    stop: watch::Sender<bool>,
    tasks: tokio::task::JoinSet<Result<()>>,
}

impl RunningNode {
    /// Stops every task and waits for them. The programs stay attached and enforcing.
    pub(crate) async fn shutdown(mut self) -> Result<()> {
        let _ = self.stop.send(true);
        while let Some(result) = self.tasks.join_next().await {
            result.context("node task panicked")??;
        }
        Ok(())
    }
}

/// Starts the node agent: kernel programs and maps, engine, proxy, GC, drop events, admin API.
pub(crate) async fn start(
    paths: Vec<PathBuf>,
    admin_socket: Option<PathBuf>,
    strict_restore: bool,
) -> Result<RunningNode> {
    let clock = Clock::start();
    let (config, node) = load(&paths)?;
    crate::perms::check(&paths, &config, &node.daemon, &[]);
    let pin_dir = node
        .pin_dir
        .clone()
        .unwrap_or_else(fqdnd_ebpf::default_pin_dir);
    let kernel = Kernel::load(&pin_dir, &node.daemon.map_sizes, true)?;
    let mut services = Services::open(&pin_dir, node.daemon.state_dir.as_deref())?;
    // Before the endpoints' programs see traffic from a restarted daemon's policy: the
    // translations established flows use are reconciled first (kept as they are).
    services.apply(&config.services, true)?;
    let lb = services.shared();

    let runtime = Arc::new(NodeRuntime {
        node: node.clone(),
        kernel: Mutex::new(kernel),
        files: Mutex::new(config.clone()),
        added: Mutex::new(BTreeMap::new()),
        added_file: node
            .daemon
            .state_dir
            .as_ref()
            .map(|d| d.join("endpoints.yaml")),
        drops: DropLog::default(),
        services: Mutex::new(services),
    });
    // Endpoints added through the API before a restart are part of the desired state from
    // the first write on, so the reconciliation keeps their entries.
    runtime.load_added()?;
    let merged = runtime.merged()?;
    let (restored, persist) = crate::state::start(&node.daemon, strict_restore, clock)?;
    let mut engine = kernel::engine_on_kernel(&merged, &pin_dir, clock, &restored)?;
    drop(restored);
    // The engine refuses new prefixes past the kernel ipcache's size (fail closed).
    let ipcache_room = lock(&runtime.kernel)?.sizes().ipcache as usize;
    engine.ipcache.set_datapath_prefixes(Some(ipcache_room));
    let engine: SharedEngine = Arc::new(Mutex::new(engine));
    crate::state::settle(persist.as_deref(), &engine).await?;
    let policy = Arc::new(GatewayPolicy::with_services(lb));
    runtime.apply(&merged, &engine, &policy, clock)?;
    runtime.save_added();

    let observer = Arc::new(EngineObserver {
        engine: Arc::clone(&engine),
        clock,
        persist: persist.clone(),
    });
    let query_log: Option<Arc<dyn QueryLog>> = match &node.daemon.query_log {
        Some(path) => Some(Arc::new(crate::gateway::querylog::JsonLines::open(path)?)),
        None => None,
    };
    if let Some(addr) = node.daemon.metrics {
        crate::metrics::install(addr)?;
    }
    fqdnd_dnsproxy::describe_metrics();
    metrics::describe_counter!(
        "fqdnd_policy_drops_total",
        "packets the datapath dropped, by reason"
    );
    let proxy = DnsProxy::bind(
        proxy_config(&config, &node),
        Arc::clone(&policy) as Arc<dyn fqdnd_dnsproxy::QueryPolicy>,
        observer,
        query_log,
    )
    .await
    .context("starting the transparent DNS proxy")?;
    lock(&runtime.kernel)?.set_dns_proxy(node.dns_proxy_port)?;
    let listen = proxy.udp_addrs();
    tracing::info!(udp = ?listen, tcp = ?proxy.tcp_addrs(), pin_dir = %pin_dir.display(), "node agent running");

    let (stop, stopped) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let proxy_stats = proxy.stats_handle();
    {
        let mut stopped = stopped.clone();
        tasks.spawn(async move {
            proxy
                .run(async move { while stopped.changed().await.is_ok() && !*stopped.borrow() {} })
                .await?;
            Ok(())
        });
    }
    {
        let engine = Arc::clone(&engine);
        let runtime = Arc::clone(&runtime);
        let persist = persist.clone();
        let interval = config.settings.gc_interval;
        let idle = node.conntrack_idle_timeout;
        let mut stopped = stopped.clone();
        tasks.spawn(async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        kernel::gc(&engine, Some(&runtime.kernel), clock, idle);
                        if let Some(p) = &persist {
                            p.tick(&engine).await;
                        }
                    }
                    _ = stopped.changed() => return Ok(()),
                }
            }
        });
    }
    {
        let runtime = Arc::clone(&runtime);
        let mut events = fqdnd_ebpf::Events::open(&pin_dir).context("opening the drop events")?;
        let mut stopped = stopped.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    _ = tick.tick() => runtime.drops.record(&events.drain()),
                    _ = stopped.changed() => return Ok(()),
                }
            }
        });
    }
    let conntrack: crate::daemon::ConntrackProbe = {
        let runtime = Arc::clone(&runtime);
        Box::new(move || {
            let k = lock(&runtime.kernel)?;
            Ok((k.conntrack_entries()?, k.sizes().conntrack))
        })
    };
    crate::daemon::spawn_metrics(
        &mut tasks,
        &stopped,
        &engine,
        persist.as_ref(),
        Some(conntrack),
    );
    let state = Arc::new(AdminState {
        engine: Arc::clone(&engine),
        policy: Arc::clone(&policy),
        paths: paths.clone(),
        demo: false,
        clock,
        proxy: proxy_stats,
        mode: AdminMode::Node(Arc::clone(&runtime)),
        listen,
        reloads: Mutex::new(admin::ReloadHistory::default()),
    });
    let socket = admin_socket.unwrap_or_else(|| node.daemon.admin_socket.clone());
    crate::daemon::spawn_admin(&mut tasks, &stopped, &state, &socket)?;
    Ok(RunningNode { stop, tasks })
}

/// Runs the node agent until SIGINT or SIGTERM.
pub(crate) async fn run(
    paths: Vec<PathBuf>,
    admin_socket: Option<PathBuf>,
    strict_restore: bool,
) -> Result<()> {
    let node = start(paths, admin_socket, strict_restore).await?;
    crate::privileges::drop_all_but("node", crate::privileges::NODE)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping (programs stay attached)"),
        _ = term.recv() => tracing::info!("SIGTERM: stopping (programs stay attached)"),
    }
    node.shutdown().await
}
