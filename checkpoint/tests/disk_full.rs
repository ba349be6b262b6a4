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

use fqdnd_checkpoint::{Error, Journal, Options, Recovered, open};
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
    assert!(
        journal
            .append(&vec![0xEE; 1000])
            .await
            .unwrap_err()
            .is_full()
    );
    let stats = journal.stats();
    assert_eq!(
        (stats.records, stats.failed_batches),
        (acked.len() as u64, 2)
    );

    fs::remove_file(tmp.path().join("filler")).unwrap();
    for _ in 0..3 {
        let record = vec![0xAB; 1000];
        journal.append(&record).await.unwrap();
        acked.push(record);
    }
    journal.close().await.unwrap();

    let r: Recovered<(), Vec<u8>> = open(&dir, &options).unwrap();
    assert!(r.discarded.is_none());
    assert_eq!(r.records, acked);
}
