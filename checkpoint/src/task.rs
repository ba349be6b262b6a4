//! The journal's writer thread: it owns the file and turns the queue into batches.
//!
//! A dedicated OS thread, not a tokio task plus the blocking pool: a batch then costs no hop
//! between threads besides the appender's wake-up of this thread (only when it sleeps) and
//! this thread's wake-up of each waiter; and the thread is scheduled by the kernel on its own,
//! not behind the DNS tasks of a busy runtime worker. Records queued while one `fdatasync`
//! runs are written and synced together as soon as it returns (group commit without a timer).

#![allow(
    clippy::disallowed_types,
    reason = "the writer thread times its own batches and lazy deadline on the monotonic clock (std's Instant): measurements and a flush timer, no policy logic"
)]

use std::time::Instant;

use std::sync::Arc;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use futures_channel::oneshot;

use crate::journal::{Msg, Rotation, SLOW_BATCH_BOUNDS, Shared};
use crate::writer::Writer;
use crate::{Error, Seq};

/// A batch is written early once it holds this much, so one write never grows unbounded.
const MAX_BATCH_BYTES: usize = 8 << 20;
/// Lazy records alone are written once they hold this much, even before the interval.
const MAX_LAZY_BYTES: usize = 1 << 20;

pub(crate) struct WriterTask {
    writer: Writer,
    shared: Arc<Shared>,
    buf: Vec<u8>,
    records: u64,
    /// Records settled (committed or failed) since the start: the last settled ticket.
    settled: u64,
    acks: Vec<(u64, oneshot::Sender<Result<Seq, Error>>)>,
}

impl WriterTask {
    pub(crate) fn new(writer: Writer, shared: Arc<Shared>) -> Self {
        Self {
            writer,
            shared,
            buf: Vec::new(),
            records: 0,
            settled: 0,
            acks: Vec::new(),
        }
    }

    /// The loop (blocking; run on its own thread): take everything queued, commit it as one
    /// batch when anyone waits (or the lazy records grew large or old), answer the waiters,
    /// repeat; commit the rest once every sender is gone. Lazy records' age is measured on
    /// the monotonic clock.
    pub(crate) fn run(mut self, rx: &Receiver<Msg>, lazy_interval: Duration) -> Result<(), Error> {
        let mut lazy_deadline: Option<Instant> = None;
        loop {
            let msg = match lazy_deadline {
                Some(deadline) => {
                    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                        Ok(msg) => msg,
                        Err(RecvTimeoutError::Timeout) => {
                            lazy_deadline = None;
                            let _ = self.commit();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                None => match rx.recv() {
                    Ok(msg) => msg,
                    Err(_) => break,
                },
            };
            let mut next = Some(msg);
            while let Some(msg) = next.take() {
                self.handle(msg);
                if self.buf.len() >= MAX_BATCH_BYTES {
                    let _ = self.commit();
                }
                next = rx.try_recv().ok();
            }
            if !self.acks.is_empty() || self.buf.len() >= MAX_LAZY_BYTES {
                let _ = self.commit();
            }
            if self.buf.is_empty() {
                lazy_deadline = None;
            } else if lazy_deadline.is_none() {
                lazy_deadline = Some(Instant::now() + lazy_interval);
            }
        }
        self.commit().map(drop)
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Record { frame, ack } => {
                self.shared.queued.fetch_sub(frame.len() as u64, Relaxed);
                if let Some(ack) = ack {
                    self.acks.push((self.records, ack));
                }
                self.buf.extend_from_slice(&frame);
                self.records += 1;
            }
            Msg::Flush(reply) => {
                let _ = reply.send(self.commit());
            }
            Msg::Rotate(reply) => {
                let result = self.commit().and_then(|_| self.writer.rotate());
                let result = result.map(|(generation, next_seq)| {
                    self.shared.generation.store(generation, Relaxed);
                    Rotation {
                        generation,
                        next_seq,
                    }
                });
                let _ = reply.send(result);
            }
        }
    }

    /// Commits the pending batch and answers its waiters; returns the next seq.
    fn commit(&mut self) -> Result<Seq, Error> {
        let records = std::mem::take(&mut self.records);
        let acks = std::mem::take(&mut self.acks);
        let bytes = self.buf.len() as u64;
        let result = self.writer.commit(&self.buf, records);
        self.buf.clear();
        let s = &self.shared;
        // Published before any waiter hears of it, the failure before the progress past it.
        self.settled += records;
        if result.is_err() && records > 0 {
            s.last_failure.store(self.settled, Release);
        }
        s.settled.store(self.settled, Release);
        match result {
            Ok((first, timing)) => {
                if records > 0 {
                    s.records.fetch_add(records, Relaxed);
                    s.batches.fetch_add(1, Relaxed);
                    s.bytes.fetch_add(bytes, Relaxed);
                    s.last_batch_records.store(records, Relaxed);
                    let ns = u64::try_from(timing.sync.as_nanos()).unwrap_or(u64::MAX);
                    s.last_fsync_ns.store(ns, Relaxed);
                    s.fsync_total_ns.fetch_add(ns, Relaxed);
                    for (count, bound) in s.slow_batches.iter().zip(SLOW_BATCH_BOUNDS) {
                        if timing.batch > bound {
                            count.fetch_add(1, Relaxed);
                        }
                    }
                }
                let next = Seq(first.0 + records);
                s.next_seq.store(next.0, Relaxed);
                for (index, ack) in acks {
                    let _ = ack.send(Ok(Seq(first.0 + index)));
                }
                Ok(next)
            }
            Err(e) => {
                if records > 0 {
                    s.failed_batches.fetch_add(1, Relaxed);
                    s.failed_records.fetch_add(records, Relaxed);
                }
                for (_, ack) in acks {
                    let _ = ack.send(Err(e.clone()));
                }
                Err(e)
            }
        }
    }
}
