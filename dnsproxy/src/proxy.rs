//! The query's way through the proxy: parse, policy, forward; the answer's way back:
//! validate, observe, hold, release. Plus the timeout sweep and the health prober.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hickory_proto::op::Message;
use hickory_proto::rr::RecordType;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use crate::answer::{self, Validated};
use crate::case;
use crate::config::{
    Config, HoldFallback, RateLimitAction, RejectCode, TruncatedAction, UpstreamTimeoutAction,
};
use crate::ids::IdSource;
use crate::metrics::{DropReason, HoldFailure, Metrics};
use crate::observer::{Observation, ObserveFuture, ResponseContext, ResponseObserver};
use crate::policy::{QueryInfo, QueryPolicy, Transport, Verdict};
use crate::query::{self, ParsedQuery};
use crate::querylog::{QueryLog, QueryLogEntry, QueryResult};
use crate::ratelimit::RateLimiter;
use crate::transparent::{self, RawSender};
use crate::upstream::{Asked, NewSocket, OpenError, Origin, OriginalUpstreams, ReplyTo, Upstream};
use crate::upstream_socket::{Inflight, UpstreamSocket};
use crate::wire::{self, rcode};

/// Packets handled per readiness wake before the task yields to others on its thread.
pub(crate) const BATCH: usize = 64;

/// One UDP listener socket (several may share an address through SO_REUSEPORT).
pub(crate) struct UdpListener {
    pub(crate) socket: UdpSocket,
    pub(crate) local: SocketAddr,
}

/// State shared by every task of one proxy.
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) policy: Arc<dyn QueryPolicy>,
    pub(crate) observer: Arc<dyn ResponseObserver>,
    pub(crate) query_log: Option<Arc<dyn QueryLog>>,
    pub(crate) udp: Vec<UdpListener>,
    /// The configured pool.
    pub(crate) upstreams: Vec<Arc<Upstream>>,
    /// Upstreams for original destinations, with `forward_to_original_destination`.
    pub(crate) originals: Option<OriginalUpstreams>,
    /// The raw sockets replies from an original destination leave through (transparent mode).
    pub(crate) raw: Option<RawSender>,
    /// Every listen address actually bound (UDP and TCP): a query to one of them is the
    /// proxy's own, never forwarded to its original destination.
    pub(crate) own: Vec<SocketAddr>,
    /// Queries admitted (forwarded) and not yet finished.
    pub(crate) inflight: AtomicUsize,
    pub(crate) tcp_open: AtomicUsize,
    pub(crate) metrics: Metrics,
    pub(crate) start: Instant,
    /// Per-client token buckets, when a rate limit is configured.
    pub(crate) rate_limit: Option<RateLimiter>,
    /// Upstream sockets opened while running (rotations), whose receivers `run` starts.
    pub(crate) new_sockets: mpsc::UnboundedSender<NewSocket>,
    /// When a failed socket rotation was last logged (ms since `start`), to rate-limit it.
    pub(crate) rotation_warned_ms: AtomicU64,
    /// When running out of file descriptors on accept was last logged (ms since `start`).
    pub(crate) fd_warned_ms: AtomicU64,
}

/// A warning that may repeat (a failed rotation, an accept without file descriptors) is logged
/// at most this often.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);

/// Per-task state of a query-receiving task: no sharing, no locking.
pub(crate) struct Worker {
    ids: IdSource,
    next_upstream: usize,
    next_socket: usize,
    /// A reply the proxy wrote itself, ready to send.
    pub(crate) scratch: Vec<u8>,
}

impl Worker {
    pub(crate) fn new(seed: usize) -> Self {
        Self {
            ids: IdSource::new(),
            next_upstream: seed,
            next_socket: seed,
            scratch: Vec::new(),
        }
    }
}

/// What became of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handled {
    /// Sent upstream; the reply comes later through its [`ReplyTo`].
    Forwarded,
    /// Answered at once: the reply is in [`Worker::scratch`].
    Reply,
    /// Nothing to send.
    Dropped,
}

/// How a query ended, for metrics and the query log.
struct Outcome<'a> {
    result: QueryResult,
    rcode: Option<u16>,
    upstream: Option<SocketAddr>,
    hold: Duration,
    answer: Option<&'a Message>,
}

impl Outcome<'_> {
    fn local(result: QueryResult, rcode: Option<u8>) -> Self {
        Self {
            result,
            rcode: rcode.map(u16::from),
            upstream: None,
            hold: Duration::ZERO,
            answer: None,
        }
    }
}

/// Where an allowed query is forwarded.
enum Target {
    /// The pooled upstream with this index.
    Pool(usize),
    /// Its original destination.
    Original(Arc<Upstream>),
}

/// A validated answer on its way to the client.
struct Answer {
    origin: Origin,
    upstream: SocketAddr,
    msg: Message,
    /// Where the answer's question ends.
    question_end: usize,
    /// When it arrived.
    answered: Instant,
}

/// Sends a datagram, waiting for buffer space only if the socket is full.
pub(crate) async fn send_udp(socket: &UdpSocket, bytes: &[u8], to: SocketAddr) {
    match socket.try_send_to(bytes, to) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            if let Err(e) = socket.send_to(bytes, to).await {
                tracing::debug!(client = %to, error = %e, "DNS reply not sent");
            }
        }
        Err(e) => tracing::debug!(client = %to, error = %e, "DNS reply not sent"),
    }
}

/// Receive errors that concern one packet or an ICMP report, not the socket.
pub(crate) fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
    )
}

/// After an unexpected receive error the task logs it and pauses this long rather than stop
/// serving (or spin on an error that repeats).
pub(crate) const ERROR_PAUSE: Duration = Duration::from_millis(10);

impl Shared {
    // ---- the query's way in -------------------------------------------------------------

    /// Handles one query from a client. `raw` is the client's message; it is rewritten in place
    /// (the ID only) when forwarded. `reply` is called only when the query is forwarded.
    pub(crate) async fn handle_query(
        &self,
        w: &mut Worker,
        raw: &mut [u8],
        client: SocketAddr,
        server: SocketAddr,
        transport: Transport,
        reply: impl FnOnce() -> ReplyTo,
    ) -> Handled {
        let received = Instant::now();
        let parsed = match query::parse(raw) {
            Ok(parsed) => parsed,
            Err(not_forwarded) => {
                let code = not_forwarded.write_reply(&mut w.scratch, raw);
                self.finish(
                    client,
                    transport,
                    "",
                    not_forwarded.qtype(),
                    received,
                    Outcome::local(QueryResult::Malformed, code),
                );
                return match code {
                    Some(_) => Handled::Reply,
                    None => Handled::Dropped,
                };
            }
        };
        let ParsedQuery {
            client_id,
            opt,
            question_end,
            qtype,
            udp_limit,
            name,
        } = parsed;
        let info = QueryInfo {
            client,
            server,
            name: &name,
            qtype,
            transport,
        };
        let verdict = self.policy.check(&info);
        let limited = verdict != Verdict::UnknownClient
            && self
                .rate_limit
                .as_ref()
                .is_some_and(|limit| !limit.allow(client.ip(), received));
        let (result, code) = if limited {
            if self.config.rate_limit_action == RateLimitAction::Drop {
                let outcome = Outcome::local(QueryResult::RateLimited, None);
                self.finish(client, transport, &name, Some(qtype), received, outcome);
                return Handled::Dropped;
            }
            (QueryResult::RateLimited, rcode::REFUSED)
        } else {
            match verdict {
                Verdict::Allow { tag } => {
                    let asked = Asked {
                        client,
                        server,
                        transport,
                        client_id,
                        name,
                        qtype,
                        tag,
                        udp_limit,
                        opt,
                        received,
                    };
                    return self.forward(w, raw, question_end, asked, reply).await;
                }
                Verdict::Deny => (
                    QueryResult::Denied,
                    match self.config.reject_code {
                        RejectCode::Refused => rcode::REFUSED,
                        RejectCode::NxDomain => rcode::NXDOMAIN,
                    },
                ),
                Verdict::UnknownClient => (QueryResult::UnknownClient, rcode::REFUSED),
            }
        };
        wire::write_header_reply(
            &mut w.scratch,
            raw,
            client_id,
            Some(question_end),
            code,
            false,
            opt,
        );
        self.finish(
            client,
            transport,
            &name,
            Some(qtype),
            received,
            Outcome::local(result, Some(code)),
        );
        Handled::Reply
    }

    /// Admits an allowed query and sends it to an upstream.
    async fn forward(
        &self,
        w: &mut Worker,
        raw: &mut [u8],
        question_end: usize,
        asked: Asked,
        reply: impl FnOnce() -> ReplyTo,
    ) -> Handled {
        let limit = self.config.concurrency_limit;
        let before = self.inflight.fetch_add(1, Ordering::Relaxed);
        if limit != 0 && before >= limit {
            self.inflight.fetch_sub(1, Ordering::Relaxed);
            self.metrics.concurrency_limited.inc();
            return self.refuse_admitted(
                w,
                raw,
                question_end,
                &asked,
                QueryResult::ConcurrencyLimited,
                rcode::SERVFAIL,
            );
        }
        let original;
        let target = self
            .originals
            .as_ref()
            .and_then(|_| {
                self.policy
                    .forward_to(asked.client, asked.server, asked.transport)
            })
            .unwrap_or(asked.server);
        let upstream: &Arc<Upstream> = match self.upstream_for(w, target) {
            Ok(Target::Pool(ui)) => &self.upstreams[ui],
            Ok(Target::Original(upstream)) => {
                original = upstream;
                &original
            }
            Err(code) => {
                self.inflight.fetch_sub(1, Ordering::Relaxed);
                return self.refuse_admitted(
                    w,
                    raw,
                    question_end,
                    &asked,
                    QueryResult::NoUpstream,
                    code,
                );
            }
        };
        let n = upstream.slots();
        let first = w.next_socket;
        w.next_socket = w.next_socket.wrapping_add(1);
        let sent = asked.received;
        let mut origin = Some(Origin {
            reply: reply(),
            asked,
        });
        let chosen = (0..n).find_map(|k| {
            let si = (first + k) % n;
            self.reserve(w, upstream, si, raw, question_end, sent, &mut origin)
        });
        let Some(socket) = chosen else {
            // Every socket of the upstream holds its maximum: refuse like the concurrency limit.
            self.inflight.fetch_sub(1, Ordering::Relaxed);
            self.metrics.concurrency_limited.inc();
            let Some(Origin { asked, .. }) = origin else {
                return Handled::Dropped;
            };
            return self.refuse_admitted(
                w,
                raw,
                question_end,
                &asked,
                QueryResult::ConcurrencyLimited,
                rcode::SERVFAIL,
            );
        };
        let socket = &socket.socket;
        match socket.try_send(raw) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if let Err(e) = socket.send(raw).await {
                    tracing::debug!(upstream = %upstream.addr, error = %e, "query not sent; it will time out");
                }
            }
            // A pending ICMP error from an earlier datagram is reported once: send again.
            Err(_) => {
                if let Err(e) = socket.try_send(raw) {
                    tracing::debug!(upstream = %upstream.addr, error = %e, "query not sent; it will time out");
                }
            }
        }
        Handled::Forwarded
    }

    /// Reserves a random free ID for the query on the socket of slot `si` (rotated first if it
    /// is due), writes it into `raw` and records the query in flight; with `randomize_case`
    /// the name's case in `raw` is then randomised (the table keeps the client's bytes).
    /// `None` if that socket is full.
    #[allow(
        clippy::too_many_arguments,
        reason = "the query's parts, passed through once"
    )]
    fn reserve(
        &self,
        w: &mut Worker,
        upstream: &Arc<Upstream>,
        si: usize,
        raw: &mut [u8],
        question_end: usize,
        sent: Instant,
        origin: &mut Option<Origin>,
    ) -> Option<Arc<UpstreamSocket>> {
        // A closed socket was replaced in its slot before its receiver closed it: reading the
        // slot again gives the new one.
        for _ in 0..4 {
            let socket = self.current_socket(upstream, si, sent);
            {
                let mut table = socket.lock();
                if table.is_closed() {
                    continue;
                }
                let slot = table.insert(&mut w.ids)?;
                wire::set_id(raw, slot.id());
                let query = raw.to_vec();
                let sent_name = self
                    .config
                    .randomize_case
                    .then(|| case::randomize(raw, question_end, &mut w.ids));
                slot.fill(Inflight {
                    query,
                    question_end,
                    sent_name,
                    sent,
                    origin: origin.take(),
                });
            }
            socket.count_query();
            return Some(socket);
        }
        None
    }

    /// The socket of slot `si`, replaced first by one on a fresh port if it has carried
    /// `upstream_socket_max_queries` or is older than `upstream_socket_max_age`. If the new
    /// socket cannot be opened (no file descriptor left, …) the old one goes on serving: the
    /// failure is counted and logged at most every [`WARN_EVERY`].
    fn current_socket(
        &self,
        upstream: &Arc<Upstream>,
        si: usize,
        now: Instant,
    ) -> Arc<UpstreamSocket> {
        let socket = upstream.socket(si);
        if !socket.is_due(now) {
            return socket;
        }
        match upstream.rotate(si, &socket, now) {
            Ok(Some(fresh)) => {
                self.metrics.upstream_socket_rotations.inc();
                tracing::debug!(upstream = %upstream.addr, old_port = socket.port, new_port = fresh.port, "DNS upstream socket rotated");
                // Nobody listens once the proxy stopped; nothing is received then, as for the others.
                let _ = self.new_sockets.send((upstream.clone(), fresh.clone()));
                fresh
            }
            Ok(None) => upstream.socket(si),
            Err(e) => {
                self.metrics.upstream_socket_rotation_failures.inc();
                if self.warn_due(&self.rotation_warned_ms, now) {
                    tracing::warn!(upstream = %upstream.addr, port = socket.port, error = %e, "cannot open a new DNS upstream socket; the old one stays in use");
                }
                socket
            }
        }
    }

    /// Whether a warning last logged at `last` (ms since start) may be logged again now; if
    /// so, records now.
    pub(crate) fn warn_due(&self, last: &AtomicU64, now: Instant) -> bool {
        let now_ms = self.elapsed_ms(now).saturating_add(1);
        let before = last.load(Ordering::Relaxed);
        let every = u64::try_from(WARN_EVERY.as_millis()).unwrap_or(u64::MAX);
        (before == 0 || now_ms.saturating_sub(before) >= every)
            && last
                .compare_exchange(before, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// SERVFAIL (or REFUSED) for an allowed query that cannot be forwarded.
    fn refuse_admitted(
        &self,
        w: &mut Worker,
        raw: &[u8],
        question_end: usize,
        asked: &Asked,
        result: QueryResult,
        code: u8,
    ) -> Handled {
        wire::write_header_reply(
            &mut w.scratch,
            raw,
            asked.client_id,
            Some(question_end),
            code,
            false,
            asked.opt,
        );
        self.finish(
            asked.client,
            asked.transport,
            &asked.name,
            Some(asked.qtype),
            asked.received,
            Outcome::local(result, Some(code)),
        );
        Handled::Reply
    }

    /// Where a query to `server` goes: its original destination when that is not one of the
    /// proxy's own addresses and `forward_to_original_destination` is set, the pool otherwise.
    /// `Err` carries the reply code when it cannot go anywhere: REFUSED for a query to the
    /// proxy itself with no pool (never a loop to ourselves), SERVFAIL when no pooled upstream
    /// is alive or no more original destinations may be opened.
    fn upstream_for(&self, w: &mut Worker, server: SocketAddr) -> Result<Target, u8> {
        if let Some(originals) = &self.originals
            && !self.is_own(server)
        {
            return match originals.get_or_open(server) {
                Ok(upstream) => Ok(Target::Original(upstream)),
                Err(OpenError::Full) => {
                    self.metrics.original_destination_overflow.inc();
                    tracing::debug!(upstream = %server, max = self.config.max_original_destinations, "original destination not forwarded to: too many open");
                    Err(rcode::SERVFAIL)
                }
                Err(OpenError::Socket(e)) => {
                    tracing::warn!(error = %e, "original destination not forwarded to");
                    Err(rcode::SERVFAIL)
                }
            };
        }
        if self.upstreams.is_empty() {
            return Err(rcode::REFUSED);
        }
        self.pick_upstream(w)
            .map(Target::Pool)
            .ok_or(rcode::SERVFAIL)
    }

    /// Whether `addr` is one of the proxy's listen addresses (a wildcard one owns its port).
    pub(crate) fn is_own(&self, addr: SocketAddr) -> bool {
        self.own.iter().any(|own| {
            *own == addr
                || (own.ip().is_unspecified()
                    && own.port() == addr.port()
                    && own.is_ipv4() == addr.is_ipv4())
        })
    }

    /// Round robin over live upstreams, starting one further on each call (per task, so tasks
    /// share no counter).
    fn pick_upstream(&self, w: &mut Worker) -> Option<usize> {
        let n = self.upstreams.len();
        if n == 0 {
            return None;
        }
        let start = w.next_upstream % n;
        w.next_upstream = w.next_upstream.wrapping_add(1);
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| self.upstreams[i].is_alive())
    }

    // ---- the answer's way back ----------------------------------------------------------

    /// Receives answers on one upstream socket until it fails, or until it was retired by a
    /// rotation and its last query in flight was answered or expired: then it waits for the
    /// observations it started and returns `Ok`, closing the socket.
    pub(crate) async fn upstream_loop(
        self: Arc<Self>,
        upstream: Arc<Upstream>,
        socket: Arc<UpstreamSocket>,
    ) -> Result<(), crate::Error> {
        let mut buf = vec![0u8; 65_536];
        let mut pending = JoinSet::new();
        loop {
            tokio::select! {
                ready = socket.socket.readable() => {
                    ready.map_err(|source| crate::Error::Upstream {
                        upstream: upstream.addr,
                        source,
                    })?;
                }
                () = socket.drained.notified() => {}
            }
            let mut batch = 0;
            loop {
                match socket.socket.try_recv_from(&mut buf) {
                    Ok((n, from)) => {
                        if let Some(task) = self
                            .on_answer(&upstream, &socket, &mut buf[..n], from)
                            .await
                        {
                            pending.spawn(task);
                        }
                        batch += 1;
                        if batch == BATCH {
                            batch = 0;
                            tokio::task::yield_now().await;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // ICMP port unreachable and the like: the sweep counts the timeouts.
                    Err(e) if is_transient(&e) => {}
                    Err(e) => {
                        tracing::warn!(upstream = %upstream.addr, error = %e, "DNS upstream socket error");
                        tokio::time::sleep(ERROR_PAUSE).await;
                        break;
                    }
                }
            }
            while pending.try_join_next().is_some() {}
            if socket.close_if_drained() {
                while pending.join_next().await.is_some() {}
                tracing::debug!(upstream = %upstream.addr, port = socket.port, "retired DNS upstream socket drained and closed");
                return Ok(());
            }
        }
    }

    /// Validates one datagram from an upstream socket and replies, or returns the task that
    /// will (a pending observation or a TCP retry).
    async fn on_answer(
        self: &Arc<Self>,
        upstream: &Arc<Upstream>,
        socket: &UpstreamSocket,
        raw: &mut [u8],
        from: SocketAddr,
    ) -> Option<Slow> {
        if from != upstream.addr {
            self.dropped(DropReason::WrongSource, upstream.addr);
            return None;
        }
        let answered = Instant::now();
        let validated = answer::validate(raw, socket);
        let Validated {
            msg,
            entry,
            question_end: answer_qend,
            len,
        } = match validated {
            Ok(validated) => validated,
            Err(reason) => {
                self.dropped(reason, upstream.addr);
                return None;
            }
        };
        let raw = &mut raw[..len];
        let rtt = answered.saturating_duration_since(entry.sent);
        upstream.on_success(rtt, self.elapsed_ms(answered));
        let (Some(origin), Some(question_end)) = (entry.origin, answer_qend) else {
            upstream.probing.store(false, Ordering::Relaxed);
            return None;
        };
        self.metrics.upstream_latency.record(rtt.as_secs_f64());
        let pass_through = origin.asked.transport == Transport::Udp
            && self.config.on_truncated == TruncatedAction::PassThrough;
        if msg.metadata.truncation && !pass_through {
            return Some(Box::pin(self.clone().retry_tcp(
                upstream.clone(),
                origin,
                entry.query,
                entry.question_end,
            )));
        }
        let answer = Answer {
            origin,
            upstream: upstream.addr,
            msg,
            question_end,
            answered,
        };
        self.observe_and_reply(answer, raw).await
    }

    fn dropped(&self, reason: DropReason, upstream: SocketAddr) {
        self.metrics.drop_answer(reason);
        tracing::debug!(%upstream, reason = reason.as_str(), "DNS answer dropped");
    }

    /// Shows the answer to the observer; releases the reply at once if the observer is done,
    /// or returns the task that waits for it (at most `response_max_delay`).
    async fn observe_and_reply(self: &Arc<Self>, answer: Answer, raw: &mut [u8]) -> Option<Slow> {
        let asked = &answer.origin.asked;
        let context = ResponseContext {
            client: asked.client,
            server: asked.server,
            upstream: answer.upstream,
            tag: asked.tag,
            name: &asked.name,
            response: &answer.msg,
            transport: asked.transport,
        };
        let started = Instant::now();
        match self.observer.observe(&context) {
            Observation::Done(result) => {
                self.metrics
                    .observer
                    .record(started.elapsed().as_secs_f64());
                match result {
                    Ok(()) => self.release(answer, raw).await,
                    Err(e) => {
                        tracing::warn!(name = %answer.origin.asked.name, error = %e, "DNS observer failed");
                        self.fallback(answer, raw, HoldFailure::ObserverError).await;
                    }
                }
                None
            }
            Observation::Pending(future) => {
                let raw = raw.to_vec();
                Some(Box::pin(
                    self.clone().await_observation(answer, raw, started, future),
                ))
            }
        }
    }

    /// Waits for a pending observation, then releases the reply, or applies the fallback once
    /// `response_max_delay` has passed since the answer arrived. The observation itself is not
    /// cancelled: it runs to its end after the fallback.
    async fn await_observation(
        self: Arc<Self>,
        answer: Answer,
        mut raw: Vec<u8>,
        started: Instant,
        mut future: ObserveFuture,
    ) {
        let deadline = answer.answered + self.config.response_max_delay;
        tokio::select! {
            biased;
            result = &mut future => {
                self.metrics.observer.record(started.elapsed().as_secs_f64());
                match result {
                    Ok(()) => self.release(answer, &mut raw).await,
                    Err(e) => {
                        tracing::warn!(name = %answer.origin.asked.name, error = %e, "DNS observer failed");
                        self.fallback(answer, &mut raw, HoldFailure::ObserverError).await;
                    }
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                tracing::warn!(
                    name = %answer.origin.asked.name,
                    max_delay = ?self.config.response_max_delay,
                    "DNS observer did not finish in time"
                );
                self.fallback(answer, &mut raw, HoldFailure::Timeout).await;
                let result = future.await;
                self.metrics.observer.record(started.elapsed().as_secs_f64());
                if let Err(e) = result {
                    tracing::warn!(error = %e, "DNS observer failed after the hold timed out");
                }
            }
        }
    }

    /// Sends the upstream's answer to the client with the client's ID (truncated for a UDP
    /// client whose payload size it exceeds).
    async fn release(&self, answer: Answer, raw: &mut [u8]) {
        let Answer {
            origin: Origin { reply, asked },
            upstream,
            msg,
            question_end,
            answered,
        } = answer;
        let code = u16::from(msg.metadata.response_code);
        match reply {
            ReplyTo::Udp { listener, server } => {
                let mut out = Vec::new();
                let reply = answer::fit_udp(
                    raw,
                    &mut out,
                    asked.client_id,
                    asked.udp_limit,
                    asked.opt,
                    question_end,
                    code,
                );
                self.send_udp_reply(listener, server, reply, asked.client)
                    .await;
            }
            ReplyTo::Tcp(tcp) => {
                let mut out = raw.to_vec();
                wire::set_id(&mut out, asked.client_id);
                tcp.send(out);
            }
        }
        let hold = answered.elapsed();
        self.metrics.hold.record(hold.as_secs_f64());
        let outcome = Outcome {
            result: QueryResult::Answered,
            rcode: Some(code),
            upstream: Some(upstream),
            hold,
            answer: Some(&msg),
        };
        self.finish_admitted(&asked, outcome);
    }

    /// The observer timed out or failed: release anyway or SERVFAIL, as configured.
    async fn fallback(&self, answer: Answer, raw: &mut [u8], failure: HoldFailure) {
        self.metrics.hold_failure(failure);
        if self.config.on_hold_timeout == HoldFallback::Release {
            return self.release(answer, raw).await;
        }
        let Answer {
            origin: Origin { reply, asked },
            upstream,
            question_end,
            answered,
            ..
        } = answer;
        let code = self.send_servfail(reply, &asked, raw, question_end).await;
        let hold = answered.elapsed();
        self.metrics.hold.record(hold.as_secs_f64());
        let result = match failure {
            HoldFailure::Timeout => QueryResult::HoldTimeout,
            HoldFailure::ObserverError => QueryResult::ObserverFailed,
        };
        let outcome = Outcome {
            result,
            rcode: Some(code.into()),
            upstream: Some(upstream),
            hold,
            answer: None,
        };
        self.finish_admitted(&asked, outcome);
    }

    /// Answers the asker of `query` with SERVFAIL (question and OPT echoed); returns the code.
    async fn send_servfail(
        &self,
        reply: ReplyTo,
        asked: &Asked,
        query: &[u8],
        question_end: usize,
    ) -> u8 {
        let mut out = Vec::with_capacity(question_end + 11);
        let code = rcode::SERVFAIL;
        wire::write_header_reply(
            &mut out,
            query,
            asked.client_id,
            Some(question_end),
            code,
            false,
            asked.opt,
        );
        self.send_reply(reply, asked.client, &out).await;
        code
    }

    /// Sends a reply the proxy wrote itself.
    pub(crate) async fn send_reply(&self, reply: ReplyTo, client: SocketAddr, bytes: &[u8]) {
        match reply {
            ReplyTo::Udp { listener, server } => {
                self.send_udp_reply(listener, server, bytes, client).await;
            }
            ReplyTo::Tcp(tcp) => tcp.send(bytes.to_vec()),
        }
    }

    /// Sends a UDP reply so that it comes from `server`, the address the client sent its query
    /// to: through listener `listener` when that is its bound address, through the raw socket
    /// otherwise (transparent mode). A reply too big for the route's MTU on the raw path (the
    /// kernel does not fragment header-included packets) is sent again truncated, so the client
    /// retries over TCP.
    pub(crate) async fn send_udp_reply(
        &self,
        listener: usize,
        server: SocketAddr,
        bytes: &[u8],
        client: SocketAddr,
    ) {
        let listener = &self.udp[listener];
        let Some(raw) = self.raw.as_ref().filter(|_| server != listener.local) else {
            return send_udp(&listener.socket, bytes, client).await;
        };
        let mut sent = raw.send(server, client, bytes).await;
        if let Err(e) = &sent
            && transparent::is_too_big(e)
        {
            let mut out = Vec::new();
            wire::write_truncated(&mut out, bytes);
            sent = raw.send(server, client, &out).await;
        }
        match sent {
            Ok(()) => self.metrics.raw_replies.inc(),
            Err(e) => {
                self.metrics.raw_reply_errors.inc();
                tracing::debug!(%client, %server, error = %e, "DNS reply not sent through the raw socket");
            }
        }
    }

    // ---- TC=1: the same upstream over TCP -----------------------------------------------

    /// Asks the upstream again over TCP (within `upstream_timeout`), then observes the full
    /// answer and replies. A failed retry is answered like an upstream timeout but does not
    /// count against the upstream's health (its UDP side answered).
    async fn retry_tcp(
        self: Arc<Self>,
        upstream: Arc<Upstream>,
        origin: Origin,
        mut query: Vec<u8>,
        question_end: usize,
    ) {
        let upstream = upstream.addr;
        let id = IdSource::new().next_id();
        wire::set_id(&mut query, id);
        let exchange = self.tcp_exchange(upstream, &query, id, question_end);
        let failure = match tokio::time::timeout(self.config.upstream_timeout, exchange).await {
            Ok(Ok(mut raw)) => match (Message::from_vec(&raw), wire::question_end(&raw)) {
                (Ok(msg), Some(answer_qend)) => {
                    let answered = Instant::now();
                    let answer = Answer {
                        origin,
                        upstream,
                        msg,
                        question_end: answer_qend,
                        answered,
                    };
                    if let Some(pending) = self.observe_and_reply(answer, &mut raw).await {
                        pending.await;
                    }
                    return;
                }
                _ => {
                    self.metrics.drop_answer(DropReason::Malformed);
                    "malformed answer".to_owned()
                }
            },
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_owned(),
        };
        tracing::debug!(%upstream, error = %failure, "DNS retry over TCP failed");
        self.upstream_failed(origin, upstream, &query, question_end)
            .await;
    }

    /// One query and its answer on a new TCP connection. Answers with another ID or question
    /// are dropped and counted; the caller bounds the time.
    async fn tcp_exchange(
        &self,
        upstream: SocketAddr,
        query: &[u8],
        id: u16,
        question_end: usize,
    ) -> io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(upstream).await?;
        stream.set_nodelay(true)?;
        let len = u16::try_from(query.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
        let mut framed = Vec::with_capacity(query.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(query);
        stream.write_all(&framed).await?;
        loop {
            let mut len = [0u8; 2];
            stream.read_exact(&mut len).await?;
            let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
            stream.read_exact(&mut answer).await?;
            if wire::id(&answer) != Some(id) || !wire::is_response(&answer) {
                self.dropped(DropReason::UnknownId, upstream);
                continue;
            }
            match wire::question_end(&answer) {
                Some(end) if wire::same_question(&answer, end, query, question_end) => {
                    return Ok(answer);
                }
                _ => self.dropped(DropReason::QuestionMismatch, upstream),
            }
        }
    }

    // ---- timeouts and health ------------------------------------------------------------

    /// Every `upstream_timeout / 8` (5 ms..250 ms), takes the expired queries out of every
    /// in-flight table: one timer for the whole proxy, not one per query.
    pub(crate) async fn sweep_loop(self: Arc<Self>) {
        let period = (self.config.upstream_timeout / 8)
            .clamp(Duration::from_millis(5), Duration::from_millis(250));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut expired = Vec::new();
        let mut originals = Vec::new();
        let mut sockets = Vec::new();
        loop {
            tick.tick().await;
            let now = Instant::now();
            if let Some(cutoff) = now.checked_sub(self.config.upstream_timeout) {
                originals.clear();
                if let Some(table) = &self.originals {
                    table.snapshot(&mut originals);
                }
                // Only the pool is health-checked: an original destination has no alternative.
                let all = (self.upstreams.iter().map(|u| (u, true)))
                    .chain(originals.iter().map(|u| (u, false)));
                for (upstream, checked) in all {
                    sockets.clear();
                    upstream.all_sockets(&mut sockets);
                    for socket in &sockets {
                        socket.lock().expire(cutoff, &mut expired);
                        if socket.is_retired() {
                            // Its receiver closes it once its table is empty.
                            socket.drained.notify_one();
                        }
                    }
                    for (_, inflight) in expired.drain(..) {
                        if checked {
                            upstream.on_failure(self.config.health_check_failures);
                        }
                        match inflight.origin {
                            None => upstream.probing.store(false, Ordering::Relaxed),
                            Some(origin) => {
                                self.upstream_failed(
                                    origin,
                                    upstream.addr,
                                    &inflight.query,
                                    inflight.question_end,
                                )
                                .await;
                            }
                        }
                    }
                }
            }
            #[allow(clippy::cast_precision_loss, reason = "a gauge")]
            self.metrics
                .inflight
                .set(self.inflight.load(Ordering::Relaxed) as f64);
        }
    }

    /// The upstream did not answer: SERVFAIL or nothing, as configured.
    async fn upstream_failed(
        &self,
        origin: Origin,
        upstream: SocketAddr,
        query: &[u8],
        question_end: usize,
    ) {
        let Origin { reply, asked } = origin;
        let code = match self.config.on_upstream_timeout {
            UpstreamTimeoutAction::ServFail => {
                let code = self.send_servfail(reply, &asked, query, question_end).await;
                Some(code.into())
            }
            UpstreamTimeoutAction::NoReply => None,
        };
        let outcome = Outcome {
            result: QueryResult::UpstreamTimeout,
            rcode: code,
            upstream: Some(upstream),
            hold: Duration::ZERO,
            answer: None,
        };
        self.finish_admitted(&asked, outcome);
    }

    /// Every `health_check_interval`, probes each dead upstream, and each live one that has
    /// not answered for that long, with `. NS`.
    pub(crate) async fn health_loop(self: Arc<Self>) {
        let interval = self.config.health_check_interval;
        let mut tick = tokio::time::interval_at(Instant::now() + interval, interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        let mut ids = IdSource::new();
        let mut probe = Vec::with_capacity(17);
        let mut next_socket = 0usize;
        loop {
            tick.tick().await;
            let now = Instant::now();
            let now_ms = self.elapsed_ms(now);
            for upstream in &self.upstreams {
                let idle = now_ms.saturating_sub(upstream.last_answer_ms()) >= interval_ms;
                if upstream.is_alive() && !idle {
                    continue;
                }
                if upstream.probing.swap(true, Ordering::Relaxed) {
                    continue;
                }
                next_socket = next_socket.wrapping_add(1);
                let socket = upstream.socket(next_socket % upstream.slots());
                let reserved = {
                    let mut table = socket.lock();
                    table.insert(&mut ids).map(|slot| {
                        wire::write_probe(&mut probe, slot.id());
                        let question_end = probe.len();
                        slot.fill(Inflight {
                            query: probe.clone(),
                            question_end,
                            sent_name: None,
                            sent: now,
                            origin: None,
                        });
                    })
                };
                if reserved.is_none() {
                    upstream.probing.store(false, Ordering::Relaxed);
                    continue;
                }
                tracing::debug!(upstream = %upstream.addr, alive = upstream.is_alive(), "probing DNS upstream");
                // A probe that is not sent times out and counts as a failure.
                let _ = socket.socket.try_send(&probe);
            }
        }
    }

    // ---- the end of a query -------------------------------------------------------------

    fn elapsed_ms(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.start).as_millis()).unwrap_or(u64::MAX)
    }

    /// A forwarded query ended.
    fn finish_admitted(&self, asked: &Asked, outcome: Outcome<'_>) {
        self.finish(
            asked.client,
            asked.transport,
            &asked.name,
            Some(asked.qtype),
            asked.received,
            outcome,
        );
        // Last, so a snapshot showing nothing in flight includes this query's counts.
        self.inflight.fetch_sub(1, Ordering::Release);
    }

    /// Counts the query and writes its log entry.
    fn finish(
        &self,
        client: SocketAddr,
        transport: Transport,
        name: &str,
        qtype: Option<RecordType>,
        received: Instant,
        outcome: Outcome<'_>,
    ) {
        self.metrics.query(outcome.result);
        let Some(log) = &self.query_log else { return };
        let total = received.elapsed();
        let answers = outcome.answer.map_or(0, |m| {
            m.answers
                .iter()
                .filter(|r| matches!(r.record_type(), RecordType::A | RecordType::AAAA))
                .count()
        });
        log.record(QueryLogEntry {
            time_ms: epoch_ms().saturating_sub(u64::try_from(total.as_millis()).unwrap_or(0)),
            client,
            transport,
            name: name.to_owned(),
            qtype: qtype.map(|t| t.to_string()).unwrap_or_default(),
            result: outcome.result,
            rcode: outcome
                .rcode
                .map(|c| wire::rcode_name(c).to_owned())
                .unwrap_or_default(),
            upstream: outcome.upstream,
            total_us: u64::try_from(total.as_micros()).unwrap_or(u64::MAX),
            hold_us: u64::try_from(outcome.hold.as_micros()).unwrap_or(u64::MAX),
            answers,
        });
    }
}

/// Work an answer leaves behind (a pending observation or a TCP retry): boxed, off the fast
/// path.
pub(crate) type Slow = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Milliseconds since the Unix epoch, for the query log only.
#[allow(
    clippy::disallowed_types,
    reason = "the query log records wall-clock time"
)]
fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
