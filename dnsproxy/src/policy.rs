//! The question the proxy asks before forwarding a query: may this client ask this name?
//!
//! The proxy knows nothing of endpoints, selectors or policy files; the binary implements
//! [`QueryPolicy`] and answers.

use std::net::SocketAddr;

use hickory_proto::rr::RecordType;

/// How a query reached the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// DNS over UDP.
    Udp,
    /// DNS over TCP.
    Tcp,
}

impl Transport {
    /// `udp` or `tcp`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Udp => "udp",
            Self::Tcp => "tcp",
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the policy is shown about a query.
#[derive(Debug, Clone, Copy)]
pub struct QueryInfo<'a> {
    /// The client's address.
    pub client: SocketAddr,
    /// The address the client sent the query to (the listen address, or the original
    /// resolver when the query was redirected transparently).
    pub server: SocketAddr,
    /// The question's name, canonical: lowercase with a trailing dot.
    pub name: &'a str,
    /// The question's type.
    pub qtype: RecordType,
    /// UDP or TCP.
    pub transport: Transport,
}

/// The policy's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it. `tag` is handed back to the observer with the answer (the binary uses it for
    /// the endpoint or client group).
    Allow {
        /// Opaque to the proxy.
        tag: u64,
    },
    /// Answer with the configured reject code.
    Deny,
    /// The client is unknown: answer REFUSED whatever the reject code (never an open resolver).
    UnknownClient,
}

/// Decides, per query, whether it may be forwarded. Called on the hot path: keep it fast and
/// non-blocking.
pub trait QueryPolicy: Send + Sync + 'static {
    /// The verdict for one query.
    fn check(&self, query: &QueryInfo<'_>) -> Verdict;

    /// Where an allowed query to `server` (its original destination) from `client` goes
    /// instead, if anywhere: a service VIP's backend, chosen the same way for every query of
    /// one client flow. Only asked with `forward_to_original_destination`; the reply still
    /// comes from `server`. The default: nowhere else.
    fn forward_to(
        &self,
        client: SocketAddr,
        server: SocketAddr,
        transport: Transport,
    ) -> Option<SocketAddr> {
        let _ = (client, server, transport);
        None
    }
}
