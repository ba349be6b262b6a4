//! Many tasks append at once: the writer groups them (fewer fsyncs than records) and every
//! record comes back at its seq.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures are fixed; a failure should fail the test"
)]

use std::sync::Arc;

use fqdnd_checkpoint::{Journal, Options, Recovered, Seq, open};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_are_group_committed_and_recovered_in_seq_order() {
    const TASKS: u32 = 64;
    const EACH: u32 = 40;
    let dir = tempfile::tempdir().unwrap();
    let options = Options::new(1);
    let r: Recovered<(), (u32, u32)> = open(dir.path(), &options).unwrap();
    let journal = Arc::new(Journal::<(u32, u32)>::start(r.tail, &options));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let journal = journal.clone();
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0..EACH {
                    let seq = journal.append(&(task, i)).await.unwrap();
                    acked.push((seq, (task, i)));
                }
                acked
            })
        })
        .collect();
    let mut acked = Vec::new();
    for t in tasks {
        let mine = t.await.unwrap();
        assert!(
            mine.windows(2).all(|w| w[0].0 < w[1].0),
            "a task's seqs increase"
        );
        acked.extend(mine);
    }
    let stats = journal.stats();
    let total = u64::from(TASKS * EACH);
    assert_eq!(stats.records, total);
    assert!(stats.fsyncs < total, "no group commit: {stats:?}");
    eprintln!(
        "{total} records in {} batches ({:.1} records per fsync)",
        stats.batches,
        total as f64 / stats.batches as f64
    );
    Arc::into_inner(journal).unwrap().close().await.unwrap();

    acked.sort();
    let r: Recovered<(), (u32, u32)> = open(dir.path(), &options).unwrap();
    assert_eq!(r.records.len() as u64, total);
    for (i, (seq, record)) in acked.iter().enumerate() {
        assert_eq!(*seq, Seq(i as u64));
        assert_eq!(r.records[i], *record);
    }
}
