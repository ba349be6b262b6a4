//! The journal handle and its writer thread: group commit, lazy records, rotation, compaction.

use std::future::Future;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use serde::Serialize;
use std::sync::mpsc;

use futures_channel::oneshot;

use crate::format::{SnapshotMeta, encode_record, encode_snapshot, encode_value};
use crate::fsutil::{SNAPSHOT, list, sync_dir, write_atomic};
use crate::recover::Tail;
use crate::task::WriterTask;
use crate::writer::Writer;
use crate::{Error, Options, Seq};

/// The boundary a rotation made: every record submitted before it is in a generation older
/// than `generation`; every record after it in `generation` or later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rotation {
    /// The new generation.
    pub generation: u64,
    /// The seq of its first record.
    pub next_seq: Seq,
}

/// A record's place in the queue of one [`Journal`]: the first record submitted after
/// [`Journal::start`] gets 1, the next 2, and so on, in the order the writer takes them
/// (lazy records count too). Unlike a [`Seq`], a ticket is known when the record is submitted,
/// also for records that later fail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub u64);

/// How far the writer got ([`Journal::settled`]): what a caller that did not await its
/// acknowledgements can still learn about its records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Every record with a ticket up to this one was dealt with: made durable, or failed.
    pub through: Ticket,
    /// The last record of the latest batch that failed ([`Ticket`]`(0)`: none failed).
    pub last_failure: Ticket,
}

impl Settled {
    /// Whether every record with a ticket in `first..=last` is known durable: all of them
    /// settled, and no batch failed since `first` was queued. (A failed batch holding any of
    /// them ends at `first` or later, and is the latest failure or older than it.) `false`
    /// also when it cannot tell: once a later batch failed, only the acknowledgements know.
    pub fn known_durable(&self, first: Ticket, last: Ticket) -> bool {
        last <= self.through && self.last_failure < first
    }
}

/// The bounds [`JournalStats::slow_batches`] counts above: 1 ms, 10 ms and 100 ms (the
/// default `proxyResponseMaxDelay`).
pub const SLOW_BATCH_BOUNDS: [Duration; 3] = [
    Duration::from_millis(1),
    Duration::from_millis(10),
    Duration::from_millis(100),
];

/// Counters of a journal (monotonic unless said otherwise).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Records made durable.
    pub records: u64,
    /// Batches committed (each is one write and one `fdatasync`).
    pub batches: u64,
    /// Successful `fdatasync` calls on journal data: one per batch (rotation's file and
    /// directory syncs not counted).
    pub fsyncs: u64,
    /// Bytes made durable.
    pub bytes: u64,
    /// Batches that failed (write or sync error).
    pub failed_batches: u64,
    /// Records lost in failed batches (acknowledged ones got the error; lazy ones are gone).
    pub failed_records: u64,
    /// Records in the last committed batch (gauge).
    pub last_batch_records: u64,
    /// Duration of the last `fdatasync` (gauge; the monotonic clock).
    pub last_fsync: Duration,
    /// Sum of all `fdatasync` durations: with `fsyncs`, a mean per scrape interval.
    pub fsync_total: Duration,
    /// Committed batches whose write and `fdatasync` together took longer than each of
    /// [`SLOW_BATCH_BOUNDS`] (so the first count includes the others). A reply that waits for
    /// a record of such a batch waits that long too.
    pub slow_batches: [u64; 3],
    /// Bytes waiting in the queue (gauge).
    pub queued_bytes: u64,
    /// Current journal generation (gauge).
    pub generation: u64,
    /// Seq the next durable record gets (gauge).
    pub next_seq: Seq,
}

#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) records: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) failed_batches: AtomicU64,
    pub(crate) failed_records: AtomicU64,
    pub(crate) last_batch_records: AtomicU64,
    pub(crate) last_fsync_ns: AtomicU64,
    pub(crate) fsync_total_ns: AtomicU64,
    pub(crate) slow_batches: [AtomicU64; 3],
    pub(crate) queued: AtomicU64,
    pub(crate) generation: AtomicU64,
    pub(crate) next_seq: AtomicU64,
    pub(crate) snapshot_generation: AtomicU64,
    /// Records settled (durable or failed), in queue order: [`Settled::through`].
    pub(crate) settled: AtomicU64,
    /// [`Settled::last_failure`]; stored before `settled` moves past it.
    pub(crate) last_failure: AtomicU64,
}

impl Shared {
    fn stats(&self) -> JournalStats {
        JournalStats {
            records: self.records.load(Relaxed),
            batches: self.batches.load(Relaxed),
            fsyncs: self.batches.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            failed_batches: self.failed_batches.load(Relaxed),
            failed_records: self.failed_records.load(Relaxed),
            last_batch_records: self.last_batch_records.load(Relaxed),
            last_fsync: Duration::from_nanos(self.last_fsync_ns.load(Relaxed)),
            fsync_total: Duration::from_nanos(self.fsync_total_ns.load(Relaxed)),
            slow_batches: self.slow_batches.each_ref().map(|n| n.load(Relaxed)),
            queued_bytes: self.queued.load(Relaxed),
            generation: self.generation.load(Relaxed),
            next_seq: Seq(self.next_seq.load(Relaxed)),
        }
    }
}

pub(crate) enum Msg {
    Record {
        frame: Vec<u8>,
        ack: Option<oneshot::Sender<Result<Seq, Error>>>,
    },
    Flush(oneshot::Sender<Result<Seq, Error>>),
    Rotate(oneshot::Sender<Result<Rotation, Error>>),
}

/// Resolves when the writer has dealt with a submitted request (a record durable, a flush or
/// a rotation done); [`Error::Closed`] if the writer went away first.
#[derive(Debug)]
pub struct Ack<R> {
    rx: oneshot::Receiver<Result<R, Error>>,
    ticket: Ticket,
}

impl<R> Ack<R> {
    /// The record's ticket; for a flush or a rotation, the ticket of the last record queued
    /// before it.
    pub fn ticket(&self) -> Ticket {
        self.ticket
    }
}

impl<R> Future for Ack<R> {
    type Output = Result<R, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(Error::Closed)))
    }
}

/// An open journal: many tasks append through `&self`; one writer thread commits.
///
/// Records are framed by the caller's task and queued in submission order; the writer takes
/// everything queued while its previous `fdatasync` ran and commits it as one write and one
/// sync, then acknowledges each record with its [`Seq`]. Seqs follow submission order, so a
/// caller that submits under its own lock gets the journal order it applied.
///
/// **After an I/O error** (e.g. [`Error::Full`]) every record of the failed batch fails with
/// that error (lazy ones are lost, counted in [`JournalStats::failed_records`]), the file is
/// cut back to its last durable record, and later appends are tried again — they succeed once
/// the disk has room. If the cut itself fails, every later call fails with
/// [`Error::Poisoned`]; reopening the directory recovers the durable prefix.
pub struct Journal<T: ?Sized> {
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
    options: Options,
    dir: PathBuf,
    compacting: futures_util::lock::Mutex<()>,
    /// The last ticket given; held while a request is queued, so tickets follow the queue.
    tickets: Mutex<u64>,
    /// The writer thread's result, sent when it ends.
    done: oneshot::Receiver<Result<(), Error>>,
    _records: PhantomData<fn(&T)>,
}

impl<T: Serialize + ?Sized> Journal<T> {
    /// Starts the writer thread, appending at `tail` (from [`crate::open`]). If the thread
    /// cannot be started every call fails with [`Error::Closed`]. [`Journal::compact`] encodes
    /// and writes the snapshot on a thread of its own: any async runtime may await it.
    pub fn start(tail: Tail, options: &Options) -> Self {
        let shared = Arc::new(Shared::default());
        shared.generation.store(tail.generation, Relaxed);
        shared.next_seq.store(tail.next_seq.0, Relaxed);
        shared
            .snapshot_generation
            .store(tail.snapshot_generation, Relaxed);
        let dir = tail.dir.clone();
        let (tx, rx) = mpsc::channel();
        let (done_tx, done) = oneshot::channel();
        let task = WriterTask::new(Writer::new(tail, options.schema), shared.clone());
        let lazy = options.lazy_flush_interval;
        let spawned = std::thread::Builder::new()
            .name("fqdnd-journal".to_owned())
            .spawn(move || {
                let _ = done_tx.send(task.run(&rx, lazy));
            });
        if let Err(source) = spawned {
            // Fail closed: the queue's receiver is gone with the closure, so every call
            // fails with `Error::Closed`.
            tracing::error!(%source, "checkpoint: cannot start the journal writer thread");
        }
        Self {
            tx,
            shared,
            options: options.clone(),
            dir,
            compacting: futures_util::lock::Mutex::new(()),
            tickets: Mutex::new(0),
            done,
            _records: PhantomData,
        }
    }

    /// Queues `msg`; returns its ticket (a record's own, or the last record's before it).
    fn send(&self, frame_len: usize, msg: Msg) -> Result<Ticket, Error> {
        let len = frame_len as u64;
        let queued = self.shared.queued.fetch_add(len, Relaxed) + len;
        if queued > self.options.max_queued_bytes && len > 0 {
            self.shared.queued.fetch_sub(len, Relaxed);
            return Err(Error::Backlog {
                queued,
                max: self.options.max_queued_bytes,
            });
        }
        let is_record = matches!(msg, Msg::Record { .. });
        let mut last = self.tickets.lock().unwrap_or_else(PoisonError::into_inner);
        self.tx.send(msg).map_err(|_| {
            self.shared.queued.fetch_sub(len, Relaxed);
            Error::Closed
        })?;
        if is_record {
            *last += 1;
        }
        Ok(Ticket(*last))
    }

    /// Queues `record` now (its seq is fixed by this call's order) and returns what resolves
    /// once it is durable.
    pub fn submit(&self, record: &T) -> Result<Ack<Seq>, Error> {
        let frame = encode_record(record, self.options.max_record_bytes)?;
        let (ack, rx) = oneshot::channel();
        let ticket = self.send(
            frame.len(),
            Msg::Record {
                frame,
                ack: Some(ack),
            },
        )?;
        Ok(Ack { rx, ticket })
    }

    /// Appends `record` and resolves once it is durable (written and `fdatasync`ed), with its
    /// seq.
    pub async fn append(&self, record: &T) -> Result<Seq, Error> {
        self.submit(record)?.await
    }

    /// Queues `record` without waiting: it becomes durable with the next batch, or at the
    /// latest `lazy_flush_interval` later. Lost, without notice to this caller, if that batch
    /// fails or the process dies first (for records whose loss only costs a refresh).
    pub fn append_lazy(&self, record: &T) -> Result<Ticket, Error> {
        let frame = encode_record(record, self.options.max_record_bytes)?;
        self.send(frame.len(), Msg::Record { frame, ack: None })
    }

    /// Makes everything submitted before it durable; resolves with the next seq.
    pub async fn flush(&self) -> Result<Seq, Error> {
        let (tx, rx) = oneshot::channel();
        let ticket = self.send(0, Msg::Flush(tx))?;
        Ack { rx, ticket }.await
    }

    /// Starts a new journal generation after everything submitted before this call (which is
    /// made durable first). The first step of compaction: submit it while holding whatever
    /// lock orders your appends, take your state under that lock, release it, await the
    /// rotation and pass both to [`Journal::compact`].
    pub fn rotate(&self) -> Result<Ack<Rotation>, Error> {
        let (tx, rx) = oneshot::channel();
        let ticket = self.send(0, Msg::Rotate(tx))?;
        Ok(Ack { rx, ticket })
    }

    /// Installs `state` as the snapshot covering everything before `rotation`, then deletes
    /// the journal generations it covers. `state` must hold the effect of every record with a
    /// seq below `rotation.next_seq` (it may also hold effects of records whose append
    /// failed) and of none after. Returns the journals deleted.
    ///
    /// Crash safety, step by step (the invariant: **the snapshot names the first generation it
    /// does not include**, and a generation is deleted only after a snapshot naming a later
    /// one is durable):
    /// 1. rotation: generation `g` is created (temp file, fsync, rename, directory fsync)
    ///    before any record goes to it; a crash leaves the old snapshot and all generations,
    ///    which recovery replays in full;
    /// 2. snapshot: written to `snapshot.tmp`, fsynced, renamed over `snapshot`, directory
    ///    fsynced; a crash before the rename leaves the old snapshot (the temp file is deleted
    ///    at open), after it the new one — both consistent with the journals on disk;
    /// 3. deletion of generations `< g`: a crash midway leaves journals that the snapshot
    ///    names as covered; recovery skips (and deletes) them, so nothing is applied twice.
    ///
    /// `state` is encoded off the async runtime, on a thread of its own, with the write: a
    /// snapshot of a million names takes ~0.1 s to encode.
    pub async fn compact<S: Serialize + Send + 'static>(
        &self,
        rotation: &Rotation,
        state: S,
        taken_at_unix_ms: u64,
    ) -> Result<Vec<PathBuf>, Error> {
        let _one_at_a_time = self.compacting.lock().await;
        let current = self.shared.snapshot_generation.load(Relaxed);
        if rotation.generation <= current {
            return Err(Error::StaleRotation {
                generation: rotation.generation,
                current,
            });
        }
        let meta = SnapshotMeta {
            next_generation: rotation.generation,
            next_seq: rotation.next_seq,
            taken_at_unix_ms,
        };
        let (schema, dir) = (self.options.schema, self.dir.clone());
        let (tx, rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("fqdnd-snapshot".to_owned())
            .spawn(move || {
                let installed = encode_value(&state).and_then(|value| {
                    install_snapshot(&dir, &meta, &encode_snapshot(schema, &meta, &value))
                });
                let _ = tx.send(installed);
            })
            .map_err(|e| Error::io(&self.dir, "start the snapshot thread", e))?;
        let removed = rx.await.map_err(|_| Error::Closed)??;
        self.shared
            .snapshot_generation
            .store(rotation.generation, Relaxed);
        Ok(removed)
    }

    /// The ticket of the last record queued so far (`Ticket(0)`: none yet).
    pub fn last_ticket(&self) -> Ticket {
        Ticket(*self.tickets.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// How far the writer got, read without waiting: which records are settled and where the
    /// latest failure was ([`Settled::known_durable`] says whether given records are durable).
    pub fn settled(&self) -> Settled {
        // `settled` first: a failure it covers is then seen in `last_failure` (stored before).
        let through = Ticket(self.shared.settled.load(Acquire));
        let last_failure = Ticket(self.shared.last_failure.load(Acquire));
        Settled {
            through,
            last_failure,
        }
    }

    /// The counters.
    pub fn stats(&self) -> JournalStats {
        self.shared.stats()
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Commits what is queued (lazy records too), stops the writer and releases the
    /// directory's lock. Returns the final counters, or the error of the last batch.
    pub async fn close(self) -> Result<JournalStats, Error> {
        let Self {
            tx, done, shared, ..
        } = self;
        drop(tx);
        done.await.map_err(|_| Error::Closed)??;
        Ok(shared.stats())
    }
}

/// Step 2 and 3 of compaction (blocking).
fn install_snapshot(dir: &Path, meta: &SnapshotMeta, bytes: &[u8]) -> Result<Vec<PathBuf>, Error> {
    write_atomic(dir, &dir.join(SNAPSHOT), bytes)?;
    let mut removed = Vec::new();
    for (generation, path) in list(dir)?.journals {
        if generation < meta.next_generation {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, "remove", e))?;
            removed.push(path);
        }
    }
    if !removed.is_empty() {
        sync_dir(dir)?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Recovered, open};

    type State = Vec<u32>;

    fn reopen(dir: &Path) -> Recovered<State, u32> {
        open(dir, &Options::new(1)).unwrap()
    }

    fn start(dir: &Path, options: &Options) -> Journal<u32> {
        let r: Recovered<State, u32> = open(dir, options).unwrap();
        Journal::start(r.tail, options)
    }

    #[tokio::test]
    async fn append_is_durable_and_seqs_continue_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let j = start(dir.path(), &Options::new(1));
        assert_eq!(j.append(&10).await.unwrap(), Seq(0));
        assert_eq!(j.append(&11).await.unwrap(), Seq(1));
        let stats = j.close().await.unwrap();
        assert_eq!(
            (stats.records, stats.next_seq, stats.generation),
            (2, Seq(2), 1)
        );
        let r = reopen(dir.path());
        assert_eq!((r.records.clone(), r.first_seq), (vec![10, 11], Seq(0)));
        let j = Journal::<u32>::start(r.tail, &Options::new(1));
        assert_eq!(j.append(&12).await.unwrap(), Seq(2));
        j.close().await.unwrap();
        assert_eq!(reopen(dir.path()).records, [10, 11, 12]);
    }

    #[tokio::test]
    async fn tickets_follow_the_queue_and_settle_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let j = start(dir.path(), &Options::new(1));
        assert_eq!(
            (j.settled(), j.last_ticket()),
            (Settled::default(), Ticket(0))
        );
        let lazy = j.append_lazy(&1).unwrap();
        let first = j.submit(&2).unwrap();
        let rotation = j.rotate().unwrap();
        let second = j.submit(&3).unwrap();
        assert_eq!(
            (lazy, first.ticket(), rotation.ticket(), second.ticket()),
            (Ticket(1), Ticket(2), Ticket(2), Ticket(3))
        );
        assert_eq!(j.last_ticket(), Ticket(3));
        let (first, second) = (first.ticket(), second);
        let last = second.ticket();
        // Not settled yet, or settled: never durable before its acknowledgement came.
        let before = j.settled();
        assert!(before.through <= last);
        second.await.unwrap();
        let after = j.settled();
        assert_eq!(after.through, last);
        assert_eq!(after.last_failure, Ticket(0));
        assert!(after.known_durable(lazy, last) && after.known_durable(first, first));
        assert!(!after.known_durable(first, Ticket(4)), "not queued yet");
        rotation.await.unwrap();
        j.close().await.unwrap();
    }

    #[tokio::test]
    async fn lazy_records_are_synced_by_the_next_batch_or_the_interval() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            lazy_flush_interval: Duration::from_millis(30),
            ..Options::new(1)
        };
        let j = start(dir.path(), &options);
        j.append_lazy(&1).unwrap();
        assert_eq!(j.append(&2).await.unwrap(), Seq(1));
        assert_eq!(j.stats().batches, 1);
        j.append_lazy(&3).unwrap();
        for _ in 0..100 {
            if j.stats().records == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!((j.stats().records, j.stats().batches), (3, 2));
        j.append_lazy(&4).unwrap();
        assert_eq!(j.flush().await.unwrap(), Seq(4));
        drop(j);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(reopen(dir.path()).records, [1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn compaction_moves_records_into_the_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let j = start(dir.path(), &Options::new(1));
        let mut state = State::new();
        for v in [1, 2, 3] {
            j.append(&v).await.unwrap();
            state.push(v);
        }
        let rotation = j.rotate().unwrap().await.unwrap();
        assert_eq!(
            rotation,
            Rotation {
                generation: 2,
                next_seq: Seq(3)
            }
        );
        j.append(&4).await.unwrap();
        let removed = j.compact(&rotation, state.clone(), 1234).await.unwrap();
        assert_eq!(removed, [dir.path().join("journal.1")]);
        assert!(matches!(
            j.compact(&rotation, state.clone(), 1234).await,
            Err(Error::StaleRotation {
                generation: 2,
                current: 2
            })
        ));
        j.close().await.unwrap();
        let r = reopen(dir.path());
        assert_eq!(r.snapshot, Some(vec![1, 2, 3]));
        assert_eq!((r.records, r.first_seq), (vec![4], Seq(3)));
        let meta = r.snapshot_meta.unwrap();
        assert_eq!((meta.next_generation, meta.taken_at_unix_ms), (2, 1234));
    }

    /// A crash at each step of compaction recovers the same state, applied once.
    #[tokio::test]
    async fn crash_between_compaction_steps() {
        let dir = tempfile::tempdir().unwrap();
        let j = start(dir.path(), &Options::new(1));
        for v in [1, 2] {
            j.append(&v).await.unwrap();
        }
        // Crash after the rotation, before the snapshot: both generations are replayed.
        let rotation = j.rotate().unwrap().await.unwrap();
        j.append(&3).await.unwrap();
        j.close().await.unwrap();
        let r = reopen(dir.path());
        assert_eq!(
            (r.snapshot.clone(), r.records.clone()),
            (None, vec![1, 2, 3])
        );
        // Crash after the snapshot, before the deletion: journal.1 is covered, not replayed.
        let saved = std::fs::read(dir.path().join("journal.1")).unwrap();
        std::fs::write(dir.path().join("snapshot.tmp"), b"half a snapshot").unwrap();
        let j = Journal::<u32>::start(r.tail, &Options::new(1));
        j.compact(&rotation, vec![1u32, 2], 0).await.unwrap();
        j.close().await.unwrap();
        std::fs::write(dir.path().join("journal.1"), saved).unwrap();
        let r = reopen(dir.path());
        assert_eq!((r.snapshot, r.records), (Some(vec![1, 2]), vec![3]));
        assert_eq!(r.removed, [dir.path().join("journal.1")]);
        assert!(!dir.path().join("journal.1").exists());
    }

    #[tokio::test]
    async fn backlog_and_size_limits_fail_closed() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            max_queued_bytes: 0,
            max_record_bytes: 2,
            ..Options::new(1)
        };
        let j = start(dir.path(), &options);
        assert!(matches!(
            j.append_lazy(&1),
            Err(Error::Backlog { max: 0, .. })
        ));
        assert!(matches!(
            j.append(&u32::MAX).await,
            Err(Error::TooLarge { max: 2, .. })
        ));
        assert_eq!(j.flush().await.unwrap(), Seq(0));
    }

    #[tokio::test]
    async fn second_writer_is_refused_and_inspect_reads_without_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let j = start(dir.path(), &Options::new(1));
        j.append(&7).await.unwrap();
        assert!(matches!(
            open::<State, u32>(dir.path(), &Options::new(1)),
            Err(Error::Locked { .. })
        ));
        let rotation = j.rotate().unwrap().await.unwrap();
        j.compact(&rotation, vec![7u32], 1_000).await.unwrap();
        j.append(&8).await.unwrap();
        let seen = crate::inspect(dir.path(), None, 4_000).unwrap();
        assert_eq!(seen.snapshot.as_ref().unwrap().age_ms, Some(3_000));
        assert_eq!(seen.generations.len(), 1);
        assert_eq!(
            (seen.generations[0].records, seen.generations[0].header),
            (1, Some((1, Seq(1))))
        );
        let text = seen.to_string();
        assert!(
            text.contains("journal.2:") && text.contains("1 records"),
            "{text}"
        );
        j.close().await.unwrap();
    }
}
