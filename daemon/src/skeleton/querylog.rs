//! The optional JSON-lines query log: the proxy hands over a record per finished query; a
//! writer thread appends them, so the DNS path never waits on the disk. When the writer falls
//! behind, records are dropped and counted rather than queued without bound.

use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};

use crate::{Context, Result};
use fqdnd_dnsproxy::{QueryLog, QueryLogEntry};

/// Records queued at most before new ones are dropped.
const QUEUE: usize = 16_384;

/// Appends one JSON object per line.
pub(super) struct JsonLines {
    tx: SyncSender<QueryLogEntry>,
}

impl JsonLines {
    /// Opens (appends to) `path` and starts the writer thread.
    pub(super) fn open(path: &Path) -> Result<Self> {
        // Who asked for what: readable by the daemon's user only.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .mode(0o600)
            .append(true)
            .open(path)
            .with_context(|| format!("opening the query log {}", path.display()))?;
        let (tx, rx) = sync_channel::<QueryLogEntry>(QUEUE);
        let shown = path.display().to_string();
        std::thread::Builder::new()
            .name("fqdnd-querylog".into())
            .spawn(move || {
                let mut out = BufWriter::new(file);
                while let Ok(entry) = rx.recv() {
                    let mut ok = serde_json::to_writer(&mut out, &entry).is_ok()
                        && out.write_all(b"\n").is_ok();
                    // Drain what is queued, then flush once.
                    while let Ok(entry) = rx.try_recv() {
                        ok &= serde_json::to_writer(&mut out, &entry).is_ok()
                            && out.write_all(b"\n").is_ok();
                    }
                    if !(ok && out.flush().is_ok()) {
                        tracing::warn!(log = %shown, "query log write failed");
                    }
                }
            })
            .context("starting the query log writer")?;
        Ok(Self { tx })
    }
}

impl QueryLog for JsonLines {
    fn record(&self, entry: QueryLogEntry) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(entry) {
            metrics::counter!(crate::metrics::catalogue::QUERYLOG_DROPPED).increment(1);
        }
    }
}
