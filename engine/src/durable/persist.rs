//! [`Persist`]: the journal as the proxy's observer and the daemon's periodic task use it.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fqdnd_checkpoint::{Ack, Journal, JournalStats, Seq};
use fqdnd_ipcache::{Datapath, EndpointId};

use super::doubt::{InDoubt, Journaled};
use super::{RESTORE_GRACE, Record, Restored, Taken};
use crate::{Clock, Engine, Error, Learning};

/// What makes learned state durable: the journal writer, which identities it already holds,
/// and when to compact.
pub struct Persist {
    journal: Journal<Record>,
    clock: Arc<dyn Clock>,
    /// Identities already journaled (or restored), until a failure may have lost them.
    journaled: Mutex<Journaled>,
    /// The allocator's creation counter when identities were last journaled.
    seen_created: AtomicU64,
    /// Records since the last snapshot.
    since_snapshot: AtomicU64,
    /// Names whose latest held answer may not be durable: their refreshes are held too.
    in_doubt: Mutex<InDoubt>,
    /// When the restore's reserved numbers are released (None: done).
    restore_until: Mutex<Option<Duration>>,
    /// Records between snapshots.
    compact_after: u64,
    /// Journal writes and compactions that failed.
    errors: AtomicU64,
}

impl std::fmt::Debug for Persist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persist")
            .field("dir", &self.journal.dir())
            .finish_non_exhaustive()
    }
}

impl Persist {
    /// Wraps a started journal; `restored` is what it held at start.
    pub fn new(
        journal: Journal<Record>,
        clock: Arc<dyn Clock>,
        restored: &Restored,
        compact_after: u64,
    ) -> Self {
        let journaled = Journaled::restored(
            restored
                .identities
                .iter()
                .map(|(labels, id)| (id.0, labels.clone())),
        );
        let restore_until = (!restored.identities.is_empty()).then(|| clock.now() + RESTORE_GRACE);
        Self {
            journal,
            clock,
            journaled: Mutex::new(journaled),
            seen_created: AtomicU64::new(u64::MAX),
            since_snapshot: AtomicU64::new(u64::try_from(restored.records).unwrap_or(0)),
            in_doubt: Mutex::new(InDoubt::default()),
            restore_until: Mutex::new(restore_until),
            compact_after,
            errors: AtomicU64::new(0),
        }
    }

    /// The periodic part: ends the restore grace period, compacts when the journal grew.
    /// Failures are logged and counted ([`Persist::errors`]).
    pub async fn tick<D: Datapath>(&self, engine: &Mutex<Engine<D>>) {
        let due = self
            .restore_until
            .lock()
            .ok()
            .and_then(|mut until| until.take_if(|t| *t <= self.clock.now()));
        if due.is_some()
            && let Ok(mut engine) = engine.lock()
        {
            let released = engine.ipcache.finish_restore();
            tracing::info!(
                released,
                "restore grace period over: unused identity numbers released"
            );
        }
        if self.since_snapshot.load(Ordering::Relaxed) >= self.compact_after {
            match self.compact(engine).await {
                Ok(entries) => tracing::info!(entries, "state compacted into a snapshot"),
                Err(e) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(error = %crate::error_chain(&e), "compaction failed; the journal keeps growing");
                }
            }
        }
    }

    fn submit(&self, record: &Record, acks: &mut Vec<Ack<Seq>>) -> Result<(), Error> {
        let ack = self.journal.submit(record).map_err(|e| {
            self.errors.fetch_add(1, Ordering::Relaxed);
            Error::Journal(e)
        })?;
        acks.push(ack);
        self.since_snapshot.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Journals identities created since the last call (cheap when none was), and those whose
    /// records a failed batch may have held. Call under the engine lock, after the change
    /// that created them.
    ///
    /// # Errors
    /// The journal refused a record.
    pub fn identities<D>(&self, engine: &Engine<D>, acks: &mut Vec<Ack<Seq>>) -> Result<(), Error> {
        let mut journaled = self
            .journaled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let failed = journaled.check(self.journal.settled());
        let created = engine.ipcache.allocator().created_total();
        if self.seen_created.swap(created, Ordering::Relaxed) == created && !failed {
            return Ok(());
        }
        for (labels, id) in engine.ipcache.identities_canonical() {
            if !journaled.has(id.0, &labels) {
                let record = Record::Identity {
                    labels: labels.clone(),
                    id: id.0,
                };
                if let Err(e) = self.submit(&record, acks) {
                    // The next call walks them all again.
                    self.seen_created.store(u64::MAX, Ordering::Relaxed);
                    return Err(e);
                }
                if let Some(ack) = acks.last() {
                    journaled.insert(id.0, labels, ack.ticket());
                }
            }
        }
        Ok(())
    }

    /// Under the engine lock, after an answer was learned: queues what makes it durable and
    /// returns the acknowledgements to await before the reply is released. None for a mere
    /// refresh of a name known durable, which is journaled lazily: it only extends a lifetime,
    /// so a name already known keeps being served even when the journal cannot take more. A
    /// refresh of a name whose own new state is not known durable yet (its sync still running,
    /// or failed) is held like new state: the engine's memory is ahead of the disk.
    ///
    /// # Errors
    /// The journal refused a record of new state.
    pub fn answer<D>(
        &self,
        engine: &Engine<D>,
        endpoint: EndpointId,
        name: &str,
        addrs: &[IpAddr],
        ttl: u32,
        learning: &Learning,
    ) -> Result<Vec<Ack<Seq>>, Error> {
        let mut acks = Vec::new();
        let learned = &learning.learned;
        let mut in_doubt = self
            .in_doubt
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let held = learned.is_new_state() || in_doubt.contains(name, self.journal.settled());
        if !held && learned.refreshed == 0 {
            return Ok(acks);
        }
        let record = Record::Learned {
            endpoint: endpoint.0,
            name: name.to_owned(),
            addrs: addrs.to_vec(),
            expires_unix_ms: self.clock.unix_ms_of(self.clock.now()) + u64::from(ttl) * 1000,
        };
        if held {
            let queued = self
                .identities(engine, &mut acks)
                .and_then(|()| self.submit(&record, &mut acks));
            if let Err(e) = queued {
                // Learned in memory, not journaled: in doubt until a snapshot holds it.
                in_doubt.refused(name, self.journal.last_ticket());
                return Err(e);
            }
            if let (Some(first), Some(last)) = (acks.first(), acks.last()) {
                in_doubt.hold(name, first.ticket(), last.ticket(), self.journal.settled());
            }
        } else if let Err(e) = self.journal.append_lazy(&record) {
            self.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, name, "a TTL refresh was not journaled");
        } else {
            self.since_snapshot.fetch_add(1, Ordering::Relaxed);
        }
        Ok(acks)
    }

    /// Under the engine lock, after [`Engine::forget`](crate::Engine::forget) removed
    /// something: queues the record that keeps a restart from bringing it back; returns its
    /// acknowledgement, to await before the forget is reported done.
    ///
    /// # Errors
    /// The journal refused the record.
    pub fn forgotten(&self, forget: &fqdnd_namemgr::Forget<'_>) -> Result<Ack<Seq>, Error> {
        let record = Record::Forgotten {
            name: fqdnd_namemgr::canonicalize(forget.name).into_owned(),
            addrs: forget.addrs.map(<[IpAddr]>::to_vec),
            endpoint: forget.endpoint.map(|ep| ep.0),
        };
        let mut acks = Vec::with_capacity(1);
        self.submit(&record, &mut acks)?;
        acks.pop()
            .ok_or(Error::Journal(fqdnd_checkpoint::Error::Closed))
    }

    /// Names whose held answers are not known durable yet (still syncing; or failed, until a
    /// snapshot covers them): their refreshes are held too.
    pub fn names_in_doubt(&self) -> usize {
        self.in_doubt
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .count(self.journal.settled())
    }

    /// Compacts: rotates the journal and takes the snapshot under the engine lock (so the
    /// snapshot holds exactly the records before the rotation), then installs it. Returns the
    /// entries in the snapshot.
    ///
    /// # Errors
    /// Rotating or writing the snapshot failed; the journal keeps every record.
    pub async fn compact<D>(&self, engine: &Mutex<Engine<D>>) -> Result<usize, Error> {
        let (rotation, snapshot) = {
            let engine = engine
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let rotation = self.journal.rotate().map_err(Error::Journal)?;
            self.since_snapshot.store(0, Ordering::Relaxed);
            (rotation, Taken::of(&engine, &*self.clock))
        };
        // Every record queued before the rotation has its effect in the state taken.
        let covered = rotation.ticket();
        let rotation = rotation.await.map_err(Error::Journal)?;
        let entries = snapshot.entries();
        self.journal
            .compact(
                &rotation,
                // Put in the restore's order outside the lock, as it is encoded.
                snapshot,
                self.clock.unix_ms_of(self.clock.now()),
            )
            .await
            .map_err(Error::Journal)?;
        self.in_doubt
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .covered(covered);
        self.journaled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .covered(covered);
        Ok(entries)
    }

    /// Waits until every identity the engine holds is journaled (at start, before anything
    /// is served: pre-allocations of new selectors).
    ///
    /// # Errors
    /// The journal refused or failed a record.
    pub async fn settle<D>(&self, engine: &Mutex<Engine<D>>) -> Result<(), Error> {
        let mut acks = Vec::new();
        {
            let engine = engine
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.identities(&engine, &mut acks)?;
        }
        for ack in acks {
            ack.await.map_err(Error::Journal)?;
        }
        Ok(())
    }

    /// Commits what is queued, stops the writer and releases the state directory's lock.
    ///
    /// # Errors
    /// The last batch failed.
    pub async fn close(self) -> Result<(), Error> {
        self.journal
            .close()
            .await
            .map(|_| ())
            .map_err(Error::Journal)
    }

    /// The journal writer's counters.
    pub fn journal_stats(&self) -> JournalStats {
        self.journal.stats()
    }

    /// Journal writes and compactions that failed so far.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Counts a failure seen by the caller (an acknowledgement that came back with an error).
    pub fn count_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
}
