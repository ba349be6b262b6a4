//! Prefix metadata: for each prefix, which resource owners claim it with which labels.
//!
//! Prefixes live in one ordered map per address family, so the prefixes inside a CIDR are one
//! range scan away; prefixes that carry their own `cidr:` label are also kept in an LPM trie,
//! which answers "the closest enclosing CIDR label" for label down-propagation. Owners are
//! registered once and recorded on prefixes as [`OwnerId`]s (integers: an IP shared by
//! hundreds of names is searched without comparing names).

use std::collections::{BTreeMap, HashMap, btree_map};
use std::fmt;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use prefix_trie::joint::map::JointPrefixMap;

use crate::identity::Identity;
use crate::labels::{LabelId, LabelSet};

/// Who writes a piece of metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OwnerKind {
    /// The NameManager, one owner per DNS name (`fqdn-name-manager/<name>`).
    NameManager,
    /// Policy: the CIDRs that selectors reference (`policy/<cidr>`).
    Policy,
    /// An endpoint or client group (`endpoint/<name>`).
    Endpoint,
    /// Cluster mode: an endpoint of another node (`remote-endpoint/<key>`).
    RemoteEndpoint,
    /// The node itself: its own addresses (`host/<address>`).
    Host,
    /// Cluster mode: another node's own addresses (`remote-node/<node>`).
    RemoteNode,
}

/// A resource owner: a kind and a name. Each owner's labels on a prefix are kept apart and
/// the prefix's labels are their union, so owners never overwrite each other.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceOwner {
    /// The kind of owner.
    pub kind: OwnerKind,
    /// Its name within the kind (the DNS name for the NameManager).
    pub name: Arc<str>,
}

impl ResourceOwner {
    /// The NameManager's owner for one DNS name.
    pub fn name_manager(name: Arc<str>) -> Self {
        Self {
            kind: OwnerKind::NameManager,
            name,
        }
    }
}

impl fmt::Display for ResourceOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            OwnerKind::NameManager => "fqdn-name-manager",
            OwnerKind::Policy => "policy",
            OwnerKind::Endpoint => "endpoint",
            OwnerKind::RemoteEndpoint => "remote-endpoint",
            OwnerKind::Host => "host",
            OwnerKind::RemoteNode => "remote-node",
        };
        write!(f, "{kind}/{}", self.name)
    }
}

/// A resource owner registered with the IpCache: what prefix metadata records instead of the
/// owner's name. Its kind is in the top three bits (so owners sort by kind first, in `OwnerKind`'s order), its slot in
/// the owner table below (plus one: never zero, so an `Option<OwnerId>` takes four bytes).
/// Made by [`crate::IpCache::add_owner`] and [`crate::IpCache::add_owner_without_name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(NonZeroU32);

impl OwnerId {
    const KIND_SHIFT: u32 = 29;
    const SLOT_MASK: u32 = (1 << Self::KIND_SHIFT) - 1;
    /// Slots below this fit (slot + 1 must stay below the kind bits).
    const SLOTS: u32 = Self::SLOT_MASK;

    fn new(kind: OwnerKind, slot: u32) -> Option<Self> {
        let kind = match kind {
            OwnerKind::NameManager => 0,
            OwnerKind::Policy => 1,
            OwnerKind::Endpoint => 2,
            OwnerKind::RemoteEndpoint => 3,
            OwnerKind::Host => 4,
            OwnerKind::RemoteNode => 5,
        };
        (slot < Self::SLOTS)
            .then(|| NonZeroU32::new((kind << Self::KIND_SHIFT) | (slot + 1)))
            .flatten()
            .map(Self)
    }

    /// The owner's kind.
    pub fn kind(self) -> OwnerKind {
        match self.0.get() >> Self::KIND_SHIFT {
            0 => OwnerKind::NameManager,
            1 => OwnerKind::Policy,
            2 => OwnerKind::Endpoint,
            3 => OwnerKind::RemoteEndpoint,
            4 => OwnerKind::Host,
            _ => OwnerKind::RemoteNode,
        }
    }

    fn slot(self) -> usize {
        ((self.0.get() & Self::SLOT_MASK) - 1) as usize
    }

    fn slot_u32(self) -> u32 {
        (self.0.get() & Self::SLOT_MASK) - 1
    }
}

/// One registered owner, in eight bytes: its name, if the IpCache keeps it, is elsewhere.
#[derive(Debug)]
struct OwnerSlot {
    /// Prefixes it has labels on.
    claims: u32,
    kind: OwnerKind,
    /// Whether its name is kept in `Owners::names` (most owners, the NameManager's, have
    /// none: removing one then touches no map).
    named: bool,
}

/// The owner table: [`OwnerId`] → owner, with the number of prefixes each claims. Owners of
/// policy and endpoints are also found by value (few, made again on every policy or endpoint
/// change). The NameManager registers one owner per cached name without a name (it keeps the
/// names itself and renders its owners; see [`crate::IpCache::add_owner_without_name`]).
#[derive(Debug, Default)]
pub(crate) struct Owners {
    slots: Vec<Option<OwnerSlot>>,
    free: Vec<u32>,
    /// Names of the owners registered with one, by slot.
    names: HashMap<u32, Arc<str>>,
    by_value: HashMap<ResourceOwner, OwnerId>,
}

impl Owners {
    /// A new owner (distinct from every other, whatever its value), with its name kept if
    /// given.
    pub(crate) fn add(&mut self, kind: OwnerKind, name: Option<Arc<str>>) -> Option<OwnerId> {
        let slot = OwnerSlot {
            claims: 0,
            kind,
            named: name.is_some(),
        };
        let at = match self.free.pop() {
            Some(at) => at,
            None => u32::try_from(self.slots.len()).ok()?,
        };
        let id = OwnerId::new(kind, at)?;
        match self.slots.get_mut(at as usize) {
            Some(free) => *free = Some(slot),
            None => self.slots.push(Some(slot)),
        }
        if let Some(name) = name {
            self.names.insert(at, name);
        }
        Some(id)
    }

    /// The owner with this value among policy and endpoint owners, added if new.
    pub(crate) fn intern(&mut self, owner: &ResourceOwner) -> Option<OwnerId> {
        if let Some(id) = self.by_value.get(owner) {
            return Some(*id);
        }
        let id = self.add(owner.kind, Some(owner.name.clone()))?;
        self.by_value.insert(owner.clone(), id);
        Some(id)
    }

    /// Forgets interned owners that claim no prefix any more.
    pub(crate) fn forget_unclaimed_interned(&mut self) {
        let unclaimed: Vec<OwnerId> = self
            .by_value
            .values()
            .copied()
            .filter(|id| self.claims_of(*id) == Some(0))
            .collect();
        for id in unclaimed {
            // Claims nothing: removal succeeds.
            let _ = self.remove(id);
        }
    }

    /// Makes room in the free list for `n` more removals.
    pub(crate) fn reserve_free(&mut self, n: usize) {
        self.free.reserve(n);
    }

    /// Removes an owner; `Err(claims)` if it still claims prefixes (then it stays).
    pub(crate) fn remove(&mut self, id: OwnerId) -> Result<(), u32> {
        let Some(slot) = self.slots.get_mut(id.slot()) else {
            return Ok(());
        };
        match slot {
            Some(s) if s.kind == id.kind() && s.claims > 0 => Err(s.claims),
            Some(s) if s.kind == id.kind() => {
                let named = s.named;
                *slot = None;
                self.free.push(id.slot_u32());
                if named && let Some(name) = self.names.remove(&id.slot_u32()) {
                    self.by_value.remove(&ResourceOwner {
                        kind: id.kind(),
                        name,
                    });
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn claims(&mut self, id: OwnerId) -> Option<&mut u32> {
        self.slots
            .get_mut(id.slot())?
            .as_mut()
            .filter(|s| s.kind == id.kind())
            .map(|s| &mut s.claims)
    }

    pub(crate) fn claims_of(&self, id: OwnerId) -> Option<u32> {
        self.slots
            .get(id.slot())?
            .as_ref()
            .filter(|s| s.kind == id.kind())
            .map(|s| s.claims)
    }

    /// Counts one more prefix claimed by `id` (a claim set on an entry without counting it:
    /// [`PrefixEntry::set_owner`] with owners that do not hold `id`).
    pub(crate) fn count_claim(&mut self, id: OwnerId) {
        if let Some(claims) = self.claims(id) {
            *claims += 1;
        }
    }

    /// Whether `id` is a registered owner.
    pub(crate) fn contains(&self, id: OwnerId) -> bool {
        self.claims_of(id).is_some()
    }

    /// The owner behind `id`, if registered with a name.
    pub(crate) fn get(&self, id: OwnerId) -> Option<ResourceOwner> {
        self.contains(id).then_some(())?;
        Some(ResourceOwner {
            kind: id.kind(),
            name: self.names.get(&id.slot_u32())?.clone(),
        })
    }

    /// Registered owners with this name, in id order.
    pub(crate) fn find(&self, owner: &ResourceOwner) -> Vec<OwnerId> {
        let mut found: Vec<OwnerId> = self
            .names
            .iter()
            .filter(|(_, name)| **name == owner.name)
            .filter_map(|(at, _)| OwnerId::new(owner.kind, *at))
            .filter(|id| self.contains(*id))
            .collect();
        found.sort();
        found
    }
}

/// An owner's labels on a prefix.
type Claim = (OwnerId, Arc<LabelSet>);

/// What is known about one prefix, in 24 bytes: most prefixes have one owner, kept inline;
/// an IP several names share has its owners in a sorted list of their own.
#[derive(Debug, Default)]
pub(crate) struct PrefixEntry {
    /// The identity's number; 0 (never allocated) for none.
    identity: u32,
    /// The only owner, when `rest` is `None`.
    first: Option<OwnerId>,
    first_labels: Option<Arc<LabelSet>>,
    /// Two or more owners and their labels, sorted by owner (kind first); label sets shared
    /// (one `Arc` per DNS name's selector combination serves all its IPs).
    #[allow(
        clippy::box_collection,
        reason = "eight bytes in every prefix instead of 24; only shared IPs have a list"
    )]
    rest: Option<Box<Vec<Claim>>>,
}

impl PrefixEntry {
    pub(crate) fn identity(&self) -> Option<Identity> {
        (self.identity != 0).then_some(Identity(self.identity))
    }

    pub(crate) fn set_identity(&mut self, identity: Option<Identity>) {
        self.identity = identity.map_or(0, |id| id.0);
    }

    /// The owners and their labels, sorted by owner.
    pub(crate) fn owners(&self) -> impl Iterator<Item = (OwnerId, &Arc<LabelSet>)> + '_ {
        let rest = self
            .rest
            .iter()
            .flat_map(|v| v.iter().map(|(o, l)| (*o, l)));
        rest.chain(self.first.zip(self.first_labels.as_ref()))
    }

    pub(crate) fn has_owners(&self) -> bool {
        self.first.is_some() || self.rest.is_some()
    }

    /// Sets `owner`'s labels; returns what the owner had before (`None`: a new claim,
    /// counted in `owners`). An IP shared by hundreds of names (S3 buckets on one region's
    /// addresses) is searched, not scanned.
    pub(crate) fn set_owner(
        &mut self,
        owners: &mut Owners,
        owner: OwnerId,
        labels: Arc<LabelSet>,
    ) -> Option<Arc<LabelSet>> {
        if let Some(rest) = &mut self.rest {
            match rest.binary_search_by_key(&owner, |(o, _)| *o) {
                Ok(at) => return Some(std::mem::replace(&mut rest[at].1, labels)),
                Err(at) => rest.insert(at, (owner, labels)),
            }
        } else {
            match (self.first, self.first_labels.take()) {
                (Some(first), Some(old)) if first == owner => {
                    self.first_labels = Some(labels);
                    return Some(old);
                }
                (Some(first), Some(first_labels)) => {
                    let mut both = vec![(first, first_labels), (owner, labels)];
                    both.sort_by_key(|(o, _)| *o);
                    self.first = None;
                    self.rest = Some(Box::new(both));
                }
                _ => {
                    self.first = Some(owner);
                    self.first_labels = Some(labels);
                }
            }
        }
        if let Some(claims) = owners.claims(owner) {
            *claims += 1;
        }
        None
    }

    /// Drops `owner`'s claim; returns its labels if it had one.
    pub(crate) fn remove_owner(
        &mut self,
        owners: &mut Owners,
        owner: OwnerId,
    ) -> Option<Arc<LabelSet>> {
        let labels = if let Some(rest) = &mut self.rest {
            let at = rest.binary_search_by_key(&owner, |(o, _)| *o).ok()?;
            let (_, labels) = rest.remove(at);
            if rest.len() == 1 {
                let (first, first_labels) = rest.remove(0);
                self.first = Some(first);
                self.first_labels = Some(first_labels);
                self.rest = None;
            }
            labels
        } else {
            if self.first != Some(owner) {
                return None;
            }
            self.first = None;
            self.first_labels.take()?
        };
        if let Some(claims) = owners.claims(owner) {
            *claims = claims.saturating_sub(1);
        }
        Some(labels)
    }

    /// Whether another owner has the very label set `labels` (the same `Arc`): then dropping
    /// or adding a claim with it leaves the prefix's label union as it is.
    pub(crate) fn shares(&self, labels: &Arc<LabelSet>) -> bool {
        self.owners().any(|(_, l)| Arc::ptr_eq(l, labels))
    }

    fn is_empty(&self) -> bool {
        !self.has_owners() && self.identity == 0
    }
}

/// An IPv4 prefix as an ordered key: address, then length (as `Ipv4Net` orders).
fn key4(net: Ipv4Net) -> u64 {
    (u64::from(u32::from(net.network())) << 8) | u64::from(net.prefix_len())
}

fn net4(key: u64) -> IpNet {
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the key holds a 32-bit address above an 8-bit length"
    )]
    let (addr, len) = ((key >> 8) as u32, (key & 0xff) as u8);
    IpNet::V4(Ipv4Net::new_assert(addr.into(), len))
}

/// An IPv6 prefix as an ordered key.
fn key6(net: Ipv6Net) -> (u128, u8) {
    (u128::from(net.network()), net.prefix_len())
}

fn net6((addr, len): (u128, u8)) -> IpNet {
    IpNet::V6(Ipv6Net::new_assert(addr.into(), len))
}

/// Runs `f` on the entry at `key` (a new, empty one with `create`), then drops the entry if it
/// was left without owners and identity. `None` if there was none and `create` is false.
fn with_entry_in<K: Ord, R>(
    map: &mut BTreeMap<K, PrefixEntry>,
    key: K,
    create: bool,
    f: impl FnOnce(&mut PrefixEntry) -> R,
) -> Option<R> {
    match map.entry(key) {
        btree_map::Entry::Occupied(mut entry) => {
            let result = f(entry.get_mut());
            if entry.get().is_empty() {
                entry.remove();
            }
            Some(result)
        }
        btree_map::Entry::Vacant(slot) if create => {
            let mut entry = PrefixEntry::default();
            let result = f(&mut entry);
            if !entry.is_empty() {
                slot.insert(entry);
            }
            Some(result)
        }
        btree_map::Entry::Vacant(_) => None,
    }
}

/// [`Metadata::rebuild_with`] for one family's map: the claims on this family come first in
/// `claims` (in key order); the others are left for the next family.
fn rebuild_in<K: Ord + Copy, N: Copy, I: Iterator<Item = (IpNet, OwnerId)>>(
    map: &mut BTreeMap<K, PrefixEntry>,
    key: impl Fn(N) -> K,
    claims: &mut std::iter::Peekable<I>,
    mut f: impl FnMut(&mut PrefixEntry, IpNet, OwnerId),
) where
    IpNet: AsFamily<N>,
{
    // This family's next claim, if the next claim is of this family.
    let next = |claims: &mut std::iter::Peekable<I>| {
        claims.peek().and_then(|(p, _)| p.as_family()).map(&key)
    };
    if next(claims).is_none() {
        return;
    }
    let mut kept: Vec<(K, PrefixEntry)> = Vec::with_capacity(map.len());
    for (k, mut entry) in std::mem::take(map) {
        while let Some(at) = next(claims).filter(|at| *at <= k) {
            if let Some((prefix, owner)) = claims.next()
                && at == k
            {
                f(&mut entry, prefix, owner);
            }
        }
        if !entry.is_empty() {
            kept.push((k, entry));
        }
    }
    // Claims past the last entry of this family.
    while next(claims).is_some() {
        claims.next();
    }
    *map = kept.into_iter().collect();
}

/// [`Metadata::merge_with`] for one family's map: this family's prefixes come first in
/// `prefixes` (in key order, each once); the others are left for the next family. The
/// merged entries are put in `merged` (emptied first: room made ahead, its memory written).
fn merge_in<K: Ord + Copy, N: Copy, I: Iterator<Item = IpNet>>(
    map: &mut BTreeMap<K, PrefixEntry>,
    key: impl Fn(N) -> K,
    prefixes: &mut std::iter::Peekable<I>,
    mut merged: Vec<(K, PrefixEntry)>,
    mut f: impl FnMut(&mut PrefixEntry, IpNet),
) where
    IpNet: AsFamily<N>,
{
    let next = |prefixes: &mut std::iter::Peekable<I>| {
        prefixes.peek().and_then(|p| p.as_family()).map(&key)
    };
    if next(prefixes).is_none() {
        return;
    }
    // Room for every entry without growing: the old ones and, at most, one per prefix given
    // (the other family's too: room reserved, never touched).
    let given = prefixes.size_hint();
    merged.clear();
    merged.reserve(map.len() + given.1.unwrap_or(given.0));
    let mut old = std::mem::take(map).into_iter().peekable();
    loop {
        let new = next(prefixes);
        let old_first = match (old.peek(), new) {
            (None, None) => break,
            (Some(_), None) => true,
            (Some((k, _)), Some(n)) => *k < n,
            (None, Some(_)) => false,
        };
        if old_first {
            merged.extend(old.next());
            continue;
        }
        let (Some(at), Some(prefix)) = (new, prefixes.next()) else {
            break;
        };
        let mut entry = match old.next_if(|(k, _)| *k == at) {
            Some((_, entry)) => entry,
            None => PrefixEntry::default(),
        };
        f(&mut entry, prefix);
        if !entry.is_empty() {
            merged.push((at, entry));
        }
    }
    // Sorted: the map is built in bulk, without a search per entry.
    *map = merged.into_iter().collect();
}

/// The family-specific network of an `IpNet`, if it is of that family.
trait AsFamily<N> {
    fn as_family(&self) -> Option<N>;
}

impl AsFamily<Ipv4Net> for IpNet {
    fn as_family(&self) -> Option<Ipv4Net> {
        match self {
            IpNet::V4(n) => Some(*n),
            IpNet::V6(_) => None,
        }
    }
}

impl AsFamily<Ipv6Net> for IpNet {
    fn as_family(&self) -> Option<Ipv6Net> {
        match self {
            IpNet::V6(n) => Some(*n),
            IpNet::V4(_) => None,
        }
    }
}

/// The metadata store: one ordered map per address family (integer keys: denser and faster
/// to compare than `IpNet`), and the owner table.
#[derive(Debug, Default)]
pub(crate) struct Metadata {
    v4: BTreeMap<u64, PrefixEntry>,
    v6: BTreeMap<(u128, u8), PrefixEntry>,
    pub(crate) owners: Owners,
    pub(crate) cidr_labels: CidrLabels,
}

/// Prefixes that carry their own `cidr:` label, for longest-prefix lookups.
#[derive(Debug, Default)]
pub(crate) struct CidrLabels(JointPrefixMap<IpNet, LabelId>);

impl CidrLabels {
    /// How many prefixes carry a `cidr:` label.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The `cidr:` label of the longest labelled CIDR containing `prefix` (itself included).
    pub(crate) fn longest_match(&self, prefix: &IpNet) -> Option<LabelId> {
        if self.0.is_empty() {
            return None;
        }
        self.0.get_lpm(prefix).map(|(_, id)| *id)
    }
}

impl Metadata {
    pub(crate) fn get(&self, prefix: &IpNet) -> Option<&PrefixEntry> {
        match *prefix {
            IpNet::V4(n) => self.v4.get(&key4(n)),
            IpNet::V6(n) => self.v6.get(&key6(n)),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    /// Every prefix in order (IPv4 first, as `IpNet` orders).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (IpNet, &PrefixEntry)> + '_ {
        let v4 = self.v4.iter().map(|(k, e)| (net4(*k), e));
        let v6 = self.v6.iter().map(|(k, e)| (net6(*k), e));
        v4.chain(v6)
    }

    /// Runs `f` on `prefix`'s entry (created empty if `create`) with the owner table and the
    /// CIDR labels; an entry left without owners and identity is dropped. One map walk.
    pub(crate) fn with_entry<R>(
        &mut self,
        prefix: IpNet,
        create: bool,
        f: impl FnOnce(&mut PrefixEntry, &mut Owners, &CidrLabels) -> R,
    ) -> Option<R> {
        let Self {
            v4,
            v6,
            owners,
            cidr_labels,
        } = self;
        match prefix {
            IpNet::V4(n) => with_entry_in(v4, key4(n), create, |e| f(e, owners, cidr_labels)),
            IpNet::V6(n) => with_entry_in(v6, key6(n), create, |e| f(e, owners, cidr_labels)),
        }
    }

    /// Applies `f` to the entry of each claim in `claims` (prefix order, IPv4 first: a GC
    /// pass's releases) by rebuilding the maps: one pass over every entry instead of a tree
    /// walk and a rebalance per removal, the kept entries packed into fresh nodes. For a batch
    /// that releases a large part of the metadata. Claims on prefixes without an entry are
    /// skipped; entries left without owners and identity are dropped.
    pub(crate) fn rebuild_with(
        &mut self,
        claims: impl IntoIterator<Item = (IpNet, OwnerId)>,
        mut f: impl FnMut(&mut PrefixEntry, &mut Owners, &CidrLabels, IpNet, OwnerId),
    ) {
        let mut claims = claims.into_iter().peekable();
        let Self {
            v4,
            v6,
            owners,
            cidr_labels,
        } = self;
        rebuild_in(v4, key4, &mut claims, |e, p, o| {
            f(e, owners, cidr_labels, p, o);
        });
        rebuild_in(v6, key6, &mut claims, |e, p, o| {
            f(e, owners, cidr_labels, p, o);
        });
    }

    /// Applies `f` to the entry of each of `prefixes` (prefix order, IPv4 first, each once),
    /// created empty where there is none, by merging them into the maps in one pass: for a
    /// batch about as large as the metadata (a restore), instead of a tree walk and a
    /// rebalance per insert. Entries left without owners and identity are dropped. The IPv4
    /// map is merged in `room_v4` (a vector with room made ahead, or an empty one).
    pub(crate) fn merge_with(
        &mut self,
        prefixes: impl IntoIterator<Item = IpNet>,
        room_v4: Vec<(u64, PrefixEntry)>,
        mut f: impl FnMut(&mut PrefixEntry, &mut Owners, &CidrLabels, IpNet),
    ) {
        let mut prefixes = prefixes.into_iter().peekable();
        let Self {
            v4,
            v6,
            owners,
            cidr_labels,
        } = self;
        merge_in(v4, key4, &mut prefixes, room_v4, |e, p| {
            f(e, owners, cidr_labels, p);
        });
        merge_in(v6, key6, &mut prefixes, Vec::new(), |e, p| {
            f(e, owners, cidr_labels, p);
        });
    }

    /// Sets `owner`'s labels on `prefix` without resolving; returns what the owner had before.
    pub(crate) fn upsert(
        &mut self,
        prefix: IpNet,
        owner: OwnerId,
        labels: Arc<LabelSet>,
    ) -> Option<Arc<LabelSet>> {
        self.with_entry(prefix, true, |e, owners, _| {
            e.set_owner(owners, owner, labels)
        })
        .flatten()
    }

    /// Drops `owner`'s claim on `prefix` without resolving; returns its labels if it had one.
    pub(crate) fn remove(&mut self, prefix: IpNet, owner: OwnerId) -> Option<Arc<LabelSet>> {
        self.with_entry(prefix, false, |e, owners, _| e.remove_owner(owners, owner))
            .flatten()
    }

    /// Every known prefix inside `outer`, `outer` included.
    pub(crate) fn descendants(&self, outer: IpNet) -> Vec<IpNet> {
        let inside = |p: &IpNet| p.prefix_len() >= outer.prefix_len() && outer.contains(p);
        match outer {
            IpNet::V4(n) => {
                let lo = u64::from(u32::from(n.network())) << 8;
                let hi = (u64::from(u32::from(n.broadcast())) << 8) | 32;
                self.v4
                    .range(lo..=hi)
                    .map(|(k, _)| net4(*k))
                    .filter(inside)
                    .collect()
            }
            IpNet::V6(n) => {
                let lo = (u128::from(n.network()), 0);
                let hi = (u128::from(n.broadcast()), 128);
                self.v6
                    .range(lo..=hi)
                    .map(|(k, _)| net6(*k))
                    .filter(inside)
                    .collect()
            }
        }
    }

    pub(crate) fn set_cidr_label(&mut self, prefix: IpNet, label: LabelId) {
        self.cidr_labels.0.insert(prefix, label);
    }

    pub(crate) fn clear_cidr_label(&mut self, prefix: &IpNet) {
        self.cidr_labels.0.remove(prefix);
    }
}

/// The host prefix (/32 or /128) of an address.
pub fn host_prefix(addr: IpAddr) -> IpNet {
    match addr {
        IpAddr::V4(a) => IpNet::V4(Ipv4Net::from(a)),
        IpAddr::V6(a) => IpNet::V6(Ipv6Net::from(a)),
    }
}
