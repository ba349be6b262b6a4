//! Durable state: what the engine learned, written to the checkpoint journal before the reply
//! that taught it is released, and restored at start so a restarted daemon has the same DNS
//! cache and gives every label set the same identity number.
//!
//! - An answer that taught new state (a new or revived (name, IP)) is one [`Record::Learned`],
//!   plus a [`Record::Identity`] for every identity created since the last one journaled; the
//!   proxy holds the reply until they are durable (group commit). A TTL refresh is journaled
//!   lazily (durable with the next batch, or within a second) — [`Persist`] — unless the
//!   name's own new state is not known durable yet (still syncing, or failed): then it is held
//!   too, until its own record is durable.
//! - Expiries are stored as Unix times, since the daemon's monotonic clock restarts at zero.
//! - Compaction: past `stateCompactAfter` records the journal rotates and a [`Snapshot`] of
//!   the whole engine (cache entries + identities) replaces the older generations.
//! - Restore ([`open`], [`Restored::apply`]): identities first (numbers withheld and given
//!   back to their label sets), then every answer with its remaining TTL, latest expiry first
//!   (expired ones come back expired: the first GC pass keeps those conntrack still shows in
//!   use, as zombies); one commit at the end.

mod doubt;
mod flat;
mod persist;
mod taken;
#[cfg(test)]
mod test_support;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

use fqdnd_checkpoint::{Discarded, Journal, Options, Seq};
use fqdnd_ipcache::{Datapath, EndpointId, Identity};
use fqdnd_namemgr::{Restore, RestoreAnswers, RestoreRoom, Sizes};
use serde::{Deserialize, Serialize};

use crate::{Clock, Engine, Error};
pub use flat::{Answers, LatestFirst, ReadSnapshot, RestoredAnswer, TooLarge};
pub use persist::Persist;
pub use taken::{AsPushed, Taken};

/// The record and snapshot layout version; a state directory of another schema is refused.
pub const SCHEMA: u32 = 2;

/// How long restored identity numbers stay reserved for their label sets; numbers whose sets
/// did not come back by then return to ordinary allocation.
pub const RESTORE_GRACE: Duration = Duration::from_secs(60);

/// One journal record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Record {
    /// `endpoint` was answered `addrs` for `name`, valid until `expires_unix_ms`.
    Learned {
        /// The endpoint or client group that asked.
        endpoint: u16,
        /// The canonical name.
        name: String,
        /// Its addresses.
        addrs: Vec<IpAddr>,
        /// When they expire, in milliseconds since the Unix epoch.
        expires_unix_ms: u64,
    },
    /// The label set `labels` (canonical rendering) has identity `id`.
    Identity {
        /// Canonical labels.
        labels: String,
        /// The number.
        id: u32,
    },
    /// What [`Engine::forget`] removed (`fqdnd cache forget`, an HA group's revocation): a
    /// restore leaves it out of the answers journaled before this record. (Added after the
    /// first two variants, so journals written before it read as they did; an fqdnd that
    /// predates it refuses a journal holding one, as an undecodable record.)
    Forgotten {
        /// The canonical name.
        name: String,
        /// The mappings removed for every endpoint; `None`: every one of the name.
        addrs: Option<Vec<IpAddr>>,
        /// The endpoint whose record of the name was removed.
        endpoint: Option<u16>,
    },
}

/// One cached name in a snapshot: its endpoints and its addresses with their expiries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotName {
    /// The canonical name.
    pub name: String,
    /// Endpoints that asked it.
    pub endpoints: Vec<u16>,
    /// Addresses with their expiries (Unix milliseconds).
    pub addrs: Vec<(IpAddr, u64)>,
}

/// The whole engine state at one moment, as a snapshot holds it (what [`Taken`] writes;
/// `fqdnd checkpoint inspect` reads it so, a restore with [`ReadSnapshot`]).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Cached names.
    pub names: Vec<SnapshotName>,
    /// Canonical label set → identity number.
    pub identities: Vec<(String, u32)>,
}

impl Snapshot {
    /// (name, IP) entries.
    pub fn entries(&self) -> usize {
        self.names.iter().map(|n| n.addrs.len()).sum()
    }
}

/// What a state directory held at start.
#[derive(Debug, Default)]
pub struct Restored {
    /// Canonical label set → identity number, the latest record winning.
    pub identities: Vec<(String, Identity)>,
    /// Answers to learn again, in journal order.
    pub answers: Answers,
    /// What recovery cut off a torn journal tail.
    pub discarded: Option<Discarded>,
    /// Journal records read after the snapshot.
    pub records: usize,
    /// Entries in the snapshot.
    pub snapshot_entries: usize,
    /// Room for the snapshot's names, made while it was decoded.
    room: Option<JoinHandle<RestoreRoom>>,
}

/// Opens the state directory `dir` (taking its lock), reads what it holds and starts the
/// journal writer (on the current tokio runtime). `strict`: refuse a torn or corrupt tail
/// instead of cutting it off.
///
/// # Errors
/// The directory cannot be opened, locked or read, holds another schema, or (strict) has a
/// damaged tail.
pub fn open(dir: &Path, strict: bool) -> Result<(Restored, Journal<Record>), Error> {
    let mut options = Options::new(SCHEMA);
    options.strict = strict;
    let recovered =
        fqdnd_checkpoint::open_with::<ReadSnapshot, Record>(dir, &options, ReadSnapshot::decode)
            .map_err(|source| Error::State {
                dir: dir.to_path_buf(),
                source,
            })?;
    let mut identities: BTreeMap<u32, String> = BTreeMap::new();
    // Read straight into the flat answers: no allocation per name.
    let snapshot = recovered.snapshot.unwrap_or_default();
    let snapshot_entries = snapshot.entries;
    let room = snapshot.room;
    let mut answers = snapshot.answers;
    for (labels, id) in snapshot.identities {
        identities.insert(id, labels);
    }
    let records = recovered.records.len();
    let mut forgets = Vec::new();
    for record in recovered.records {
        match record {
            Record::Learned {
                endpoint,
                name,
                addrs,
                expires_unix_ms,
            } => answers
                .push(EndpointId(endpoint), &name, &addrs, expires_unix_ms)
                .map_err(|TooLarge| Error::RestoreTooLarge {
                    dir: dir.to_path_buf(),
                })?,
            Record::Identity { labels, id } => {
                identities.insert(id, labels);
            }
            Record::Forgotten {
                name,
                addrs,
                endpoint,
            } => forgets.push(flat::Forgot {
                before: answers.len(),
                name,
                addrs,
                endpoint,
            }),
        }
    }
    answers
        .forget(&forgets)
        .map_err(|TooLarge| Error::RestoreTooLarge {
            dir: dir.to_path_buf(),
        })?;
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
        room,
    };
    let journal = Journal::start(recovered.tail, &options);
    Ok((restored, journal))
}

impl Restored {
    /// Gives the restored label sets their numbers back (until
    /// [`IpCache::finish_restore`](fqdnd_ipcache::IpCache::finish_restore)); call before the
    /// engine gets its endpoints and policy.
    pub fn reserve_identities<D: Datapath>(&self, engine: &mut Engine<D>) {
        if !self.identities.is_empty() {
            engine.ipcache.restore_identities(self.identities.clone());
        }
    }

    /// Learns every restored answer with its remaining TTL and commits once. Returns how many
    /// answers were given to the engine.
    ///
    /// # Errors
    /// The datapath refused the commit.
    pub fn apply<D: Datapath>(
        &mut self,
        engine: &mut Engine<D>,
        clock: &dyn Clock,
    ) -> Result<usize, Error> {
        if let Some(room) = self.room.take().and_then(|room| room.join().ok()) {
            engine.names.adopt_room(room);
        }
        let now = clock.now();
        // One clock reading for every answer's remaining TTL.
        let now_unix_ms = clock.unix_ms_of(now);
        // Latest expiry first: when a bound (maxCacheEntries, the per-name and per-endpoint
        // breakers) is reached during the restore, what is left out is what expires first
        // (expired flood names, say), never a live name behind them.
        let answers = Remaining {
            answers: self.answers.latest_first(),
            now_unix_ms,
        };
        let stats = engine.restore_answers(&answers, now, |a, e| {
            tracing::warn!(name = %a.name, error = %crate::error_chain(&e), "a restored answer was not learned");
        })?;
        if let Some(why) = stats.one_by_one {
            tracing::debug!(?why, "restored answers learned one by one");
        }
        engine.commit()?;
        Ok(self.answers.len())
    }
}

/// Restored answers as the NameManager learns them: in their order, each with the seconds
/// it has left at `now_unix_ms`.
struct Remaining<'a> {
    answers: LatestFirst<'a>,
    now_unix_ms: u64,
}

impl RestoreAnswers for Remaining<'_> {
    fn len(&self) -> usize {
        self.answers.len()
    }

    fn get(&self, at: usize) -> Option<Restore<'_>> {
        let a = self.answers.get(at)?;
        Some(Restore {
            endpoint: a.endpoint,
            name: a.name,
            addrs: a.addrs,
            ttl: crate::clock::seconds_between(self.now_unix_ms, a.expires_unix_ms),
        })
    }

    fn name_number(&self, at: usize) -> Option<u32> {
        self.answers.name_number(at)
    }

    fn name_numbers(&self) -> usize {
        self.answers.name_numbers()
    }

    fn unnumbered(&self) -> Vec<usize> {
        self.answers.unnumbered()
    }

    fn sizes(&self) -> Sizes {
        self.answers.sizes()
    }
}

/// The order of a synthetic snapshot's names ([`synthesize`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// As compaction writes them ([`Taken`]): the latest expiry first.
    InRestoreOrder,
    /// As they were made up: with a spread, the expiries in no order (as a snapshot of an
    /// fqdnd before that order, or a journal, holds them).
    AsMade,
}

/// Writes a synthetic state directory: `names` names under `zone`, `ips` addresses each,
/// valid for an hour and, with a `spread`, up to that many seconds more, a name's share
/// picked at random (so that the order of expiry is not the order made up, as in a real
/// cache), written in the order `written`; for restore benchmarks:
/// `benchmarks/restore-time.sh`.
///
/// # Errors
/// The directory or the snapshot cannot be written.
pub fn synthesize(
    dir: &Path,
    clock: &dyn Clock,
    zone: &str,
    (names, ips): (u32, u32),
    (spread, written): (Duration, Written),
) -> Result<(), Error> {
    let hour_from_now = clock.unix_ms_of(clock.now()) + 3_600_000;
    let spread_ms = u64::try_from(spread.as_millis()).unwrap_or(u64::MAX);
    let mut taken = Taken::default();
    let mut n: u32 = 0;
    for i in 0..names {
        let expires_unix_ms = match spread_ms {
            0 => hour_from_now,
            spread => hour_from_now + scatter(u64::from(i)) % spread,
        };
        let addrs = (0..ips).map(|_| {
            let [_, a, b, c] = n.to_be_bytes();
            n += 1;
            (IpAddr::from([100, 64 + (a & 0x3f), b, c]), expires_unix_ms)
        });
        taken.push(&format!("n{i}.{zone}."), [1], addrs);
    }
    let state_err = |source| Error::State {
        dir: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| {
        state_err(fqdnd_checkpoint::Error::Io {
            op: "creating the directory",
            path: dir.to_path_buf(),
            error: std::sync::Arc::new(e),
        })
    })?;
    let meta = fqdnd_checkpoint::SnapshotMeta {
        next_generation: 1,
        next_seq: Seq(0),
        taken_at_unix_ms: clock.unix_ms_of(clock.now()),
    };
    match written {
        Written::InRestoreOrder => fqdnd_checkpoint::write_snapshot(dir, SCHEMA, &meta, &taken),
        Written::AsMade => fqdnd_checkpoint::write_snapshot(dir, SCHEMA, &meta, &taken.as_pushed()),
    }
    .map(|_| ())
    .map_err(state_err)
}

/// A number that looks random for each `i` (SplitMix64's finaliser): the same every run.
fn scatter(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fqdnd_ipcache::MemoryDatapath;

    /// A clock stopped at the Unix time `unix_ms` (monotonic time 0).
    struct Fixed {
        unix_ms: u64,
    }

    impl Clock for Fixed {
        fn now(&self) -> Duration {
            Duration::ZERO
        }

        fn unix_ms_of(&self, at: Duration) -> u64 {
            self.unix_ms + u64::try_from(at.as_millis()).unwrap()
        }
    }

    /// Compaction writes the snapshot in the restore's order, so that a restart reads it
    /// straight through, whatever order the names were learned in.
    #[tokio::test]
    async fn compaction_writes_the_latest_expiry_first() {
        let config = test_support::lan_config(None);
        let clock = std::sync::Arc::new(Fixed {
            unix_ms: 1_700_000_000_000,
        });
        let dir = tempfile::tempdir().unwrap();
        let (restored, journal) = open(dir.path(), true).unwrap();
        let persist = Persist::new(journal, clock.clone(), &restored, 1_000);
        let mut engine =
            Engine::from_config(&config, MemoryDatapath::default(), clock.now()).unwrap();
        for (name, last, ttl) in [
            ("a.test.", 1, 100),
            ("b.test.", 2, 300),
            ("c.test.", 3, 200),
        ] {
            let addr = IpAddr::from([192, 0, 2, last]);
            engine
                .learn(EndpointId(7), name, &[addr], ttl, clock.now())
                .unwrap();
        }
        let engine = std::sync::Mutex::new(engine);
        assert_eq!(persist.compact(&engine).await.unwrap(), 3);
        let options = Options::new(SCHEMA);
        let read = fqdnd_checkpoint::read_snapshot_with(dir.path(), &options, ReadSnapshot::decode);
        let answers = read.unwrap().unwrap().1.answers;
        let names: Vec<(&str, u64)> = answers
            .iter()
            .map(|a| (a.name, (a.expires_unix_ms - clock.unix_ms) / 1000))
            .collect();
        assert_eq!(
            names,
            [("b.test.", 300), ("c.test.", 200), ("a.test.", 100)]
        );
        // The same layout as a `Snapshot` (what `fqdnd checkpoint inspect` reads).
        let plain = fqdnd_checkpoint::read_snapshot::<Snapshot>(dir.path(), &options);
        let plain = plain.unwrap().unwrap().1;
        let names: Vec<&str> = plain.names.iter().map(|n| &*n.name).collect();
        assert_eq!(names, ["b.test.", "c.test.", "a.test."]);
        assert_eq!(plain.names[0].endpoints, [7]);
    }

    /// A forget is journaled: a restart does not bring back what was forgotten, and an
    /// answer learned after the forget comes back as usual.
    #[tokio::test]
    async fn a_restart_keeps_what_was_forgotten_out() {
        let config = test_support::lan_config(None);
        let clock = std::sync::Arc::new(Fixed {
            unix_ms: 1_700_000_000_000,
        });
        let dir = tempfile::tempdir().unwrap();
        let ep = EndpointId(7);
        let ip = |last| IpAddr::from([192, 0, 2, last]);
        {
            let (restored, journal) = open(dir.path(), true).unwrap();
            let persist = Persist::new(journal, clock.clone(), &restored, 1_000);
            let mut engine =
                Engine::from_config(&config, MemoryDatapath::default(), clock.now()).unwrap();
            let mut acks = Vec::new();
            let learn = |engine: &mut Engine<MemoryDatapath>, name: &str, addrs: &[IpAddr]| {
                let learning = engine.learn(ep, name, addrs, 300, clock.now()).unwrap();
                persist
                    .answer(engine, ep, name, addrs, 300, &learning)
                    .unwrap()
            };
            acks.extend(learn(&mut engine, "a.test.", &[ip(1), ip(2)]));
            acks.extend(learn(&mut engine, "b.test.", &[ip(3)]));
            for forget in [
                crate::Forget {
                    name: "A.test",
                    addrs: Some(&[ip(1)]),
                    endpoint: None,
                },
                crate::Forget {
                    name: "b.test.",
                    addrs: None,
                    endpoint: Some(ep),
                },
            ] {
                let forgotten = engine.forget(&forget).unwrap();
                assert_eq!(forgotten.mappings, 1);
                acks.push(persist.forgotten(&forget).unwrap());
            }
            // b.test. asked again after the forget: it stays.
            acks.extend(learn(&mut engine, "b.test.", &[ip(4)]));
            for ack in acks {
                ack.await.unwrap();
            }
            let dp = engine.ipcache.datapath();
            assert_eq!(dp.identity_of(ip(1)), dp.identity_of(ip(200)), "unknown");
            // The directory's lock released before it is opened again.
            persist.close().await.unwrap();
        }
        let (mut restored, _journal) = open(dir.path(), true).unwrap();
        let mut engine =
            Engine::from_config(&config, MemoryDatapath::default(), clock.now()).unwrap();
        restored.apply(&mut engine, &*clock).unwrap();
        let mut entries: Vec<(String, IpAddr)> = engine
            .names
            .entries()
            .map(|e| (e.name.to_owned(), e.ip.addr))
            .collect();
        entries.sort();
        assert_eq!(
            entries,
            [("a.test.".into(), ip(2)), ("b.test.".into(), ip(4))]
        );
        let dp = engine.ipcache.datapath();
        assert_eq!(dp.identity_of(ip(1)), dp.identity_of(ip(200)), "unknown");
        assert_ne!(dp.identity_of(ip(2)), dp.identity_of(ip(200)));
    }

    /// Records an fqdnd without the forget record wrote (their bytes, postcard) read as
    /// they did.
    #[test]
    fn older_records_read_as_they_did() {
        let decode = fqdnd_checkpoint::format::decode_value::<Record>;
        let learned = decode(&[0, 7, 2, b'a', b'.', 1, 0, 10, 0, 0, 1, 1]).unwrap();
        assert!(
            matches!(&learned, Record::Learned { endpoint: 7, name, addrs, expires_unix_ms: 1 }
                if name == "a." && addrs == &[IpAddr::from([10, 0, 0, 1])]),
            "{learned:?}"
        );
        let identity = decode(&[1, 1, b'x', 172, 2]).unwrap();
        assert!(
            matches!(&identity, Record::Identity { labels, id: 300 } if labels == "x"),
            "{identity:?}"
        );
    }

    /// At a full cache, the restore keeps the live answers and leaves out the expired ones,
    /// whatever their order in the journal (expired flood names first, here).
    #[test]
    fn a_restore_at_the_cache_bound_keeps_live_answers_over_expired_ones() {
        let config = test_support::lan_config(Some("breakers: {maxCacheEntries: 3}"));
        let clock = Fixed {
            unix_ms: 1_700_000_000_000,
        };
        let now_ms = clock.unix_ms;
        let mut answers = Answers::default();
        for (name, last, expires) in [
            ("w1.flood.test.", 1, now_ms - 60_000),
            ("w2.flood.test.", 2, now_ms - 50_000),
            ("w3.flood.test.", 3, now_ms - 40_000),
            ("k1.corp.test.", 11, now_ms + 3_600_000),
            ("k2.corp.test.", 12, now_ms + 3_600_000),
        ] {
            let addr = IpAddr::from([192, 0, 2, last]);
            answers.push(EndpointId(7), name, &[addr], expires).unwrap();
        }
        let mut restored = Restored {
            identities: Vec::new(),
            answers,
            discarded: None,
            records: 5,
            snapshot_entries: 0,
            room: None,
        };
        let mut engine =
            Engine::from_config(&config, MemoryDatapath::default(), clock.now()).unwrap();
        restored.apply(&mut engine, &clock).unwrap();
        let mut names: Vec<String> = engine.names.entries().map(|e| e.name.to_string()).collect();
        names.sort();
        assert_eq!(
            names,
            ["k1.corp.test.", "k2.corp.test.", "w3.flood.test."],
            "the live names and the latest-expiring of the rest"
        );
    }
}
