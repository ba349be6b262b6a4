//! The DNS proxy: every query from a workload passes through it, and no answer reaches the
//! workload before the rest of fqdnd has learned it.
//!
//! It owns
//! - the client-facing listeners: UDP (several SO_REUSEPORT sockets per address, each drained
//!   by its own task) and TCP (RFC 7766 framing and pipelining, idle timeout, a connection
//!   limit);
//! - the per-query policy check: the question is parsed with hickory-proto, its name made
//!   canonical, and a [`QueryPolicy`] decides (allow, deny → REFUSED/NXDOMAIN, unknown client
//!   → REFUSED);
//! - forwarding: a pool of upstreams with health checks, each with a fixed set of long-lived
//!   connected UDP sockets on random ports, and per socket an in-flight table keyed by a random
//!   query ID. Only the two ID bytes of a query or answer are rewritten; everything else (EDNS0,
//!   the DO bit, …) passes through untouched;
//! - answer validation: the ID must be outstanding on the socket the answer came in on and the
//!   question must match; anything else is dropped and counted;
//! - TC=1 handling (retry over TCP, or pass through) and upstream timeouts (one periodic sweep);
//! - holding each validated answer until the [`ResponseObserver`] has finished with it, at most
//!   `response_max_delay`, then the configured fallback.
//!
//! It never knows about NameManager, IpCache or endpoints (the binary implements
//! [`QueryPolicy`] and [`ResponseObserver`]), never opens a socket per UDP query (a TCP
//! connection is opened only to retry a truncated answer), and never releases a reply before
//! the observer finished or the maximum delay passed.
//!
//! Choices where the protocol leaves room:
//! - upstreams are used round robin among the live ones (per receiving task, so tasks share no
//!   counter); a dead one gets no queries until a `. NS` probe is answered. If none is alive
//!   the query gets SERVFAIL ([`QueryResult::NoUpstream`]);
//! - TCP clients are forwarded over the same UDP upstream sockets; a TC=1 answer to a TCP
//!   client is always retried over TCP so it gets the full answer, whatever
//!   [`TruncatedAction`] says (passing TC to a TCP client would make it retry over TCP again);
//! - a failed TCP retry is answered like an upstream timeout but does not mark the upstream
//!   down (its UDP side answered);
//! - after the hold fallback the observation is not cancelled: it runs to its end;
//! - an answer without a question is accepted only for a health probe; an answer that does
//!   not parse is dropped (counted) and the query keeps waiting for a good one or its timeout;
//! - a UDP reply leaves from the listener socket the query came in on, and
//!   [`QueryInfo::server`] is that socket's bound address (bind specific addresses, not a
//!   wildcard, until the transparent mode reads the original destination);
//! - the `fqdnd_dns_inflight` gauge is sampled by the timeout sweep rather than moved per
//!   query.

#![forbid(unsafe_code)]

mod config;
mod error;
mod ids;
mod listen;
pub mod metrics;
mod observer;
mod policy;
mod proxy;
mod querylog;
mod ratelimit;
mod upstream;
mod wire;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use crate::metrics::{DropReason, ProxyStats, UpstreamHealth, describe_metrics};
pub use config::{
    Config, HoldFallback, RateLimitAction, RejectCode, TruncatedAction, UpstreamTimeoutAction,
};
pub use error::Error;
pub use observer::{Observation, ObserveError, ObserveFuture, ResponseContext, ResponseObserver};
pub use policy::{QueryInfo, QueryPolicy, Transport, Verdict};
pub use querylog::{QueryLog, QueryLogEntry, QueryResult};

use crate::metrics::Metrics;
use crate::proxy::{Shared, UdpListener};
use crate::ratelimit::RateLimiter;
use crate::upstream::Upstream;

/// A bound DNS proxy; [`DnsProxy::run`] serves until shut down.
pub struct DnsProxy {
    shared: Arc<Shared>,
    tcp: Vec<(TcpListener, SocketAddr)>,
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
        query_log: Option<Arc<dyn QueryLog>>,
    ) -> Result<Self, Error> {
        validate(&config)?;
        let mut udp = Vec::new();
        for &addr in &config.listen_udp {
            let mut actual = addr;
            for _ in 0..config.udp_sockets_per_address {
                let bind_err = |source| Error::Bind {
                    transport: Transport::Udp,
                    addr,
                    source,
                };
                let socket = listen::bind_udp(actual).map_err(bind_err)?;
                // Port 0: the first socket picks the port, the others share it.
                actual = socket.local_addr().map_err(bind_err)?;
                udp.push(UdpListener {
                    socket,
                    local: actual,
                });
            }
        }
        let mut tcp = Vec::new();
        for &addr in &config.listen_tcp {
            let bind_err = |source| Error::Bind {
                transport: Transport::Tcp,
                addr,
                source,
            };
            let listener = listen::bind_tcp(addr).map_err(bind_err)?;
            let local = listener.local_addr().map_err(bind_err)?;
            tcp.push((listener, local));
        }
        let mut upstreams = Vec::with_capacity(config.upstreams.len());
        for &addr in &config.upstreams {
            upstreams.push(Upstream::bind(
                addr,
                config.upstream_sockets,
                Metrics::upstream_up(addr),
            )?);
        }
        let rate_limit = RateLimiter::new(
            config.rate_limit_qps,
            config.rate_limit_burst,
            config.rate_limit_clients,
        );
        let shared = Arc::new(Shared {
            config,
            policy,
            observer,
            query_log,
            udp,
            upstreams,
            inflight: AtomicUsize::new(0),
            tcp_open: AtomicUsize::new(0),
            metrics: Metrics::new(),
            start: Instant::now(),
            rate_limit,
        });
        Ok(Self { shared, tcp })
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
        let Self { shared, tcp } = self;
        let mut tasks: JoinSet<Result<(), Error>> = JoinSet::new();
        let mut names = std::collections::HashMap::new();
        for index in 0..shared.udp.len() {
            let h = tasks.spawn(listen::udp_loop(shared.clone(), index));
            names.insert(h.id(), "udp listener");
        }
        for (listener, local) in tcp {
            let h = tasks.spawn(listen::tcp_accept_loop(shared.clone(), listener, local));
            names.insert(h.id(), "tcp listener");
        }
        for (ui, upstream) in shared.upstreams.iter().enumerate() {
            for si in 0..upstream.sockets.len() {
                let h = tasks.spawn(shared.clone().upstream_loop(ui, si));
                names.insert(h.id(), "upstream receiver");
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

        let result = tokio::select! {
            () = shutdown => Ok(()),
            Some(done) = tasks.join_next_with_id() => match done {
                Ok((_, result)) => result,
                Err(e) => Err(Error::TaskPanicked {
                    task: names.get(&e.id()).copied().unwrap_or("unknown"),
                    reason: e.to_string(),
                }),
            },
        };
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        result
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
        concurrency_limited: m.concurrency_limited.get(),
        hold_timeouts: m.hold_timeouts.get(),
        observer_errors: m.observer_errors.get(),
        inflight: shared.inflight.load(Ordering::Acquire),
        tcp_connections: shared.tcp_open.load(Ordering::Relaxed),
        tcp_refused: m.tcp_refused.get(),
        upstreams: shared.upstreams.iter().map(Upstream::health).collect(),
    }
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
    if config.upstreams.is_empty() {
        return invalid("no upstream");
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
    if config.tcp_idle_timeout.is_zero() {
        return invalid("tcp_idle_timeout must be positive");
    }
    if config.max_tcp_connections == 0 && !config.listen_tcp.is_empty() {
        return invalid("max_tcp_connections must be at least 1 when listening on TCP");
    }
    Ok(())
}
