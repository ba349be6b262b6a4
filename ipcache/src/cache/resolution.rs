//! Resolution: owners' labels on a prefix in, the prefix's identity out. A claim set or
//! dropped goes through [`resolve_entry`], which works out the labels the prefix should
//! carry, checks the breakers (FQDN identities, the datapath's room) before anything
//! changes, moves the identity references and queues the datapath's change.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use smallvec::SmallVec;

use super::IpCache;
use super::identities::Identities;
use crate::datapath::Datapath;
use crate::error::{Breaker, Error};
use crate::identity::{Identity, Scope};
use crate::labels::{Label, LabelSet, LabelTable};
use crate::metadata::{CidrLabels, OwnerId, OwnerKind, Owners, PrefixEntry};

/// How often a tripped breaker may log a warning.
const BREAKER_WARNING_INTERVAL: Duration = Duration::from_secs(10);

impl<D: Datapath> IpCache<D> {
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
    pub(super) fn resolve_all(&mut self, prefixes: BTreeSet<IpNet>) -> Result<(), Error> {
        let mut first = None;
        for prefix in prefixes {
            if let Err(e) = self.resolve(prefix) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Brings `prefix`'s identity in line with its metadata.
    pub(super) fn resolve(&mut self, prefix: IpNet) -> Result<(), Error> {
        let mut ids = identities!(self);
        self.meta
            .with_entry(prefix, false, |entry, _, cidr| {
                resolve_entry(&mut ids, entry, cidr, prefix, false, None)
            })
            .unwrap_or(Ok(()))
    }

    pub(super) fn warn_breaker(&mut self, now: Duration, err: &Error) {
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
pub(super) fn resolve_entry(
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
pub(super) fn set_identity(
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
pub(super) fn desired_labels(
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
