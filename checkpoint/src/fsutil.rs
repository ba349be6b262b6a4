//! File names of a state directory and the few filesystem steps everything else builds on.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::format::encode_journal_header;
use crate::{Error, Seq};

/// Name of the snapshot file.
pub(crate) const SNAPSHOT: &str = "snapshot";
/// Name of the lock file held by the writer.
pub(crate) const LOCK: &str = "lock";
/// Suffix of files being written before their rename.
pub(crate) const TMP_SUFFIX: &str = ".tmp";

/// `journal.<gen>`.
pub(crate) fn journal_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("journal.{generation}"))
}

/// The generation a file name denotes, if it is exactly `journal.<decimal>`.
pub(crate) fn parse_journal_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("journal.")?;
    let generation: u64 = digits.parse().ok()?;
    (generation.to_string() == digits).then_some(generation)
}

/// What a directory holds: journal generations (sorted) and leftover temp files.
pub(crate) struct Listing {
    pub(crate) journals: Vec<(u64, PathBuf)>,
    pub(crate) temps: Vec<PathBuf>,
}

pub(crate) fn list(dir: &Path) -> Result<Listing, Error> {
    let mut listing = Listing {
        journals: Vec::new(),
        temps: Vec::new(),
    };
    let entries = fs::read_dir(dir).map_err(|e| Error::io(dir, "read directory", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, "read directory", e))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if let Some(generation) = parse_journal_name(&name) {
            listing.journals.push((generation, entry.path()));
        } else if name.ends_with(TMP_SUFFIX) {
            listing.temps.push(entry.path());
        }
    }
    listing.journals.sort();
    Ok(listing)
}

/// fsync a directory, so renames, creations and deletions in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, "fsync directory", e))
}

/// Writes `bytes` to `path` atomically: `path.tmp`, fsync, rename, fsync the directory.
pub(crate) fn write_atomic(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(TMP_SUFFIX);
    let tmp = PathBuf::from(tmp);
    let written = (|| {
        // 0600: what a state directory holds says which client asked for which name.
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io(&tmp, "write", e));
    }
    fs::rename(&tmp, path).map_err(|e| Error::io(path, "rename", e))?;
    sync_dir(dir)
}

/// Creates journal `generation` (header only, durable, directory synced) and opens it for
/// writing.
pub(crate) fn create_journal(
    dir: &Path,
    schema: u32,
    generation: u64,
    base_seq: Seq,
) -> Result<(File, PathBuf), Error> {
    let path = journal_path(dir, generation);
    write_atomic(
        dir,
        &path,
        &encode_journal_header(schema, generation, base_seq),
    )?;
    let file = open_rw(&path)?;
    Ok((file, path))
}

pub(crate) fn open_rw(path: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path, "open", e))
}

/// Takes the directory's lock file (an exclusive `flock`, released when the file closes).
pub(crate) fn lock(dir: &Path) -> Result<File, Error> {
    let path = dir.join(LOCK);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::io(&path, "open", e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(Error::Locked { path }),
        Err(fs::TryLockError::Error(e)) => Err(Error::io(&path, "lock", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_names() {
        assert_eq!(parse_journal_name("journal.12"), Some(12));
        assert_eq!(parse_journal_name("journal.012"), None);
        assert_eq!(parse_journal_name("journal.+1"), None);
        assert_eq!(parse_journal_name("journal.1.tmp"), None);
        assert_eq!(parse_journal_name("snapshot"), None);
        assert_eq!(journal_path(Path::new("/d"), 7), Path::new("/d/journal.7"));
    }

    #[test]
    fn lock_is_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path()).unwrap();
        assert!(matches!(lock(dir.path()), Err(Error::Locked { .. })));
        drop(held);
        lock(dir.path()).unwrap();
    }
}
