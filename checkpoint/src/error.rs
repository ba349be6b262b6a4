//! Everything that can go wrong, with the file and offset where it did.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// An error of the checkpoint crate. `Clone` because one failed batch fails every record in
/// it; I/O causes are shared behind an `Arc`.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O operation failed (`op` is what was being done, e.g. "fdatasync").
    #[error("{op} {}: {error}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The cause (in the message, so not a `source`: a chain renderer prints it once).
        error: Arc<io::Error>,
    },
    /// The disk (or quota) is full: nothing of the failed batch is durable. The journal was
    /// cut back to its last durable record and accepts appends again once space is freed.
    #[error("{op} {}: no space left ({error})", path.display())]
    Full {
        /// The file being written.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The cause (`StorageFull` or `QuotaExceeded`; in the message, not a `source`).
        error: Arc<io::Error>,
    },
    /// After a failed write the journal could not be cut back to its last durable record: it
    /// accepts nothing more. Reopen the directory with [`crate::open`] (which cuts the tail).
    #[error("journal {} is unusable after a failed write: {error}", path.display())]
    Poisoned {
        /// The journal file.
        path: PathBuf,
        /// Why restoring it failed (in the message, not a `source`).
        error: Arc<io::Error>,
    },
    /// A file header is not one this crate wrote for this schema.
    #[error("{}: bad header at offset {offset}: {problem}", file.display())]
    BadHeader {
        /// The file.
        file: PathBuf,
        /// Byte offset of the bad field.
        offset: u64,
        /// What is wrong.
        problem: HeaderProblem,
    },
    /// A record or snapshot body is torn or corrupt where it may not be: anywhere in strict
    /// mode, in a snapshot, or in a journal generation that is not the last one.
    #[error("{}: corrupt at offset {offset}: {problem}", file.display())]
    Corrupt {
        /// The file.
        file: PathBuf,
        /// Byte offset of the frame.
        offset: u64,
        /// What is wrong.
        problem: FrameProblem,
    },
    /// A record passed its CRC but does not decode as the expected type (a schema change
    /// without a new schema number, or a bug): never silently dropped.
    #[error("{}: record at offset {offset} does not decode: {message}", file.display())]
    Decode {
        /// The file.
        file: PathBuf,
        /// Byte offset of the frame.
        offset: u64,
        /// The decoder's message.
        message: String,
    },
    /// A record or snapshot could not be serialised.
    #[error("cannot encode: {message}")]
    Encode {
        /// The encoder's message.
        message: String,
    },
    /// A record is larger than `Options::max_record_bytes`.
    #[error("record of {bytes} bytes is larger than the limit of {max}")]
    TooLarge {
        /// Encoded size.
        bytes: usize,
        /// The limit.
        max: u32,
    },
    /// The journal generations on disk do not follow each other (a file is missing, or a
    /// generation does not start where the previous one ended).
    #[error("{}: expected generation {expected_generation} starting at seq {expected_seq}, found generation {found_generation} starting at seq {found_seq}", file.display())]
    Gap {
        /// The file that does not follow.
        file: PathBuf,
        /// The generation that should come next.
        expected_generation: u64,
        /// The sequence number it should start at.
        expected_seq: u64,
        /// The generation found.
        found_generation: u64,
        /// The sequence number it starts at.
        found_seq: u64,
    },
    /// Another process (or handle) holds the directory's lock file.
    #[error("{} is locked by another writer", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// More than `Options::max_queued_bytes` wait for the disk.
    #[error("journal backlog: {queued} bytes queued, limit {max}")]
    Backlog {
        /// Bytes queued.
        queued: u64,
        /// The limit.
        max: u64,
    },
    /// A rotation older than the last installed snapshot was passed to `compact`.
    #[error("rotation to generation {generation} is older than the snapshot's {current}")]
    StaleRotation {
        /// The rotation's generation.
        generation: u64,
        /// The generation the current snapshot names.
        current: u64,
    },
    /// The writer thread is gone (the journal was closed, or the thread could not start or died).
    #[error("journal writer is closed")]
    Closed,
}

/// What is wrong with a file header.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderProblem {
    /// The file is shorter than a header.
    #[error("file is {len} bytes, shorter than the {needed}-byte header")]
    Short {
        /// File length.
        len: u64,
        /// Header length.
        needed: u64,
    },
    /// Not this kind of file.
    #[error("magic {found:?}, expected {expected:?}")]
    Magic {
        /// The bytes found.
        found: [u8; 6],
        /// The magic expected.
        expected: [u8; 6],
    },
    /// A format version this build does not read.
    #[error("format version {found}, this build reads {supported}")]
    Version {
        /// Version found.
        found: u16,
        /// Version supported.
        supported: u16,
    },
    /// Written for another schema.
    #[error("schema {found}, expected {expected}")]
    Schema {
        /// Schema found.
        found: u32,
        /// Schema expected.
        expected: u32,
    },
    /// The header's own CRC does not match.
    #[error("header crc {stored:#010x}, computed {computed:#010x}")]
    Crc {
        /// Stored CRC.
        stored: u32,
        /// Computed CRC.
        computed: u32,
    },
    /// The file name says one generation, the header another.
    #[error("file name says generation {named}, header says {found}")]
    Generation {
        /// From the file name.
        named: u64,
        /// From the header.
        found: u64,
    },
}

/// What is wrong with a record frame (or a snapshot body).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameProblem {
    /// The file ends inside the frame (a torn write).
    #[error("torn: frame needs {needed} bytes, {available} remain")]
    Torn {
        /// Bytes the frame needs from its offset.
        needed: u64,
        /// Bytes left in the file from its offset.
        available: u64,
    },
    /// The length field exceeds the limit.
    #[error("length {len} exceeds the limit of {max}")]
    TooLarge {
        /// The length field.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The CRC does not match.
    #[error("crc {stored:#010x}, computed {computed:#010x}")]
    Crc {
        /// Stored CRC.
        stored: u32,
        /// Computed CRC.
        computed: u32,
    },
    /// Bytes after the end of a snapshot body.
    #[error("{extra} bytes after the end of the body")]
    Trailing {
        /// How many.
        extra: u64,
    },
}

impl Error {
    /// An I/O error on `path`; `StorageFull`/`QuotaExceeded` become [`Error::Full`].
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> Self {
        let path = path.into();
        let error = Arc::new(source);
        match error.kind() {
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
                Error::Full { path, op, error }
            }
            _ => Error::Io { path, op, error },
        }
    }

    /// True for [`Error::Full`].
    pub fn is_full(&self) -> bool {
        matches!(self, Error::Full { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `fqdnd checkpoint inspect` of a missing directory printed: "…: No such file or
    /// directory (os error 2): No such file or directory (os error 2)". Each cause once.
    #[test]
    fn an_io_error_is_printed_once() {
        let e = Error::io("/x", "read directory", io::Error::from_raw_os_error(2));
        assert_eq!(
            e.to_string(),
            "read directory /x: No such file or directory (os error 2)"
        );
        assert!(std::error::Error::source(&e).is_none());
        let full = Error::io("/x", "write", io::Error::from(io::ErrorKind::StorageFull));
        assert!(full.is_full());
        assert!(std::error::Error::source(&full).is_none());
    }
}
