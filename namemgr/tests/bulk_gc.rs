//! A GC pass that releases most of the cache takes the bulk paths (the IpCache's metadata
//! rebuilt in one pass, the per-IP counts counted again, names dropped from the index in one
//! sweep); passes that release a little at a time take the one-by-one paths. Both must leave
//! the same state.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use fqdnd_ipcache::{EndpointId, Identity, IpCache, MemoryDatapath};
use fqdnd_namemgr::{Config, FqdnSelector, NameManager};
use ipnet::IpNet;
use proptest::prelude::*;

/// Names under two selectors (one matches all, one a subset), and one unselected.
fn name(i: usize) -> String {
    match i % 5 {
        0 => format!("n{i}.other.test"),
        1 | 2 => format!("n{i}.sub.example.com"),
        _ => format!("n{i}.example.com"),
    }
}

fn addr(i: u16) -> IpAddr {
    if i % 7 == 6 {
        IpAddr::from(std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i))
    } else {
        IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + u32::from(i)))
    }
}

struct Engine {
    names: NameManager,
    ipcache: IpCache<MemoryDatapath>,
}

impl Engine {
    fn new() -> Self {
        let mut ipcache = IpCache::new(fqdnd_ipcache::Config::default(), MemoryDatapath::default());
        let mut names = NameManager::new(Config {
            max_zombies: 8,
            ..Config::default()
        });
        let selectors: Vec<FqdnSelector> = ["*.example.com", "**.sub.example.com"]
            .iter()
            .map(|s| FqdnSelector::match_pattern(s).unwrap())
            .collect();
        names
            .set_selectors(&selectors, Duration::ZERO, &mut ipcache)
            .unwrap();
        Self { names, ipcache }
    }

    fn gc(&mut self, now: u64, in_use: &BTreeSet<IpAddr>) {
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

    /// Everything a GC pass can change, in a comparable form.
    #[allow(clippy::type_complexity, reason = "a test's snapshot")]
    fn state(
        &self,
    ) -> (
        BTreeSet<(String, IpAddr, u32, bool)>,
        Vec<(IpNet, Option<BTreeSet<String>>, usize)>,
        usize,
        usize,
        usize,
        BTreeSet<(IpAddr, Option<BTreeSet<String>>)>,
    ) {
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
        (
            entries,
            prefixes,
            self.names.ip_count(),
            self.names.name_count(),
            self.ipcache.allocator().len(),
            datapath,
        )
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The same cache, released in one pass (bulk) or over many small passes, ends the same.
    #[test]
    fn one_large_pass_equals_many_small_ones(
        answers in prop::collection::vec(
            (0usize..400, prop::collection::vec(0u16..300, 1..4), 1u32..200),
            200..500,
        ),
        in_use in prop::collection::btree_set(0u16..300, 0..20),
        until in 100u64..220,
    ) {
        let mut bulk = Engine::new();
        let mut steps = Engine::new();
        for (n, ips, ttl) in &answers {
            let addrs: Vec<IpAddr> = ips.iter().map(|i| addr(*i)).collect();
            for e in [&mut bulk, &mut steps] {
                e.names
                    .observe(EndpointId(1), &name(*n), &addrs, *ttl, Duration::ZERO, &mut e.ipcache)
                    .unwrap();
                e.ipcache.commit().unwrap();
            }
        }
        let in_use: BTreeSet<IpAddr> = in_use.into_iter().map(addr).collect();
        // Second by second: each pass releases a small part of the cache.
        for now in 1..=until {
            steps.gc(now, &in_use);
        }
        bulk.gc(until, &in_use);
        // Expired-in-use mappings became zombies in both; with nothing in use any more, the
        // zombies go too (a large pass again for `bulk`, small ones for `steps`).
        let none = BTreeSet::new();
        prop_assert!(bulk.state() == steps.state(), "after the expiry pass(es)");
        steps.gc(until + 1, &none);
        bulk.gc(until + 1, &none);
        prop_assert!(bulk.state() == steps.state(), "after the zombie pass(es)");
    }
}
