//! The importer: a read of the whole group, then a watch after it; each change goes through
//! the [`Group`] (checked, clamped, revocations worked out) to the [`LearnedSink`]. After each
//! read of the whole group — at start and after every reconnection — the live answers the
//! gateway holds that no record carries are handed to the publisher.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::group::{Applied, Group};
use super::publish::Publish;
use super::{LearnedSink, ShareConfig, ShareStatus, Wall, millis};
use crate::error::StoreError;
use crate::store::{Revision, Store, Watch};

/// How often a summary of the records the engine refused (or of the revocations applied) may
/// be logged: a hand writing and deleting keys in a loop costs counters, not the log.
const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// Events counted since their last summary line, and when it was logged.
#[derive(Debug, Default)]
struct Summary {
    count: u64,
    logged: Option<Instant>,
}

impl Summary {
    /// Counts `n` more; whether a summary is due (then the count restarts).
    fn due(&mut self, n: u64) -> Option<u64> {
        self.count += n;
        if self.count == 0 || self.logged.is_some_and(|at| at.elapsed() < SUMMARY_EVERY) {
            return None;
        }
        self.logged = Some(Instant::now());
        Some(std::mem::take(&mut self.count))
    }
}

/// What the importer hands on, and where.
pub struct Importer<K, W> {
    /// The group as read so far.
    pub group: Group,
    sink: Arc<K>,
    wall: Arc<W>,
    status: watch::Sender<ShareStatus>,
    /// Records the engine refused, and revocations, since their last summary line.
    refused: Summary,
    revoked: Summary,
}

impl<K: LearnedSink, W: Wall> Importer<K, W> {
    /// An importer of `config`'s group that has read nothing yet.
    pub fn new(
        config: ShareConfig,
        sink: Arc<K>,
        wall: Arc<W>,
        status: watch::Sender<ShareStatus>,
    ) -> Self {
        Self {
            group: Group::new(config),
            sink,
            wall,
            status,
            refused: Summary::default(),
            revoked: Summary::default(),
        }
    }

    /// Revokes, then imports, what `applied` says; returns this gateway's keys others
    /// deleted or rewrote (for the publisher).
    async fn deliver(&mut self, applied: Applied) -> Vec<String> {
        let Applied {
            imports,
            new_since_ms,
            revocations,
            unwritten,
            rejected,
        } = applied;
        if !revocations.is_empty() {
            for r in &revocations {
                tracing::debug!(client = %r.client, name = %r.name, addrs = ?r.addrs, record = r.record, "a learned record was revoked in the HA group: forgetting what only it carried");
            }
            let first = revocations
                .first()
                .map(|r| r.name.clone())
                .unwrap_or_default();
            let sink = Arc::clone(&self.sink);
            let count = revocations.len() as u64;
            let _ = tokio::task::spawn_blocking(move || sink.revoke(&revocations)).await;
            self.status.send_modify(|s| s.revoked += count);
            if let Some(n) = self.revoked.due(count) {
                tracing::info!(revocations = n, first = %first, "learned records revoked in the HA group (keys deleted or rewritten before they expired): forgotten what only they carried");
            }
        }
        let total = imports.len() as u64;
        let imported = if imports.is_empty() {
            0
        } else {
            let sink = Arc::clone(&self.sink);
            tokio::task::spawn_blocking(move || sink.import(&imports))
                .await
                .unwrap_or(0) as u64
        };
        // Until the sink has them: the answer is enforced here from then on.
        let lag = new_since_ms.map(|oldest| self.wall.unix_ms().saturating_sub(oldest));
        let refused = total.saturating_sub(imported);
        self.status.send_modify(|s| {
            s.imported += imported;
            s.import_refused += refused;
            s.rejected += rejected;
            if let Some(lag) = lag {
                s.import_lag_ms = lag;
                s.import_lag_max_ms = s.import_lag_max_ms.max(lag);
            }
        });
        if let Some(n) = self.refused.due(refused) {
            tracing::info!(
                refused = n,
                "records of the HA group refused here (unknown client group, a name this gateway's policy refuses, a breaker): see `fqdnd status`"
            );
        }
        unwritten
    }

    /// Reads the whole group and imports it (`start`: this gateway's own records too, and
    /// the start-up import is reported apart). Returns the revision read at, and this
    /// gateway's keys others deleted or rewrote since the last read.
    ///
    /// # Errors
    /// The store failed.
    pub async fn read<S: Store>(
        &mut self,
        store: &S,
        start: bool,
    ) -> Result<(Revision, Vec<String>), StoreError> {
        let began = Instant::now();
        let prefix = self.group_prefix();
        let snapshot = store.range(&prefix).await?;
        let applied = self.group.reload(&snapshot, self.wall.unix_ms(), start);
        let unwritten = self.deliver(applied).await;
        if start {
            let took = millis(began.elapsed());
            let records = snapshot.kvs.len() as u64;
            self.status.send_modify(|s| {
                s.startup_records = records;
                s.startup_import_ms = took;
            });
        }
        Ok((snapshot.revision, unwritten))
    }

    fn group_prefix(&self) -> String {
        self.group.config().group_prefix()
    }

    /// Hands the publisher the live answers this gateway holds that no record carries.
    async fn republish(&self, publisher: &mpsc::Sender<Publish>) {
        let sink = Arc::clone(&self.sink);
        let held = tokio::task::spawn_blocking(move || sink.held())
            .await
            .unwrap_or_default();
        let missing = self.group.missing(&held, self.wall.unix_ms());
        if missing.is_empty() {
            return;
        }
        let count = missing.len() as u64;
        tracing::info!(
            answers = count,
            "publishing again the live answers the HA group lacks"
        );
        for answer in missing {
            if publisher.send(Publish::Answer(answer)).await.is_err() {
                return;
            }
        }
        self.status.send_modify(|s| s.republished += count);
    }
}

/// Reads every record of the group and imports it (this gateway's own included: what it
/// learned before a restart) — the import before the gateway serves. Returns the revision
/// read at; `importer` goes on to [`import`].
///
/// # Errors
/// The store failed.
pub async fn import_all<S: Store, K: LearnedSink, W: Wall>(
    store: &S,
    importer: &mut Importer<K, W>,
) -> Result<Revision, StoreError> {
    let (revision, _) = importer.read(store, true).await?;
    importer
        .status
        .send_modify(|s| s.initial_import_done = true);
    Ok(revision)
}

/// Runs the importer until `stop`: from `revision` (what [`import_all`] read before serving;
/// `None`: read everything first), watching the group; on a store error it keeps what it
/// imported, backs off, and reads everything again. After each read of the whole group (and
/// after the one before serving) the answers the group lacks go to `publisher`.
pub async fn import<S: Store, K: LearnedSink, W: Wall>(
    store: S,
    mut importer: Importer<K, W>,
    mut revision: Option<Revision>,
    publisher: mpsc::Sender<Publish>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    let mut read_before = revision.is_some();
    let mut reconcile = revision.is_some();
    loop {
        if *stop.borrow() {
            return;
        }
        let connected = async {
            let from = match revision {
                Some(r) => r,
                None => {
                    let (r, unwritten) = importer.read(&store, !read_before).await?;
                    if !read_before {
                        importer
                            .status
                            .send_modify(|s| s.initial_import_done = true);
                    }
                    read_before = true;
                    reconcile = true;
                    if !unwritten.is_empty() {
                        let _ = publisher.send(Publish::Unwritten(unwritten)).await;
                    }
                    r
                }
            };
            let w = store.watch(&importer.group_prefix(), from + 1).await?;
            Ok::<_, StoreError>(w)
        }
        .await;
        let mut w = match connected {
            Ok(w) => w,
            Err(e) => {
                revision = None;
                importer.status.send_modify(|s| {
                    s.importing = false;
                    s.last_error = Some(e.to_string());
                });
                crate::node::retry_pause(&mut backoff, &mut stop).await;
                continue;
            }
        };
        backoff = Duration::from_millis(200);
        importer.status.send_modify(|s| s.importing = true);
        if std::mem::take(&mut reconcile) {
            importer.republish(&publisher).await;
        }
        let failure = loop {
            tokio::select! {
                next = w.next() => match next {
                    Ok(batch) => {
                        let applied = importer.group.apply(&batch, importer.wall.unix_ms());
                        let unwritten = importer.deliver(applied).await;
                        if !unwritten.is_empty() {
                            let _ = publisher.send(Publish::Unwritten(unwritten)).await;
                        }
                    }
                    Err(e) => break e,
                },
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        };
        tracing::warn!(error = %failure, "the learned-answer watch ended: keeping what was imported, reading the group again when the store is back");
        revision = None;
        importer.status.send_modify(|s| {
            s.importing = false;
            s.last_error = Some(failure.to_string());
        });
    }
}
