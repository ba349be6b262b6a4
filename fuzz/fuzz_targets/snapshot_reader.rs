//! Arbitrary bytes as a snapshot file → `decode_snapshot_bytes` and `read_snapshot`.
//!
//! Invariants: never panics; whatever decodes re-encodes to exactly the input (nothing is
//! ignored: no trailing bytes, no unchecked field); any bytes wrapped as a snapshot body decode
//! back to themselves; reading the same bytes from a file agrees with the in-memory decoder.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use fqdnd_checkpoint::format::{SnapshotMeta, decode_value, encode_snapshot};
use fqdnd_checkpoint::{Options, Seq, decode_snapshot_bytes, read_snapshot};
use libfuzzer_sys::fuzz_target;

const SCHEMA: u32 = 0x5EED;
type State = Vec<(u32, String)>;

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
        let dir = base.join(format!("fqdnd-fuzz-snapshot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let any = decode_snapshot_bytes(data, None);
    if let Ok((meta, body)) = &any {
        let schema = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
        assert_eq!(encode_snapshot(schema, meta, body), data, "decode is not exact");
        let _ = decode_value::<State>(body);
    }
    let checked = decode_snapshot_bytes(data, Some(SCHEMA));
    assert!(checked.is_err() || any.is_ok());

    let meta = SnapshotMeta { next_generation: 3, next_seq: Seq(data.len() as u64), taken_at_unix_ms: 9 };
    let wrapped = encode_snapshot(SCHEMA, &meta, data);
    let (m, body) = decode_snapshot_bytes(&wrapped, Some(SCHEMA)).unwrap();
    assert_eq!((m, body), (meta, data));

    let dir = scratch();
    std::fs::write(dir.join("snapshot"), data).unwrap();
    let from_file = read_snapshot::<State>(dir, &Options::new(SCHEMA));
    match (&checked, from_file) {
        (Ok((meta, body)), Ok(Some((m, state)))) => {
            assert_eq!(*meta, m);
            assert_eq!(decode_value::<State>(body).unwrap(), state);
        }
        (Ok((_, body)), Err(_)) => assert!(decode_value::<State>(body).is_err()),
        (Err(a), Err(b)) => assert_eq!(a.to_string().replace("<bytes>", ""), b.to_string().replace(&dir.join("snapshot").display().to_string(), "")),
        (a, b) => panic!("decoders disagree: {a:?} / {b:?}"),
    }
});
