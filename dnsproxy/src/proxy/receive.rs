//! The answer's way in: one receiver per upstream socket validates each datagram (source,
//! ID, question) and hands it on to the hold, or to a TCP retry when truncated.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use fqdnd_dnswire::Decoder;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Answer, BATCH, Held, Replies, Round, Shared, Slow, addresses, is_transient};
use crate::answer::{self, Validated};
use crate::batch::RecvBatch;
use crate::config::TruncatedAction;
use crate::latency::Series;
use crate::metrics::DropReason;
use crate::policy::Transport;
use crate::upstream::Upstream;
use crate::upstream_socket::{Inflight, Spare, UpstreamSocket};

/// What became of an upstream's datagram before the hold ([`Shared::accept`]).
#[allow(
    clippy::large_enum_variant,
    reason = "`Hold` is the common case: boxed, it would cost an allocation per answer"
)]
enum Accepted {
    /// An answer to hold, and the length of the datagram to reply with.
    Hold(Answer, usize),
    /// Dropped, or a health probe's answer: nothing more to do.
    Ended,
    /// Truncated: the query goes to TCP.
    Retry(Slow),
}

/// One upstream socket's reader: its receive batch, the replies of a batch, and the
/// observations it started that still wait.
pub(crate) struct UpstreamReceiver {
    shared: Arc<Shared>,
    upstream: Arc<Upstream>,
    socket: Arc<UpstreamSocket>,
    batch: RecvBatch,
    replies: Replies,
    decoder: Decoder,
    /// Pending observations and TCP retries, spawned on the current runtime (a shard thread's
    /// is the proxy's); dropping the receiver drops them.
    pending: JoinSet<()>,
    /// Buffers of the queries that ended here, given back to the socket's table with the
    /// next answer (under the lock its validation takes anyway), for the next queries.
    spare: Spare,
}

impl UpstreamReceiver {
    pub(crate) fn new(
        shared: Arc<Shared>,
        upstream: Arc<Upstream>,
        socket: Arc<UpstreamSocket>,
    ) -> Self {
        let replies = Replies::new(shared.udp.len());
        Self {
            shared,
            upstream,
            socket,
            batch: RecvBatch::new(false),
            replies,
            decoder: Decoder::new(),
            pending: JoinSet::new(),
            spare: Spare::default(),
        }
    }

    /// The upstream socket (`None` for an encrypted upstream, whose answers come through
    /// [`Shared::stream_loop`]).
    pub(crate) fn udp(&self) -> Option<&crate::udp::UdpSocket> {
        self.socket.socket.as_ref()
    }

    /// The socket read, to wake its receiver when its table may have emptied.
    pub(crate) fn upstream_socket(&self) -> &UpstreamSocket {
        &self.socket
    }

    /// Reads and handles batches of answers until the socket is empty or [`BATCH`] were
    /// handled. Awaits only a send that finds its socket's buffer full.
    pub(crate) async fn round(&mut self) -> Round {
        let Self {
            shared,
            upstream,
            socket,
            batch,
            replies,
            decoder,
            pending,
            spare,
        } = self;
        let Some(udp) = socket.socket.as_ref() else {
            return Round::Drained;
        };
        let mut handled = 0;
        loop {
            let n = match batch.try_recv(udp) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Round::Drained,
                // ICMP port unreachable and the like: the sweep counts the timeouts.
                Err(e) if is_transient(&e) => continue,
                Err(e) => {
                    tracing::warn!(upstream = %upstream.addr, error = %e, "DNS upstream socket error");
                    return Round::Failed;
                }
            };
            // The batch's answers arrived by now: one clock read for them all.
            let answered = Instant::now();
            for i in 0..n {
                let Some((got, raw)) = batch.get(i) else {
                    break;
                };
                if let Some(task) = shared
                    .on_answer(
                        upstream, socket, raw, got.from, answered, decoder, replies, spare,
                    )
                    .await
                {
                    pending.spawn(task);
                }
            }
            // The batch's replies leave together (one `sendmmsg` per listener).
            shared.flush_replies(replies).await;
            if batch.drained() {
                return Round::Drained;
            }
            handled += n;
            if handled >= BATCH {
                return Round::More;
            }
        }
    }

    /// After a round, or a wake by the sweep: forgets the observations that finished; if the
    /// socket was retired by a rotation and its last query in flight was answered or expired,
    /// gives its table back to the upstream and returns `true`: the socket closes once the
    /// receiver is dropped (after [`UpstreamReceiver::is_idle`]).
    pub(crate) fn close_if_drained(&mut self) -> bool {
        super::forget_finished(&mut self.pending);
        let Some(table) = self.socket.close_if_drained() else {
            return false;
        };
        self.upstream.recycle(table);
        tracing::debug!(upstream = %self.upstream.addr, port = self.socket.port, "retired DNS upstream socket drained and closed");
        true
    }

    /// Whether every observation it started has finished.
    pub(crate) fn is_idle(&mut self) -> bool {
        super::forget_finished(&mut self.pending);
        self.pending.is_empty()
    }
}

impl Shared {
    /// Receives answers on one upstream socket until it fails, or until it was retired by a
    /// rotation and its last query in flight was answered or expired: then it waits for the
    /// observations it started and returns `Ok`, closing the socket.
    pub(crate) async fn upstream_loop(
        self: Arc<Self>,
        upstream: Arc<Upstream>,
        socket: Arc<UpstreamSocket>,
    ) -> Result<(), crate::Error> {
        let mut receiver = UpstreamReceiver::new(self, upstream.clone(), socket.clone());
        // An encrypted upstream's answers come through `stream_loop`.
        let Some(udp) = socket.socket.as_ref() else {
            return Ok(());
        };
        loop {
            tokio::select! {
                ready = udp.readable() => {
                    ready.map_err(|source| crate::Error::Upstream {
                        upstream: upstream.addr,
                        error: source,
                    })?;
                }
                () = socket.drained.notified() => {}
            }
            while receiver.round().await.again().await {}
            if receiver.close_if_drained() {
                while receiver.pending.join_next().await.is_some() {}
                return Ok(());
            }
        }
    }

    /// Validates one datagram from an upstream socket, which arrived by `answered`, and
    /// replies, or returns the task that will (a pending observation or a TCP retry). The
    /// buffers of a query that ends here go to `spare`.
    #[allow(
        clippy::too_many_arguments,
        reason = "the receiver's state, passed through once"
    )]
    async fn on_answer(
        self: &Arc<Self>,
        upstream: &Arc<Upstream>,
        socket: &UpstreamSocket,
        raw: &mut [u8],
        from: SocketAddr,
        answered: Instant,
        decoder: &mut Decoder,
        replies: &mut Replies,
        spare: &mut Spare,
    ) -> Option<Slow> {
        // Everything up to the hold is synchronous, in `accept`: its locals then stay on the
        // stack instead of in this future, which is copied at each step of an answer's way.
        let (answer, len) = match self.accept(upstream, socket, raw, from, answered, decoder, spare)
        {
            Accepted::Hold(answer, len) => (answer, len),
            Accepted::Ended => return None,
            Accepted::Retry(task) => return Some(task),
        };
        match self
            .observe_and_reply(answer, &mut raw[..len], decoder.decoded(), Some(replies))
            .await
        {
            Held::Done(name) => {
                spare.keep_name(name);
                None
            }
            Held::Pending(task) => Some(task),
        }
    }

    /// [`Shared::on_answer`] up to the hold: the datagram validated and its query taken out of
    /// the socket's table; what the answer is for (`Hold`, with the length of `raw` to
    /// reply with), or that it ended here (dropped, or a health probe's answer), or the TCP
    /// retry that a truncated answer starts.
    #[allow(
        clippy::too_many_arguments,
        reason = "the receiver's state, passed through once"
    )]
    fn accept(
        self: &Arc<Self>,
        upstream: &Arc<Upstream>,
        socket: &UpstreamSocket,
        raw: &mut [u8],
        from: SocketAddr,
        answered: Instant,
        decoder: &mut Decoder,
        spare: &mut Spare,
    ) -> Accepted {
        if from != upstream.addr {
            self.dropped(DropReason::WrongSource, upstream.addr);
            return Accepted::Ended;
        }
        let validated = answer::validate(raw, socket, decoder, spare);
        let Validated {
            entry,
            question: answer_question,
            len,
        } = match validated {
            Ok(validated) => validated,
            Err(reason) => {
                self.dropped(reason, upstream.addr);
                return Accepted::Ended;
            }
        };
        let rtt = answered.saturating_duration_since(entry.sent);
        upstream.on_success(rtt, self.elapsed_ms(answered));
        let Inflight {
            query,
            question: query_question,
            sent_name,
            origin,
            ..
        } = entry;
        spare.keep_bytes(sent_name);
        let (Some(origin), Some(question)) = (origin, answer_question) else {
            upstream.probing.store(false, Ordering::Relaxed);
            return Accepted::Ended;
        };
        self.metrics.latency.record(Series::Upstream, rtt);
        let pass_through = origin.asked.transport == Transport::Udp
            && self.config.on_truncated == TruncatedAction::PassThrough;
        let decoded = decoder.decoded();
        // Over TLS or HTTPS nothing is cut to fit: TC=1 there is the server's own answer.
        if decoded.header.truncated && !pass_through && upstream.encrypted.is_none() {
            return Accepted::Retry(Box::pin(self.clone().retry_tcp(
                upstream.clone(),
                origin,
                query,
                query_question,
            )));
        }
        spare.keep_bytes(query);
        let answer = Answer {
            origin,
            upstream: upstream.addr,
            rcode: decoded.rcode,
            addresses: addresses(decoded),
            question,
            answered,
            cached: false,
        };
        Accepted::Hold(answer, len)
    }

    /// Receives the answers an encrypted upstream's transport hands over (each a whole DNS
    /// message) and treats each as `upstream_loop` treats a datagram: validated against the
    /// upstream's in-flight table, then held and replied.
    pub(crate) async fn stream_loop(
        self: Arc<Self>,
        upstream: Arc<Upstream>,
        mut answers: tokio::sync::mpsc::Receiver<Vec<u8>>,
    ) -> Result<(), crate::Error> {
        let socket = upstream.socket(0);
        let mut replies = Replies::new(self.udp.len());
        let mut decoder = Decoder::new();
        let mut pending = JoinSet::new();
        let mut spare = Spare::default();
        while let Some(mut raw) = answers.recv().await {
            let mut handled = 0;
            loop {
                if let Some(task) = self
                    .on_answer(
                        &upstream,
                        &socket,
                        &mut raw,
                        upstream.addr,
                        Instant::now(),
                        &mut decoder,
                        &mut replies,
                        &mut spare,
                    )
                    .await
                {
                    pending.spawn(task);
                }
                handled += 1;
                // Answers that arrived together leave together.
                match answers.try_recv() {
                    Ok(next) if handled < BATCH => raw = next,
                    Ok(next) => {
                        self.flush_replies(&mut replies).await;
                        tokio::task::yield_now().await;
                        handled = 0;
                        raw = next;
                    }
                    Err(_) => break,
                }
            }
            self.flush_replies(&mut replies).await;
            super::forget_finished(&mut pending);
        }
        // The transport stopped (only when the proxy does).
        Ok(())
    }

    pub(super) fn dropped(&self, reason: DropReason, upstream: SocketAddr) {
        self.metrics.drop_answer(reason);
        tracing::debug!(%upstream, reason = reason.as_str(), "DNS answer dropped");
    }
}
