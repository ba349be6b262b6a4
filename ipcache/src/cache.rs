//! The IpCache: prefix metadata in, prefix → identity and per-endpoint policy out.
//!
//! [`IpCache`] owns the prefix metadata (each owner's labels on each prefix), the interned
//! labels, the identity allocator, the selector cache, every endpoint's policy, the rules,
//! endpoints and node addresses they came from, cluster mode's state, and what the datapath
//! does not have yet ([`Pending`]). Every change goes to `Pending` as it is made; only
//! [`IpCache::commit`] writes to the datapath, in one batch in this order: policy entries
//! added, ipcache upserts, ipcache deletes, policy entries removed (a packet never meets a
//! prefix's new identity before that identity's policy entries, and an old identity's
//! entries go only after the prefixes that had it moved).
//!
//! This file holds the struct, [`Pending`] and the commit; the rest is by concern:
//! - `owners`: registering and giving up resource owners;
//! - `resolution`: owners' labels on prefixes in, each prefix's identity out;
//! - `identities`: identity references and what follows a number's coming and going;
//! - `policy`: endpoints, node addresses and rules, and the policy they make;
//! - `cluster`: cluster mode's assigned numbers and other nodes' endpoints and addresses;
//! - `bulk`: many claims in one pass (a restore).

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use ipnet::IpNet;

use crate::config::Config;
use crate::datapath::{Datapath, DatapathChange, PolicyKey};
use crate::endpoint::{Endpoint, EndpointId};
use crate::endpoint_policy::PolicyState;
use crate::error::Error;
use crate::identity::{Allocator, Identity};
use crate::labels::{LabelId, LabelTable};
use crate::metadata::Metadata;
use crate::policy::Rule;
use crate::selector::{SelectorCache, SelectorIdx};

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

/// Borrows the fields identity changes touch, leaving `meta` free for the caller. Defined
/// before the submodules so that they can use it.
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
mod resolution;
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
}

impl<D> IpCache<D> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_change_cancels_a_pending_one_the_other_way() {
        let key = |n| PolicyKey {
            identity: Identity(n),
            ..PolicyKey::ALLOW_ALL
        };
        let (one, two) = (EndpointId(1), EndpointId(2));
        let mut pending = Pending::default();
        pending.policy_change(one, key(300), true);
        pending.policy_change(one, key(300), false);
        pending.policy_change(one, key(301), false);
        pending.policy_change(one, key(301), true);
        assert!(pending.is_empty(), "{:?}", pending.policy);

        // Only the same endpoint and key cancel; a repeat stays one change.
        pending.policy_change(one, key(302), true);
        pending.policy_change(two, key(302), false);
        pending.policy_change(one, key(303), true);
        pending.policy_change(one, key(303), true);
        let changes: Vec<_> = pending.policy.into_iter().collect();
        assert_eq!(
            changes,
            [
                ((one, key(302)), true),
                ((one, key(303)), true),
                ((two, key(302)), false),
            ]
        );
    }
}
