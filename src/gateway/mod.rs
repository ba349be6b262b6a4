//! `fqdnd gateway`: fqdnd as a standalone DNS firewall. Client groups by CIDR, CNP-style DNS
//! rules and allow/deny lists decide what each group may ask; every allowed answer is learned
//! by the engine (NameManager → IpCache → datapath) before the client gets it.

mod lists;
pub(crate) mod observer;
pub(crate) mod policy;
pub(crate) mod querylog;
mod zone;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow, bail};
use fqdnd_config::{Config, Gateway};
use fqdnd_dnsproxy::{DnsProxy, QueryLog};
use tokio::sync::watch;

use crate::admin::{self, AdminState};
use crate::clock::Clock;
use crate::datapath::AnyDatapath;
use crate::engine::Engine;
use crate::kernel::Kernel;
use observer::{EngineObserver, SharedEngine};
use policy::{CompiledPolicy, GatewayPolicy};
use zone::ZoneServer;

/// The demo configuration behind `fqdnd gateway --demo` (the README's main job).
pub(crate) const DEMO_CONFIG: &str = include_str!("../../examples/gateway-demo.yaml");

/// A gateway, bound and serving.
pub(crate) struct RunningGateway {
    /// Where it answers DNS over UDP.
    pub(crate) udp: Vec<std::net::SocketAddr>,
    /// Shared engine, for listings.
    pub(crate) engine: SharedEngine,
    stop: watch::Sender<bool>,
    tasks: tokio::task::JoinSet<Result<()>>,
    zones: Option<ZoneServer>,
}

impl RunningGateway {
    /// Stops every task and waits for them.
    pub(crate) async fn shutdown(mut self) -> Result<()> {
        let _ = self.stop.send(true);
        while let Some(result) = self.tasks.join_next().await {
            result.context("gateway task panicked")??;
        }
        if let Some(zones) = self.zones.take() {
            zones.stop().await;
        }
        Ok(())
    }
}

/// Listen addresses with port 0 get one free port for both UDP and TCP, so clients can use
/// either transport on the address `fqdnd status` shows.
fn concrete_listen(addrs: &[std::net::SocketAddr]) -> Result<Vec<std::net::SocketAddr>> {
    addrs
        .iter()
        .map(|addr| {
            if addr.port() != 0 {
                return Ok(*addr);
            }
            for _ in 0..32 {
                let udp =
                    std::net::UdpSocket::bind(addr).with_context(|| format!("binding {addr}"))?;
                let port = udp.local_addr()?.port();
                let candidate = std::net::SocketAddr::new(addr.ip(), port);
                if std::net::TcpListener::bind(candidate).is_ok() {
                    return Ok(candidate);
                }
            }
            bail!("no port free for both UDP and TCP on {}", addr.ip())
        })
        .collect()
}

fn proxy_config(
    settings: &fqdnd_config::Settings,
    gateway: &Gateway,
    listen: &[std::net::SocketAddr],
    upstreams: Vec<std::net::SocketAddr>,
) -> fqdnd_dnsproxy::Config {
    fqdnd_dnsproxy::Config {
        listen_udp: listen.to_vec(),
        listen_tcp: listen.to_vec(),
        upstreams,
        ..crate::daemon::proxy_config(settings, &gateway.daemon)
    }
}

/// Loads the configuration; a gateway needs a `Gateway` document.
pub(crate) fn load(paths: &[PathBuf], demo: bool) -> Result<(Config, Gateway)> {
    let config = if demo {
        fqdnd_config::load_str(DEMO_CONFIG, std::path::Path::new("<embedded gateway demo>"))
    } else {
        fqdnd_config::load(paths)
    }
    .map_err(|errors| anyhow!("{errors}"))?;
    let Some(gateway) = config.gateway.clone() else {
        bail!(
            "no `kind: Gateway` document in the configuration: `fqdnd gateway` needs one (see docs/operations.md)"
        );
    };
    if !config.services.is_empty() {
        tracing::warn!(
            services = config.services.len(),
            "`kind: Service` documents are ignored by `fqdnd gateway` (only `fqdnd node` load-balances)"
        );
    }
    Ok((config, gateway))
}

/// Starts the gateway: static zones, engine, proxy, GC, admin API, metrics, query log.
pub(crate) async fn start(
    paths: Vec<PathBuf>,
    demo: bool,
    admin_socket: Option<PathBuf>,
    strict_restore: bool,
) -> Result<RunningGateway> {
    let clock = Clock::start();
    let (config, gateway) = load(&paths, demo)?;
    if !demo {
        crate::perms::check(&paths, &config, &gateway.daemon, &gateway.static_zones);
    }
    let compiled = CompiledPolicy::compile(&config, &gateway.daemon.lists)?;
    let policy = Arc::new(GatewayPolicy::default());
    policy.replace(compiled);

    let mut upstreams = gateway.upstreams.clone();
    let zones = if gateway.static_zones.is_empty() {
        None
    } else {
        let server = ZoneServer::start(&gateway.static_zones).await?;
        tracing::info!(addr = %server.addr, zones = gateway.static_zones.len(), "static zones served");
        upstreams.push(server.addr);
        Some(server)
    };

    // With LAN interfaces to enforce, the engine writes into the kernel maps and the
    // programs check forwarded traffic by client group.
    let kernel = if gateway.enforce_interfaces.is_empty() {
        None
    } else {
        let pin_dir = gateway
            .pin_dir
            .clone()
            .unwrap_or_else(fqdnd_ebpf::default_pin_dir);
        Some((
            Kernel::load(&pin_dir, &gateway.daemon.map_sizes, false)?,
            pin_dir,
        ))
    };
    let (restored, persist) = if demo {
        (crate::state::Restored::default(), None)
    } else {
        crate::state::start(&gateway.daemon, strict_restore, clock)?
    };
    let engine = match &kernel {
        None => crate::state::build_engine(
            &config,
            AnyDatapath::Memory(Box::default()),
            clock,
            &restored,
        )?,
        Some((_, pin_dir)) => crate::kernel::engine_on_kernel(&config, pin_dir, clock, &restored)?,
    };
    drop(restored);
    let mut engine = engine;
    let kernel = match kernel {
        None => None,
        Some((mut k, _)) => {
            // The engine refuses new prefixes past the kernel ipcache's size (fail closed).
            engine
                .ipcache
                .set_datapath_prefixes(Some(k.sizes().ipcache as usize));
            k.sync_gateway(&gateway.enforce_interfaces, &clients(&config, &engine))?;
            Some(Arc::new(Mutex::new(k)))
        }
    };
    let engine: SharedEngine = Arc::new(Mutex::new(engine));
    crate::state::settle(persist.as_deref(), &engine).await?;
    let observer = Arc::new(EngineObserver {
        engine: Arc::clone(&engine),
        clock,
        persist: persist.clone(),
    });
    let query_log: Option<Arc<dyn QueryLog>> = match &gateway.daemon.query_log {
        Some(path) => Some(Arc::new(querylog::JsonLines::open(path)?)),
        None => None,
    };
    if let Some(addr) = gateway.daemon.metrics {
        crate::metrics::install(addr)?;
    }
    fqdnd_dnsproxy::describe_metrics();
    let proxy = DnsProxy::bind(
        proxy_config(
            &config.settings,
            &gateway,
            &concrete_listen(&gateway.listen)?,
            upstreams,
        ),
        Arc::clone(&policy) as Arc<dyn fqdnd_dnsproxy::QueryPolicy>,
        observer,
        query_log,
    )
    .await
    .context("starting the DNS proxy")?;
    let udp = proxy.udp_addrs();
    tracing::info!(udp = ?udp, tcp = ?proxy.tcp_addrs(), "gateway listening");

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
        let kernel = kernel.clone();
        let persist = persist.clone();
        let interval = config.settings.gc_interval;
        let mut stopped = stopped.clone();
        tasks.spawn(async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        crate::kernel::gc(&engine, kernel.as_deref(), clock, crate::kernel::DEFAULT_CONNTRACK_IDLE);
                        if let Some(p) = &persist {
                            p.tick(&engine).await;
                        }
                    }
                    _ = stopped.changed() => return Ok(()),
                }
            }
        });
    }
    let conntrack = kernel.clone().map(|k| -> crate::daemon::ConntrackProbe {
        Box::new(move || {
            let k = k.lock().map_err(|_| anyhow!("kernel lock poisoned"))?;
            Ok((k.conntrack_entries()?, k.sizes().conntrack))
        })
    });
    crate::daemon::spawn_metrics(&mut tasks, &stopped, &engine, persist.as_ref(), conntrack);
    let state = Arc::new(AdminState {
        engine: Arc::clone(&engine),
        policy: Arc::clone(&policy),
        paths: paths.clone(),
        demo,
        clock,
        proxy: proxy_stats,
        mode: admin::AdminMode::Gateway {
            gateway: Box::new(gateway.clone()),
            kernel: kernel.clone(),
        },
        listen: udp.clone(),
        reloads: Mutex::new(admin::ReloadHistory::default()),
    });
    let socket = admin_socket.unwrap_or_else(|| gateway.daemon.admin_socket.clone());
    if !demo {
        crate::daemon::spawn_admin(&mut tasks, &stopped, &state, &socket)?;
    }
    Ok(RunningGateway {
        udp,
        engine,
        stop,
        tasks,
        zones,
    })
}

/// Every client prefix with its group and whether the group is under egress policy.
pub(crate) fn clients(
    config: &Config,
    engine: &Engine<AnyDatapath>,
) -> Vec<(ipnet::IpNet, fqdnd_ipcache::EndpointId, bool)> {
    config
        .endpoints
        .iter()
        .flat_map(|e| {
            let enforcing = engine.ipcache.endpoint_enforcing(e.id).unwrap_or(false);
            e.addresses.iter().map(move |a| (*a, e.id, enforcing))
        })
        .collect()
}

/// Runs the gateway until SIGINT or SIGTERM.
pub(crate) async fn run(
    paths: Vec<PathBuf>,
    admin_socket: Option<PathBuf>,
    strict_restore: bool,
) -> Result<()> {
    let gateway = start(paths, false, admin_socket, strict_restore).await?;
    crate::privileges::drop_all_but("gateway", crate::privileges::GATEWAY)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
    }
    gateway.shutdown().await
}
