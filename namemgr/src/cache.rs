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

use std::cmp::Ordering;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Arc;

use crate::manager::Sizes;
use crate::name::DnsName;
use fqdnd_ipcache::{Claims, EndpointId, LabelSet, OwnerId};
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

    /// Drops `endpoint`'s record; whether it had one.
    pub(crate) fn remove(&mut self, endpoint: EndpointId) -> bool {
        match self {
            Self::None => false,
            Self::One(ep, _) => {
                let had = *ep == endpoint;
                if had {
                    *self = Self::None;
                }
                had
            }
            Self::Many(list) => match list.binary_search_by_key(&endpoint, |(ep, _)| *ep) {
                Ok(at) => {
                    list.remove(at);
                    if let [(ep, until)] = list.as_slice() {
                        *self = Self::One(*ep, *until);
                    }
                    true
                }
                Err(_) => false,
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

/// Where a name's text is in [`Names`]'s arena, and (in what would be padding) how many of
/// its mappings are zombies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NameText {
    at: u32,
    len: u16,
    /// Zombies among the name's mappings; [`u16::MAX`]: that many or more (then counted).
    zombies: u16,
}

/// What the cache holds for one name, in 72 bytes (its text is in the arena).
#[derive(Debug)]
pub(crate) struct NameEntry {
    /// The canonical name.
    name: NameText,
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
    fn new(name: NameText, labels: Arc<LabelSet>) -> Self {
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

    /// Live mappings.
    pub(crate) fn live(&self) -> usize {
        match self.name.zombies {
            u16::MAX => self.ips.iter().filter(|m| !m.zombie).count(),
            zombies => self.ips.len() - usize::from(zombies),
        }
    }

    /// Counts the zombies again (after a pass that changed several).
    pub(crate) fn recount_zombies(&mut self) {
        let counted = self.ips.iter().filter(|m| m.zombie).count();
        self.name.zombies = u16::try_from(counted).unwrap_or(u16::MAX);
    }

    /// One mapping more (`true`) or fewer became a zombie.
    pub(crate) fn count_zombie(&mut self, more: bool) {
        let zombies = &mut self.name.zombies;
        *zombies = match (*zombies, more) {
            (u16::MAX, _) => {
                let counted = self.ips.iter().filter(|m| m.zombie).count();
                u16::try_from(counted).unwrap_or(u16::MAX)
            }
            (n, true) => n + 1,
            (n, false) => n.saturating_sub(1),
        };
    }

    /// Where `addr` is, or would go.
    pub(crate) fn find(&self, addr: IpAddr) -> Result<usize, usize> {
        match self.ips.last() {
            // Past the last one (a new name's sorted answer): no search.
            Some(last) if last.addr < addr => return Err(self.ips.len()),
            None => return Err(0),
            Some(_) => {}
        }
        // `IpAddr`'s order (IPv4 first, then each family by its bits), compared on the
        // family's integer: one comparison per step instead of the enum's and the octets'.
        match addr {
            IpAddr::V4(a) => {
                let key = a.to_bits();
                self.ips.binary_search_by(|m| match m.addr {
                    IpAddr::V4(b) => b.to_bits().cmp(&key),
                    IpAddr::V6(_) => Ordering::Greater,
                })
            }
            IpAddr::V6(a) => {
                let key = a.to_bits();
                self.ips.binary_search_by(|m| match m.addr {
                    IpAddr::V4(_) => Ordering::Less,
                    IpAddr::V6(b) => b.to_bits().cmp(&key),
                })
            }
        }
    }

    /// Whether `endpoint` has a record for this name.
    pub(crate) fn asked_by(&self, endpoint: EndpointId) -> bool {
        self.endpoints.contains(endpoint)
    }
}

/// The names, by slot and by name. Their text lives in one arena (no allocation per name:
/// a name costs its length, and releasing a million names frees nothing one by one); the
/// arena is compacted once more than half of it belongs to names that left.
#[derive(Default)]
pub(crate) struct Names {
    slots: Vec<Option<NameEntry>>,
    free: Vec<u32>,
    /// Slots, found by their name's hash.
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// Every cached name's text, one after the other (ASCII: names are canonical).
    text: String,
    /// Bytes of `text` no cached name uses any more.
    dead: usize,
    /// Names a restore added without indexing them (their slots), for one pass to index at
    /// its end ([`Names::index_pending`], off the restore's path); until then no lookup by
    /// name may be made.
    pending: Vec<u32>,
}

/// Room for the names of a restore to come — their slots, their text, the IpCache claims of
/// their addresses — its memory written once ahead of it: filling a million slots (72 MB)
/// otherwise takes ~18k page faults on the restore's path (40-50 ms on this project's VM),
/// the text and claims of a million one-address names as many again, which a second core can
/// take while the snapshot is still being decoded.
/// [`NameManager::adopt_room`](crate::NameManager::adopt_room) hands it to an empty cache.
pub struct RestoreRoom {
    slots: Vec<Option<NameEntry>>,
    text: String,
    pub(crate) claims: Claims,
}

impl RestoreRoom {
    /// Room for `names` names holding about `sizes` (their text, IPv4 and IPv6 addresses),
    /// written for all of it, with a sixteenth more unwritten (the journal's answers after a
    /// snapshot's). A part whose memory cannot be had is left out.
    pub fn new(names: usize, sizes: Sizes) -> Self {
        let more = |n: usize| n.saturating_add(n / 16);
        let mut slots = Vec::new();
        if slots.try_reserve_exact(more(names)).is_ok() {
            // Written, then emptied: the capacity stays, its pages mapped.
            slots.resize_with(names, || None);
            slots.clear();
        }
        let mut text = Vec::new();
        if text.try_reserve_exact(more(sizes.name_bytes)).is_ok() {
            text.resize(sizes.name_bytes, 0);
            text.clear();
        }
        Self {
            slots,
            text: String::from_utf8(text).unwrap_or_default(),
            claims: Claims::with_room(sizes.v4, sizes.v6),
        }
    }

    /// How many names it has room for.
    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// What its names may hold without growing it: bytes of text, IPv4 and IPv6 addresses.
    pub fn sizes(&self) -> Sizes {
        let [v4, v6] = self.claims.capacity();
        Sizes {
            name_bytes: self.text.capacity(),
            v4,
            v6,
        }
    }
}

impl std::fmt::Debug for RestoreRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoreRoom")
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Names")
            .field("len", &self.len())
            .field("text", &self.text.len())
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

/// The text of `name` in `arena`.
fn text_of(arena: &str, name: NameText) -> &str {
    let at = name.at as usize;
    arena
        .get(at..at + usize::from(name.len))
        .unwrap_or_default()
}

/// The hash of the name in a slot, for the index to grow by.
fn slot_hash<'a>(
    slots: &'a [Option<NameEntry>],
    hasher: &'a DefaultHashBuilder,
    arena: &'a str,
) -> impl Fn(&u32) -> u64 + 'a {
    |&at| {
        slots
            .get(at as usize)
            .and_then(Option::as_ref)
            .map_or(0, |e| hasher.hash_one(text_of(arena, e.name)))
    }
}

/// Whether `live` names in `slots` slots are few enough to reach through the index rather
/// than by a walk over every slot.
fn is_sparse(live: usize, slots: usize) -> bool {
    live < slots / 8
}

/// The arena is compacted past this many dead bytes (and more dead than live).
const COMPACT_AFTER: usize = 1 << 20;

impl Names {
    /// The name index's hasher (a restore's labelling thread compares names by it).
    pub(crate) fn hasher(&self) -> &DefaultHashBuilder {
        &self.hasher
    }

    /// The slot of `name`, if cached.
    pub(crate) fn find(&self, name: &str) -> Option<NameIdx> {
        let hash = self.hasher.hash_one(name);
        debug_assert!(
            self.pending.is_empty(),
            "a lookup with names not indexed yet"
        );
        let (slots, text) = (&self.slots, &self.text);
        self.index
            .find(hash, |&at| {
                slots
                    .get(at as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|e| text_of(text, e.name) == name)
            })
            .map(|&at| NameIdx(at))
    }

    /// The name of an entry of this cache.
    pub(crate) fn text(&self, entry: &NameEntry) -> &str {
        text_of(&self.text, entry.name)
    }

    /// Room for `more` names of `bytes` bytes in all (a restore's answers: upper bounds on
    /// its names), in the index, the slots and the text, so that none of them grows by
    /// copying (or rehashing) everything it holds, a million names over.
    pub(crate) fn reserve(&mut self, more: usize, bytes: usize) {
        let rehash = slot_hash(&self.slots, &self.hasher, &self.text);
        self.index.reserve(more, rehash);
        self.slots.reserve(more.saturating_sub(self.free.len()));
        self.text.reserve(bytes);
        self.pending.reserve(more);
    }

    /// Takes `room`'s slots if no slot was ever used, and its text if no name was ever
    /// added (else drops them).
    pub(crate) fn adopt(&mut self, room: RestoreRoom) {
        if self.slots.is_empty() && room.slots.capacity() > self.slots.capacity() {
            self.slots = room.slots;
        }
        if self.text.is_empty() && room.text.capacity() > self.text.capacity() {
            self.text = room.text;
        }
    }

    /// Adds `name` (which the caller found absent) with its labels; `None` past 2³² names,
    /// a 4 GiB arena, or a name longer than 65535 bytes.
    pub(crate) fn insert(&mut self, name: &str, labels: Arc<LabelSet>) -> Option<NameIdx> {
        let hash = self.hasher.hash_one(name);
        let idx = self.push(name, labels)?;
        let rehash = slot_hash(&self.slots, &self.hasher, &self.text);
        self.index.insert_unique(hash, idx.0, rehash);
        Some(idx)
    }

    /// [`Names::insert`] without the index's hash and insert (a cache miss in a large
    /// index), for a restore that knows no cached name is `name`: the name is indexed by
    /// [`Names::index_pending`], and no name may be looked up before.
    pub(crate) fn insert_unindexed(
        &mut self,
        name: &str,
        labels: Arc<LabelSet>,
    ) -> Option<NameIdx> {
        let idx = self.push(name, labels)?;
        self.pending.push(idx.0);
        Some(idx)
    }

    /// Indexes the names [`Names::insert_unindexed`] added. `false` if one of them was in the
    /// index already (the restore that added it was told wrongly that it was new): that slot
    /// is left out of the index, and the cache is to be emptied.
    #[must_use]
    pub(crate) fn index_pending(&mut self) -> bool {
        let pending = std::mem::take(&mut self.pending);
        let Self {
            slots,
            index,
            hasher,
            text,
            ..
        } = self;
        let rehash = slot_hash(slots, hasher, text);
        index.reserve(pending.len(), &rehash);
        let name = |at: u32| {
            slots
                .get(at as usize)
                .and_then(Option::as_ref)
                .map(|e| text_of(text, e.name))
        };
        let mut all_new = true;
        for at in pending {
            let text = name(at);
            let hash = text.map_or(0, |t| hasher.hash_one(t));
            match index.entry(hash, |&j| name(j) == text, &rehash) {
                hashbrown::hash_table::Entry::Vacant(e) => {
                    e.insert(at);
                }
                hashbrown::hash_table::Entry::Occupied(_) => all_new = false,
            }
        }
        all_new
    }

    /// Whether the slot `idx` holds `name` (canonical or not).
    pub(crate) fn holds(&self, idx: NameIdx, name: &str) -> bool {
        let Some(held) = self.get(idx).map(|e| self.text(e)) else {
            return false;
        };
        held == name || DnsName::canonical(name).is_ok_and(|n| *n == *held)
    }

    /// A new slot holding `name`, not indexed.
    fn push(&mut self, name: &str, labels: Arc<LabelSet>) -> Option<NameIdx> {
        let text = NameText {
            at: u32::try_from(self.text.len()).ok()?,
            len: u16::try_from(name.len()).ok()?,
            zombies: 0,
        };
        u32::try_from(self.text.len() + name.len()).ok()?;
        let at = match self.free.last() {
            Some(at) => *at,
            None => u32::try_from(self.slots.len()).ok()?,
        };
        self.text.push_str(name);
        let entry = NameEntry::new(text, labels);
        if self.free.pop().is_some() {
            self.slots[at as usize] = Some(entry);
        } else {
            self.slots.push(Some(entry));
        }
        Some(NameIdx(at))
    }

    /// Takes out every name `gone` says to (a fraction of them at random, or most of them in
    /// one pass over the index), handing each to `each`.
    pub(crate) fn remove_many(&mut self, gone: &[NameIdx], mut each: impl FnMut(NameEntry)) {
        debug_assert!(
            self.pending.is_empty(),
            "a GC pass with names not indexed yet"
        );
        self.free.reserve(gone.len());
        if gone.len() < self.len() / 8 {
            for idx in gone {
                if let Some(entry) = self.remove(*idx) {
                    each(entry);
                }
            }
        } else {
            // Which slots went, as bits: the pass over the index (in hash order) reads this
            // instead of the slots themselves, which would be a cache miss per name.
            let mut went = vec![0u64; self.slots.len().div_ceil(64)];
            for idx in gone {
                if let Some(entry) = self.slots.get_mut(idx.at()).and_then(Option::take) {
                    self.free.push(idx.0);
                    self.dead += usize::from(entry.name.len);
                    if let Some(word) = went.get_mut(idx.at() / 64) {
                        *word |= 1 << (idx.at() % 64);
                    }
                    each(entry);
                }
            }
            self.index.retain(|at| {
                let at = *at as usize;
                went.get(at / 64)
                    .is_none_or(|word| word & (1 << (at % 64)) == 0)
            });
        }
        self.compact_if_due();
    }

    /// Takes a name out.
    pub(crate) fn remove(&mut self, idx: NameIdx) -> Option<NameEntry> {
        let entry = self.slots.get_mut(idx.at())?.take()?;
        // A restore takes back only the name it just added (a new name that learned
        // nothing): the last one not indexed, if it is one.
        if let Some(at) = self.pending.iter().rposition(|&at| at == idx.0) {
            self.pending.swap_remove(at);
        } else {
            let hash = self.hasher.hash_one(text_of(&self.text, entry.name));
            if let Ok(found) = self.index.find_entry(hash, |&at| at == idx.0) {
                found.remove();
            }
        }
        self.free.push(idx.0);
        self.dead += usize::from(entry.name.len);
        Some(entry)
    }

    /// Rewrites the arena without the text of names that left, once that is most of it.
    fn compact_if_due(&mut self) {
        if self.dead < COMPACT_AFTER || self.dead * 2 < self.text.len() {
            return;
        }
        let mut text = String::with_capacity(self.text.len() - self.dead);
        let Self {
            slots,
            index,
            text: old,
            ..
        } = self;
        let mut move_text = |entry: &mut NameEntry| {
            let name = text_of(old, entry.name);
            // Shorter than the old arena, which fitted in a u32.
            entry.name.at = u32::try_from(text.len()).unwrap_or(u32::MAX);
            text.push_str(name);
        };
        if is_sparse(index.len(), slots.len()) {
            for &at in index.iter() {
                if let Some(Some(entry)) = slots.get_mut(at as usize) {
                    move_text(entry);
                }
            }
        } else {
            slots.iter_mut().flatten().for_each(move_text);
        }
        self.text = text;
        self.dead = 0;
    }

    /// Every name's entry, in no particular order: slot by slot, or through the index when
    /// most slots are free (after a GC pass that released most names) — then a pass touches
    /// only the names left, not every slot.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &NameEntry> + '_ {
        let sparse = self.pending.is_empty() && is_sparse(self.len(), self.slots.len());
        let slots = &self.slots;
        let by_index = sparse.then(|| {
            self.index
                .iter()
                .filter_map(|&at| slots.get(at as usize)?.as_ref())
        });
        let by_slot = (!sparse).then(|| slots.iter().flatten());
        by_index
            .into_iter()
            .flatten()
            .chain(by_slot.into_iter().flatten())
    }

    pub(crate) fn get(&self, idx: NameIdx) -> Option<&NameEntry> {
        self.slots.get(idx.at())?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, idx: NameIdx) -> Option<&mut NameEntry> {
        self.slots.get_mut(idx.at())?.as_mut()
    }

    /// Every name with its text, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (NameIdx, &str, &NameEntry)> + '_ {
        let text = &self.text;
        self.slots.iter().enumerate().filter_map(move |(at, e)| {
            let at = u32::try_from(at).ok()?;
            let e = e.as_ref()?;
            Some((NameIdx(at), text_of(text, e.name), e))
        })
    }

    /// Every name, mutably, in slot order (without its text).
    pub(crate) fn entries_mut(&mut self) -> impl Iterator<Item = (NameIdx, &mut NameEntry)> + '_ {
        self.slots.iter_mut().enumerate().filter_map(|(at, e)| {
            let at = u32::try_from(at).ok()?;
            Some((NameIdx(at), e.as_mut()?))
        })
    }

    /// Every name with its text, mutably, in slot order.
    pub(crate) fn iter_mut(
        &mut self,
    ) -> impl Iterator<Item = (NameIdx, &str, &mut NameEntry)> + '_ {
        let text = &self.text;
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(move |(at, e)| {
                let at = u32::try_from(at).ok()?;
                let e = e.as_mut()?;
                Some((NameIdx(at), text_of(text, e.name), e))
            })
    }

    pub(crate) fn len(&self) -> usize {
        self.index.len() + self.pending.len()
    }
}

/// How many names hold each IP (live or zombie), per address family: hash maps (foldhash),
/// one probe per link or unlink.
#[derive(Debug, Default)]
pub(crate) struct IpRefs {
    v4: hashbrown::HashMap<u32, u32>,
    v6: hashbrown::HashMap<u128, u32>,
}

impl IpRefs {
    /// One more name holds `addr`.
    pub(crate) fn link(&mut self, addr: IpAddr) {
        match addr {
            IpAddr::V4(a) => *self.v4.entry(a.to_bits()).or_insert(0) += 1,
            IpAddr::V6(a) => *self.v6.entry(a.to_bits()).or_insert(0) += 1,
        }
    }

    /// Counts from scratch, from every mapping's address: sorted first, so each distinct
    /// address is one insert into tables sized once (a restore's million mappings).
    pub(crate) fn count(&mut self, addrs: impl Iterator<Item = IpAddr>) {
        fn table<K: Ord + Copy + std::hash::Hash>(mut keys: Vec<K>) -> hashbrown::HashMap<K, u32> {
            keys.sort_unstable();
            let runs = keys.chunk_by(|a, b| a == b);
            let mut table = hashbrown::HashMap::with_capacity(runs.clone().count());
            for run in runs {
                // A run is the names holding one address: far fewer than 2³².
                table.insert(run[0], u32::try_from(run.len()).unwrap_or(u32::MAX));
            }
            table
        }
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for addr in addrs {
            match addr {
                IpAddr::V4(a) => v4.push(a.to_bits()),
                IpAddr::V6(a) => v6.push(a.to_bits()),
            }
        }
        *self = Self {
            v4: table(v4),
            v6: table(v6),
        };
    }

    /// One name fewer holds `addr`.
    pub(crate) fn unlink(&mut self, addr: IpAddr) {
        fn down<K: std::hash::Hash + Eq>(map: &mut hashbrown::HashMap<K, u32>, key: K) {
            if let hashbrown::hash_map::Entry::Occupied(mut refs) = map.entry(key) {
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

    /// Counts again, from every mapping the cache holds (`addrs`, about `mappings` of them):
    /// after a pass that released more mappings than it kept, cheaper than an unlink per
    /// released one (a cache miss each).
    pub(crate) fn rebuild(&mut self, addrs: impl Iterator<Item = IpAddr>, mappings: usize) {
        let (v4, v6) = (self.v4.len().min(mappings), self.v6.len().min(mappings));
        *self = Self {
            v4: hashbrown::HashMap::with_capacity(v4),
            v6: hashbrown::HashMap::with_capacity(v6),
        };
        for addr in addrs {
            self.link(addr);
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
    /// One shared copy of each label set names carry (few: one per selector combination;
    /// looked up for every new name, so with foldhash rather than SipHash).
    pub(crate) label_sets: hashbrown::HashMap<LabelSet, Arc<LabelSet>>,
    pub(crate) names: Names,
    pub(crate) ips: IpRefs,
    /// Names each endpoint has a record for (what `max_names_per_endpoint` bounds; looked
    /// up for every answer).
    pub(crate) endpoint_names: hashbrown::HashMap<EndpointId, usize>,
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

    /// `n` endpoint records fewer for `endpoint`.
    pub(crate) fn forget_endpoints(
        endpoint_names: &mut hashbrown::HashMap<EndpointId, usize>,
        endpoint: EndpointId,
        n: usize,
    ) {
        if let Some(count) = endpoint_names.get_mut(&endpoint) {
            *count = count.saturating_sub(n);
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
        assert_eq!(size_of::<Option<NameEntry>>(), 72);
    }

    #[test]
    fn names_are_found_removed_and_their_arena_compacted() {
        let labels = Arc::new(LabelSet::new());
        let mut names = Names::default();
        let count = 60_000u32;
        let all: Vec<NameIdx> = (0..count)
            .map(|i| {
                let name = format!("host-{i:05}.example.com.");
                assert_eq!(names.find(&name), None);
                names.insert(&name, labels.clone()).unwrap()
            })
            .collect();
        let before = names.text.len();
        // Most go in one pass: the arena is compacted; the rest are still found.
        let gone: Vec<NameIdx> = all.iter().copied().filter(|i| i.0 % 10 != 0).collect();
        let mut removed = 0;
        names.remove_many(&gone, |_| removed += 1);
        assert_eq!(removed, gone.len());
        assert!(names.text.len() < before / 5, "compacted");
        assert_eq!(names.len(), (count / 10) as usize);
        // Few names left in many slots: walked through the index, each once.
        assert!(is_sparse(names.len(), names.slots.len()));
        let mut left: Vec<&str> = names.entries().map(|e| names.text(e)).collect();
        left.sort_unstable();
        let mut expected: Vec<String> = (0..count)
            .filter(|i| i % 10 == 0)
            .map(|i| format!("host-{i:05}.example.com."))
            .collect();
        expected.sort_unstable();
        assert_eq!(left, expected);
        for i in 0..count {
            let name = format!("host-{i:05}.example.com.");
            let found = names.find(&name);
            assert_eq!(found.is_some(), i % 10 == 0, "{name}");
            if let Some(idx) = found {
                assert_eq!(names.text(names.get(idx).unwrap()), name);
            }
        }
        // Slots are reused; a few removed one by one.
        let again = names.insert("new.example.com.", labels.clone()).unwrap();
        assert!(again.0 < count);
        assert_eq!(names.find("new.example.com."), Some(again));
        names.remove_many(&[again], |_| {});
        assert_eq!(names.find("new.example.com."), None);
    }

    /// A restore's names go into the memory of the room made for them, not a block of
    /// their own; a room too small grows once, and a cache that held a name keeps its
    /// slots.
    #[test]
    fn a_restore_fills_its_room() {
        let labels = Arc::new(LabelSet::new());
        let fill = |names: &mut Names, count: u32| {
            for i in 0..count {
                names
                    .insert_unindexed(&format!("n{i}.test."), labels.clone())
                    .unwrap();
            }
            assert!(names.index_pending());
        };
        // The names' text: 8 to 10 bytes each.
        let sizes = |name_bytes| Sizes {
            name_bytes,
            v4: 0,
            v6: 0,
        };
        let room = RestoreRoom::new(1000, sizes(10_000));
        assert_eq!(room.capacity(), 1000 + 1000 / 16);
        let mut names = Names::default();
        names.adopt(room);
        let (block, text) = (names.slots.as_ptr(), names.text.as_ptr());
        names.reserve(1000, 10_000);
        fill(&mut names, 1000);
        assert_eq!(names.slots.as_ptr(), block, "the room's memory");
        assert_eq!(names.text.as_ptr(), text, "the room's text");
        assert_eq!(names.find("n999.test."), Some(NameIdx(999)));

        let mut names = Names::default();
        names.adopt(RestoreRoom::new(100, sizes(0)));
        names.reserve(1000, 0);
        assert!(names.slots.capacity() >= 1000);
        let block = names.slots.as_ptr();
        fill(&mut names, 1000);
        assert_eq!(names.slots.as_ptr(), block, "grown once");

        let mut names = Names::default();
        fill(&mut names, 1);
        let capacity = (names.slots.capacity(), names.text.capacity());
        names.adopt(RestoreRoom::new(1000, sizes(10_000)));
        assert_eq!(
            (names.slots.capacity(), names.text.capacity()),
            capacity,
            "a cache used keeps its slots and text"
        );
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
