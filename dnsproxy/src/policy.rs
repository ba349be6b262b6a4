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
    /// DNS over TLS (RFC 7858): TCP framing inside TLS.
    Dot,
    /// DNS over HTTPS (RFC 8484): one message per HTTP request, over TLS.
    Doh,
}

impl Transport {
    /// `udp`, `tcp`, `dot` or `doh`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Udp => "udp",
            Self::Tcp => "tcp",
            Self::Dot => "dot",
            Self::Doh => "doh",
        }
    }

    /// Whether the client's transport is a stream (TCP, TLS, HTTPS): no size limit on the
    /// reply but the 64 KiB of a DNS message, nothing to truncate.
    pub const fn is_stream(self) -> bool {
        !matches!(self, Self::Udp)
    }

    /// Every transport, in declaration order.
    pub const ALL: [Self; 4] = [Self::Udp, Self::Tcp, Self::Dot, Self::Doh];
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
    /// resolver when the query was redirected transparently or at the socket level).
    pub server: SocketAddr,
    /// Who sent the query, when a socket-level redirect named it ([`Redirect::sender`],
    /// opaque to the proxy); `None`: the client is known by its address only.
    pub sender: Option<u64>,
    /// The question's name, canonical: lowercase with a trailing dot.
    pub name: &'a str,
    /// The question's type.
    pub qtype: RecordType,
    /// UDP, TCP, DoT or DoH (the port the client asked is `server`'s).
    pub transport: Transport,
}

/// A query redirected to the proxy at the socket level (node mode: the cgroup socket programs
/// rewrite a host process's DNS destination to the proxy's loopback address): where it was
/// going, and who sent it. The reply still leaves from the address the query arrived at (the
/// client's socket is connected to it; the kernel shows the client the original address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Redirect {
    /// The destination the client asked for: the query's [`QueryInfo::server`], where it is
    /// forwarded with `forward_to_original_destination`.
    pub server: SocketAddr,
    /// Who sent it (the binary uses it for the endpoint): [`QueryInfo::sender`].
    pub sender: u64,
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
    /// Answer with the configured reject code. `tag` names who asked, as for
    /// [`Verdict::Allow`] (the recording says whose rules refused the query).
    Deny {
        /// Opaque to the proxy.
        tag: u64,
    },
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

    /// Whether the query from `client` that reached the proxy at `local` (its listener's
    /// address, or the original destination the kernel reported) was redirected to it at the
    /// socket level, and if so where it was going and who sent it. Asked for every query
    /// before [`QueryPolicy::check`]: answer fast (the default: never).
    fn redirected(
        &self,
        client: SocketAddr,
        local: SocketAddr,
        transport: Transport,
    ) -> Option<Redirect> {
        let _ = (client, local, transport);
        None
    }
}
