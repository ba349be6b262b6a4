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
use fqdnd_ipcache::{Datapath, Endpoint, EndpointId, IpCache};
use fqdnd_namemgr::{Connections, FqdnSelector, GcStats, Learned, NameManager};
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

/// NameManager + IpCache over a datapath.
#[derive(Debug)]
pub struct Engine<D> {
    /// The NameManager (DNS cache, selectors, zombies).
    pub names: NameManager,
    /// The IpCache (metadata, identities, selector cache, endpoint policy).
    pub ipcache: IpCache<D>,
}

impl<D: Datapath> Engine<D> {
    /// An engine with no endpoints and no policy, configured from `settings`.
    pub fn new(settings: &Settings, mode: IdentityMode, datapath: D) -> Self {
        let per_ip = mode == IdentityMode::PerIp;
        let ipcache = fqdnd_ipcache::Config {
            identity_per_prefix: per_ip,
            preallocate_fqdn_identities: !per_ip && settings.ipcache().preallocate_fqdn_identities,
            ..settings.ipcache()
        };
        Self {
            names: NameManager::new(settings.namemgr()),
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

    /// Learns a restored answer without committing (a restore commits once, at the end).
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
