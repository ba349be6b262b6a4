//! The IpCache: prefix metadata in, prefix → identity and per-endpoint policy out.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use smallvec::SmallVec;

use crate::config::Config;
use crate::datapath::{Datapath, DatapathChange, PolicyKey};
use crate::endpoint::{Endpoint, EndpointId};
use crate::endpoint_policy::PolicyState;
use crate::error::{Breaker, Error};
use crate::identity::{Allocator, Identity, Scope};
use crate::labels::{Label, LabelId, LabelSet, LabelTable};
use crate::metadata::{CidrLabels, Metadata, OwnerId, OwnerKind, Owners, PrefixEntry};
use crate::policy::Rule;
use crate::selector::{SelectorCache, SelectorIdx};

/// How often a tripped breaker may log a warning.
const BREAKER_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Counters of what the IpCache did, for metrics and replay summaries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Prefix → identity entries written to the datapath.
    pub ipcache_upserts: u64,
    /// Prefix entries removed from the datapath.
    pub ipcache_deletes: u64,
    /// Policy-map entries added.
    pub policy_upserts: u64,
    /// Policy-map entries removed.
    pub policy_deletes: u64,
    /// Times a selector gained or lost an identity.
    pub selector_updates: u64,
    /// DNS-driven changes a circuit breaker rejected.
    pub breaker_trips: u64,
    /// Batches handed to the datapath.
    pub batches: u64,
    /// DNS-driven changes rejected because the datapath's ipcache was full.
    pub datapath_full: u64,
}

/// Changes a commit's buffers keep room for after a larger batch.
const KEPT_BATCH: usize = 1 << 16;

/// What the datapath does not have yet: the changes waiting for the next
/// [`IpCache::commit`], coalesced per key. A batch the datapath refuses stays here.
#[derive(Debug, Default)]
struct Pending {
    /// In the order made; coalesced (last write wins) at commit. Ipcache writes are
    /// idempotent, so a write repeated after a refused batch is harmless.
    ipcache: Vec<(IpNet, Option<Identity>)>,
    /// `true`: add, `false`: remove. An entry leaves and reaches zero strictly in turn, so a
    /// change against a pending change of the other direction cancels it: the datapath
    /// already is where the two lead (a policy upsert is not idempotent in the kernel, whose
    /// entries are reference-counted).
    policy: BTreeMap<(EndpointId, PolicyKey), bool>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.ipcache.is_empty() && self.policy.is_empty()
    }

    fn policy_change(&mut self, endpoint: EndpointId, key: PolicyKey, up: bool) {
        match self.policy.entry((endpoint, key)) {
            Entry::Occupied(e) if *e.get() != up => {
                e.remove();
            }
            Entry::Occupied(mut e) => {
                e.insert(up);
            }
            Entry::Vacant(e) => {
                e.insert(up);
            }
        }
    }
}

/// Borrows the fields identity changes touch, leaving `meta` free for the caller.
macro_rules! identities {
    ($cache:ident) => {
        $crate::cache::identities::Identities {
            labels: &mut $cache.labels,
            per_prefix: $cache.config.identity_per_prefix,
            alloc: &mut $cache.alloc,
            selectors: &mut $cache.selectors,
            policy: &mut $cache.policy,
            pending: &mut $cache.pending,
            stats: &mut $cache.stats,
            scratch: &mut $cache.scratch,
            restore: &$cache.restore,
            written: &mut $cache.written,
            capacity: $cache.config.datapath_prefixes,
            cluster: $cache.cluster.as_mut(),
        }
    };
}

mod bulk;
mod cluster;
mod identities;
mod owners;
mod policy;
pub use bulk::{Claims, ManyUpserted, NotApplied, Refused};
use cluster::ClusterState;
use identities::Identities;

/// The IpCache. Generic over the datapath it writes to.
#[derive(Debug)]
pub struct IpCache<D> {
    config: Config,
    labels: LabelTable,
    alloc: Allocator,
    meta: Metadata,
    selectors: SelectorCache,
    policy: PolicyState,
    rules: Vec<Rule>,
    endpoints: BTreeMap<EndpointId, Endpoint>,
    policy_cidrs: BTreeSet<IpNet>,
    /// The node's own addresses (host prefixes) that have the host identity.
    host: BTreeSet<IpNet>,
    /// The node's addresses left out for want of room in the datapath.
    host_no_room: BTreeSet<IpNet>,
    preallocated: HashMap<LabelId, [Identity; 2]>,
    pending: Pending,
    batch: Vec<DatapathChange>,
    scratch: Vec<SelectorIdx>,
    datapath: D,
    stats: Stats,
    revision: u64,
    last_breaker_warning: Option<Duration>,
    /// Identity numbers to give label sets again after a restart (see `restore_identities`).
    restore: HashMap<String, Identity>,
    /// Prefixes with an identity, IPv4 and IPv6: the entries the datapath's ipcache holds.
    written: [usize; 2],
    /// Cluster mode (`None`: a single node, numbers chosen here).
    cluster: Option<ClusterState>,
}

impl<D: Datapath> IpCache<D> {
    /// An empty IpCache writing to `datapath`.
    pub fn new(config: Config, datapath: D) -> Self {
        Self {
            config,
            labels: LabelTable::default(),
            alloc: Allocator::default(),
            meta: Metadata::default(),
            selectors: SelectorCache::default(),
            policy: PolicyState::default(),
            rules: Vec::new(),
            endpoints: BTreeMap::new(),
            policy_cidrs: BTreeSet::new(),
            host: BTreeSet::new(),
            host_no_room: BTreeSet::new(),
            preallocated: HashMap::new(),
            pending: Pending::default(),
            batch: Vec::new(),
            scratch: Vec::new(),
            datapath,
            stats: Stats::default(),
            revision: 0,
            last_breaker_warning: None,
            restore: HashMap::new(),
            written: [0; 2],
            cluster: None,
        }
    }

    fn identities(&mut self) -> Identities<'_> {
        identities!(self)
    }

    /// Makes room for `changes` more pending ipcache changes (before a large GC pass, so the
    /// queue does not regrow while the pass frees memory).
    pub fn reserve(&mut self, changes: usize) {
        self.pending.ipcache.reserve(changes);
    }

    /// Sets `owner`'s labels on `prefix` (host bits are cleared) and re-resolves its identity.
    ///
    /// A NameManager owner's change that would create an identity past the FQDN identity
    /// breaker is rejected: the metadata is left as it was and [`Error::BreakerTripped`] is
    /// returned. `now` only paces the breaker's warning.
    ///
    /// # Errors
    /// A breaker, a full datapath, no identity number left, or [`Error::UnknownOwner`].
    pub fn upsert_metadata(
        &mut self,
        prefix: IpNet,
        owner: OwnerId,
        labels: Arc<LabelSet>,
        now: Duration,
    ) -> Result<(), Error> {
        if !self.meta.owners.contains(owner) {
            return Err(Error::UnknownOwner);
        }
        let prefix = prefix.trunc();
        let from_dns = owner.kind() == OwnerKind::NameManager;
        let breaker = from_dns.then_some(self.config.max_fqdn_identities);
        let mut ids = identities!(self);
        let result = self.meta.with_entry(prefix, true, |entry, owners, cidr| {
            // Fast path: the labels only grew and the prefix's identity already carries them
            // all (another name answered with this IP under the same selectors): the union
            // cannot change.
            let unchanged = |previous: &Option<Arc<LabelSet>>, current: Option<&LabelSet>| {
                previous.as_ref().is_none_or(|p| p.is_subset(&labels))
                    && current.is_some_and(|c| labels.is_subset(c))
            };
            let current = entry.identity().and_then(|id| ids.alloc.labels(id));
            let previous = entry.set_owner(owners, owner, Arc::clone(&labels));
            if unchanged(&previous, current) {
                return Ok(());
            }
            let Err(err) = resolve_entry(&mut ids, entry, cidr, prefix, from_dns, breaker) else {
                return Ok(());
            };
            match previous {
                Some(labels) => {
                    entry.set_owner(owners, owner, labels);
                }
                None => {
                    entry.remove_owner(owners, owner);
                }
            }
            Err(err)
        });
        let Some(Err(err)) = result else {
            return Ok(());
        };
        match err {
            Error::BreakerTripped { .. } => {
                self.stats.breaker_trips += 1;
                self.warn_breaker(now, &err);
            }
            Error::DatapathFull { .. } => {
                self.stats.datapath_full += 1;
                self.warn_breaker(now, &err);
            }
            _ => {}
        }
        Err(err)
    }

    /// Drops `owner`'s labels on `prefix` and re-resolves its identity. Never trips a breaker.
    ///
    /// # Errors
    /// The identity change failed (no number left: not for a removal in practice).
    pub fn remove_metadata(&mut self, prefix: IpNet, owner: OwnerId) -> Result<(), Error> {
        let prefix = prefix.trunc();
        let from_dns = owner.kind() == OwnerKind::NameManager;
        let mut ids = identities!(self);
        self.meta
            .with_entry(prefix, false, |entry, owners, cidr| {
                remove_claim(&mut ids, entry, owners, cidr, prefix, owner, from_dns)
            })
            .unwrap_or(Ok(()))
    }

    /// [`IpCache::remove_metadata`] for each claim of `claims`, which come in prefix order
    /// (IPv4 first, as `IpNet` orders; a GC pass's releases sorted by address), `expected`
    /// of them. A batch that releases more than an eighth of the prefixes is applied in one
    /// pass that rebuilds the metadata maps; a smaller one claim by claim.
    ///
    /// # Errors
    /// As [`IpCache::remove_metadata`]; in the one-pass case every claim is still removed and
    /// the first error is returned.
    pub fn remove_metadata_many(
        &mut self,
        claims: impl IntoIterator<Item = (IpNet, OwnerId)>,
        expected: usize,
    ) -> Result<(), Error> {
        if expected < self.meta.len() / 8 {
            for (prefix, owner) in claims {
                self.remove_metadata(prefix, owner)?;
            }
            return Ok(());
        }
        let mut ids = identities!(self);
        let mut first_error = None;
        self.meta.rebuild_with(
            claims.into_iter().map(|(p, o)| (p.trunc(), o)),
            |entry, owners, cidr, prefix, owner| {
                let from_dns = owner.kind() == OwnerKind::NameManager;
                let result = remove_claim(&mut ids, entry, owners, cidr, prefix, owner, from_dns);
                if let Err(e) = result
                    && first_error.is_none()
                {
                    first_error = Some(e);
                }
            },
        );
        first_error.map_or(Ok(()), Err)
    }

    /// Re-resolves `prefixes`; every one is tried, the first error is returned.
    fn resolve_all(&mut self, prefixes: BTreeSet<IpNet>) -> Result<(), Error> {
        let mut first = None;
        for prefix in prefixes {
            if let Err(e) = self.resolve(prefix) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Hands the pending changes to the datapath in one ordered batch; returns the revision
    /// that is now in the datapath.
    ///
    /// # Errors
    /// The datapath refused the batch. A [`Datapath`] applies a batch whole or not at all, so
    /// the changes stay pending: they go with the next commit, together with whatever changes
    /// in between (a change back to the datapath's state cancels its pending opposite).
    pub fn commit(&mut self) -> Result<u64, Error> {
        if self.pending.is_empty() {
            return Ok(self.revision);
        }
        self.batch.clear();
        self.batch
            .reserve(self.pending.ipcache.len() + self.pending.policy.len());
        let mut counts = Stats::default();
        for ((endpoint, key), _) in self.pending.policy.iter().filter(|(_, up)| **up) {
            self.batch.push(DatapathChange::PolicyUpsert {
                endpoint: *endpoint,
                key: *key,
            });
            counts.policy_upserts += 1;
        }
        // Stable sort, then keep the last change of each prefix.
        self.pending.ipcache.sort_by_key(|(prefix, _)| *prefix);
        let changes = &self.pending.ipcache;
        let last = |i: usize| {
            changes
                .get(i + 1)
                .is_none_or(|(next, _)| *next != changes[i].0)
        };
        for (i, (prefix, identity)) in changes.iter().enumerate() {
            if let (true, Some(identity)) = (last(i), identity) {
                self.batch.push(DatapathChange::IpcacheUpsert {
                    prefix: *prefix,
                    identity: *identity,
                });
                counts.ipcache_upserts += 1;
            }
        }
        for (i, (prefix, identity)) in changes.iter().enumerate() {
            if last(i) && identity.is_none() {
                self.batch
                    .push(DatapathChange::IpcacheDelete { prefix: *prefix });
                counts.ipcache_deletes += 1;
            }
        }
        for ((endpoint, key), _) in self.pending.policy.iter().filter(|(_, up)| !**up) {
            self.batch.push(DatapathChange::PolicyDelete {
                endpoint: *endpoint,
                key: *key,
            });
            counts.policy_deletes += 1;
        }
        self.datapath.apply(&self.batch)?;
        self.pending.ipcache.clear();
        self.pending.policy.clear();
        // The room a restore's or a large GC's batch took (tens of megabytes for a million
        // prefixes) is given back, not kept for the small batches that follow.
        if self.batch.capacity() > KEPT_BATCH {
            self.batch = Vec::new();
        }
        if self.pending.ipcache.capacity() > KEPT_BATCH {
            self.pending.ipcache = Vec::new();
        }
        self.stats.policy_upserts += counts.policy_upserts;
        self.stats.ipcache_upserts += counts.ipcache_upserts;
        self.stats.ipcache_deletes += counts.ipcache_deletes;
        self.stats.policy_deletes += counts.policy_deletes;
        self.stats.batches += 1;
        self.revision += 1;
        Ok(self.revision)
    }

    /// Brings `prefix`'s identity in line with its metadata.
    fn resolve(&mut self, prefix: IpNet) -> Result<(), Error> {
        let mut ids = identities!(self);
        self.meta
            .with_entry(prefix, false, |entry, _, cidr| {
                resolve_entry(&mut ids, entry, cidr, prefix, false, None)
            })
            .unwrap_or(Ok(()))
    }

    fn warn_breaker(&mut self, now: Duration, err: &Error) {
        let due = self
            .last_breaker_warning
            .is_none_or(|last| now.saturating_sub(last) >= BREAKER_WARNING_INTERVAL);
        if due {
            self.last_breaker_warning = Some(now);
            tracing::warn!(error = %err, trips = self.stats.breaker_trips, "circuit breaker tripped");
        }
    }
}

impl<D> IpCache<D> {
    /// The identity currently resolved for `prefix`.
    pub fn identity_of(&self, prefix: &IpNet) -> Option<Identity> {
        self.meta
            .get(&prefix.trunc())
            .and_then(PrefixEntry::identity)
    }

    /// Every prefix with its identity and owners (by id: [`IpCache::owner`] names those
    /// registered with a name), ordered by prefix.
    pub fn prefixes(&self) -> impl Iterator<Item = (IpNet, Option<Identity>, Vec<OwnerId>)> + '_ {
        self.meta
            .iter()
            .map(|(p, e)| (p, e.identity(), e.owners().map(|(o, _)| o).collect()))
    }

    /// Number of prefixes with metadata.
    pub fn prefix_count(&self) -> usize {
        self.meta.len()
    }

    /// Sets the datapath's room per family ([`Config::datapath_prefixes`]); `None`: unbounded.
    pub fn set_datapath_prefixes(&mut self, room: Option<usize>) {
        self.config.datapath_prefixes = room;
    }

    /// The datapath's room per family, if bounded.
    pub fn datapath_room(&self) -> Option<usize> {
        self.config.datapath_prefixes
    }

    /// Prefixes with an identity — the entries the datapath's ipcache holds — IPv4 and IPv6.
    pub fn datapath_prefixes(&self) -> [usize; 2] {
        self.written
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The datapath.
    pub fn datapath(&self) -> &D {
        &self.datapath
    }

    /// The datapath, mutably (for its own maintenance, never to bypass the IpCache).
    pub fn datapath_mut(&mut self) -> &mut D {
        &mut self.datapath
    }

    /// The revision last committed to the datapath.
    pub fn revision(&self) -> u64 {
        self.revision
    }
}

/// Drops `owner`'s claim on `entry` (the metadata of `prefix`) and re-resolves its identity
/// unless the label union cannot have changed: another owner still holds the very same
/// label set (most of an S3 region's IP's names).
fn remove_claim(
    ids: &mut Identities<'_>,
    entry: &mut PrefixEntry,
    owners: &mut Owners,
    cidr: &CidrLabels,
    prefix: IpNet,
    owner: OwnerId,
    from_dns: bool,
) -> Result<(), Error> {
    let Some(labels) = entry.remove_owner(owners, owner) else {
        return Ok(());
    };
    if entry.identity().is_some() && entry.shares(&labels) {
        return Ok(());
    }
    resolve_entry(ids, entry, cidr, prefix, from_dns, None)
}

/// Brings one prefix's identity in line with its metadata: identity references move, the
/// selector cache and policy follow, and the change is queued for the datapath. With
/// `breaker: Some(limit)`, creating a DNS identity past `limit` fails before anything changes.
fn resolve_entry(
    ids: &mut Identities<'_>,
    entry: &mut PrefixEntry,
    cidr: &CidrLabels,
    prefix: IpNet,
    from_dns: bool,
    breaker: Option<usize>,
) -> Result<(), Error> {
    let current = entry.identity();
    let family = usize::from(matches!(prefix, IpNet::V6(_)));
    let desired = desired_labels(entry, cidr, &prefix);
    if let Some(cluster) = ids.cluster.as_deref_mut() {
        let endpoint_labels = desired
            .as_ref()
            .filter(|(_, scope, _)| *scope == Scope::Cluster)
            .map(|(labels, _, _)| labels);
        cluster.track(prefix, endpoint_labels);
    }
    match desired {
        None => {
            drop_identity(ids, entry, prefix, family, current);
        }
        Some((labels, Scope::Cluster, local)) if ids.cluster.is_some() => {
            let assigned = ids
                .cluster
                .as_deref()
                .and_then(|c| c.assigned.get(&labels))
                .copied();
            let keep = current.is_some_and(|id| {
                ids.alloc.labels(id) == Some(&labels)
                    && match assigned {
                        Some(number) => id == number,
                        None => local && id.scope() == Some(Scope::Temporary),
                    }
            });
            if keep {
                return Ok(());
            }
            let id = match assigned {
                Some(number) => ids.acquire_exact(&labels, number)?,
                None if local => ids.acquire_temporary(&labels)?,
                // A remote endpoint waits for its label set's global number.
                None => {
                    drop_identity(ids, entry, prefix, family, current);
                    return Ok(());
                }
            };
            set_identity(ids, entry, prefix, family, current, id);
        }
        Some((mut labels, scope, _)) => {
            if ids.per_prefix
                && scope == Scope::Local
                && labels
                    .iter()
                    .any(|l| matches!(ids.labels.label(l), Some(Label::Fqdn(_))))
            {
                labels.insert(ids.labels.intern(Label::Cidr(prefix)));
            }
            if current.is_some_and(|id| ids.alloc.labels(id) == Some(&labels)) {
                return Ok(());
            }
            if let Some(limit) = breaker
                && ids.alloc.lookup(&labels).is_none()
                && ids.alloc.from_dns_live() >= limit
            {
                return Err(Error::BreakerTripped {
                    breaker: Breaker::FqdnIdentities,
                    limit,
                    prefix,
                });
            }
            if let (Some(_), Some(limit), None) = (breaker, ids.capacity, current)
                && ids.written[family] >= limit
            {
                return Err(Error::DatapathFull {
                    map: "ipcache",
                    limit,
                    prefix,
                });
            }
            let id = ids.acquire(&labels, scope, from_dns)?;
            set_identity(ids, entry, prefix, family, current, id);
        }
    }
    Ok(())
}

/// The prefix loses its identity: its datapath entry goes, the reference is dropped.
fn drop_identity(
    ids: &mut Identities<'_>,
    entry: &mut PrefixEntry,
    prefix: IpNet,
    family: usize,
    current: Option<Identity>,
) {
    entry.set_identity(None);
    if let Some(old) = current {
        ids.written[family] -= 1;
        ids.pending.ipcache.push((prefix, None));
        ids.release(old);
    }
}

/// The prefix takes `id` (a reference already held): its datapath entry flips, and the old
/// identity's reference is dropped after.
fn set_identity(
    ids: &mut Identities<'_>,
    entry: &mut PrefixEntry,
    prefix: IpNet,
    family: usize,
    current: Option<Identity>,
    id: Identity,
) {
    if current.is_none() {
        ids.written[family] += 1;
    }
    entry.set_identity(Some(id));
    ids.pending.ipcache.push((prefix, Some(id)));
    if let Some(old) = current {
        ids.release(old);
    }
}

/// The label set a prefix should carry, the identity scope it belongs to, and whether a
/// local endpoint owns it.
///
/// An endpoint's prefix (local or remote) carries its endpoint labels only. A node's own
/// address (and no endpoint's) is the host: `reserved:host`, identity 1. Another node's
/// address (neither an endpoint's nor this node's) is `reserved:remote-node`, identity 6.
/// Any other prefix
/// carries the union of its owners' labels, the `cidr:` label of the closest labelled CIDR
/// that contains it (only the longest one), and the world label of its family. A prefix
/// without owners carries none.
fn desired_labels(
    entry: &PrefixEntry,
    cidr: &CidrLabels,
    prefix: &IpNet,
) -> Option<(LabelSet, Scope, bool)> {
    if !entry.has_owners() {
        return None;
    }
    let mut set = LabelSet::new();
    let endpoint =
        |kind: OwnerKind| matches!(kind, OwnerKind::Endpoint | OwnerKind::RemoteEndpoint);
    if entry.owners().any(|(o, _)| endpoint(o.kind())) {
        for (_, labels) in entry.owners().filter(|(o, _)| endpoint(o.kind())) {
            set.extend(labels);
        }
        let local = entry.owners().any(|(o, _)| o.kind() == OwnerKind::Endpoint);
        return Some((set, Scope::Cluster, local));
    }
    if entry.owners().any(|(o, _)| o.kind() == OwnerKind::Host) {
        // The node's own address is the host, whatever name answered with it or policy CIDR
        // holds it (as in Cilium: CIDR selectors do not select the host).
        set.insert(LabelTable::HOST);
        return Some((set, Scope::Reserved, false));
    }
    if entry
        .owners()
        .any(|(o, _)| o.kind() == OwnerKind::RemoteNode)
    {
        // As the host: another node's address is the remote node, whatever else selects it
        // (Cilium: CIDR selectors do not select nodes).
        set.insert(LabelTable::REMOTE_NODE);
        return Some((set, Scope::Reserved, false));
    }
    // Owners of one prefix mostly share a handful of label sets (the NameManager shares one
    // `Arc` per distinct set): merge each distinct set once.
    let mut merged: SmallVec<[*const LabelSet; 4]> = SmallVec::new();
    for (_, labels) in entry.owners() {
        let ptr = Arc::as_ptr(labels);
        if !merged.contains(&ptr) {
            if merged.len() < merged.inline_size() {
                merged.push(ptr);
            }
            set.extend(labels);
        }
    }
    if let Some(label) = cidr.longest_match(prefix) {
        set.insert(label);
    }
    if set.is_empty() {
        return None;
    }
    set.insert(LabelTable::world(matches!(prefix, IpNet::V4(_))));
    Some((set, Scope::Local, false))
}
