//! The on-disk formats, and pure decoders over bytes (what the fuzz targets drive).
//!
//! All integers are little-endian; every CRC is CRC-32 (IEEE, `crc32fast`).
//!
//! **Journal file** `journal.<gen>` (decimal generation, no padding):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 6 | magic `FQDNDJ` |
//! | 6 | 2 | format version (1) |
//! | 8 | 4 | schema (the caller's) |
//! | 12 | 8 | generation (equals the file name's) |
//! | 20 | 8 | base seq: the [`crate::Seq`] of the first record in this file |
//! | 28 | 4 | CRC of bytes 0..28 |
//! | 32 | … | records |
//!
//! **Record frame**: `len: u32 | crc: u32 | payload (len bytes, postcard of T)`. The CRC covers
//! the 4 length bytes *and* the payload, so a run of zeros (a preallocated, never written
//! block) is not a valid empty record. `len` above the limit is corruption, never an
//! allocation.
//!
//! **Preallocated tail**: the writer keeps up to [`PREALLOCATION`] bytes of zeros written and
//! synced past the last record, so that a batch overwrites blocks that already exist and its
//! `fdatasync` has no file size or extent to commit. The records end at the first bad frame
//! whose bytes, up to the end of the file, are all zeros: that is free space, not damage (no
//! valid frame is all zeros). Anything else after the last valid frame is a torn tail.
//!
//! **Snapshot file** `snapshot`:
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 6 | magic `FQDNDS` |
//! | 6 | 2 | format version (1) |
//! | 8 | 4 | schema |
//! | 12 | 8 | next generation: the first journal generation *not* covered by the snapshot |
//! | 20 | 8 | next seq: the first record *not* covered |
//! | 28 | 8 | taken at, Unix milliseconds (given by the caller) |
//! | 36 | 4 | CRC of bytes 0..36 |
//! | 40 | 8 | body length |
//! | 48 | 4 | CRC of the 8 length bytes and the body |
//! | 52 | … | body (postcard of S); the file ends exactly here |

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::{DeserializeOwned, DeserializeSeed};

use crate::{Error, FrameProblem, HeaderProblem, Seq};

/// Magic of a journal file.
pub const JOURNAL_MAGIC: [u8; 6] = *b"FQDNDJ";
/// Magic of a snapshot file.
pub const SNAPSHOT_MAGIC: [u8; 6] = *b"FQDNDS";
/// The format version written and read by this build.
pub const VERSION: u16 = 1;
/// Length of a journal header.
pub const JOURNAL_HEADER_LEN: u64 = 32;
/// Length of a snapshot header, up to the body length field.
pub const SNAPSHOT_HEADER_LEN: u64 = 40;
/// Length of a record frame's prefix (length + CRC).
pub const FRAME_PREFIX_LEN: u64 = 8;
const SNAPSHOT_BODY_OFFSET: u64 = SNAPSHOT_HEADER_LEN + 12;
/// Zeros the writer keeps written past the last record of the current journal (see the
/// module docs): it extends the file by this much once less than a quarter of it is left.
pub const PREALLOCATION: u64 = 1 << 20;

/// Whether `bytes` are all zeros: free, preallocated space at the end of a journal.
pub(crate) fn is_free_space(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// The decoded header of a journal file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalHeader {
    /// The caller's schema.
    pub schema: u32,
    /// The generation.
    pub generation: u64,
    /// Seq of the first record in the file.
    pub base_seq: Seq,
}

/// What a snapshot says about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotMeta {
    /// First journal generation not covered by the snapshot; recovery replays from it.
    pub next_generation: u64,
    /// First record not covered by the snapshot.
    pub next_seq: Seq,
    /// When the caller took it, Unix milliseconds.
    pub taken_at_unix_ms: u64,
}

/// A journal decoded from bytes: the valid prefix, and what follows it if anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedJournal<'a> {
    /// The header.
    pub header: JournalHeader,
    /// Each valid record: its frame offset and payload.
    pub records: Vec<(u64, &'a [u8])>,
    /// Length of the valid prefix (header + valid frames).
    pub valid_len: u64,
    /// The first bad frame, if the bytes after `valid_len` are not all zeros (preallocated
    /// free space): its offset and problem.
    pub discarded: Option<(u64, FrameProblem)>,
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[at..at + 2]);
    u16::from_le_bytes(a)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The header of journal `generation`.
pub fn encode_journal_header(schema: u32, generation: u64, base_seq: Seq) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[0..6].copy_from_slice(&JOURNAL_MAGIC);
    h[6..8].copy_from_slice(&VERSION.to_le_bytes());
    h[8..12].copy_from_slice(&schema.to_le_bytes());
    h[12..20].copy_from_slice(&generation.to_le_bytes());
    h[20..28].copy_from_slice(&base_seq.0.to_le_bytes());
    let crc = crc32fast::hash(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Checks magic, version and CRC of a header of `len` bytes whose CRC sits at `len - 4`,
/// then the schema if `schema` is given. Errors carry the offset of the bad field.
fn check_header(
    bytes: &[u8],
    len: usize,
    magic: [u8; 6],
    schema: Option<u32>,
) -> Result<(), (u64, HeaderProblem)> {
    if bytes.len() < len {
        let problem = HeaderProblem::Short {
            len: bytes.len() as u64,
            needed: len as u64,
        };
        return Err((0, problem));
    }
    let mut found = [0u8; 6];
    found.copy_from_slice(&bytes[0..6]);
    if found != magic {
        return Err((
            0,
            HeaderProblem::Magic {
                found,
                expected: magic,
            },
        ));
    }
    let version = le_u16(bytes, 6);
    if version != VERSION {
        return Err((
            6,
            HeaderProblem::Version {
                found: version,
                supported: VERSION,
            },
        ));
    }
    let stored = le_u32(bytes, len - 4);
    let computed = crc32fast::hash(&bytes[0..len - 4]);
    if stored != computed {
        return Err(((len - 4) as u64, HeaderProblem::Crc { stored, computed }));
    }
    let found = le_u32(bytes, 8);
    match schema {
        Some(expected) if expected != found => Err((8, HeaderProblem::Schema { found, expected })),
        _ => Ok(()),
    }
}

/// Decodes a journal header; `schema: None` accepts any schema (inspection).
pub fn decode_journal_header(
    bytes: &[u8],
    schema: Option<u32>,
) -> Result<JournalHeader, (u64, HeaderProblem)> {
    check_header(bytes, JOURNAL_HEADER_LEN as usize, JOURNAL_MAGIC, schema)?;
    Ok(JournalHeader {
        schema: le_u32(bytes, 8),
        generation: le_u64(bytes, 12),
        base_seq: Seq(le_u64(bytes, 20)),
    })
}

fn frame_crc(len_bytes: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(len_bytes);
    h.update(payload);
    h.finalize()
}

/// Serialises `value` as one record frame (prefix + payload), refusing payloads over `max`.
pub fn encode_record<T: Serialize + ?Sized>(value: &T, max: u32) -> Result<Vec<u8>, Error> {
    let frame = postcard::to_extend(value, vec![0u8; FRAME_PREFIX_LEN as usize]).map_err(|e| {
        Error::Encode {
            message: e.to_string(),
        }
    })?;
    let payload_len = frame.len() - FRAME_PREFIX_LEN as usize;
    let len = u32::try_from(payload_len)
        .ok()
        .filter(|l| *l <= max)
        .ok_or(Error::TooLarge {
            bytes: payload_len,
            max,
        })?;
    let mut frame = frame;
    frame[0..4].copy_from_slice(&len.to_le_bytes());
    let crc = frame_crc(&frame[0..4], &frame[8..]);
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(frame)
}

/// Checks a frame prefix against the bytes that remain from its offset; returns the payload
/// length and the stored CRC.
pub(crate) fn check_prefix(
    prefix: &[u8; 8],
    remaining: u64,
    max: u32,
) -> Result<(usize, u32), FrameProblem> {
    let len = le_u32(prefix, 0);
    if len > max {
        return Err(FrameProblem::TooLarge {
            len: u64::from(len),
            max: u64::from(max),
        });
    }
    let needed = FRAME_PREFIX_LEN + u64::from(len);
    if needed > remaining {
        return Err(FrameProblem::Torn {
            needed,
            available: remaining,
        });
    }
    Ok((len as usize, le_u32(prefix, 4)))
}

/// Checks a payload against the CRC stored in its prefix.
pub(crate) fn check_payload(prefix: &[u8; 8], payload: &[u8]) -> Result<(), FrameProblem> {
    let stored = le_u32(prefix, 4);
    let computed = frame_crc(&prefix[0..4], payload);
    if stored == computed {
        Ok(())
    } else {
        Err(FrameProblem::Crc { stored, computed })
    }
}

/// Decodes journal bytes: header (checked against `schema`), then frames up to the first bad
/// one (which is no damage if only zeros follow: preallocated space). Never panics and never allocates more than the input's size; a bad header is an
/// [`Error::BadHeader`] (file `<bytes>`), a bad frame ends the valid prefix.
pub fn decode_journal_bytes(
    bytes: &[u8],
    schema: u32,
    max_record_bytes: u32,
) -> Result<DecodedJournal<'_>, Error> {
    let header = decode_journal_header(bytes, Some(schema)).map_err(|(offset, problem)| {
        Error::BadHeader {
            file: "<bytes>".into(),
            offset,
            problem,
        }
    })?;
    let mut at = JOURNAL_HEADER_LEN as usize;
    let mut records = Vec::new();
    let mut discarded = None;
    while at < bytes.len() {
        let remaining = (bytes.len() - at) as u64;
        let mut prefix = [0u8; 8];
        if remaining < FRAME_PREFIX_LEN {
            let problem = FrameProblem::Torn {
                needed: FRAME_PREFIX_LEN,
                available: remaining,
            };
            discarded = Some((at as u64, problem));
            break;
        }
        prefix.copy_from_slice(&bytes[at..at + 8]);
        let checked = check_prefix(&prefix, remaining, max_record_bytes).and_then(|(len, _)| {
            let payload = &bytes[at + 8..at + 8 + len];
            check_payload(&prefix, payload).map(|()| payload)
        });
        match checked {
            Ok(payload) => {
                records.push((at as u64, payload));
                at += 8 + payload.len();
            }
            Err(problem) => {
                discarded = Some((at as u64, problem));
                break;
            }
        }
    }
    if is_free_space(&bytes[at..]) {
        discarded = None;
    }
    Ok(DecodedJournal {
        header,
        records,
        valid_len: at as u64,
        discarded,
    })
}

/// The snapshot file for `meta` and an encoded body.
pub fn encode_snapshot(schema: u32, meta: &SnapshotMeta, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(SNAPSHOT_BODY_OFFSET as usize + body.len());
    out.extend_from_slice(&SNAPSHOT_MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&schema.to_le_bytes());
    out.extend_from_slice(&meta.next_generation.to_le_bytes());
    out.extend_from_slice(&meta.next_seq.0.to_le_bytes());
    out.extend_from_slice(&meta.taken_at_unix_ms.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    let len = (body.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&frame_crc(&len, body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Decodes snapshot bytes into its meta and body, checking everything; errors name the file
/// `<bytes>`. `schema: None` accepts any schema.
pub fn decode_snapshot_bytes(
    bytes: &[u8],
    schema: Option<u32>,
) -> Result<(SnapshotMeta, &[u8]), Error> {
    decode_snapshot_in("<bytes>".as_ref(), bytes, schema)
}

pub(crate) fn decode_snapshot_in<'a>(
    file: &std::path::Path,
    bytes: &'a [u8],
    schema: Option<u32>,
) -> Result<(SnapshotMeta, &'a [u8]), Error> {
    check_header(bytes, SNAPSHOT_HEADER_LEN as usize, SNAPSHOT_MAGIC, schema).map_err(
        |(offset, problem)| Error::BadHeader {
            file: file.to_path_buf(),
            offset,
            problem,
        },
    )?;
    let meta = SnapshotMeta {
        next_generation: le_u64(bytes, 12),
        next_seq: Seq(le_u64(bytes, 20)),
        taken_at_unix_ms: le_u64(bytes, 28),
    };
    let corrupt = |problem| Error::Corrupt {
        file: file.to_path_buf(),
        offset: 40,
        problem,
    };
    let available = bytes.len() as u64 - SNAPSHOT_HEADER_LEN;
    if available < 12 {
        return Err(corrupt(FrameProblem::Torn {
            needed: 12,
            available,
        }));
    }
    let len = le_u64(bytes, 40);
    let needed = len.saturating_add(12);
    if needed > available {
        return Err(corrupt(FrameProblem::Torn { needed, available }));
    }
    if needed < available {
        return Err(corrupt(FrameProblem::Trailing {
            extra: available - needed,
        }));
    }
    let body = &bytes[SNAPSHOT_BODY_OFFSET as usize..];
    let stored = le_u32(bytes, 48);
    let computed = frame_crc(&bytes[40..48], body);
    if stored != computed {
        return Err(corrupt(FrameProblem::Crc { stored, computed }));
    }
    Ok((meta, body))
}

/// Serialises a value (a record payload or a snapshot body).
pub(crate) fn encode_value<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, Error> {
    postcard::to_allocvec(value).map_err(|e| Error::Encode {
        message: e.to_string(),
    })
}

/// Deserialises a whole payload; trailing bytes are an error.
pub fn decode_value<T: DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
    decode_seed(PhantomData::<T>, payload)
}

/// Deserialises a whole payload with `seed`: a decoder with state of its own (where to
/// append what it reads, what to start once it knows a length); trailing bytes are an error.
pub fn decode_seed<'de, D: DeserializeSeed<'de>>(
    seed: D,
    payload: &'de [u8],
) -> Result<D::Value, String> {
    let mut decoder = postcard::Deserializer::from_bytes(payload);
    let value = seed.deserialize(&mut decoder).map_err(|e| e.to_string())?;
    match decoder.finalize() {
        Ok([]) => Ok(value),
        Ok(rest) => Err(format!("{} bytes left after the value", rest.len())),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal(records: &[&str]) -> Vec<u8> {
        let mut out = encode_journal_header(7, 3, Seq(10)).to_vec();
        for r in records {
            out.extend(encode_record(r, 1024).unwrap());
        }
        out
    }

    #[test]
    fn journal_round_trip() {
        let bytes = journal(&["a", "bb", ""]);
        let d = decode_journal_bytes(&bytes, 7, 1024).unwrap();
        assert_eq!(
            d.header,
            JournalHeader {
                schema: 7,
                generation: 3,
                base_seq: Seq(10)
            }
        );
        let values: Vec<String> = d
            .records
            .iter()
            .map(|(_, p)| decode_value(p).unwrap())
            .collect();
        assert_eq!(values, ["a", "bb", ""]);
        assert_eq!(d.valid_len, bytes.len() as u64);
        assert_eq!(d.discarded, None);
    }

    #[test]
    fn zeroed_tail_is_free_space_not_a_record() {
        let mut bytes = journal(&["a"]);
        let valid = bytes.len() as u64;
        for zeros in [1, 7, 8, 64, 4096] {
            let mut z = bytes.clone();
            z.extend(vec![0u8; zeros]);
            let d = decode_journal_bytes(&z, 7, 1024).unwrap();
            assert_eq!((d.valid_len, d.records.len()), (valid, 1), "{zeros} zeros");
            assert_eq!(d.discarded, None, "{zeros} zeros");
        }
        // A torn frame in preallocated space: damage, even though zeros follow it.
        let mut torn = bytes.clone();
        torn.extend(&encode_record(&"torn", 1024).unwrap()[..6]);
        torn.extend([0u8; 64]);
        let d = decode_journal_bytes(&torn, 7, 1024).unwrap();
        assert!(matches!(d.discarded, Some((o, FrameProblem::Crc { .. })) if o == valid));
        // One non-zero byte anywhere in the tail makes it damage.
        bytes.extend([0u8; 64]);
        bytes[valid as usize + 40] = 1;
        let d = decode_journal_bytes(&bytes, 7, 1024).unwrap();
        assert!(matches!(d.discarded, Some((o, _)) if o == valid));
    }

    #[test]
    fn torn_and_oversized_frames() {
        let bytes = journal(&["hello"]);
        for cut in 33..bytes.len() {
            let d = decode_journal_bytes(&bytes[..cut], 7, 1024).unwrap();
            assert!(d.records.is_empty());
            assert!(matches!(d.discarded, Some((32, FrameProblem::Torn { .. }))));
        }
        let mut big = journal(&[]);
        big.extend(u32::MAX.to_le_bytes());
        big.extend([0u8; 4]);
        let d = decode_journal_bytes(&big, 7, 1024).unwrap();
        assert!(matches!(
            d.discarded,
            Some((32, FrameProblem::TooLarge { .. }))
        ));
    }

    #[test]
    fn headers_name_what_is_wrong() {
        let bytes = journal(&[]);
        let err = |b: &[u8]| match decode_journal_bytes(b, 7, 1024) {
            Err(Error::BadHeader {
                offset, problem, ..
            }) => (offset, problem),
            other => panic!("{other:?}"),
        };
        assert!(matches!(
            err(&bytes[..10]),
            (0, HeaderProblem::Short { len: 10, .. })
        ));
        assert!(matches!(
            err(b"FQDNDSxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
            (0, HeaderProblem::Magic { .. })
        ));
        let mut v = bytes.clone();
        v[6] = 9;
        assert!(matches!(
            err(&v),
            (6, HeaderProblem::Version { found: 9, .. })
        ));
        let mut v = bytes.clone();
        v[15] ^= 1;
        assert!(matches!(err(&v), (28, HeaderProblem::Crc { .. })));
        assert!(matches!(
            decode_journal_bytes(&bytes, 8, 1024),
            Err(Error::BadHeader {
                offset: 8,
                problem: HeaderProblem::Schema {
                    found: 7,
                    expected: 8
                },
                ..
            })
        ));
    }

    #[test]
    fn snapshot_round_trip_and_damage() {
        let meta = SnapshotMeta {
            next_generation: 4,
            next_seq: Seq(99),
            taken_at_unix_ms: 5,
        };
        let body = encode_value(&vec![1u32, 2, 3]).unwrap();
        let bytes = encode_snapshot(1, &meta, &body);
        let (m, b) = decode_snapshot_bytes(&bytes, Some(1)).unwrap();
        assert_eq!((m, b), (meta, &body[..]));
        assert_eq!(decode_value::<Vec<u32>>(b).unwrap(), [1, 2, 3]);
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(matches!(
            decode_snapshot_bytes(&extra, Some(1)),
            Err(Error::Corrupt {
                offset: 40,
                problem: FrameProblem::Trailing { extra: 1 },
                ..
            })
        ));
        assert!(matches!(
            decode_snapshot_bytes(&bytes[..bytes.len() - 1], Some(1)),
            Err(Error::Corrupt {
                problem: FrameProblem::Torn { .. },
                ..
            })
        ));
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 0x10;
        assert!(matches!(
            decode_snapshot_bytes(&flipped, Some(1)),
            Err(Error::Corrupt {
                problem: FrameProblem::Crc { .. },
                ..
            })
        ));
    }

    #[test]
    fn record_limit_and_trailing_bytes() {
        assert!(matches!(
            encode_record(&"x".repeat(100), 50),
            Err(Error::TooLarge { max: 50, .. })
        ));
        assert!(decode_value::<u8>(&[1, 2]).is_err());
    }
}
