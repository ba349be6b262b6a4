//! Forgetting what DNS answered, on demand (`fqdnd cache forget`, an HA group's revocation):
//! the mappings go at once — not as zombies, whatever the datapath reports in use — and
//! their IpCache claims with them.

use std::net::IpAddr;

use fqdnd_ipcache::{Datapath, EndpointId, IpCache, host_prefix};

use super::NameManager;
use crate::cache::DnsCache;
use crate::error::Error;
use crate::name::DnsName;

/// What to forget of one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forget<'a> {
    /// The name (canonicalised as an answer's would be).
    pub name: &'a str,
    /// The mappings to remove, for every endpoint (the cache is shared: an address is
    /// selected for whoever's policy selects its name); `None`: every mapping of the name.
    pub addrs: Option<&'a [IpAddr]>,
    /// An endpoint whose record of the name goes too.
    pub endpoint: Option<EndpointId>,
}

/// What a forget removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// (name, IP) mappings removed, live and zombie.
    pub mappings: usize,
    /// Endpoint records of the name removed (the endpoint's, or every one when the name
    /// went).
    pub endpoint_records: usize,
    /// Whether the name left the cache (it held nothing more).
    pub name_removed: bool,
}

impl Forgotten {
    /// Whether anything was removed.
    pub fn is_empty(&self) -> bool {
        self.mappings == 0 && self.endpoint_records == 0
    }
}

impl NameManager {
    /// Removes what `forget` names: the endpoint's record of the name (if given), then the
    /// mappings (the addresses given, or all), each with its IpCache claim (the caller
    /// commits). A name left without mappings leaves the cache with its endpoint records.
    /// A name not cached forgets nothing.
    ///
    /// # Errors
    /// The name is not a valid DNS name, or the IpCache refused a removal (what was removed
    /// before stays removed).
    pub fn forget<D: Datapath>(
        &mut self,
        forget: &Forget<'_>,
        ipcache: &mut IpCache<D>,
    ) -> Result<Forgotten, Error> {
        let found = match self.cache.names.find(forget.name) {
            Some(idx) => Some(idx),
            None => {
                let canonical =
                    DnsName::canonical(forget.name).map_err(|error| Error::InvalidName {
                        name: forget.name.to_owned(),
                        error,
                    })?;
                self.cache.names.find(&canonical)
            }
        };
        let mut done = Forgotten::default();
        let Some(idx) = found else {
            return Ok(done);
        };
        let DnsCache {
            names,
            ips,
            endpoint_names,
            ..
        } = &mut self.cache;
        let Some(entry) = names.get_mut(idx) else {
            return Ok(done);
        };
        if let Some(endpoint) = forget.endpoint
            && entry.endpoints.remove(endpoint)
        {
            DnsCache::forget_endpoints(endpoint_names, endpoint, 1);
            done.endpoint_records += 1;
        }
        let claim = entry.owner.filter(|_| !entry.labels.is_empty());
        let mut released = Vec::new();
        let mut zombies = 0;
        entry.ips.retain(|m| {
            let gone = forget.addrs.is_none_or(|addrs| addrs.contains(&m.addr));
            if gone {
                released.push(m.addr);
                zombies += usize::from(m.zombie);
            }
            !gone
        });
        if zombies > 0 {
            entry.recount_zombies();
        }
        let empty = entry.ips.is_empty();
        for &addr in &released {
            if let Some(owner) = claim {
                ipcache.remove_metadata(host_prefix(addr), owner)?;
            }
            ips.unlink(addr);
        }
        self.zombies -= zombies;
        self.entries -= released.len();
        done.mappings = released.len();
        if empty && let Some(entry) = names.remove(idx) {
            for (endpoint, _) in entry.endpoints.iter() {
                DnsCache::forget_endpoints(endpoint_names, endpoint, 1);
                done.endpoint_records += 1;
            }
            if let Some(owner) = entry.owner {
                ipcache.remove_owner(owner)?;
            }
            done.name_removed = true;
            self.cache.forget_unused_label_sets();
        }
        Ok(done)
    }

    /// Whether an endpoint other than `endpoint` has a record of the (canonical) `name`.
    pub fn asked_by_others(&self, name: &str, endpoint: EndpointId) -> bool {
        self.cache
            .names
            .find(name)
            .and_then(|idx| self.cache.names.get(idx))
            .is_some_and(|e| e.endpoints.iter().any(|(ep, _)| ep != endpoint))
    }
}
