//! The daemon skeleton gateway and node share: start, reload, stop — written once.
//!
//! Start: the mode prepares what is its own (its document, the kernel programs, static zones,
//! services, saved endpoints) → the state directory is opened and the engine built from the
//! desired configuration with what it held → [`Shared::apply`] brings the engine, the mode's
//! kernel side and the DNS policy to that configuration → the journal settles → the proxy
//! binds → the periodic tasks (GC, metrics), the mode's own tasks and the admin API start.
//!
//! Reload (SIGHUP, `fqdnd policy reload`, and every endpoint change of node mode) is
//! [`Shared::apply`]: DNS policy compiled, engine changed (rolled back inside if the datapath
//! refuses), the mode's kernel side synced (on failure the engine and kernel go back to the
//! configuration in force), then the DNS policy swapped. A refused change leaves nothing
//! behind. In cluster mode the configuration is the files' plus the shared policy
//! ([`crate::cluster`]), merged here in every apply.

mod dns;
mod forget;
mod learned;
mod observer;
mod proxy;
mod querylog;
pub mod record;
mod state;
mod tasks;

pub use forget::ForgetError;
pub use proxy::{answer_cache, proxy_config};
pub use state::create_state_dir;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::{Context, Result, refused};
use fqdnd_config::{Config, Daemon, Lists};
use fqdnd_dnsproxy::{DnsProxy, QueryLog};
use fqdnd_engine::dns::DnsPolicy;
use fqdnd_engine::{Clock as _, Engine};
use fqdnd_ipcache::EndpointId;
use fqdnd_ipcache::policy::{Direction, Rule};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::cluster::{ClusterRuntime, Host};
use crate::datapath::AnyDatapath;
use crate::kernel::Kernel;
pub use dns::{DnsHandle, SharedLb, SocketRedirects};

/// The engine, shared between the proxy's observer, the GC task and the admin API. Each
/// holder locks it briefly (one answer, one GC pass, one listing).
pub type SharedEngine = Arc<Mutex<Engine<AnyDatapath>>>;

/// The kernel side, when the mode has one (node; gateway with `enforceInterfaces`).
pub type SharedKernel = Arc<Mutex<Kernel>>;

/// Logs the configuration's warnings (what `fqdnd policy check` prints: a skipped empty
/// file, a dead `toFQDNs` selector, an allow a deny shadows…) at load and at every reload.
pub fn log_warnings(config: &Config) {
    for warning in &config.warnings {
        tracing::warn!("configuration: {warning}");
    }
}

/// Locks `m`, naming it in the error if a holder panicked.
pub fn lock<'a, T>(m: &'a Mutex<T>, what: &str) -> Result<MutexGuard<'a, T>> {
    m.lock().map_err(|_| refused!("{what} lock poisoned"))
}

/// What differs between gateway and node, as the skeleton needs it. The skeleton knows no
/// mode: each implements this.
pub trait ModeHooks: Send + Sync + 'static {
    /// `gateway` or `node`.
    fn name(&self) -> &'static str;
    /// Brings the mode's kernel side (and services) to `config`, after the engine has it;
    /// `enforcing` says which endpoints are under egress policy.
    fn sync(
        &self,
        kernel: Option<&SharedKernel>,
        config: &Config,
        enforcing: &BTreeMap<EndpointId, crate::kernel::Enforcing>,
    ) -> Result<()>;
    /// Re-reads the configuration files for a reload.
    fn reload(&self, paths: &[PathBuf], demo: bool) -> Result<Loaded>;
    /// Once the proxy listens (node: points the DNS redirect at it).
    fn proxy_bound(&self, _kernel: Option<&SharedKernel>) -> Result<()> {
        Ok(())
    }
    /// The node's own addresses, which get the host identity (`reserved:host`); `None` when
    /// the mode gives none (gateway: its clients are groups of addresses, not endpoints on
    /// this host).
    fn host_addresses(&self) -> Option<Vec<std::net::IpAddr>> {
        None
    }
    /// The mode's own tasks (node: the drop events).
    fn spawn_tasks(
        &self,
        _tasks: &mut JoinSet<Result<()>>,
        _stopped: &watch::Receiver<bool>,
    ) -> Result<()> {
        Ok(())
    }
    /// Stops what the mode runs beside the tasks (gateway: the static zone server).
    fn stop(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async {})
    }
    /// What stopping leaves in place, for the log line.
    fn leaves(&self) -> &'static str {
        ""
    }
    /// The mode, for the admin API's mode-specific routes.
    fn as_any(&self) -> &dyn std::any::Any;
    /// Cluster mode: whether endpoints are published with their addresses, so other nodes
    /// route to them (node: yes; a gateway's client groups are not workloads).
    fn publishes_cluster_addresses(&self) -> bool {
        false
    }
    /// What a restart keeps even without a `stateDir`, for its warning (node: the endpoints
    /// added at run time, and where).
    fn kept_without_state_dir(&self) -> Option<String> {
        None
    }
}

/// What a mode hands the skeleton at start.
pub struct Prepared {
    /// The desired configuration (node: files + saved endpoints).
    pub config: Config,
    /// The daemon options of the mode's document.
    pub daemon: Daemon,
    /// The loaded programs and where their maps are pinned, if the mode enforces.
    pub kernel: Option<(Kernel, PathBuf)>,
    /// The proxy's listen addresses, upstreams and transparent mode; the rest comes from
    /// `daemon` and the settings ([`proxy_config`]).
    pub proxy: fqdnd_dnsproxy::Config,
    /// The mode's own state.
    pub mode: Box<dyn ModeHooks>,
    /// Node: queries to a service VIP are forwarded to one of its backends.
    pub services: Option<SharedLb>,
    /// Node: host processes' DNS, redirected by the cgroup socket programs.
    pub redirects: Option<SocketRedirects>,
    /// The admin socket the mode's document names.
    pub admin_socket: PathBuf,
}

/// What one (re)load wants: the configuration and the lists that go with it.
#[derive(Debug, Clone)]
pub struct Desired {
    pub(crate) config: Config,
    pub(crate) lists: Lists,
}

/// The reloads so far and the last one's errors (for `status`).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ReloadHistory {
    /// Reloads tried.
    pub reloads: u64,
    /// Reloads refused.
    pub failed: u64,
    /// The last refused reload's errors.
    pub last_errors: Vec<String>,
}

/// The outcome of a reload or another change (`POST /v1/policy/reload`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Reload {
    /// Whether it was applied.
    pub ok: bool,
    /// Why not, one line per problem.
    pub errors: Vec<String>,
}

/// Everything the daemon's tasks and the admin API share.
pub struct Shared {
    pub(crate) engine: SharedEngine,
    pub(crate) dns: Arc<DnsHandle>,
    pub(crate) clock: Clock,
    pub(crate) kernel: Option<SharedKernel>,
    pub(crate) mode: Box<dyn ModeHooks>,
    /// The configuration files given on the command line.
    pub paths: Vec<PathBuf>,
    pub(crate) demo: bool,
    /// The configuration in force (what the last successful apply installed).
    desired: Mutex<Desired>,
    pub(crate) reloads: Mutex<ReloadHistory>,
    /// Held by every change of the desired state (reloads, endpoint changes), one at a time.
    pub changes: Mutex<()>,
    /// Set once the proxy is bound.
    pub proxy: OnceLock<fqdnd_dnsproxy::StatsHandle>,
    pub(crate) listen: OnceLock<Vec<SocketAddr>>,
    /// The DoT and DoH listeners bound, as `dot ADDRESS` / `doh ADDRESS`.
    pub(crate) encrypted: OnceLock<Vec<String>>,
    pub(crate) persist: Option<Arc<fqdnd_engine::durable::Persist>>,
    /// `fqdnd record`.
    pub recorder: record::SharedRecorder,
    /// Cluster mode, with a `kind: Cluster` document.
    pub cluster: Option<Arc<ClusterRuntime>>,
    /// The shared policy's rules in force (what the last successful apply merged).
    cluster_rules: Mutex<Vec<Rule>>,
    /// What the dashboard learns from finished queries, when it is on.
    pub(crate) feed: Option<Arc<crate::dashboard::Feed>>,
}

/// `config` with the shared policy's rules after its own.
fn with_rules(config: &Config, rules: &[Rule]) -> Config {
    let mut config = config.clone();
    config.rules.extend(rules.iter().cloned());
    config
}

impl Host for Shared {
    fn engine(&self) -> &Mutex<Engine<AnyDatapath>> {
        &self.engine
    }

    fn reload_all(&self) -> std::result::Result<(), Vec<String>> {
        let outcome = self.reload();
        if outcome.ok {
            Ok(())
        } else {
            Err(outcome.errors)
        }
    }

    fn import_learned(&self, records: &[fqdnd_cluster::Import], servers: &[SocketAddr]) -> usize {
        learned::import(self, records, servers)
    }

    fn revoke_learned(&self, revocations: &[fqdnd_cluster::Revocation]) {
        learned::revoke(self, revocations);
    }

    fn held_answers(&self) -> Vec<fqdnd_cluster::Held> {
        learned::held(self)
    }
}

impl Shared {
    /// The configuration in force.
    pub fn desired(&self) -> Result<Desired> {
        Ok(lock(&self.desired, "configuration")?.clone())
    }

    /// Brings the engine, the mode's kernel side and the DNS policy to `next` (in cluster
    /// mode, with the shared policy's rules after its own). On any failure what was in force
    /// stays in force.
    pub fn apply(&self, next: Desired) -> Result<()> {
        let shared_rules = self.cluster.as_ref().map(|c| c.rules()).unwrap_or_default();
        let effective = with_rules(&next.config, &shared_rules);
        let compiled = DnsPolicy::compile(&effective, &next.lists)?;
        let previous = with_rules(
            &self.desired()?.config,
            &lock(&self.cluster_rules, "shared policy")?,
        );
        let enforced = {
            let mut engine = lock(&self.engine, "engine")?;
            engine.apply(
                effective.endpoints.clone(),
                effective.rules.clone(),
                self.clock.now(),
            )?;
            // After the endpoints and policy: they have the datapath's room first.
            self.refresh_host(&mut engine);
            enforcing(&effective, &engine)
        };
        if let Err(e) = self.sync(&effective, &enforced) {
            // Back to the configuration in force, in the engine and the kernel.
            let undo = lock(&self.engine, "engine").and_then(|mut engine| {
                engine.apply(
                    previous.endpoints.clone(),
                    previous.rules.clone(),
                    self.clock.now(),
                )?;
                Ok(enforcing(&previous, &engine))
            });
            match undo.and_then(|before| self.sync(&previous, &before)) {
                Ok(()) => {}
                Err(undo) => {
                    tracing::error!(error = %crate::chain(&undo), "going back to the configuration in force failed")
                }
            }
            return Err(e);
        }
        self.dns.replace(compiled);
        *lock(&self.desired, "configuration")? = next;
        *lock(&self.cluster_rules, "shared policy")? = shared_rules;
        if let Some(cluster) = &self.cluster {
            cluster.set_local(&effective);
        }
        Ok(())
    }

    /// Gives the node's current addresses the host identity, committed (and, in cluster
    /// mode, hands them to the node side to publish). A failure is logged: the addresses
    /// keep the identity they had.
    pub fn refresh_host(&self, engine: &mut Engine<AnyDatapath>) {
        let Some(addrs) = self.mode.host_addresses() else {
            return;
        };
        if let Some(cluster) = &self.cluster {
            cluster.set_addresses(&addrs);
        }
        match engine.set_host_addresses(&addrs) {
            Ok(true) => {
                tracing::info!(addresses = ?addrs, "the node's addresses (the host identity)")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %fqdnd_engine::error_chain(&e), "giving the node's addresses the host identity failed")
            }
        }
    }

    /// The mode's kernel side (and services) to `config`.
    fn sync(
        &self,
        config: &Config,
        enforcing: &BTreeMap<EndpointId, crate::kernel::Enforcing>,
    ) -> Result<()> {
        self.mode.sync(self.kernel.as_ref(), config, enforcing)
    }

    /// Re-reads the configuration files and applies them; the outcome is recorded for
    /// `status` and logged.
    pub fn reload(&self) -> Reload {
        let outcome = (|| {
            let _changes = lock(&self.changes, "changes")?;
            let loaded = self.mode.reload(&self.paths, self.demo)?;
            self.apply(loaded.desired)?;
            (loaded.commit)();
            Ok(())
        })();
        self.record_reload(outcome)
    }

    fn record_reload(&self, outcome: Result<()>) -> Reload {
        let mut history = self
            .reloads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        history.reloads += 1;
        match outcome {
            Ok(()) => {
                history.last_errors.clear();
                tracing::info!(mode = self.mode.name(), "policy reloaded");
                Reload {
                    ok: true,
                    errors: Vec::new(),
                }
            }
            Err(e) => {
                history.failed += 1;
                let errors: Vec<String> = crate::chain(&e).lines().map(str::to_owned).collect();
                for line in &errors {
                    tracing::error!(error = %line, "reload rejected; the previous policy stays in force");
                }
                history.last_errors = errors.clone();
                Reload { ok: false, errors }
            }
        }
    }
}

/// A reload as a mode reads it: what to apply, and what to do once it is in force.
pub struct Loaded {
    pub(crate) desired: Desired,
    pub(crate) commit: Box<dyn FnOnce() + Send>,
}

/// Whether each endpoint of `config` is under egress policy in `engine`.
fn enforcing(
    config: &Config,
    engine: &Engine<AnyDatapath>,
) -> BTreeMap<EndpointId, crate::kernel::Enforcing> {
    config
        .endpoints
        .iter()
        .map(|e| {
            (
                e.id,
                crate::kernel::Enforcing {
                    egress: engine
                        .ipcache
                        .endpoint_under_policy(e.id, Direction::Egress)
                        .unwrap_or(false),
                    ingress: engine
                        .ipcache
                        .endpoint_under_policy(e.id, Direction::Ingress)
                        .unwrap_or(false),
                },
            )
        })
        .collect()
}

/// A running daemon.
pub struct Running {
    pub(crate) shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    /// Tasks fire when the stop channel does.
    pub stopped: watch::Receiver<bool>,
    pub(crate) tasks: JoinSet<Result<()>>,
    /// Where the admin API is to listen (`None` for the demo).
    pub admin_socket: Option<PathBuf>,
    /// The dashboard's settings, when the document has them.
    pub dashboard: Option<fqdnd_config::Dashboard>,
}

impl Running {
    /// Where the proxy answers over UDP.
    pub fn udp(&self) -> Vec<SocketAddr> {
        self.shared.listen.get().cloned().unwrap_or_default()
    }

    /// Re-reads the configuration files and applies them, as SIGHUP and `fqdnd policy
    /// reload` do: whole or not at all.
    pub fn reload(&self) -> Reload {
        self.shared.reload()
    }

    /// Stops every task and waits for them (the mode's own resources go with them).
    pub async fn shutdown(mut self) -> Result<()> {
        let _ = self.stop.send(true);
        while let Some(result) = self.tasks.join_next().await {
            result.context("daemon task panicked")??;
        }
        self.shared.mode.stop().await;
        Ok(())
    }

    /// In service: the admin API started, then every capability dropped but `keep` (the
    /// mode's, [`crate::privileges::GATEWAY`] or [`crate::privileges::NODE`]), then ready
    /// (systemd is told: the proxy answers, the state is restored, the admin API listens),
    /// then until SIGINT or SIGTERM.
    ///
    /// # Errors
    /// The admin socket cannot be bound, privileges cannot be dropped, or stopping failed.
    pub async fn serve(mut self, mode: &str, keep: &[fqdnd_privileges::Cap]) -> Result<()> {
        crate::admin::server::spawn(&mut self)?;
        crate::dashboard::spawn(&mut self)?;
        crate::privileges::drop_all_but(mode, keep)?;
        crate::notify::ready(&format!("{mode}: answering DNS on {:?}", self.udp()));
        self.until_signal().await
    }

    /// Runs until SIGINT or SIGTERM, then stops.
    pub async fn until_signal(self) -> Result<()> {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let leaves = self.shared.mode.leaves();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping{leaves}"),
            _ = term.recv() => tracing::info!("SIGTERM: stopping{leaves}"),
        }
        crate::notify::stopping();
        self.shutdown().await
    }
}

/// How a daemon is started.
pub struct StartOptions {
    /// Configuration files or directories.
    pub paths: Vec<PathBuf>,
    /// The embedded demo (no state, no admin API, no permission checks).
    pub demo: bool,
    /// The admin socket instead of the document's.
    pub admin_socket: Option<PathBuf>,
    /// Refuse a torn journal tail.
    pub strict_restore: bool,
    /// Cluster mode over this in-memory store instead of the `Cluster` document's etcd (the
    /// daemon in-process in tests: the same code above the store).
    pub cluster_store: Option<fqdnd_cluster::MemoryStore>,
}

/// How long a cluster member without a saved view waits for the shared policy before it
/// serves.
const CLUSTER_POLICY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest an HA group's imported answer is held: the answer cache's `maxTTL` when the
/// gateway has one, else its default (a day) — the bound the gateway puts on what DNS tells
/// its own clients.
fn max_import_ttl(cache: Option<&fqdnd_dnsproxy::CacheConfig>) -> u32 {
    cache.map_or(fqdnd_config::AnswerCache::default().max_ttl, |c| c.max_ttl)
}

/// Starts a daemon from what its mode prepared.
pub async fn start(prepared: Prepared, options: StartOptions, clock: Clock) -> Result<Running> {
    let Prepared {
        config,
        daemon,
        kernel,
        proxy,
        mode,
        services,
        redirects,
        admin_socket,
    } = prepared;
    // The recorder first: the gauges are set as soon as the restore ends; the endpoint serves
    // from then on.
    let exporter = match daemon.metrics {
        Some(addr) => Some(crate::metrics::install(addr)?),
        None => None,
    };
    let (mut restored, persist) = if options.demo {
        (fqdnd_engine::durable::Restored::default(), None)
    } else {
        state::open(
            &daemon,
            options.strict_restore,
            clock,
            mode.kept_without_state_dir(),
        )?
    };
    let cluster = match &config.cluster {
        Some(doc) if !options.demo => Some(ClusterRuntime::open(
            doc,
            &daemon,
            mode.publishes_cluster_addresses(),
            mode.name() == "gateway",
            clock,
            (&proxy.listen_udp, max_import_ttl(proxy.cache.as_ref())),
            options.cluster_store.clone(),
        )?),
        _ => None,
    };
    // The engine starts from the cluster's numbers, remote endpoints and shared policy as
    // last seen (cluster mode), then the configuration.
    let prime = |engine: &mut Engine<AnyDatapath>| {
        if let Some(cluster) = &cluster {
            cluster.prime(engine);
        }
    };
    let first = with_rules(
        &config,
        &cluster.as_ref().map(|c| c.rules()).unwrap_or_default(),
    );
    let (engine, kernel) = match kernel {
        None => (
            state::build_engine(&first, AnyDatapath::Unenforced, clock, &mut restored, prime)?,
            None,
        ),
        Some((kernel, pin_dir)) => {
            let mut engine =
                state::engine_on_kernel(&first, &pin_dir, clock, &mut restored, prime)?;
            // The engine refuses new prefixes past the kernel ipcache's size (fail closed).
            engine
                .ipcache
                .set_datapath_prefixes(Some(kernel.sizes().ipcache as usize));
            (engine, Some(Arc::new(Mutex::new(kernel))))
        }
    };
    drop(restored);
    let engine: SharedEngine = Arc::new(Mutex::new(engine));
    // Gauges right after the restore, not a tick later.
    if let Ok(engine) = engine.lock() {
        crate::metrics::record_engine(&engine);
    }
    if let Some(exporter) = exporter {
        crate::metrics::serve(exporter);
    }
    let shared = Arc::new(Shared {
        engine: Arc::clone(&engine),
        dns: Arc::new(DnsHandle::new(services, redirects)),
        clock,
        kernel,
        mode,
        paths: options.paths,
        demo: options.demo,
        desired: Mutex::new(Desired {
            config: config.clone(),
            lists: daemon.lists.clone(),
        }),
        reloads: Mutex::new(ReloadHistory::default()),
        changes: Mutex::new(()),
        proxy: OnceLock::new(),
        listen: OnceLock::new(),
        encrypted: OnceLock::new(),
        persist: persist.clone(),
        recorder: Arc::default(),
        cluster,
        cluster_rules: Mutex::new(Vec::new()),
        feed: daemon
            .dashboard
            .is_some()
            .then(|| Arc::new(crate::dashboard::Feed::default())),
    });
    shared.apply(Desired {
        config: config.clone(),
        lists: daemon.lists.clone(),
    })?;
    if let Some(persist) = &persist {
        persist
            .settle(&engine)
            .await
            .context("journaling the identities at start")?;
    }
    // The query log file and the dashboard both tap finished queries.
    let mut taps: Vec<Arc<dyn QueryLog>> = Vec::new();
    if let Some(path) = &daemon.query_log {
        taps.push(Arc::new(querylog::JsonLines::open(path)?));
    }
    if let Some(feed) = &shared.feed {
        taps.push(Arc::clone(feed) as Arc<dyn QueryLog>);
    }
    let query_log: Option<Arc<dyn QueryLog>> = match taps.len() {
        0 => None,
        1 => taps.pop(),
        _ => Some(Arc::new(crate::dashboard::feed::Tee(taps))),
    };
    // An HA gateway imports its group's state before it serves.
    let ha = shared.cluster.as_ref().and_then(|c| c.ha().cloned());
    if let Some(ha) = &ha {
        ha.import_before_serving(Arc::clone(&shared) as Arc<dyn Host>)
            .await?;
    }
    let (stop, stopped) = watch::channel(false);
    let mut tasks = JoinSet::new();
    // Cluster mode: the node side runs from now on; a node that does not know the shared
    // policy yet (no saved view) waits a little for etcd before it serves — its endpoints are
    // in default deny until then.
    if let Some(cluster) = &shared.cluster {
        cluster
            .spawn(Arc::clone(&shared) as Arc<dyn Host>, &mut tasks, &stopped)
            .await?;
        if !cluster.wait_established(CLUSTER_POLICY_WAIT).await {
            tracing::warn!(
                "the cluster's shared policy was not read within 5s: serving; every endpoint stays in default deny until etcd answers"
            );
        }
    }
    let observer = Arc::new(observer::EngineObserver {
        engine: Arc::clone(&engine),
        clock,
        persist: persist.clone(),
        ha,
    });
    let proxy = DnsProxy::bind(
        proxy_config(&config.settings, &daemon, proxy),
        Arc::clone(&shared.dns) as Arc<dyn fqdnd_dnsproxy::QueryPolicy>,
        observer,
        fqdnd_dnsproxy::Taps {
            query_log,
            recorder: Some(Arc::clone(&shared.recorder) as Arc<dyn fqdnd_dnsproxy::Recorder>),
        },
    )
    .await
    .context("starting the DNS proxy")?;
    shared.mode.proxy_bound(shared.kernel.as_ref())?;
    let udp = proxy.udp_addrs();
    let encrypted: Vec<String> = (proxy.dot_addrs().iter().map(|a| format!("dot {a}")))
        .chain(proxy.doh_addrs().iter().map(|a| format!("doh {a}")))
        .collect();
    tracing::info!(mode = shared.mode.name(), udp = ?udp, tcp = ?proxy.tcp_addrs(), encrypted = ?encrypted, "listening");
    let _ = shared.proxy.set(proxy.stats_handle());
    let _ = shared.listen.set(udp);
    let _ = shared.encrypted.set(encrypted);

    {
        let mut stopped = stopped.clone();
        tasks.spawn(async move {
            proxy
                .run(async move { while stopped.changed().await.is_ok() && !*stopped.borrow() {} })
                .await?;
            Ok(())
        });
    }
    tasks::spawn_gc(&mut tasks, &stopped, &shared, config.settings.gc_interval)?;
    tasks::spawn_metrics(&mut tasks, &stopped, &shared)?;
    tasks::spawn_host_addresses(&mut tasks, &stopped, &shared);
    shared.mode.spawn_tasks(&mut tasks, &stopped)?;
    Ok(Running {
        shared,
        stop,
        stopped,
        tasks,
        admin_socket: (!options.demo).then(|| options.admin_socket.unwrap_or(admin_socket)),
        dashboard: daemon.dashboard.clone(),
    })
}
