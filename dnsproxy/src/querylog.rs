//! One record per finished query, for an optional query log.

use std::net::SocketAddr;

use crate::policy::Transport;

/// How a query ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueryResult {
    /// Forwarded, answered, observed, released.
    Answered,
    /// Denied by policy.
    Denied,
    /// From a client in no endpoint or client group.
    UnknownClient,
    /// The upstream did not answer in time.
    UpstreamTimeout,
    /// No upstream is alive (SERVFAIL), no more original destinations may be opened
    /// (SERVFAIL), or a query to the proxy itself found no pool (REFUSED).
    NoUpstream,
    /// Over the concurrency limit.
    ConcurrencyLimited,
    /// Over the client's rate limit.
    RateLimited,
    /// The observer did not finish within `response_max_delay`: the answer was released
    /// anyway or SERVFAIL sent, per [`crate::HoldFallback`].
    HoldTimeout,
    /// The observer failed: the answer was released anyway or SERVFAIL sent, per
    /// [`crate::HoldFallback`].
    ObserverFailed,
    /// The query could not be parsed (FORMERR sent unless it claims to be a response). A
    /// message shorter than a DNS header is no query: see [`crate::ProxyStats::runt_queries`].
    Malformed,
}

impl QueryResult {
    /// Every result, in declaration order (the order of [`crate::ProxyStats::queries`]).
    pub const ALL: [Self; 10] = [
        Self::Answered,
        Self::Denied,
        Self::UnknownClient,
        Self::UpstreamTimeout,
        Self::NoUpstream,
        Self::ConcurrencyLimited,
        Self::RateLimited,
        Self::HoldTimeout,
        Self::ObserverFailed,
        Self::Malformed,
    ];

    /// The name used in logs and as the `result` label of `fqdnd_dns_queries_total`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::Denied => "denied",
            Self::UnknownClient => "unknown_client",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::NoUpstream => "no_upstream",
            Self::ConcurrencyLimited => "concurrency_limited",
            Self::RateLimited => "rate_limited",
            Self::HoldTimeout => "hold_timeout",
            Self::ObserverFailed => "observer_failed",
            Self::Malformed => "malformed",
        }
    }

    /// Position in [`Self::ALL`].
    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// One finished query.
#[derive(Debug, Clone, serde::Serialize)]
pub struct QueryLogEntry {
    /// Milliseconds since the Unix epoch when the query arrived.
    pub time_ms: u64,
    /// Client address.
    pub client: SocketAddr,
    /// Transport.
    pub transport: Transport,
    /// Question name (canonical), empty if unparsable.
    pub name: String,
    /// Question type, e.g. `A`.
    pub qtype: String,
    /// How it ended.
    pub result: QueryResult,
    /// Response code sent, e.g. `NOERROR`; empty when nothing was sent.
    pub rcode: String,
    /// Upstream that answered, if any.
    pub upstream: Option<SocketAddr>,
    /// Microseconds from the query's arrival to the reply leaving (or the end).
    pub total_us: u64,
    /// Microseconds the answer was held for the observer.
    pub hold_us: u64,
    /// Addresses in the answer.
    pub answers: usize,
}

/// Receives a record per finished query. Must not block: queue and write elsewhere.
pub trait QueryLog: Send + Sync + 'static {
    /// One query ended.
    fn record(&self, entry: QueryLogEntry);
}
