//! Durable state: what the engine learned, written to the checkpoint journal before the reply
//! that taught it is released, and restored at start so a restarted daemon has the same DNS
//! cache and gives every label set the same identity number.
//!
//! - An answer that taught new state (a new or revived (name, IP)) is one `Learned` record,
//!   plus an `Identity` record for every identity created since the last one journaled; the
//!   proxy holds the reply until they are durable (group commit). A TTL refresh is journaled
//!   lazily (durable with the next batch, or within a second).
//! - Expiries are stored as Unix times, since the daemon's clock restarts at zero.
//! - Compaction: past `stateCompactAfter` records the journal rotates and a snapshot of the whole
//!   engine (cache entries + identities) replaces the older generations.
//! - Restore: identities first (numbers withheld and given back to their label sets), then
//!   every answer with its remaining TTL (expired ones come back expired: the first GC pass
//!   keeps those conntrack still shows in use, as zombies); one commit at the end.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, anyhow};
use fqdnd_checkpoint::{Ack, Discarded, Journal, Options, Seq};
use fqdnd_ipcache::{Datapath, EndpointId, Identity};
use fqdnd_namemgr::Learned;
use serde::{Deserialize, Serialize};

use crate::clock::Clock;
use crate::engine::Engine;

/// The record and snapshot layout version; a state directory of another schema is refused.
pub(crate) const SCHEMA: u32 = 2;

/// How long restored identity numbers stay reserved for their label sets; numbers whose sets
/// did not come back by then return to ordinary allocation.
pub(crate) const RESTORE_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// One journal record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Record {
    /// `endpoint` was answered `addrs` for `name`, valid until `expires_unix_ms`.
    Learned {
        endpoint: u16,
        name: String,
        addrs: Vec<IpAddr>,
        expires_unix_ms: u64,
    },
    /// The label set `labels` (canonical rendering) has identity `id`.
    Identity { labels: String, id: u32 },
}

/// One cached name in a snapshot: its endpoints and its addresses with their expiries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SnapshotName {
    pub(crate) name: String,
    pub(crate) endpoints: Vec<u16>,
    pub(crate) addrs: Vec<(IpAddr, u64)>,
}

/// The whole engine state at one moment.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Snapshot {
    pub(crate) names: Vec<SnapshotName>,
    pub(crate) identities: Vec<(String, u32)>,
}

impl Snapshot {
    /// (name, IP) entries.
    pub(crate) fn entries(&self) -> usize {
        self.names.iter().map(|n| n.addrs.len()).sum()
    }
}

/// What a state directory held at start.
#[derive(Debug, Default)]
pub(crate) struct Restored {
    /// Canonical label set → identity number, the latest record winning.
    pub(crate) identities: Vec<(String, Identity)>,
    /// Answers to learn again, in order: (endpoint, name, addresses, expiry).
    answers: Vec<(EndpointId, String, Vec<IpAddr>, u64)>,
    /// What recovery cut off a torn journal tail.
    pub(crate) discarded: Option<Discarded>,
    /// Journal records read after the snapshot.
    pub(crate) records: usize,
    /// Entries in the snapshot.
    pub(crate) snapshot_entries: usize,
}

/// Opens the state directory (taking its lock), reads what it holds and starts the journal
/// writer. `strict`: refuse a torn or corrupt tail instead of cutting it off.
pub(crate) fn open(dir: &Path, strict: bool) -> Result<(Restored, Journal<Record>)> {
    let mut options = Options::new(SCHEMA);
    options.strict = strict;
    let recovered =
        fqdnd_checkpoint::open::<Snapshot, Record>(dir, &options).with_context(|| {
            format!(
                "restoring the state in {} (`fqdnd checkpoint inspect {}` shows what it holds)",
                dir.display(),
                dir.display()
            )
        })?;
    let mut identities: BTreeMap<u32, String> = BTreeMap::new();
    let mut answers: Vec<(EndpointId, String, Vec<IpAddr>, u64)> = Vec::new();
    let snapshot = recovered.snapshot.unwrap_or_default();
    let snapshot_entries = snapshot.entries();
    for (labels, id) in snapshot.identities {
        identities.insert(id, labels);
    }
    for n in snapshot.names {
        let endpoints = if n.endpoints.is_empty() {
            vec![0]
        } else {
            n.endpoints
        };
        // One answer per (endpoint, expiry): the addresses of a name mostly share theirs.
        let mut by_expiry: BTreeMap<u64, Vec<IpAddr>> = BTreeMap::new();
        for (addr, expires) in n.addrs {
            by_expiry.entry(expires).or_default().push(addr);
        }
        for ep in endpoints {
            for (expires, addrs) in &by_expiry {
                answers.push((EndpointId(ep), n.name.clone(), addrs.clone(), *expires));
            }
        }
    }
    let records = recovered.records.len();
    for record in recovered.records {
        match record {
            Record::Learned {
                endpoint,
                name,
                addrs,
                expires_unix_ms,
            } => answers.push((EndpointId(endpoint), name, addrs, expires_unix_ms)),
            Record::Identity { labels, id } => {
                identities.insert(id, labels);
            }
        }
    }
    // A label set journaled under two numbers (its first one was freed): the later wins.
    let mut by_labels: HashMap<String, u32> = HashMap::new();
    for (id, labels) in identities {
        by_labels.insert(labels, id);
    }
    let restored = Restored {
        identities: by_labels
            .into_iter()
            .map(|(labels, id)| (labels, Identity(id)))
            .collect(),
        answers,
        discarded: recovered.discarded,
        records,
        snapshot_entries,
    };
    let journal = Journal::start(recovered.tail, &options);
    Ok((restored, journal))
}

impl Restored {
    /// Learns every restored answer with its remaining TTL and commits once. Returns how many
    /// answers were learned.
    pub(crate) fn apply<D: Datapath>(&self, engine: &mut Engine<D>, clock: Clock) -> Result<usize> {
        let now = clock.now();
        // Latest expiry first: when a bound (maxCacheEntries, the per-name and per-endpoint
        // breakers) is reached during the restore, what is left out is what expires first
        // (expired flood names, say), never a live name behind them.
        let mut answers: Vec<_> = self.answers.iter().collect();
        answers.sort_by_key(|(_, _, _, expires)| std::cmp::Reverse(*expires));
        for (endpoint, name, addrs, expires) in answers {
            let ttl = clock.seconds_until_unix_ms(*expires);
            if let Err(e) = engine.restore_parts(*endpoint, name, addrs, ttl, now) {
                tracing::warn!(name = %name, error = %e, "a restored answer was not learned");
            }
        }
        let learned_at = clock.now();
        engine
            .ipcache
            .commit()
            .context("committing the restored state")?;
        tracing::debug!(
            learn_ms = (learned_at - now).as_millis(),
            commit_ms = (clock.now() - learned_at).as_millis(),
            "restore timing"
        );
        Ok(self.answers.len())
    }
}

/// The journal as the engine's observer and the daemon's tasks use it.
pub(crate) struct Persist {
    journal: Journal<Record>,
    clock: Clock,
    /// Identity → canonical labels already journaled (or restored).
    journaled: Mutex<HashMap<u32, String>>,
    /// The allocator's creation counter when identities were last journaled.
    seen_created: AtomicU64,
    /// Records since the last snapshot.
    since_snapshot: AtomicU64,
    /// When the restore's reserved numbers are released (None: done).
    restore_until: Mutex<Option<std::time::Duration>>,
    /// Records between snapshots.
    compact_after: u64,
}

impl std::fmt::Debug for Persist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persist")
            .field("dir", &self.journal.dir())
            .finish_non_exhaustive()
    }
}

impl Persist {
    /// Wraps a started journal; `restored` are the identities already on disk.
    pub(crate) fn new(
        journal: Journal<Record>,
        clock: Clock,
        restored: &Restored,
        compact_after: u64,
    ) -> Self {
        let journaled = restored
            .identities
            .iter()
            .map(|(labels, id)| (id.0, labels.clone()))
            .collect();
        Self {
            journal,
            clock,
            journaled: Mutex::new(journaled),
            seen_created: AtomicU64::new(u64::MAX),
            since_snapshot: AtomicU64::new(u64::try_from(restored.records).unwrap_or(0)),
            restore_until: Mutex::new(
                (!restored.identities.is_empty()).then(|| clock.now() + RESTORE_GRACE),
            ),
            compact_after,
        }
    }

    /// The periodic part: ends the restore grace period, compacts when the journal grew.
    pub(crate) async fn tick<D: Datapath>(&self, engine: &Mutex<Engine<D>>) {
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
        if self.wants_compaction() {
            match self.compact(engine).await {
                Ok(entries) => tracing::info!(entries, "state compacted into a snapshot"),
                Err(e) => {
                    metrics::counter!("fqdnd_checkpoint_errors_total").increment(1);
                    tracing::error!(error = %format!("{e:#}"), "compaction failed; the journal keeps growing");
                }
            }
        }
    }

    fn submit(&self, record: &Record, acks: &mut Vec<Ack<Seq>>) -> Result<()> {
        acks.push(self.journal.submit(record).map_err(|e| {
            metrics::counter!("fqdnd_checkpoint_errors_total").increment(1);
            anyhow!("journaling: {e}")
        })?);
        self.since_snapshot.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Journals identities created since the last call (cheap when none was). Call under the
    /// engine lock, after the change that created them.
    pub(crate) fn identities<D: Datapath>(
        &self,
        engine: &Engine<D>,
        acks: &mut Vec<Ack<Seq>>,
    ) -> Result<()> {
        let created = engine.ipcache.allocator().created_total();
        if self.seen_created.swap(created, Ordering::Relaxed) == created {
            return Ok(());
        }
        let mut journaled = self
            .journaled
            .lock()
            .map_err(|_| anyhow!("journal state lock poisoned"))?;
        for (labels, id) in engine.ipcache.identities_canonical() {
            if journaled.get(&id.0) != Some(&labels) {
                self.submit(
                    &Record::Identity {
                        labels: labels.clone(),
                        id: id.0,
                    },
                    acks,
                )?;
                journaled.insert(id.0, labels);
            }
        }
        Ok(())
    }

    /// Under the engine lock, after an answer was learned: queues what makes it durable and
    /// returns the acknowledgements to await before the reply is released (none for a mere
    /// refresh, which is journaled lazily).
    pub(crate) fn answer<D: Datapath>(
        &self,
        engine: &Engine<D>,
        endpoint: EndpointId,
        name: &str,
        addrs: &[IpAddr],
        ttl: u32,
        learned: &Learned,
    ) -> Result<Vec<Ack<Seq>>> {
        let mut acks = Vec::new();
        if !learned.is_new_state() && learned.refreshed == 0 {
            return Ok(acks);
        }
        let record = Record::Learned {
            endpoint: endpoint.0,
            name: name.to_owned(),
            addrs: addrs.to_vec(),
            expires_unix_ms: self.clock.unix_ms_of(self.clock.now()) + u64::from(ttl) * 1000,
        };
        if learned.is_new_state() {
            self.identities(engine, &mut acks)?;
            self.submit(&record, &mut acks)?;
        } else if let Err(e) = self.journal.append_lazy(&record) {
            // A refresh only extends a lifetime: a name already known keeps being served
            // even when the journal cannot take more (disk full, backlog).
            metrics::counter!("fqdnd_checkpoint_errors_total").increment(1);
            tracing::warn!(error = %e, name, "a TTL refresh was not journaled");
        } else {
            self.since_snapshot.fetch_add(1, Ordering::Relaxed);
        }
        Ok(acks)
    }

    /// Whether enough records piled up for a compaction.
    pub(crate) fn wants_compaction(&self) -> bool {
        self.since_snapshot.load(Ordering::Relaxed) >= self.compact_after
    }

    /// Compacts: rotates the journal and takes the snapshot under the engine lock (so the
    /// snapshot holds exactly the records before the rotation), then installs it.
    pub(crate) async fn compact<D: Datapath>(&self, engine: &Mutex<Engine<D>>) -> Result<usize> {
        let (rotation, snapshot) = {
            let engine = engine.lock().map_err(|_| anyhow!("engine lock poisoned"))?;
            let rotation = self.journal.rotate()?;
            self.since_snapshot.store(0, Ordering::Relaxed);
            (rotation, self.snapshot_of(&engine))
        };
        let rotation = rotation.await.context("rotating the journal")?;
        let entries = snapshot.entries();
        self.journal
            .compact(
                &rotation,
                &snapshot,
                self.clock.unix_ms_of(self.clock.now()),
            )
            .await
            .context("writing the snapshot")?;
        Ok(entries)
    }

    fn snapshot_of<D: Datapath>(&self, engine: &Engine<D>) -> Snapshot {
        let mut names: Vec<SnapshotName> = Vec::new();
        for e in engine.names.entries() {
            let expires = self
                .clock
                .unix_ms_of(std::time::Duration::from_secs(u64::from(e.ip.expires)));
            // Entries come name by name.
            if let Some(last) = names.last_mut().filter(|n| *n.name == *e.name) {
                last.addrs.push((e.ip.addr, expires));
                continue;
            }
            names.push(SnapshotName {
                endpoints: engine
                    .names
                    .endpoints_of(&e.name)
                    .iter()
                    .map(|ep| ep.0)
                    .collect(),
                name: e.name.to_string(),
                addrs: vec![(e.ip.addr, expires)],
            });
        }
        let identities = engine
            .ipcache
            .identities_canonical()
            .into_iter()
            .map(|(labels, id)| (labels, id.0))
            .collect();
        Snapshot { names, identities }
    }

    /// Publishes the journal's counters as metrics.
    pub(crate) fn record_metrics(&self) {
        let s = self.journal.stats();
        metrics::counter!("fqdnd_checkpoint_records_total").absolute(s.records);
        metrics::counter!("fqdnd_checkpoint_fsyncs_total").absolute(s.fsyncs);
        metrics::counter!("fqdnd_checkpoint_bytes_total").absolute(s.bytes);
        metrics::counter!("fqdnd_checkpoint_failed_batches_total").absolute(s.failed_batches);
        metrics::gauge!("fqdnd_checkpoint_last_batch_records").set(s.last_batch_records as f64);
        metrics::gauge!("fqdnd_checkpoint_last_fsync_seconds").set(s.last_fsync.as_secs_f64());
        metrics::gauge!("fqdnd_checkpoint_queued_bytes").set(s.queued_bytes as f64);
    }
}

/// Opens the state directory if there is one: what to restore, and the journal.
pub(crate) fn start(
    daemon: &fqdnd_config::Daemon,
    strict: bool,
    clock: Clock,
) -> Result<(Restored, Option<std::sync::Arc<Persist>>)> {
    let Some(dir) = daemon.state_dir.as_deref() else {
        tracing::warn!("no `stateDir`: learned names and identity numbers are lost on restart");
        return Ok((Restored::default(), None));
    };
    let started = clock.now();
    let (restored, journal) = open(dir, strict)?;
    let read_ms = (clock.now() - started).as_millis();
    if let Some(d) = &restored.discarded {
        tracing::warn!(
            file = %d.file.display(),
            offset = d.offset,
            bytes = d.bytes,
            reason = %d.reason,
            "a torn or corrupt journal tail was cut off (never acknowledged)"
        );
    }
    tracing::info!(
        dir = %dir.display(),
        snapshot_entries = restored.snapshot_entries,
        records = restored.records,
        identities = restored.identities.len(),
        read_ms,
        "state restored"
    );
    let persist = std::sync::Arc::new(Persist::new(
        journal,
        clock,
        &restored,
        daemon.state_compact_after,
    ));
    Ok((restored, Some(persist)))
}

/// Builds the engine from the configuration and the restored state: identities keep their
/// numbers, answers come back with their remaining TTLs, one commit.
pub(crate) fn build_engine<D: Datapath>(
    config: &fqdnd_config::Config,
    datapath: D,
    clock: Clock,
    restored: &Restored,
) -> Result<Engine<D>> {
    let started = clock.now();
    let mut engine = Engine::restoring(config, datapath, clock.now(), restored.identities.clone())?;
    if !restored.answers.is_empty() {
        let n = restored.apply(&mut engine, clock)?;
        let restore_ms = (clock.now() - started).as_millis();
        tracing::info!(
            answers = n,
            entries = engine.names.mapping_count(),
            identities = engine.ipcache.allocator().len(),
            restore_ms,
            "DNS cache restored"
        );
    }
    Ok(engine)
}

/// Journals the identities the start created (pre-allocations of new selectors) and waits
/// until they are durable, before anything is served.
pub(crate) async fn settle<D: Datapath>(
    persist: Option<&Persist>,
    engine: &Mutex<Engine<D>>,
) -> Result<()> {
    let Some(persist) = persist else {
        return Ok(());
    };
    let mut acks = Vec::new();
    {
        let engine = engine.lock().map_err(|_| anyhow!("engine lock poisoned"))?;
        persist.identities(&engine, &mut acks)?;
    }
    for ack in acks {
        ack.await.context("journaling the identities at start")?;
    }
    Ok(())
}

/// Writes a synthetic state directory: `names` names under `zone`, `ips` addresses each, all
/// valid for an hour (for restore benchmarks: `benchmarks/restore-time.sh`).
pub(crate) fn synthesize(dir: &Path, zone: &str, names: u32, ips: u32) -> Result<()> {
    let clock = Clock::start();
    let expires_unix_ms = clock.unix_ms_of(clock.now()) + 3_600_000;
    let mut list = Vec::with_capacity(names as usize);
    let mut n: u32 = 0;
    for i in 0..names {
        let mut addrs = Vec::with_capacity(ips as usize);
        for _ in 0..ips {
            let [a, b, c] = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            addrs.push((IpAddr::from([100, 64 + (a & 0x3f), b, c]), expires_unix_ms));
            n += 1;
        }
        list.push(SnapshotName {
            name: format!("n{i}.{zone}."),
            endpoints: vec![1],
            addrs,
        });
    }
    let snapshot = Snapshot {
        names: list,
        identities: Vec::new(),
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let meta = fqdnd_checkpoint::SnapshotMeta {
        next_generation: 1,
        next_seq: Seq(0),
        taken_at_unix_ms: clock.unix_ms_of(clock.now()),
    };
    fqdnd_checkpoint::write_snapshot(dir, SCHEMA, &meta, &snapshot)
        .with_context(|| format!("writing the snapshot in {}", dir.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fqdnd_ipcache::MemoryDatapath;

    /// At a full cache, the restore keeps the live answers and leaves out the expired ones,
    /// whatever their order in the journal (expired flood names first, here).
    #[test]
    fn a_restore_at_the_cache_bound_keeps_live_answers_over_expired_ones() {
        let config = fqdnd_config::load_str(
            "apiVersion: fqdnd.io/v1
kind: Settings
spec:
  breakers: {maxCacheEntries: 3}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: lan}
spec: {id: 7, addresses: [\"127.0.0.0/8\"], labels: {site: lan}}
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: lan}
spec:
  endpointSelector: {matchLabels: {site: lan}}
  egress:
  - toFQDNs: [{matchPattern: \"*.test\"}]
",
            Path::new("test.yaml"),
        )
        .unwrap();
        let clock = Clock::start();
        let now_ms = clock.unix_ms_of(clock.now());
        let answer = |name: &str, last: u8, expires: u64| {
            (
                EndpointId(7),
                name.to_owned(),
                vec![IpAddr::from([192, 0, 2, last])],
                expires,
            )
        };
        let restored = Restored {
            identities: Vec::new(),
            answers: vec![
                answer("w1.flood.test.", 1, now_ms - 60_000),
                answer("w2.flood.test.", 2, now_ms - 50_000),
                answer("w3.flood.test.", 3, now_ms - 40_000),
                answer("k1.corp.test.", 11, now_ms + 3_600_000),
                answer("k2.corp.test.", 12, now_ms + 3_600_000),
            ],
            discarded: None,
            records: 5,
            snapshot_entries: 0,
        };
        let mut engine = Engine::new(&config, MemoryDatapath::default(), clock.now()).unwrap();
        restored.apply(&mut engine, clock).unwrap();
        let mut names: Vec<String> = engine.names.entries().map(|e| e.name.to_string()).collect();
        names.sort();
        assert_eq!(
            names,
            ["k1.corp.test.", "k2.corp.test.", "w3.flood.test."],
            "the live names and the latest-expiring of the rest"
        );
    }
}
