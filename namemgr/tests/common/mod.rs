//! The fixture the bulk-path tests share: a NameManager and an IpCache on the in-memory
//! datapath, names under two selectors and one unselected, and the state they hold in a
//! comparable form.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    dead_code,
    reason = "test code: a failed step should panic; each test binary uses part of this"
)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use fqdnd_ipcache::{EndpointId, Identity, IpCache, MemoryDatapath, OwnerId};
use fqdnd_namemgr::{Config, FqdnSelector, NameManager};
use ipnet::IpNet;

/// Names under two selectors (one matches all, one a subset), and one unselected.
pub(crate) fn name(i: usize) -> String {
    match i % 5 {
        0 => format!("n{i}.other.test"),
        1 | 2 => format!("n{i}.sub.example.com"),
        _ => format!("n{i}.example.com"),
    }
}

pub(crate) fn addr(i: u16) -> IpAddr {
    if i % 7 == 6 {
        IpAddr::from(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i))
    } else {
        IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + u32::from(i)))
    }
}

pub(crate) struct Engine {
    pub(crate) names: NameManager,
    pub(crate) ipcache: IpCache<MemoryDatapath>,
}

impl Engine {
    pub(crate) fn new() -> Self {
        Self::with(
            Config {
                max_zombies: 8,
                ..Config::default()
            },
            fqdnd_ipcache::Config::default(),
        )
    }

    pub(crate) fn with(config: Config, ipcache: fqdnd_ipcache::Config) -> Self {
        let mut ipcache = IpCache::new(ipcache, MemoryDatapath::default());
        let mut names = NameManager::new(config);
        let selectors: Vec<FqdnSelector> = ["*.example.com", "**.sub.example.com"]
            .iter()
            .map(|s| FqdnSelector::match_pattern(s).unwrap())
            .collect();
        names
            .set_selectors(&selectors, Duration::ZERO, &mut ipcache)
            .unwrap();
        Self { names, ipcache }
    }

    pub(crate) fn gc(&mut self, now: u64, in_use: &BTreeSet<IpAddr>) {
        self.names
            .gc(
                Duration::from_secs(now),
                &|a: IpAddr| in_use.contains(&a),
                &mut self.ipcache,
            )
            .unwrap();
        self.ipcache.commit().unwrap();
    }

    /// An identity's labels, sorted (label ids, and so their rendering order, depend on the
    /// order selectors were registered in).
    fn labels(&self, id: Identity) -> Option<BTreeSet<String>> {
        let text = self.ipcache.labels_of(id)?;
        Some(text.split(',').map(str::to_owned).collect())
    }

    /// Everything the NameManager and the IpCache hold, in a comparable form.
    pub(crate) fn state(&self) -> State {
        let entries = self
            .names
            .entries()
            .map(|e| (e.name.to_owned(), e.ip.addr, e.ip.expires, e.zombie))
            .collect();
        let prefixes = self
            .ipcache
            .prefixes()
            .map(|(p, id, owners)| (p, id.and_then(|id| self.labels(id)), owners.len()))
            .collect();
        let datapath = self
            .ipcache
            .prefixes()
            .map(|(p, _, _)| {
                let ip = p.addr();
                let id = self.ipcache.datapath().identity_of(ip);
                (ip, self.labels(id))
            })
            .collect();
        let endpoints = self
            .names
            .entries()
            .flat_map(|e| {
                let name = e.name.to_owned();
                self.names
                    .endpoints_of(e.name)
                    .into_iter()
                    .map(move |ep| (name.clone(), ep))
            })
            .collect();
        let mut listed: HashMap<OwnerId, usize> = HashMap::new();
        for (_, _, owners) in self.ipcache.prefixes() {
            for owner in owners {
                *listed.entry(owner).or_default() += 1;
            }
        }
        let claims = (self.names.owner_names().into_iter())
            .map(|(owner, name)| {
                let listed = listed.get(&owner).copied().unwrap_or(0);
                (name.to_owned(), (self.ipcache.owner_claims(owner), listed))
            })
            .collect();
        State {
            claims,
            entries,
            prefixes,
            ips: self.names.ip_count(),
            names: self.names.name_count(),
            identities: {
                let allocator = self.ipcache.allocator();
                let mut live: Vec<_> = allocator
                    .iter()
                    .map(|(id, _, refs)| (self.labels(id), refs))
                    .collect();
                live.sort();
                live
            },
            datapath,
            endpoints,
        }
    }
}

/// What [`Engine::state`] returns.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct State {
    pub(crate) entries: BTreeSet<(String, IpAddr, u32, bool)>,
    pub(crate) prefixes: Vec<(IpNet, Option<BTreeSet<String>>, usize)>,
    pub(crate) ips: usize,
    pub(crate) names: usize,
    /// Live identities: their labels and references.
    pub(crate) identities: Vec<(Option<BTreeSet<String>>, u32)>,
    pub(crate) datapath: BTreeSet<(IpAddr, Option<BTreeSet<String>>)>,
    pub(crate) endpoints: BTreeSet<(String, EndpointId)>,
    /// Each name's owner: the prefixes the IpCache counts it claiming, and those that list
    /// it.
    pub(crate) claims: BTreeMap<String, (Option<u32>, usize)>,
}
