//! The proxy's [`QueryPolicy`], adapted to the engine's [`DnsPolicy`]: the policy in force is
//! swapped whole on reload; in node mode, queries to a service VIP go to one of its backends.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use fqdnd_dnsproxy::{QueryInfo, QueryPolicy, Transport, Verdict};
use fqdnd_engine::dns::{self, DnsPolicy};
use fqdnd_ipcache::policy::Protocol;
use fqdnd_lb::LoadBalancer;

/// The load balancer as the DNS proxy reads it: VIP → backend per client flow.
pub(crate) type SharedLb = Arc<RwLock<LoadBalancer>>;

/// The DNS policy the proxy consults.
#[derive(Debug, Default)]
pub(crate) struct DnsHandle {
    current: RwLock<Arc<DnsPolicy>>,
    /// Node mode: queries to a service VIP go to one of its backends.
    services: Option<SharedLb>,
}

impl DnsHandle {
    /// An empty policy (every client unknown) until the first [`DnsHandle::replace`].
    pub(crate) fn new(services: Option<SharedLb>) -> Self {
        Self {
            current: RwLock::default(),
            services,
        }
    }

    /// Installs a newly compiled policy.
    pub(crate) fn replace(&self, policy: DnsPolicy) {
        let mut current = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *current = Arc::new(policy);
    }

    /// The policy in force.
    pub(crate) fn current(&self) -> Arc<DnsPolicy> {
        self.current
            .read()
            .map(|p| Arc::clone(&p))
            .unwrap_or_default()
    }
}

impl QueryPolicy for DnsHandle {
    fn check(&self, query: &QueryInfo<'_>) -> Verdict {
        let Ok(policy) = self.current.read() else {
            return Verdict::Deny;
        };
        let protocol = match query.transport {
            Transport::Udp => Protocol::Udp,
            Transport::Tcp => Protocol::Tcp,
        };
        match policy.verdict(query.client.ip(), query.server, protocol, query.name) {
            dns::Verdict::Allow { endpoint } => Verdict::Allow {
                tag: u64::from(endpoint.0),
            },
            dns::Verdict::Deny => Verdict::Deny,
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
            Transport::Tcp => fqdnd_lb::Protocol::Tcp,
        };
        let lb = self.services.as_ref()?.read().ok()?;
        lb.backend_for_flow(server, proto, client)
    }
}
