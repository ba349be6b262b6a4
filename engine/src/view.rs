//! The engine's state as the admin API lists it (and the CLI prints it): the DNS cache in
//! Cilium's `fqdn cache list` shape, identities, the ipcache, and the counts `status` shows.
//! Plain serde types, so the server and the client share them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use fqdnd_ipcache::{Identity, OwnerId, ResourceOwner};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::{Clock, Engine};

/// One row of `fqdnd cache list`: one per (endpoint, name, source).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheRow {
    /// The endpoint that asked (`-` when none is recorded).
    pub endpoint: String,
    /// `lookup` (live) or `connection` (a zombie kept while in use).
    pub source: String,
    /// The name.
    pub fqdn: String,
    /// The TTL it was learned with, seconds.
    pub ttl: u32,
    /// When it expires (RFC 3339, seconds).
    pub expiration_time: String,
    /// Its addresses, sorted.
    pub ips: Vec<String>,
}

/// One row of `fqdnd identity list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityRow {
    /// The number.
    pub identity: u32,
    /// Its labels.
    pub labels: Vec<String>,
    /// References held.
    pub refs: u32,
}

/// One row of `fqdnd ipcache list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpcacheRow {
    /// The prefix.
    pub prefix: String,
    /// Its identity.
    pub identity: u32,
    /// Who put it there.
    pub owners: Vec<String>,
}

/// The engine's counts, as `status` and the metrics show them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Names in the DNS cache.
    pub cache_names: usize,
    /// (name, IP) mappings, zombies included.
    pub cache_entries: usize,
    /// Zombies.
    pub cache_zombies: usize,
    /// The bound on mappings (`breakers.maxCacheEntries`).
    pub cache_entries_max: usize,
    /// Identities allocated (all scopes).
    pub identities: usize,
    /// Identities created by DNS answers.
    pub fqdn_identities: usize,
    /// Prefixes with metadata.
    pub ipcache_prefixes: usize,
    /// Changes any circuit breaker rejected.
    pub breaker_trips: u64,
}

/// The wall-clock time (RFC 3339, seconds) of the moment `at` on `clock`.
pub fn wall_time(clock: &dyn Clock, at: Duration) -> String {
    let wall = UNIX_EPOCH + Duration::from_millis(clock.unix_ms_of(at));
    humantime::format_rfc3339_seconds(wall).to_string()
}

/// (endpoint, name, source) → (TTL, expiry, IPs), while building cache rows.
type CacheRows<'a> = BTreeMap<(String, String, &'a str), (u32, u32, Vec<String>)>;

impl<D> Engine<D> {
    /// The engine's counts.
    pub fn counts(&self) -> Counts {
        let alloc = self.ipcache.allocator();
        Counts {
            cache_names: self.names.name_count(),
            cache_entries: self.names.mapping_count(),
            cache_zombies: self.names.zombie_count(),
            cache_entries_max: self.names.config().max_cache_entries,
            identities: alloc.len(),
            fqdn_identities: alloc.from_dns_live(),
            ipcache_prefixes: self.ipcache.prefix_count(),
            breaker_trips: self.names.stats().breaker_trips,
        }
    }

    /// The DNS cache in Cilium's `fqdn cache list` shape; expiries on `clock`'s wall time.
    pub fn cache_rows(&self, clock: &dyn Clock) -> Vec<CacheRow> {
        let mut rows = CacheRows::new();
        for entry in self.names.entries() {
            let source = if entry.zombie { "connection" } else { "lookup" };
            let endpoints = self.names.endpoints_of(entry.name);
            let endpoints = if endpoints.is_empty() {
                vec!["-".to_owned()]
            } else {
                endpoints.iter().map(ToString::to_string).collect()
            };
            for endpoint in endpoints {
                let row = rows
                    .entry((endpoint, entry.name.to_string(), source))
                    .or_insert((0, 0, Vec::new()));
                row.0 = row
                    .0
                    .max(entry.ip.expires.saturating_sub(entry.last_lookup));
                row.1 = row.1.max(entry.ip.expires);
                row.2.push(entry.ip.addr.to_string());
            }
        }
        rows.into_iter()
            .map(|((endpoint, fqdn, source), (ttl, expires, mut ips))| {
                ips.sort();
                CacheRow {
                    endpoint,
                    source: source.to_owned(),
                    fqdn,
                    ttl,
                    expiration_time: wall_time(clock, Duration::from_secs(u64::from(expires))),
                    ips,
                }
            })
            .collect()
    }

    /// Every identity with its labels (sorted by text, as Cilium lists them), by number.
    pub fn identity_rows(&self) -> Vec<IdentityRow> {
        let mut rows: Vec<IdentityRow> = self
            .ipcache
            .allocator()
            .iter()
            .map(|(id, _, refs)| IdentityRow {
                identity: id.0,
                labels: self
                    .ipcache
                    .canonical_labels_of(id)
                    .unwrap_or_default()
                    .split(',')
                    .map(str::to_owned)
                    .collect(),
                refs,
            })
            .collect();
        rows.sort_by_key(|r| r.identity);
        rows
    }

    /// Every prefix with an identity.
    pub fn ipcache_rows(&self) -> Vec<IpcacheRow> {
        self.prefix_owners()
            .into_iter()
            .filter_map(|(prefix, identity, owners)| {
                Some(IpcacheRow {
                    prefix: prefix.to_string(),
                    identity: identity?.0,
                    owners,
                })
            })
            .collect()
    }

    /// Every prefix with its identity and its owners as text (`fqdn-name-manager/<name>`,
    /// `policy/<cidr>`, `endpoint/<id>`, `host/<address>`, sorted), ordered by prefix. The IpCache keeps no
    /// name for the NameManager's owners: they are named from the DNS cache.
    pub fn prefix_owners(&self) -> Vec<(IpNet, Option<Identity>, Vec<String>)> {
        let names = self.names.owner_names();
        let render = |id: OwnerId| match self.ipcache.owner(id) {
            Some(owner) => owner.to_string(),
            None => match names.get(&id) {
                Some(name) => ResourceOwner::name_manager(Arc::from(*name)).to_string(),
                None => format!("{:?}/?", id.kind()),
            },
        };
        self.ipcache
            .prefixes()
            .map(|(prefix, identity, owners)| {
                let mut owners: Vec<String> = owners.into_iter().map(render).collect();
                owners.sort();
                (prefix, identity, owners)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use fqdnd_ipcache::MemoryDatapath;

    use crate::Engine;

    /// `identity list` shows an identity's labels sorted by text, whatever order they were
    /// written (and first seen) in — they came out as `k8s:team=x,k8s:app=y`.
    #[test]
    fn identity_rows_list_labels_sorted() {
        let config = fqdnd_config::load_str(
            "apiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata: {name: a}\nspec: {id: 1, addresses: [10.0.0.1], labels: {team: x, app: y}}\n",
            Path::new("t.yaml"),
        )
        .unwrap();
        let engine =
            Engine::from_config(&config, MemoryDatapath::default(), Duration::ZERO).unwrap();
        let rows = engine.identity_rows();
        let labels: Vec<&Vec<String>> = rows
            .iter()
            .filter(|r| r.labels.iter().any(|l| l == "k8s:team=x"))
            .map(|r| &r.labels)
            .collect();
        assert_eq!(
            labels,
            [&vec![
                "k8s:app=y".to_owned(),
                "k8s:io.kubernetes.pod.namespace=default".to_owned(),
                "k8s:team=x".to_owned()
            ]],
            "{rows:?}"
        );
    }
}
