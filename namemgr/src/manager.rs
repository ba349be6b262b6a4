//! The NameManager: learns (name, IP) mappings from DNS answers, keeps them with their TTLs,
//! and labels each IP in the IpCache with the `fqdn:` labels of the selectors matching its
//! name, under one resource owner per DNS name.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use fqdnd_ipcache::{
    Claims, Datapath, EndpointId, IpCache, LabelId, LabelSet, OwnerId, OwnerKind, host_prefix,
};
use smallvec::SmallVec;

use crate::cache::{DnsCache, IpEntry, Mapping, NameEntry, NameIdx, Secs};
use crate::config::Config;
use crate::error::{Breaker, Error};
use crate::matcher::{Matcher, SelectorId};
use crate::name::DnsName;
use crate::pattern::FqdnSelector;

mod forget;
mod restore;
pub use forget::{Forget, Forgotten};
pub use restore::{OneByOne, Restore, RestoreAnswers, RestoreStats, Sizes};

/// How often a tripped breaker may log a warning.
const WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Tells the NameManager which IPs live connections still use (the datapath's conntrack).
pub trait Connections {
    /// Whether some connection still uses `addr`.
    fn in_use(&self, addr: IpAddr) -> bool;
}

impl<F: Fn(IpAddr) -> bool> Connections for F {
    fn in_use(&self, addr: IpAddr) -> bool {
        self(addr)
    }
}

/// What one answer changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Learned {
    /// New (name, IP) mappings.
    pub new: usize,
    /// Mappings whose expiry moved (a TTL refresh).
    pub refreshed: usize,
    /// Zombies made live again.
    pub revived: usize,
    /// IPs not learned because the name's IP cap was filled by this very answer.
    pub capped: usize,
    /// IPs a circuit breaker rejected.
    pub rejected: usize,
}

impl Learned {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: Self) {
        self.new += other.new;
        self.refreshed += other.refreshed;
        self.revived += other.revived;
        self.capped += other.capped;
        self.rejected += other.rejected;
    }

    /// Whether the answer taught state that must be durable before the reply is released
    /// (a refresh only extends a lifetime).
    pub fn is_new_state(&self) -> bool {
        self.new + self.revived > 0
    }
}

/// What one GC pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcStats {
    /// Live mappings whose TTL ran out.
    pub expired: usize,
    /// Mappings released (their IP no longer in use, or over the zombie cap).
    pub released: usize,
    /// Zombies released because there were more than the cap allows.
    pub over_cap: usize,
    /// Names that left the cache.
    pub names_removed: usize,
}

/// Counters since start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Answers observed.
    pub answers: u64,
    /// Answers whose name fqdnd does not store.
    pub invalid_names: u64,
    /// New mappings learned.
    pub new_mappings: u64,
    /// Breaker trips (per answer for names-per-endpoint, per IP otherwise).
    pub breaker_trips: u64,
    /// The same trips by breaker.
    pub trips: BreakerTrips,
    /// Mappings released by GC.
    pub gc_releases: u64,
    /// GC passes.
    pub gc_runs: u64,
}

/// Breaker trips since start, by breaker (what `Stats::breaker_trips` adds up).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BreakerTrips {
    /// Answers for a new name refused because the endpoint had too many names.
    pub names_per_endpoint: u64,
    /// Answers that brought a name past its IP cap (once per answer).
    pub ips_per_name: u64,
    /// IPs refused because the whole cache was full.
    pub cache_entries: u64,
    /// IPs refused because they needed a new identity past the FQDN identity breaker.
    pub fqdn_identities: u64,
    /// IPs refused because the datapath's ipcache had no room for a new prefix.
    pub datapath_full: u64,
}

/// One cached name with the endpoints that asked it and its mappings
/// ([`NameManager::cached_names`]).
#[derive(Debug, Clone, Copy)]
pub struct CachedName<'a> {
    /// The name.
    pub name: &'a str,
    entry: &'a NameEntry,
}

impl<'a> CachedName<'a> {
    /// The endpoints that asked it.
    pub fn endpoints(&self) -> impl Iterator<Item = EndpointId> + 'a {
        self.entry.endpoints.iter().map(|(endpoint, _)| endpoint)
    }

    /// Its mappings, live and zombie: each address and its expiry (seconds on the caller's
    /// clock).
    pub fn ips(&self) -> impl Iterator<Item = IpEntry> + 'a {
        self.entry.ips.iter().map(|m| m.entry())
    }
}

/// One mapping, for listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheEntry<'a> {
    /// The name.
    pub name: &'a str,
    /// The address and its expiry (seconds on the caller's clock).
    pub ip: IpEntry,
    /// Whether it is a zombie (expired or evicted, kept because in use).
    pub zombie: bool,
    /// When the name was last answered.
    pub last_lookup: u32,
}

#[derive(Debug, Clone)]
struct Registered {
    selector: FqdnSelector,
    label: LabelId,
}

/// The NameManager.
#[derive(Debug)]
pub struct NameManager {
    config: Config,
    /// The selectors in force (shared with a restore's labelling thread; changed in place
    /// when not shared).
    selection: Arc<Selection>,
    by_key: HashMap<String, SelectorId>,
    next_selector: u32,
    cache: DnsCache,
    zombies: usize,
    /// (name, IP) mappings held, live and zombie: what `max_cache_entries` bounds.
    entries: usize,
    stats: Stats,
    last_warning: Option<Duration>,
    /// During a bulk restore: the IpCache claims of the mappings learned, applied at the end
    /// in one pass (`restore`), instead of one upsert each.
    deferred: Option<Claims>,
    /// Claims with room made ahead for the next restore (`adopt_room`).
    claims_room: Option<Claims>,
}

/// The IpCache owner of the name at `entry`, registered on first use.
fn owner_of<D: Datapath>(
    entry: &mut NameEntry,
    ipcache: &mut IpCache<D>,
) -> Result<OwnerId, fqdnd_ipcache::Error> {
    if let Some(owner) = entry.owner {
        return Ok(owner);
    }
    let owner = ipcache.add_owner_without_name(OwnerKind::NameManager)?;
    entry.owner = Some(owner);
    Ok(owner)
}

fn secs(now: Duration) -> Secs {
    u32::try_from(now.as_secs()).unwrap_or(u32::MAX)
}

/// What a restore's labelling thread works out ahead for a name it found canonical.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The name's labels, if the thread worked them out (when the learning side has work
    /// queued).
    pub(crate) labels: Option<LabelSet>,
}

/// What is known of an answer's name before it is learned.
#[derive(Debug)]
pub(crate) enum Known {
    /// Nothing: it is looked up in the name index, and worked out here if new.
    Nothing,
    /// The cache holds it in this slot (a restore learned it from an earlier answer).
    At(NameIdx),
    /// The cache does not hold it, and it is canonical as given: it is added with what was
    /// prepared, without indexing it (a restore indexes its new names at its end).
    New(Prepared),
}

/// The FQDN selectors in force, compiled.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selection {
    matcher: Matcher,
    /// Looked up for every new name's labels: foldhash, not std's SipHash.
    selectors: hashbrown::HashMap<SelectorId, Registered>,
}

impl Selection {
    /// The `fqdn:` labels of the selectors matching the canonical `name`.
    pub(crate) fn labels_for(&self, name: &str) -> LabelSet {
        let mut labels = LabelSet::new();
        self.matcher.for_each_match(name, |id| {
            if let Some(reg) = self.selectors.get(&id) {
                labels.insert(reg.label);
            }
        });
        labels
    }
}

impl NameManager {
    /// An empty NameManager.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            selection: Arc::default(),
            by_key: HashMap::new(),
            next_selector: 0,
            cache: DnsCache::default(),
            zombies: 0,
            entries: 0,
            stats: Stats::default(),
            last_warning: None,
            deferred: None,
            claims_room: None,
        }
    }

    /// Learns an answer: `addrs` for `name` with `ttl` seconds, looked up by `endpoint`.
    ///
    /// New IPs of a name some selector matches are labelled in `ipcache` (the caller commits).
    /// The TTL is raised to the configured minimum. Past the name's IP cap the
    /// earliest-expiring IPs become zombies.
    pub fn observe<D: Datapath>(
        &mut self,
        endpoint: EndpointId,
        name: &str,
        addrs: &[IpAddr],
        ttl: u32,
        now: Duration,
        ipcache: &mut IpCache<D>,
    ) -> Result<Learned, Error> {
        let answer = Restore {
            endpoint,
            name,
            addrs,
            ttl,
        };
        self.observe_known(&answer, now, ipcache, Known::Nothing, &mut None)
    }

    /// [`NameManager::observe`] of `answer`, with what a restore knows of its name ahead;
    /// `kept` is set to the name's slot when the cache holds the name afterwards.
    pub(crate) fn observe_known<D: Datapath>(
        &mut self,
        answer: &Restore<'_>,
        now: Duration,
        ipcache: &mut IpCache<D>,
        known: Known,
        kept: &mut Option<NameIdx>,
    ) -> Result<Learned, Error> {
        let &Restore {
            endpoint,
            name,
            addrs,
            ttl,
        } = answer;
        self.stats.answers += 1;
        let (found, prepared) = match known {
            Known::At(idx) => (Some(idx), None),
            Known::New(prepared) => (None, Some(prepared)),
            // A name already in the cache was validated when it was stored: look it up as
            // given (the proxy hands over canonical names) before paying for parsing and
            // allocation.
            Known::Nothing => (self.cache.names.find(name), None),
        };
        let found = match found {
            Some(idx) => Ok(idx),
            // Found canonical already.
            None if prepared.is_some() => Err(Cow::Borrowed(name)),
            None => {
                let parsed = DnsName::canonical(name).map_err(|error| {
                    self.stats.invalid_names += 1;
                    Error::InvalidName {
                        name: name.to_owned(),
                        error,
                    }
                })?;
                // Looked up again only if canonicalisation changed it.
                let again = match &parsed {
                    Cow::Owned(canonical) => self.cache.names.find(canonical),
                    Cow::Borrowed(_) => None,
                };
                match again {
                    Some(idx) => Ok(idx),
                    None => Err(parsed),
                }
            }
        };
        let expires = secs(now).saturating_add(ttl.max(self.config.min_ttl));

        let asked = match found {
            Ok(idx) => self
                .cache
                .names
                .get(idx)
                .is_some_and(|e| e.asked_by(endpoint)),
            Err(_) => false,
        };
        let names_of_endpoint = self
            .cache
            .endpoint_names
            .get(&endpoint)
            .copied()
            .unwrap_or(0);
        if !asked && names_of_endpoint >= self.config.max_names_per_endpoint {
            self.stats.breaker_trips += 1;
            self.stats.trips.names_per_endpoint += 1;
            let name = match &found {
                Ok(idx) => self
                    .cache
                    .names
                    .get(*idx)
                    .map_or_else(|| name.to_owned(), |e| self.cache.names.text(e).to_owned()),
                Err(key) => key.to_string(),
            };
            let err = Error::BreakerTripped {
                breaker: Breaker::NamesPerEndpoint,
                limit: self.config.max_names_per_endpoint,
                name,
            };
            self.warn(now, &err);
            return Err(err);
        }
        let (idx, is_new) = match found {
            Ok(idx) => (idx, false),
            Err(key) => {
                let inserted = match prepared {
                    Some(Prepared { labels }) => {
                        let labels = labels.unwrap_or_else(|| self.selection.labels_for(&key));
                        let labels = self.cache.share(labels);
                        self.cache.names.insert_unindexed(&key, labels)
                    }
                    None => {
                        let labels = self.cache.share(self.selection.labels_for(&key));
                        self.cache.names.insert(&key, labels)
                    }
                };
                let Some(idx) = inserted else {
                    // 2³² names at once: far past any `max_cache_entries`.
                    return Err(Error::BreakerTripped {
                        breaker: Breaker::CacheEntries,
                        limit: u32::MAX as usize,
                        name: key.to_string(),
                    });
                };
                (idx, true)
            }
        };
        let mut learned = Learned::default();
        let mut tripped = None;
        let learning = self.learn_addrs(idx, addrs, expires, now, ipcache, &mut learned);
        if let Err(e) = learning {
            self.drop_if_empty(idx, is_new, ipcache)?;
            *kept = self.cache.names.get(idx).is_some().then_some(idx);
            return Err(e);
        }
        if let Ok(Some(trip)) = learning {
            tripped = Some(trip);
        }
        if let Some((breaker, limit)) = tripped {
            if breaker == Breaker::IpsPerName {
                self.stats.breaker_trips += 1;
                self.stats.trips.ips_per_name += 1;
            }
            let name = self
                .cache
                .names
                .get(idx)
                .map(|e| self.cache.names.text(e).to_owned())
                .unwrap_or_default();
            let err = Error::BreakerTripped {
                breaker,
                limit,
                name,
            };
            self.warn(now, &err);
        }
        if self.cache.names.get(idx).is_some_and(|e| e.holds() > 0) {
            self.cache.record_endpoint(idx, endpoint, expires);
        } else {
            // Nothing was learned for a new name: do not keep an empty entry.
            self.drop_if_empty(idx, is_new, ipcache)?;
        }
        *kept = self.cache.names.get(idx).is_some().then_some(idx);
        Ok(learned)
    }

    /// Learns `addrs` for the name at `idx` (see [`NameManager::observe`]); returns the
    /// breaker that refused some of them, if any.
    fn learn_addrs<D: Datapath>(
        &mut self,
        idx: NameIdx,
        addrs: &[IpAddr],
        expires: Secs,
        now: Duration,
        ipcache: &mut IpCache<D>,
        learned: &mut Learned,
    ) -> Result<Option<(Breaker, usize)>, Error> {
        let mut tripped = None;
        let DnsCache { names, ips, .. } = &mut self.cache;
        let Some(entry) = names.get_mut(idx) else {
            return Ok(None);
        };
        if !addrs.is_empty() {
            entry.last_lookup = secs(now);
        }
        if entry.holds() == 0 {
            // A new name: its list grows once, not step by step.
            entry
                .ips
                .reserve(addrs.len().min(self.config.max_ips_per_name));
        }
        for &addr in addrs {
            let at = match entry.find(addr) {
                Ok(at) => {
                    let mapping = &mut entry.ips[at];
                    if mapping.zombie {
                        mapping.zombie = false;
                        mapping.expires = expires;
                        entry.count_zombie(false);
                        self.zombies -= 1;
                        learned.revived += 1;
                    } else if expires > mapping.expires {
                        mapping.expires = expires;
                        learned.refreshed += 1;
                    }
                    continue;
                }
                Err(at) => at,
            };
            if entry.holds() >= self.config.max_ips_per_name {
                learned.rejected += 1;
                tripped = Some((Breaker::IpsPerName, self.config.max_ips_per_name));
                continue;
            }
            if self.entries >= self.config.max_cache_entries {
                // The global bound: no new mapping, whatever the endpoint or the name.
                learned.rejected += 1;
                self.stats.breaker_trips += 1;
                self.stats.trips.cache_entries += 1;
                tripped = Some((Breaker::CacheEntries, self.config.max_cache_entries));
                continue;
            }
            if entry.live() >= self.config.max_ips_per_hostname {
                let oldest = entry
                    .ips
                    .iter_mut()
                    .filter(|m| !m.zombie)
                    .min_by_key(|m| m.expires);
                match oldest {
                    Some(m) if m.expires < expires => {
                        m.zombie = true;
                        m.expires = secs(now);
                        entry.count_zombie(true);
                        self.zombies += 1;
                    }
                    _ => {
                        learned.capped += 1;
                        continue;
                    }
                }
            }
            if !entry.labels.is_empty() {
                let owner = owner_of(entry, ipcache)?;
                let upserted = match &mut self.deferred {
                    Some(claims) => {
                        claims.push(addr, owner, &entry.labels);
                        Ok(())
                    }
                    None => {
                        ipcache.upsert_metadata(host_prefix(addr), owner, entry.labels.clone(), now)
                    }
                };
                match upserted {
                    Ok(()) => {}
                    Err(fqdnd_ipcache::Error::BreakerTripped { .. }) => {
                        learned.rejected += 1;
                        self.stats.breaker_trips += 1;
                        self.stats.trips.fqdn_identities += 1;
                        continue;
                    }
                    Err(fqdnd_ipcache::Error::DatapathFull { .. }) => {
                        // Counted by the IpCache (a datapath capacity, not a breaker).
                        learned.rejected += 1;
                        self.stats.trips.datapath_full += 1;
                        continue;
                    }
                    Err(err) => return Err(err.into()),
                }
            }
            entry.ips.insert(
                at,
                Mapping {
                    addr,
                    expires,
                    zombie: false,
                },
            );
            if self.deferred.is_none() {
                // A restore counts every address once at the end.
                ips.link(addr);
            }
            self.entries += 1;
            learned.new += 1;
            self.stats.new_mappings += 1;
        }
        Ok(tripped)
    }

    /// Removes the new name at `idx` if it holds nothing (and gives up its IpCache owner).
    fn drop_if_empty<D: Datapath>(
        &mut self,
        idx: NameIdx,
        is_new: bool,
        ipcache: &mut IpCache<D>,
    ) -> Result<(), Error> {
        if !is_new || self.cache.names.get(idx).is_none_or(|e| e.holds() > 0) {
            return Ok(());
        }
        if let Some(entry) = self.cache.names.remove(idx)
            && let Some(owner) = entry.owner
        {
            ipcache.remove_owner(owner)?;
        }
        Ok(())
    }

    /// Makes `selectors` the FQDN selectors in force. Every cached name that an added or
    /// removed selector matches is relabelled in `ipcache` (the caller commits).
    pub fn set_selectors<D: Datapath>(
        &mut self,
        selectors: &[FqdnSelector],
        now: Duration,
        ipcache: &mut IpCache<D>,
    ) -> Result<(), Error> {
        let wanted: HashMap<&str, &FqdnSelector> = selectors.iter().map(|s| (s.key(), s)).collect();
        let mut changed: Vec<FqdnSelector> = Vec::new();
        let gone: Vec<String> = self
            .by_key
            .keys()
            .filter(|k| !wanted.contains_key(k.as_str()))
            .cloned()
            .collect();
        let selection = Arc::make_mut(&mut self.selection);
        for key in gone {
            if let Some(id) = self.by_key.remove(&key)
                && let Some(reg) = selection.selectors.remove(&id)
            {
                selection.matcher.remove(&reg.selector, id);
                changed.push(reg.selector);
            }
        }
        for (key, selector) in wanted {
            if self.by_key.contains_key(key) {
                continue;
            }
            let id = SelectorId(self.next_selector);
            self.next_selector = self.next_selector.wrapping_add(1);
            let label = ipcache.fqdn_label(key);
            selection.matcher.insert(selector, id);
            selection.selectors.insert(
                id,
                Registered {
                    selector: selector.clone(),
                    label,
                },
            );
            self.by_key.insert(key.to_owned(), id);
            changed.push(selector.clone());
        }
        if changed.is_empty() {
            return Ok(());
        }
        let DnsCache {
            names,
            label_sets: shared,
            ..
        } = &mut self.cache;
        for (_, name, entry) in names.iter_mut() {
            if !changed.iter().any(|s| s.matches(name)) {
                continue;
            }
            let labels = self.selection.labels_for(name);
            if labels == *entry.labels {
                continue;
            }
            let labels = shared
                .entry(labels)
                .or_insert_with_key(|l| Arc::new(l.clone()))
                .clone();
            for i in 0..entry.ips.len() {
                let prefix = host_prefix(entry.ips[i].addr);
                let result = if labels.is_empty() {
                    match entry.owner {
                        Some(owner) => ipcache.remove_metadata(prefix, owner),
                        None => Ok(()),
                    }
                } else {
                    owner_of(entry, ipcache).and_then(|owner| {
                        ipcache.upsert_metadata(prefix, owner, labels.clone(), now)
                    })
                };
                match result {
                    Ok(()) => {}
                    Err(fqdnd_ipcache::Error::BreakerTripped { .. }) => {
                        self.stats.breaker_trips += 1
                    }
                    Err(err) => return Err(err.into()),
                }
            }
            entry.labels = labels;
        }
        self.cache.forget_unused_label_sets();
        Ok(())
    }

    /// Expires mappings whose TTL ran out, keeps as zombies those whose IP `connections`
    /// reports in use, releases the rest, and caps the zombies. The caller commits.
    pub fn gc<D: Datapath>(
        &mut self,
        now: Duration,
        connections: &impl Connections,
        ipcache: &mut IpCache<D>,
    ) -> Result<GcStats, Error> {
        self.stats.gc_runs += 1;
        let now_s = secs(now);
        let mut stats = GcStats::default();
        // Sized up front (virtual memory; pages are touched as used): growing these while
        // the pass frees thousands of small blocks makes the allocator consolidate its free
        // lists on every regrowth.
        // Each released address, its name, and the IpCache claim the name had on it (its
        // owner, if the name carries labels: read while the name is at hand).
        let mut released: Vec<(IpAddr, NameIdx, Option<OwnerId>)> =
            Vec::with_capacity(self.entries);
        let mut empty: Vec<NameIdx> = Vec::with_capacity(self.cache.names.len());
        // Endpoint records dropped (lapsed, or with their name), counted per endpoint and
        // taken off the per-endpoint counts once at the end.
        let mut dropped: SmallVec<[(EndpointId, usize); 4]> = SmallVec::new();
        let mut drop_record =
            |endpoint: EndpointId| match dropped.iter_mut().find(|(ep, _)| *ep == endpoint) {
                Some((_, n)) => *n += 1,
                None => dropped.push((endpoint, 1)),
            };
        for (idx, entry) in self.cache.names.entries_mut() {
            entry.endpoints.expire(now_s, &mut drop_record);
            let claim = entry.owner.filter(|_| !entry.labels.is_empty());
            let mut zombies_changed = false;
            entry.ips.retain(|m| {
                if m.zombie {
                    if connections.in_use(m.addr) {
                        return true;
                    }
                    self.zombies -= 1;
                    zombies_changed = true;
                    released.push((m.addr, idx, claim));
                    return false;
                }
                if m.expires > now_s {
                    return true;
                }
                stats.expired += 1;
                if connections.in_use(m.addr) {
                    m.zombie = true;
                    self.zombies += 1;
                    zombies_changed = true;
                    true
                } else {
                    released.push((m.addr, idx, claim));
                    false
                }
            });
            if zombies_changed {
                entry.recount_zombies();
            }
            if entry.ips.is_empty() {
                empty.push(idx);
            }
        }
        if self.zombies > self.config.max_zombies {
            let mut all: Vec<(Secs, &str, IpAddr, NameIdx)> = self
                .cache
                .names
                .iter()
                .flat_map(|(idx, name, e)| {
                    e.ips
                        .iter()
                        .filter(|m| m.zombie)
                        .map(move |m| (m.expires, name, m.addr, idx))
                })
                .collect();
            all.sort_unstable_by(|a, b| {
                a.0.cmp(&b.0)
                    .then_with(|| a.1.cmp(b.1))
                    .then_with(|| a.2.cmp(&b.2))
            });
            let excess = self.zombies - self.config.max_zombies;
            let over: Vec<(IpAddr, NameIdx)> = all
                .into_iter()
                .take(excess)
                .map(|(_, _, addr, idx)| (addr, idx))
                .collect();
            for &(addr, idx) in &over {
                if let Some(entry) = self.cache.names.get_mut(idx)
                    && let Ok(at) = entry.find(addr)
                {
                    entry.ips.remove(at);
                    entry.count_zombie(false);
                    if entry.ips.is_empty() {
                        empty.push(idx);
                    }
                    let claim = entry.owner.filter(|_| !entry.labels.is_empty());
                    released.push((addr, idx, claim));
                }
            }
            stats.over_cap += over.len();
            self.zombies -= excess;
            tracing::warn!(
                limit = self.config.max_zombies,
                released = excess,
                "zombie cap reached: releasing the oldest IPs still in use; raise maxDeferredConnectionDeletes"
            );
        }
        // In address order, the IpCache's ordered maps are walked front to back instead of at
        // random: several times faster for large passes.
        released.sort_unstable();
        ipcache.reserve(released.len());
        let claims = released
            .iter()
            .filter_map(|&(addr, _, owner)| Some((host_prefix(addr), owner?)));
        ipcache.remove_metadata_many(claims, released.len())?;
        stats.released = released.len();
        self.entries -= released.len();
        self.stats.gc_releases += released.len() as u64;
        // Names left without mappings go, with their endpoint records and their IpCache owner.
        let mut owners: Vec<OwnerId> = Vec::with_capacity(empty.len());
        self.cache.names.remove_many(&empty, |entry| {
            for (endpoint, _) in entry.endpoints.iter() {
                drop_record(endpoint);
            }
            owners.extend(entry.owner);
        });
        for (endpoint, n) in dropped {
            DnsCache::forget_endpoints(&mut self.cache.endpoint_names, endpoint, n);
        }
        // The per-IP counts: unlinked one by one, or counted again from what is left when
        // that is less than what went.
        if released.len() > self.entries {
            let kept = self.cache.names.entries().flat_map(|e| e.ips.iter());
            self.cache.ips.rebuild(kept.map(|m| m.addr), self.entries);
        } else {
            for (addr, _, _) in &released {
                self.cache.ips.unlink(*addr);
            }
        }
        ipcache.remove_owners(&owners)?;
        stats.names_removed = empty.len();
        self.cache.forget_unused_label_sets();
        Ok(stats)
    }

    /// Every mapping, live and zombie, name by name, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = CacheEntry<'_>> + '_ {
        self.cache.names.iter().flat_map(|(_, name, e)| {
            e.ips.iter().map(move |m| CacheEntry {
                name,
                ip: m.entry(),
                zombie: m.zombie,
                last_lookup: e.last_lookup,
            })
        })
    }

    /// Every cached name, with its endpoints and mappings, in no particular order (for a
    /// snapshot: no lookup per name).
    pub fn cached_names(&self) -> impl Iterator<Item = CachedName<'_>> + '_ {
        (self.cache.names.iter()).map(|(_, name, entry)| CachedName { name, entry })
    }

    /// The names `addr` is known under, live or zombie (a scan of the cache: for tests and
    /// listings, not for a per-answer path).
    pub fn names_of(&self, addr: IpAddr) -> Vec<&str> {
        self.cache
            .names
            .iter()
            .filter(|(_, _, e)| e.find(addr).is_ok())
            .map(|(_, name, _)| name)
            .collect()
    }

    /// The names behind the IpCache owners this NameManager registered (without a name:
    /// see `IpCache::add_owner_without_name`), for listings.
    pub fn owner_names(&self) -> HashMap<OwnerId, &str> {
        self.cache
            .names
            .iter()
            .filter_map(|(_, name, e)| Some((e.owner?, name)))
            .collect()
    }

    /// The endpoints that looked `name` up and have it live, for listings.
    pub fn endpoints_of(&self, name: &str) -> Vec<EndpointId> {
        self.cache
            .names
            .find(name)
            .and_then(|idx| self.cache.names.get(idx))
            .map(|e| e.endpoints.iter().map(|(ep, _)| ep).collect())
            .unwrap_or_default()
    }

    /// Names live for `endpoint`.
    pub fn endpoint_name_count(&self, endpoint: EndpointId) -> usize {
        self.cache
            .endpoint_names
            .get(&endpoint)
            .copied()
            .unwrap_or(0)
    }

    /// Names in the cache.
    pub fn name_count(&self) -> usize {
        self.cache.names.len()
    }

    /// (name, IP) mappings in the cache, zombies included.
    pub fn mapping_count(&self) -> usize {
        self.entries
    }

    /// Zombies in the cache.
    pub fn zombie_count(&self) -> usize {
        self.zombies
    }

    /// Distinct IPs in the cache.
    pub fn ip_count(&self) -> usize {
        self.cache.ips.len()
    }

    /// The selectors in force.
    pub fn selectors(&self) -> impl Iterator<Item = &FqdnSelector> + '_ {
        self.selection.selectors.values().map(|r| &r.selector)
    }

    /// Whether any selector matches the canonical `name`.
    pub fn is_selected(&self, name: &str) -> bool {
        self.selection.matcher.is_match(name)
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The settings it runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    fn warn(&mut self, now: Duration, err: &Error) {
        if self
            .last_warning
            .is_none_or(|last| now.saturating_sub(last) >= WARNING_INTERVAL)
        {
            self.last_warning = Some(now);
            tracing::warn!(error = %err, trips = self.stats.breaker_trips, "circuit breaker tripped");
        }
    }
}
