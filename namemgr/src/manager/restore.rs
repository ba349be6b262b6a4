//! Learning a restored DNS cache at start: every answer as [`NameManager::observe`] learns
//! it, with the IpCache's claims collected and applied in one pass at the end.

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fqdnd_ipcache::{
    Datapath, EndpointId, Error as IpCacheError, IpCache, ManyUpserted, NotApplied, OwnerId,
    Refused, host_prefix,
};
use hashbrown::{DefaultHashBuilder, HashTable};
use ipnet::IpNet;

use super::{Known, Learned, NameManager, Prepared, Selection};
use crate::cache::{DnsCache, IpRefs, NameIdx, Names, RestoreRoom};
use crate::error::Error;
use crate::name::DnsName;

/// Answers prepared at a time by a restore's labelling thread (fewer in a small restore,
/// so that it still has several chunks).
const LABEL_CHUNK: usize = 4096;

/// Chunks the learning side must have queued for the labelling thread to work out the
/// labels of the next one too (else the learning side does).
const LABEL_SLACK: usize = 2;

/// Chunks the labelling thread may work out ahead of the answers learned.
const CHUNKS_AHEAD: usize = 4;

/// One answer to learn again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restore<'a> {
    /// The endpoint that asked.
    pub endpoint: EndpointId,
    /// The name.
    pub name: &'a str,
    /// The addresses it answered.
    pub addrs: &'a [IpAddr],
    /// Seconds it has left.
    pub ttl: u32,
}

/// The answers a restore learns, by number, in the order to learn them: a slice of them,
/// or a view its caller keeps (a restored snapshot's answers in the order it chose,
/// without a copy of each).
pub trait RestoreAnswers: Sync {
    /// How many there are.
    fn len(&self) -> usize;

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The answer numbered `at` (`None` past the last).
    fn get(&self, at: usize) -> Option<Restore<'_>>;

    /// A number for the name of the answer numbered `at`, where the implementation knows
    /// which answers share a name without comparing them (a snapshot numbers its names as
    /// written): answers numbered alike have the same name, answers numbered differently
    /// different names, all below [`RestoreAnswers::name_numbers`]. The restore compares
    /// the names of the answers without one (`None`, the default) with the others'; it
    /// checks the numbers as it indexes the names, and learns the answers one by one if
    /// two turn out to share a name ([`OneByOne::SharedName`]).
    fn name_number(&self, at: usize) -> Option<u32> {
        let _ = at;
        None
    }

    /// How many name numbers there are: 0 (the default) if none is given.
    fn name_numbers(&self) -> usize {
        0
    }

    /// The answers without a name number, in order: by a pass over every answer unless the
    /// implementation knows better.
    fn unnumbered(&self) -> Vec<usize> {
        (0..self.len())
            .filter(|&at| self.name_number(at).is_none())
            .collect()
    }

    /// Upper bounds on what the answers hold, to size the cache before learning them: by
    /// a pass over every answer unless the implementation knows better.
    fn sizes(&self) -> Sizes {
        answers_in(self, 0, self.len()).fold(Sizes::default(), |mut sizes, (_, a)| {
            sizes.name_bytes += a.name.len();
            for addr in a.addrs {
                match addr {
                    IpAddr::V4(_) => sizes.v4 += 1,
                    IpAddr::V6(_) => sizes.v6 += 1,
                }
            }
            sizes
        })
    }
}

/// What [`RestoreAnswers`] hold, at most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizes {
    /// Bytes of names, all answers' added up.
    pub name_bytes: usize,
    /// IPv4 addresses, all answers' added up.
    pub v4: usize,
    /// IPv6 addresses, all answers' added up.
    pub v6: usize,
}

impl RestoreAnswers for [Restore<'_>] {
    fn len(&self) -> usize {
        <[Restore<'_>]>::len(self)
    }

    fn get(&self, at: usize) -> Option<Restore<'_>> {
        <[Restore<'_>]>::get(self, at).copied()
    }
}

/// Every answer of `answers` with its number, from `from` to (not including) `to`.
fn answers_in<A: RestoreAnswers + ?Sized>(
    answers: &A,
    from: usize,
    to: usize,
) -> impl Iterator<Item = (usize, Restore<'_>)> + '_ {
    (from..to.min(answers.len())).filter_map(|at| answers.get(at).map(|a| (at, a)))
}

/// What [`NameManager::restore`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreStats {
    /// The answers' changes, added up.
    pub learned: Learned,
    /// Answers not learned at all (their errors went to the caller's `failed`).
    pub failed: usize,
    /// `None`: the IpCache's claims were applied in one pass; otherwise why they were
    /// applied one by one.
    pub one_by_one: Option<OneByOne>,
}

/// Why [`NameManager::restore`] learned the answers one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OneByOne {
    /// The cache was not empty.
    NotEmpty,
    /// The IpCache would not apply the claims in one pass.
    IpCache(NotApplied),
    /// Two answers numbered differently ([`RestoreAnswers::name_number`]) had the same name.
    SharedName,
}

/// What the labelling thread works out for one answer.
struct Ahead {
    /// For a name canonical as given (the learning side takes it as is): its labels, if
    /// worked out.
    prepared: Option<Prepared>,
    /// For a valid name: where the learning side keeps the slot of the name (the same for
    /// every answer with that canonical name; [`Keys`]).
    key: Option<usize>,
}

/// Where the learning side of a restore keeps the slot of each name it added, by name: a
/// name's number if its answers have one, else (or if an answer without a number has the
/// name too) `numbers` + the first answer without a number that has it.
struct Keys {
    /// Name numbers there are.
    numbers: usize,
    /// Answers there are.
    answers: usize,
    /// The answers without a number, if there are numbers: their names are met before the
    /// others (then a numbered answer with the same name takes their key).
    unnumbered: Vec<usize>,
}

impl Keys {
    fn of(answers: &(impl RestoreAnswers + ?Sized)) -> Self {
        let numbers = answers.name_numbers();
        Self {
            numbers,
            answers: answers.len(),
            unnumbered: if numbers == 0 {
                Vec::new()
            } else {
                answers.unnumbered()
            },
        }
    }

    /// How many names there can be: one per number and per answer without one.
    fn names(&self) -> usize {
        match self.numbers {
            0 => self.answers,
            numbers => numbers + self.unnumbered.len(),
        }
    }

    /// How many keys there can be.
    fn len(&self) -> usize {
        let unnumbered = self.numbers == 0 || !self.unnumbered.is_empty();
        self.numbers + if unnumbered { self.answers } else { 0 }
    }

    /// The key of the answer numbered `at`, whose canonical name is `name` (hashed only to
    /// be compared with the names of answers without a number).
    fn of_answer(
        &self,
        (at, name): (u32, Cow<'_, str>),
        answers: &(impl RestoreAnswers + ?Sized),
        hasher: &DefaultHashBuilder,
        seen: &mut Seen,
    ) -> usize {
        let number = answers
            .name_number(at as usize)
            .filter(|&n| (n as usize) < self.numbers);
        match number {
            Some(n) => {
                // An answer without a number has the name too (met first): its key.
                let shared = (!seen.first.is_empty())
                    .then(|| seen.find(&name, hasher.hash_one(&*name), answers))
                    .flatten();
                shared.map_or(n as usize, |first| self.numbers + first)
            }
            None => {
                let hash = hasher.hash_one(&*name);
                let first = seen.first(at, name, hash, answers, hasher);
                self.numbers + first.unwrap_or(at as usize)
            }
        }
    }
}

/// The canonical names a restore's labelling thread has met in answers without a name
/// number, each with the first answer that had it.
struct Seen {
    /// Answer numbers, by their canonical name's hash in the name index.
    first: HashTable<u32>,
    /// The canonical form of the names not canonical as given, by answer number.
    spelled: hashbrown::HashMap<u32, Box<str>>,
}

impl Seen {
    fn new(answers: usize) -> Self {
        Self {
            first: HashTable::with_capacity(answers),
            spelled: hashbrown::HashMap::new(),
        }
    }

    /// The first answer met whose canonical name is `name` (hashed `hash`).
    fn find(
        &self,
        name: &str,
        hash: u64,
        answers: &(impl RestoreAnswers + ?Sized),
    ) -> Option<usize> {
        let text = |j| canonical(&self.spelled, answers, j);
        let found = self.first.find(hash, |&j| text(j) == name)?;
        Some(*found as usize)
    }

    /// The first answer before `at` whose canonical name is `name` (hashed `hash`); `None`
    /// if `at` is the first, which is then remembered.
    fn first(
        &mut self,
        at: u32,
        name: Cow<'_, str>,
        hash: u64,
        answers: &(impl RestoreAnswers + ?Sized),
        hasher: &DefaultHashBuilder,
    ) -> Option<usize> {
        let Self { first, spelled } = self;
        let text = |j| canonical(spelled, answers, j);
        match first.entry(hash, |&j| text(j) == name, |&j| hasher.hash_one(text(j))) {
            hashbrown::hash_table::Entry::Occupied(e) => Some(*e.get() as usize),
            hashbrown::hash_table::Entry::Vacant(e) => {
                e.insert(at);
                if let Cow::Owned(name) = name {
                    spelled.insert(at, name.into_boxed_str());
                }
                None
            }
        }
    }
}

/// The canonical name of the answer numbered `at`: as spelled, unless `spelled` holds it.
fn canonical<'a>(
    spelled: &'a hashbrown::HashMap<u32, Box<str>>,
    answers: &'a (impl RestoreAnswers + ?Sized),
    at: u32,
) -> &'a str {
    match spelled.get(&at) {
        Some(canonical) => canonical,
        None => answers.get(at as usize).map_or("", |a| a.name),
    }
}

/// What the labelling thread works out for the answers numbered `chunk`; the labels only
/// with `labels`, else the learning side works them out.
fn prepare(
    answers: &(impl RestoreAnswers + ?Sized),
    chunk: std::ops::Range<usize>,
    (selection, labels): (&Selection, bool),
    (hasher, keys): (&DefaultHashBuilder, &Keys),
    seen: &mut Seen,
) -> Vec<Ahead> {
    answers_in(answers, chunk.start, chunk.end)
        .map(|(at, a)| {
            // An invalid name, or an answer past 2³² (none: a snapshot that large is refused),
            // gets nothing: the learning side looks the name up in the index.
            let at = u32::try_from(at);
            let (Ok(name), Ok(at)) = (DnsName::canonical(a.name), at) else {
                return Ahead {
                    prepared: None,
                    key: None,
                };
            };
            let prepared = match name {
                Cow::Borrowed(name) => Some(Prepared {
                    labels: labels.then(|| selection.labels_for(name)),
                }),
                Cow::Owned(_) => None,
            };
            Ahead {
                prepared,
                key: Some(keys.of_answer((at, name), answers, hasher, seen)),
            }
        })
        .collect()
}

impl NameManager {
    /// Uses `room` for the restore to come: its slots and text if the cache never held a
    /// name (else drops them), its claims if that restore learns in one pass.
    pub fn adopt_room(&mut self, mut room: RestoreRoom) {
        self.claims_room = Some(std::mem::take(&mut room.claims));
        self.cache.names.adopt(room);
    }

    /// Learns `answers` (in the order given: what a bound leaves out is what comes last, so
    /// a restore passes the latest expiry first) as [`NameManager::observe`] would one by
    /// one, handing each answer that fails, with its error, to `failed`.
    ///
    /// Into an empty cache, the IpCache's claims are collected and applied in one pass at
    /// the end ([`IpCache::upsert_metadata_many`]): a million mappings without a tree walk
    /// each; so are the new names into the name index, with a second core. If that pass could
    /// trip an IpCache breaker — which claims it refuses depends on their order — the cache
    /// is emptied again and the answers are learned one by one.
    ///
    /// # Errors
    /// The IpCache failed in a way no answer explains (an owner it does not know).
    pub fn restore<D: Datapath>(
        &mut self,
        answers: &(impl RestoreAnswers + ?Sized),
        now: Duration,
        ipcache: &mut IpCache<D>,
        mut failed: impl FnMut(&Restore<'_>, Error),
    ) -> Result<RestoreStats, Error> {
        let room = self.claims_room.take();
        if self.entries > 0 || self.cache.names.len() > 0 {
            let why = OneByOne::NotEmpty;
            return Ok(self.restore_one_by_one(answers, now, ipcache, &mut failed, why));
        }
        let stats = self.stats.clone();
        let sizes = answers.sizes();
        let keys = &Keys::of(answers);
        self.cache.names.reserve(keys.names(), sizes.name_bytes);
        let mut claims = room.unwrap_or_default();
        claims.reserve(sizes.v4, sizes.v6);
        self.deferred = Some(claims);
        let mut out = RestoreStats::default();
        let mut errors = Vec::new();
        // A second thread works out, chunks ahead of the answers learned here, whether each
        // name is canonical and where the learning side keeps its slot (by its number, or by
        // the first answer without a number that had it): a new name is then added without
        // a lookup in the index or an insert into it (a cache miss each in an index of a
        // million, while the rest of the restore fills memory); the new names are indexed
        // in one pass at the end, which checks the numbers. It also works out a chunk's
        // labels when the learning side has work queued, else leaves them to it: so
        // neither waits long for the other whatever labelling costs (for 1M names, the
        // learning side waited 65-100 ms of its ~300 when the thread labelled every second
        // chunk, 5-50 ms this way; 160-250 ms when it labelled them all). Only with a
        // second core to run it on: on one, its hand-offs cost more than they save.
        let chunk_len = LABEL_CHUNK.min(answers.len().div_ceil(8)).max(1);
        let selection = Arc::clone(&self.selection);
        let hasher = self.cache.names.hasher().clone();
        // Whether every name the learning side added without a lookup was new (the
        // numbers of the names were right).
        let mut all_new = true;
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        // Chunks the labelling thread has sent and the learning side not taken yet.
        let queued = &AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel(CHUNKS_AHEAD);
            let labelling = (cores > 1).then_some(tx).map(|tx| {
                std::thread::Builder::new()
                    .name("restore-labels".into())
                    .spawn_scoped(scope, move || {
                        let unnumbered = keys.unnumbered.len();
                        let mut seen = Seen::new(match keys.numbers {
                            0 => answers.len(),
                            _ => unnumbered,
                        });
                        // The names of the answers without a number first: the numbered
                        // answers with one of them take its key.
                        for &at in &keys.unnumbered {
                            let (Some(a), Ok(at)) = (answers.get(at), u32::try_from(at)) else {
                                continue;
                            };
                            if let Ok(name) = DnsName::canonical(a.name) {
                                let hash = hasher.hash_one(&*name);
                                seen.first(at, name, hash, answers, &hasher);
                            }
                        }
                        for base in (0..answers.len()).step_by(chunk_len) {
                            // Labels too when the learning side has work queued.
                            let slack = queued.load(Ordering::Relaxed) >= LABEL_SLACK;
                            let labels = (&*selection, slack);
                            let chunk = base..base + chunk_len;
                            let with = (&hasher, keys);
                            let ahead = prepare(answers, chunk, labels, with, &mut seen);
                            queued.fetch_add(1, Ordering::Relaxed);
                            if tx.send(ahead).is_err() {
                                return;
                            }
                        }
                    })
            });
            // One core, or no thread to be had: the sender is gone, and every name is looked
            // up in the index and worked out here. With the thread: for each answer that was
            // the first to have its name, the slot that holds the name.
            let mut slot_of = if matches!(labelling, Some(Ok(_))) {
                vec![None; keys.len()]
            } else {
                Vec::new()
            };
            drop(labelling);
            for base in (0..answers.len()).step_by(chunk_len) {
                let mut ahead = rx.recv().ok().map(Vec::into_iter);
                if ahead.is_some() {
                    queued.fetch_sub(1, Ordering::Relaxed);
                }
                for (at, a) in answers_in(answers, base, base + chunk_len) {
                    let ahead = ahead.as_mut().and_then(Iterator::next);
                    // Where the slot of this answer's name is kept.
                    let key = ahead.as_ref().and_then(|h| h.key);
                    let slot = key.and_then(|k| slot_of.get(k).copied().flatten());
                    let known = match ahead {
                        // One key, one name, unless a caller numbered names wrongly.
                        _ if let Some(slot) = slot
                            && self.cache.names.holds(slot, a.name) =>
                        {
                            Known::At(slot)
                        }
                        Some(Ahead {
                            prepared: Some(prepared),
                            ..
                        }) if slot.is_none() => Known::New(prepared),
                        // Nothing ahead, a name not canonical as given, or an invalid one (or
                        // a key whose slot holds another name: the numbers were wrong): it
                        // is looked up by name, so every name must be in the index first.
                        _ => {
                            all_new &= slot.is_none();
                            all_new &= self.cache.names.index_pending();
                            Known::Nothing
                        }
                    };
                    let new = matches!(known, Known::New(_));
                    let mut kept = None;
                    match self.observe_known(&a, now, ipcache, known, &mut kept) {
                        Ok(learned) => out.learned.add(learned),
                        Err(e) => errors.push((at, e)),
                    }
                    // A new name that left nothing in the cache: had the cache held it
                    // (its number given wrongly), the answer would have changed it.
                    if new && kept.is_none() {
                        all_new &= self.cache.names.index_pending();
                        all_new &= self.cache.names.find(a.name).is_none();
                    }
                    if let (Some(key), Some(idx)) = (key, kept)
                        && let Some(slot) = slot_of.get_mut(key)
                    {
                        *slot = Some(idx);
                    }
                }
            }
        });
        let claims = self.deferred.take().unwrap_or_default();
        // The names per IP are counted on a second thread while the IpCache applies the
        // claims (they share nothing): a tenth of a million-entry restore, off its path.
        let count = |ips: &mut IpRefs, names: &Names| {
            ips.count(names.entries().flat_map(|e| e.ips.iter().map(|m| m.addr)));
        };
        let DnsCache { names, ips, .. } = &mut self.cache;
        let (upserted, counted) = std::thread::scope(|scope| {
            let counting = std::thread::Builder::new()
                .name("restore-count".into())
                .spawn_scoped(scope, || {
                    count(ips, names);
                    names.index_pending()
                });
            let upserted = ipcache.upsert_metadata_many(claims, now);
            (upserted, counting.map(|c| c.join()))
        });
        all_new &= match counted {
            Ok(Ok(all_new)) => all_new,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            // No thread to be had: counted and indexed here, after.
            Err(_) => {
                count(&mut self.cache.ips, &self.cache.names);
                self.cache.names.index_pending()
            }
        };
        let why = match upserted {
            Ok(ManyUpserted::Applied { refused }) if all_new => {
                self.drop_refused(refused, &mut out.learned, ipcache)?;
                out.failed = errors.len();
                for (at, e) in errors {
                    if let Some(a) = answers.get(at) {
                        failed(&a, e);
                    }
                }
                return Ok(out);
            }
            // A name was added twice: the claims applied are taken back.
            Ok(ManyUpserted::Applied { refused }) => {
                self.drop_refused(refused, &mut out.learned, ipcache)?;
                self.take_back(ipcache)?;
                OneByOne::SharedName
            }
            Ok(ManyUpserted::NotApplied(why)) => OneByOne::IpCache(why),
            Err(e) => {
                self.empty(ipcache)?;
                return Err(e.into());
            }
        };
        self.empty(ipcache)?;
        self.stats = stats;
        Ok(self.restore_one_by_one(answers, now, ipcache, &mut failed, why))
    }

    fn restore_one_by_one<D: Datapath>(
        &mut self,
        answers: &(impl RestoreAnswers + ?Sized),
        now: Duration,
        ipcache: &mut IpCache<D>,
        failed: &mut impl FnMut(&Restore<'_>, Error),
        why: OneByOne,
    ) -> RestoreStats {
        let mut out = RestoreStats {
            one_by_one: Some(why),
            ..RestoreStats::default()
        };
        for (_, a) in answers_in(answers, 0, answers.len()) {
            match self.observe(a.endpoint, a.name, a.addrs, a.ttl, now, ipcache) {
                Ok(learned) => out.learned.add(learned),
                Err(e) => {
                    out.failed += 1;
                    failed(&a, e);
                }
            }
        }
        out
    }

    /// Takes back the mappings whose claims the IpCache refused (as `observe` would not have
    /// learned them), and the names left without any.
    fn drop_refused<D: Datapath>(
        &mut self,
        refused: Vec<Refused>,
        learned: &mut Learned,
        ipcache: &mut IpCache<D>,
    ) -> Result<(), Error> {
        if refused.is_empty() {
            return Ok(());
        }
        let by_owner: HashMap<OwnerId, NameIdx> = self
            .cache
            .names
            .iter()
            .filter_map(|(idx, _, e)| Some((e.owner?, idx)))
            .collect();
        let DnsCache {
            names,
            ips,
            endpoint_names,
            ..
        } = &mut self.cache;
        for r in refused {
            let addr = r.prefix.addr();
            for owner in &r.owners {
                let Some(&idx) = by_owner.get(owner) else {
                    continue;
                };
                let Some(entry) = names.get_mut(idx) else {
                    continue;
                };
                let Ok(at) = entry.find(addr) else {
                    continue;
                };
                entry.ips.remove(at);
                ips.unlink(addr);
                self.entries -= 1;
                self.stats.new_mappings -= 1;
                learned.new -= 1;
                learned.rejected += 1;
                match r.error {
                    IpCacheError::BreakerTripped { .. } => {
                        self.stats.breaker_trips += 1;
                        self.stats.trips.fqdn_identities += 1;
                    }
                    IpCacheError::DatapathFull { .. } => self.stats.trips.datapath_full += 1,
                    _ => {}
                }
                if entry.holds() == 0
                    && let Some(entry) = names.remove(idx)
                {
                    for (endpoint, _) in entry.endpoints.iter() {
                        DnsCache::forget_endpoints(endpoint_names, endpoint, 1);
                    }
                    if let Some(owner) = entry.owner {
                        // It claims nothing any more.
                        ipcache.remove_owner(owner)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes back the IpCache claims on every mapping the cache holds (which a restore to be
    /// undone applied in one pass).
    fn take_back<D: Datapath>(&self, ipcache: &mut IpCache<D>) -> Result<(), Error> {
        let mut claims: Vec<(IpNet, OwnerId)> = self
            .cache
            .names
            .entries()
            .filter_map(|e| Some((e.owner?, e)))
            .flat_map(|(owner, e)| e.ips.iter().map(move |m| (host_prefix(m.addr), owner)))
            .collect();
        claims.sort_unstable();
        let expected = claims.len();
        ipcache.remove_metadata_many(claims, expected)?;
        Ok(())
    }

    /// Empties the cache this restore filled (it was empty before), with the IpCache
    /// owners of its names (which claim nothing: their claims were never applied, or were
    /// taken back).
    fn empty<D: Datapath>(&mut self, ipcache: &mut IpCache<D>) -> Result<(), Error> {
        let owners: Vec<OwnerId> = self.cache.names.entries().filter_map(|e| e.owner).collect();
        self.cache = DnsCache::default();
        self.entries = 0;
        self.zombies = 0;
        ipcache.remove_owners(&owners)?;
        Ok(())
    }
}
