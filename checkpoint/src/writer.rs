//! The blocking half of the journal: one file, written at its durable end, synced.
//!
//! Runs on the journal's writer thread, which owns it.

#![allow(
    clippy::disallowed_types,
    reason = "the writer thread times its own batches and lazy deadline on the monotonic clock (std's Instant): measurements and a flush timer, no policy logic"
)]

use std::time::Instant;

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use crate::format::PREALLOCATION;
use crate::fsutil::create_journal;
use crate::recover::Tail;
use crate::{Error, Seq};

/// Durations of a committed batch, on the monotonic clock.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Timing {
    /// The `fdatasync`.
    pub(crate) sync: Duration,
    /// The whole batch: its write (which a frozen or throttled file system can hold up too),
    /// any preallocation step and the `fdatasync`.
    pub(crate) batch: Duration,
}

pub(crate) struct Writer {
    pub(crate) tail: Tail,
    pub(crate) schema: u32,
    poisoned: Option<Error>,
    /// After a failed preallocation (a full disk), the offset from which it is tried again.
    preallocate_from: u64,
}

impl Writer {
    pub(crate) fn new(tail: Tail, schema: u32) -> Self {
        Self {
            tail,
            schema,
            poisoned: None,
            preallocate_from: 0,
        }
    }

    /// Writes zeros past `end` up to [`PREALLOCATION`] bytes ahead, once less than a quarter of
    /// that is left, so that the next batches overwrite existing blocks: their `fdatasync`
    /// then flushes data only, with no file size or extent change to commit in the
    /// filesystem's journal (shared with every other writer of the disk). Synced by the
    /// caller's `fdatasync`. Best effort: on a full disk the zeros are cut off again (they
    /// must not take the space records need) and not tried again for a while.
    fn preallocate(&mut self, end: u64) {
        let t = &mut self.tail;
        if t.allocated >= end + PREALLOCATION / 4 || end < self.preallocate_from {
            return;
        }
        let from = t.allocated.max(end);
        let to = (end + PREALLOCATION).next_multiple_of(4096);
        let zeros = vec![0u8; 64 << 10];
        let mut at = from;
        let written = loop {
            if at >= to {
                break Ok(());
            }
            let n = usize::try_from(to - at).map_or(zeros.len(), |n| n.min(zeros.len()));
            if let Err(e) = t.file.write_all_at(&zeros[..n], at) {
                break Err(e);
            }
            at += n as u64;
        };
        match written {
            Ok(()) => t.allocated = to,
            Err(source) => {
                tracing::debug!(file = %t.path.display(), %source, "checkpoint: no preallocation");
                // Zeros are harmless if the cut fails: recovery and appends treat them as free.
                let _ = t.file.set_len(from);
                t.allocated = from;
                self.preallocate_from = end + PREALLOCATION;
            }
        }
    }

    /// Appends `buf` (`records` whole frames) at the durable end and syncs it. On success the
    /// records get seqs from the returned one on. On failure nothing of `buf` counts: the file
    /// is cut back to its durable end (and synced) so the next batch starts clean; if even
    /// that fails the writer is poisoned and refuses everything after.
    pub(crate) fn commit(&mut self, buf: &[u8], records: u64) -> Result<(Seq, Timing), Error> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let first = self.tail.next_seq;
        if buf.is_empty() {
            return Ok((first, Timing::default()));
        }
        let t = &self.tail;
        let started = Instant::now();
        let result = t
            .file
            .write_all_at(buf, t.offset)
            .map_err(|e| Error::io(&t.path, "write", e))
            .and_then(|()| {
                let end = self.tail.offset + buf.len() as u64;
                self.preallocate(end);
                let t = &self.tail;
                let written = Instant::now();
                t.file
                    .sync_data()
                    .map_err(|e| Error::io(&t.path, "fdatasync", e))?;
                let done = Instant::now();
                Ok(Timing {
                    sync: done - written,
                    batch: done - started,
                })
            });
        match result {
            Ok(timing) => {
                self.tail.offset += buf.len() as u64;
                self.tail.next_seq.0 += records;
                Ok((first, timing))
            }
            Err(e) => {
                let t = &mut self.tail;
                t.allocated = t.offset;
                let restored = t.file.set_len(t.offset).and_then(|()| t.file.sync_data());
                if let Err(source) = restored {
                    tracing::error!(file = %t.path.display(), %source, "checkpoint: journal poisoned");
                    self.poisoned = Some(Error::Poisoned {
                        path: t.path.clone(),
                        error: Arc::new(source),
                    });
                }
                Err(e)
            }
        }
    }

    /// Starts generation `current + 1` at the current seq. Call only with nothing pending.
    pub(crate) fn rotate(&mut self) -> Result<(u64, Seq), Error> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let generation = self.tail.generation + 1;
        let seq = self.tail.next_seq;
        let (file, path) = create_journal(&self.tail.dir, self.schema, generation, seq)?;
        self.tail.file = file;
        self.tail.path = path;
        self.tail.generation = generation;
        self.tail.offset = crate::format::JOURNAL_HEADER_LEN;
        self.tail.allocated = crate::format::JOURNAL_HEADER_LEN;
        self.preallocate_from = 0;
        Ok((generation, seq))
    }
}
