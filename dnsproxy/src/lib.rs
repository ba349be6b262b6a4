//! The DNS proxy: every query from a workload passes through it, and no answer reaches the
//! workload before the rest of fqdnd has learned it.
//!
//! It owns
//! - the client-facing listeners: UDP (several SO_REUSEPORT sockets per address, each drained
//!   by its own task, its replies sent through a send-only twin that no `epoll` set watches,
//!   see `twin.rs`) and TCP (RFC 7766 framing and pipelining, idle timeout, a connection
//!   limit);
//! - the threads of the UDP path ([`Config::udp_threads`], half the CPUs by default): each
//!   waits in `epoll_wait` on its share of the UDP listener and upstream sockets and runs what
//!   arrives to completion, so a query and its answer are handled on one thread without a
//!   task wake; what must wait longer (a pending observation, a TCP retry) goes to the
//!   caller's runtime, as do TCP, DoT and DoH;
//! - the per-query policy check: the question is parsed with hickory-proto, its name made
//!   canonical, and a [`QueryPolicy`] decides (allow, deny → REFUSED/NXDOMAIN, unknown client
//!   → REFUSED);
//! - forwarding: a pool of upstreams with health checks, each with a fixed number of
//!   long-lived connected UDP sockets on kernel-chosen ephemeral ports, each replaced by one on
//!   a fresh port after `upstream_socket_max_queries` queries or `upstream_socket_max_age`
//!   (the old one drains its queries in flight, then closes), and per socket an in-flight table
//!   keyed by a random query ID. Only the two ID bytes of a query or answer are rewritten
//!   (and, with `randomize_case`, the case of the question name's letters); everything else
//!   (EDNS0, the DO bit, …) passes through untouched;
//! - encrypted upstreams ([`UpstreamAddr`]): DNS over TLS (one long-lived connection per
//!   upstream, queries pipelined on it) and DNS over HTTPS (one HTTP/2 connection, a stream
//!   per query), certificates verified against [`Config::upstream_ca`]; their queries take an
//!   ID in the upstream's in-flight table and their answers are validated, held, timed out and
//!   counted against the upstream's health exactly as UDP answers are;
//! - answer validation: the ID must be outstanding on the socket the answer came in on and the
//!   question must match (with 0x20, in the case it was sent); anything else is dropped and
//!   counted. A TC=1 answer cut mid-record is kept as its header and question;
//! - TC=1 handling (retry over TCP, or pass through) and upstream timeouts (one periodic sweep);
//! - holding each validated answer until the [`ResponseObserver`] has finished with it, at most
//!   `response_max_delay`, then the configured fallback.
//!
//! It never knows about NameManager, IpCache or endpoints (the binary implements
//! [`QueryPolicy`] and [`ResponseObserver`]), never opens a socket per UDP query (a TCP
//! connection is opened only to retry a truncated answer; an encrypted upstream's connection
//! is kept and reused), and never releases a reply before the observer finished or the
//! maximum delay passed.
//!
//! Choices where the protocol leaves room:
//! - upstreams are used round robin among the live ones (per receiving task, so tasks share no
//!   counter); a dead one gets no queries until a `. NS` probe is answered. If none is alive
//!   the query gets SERVFAIL ([`QueryResult::NoUpstream`]);
//! - an upstream is marked dead after [`Config::health_check_failures`] timeout sweeps in a
//!   row found its queries (or probe) expired with no good answer in between: one failure per
//!   sweep however many expired, so a burst of queries it ignores does not mark dead an
//!   upstream that answers the rest;
//! - TCP clients are forwarded over the same UDP upstream sockets; a TC=1 answer to a TCP
//!   client is always retried over TCP so it gets the full answer, whatever
//!   [`TruncatedAction`] says (passing TC to a TCP client would make it retry over TCP again);
//! - a failed TCP retry is answered like an upstream timeout but does not mark the upstream
//!   down (its UDP side answered);
//! - out of file descriptors, a TCP client waiting to be accepted is accepted with a
//!   descriptor kept in reserve and closed at once (counted, warned at most every 10 s), so it
//!   is not left hanging in the backlog and the accept loop does not spin; UDP goes on;
//! - after the hold fallback the observation is not cancelled: it runs to its end;
//! - a client message shorter than a DNS header (12 bytes) gets no reply (any reply would be
//!   bigger: a reflection amplifier towards a spoofed source; BIND and Unbound drop them too)
//!   and is counted as `fqdnd_dns_dropped_queries_total{reason="runt"}`, not as a query; over
//!   TCP it also ends the connection once the queries before it are answered (BIND resets
//!   it);
//! - an answer without a question is accepted only for a health probe; an answer that does
//!   not parse is dropped (counted) and the query keeps waiting for a good one or its timeout;
//! - without [`Config::transparent`], a UDP reply leaves from the listener socket the query came
//!   in on, and [`QueryInfo::server`] is that socket's bound address (bind specific addresses,
//!   not a wildcard);
//! - with [`Config::transparent`] (node mode: the datapath assigns queries to any address to
//!   the listeners), every listener has `IP_TRANSPARENT`; [`QueryInfo::server`] is the query's
//!   original destination: from `IP_RECVORIGDSTADDR` / `IPV6_RECVORIGDSTADDR` for UDP (the
//!   bound address if the kernel reported none), the accepted socket's local address for TCP.
//!   Every UDP reply (answer, REFUSED, SERVFAIL, …) to a query whose original destination is
//!   not the listener's bound address (always the case behind a wildcard listener or a
//!   redirect) leaves from that destination, address and port, through a send-only
//!   `SOCK_RAW`/`IPPROTO_RAW` socket per family with the IP and UDP headers written by the
//!   proxy: nothing to receive or filter, no control messages, only `CAP_NET_RAW`. The kernel
//!   does not fragment such packets: a reply over the route's MTU is sent again truncated
//!   (TC=1), so the client retries over TCP, whose replies come from the original destination
//!   by construction;
//! - with [`Config::forward_to_original_destination`], a query whose original destination is
//!   not one of the proxy's listen addresses (a wildcard listen address owns its port on every
//!   address) is forwarded to that destination, through upstream sockets opened on first use
//!   and kept (at most [`Config::max_original_destinations`]; past it SERVFAIL, counted as
//!   `fqdnd_dns_original_destination_overflow_total`), with the same IDs, validation, hold,
//!   TC→TCP retry and timeouts as the pool. They are not health-checked (the client chose the
//!   server; there is nothing to fail over to): a timeout is answered per
//!   [`Config::on_upstream_timeout`]. A query to the proxy's own address goes to the pool, or
//!   gets REFUSED when the pool is empty (never forwarded to the proxy itself). Both count as
//!   [`QueryResult::NoUpstream`];
//! - with a [`QueryPolicy`] that answers [`QueryPolicy::redirected`] (node mode: the cgroup
//!   socket programs rewrite a host process's DNS destination to the proxy's loopback
//!   address and record where it was going), a query is about the destination the policy
//!   names: that is [`QueryInfo::server`] (checked, forwarded to, logged) and the policy's
//!   [`QueryInfo::sender`] comes with it, while every reply still leaves from the address the
//!   query arrived at (the client's socket is connected to it; the kernel shows the client
//!   its resolver's address);
//! - the `fqdnd_dns_inflight` gauge is sampled by the timeout sweep rather than moved per
//!   query.

#![forbid(unsafe_code)]

mod answer;
mod batch;
mod cache;
mod case;
mod config;
mod encrypted;
mod error;
mod framing;
#[doc(hidden)]
pub mod fuzz;
mod ids;
mod latency;
mod listen;
pub mod metrics;
mod observer;
mod policy;
mod proxy;
mod query;
mod querylog;
mod question;
mod ratelimit;
mod record;
mod shards;
mod transparent;
mod twin;
mod udp;
mod upstream;
mod upstream_encrypted;
mod upstream_https;
mod upstream_socket;
mod upstream_tls;
mod wire;
mod zones;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use crate::cache::{CacheConfig, CacheStats};
pub use crate::metrics::{DropReason, ProxyStats, UpstreamHealth, describe_metrics};
pub use config::{
    Config, HoldFallback, RateLimitAction, RejectCode, TruncatedAction, UpstreamTimeoutAction,
};
pub use encrypted::{EncryptedConfig, EncryptedError, TlsCertificates};
pub use error::Error;
pub use observer::{Observation, ObserveError, ObserveFuture, ResponseContext, ResponseObserver};
pub use policy::{QueryInfo, QueryPolicy, Redirect, Transport, Verdict};
pub use querylog::{QueryLog, QueryLogEntry, QueryResult};
pub use record::{Direction, Recorded, Recorder};
pub use upstream_encrypted::{SYSTEM_CA, UpstreamAddr, UpstreamProtocol};
pub use zones::ZoneUpstreams;

use crate::metrics::Metrics;
use crate::proxy::{Shared, UdpListener};
use crate::ratelimit::RateLimiter;
use crate::shards::Job;
use crate::transparent::RawSender;
use crate::upstream::{NewSocket, OriginalUpstreams, Upstream};
use crate::upstream_socket::Rotation;

/// What the proxy reports beside its metrics: a record per finished query, and every message
/// as the client saw it. Both are optional and must not block.
#[derive(Clone, Default)]
pub struct Taps {
    /// One entry per finished query.
    pub query_log: Option<Arc<dyn QueryLog>>,
    /// Every query and reply, when recording is on.
    pub recorder: Option<Arc<dyn Recorder>>,
}

impl std::fmt::Debug for Taps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Taps")
            .field("query_log", &self.query_log.is_some())
            .field("recorder", &self.recorder.is_some())
            .finish()
    }
}

/// A bound DNS proxy; [`DnsProxy::run`] serves until shut down.
pub struct DnsProxy {
    shared: Arc<Shared>,
    tcp: Vec<(TcpListener, SocketAddr)>,
    /// DoT and DoH listeners.
    encrypted: Vec<encrypted::Listener>,
    /// Upstream sockets opened after bind (rotations, original destinations), whose receivers
    /// `run` starts.
    new_sockets: mpsc::UnboundedReceiver<NewSocket>,
    /// The UDP path's threads ([`Config::udp_threads`]); they stop when the proxy does.
    shard_threads: shards::ShardThreads,
}

impl std::fmt::Debug for DnsProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsProxy")
            .field("udp", &self.udp_addrs())
            .field("tcp", &self.tcp_addrs())
            .field("upstreams", &self.shared.config.upstreams)
            .finish_non_exhaustive()
    }
}

impl DnsProxy {
    /// Binds every listener and upstream socket (errors name the address). Install the
    /// metrics recorder before calling this: metric handles are taken here.
    pub async fn bind(
        config: Config,
        policy: Arc<dyn QueryPolicy>,
        observer: Arc<dyn ResponseObserver>,
        taps: Taps,
    ) -> Result<Self, Error> {
        validate(&config)?;
        let transparent = config.transparent;
        let (shards, shard_threads) =
            shards::start(config.udp_threads, &tokio::runtime::Handle::current())
                .map_err(|error| Error::Threads { error })?;
        let mut udp = Vec::new();
        for &addr in &config.listen_udp {
            // Checked before the listeners bind: they make it held.
            let twins = !transparent && twin::address_is_free(addr);
            let first = udp.len();
            let mut actual = addr;
            for _ in 0..config.udp_sockets_per_address {
                // Listener `i` is served by shard `i` (or by this runtime's reactor).
                let socket = listen::bind_udp(actual, transparent, shards.watcher())
                    .map_err(|e| e.into_error(Transport::Udp, addr))?;
                // Port 0: the first socket picks the port, the others share it.
                actual = socket.local_addr().map_err(|source| Error::Bind {
                    transport: Transport::Udp,
                    addr,
                    error: source,
                })?;
                udp.push(UdpListener {
                    socket,
                    twin: None,
                    local: actual,
                });
            }
            if twins {
                twin::add_twins(&mut udp[first..], actual);
            }
        }
        let mut tcp = Vec::new();
        for &addr in &config.listen_tcp {
            let listener = listen::bind_tcp(addr, transparent)
                .map_err(|e| e.into_error(Transport::Tcp, addr))?;
            let local = listener.local_addr().map_err(|source| Error::Bind {
                transport: Transport::Tcp,
                addr,
                error: source,
            })?;
            tcp.push((listener, local));
        }
        let mut encrypted = Vec::new();
        if let Some(e) = &config.encrypted {
            let listeners = e
                .listen_dot
                .iter()
                .map(|a| (*a, Transport::Dot))
                .chain(e.listen_doh.iter().map(|a| (*a, Transport::Doh)));
            for (addr, transport) in listeners {
                let socket =
                    listen::bind_tcp(addr, false).map_err(|err| err.into_error(transport, addr))?;
                let local = socket.local_addr().map_err(|source| Error::Bind {
                    transport,
                    addr,
                    error: source,
                })?;
                encrypted.push(encrypted::Listener {
                    socket,
                    local,
                    transport,
                    acceptor: encrypted::acceptor(&e.certificates, transport)?,
                });
            }
        }
        let raw = if transparent {
            Some(open_raw_sender(&udp)?)
        } else {
            None
        };
        let rotation = Rotation {
            max_queries: config.upstream_socket_max_queries,
            max_age: config.upstream_socket_max_age,
        };
        // The default pool first, then each zone's ([`zones::Pools`] ranges into this list).
        let pools = zones::Pools::new(config.upstreams.len(), &config.zones)?;
        let all: Vec<&UpstreamAddr> = config
            .upstreams
            .iter()
            .chain(config.zones.iter().flat_map(|z| &z.upstreams))
            .collect();
        // The trust store is read only when an upstream needs it.
        let tls = if all.iter().any(|u| u.is_encrypted()) {
            Some(upstream_encrypted::TlsConfigs::load(
                config.upstream_ca.as_deref(),
            )?)
        } else {
            None
        };
        let mut upstreams = Vec::with_capacity(all.len());
        for upstream in all {
            let up = Metrics::upstream_up(upstream);
            upstreams.push(Arc::new(match &tls {
                Some(tls) if upstream.is_encrypted() => Upstream::encrypted(
                    upstream,
                    tls.encrypted(upstream, config.upstream_timeout)?,
                    up,
                ),
                _ => Upstream::bind(
                    upstream.addr,
                    config.upstream_sockets,
                    rotation,
                    up,
                    &shards,
                )?,
            }));
        }
        let metrics = Metrics::new();
        let (new_sockets_tx, new_sockets) = mpsc::unbounded_channel();
        let originals = config.forward_to_original_destination.then(|| {
            OriginalUpstreams::new(
                config.max_original_destinations,
                config.upstream_sockets,
                rotation,
                metrics.original_destinations.clone(),
                new_sockets_tx.clone(),
                shards.clone(),
            )
        });
        let mut own: Vec<SocketAddr> = udp.iter().map(|l| l.local).collect();
        own.extend(tcp.iter().map(|(_, local)| *local));
        own.extend(encrypted.iter().map(|l| l.local));
        own.sort_unstable();
        own.dedup();
        let rate_limit = RateLimiter::new(
            config.rate_limit_qps,
            config.rate_limit_burst,
            config.rate_limit_clients,
        );
        let cache = config
            .cache
            .map(|c| cache::AnswerCache::new(c, metrics::cache_metrics()));
        let shared = Arc::new(Shared {
            cache,
            config,
            policy,
            observer,
            query_log: taps.query_log,
            recorder: taps.recorder,
            udp,
            shards,
            upstreams,
            pools,
            originals,
            raw,
            own,
            inflight: AtomicUsize::new(0),
            tcp_open: AtomicUsize::new(0),
            metrics,
            start: Instant::now(),
            rate_limit,
            new_sockets: new_sockets_tx,
            rotation_warned_ms: AtomicU64::new(0),
            fd_warned_ms: AtomicU64::new(0),
            observer_warned_ms: AtomicU64::new(0),
            hold_timeout_warned_ms: AtomicU64::new(0),
        });
        Ok(Self {
            shared,
            tcp,
            encrypted,
            new_sockets,
            shard_threads,
        })
    }

    /// The UDP addresses actually bound (port 0 resolved), one per configured address.
    pub fn udp_addrs(&self) -> Vec<SocketAddr> {
        let mut addrs: Vec<SocketAddr> = Vec::new();
        for listener in &self.shared.udp {
            if !addrs.contains(&listener.local) {
                addrs.push(listener.local);
            }
        }
        addrs
    }

    /// The TCP addresses actually bound.
    pub fn tcp_addrs(&self) -> Vec<SocketAddr> {
        self.tcp.iter().map(|(_, addr)| *addr).collect()
    }

    /// The DoT addresses actually bound.
    pub fn dot_addrs(&self) -> Vec<SocketAddr> {
        self.encrypted_addrs(Transport::Dot)
    }

    /// The DoH addresses actually bound.
    pub fn doh_addrs(&self) -> Vec<SocketAddr> {
        self.encrypted_addrs(Transport::Doh)
    }

    fn encrypted_addrs(&self, transport: Transport) -> Vec<SocketAddr> {
        self.encrypted
            .iter()
            .filter(|l| l.transport == transport)
            .map(|l| l.local)
            .collect()
    }

    /// A cheap snapshot of the counters and of each upstream's health.
    pub fn stats(&self) -> ProxyStats {
        stats(&self.shared)
    }

    /// A handle that reads [`DnsProxy::stats`] while [`DnsProxy::run`] owns the proxy.
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle {
            shared: self.shared.clone(),
        }
    }

    /// Serves until `shutdown` resolves, then stops every listener and drops the work in
    /// flight; returns once every task has stopped and the sockets are closed. Per-packet
    /// socket errors are logged and serving goes on; an error is returned only if a socket can
    /// no longer be polled or a task panics.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let Self {
            shared,
            tcp,
            encrypted,
            mut new_sockets,
            mut shard_threads,
        } = self;
        let mut tasks: JoinSet<Result<(), Error>> = JoinSet::new();
        let mut names = std::collections::HashMap::new();
        // The UDP path's sockets are served by the shard threads (or here, without shards).
        let mut shard_failures = shard_threads.failures();
        for index in 0..shared.udp.len() {
            if let Err(Job::Listener(shared, index)) = shared
                .shards
                .submit(index, Job::Listener(shared.clone(), index))
            {
                let h = tasks.spawn(listen::udp_loop(shared, index));
                names.insert(h.id(), "udp listener");
            }
        }
        for (listener, local) in tcp {
            let h = tasks.spawn(listen::tcp_accept_loop(shared.clone(), listener, local));
            names.insert(h.id(), "tcp listener");
        }
        if let Some(e) = &shared.config.encrypted {
            let slots = encrypted::Slots::new(e.max_connections, e.max_connections_per_client);
            for listener in encrypted {
                let h = tasks.spawn(encrypted::accept_loop(
                    shared.clone(),
                    listener,
                    slots.clone(),
                ));
                names.insert(h.id(), "encrypted listener");
            }
        }
        for upstream in &shared.upstreams {
            // An encrypted upstream: its transport, and the receiver of what it hands over.
            if let Some(transport) = upstream.encrypted.as_ref().and_then(|e| e.take_transport()) {
                let (answers, received) = mpsc::channel(upstream_encrypted::ANSWERS_QUEUED);
                let h = tasks.spawn(async move {
                    transport.run(answers).await;
                    Ok(())
                });
                names.insert(h.id(), UPSTREAM_RECEIVER);
                let h = tasks.spawn(shared.clone().stream_loop(upstream.clone(), received));
                names.insert(h.id(), UPSTREAM_RECEIVER);
                continue;
            }
            for si in 0..upstream.slots() {
                let job = Job::Upstream(shared.clone(), upstream.clone(), upstream.socket(si));
                serve_upstream(&shared, job, si, &mut tasks, &mut names);
            }
        }
        let sweep = shared.clone().sweep_loop();
        let h = tasks.spawn(async move {
            sweep.await;
            Ok(())
        });
        names.insert(h.id(), "timeout sweep");
        let health = shared.clone().health_loop();
        let h = tasks.spawn(async move {
            health.await;
            Ok(())
        });
        names.insert(h.id(), "health check");

        let mut shutdown = std::pin::pin!(shutdown);
        let result = loop {
            tokio::select! {
                () = &mut shutdown => break Ok(()),
                Some(done) = tasks.join_next_with_id() => match done {
                    // A retired upstream socket drained: its receiver is done.
                    Ok((id, Ok(()))) if names.remove(&id) == Some(UPSTREAM_RECEIVER) => {}
                    Ok((_, result)) => break result,
                    Err(e) => break Err(Error::TaskPanicked {
                        task: names.get(&e.id()).copied().unwrap_or("unknown"),
                        reason: e.to_string(),
                    }),
                },
                // A socket opened by a rotation or for a new original destination: its
                // receiver joins the others (and stops with them).
                Some((upstream, socket, si)) = new_sockets.recv() => {
                    let job = Job::Upstream(shared.clone(), upstream, socket);
                    serve_upstream(&shared, job, si, &mut tasks, &mut names);
                }
                // A shard thread stops on its own only when it fails.
                Some(failed) = recv_failure(&mut shard_failures) => break Err(failed),
            }
        };
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        // The shard threads stop and drop what they served.
        let _ = tokio::task::spawn_blocking(move || shard_threads.stop_and_join()).await;
        result
    }
}

/// The task name of every upstream socket's receiver.
const UPSTREAM_RECEIVER: &str = "upstream receiver";

/// Serves an upstream socket's answers (`job`): on the shard thread of its slot `si`, or as a
/// task here without shards.
fn serve_upstream(
    shared: &Shared,
    job: Job,
    si: usize,
    tasks: &mut JoinSet<Result<(), Error>>,
    names: &mut std::collections::HashMap<tokio::task::Id, &'static str>,
) {
    if let Err(Job::Upstream(shared, upstream, socket)) = shared.shards.submit(si, job) {
        let h = tasks.spawn(shared.upstream_loop(upstream, socket));
        names.insert(h.id(), UPSTREAM_RECEIVER);
    }
}

/// The next failure of a shard thread (never, without shards).
async fn recv_failure(failures: &mut Option<mpsc::UnboundedReceiver<Error>>) -> Option<Error> {
    match failures {
        Some(failures) => failures.recv().await,
        None => std::future::pending().await,
    }
}

/// Reads the proxy's counters from anywhere; see [`DnsProxy::stats_handle`].
#[derive(Clone)]
pub struct StatsHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for StatsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsHandle").finish_non_exhaustive()
    }
}

impl StatsHandle {
    /// Same as [`DnsProxy::stats`].
    pub fn stats(&self) -> ProxyStats {
        stats(&self.shared)
    }
}

fn stats(shared: &Shared) -> ProxyStats {
    let m = &shared.metrics;
    ProxyStats {
        queries: QueryResult::ALL
            .iter()
            .map(|&r| (r, m.queries[r.index()].get()))
            .collect(),
        dropped_answers: DropReason::ALL
            .iter()
            .map(|&r| (r, m.dropped[r as usize].get()))
            .collect(),
        runt_queries: m.runt_queries.get(),
        concurrency_limited: m.concurrency_limited.get(),
        hold_timeouts: m.hold_timeouts.get(),
        observer_errors: m.observer_errors.get(),
        inflight: shared.inflight.load(Ordering::Acquire),
        tcp_connections: shared.tcp_open.load(Ordering::Relaxed),
        tcp_refused: m.tcp_refused.get(),
        tcp_refused_fd_exhausted: m.tcp_refused_fd_exhausted.get(),
        upstream_socket_rotations: m.upstream_socket_rotations.get(),
        upstream_socket_rotation_failures: m.upstream_socket_rotation_failures.get(),
        upstreams: shared.upstreams.iter().map(|u| u.health()).collect(),
        raw_replies: m.raw_replies.get(),
        raw_reply_errors: m.raw_reply_errors.get(),
        original_destination_overflow: m.original_destination_overflow.get(),
        original_destinations: shared.originals.as_ref().map_or(0, OriginalUpstreams::len),
        cache: shared.cache.as_ref().map(cache::AnswerCache::stats),
        transports: Transport::ALL
            .iter()
            .map(|t| (*t, m.transports[*t as usize].get()))
            .collect(),
        encrypted_connections: m.encrypted_open_now.load(Ordering::Relaxed),
        encrypted_errors: m.encrypted_error_counts(),
        latency_samples: [
            latency::Series::Upstream,
            latency::Series::Hold,
            latency::Series::Observer,
        ]
        .map(|s| m.latency.count(s)),
    }
}

/// Opens the raw socket of each family a UDP listener has (transparent mode).
fn open_raw_sender(udp: &[UdpListener]) -> Result<RawSender, Error> {
    let open = |ipv6: bool| {
        let Some(listener) = udp.iter().find(|l| l.local.is_ipv6() == ipv6) else {
            return Ok(None);
        };
        transparent::open_raw(ipv6)
            .map(Some)
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::PermissionDenied => Error::MissingCapability {
                    what: "open the raw socket for UDP replies",
                    addr: listener.local,
                    capability: "CAP_NET_RAW",
                    error: source,
                },
                _ => Error::Bind {
                    transport: Transport::Udp,
                    addr: listener.local,
                    error: source,
                },
            })
    };
    Ok(RawSender {
        v4: open(false)?,
        v6: open(true)?,
    })
}

fn validate(config: &Config) -> Result<(), Error> {
    let invalid = |reason: &str| {
        Err(Error::InvalidConfig {
            reason: reason.to_owned(),
        })
    };
    if config.listen_udp.is_empty() && config.listen_tcp.is_empty() {
        return invalid("no listen address (listen_udp, listen_tcp)");
    }
    if config.upstreams.is_empty()
        && config.zones.is_empty()
        && !config.forward_to_original_destination
    {
        return invalid(
            "no upstream, no zone upstreams, and forward_to_original_destination is off",
        );
    }
    if config.forward_to_original_destination && config.max_original_destinations == 0 {
        return invalid(
            "max_original_destinations must be at least 1 with forward_to_original_destination",
        );
    }
    if let Some(reason) = config.encrypted.as_ref().and_then(encrypted::invalid) {
        return invalid(reason);
    }
    if config.udp_sockets_per_address == 0 {
        return invalid("udp_sockets_per_address must be at least 1");
    }
    if config.upstream_sockets == 0 {
        return invalid("upstream_sockets must be at least 1");
    }
    if config.upstream_timeout.is_zero() {
        return invalid("upstream_timeout must be positive");
    }
    if config.health_check_interval.is_zero() {
        return invalid("health_check_interval must be positive");
    }
    if config.health_check_failures == 0 {
        return invalid("health_check_failures must be at least 1");
    }
    if let Some(cache) = &config.cache {
        if config.forward_to_original_destination {
            return invalid("the answer cache cannot be used with forward_to_original_destination");
        }
        if cache.max_entries == 0 {
            return invalid("cache max_entries must be at least 1");
        }
        if cache.min_ttl > cache.max_ttl {
            return invalid("cache min_ttl must not exceed max_ttl");
        }
    }
    if config.tcp_idle_timeout.is_zero() {
        return invalid("tcp_idle_timeout must be positive");
    }
    if config.max_tcp_connections == 0 && !config.listen_tcp.is_empty() {
        return invalid("max_tcp_connections must be at least 1 when listening on TCP");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::net::UdpSocket;

    use super::*;
    use crate::proxy::{Handled, Worker};
    use crate::upstream::ReplyTo;

    /// The longest real time a step may take (generous: tests run on loaded machines).
    const PATIENCE: Duration = Duration::from_secs(60);

    struct AllowAll;

    impl QueryPolicy for AllowAll {
        fn check(&self, _: &QueryInfo<'_>) -> Verdict {
            Verdict::Allow { tag: 1 }
        }
    }

    struct Done;

    impl ResponseObserver for Done {
        fn observe(&self, _: &ResponseContext<'_>) -> Observation {
            Observation::Done(Ok(()))
        }
    }

    /// `www.example. A` with ID 0x4242 and RD=1.
    fn query() -> Vec<u8> {
        let mut q = vec![0x42, 0x42, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend_from_slice(b"\x03www\x07example\x00\x00\x01\x00\x01");
        q
    }

    fn config() -> Config {
        Config {
            listen_udp: vec!["127.0.0.1:0".parse().unwrap()],
            udp_sockets_per_address: 1,
            upstream_sockets: 1,
            forward_to_original_destination: true,
            max_original_destinations: 1,
            ..Config::default()
        }
    }

    #[test]
    fn an_empty_pool_is_valid_only_with_original_destinations() {
        assert!(validate(&config()).is_ok());
        let no_pool = Config {
            forward_to_original_destination: false,
            ..config()
        };
        assert!(matches!(
            validate(&no_pool),
            Err(Error::InvalidConfig { .. })
        ));
        let no_room = Config {
            max_original_destinations: 0,
            ..config()
        };
        assert!(matches!(
            validate(&no_room),
            Err(Error::InvalidConfig { .. })
        ));
    }

    /// A query redirected to an original destination (simulated: the destination is handed to
    /// `handle_query` as the listener would after reading it from IP_RECVORIGDSTADDR) is
    /// forwarded there through an upstream opened on first use, whose receiver `run` started;
    /// past `max_original_destinations` a new destination gets SERVFAIL and is counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn original_destinations_are_forwarded_to_and_bounded() {
        let proxy = DnsProxy::bind(
            config(),
            Arc::new(AllowAll),
            Arc::new(Done),
            Taps::default(),
        )
        .await
        .unwrap();
        let shared = proxy.shared.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(proxy.run(async move {
            let _ = stopped.await;
        }));
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let server_addr = server.local_addr().unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let client_addr = client.local_addr().unwrap();

        let ask = |server: SocketAddr| {
            let shared = shared.clone();
            async move {
                let mut w = Worker::new(0);
                let mut raw = query();
                let handled = shared
                    .handle_query(
                        &mut w,
                        &mut raw,
                        client_addr,
                        server,
                        Transport::Udp,
                        || ReplyTo::Udp {
                            listener: 0,
                            server,
                        },
                    )
                    .await;
                (handled, w.scratch)
            }
        };

        // The first destination: forwarded with a random ID, answered.
        let (handled, _) = ask(server_addr).await;
        assert_eq!(handled, Handled::Forwarded);
        let mut buf = [0u8; 512];
        let (n, from) = tokio::time::timeout(PATIENCE, server.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[2..n], &query()[2..], "only the ID is rewritten");
        let mut answer = buf[..n].to_vec();
        answer[2] |= 0x80;
        server.send_to(&answer, from).await.unwrap();
        let (n, _) = tokio::time::timeout(PATIENCE, client.recv_from(&mut buf))
            .await
            .expect("the answer reaches the client")
            .unwrap();
        assert_eq!(&buf[..2], &[0x42, 0x42], "the client's ID is restored");
        assert_eq!(buf[2] & 0x80, 0x80);
        assert_eq!(n, answer.len());

        // A second destination: over the bound.
        let other = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let (handled, reply) = ask(other.local_addr().unwrap()).await;
        assert_eq!(handled, Handled::Reply);
        assert_eq!(reply[3] & 0x0f, wire::rcode::SERVFAIL);
        assert_eq!(&reply[..2], &[0x42, 0x42]);

        // The first one still works.
        let (handled, _) = ask(server_addr).await;
        assert_eq!(handled, Handled::Forwarded);

        // The answered query is counted once its task finishes, which may be just after
        // the client got the reply: wait for it (bounded).
        for _ in 0..6000 {
            if stats(&shared).queries(QueryResult::Answered) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let stats = stats(&shared);
        assert_eq!(stats.original_destinations, 1);
        assert_eq!(stats.original_destination_overflow, 1);
        assert_eq!(stats.queries(QueryResult::NoUpstream), 1);
        assert_eq!(stats.queries(QueryResult::Answered), 1);
        assert!(stats.upstreams.is_empty());

        stop.send(()).unwrap();
        tokio::time::timeout(PATIENCE, run)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}
