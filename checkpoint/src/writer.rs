//! The blocking half of the journal: one file, written at its durable end, synced.
//!
//! Runs on tokio's blocking pool, one call at a time (the writer task owns it).

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::fsutil::create_journal;
use crate::recover::Tail;
use crate::{Error, Seq};

/// Durations of a committed batch, on tokio's clock.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Timing {
    pub(crate) sync: Duration,
}

pub(crate) struct Writer {
    pub(crate) tail: Tail,
    pub(crate) schema: u32,
    poisoned: Option<Error>,
}

impl Writer {
    pub(crate) fn new(tail: Tail, schema: u32) -> Self {
        Self {
            tail,
            schema,
            poisoned: None,
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
        let result = t
            .file
            .write_all_at(buf, t.offset)
            .map_err(|e| Error::io(&t.path, "write", e))
            .and_then(|()| {
                let written = Instant::now();
                t.file
                    .sync_data()
                    .map_err(|e| Error::io(&t.path, "fdatasync", e))?;
                Ok(Timing {
                    sync: written.elapsed(),
                })
            });
        match result {
            Ok(timing) => {
                self.tail.offset += buf.len() as u64;
                self.tail.next_seq.0 += records;
                Ok((first, timing))
            }
            Err(e) => {
                let restored = t.file.set_len(t.offset).and_then(|()| t.file.sync_data());
                if let Err(source) = restored {
                    tracing::error!(file = %t.path.display(), %source, "checkpoint: journal poisoned");
                    self.poisoned = Some(Error::Poisoned {
                        path: t.path.clone(),
                        source: Arc::new(source),
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
        Ok((generation, seq))
    }
}
