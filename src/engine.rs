//! The engine: NameManager and IpCache wired together, as every mode uses them.
//!
//! Order matters and lives here: a policy change reaches the IpCache first (CIDR labels,
//! pre-allocated identities, selectors), then the NameManager relabels cached names, then one
//! batch goes to the datapath.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use fqdnd_config::Config;
use fqdnd_ipcache::policy::Rule;
use fqdnd_ipcache::{Datapath, EndpointId, IpCache};
use fqdnd_namemgr::{Answer, Connections, FqdnSelector, GcStats, Learned, NameManager};

/// NameManager + IpCache over a datapath.
pub(crate) struct Engine<D> {
    /// The NameManager.
    pub(crate) names: NameManager,
    /// The IpCache.
    pub(crate) ipcache: IpCache<D>,
}

impl<D: Datapath> Engine<D> {
    /// Builds the engine from a loaded configuration: endpoints, then policy.
    pub(crate) fn new(config: &Config, datapath: D, now: Duration) -> Result<Self> {
        Self::restoring(config, datapath, now, Vec::new())
    }

    /// [`Engine::new`] after a restart: every label set in `identities` (canonical labels →
    /// number, from the checkpoint) gets its old number back, and those numbers are kept from
    /// other label sets until [`IpCache::finish_restore`].
    pub(crate) fn restoring(
        config: &Config,
        datapath: D,
        now: Duration,
        identities: Vec<(String, fqdnd_ipcache::Identity)>,
    ) -> Result<Self> {
        let mut engine = Self {
            names: NameManager::new(config.settings.namemgr()),
            ipcache: IpCache::new(config.settings.ipcache(), datapath),
        };
        if !identities.is_empty() {
            engine.ipcache.restore_identities(identities);
        }
        engine
            .ipcache
            .set_endpoints(config.endpoints.clone())
            .context("installing endpoints")?;
        engine.set_policy(config.rules.clone(), now)?;
        Ok(engine)
    }

    /// Replaces the policy and commits the result.
    pub(crate) fn set_policy(&mut self, rules: Vec<Rule>, now: Duration) -> Result<()> {
        self.ipcache
            .set_policy(rules)
            .context("installing policy")?;
        let selectors = self
            .ipcache
            .fqdn_selector_keys()
            .iter()
            .map(|key| FqdnSelector::match_pattern(key))
            .collect::<Result<Vec<_>, _>>()
            .context("policy holds an FQDN selector the NameManager rejects")?;
        self.names
            .set_selectors(&selectors, now, &mut self.ipcache)?;
        self.ipcache.commit()?;
        Ok(())
    }

    /// The endpoint whose addresses contain `client` (the longest match).
    pub(crate) fn endpoint_of(&self, client: IpAddr) -> Option<EndpointId> {
        self.ipcache
            .endpoints()
            .values()
            .flat_map(|ep| ep.addresses.iter().map(move |a| (a, ep.id)))
            .filter(|(a, _)| a.contains(&client))
            .max_by_key(|(a, _)| a.prefix_len())
            .map(|(_, id)| id)
    }

    /// Learns an answer for `endpoint` and commits it to the datapath.
    pub(crate) fn observe(
        &mut self,
        endpoint: EndpointId,
        answer: &Answer,
        now: Duration,
    ) -> Result<Learned> {
        self.observe_parts(endpoint, &answer.name, &answer.addrs, answer.ttl, now)
    }

    /// [`Engine::observe`] for an answer already taken apart: `addrs` for `name`, `ttl`.
    pub(crate) fn observe_parts(
        &mut self,
        endpoint: EndpointId,
        name: &str,
        addrs: &[IpAddr],
        ttl: u32,
        now: Duration,
    ) -> Result<Learned> {
        let learned = self
            .names
            .observe(endpoint, name, addrs, ttl, now, &mut self.ipcache);
        // Commit whatever was applied, even when the NameManager stopped part-way.
        self.ipcache.commit()?;
        Ok(learned?)
    }

    /// Learns a restored answer without committing (a restore commits once at the end).
    pub(crate) fn restore_parts(
        &mut self,
        endpoint: EndpointId,
        name: &str,
        addrs: &[IpAddr],
        ttl: u32,
        now: Duration,
    ) -> Result<Learned> {
        Ok(self
            .names
            .observe(endpoint, name, addrs, ttl, now, &mut self.ipcache)?)
    }

    /// Runs a GC pass and commits it.
    pub(crate) fn gc(&mut self, now: Duration, connections: &impl Connections) -> Result<GcStats> {
        let stats = self.names.gc(now, connections, &mut self.ipcache)?;
        self.ipcache.commit()?;
        Ok(stats)
    }
}
