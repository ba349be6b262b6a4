//! The DNS cache: name → IPs with expiry, the zombies among them, and IP → names.
//!
//! One entry per (name, IP). An entry is *live* until its expiry; then, or when the name's
//! IP cap evicts it, it becomes a *zombie* and stays only while the datapath reports the IP
//! in use. Times are whole seconds on the caller's clock.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use fqdnd_ipcache::{LabelSet, ResourceOwner};
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

/// What the cache holds for one name.
#[derive(Debug)]
pub(crate) struct NameEntry {
    /// This name's resource owner in the IpCache, shared by all its IPs.
    pub(crate) owner: Arc<ResourceOwner>,
    /// Live mappings, sorted by address.
    pub(crate) live: SmallVec<[IpEntry; 1]>,
    /// Zombies (expired or evicted, kept while in use), sorted by address.
    pub(crate) zombies: SmallVec<[IpEntry; 0]>,
    /// The `fqdn:` labels of the selectors matching this name.
    pub(crate) labels: Arc<LabelSet>,
    /// When this name was last answered.
    pub(crate) last_lookup: Secs,
}

impl NameEntry {
    pub(crate) fn new(name: Arc<str>, labels: Arc<LabelSet>) -> Self {
        Self {
            owner: Arc::new(ResourceOwner::name_manager(name)),
            live: SmallVec::new(),
            zombies: SmallVec::new(),
            labels,
            last_lookup: 0,
        }
    }

    pub(crate) fn holds(&self) -> usize {
        self.live.len() + self.zombies.len()
    }
}

/// The reverse index orders an IP's names by their `Arc`'s address: the cache holds one `Arc`
/// per name for as long as any of its IPs is linked, so identity is the pointer.
fn name_key(name: &Arc<str>) -> usize {
    Arc::as_ptr(name).cast::<u8>() as usize
}

/// Name → entries, and IP → names (ordered: denser in memory than a hash map of this size).
#[derive(Debug, Default)]
pub(crate) struct DnsCache {
    /// One shared copy of each label set names carry (few: one per selector combination).
    pub(crate) label_sets: HashMap<LabelSet, Arc<LabelSet>>,
    pub(crate) names: HashMap<Arc<str>, NameEntry>,
    pub(crate) reverse: BTreeMap<IpAddr, SmallVec<[Arc<str>; 1]>>,
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

    /// Records that `addr` is known under `name` (an IP shared by hundreds of names costs a
    /// binary search over pointers, not string compares).
    pub(crate) fn link(&mut self, addr: IpAddr, name: &Arc<str>) {
        let names = self.reverse.entry(addr).or_default();
        if let Err(at) = names.binary_search_by_key(&name_key(name), name_key) {
            names.insert(at, name.clone());
        }
    }

    pub(crate) fn unlink(&mut self, addr: IpAddr, name: &Arc<str>) {
        if let std::collections::btree_map::Entry::Occupied(mut names) = self.reverse.entry(addr) {
            if let Ok(at) = names.get().binary_search_by_key(&name_key(name), name_key) {
                names.get_mut().remove(at);
            }
            if names.get().is_empty() {
                names.remove();
            }
        }
    }
}
