//! Snapshots: one file, `snapshot`, replaced atomically.

use std::fs;
use std::io;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use crate::format::SnapshotMeta;
use crate::format::{decode_snapshot_in, decode_value, encode_snapshot, encode_value};
use crate::fsutil::{SNAPSHOT, write_atomic};
use crate::{Error, Options};

/// Writes `state` as `dir/snapshot`, atomically: a temp file in `dir`, fsync, rename over
/// `snapshot`, fsync of `dir`. A crash at any point leaves either the old snapshot or the new
/// one, never a mix. Returns the file's size.
///
/// On its own this does not touch the journals; [`crate::Journal::compact`] is the safe way to
/// compact. Writing a snapshot whose `next_generation` is older than the journals on disk, or
/// whose state does not cover exactly the records before `next_seq`, breaks recovery.
pub fn write_snapshot<S: Serialize + ?Sized>(
    dir: &Path,
    schema: u32,
    meta: &SnapshotMeta,
    state: &S,
) -> Result<u64, Error> {
    let bytes = encode_snapshot(schema, meta, &encode_value(state)?);
    write_atomic(dir, &dir.join(SNAPSHOT), &bytes)?;
    Ok(bytes.len() as u64)
}

/// Reads `dir/snapshot`, if there is one, checking magic, version, schema and both CRCs; an
/// error names the file and the offset of what is wrong.
pub fn read_snapshot<S: DeserializeOwned>(
    dir: &Path,
    options: &Options,
) -> Result<Option<(SnapshotMeta, S)>, Error> {
    read_snapshot_with(dir, options, decode_value)
}

/// [`read_snapshot`] with the body — its length and CRCs checked — decoded by `decode`
/// (with [`decode_seed`](crate::format::decode_seed), say); its error message is reported
/// as [`Error::Decode`].
pub fn read_snapshot_with<S>(
    dir: &Path,
    options: &Options,
    decode: impl FnOnce(&[u8]) -> Result<S, String>,
) -> Result<Option<(SnapshotMeta, S)>, Error> {
    let path = dir.join(SNAPSHOT);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, "read", e)),
    };
    let (meta, body) = decode_snapshot_in(&path, &bytes, Some(options.schema))?;
    let state = decode(body).map_err(|message| Error::Decode {
        file: path.clone(),
        offset: crate::format::SNAPSHOT_HEADER_LEN + 12,
        message,
    })?;
    Ok(Some((meta, state)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Seq;

    #[test]
    fn write_then_read_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options::new(3);
        assert!(
            read_snapshot::<Vec<u8>>(dir.path(), &options)
                .unwrap()
                .is_none()
        );
        let meta = SnapshotMeta {
            next_generation: 2,
            next_seq: Seq(5),
            taken_at_unix_ms: 77,
        };
        write_snapshot(dir.path(), 3, &meta, &vec![1u8, 2]).unwrap();
        let meta2 = SnapshotMeta {
            next_generation: 3,
            ..meta
        };
        write_snapshot(dir.path(), 3, &meta2, &vec![9u8]).unwrap();
        let (m, s): (_, Vec<u8>) = read_snapshot(dir.path(), &options).unwrap().unwrap();
        assert_eq!((m, s), (meta2, vec![9]));
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["snapshot"]);
    }

    #[test]
    fn errors_name_file_and_offset() {
        let dir = tempfile::tempdir().unwrap();
        let meta = SnapshotMeta {
            next_generation: 1,
            next_seq: Seq(0),
            taken_at_unix_ms: 0,
        };
        write_snapshot(dir.path(), 3, &meta, "state").unwrap();
        let err = read_snapshot::<String>(dir.path(), &Options::new(4)).unwrap_err();
        assert!(
            matches!(&err, Error::BadHeader { file, offset: 8, .. } if file.ends_with("snapshot"))
        );
        assert!(err.to_string().contains("schema 3, expected 4"), "{err}");
        let err = read_snapshot::<u64>(dir.path(), &Options::new(3)).unwrap_err();
        assert!(matches!(err, Error::Decode { offset: 52, .. }), "{err}");
    }
}
