//! Durable state for fqdnd: the *mechanism*, not the policy.
//!
//! It owns
//! - the **journal**: append-only files `journal.<gen>` of CRC-framed records, written by one
//!   writer thread that group-commits (one write + one `fdatasync` for everything queued while
//!   the previous sync ran, into zeros preallocated ahead) — [`Journal`]; and what a caller
//!   that did not wait can still learn: each record's place in the queue ([`Ticket`]) and how
//!   far the writer got ([`Journal::settled`]);
//! - **snapshots**: one file `snapshot`, replaced atomically (temp file, fsync, rename, fsync
//!   of the directory) — [`write_snapshot`], [`read_snapshot`];
//! - **compaction**: rotate to a new journal generation, write a snapshot naming it, delete
//!   the generations the snapshot covers — [`Journal::rotate`], [`Journal::compact`];
//! - **recovery**: snapshot + the journals after it, a torn tail cut off and reported —
//!   [`open`]; and a read-only summary of a state directory — [`inspect()`].
//!
//! It never knows what it stores: records and snapshots are any `T: Serialize +
//! DeserializeOwned` (nothing here knows DNS, the NameManager or the IpCache). It never reads
//! the wall clock (a snapshot's time is given by the caller; durations use the monotonic clock),
//! never panics on what it reads, and never acknowledges a record before it is on disk.
//!
//! The crash-safety invariants are documented on [`Journal`] (I/O errors), [`open`]
//! (recovery) and [`Journal::compact`] (compaction); the file formats in [`format`](mod@format).

#![forbid(unsafe_code)]

mod error;
pub mod format;
mod fsutil;
mod inspect;
mod journal;
mod recover;
mod snapshot;
mod task;
mod writer;

use std::fmt;
use std::time::Duration;

pub use error::{Error, FrameProblem, HeaderProblem};
pub use format::{DecodedJournal, decode_journal_bytes, decode_snapshot_bytes};
pub use inspect::{GenerationSummary, Inspection, SnapshotSummary, inspect};
pub use journal::{Ack, Journal, JournalStats, Rotation, SLOW_BATCH_BOUNDS, Settled, Ticket};
pub use recover::{Discarded, Recovered, Tail, open, open_with};
pub use snapshot::{SnapshotMeta, read_snapshot, read_snapshot_with, write_snapshot};

/// Sequence number of a journal record: its index in the whole history of the state directory
/// (snapshots included), contiguous across generations. The first record ever written is 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(pub u64);

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Largest record payload accepted by default (16 MiB); a length field above the limit is
/// treated as corruption, so a flipped bit never makes the reader allocate gigabytes.
pub const DEFAULT_MAX_RECORD_BYTES: u32 = 16 << 20;

/// How a state directory is opened and written.
#[derive(Clone, Debug)]
pub struct Options {
    /// The caller's schema number, stored in every header. A file written with another schema
    /// is refused ([`HeaderProblem::Schema`]) instead of being misread.
    pub schema: u32,
    /// Refuse a torn or corrupt journal tail ([`Error::Corrupt`]) instead of truncating it.
    /// (Leftovers are still removed: temp files, and journals a snapshot covers.)
    pub strict: bool,
    /// Largest record payload, in bytes (see [`DEFAULT_MAX_RECORD_BYTES`]).
    pub max_record_bytes: u32,
    /// Records queued with [`Journal::append_lazy`] and nothing else are synced at the latest
    /// this long after the first of them was queued (monotonic clock, not tokio's: the
    /// writer is a thread of its own).
    pub lazy_flush_interval: Duration,
    /// Bytes that may wait in the writer's queue; past this, appends fail with
    /// [`Error::Backlog`] (the disk is not keeping up, fail closed).
    pub max_queued_bytes: u64,
}

impl Options {
    /// Defaults for `schema`: lenient recovery, 16 MiB records, lazy records synced within a
    /// second, 256 MiB of queue.
    pub fn new(schema: u32) -> Self {
        Self {
            schema,
            strict: false,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            lazy_flush_interval: Duration::from_secs(1),
            max_queued_bytes: 256 << 20,
        }
    }
}
