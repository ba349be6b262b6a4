//! The query's way through the proxy, split by stage: [`admit`] (parse, policy, the replies
//! the proxy writes itself), [`forward`] (upstream, socket, ID, send), [`receive`] (an
//! upstream socket's answers validated), [`hold`] (the observer, the fallback, the reply
//! out), [`tcp_retry`] (TC=1 asked again over TCP) and [`maintenance`] (the timeout sweep and
//! the health prober). This module owns the state they share and the end of every query
//! (metrics, query log).

mod admit;
mod forward;
mod hold;
mod maintenance;
mod receive;
mod tcp_retry;

pub(crate) use receive::UpstreamReceiver;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use fqdnd_dnswire::{Decoded, TYPE_A, TYPE_AAAA};
use hickory_proto::rr::RecordType;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::batch::SendBatch;
use crate::config::Config;
use crate::ids::IdSource;
use crate::metrics::Metrics;
use crate::observer::ResponseObserver;
use crate::policy::{QueryPolicy, Transport};
use crate::querylog::{QueryLog, QueryLogEntry, QueryResult};
use crate::question::Question;
use crate::ratelimit::RateLimiter;
use crate::record::{Direction, Recorded, Recorder};
use crate::transparent::RawSender;
use crate::udp::UdpSocket;
use crate::upstream::{Asked, NewSocket, Origin, OriginalUpstreams, Upstream};
use crate::upstream_socket::UpstreamSocket;
use crate::wire;

/// Packets handled per readiness wake before the task yields to others on its thread.
pub(crate) const BATCH: usize = 64;

/// What one round of reading a socket left: the socket is empty, it may have more (a round
/// reads at most [`BATCH`] datagrams, so one socket cannot starve the others on its thread), or
/// reading failed (logged) and the socket should rest for [`ERROR_PAUSE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Round {
    Drained,
    More,
    Failed,
}

impl Round {
    /// Paces a reader driven by the reactor after a round: `true` (after a yield to the other
    /// tasks) when the socket may have more; `false` when the reader should wait for
    /// readiness again, after resting for [`ERROR_PAUSE`] if the round failed.
    pub(crate) async fn again(self) -> bool {
        match self {
            Round::Drained => false,
            Round::More => {
                tokio::task::yield_now().await;
                true
            }
            Round::Failed => {
                tokio::time::sleep(ERROR_PAUSE).await;
                false
            }
        }
    }
}

/// One UDP listener socket (several may share an address through SO_REUSEPORT).
pub(crate) struct UdpListener {
    pub(crate) socket: UdpSocket,
    /// Its send-only twin, which its replies leave through ([`crate::twin`]), if it has one.
    pub(crate) twin: Option<UdpSocket>,
    pub(crate) local: SocketAddr,
}

impl UdpListener {
    /// The socket replies leave through: the twin if there is one, else the listener itself.
    pub(crate) fn sender(&self) -> &UdpSocket {
        self.twin.as_ref().unwrap_or(&self.socket)
    }
}

/// State shared by every task of one proxy.
pub(crate) struct Shared {
    /// The answer cache, when on.
    pub(crate) cache: Option<crate::cache::AnswerCache>,
    pub(crate) config: Config,
    pub(crate) policy: Arc<dyn QueryPolicy>,
    pub(crate) observer: Arc<dyn ResponseObserver>,
    pub(crate) query_log: Option<Arc<dyn QueryLog>>,
    pub(crate) recorder: Option<Arc<dyn Recorder>>,
    pub(crate) udp: Vec<UdpListener>,
    /// The UDP path's threads: listener `i` and upstream slot `i` belong to shard `i`.
    pub(crate) shards: crate::shards::Shards,
    /// Every configured upstream: the default pool's, then each zone's.
    pub(crate) upstreams: Vec<Arc<Upstream>>,
    /// Which of `upstreams` a question goes to: the default pool or its zone's.
    pub(crate) pools: crate::zones::Pools,
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
    /// Upstream sockets opened while running whose receivers `run` starts: a new original
    /// destination's, and without shard threads a rotation's (with them, a rotation hands
    /// its socket to its shard directly).
    pub(crate) new_sockets: mpsc::UnboundedSender<NewSocket>,
    /// When a failed socket rotation was last logged (ms since `start`), to rate-limit it.
    pub(crate) rotation_warned_ms: AtomicU64,
    /// When running out of file descriptors on accept was last logged (ms since `start`).
    pub(crate) fd_warned_ms: AtomicU64,
    /// When an observer failure was last logged (ms since `start`).
    pub(crate) observer_warned_ms: AtomicU64,
    /// When an observer that did not finish in time was last logged (ms since `start`).
    pub(crate) hold_timeout_warned_ms: AtomicU64,
}

/// A warning that may repeat (a failed rotation, an accept without file descriptors) is logged
/// at most this often.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);

/// Per-task state of a query-receiving task: no sharing, no locking.
pub(crate) struct Worker {
    ids: IdSource,
    next_upstream: usize,
    next_socket: usize,
    /// The shard whose thread made this worker (a worker stays on its task's thread), as
    /// `(shard, shards)`: it forwards through the upstream sockets of its shard first, whose
    /// answers are read on its thread.
    shard: Option<(usize, usize)>,
    /// A reply the proxy wrote itself, ready to send.
    pub(crate) scratch: Vec<u8>,
    /// The canonical name of the query being handled. A forwarded query takes it along and
    /// leaves a spare buffer from its upstream socket in its place.
    name: String,
    /// Batching (a UDP listener's task): forwarded queries wait in `queries` until
    /// [`Shared::flush`]; otherwise each is sent at once.
    pub(crate) batching: bool,
    /// Per upstream socket, the queries forwarded since the last flush. Emptied by the flush,
    /// so a worker holds no socket between batches (a socket a rotation retired closes once
    /// its receiver drains it, not when this worker next forwards a batch).
    queries: Vec<Queued>,
    /// The send batches of earlier flushes, for their buffers.
    spare_queues: Vec<SendBatch>,
    /// Batching: the UDP replies of the batch (per listener socket).
    pub(crate) replies: Replies,
    /// Answers from the cache waiting for their observer (a listener task's pending holds:
    /// they end with it).
    pub(crate) pending: tokio::task::JoinSet<()>,
    /// A cached answer being served.
    cached: Vec<u8>,
    /// Decodes the cached answers served, for the observer.
    decoder: fqdnd_dnswire::Decoder,
    /// When the batch of queries being handled was read (a UDP listener's task sets it per
    /// `recvmmsg`, one clock read for the batch); `None`: each query reads the clock.
    pub(crate) batch_received: Option<Instant>,
}

impl Worker {
    /// A worker that sends each forwarded query at once (TCP connections).
    pub(crate) fn new(seed: usize) -> Self {
        Self {
            ids: IdSource::new(),
            next_upstream: seed,
            next_socket: seed,
            shard: crate::shards::current(),
            scratch: Vec::new(),
            name: String::new(),
            batching: false,
            queries: Vec::new(),
            spare_queues: Vec::new(),
            replies: Replies::new(0),
            pending: tokio::task::JoinSet::new(),
            cached: Vec::new(),
            decoder: fqdnd_dnswire::Decoder::new(),
            batch_received: None,
        }
    }

    /// Where a batching worker queues UDP replies; `None`: send each at once.
    pub(crate) fn reply_queue(&mut self) -> Option<&mut Replies> {
        self.batching.then_some(&mut self.replies)
    }

    /// A worker that queues forwarded queries until [`Shared::flush`] (UDP listeners: one
    /// `sendmmsg` per upstream socket per batch of queries).
    pub(crate) fn batching(seed: usize, listeners: usize) -> Self {
        Self {
            batching: true,
            replies: Replies::new(listeners),
            ..Self::new(seed)
        }
    }

    /// The upstream socket slots (of `n`) this worker offers its next query to, in order.
    fn slot_order(&self, n: usize) -> impl Iterator<Item = usize> + use<> {
        slot_order(n, self.next_socket, self.shard)
    }

    /// Queues a query for `socket`, the socket of slot `slot` (pooled upstream, slot) if known.
    fn queue_query(
        &mut self,
        socket: &Arc<UpstreamSocket>,
        slot: Option<(usize, usize)>,
        bytes: &[u8],
    ) {
        if let Some(queued) = self
            .queries
            .iter_mut()
            .find(|q| Arc::ptr_eq(&q.socket, socket))
        {
            queued.queue.push(bytes, None);
            return;
        }
        let mut queue = self.spare_queues.pop().unwrap_or_default();
        queue.push(bytes, None);
        self.queries.push(Queued {
            socket: socket.clone(),
            slot,
            queue,
        });
    }

    /// Where in `queries` the socket of pooled upstream `ui`'s slot `si` is, if this batch
    /// queued a query for it already and it is not due for rotation at `now`: the batch's next
    /// queries for that slot go there without reading the slot again (its lock and the
    /// socket's reference count: four locked instructions a query). A rotation by another
    /// thread meanwhile is seen by the next batch; until then the old socket, retired but
    /// still read, takes the rest of this one (a closed one takes none: see `forward`).
    fn queued_socket(&self, ui: usize, si: usize, now: Instant) -> Option<usize> {
        self.queries
            .iter()
            .rposition(|q| q.slot == Some((ui, si)))
            .filter(|&k| !self.queries[k].socket.is_due(now))
    }
}

/// The queries a batching worker queued for one upstream socket.
struct Queued {
    socket: Arc<UpstreamSocket>,
    /// The pooled upstream and the slot the socket was taken from (`None`: an original
    /// destination's, never looked up here: its upstream may be dropped and another opened
    /// in its place).
    slot: Option<(usize, usize)>,
    queue: SendBatch,
}

/// The upstream socket slots (of `n`) a query is offered to, in order: from `first` on, the
/// slots of `shard` (slot `si` belongs to shard `si % shards`), then every slot in case those
/// are full. Without a shard (or one with no slot): every slot from `first` on.
fn slot_order(
    n: usize,
    first: usize,
    shard: Option<(usize, usize)>,
) -> impl Iterator<Item = usize> {
    let (start, step, mine) = match shard {
        Some((shard, shards)) if shard < n && shards > 1 => {
            (shard, shards, (n - shard).div_ceil(shards))
        }
        _ => (0, 1, 0),
    };
    (0..mine)
        .map(move |j| start + step * ((first + j) % mine))
        .chain((0..n).map(move |k| (first + k) % n))
}

/// UDP replies waiting to leave through the listener sockets, one queue per listener socket,
/// and the forwarded queries that the batch ended, counted when its replies leave
/// ([`Shared::flush_replies`]).
pub(crate) struct Replies {
    queues: Vec<SendBatch>,
    pub(crate) ended: Ended,
}

impl Replies {
    pub(crate) fn new(listeners: usize) -> Self {
        Self {
            queues: (0..listeners).map(|_| SendBatch::default()).collect(),
            ended: Ended::default(),
        }
    }

    /// Queues a reply to `client` through listener `listener`.
    pub(crate) fn push(&mut self, listener: usize, bytes: &[u8], client: SocketAddr) {
        if let Some(queue) = self.queues.get_mut(listener) {
            queue.push(bytes, Some(client));
        }
    }
}

/// Forwarded queries that ended in a batch, by result and transport: added to the shared
/// counters, and taken off the in-flight count, once per batch instead of once per query.
/// Each of those is a locked instruction, which waits for the CPU's pending stores (a reply
/// was just copied): three per query were 0.7 % of the CPU at saturation (issue 39).
#[derive(Debug, Default)]
pub(crate) struct Ended {
    results: [u32; QueryResult::ALL.len()],
    transports: [u32; Transport::ALL.len()],
}

impl Ended {
    fn add(&mut self, result: QueryResult, transport: Transport) {
        self.results[result.index()] += 1;
        self.transports[transport as usize] += 1;
    }

    /// How many queries ended.
    fn queries(&self) -> usize {
        self.results.iter().map(|&n| n as usize).sum()
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
    /// Nothing to send, and the message was shorter than a DNS header: a TCP client's
    /// connection is closed.
    Runt,
}

/// How a query ended, for metrics and the query log.
struct Outcome {
    result: QueryResult,
    rcode: Option<u16>,
    upstream: Option<SocketAddr>,
    hold: Duration,
    /// The A and AAAA records of the answer section, when there was an answer.
    addresses: Option<usize>,
}

impl Outcome {
    fn local(result: QueryResult, rcode: Option<u8>) -> Self {
        Self {
            result,
            rcode: rcode.map(u16::from),
            upstream: None,
            hold: Duration::ZERO,
            addresses: None,
        }
    }
}

/// A validated answer on its way to the client.
struct Answer {
    origin: Origin,
    upstream: SocketAddr,
    /// The RCODE, with an OPT record's upper bits.
    rcode: u16,
    /// The A and AAAA records of the answer section (for the query log).
    addresses: usize,
    /// The answer's question.
    question: Question,
    /// When it arrived (for a cached answer: when it was taken from the cache).
    answered: Instant,
    /// Served from the answer cache (not stored again).
    cached: bool,
}

/// The A and AAAA records of a decoded answer section.
fn addresses(decoded: &Decoded) -> usize {
    decoded
        .answers
        .iter()
        .filter(|r| matches!(r.rtype, TYPE_A | TYPE_AAAA))
        .count()
}

/// Forgets the tasks of `set` that finished. An empty set is not looked into: that takes the
/// set's lock, a cache miss on a thread that just woke (0.4 % of the CPU at 20k qps).
pub(crate) fn forget_finished<T: 'static>(set: &mut tokio::task::JoinSet<T>) {
    if set.is_empty() {
        return;
    }
    while set.try_join_next().is_some() {}
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
    /// Sends what a batch left queued: each upstream socket's queries (one `sendmmsg` each,
    /// then the next batch starts on the next socket) and the replies (one per listener).
    pub(crate) async fn flush(&self, w: &mut Worker) {
        if !w.queries.is_empty() {
            for Queued { socket, queue, .. } in &mut w.queries {
                if queue.is_empty() {
                    continue;
                }
                let port = socket.port;
                // Only UDP sockets have queries queued (see `forward`).
                let Some(udp) = &socket.socket else {
                    continue;
                };
                queue
                    .flush(udp, |_, e| {
                        tracing::debug!(local_port = port, error = %e, "query not sent; it will time out");
                    })
                    .await;
            }
            w.spare_queues.extend(w.queries.drain(..).map(|q| q.queue));
            w.next_socket = w.next_socket.wrapping_add(1);
        }
        self.flush_replies(&mut w.replies).await;
        forget_finished(&mut w.pending);
    }

    /// Sends the queued replies, one `sendmmsg` per listener socket, then counts the queries
    /// they ended.
    pub(crate) async fn flush_replies(&self, replies: &mut Replies) {
        for (listener, queue) in replies.queues.iter_mut().enumerate() {
            if queue.is_empty() {
                continue;
            }
            let Some(l) = self.udp.get(listener) else {
                continue;
            };
            queue
                .flush(l.sender(), |client, e| {
                    tracing::debug!(?client, error = %e, "DNS reply not sent");
                })
                .await;
        }
        let ended = std::mem::take(&mut replies.ended);
        let queries = ended.queries();
        if queries > 0 {
            self.metrics
                .queries_ended(&ended.results, &ended.transports);
            // Last, as in `finish_admitted`.
            self.inflight.fetch_sub(queries, Ordering::Release);
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

    /// Milliseconds from the proxy's start to `now`.
    fn elapsed_ms(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.start).as_millis()).unwrap_or(u64::MAX)
    }

    /// Hands one message to the recorder, if recording is on.
    #[allow(
        clippy::too_many_arguments,
        reason = "the fields of one recorded message, at call sites that hold them apart"
    )]
    pub(crate) fn tap(
        &self,
        direction: Direction,
        client: SocketAddr,
        server: SocketAddr,
        transport: Transport,
        bytes: &[u8],
        (tag, redirected): (Option<u64>, bool),
        verdict: &'static str,
    ) {
        let Some(recorder) = self.recorder.as_ref().filter(|r| r.active()) else {
            return;
        };
        recorder.record(&Recorded {
            direction,
            client,
            server,
            transport,
            bytes,
            tag,
            redirected,
            verdict,
            unix_us: crate::record::unix_us(),
        });
    }

    /// Hands a reply to an admitted query to the recorder.
    pub(crate) fn tap_reply(&self, asked: &Asked, bytes: &[u8], result: QueryResult) {
        self.tap(
            Direction::Reply,
            asked.client,
            asked.server,
            asked.transport,
            bytes,
            (Some(asked.tag), asked.redirected),
            result.as_str(),
        );
    }

    /// A forwarded query ended: counted now, or with `ended`'s batch when its reply was queued
    /// in one (logged now either way).
    fn finish_admitted(&self, asked: &Asked, outcome: Outcome, ended: Option<&mut Ended>) {
        let now = ended.is_none();
        self.finish(
            asked.client,
            asked.transport,
            &asked.name,
            Some(asked.qtype),
            asked.received,
            outcome,
            ended,
        );
        if now {
            // Last, so a snapshot showing nothing in flight includes this query's counts.
            self.inflight.fetch_sub(1, Ordering::Release);
        }
    }

    /// Counts the query (now, or in `ended` for its batch) and writes its log entry.
    #[allow(
        clippy::too_many_arguments,
        reason = "the query's parts, for its count and its log entry"
    )]
    fn finish(
        &self,
        client: SocketAddr,
        transport: Transport,
        name: &str,
        qtype: Option<RecordType>,
        received: Instant,
        outcome: Outcome,
        ended: Option<&mut Ended>,
    ) {
        match ended {
            Some(ended) => ended.add(outcome.result, transport),
            None => {
                self.metrics.query(outcome.result);
                self.metrics.transport_query(transport);
            }
        }
        let Some(log) = &self.query_log else { return };
        let total = received.elapsed();
        let answers = outcome.addresses.unwrap_or(0);
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

/// What became of an answer shown to the observer.
pub(crate) enum Held {
    /// The reply is out (or the fallback was applied): the query's canonical name comes back,
    /// for its buffer to serve another query.
    Done(String),
    /// The observer is still working: the task that holds the answer until it is done.
    Pending(Slow),
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

#[cfg(test)]
mod tests {
    use super::slot_order;

    fn order(n: usize, first: usize, shard: Option<(usize, usize)>) -> Vec<usize> {
        slot_order(n, first, shard).collect()
    }

    #[test]
    fn a_worker_offers_its_own_shards_slots_first_then_every_slot() {
        // 4 slots over 2 shards: shard 0 owns 0 and 2, shard 1 owns 1 and 3.
        assert_eq!(order(4, 0, Some((0, 2))), [0, 2, 0, 1, 2, 3]);
        assert_eq!(order(4, 1, Some((0, 2))), [2, 0, 1, 2, 3, 0]);
        assert_eq!(order(4, 0, Some((1, 2))), [1, 3, 0, 1, 2, 3]);
        // 3 slots over 2 shards: shard 1 owns slot 1 only.
        assert_eq!(order(3, 5, Some((1, 2))), [1, 2, 0, 1]);
        // A shard with no slot (an encrypted upstream's single slot) and no shard at all.
        assert_eq!(order(1, 3, Some((1, 2))), [0]);
        assert_eq!(order(3, 4, None), [1, 2, 0]);
        assert_eq!(order(3, 4, Some((0, 1))), [1, 2, 0]);
    }
}
