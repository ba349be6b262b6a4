//! The query's way through the proxy: parse, policy, forward; the answer's way back:
//! validate, observe, hold, release. Plus the timeout sweep and the health prober.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode};
use hickory_proto::rr::RecordType;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use crate::config::{
    Config, HoldFallback, RateLimitAction, RejectCode, TruncatedAction, UpstreamTimeoutAction,
};
use crate::ids::IdSource;
use crate::metrics::{DropReason, HoldFailure, Metrics};
use crate::observer::{Observation, ObserveFuture, ResponseContext, ResponseObserver};
use crate::policy::{QueryInfo, QueryPolicy, Transport, Verdict};
use crate::querylog::{QueryLog, QueryLogEntry, QueryResult};
use crate::ratelimit::RateLimiter;
use crate::transparent::{self, RawSender};
use crate::upstream::{Asked, Inflight, OpenError, Origin, OriginalUpstreams, ReplyTo, Upstream};
use crate::wire::{self, Opt, rcode};

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
}

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
        let Ok(msg) = Message::from_vec(raw) else {
            return self.malformed(w, raw, client, transport, received);
        };
        if msg.metadata.message_type != MessageType::Query {
            // A response sent to the listener: never answer it (no reflection loops).
            self.finish(
                client,
                transport,
                "",
                None,
                received,
                Outcome::local(QueryResult::Malformed, None),
            );
            return Handled::Dropped;
        }
        let client_id = msg.metadata.id;
        let opt = msg.edns.as_ref().map(|e| Opt {
            dnssec_ok: e.flags().dnssec_ok,
            rcode_high: 0,
        });
        let question_end = match msg.queries.len() {
            1 => wire::question_end(raw),
            _ => None,
        };
        let Some(question_end) = question_end else {
            wire::write_header_reply(
                &mut w.scratch,
                raw,
                client_id,
                None,
                rcode::FORMERR,
                false,
                opt,
            );
            self.finish(
                client,
                transport,
                "",
                None,
                received,
                Outcome::local(QueryResult::Malformed, Some(rcode::FORMERR)),
            );
            return Handled::Reply;
        };
        let qtype = msg.queries[0].query_type;
        if msg.metadata.op_code != OpCode::Query {
            let (qe, code) = (Some(question_end), rcode::NOTIMP);
            wire::write_header_reply(&mut w.scratch, raw, client_id, qe, code, false, opt);
            self.finish(
                client,
                transport,
                "",
                Some(qtype),
                received,
                Outcome::local(QueryResult::Malformed, Some(code)),
            );
            return Handled::Reply;
        }
        let udp_limit = msg.max_payload();
        drop(msg);

        let mut name = String::with_capacity(question_end - wire::HEADER_LEN);
        wire::canonical_name(raw, question_end, &mut name);
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

    /// FORMERR for an unparsable message whose ID is readable; nothing otherwise.
    fn malformed(
        &self,
        w: &mut Worker,
        raw: &[u8],
        client: SocketAddr,
        transport: Transport,
        received: Instant,
    ) -> Handled {
        let (handled, code) = match wire::id(raw) {
            // Never answer something that claims to be a response.
            Some(id) if !wire::is_response(raw) => {
                wire::write_formerr(&mut w.scratch, raw, id);
                (Handled::Reply, Some(rcode::FORMERR))
            }
            _ => (Handled::Dropped, None),
        };
        self.finish(
            client,
            transport,
            "",
            None,
            received,
            Outcome::local(QueryResult::Malformed, code),
        );
        handled
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
        let upstream: &Upstream = match self.upstream_for(w, target) {
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
        let n = upstream.sockets.len();
        let first = w.next_socket;
        w.next_socket = w.next_socket.wrapping_add(1);
        let sent = asked.received;
        let mut origin = Some(Origin {
            reply: reply(),
            asked,
        });
        let mut chosen = None;
        for k in 0..n {
            let si = (first + k) % n;
            let mut table = upstream.sockets[si].lock();
            if let Some(slot) = table.insert(&mut w.ids) {
                wire::set_id(raw, slot.id());
                slot.fill(Inflight {
                    query: raw.to_vec(),
                    question_end,
                    sent,
                    origin: origin.take(),
                });
                chosen = Some(si);
                break;
            }
        }
        let Some(si) = chosen else {
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
        let socket = &upstream.sockets[si].socket;
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

    /// Receives answers on one upstream socket until it fails.
    pub(crate) async fn upstream_loop(
        self: Arc<Self>,
        upstream: Arc<Upstream>,
        si: usize,
    ) -> Result<(), crate::Error> {
        let socket = &upstream.sockets[si].socket;
        let mut buf = vec![0u8; 65_536];
        let mut pending = JoinSet::new();
        loop {
            socket
                .readable()
                .await
                .map_err(|source| crate::Error::Upstream {
                    upstream: upstream.addr,
                    source,
                })?;
            let mut batch = 0;
            loop {
                match socket.try_recv_from(&mut buf) {
                    Ok((n, from)) => {
                        if let Some(task) = self.on_answer(&upstream, si, &mut buf[..n], from).await
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
        }
    }

    /// Validates one datagram from an upstream socket and replies, or returns the task that
    /// will (a pending observation or a TCP retry).
    async fn on_answer(
        self: &Arc<Self>,
        upstream: &Arc<Upstream>,
        si: usize,
        raw: &mut [u8],
        from: SocketAddr,
    ) -> Option<Slow> {
        if from != upstream.addr {
            self.dropped(DropReason::WrongSource, upstream.addr);
            return None;
        }
        let answered = Instant::now();
        let id = match wire::id(raw) {
            Some(id) if raw.len() >= wire::HEADER_LEN && wire::is_response(raw) => id,
            _ => {
                self.dropped(DropReason::Malformed, upstream.addr);
                return None;
            }
        };
        let Ok(msg) = Message::from_vec(raw) else {
            self.dropped(DropReason::Malformed, upstream.addr);
            return None;
        };
        let answer_qend = wire::question_end(raw);
        let taken = upstream.sockets[si]
            .lock()
            .take(id, |e| match (answer_qend, &e.origin) {
                (Some(end), _) => wire::same_question(raw, end, &e.query, e.question_end),
                // A probe accepts any well-formed answer with its ID (e.g. REFUSED without question).
                (None, origin) => origin.is_none(),
            });
        let entry = match taken {
            Ok(entry) => entry,
            Err(reason) => {
                self.dropped(reason, upstream.addr);
                return None;
            }
        };
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
                if raw.len() > usize::from(asked.udp_limit) {
                    let mut out = Vec::with_capacity(question_end + 11);
                    let opt = asked.opt.map(|o| Opt {
                        rcode_high: (code >> 4) as u8,
                        ..o
                    });
                    #[allow(
                        clippy::cast_possible_truncation,
                        reason = "the low 4 bits of the RCODE"
                    )]
                    let low = (code & 0x0f) as u8;
                    wire::write_header_reply(
                        &mut out,
                        raw,
                        asked.client_id,
                        Some(question_end),
                        low,
                        true,
                        opt,
                    );
                    self.send_udp_reply(listener, server, &out, asked.client)
                        .await;
                } else {
                    wire::set_id(raw, asked.client_id);
                    self.send_udp_reply(listener, server, raw, asked.client)
                        .await;
                }
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
                    for socket in &upstream.sockets {
                        socket.lock().expire(cutoff, &mut expired);
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
                let socket = &upstream.sockets[next_socket % upstream.sockets.len()];
                let reserved = {
                    let mut table = socket.lock();
                    table.insert(&mut ids).map(|slot| {
                        wire::write_probe(&mut probe, slot.id());
                        let question_end = probe.len();
                        slot.fill(Inflight {
                            query: probe.clone(),
                            question_end,
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
