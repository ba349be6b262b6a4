//! The DNS cache: name → IPs with expiry, the zombies among them, the endpoints that asked,
//! and how many names hold each IP.
//!
//! One mapping per (name, IP). A mapping is *live* until its expiry; then, or when the name's
//! IP cap evicts it, it becomes a *zombie* and stays only while the datapath reports the IP
//! in use. Times are whole seconds on the caller's clock.
//!
//! Layout, for a million names in a few hundred bytes each: names live in a slab and are
//! referred to by their slot ([`NameIdx`]); the name → slot index is a hash table of slots
//! (the name is stored once, in the slab); a name's mappings, live and zombie, are one list
//! sorted by address; the endpoints that asked a name are kept with it. Which names hold an
//! IP is not indexed (only how many, per address family): nothing on the answer or GC path
//! needs the names of an IP.

use std::collections::{BTreeMap, HashMap, btree_map};
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Arc;

use fqdnd_ipcache::{EndpointId, LabelSet, OwnerId};
use hashbrown::{DefaultHashBuilder, HashTable};
use smallvec::SmallVec;

/// Seconds on the caller's clock.
pub(crate) type Secs = u32;

/// One (name, IP) mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpEntry {
    /// The address.
    pub addr: IpAddr,
    /// When the answer that taught it expires (live), or expired/was evicted (zombie).
    pub expires: Secs,
}

/// A mapping as a name keeps it: [`IpEntry`] and whether it is a zombie, in 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub(crate) addr: IpAddr,
    pub(crate) expires: Secs,
    pub(crate) zombie: bool,
}

impl Mapping {
    pub(crate) fn entry(self) -> IpEntry {
        IpEntry {
            addr: self.addr,
            expires: self.expires,
        }
    }
}

/// A name's slot in the cache; valid while the name is cached (slots are reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct NameIdx(u32);

impl NameIdx {
    fn at(self) -> usize {
        self.0 as usize
    }
}

/// The endpoints that looked a name up, each with when its record lapses, sorted: one kept
/// inline (the common case: a gateway's client group, a pod), more in a list of their own.
#[derive(Debug, Default)]
pub(crate) enum Endpoints {
    #[default]
    None,
    One(EndpointId, Secs),
    #[allow(
        clippy::box_collection,
        reason = "eight bytes in every name instead of 24; few names have several endpoints"
    )]
    Many(Box<Vec<(EndpointId, Secs)>>),
}

impl Endpoints {
    pub(crate) fn iter(&self) -> impl Iterator<Item = (EndpointId, Secs)> + '_ {
        let (one, many) = match self {
            Self::None => (None, &[][..]),
            Self::One(ep, expires) => (Some((*ep, *expires)), &[][..]),
            Self::Many(list) => (None, list.as_slice()),
        };
        one.into_iter().chain(many.iter().copied())
    }

    pub(crate) fn contains(&self, endpoint: EndpointId) -> bool {
        match self {
            Self::None => false,
            Self::One(ep, _) => *ep == endpoint,
            Self::Many(list) => list.binary_search_by_key(&endpoint, |(ep, _)| *ep).is_ok(),
        }
    }

    /// Records `endpoint` until `expires` at least; whether it is a new record.
    pub(crate) fn record(&mut self, endpoint: EndpointId, expires: Secs) -> bool {
        match self {
            Self::None => {
                *self = Self::One(endpoint, expires);
                true
            }
            Self::One(ep, until) if *ep == endpoint => {
                *until = (*until).max(expires);
                false
            }
            Self::One(ep, until) => {
                let mut list = vec![(*ep, *until), (endpoint, expires)];
                list.sort_unstable_by_key(|(ep, _)| *ep);
                *self = Self::Many(Box::new(list));
                true
            }
            Self::Many(list) => match list.binary_search_by_key(&endpoint, |(ep, _)| *ep) {
                Ok(at) => {
                    list[at].1 = list[at].1.max(expires);
                    false
                }
                Err(at) => {
                    list.insert(at, (endpoint, expires));
                    true
                }
            },
        }
    }

    /// Drops the records lapsed at `now`, handing each to `lapsed`.
    pub(crate) fn expire(&mut self, now: Secs, mut lapsed: impl FnMut(EndpointId)) {
        match self {
            Self::None => {}
            Self::One(ep, until) => {
                if *until <= now {
                    lapsed(*ep);
                    *self = Self::None;
                }
            }
            Self::Many(list) => {
                list.retain(|(ep, until)| {
                    let keep = *until > now;
                    if !keep {
                        lapsed(*ep);
                    }
                    keep
                });
                match list.len() {
                    0 => *self = Self::None,
                    1 => *self = Self::One(list[0].0, list[0].1),
                    _ => {}
                }
            }
        }
    }
}

/// What the cache holds for one name, in 80 bytes.
#[derive(Debug)]
pub(crate) struct NameEntry {
    /// The canonical name.
    pub(crate) name: Arc<str>,
    /// The `fqdn:` labels of the selectors matching this name (one shared copy per set).
    pub(crate) labels: Arc<LabelSet>,
    /// Live and zombie mappings, sorted by address (an address is in at most once).
    pub(crate) ips: SmallVec<[Mapping; 1]>,
    /// Endpoints that looked the name up.
    pub(crate) endpoints: Endpoints,
    /// This name's resource owner in the IpCache, registered when it first labels an IP.
    pub(crate) owner: Option<OwnerId>,
    /// When this name was last answered.
    pub(crate) last_lookup: Secs,
}

impl NameEntry {
    pub(crate) fn new(name: Arc<str>, labels: Arc<LabelSet>) -> Self {
        Self {
            name,
            labels,
            ips: SmallVec::new(),
            endpoints: Endpoints::None,
            owner: None,
            last_lookup: 0,
        }
    }

    /// Mappings held, live and zombie.
    pub(crate) fn holds(&self) -> usize {
        self.ips.len()
    }

    /// Live mappings (a scan: only when the name gains an IP).
    pub(crate) fn live(&self) -> usize {
        self.ips.iter().filter(|m| !m.zombie).count()
    }

    /// Where `addr` is, or would go.
    pub(crate) fn find(&self, addr: IpAddr) -> Result<usize, usize> {
        self.ips.binary_search_by_key(&addr, |m| m.addr)
    }

    /// Whether `endpoint` has a record for this name.
    pub(crate) fn asked_by(&self, endpoint: EndpointId) -> bool {
        self.endpoints.contains(endpoint)
    }
}

/// The names, by slot and by name.
#[derive(Default)]
pub(crate) struct Names {
    slots: Vec<Option<NameEntry>>,
    free: Vec<u32>,
    /// Slots, found by their name's hash.
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
}

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Names")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl Names {
    /// The slot of `name`, if cached.
    pub(crate) fn find(&self, name: &str) -> Option<NameIdx> {
        let hash = self.hasher.hash_one(name);
        let slots = &self.slots;
        self.index
            .find(hash, |&at| {
                slots
                    .get(at as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|e| *e.name == *name)
            })
            .map(|&at| NameIdx(at))
    }

    /// Adds a name the caller found absent; `None` past 2³² names.
    pub(crate) fn insert(&mut self, entry: NameEntry) -> Option<NameIdx> {
        let hash = self.hasher.hash_one(&*entry.name);
        let at = match self.free.pop() {
            Some(at) => {
                self.slots[at as usize] = Some(entry);
                at
            }
            None => {
                let at = u32::try_from(self.slots.len()).ok()?;
                self.slots.push(Some(entry));
                at
            }
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.insert_unique(hash, at, |&other| {
            slots
                .get(other as usize)
                .and_then(Option::as_ref)
                .map_or(0, |e| hasher.hash_one(&*e.name))
        });
        Some(NameIdx(at))
    }

    /// Takes out every name `gone` says to (a fraction of them at random, or most of them in
    /// one pass over the index), handing each to `each`.
    pub(crate) fn remove_many(&mut self, gone: &[NameIdx], mut each: impl FnMut(NameEntry)) {
        self.free.reserve(gone.len());
        if gone.len() < self.len() / 8 {
            for idx in gone {
                if let Some(entry) = self.remove(*idx) {
                    each(entry);
                }
            }
            return;
        }
        for idx in gone {
            if let Some(entry) = self.slots.get_mut(idx.at()).and_then(Option::take) {
                self.free.push(idx.0);
                each(entry);
            }
        }
        let slots = &self.slots;
        self.index
            .retain(|at| slots.get(*at as usize).is_some_and(Option::is_some));
    }

    /// Takes a name out.
    pub(crate) fn remove(&mut self, idx: NameIdx) -> Option<NameEntry> {
        let entry = self.slots.get_mut(idx.at())?.take()?;
        let hash = self.hasher.hash_one(&*entry.name);
        if let Ok(found) = self.index.find_entry(hash, |&at| at == idx.0) {
            found.remove();
        }
        self.free.push(idx.0);
        Some(entry)
    }

    pub(crate) fn get(&self, idx: NameIdx) -> Option<&NameEntry> {
        self.slots.get(idx.at())?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, idx: NameIdx) -> Option<&mut NameEntry> {
        self.slots.get_mut(idx.at())?.as_mut()
    }

    /// Every name, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (NameIdx, &NameEntry)> + '_ {
        self.slots.iter().enumerate().filter_map(|(at, e)| {
            let at = u32::try_from(at).ok()?;
            Some((NameIdx(at), e.as_ref()?))
        })
    }

    /// Every name, mutably, in slot order.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (NameIdx, &mut NameEntry)> + '_ {
        self.slots.iter_mut().enumerate().filter_map(|(at, e)| {
            let at = u32::try_from(at).ok()?;
            Some((NameIdx(at), e.as_mut()?))
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }
}

/// How many names hold each IP (live or zombie), per address family. Ordered maps: GC
/// releases in address order, which walks them front to back.
#[derive(Debug, Default)]
pub(crate) struct IpRefs {
    v4: BTreeMap<u32, u32>,
    v6: BTreeMap<u128, u32>,
}

impl IpRefs {
    /// One more name holds `addr`.
    pub(crate) fn link(&mut self, addr: IpAddr) {
        match addr {
            IpAddr::V4(a) => *self.v4.entry(a.to_bits()).or_insert(0) += 1,
            IpAddr::V6(a) => *self.v6.entry(a.to_bits()).or_insert(0) += 1,
        }
    }

    /// One name fewer holds `addr`.
    pub(crate) fn unlink(&mut self, addr: IpAddr) {
        fn down<K: Ord>(map: &mut BTreeMap<K, u32>, key: K) {
            if let btree_map::Entry::Occupied(mut refs) = map.entry(key) {
                *refs.get_mut() -= 1;
                if *refs.get() == 0 {
                    refs.remove();
                }
            }
        }
        match addr {
            IpAddr::V4(a) => down(&mut self.v4, a.to_bits()),
            IpAddr::V6(a) => down(&mut self.v6, a.to_bits()),
        }
    }

    /// Distinct IPs held.
    pub(crate) fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }
}

/// The cache.
#[derive(Debug, Default)]
pub(crate) struct DnsCache {
    /// One shared copy of each label set names carry (few: one per selector combination).
    pub(crate) label_sets: HashMap<LabelSet, Arc<LabelSet>>,
    pub(crate) names: Names,
    pub(crate) ips: IpRefs,
    /// Names each endpoint has a record for (what `max_names_per_endpoint` bounds).
    pub(crate) endpoint_names: HashMap<EndpointId, usize>,
}

impl DnsCache {
    /// The shared copy of `labels`.
    pub(crate) fn share(&mut self, labels: LabelSet) -> Arc<LabelSet> {
        self.label_sets
            .entry(labels)
            .or_insert_with_key(|l| Arc::new(l.clone()))
            .clone()
    }

    /// Forgets label sets no name carries any more.
    pub(crate) fn forget_unused_label_sets(&mut self) {
        self.label_sets
            .retain(|_, shared| Arc::strong_count(shared) > 1);
    }

    /// Records that `endpoint` looked up the name at `idx`, its record lasting until
    /// `expires` at least.
    pub(crate) fn record_endpoint(&mut self, idx: NameIdx, endpoint: EndpointId, expires: Secs) {
        if let Some(entry) = self.names.get_mut(idx)
            && entry.endpoints.record(endpoint, expires)
        {
            *self.endpoint_names.entry(endpoint).or_insert(0) += 1;
        }
    }

    /// One endpoint record fewer for `endpoint`.
    pub(crate) fn forget_endpoint(
        endpoint_names: &mut HashMap<EndpointId, usize>,
        endpoint: EndpointId,
    ) {
        if let Some(count) = endpoint_names.get_mut(&endpoint) {
            *count -= 1;
            if *count == 0 {
                endpoint_names.remove(&endpoint);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_entry_and_a_mapping_stay_small() {
        assert_eq!(size_of::<Mapping>(), 24);
        assert_eq!(size_of::<Endpoints>(), 16);
        assert_eq!(size_of::<Option<NameEntry>>(), 80);
    }

    #[test]
    fn endpoint_records_are_kept_sorted_and_expire() {
        let mut records = Endpoints::None;
        assert!(records.record(EndpointId(5), 10));
        assert!(!records.record(EndpointId(5), 20));
        assert!(records.record(EndpointId(2), 15));
        assert!(records.record(EndpointId(9), 30));
        let all: Vec<_> = records.iter().collect();
        assert_eq!(
            all,
            [
                (EndpointId(2), 15),
                (EndpointId(5), 20),
                (EndpointId(9), 30)
            ]
        );
        let mut lapsed = Vec::new();
        records.expire(20, |ep| lapsed.push(ep));
        assert_eq!(lapsed, [EndpointId(2), EndpointId(5)]);
        assert!(matches!(records, Endpoints::One(EndpointId(9), 30)));
        records.expire(30, |_| {});
        assert!(matches!(records, Endpoints::None));
    }
}
