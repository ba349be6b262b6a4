//! A GC pass that releases most of the cache takes the bulk paths (the IpCache's metadata
//! rebuilt in one pass, the per-IP counts counted again, names dropped from the index in one
//! sweep); passes that release a little at a time take the one-by-one paths. Both must leave
//! the same state.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

mod common;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use common::{Engine, addr, name};
use fqdnd_ipcache::EndpointId;
use proptest::prelude::*;

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
