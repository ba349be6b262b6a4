//! Static zones served from memory by an in-process authoritative server (hickory-server), so
//! the gateway can answer with no network at all: tests, demos, air-gapped sites. The proxy
//! reaches it as an ordinary upstream on loopback.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use crate::{Context, Result, bail};
use fqdnd_config::{StaticZone, ZoneSource};
use hickory_proto::rr::{LowerName, Name};
use hickory_proto::serialize::txt::Parser;
use hickory_server::Server;
use hickory_server::net::runtime::TokioRuntimeProvider;
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneType};
use tokio::net::{TcpListener, UdpSocket};

/// A running static-zone server.
pub(super) struct ZoneServer {
    /// Where it answers, over UDP and TCP.
    pub addr: SocketAddr,
    server: Server<Catalog>,
}

impl ZoneServer {
    /// Parses every zone and serves them on a free loopback port.
    pub(super) async fn start(zones: &[StaticZone]) -> Result<Self> {
        let mut catalog = Catalog::new();
        for zone in zones {
            let (text, path) = match &zone.source {
                ZoneSource::File(path) => (
                    std::fs::read_to_string(path)
                        .with_context(|| format!("reading zone file {}", path.display()))?,
                    Some(path.clone()),
                ),
                ZoneSource::Inline(text) => (text.clone(), None::<PathBuf>),
            };
            let origin = Name::from_ascii(&zone.origin)
                .with_context(|| format!("zone origin {}", zone.origin))?;
            let where_ = path.as_ref().map_or_else(
                || format!("inline zone {}", zone.origin),
                |p| p.display().to_string(),
            );
            let (origin, records) = Parser::new(text, path, Some(origin))
                .parse()
                .with_context(|| format!("parsing {where_}"))?;
            let records: BTreeMap<_, _> = records;
            let handler = InMemoryZoneHandler::<TokioRuntimeProvider>::new(
                origin.clone(),
                records,
                ZoneType::Primary,
                AxfrPolicy::Deny,
            )
            .map_err(|e| crate::refused!("zone {origin}: {e}"))?;
            catalog.upsert(LowerName::from(&origin), vec![Arc::new(handler)]);
        }
        // One port for UDP and TCP: take a free UDP port, then the same for TCP.
        for _ in 0..16 {
            let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .context("binding the static zone server")?;
            // The gateway forwards a burst of clients' queries here as fast as they come (a
            // load generator catching up, clients retrying at once): the listeners' receive
            // buffer, not the default ~200 KiB that holds a few hundred. Best effort (capped
            // by net.core.rmem_max).
            let _ =
                nix::sys::socket::setsockopt(&udp, nix::sys::socket::sockopt::RcvBuf, &(4 << 20));
            let addr = udp.local_addr()?;
            let Ok(tcp) = TcpListener::bind(addr).await else {
                continue;
            };
            let mut server = Server::new(catalog);
            server.register_socket(udp);
            server.register_listener(tcp, std::time::Duration::from_secs(5), 65_535);
            return Ok(Self { addr, server });
        }
        bail!("no loopback port was free for UDP and TCP at once")
    }

    /// Stops serving.
    pub(super) async fn stop(mut self) {
        if let Err(e) = self.server.shutdown_gracefully().await {
            tracing::debug!(error = %e, "static zone server stopped");
        }
    }
}
