//! Arbitrary bytes as a journal file → `decode_journal_bytes` (the in-memory decoder) and
//! `open` (the streaming recovery that reads, truncates and reopens the file).
//!
//! Invariants: never panics; the input as given and behind a valid header both decode; the
//! valid records are contiguous from the header to `valid_len`, and anything after it is
//! either all zeros (the writer's preallocated free space, not reported) or reported as
//! discarded at exactly that offset; recovery of the same bytes from a file agrees with the
//! in-memory decoder (same records, same discarded tail, file cut to `valid_len` when a tail
//! was discarded and left as it was when only zeros follow) or fails with `Decode` at the
//! first record that is not a `Record`.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use fqdnd_checkpoint::format::{JOURNAL_HEADER_LEN, decode_value, encode_journal_header};
use fqdnd_checkpoint::{Error, Options, Recovered, Seq, decode_journal_bytes, open};
use libfuzzer_sys::fuzz_target;

const SCHEMA: u32 = 0x5EED;
const MAX: u32 = 1 << 20;
type Record = (u32, String);

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
        base.join(format!("fqdnd-fuzz-journal-{}", std::process::id()))
    })
}

fn check(bytes: &[u8]) -> Option<Vec<(u64, Result<Record, String>)>> {
    let d = decode_journal_bytes(bytes, SCHEMA, MAX).ok()?;
    let mut end = JOURNAL_HEADER_LEN;
    for (offset, payload) in &d.records {
        assert_eq!(*offset, end, "records are not contiguous");
        end += 8 + payload.len() as u64;
    }
    assert_eq!(d.valid_len, end);
    assert!(d.valid_len <= bytes.len() as u64);
    match &d.discarded {
        Some((offset, _)) => assert_eq!(*offset, d.valid_len),
        None => assert!(
            bytes[d.valid_len as usize..].iter().all(|&b| b == 0),
            "bytes after the valid prefix neither discarded nor free space"
        ),
    }
    Some(d.records.iter().map(|(o, p)| (*o, decode_value::<Record>(p))).collect())
}

fuzz_target!(|data: &[u8]| {
    let _ = check(data);
    let mut file = encode_journal_header(SCHEMA, 1, Seq(0)).to_vec();
    file.extend_from_slice(data);
    let Some(records) = check(&file) else { panic!("a valid header was refused") };
    let d = decode_journal_bytes(&file, SCHEMA, MAX).unwrap();

    let dir = scratch();
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("journal.1");
    std::fs::write(&path, &file).unwrap();
    let options = Options { max_record_bytes: MAX, ..Options::new(SCHEMA) };
    let first_bad = records.iter().find(|(_, r)| r.is_err()).map(|(o, _)| *o);
    match open::<(), Record>(dir, &options) {
        Ok(r) => {
            let r: Recovered<(), Record> = r;
            assert_eq!(first_bad, None, "an undecodable record was accepted");
            let values: Vec<Record> = records.into_iter().filter_map(|(_, r)| r.ok()).collect();
            assert_eq!(r.records, values);
            assert_eq!(r.discarded.as_ref().map(|x| (x.offset, x.reason.clone())), d.discarded);
            let kept = if d.discarded.is_some() { d.valid_len } else { file.len() as u64 };
            assert_eq!(std::fs::metadata(&path).unwrap().len(), kept);
            assert_eq!(r.tail.next_seq(), Seq(r.records.len() as u64));
        }
        Err(Error::Decode { offset, .. }) => assert_eq!(Some(offset), first_bad),
        Err(e) => panic!("recovery failed: {e}"),
    }
});
