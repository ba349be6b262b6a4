//! The NameManager: learns (name, IP) mappings from DNS answers, keeps them with their TTLs,
//! and labels each IP in the IpCache with the `fqdn:` labels of the selectors matching its
//! name, under one resource owner per DNS name.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use fqdnd_ipcache::{Datapath, EndpointId, IpCache, LabelId, LabelSet, host_prefix};
use smallvec::SmallVec;

use crate::cache::{DnsCache, IpEntry, NameEntry, Secs};
use crate::config::Config;
use crate::error::{Breaker, Error};
use crate::matcher::{Matcher, SelectorId};
use crate::name::DnsName;
use crate::pattern::FqdnSelector;

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

/// One mapping, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// The name.
    pub name: Arc<str>,
    /// The address and its expiry (seconds on the caller's clock).
    pub ip: IpEntry,
    /// Whether it is a zombie (expired or evicted, kept because in use).
    pub zombie: bool,
    /// When the name was last answered.
    pub last_lookup: u32,
}

#[derive(Debug)]
struct Registered {
    selector: FqdnSelector,
    label: LabelId,
}

/// The NameManager.
#[derive(Debug)]
pub struct NameManager {
    config: Config,
    matcher: Matcher,
    selectors: HashMap<SelectorId, Registered>,
    by_key: HashMap<String, SelectorId>,
    next_selector: u32,
    cache: DnsCache,
    endpoint_names: HashMap<EndpointId, HashMap<Arc<str>, Secs>>,
    zombies: usize,
    /// (name, IP) mappings held, live and zombie: what `max_cache_entries` bounds.
    entries: usize,
    stats: Stats,
    last_warning: Option<Duration>,
}

/// Where `addr` is, or would go, in a list kept sorted by address.
fn find(list: &[IpEntry], addr: IpAddr) -> Result<usize, usize> {
    list.binary_search_by_key(&addr, |e| e.addr)
}

/// Inserts into a list kept sorted by address (the caller checked `addr` is absent).
fn insert<A: smallvec::Array<Item = IpEntry>>(list: &mut SmallVec<A>, entry: IpEntry) {
    let at = find(list, entry.addr).unwrap_or_else(|at| at);
    list.insert(at, entry);
}

fn secs(now: Duration) -> Secs {
    u32::try_from(now.as_secs()).unwrap_or(u32::MAX)
}

fn labels_for(
    matcher: &Matcher,
    selectors: &HashMap<SelectorId, Registered>,
    name: &str,
) -> LabelSet {
    let mut labels = LabelSet::new();
    matcher.for_each_match(name, |id| {
        if let Some(reg) = selectors.get(&id) {
            labels.insert(reg.label);
        }
    });
    labels
}

impl NameManager {
    /// An empty NameManager.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            matcher: Matcher::new(),
            selectors: HashMap::new(),
            by_key: HashMap::new(),
            next_selector: 0,
            cache: DnsCache::default(),
            endpoint_names: HashMap::new(),
            zombies: 0,
            entries: 0,
            stats: Stats::default(),
            last_warning: None,
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
        self.stats.answers += 1;
        // A name already in the cache was validated when it was stored: look it up as given
        // (the proxy hands over canonical names) before paying for parsing and allocation.
        let cached = self
            .cache
            .names
            .get_key_value(name)
            .map(|(key, _)| key.clone());
        let (key, is_new) = match cached {
            Some(key) => (key, false),
            None => {
                let parsed = DnsName::parse(name).map_err(|source| {
                    self.stats.invalid_names += 1;
                    Error::InvalidName {
                        name: name.to_owned(),
                        source,
                    }
                })?;
                match self.cache.names.get_key_value(parsed.as_str()) {
                    Some((key, _)) => (key.clone(), false),
                    None => (parsed.as_arc().clone(), true),
                }
            }
        };
        let expires = secs(now).saturating_add(ttl.max(self.config.min_ttl));

        let ep_names = self.endpoint_names.entry(endpoint).or_default();
        if !ep_names.contains_key(&*key) && ep_names.len() >= self.config.max_names_per_endpoint {
            self.stats.breaker_trips += 1;
            self.stats.trips.names_per_endpoint += 1;
            let err = Error::BreakerTripped {
                breaker: Breaker::NamesPerEndpoint,
                limit: self.config.max_names_per_endpoint,
                name: key.to_string(),
            };
            self.warn(now, &err);
            return Err(err);
        }
        if is_new {
            let labels = self
                .cache
                .share(labels_for(&self.matcher, &self.selectors, &key));
            self.cache
                .names
                .insert(key.clone(), NameEntry::new(key.clone(), labels));
        }
        let mut learned = Learned::default();
        let mut tripped = None;
        for &addr in addrs {
            let Some(entry) = self.cache.names.get_mut(&key) else {
                break;
            };
            entry.last_lookup = secs(now);
            if let Ok(at) = find(&entry.live, addr) {
                let live = &mut entry.live[at];
                if expires > live.expires {
                    live.expires = expires;
                    learned.refreshed += 1;
                }
                continue;
            }
            if let Ok(at) = find(&entry.zombies, addr) {
                entry.zombies.remove(at);
                self.zombies -= 1;
                insert(&mut entry.live, IpEntry { addr, expires });
                learned.revived += 1;
                continue;
            }
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
            if entry.live.len() >= self.config.max_ips_per_hostname {
                let oldest = entry
                    .live
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, e)| e.expires)
                    .map(|(i, e)| (i, *e));
                match oldest {
                    Some((at, e)) if e.expires < expires => {
                        entry.live.remove(at);
                        insert(
                            &mut entry.zombies,
                            IpEntry {
                                addr: e.addr,
                                expires: secs(now),
                            },
                        );
                        self.zombies += 1;
                    }
                    _ => {
                        learned.capped += 1;
                        continue;
                    }
                }
            }
            if !entry.labels.is_empty() {
                match ipcache.upsert_metadata(
                    host_prefix(addr),
                    &entry.owner,
                    entry.labels.clone(),
                    now,
                ) {
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
            insert(&mut entry.live, IpEntry { addr, expires });
            self.cache.link(addr, &key);
            self.entries += 1;
            learned.new += 1;
            self.stats.new_mappings += 1;
        }
        if let Some((breaker, limit)) = tripped {
            if breaker == Breaker::IpsPerName {
                self.stats.breaker_trips += 1;
                self.stats.trips.ips_per_name += 1;
            }
            let err = Error::BreakerTripped {
                breaker,
                limit,
                name: key.to_string(),
            };
            self.warn(now, &err);
        }
        match self.cache.names.get(&key) {
            Some(entry) if entry.holds() > 0 => {
                let record = self
                    .endpoint_names
                    .entry(endpoint)
                    .or_default()
                    .entry(key)
                    .or_insert(0);
                *record = (*record).max(expires);
            }
            _ => {
                // Nothing was learned for a new name: do not keep an empty entry.
                self.cache.names.remove(&key);
            }
        }
        Ok(learned)
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
        for key in gone {
            if let Some(id) = self.by_key.remove(&key)
                && let Some(reg) = self.selectors.remove(&id)
            {
                self.matcher.remove(&reg.selector, id);
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
            self.matcher.insert(selector, id);
            self.selectors.insert(
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
        for (name, entry) in names.iter_mut() {
            if !changed.iter().any(|s| s.matches(name)) {
                continue;
            }
            let labels = labels_for(&self.matcher, &self.selectors, name);
            if labels == *entry.labels {
                continue;
            }
            let labels = shared
                .entry(labels)
                .or_insert_with_key(|l| Arc::new(l.clone()))
                .clone();
            for ip in entry.live.iter().chain(&entry.zombies) {
                let prefix = host_prefix(ip.addr);
                let result = if labels.is_empty() {
                    ipcache.remove_metadata(prefix, &entry.owner)
                } else {
                    ipcache.upsert_metadata(prefix, &entry.owner, labels.clone(), now)
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
        let mut released: Vec<(Arc<str>, IpAddr)> = Vec::new();
        let mut dead_zombies = 0;
        for (name, entry) in &mut self.cache.names {
            entry.zombies.retain(|z| {
                let keep = connections.in_use(z.addr);
                if !keep {
                    released.push((name.clone(), z.addr));
                    dead_zombies += 1;
                }
                keep
            });
            let NameEntry { live, zombies, .. } = entry;
            let before = zombies.len();
            live.retain(|e| {
                if e.expires > now_s {
                    return true;
                }
                stats.expired += 1;
                if connections.in_use(e.addr) {
                    zombies.push(*e);
                } else {
                    released.push((name.clone(), e.addr));
                }
                false
            });
            if zombies.len() > before {
                self.zombies += zombies.len() - before;
                zombies.sort_unstable_by_key(|z| z.addr);
            }
        }
        self.zombies -= dead_zombies;
        if self.zombies > self.config.max_zombies {
            let mut all: Vec<(Secs, Arc<str>, IpAddr)> = self
                .cache
                .names
                .iter()
                .flat_map(|(n, e)| {
                    e.zombies
                        .iter()
                        .map(move |z| (z.expires, n.clone(), z.addr))
                })
                .collect();
            all.sort_unstable_by(|a, b| {
                a.0.cmp(&b.0)
                    .then_with(|| a.1.cmp(&b.1))
                    .then_with(|| a.2.cmp(&b.2))
            });
            let excess = self.zombies - self.config.max_zombies;
            for (_, name, addr) in all.into_iter().take(excess) {
                if let Some(entry) = self.cache.names.get_mut(&name) {
                    entry.zombies.retain(|z| z.addr != addr);
                }
                released.push((name, addr));
                stats.over_cap += 1;
            }
            self.zombies -= excess;
            tracing::warn!(
                limit = self.config.max_zombies,
                released = excess,
                "zombie cap reached: releasing the oldest IPs still in use; raise maxDeferredConnectionDeletes"
            );
        }
        // In address order, the IpCache's and the reverse index's ordered maps are walked
        // front to back instead of at random: several times faster for large passes.
        released.sort_unstable_by_key(|(_, addr)| *addr);
        for (name, addr) in &released {
            if let Some(entry) = self.cache.names.get(name).filter(|e| !e.labels.is_empty()) {
                ipcache.remove_metadata(host_prefix(*addr), &entry.owner)?;
            }
            self.cache.unlink(*addr, name);
        }
        stats.released = released.len();
        self.entries -= released.len();
        self.stats.gc_releases += released.len() as u64;
        let before = self.cache.names.len();
        self.cache.names.retain(|_, e| e.holds() > 0);
        self.cache.forget_unused_label_sets();
        stats.names_removed = before - self.cache.names.len();
        for names in self.endpoint_names.values_mut() {
            names.retain(|_, expires| *expires > now_s);
        }
        self.endpoint_names.retain(|_, names| !names.is_empty());
        Ok(stats)
    }

    /// Every mapping, live and zombie, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = CacheEntry> + '_ {
        self.cache.names.iter().flat_map(|(name, e)| {
            let live = e.live.iter().map(move |ip| (ip, false));
            let zombies = e.zombies.iter().map(move |ip| (ip, true));
            live.chain(zombies).map(move |(ip, zombie)| CacheEntry {
                name: name.clone(),
                ip: *ip,
                zombie,
                last_lookup: e.last_lookup,
            })
        })
    }

    /// The names `addr` is known under.
    pub fn names_of(&self, addr: IpAddr) -> &[Arc<str>] {
        self.cache
            .reverse
            .get(&addr)
            .map_or(&[], |names| names.as_slice())
    }

    /// The endpoints that looked `name` up and have it live, for listings.
    pub fn endpoints_of(&self, name: &str) -> Vec<EndpointId> {
        let mut eps: Vec<EndpointId> = self
            .endpoint_names
            .iter()
            .filter(|(_, names)| names.contains_key(name))
            .map(|(ep, _)| *ep)
            .collect();
        eps.sort();
        eps
    }

    /// Names live for `endpoint`.
    pub fn endpoint_name_count(&self, endpoint: EndpointId) -> usize {
        self.endpoint_names.get(&endpoint).map_or(0, HashMap::len)
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
        self.cache.reverse.len()
    }

    /// The selectors in force.
    pub fn selectors(&self) -> impl Iterator<Item = &FqdnSelector> + '_ {
        self.selectors.values().map(|r| &r.selector)
    }

    /// Whether any selector matches the canonical `name`.
    pub fn is_selected(&self, name: &str) -> bool {
        self.matcher.is_match(name)
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
