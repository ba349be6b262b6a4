//! The proxy's metrics (counters and gauges through the `metrics` facade; the latency summaries
//! its own, rendered by [`render_summaries`]) and the counters behind
//! [`crate::DnsProxy::stats`].
//!
//! Every handle is registered once when the proxy binds, so a query costs a few atomic adds and
//! no string formatting. Install the recorder (the binary's Prometheus exporter) before
//! [`crate::DnsProxy::bind`]: handles taken before that are no-ops.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge, Unit};

use crate::encrypted::EncryptedError;
use crate::latency::LatencySet;
pub use crate::latency::render_summaries;
use crate::policy::Transport;
use crate::querylog::QueryResult;

/// Queries by how they ended (`result` label: [`QueryResult::as_str`]).
pub const QUERIES: &str = "fqdnd_dns_queries_total";
/// Time from forwarding a query to its validated answer, seconds.
pub const UPSTREAM_LATENCY: &str = "fqdnd_dns_upstream_latency_seconds";
/// Time from a validated answer to the reply leaving, seconds (the hold for the observer).
pub const HOLD: &str = "fqdnd_dns_hold_seconds";
/// Time the observer took, seconds.
pub const OBSERVER: &str = "fqdnd_dns_observer_seconds";
/// Client messages dropped before they count as queries (`reason` label: `runt`, shorter
/// than a DNS header: no reply over UDP, the connection closed over TCP).
pub const DROPPED_QUERIES: &str = "fqdnd_dns_dropped_queries_total";
/// Upstream answers dropped by validation (`reason` label: [`DropReason::as_str`]).
pub const DROPPED_ANSWERS: &str = "fqdnd_dns_dropped_answers_total";
/// Queries answered SERVFAIL because the concurrency limit was reached.
pub const CONCURRENCY_LIMITED: &str = "fqdnd_dns_concurrency_limited_total";
/// Queries forwarded and not yet finished (sampled by the timeout sweep).
pub const INFLIGHT: &str = "fqdnd_dns_inflight";
/// 1 while an upstream is considered alive (`upstream` label: its address).
pub const UPSTREAM_UP: &str = "fqdnd_dns_upstream_up";
/// Connections opened to an encrypted (DoT, DoH) upstream (`upstream` label: as configured,
/// e.g. `tls://192.0.2.1:853#dns.example`; `result` label: `ok`, or `failed` when the TCP
/// connection, the TLS handshake (a certificate that does not verify) or HTTP/2 failed).
pub const UPSTREAM_CONNECTIONS: &str = "fqdnd_dns_upstream_connections_total";
/// Held answers whose observer did not finish in time or failed (`reason` label: `timeout`,
/// `observer_error`), whatever the fallback.
pub const HOLD_FALLBACKS: &str = "fqdnd_dns_hold_fallbacks_total";
/// TCP client connections closed at once (`reason` label: `max_connections` when
/// `max_tcp_connections` were open, `fd_exhausted` when the process had no file descriptor
/// left to accept it with).
pub const TCP_REFUSED: &str = "fqdnd_dns_tcp_connections_refused_total";
/// Upstream sockets replaced by one on a fresh port (`upstream_socket_max_queries` / `_age`).
pub const UPSTREAM_SOCKET_ROTATIONS: &str = "fqdnd_dns_upstream_socket_rotations_total";
/// Rotations that failed to open the new socket (the old one stays in service).
pub const UPSTREAM_SOCKET_ROTATION_FAILURES: &str =
    "fqdnd_dns_upstream_socket_rotation_failures_total";
/// UDP replies sent through the transparent mode's raw socket (from the original destination).
pub const RAW_REPLIES: &str = "fqdnd_dns_raw_replies_total";
/// UDP replies the raw socket failed to send.
pub const RAW_REPLY_ERRORS: &str = "fqdnd_dns_raw_reply_errors_total";
/// Queries answered SERVFAIL because `max_original_destinations` upstreams were open.
pub const ORIGINAL_DESTINATION_OVERFLOW: &str = "fqdnd_dns_original_destination_overflow_total";
/// Original destinations forwarded to (upstreams opened on first use).
pub const ORIGINAL_DESTINATIONS: &str = "fqdnd_dns_original_destinations";

/// Queries by the transport they came by (`transport` label: `udp`, `tcp`, `dot`, `doh`).
pub const TRANSPORT_QUERIES: &str = "fqdnd_dns_queries_by_transport_total";
/// Encrypted client connections whose TLS handshake succeeded (`transport`: `dot`, `doh`).
pub const ENCRYPTED_CONNECTIONS: &str = "fqdnd_dns_encrypted_connections_total";
/// Encrypted client connections open now (`transport`).
pub const ENCRYPTED_OPEN: &str = "fqdnd_dns_encrypted_connections_open";
/// Encrypted connections or DoH requests turned away or cut short (`transport`, `reason`:
/// [`crate::EncryptedError::as_str`]).
pub const ENCRYPTED_ERRORS: &str = "fqdnd_dns_encrypted_errors_total";

/// Allowed queries answered from the answer cache (gateway, `cache` on).
pub const CACHE_HITS: &str = "fqdnd_answer_cache_hits_total";
/// Allowed queries the answer cache could not answer (forwarded).
pub const CACHE_MISSES: &str = "fqdnd_answer_cache_misses_total";
/// Answers stored in the answer cache.
pub const CACHE_INSERTS: &str = "fqdnd_answer_cache_inserts_total";
/// Entries pushed out of the answer cache to make room (`max_entries`).
pub const CACHE_EVICTIONS: &str = "fqdnd_answer_cache_evictions_total";
/// Entries found expired on lookup and dropped.
pub const CACHE_EXPIRED: &str = "fqdnd_answer_cache_expired_total";
/// Entries in the answer cache (sampled on insert and expiry).
pub const CACHE_ENTRIES: &str = "fqdnd_answer_cache_entries";

/// What a series is, as Prometheus types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (restarts from zero with the process).
    Counter,
    /// Goes up and down.
    Gauge,
    /// A latency distribution, rendered as a summary by the proxy itself
    /// ([`render_summaries`]), not through the facade.
    Summary,
}

/// One series of a catalogue: its name, kind, unit and description, written once.
#[derive(Debug, Clone, Copy)]
pub struct Series {
    /// The name (one of this module's constants).
    pub name: &'static str,
    /// Counter, gauge or summary.
    pub kind: Kind,
    /// Its unit, when it has one.
    pub unit: Option<Unit>,
    /// What it counts.
    pub help: &'static str,
}

impl Series {
    /// A series of a catalogue.
    pub const fn new(
        name: &'static str,
        kind: Kind,
        unit: Option<Unit>,
        help: &'static str,
    ) -> Self {
        Self {
            name,
            kind,
            unit,
            help,
        }
    }
}

/// A count of things.
pub const COUNT: Option<Unit> = Some(Unit::Count);
/// Seconds.
pub const SECONDS: Option<Unit> = Some(Unit::Seconds);
/// Bytes.
pub const BYTES: Option<Unit> = Some(Unit::Bytes);

const fn series(name: &'static str, kind: Kind, unit: Option<Unit>, help: &'static str) -> Series {
    Series::new(name, kind, unit, help)
}

/// The proxy's series.
pub const SERIES: &[Series] = &[
    series(
        QUERIES,
        Kind::Counter,
        COUNT,
        "DNS queries by how they ended",
    ),
    series(
        UPSTREAM_LATENCY,
        Kind::Summary,
        SECONDS,
        "time from forwarding a query to its validated upstream answer",
    ),
    series(
        HOLD,
        Kind::Summary,
        SECONDS,
        "time an answer was held for the observer before the reply left",
    ),
    series(
        OBSERVER,
        Kind::Summary,
        SECONDS,
        "time the response observer took",
    ),
    series(
        DROPPED_QUERIES,
        Kind::Counter,
        COUNT,
        "client messages dropped unanswered before they count as queries (runt: shorter than a DNS header)",
    ),
    series(
        DROPPED_ANSWERS,
        Kind::Counter,
        COUNT,
        "upstream answers dropped by validation, by reason",
    ),
    series(
        CONCURRENCY_LIMITED,
        Kind::Counter,
        COUNT,
        "queries answered SERVFAIL past the concurrency limit",
    ),
    series(
        INFLIGHT,
        Kind::Gauge,
        COUNT,
        "queries forwarded and not yet finished",
    ),
    series(
        UPSTREAM_UP,
        Kind::Gauge,
        None,
        "1 while the upstream is considered alive",
    ),
    series(
        UPSTREAM_CONNECTIONS,
        Kind::Counter,
        COUNT,
        "connections opened to an encrypted (DoT, DoH) upstream, by result",
    ),
    series(
        HOLD_FALLBACKS,
        Kind::Counter,
        COUNT,
        "held answers whose observer timed out or failed",
    ),
    series(
        TCP_REFUSED,
        Kind::Counter,
        COUNT,
        "TCP client connections closed at once: too many open, or no file descriptor left",
    ),
    series(
        UPSTREAM_SOCKET_ROTATIONS,
        Kind::Counter,
        COUNT,
        "upstream UDP sockets replaced by one on a fresh port",
    ),
    series(
        UPSTREAM_SOCKET_ROTATION_FAILURES,
        Kind::Counter,
        COUNT,
        "upstream socket rotations that could not open the new socket",
    ),
    series(
        RAW_REPLIES,
        Kind::Counter,
        COUNT,
        "UDP replies sent from the original destination through the raw socket",
    ),
    series(
        RAW_REPLY_ERRORS,
        Kind::Counter,
        COUNT,
        "UDP replies the raw socket failed to send",
    ),
    series(
        ORIGINAL_DESTINATION_OVERFLOW,
        Kind::Counter,
        COUNT,
        "queries answered SERVFAIL because too many original destinations were open",
    ),
    series(
        ORIGINAL_DESTINATIONS,
        Kind::Gauge,
        COUNT,
        "original destinations with an upstream opened",
    ),
    series(
        TRANSPORT_QUERIES,
        Kind::Counter,
        COUNT,
        "DNS queries by the transport they came by",
    ),
    series(
        ENCRYPTED_CONNECTIONS,
        Kind::Counter,
        COUNT,
        "DoT and DoH client connections whose TLS handshake succeeded",
    ),
    series(
        ENCRYPTED_OPEN,
        Kind::Gauge,
        COUNT,
        "DoT and DoH client connections open",
    ),
    series(
        ENCRYPTED_ERRORS,
        Kind::Counter,
        COUNT,
        "DoT and DoH connections or requests turned away or cut short, by reason",
    ),
    series(
        CACHE_HITS,
        Kind::Counter,
        COUNT,
        "allowed queries answered from the answer cache",
    ),
    series(
        CACHE_MISSES,
        Kind::Counter,
        COUNT,
        "allowed queries the answer cache could not answer",
    ),
    series(
        CACHE_INSERTS,
        Kind::Counter,
        COUNT,
        "answers stored in the answer cache",
    ),
    series(
        CACHE_EVICTIONS,
        Kind::Counter,
        COUNT,
        "answer cache entries pushed out to make room",
    ),
    series(
        CACHE_EXPIRED,
        Kind::Counter,
        COUNT,
        "answer cache entries found expired and dropped",
    ),
    series(
        CACHE_ENTRIES,
        Kind::Gauge,
        COUNT,
        "entries in the answer cache",
    ),
];

/// Describes each series of `catalogue` to the installed recorder (once, after installing it).
pub fn describe<'a>(catalogue: impl IntoIterator<Item = &'a Series>) {
    for s in catalogue {
        match (s.kind, s.unit) {
            (Kind::Counter, Some(u)) => metrics::describe_counter!(s.name, u, s.help),
            (Kind::Counter, None) => metrics::describe_counter!(s.name, s.help),
            (Kind::Gauge, Some(u)) => metrics::describe_gauge!(s.name, u, s.help),
            (Kind::Gauge, None) => metrics::describe_gauge!(s.name, s.help),
            // Rendered with their description by `render_summaries`.
            (Kind::Summary, _) => {}
        }
    }
}

/// Describes the proxy's series ([`SERIES`]); the daemon calls it after installing its
/// recorder.
pub fn describe_metrics() {
    describe(SERIES);
}

/// The answer cache's metric handles.
pub(crate) fn cache_metrics() -> crate::cache::CacheMetrics {
    crate::cache::CacheMetrics {
        hits: metrics::counter!(CACHE_HITS),
        misses: metrics::counter!(CACHE_MISSES),
        inserts: metrics::counter!(CACHE_INSERTS),
        evictions: metrics::counter!(CACHE_EVICTIONS),
        expired: metrics::counter!(CACHE_EXPIRED),
        entries: metrics::gauge!(CACHE_ENTRIES),
    }
}

/// Why an upstream answer was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// No query with this ID is outstanding on the socket.
    UnknownId,
    /// The query with this ID was answered already.
    Duplicate,
    /// The query with this ID timed out before the answer came.
    Late,
    /// The ID matched but the question (name, type, class) did not.
    QuestionMismatch,
    /// With `randomize_case` (0x20): the question matched but not in the case it was sent in.
    CaseMismatch,
    /// Not a well-formed DNS response.
    Malformed,
    /// From an address other than the upstream's (the connected socket should make this
    /// impossible; checked anyway).
    WrongSource,
}

impl DropReason {
    /// Every reason, in declaration order.
    pub const ALL: [Self; 7] = [
        Self::UnknownId,
        Self::Duplicate,
        Self::Late,
        Self::QuestionMismatch,
        Self::CaseMismatch,
        Self::Malformed,
        Self::WrongSource,
    ];

    /// The `reason` label.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::UnknownId => "unknown_id",
            Self::Duplicate => "duplicate",
            Self::Late => "late",
            Self::QuestionMismatch => "question_mismatch",
            Self::CaseMismatch => "case_mismatch",
            Self::Malformed => "malformed",
            Self::WrongSource => "wrong_source",
        }
    }
}

/// Why a held answer got the fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldFailure {
    /// `response_max_delay` passed.
    Timeout,
    /// The observer returned an error.
    ObserverError,
}

/// One upstream's health, as [`crate::DnsProxy::stats`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamHealth {
    /// The upstream's address.
    pub addr: SocketAddr,
    /// The upstream as configured: its address, or its `tls://` / `https://` URL.
    pub label: String,
    /// Whether queries are sent to it.
    pub alive: bool,
    /// Timeout sweeps that found its queries or probe expired since its last good answer (at
    /// most one failure per sweep).
    pub consecutive_failures: u32,
    /// Round-trip time of its last good answer.
    pub last_rtt: Option<Duration>,
}

/// A snapshot of the proxy's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyStats {
    /// Finished queries per result, in [`QueryResult::ALL`] order.
    pub queries: Vec<(QueryResult, u64)>,
    /// Dropped upstream answers per reason, in [`DropReason::ALL`] order.
    pub dropped_answers: Vec<(DropReason, u64)>,
    /// Client messages shorter than a DNS header, dropped unanswered (over TCP, the
    /// connection closed); not counted in [`ProxyStats::queries`].
    pub runt_queries: u64,
    /// Queries refused by the concurrency limit.
    pub concurrency_limited: u64,
    /// Held answers whose observer did not finish within `response_max_delay`.
    pub hold_timeouts: u64,
    /// Held answers whose observer returned an error.
    pub observer_errors: u64,
    /// Queries forwarded and not yet finished.
    pub inflight: usize,
    /// TCP client connections open.
    pub tcp_connections: usize,
    /// TCP client connections closed at once because the limit was reached.
    pub tcp_refused: u64,
    /// TCP client connections closed at once because no file descriptor was left (EMFILE /
    /// ENFILE on accept).
    pub tcp_refused_fd_exhausted: u64,
    /// Upstream sockets replaced by one on a fresh port.
    pub upstream_socket_rotations: u64,
    /// Rotations that could not open the new socket.
    pub upstream_socket_rotation_failures: u64,
    /// Every upstream, in configuration order.
    pub upstreams: Vec<UpstreamHealth>,
    /// UDP replies sent from the original destination through the raw socket (transparent
    /// mode).
    pub raw_replies: u64,
    /// UDP replies the raw socket failed to send.
    pub raw_reply_errors: u64,
    /// Queries answered SERVFAIL because `max_original_destinations` were open.
    pub original_destination_overflow: u64,
    /// Original destinations with an upstream opened (`forward_to_original_destination`).
    pub original_destinations: usize,
    /// The answer cache's counters, when it is on.
    pub cache: Option<crate::cache::CacheStats>,
    /// Queries per transport they came by, in [`Transport::ALL`] order.
    pub transports: Vec<(Transport, u64)>,
    /// DoT and DoH connections open.
    pub encrypted_connections: u64,
    /// DoT and DoH connections or requests turned away, per transport and reason (only the
    /// reasons that happened).
    pub encrypted_errors: Vec<(Transport, EncryptedError, u64)>,
    /// Samples recorded in the latency summaries since the start: upstream latency, hold,
    /// observer ([`UPSTREAM_LATENCY`], [`HOLD`], [`OBSERVER`]).
    pub latency_samples: [u64; 3],
}

impl ProxyStats {
    /// Queries that ended with `result`.
    pub fn queries(&self, result: QueryResult) -> u64 {
        self.queries
            .iter()
            .find(|(r, _)| *r == result)
            .map_or(0, |(_, n)| *n)
    }

    /// Answers dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped_answers
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n)
    }

    /// Answers dropped for any reason.
    pub fn dropped_total(&self) -> u64 {
        self.dropped_answers.iter().map(|(_, n)| n).sum()
    }

    /// Queries that came by `transport`.
    pub fn transport(&self, transport: Transport) -> u64 {
        self.transports
            .iter()
            .find(|(t, _)| *t == transport)
            .map_or(0, |(_, n)| *n)
    }

    /// Encrypted connections or requests of `transport` turned away for `reason`.
    pub fn encrypted_errors(&self, transport: Transport, reason: EncryptedError) -> u64 {
        self.encrypted_errors
            .iter()
            .find(|(t, r, _)| *t == transport && *r == reason)
            .map_or(0, |(_, _, n)| *n)
    }
}

/// A counter exported both to the recorder and to [`ProxyStats`].
pub(crate) struct Count {
    handle: Counter,
    value: AtomicU64,
}

impl Count {
    fn new(handle: Counter) -> Self {
        Self {
            handle,
            value: AtomicU64::new(0),
        }
    }

    pub(crate) fn inc(&self) {
        self.add(1);
    }

    pub(crate) fn add(&self, n: u64) {
        self.handle.increment(n);
        self.value.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// The encrypted transports, in the order of [`Metrics`]'s per-transport arrays.
const ENCRYPTED: [Transport; 2] = [Transport::Dot, Transport::Doh];

/// An encrypted connection counted open.
pub(crate) struct OpenConnection<'a> {
    metrics: &'a Metrics,
    t: usize,
}

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.metrics.encrypted_open[self.t].decrement(1.0);
        self.metrics
            .encrypted_open_now
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Every handle the proxy uses, registered once.
pub(crate) struct Metrics {
    pub(crate) queries: [Count; 10],
    pub(crate) dropped: [Count; 7],
    pub(crate) runt_queries: Count,
    pub(crate) concurrency_limited: Count,
    pub(crate) hold_timeouts: Count,
    pub(crate) observer_errors: Count,
    pub(crate) tcp_refused: Count,
    pub(crate) tcp_refused_fd_exhausted: Count,
    pub(crate) upstream_socket_rotations: Count,
    pub(crate) upstream_socket_rotation_failures: Count,
    pub(crate) raw_replies: Count,
    pub(crate) raw_reply_errors: Count,
    pub(crate) original_destination_overflow: Count,
    pub(crate) original_destinations: Gauge,
    /// Upstream latency, hold and observer time.
    pub(crate) latency: LatencySet,
    pub(crate) inflight: Gauge,
    pub(crate) transports: [Count; 4],
    /// Per encrypted transport (DoT, DoH), per [`EncryptedError::ALL`].
    pub(crate) encrypted_errors: [[Count; 7]; 2],
    pub(crate) encrypted_accepted: [Counter; 2],
    pub(crate) encrypted_open: [Gauge; 2],
    pub(crate) encrypted_open_now: AtomicU64,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Self {
            queries: QueryResult::ALL
                .map(|r| Count::new(metrics::counter!(QUERIES, "result" => r.as_str()))),
            dropped: DropReason::ALL
                .map(|r| Count::new(metrics::counter!(DROPPED_ANSWERS, "reason" => r.as_str()))),
            runt_queries: Count::new(metrics::counter!(DROPPED_QUERIES, "reason" => "runt")),
            concurrency_limited: Count::new(metrics::counter!(CONCURRENCY_LIMITED)),
            hold_timeouts: Count::new(metrics::counter!(HOLD_FALLBACKS, "reason" => "timeout")),
            observer_errors: Count::new(
                metrics::counter!(HOLD_FALLBACKS, "reason" => "observer_error"),
            ),
            tcp_refused: Count::new(metrics::counter!(TCP_REFUSED, "reason" => "max_connections")),
            tcp_refused_fd_exhausted: Count::new(
                metrics::counter!(TCP_REFUSED, "reason" => "fd_exhausted"),
            ),
            upstream_socket_rotations: Count::new(metrics::counter!(UPSTREAM_SOCKET_ROTATIONS)),
            upstream_socket_rotation_failures: Count::new(metrics::counter!(
                UPSTREAM_SOCKET_ROTATION_FAILURES
            )),
            raw_replies: Count::new(metrics::counter!(RAW_REPLIES)),
            raw_reply_errors: Count::new(metrics::counter!(RAW_REPLY_ERRORS)),
            original_destination_overflow: Count::new(metrics::counter!(
                ORIGINAL_DESTINATION_OVERFLOW
            )),
            original_destinations: metrics::gauge!(ORIGINAL_DESTINATIONS),
            latency: LatencySet::new(),
            inflight: metrics::gauge!(INFLIGHT),
            transports: Transport::ALL.map(|t| {
                Count::new(metrics::counter!(TRANSPORT_QUERIES, "transport" => t.as_str()))
            }),
            encrypted_errors: ENCRYPTED.map(|t| {
                EncryptedError::ALL.map(|r| {
                    Count::new(metrics::counter!(
                        ENCRYPTED_ERRORS, "transport" => t.as_str(), "reason" => r.as_str()
                    ))
                })
            }),
            encrypted_accepted: ENCRYPTED
                .map(|t| metrics::counter!(ENCRYPTED_CONNECTIONS, "transport" => t.as_str())),
            encrypted_open: ENCRYPTED
                .map(|t| metrics::gauge!(ENCRYPTED_OPEN, "transport" => t.as_str())),
            encrypted_open_now: AtomicU64::new(0),
        }
    }

    pub(crate) fn transport_query(&self, transport: Transport) {
        self.transports[transport as usize].inc();
    }

    pub(crate) fn encrypted_error(&self, transport: Transport, reason: EncryptedError) {
        let t = usize::from(transport == Transport::Doh);
        self.encrypted_errors[t][reason as usize].inc();
    }

    /// Counts an encrypted connection accepted and open until the guard is dropped.
    pub(crate) fn encrypted_open(&self, transport: Transport) -> OpenConnection<'_> {
        let t = usize::from(transport == Transport::Doh);
        self.encrypted_accepted[t].increment(1);
        self.encrypted_open[t].increment(1.0);
        self.encrypted_open_now.fetch_add(1, Ordering::Relaxed);
        OpenConnection { metrics: self, t }
    }

    /// The encrypted error counts that are not zero.
    pub(crate) fn encrypted_error_counts(&self) -> Vec<(Transport, EncryptedError, u64)> {
        let mut out = Vec::new();
        for (t, counts) in ENCRYPTED.iter().zip(&self.encrypted_errors) {
            for (r, count) in EncryptedError::ALL.iter().zip(counts) {
                let n = count.get();
                if n > 0 {
                    out.push((*t, *r, n));
                }
            }
        }
        out
    }

    pub(crate) fn query(&self, result: QueryResult) {
        self.queries[result.index()].inc();
    }

    /// Queries that ended together: how many per result (in [`QueryResult::ALL`]'s order) and
    /// per transport (in [`Transport::ALL`]'s).
    pub(crate) fn queries_ended(&self, results: &[u32], transports: &[u32]) {
        for (count, &n) in self.queries.iter().zip(results) {
            if n > 0 {
                count.add(u64::from(n));
            }
        }
        for (count, &n) in self.transports.iter().zip(transports) {
            if n > 0 {
                count.add(u64::from(n));
            }
        }
    }

    pub(crate) fn drop_answer(&self, reason: DropReason) {
        self.dropped[reason as usize].inc();
    }

    pub(crate) fn hold_failure(&self, failure: HoldFailure) {
        match failure {
            HoldFailure::Timeout => self.hold_timeouts.inc(),
            HoldFailure::ObserverError => self.observer_errors.inc(),
        }
    }

    /// The `fqdnd_dns_upstream_up` gauge of one upstream.
    pub(crate) fn upstream_up(upstream: &crate::UpstreamAddr) -> Gauge {
        metrics::gauge!(UPSTREAM_UP, "upstream" => upstream.to_string())
    }

    /// The `fqdnd_dns_upstream_connections_total` counters of one encrypted upstream: `ok`,
    /// `failed`.
    pub(crate) fn upstream_connections(upstream: &crate::UpstreamAddr) -> (Counter, Counter) {
        let label = upstream.to_string();
        (
            metrics::counter!(UPSTREAM_CONNECTIONS, "upstream" => label.clone(), "result" => "ok"),
            metrics::counter!(UPSTREAM_CONNECTIONS, "upstream" => label, "result" => "failed"),
        )
    }
}
