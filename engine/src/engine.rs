//! [`Engine`]: the NameManager and the IpCache over a datapath, and the order of operations.
//!
//! - A policy or endpoint change reaches the IpCache first (endpoint labels, CIDR labels,
//!   pre-allocated identities, selectors), then the NameManager relabels cached names with the
//!   selectors in force, then one ordered batch goes to the datapath. If the datapath refuses
//!   the batch, the engine goes back to the endpoints and rules it had and commits again, so a
//!   refused change leaves nothing behind (the datapath applies a batch whole or not at all).
//! - An answer is learned (NameManager → IpCache) and committed at once; a refused batch
//!   stays pending and goes with the next commit.

use std::net::IpAddr;
use std::time::Duration;

use fqdnd_config::Settings;
use fqdnd_ipcache::policy::Rule;
use fqdnd_ipcache::{Datapath, Endpoint, EndpointId, EndpointLabel, Identity, IpCache};
use fqdnd_namemgr::{
    Connections, Forget, Forgotten, FqdnSelector, GcStats, Learned, NameManager, Restore,
    RestoreAnswers, RestoreStats,
};
use ipnet::IpNet;
use serde::Serialize;

use crate::Error;

/// How identities are given to the IPs FQDN selectors select.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub enum IdentityMode {
    /// One identity per distinct label set (Cilium ≥ 1.16; fqdnd's own).
    #[default]
    #[serde(rename = "selector")]
    Selector,
    /// One identity per selected IP and no FQDN selector identities at all (Cilium ≤ 1.15),
    /// for comparisons.
    #[serde(rename = "per-ip")]
    PerIp,
}

impl IdentityMode {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Selector => "selector",
            Self::PerIp => "per-ip",
        }
    }
}

/// What one answer taught, and of how many addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Learning {
    /// What the NameManager did with the answer.
    pub learned: Learned,
    /// Addresses in the answer.
    pub total: usize,
}

impl Learning {
    /// Whether every address of the answer is known to the datapath now. An answer some of
    /// whose addresses were not learned (a circuit breaker, the name's IP cap, a full datapath
    /// map) must not be released as allowed: the datapath would not know those addresses.
    ///
    /// # Errors
    /// [`Error::NotLearned`] with the counts.
    pub fn complete(&self) -> Result<(), Error> {
        let missing = self.learned.rejected + self.learned.capped;
        if missing == 0 {
            Ok(())
        } else {
            Err(Error::NotLearned {
                missing,
                total: self.total,
            })
        }
    }
}

/// Cluster mode: what changed in the cluster's identities and other nodes' endpoints, as the
/// engine applies it ([`Engine::apply_cluster`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterUpdate {
    /// Label sets that lost their global number.
    pub unassigned: Vec<Vec<EndpointLabel>>,
    /// Label sets that got one (or another).
    pub assigned: Vec<(Vec<EndpointLabel>, Identity)>,
    /// Other nodes' endpoints gone, by name.
    pub remote_removed: Vec<String>,
    /// Other nodes' endpoints new or changed.
    pub remote_upserted: Vec<RemoteEndpoint>,
    /// Other nodes gone (their registration expired), by name.
    pub nodes_removed: Vec<String>,
    /// Other nodes registered, or whose own addresses changed.
    pub nodes_upserted: Vec<RemoteNode>,
}

impl ClusterUpdate {
    /// Whether there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.unassigned.is_empty()
            && self.assigned.is_empty()
            && self.remote_removed.is_empty()
            && self.remote_upserted.is_empty()
            && self.nodes_removed.is_empty()
            && self.nodes_upserted.is_empty()
    }
}

/// Another node of the cluster: its own addresses get the remote-node identity
/// ([`IpCache::upsert_remote_node`](fqdnd_ipcache::IpCache::upsert_remote_node)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteNode {
    /// Its name.
    pub name: String,
    /// Its own addresses (those it gives the host identity).
    pub addresses: Vec<IpAddr>,
}

/// Another node's endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteEndpoint {
    /// Its name (unique in the cluster: the key its node published it under).
    pub name: String,
    /// Its addresses.
    pub addresses: Vec<IpNet>,
    /// Its labels.
    pub labels: Vec<EndpointLabel>,
}

/// NameManager + IpCache over a datapath.
#[derive(Debug)]
pub struct Engine<D> {
    /// The NameManager (DNS cache, selectors, zombies).
    pub names: NameManager,
    /// The IpCache (metadata, identities, selector cache, endpoint policy).
    pub ipcache: IpCache<D>,
}

/// What the engine is built with: its two parts' own settings. The configuration's
/// `Settings` converts into it (`From<&Settings>`), so the engine needs nothing else of it.
#[derive(Debug, Clone, Default)]
pub struct Tunables {
    /// The NameManager's (TTL floor, breakers, cache bound).
    pub names: fqdnd_namemgr::Config,
    /// The IpCache's (FQDN identity breaker, pre-allocation).
    pub ipcache: fqdnd_ipcache::Config,
}

impl From<&Settings> for Tunables {
    fn from(settings: &Settings) -> Self {
        Self {
            names: settings.namemgr(),
            ipcache: settings.ipcache(),
        }
    }
}

impl<D: Datapath> Engine<D> {
    /// An engine with no endpoints and no policy, built with `tunables` (or the
    /// configuration's `Settings`, which convert).
    pub fn new(tunables: impl Into<Tunables>, mode: IdentityMode, datapath: D) -> Self {
        let Tunables { names, ipcache } = tunables.into();
        let per_ip = mode == IdentityMode::PerIp;
        let ipcache = fqdnd_ipcache::Config {
            identity_per_prefix: per_ip,
            preallocate_fqdn_identities: !per_ip && ipcache.preallocate_fqdn_identities,
            ..ipcache
        };
        Self {
            names: NameManager::new(names),
            ipcache: IpCache::new(ipcache, datapath),
        }
    }

    /// The engine of a loaded configuration: its settings, endpoints and policy, committed.
    ///
    /// # Errors
    /// The endpoints or policy are refused, or the datapath refuses the first batch.
    pub fn from_config(
        config: &fqdnd_config::Config,
        datapath: D,
        now: Duration,
    ) -> Result<Self, Error> {
        let mut engine = Self::new(&config.settings, IdentityMode::Selector, datapath);
        engine.apply(config.endpoints.clone(), config.rules.clone(), now)?;
        Ok(engine)
    }

    /// Brings the engine to `endpoints` and `rules` and commits. If any step fails, the
    /// endpoints and rules in force before stay in force (in the engine and the datapath).
    ///
    /// # Errors
    /// What refused the change; [`Error::Datapath`] says whether the rollback succeeded.
    pub fn apply(
        &mut self,
        endpoints: Vec<Endpoint>,
        rules: Vec<Rule>,
        now: Duration,
    ) -> Result<(), Error> {
        let old_endpoints: Vec<Endpoint> = self.ipcache.endpoints().values().cloned().collect();
        let old_rules = self.ipcache.rules().to_vec();
        let failed = match self.install(endpoints, rules, now) {
            Ok(()) => match self.ipcache.commit() {
                Ok(_) => return Ok(()),
                Err(source) => Error::Datapath {
                    rolled_back: true,
                    source,
                },
            },
            Err(e) => e,
        };
        match self.install(old_endpoints, old_rules, now).and_then(|()| {
            self.ipcache
                .commit()
                .map(|_| ())
                .map_err(|source| Error::Datapath {
                    rolled_back: true,
                    source,
                })
        }) {
            Ok(()) => Err(failed),
            Err(Error::Datapath { source, .. }) => Err(match failed {
                Error::Datapath { source: change, .. } => Error::RollbackFailed {
                    change,
                    rollback: source,
                },
                other => other,
            }),
            Err(_) => Err(failed),
        }
    }

    /// Replaces the policy, keeping the endpoints ([`Engine::apply`]).
    ///
    /// # Errors
    /// As [`Engine::apply`].
    pub fn set_policy(&mut self, rules: Vec<Rule>, now: Duration) -> Result<(), Error> {
        let endpoints = self.ipcache.endpoints().values().cloned().collect();
        self.apply(endpoints, rules, now)
    }

    /// The node's own addresses: the host identity (`reserved:host`) for each, committed.
    /// Returns whether they changed.
    ///
    /// # Errors
    /// The IpCache refused them ([`Error::Endpoints`]), or the datapath refused the batch (it
    /// stays pending and goes with the next commit).
    pub fn set_host_addresses(&mut self, addrs: &[IpAddr]) -> Result<bool, Error> {
        let changed = self
            .ipcache
            .set_host_addresses(addrs.iter().copied())
            .map_err(Error::Endpoints)?;
        if changed {
            self.commit()?;
        }
        Ok(changed)
    }

    /// Endpoints, then policy, then the NameManager's selectors; nothing committed.
    fn install(
        &mut self,
        endpoints: Vec<Endpoint>,
        rules: Vec<Rule>,
        now: Duration,
    ) -> Result<(), Error> {
        self.ipcache
            .set_endpoints(endpoints)
            .map_err(Error::Endpoints)?;
        self.ipcache.set_policy(rules).map_err(Error::Policy)?;
        let selectors = self
            .ipcache
            .fqdn_selector_keys()
            .iter()
            .map(|key| FqdnSelector::match_pattern(key))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::Selector)?;
        self.names
            .set_selectors(&selectors, now, &mut self.ipcache)?;
        Ok(())
    }

    /// Turns cluster mode on (before endpoints and policy are installed): endpoint label sets
    /// take the cluster's numbers, temporary ones meanwhile (see
    /// [`IpCache::enable_cluster`]).
    pub fn enable_cluster(&mut self) {
        self.ipcache.enable_cluster();
    }

    /// Applies what changed in the cluster, committed in two ordered steps so that a number
    /// never stands for two label sets in one batch: first what goes (numbers taken away,
    /// other nodes' endpoints removed), then what comes. Every change is tried; the batches
    /// hand over whatever was applied.
    ///
    /// # Errors
    /// The first change the IpCache refused ([`Error::Cluster`]), or the datapath refused a
    /// batch (it stays pending and goes with the next commit).
    pub fn apply_cluster(&mut self, update: ClusterUpdate) -> Result<(), Error> {
        let mut first: Option<Error> = None;
        let mut note = |r: Result<(), fqdnd_ipcache::Error>| {
            if let Err(e) = r {
                first.get_or_insert(Error::Cluster(e));
            }
        };
        if !update.unassigned.is_empty() {
            note(self.ipcache.assign_cluster_identities(
                update.unassigned.into_iter().map(|labels| (labels, None)),
            ));
        }
        for name in &update.remote_removed {
            note(self.ipcache.remove_remote_endpoint(name));
        }
        for name in &update.nodes_removed {
            note(self.ipcache.remove_remote_node(name));
        }
        self.commit()?;
        if !update.assigned.is_empty() {
            note(
                self.ipcache.assign_cluster_identities(
                    update
                        .assigned
                        .into_iter()
                        .map(|(labels, id)| (labels, Some(id))),
                ),
            );
        }
        for remote in &update.remote_upserted {
            note(self.ipcache.upsert_remote_endpoint(
                &remote.name,
                &remote.addresses,
                &remote.labels,
            ));
        }
        for node in &update.nodes_upserted {
            note(self.ipcache.upsert_remote_node(&node.name, &node.addresses));
        }
        self.commit()?;
        first.map_or(Ok(()), Err)
    }

    /// Learns that `endpoint` was answered `addrs` for `name` (canonical) with `ttl`, and
    /// commits what that changed.
    ///
    /// # Errors
    /// The NameManager refused the answer (invalid name, names-per-endpoint breaker), or the
    /// datapath refused the batch (it stays pending and goes with the next commit). What was
    /// applied before the error stays applied.
    pub fn learn(
        &mut self,
        endpoint: EndpointId,
        name: &str,
        addrs: &[IpAddr],
        ttl: u32,
        now: Duration,
    ) -> Result<Learning, Error> {
        let learned = self
            .names
            .observe(endpoint, name, addrs, ttl, now, &mut self.ipcache);
        // Commit whatever was applied, even when the NameManager stopped part-way.
        self.commit()?;
        Ok(Learning {
            learned: learned?,
            total: addrs.len(),
        })
    }

    /// Learns an answer without committing: a restored one, or one a peer gateway learned (a
    /// restore, or an import of a batch, commits once at the end).
    ///
    /// # Errors
    /// The NameManager refused the answer.
    pub fn restore_answer(
        &mut self,
        endpoint: EndpointId,
        name: &str,
        addrs: &[IpAddr],
        ttl: u32,
        now: Duration,
    ) -> Result<Learned, Error> {
        Ok(self
            .names
            .observe(endpoint, name, addrs, ttl, now, &mut self.ipcache)?)
    }

    /// Learns a restored DNS cache (latest expiry first: what a bound leaves out is what
    /// comes last) without committing; each answer that fails goes to `failed` with its
    /// error. Into an empty cache the IpCache's side is done in one pass
    /// ([`NameManager::restore`]).
    ///
    /// # Errors
    /// The IpCache failed in a way no answer explains.
    pub fn restore_answers(
        &mut self,
        answers: &(impl RestoreAnswers + ?Sized),
        now: Duration,
        failed: impl FnMut(&Restore<'_>, fqdnd_namemgr::Error),
    ) -> Result<RestoreStats, Error> {
        Ok(self
            .names
            .restore(answers, now, &mut self.ipcache, failed)?)
    }

    /// Forgets what `forget` names (`fqdnd cache forget`, an HA group's revocation) — at
    /// once, not as zombies — and commits: the datapath loses the addresses in one ordered
    /// batch, as a GC pass would release them.
    ///
    /// # Errors
    /// The name is invalid, the IpCache refused a removal, or the datapath refused the batch
    /// (it stays pending and goes with the next commit). What was removed stays removed.
    pub fn forget(&mut self, forget: &Forget<'_>) -> Result<Forgotten, Error> {
        let forgotten = self.names.forget(forget, &mut self.ipcache);
        self.commit()?;
        Ok(forgotten?)
    }

    /// What `fqdnd cache forget NAME [--address A] --client GROUP` forgets: the group's
    /// record of the name, and its mappings (`addrs`, or all) too — unless another endpoint
    /// still has a record of the name: the cache is shared, so its mappings stay for that
    /// endpoint. Without `endpoint`, the mappings for everyone.
    pub fn scope_forget<'a>(
        &self,
        name: &'a str,
        addrs: Option<&'a [IpAddr]>,
        endpoint: Option<EndpointId>,
    ) -> Forget<'a> {
        let shared = endpoint.is_some_and(|ep| {
            self.names
                .asked_by_others(&fqdnd_namemgr::canonicalize(name), ep)
        });
        Forget {
            name,
            addrs: if shared { Some(&[]) } else { addrs },
            endpoint,
        }
    }

    /// Hands the pending changes to the datapath.
    ///
    /// # Errors
    /// The datapath refused them; they stay pending.
    pub fn commit(&mut self) -> Result<(), Error> {
        self.ipcache
            .commit()
            .map(|_| ())
            .map_err(|source| Error::Datapath {
                rolled_back: false,
                source,
            })
    }

    /// One GC pass at `now` (expired names released unless `connections` says their IPs are
    /// in use), committed.
    ///
    /// # Errors
    /// The NameManager or the datapath refused a change.
    pub fn gc(&mut self, now: Duration, connections: &impl Connections) -> Result<GcStats, Error> {
        let stats = self.names.gc(now, connections, &mut self.ipcache)?;
        self.commit()?;
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fqdnd_ipcache::{MemoryDatapath, Scope, host_prefix};

    fn labels(app: &str) -> Vec<EndpointLabel> {
        vec![EndpointLabel {
            source: "k8s".into(),
            key: "app".into(),
            value: app.into(),
        }]
    }

    /// A forget reaches the datapath in one batch, and `--client` keeps the mappings of a
    /// name another client group still has.
    #[test]
    fn a_forget_is_one_batch_and_spares_a_name_another_group_has() {
        let config = fqdnd_config::load_str(
            "apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: a}
spec: {id: 1, addresses: [\"10.1.0.0/16\"], labels: {g: a}}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: b}
spec: {id: 2, addresses: [\"10.2.0.0/16\"], labels: {g: b}}
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: p}
spec:
  endpointSelector: {}
  egress:
  - toFQDNs: [{matchPattern: \"*.test\"}]
",
            std::path::Path::new("t.yaml"),
        )
        .unwrap();
        let mut engine =
            Engine::from_config(&config, MemoryDatapath::default(), Duration::ZERO).unwrap();
        let ip = |last| IpAddr::from([192, 0, 2, last]);
        let (a, b) = (EndpointId(1), EndpointId(2));
        engine
            .learn(a, "x.test.", &[ip(1), ip(2)], 300, Duration::ZERO)
            .unwrap();
        engine
            .learn(b, "x.test.", &[ip(1)], 300, Duration::ZERO)
            .unwrap();
        engine
            .learn(a, "y.test.", &[ip(3)], 300, Duration::ZERO)
            .unwrap();
        let unknown = engine.ipcache.datapath().identity_of(ip(200));
        // For group a only: b still has x.test., so its mappings stay.
        let two = [ip(2)];
        let scoped = engine.scope_forget("x.test", Some(&two), Some(a));
        assert_eq!(scoped.addrs, Some(&[][..]));
        let batches = engine.ipcache.datapath().batches();
        let f = engine.forget(&scoped).unwrap();
        assert_eq!((f.mappings, f.endpoint_records), (0, 1));
        assert_ne!(engine.ipcache.datapath().identity_of(ip(2)), unknown);
        // y.test. only a has: its mapping goes, in one batch.
        let scoped = engine.scope_forget("y.test.", None, Some(a));
        assert_eq!(scoped.addrs, None);
        engine.forget(&scoped).unwrap();
        // For everyone: one address.
        engine
            .forget(&Forget {
                name: "x.test.",
                addrs: Some(&[ip(2)]),
                endpoint: None,
            })
            .unwrap();
        let dp = engine.ipcache.datapath();
        // The record alone changed nothing the datapath holds; each other forget, one batch.
        assert_eq!(dp.batches(), batches + 2);
        assert_eq!(dp.identity_of(ip(3)), unknown);
        assert_eq!(dp.identity_of(ip(2)), unknown);
        assert_ne!(dp.identity_of(ip(1)), unknown);
    }

    /// A number collected from one label set and reused for another arrives as one update:
    /// the engine lets go of it in a first batch and gives it out in a second.
    #[test]
    fn a_reused_number_changes_hands_in_one_update() {
        let mut engine = Engine::new(
            &Settings::default(),
            IdentityMode::Selector,
            MemoryDatapath::default(),
        );
        engine.enable_cluster();
        let web = Endpoint {
            id: EndpointId(1),
            name: "web".into(),
            addresses: vec![host_prefix("10.0.0.2".parse().unwrap())],
            labels: labels("web"),
        };
        engine.apply(vec![web], Vec::new(), Duration::ZERO).unwrap();
        let db = RemoteEndpoint {
            name: "n2/1".into(),
            addresses: vec![host_prefix("10.0.0.1".parse().unwrap())],
            labels: labels("db"),
        };
        engine
            .apply_cluster(ClusterUpdate {
                assigned: vec![(labels("web"), Identity(300))],
                remote_upserted: vec![db],
                ..ClusterUpdate::default()
            })
            .unwrap();
        let batches = engine.ipcache.datapath().batches();
        engine
            .apply_cluster(ClusterUpdate {
                unassigned: vec![labels("web")],
                assigned: vec![(labels("db"), Identity(300))],
                ..ClusterUpdate::default()
            })
            .unwrap();
        assert_eq!(engine.ipcache.datapath().batches(), batches + 2);
        let dp = engine.ipcache.datapath();
        assert_eq!(dp.identity_of("10.0.0.1".parse().unwrap()), Identity(300));
        assert_eq!(
            dp.identity_of("10.0.0.2".parse().unwrap()).scope(),
            Some(Scope::Temporary)
        );
    }
}
