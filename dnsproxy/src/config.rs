//! The proxy's own settings, passed in at construction.

use std::net::SocketAddr;
use std::time::Duration;

/// What the proxy does when an upstream does not answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamTimeoutAction {
    /// Answer SERVFAIL, so the client gives up at once.
    #[default]
    ServFail,
    /// Send nothing, as Cilium does; the client retries on its own timer.
    NoReply,
}

/// What the proxy does when the observer has not finished within `response_max_delay`, or
/// failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HoldFallback {
    /// Release the answer anyway (Cilium's behaviour): the first packet may race the policy.
    #[default]
    Release,
    /// Answer SERVFAIL instead: nothing the datapath does not know reaches the client.
    ServFail,
}

/// What the proxy does with an upstream UDP answer that has TC=1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TruncatedAction {
    /// Ask the same upstream again over TCP, observe the full answer, then reply (truncated
    /// again if it does not fit the client's UDP size).
    #[default]
    RetryTcp,
    /// Pass the truncated answer back; the client retries over TCP itself.
    PassThrough,
}

/// The response code for a query policy denies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RejectCode {
    /// REFUSED (rcode 5), Cilium's default.
    #[default]
    Refused,
    /// NXDOMAIN (rcode 3).
    NxDomain,
}

/// What happens to a query over its client's rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateLimitAction {
    /// Drop it silently (no reply to reflect at a spoofed source).
    #[default]
    Drop,
    /// Answer REFUSED.
    Refused,
}

/// The DNS proxy's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Addresses to serve DNS over UDP on (port 0 picks a free port; see `DnsProxy::udp_addrs`).
    pub listen_udp: Vec<SocketAddr>,
    /// Addresses to serve DNS over TCP on.
    pub listen_tcp: Vec<SocketAddr>,
    /// UDP sockets per listen address, sharing the port with SO_REUSEPORT (default: half the
    /// CPUs, at least one).
    pub udp_sockets_per_address: usize,
    /// Threads that serve the UDP path (default: half the CPUs, at least one). Each waits on a
    /// share of the UDP listener sockets and upstream sockets in its own `epoll` set and runs
    /// what arrives to completion, so a query and its answer are handled on one thread without
    /// waking another. 0: the caller's runtime serves them (what tests with tokio's paused
    /// clock need).
    pub udp_threads: usize,
    /// Upstream servers, tried in order of health (the gateway's default pool). May be empty
    /// only with `forward_to_original_destination` or `zones` (names outside every zone are
    /// then REFUSED).
    /// Each plain (`192.0.2.1:53`), DNS over TLS or DNS over HTTPS ([`crate::UpstreamAddr`]).
    pub upstreams: Vec<crate::UpstreamAddr>,
    /// The PEM bundle the certificates of encrypted upstreams are verified against; `None`:
    /// the system's ([`crate::SYSTEM_CA`]). Read at bind, only if an upstream is encrypted.
    pub upstream_ca: Option<std::path::PathBuf>,
    /// Per-zone upstreams: a name in one of these zones (the longest that holds it) goes to
    /// that zone's pool instead of `upstreams`.
    pub zones: Vec<crate::ZoneUpstreams>,
    /// Long-lived UDP sockets per upstream, each on its own random source port.
    pub upstream_sockets: usize,
    /// Queries one upstream socket carries before it is replaced by a socket on a fresh
    /// ephemeral port (the old one drains its queries in flight, then closes); 0 = no bound.
    /// Between unbound's new port per query and dnsdist's fixed sockets: an off-path spoofer
    /// who learnt or guessed a port has it for at most this many queries, while a rotation
    /// costs a few system calls every few thousand queries.
    pub upstream_socket_max_queries: u64,
    /// Age after which an upstream socket is replaced by the next query that would use it;
    /// zero = no bound. Keeps the port of a quiet proxy from living for days.
    pub upstream_socket_max_age: Duration,
    /// DNS 0x20 (draft-vixie-dnsext-dns0x20): flip the case of the letters of each forwarded
    /// UDP query's name at random, drop an answer whose question does not echo that case
    /// exactly (counted as `case_mismatch`), and give the client its own spelling back. Adds
    /// one bit per letter to what a spoofer must guess. Off by default: a few upstreams do not
    /// preserve case, and their every answer would be dropped.
    pub randomize_case: bool,
    /// How long an upstream may take to answer.
    pub upstream_timeout: Duration,
    /// What to do when it does not.
    pub on_upstream_timeout: UpstreamTimeoutAction,
    /// How often a dead upstream is probed, and a live one checked when idle.
    pub health_check_interval: Duration,
    /// Consecutive failures that mark an upstream dead. A failure is a timeout sweep (every
    /// `upstream_timeout / 8`) that found queries or a probe of the upstream expired, however
    /// many; any good answer starts the count again.
    pub health_check_failures: u32,
    /// Longest time an answer is held while the observer works
    /// (Cilium `tofqdns-proxy-response-max-delay`, default 100 ms).
    pub response_max_delay: Duration,
    /// What to do past that delay, or when the observer fails.
    pub on_hold_timeout: HoldFallback,
    /// Upstream answers with TC=1.
    pub on_truncated: TruncatedAction,
    /// The answer to a denied query.
    pub reject_code: RejectCode,
    /// Queries in flight at once; 0 = no limit (Cilium `dnsproxy-concurrency-limit`). Past it,
    /// SERVFAIL.
    pub concurrency_limit: usize,
    /// Queries per second one client address may send; 0 = no limit (dnsdist's
    /// `MaxQPSIPRule`). Unknown clients are refused before this applies.
    pub rate_limit_qps: u32,
    /// Queries a client may send at once before the rate applies; 0 = `rate_limit_qps`.
    pub rate_limit_burst: u32,
    /// Client addresses tracked at most (bounded memory under floods of new sources).
    pub rate_limit_clients: usize,
    /// What happens to a query over the limit.
    pub rate_limit_action: RateLimitAction,
    /// A TCP client connection idle this long is closed.
    pub tcp_idle_timeout: Duration,
    /// TCP client connections open at once; past it new ones are refused (closed).
    pub max_tcp_connections: usize,
    /// Transparent mode (node mode, queries redirected to the listeners by the datapath): every
    /// listener gets `IP_TRANSPARENT`, a UDP query's original destination is read from
    /// `IP_RECVORIGDSTADDR` / `IPV6_RECVORIGDSTADDR` (for TCP it is the connection's local
    /// address) and becomes `QueryInfo::server`, and a UDP reply to a query whose original
    /// destination is not the listener's bound address leaves from that original destination
    /// (address and port) through a raw socket. Needs `CAP_NET_RAW` (or `CAP_NET_ADMIN` for
    /// `IP_TRANSPARENT` and `CAP_NET_RAW` for the raw socket).
    pub transparent: bool,
    /// Forward a query whose original destination is not one of the proxy's listen addresses
    /// to that destination instead of the `upstreams` pool; queries to a listen address still
    /// go to the pool (REFUSED when it is empty, never to the proxy itself). A listen address
    /// with a wildcard IP owns every destination on its port. Meaningful with `transparent`
    /// (without it every query's destination is a listen address).
    pub forward_to_original_destination: bool,
    /// Original destinations forwarded to at most (each gets `upstream_sockets` sockets, opened
    /// on first use and kept); a query to one more gets SERVFAIL and is counted
    /// (`fqdnd_dns_original_destination_overflow_total`).
    pub max_original_destinations: usize,
    /// The answer cache (see [`crate::CacheConfig`]); `None` (the default) caches nothing.
    /// Not with `forward_to_original_destination`.
    pub cache: Option<crate::CacheConfig>,
    /// DoT and DoH listeners with their certificate (see [`crate::EncryptedConfig`]); `None`
    /// (the default): none.
    pub encrypted: Option<crate::EncryptedConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen_udp: Vec::new(),
            listen_tcp: Vec::new(),
            udp_sockets_per_address: half_the_cpus(),
            udp_threads: half_the_cpus(),
            upstreams: Vec::new(),
            upstream_ca: None,
            zones: Vec::new(),
            upstream_sockets: 4,
            upstream_socket_max_queries: 4096,
            upstream_socket_max_age: Duration::from_secs(60),
            randomize_case: false,
            upstream_timeout: Duration::from_secs(5),
            on_upstream_timeout: UpstreamTimeoutAction::ServFail,
            health_check_interval: Duration::from_secs(5),
            health_check_failures: 3,
            response_max_delay: Duration::from_millis(100),
            on_hold_timeout: HoldFallback::Release,
            on_truncated: TruncatedAction::RetryTcp,
            reject_code: RejectCode::Refused,
            concurrency_limit: 0,
            rate_limit_qps: 0,
            rate_limit_burst: 0,
            rate_limit_clients: 65_536,
            rate_limit_action: RateLimitAction::Drop,
            tcp_idle_timeout: Duration::from_secs(10),
            max_tcp_connections: 1024,
            transparent: false,
            forward_to_original_destination: false,
            max_original_destinations: 64,
            cache: None,
            encrypted: None,
        }
    }
}

/// The default number of the DNS path's threads and listener sockets per address: half the
/// CPUs, at least one. Most of a query's CPU is the kernel's (the sends and receives, in the
/// thread that makes them, and the packets' processing); the other half of the machine is left
/// to that, to the upstreams and to the workloads. On the 2-vCPU test machine one thread
/// spent 15 % less CPU per query than two and answered more queries per second
/// (docs/benchmarks/dns-proxy.md, "How many threads").
fn half_the_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (usize::from(n) / 2).max(1))
}
