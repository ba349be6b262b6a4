//! One long-lived UDP socket towards an upstream, its in-flight table, and when it is due to be
//! replaced by a socket on a fresh ephemeral port.
//!
//! An off-path spoofer must guess the query ID *and* the source port of a query in flight. With
//! a fixed set of sockets opened once, the port stops being a secret after one observation, so
//! each socket is retired after [`Rotation::max_queries`] queries or [`Rotation::max_age`]
//! (unbound picks a new port per query; dnsdist keeps a fixed pool: this sits between, keeping
//! the fixed pool's cost). A retired socket takes no new queries; its receiver keeps reading
//! until its last query is answered or expired, then closes it.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::ids::{BuildIdHasher, IdSource};
use crate::metrics::DropReason;
use crate::question::Question;
use crate::udp::{UdpSocket, Watcher};
use crate::upstream::Origin;

/// At most this many queries in flight on one upstream socket; past it the next socket is
/// tried. Leaves room in the 16-bit ID space so a random free ID is found in a few draws.
pub(crate) const MAX_INFLIGHT_PER_SOCKET: usize = 32_768;

/// Random draws before a socket is considered full.
const ID_DRAWS: usize = 64;

/// After a failed rotation (no file descriptor, …) the socket is tried again after this long.
const ROTATION_RETRY: Duration = Duration::from_secs(1);

/// When an upstream socket is replaced by one on a fresh port; 0 / zero disables a bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rotation {
    /// Queries sent on one socket before it is replaced.
    pub(crate) max_queries: u64,
    /// Age after which the next query replaces it.
    pub(crate) max_age: Duration,
}

/// One query outstanding on an upstream socket.
#[derive(Debug)]
pub(crate) struct Inflight {
    /// The query with the upstream ID and the client's question, byte for byte (kept for a TCP
    /// retry and for the replies the proxy writes itself). A buffer from [`Spare`].
    pub(crate) query: Vec<u8>,
    /// The question of `query`.
    pub(crate) question: Question,
    /// The question name as sent upstream when its case was randomised (0x20); the answer must
    /// echo exactly these bytes. Empty when the case was not randomised (a name's wire form
    /// is never empty). A buffer from [`Spare`].
    pub(crate) sent_name: Vec<u8>,
    pub(crate) sent: Instant,
    /// `None` for a health probe.
    pub(crate) origin: Option<Origin>,
}

impl Inflight {
    /// Whether `answer` (whose first question is `answered`, if it has one) answers this
    /// query: exactly one question, the same (name case-insensitively, type and class
    /// exactly); with 0x20, the name exactly as sent. A health probe accepts an answer without
    /// a question.
    pub(crate) fn check_question(
        &self,
        answer: &[u8],
        answered: Option<Question>,
    ) -> Result<(), DropReason> {
        let Some(answered) = answered else {
            return match self.origin {
                None => Ok(()),
                Some(_) => Err(DropReason::QuestionMismatch),
            };
        };
        // Extra questions are no part of an answer to one (and nobody says what they mean).
        if crate::wire::qdcount(answer) != 1 || !answered.same(answer, self.question, &self.query) {
            return Err(DropReason::QuestionMismatch);
        }
        if !self.sent_name.is_empty() && answered.name(answer) != &self.sent_name[..] {
            return Err(DropReason::CaseMismatch);
        }
        Ok(())
    }
}

/// Spare buffers kept per socket: at most this many of each kind.
const SPARE_MAX: usize = 1024;

/// A buffer bigger than this is not kept (a rare big query must not pin its memory).
const SPARE_CAPACITY_MAX: usize = 512;

/// Buffers of queries that ended, kept (emptied, capacity kept) for the next queries on the
/// socket: a query's canonical name, its bytes and the name as sent (0x20) cost no allocation
/// once the proxy is warm. Taken under the table's lock when a query goes in flight, given
/// back by the socket's receiver under the lock it takes for the next answer.
#[derive(Debug, Default)]
pub(crate) struct Spare {
    names: Vec<String>,
    bytes: Vec<Vec<u8>>,
}

impl Spare {
    /// An empty name buffer (a new one, without capacity, when none is spare).
    pub(crate) fn name(&mut self) -> String {
        self.names.pop().unwrap_or_default()
    }

    /// An empty byte buffer (a new one, without capacity, when none is spare).
    pub(crate) fn bytes(&mut self) -> Vec<u8> {
        self.bytes.pop().unwrap_or_default()
    }

    pub(crate) fn keep_name(&mut self, mut name: String) {
        if (1..=SPARE_CAPACITY_MAX).contains(&name.capacity()) && self.names.len() < SPARE_MAX {
            name.clear();
            self.names.push(name);
        }
    }

    pub(crate) fn keep_bytes(&mut self, mut bytes: Vec<u8>) {
        if (1..=SPARE_CAPACITY_MAX).contains(&bytes.capacity()) && self.bytes.len() < SPARE_MAX {
            bytes.clear();
            self.bytes.push(bytes);
        }
    }

    /// Moves `other`'s buffers here (as many as are kept).
    pub(crate) fn take_all(&mut self, other: &mut Self) {
        for name in other.names.drain(..) {
            self.keep_name(name);
        }
        for bytes in other.bytes.drain(..) {
            self.keep_bytes(bytes);
        }
    }
}

/// What became of an ID's last query on a socket; tells late and duplicate answers from
/// unknown ones.
const ID_UNUSED: u8 = 0;
const ID_ANSWERED: u8 = 1;
const ID_EXPIRED: u8 = 2;

/// Notes kept before they are written into an [`IdHistory`]'s bits, all at once.
const ID_NOTES_QUEUED: usize = 64;

/// Per ID of a socket, what became of its last query: two bits each, 16 KiB in all. Answers
/// come with random IDs, so writing each note at once was a cache miss per answer (a third of
/// `on_answer`'s own time at saturation); notes are queued, and written 64 at a time, whose
/// misses the CPU then waits for together. A lookup (for an answer to no query in flight: rare)
/// writes the queue first. While an ID is in flight its note is stale and unread: the table's
/// index answers first.
struct IdHistory {
    bits: Box<[u8]>,
    queued: Vec<(u16, u8)>,
}

impl IdHistory {
    const BYTES: usize = (1 << 16) / 4;

    fn new() -> Self {
        Self {
            bits: vec![0; Self::BYTES].into_boxed_slice(),
            queued: Vec::with_capacity(ID_NOTES_QUEUED),
        }
    }

    /// What a closed table keeps: nothing (every ID reads as unused).
    fn none() -> Self {
        Self {
            bits: Box::default(),
            queued: Vec::new(),
        }
    }

    fn clear(&mut self) {
        self.queued.clear();
        if self.bits.len() == Self::BYTES {
            self.bits.fill(0);
        } else {
            *self = Self::new();
        }
    }

    fn get(&mut self, id: u16) -> u8 {
        self.write_queued();
        let (at, shift) = Self::place(id);
        self.bits
            .get(at)
            .map_or(ID_UNUSED, |byte| (byte >> shift) & 3)
    }

    fn set(&mut self, id: u16, state: u8) {
        if self.bits.is_empty() {
            return;
        }
        self.queued.push((id, state));
        if self.queued.len() >= ID_NOTES_QUEUED {
            self.write_queued();
        }
    }

    /// Writes the queued notes, oldest first (a later note of an ID wins).
    fn write_queued(&mut self) {
        for (id, state) in self.queued.drain(..) {
            let (at, shift) = Self::place(id);
            if let Some(byte) = self.bits.get_mut(at) {
                *byte = (*byte & !(3 << shift)) | ((state & 3) << shift);
            }
        }
    }

    fn place(id: u16) -> (usize, u32) {
        (usize::from(id >> 2), u32::from(id & 3) * 2)
    }
}

/// The in-flight table of one upstream socket.
///
/// The entries live in a slab whose freed slots are reused last-freed-first, so a new query
/// lands in memory still in cache, and the ID map moves a 4-byte index, not an [`Inflight`].
pub(crate) struct Table {
    /// ID → index of its entry in `slots`.
    index: HashMap<u16, u32, BuildIdHasher>,
    /// The entries; `None` for a free slot (listed in `free`).
    slots: Vec<Option<Inflight>>,
    /// Free slots of `slots`, the last freed last.
    free: Vec<u32>,
    /// Per ID, what became of its last query.
    history: IdHistory,
    /// The socket's receiver has stopped: nothing may be added.
    closed: bool,
    /// Buffers for the next queries in flight.
    pub(crate) spare: Spare,
}

impl Table {
    pub(crate) fn new() -> Self {
        Self {
            index: HashMap::with_capacity_and_hasher(256, BuildIdHasher::default()),
            slots: Vec::with_capacity(256),
            free: Vec::with_capacity(256),
            history: IdHistory::new(),
            closed: false,
            spare: Spare::default(),
        }
    }

    /// What a closed socket keeps once its memory went to [`Table::recycle`]: nothing, and
    /// nothing may be added.
    fn closed() -> Self {
        Self {
            index: HashMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
            history: IdHistory::none(),
            closed: true,
            spare: Spare::default(),
        }
    }

    /// The memory of a closed socket's table as a new, empty table (its ID history cleared;
    /// its index, slab and spare buffers kept at the size they grew to). The default rotation
    /// (a new port every 4,096 queries) opens a socket every ~50 ms at 80k queries per
    /// second: a fresh table each time cost ~1 % of the proxy's CPU, most of it `memset` of
    /// the ID history (docs/benchmarks/dns-proxy.md).
    pub(crate) fn recycle(mut self) -> Self {
        self.index.clear();
        self.slots.clear();
        self.free.clear();
        self.history.clear();
        self.closed = false;
        self
    }

    /// Reserves a random ID free on this socket; `None` if the socket is full or closed.
    pub(crate) fn insert(&mut self, ids: &mut IdSource) -> Option<VacantId<'_>> {
        if self.closed || self.index.len() >= MAX_INFLIGHT_PER_SOCKET {
            return None;
        }
        for _ in 0..ID_DRAWS {
            let id = ids.next_id();
            if !self.index.contains_key(&id) {
                return Some(VacantId { table: self, id });
            }
        }
        None
    }

    /// Takes the query `id` out if `check` accepts it; otherwise says why the answer is
    /// dropped. The entry stays when `check` refuses (the real answer may follow).
    pub(crate) fn take(
        &mut self,
        id: u16,
        check: impl FnOnce(&Inflight) -> Result<(), DropReason>,
    ) -> Result<Inflight, DropReason> {
        let Entry::Occupied(entry) = self.index.entry(id) else {
            return Err(match self.history.get(id) {
                ID_ANSWERED => DropReason::Duplicate,
                ID_EXPIRED => DropReason::Late,
                _ => DropReason::UnknownId,
            });
        };
        let slot = *entry.get();
        // An indexed slot always holds its entry; were it not so, the answer is unknown.
        let Some(held) = self.slots.get_mut(slot as usize) else {
            return Err(DropReason::UnknownId);
        };
        check(held.as_ref().ok_or(DropReason::UnknownId)?)?;
        let inflight = held.take().ok_or(DropReason::UnknownId)?;
        entry.remove();
        self.history.set(id, ID_ANSWERED);
        self.free.push(slot);
        Ok(inflight)
    }

    /// The client's own ID of the query `id`, if it is outstanding and not a probe.
    pub(crate) fn client_id(&self, id: u16) -> Option<u16> {
        let slot = *self.index.get(&id)?;
        let origin = self.slots.get(slot as usize)?.as_ref()?.origin.as_ref()?;
        Some(origin.asked.client_id)
    }

    /// Moves every query sent at or before `cutoff` into `out`.
    pub(crate) fn expire(&mut self, cutoff: Instant, out: &mut Vec<(u16, Inflight)>) {
        let Self {
            index,
            slots,
            free,
            history,
            ..
        } = self;
        index.retain(|&id, &mut slot| {
            let Some(held) = slots.get_mut(slot as usize) else {
                return false;
            };
            let due = held.as_ref().is_some_and(|e| e.sent <= cutoff);
            if due && let Some(entry) = held.take() {
                history.set(id, ID_EXPIRED);
                free.push(slot);
                out.push((id, entry));
            }
            !due
        });
    }

    /// Queries outstanding.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed
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

    /// The table's spare buffers, for the entry.
    pub(crate) fn spare(&mut self) -> &mut Spare {
        &mut self.table.spare
    }

    pub(crate) fn fill(self, entry: Inflight) {
        let table = self.table;
        let slot = match table.free.pop() {
            Some(slot) => {
                table.slots[slot as usize] = Some(entry);
                slot
            }
            None => {
                // At most MAX_INFLIGHT_PER_SOCKET slots: the index fits a u32.
                let slot = u32::try_from(table.slots.len()).unwrap_or(u32::MAX);
                table.slots.push(Some(entry));
                slot
            }
        };
        table.index.insert(self.id, slot);
    }
}

/// One connected UDP socket towards an upstream, with its in-flight table.
pub(crate) struct UpstreamSocket {
    /// `None` for an encrypted upstream's table (its queries leave on its connections).
    pub(crate) socket: Option<UdpSocket>,
    /// Its local port (for logs and tests).
    pub(crate) port: u16,
    table: Mutex<Table>,
    opened: Instant,
    /// Queries forwarded on it.
    queries: AtomicU64,
    /// Due for rotation once `queries` reaches this (moved on after a failed rotation).
    due_queries: AtomicU64,
    /// Due for rotation once it is this old, in milliseconds (moved on after a failure).
    due_age_ms: AtomicU64,
    /// Replaced in its slot: takes no new queries, closes once its table is empty.
    retired: AtomicBool,
    /// Wakes the receiver of a retired socket whose table may have emptied.
    pub(crate) drained: Notify,
}

impl UpstreamSocket {
    /// Opens a socket on a fresh ephemeral port, connected to `upstream`, with `table` (new,
    /// or [recycled](Table::recycle)) as its in-flight table.
    pub(crate) fn open(
        upstream: SocketAddr,
        rotation: Rotation,
        now: Instant,
        table: Table,
        watcher: Watcher,
    ) -> std::io::Result<Self> {
        let socket = connect_udp(upstream, watcher)?;
        let port = socket.local_addr()?.port();
        Ok(Self::with(Some(socket), port, rotation, now, table))
    }

    /// The in-flight table of an encrypted upstream, without a UDP socket.
    pub(crate) fn without_socket(rotation: Rotation, now: Instant) -> Self {
        Self::with(None, 0, rotation, now, Table::new())
    }

    fn with(
        socket: Option<UdpSocket>,
        port: u16,
        rotation: Rotation,
        now: Instant,
        table: Table,
    ) -> Self {
        let age_ms = u64::try_from(rotation.max_age.as_millis()).unwrap_or(u64::MAX);
        Self {
            socket,
            port,
            table: Mutex::new(table),
            opened: now,
            queries: AtomicU64::new(0),
            due_queries: AtomicU64::new(if rotation.max_queries == 0 {
                u64::MAX
            } else {
                rotation.max_queries
            }),
            due_age_ms: AtomicU64::new(if age_ms == 0 { u64::MAX } else { age_ms }),
            retired: AtomicBool::new(false),
            drained: Notify::new(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one forwarded query. `_table` is this socket's table, locked: the caller is then
    /// the count's only writer, so a plain store does, not a locked add (each of which waits
    /// for the CPU's pending stores, on every query).
    pub(crate) fn count_query(&self, _table: &Table) {
        let n = self.queries.load(Ordering::Relaxed);
        self.queries.store(n.saturating_add(1), Ordering::Relaxed);
    }

    /// Whether this socket should be replaced before the next query leaves on it.
    pub(crate) fn is_due(&self, now: Instant) -> bool {
        if self.queries.load(Ordering::Relaxed) >= self.due_queries.load(Ordering::Relaxed) {
            return true;
        }
        let age = now.saturating_duration_since(self.opened).as_millis();
        u64::try_from(age).unwrap_or(u64::MAX) >= self.due_age_ms.load(Ordering::Relaxed)
    }

    /// A rotation failed: try again after `max_queries` more queries or [`ROTATION_RETRY`].
    pub(crate) fn postpone(&self, rotation: Rotation, now: Instant) {
        if rotation.max_queries != 0 {
            let next = self
                .queries
                .load(Ordering::Relaxed)
                .saturating_add(rotation.max_queries);
            self.due_queries.store(next, Ordering::Relaxed);
        }
        if !rotation.max_age.is_zero() {
            let age = now.saturating_duration_since(self.opened) + ROTATION_RETRY;
            let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
            self.due_age_ms.store(age_ms, Ordering::Relaxed);
        }
    }

    /// Takes it out of service: no new queries; the receiver closes it once drained.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        self.drained.notify_one();
    }

    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// For the receiver: if the socket is retired and nothing is in flight, closes its table
    /// (no query can be added any more) and returns the table's memory, for a later socket
    /// ([`Table::recycle`]): the socket can go.
    pub(crate) fn close_if_drained(&self) -> Option<Table> {
        if !self.is_retired() {
            return None;
        }
        let mut table = self.lock();
        if table.len() == 0 {
            return Some(std::mem::replace(&mut *table, Table::closed()));
        }
        None
    }
}

/// A UDP socket bound to an ephemeral port of the upstream's family and connected to it, so
/// the kernel drops datagrams from any other source.
fn connect_udp(upstream: SocketAddr, watcher: Watcher) -> std::io::Result<UdpSocket> {
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
    UdpSocket::new(socket.into(), watcher)
}

/// Access to one socket's in-flight table, for answer validation: through the socket's lock in
/// the proxy, directly in the fuzz entry points.
pub(crate) trait TableAccess {
    /// Runs `f` on the table (under its lock).
    fn with_table<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R;
}

impl TableAccess for UpstreamSocket {
    fn with_table<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R {
        f(&mut self.lock())
    }
}

impl TableAccess for std::cell::RefCell<Table> {
    fn with_table<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R {
        f(&mut self.borrow_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inflight(sent: Instant) -> Inflight {
        let mut query = Vec::new();
        let question = crate::wire::write_probe(&mut query, 1).unwrap();
        Inflight {
            query,
            question,
            sent_name: Vec::new(),
            sent,
            origin: None,
        }
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
        assert!(
            table
                .take(a, |_| Err(DropReason::QuestionMismatch))
                .is_err()
        );
        assert!(table.take(a, |_| Ok(())).is_ok());
        assert!(matches!(
            table.take(a, |_| Ok(())),
            Err(DropReason::Duplicate)
        ));
        let mut out = Vec::new();
        table.expire(t0, &mut out);
        assert_eq!(out.len(), 999);
        let b = taken[1];
        assert!(matches!(table.take(b, |_| Ok(())), Err(DropReason::Late)));
        let unknown = (0..=u16::MAX).find(|i| !taken.contains(i)).unwrap();
        assert!(matches!(
            table.take(unknown, |_| Ok(())),
            Err(DropReason::UnknownId)
        ));
    }

    #[test]
    fn id_history_keeps_each_ids_note_apart() {
        let mut history = IdHistory::new();
        let state = |id: u16| [ID_UNUSED, ID_ANSWERED, ID_EXPIRED][usize::from(id % 3)];
        for id in 0..=u16::MAX {
            history.set(id, state(id));
        }
        assert!((0..=u16::MAX).all(|id| history.get(id) == state(id)));
        // Rewriting one ID leaves its neighbours in the same byte as they were.
        history.set(4, ID_EXPIRED);
        history.set(6, ID_UNUSED);
        let got: Vec<u8> = (4..8).map(|id| history.get(id)).collect();
        assert_eq!(got, [ID_EXPIRED, state(5), ID_UNUSED, state(7)]);
        history.clear();
        assert!((0..=u16::MAX).all(|id| history.get(id) == ID_UNUSED));
        // Queued notes (fewer than are written at once): a lookup sees them, the later note
        // of an ID wins, and clearing drops them.
        history.set(9, ID_ANSWERED);
        history.set(9, ID_EXPIRED);
        history.set(10, ID_ANSWERED);
        assert_eq!(history.queued.len(), 3);
        assert_eq!((history.get(9), history.get(10)), (ID_EXPIRED, ID_ANSWERED));
        history.set(11, ID_ANSWERED);
        history.clear();
        assert_eq!(history.get(11), ID_UNUSED);
        // A closed table's history notes nothing and reads as unused.
        let mut none = IdHistory::none();
        none.set(7, ID_ANSWERED);
        assert_eq!(none.get(7), ID_UNUSED);
    }

    #[test]
    fn freed_slots_are_reused_last_freed_first() {
        let mut table = Table::new();
        let mut ids = IdSource::new();
        let t0 = Instant::now();
        let mut fill = |table: &mut Table| {
            let slot = table.insert(&mut ids).unwrap();
            let id = slot.id();
            slot.fill(inflight(t0));
            id
        };
        let (a, b, c) = (fill(&mut table), fill(&mut table), fill(&mut table));
        assert_eq!(
            (table.index[&a], table.index[&b], table.index[&c]),
            (0, 1, 2)
        );
        table.take(a, |_| Ok(())).unwrap();
        table.take(c, |_| Ok(())).unwrap();
        let d = fill(&mut table);
        assert_eq!(table.index[&d], 2, "the slot freed last is taken first");
        let e = fill(&mut table);
        assert_eq!(table.index[&e], 0);
        assert_eq!(table.slots.len(), 3, "no slot added while one was free");
        assert_eq!(table.client_id(b), None, "a probe has no client ID");
        let mut out = Vec::new();
        table.expire(t0, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(table.len(), 0);
        assert_eq!(table.free.len(), 3, "every slot free after expiry");
        assert!(matches!(table.take(d, |_| Ok(())), Err(DropReason::Late)));
    }

    #[tokio::test]
    async fn due_after_max_queries_or_age_and_postponed_after_a_failure() {
        let upstream: SocketAddr = "127.0.0.1:53".parse().unwrap();
        let rotation = Rotation {
            max_queries: 3,
            max_age: Duration::from_secs(30),
        };
        let t0 = Instant::now();
        let s =
            UpstreamSocket::open(upstream, rotation, t0, Table::new(), Watcher::Reactor).unwrap();
        assert_ne!(s.port, 0);
        for _ in 0..3 {
            assert!(!s.is_due(t0));
            s.count_query(&s.lock());
        }
        assert!(s.is_due(t0), "after 3 queries");
        s.postpone(rotation, t0);
        assert!(!s.is_due(t0), "postponed by 3 more queries");
        assert!(s.is_due(t0 + Duration::from_secs(31)), "old enough");

        let never = Rotation {
            max_queries: 0,
            max_age: Duration::ZERO,
        };
        let s = UpstreamSocket::open(upstream, never, t0, Table::new(), Watcher::Reactor).unwrap();
        for _ in 0..10 {
            s.count_query(&s.lock());
        }
        assert!(!s.is_due(t0 + Duration::from_secs(86_400)));
    }

    #[tokio::test]
    async fn a_retired_socket_closes_only_once_drained() {
        let upstream: SocketAddr = "127.0.0.1:53".parse().unwrap();
        let rotation = Rotation {
            max_queries: 0,
            max_age: Duration::ZERO,
        };
        let t0 = Instant::now();
        let s =
            UpstreamSocket::open(upstream, rotation, t0, Table::new(), Watcher::Reactor).unwrap();
        let mut ids = IdSource::new();
        let id = {
            let mut table = s.lock();
            let slot = table.insert(&mut ids).unwrap();
            let id = slot.id();
            slot.fill(inflight(t0));
            id
        };
        assert!(s.close_if_drained().is_none(), "not retired");
        s.retire();
        assert!(s.close_if_drained().is_none(), "a query is in flight");
        s.lock().take(id, |_| Ok(())).unwrap();
        let memory = s.close_if_drained().expect("drained");
        assert!(s.lock().insert(&mut ids).is_none(), "closed: nothing added");
        assert!(s.lock().is_closed());
        assert!(
            matches!(s.lock().take(id, |_| Ok(())), Err(DropReason::UnknownId)),
            "a closed table knows no ID"
        );

        // Its memory serves the next socket as a new table: empty, open, no history.
        let history = memory.history.bits.as_ptr();
        let mut table = memory.recycle();
        assert_eq!(table.history.bits.as_ptr(), history, "the same memory");
        assert!(!table.is_closed() && table.len() == 0);
        assert!(matches!(
            table.take(id, |_| Ok(())),
            Err(DropReason::UnknownId)
        ));
        let slot = table.insert(&mut ids).unwrap();
        let fresh = slot.id();
        slot.fill(inflight(t0));
        assert!(table.take(fresh, |_| Ok(())).is_ok());
        assert!(matches!(
            table.take(fresh, |_| Ok(())),
            Err(DropReason::Duplicate)
        ));
    }
}
