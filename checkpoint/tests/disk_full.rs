//! A full disk: appends fail with `Error::Full`, nothing of a failed batch is recovered, and
//! the journal accepts appends again once space is freed.
//!
//! Needs root (a 64 KiB tmpfs). Without it the test says so and passes, unless
//! `FQDND_REQUIRE_PRIVILEGED=1`, where it fails.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures are fixed; a failure should fail the test"
)]

use std::fs;
use std::path::{Path, PathBuf};

use fqdnd_checkpoint::{Error, Journal, Options, Recovered, Ticket, open};
use nix::mount::{MntFlags, MsFlags, mount, umount2};

struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = umount2(&self.0, MntFlags::MNT_DETACH);
    }
}

fn tiny_tmpfs(at: &Path) -> Option<Unmount> {
    let required = std::env::var("FQDND_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1");
    let why = if nix::unistd::geteuid().is_root() {
        match mount(
            Some("tmpfs"),
            at,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=64k"),
        ) {
            Ok(()) => return Some(Unmount(at.to_path_buf())),
            Err(e) => format!("mount -t tmpfs failed: {e}"),
        }
    } else {
        "not root".to_owned()
    };
    assert!(!required, "FQDND_REQUIRE_PRIVILEGED=1 but {why}");
    eprintln!("SKIPPED disk-full test: {why} (a 64 KiB tmpfs needs root)");
    None
}

#[tokio::test]
async fn full_disk_fails_the_batch_and_the_journal_recovers_when_space_is_freed() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(_mounted) = tiny_tmpfs(tmp.path()) else {
        return;
    };
    let dir = tmp.path().join("state");
    let options = Options::new(1);
    let r: Recovered<(), Vec<u8>> = open(&dir, &options).unwrap();
    let journal = Journal::<Vec<u8>>::start(r.tail, &options);
    fs::write(tmp.path().join("filler"), vec![1u8; 24 << 10]).unwrap();

    let mut acked = Vec::new();
    let full = loop {
        let record = vec![acked.len() as u8; 1000];
        match journal.append(&record).await {
            Ok(_) => acked.push(record),
            Err(e) => break e,
        }
        assert!(acked.len() < 200, "the 64 KiB tmpfs never filled up");
    };
    assert!(
        matches!(&full, Error::Full { path, .. } if path.ends_with("journal.1")),
        "{full}"
    );
    let failing = journal.submit(&vec![0xEE; 1000]).unwrap();
    let failed = failing.ticket();
    assert!(failing.await.unwrap_err().is_full());
    let stats = journal.stats();
    assert_eq!(
        (stats.records, stats.failed_batches),
        (acked.len() as u64, 2)
    );
    // Without its acknowledgement, a caller learns the same from the writer's progress.
    let settled = journal.settled();
    assert_eq!((settled.through, settled.last_failure), (failed, failed));
    // After a failure, records before it are no longer known durable by the progress alone.
    assert!(!settled.known_durable(Ticket(1), Ticket(1)));

    fs::remove_file(tmp.path().join("filler")).unwrap();
    let mut after = Vec::new();
    for _ in 0..3 {
        let record = vec![0xAB; 1000];
        let ack = journal.submit(&record).unwrap();
        after.push(ack.ticket());
        ack.await.unwrap();
        acked.push(record);
    }
    assert_eq!(after[0], Ticket(failed.0 + 1));
    let settled = journal.settled();
    assert!(settled.known_durable(after[0], after[2]));
    // A span that holds a failed record is never known durable, whatever came after.
    assert!(!settled.known_durable(failed, after[2]));
    journal.close().await.unwrap();

    let r: Recovered<(), Vec<u8>> = open(&dir, &options).unwrap();
    assert!(r.discarded.is_none());
    assert_eq!(r.records, acked);
}
