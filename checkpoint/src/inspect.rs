//! A read-only summary of a state directory (`fqdnd checkpoint inspect DIR`).

use std::fmt;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use crate::format::{SnapshotMeta, decode_snapshot_in};
use crate::fsutil::{SNAPSHOT, list};
use crate::recover::{Discarded, read_header, scan_frames};
use crate::{DEFAULT_MAX_RECORD_BYTES, Error, Seq};

/// The snapshot file, as found.
#[derive(Clone, Debug)]
pub struct SnapshotSummary {
    /// The file.
    pub file: PathBuf,
    /// Its size.
    pub bytes: u64,
    /// Its modification time, Unix milliseconds.
    pub modified_unix_ms: Option<u64>,
    /// Header and meta, or what is wrong with the file.
    pub meta: Result<(u32, SnapshotMeta), Error>,
    /// `now - taken_at`, if the snapshot is readable.
    pub age_ms: Option<u64>,
}

/// One journal generation, as found.
#[derive(Clone, Debug)]
pub struct GenerationSummary {
    /// The file.
    pub file: PathBuf,
    /// The generation (from the file name).
    pub generation: u64,
    /// Its size.
    pub bytes: u64,
    /// Schema and seq of its first record, if the header is good.
    pub header: Option<(u32, Seq)>,
    /// Valid records.
    pub records: u64,
    /// Bytes of header and valid records (zeros may follow: preallocated space).
    pub valid_bytes: u64,
    /// Older than the snapshot's next generation: covered by it, deleted at the next open.
    pub covered_by_snapshot: bool,
    /// The bad tail recovery would discard (or refuse), if any.
    pub discarded: Option<Discarded>,
    /// Why the file could not be read at all (bad header, I/O).
    pub error: Option<Error>,
}

/// What [`inspect()`] found.
#[derive(Clone, Debug)]
pub struct Inspection {
    /// The directory.
    pub dir: PathBuf,
    /// The snapshot, if there is a file.
    pub snapshot: Option<SnapshotSummary>,
    /// Journal generations, oldest first.
    pub generations: Vec<GenerationSummary>,
    /// Leftover temp files (deleted at the next open).
    pub temp_files: Vec<PathBuf>,
}

/// Summarises `dir` without modifying it (no lock taken, nothing truncated or deleted).
/// `schema: None` accepts any schema; `now_unix_ms` is the caller's clock, for the age.
/// Fails only if the directory cannot be listed; each file's problems are in its summary.
pub fn inspect(dir: &Path, schema: Option<u32>, now_unix_ms: u64) -> Result<Inspection, Error> {
    let listing = list(dir)?;
    let snapshot = summarise_snapshot(&dir.join(SNAPSHOT), schema, now_unix_ms)?;
    let next_generation = snapshot
        .as_ref()
        .and_then(|s| s.meta.as_ref().ok())
        .map_or(0, |(_, m)| m.next_generation);
    let generations = listing
        .journals
        .into_iter()
        .map(|(generation, file)| {
            let mut summary = summarise_journal(&file, generation, schema);
            summary.covered_by_snapshot = generation < next_generation;
            summary
        })
        .collect();
    Ok(Inspection {
        dir: dir.to_path_buf(),
        snapshot,
        generations,
        temp_files: listing.temps,
    })
}

fn summarise_snapshot(
    file: &Path,
    schema: Option<u32>,
    now_unix_ms: u64,
) -> Result<Option<SnapshotSummary>, Error> {
    let bytes = match fs::read(file) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(file, "read", e)),
    };
    let modified_unix_ms = fs::metadata(file)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| u64::try_from(d.as_millis()).ok());
    let meta = decode_snapshot_in(file, &bytes, schema).map(|(meta, _)| {
        let mut schema = [0u8; 4];
        schema.copy_from_slice(&bytes[8..12]);
        (u32::from_le_bytes(schema), meta)
    });
    let age_ms = meta
        .as_ref()
        .ok()
        .map(|(_, m)| now_unix_ms.saturating_sub(m.taken_at_unix_ms));
    Ok(Some(SnapshotSummary {
        file: file.to_path_buf(),
        bytes: bytes.len() as u64,
        modified_unix_ms,
        meta,
        age_ms,
    }))
}

fn summarise_journal(file: &Path, generation: u64, schema: Option<u32>) -> GenerationSummary {
    let mut summary = GenerationSummary {
        file: file.to_path_buf(),
        generation,
        bytes: 0,
        header: None,
        records: 0,
        valid_bytes: 0,
        covered_by_snapshot: false,
        discarded: None,
        error: None,
    };
    let result = (|| {
        let f = File::open(file).map_err(|e| Error::io(file, "open", e))?;
        summary.bytes = f.metadata().map_err(|e| Error::io(file, "stat", e))?.len();
        let header = read_header(file, &f, generation, schema)?;
        summary.header = Some((header.schema, header.base_seq));
        let mut records = 0;
        let scan = scan_frames(file, f, DEFAULT_MAX_RECORD_BYTES, |_, _| {
            records += 1;
            Ok(())
        })?;
        summary.records = records;
        summary.valid_bytes = scan.valid_len;
        summary.discarded = scan.bad.map(|(offset, reason)| Discarded {
            file: file.to_path_buf(),
            offset,
            bytes: scan.len - offset,
            reason,
        });
        Ok(())
    })();
    summary.error = result.err();
    summary
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "state directory {}", self.dir.display())?;
        match &self.snapshot {
            None => writeln!(f, "  snapshot: none")?,
            Some(s) => match &s.meta {
                Ok((schema, m)) => writeln!(
                    f,
                    "  snapshot: {} bytes, schema {schema}, covers seq < {} (journals < {}), taken at {} ms{}",
                    s.bytes,
                    m.next_seq,
                    m.next_generation,
                    m.taken_at_unix_ms,
                    s.age_ms
                        .map(|a| format!(", age {:.1} s", a as f64 / 1000.0))
                        .unwrap_or_default(),
                )?,
                Err(e) => writeln!(f, "  snapshot: {} bytes, UNREADABLE: {e}", s.bytes)?,
            },
        }
        for g in &self.generations {
            write!(f, "  journal.{}: {} bytes", g.generation, g.bytes)?;
            if let Some((schema, base)) = g.header {
                write!(f, ", schema {schema}, seq {base}.., {} records", g.records)?;
            }
            if g.discarded.is_none() && g.error.is_none() && g.bytes > g.valid_bytes {
                write!(f, ", {} bytes preallocated", g.bytes - g.valid_bytes)?;
            }
            if g.covered_by_snapshot {
                write!(f, " (covered by the snapshot)")?;
            }
            if let Some(d) = &g.discarded {
                write!(
                    f,
                    ", bad tail at offset {}: {} bytes ({})",
                    d.offset, d.bytes, d.reason
                )?;
            }
            if let Some(e) = &g.error {
                write!(f, ", ERROR: {e}")?;
            }
            writeln!(f)?;
        }
        for t in &self.temp_files {
            writeln!(f, "  leftover temp file {}", t.display())?;
        }
        Ok(())
    }
}
