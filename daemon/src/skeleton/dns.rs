//! The proxy's [`QueryPolicy`], adapted to the engine's [`DnsPolicy`]: the policy in force is
//! swapped whole on reload; in node mode, queries to a service VIP go to one of its backends,
//! and a host process's query that the cgroup socket programs redirected to the proxy's
//! loopback address is about its original destination, for the endpoint of its cgroup.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use fqdnd_dnsproxy::{QueryInfo, QueryPolicy, Redirect, Transport, Verdict};
use fqdnd_engine::dns::{self, DnsPolicy, DnsService};
use fqdnd_ipcache::EndpointId;
use fqdnd_ipcache::policy::Protocol;
use fqdnd_lb::LoadBalancer;

/// The load balancer as the DNS proxy reads it: VIP → backend per client flow.
pub type SharedLb = Arc<RwLock<LoadBalancer>>;

/// Node mode: where the cgroup socket programs send host processes' DNS, and their record
/// of each redirected socket.
#[derive(Debug)]
pub struct SocketRedirects {
    /// The kernel's records, by the client socket's address and port.
    pub origins: fqdnd_ebpf::DnsOrigins,
    /// The proxy's port (the programs send to 127.0.0.1 / ::1 on it).
    pub port: u16,
}

/// The DNS policy the proxy consults.
#[derive(Debug, Default)]
pub struct DnsHandle {
    current: RwLock<Arc<DnsPolicy>>,
    /// Node mode: queries to a service VIP go to one of its backends.
    services: Option<SharedLb>,
    /// Node mode: host processes' redirected queries.
    redirects: Option<SocketRedirects>,
}

impl DnsHandle {
    /// An empty policy (every client unknown) until the first [`DnsHandle::replace`].
    pub fn new(services: Option<SharedLb>, redirects: Option<SocketRedirects>) -> Self {
        Self {
            current: RwLock::default(),
            services,
            redirects,
        }
    }

    /// Installs a newly compiled policy.
    pub fn replace(&self, policy: DnsPolicy) {
        let mut current = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *current = Arc::new(policy);
    }

    /// The policy in force.
    pub fn current(&self) -> Arc<DnsPolicy> {
        self.current
            .read()
            .map(|p| Arc::clone(&p))
            .unwrap_or_default()
    }
}

impl QueryPolicy for DnsHandle {
    fn check(&self, query: &QueryInfo<'_>) -> Verdict {
        let policy = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // DoT and DoH are the services on TCP 853 and 443 for `toPorts`, whatever port the
        // gateway listens on (as plain DNS is port 53).
        let protocol = match query.transport {
            Transport::Udp => DnsService::Plain(Protocol::Udp),
            Transport::Tcp => DnsService::Plain(Protocol::Tcp),
            Transport::Dot => DnsService::Tls,
            Transport::Doh => DnsService::Https,
        };
        let verdict = match query.sender {
            // A host process's query: its endpoint is its cgroup's, as the kernel recorded.
            Some(sender) => policy.endpoint_verdict(
                EndpointId(u16::try_from(sender).unwrap_or(0)),
                query.server,
                protocol,
                query.name,
            ),
            None => policy.verdict(query.client.ip(), query.server, protocol, query.name),
        };
        match verdict {
            dns::Verdict::Allow { endpoint } => Verdict::Allow {
                tag: u64::from(endpoint.0),
            },
            dns::Verdict::Deny { endpoint } => Verdict::Deny {
                tag: u64::from(endpoint.0),
            },
            dns::Verdict::UnknownClient => Verdict::UnknownClient,
        }
    }

    fn forward_to(
        &self,
        client: SocketAddr,
        server: SocketAddr,
        transport: Transport,
    ) -> Option<SocketAddr> {
        let proto = match transport {
            Transport::Udp => fqdnd_lb::Protocol::Udp,
            Transport::Tcp | Transport::Dot | Transport::Doh => fqdnd_lb::Protocol::Tcp,
        };
        let lb = self.services.as_ref()?.read().ok()?;
        lb.backend_for_flow(server, proto, client)
    }

    fn redirected(
        &self,
        client: SocketAddr,
        local: SocketAddr,
        transport: Transport,
    ) -> Option<Redirect> {
        let r = self.redirects.as_ref()?;
        // The programs send to the proxy's loopback address: anything else is not theirs.
        if local.port() != r.port || !local.ip().to_canonical().is_loopback() {
            return None;
        }
        let origin = r.origins.lookup(client, transport.is_stream())?;
        Some(Redirect {
            server: origin.server,
            sender: u64::from(origin.endpoint.0),
        })
    }
}
