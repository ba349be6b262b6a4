//! Upstreams: their slots of long-lived UDP sockets (each rotated onto a fresh port now and
//! then, see [`crate::upstream_socket`]), health, and the upstreams opened for original
//! destinations. An encrypted upstream has one slot whose table has no UDP socket: its queries
//! leave through its transport ([`crate::upstream_encrypted`]).
//!
//! Each upstream has `upstream_sockets` slots, each holding one connected UDP socket on a
//! kernel-chosen ephemeral port. A forwarded query gets a random ID that is free on the socket
//! it leaves from; the socket's in-flight table maps that ID back to the client. The table's
//! lock is held for a lookup or an insert, never across an `.await`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use hickory_proto::rr::RecordType;
use metrics::Gauge;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::error::Error;
use crate::metrics::UpstreamHealth;
use crate::policy::Transport;
use crate::shards::Shards;
use crate::upstream_encrypted::Encrypted;
use crate::upstream_socket::{Rotation, Table, UpstreamSocket};
use crate::wire::Opt;

/// A socket whose receiver `DnsProxy::run` must start (on the shard thread of its slot, the
/// last field): opened for a new original destination, or by a rotation without shards.
pub(crate) type NewSocket = (Arc<Upstream>, Arc<UpstreamSocket>, usize);

/// How a reply reaches the client.
#[derive(Debug)]
pub(crate) enum ReplyTo {
    /// Through the UDP listener socket with index `listener` (any socket of the address will
    /// do: they share it), or through the raw socket when `server`, the query's original
    /// destination, is not the listener's bound address (transparent mode).
    Udp { listener: usize, server: SocketAddr },
    /// Through the TCP connection's writer.
    Tcp(TcpReply),
}

/// One message for a TCP connection's writer: a reply, or `None` when the query ends without
/// one (so the connection's pipeline slot is released either way).
pub(crate) type TcpOut = Option<Vec<u8>>;

/// The way back to a stream client (TCP, DoT, DoH) for one query. Dropping it unsent tells
/// the writer the query ended without a reply.
#[derive(Debug)]
pub(crate) struct TcpReply {
    to: ReplySink,
    sent: bool,
}

/// Where a stream client's reply goes.
#[derive(Debug)]
enum ReplySink {
    /// A connection's writer, which serves many queries (TCP and DoT pipelining).
    Connection(mpsc::UnboundedSender<TcpOut>),
    /// The one request waiting for it (a DoH stream); dropped unsent, the request sees the
    /// sender gone.
    Request(Option<oneshot::Sender<Vec<u8>>>),
}

impl TcpReply {
    pub(crate) fn new(tx: mpsc::UnboundedSender<TcpOut>) -> Self {
        Self {
            to: ReplySink::Connection(tx),
            sent: false,
        }
    }

    /// The way back to one request that waits for its reply on `tx`'s receiver.
    pub(crate) fn request(tx: oneshot::Sender<Vec<u8>>) -> Self {
        Self {
            to: ReplySink::Request(Some(tx)),
            sent: false,
        }
    }

    /// Queues the reply (ignored if the connection is gone).
    pub(crate) fn send(mut self, reply: Vec<u8>) {
        self.sent = true;
        match &mut self.to {
            ReplySink::Connection(tx) => {
                let _ = tx.send(Some(reply));
            }
            ReplySink::Request(tx) => {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(reply);
                }
            }
        }
    }
}

impl Drop for TcpReply {
    fn drop(&mut self) {
        if let (false, ReplySink::Connection(tx)) = (self.sent, &self.to) {
            let _ = tx.send(None);
        }
    }
}

/// A forwarded query's way back and what the reply needs.
#[derive(Debug)]
pub(crate) struct Origin {
    pub(crate) reply: ReplyTo,
    pub(crate) asked: Asked,
}

/// Who asked a forwarded query, and what.
#[derive(Debug)]
pub(crate) struct Asked {
    pub(crate) client: SocketAddr,
    pub(crate) server: SocketAddr,
    pub(crate) transport: Transport,
    /// The client's own ID, written back into the answer.
    pub(crate) client_id: u16,
    /// Canonical question name.
    pub(crate) name: String,
    pub(crate) qtype: RecordType,
    /// From the policy's verdict.
    pub(crate) tag: u64,
    /// Redirected at the socket level (the recording says so).
    pub(crate) redirected: bool,
    /// The client's UDP payload size (EDNS0, at least 512).
    pub(crate) udp_limit: u16,
    /// The client's OPT record, if it sent one.
    pub(crate) opt: Option<Opt>,
    /// What of the query the answer cache's key holds besides the question and tag
    /// (`cache::key_flags`).
    pub(crate) cache_flags: u8,
    pub(crate) received: Instant,
}

/// One upstream server.
pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    /// As configured (`192.0.2.1:53`, `tls://…`), for logs.
    pub(crate) label: String,
    /// DoT or DoH: queries leave through this transport, not through UDP sockets (its single
    /// slot holds the in-flight table only; see [`crate::upstream_encrypted`]).
    pub(crate) encrypted: Option<Encrypted>,
    /// The sockets queries leave on; each slot's socket is replaced by rotation.
    slots: Vec<RwLock<Arc<UpstreamSocket>>>,
    /// Retired sockets whose queries are still in flight (their receivers run until drained).
    draining: Mutex<Vec<Arc<UpstreamSocket>>>,
    /// The in-flight tables of closed sockets, emptied, for the next rotations (at most one
    /// per slot).
    recycled: Mutex<Vec<Table>>,
    rotation: Rotation,
    /// Slot `si`'s socket is read by shard `si`'s thread (or by the caller's reactor).
    shards: Shards,
    alive: AtomicBool,
    failures: AtomicU32,
    /// Microseconds; `u64::MAX` until the first answer.
    last_rtt_us: AtomicU64,
    /// Milliseconds since the proxy started when the last good answer came.
    last_answer_ms: AtomicU64,
    /// A probe is outstanding.
    pub(crate) probing: AtomicBool,
    up_gauge: Gauge,
}

impl Upstream {
    /// Opens `sockets` connected UDP sockets to `addr`, each on its own ephemeral port and
    /// registered with its slot's shard.
    pub(crate) fn bind(
        addr: SocketAddr,
        sockets: usize,
        rotation: Rotation,
        up_gauge: Gauge,
        shards: &Shards,
    ) -> Result<Self, Error> {
        let now = Instant::now();
        let mut slots = Vec::with_capacity(sockets);
        for _ in 0..sockets {
            let socket = UpstreamSocket::open(addr, rotation, now, Table::new(), shards.watcher())
                .map_err(|source| Error::UpstreamSocket {
                    upstream: addr,
                    error: source,
                })?;
            slots.push(RwLock::new(Arc::new(socket)));
        }
        Ok(Self::with_slots(
            addr,
            addr.to_string(),
            None,
            (slots, shards.clone()),
            rotation,
            up_gauge,
        ))
    }

    /// An encrypted upstream: one slot (never rotated) whose table has no UDP socket; its
    /// queries go to `encrypted`.
    pub(crate) fn encrypted(
        upstream: &crate::UpstreamAddr,
        encrypted: Encrypted,
        up_gauge: Gauge,
    ) -> Self {
        let never = Rotation {
            max_queries: 0,
            max_age: Duration::ZERO,
        };
        let socket = UpstreamSocket::without_socket(never, Instant::now());
        Self::with_slots(
            upstream.addr,
            upstream.to_string(),
            Some(encrypted),
            (vec![RwLock::new(Arc::new(socket))], Shards::default()),
            never,
            up_gauge,
        )
    }

    /// An upstream over `slots` (on `shards`), alive until its health checks say otherwise.
    fn with_slots(
        addr: SocketAddr,
        label: String,
        encrypted: Option<Encrypted>,
        (slots, shards): (Vec<RwLock<Arc<UpstreamSocket>>>, Shards),
        rotation: Rotation,
        up_gauge: Gauge,
    ) -> Self {
        up_gauge.set(1.0);
        Self {
            addr,
            label,
            encrypted,
            slots,
            draining: Mutex::new(Vec::new()),
            recycled: Mutex::new(Vec::new()),
            rotation,
            shards,
            alive: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            last_rtt_us: AtomicU64::new(u64::MAX),
            last_answer_ms: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            up_gauge,
        }
    }

    /// Number of socket slots.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// The socket in slot `si` now.
    pub(crate) fn socket(&self, si: usize) -> Arc<UpstreamSocket> {
        self.slots[si]
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Appends every socket with a receiver: the current ones and those draining. Drained ones
    /// (closed by their receiver) are forgotten here.
    pub(crate) fn all_sockets(&self, out: &mut Vec<Arc<UpstreamSocket>>) {
        out.extend((0..self.slots.len()).map(|si| self.socket(si)));
        let mut draining = self.draining.lock().unwrap_or_else(PoisonError::into_inner);
        draining.retain(|s| !s.lock().is_closed());
        out.extend(draining.iter().cloned());
    }

    /// Replaces `current`, the socket of slot `si`, by one on a fresh port, if it is still the
    /// slot's socket (another query may have rotated it already): `Ok(Some(new))` after a
    /// rotation, whose receiver the caller must start; `Ok(None)` if it was rotated already.
    /// The old socket is retired: it drains its queries in flight, then closes. On an error
    /// (no file descriptor left, …) the old socket stays in service and is tried again later.
    pub(crate) fn rotate(
        &self,
        si: usize,
        current: &Arc<UpstreamSocket>,
        now: Instant,
    ) -> std::io::Result<Option<Arc<UpstreamSocket>>> {
        let mut slot = self.slots[si]
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if !Arc::ptr_eq(&slot, current) {
            return Ok(None);
        }
        let table = self
            .recycled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_else(Table::new);
        let opened =
            UpstreamSocket::open(self.addr, self.rotation, now, table, self.shards.watcher());
        let fresh = match opened {
            Ok(fresh) => Arc::new(fresh),
            Err(e) => {
                current.postpone(self.rotation, now);
                return Err(e);
            }
        };
        // The old socket's spare buffers serve the new one.
        std::mem::swap(&mut current.lock().spare, &mut fresh.lock().spare);
        let old = std::mem::replace(&mut *slot, fresh.clone());
        drop(slot);
        old.retire();
        self.draining
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(old);
        Ok(Some(fresh))
    }

    /// Keeps the in-flight table of a socket that closed (`close_if_drained`) for a later
    /// rotation, emptied; dropped past one per slot.
    pub(crate) fn recycle(&self, table: Table) {
        let mut recycled = self.recycled.lock().unwrap_or_else(PoisonError::into_inner);
        if recycled.len() < self.slots.len() {
            recycled.push(table.recycle());
        }
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// A good answer (to a query or a probe): the upstream is alive.
    pub(crate) fn on_success(&self, rtt: Duration, now_ms: u64) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if !self.alive.load(Ordering::Relaxed) && !self.alive.swap(true, Ordering::Relaxed) {
            tracing::info!(upstream = %self.label, "DNS upstream is back");
            self.up_gauge.set(1.0);
        }
        let rtt_us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX - 1);
        self.last_rtt_us.store(rtt_us, Ordering::Relaxed);
        if self.last_answer_ms.load(Ordering::Relaxed) != now_ms {
            self.last_answer_ms.store(now_ms, Ordering::Relaxed);
        }
    }

    /// A sweep found timed-out queries or a failed probe (one call per sweep); `threshold`
    /// consecutive ones mark the upstream dead.
    pub(crate) fn on_failure(&self, threshold: u32) {
        let n = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if n >= threshold && self.alive.swap(false, Ordering::Relaxed) {
            tracing::warn!(upstream = %self.label, failures = n, "DNS upstream marked dead");
            self.up_gauge.set(0.0);
        }
    }

    pub(crate) fn last_answer_ms(&self) -> u64 {
        self.last_answer_ms.load(Ordering::Relaxed)
    }

    pub(crate) fn health(&self) -> UpstreamHealth {
        let rtt = self.last_rtt_us.load(Ordering::Relaxed);
        UpstreamHealth {
            addr: self.addr,
            label: self.label.clone(),
            alive: self.is_alive(),
            consecutive_failures: self.failures.load(Ordering::Relaxed),
            last_rtt: (rtt != u64::MAX).then(|| Duration::from_micros(rtt)),
        }
    }
}

/// Why no upstream could be had for an original destination.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// `max_original_destinations` are open.
    Full,
    /// Its sockets could not be opened.
    Socket(Error),
}

/// Upstreams for original destinations (`forward_to_original_destination`): opened on first
/// use, at most `max`, then kept until the proxy stops. Each new one is sent to
/// `DnsProxy::run`, which starts its receivers with the others (and stops them with the
/// others). They are not health-checked: there is no other server to fail over to (the client
/// chose this one), so each query is forwarded and a timeout is answered per
/// `on_upstream_timeout`.
pub(crate) struct OriginalUpstreams {
    max: usize,
    sockets: usize,
    rotation: Rotation,
    table: RwLock<HashMap<SocketAddr, Arc<Upstream>>>,
    started: mpsc::UnboundedSender<NewSocket>,
    gauge: Gauge,
    shards: Shards,
}

impl OriginalUpstreams {
    /// The table; the sockets of its new upstreams are announced on `started`.
    pub(crate) fn new(
        max: usize,
        sockets: usize,
        rotation: Rotation,
        gauge: Gauge,
        started: mpsc::UnboundedSender<NewSocket>,
        shards: Shards,
    ) -> Self {
        Self {
            max,
            sockets,
            rotation,
            table: RwLock::new(HashMap::new()),
            started,
            gauge,
            shards,
        }
    }

    /// The upstream for `addr`, opened now if it is new and there is room.
    pub(crate) fn get_or_open(&self, addr: SocketAddr) -> Result<Arc<Upstream>, OpenError> {
        if let Some(upstream) = self
            .table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&addr)
        {
            return Ok(upstream.clone());
        }
        let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(upstream) = table.get(&addr) {
            return Ok(upstream.clone());
        }
        if table.len() >= self.max {
            return Err(OpenError::Full);
        }
        let upstream = Arc::new(
            Upstream::bind(
                addr,
                self.sockets,
                self.rotation,
                Gauge::noop(),
                &self.shards,
            )
            .map_err(OpenError::Socket)?,
        );
        table.insert(addr, upstream.clone());
        #[allow(clippy::cast_precision_loss, reason = "a gauge")]
        self.gauge.set(table.len() as f64);
        tracing::debug!(upstream = %addr, open = table.len(), "DNS upstream opened for an original destination");
        // Nobody listens once the proxy stopped: then nothing is received, as for the others.
        for si in 0..upstream.slots() {
            let _ = self
                .started
                .send((upstream.clone(), upstream.socket(si), si));
        }
        Ok(upstream)
    }

    /// Appends every upstream open.
    pub(crate) fn snapshot(&self, out: &mut Vec<Arc<Upstream>>) {
        out.extend(
            self.table
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned(),
        );
    }

    /// Upstreams open.
    pub(crate) fn len(&self) -> usize {
        self.table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEVER: Rotation = Rotation {
        max_queries: 0,
        max_age: Duration::ZERO,
    };

    #[tokio::test]
    async fn original_destinations_are_opened_once_and_bounded() {
        let (tx, mut started) = mpsc::unbounded_channel();
        let table = OriginalUpstreams::new(2, 3, NEVER, Gauge::noop(), tx, Shards::default());
        let a: SocketAddr = "127.0.0.1:5301".parse().unwrap();
        let b: SocketAddr = "[::1]:5302".parse().unwrap();
        let c: SocketAddr = "127.0.0.1:5303".parse().unwrap();
        let first = table.get_or_open(a).unwrap();
        assert_eq!(first.slots(), 3);
        assert!(Arc::ptr_eq(&first, &table.get_or_open(a).unwrap()), "kept");
        table.get_or_open(b).unwrap();
        assert!(matches!(table.get_or_open(c), Err(OpenError::Full)));
        assert_eq!(table.len(), 2);
        // The known ones still work past the bound.
        assert!(table.get_or_open(b).is_ok());
        // Each socket of a new upstream is announced once, for its receiver.
        for addr in [a, a, a, b, b, b] {
            assert_eq!(started.try_recv().unwrap().0.addr, addr);
        }
        assert!(started.try_recv().is_err());
        let mut all = Vec::new();
        table.snapshot(&mut all);
        assert_eq!(all.len(), 2);
    }

    #[tokio::test]
    async fn rotation_moves_a_slot_to_a_new_port_and_drains_the_old_socket() {
        let addr: SocketAddr = "127.0.0.1:5301".parse().unwrap();
        let upstream = Upstream::bind(addr, 1, NEVER, Gauge::noop(), &Shards::default()).unwrap();
        let now = Instant::now();
        let old = upstream.socket(0);
        let new = upstream.rotate(0, &old, now).unwrap().unwrap();
        assert!(Arc::ptr_eq(&upstream.socket(0), &new));
        assert_ne!(old.port, new.port, "a fresh ephemeral port");
        assert!(old.is_retired() && !new.is_retired());
        // A second rotation of the same (already replaced) socket does nothing.
        assert!(upstream.rotate(0, &old, now).unwrap().is_none());
        let mut all = Vec::new();
        upstream.all_sockets(&mut all);
        assert_eq!(all.len(), 2, "the old socket drains");
        upstream.recycle(old.close_if_drained().expect("nothing in flight"));
        all.clear();
        upstream.all_sockets(&mut all);
        assert_eq!(all.len(), 1, "closed sockets are forgotten");
        // The next rotation takes the closed socket's table; none is kept past one per slot.
        assert_eq!(upstream.recycled.lock().unwrap().len(), 1);
        let newer = upstream.rotate(0, &new, now).unwrap().unwrap();
        assert!(upstream.recycled.lock().unwrap().is_empty());
        assert!(!newer.lock().is_closed() && newer.lock().len() == 0);
        for socket in [&new, &newer] {
            socket.retire();
            upstream.recycle(socket.close_if_drained().expect("nothing in flight"));
        }
        assert_eq!(upstream.recycled.lock().unwrap().len(), 1);
    }
}
