//! Many claims in one pass (a restore: a million NameManager claims at once): sorted by
//! prefix, checked against the breakers before anything changes, merged into the metadata
//! maps in one pass, each prefix resolved once, and the datapath's changes queued in prefix
//! order.

use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use hashbrown::{HashMap, HashSet};
use ipnet::IpNet;
use smallvec::SmallVec;

use super::IpCache;
use super::resolution::{desired_labels, resolve_entry, set_identity};
use crate::datapath::Datapath;
use crate::error::Error;
use crate::identity::Identity;
use crate::labels::{LabelId, LabelSet};
use crate::metadata::{OwnerId, OwnerKind, Owners, PrefixEntry, host_prefix};

/// Owners' labels on host prefixes, for [`IpCache::upsert_metadata_many`]: per address
/// family, each claim in 12 bytes (IPv4) naming its label set by number (a million claims
/// share a few sets: no reference count changes per claim until one is applied).
#[derive(Debug, Default)]
pub struct Claims {
    sets: Vec<Arc<LabelSet>>,
    by_set: HashMap<usize, u32>,
    v4: Vec<(u32, OwnerId, u32)>,
    v6: Vec<(u128, OwnerId, u32)>,
    /// Room for merging the IPv4 claims into the metadata ([`Claims::with_room`]).
    merge_v4: Vec<(u64, PrefixEntry)>,
}

impl Claims {
    /// Room for `v4` claims on IPv4 addresses and `v6` on IPv6 ones without growing, and to
    /// merge as many IPv4 prefixes into the IpCache, each room's memory written once (its pages mapped): ~44 MB for a million IPv4
    /// claims, whose ~11k page faults a second core can take ahead of a restore (~25 ms on
    /// this project's VM). A room whose memory cannot be had is left out.
    pub fn with_room(v4: usize, v6: usize) -> Self {
        Self {
            v4: written(v4),
            v6: written(v6),
            merge_v4: written(v4),
            ..Self::default()
        }
    }

    /// How many claims on IPv4 and IPv6 addresses it has room for.
    pub fn capacity(&self) -> [usize; 2] {
        [self.v4.capacity(), self.v6.capacity()]
    }

    /// Room for `v4` claims on IPv4 addresses and `v6` on IPv6 ones in all.
    pub fn reserve(&mut self, v4: usize, v6: usize) {
        self.v4.reserve(v4.saturating_sub(self.v4.len()));
        self.v6.reserve(v6.saturating_sub(self.v6.len()));
    }

    /// `owner` claims the host prefix of `addr` with `labels`.
    pub fn push(&mut self, addr: IpAddr, owner: OwnerId, labels: &Arc<LabelSet>) {
        let ptr = Arc::as_ptr(labels) as usize;
        let last = self.sets.len().checked_sub(1);
        let set = match last {
            // Consecutive claims mostly come from one name.
            Some(at) if Arc::as_ptr(&self.sets[at]) as usize == ptr => at,
            _ => match self.by_set.get(&ptr) {
                Some(&at) => at as usize,
                None => {
                    self.sets.push(Arc::clone(labels));
                    let at = self.sets.len() - 1;
                    self.by_set
                        .insert(ptr, u32::try_from(at).unwrap_or(u32::MAX));
                    at
                }
            },
        };
        // Fewer than 2³² distinct label sets: they are made per selector combination.
        let set = u32::try_from(set).unwrap_or(u32::MAX);
        match addr {
            IpAddr::V4(a) => self.v4.push((a.to_bits(), owner, set)),
            IpAddr::V6(a) => self.v6.push((a.to_bits(), owner, set)),
        }
    }

    /// Claims held.
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sorted by address, then owner; of a repeated (address, owner), the last claim kept.
    fn sort(&mut self) {
        /// Sorted by `by` (stable: the last of a repeated claim stays last), then deduplicated.
        fn sort<K: Ord + Copy>(
            claims: &mut Vec<(K, OwnerId, u32)>,
            by: impl FnOnce(&mut [(K, OwnerId, u32)]),
        ) {
            by(claims);
            claims.dedup_by(|later, kept| {
                let same = later.0 == kept.0 && later.1 == kept.1;
                if same {
                    kept.2 = later.2;
                }
                same
            });
        }
        // IPv4 claims by address with a radix sort (stable), then each address's by owner
        // (few addresses have more than one claim): a million claims, ~50 -> ~19 ms. IPv6
        // keys are too wide for it.
        sort(&mut self.v4, |claims| {
            radsort::sort_by_key(claims, |(at, _, _)| *at);
            for run in claims.chunk_by_mut(|a, b| a.0 == b.0) {
                if run.len() > 1 {
                    run.sort_by_key(|(_, owner, _)| *owner);
                }
            }
        });
        sort(&mut self.v6, |claims| {
            claims.sort_by_key(|(at, owner, _)| (*at, *owner));
        });
    }

    /// Each claimed prefix in prefix order (IPv4 first) with its owners and label sets.
    fn groups(&self) -> impl Iterator<Item = (IpNet, Group)> + '_ {
        fn group<K>(run: &[(K, OwnerId, u32)]) -> Group {
            run.iter().map(|(_, owner, set)| (*owner, *set)).collect()
        }
        let v4 = runs(&self.v4).map(|run| (net4(run[0].0), group(run)));
        v4.chain(runs(&self.v6).map(|run| (net6(run[0].0), group(run))))
    }

    /// Each claimed prefix in prefix order (IPv4 first), once.
    fn prefixes(&self) -> impl Iterator<Item = IpNet> + '_ {
        let v4 = runs(&self.v4).map(|run| net4(run[0].0));
        v4.chain(runs(&self.v6).map(|run| net6(run[0].0)))
    }

    fn owners(&self) -> impl Iterator<Item = OwnerId> + '_ {
        let v4 = self.v4.iter().map(|(_, owner, _)| *owner);
        v4.chain(self.v6.iter().map(|(_, owner, _)| *owner))
    }
}

/// An empty vector with room for `n` items, its memory written (zeros), or with none if it
/// cannot be had.
fn written<T>(n: usize) -> Vec<T> {
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_ok() {
        v.spare_capacity_mut().fill_with(MaybeUninit::zeroed);
    }
    v
}

/// The claims of each address, in the order sorted (none is empty).
fn runs<K: Eq>(claims: &[(K, OwnerId, u32)]) -> impl Iterator<Item = &[(K, OwnerId, u32)]> {
    claims.chunk_by(|a, b| a.0 == b.0)
}

fn net4(addr: u32) -> IpNet {
    host_prefix(IpAddr::from(Ipv4Addr::from_bits(addr)))
}

fn net6(addr: u128) -> IpNet {
    host_prefix(IpAddr::from(Ipv6Addr::from_bits(addr)))
}

/// What a new prefix one owner claims gets its identity from: that owner's label set (by
/// number), the enclosing CIDR label, and whether it is IPv4.
type Key = (u32, Option<LabelId>, bool);

/// The owners claiming one prefix, with their label sets' numbers.
type Group = SmallVec<[(OwnerId, u32); 1]>;

/// What [`IpCache::upsert_metadata_many`] did.
#[derive(Debug)]
#[must_use]
pub enum ManyUpserted {
    /// Every claim was applied except the `refused` ones (their prefixes' metadata left as
    /// it was), as [`IpCache::upsert_metadata`] would have refused them.
    Applied {
        /// The refused prefixes, each with its claimants and why.
        refused: Vec<Refused>,
    },
    /// Nothing changed: the claims are to be applied one by one, in the caller's order.
    NotApplied(NotApplied),
}

/// A prefix [`IpCache::upsert_metadata_many`] could not apply.
#[derive(Debug)]
pub struct Refused {
    /// The prefix (host bits cleared).
    pub prefix: IpNet,
    /// The owners whose claims on it were refused.
    pub owners: SmallVec<[OwnerId; 1]>,
    /// Why (a breaker, a full datapath, no identity number left).
    pub error: Error,
}

/// Why [`IpCache::upsert_metadata_many`] left the claims to be applied one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotApplied {
    /// They may need more FQDN identities than the breaker allows: which claims it refuses
    /// then depends on their order.
    FqdnIdentities,
    /// They may need more room than the datapath's ipcache has (as above).
    DatapathFull,
    /// Cluster mode, or an identity per prefix: not done in bulk.
    Mode,
}

impl<D: Datapath> IpCache<D> {
    /// [`IpCache::upsert_metadata`] for many claims at once, in one pass over the metadata.
    /// Each prefix is resolved once, after all its claims; of a repeated (prefix, owner),
    /// the last claim counts.
    ///
    /// Which claims a breaker (FQDN identities, datapath room) refuses depends on the order
    /// they come in, which a pass in prefix order would not keep: when the claims could trip
    /// one, nothing is applied and [`ManyUpserted::NotApplied`] says so. `now` only paces
    /// warnings.
    ///
    /// # Errors
    /// [`Error::UnknownOwner`] if an owner is not registered (nothing is applied).
    pub fn upsert_metadata_many(
        &mut self,
        mut claims: Claims,
        now: Duration,
    ) -> Result<ManyUpserted, Error> {
        if self.cluster.is_some() || self.config.identity_per_prefix {
            return Ok(ManyUpserted::NotApplied(NotApplied::Mode));
        }
        if !claims
            .owners()
            .all(|owner| self.meta.owners.contains(owner))
        {
            return Err(Error::UnknownOwner);
        }
        claims.sort();
        if !self.cannot_trip(&claims)
            && let Some(why) = self.may_trip(&claims)
        {
            return Ok(ManyUpserted::NotApplied(why));
        }
        let breaker = Some(self.config.max_fqdn_identities);
        let mut ids = identities!(self);
        // One change per prefix, queued without growing the queue.
        ids.pending.ipcache.reserve(claims.len());
        let mut refused = Vec::new();
        let mut known: HashMap<Key, Identity> = HashMap::new();
        let mut last: Option<(Key, Identity)> = None;
        let room_v4 = std::mem::take(&mut claims.merge_v4);
        let sets = &claims.sets;
        let mut groups = claims.groups();
        let prefixes = claims.prefixes();
        // Owners' claims are set without counting them (owners that hold none: the counts
        // are the owners table's, and the claims, sorted by address, reach their owners in
        // no order, a cache miss each in the merge); the new ones are counted after it, in
        // a loop that does nothing else.
        let mut uncounted = Owners::default();
        let mut new_claims: Vec<OwnerId> = Vec::with_capacity(claims.len());
        self.meta
            .merge_with(prefixes, room_v4, |entry, _, cidr, prefix| {
                let owners = &mut uncounted;
                let Some((_, group)) = groups.next() else {
                    return;
                };
                let from_dns = group
                    .iter()
                    .any(|(o, _)| o.kind() == OwnerKind::NameManager);
                // A new prefix one owner claims gets what the last such prefix with the same
                // labels, enclosing CIDR label and family got (resolving it would find the same
                // live identity and take a reference on it).
                let alone = match group[..] {
                    [(owner, set)] if !entry.has_owners() && entry.identity().is_none() => {
                        let key = (set, cidr.longest_match(&prefix), prefix.addr().is_ipv4());
                        Some((owner, key))
                    }
                    _ => None,
                };
                // Consecutive prefixes mostly share their key: the last one is tried first.
                let id_of = |key| match last {
                    Some((k, id)) if k == key => Some(id),
                    _ => known.get(&key).copied(),
                };
                if let Some((owner, key)) = alone
                    && let Some(id) = id_of(key)
                    && ids.alloc.acquire(id)
                {
                    last = Some((key, id));
                    let labels = Arc::clone(&sets[key.0 as usize]);
                    if entry.set_owner(owners, owner, labels).is_none() {
                        new_claims.push(owner);
                    }
                    let family = usize::from(!key.2);
                    set_identity(&mut ids, entry, prefix, family, None, id);
                    return;
                }
                let previous: SmallVec<[Option<Arc<LabelSet>>; 1]> = group
                    .iter()
                    .map(|(owner, set)| {
                        entry.set_owner(owners, *owner, Arc::clone(&sets[*set as usize]))
                    })
                    .collect();
                let breaker = breaker.filter(|_| from_dns);
                let error = match resolve_entry(&mut ids, entry, cidr, prefix, from_dns, breaker) {
                    Ok(()) => {
                        if let (Some((_, key)), Some(id)) = (alone, entry.identity()) {
                            known.insert(key, id);
                            last = Some((key, id));
                        }
                        let new = group.iter().zip(&previous).filter(|(_, p)| p.is_none());
                        new_claims.extend(new.map(|((owner, _), _)| *owner));
                        return;
                    }
                    Err(error) => error,
                };
                for ((owner, _), before) in group.iter().zip(previous).rev() {
                    match before {
                        Some(labels) => {
                            entry.set_owner(owners, *owner, labels);
                        }
                        None => {
                            entry.remove_owner(owners, *owner);
                        }
                    }
                }
                refused.push(Refused {
                    prefix,
                    owners: group.iter().map(|(owner, _)| *owner).collect(),
                    error,
                });
            });
        for owner in new_claims {
            self.meta.owners.count_claim(owner);
        }
        for r in &refused {
            match r.error {
                Error::BreakerTripped { .. } => self.stats.breaker_trips += 1,
                Error::DatapathFull { .. } => self.stats.datapath_full += 1,
                _ => continue,
            }
            self.warn_breaker(now, &r.error);
        }
        Ok(ManyUpserted::Applied { refused })
    }

    /// Whether `claims` (sorted by prefix) certainly trip neither the FQDN identity breaker
    /// nor the datapath's room, by bounds that work out no label set (a pass over the claims
    /// instead of [`IpCache::may_trip`]'s lookups, ~20 ms for a million): each prefix gets at
    /// most one new identity and one new datapath entry, and the prefixes one owner claims
    /// alone, with no owner before, get theirs from their key (label set, enclosing CIDR
    /// label, family) — at most one identity per key.
    fn cannot_trip(&self, claims: &Claims) -> bool {
        let prefixes = [runs(&claims.v4).count(), runs(&claims.v6).count()];
        let shared = runs(&claims.v4).filter(|run| run.len() > 1).count()
            + runs(&claims.v6).filter(|run| run.len() > 1).count();
        let keys = claims
            .sets
            .len()
            .saturating_mul(self.meta.cidr_labels.len().saturating_add(1))
            .saturating_mul(2);
        // Prefixes with an entry before may have owners: bounded by the entries there are.
        let owned_before = self.meta.len();
        let new_identities = (keys.saturating_add(shared).saturating_add(owned_before))
            .min(prefixes[0] + prefixes[1]);
        let identities_fit = self.alloc.from_dns_live().saturating_add(new_identities)
            <= self.config.max_fqdn_identities;
        let room_fits = self
            .config
            .datapath_prefixes
            .is_none_or(|room| (0..2).all(|f| self.written[f].saturating_add(prefixes[f]) <= room));
        identities_fit && room_fits
    }

    /// Whether applying `claims` (sorted by prefix) could trip the FQDN identity breaker or
    /// fill the datapath: the label sets they would give their prefixes, counted without
    /// changing anything. Prefixes claimed by one owner alone share the work per (label
    /// set, enclosing CIDR label, family).
    fn may_trip(&self, claims: &Claims) -> Option<NotApplied> {
        let mut memo: HashMap<Key, Option<bool>> = HashMap::new();
        let mut last: Option<(Key, bool)> = None;
        let mut seen: HashSet<LabelSet> = HashSet::new();
        let mut new_identities = 0usize;
        let mut new_prefixes = [0usize; 2];
        let mut no_owners = Owners::default();
        let cidr = &self.meta.cidr_labels;
        for (prefix, group) in claims.groups() {
            let existing = self.meta.get(&prefix);
            let mut desired = || {
                // The entry as it would be, outside the maps (no owner counts change).
                let mut scratch = PrefixEntry::default();
                for (owner, labels) in existing.into_iter().flat_map(PrefixEntry::owners) {
                    scratch.set_owner(&mut no_owners, owner, Arc::clone(labels));
                }
                for (owner, set) in &group {
                    let labels = Arc::clone(&claims.sets[*set as usize]);
                    scratch.set_owner(&mut no_owners, *owner, labels);
                }
                let (set, _, _) = desired_labels(&scratch, cidr, &prefix)?;
                let new = self.alloc.lookup(&set).is_none() && seen.insert(set);
                new_identities += usize::from(new);
                Some(new)
            };
            let alone = group.len() == 1 && existing.is_none_or(|e| !e.has_owners());
            let labelled = if alone {
                let key = (
                    group[0].1,
                    cidr.longest_match(&prefix),
                    matches!(prefix, IpNet::V4(_)),
                );
                // Consecutive prefixes mostly share their key: the last one is tried first.
                let labelled = match last {
                    Some((k, labelled)) if k == key => labelled,
                    _ => match memo.get(&key) {
                        Some(known) => known.is_some(),
                        None => {
                            let known = desired();
                            memo.insert(key, known);
                            known.is_some()
                        }
                    },
                };
                last = Some((key, labelled));
                labelled
            } else {
                desired().is_some()
            };
            if labelled && existing.is_none_or(|e| e.identity().is_none()) {
                new_prefixes[usize::from(matches!(prefix, IpNet::V6(_)))] += 1;
            }
        }
        if self.alloc.from_dns_live() + new_identities > self.config.max_fqdn_identities {
            return Some(NotApplied::FqdnIdentities);
        }
        if let Some(room) = self.config.datapath_prefixes
            && (0..2).any(|f| self.written[f] + new_prefixes[f] > room)
        {
            return Some(NotApplied::DatapathFull);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::MemoryDatapath;
    use crate::labels::Label;
    use proptest::prelude::*;

    /// A cache with `owners` NameManager owners, CIDR labels on `cidrs` (/24s of
    /// 10.0.x.0), `before` claims already applied, and claims `(address, owner, set)` of
    /// `sets` fqdn label sets (addresses in 10.0.0.0/22 and 2001:db8::/126).
    fn with_claims(
        config: crate::Config,
        (owners, sets, cidrs): (usize, usize, &[u8]),
        before: &[(u16, usize, usize)],
        claims: &[(u16, usize, usize)],
    ) -> (IpCache<MemoryDatapath>, Claims) {
        let mut cache = IpCache::new(config, MemoryDatapath::default());
        let owners: Vec<OwnerId> = (0..owners)
            .map(|_| {
                cache
                    .add_owner_without_name(OwnerKind::NameManager)
                    .unwrap()
            })
            .collect();
        let sets: Vec<Arc<LabelSet>> = (0..sets)
            .map(|n| {
                let mut set = LabelSet::new();
                set.insert(cache.labels.intern(Label::fqdn(&format!("s{n}"))));
                Arc::new(set)
            })
            .collect();
        for &third in cidrs {
            let cidr: IpNet = format!("10.0.{third}.0/24").parse().unwrap();
            let label = cache.labels.intern(Label::Cidr(cidr));
            cache.meta.set_cidr_label(cidr, label);
        }
        // Spread over the four /24s of 10.0.0.0/22, then IPv6.
        let addr = |n: u16| match n {
            0..1024 => IpAddr::from([10, 0, (n % 4) as u8, (n / 4) as u8]),
            _ => IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, n & 3]),
        };
        for &(n, owner, set) in before {
            let labels = Arc::clone(&sets[set]);
            let prefix = host_prefix(addr(n));
            // A breaker may refuse some: they are then not there before.
            let _ = cache.upsert_metadata(prefix, owners[owner], labels, Duration::ZERO);
        }
        let mut out = Claims::default();
        for &(n, owner, set) in claims {
            out.push(addr(n), owners[owner], &sets[set]);
        }
        out.sort();
        (cache, out)
    }

    fn addr() -> impl Strategy<Value = u16> {
        prop_oneof![0u16..32, 1024u16..1028]
    }

    proptest! {
        /// The bounds never say "cannot trip" of claims the exact count says may trip.
        #[test]
        fn claims_that_cannot_trip_by_the_bounds_do_not_by_the_count(
            owners in 1usize..4,
            sets in 1usize..5,
            cidrs in prop::collection::vec(0u8..4, 0..4),
            // Few addresses (32 IPv4, 4 IPv6): many shared by several owners.
            before in prop::collection::vec((addr(), 0usize..3, 0usize..4), 0..20),
            claims in prop::collection::vec((addr(), 0usize..3, 0usize..4), 1..100),
            max_fqdn_identities in 0usize..24,
            room in prop::option::of(0usize..40),
        ) {
            let config = crate::Config {
                max_fqdn_identities,
                datapath_prefixes: room,
                ..crate::Config::default()
            };
            let pick = |v: &[(u16, usize, usize)]| -> Vec<(u16, usize, usize)> {
                v.iter().map(|&(n, o, s)| (n, o % owners, s % sets)).collect()
            };
            let (cache, claims) = with_claims(config, (owners, sets, &cidrs), &pick(&before), &pick(&claims));
            if cache.cannot_trip(&claims) {
                prop_assert_eq!(cache.may_trip(&claims), None);
            }
        }
    }

    /// Prefixes two owners claim get the union of their label sets: identities no key
    /// bounds; so do prefixes claimed by an owner that another one claimed before.
    #[test]
    fn shared_prefixes_count_beyond_the_keys() {
        let config = crate::Config {
            max_fqdn_identities: 4,
            ..crate::Config::default()
        };
        let claims = [
            (0, 0, 0),
            (1, 0, 1),
            (2, 0, 0),
            (2, 1, 1),
            (1024, 0, 0),
            (1025, 0, 1),
            (1026, 0, 0),
            (1026, 1, 1),
        ];
        let (cache, sorted) = with_claims(config, (2, 2, &[]), &[], &claims);
        assert_eq!(cache.may_trip(&sorted), Some(NotApplied::FqdnIdentities));
        assert!(!cache.cannot_trip(&sorted));
        // Before: {s1} and {s2} in each family; the claims make four sets new in each.
        let config = crate::Config {
            max_fqdn_identities: 11,
            ..crate::Config::default()
        };
        let before = [0, 1024].map(|v| [(v, 1, 1), (v + 1, 1, 2), (v + 2, 1, 1)]);
        let claims = [0, 1024].map(|v| [(v, 0, 0), (v + 1, 0, 0), (v + 2, 0, 2), (v + 3, 0, 0)]);
        let (cache, sorted) = with_claims(
            config,
            (2, 3, &[]),
            before.as_flattened(),
            claims.as_flattened(),
        );
        assert_eq!(cache.may_trip(&sorted), Some(NotApplied::FqdnIdentities));
        assert!(!cache.cannot_trip(&sorted));
    }

    /// A restore's claims (few label sets, many addresses, an empty cache) need no count.
    #[test]
    fn a_restores_claims_cannot_trip_by_the_bounds_alone() {
        let config = crate::Config {
            max_fqdn_identities: 4,
            // Per family: 1024 IPv4 prefixes, 4 IPv6.
            datapath_prefixes: Some(1024),
            ..crate::Config::default()
        };
        let claims: Vec<_> = (0..1028).map(|n| (n, 0, usize::from(n % 2))).collect();
        let (cache, sorted) = with_claims(config, (1, 2, &[]), &[], &claims);
        assert!(cache.cannot_trip(&sorted));
        // One more identity than the two sets, both families, can need: the count decides.
        let config = crate::Config {
            max_fqdn_identities: 3,
            ..crate::Config::default()
        };
        let (cache, sorted) = with_claims(config, (1, 2, &[]), &[], &claims);
        assert!(!cache.cannot_trip(&sorted));
        // No room for the last IPv4 prefix in the datapath.
        let config = crate::Config {
            datapath_prefixes: Some(1023),
            ..crate::Config::default()
        };
        let (cache, sorted) = with_claims(config, (1, 2, &[]), &[], &claims);
        assert!(!cache.cannot_trip(&sorted));
    }

    /// Claims come sorted by address, then owner, the last of a repeated (address, owner)
    /// kept, whatever order they were pushed in.
    #[test]
    fn claims_sort_by_address_then_owner_and_keep_the_last_repeat() {
        let mut cache = IpCache::new(crate::Config::default(), MemoryDatapath::default());
        let mut owner = || {
            cache
                .add_owner_without_name(OwnerKind::NameManager)
                .unwrap()
        };
        let (first, second) = (owner(), owner());
        assert!(first < second);
        let (one, two) = (Arc::new(LabelSet::new()), Arc::new(LabelSet::new()));
        let mut claims = Claims::default();
        let v4 = |last: u8| IpAddr::from([192, 0, 2, last]);
        let v6 = IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1]);
        for (addr, owner, labels) in [
            (v4(9), second, &one),
            (v6, second, &one),
            (v4(9), first, &one),
            (v4(1), second, &one),
            (v6, first, &two),
            (v4(9), second, &two),
            (v6, second, &two),
        ] {
            claims.push(addr, owner, labels);
        }
        claims.sort();
        let (b9, b1) = (
            u32::from_be_bytes([192, 0, 2, 9]),
            u32::from_be_bytes([192, 0, 2, 1]),
        );
        assert_eq!(
            claims.v4,
            [(b1, second, 0), (b9, first, 0), (b9, second, 1)]
        );
        let b6 = 0x2001_0db8_u128 << 96 | 1;
        assert_eq!(claims.v6, [(b6, first, 1), (b6, second, 1)]);
    }
}
