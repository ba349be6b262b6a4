//! Random appends, lazy appends, flushes and compactions, then a simulated crash in the tail
//! of the last journal (cut at any byte, bits flipped after it, garbage or zeros after it: the
//! writer keeps zeros preallocated after its last record, and a batch written there may reach
//! the disk only in part), and optionally a crash between a compaction's snapshot and its
//! deletions. Recovery must give
//! exactly a prefix of what was appended, including everything that was on disk before the
//! crash point, and appends after recovery must follow that prefix.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures are fixed; a failure should fail the test"
)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use fqdnd_checkpoint::{
    Error, Journal, Options, Recovered, Seq, decode_journal_bytes, format::JOURNAL_HEADER_LEN, open,
};
use proptest::prelude::*;
use proptest::sample::Index;

const SCHEMA: u32 = 0xC0FFEE;

#[derive(Clone, Debug)]
enum Op {
    Append(u32),
    Lazy(u32),
    Flush,
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => any::<u32>().prop_map(Op::Append),
        3 => any::<u32>().prop_map(Op::Lazy),
        1 => Just(Op::Flush),
        1 => Just(Op::Compact),
    ]
}

#[derive(Clone, Debug)]
enum Damage {
    /// The file ends at the crash point.
    Cut,
    /// The bytes after the crash point are there, with bits flipped.
    Flip(Vec<(Index, u8)>),
    /// The file continues after the crash point with garbage.
    Garbage(Vec<u8>),
    /// The file keeps its length, with zeros after the crash point: a batch written into the
    /// writer's preallocated space, cut by the crash before all its blocks reached the disk.
    Zeroed,
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        Just(Damage::Cut),
        proptest::collection::vec((any::<Index>(), 0u8..8), 1..4).prop_map(Damage::Flip),
        proptest::collection::vec(any::<u8>(), 1..64).prop_map(Damage::Garbage),
        Just(Damage::Zeroed),
    ]
}

type State = Vec<u32>;

fn options() -> Options {
    Options::new(SCHEMA)
}

fn journals(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("journal.")
        })
        .map(|p| {
            let bytes = fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

/// Runs the operations; returns every value in submission order and the journal files a
/// crash right before the last compaction's deletions would have left behind.
async fn run(dir: &Path, ops: &[Op]) -> (Vec<u32>, BTreeMap<PathBuf, Vec<u8>>) {
    let r: Recovered<State, u32> = open(dir, &options()).unwrap();
    let journal = Journal::<u32>::start(r.tail, &options());
    let mut applied = Vec::new();
    let mut resurrect = BTreeMap::new();
    for op in ops {
        match op {
            Op::Append(v) => {
                let seq = journal.append(v).await.unwrap();
                assert_eq!(seq, Seq(applied.len() as u64));
                applied.push(*v);
            }
            Op::Lazy(v) => {
                journal.append_lazy(v).unwrap();
                applied.push(*v);
            }
            Op::Flush => {
                assert_eq!(journal.flush().await.unwrap(), Seq(applied.len() as u64));
            }
            Op::Compact => {
                let rotation = journal.rotate().unwrap().await.unwrap();
                assert_eq!(rotation.next_seq, Seq(applied.len() as u64));
                let before = journals(dir);
                let removed = journal
                    .compact(&rotation, applied.clone(), 42)
                    .await
                    .unwrap();
                resurrect = removed
                    .iter()
                    .map(|p| (p.clone(), before[p].clone()))
                    .collect();
            }
        }
    }
    journal.close().await.unwrap();
    (applied, resurrect)
}

fn recovered_values(r: &Recovered<State, u32>) -> Vec<u32> {
    let mut all = r.snapshot.clone().unwrap_or_default();
    assert_eq!(r.first_seq, Seq(all.len() as u64));
    all.extend(&r.records);
    all
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn recovery_after_a_crash_is_a_prefix_with_everything_before_the_crash_point(
        ops in proptest::collection::vec(op(), 0..24),
        crash in any::<Index>(),
        damage in damage(),
        crash_before_deletion in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (applied, resurrect) = rt.block_on(run(dir.path(), &ops));

        // The last journal: where every frame ends, and the crash point.
        let (last, original) = journals(dir.path()).into_iter().next_back().unwrap();
        let decoded = decode_journal_bytes(&original, SCHEMA, u32::MAX).unwrap();
        prop_assert!(decoded.discarded.is_none());
        if !decoded.records.is_empty() {
            prop_assert!(original.len() as u64 > decoded.valid_len, "no preallocated zeros");
        }
        let in_last = decoded.records.len();
        let before_last = applied.len() - in_last;
        prop_assert_eq!(decoded.header.base_seq, Seq(before_last as u64));
        let header = JOURNAL_HEADER_LEN as usize;
        // The crash point: anywhere in the records or the first bytes of free space after them.
        let span = (decoded.valid_len as usize + 64).min(original.len()) - header;
        let at = header + crash.index(span + 1);
        let mut ends = decoded.records.iter().map(|(o, p)| *o as usize + 8 + p.len());
        let whole_before_crash = ends.position(|end| end > at).unwrap_or(in_last);

        let mut damaged = original[..at].to_vec();
        match &damage {
            Damage::Cut => {}
            Damage::Flip(flips) => {
                damaged.extend_from_slice(&original[at..]);
                if at < original.len() {
                    for (i, bit) in flips {
                        damaged[at + i.index(original.len() - at)] ^= 1 << bit;
                    }
                }
            }
            Damage::Garbage(bytes) => damaged.extend_from_slice(bytes),
            Damage::Zeroed => damaged.resize(original.len(), 0),
        }
        fs::write(&last, &damaged).unwrap();
        if crash_before_deletion {
            for (path, bytes) in &resurrect {
                fs::write(path, bytes).unwrap();
            }
        }

        // Strict mode refuses a bad tail and leaves the file alone.
        let strict = Options { strict: true, ..options() };
        let strict_ok = match open::<State, u32>(dir.path(), &strict) {
            Ok(r) => {
                prop_assert!(r.discarded.is_none());
                true
            }
            Err(Error::Corrupt { file, .. }) => {
                prop_assert_eq!(file, last.clone());
                prop_assert_eq!(fs::read(&last).unwrap(), damaged.clone());
                false
            }
            Err(e) => panic!("strict open: {e}"),
        };

        let r: Recovered<State, u32> = open(dir.path(), &options()).unwrap();
        let got = recovered_values(&r);
        prop_assert!(got.len() >= before_last + whole_before_crash,
            "lost records before the crash point: got {}, need {}", got.len(), before_last + whole_before_crash);
        prop_assert!(got.len() <= applied.len());
        prop_assert_eq!(&got[..], &applied[..got.len()]);
        prop_assert_eq!(r.discarded.is_some(), !strict_ok);
        if let Some(d) = &r.discarded {
            prop_assert_eq!(&d.file, &last);
            prop_assert_eq!(d.offset + d.bytes, damaged.len() as u64);
            prop_assert_eq!(fs::metadata(&last).unwrap().len(), d.offset);
        }
        for path in resurrect.keys() {
            prop_assert!(!path.exists(), "covered journal {} not removed", path.display());
        }

        // Appends continue right after the recovered prefix.
        let expected_seq = Seq(got.len() as u64);
        let mut next = got.clone();
        next.push(7);
        rt.block_on(async {
            let journal = Journal::<u32>::start(r.tail, &options());
            assert_eq!(journal.append(&7).await.unwrap(), expected_seq);
            journal.close().await.unwrap();
        });
        let r: Recovered<State, u32> = open(dir.path(), &options()).unwrap();
        prop_assert!(r.discarded.is_none());
        prop_assert_eq!(recovered_values(&r), next);
    }
}
