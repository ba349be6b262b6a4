//! Encrypted upstreams: DNS over TLS ([`crate::upstream_tls`]) and DNS over HTTPS
//! ([`crate::upstream_https`]).
//!
//! An encrypted upstream is an [`crate::upstream::Upstream`] like a plain one: one in-flight
//! table (a single slot that is never rotated: its queries leave on connections, not on a
//! port of its own), the same random IDs, round robin, health and timeout sweep. Only the way
//! a query leaves and its answer comes back differ: [`Encrypted::send`] hands the query (ID
//! already written) to the upstream's transport task, which keeps its connection(s) up and
//! hands every answer back, as bytes, to the upstream's receiver in the proxy
//! (`Shared::stream_loop`), which validates and holds it exactly as it does a UDP answer.
//!
//! A connection that cannot be made (refused, timed out, a certificate that does not verify)
//! loses the queries waiting for it: they time out, so the upstream is marked dead after
//! `health_check_failures` sweeps like a plain one, and the probes bring it back. The reason
//! is logged once (a warning), again only when it changes, and the recovery once.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metrics::Counter;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::Error;

/// The trust store used when [`crate::Config::upstream_ca`] is `None`: Debian's system bundle.
pub const SYSTEM_CA: &str = "/etc/ssl/certs/ca-certificates.crt";

/// How the proxy talks to one upstream.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UpstreamProtocol {
    /// UDP, and TCP to retry a truncated answer.
    Plain,
    /// DNS over TLS (RFC 7858): pipelined queries on a long-lived connection.
    Tls {
        /// The name the certificate must carry; `None`: the IP address (an IP SAN).
        server_name: Option<String>,
    },
    /// DNS over HTTPS (RFC 8484): POST `application/dns-message` on one HTTP/2 connection,
    /// a stream per query.
    Https {
        /// The name the certificate must carry (and the request's authority); `None`: the IP
        /// address.
        server_name: Option<String>,
        /// The URL path, e.g. `/dns-query`.
        path: String,
    },
}

/// One upstream: an address and how to speak to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UpstreamAddr {
    /// Its IP address and port.
    pub addr: SocketAddr,
    /// Plain, DoT or DoH.
    pub protocol: UpstreamProtocol,
}

impl From<SocketAddr> for UpstreamAddr {
    fn from(addr: SocketAddr) -> Self {
        Self {
            addr,
            protocol: UpstreamProtocol::Plain,
        }
    }
}

impl fmt::Display for UpstreamAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |n: &Option<String>| n.as_ref().map(|n| format!("#{n}")).unwrap_or_default();
        match &self.protocol {
            UpstreamProtocol::Plain => write!(f, "{}", self.addr),
            UpstreamProtocol::Tls { server_name } => {
                write!(f, "tls://{}{}", self.addr, name(server_name))
            }
            UpstreamProtocol::Https { server_name, path } => {
                write!(f, "https://{}{path}{}", self.addr, name(server_name))
            }
        }
    }
}

impl UpstreamAddr {
    /// Whether its queries leave over TLS.
    pub fn is_encrypted(&self) -> bool {
        self.protocol != UpstreamProtocol::Plain
    }

    /// The name its certificate is verified against.
    fn server_name(&self) -> Result<ServerName<'static>, Error> {
        let name = match &self.protocol {
            UpstreamProtocol::Plain => None,
            UpstreamProtocol::Tls { server_name } | UpstreamProtocol::Https { server_name, .. } => {
                server_name.as_deref()
            }
        };
        match name {
            None => Ok(ServerName::IpAddress(self.addr.ip().into())),
            Some(name) => ServerName::try_from(name.to_owned()).map_err(|_| Error::InvalidConfig {
                reason: format!("upstream {self}: {name:?} is not a server name"),
            }),
        }
    }
}

/// A query on its way to an encrypted upstream's transport: its bytes, and whether it is
/// being sent a second time (after its connection closed unanswered; never a third).
pub(crate) struct Query {
    pub(crate) bytes: Vec<u8>,
    pub(crate) retried: bool,
}

/// The proxy's handle on an encrypted upstream's transport.
pub(crate) struct Encrypted {
    queries: mpsc::UnboundedSender<Query>,
    /// Taken by `DnsProxy::run`, which starts it.
    transport: Mutex<Option<Transport>>,
}

impl Encrypted {
    /// Queues a query (its ID written); it leaves as soon as the connection is up. If it
    /// cannot (the connection fails), it times out like an unanswered UDP query.
    pub(crate) fn send(&self, bytes: Vec<u8>) {
        // Nobody receives once the proxy stopped: the query then ends with the proxy.
        let _ = self.queries.send(Query {
            bytes,
            retried: false,
        });
    }

    /// The transport task's work, the first time it is asked for.
    pub(crate) fn take_transport(&self) -> Option<Transport> {
        self.transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Answers an encrypted upstream's transport may have handed over and the proxy not yet
/// taken: past it the transport stops reading (TCP pushes back on the server), so a server
/// that floods answers costs bounded memory.
pub(crate) const ANSWERS_QUEUED: usize = 1024;

/// What an encrypted upstream's transport task needs.
pub(crate) struct Transport {
    pub(crate) upstream: UpstreamAddr,
    pub(crate) connector: Connector,
    pub(crate) queries: mpsc::UnboundedReceiver<Query>,
    /// For queries to send again on a new connection.
    pub(crate) requeue: mpsc::UnboundedSender<Query>,
    /// How long a connection (TCP and TLS handshake) may take, and an HTTP exchange.
    pub(crate) timeout: Duration,
    pub(crate) report: Report,
}

impl Transport {
    /// Runs until the proxy stops, handing each answer's bytes to `answers`.
    pub(crate) async fn run(self, answers: mpsc::Sender<Vec<u8>>) {
        match &self.upstream.protocol {
            UpstreamProtocol::Https { .. } => crate::upstream_https::run(self, answers).await,
            _ => crate::upstream_tls::run(self, answers).await,
        }
    }

    /// Drops the queries waiting after a failed connection: they time out.
    pub(crate) fn drop_waiting(&mut self) {
        while self.queries.try_recv().is_ok() {}
    }
}

/// Opens TLS connections to one upstream, its certificate verified against the trust store.
pub(crate) struct Connector {
    addr: SocketAddr,
    server_name: ServerName<'static>,
    tls: TlsConnector,
}

impl Connector {
    /// A TCP connection, then the TLS handshake (the caller bounds the time).
    pub(crate) async fn connect(&self) -> Result<TlsStream<TcpStream>, String> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("TCP connection failed: {e}"))?;
        // Queries are small and pipelined: no Nagle delay.
        let _ = tcp.set_nodelay(true);
        self.tls
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS handshake failed: {e}"))
    }
}

/// Logs an upstream's connection failures once per reason, and counts connections.
pub(crate) struct Report {
    label: String,
    last_error: Option<String>,
    connected: Counter,
    failed: Counter,
}

impl Report {
    fn new(upstream: &UpstreamAddr) -> Self {
        let (connected, failed) = crate::metrics::Metrics::upstream_connections(upstream);
        Self {
            label: upstream.to_string(),
            last_error: None,
            connected,
            failed,
        }
    }

    pub(crate) fn connected(&mut self) {
        self.connected.increment(1);
        if self.last_error.take().is_some() {
            tracing::info!(upstream = %self.label, "connected to the encrypted DNS upstream again");
        } else {
            tracing::debug!(upstream = %self.label, "connected to the encrypted DNS upstream");
        }
    }

    pub(crate) fn failed(&mut self, error: String) {
        self.failed.increment(1);
        if self.last_error.as_ref() == Some(&error) {
            tracing::debug!(upstream = %self.label, %error, "cannot connect to the encrypted DNS upstream");
        } else {
            tracing::warn!(upstream = %self.label, %error, "cannot connect to the encrypted DNS upstream; its queries fail until it can");
            self.last_error = Some(error);
        }
    }

    /// A connection that worked ended (closed by the server, or broken).
    pub(crate) fn closed(&self, why: &str) {
        tracing::debug!(upstream = %self.label, reason = why, "encrypted DNS upstream connection closed");
    }

    pub(crate) fn label(&self) -> &str {
        &self.label
    }
}

/// The TLS client settings of every encrypted upstream of a proxy: one trust store, TLS 1.2
/// and 1.3, ALPN `h2` for DoH.
pub(crate) struct TlsConfigs {
    dot: Arc<rustls::ClientConfig>,
    doh: Arc<rustls::ClientConfig>,
}

impl TlsConfigs {
    /// Reads the trust store: `ca`, or [`SYSTEM_CA`].
    pub(crate) fn load(ca: Option<&Path>) -> Result<Self, Error> {
        Self::load_or(ca, Path::new(SYSTEM_CA))
    }

    /// [`TlsConfigs::load`] with `system` as the default store.
    fn load_or(ca: Option<&Path>, system: &Path) -> Result<Self, Error> {
        let path = ca.unwrap_or(system).to_path_buf();
        let what = if ca.is_some() {
            "upstreamCA"
        } else {
            "the system's CA bundle (the default when upstreamCA is not given; install the \
             ca-certificates package or name a PEM file in upstreamCA)"
        };
        let fail = |reason: String| Error::UpstreamCa {
            path: path.clone(),
            reason: format!("{what}: {reason}"),
        };
        let pem = std::fs::read(&path).map_err(|e| fail(e.to_string()))?;
        let roots = roots(&pem).map_err(fail)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = |alpn: &[&[u8]]| -> Result<Arc<rustls::ClientConfig>, Error> {
            let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
                .map_err(|e| fail(e.to_string()))?
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
            config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Ok(Arc::new(config))
        };
        Ok(Self {
            dot: config(&[])?,
            doh: config(&[b"h2"])?,
        })
    }

    /// The handle of `upstream` (an encrypted one), its transport waiting to be started.
    pub(crate) fn encrypted(
        &self,
        upstream: &UpstreamAddr,
        timeout: Duration,
    ) -> Result<Encrypted, Error> {
        let tls = match upstream.protocol {
            UpstreamProtocol::Https { .. } => &self.doh,
            _ => &self.dot,
        };
        let connector = Connector {
            addr: upstream.addr,
            server_name: upstream.server_name()?,
            tls: TlsConnector::from(tls.clone()),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let transport = Transport {
            upstream: upstream.clone(),
            connector,
            queries: rx,
            requeue: tx.clone(),
            timeout,
            report: Report::new(upstream),
        };
        Ok(Encrypted {
            queries: tx,
            transport: Mutex::new(Some(transport)),
        })
    }
}

/// The certificates of a PEM bundle (other PEM sections are skipped); an error if there is
/// none or one does not parse.
fn roots(pem: &[u8]) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("not a PEM bundle: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("a certificate is not usable as a trust anchor: {e}"))?;
    }
    if roots.is_empty() {
        return Err("holds no PEM certificate".to_owned());
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_label_is_what_the_configuration_says() {
        let plain = UpstreamAddr::from("192.0.2.1:53".parse::<SocketAddr>().unwrap());
        assert_eq!(plain.to_string(), "192.0.2.1:53");
        assert!(!plain.is_encrypted());
        let dot = UpstreamAddr {
            addr: "[2001:db8::1]:853".parse().unwrap(),
            protocol: UpstreamProtocol::Tls {
                server_name: Some("dns.example".into()),
            },
        };
        assert_eq!(dot.to_string(), "tls://[2001:db8::1]:853#dns.example");
        assert_eq!(
            dot.server_name().unwrap(),
            ServerName::try_from("dns.example").unwrap()
        );
        let doh = UpstreamAddr {
            addr: "192.0.2.1:443".parse().unwrap(),
            protocol: UpstreamProtocol::Https {
                server_name: None,
                path: "/dns-query".into(),
            },
        };
        assert_eq!(doh.to_string(), "https://192.0.2.1:443/dns-query");
        assert!(matches!(
            doh.server_name().unwrap(),
            ServerName::IpAddress(_)
        ));
    }

    #[test]
    fn a_trust_store_must_hold_certificates() {
        assert!(roots(b"").unwrap_err().contains("no PEM certificate"));
        assert!(roots(b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n").is_err());
        let missing = TlsConfigs::load(Some(Path::new("/nonexistent/ca.pem")))
            .err()
            .unwrap()
            .to_string();
        assert!(missing.contains("/nonexistent/ca.pem"), "{missing}");
        assert!(missing.contains("upstreamCA"), "{missing}");
        // Without `upstreamCA`, a missing system store says it is the default and what to do.
        let no_system = TlsConfigs::load_or(None, Path::new("/nonexistent/system.crt"))
            .err()
            .unwrap()
            .to_string();
        assert!(no_system.contains("/nonexistent/system.crt"), "{no_system}");
        assert!(no_system.contains("the system's CA bundle"), "{no_system}");
        assert!(no_system.contains("ca-certificates"), "{no_system}");
        // The system store of this machine (Debian's) loads.
        if Path::new(SYSTEM_CA).exists() {
            assert!(TlsConfigs::load(None).is_ok());
        }
    }
}
