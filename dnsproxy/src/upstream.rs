//! Upstreams: their long-lived UDP sockets, the in-flight table of each socket, and health.
//!
//! Each upstream has `upstream_sockets` connected UDP sockets, each on a kernel-chosen
//! ephemeral port, opened once at bind. A forwarded query gets a random ID that is free on the
//! socket it leaves from; the socket's in-flight table maps that ID back to the client. The
//! table's lock is held for a lookup or an insert, never across an `.await`.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use hickory_proto::rr::RecordType;
use metrics::Gauge;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::Error;
use crate::ids::{BuildIdHasher, IdSource};
use crate::metrics::{DropReason, UpstreamHealth};
use crate::policy::Transport;
use crate::wire::Opt;

/// At most this many queries in flight on one upstream socket; past it the next socket is
/// tried. Leaves room in the 16-bit ID space so a random free ID is found in a few draws.
pub(crate) const MAX_INFLIGHT_PER_SOCKET: usize = 32_768;

/// Random draws before a socket is considered full.
const ID_DRAWS: usize = 64;

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

/// The way back to a TCP client for one query. Dropping it unsent tells the writer the query
/// ended without a reply.
#[derive(Debug)]
pub(crate) struct TcpReply {
    tx: mpsc::UnboundedSender<TcpOut>,
    sent: bool,
}

impl TcpReply {
    pub(crate) fn new(tx: mpsc::UnboundedSender<TcpOut>) -> Self {
        Self { tx, sent: false }
    }

    /// Queues the reply (ignored if the connection is gone).
    pub(crate) fn send(mut self, reply: Vec<u8>) {
        self.sent = true;
        let _ = self.tx.send(Some(reply));
    }
}

impl Drop for TcpReply {
    fn drop(&mut self) {
        if !self.sent {
            let _ = self.tx.send(None);
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
    /// The client's UDP payload size (EDNS0, at least 512).
    pub(crate) udp_limit: u16,
    /// The client's OPT record, if it sent one.
    pub(crate) opt: Option<Opt>,
    pub(crate) received: Instant,
}

/// One query outstanding on an upstream socket.
#[derive(Debug)]
pub(crate) struct Inflight {
    /// The query as sent: the client's bytes with the upstream ID (kept for a TCP retry and
    /// for the replies the proxy writes itself).
    pub(crate) query: Vec<u8>,
    /// Where its question ends.
    pub(crate) question_end: usize,
    pub(crate) sent: Instant,
    /// `None` for a health probe.
    pub(crate) origin: Option<Origin>,
}

/// What became of an ID on a socket; tells late and duplicate answers from unknown ones.
const ID_FREE: u8 = 0;
const ID_ANSWERED: u8 = 1;
const ID_EXPIRED: u8 = 2;

/// The in-flight table of one upstream socket.
pub(crate) struct Table {
    entries: HashMap<u16, Inflight, BuildIdHasher>,
    /// Per ID, what became of its last query (until the ID is reused).
    history: Box<[u8]>,
}

impl Table {
    fn new() -> Self {
        Self {
            entries: HashMap::with_capacity_and_hasher(256, BuildIdHasher::default()),
            history: vec![ID_FREE; 1 << 16].into_boxed_slice(),
        }
    }

    /// Reserves a random ID free on this socket; `None` if the socket is full.
    pub(crate) fn insert(&mut self, ids: &mut IdSource) -> Option<VacantId<'_>> {
        if self.entries.len() >= MAX_INFLIGHT_PER_SOCKET {
            return None;
        }
        for _ in 0..ID_DRAWS {
            let id = ids.next_id();
            if !self.entries.contains_key(&id) {
                return Some(VacantId { table: self, id });
            }
        }
        None
    }

    /// Takes the query `id` out if `matches` accepts it; otherwise says why the answer is
    /// dropped. The entry stays when the question does not match (the real answer may follow).
    pub(crate) fn take(
        &mut self,
        id: u16,
        matches: impl FnOnce(&Inflight) -> bool,
    ) -> Result<Inflight, DropReason> {
        let Entry::Occupied(entry) = self.entries.entry(id) else {
            return Err(match self.history[usize::from(id)] {
                ID_ANSWERED => DropReason::Duplicate,
                ID_EXPIRED => DropReason::Late,
                _ => DropReason::UnknownId,
            });
        };
        if !matches(entry.get()) {
            return Err(DropReason::QuestionMismatch);
        }
        self.history[usize::from(id)] = ID_ANSWERED;
        Ok(entry.remove())
    }

    /// Moves every query sent at or before `cutoff` into `out`.
    pub(crate) fn expire(&mut self, cutoff: Instant, out: &mut Vec<(u16, Inflight)>) {
        let start = out.len();
        out.extend(self.entries.extract_if(|_, e| e.sent <= cutoff));
        for (id, _) in &out[start..] {
            self.history[usize::from(*id)] = ID_EXPIRED;
        }
    }

    /// Queries outstanding.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// A free ID reserved under the table's lock.
pub(crate) struct VacantId<'a> {
    table: &'a mut Table,
    id: u16,
}

impl VacantId<'_> {
    pub(crate) fn id(&self) -> u16 {
        self.id
    }

    pub(crate) fn fill(self, entry: Inflight) {
        self.table.history[usize::from(self.id)] = ID_FREE;
        self.table.entries.insert(self.id, entry);
    }
}

/// One connected UDP socket towards an upstream, with its in-flight table.
pub(crate) struct UpstreamSocket {
    pub(crate) socket: UdpSocket,
    table: Mutex<Table>,
}

impl UpstreamSocket {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One upstream server.
pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    pub(crate) sockets: Vec<UpstreamSocket>,
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
    /// Opens `sockets` connected UDP sockets to `addr`, each on its own ephemeral port.
    pub(crate) fn bind(addr: SocketAddr, sockets: usize, up_gauge: Gauge) -> Result<Self, Error> {
        let mut v = Vec::with_capacity(sockets);
        for _ in 0..sockets {
            let socket = connect_udp(addr).map_err(|source| Error::UpstreamSocket {
                upstream: addr,
                source,
            })?;
            v.push(UpstreamSocket {
                socket,
                table: Mutex::new(Table::new()),
            });
        }
        up_gauge.set(1.0);
        Ok(Self {
            addr,
            sockets: v,
            alive: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            last_rtt_us: AtomicU64::new(u64::MAX),
            last_answer_ms: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            up_gauge,
        })
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
            tracing::info!(upstream = %self.addr, "DNS upstream is back");
            self.up_gauge.set(1.0);
        }
        let rtt_us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX - 1);
        self.last_rtt_us.store(rtt_us, Ordering::Relaxed);
        if self.last_answer_ms.load(Ordering::Relaxed) != now_ms {
            self.last_answer_ms.store(now_ms, Ordering::Relaxed);
        }
    }

    /// A timeout or a failed probe; `threshold` consecutive ones mark the upstream dead.
    pub(crate) fn on_failure(&self, threshold: u32) {
        let n = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if n >= threshold && self.alive.swap(false, Ordering::Relaxed) {
            tracing::warn!(upstream = %self.addr, failures = n, "DNS upstream marked dead");
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
    table: RwLock<HashMap<SocketAddr, Arc<Upstream>>>,
    started: mpsc::UnboundedSender<Arc<Upstream>>,
    gauge: Gauge,
}

impl OriginalUpstreams {
    /// The table, and where its new upstreams are announced.
    pub(crate) fn new(
        max: usize,
        sockets: usize,
        gauge: Gauge,
    ) -> (Self, mpsc::UnboundedReceiver<Arc<Upstream>>) {
        let (started, rx) = mpsc::unbounded_channel();
        let table = Self {
            max,
            sockets,
            table: RwLock::new(HashMap::new()),
            started,
            gauge,
        };
        (table, rx)
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
        let upstream =
            Arc::new(Upstream::bind(addr, self.sockets, Gauge::noop()).map_err(OpenError::Socket)?);
        table.insert(addr, upstream.clone());
        #[allow(clippy::cast_precision_loss, reason = "a gauge")]
        self.gauge.set(table.len() as f64);
        tracing::debug!(upstream = %addr, open = table.len(), "DNS upstream opened for an original destination");
        // Nobody listens once the proxy stopped: then nothing is received, as for the others.
        let _ = self.started.send(upstream.clone());
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

/// A UDP socket bound to an ephemeral port of the upstream's family and connected to it, so
/// the kernel drops datagrams from any other source.
fn connect_udp(upstream: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(upstream),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    let local: SocketAddr = if upstream.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    // Bursts of answers must not overflow the default buffer; best effort.
    let _ = socket.set_recv_buffer_size(4 << 20);
    socket.bind(&SockAddr::from(local))?;
    socket.connect(&SockAddr::from(upstream))?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inflight(sent: Instant) -> Inflight {
        Inflight {
            query: Vec::new(),
            question_end: 0,
            sent,
            origin: None,
        }
    }

    #[tokio::test]
    async fn original_destinations_are_opened_once_and_bounded() {
        let (table, mut started) = OriginalUpstreams::new(2, 3, Gauge::noop());
        let a: SocketAddr = "127.0.0.1:5301".parse().unwrap();
        let b: SocketAddr = "[::1]:5302".parse().unwrap();
        let c: SocketAddr = "127.0.0.1:5303".parse().unwrap();
        let first = table.get_or_open(a).unwrap();
        assert_eq!(first.sockets.len(), 3);
        assert!(Arc::ptr_eq(&first, &table.get_or_open(a).unwrap()), "kept");
        table.get_or_open(b).unwrap();
        assert!(matches!(table.get_or_open(c), Err(OpenError::Full)));
        assert_eq!(table.len(), 2);
        // The known ones still work past the bound.
        assert!(table.get_or_open(b).is_ok());
        // Each new upstream is announced once, for its receivers.
        assert_eq!(started.try_recv().unwrap().addr, a);
        assert_eq!(started.try_recv().unwrap().addr, b);
        assert!(started.try_recv().is_err());
        let mut all = Vec::new();
        table.snapshot(&mut all);
        assert_eq!(all.len(), 2);
    }

    #[test]
    fn ids_are_unique_and_history_classifies_misses() {
        let mut table = Table::new();
        let mut ids = IdSource::new();
        let t0 = Instant::now();
        let mut taken = Vec::new();
        for _ in 0..1000 {
            let slot = table.insert(&mut ids).unwrap();
            taken.push(slot.id());
            slot.fill(inflight(t0));
        }
        assert_eq!(table.len(), 1000);
        let a = taken[0];
        assert!(table.take(a, |_| false).is_err());
        assert!(table.take(a, |_| true).is_ok());
        assert!(matches!(
            table.take(a, |_| true),
            Err(DropReason::Duplicate)
        ));
        let mut out = Vec::new();
        table.expire(t0, &mut out);
        assert_eq!(out.len(), 999);
        let b = taken[1];
        assert!(matches!(table.take(b, |_| true), Err(DropReason::Late)));
        let unknown = (0..=u16::MAX).find(|i| !taken.contains(i)).unwrap();
        assert!(matches!(
            table.take(unknown, |_| true),
            Err(DropReason::UnknownId)
        ));
    }
}
