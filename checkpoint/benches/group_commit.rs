//! Group commit on this machine's disk: what one `fdatasync` costs with and without
//! preallocation, append latency (p50/p99) at a fixed offered rate from 8 concurrent writers,
//! and recovery time for 1M small records.
//!
//! `cargo bench -p fqdnd-checkpoint --bench group_commit` — state in `$CHECKPOINT_BENCH_DIR`
//! (default /var/tmp, a real disk, not tmpfs); `BENCH_SECONDS` per rate (default 5).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark fixtures are fixed; a failure should stop the run"
)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fqdnd_checkpoint::{Journal, Options, Recovered, open};
use tokio::time::{Instant, MissedTickBehavior};

const WRITERS: u32 = 8;
type Record = (u32, u64);

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

async fn latency_at(dir: &Path, rate: u32, seconds: u64) {
    let options = Options::new(1);
    let r: Recovered<(), Record> = open(dir, &options).unwrap();
    let journal = Arc::new(Journal::<Record>::start(r.tail, &options));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let per_writer = Duration::from_secs_f64(f64::from(WRITERS) / f64::from(rate));
    let end = Instant::now() + Duration::from_secs(seconds);
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (journal, tx) = (journal.clone(), tx.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(per_writer);
                tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
                let mut n = 0u64;
                let mut inflight = tokio::task::JoinSet::new();
                while tick.tick().await < end {
                    let (journal, tx) = (journal.clone(), tx.clone());
                    n += 1;
                    inflight.spawn(async move {
                        let start = Instant::now();
                        journal.append(&(w, n)).await.unwrap();
                        tx.send(start.elapsed()).unwrap();
                    });
                }
                inflight.join_all().await;
            })
        })
        .collect();
    drop(tx);
    for w in writers {
        w.await.unwrap();
    }
    let mut latencies = Vec::new();
    while let Some(l) = rx.recv().await {
        latencies.push(l);
    }
    latencies.sort();
    let stats = journal.stats();
    println!(
        "offered {rate:>6}/s, {WRITERS} writers, {seconds} s: {} appends, p50 {:?}, p99 {:?}, p99.9 {:?}, max {:?}; {} fsyncs ({:.1} records/fsync), mean fsync {:?}",
        latencies.len(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        percentile(&latencies, 0.999),
        latencies.last().copied().unwrap_or_default(),
        stats.fsyncs,
        stats.records as f64 / stats.fsyncs.max(1) as f64,
        stats.fsync_total / u32::try_from(stats.fsyncs.max(1)).unwrap_or(u32::MAX),
    );
    Arc::into_inner(journal).unwrap().close().await.unwrap();
}

async fn recovery(dir: &Path, records: u64) {
    let options = Options::new(1);
    let r: Recovered<(), Record> = open(dir, &options).unwrap();
    let journal = Journal::<Record>::start(r.tail, &options);
    let start = Instant::now();
    for i in 0..records {
        journal.append_lazy(&((i % 8) as u32, i)).unwrap();
        if i % 50_000 == 0 {
            journal.flush().await.unwrap();
        }
    }
    let stats = journal.close().await.unwrap();
    let written = start.elapsed();
    let bytes = std::fs::metadata(dir.join("journal.1")).unwrap().len();
    let start = Instant::now();
    let r: Recovered<(), Record> = open(dir, &options).unwrap();
    let took = start.elapsed();
    assert_eq!(r.records.len() as u64, records);
    println!(
        "recovery of {records} records ({bytes} bytes, {} per record): {took:?} ({:.1} M records/s); writing them lazily took {written:?} in {} batches",
        bytes / records,
        records as f64 / took.as_secs_f64() / 1e6,
        stats.batches,
    );
}

/// What one small append + `fdatasync` costs on this disk when the write extends the file (the
/// sync must also commit the new size in the filesystem's journal) and when it overwrites
/// zeros written ahead (what the journal's preallocation gives every batch).
fn sync_cost(dir: &Path, appends: usize) {
    use std::os::unix::fs::FileExt;
    let record = [0x5au8; 64];
    for preallocated in [false, true] {
        let path = dir.join(format!("sync-cost-{preallocated}"));
        let file = std::fs::File::create(&path).unwrap();
        if preallocated {
            file.write_all_at(&vec![0u8; appends * record.len() + 4096], 0)
                .unwrap();
            file.sync_all().unwrap();
        }
        let mut took = Vec::with_capacity(appends);
        for i in 0..appends {
            let start = Instant::now();
            file.write_all_at(&record, (i * record.len()) as u64)
                .unwrap();
            file.sync_data().unwrap();
            took.push(start.elapsed());
        }
        took.sort();
        println!(
            "64-byte write + fdatasync, {}: p50 {:?}, p99 {:?}, mean {:?} ({appends} syncs)",
            if preallocated {
                "into preallocated zeros"
            } else {
                "extending the file     "
            },
            percentile(&took, 0.50),
            percentile(&took, 0.99),
            took.iter().sum::<Duration>() / u32::try_from(appends).unwrap(),
        );
        std::fs::remove_file(&path).unwrap();
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let base = std::env::var("CHECKPOINT_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".to_owned());
    let seconds = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir_in(&base).unwrap();
        sync_cost(dir.path(), 2_000);
        for rate in [1_000, 10_000] {
            let dir = tempfile::tempdir_in(&base).unwrap();
            latency_at(dir.path(), rate, seconds).await;
        }
        let dir = tempfile::tempdir_in(&base).unwrap();
        recovery(dir.path(), 1_000_000).await;
    });
}
