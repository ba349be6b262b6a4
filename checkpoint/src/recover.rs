//! Recovery: the snapshot, the journals after it, the torn tail cut off.

use std::fs::{self, File};
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::format::{
    FRAME_PREFIX_LEN, JOURNAL_HEADER_LEN, JournalHeader, SnapshotMeta, check_payload, check_prefix,
    decode_journal_header, decode_value, is_free_space,
};
use crate::fsutil::{create_journal, list, lock, open_rw, sync_dir};
use crate::snapshot::read_snapshot_with;
use crate::{Error, FrameProblem, HeaderProblem, Options, Seq};

/// What recovery cut off the end of the last journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discarded {
    /// The journal file.
    pub file: PathBuf,
    /// Offset of the first bad frame (the file now ends here).
    pub offset: u64,
    /// Bytes removed.
    pub bytes: u64,
    /// Why the frame at `offset` was bad.
    pub reason: FrameProblem,
}

/// Where new records go: the last journal, opened at the end of its valid prefix, and the
/// directory's lock. Hand it to [`crate::Journal::start`].
#[derive(Debug)]
pub struct Tail {
    pub(crate) dir: PathBuf,
    /// Held (never read) so the directory's `flock` lasts as long as the writer.
    pub(crate) _lock: File,
    pub(crate) file: File,
    pub(crate) path: PathBuf,
    pub(crate) generation: u64,
    pub(crate) offset: u64,
    /// End of the file: `allocated - offset` bytes of zeros follow the last record.
    pub(crate) allocated: u64,
    pub(crate) next_seq: Seq,
    pub(crate) snapshot_generation: u64,
}

impl Tail {
    /// The journal generation appends go to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The seq the next record will get.
    pub fn next_seq(&self) -> Seq {
        self.next_seq
    }
}

/// The state found in a directory.
#[derive(Debug)]
pub struct Recovered<S, T> {
    /// The snapshot, if there is one.
    pub snapshot: Option<S>,
    /// What the snapshot says about itself.
    pub snapshot_meta: Option<SnapshotMeta>,
    /// The records after the snapshot, in order: `records[i]` has seq `first_seq + i`.
    pub records: Vec<T>,
    /// The seq of `records[0]` (the snapshot's `next_seq`, or 0).
    pub first_seq: Seq,
    /// The torn or corrupt tail that was cut off, if any.
    pub discarded: Option<Discarded>,
    /// Files deleted as leftovers: temp files and journals the snapshot covers.
    pub removed: Vec<PathBuf>,
    /// Where appends continue.
    pub tail: Tail,
}

/// Opens (creating if needed) the state directory `dir`: takes its lock, reads the snapshot
/// and every journal generation from the one it names, and returns the state and the [`Tail`]
/// to append to.
///
/// Recovery stops at the first torn or corrupt frame of the **last** generation: that frame
/// and everything after it were never acknowledged (a record is acknowledged only after its
/// batch was fsynced, and batches are written in order), so the tail is truncated and reported
/// in [`Recovered::discarded`] — or, with `options.strict`, refused with [`Error::Corrupt`]
/// and left untouched. A bad frame in an earlier generation, a bad header, a missing
/// generation or a record that passes its CRC but does not decode is always an error: those
/// are not crash artifacts, and cutting them would drop acknowledged records. Zeros from the
/// first bad frame to the end of a file are the writer's preallocated space (see
/// [`format`](mod@crate::format)), not damage: they are kept and appends overwrite them.
///
/// Journals older than the snapshot's `next_generation` are covered by it and deleted, as are
/// temp files of an interrupted snapshot or rotation. Never panics on any file contents.
pub fn open<S, T>(dir: &Path, options: &Options) -> Result<Recovered<S, T>, Error>
where
    S: DeserializeOwned,
    T: DeserializeOwned,
{
    open_with(dir, options, decode_value)
}

/// [`open`] with the snapshot's body (checked) decoded by `decode_snapshot`, as
/// [`read_snapshot_with`](crate::read_snapshot_with) does.
pub fn open_with<S, T>(
    dir: &Path,
    options: &Options,
    decode_snapshot: impl FnOnce(&[u8]) -> Result<S, String>,
) -> Result<Recovered<S, T>, Error>
where
    T: DeserializeOwned,
{
    // What is recorded may be private (which client asked for what): a new directory is the
    // owner's only.
    std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
        .create(dir)
        .map_err(|e| Error::io(dir, "create directory", e))?;
    let lock = lock(dir)?;
    let listing = list(dir)?;
    let mut removed = Vec::new();
    for tmp in listing.temps {
        fs::remove_file(&tmp).map_err(|e| Error::io(&tmp, "remove", e))?;
        removed.push(tmp);
    }
    let snapshot = read_snapshot_with(dir, options, decode_snapshot)?;
    let snapshot_meta = snapshot.as_ref().map(|(meta, _)| *meta);
    let (live, stale): (Vec<_>, Vec<_>) = listing
        .journals
        .into_iter()
        .partition(|(g, _)| snapshot_meta.is_none_or(|m| *g >= m.next_generation));
    for (_, path) in stale {
        fs::remove_file(&path).map_err(|e| Error::io(&path, "remove", e))?;
        removed.push(path);
    }
    if !removed.is_empty() {
        sync_dir(dir)?;
    }
    let first_seq = snapshot_meta.map_or(Seq(0), |m| m.next_seq);
    let mut expected_gen = match (snapshot_meta, live.first()) {
        (Some(m), _) => m.next_generation.max(1),
        (None, Some((g, _))) => *g,
        (None, None) => 1,
    };
    let mut next_seq = first_seq;
    let mut records = Vec::new();
    let mut discarded = None;
    let mut last = None;
    for (i, (generation, path)) in live.iter().enumerate() {
        let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
        let header = read_header(path, &file, *generation, Some(options.schema))?;
        if header.generation != expected_gen || header.base_seq != next_seq {
            return Err(Error::Gap {
                file: path.clone(),
                expected_generation: expected_gen,
                expected_seq: next_seq.0,
                found_generation: header.generation,
                found_seq: header.base_seq.0,
            });
        }
        let scan = scan_frames(path, file, options.max_record_bytes, |offset, payload| {
            let value = decode_value(payload).map_err(|message| Error::Decode {
                file: path.clone(),
                offset,
                message,
            })?;
            records.push(value);
            next_seq.0 += 1;
            Ok(())
        })?;
        // A cut tail leaves the file ending at the valid prefix; else zeros may follow it.
        let allocated = if scan.bad.is_some() {
            scan.valid_len
        } else {
            scan.len
        };
        if let Some((offset, problem)) = scan.bad {
            if options.strict || i + 1 < live.len() {
                return Err(Error::Corrupt {
                    file: path.clone(),
                    offset,
                    problem,
                });
            }
            let file = open_rw(path)?;
            file.set_len(offset)
                .and_then(|()| file.sync_all())
                .map_err(|e| Error::io(path, "truncate", e))?;
            tracing::warn!(file = %path.display(), offset, bytes = scan.len - offset, %problem,
                "checkpoint: discarded the journal's torn tail");
            discarded = Some(Discarded {
                file: path.clone(),
                offset,
                bytes: scan.len - offset,
                reason: problem,
            });
        }
        last = Some((*generation, path.clone(), scan.valid_len, allocated));
        expected_gen += 1;
    }
    let (file, path, generation, offset, allocated) = match last {
        Some((generation, path, offset, allocated)) => {
            (open_rw(&path)?, path, generation, offset, allocated)
        }
        None => {
            let (file, path) = create_journal(dir, options.schema, expected_gen, next_seq)?;
            (
                file,
                path,
                expected_gen,
                JOURNAL_HEADER_LEN,
                JOURNAL_HEADER_LEN,
            )
        }
    };
    let tail = Tail {
        dir: dir.to_path_buf(),
        _lock: lock,
        file,
        path,
        generation,
        offset,
        allocated,
        next_seq,
        snapshot_generation: snapshot_meta.map_or(0, |m| m.next_generation),
    };
    Ok(Recovered {
        snapshot: snapshot.map(|(_, s)| s),
        snapshot_meta,
        records,
        first_seq,
        discarded,
        removed,
        tail,
    })
}

/// Reads and checks the header of journal `named` (`schema: None` accepts any schema).
pub(crate) fn read_header(
    path: &Path,
    file: &File,
    named: u64,
    schema: Option<u32>,
) -> Result<JournalHeader, Error> {
    let mut buf = Vec::with_capacity(JOURNAL_HEADER_LEN as usize);
    file.take(JOURNAL_HEADER_LEN)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(path, "read", e))?;
    let bad = |offset, problem| Error::BadHeader {
        file: path.to_path_buf(),
        offset,
        problem,
    };
    let header = decode_journal_header(&buf, schema).map_err(|(o, p)| bad(o, p))?;
    if header.generation != named {
        return Err(bad(
            12,
            HeaderProblem::Generation {
                named,
                found: header.generation,
            },
        ));
    }
    Ok(header)
}

/// The result of scanning a journal's frames.
pub(crate) struct Scan {
    /// File length.
    pub(crate) len: u64,
    /// End of the valid prefix.
    pub(crate) valid_len: u64,
    /// The first bad frame (`None` if only zeros follow the valid prefix: preallocated space).
    pub(crate) bad: Option<(u64, FrameProblem)>,
}

/// Reads the frames of `file` (positioned after its header), calling `each(offset, payload)`
/// for every valid one, up to the first bad frame. Allocates at most one frame, bounded by
/// both `max` and what is left of the file.
pub(crate) fn scan_frames(
    path: &Path,
    file: File,
    max: u32,
    mut each: impl FnMut(u64, &[u8]) -> Result<(), Error>,
) -> Result<Scan, Error> {
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    let mut reader = BufReader::with_capacity(256 << 10, file);
    let mut offset = JOURNAL_HEADER_LEN;
    let mut payload = Vec::new();
    let io = |e| Error::io(path, "read", e);
    let bad = loop {
        let remaining = len.saturating_sub(offset);
        if remaining == 0 {
            break None;
        }
        if remaining < FRAME_PREFIX_LEN {
            break Some(FrameProblem::Torn {
                needed: FRAME_PREFIX_LEN,
                available: remaining,
            });
        }
        let mut prefix = [0u8; 8];
        reader.read_exact(&mut prefix).map_err(io)?;
        let payload_len = match check_prefix(&prefix, remaining, max) {
            Ok((payload_len, _)) => payload_len,
            Err(problem) => break Some(problem),
        };
        payload.resize(payload_len, 0);
        reader.read_exact(&mut payload).map_err(io)?;
        if let Err(problem) = check_payload(&prefix, &payload) {
            break Some(problem);
        }
        each(offset, &payload)?;
        offset += FRAME_PREFIX_LEN + payload_len as u64;
    };
    let bad = match bad {
        Some(_) if only_zeros(reader.get_ref(), offset, len).map_err(io)? => None,
        bad => bad,
    };
    Ok(Scan {
        len,
        valid_len: offset,
        bad: bad.map(|p| (offset, p)),
    })
}

/// Whether `file[from..to]` is all zeros: the writer's preallocated free space.
fn only_zeros(file: &File, from: u64, to: u64) -> std::io::Result<bool> {
    let mut buf = vec![0u8; 64 << 10];
    let mut at = from;
    while at < to {
        let want = usize::try_from(to - at).map_or(buf.len(), |n| n.min(buf.len()));
        let got = file.read_at(&mut buf[..want], at)?;
        if got == 0 {
            // Shorter than its length a moment ago: nothing more to look at.
            break;
        }
        if !is_free_space(&buf[..got]) {
            return Ok(false);
        }
        at += got as u64;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::format::{encode_journal_header, encode_record};
    use crate::fsutil::journal_path;

    fn write_journal(dir: &Path, generation: u64, base: u64, records: &[u32], junk: &[u8]) {
        let mut f = File::create(journal_path(dir, generation)).unwrap();
        f.write_all(&encode_journal_header(1, generation, Seq(base)))
            .unwrap();
        for r in records {
            f.write_all(&encode_record(r, 1024).unwrap()).unwrap();
        }
        f.write_all(junk).unwrap();
    }

    #[test]
    fn fresh_directory_gets_generation_one() {
        let dir = tempfile::tempdir().unwrap();
        let r: Recovered<(), u32> = open(dir.path(), &Options::new(1)).unwrap();
        assert!(r.snapshot.is_none() && r.records.is_empty() && r.discarded.is_none());
        assert_eq!((r.tail.generation(), r.tail.next_seq()), (1, Seq(0)));
        assert!(journal_path(dir.path(), 1).exists());
    }

    #[test]
    fn torn_tail_is_cut_and_reported_strict_refuses() {
        let dir = tempfile::tempdir().unwrap();
        write_journal(dir.path(), 1, 0, &[1, 2], &[]);
        write_journal(dir.path(), 2, 2, &[3], &[5, 0, 0, 0, 1]);
        let path = journal_path(dir.path(), 2);
        let len = fs::metadata(&path).unwrap().len();
        let strict = Options {
            strict: true,
            ..Options::new(1)
        };
        let err = open::<(), u32>(dir.path(), &strict).unwrap_err();
        assert!(
            matches!(err, Error::Corrupt { offset, .. } if offset == len - 5),
            "{err}"
        );
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            len,
            "strict mode must not truncate"
        );
        let r: Recovered<(), u32> = open(dir.path(), &Options::new(1)).unwrap();
        assert_eq!(r.records, [1, 2, 3]);
        assert_eq!(
            r.discarded,
            Some(Discarded {
                file: path.clone(),
                offset: len - 5,
                bytes: 5,
                reason: FrameProblem::Torn {
                    needed: 8,
                    available: 5
                },
            })
        );
        assert_eq!(fs::metadata(&path).unwrap().len(), len - 5);
        assert_eq!(
            (r.tail.generation(), r.tail.next_seq(), r.tail.offset),
            (2, Seq(3), len - 5)
        );
    }

    #[test]
    fn corruption_before_the_last_generation_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write_journal(dir.path(), 1, 0, &[1], &[0, 0, 0, 0, 0, 0, 0, 0, 1]);
        write_journal(dir.path(), 2, 1, &[2], &[]);
        let err = open::<(), u32>(dir.path(), &Options::new(1)).unwrap_err();
        assert!(
            matches!(&err, Error::Corrupt { file, .. } if file.ends_with("journal.1")),
            "{err}"
        );
    }

    /// Preallocated space (zeros after the last record) is no damage, in any generation and
    /// in strict mode; it is kept, and appends overwrite it.
    #[tokio::test]
    async fn zero_tail_is_free_space_kept_and_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        write_journal(dir.path(), 1, 0, &[1], &[0; 9]);
        write_journal(dir.path(), 2, 1, &[2, 3], &[0; 5000]);
        let path = journal_path(dir.path(), 2);
        let len = fs::metadata(&path).unwrap().len();
        let strict = Options {
            strict: true,
            ..Options::new(1)
        };
        let r: Recovered<(), u32> = open(dir.path(), &strict).unwrap();
        assert_eq!(
            (r.records.clone(), r.discarded.clone()),
            (vec![1, 2, 3], None)
        );
        assert_eq!((r.tail.offset, r.tail.allocated), (len - 5000, len));
        assert_eq!(fs::metadata(&path).unwrap().len(), len, "free space kept");
        let j = crate::Journal::<u32>::start(r.tail, &strict);
        assert_eq!(j.append(&4).await.unwrap(), Seq(3));
        j.close().await.unwrap();
        let r: Recovered<(), u32> = open(dir.path(), &strict).unwrap();
        assert_eq!((r.records.clone(), r.discarded), (vec![1, 2, 3, 4], None));
        // The writer kept (and grew) the preallocation: the file did not end at the record.
        assert!(r.tail.allocated >= len && r.tail.allocated > r.tail.offset);
    }

    /// A record torn inside preallocated space (its first bytes written, the rest still zeros,
    /// as a crash during a batch leaves it) is a torn tail: cut, with the zeros after it.
    #[test]
    fn torn_record_in_free_space_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let mut junk = encode_record(&77u32, 1024).unwrap();
        junk.truncate(junk.len() - 1);
        junk.extend([0; 300]);
        write_journal(dir.path(), 1, 0, &[1, 2], &junk);
        let path = journal_path(dir.path(), 1);
        let len = fs::metadata(&path).unwrap().len();
        let strict = Options {
            strict: true,
            ..Options::new(1)
        };
        assert!(matches!(
            open::<(), u32>(dir.path(), &strict),
            Err(Error::Corrupt { .. })
        ));
        let r: Recovered<(), u32> = open(dir.path(), &Options::new(1)).unwrap();
        assert_eq!(r.records, [1, 2]);
        let d = r.discarded.unwrap();
        assert_eq!(
            (d.offset, d.offset + d.bytes),
            (len - junk.len() as u64, len)
        );
        assert_eq!(fs::metadata(&path).unwrap().len(), d.offset);
        assert_eq!(r.tail.allocated, d.offset);
    }

    #[test]
    fn gaps_and_misnamed_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        write_journal(dir.path(), 1, 0, &[1], &[]);
        write_journal(dir.path(), 3, 1, &[2], &[]);
        let err = open::<(), u32>(dir.path(), &Options::new(1)).unwrap_err();
        assert!(matches!(
            err,
            Error::Gap {
                expected_generation: 2,
                found_generation: 3,
                ..
            }
        ));

        let dir = tempfile::tempdir().unwrap();
        write_journal(dir.path(), 1, 5, &[1], &[]);
        let err = open::<(), u32>(dir.path(), &Options::new(1)).unwrap_err();
        assert!(matches!(
            err,
            Error::Gap {
                expected_seq: 0,
                found_seq: 5,
                ..
            }
        ));

        let dir = tempfile::tempdir().unwrap();
        write_journal(dir.path(), 1, 0, &[], &[]);
        fs::rename(journal_path(dir.path(), 1), journal_path(dir.path(), 4)).unwrap();
        let err = open::<(), u32>(dir.path(), &Options::new(1)).unwrap_err();
        assert!(matches!(
            err,
            Error::BadHeader {
                problem: HeaderProblem::Generation { named: 4, found: 1 },
                ..
            }
        ));
    }

    #[test]
    fn undecodable_record_is_an_error_not_a_tail() {
        let dir = tempfile::tempdir().unwrap();
        write_journal(dir.path(), 1, 0, &[1, 2], &[]);
        let err = open::<(), String>(dir.path(), &Options::new(1)).unwrap_err();
        assert!(matches!(err, Error::Decode { offset: 32, .. }), "{err}");
    }
}
