//! The encrypted listeners: DNS over TLS (RFC 7858) and DNS over HTTPS (RFC 8484). A query
//! that comes by either meets exactly what a UDP or TCP query meets (the same
//! [`Shared::handle_query`]: client group, policy, rate limit, answer cache, the hold); only
//! the framing differs.
//!
//! What keeps a hostile client bounded, each case counted in
//! `fqdnd_dns_encrypted_errors_total{transport, reason}`:
//! - connections: at most `max_connections` open over every encrypted listener, and
//!   `max_connections_per_client` per client address; past either, a new one is closed at once;
//! - the TLS handshake must end within `handshake_timeout` (garbage instead of a hello fails
//!   it at once);
//! - a connection without a query for `idle_timeout`, and none in flight, is closed;
//! - DoT: RFC 7766 framing and pipelining, as a TCP client ([`crate::listen::serve_stream`]);
//! - DoH: [`doh`]'s limits (streams, header sizes, bodies, HTTP/2 resets).
//!
//! The certificate and key come from the caller as a [`TlsCertificates`], which it may replace
//! while the proxy runs (a reload): connections made after that get the new one.

mod doh;
mod slots;

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::error::Error;
use crate::listen::{is_fd_exhausted, reserve_fd, serve_stream, shed_one};
use crate::policy::Transport;
use crate::proxy::{ERROR_PAUSE, Shared};

pub(crate) use slots::Slots;

/// Why an encrypted connection (or one DoH request) was turned away or cut short; the `reason`
/// label of `fqdnd_dns_encrypted_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EncryptedError {
    /// `max_connections` were open.
    MaxConnections,
    /// `max_connections_per_client` were open from the client's address.
    MaxConnectionsPerClient,
    /// The TLS handshake did not end within `handshake_timeout`.
    HandshakeTimeout,
    /// The TLS handshake failed (not TLS, no common version or cipher, an ALPN the listener
    /// does not speak, …).
    HandshakeFailed,
    /// An HTTP protocol error ended a DoH connection (malformed frames, too many HTTP/2
    /// streams reset, headers over the limit, …).
    Http,
    /// A DoH request that is not a DNS query (wrong path or method or media type, bad
    /// `dns` parameter, a message shorter than a header): a 4xx answer.
    BadRequest,
    /// A DoH request body over 65,535 bytes: 413.
    TooLarge,
}

impl EncryptedError {
    /// Every reason, in declaration order.
    pub const ALL: [Self; 7] = [
        Self::MaxConnections,
        Self::MaxConnectionsPerClient,
        Self::HandshakeTimeout,
        Self::HandshakeFailed,
        Self::Http,
        Self::BadRequest,
        Self::TooLarge,
    ];

    /// The `reason` label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MaxConnections => "max_connections",
            Self::MaxConnectionsPerClient => "max_connections_per_client",
            Self::HandshakeTimeout => "handshake_timeout",
            Self::HandshakeFailed => "handshake_failed",
            Self::Http => "http_error",
            Self::BadRequest => "bad_request",
            Self::TooLarge => "too_large",
        }
    }
}

/// The certificate chain and key the encrypted listeners present; [`TlsCertificates::replace`]
/// swaps them while the proxy runs (the next handshake gets the new pair).
#[derive(Debug)]
pub struct TlsCertificates {
    current: RwLock<Arc<CertifiedKey>>,
}

impl TlsCertificates {
    /// Presents `key` (a chain whose first certificate is the server's, and its signing key).
    pub fn new(key: CertifiedKey) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(Arc::new(key)),
        })
    }

    /// Presents `key` from now on.
    pub fn replace(&self, key: CertifiedKey) {
        if let Ok(mut current) = self.current.write() {
            *current = Arc::new(key);
        }
    }

    /// The pair presented now.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|k| k.clone())
    }
}

impl ResolvesServerCert for TlsCertificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

/// The encrypted listeners' settings.
#[derive(Debug, Clone)]
pub struct EncryptedConfig {
    /// Addresses to serve DNS over TLS on (usually port 853).
    pub listen_dot: Vec<SocketAddr>,
    /// Addresses to serve DNS over HTTPS on (usually port 443).
    pub listen_doh: Vec<SocketAddr>,
    /// The DoH path (`/dns-query` by default); other paths get 404.
    pub doh_path: String,
    /// The certificate and key, replaceable while running.
    pub certificates: Arc<TlsCertificates>,
    /// A TLS handshake not finished in this time closes the connection.
    pub handshake_timeout: Duration,
    /// A connection without a query this long, with none in flight, is closed.
    pub idle_timeout: Duration,
    /// Encrypted connections open at once (DoT and DoH together); past it new ones are closed.
    pub max_connections: usize,
    /// Encrypted connections open at once from one client address.
    pub max_connections_per_client: usize,
    /// HTTP/2 streams (DoH queries) one connection may have open at once.
    pub max_streams: u32,
}

impl EncryptedConfig {
    /// The defaults around `certificates`: no listener yet, `/dns-query`, a 5 s handshake,
    /// 30 s idle, 2,048 connections, 64 per client, 128 streams.
    pub fn new(certificates: Arc<TlsCertificates>) -> Self {
        Self {
            listen_dot: Vec::new(),
            listen_doh: Vec::new(),
            doh_path: "/dns-query".to_owned(),
            certificates,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            max_connections: 2048,
            max_connections_per_client: 64,
            max_streams: 128,
        }
    }
}

impl PartialEq for EncryptedConfig {
    fn eq(&self, other: &Self) -> bool {
        self.listen_dot == other.listen_dot
            && self.listen_doh == other.listen_doh
            && self.doh_path == other.doh_path
            && Arc::ptr_eq(&self.certificates, &other.certificates)
            && self.handshake_timeout == other.handshake_timeout
            && self.idle_timeout == other.idle_timeout
            && self.max_connections == other.max_connections
            && self.max_connections_per_client == other.max_connections_per_client
            && self.max_streams == other.max_streams
    }
}

impl Eq for EncryptedConfig {}

/// Why the settings cannot serve, for `validate`.
pub(crate) fn invalid(config: &EncryptedConfig) -> Option<&'static str> {
    if config.listen_dot.is_empty() && config.listen_doh.is_empty() {
        return Some("encrypted listeners configured without a DoT or DoH address");
    }
    if !config.doh_path.starts_with('/') {
        return Some("the DoH path must start with `/`");
    }
    if config.handshake_timeout.is_zero() || config.idle_timeout.is_zero() {
        return Some("the encrypted listeners' handshake and idle timeouts must be positive");
    }
    if config.max_connections == 0
        || config.max_connections_per_client == 0
        || config.max_streams == 0
    {
        return Some("the encrypted listeners' connection and stream limits must be at least 1");
    }
    None
}

/// The TLS acceptor of a listener of `transport`: TLS 1.2 and 1.3 only, ring's ciphers, the
/// ALPN protocols it speaks (`dot`; `h2` then `http/1.1`).
pub(crate) fn acceptor(
    certificates: &Arc<TlsCertificates>,
    transport: Transport,
) -> Result<TlsAcceptor, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| Error::InvalidConfig {
            reason: format!("TLS settings: {e}"),
        })?
        .with_no_client_auth()
        .with_cert_resolver(certificates.clone());
    config.alpn_protocols = match transport {
        Transport::Doh => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        _ => vec![b"dot".to_vec()],
    };
    // Stateless session tickets: a client that reconnects skips the full handshake.
    if let Ok(ticketer) = rustls::crypto::ring::Ticketer::new() {
        config.ticketer = ticketer;
    }
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// One bound encrypted listener.
pub(crate) struct Listener {
    pub(crate) socket: TcpListener,
    pub(crate) local: SocketAddr,
    pub(crate) transport: Transport,
    pub(crate) acceptor: TlsAcceptor,
}

/// Accepts clients of one encrypted listener, within the connection limits; each connection
/// does its handshake and is served in a task of its own.
pub(crate) async fn accept_loop(
    shared: Arc<Shared>,
    listener: Listener,
    slots: Arc<Slots>,
) -> Result<(), Error> {
    let Listener {
        socket,
        local,
        transport,
        acceptor,
    } = listener;
    let mut connections = JoinSet::new();
    let mut spare = reserve_fd();
    loop {
        let (stream, peer) = match socket.accept().await {
            Ok(accepted) => accepted,
            Err(e) if is_fd_exhausted(&e) => {
                shed_one(&shared, &socket, local, &mut spare, &e).await;
                continue;
            }
            Err(e) => {
                tracing::warn!(addr = %local, %transport, error = %e, "DNS accept failed");
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        if spare.is_none() {
            spare = reserve_fd();
        }
        while connections.try_join_next().is_some() {}
        let slot = match slots.take(peer.ip()) {
            Ok(slot) => slot,
            Err(reason) => {
                shared.metrics.encrypted_error(transport, reason);
                tracing::debug!(client = %peer, %transport, reason = reason.as_str(), "encrypted DNS connection refused");
                drop(stream);
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let shared = shared.clone();
        connections.spawn(async move {
            connection(&shared, stream, peer, local, transport, &acceptor).await;
            drop(slot);
        });
    }
}

/// One encrypted client: the handshake (bounded in time), then DoT or DoH.
async fn connection(
    shared: &Arc<Shared>,
    stream: TcpStream,
    client: SocketAddr,
    listen: SocketAddr,
    transport: Transport,
    acceptor: &TlsAcceptor,
) {
    let Some(config) = shared.config.encrypted.as_ref() else {
        return;
    };
    let server = stream.local_addr().unwrap_or(listen);
    let _ = stream.set_nodelay(true);
    let tls = match tokio::time::timeout(config.handshake_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            shared
                .metrics
                .encrypted_error(transport, EncryptedError::HandshakeFailed);
            tracing::debug!(%client, %transport, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            shared
                .metrics
                .encrypted_error(transport, EncryptedError::HandshakeTimeout);
            tracing::debug!(%client, %transport, "TLS handshake timed out");
            return;
        }
    };
    let _open = shared.metrics.encrypted_open(transport);
    match transport {
        Transport::Doh => doh::serve(shared, tls, client, server, config).await,
        _ => serve_stream(shared, tls, client, server, transport, config.idle_timeout).await,
    }
}
