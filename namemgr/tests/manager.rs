//! NameManager behaviour: TTLs, caps, zombies, breakers, relabelling.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::net::IpAddr;
use std::time::Duration;

use fqdnd_ipcache::{EndpointId, IpCache, MemoryDatapath, host_prefix};
use fqdnd_namemgr::{Breaker, Config, Error, FqdnSelector, NameManager};

const EP: EndpointId = EndpointId(7);

fn ip(i: u32) -> IpAddr {
    IpAddr::from(std::net::Ipv4Addr::from(0xc000_0200 + i))
}

fn setup(config: Config, selectors: &[&str]) -> (NameManager, IpCache<MemoryDatapath>) {
    let mut ipcache = IpCache::new(fqdnd_ipcache::Config::default(), MemoryDatapath::default());
    let mut names = NameManager::new(config);
    let sels: Vec<FqdnSelector> = selectors
        .iter()
        .map(|s| FqdnSelector::match_pattern(s).unwrap())
        .collect();
    names
        .set_selectors(&sels, Duration::ZERO, &mut ipcache)
        .unwrap();
    (names, ipcache)
}

fn at(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn nothing_in_use(_: IpAddr) -> bool {
    false
}

#[test]
fn ttl_is_raised_to_the_minimum_and_expires_on_gc() {
    let (mut n, mut c) = setup(
        Config {
            min_ttl: 60,
            ..Config::default()
        },
        &["*.example.com"],
    );
    let learned = n
        .observe(EP, "A.Example.com", &[ip(1)], 5, at(100), &mut c)
        .unwrap();
    assert_eq!((learned.new, learned.is_new_state()), (1, true));
    let entry = n.entries().next().unwrap();
    assert_eq!(entry.name, "a.example.com.");
    assert_eq!(entry.ip.expires, 160);
    assert!(c.identity_of(&host_prefix(ip(1))).is_some());
    // A refresh only extends the lifetime.
    let again = n
        .observe(EP, "a.example.com.", &[ip(1)], 100, at(110), &mut c)
        .unwrap();
    assert_eq!(
        (again.new, again.refreshed, again.is_new_state()),
        (0, 1, false)
    );
    n.gc(at(209), &nothing_in_use, &mut c).unwrap();
    assert_eq!(n.mapping_count(), 1);
    let gc = n.gc(at(210), &nothing_in_use, &mut c).unwrap();
    assert_eq!((gc.expired, gc.released, gc.names_removed), (1, 1, 1));
    assert_eq!(c.identity_of(&host_prefix(ip(1))), None);
    assert_eq!(n.endpoint_name_count(EP), 0);
}

#[test]
fn expired_ips_in_use_stay_as_zombies_until_unused() {
    let (mut n, mut c) = setup(Config::default(), &["*.example.com"]);
    n.observe(EP, "a.example.com", &[ip(1), ip(2)], 10, at(0), &mut c)
        .unwrap();
    let in_use = |a: IpAddr| a == ip(1);
    n.gc(at(10), &in_use, &mut c).unwrap();
    assert_eq!(n.zombie_count(), 1);
    assert!(
        c.identity_of(&host_prefix(ip(1))).is_some(),
        "a zombie keeps its labels"
    );
    assert_eq!(c.identity_of(&host_prefix(ip(2))), None);
    // A new answer revives the zombie.
    let learned = n
        .observe(EP, "a.example.com", &[ip(1)], 10, at(11), &mut c)
        .unwrap();
    assert_eq!(learned.revived, 1);
    assert_eq!(n.zombie_count(), 0);
    n.gc(at(30), &nothing_in_use, &mut c).unwrap();
    assert_eq!(n.mapping_count(), 0);
}

#[test]
fn the_hostname_cap_evicts_the_earliest_expiring_into_zombies() {
    let (mut n, mut c) = setup(
        Config {
            max_ips_per_hostname: 2,
            ..Config::default()
        },
        &["*.s3.amazonaws.com"],
    );
    n.observe(EP, "b.s3.amazonaws.com", &[ip(1)], 5, at(0), &mut c)
        .unwrap();
    n.observe(EP, "b.s3.amazonaws.com", &[ip(2)], 5, at(1), &mut c)
        .unwrap();
    n.observe(EP, "b.s3.amazonaws.com", &[ip(3)], 5, at(2), &mut c)
        .unwrap();
    assert_eq!(n.zombie_count(), 1);
    let live: Vec<IpAddr> = n
        .entries()
        .filter(|e| !e.zombie)
        .map(|e| e.ip.addr)
        .collect();
    assert!(live.contains(&ip(2)) && live.contains(&ip(3)));
    // One answer with more IPs than the cap keeps the first ones.
    let (mut n, mut c) = setup(
        Config {
            max_ips_per_hostname: 2,
            ..Config::default()
        },
        &[],
    );
    let learned = n
        .observe(EP, "x.example", &[ip(1), ip(2), ip(3)], 5, at(0), &mut c)
        .unwrap();
    assert_eq!((learned.new, learned.capped), (2, 1));
}

#[test]
fn zombie_cap_releases_the_oldest() {
    let (mut n, mut c) = setup(
        Config {
            max_zombies: 2,
            ..Config::default()
        },
        &["*"],
    );
    for i in 0..4 {
        n.observe(
            EP,
            &format!("n{i}.example"),
            &[ip(i)],
            1,
            at(u64::from(i)),
            &mut c,
        )
        .unwrap();
    }
    let all = |_: IpAddr| true;
    let gc = n.gc(at(100), &all, &mut c).unwrap();
    assert_eq!((gc.expired, gc.over_cap), (4, 2));
    assert_eq!(n.zombie_count(), 2);
    let kept: Vec<IpAddr> = n.entries().map(|e| e.ip.addr).collect();
    assert!(kept.contains(&ip(2)) && kept.contains(&ip(3)), "{kept:?}");
    assert_eq!(c.identity_of(&host_prefix(ip(0))), None);
}

#[test]
fn breakers_reject_without_touching_existing_state() {
    let (mut n, mut c) = setup(
        Config {
            max_names_per_endpoint: 2,
            max_ips_per_name: 3,
            ..Config::default()
        },
        &["*"],
    );
    n.observe(EP, "a.example", &[ip(1)], 60, at(0), &mut c)
        .unwrap();
    n.observe(EP, "b.example", &[ip(2)], 60, at(0), &mut c)
        .unwrap();
    let err = n
        .observe(EP, "c.example", &[ip(3)], 60, at(0), &mut c)
        .unwrap_err();
    assert!(matches!(
        err,
        Error::BreakerTripped {
            breaker: Breaker::NamesPerEndpoint,
            limit: 2,
            ..
        }
    ));
    assert_eq!(n.name_count(), 2);
    // A known name still refreshes; another endpoint is not affected.
    n.observe(EP, "a.example", &[ip(1)], 60, at(1), &mut c)
        .unwrap();
    n.observe(EndpointId(8), "c.example", &[ip(3)], 60, at(1), &mut c)
        .unwrap();
    // Per-name IP breaker.
    let learned = n
        .observe(EP, "a.example", &[ip(4), ip(5), ip(6)], 60, at(2), &mut c)
        .unwrap();
    assert_eq!((learned.new, learned.rejected), (2, 1));
    assert_eq!(c.identity_of(&host_prefix(ip(6))), None);
    assert_eq!(n.stats().breaker_trips, 2);
}

#[test]
fn invalid_names_are_not_stored() {
    let (mut n, mut c) = setup(Config::default(), &["*"]);
    let long = format!("{}.example", "a".repeat(250));
    for bad in [long.as_str(), "bad name.example", "a..example", "."] {
        let err = n.observe(EP, bad, &[ip(1)], 60, at(0), &mut c).unwrap_err();
        assert!(matches!(err, Error::InvalidName { .. }), "{bad}: {err}");
    }
    assert_eq!(n.mapping_count(), 0);
    assert_eq!(n.stats().invalid_names, 4);
}

#[test]
fn selector_changes_relabel_cached_ips() {
    let (mut n, mut c) = setup(Config::default(), &[]);
    n.observe(EP, "www.cilium.io", &[ip(1)], 60, at(0), &mut c)
        .unwrap();
    assert_eq!(
        c.identity_of(&host_prefix(ip(1))),
        None,
        "unselected names stay out of the ipcache"
    );
    let add = [FqdnSelector::match_pattern("*.cilium.io").unwrap()];
    n.set_selectors(&add, at(1), &mut c).unwrap();
    let id = c.identity_of(&host_prefix(ip(1))).unwrap();
    assert_eq!(
        c.labels_of(id).unwrap(),
        "reserved:world-ipv4,fqdn:*.cilium.io."
    );
    assert_eq!(n.names_of(ip(1)).len(), 1);
    n.set_selectors(&[], at(2), &mut c).unwrap();
    assert_eq!(c.identity_of(&host_prefix(ip(1))), None);
    assert_eq!(
        n.mapping_count(),
        1,
        "the cache keeps the name for future selectors"
    );
}

#[test]
fn the_cache_bound_holds_across_endpoints_and_gc_makes_room_again() {
    let (mut n, mut c) = setup(
        Config {
            max_cache_entries: 10,
            ..Config::default()
        },
        &["*.flood.test"],
    );
    // A water-torture flood from many endpoints: each endpoint is far below its own
    // breaker, the whole cache is not.
    for i in 0..100u32 {
        let ep = EndpointId(u16::try_from(i % 7).unwrap());
        let learned = n
            .observe(ep, &format!("r{i}.flood.test"), &[ip(i)], 30, at(1), &mut c)
            .unwrap();
        if i < 10 {
            assert_eq!(learned.new, 1);
        } else {
            assert_eq!((learned.new, learned.rejected), (0, 1), "name {i}");
        }
        assert!(n.mapping_count() <= 10);
    }
    assert_eq!(n.mapping_count(), n.entries().count());
    assert_eq!(n.name_count(), 10, "rejected names leave no entry behind");
    assert_eq!(n.stats().trips.cache_entries, 90);
    // A known name is still refreshed at the bound.
    let refreshed = n
        .observe(EndpointId(0), "r0.flood.test", &[ip(0)], 60, at(2), &mut c)
        .unwrap();
    assert_eq!((refreshed.refreshed, refreshed.rejected), (1, 0));
    // Once GC released the expired ones there is room again.
    n.gc(at(40), &nothing_in_use, &mut c).unwrap();
    assert_eq!(n.mapping_count(), 1);
    assert_eq!(n.mapping_count(), n.entries().count());
    let learned = n
        .observe(EP, "new.flood.test", &[ip(500)], 30, at(41), &mut c)
        .unwrap();
    assert_eq!(learned.new, 1);
}

#[test]
fn ten_thousand_addresses_for_one_name_are_capped() {
    // One DNS message holds at most ~4k A records (64 KiB); the engine takes the addresses of
    // several messages, or one in-memory answer, the same way.
    let (mut n, mut c) = setup(
        Config {
            max_ips_per_hostname: 1000,
            max_ips_per_name: 2000,
            ..Config::default()
        },
        &["*.big.test"],
    );
    let all: Vec<IpAddr> = (0..10_000).map(ip).collect();
    let learned = n
        .observe(EP, "cdn.big.test", &all, 300, at(1), &mut c)
        .unwrap();
    assert_eq!((learned.new, learned.capped), (1000, 9000));
    // Later answers evict the earliest-expiring into zombies, up to the per-name breaker.
    for (k, chunk) in all.chunks(2500).enumerate() {
        n.observe(EP, "cdn.big.test", chunk, 300, at(10 + k as u64), &mut c)
            .unwrap();
        assert!(n.mapping_count() <= 2000, "{}", n.mapping_count());
    }
    assert_eq!(n.mapping_count(), 2000);
    assert!(n.stats().trips.ips_per_name > 0);
}

/// `fqdnd cache forget`: mappings go at once — a zombie too, whatever conntrack says — with
/// their IpCache claims; a name left without mappings goes with its endpoint records; an
/// endpoint's record goes alone while another endpoint still has the name.
#[test]
fn forgetting_removes_mappings_and_records_at_once() {
    use fqdnd_namemgr::Forget;
    let other = EndpointId(8);
    let (mut n, mut c) = setup(
        Config {
            max_ips_per_hostname: 2,
            ..Config::default()
        },
        &["*.example.com"],
    );
    n.observe(EP, "a.example.com", &[ip(1), ip(2)], 300, at(0), &mut c)
        .unwrap();
    n.observe(other, "a.example.com", &[ip(3)], 300, at(1), &mut c)
        .unwrap();
    // ip(1) expired early in the cap's eviction: a zombie.
    assert_eq!(n.zombie_count(), 1);
    n.observe(EP, "b.example.com", &[ip(9)], 300, at(0), &mut c)
        .unwrap();
    // One address, for everyone; named as a client would type it.
    let f = n
        .forget(
            &Forget {
                name: "A.Example.COM",
                addrs: Some(&[ip(2)]),
                endpoint: None,
            },
            &mut c,
        )
        .unwrap();
    assert_eq!(
        (f.mappings, f.endpoint_records, f.name_removed),
        (1, 0, false)
    );
    assert_eq!(c.identity_of(&host_prefix(ip(2))), None);
    assert!(c.identity_of(&host_prefix(ip(3))).is_some());
    // The zombie goes at once, though in use.
    let f = n
        .forget(
            &Forget {
                name: "a.example.com.",
                addrs: Some(&[ip(1)]),
                endpoint: None,
            },
            &mut c,
        )
        .unwrap();
    assert_eq!(f.mappings, 1);
    assert_eq!(n.zombie_count(), 0);
    assert_eq!(c.identity_of(&host_prefix(ip(1))), None);
    // An endpoint's record: `other` still has the name, so only EP's record goes.
    assert!(n.asked_by_others("a.example.com.", EP));
    let f = n
        .forget(
            &Forget {
                name: "a.example.com.",
                addrs: Some(&[]),
                endpoint: Some(EP),
            },
            &mut c,
        )
        .unwrap();
    assert_eq!((f.mappings, f.endpoint_records), (0, 1));
    assert_eq!(n.endpoints_of("a.example.com."), vec![other]);
    assert_eq!(n.endpoint_name_count(EP), 1, "b.example.com");
    // Every mapping: the name leaves with its records.
    let f = n
        .forget(
            &Forget {
                name: "a.example.com.",
                addrs: None,
                endpoint: None,
            },
            &mut c,
        )
        .unwrap();
    assert_eq!(
        (f.mappings, f.endpoint_records, f.name_removed),
        (1, 1, true)
    );
    assert_eq!(n.endpoint_name_count(other), 0);
    assert_eq!(c.identity_of(&host_prefix(ip(3))), None);
    assert_eq!((n.name_count(), n.mapping_count(), n.ip_count()), (1, 1, 1));
    // Nothing cached, nothing forgotten; an invalid name is an error.
    let none = Forget {
        name: "a.example.com.",
        addrs: None,
        endpoint: None,
    };
    assert!(n.forget(&none, &mut c).unwrap().is_empty());
    let bad = Forget {
        name: "bad..name",
        ..none
    };
    assert!(n.forget(&bad, &mut c).is_err());
    // Learned again afterwards: a new mapping.
    let learned = n
        .observe(EP, "a.example.com", &[ip(2)], 300, at(5), &mut c)
        .unwrap();
    assert_eq!(learned.new, 1);
    // A later GC finds nothing left of what was forgotten.
    let gc = n.gc(at(1000), &nothing_in_use, &mut c).unwrap();
    assert_eq!(gc.released, 2);
    assert_eq!(n.mapping_count(), 0);
}
