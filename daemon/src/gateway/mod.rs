//! `fqdnd gateway`: fqdnd as a standalone DNS firewall. Client groups by CIDR, CNP-style DNS
//! rules and allow/deny lists decide what each group may ask; every allowed answer is learned
//! by the engine before the client gets it. With `enforceInterfaces` the engine writes into the
//! kernel maps and the programs on those LAN interfaces check forwarded traffic by client group.
//!
//! What is the gateway's own: the `Gateway` document, static zones served in-process, and the
//! client prefixes of the LAN interfaces; the rest is the daemon skeleton's.

pub mod demo;
mod zone;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{Context, Result, bail, refused};
use fqdnd_config::{Config, Gateway};
use fqdnd_dnsproxy::TlsCertificates;
use fqdnd_ipcache::EndpointId;

use crate::clock::Clock;
use crate::kernel::Kernel;
use crate::skeleton::{
    self, Desired, Loaded, ModeHooks, Prepared, Running, SharedKernel, StartOptions, lock,
};
use zone::ZoneServer;

/// The demo configuration behind `fqdnd gateway --demo` (the README's main job).
pub const DEMO_CONFIG: &str = include_str!("../../../examples/gateway-demo.yaml");

/// The gateway's own state.
pub struct GatewayMode {
    /// The Gateway document it started with (listen addresses, upstreams, zones and
    /// interfaces change only on restart).
    gateway: Gateway,
    zones: tokio::sync::Mutex<Option<ZoneServer>>,
    /// The certificate the DoT/DoH listeners present, re-read on reload.
    certificates: Option<Arc<TlsCertificates>>,
}

/// Loads the configuration; a gateway needs a `Gateway` document.
fn load(paths: &[PathBuf], demo: bool) -> Result<(Config, Gateway)> {
    let config = if demo {
        fqdnd_config::load_str(DEMO_CONFIG, Path::new("<embedded gateway demo>"))
    } else {
        fqdnd_config::load(paths)
    }
    .map_err(|errors| refused!("{errors}"))?;
    skeleton::log_warnings(&config);
    let Some(gateway) = config.gateway.clone() else {
        bail!(
            "no `kind: Gateway` document in the configuration: `fqdnd gateway` needs one (see docs/manual/gateway.md)"
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

/// Listen addresses with port 0 get one free port for both UDP and TCP, so clients can use
/// either transport on the address `fqdnd status` shows.
fn concrete_listen(addrs: &[SocketAddr]) -> Result<Vec<SocketAddr>> {
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
                let candidate = SocketAddr::new(addr.ip(), port);
                if std::net::TcpListener::bind(candidate).is_ok() {
                    return Ok(candidate);
                }
            }
            bail!("no port free for both UDP and TCP on {}", addr.ip())
        })
        .collect()
}

/// A configured upstream as the proxy takes it.
fn upstream_addr(upstream: &fqdnd_config::Upstream) -> fqdnd_dnsproxy::UpstreamAddr {
    use fqdnd_config::UpstreamProtocol as From;
    use fqdnd_dnsproxy::UpstreamProtocol as To;
    let protocol = match &upstream.protocol {
        From::Plain => To::Plain,
        From::Tls { server_name } => To::Tls {
            server_name: server_name.clone(),
        },
        From::Https { server_name, path } => To::Https {
            server_name: server_name.clone(),
            path: path.clone(),
        },
    };
    fqdnd_dnsproxy::UpstreamAddr {
        addr: upstream.addr,
        protocol,
    }
}

impl GatewayMode {
    /// Everything the gateway needs before the engine: its document, static zones, the
    /// kernel programs when it enforces LAN interfaces.
    async fn prepare(paths: &[PathBuf], demo: bool) -> Result<Prepared> {
        let (config, gateway) = load(paths, demo)?;
        if !demo {
            crate::perms::check(paths, &config, &gateway.daemon, &gateway.static_zones);
            skeleton::create_state_dir(&gateway.daemon)?;
        }
        // Each zone's names go to its own pool: the `zoneUpstreams`, and the static zones'
        // in-process server for theirs; every other name to `upstreams`.
        let mut zone_pools: Vec<fqdnd_dnsproxy::ZoneUpstreams> = gateway
            .zone_upstreams
            .iter()
            .map(|z| fqdnd_dnsproxy::ZoneUpstreams {
                zone: z.zone.clone(),
                upstreams: z.upstreams.iter().map(upstream_addr).collect(),
            })
            .collect();
        let zones = if gateway.static_zones.is_empty() {
            None
        } else {
            let server = ZoneServer::start(&gateway.static_zones).await?;
            tracing::info!(addr = %server.addr, zones = gateway.static_zones.len(), "static zones served");
            zone_pools.extend(
                gateway
                    .static_zones
                    .iter()
                    .map(|z| fqdnd_dnsproxy::ZoneUpstreams {
                        zone: z.origin.clone(),
                        upstreams: vec![server.addr.into()],
                    }),
            );
            Some(server)
        };
        let kernel = if gateway.enforce_interfaces.is_empty() {
            None
        } else {
            let pin_dir = gateway
                .pin_dir
                .clone()
                .unwrap_or_else(fqdnd_ebpf::default_pin_dir);
            Some((
                Kernel::load(
                    &pin_dir,
                    &gateway.daemon.map_sizes,
                    &gateway.daemon.conntrack,
                    false,
                )?,
                pin_dir,
            ))
        };
        let listen = concrete_listen(&gateway.listen)?;
        let (certificates, encrypted) = match &gateway.tls {
            Some(tls) => {
                let pair = crate::tls::load_pair(tls, crate::clock::unix_now())?;
                let certificates = TlsCertificates::new(pair);
                let listeners = crate::tls::listeners(tls, certificates.clone());
                (Some(certificates), Some(listeners))
            }
            None => (None, None),
        };
        Ok(Prepared {
            daemon: gateway.daemon.clone(),
            kernel,
            proxy: fqdnd_dnsproxy::Config {
                listen_udp: listen.clone(),
                listen_tcp: listen,
                upstreams: gateway.upstreams.iter().map(upstream_addr).collect(),
                upstream_ca: gateway.upstream_ca.clone(),
                zones: zone_pools,
                cache: skeleton::answer_cache(gateway.cache),
                encrypted,
                ..fqdnd_dnsproxy::Config::default()
            },
            services: None,
            redirects: None,
            admin_socket: gateway.daemon.admin_socket.clone(),
            mode: Box::new(Self {
                gateway,
                zones: tokio::sync::Mutex::new(zones),
                certificates,
            }),
            config,
        })
    }
}

/// What of the `tls` block only a restart changes: everything but the files.
fn listen_of(tls: &fqdnd_config::EncryptedDns) -> fqdnd_config::EncryptedDns {
    fqdnd_config::EncryptedDns {
        certificate: PathBuf::new(),
        key: PathBuf::new(),
        ..tls.clone()
    }
}

impl ModeHooks for GatewayMode {
    fn name(&self) -> &'static str {
        "gateway"
    }

    /// The client prefixes of the LAN interfaces, with each group's enforcement.
    fn sync(
        &self,
        kernel: Option<&SharedKernel>,
        config: &Config,
        enforcing: &BTreeMap<EndpointId, crate::kernel::Enforcing>,
    ) -> Result<()> {
        let Some(kernel) = kernel else {
            return Ok(());
        };
        let clients: Vec<_> = config
            .endpoints
            .iter()
            .flat_map(|e| {
                let on = enforcing.get(&e.id).copied().unwrap_or_default();
                e.addresses.iter().map(move |a| (*a, e.id, on))
            })
            .collect();
        lock(kernel, "kernel")?.sync_gateway(&self.gateway.enforce_interfaces, &clients)
    }

    fn reload(&self, paths: &[PathBuf], demo: bool) -> Result<Loaded> {
        let (config, gateway) = load(paths, demo)?;
        crate::perms::check(paths, &config, &gateway.daemon, &gateway.static_zones);
        let current = &self.gateway;
        if gateway.listen != current.listen
            || gateway.upstreams != current.upstreams
            || gateway.upstream_ca != current.upstream_ca
            || gateway.zone_upstreams != current.zone_upstreams
            || gateway.static_zones != current.static_zones
            || gateway.enforce_interfaces != current.enforce_interfaces
            || gateway.tls.as_ref().map(listen_of) != current.tls.as_ref().map(listen_of)
        {
            tracing::warn!(
                "listen addresses (also DoT/DoH and their limits), upstreams (and upstreamCA), zone upstreams, static zones and enforced interfaces change only on restart"
            );
        }
        // The certificate and key are read again: a renewed pair is presented from the next
        // handshake; one that cannot serve refuses the reload (the pair in use stays).
        let renewed = match (&gateway.tls, &self.certificates) {
            (Some(tls), Some(certificates)) => Some((
                crate::tls::load_pair(tls, crate::clock::unix_now())?,
                certificates.clone(),
            )),
            _ => None,
        };
        Ok(Loaded {
            desired: Desired {
                config,
                lists: gateway.daemon.lists,
            },
            commit: Box::new(move || {
                if let Some((pair, certificates)) = renewed {
                    certificates.replace(pair);
                    tracing::info!("DoT/DoH certificate read again");
                }
            }),
        })
    }

    /// Stops the static zone server, if any.
    fn stop(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async {
            if let Some(zones) = self.zones.lock().await.take() {
                zones.stop().await;
            }
        })
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Starts the gateway.
pub async fn start(options: StartOptions) -> Result<Running> {
    let clock = Clock::start();
    let prepared = GatewayMode::prepare(&options.paths, options.demo).await?;
    skeleton::start(prepared, options, clock).await
}
