//! Map sizes and migration (`Loaded::load_with`): maps are migrated, never flushed.
//!
//! Root only (skipped otherwise, failing with `FQDND_REQUIRE_PRIVILEGED=1`), like tests/kernel.rs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "tests; waiting for the kernel to free maps sleeps; the cost measurement reads the clock"
)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::time::{Duration, Instant};

use aya::maps::{HashMap, Map, MapData, MapInfo};
use aya::programs::{TestRun, TestRunOptions};
use common::{PinDir, packet, privileged};
use fqdnd_ebpf::sys::{self, CtKey, CtValue};
use fqdnd_ebpf::{
    CtEntry, EndpointFlags, Error, FROM_ENDPOINT, KernelDatapath, Loaded, MapSizes, Migration,
    TO_ENDPOINT, map_names,
};
use fqdnd_ipcache::policy::Protocol;
use fqdnd_ipcache::{Datapath, DatapathChange, EndpointId, Identity};

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const LO_IFINDEX: u32 = 1;
const EP: EndpointId = EndpointId(7);
const ENFORCE: EndpointFlags = EndpointFlags {
    enforce_egress: true,
    redirect_dns: false,
    check_source: false,
    enforce_ingress: false,
};
const EP_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 7);
const ALLOWED_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const FQDN_ID: u32 = (1 << 24) + 1;

fn run(loaded: &mut Loaded, prog: &str, pkt: &[u8]) -> u32 {
    let mut out = vec![0u8; pkt.len() + 256];
    loaded
        .classifier(prog)
        .unwrap()
        .test_run(TestRunOptions {
            data_in: Some(pkt),
            data_out: Some(&mut out),
            repeat: 1,
            ..Default::default()
        })
        .expect("BPF_PROG_TEST_RUN")
        .return_value
}

fn info(dir: &Path, name: &str) -> MapInfo {
    MapData::from_pin(dir.join(name)).unwrap().info().unwrap()
}

/// Map name → id of the map pinned under that name.
fn pinned_ids(dir: &Path) -> BTreeMap<&'static str, u32> {
    map_names()
        .iter()
        .map(|n| (*n, info(dir, n).id()))
        .collect()
}

fn policy_key(port: u16, end_port: u16) -> fqdnd_ipcache::PolicyKey {
    fqdnd_ipcache::PolicyKey {
        identity: Identity(FQDN_ID),
        protocol: Protocol::Tcp,
        port,
        end_port,
        ..Default::default()
    }
}

/// Everything the maps hold, in comparable form.
#[derive(Debug, PartialEq)]
struct Dump {
    ipcache: Vec<(ipnet::IpNet, Identity)>,
    policy: Vec<sys::PolicyKey>,
    endpoints: Vec<fqdnd_ebpf::EndpointEntry>,
    clients: Vec<(ipnet::IpNet, EndpointId, EndpointFlags)>,
    dns_proxy: String,
    ct: HashSet<CtEntry>,
}

fn dump(dir: &Path) -> Dump {
    let dp = KernelDatapath::open(dir).unwrap();
    let mut ipcache = dp.ipcache_entries().unwrap();
    ipcache.sort();
    Dump {
        ipcache,
        policy: dp.policy_entries().unwrap(),
        endpoints: dp.endpoint_entries().unwrap(),
        clients: dp.client_entries().unwrap(),
        dns_proxy: format!("{:?}", dp.dns_proxy().unwrap()),
        ct: dp.ct_entries().unwrap().into_iter().collect(),
    }
}

/// Writes `n` synthetic conntrack entries (UDP flows 10.1.x.y:1000 → 198.18.0.1:53).
fn fill_ct(dir: &Path, n: u32) {
    let mut ct: HashMap<MapData, CtKey, CtValue> =
        Map::from_map_data(MapData::from_pin(dir.join("fqdnd_ct")).unwrap())
            .unwrap()
            .try_into()
            .unwrap();
    for i in 0..n {
        let mut k = CtKey {
            sport: 1000u16.to_be(),
            dport: 53u16.to_be(),
            proto: sys::PROTO_UDP,
            family: 4,
            ..Default::default()
        };
        k.saddr[..4].copy_from_slice(&[10, 1 + (i >> 16) as u8, (i >> 8) as u8, i as u8]);
        k.daddr[..4].copy_from_slice(&[198, 18, 0, 1]);
        let v = CtValue {
            created_ns: 1 + u64::from(i),
            last_seen_ns: 2 + u64::from(i),
            expires_ns: 3 + u64::from(i),
            flags: sys::CT_EGRESS,
            ..Default::default()
        };
        ct.insert(k, v, 0).unwrap();
    }
}

/// Waits until no map with one of `ids` exists any more (the kernel frees a map after its
/// last reference is dropped, asynchronously).
fn wait_released(ids: &[u32]) -> bool {
    for _ in 0..200 {
        if ids.iter().all(|id| MapInfo::from_id(*id).is_err()) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Same sizes: nothing is migrated, every pinned map is reused (same ids), and the maps have
/// the default sizes (so the crate's map table matches the object: a layout difference
/// would be an error, a size difference a migration).
#[test]
fn same_sizes_reuse_the_maps() {
    if !privileged("same") {
        return;
    }
    let dir = PinDir::new("mig-same");
    let first = Loaded::load(&dir.0).unwrap();
    let ids = pinned_ids(&dir.0);
    let (second, migrations) = Loaded::load_with(&dir.0, &MapSizes::default()).unwrap();
    assert!(migrations.is_empty(), "{migrations:?}");
    assert_eq!(pinned_ids(&dir.0), ids);
    let d = MapSizes::default();
    for (name, max) in [
        ("fqdnd_ipc4", d.ipcache),
        ("fqdnd_ipc6", d.ipcache),
        ("fqdnd_policy", d.policy),
        ("fqdnd_ct", d.conntrack),
        ("fqdnd_endpoints", d.endpoints),
        ("fqdnd_clients4", d.clients),
        ("fqdnd_clients6", d.clients),
        ("fqdnd_dns_proxy", 1),
        ("fqdnd_events", 256 * 1024),
        ("fqdnd_ep_addrs", d.endpoint_addresses),
        ("fqdnd_frags", 8192),
        ("fqdnd_settings", 1),
    ] {
        assert_eq!(info(&dir.0, name).max_entries(), max, "{name}");
    }
    assert!(!dir.0.join("migrating").exists());
    drop((first, second));
    // a fresh directory with other sizes creates the maps with them (nothing to migrate)
    let other = PinDir::new("mig-same-b");
    let sizes = MapSizes {
        conntrack: 1024,
        ipcache: 2048,
        ..MapSizes::default()
    };
    let (_l, migrations) = Loaded::load_with(&other.0, &sizes).unwrap();
    assert!(migrations.is_empty());
    assert_eq!(info(&other.0, "fqdnd_ct").max_entries(), 1024);
    assert_eq!(info(&other.0, "fqdnd_ipc6").max_entries(), 2048);
    assert!(matches!(
        Loaded::load_with(&other.0, &MapSizes { policy: 0, ..sizes }),
        Err(Error::InvalidMapSize { map: "policy", .. })
    ));
}

/// Bigger conntrack and ipcache: every entry of every map is still there, the pins name new
/// maps of the new sizes (the others are reused), the new programs use them, the old maps
/// are released, and enforcement (including a migrated conntrack entry) is unchanged.
#[test]
fn grow_migrates_every_entry() {
    if !privileged("grow") {
        return;
    }
    let dir = PinDir::new("mig-grow");
    let mut loaded = Loaded::load(&dir.0).unwrap();
    let mut dp = KernelDatapath::open(&dir.0).unwrap();
    dp.set_endpoint(LO_IFINDEX, EP, ENFORCE).unwrap();
    dp.set_interface_by_source(999, true).unwrap();
    dp.set_client_prefix("10.9.0.0/16".parse().unwrap(), EndpointId(9), ENFORCE)
        .unwrap();
    dp.set_client_prefix("fd09::/48".parse().unwrap(), EndpointId(9), ENFORCE)
        .unwrap();
    dp.set_dns_proxy(Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 5353)), None)
        .unwrap();
    let mut changes = vec![
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: policy_key(443, 443),
        },
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: policy_key(8000, 8099),
        },
        DatapathChange::IpcacheUpsert {
            prefix: "192.0.2.0/24".parse().unwrap(),
            identity: Identity(FQDN_ID),
        },
        DatapathChange::IpcacheUpsert {
            prefix: "2001:db8::/64".parse().unwrap(),
            identity: Identity(FQDN_ID),
        },
    ];
    for i in 0..1000u32 {
        let a = Ipv4Addr::from(0x0a64_0000 + i);
        changes.push(DatapathChange::IpcacheUpsert {
            prefix: ipnet::IpNet::new(IpAddr::V4(a), 32).unwrap(),
            identity: Identity(FQDN_ID + 1 + i),
        });
    }
    dp.apply(&changes).unwrap();
    // conntrack entries made by the program (egress and ingress) and 3000 synthetic ones
    let ep = IpAddr::V4(EP_V4);
    let ok = IpAddr::V4(ALLOWED_V4);
    let world = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1));
    let established = packet(ep, ok, sys::PROTO_TCP, 40000, 443);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &established), TC_ACT_OK);
    let inbound = packet(world, ep, sys::PROTO_TCP, 50000, 8080);
    assert_eq!(run(&mut loaded, TO_ENDPOINT, &inbound), TC_ACT_OK);
    fill_ct(&dir.0, 3000);
    // a load-balanced service with three backends
    let mut lb = fqdnd_lb::LoadBalancer::new();
    let service = fqdnd_lb::ServiceKey {
        vip: "10.96.0.10".parse().unwrap(),
        port: 80,
        proto: fqdnd_lb::Protocol::Tcp,
    };
    let backends: Vec<std::net::SocketAddr> = (1..=3)
        .map(|i| format!("10.0.1.{i}:8080").parse().unwrap())
        .collect();
    let mut lb_maps = fqdnd_ebpf::LbMaps::open(&dir.0).unwrap();
    lb_maps
        .apply(&lb.set_service(service, &backends).unwrap())
        .unwrap();
    let lb_before = lb_maps.read().unwrap();
    assert_eq!(lb_before, lb.maps());
    drop(lb_maps);

    let before = dump(&dir.0);
    assert_eq!(before.ct.len(), 3002);
    assert_eq!(before.ipcache.len(), 1002);
    // 443, and 8000-8099 as the port prefixes 8000/10, 8064/11, 8096/14
    assert_eq!(before.policy.len(), 4);
    let old_ids = pinned_ids(&dir.0);
    drop(loaded);
    drop(dp);

    let sizes = MapSizes {
        conntrack: 524_288,
        ipcache: 1_000_000,
        lb_services: 1024,
        lb_backends: 512,
        ..MapSizes::default()
    };
    let (mut loaded, mut migrations) = Loaded::load_with(&dir.0, &sizes).unwrap();
    migrations.sort_by(|a, b| a.map.cmp(&b.map));
    let m = |map: &str, from_max, to_max, n| Migration {
        map: map.to_owned(),
        from_max,
        to_max,
        entries_before: n,
        entries_after: n,
    };
    assert_eq!(
        migrations,
        vec![
            m("fqdnd_ct", 262_144, 524_288, 3002),
            m("fqdnd_ipc4", 512_000, 1_000_000, 1001),
            m("fqdnd_ipc6", 512_000, 1_000_000, 1),
            m("fqdnd_lb_backends", 65_536, 512, 3),
            m("fqdnd_lb_revnat", 65_536, 1024, 1),
            m("fqdnd_lb_svc", 65_536, 1024, 4),
        ]
    );
    let after = dump(&dir.0);
    assert_eq!(after, before);
    assert_eq!(
        fqdnd_ebpf::LbMaps::open(&dir.0).unwrap().read().unwrap(),
        lb_before,
        "the load-balancer maps were migrated with every entry"
    );

    let new_ids = pinned_ids(&dir.0);
    for name in map_names() {
        let migrated = [
            "fqdnd_ct",
            "fqdnd_ipc4",
            "fqdnd_ipc6",
            "fqdnd_lb_backends",
            "fqdnd_lb_revnat",
            "fqdnd_lb_svc",
        ]
        .contains(name);
        assert_eq!(new_ids[name] != old_ids[name], migrated, "{name}");
    }
    assert_eq!(info(&dir.0, "fqdnd_ct").max_entries(), 524_288);
    assert_eq!(info(&dir.0, "fqdnd_ipc4").max_entries(), 1_000_000);
    assert_eq!(info(&dir.0, "fqdnd_ipc6").max_entries(), 1_000_000);
    assert!(!dir.0.join("migrating").exists());
    // the programs use exactly the pinned maps
    for prog in [FROM_ENDPOINT, TO_ENDPOINT] {
        let used: HashSet<u32> = loaded
            .classifier(prog)
            .unwrap()
            .info()
            .unwrap()
            .map_ids()
            .unwrap()
            .unwrap()
            .into_iter()
            .collect();
        let pinned: HashSet<u32> = new_ids.values().copied().collect();
        assert!(used.is_subset(&pinned), "{prog} uses {used:?}");
        assert!(used.contains(&new_ids["fqdnd_ct"]));
    }
    let gone: Vec<u32> = ["fqdnd_ct", "fqdnd_ipc4", "fqdnd_ipc6"]
        .iter()
        .map(|n| old_ids[n])
        .collect();
    assert!(wait_released(&gone), "old maps still referenced");

    // enforcement: the endpoint's reply in the inbound flow passes on its migrated
    // conntrack entry (no rule allows the world); after a restarted daemon's resync without
    // the 443 key, a new flow to 443 is dropped and so is the established one (conntrack
    // does not bypass policy); the ipcache answers from the new trie
    let reply = packet(ep, world, sys::PROTO_TCP, 8080, 50000);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &reply), TC_ACT_OK);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &established), TC_ACT_OK);
    let mut dp = KernelDatapath::open(&dir.0).unwrap();
    dp.begin_resync().unwrap();
    dp.apply(&changes[1..]).unwrap();
    assert_eq!(dp.finish_resync().unwrap().removed, 1);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &established), TC_ACT_SHOT);
    let fresh = packet(ep, ok, sys::PROTO_TCP, 40001, 443);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &fresh), TC_ACT_SHOT);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &reply), TC_ACT_OK);
    let p8050 = packet(ep, ok, sys::PROTO_TCP, 40002, 8050);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p8050), TC_ACT_OK);
    assert_eq!(
        dp.identity_of("10.100.3.231".parse().unwrap()).unwrap(),
        Identity(FQDN_ID + 1 + 999)
    );
}

/// A smaller size that cannot hold the entries is refused before anything is created: every
/// pin still names its old map, with its entries. A smaller size that fits migrates.
#[test]
fn shrink_below_entries_is_refused() {
    if !privileged("shrink") {
        return;
    }
    let dir = PinDir::new("mig-shrink");
    let loaded = Loaded::load(&dir.0).unwrap();
    let mut dp = KernelDatapath::open(&dir.0).unwrap();
    // 100 single ports: 100 entries (a range would be a few port prefixes)
    let singles: Vec<DatapathChange> = (1000..1100)
        .map(|port| DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: policy_key(port, port),
        })
        .collect();
    dp.apply(&singles).unwrap();
    fill_ct(&dir.0, 10);
    drop((loaded, dp));
    let ids = pinned_ids(&dir.0);

    // conntrack would grow, but the policy does not fit: nothing changes at all
    let sizes = MapSizes {
        policy: 50,
        conntrack: 300_000,
        ..MapSizes::default()
    };
    match Loaded::load_with(&dir.0, &sizes) {
        Err(Error::MapTooSmall {
            map,
            entries,
            max_entries,
        }) => assert_eq!(
            (map.as_str(), entries, max_entries),
            ("fqdnd_policy", 100, 50)
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(pinned_ids(&dir.0), ids);
    assert_eq!(info(&dir.0, "fqdnd_policy").max_entries(), 65_536);
    assert_eq!(info(&dir.0, "fqdnd_ct").max_entries(), 262_144);
    assert!(!dir.0.join("migrating").exists());
    let d = dump(&dir.0);
    assert_eq!((d.policy.len(), d.ct.len()), (100, 10));

    // exactly enough room: migrated
    let sizes = MapSizes {
        policy: 100,
        ..MapSizes::default()
    };
    let (_l, migrations) = Loaded::load_with(&dir.0, &sizes).unwrap();
    assert_eq!(
        migrations,
        vec![Migration {
            map: "fqdnd_policy".to_owned(),
            from_max: 65_536,
            to_max: 100,
            entries_before: 100,
            entries_after: 100,
        }]
    );
    assert_eq!(dump(&dir.0), d);
    // one less: refused
    let e = Loaded::load_with(
        &dir.0,
        &MapSizes {
            policy: 99,
            ..MapSizes::default()
        },
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "map fqdnd_policy holds 100 entries, more than the new max_entries 99: migration \
         refused, the old map is kept"
    );
    assert_eq!(info(&dir.0, "fqdnd_policy").max_entries(), 100);
}

/// A pinned map with another layout under a wanted name (type, key or value size) is an
/// error naming it; nothing is created or changed.
#[test]
fn layout_change_is_refused() {
    if !privileged("layout") {
        return;
    }
    let a = PinDir::new("mig-layout-a");
    let b = PinDir::new("mig-layout-b");
    let _l = Loaded::load(&a.0).unwrap();
    std::fs::create_dir_all(&b.0).unwrap();
    let policy = MapData::from_pin(a.0.join("fqdnd_policy")).unwrap();
    policy.pin(b.0.join("fqdnd_endpoints")).unwrap();
    let id = info(&b.0, "fqdnd_endpoints").id();
    match Loaded::load_with(&b.0, &MapSizes::default()) {
        Err(e @ Error::MapLayout { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("fqdnd_endpoints"), "{msg}");
            assert!(msg.contains("LpmTrie, key 16 B"), "{msg}");
            assert!(msg.contains("key 4 B"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(info(&b.0, "fqdnd_endpoints").id(), id);
    let names: Vec<_> = std::fs::read_dir(&b.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec!["fqdnd_endpoints"]);
}

/// Crash leftovers: a staging directory of an interrupted migration is removed (aya would
/// otherwise reuse its pins), and a half-switched set of pins (one map migrated, another not)
/// completes: switched maps are reused, the rest migrated.
#[test]
fn interrupted_migration_completes() {
    if !privileged("crash") {
        return;
    }
    let dir = PinDir::new("mig-crash");
    let l = Loaded::load(&dir.0).unwrap();
    fill_ct(&dir.0, 50);
    drop(l);
    // "crashed" after creating the staging dir: a stale pin there (here: the old ct itself)
    let staging = dir.0.join("migrating");
    std::fs::create_dir_all(&staging).unwrap();
    MapData::from_pin(dir.0.join("fqdnd_ct"))
        .unwrap()
        .pin(staging.join("fqdnd_ct"))
        .unwrap();
    // "crashed" after switching the ipcache pins, before the conntrack one
    let ipcache_only = MapSizes {
        ipcache: 600_000,
        ..MapSizes::default()
    };
    let (l, m) = Loaded::load_with(&dir.0, &ipcache_only).unwrap();
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(!staging.exists());
    drop(l);
    let ipc_id = info(&dir.0, "fqdnd_ipc4").id();
    let sizes = MapSizes {
        conntrack: 300_000,
        ..ipcache_only
    };
    let (_l, m) = Loaded::load_with(&dir.0, &sizes).unwrap();
    assert_eq!(
        m.iter().map(|m| m.map.as_str()).collect::<Vec<_>>(),
        ["fqdnd_ct"]
    );
    assert_eq!((m[0].entries_before, m[0].entries_after), (50, 50));
    assert_eq!(info(&dir.0, "fqdnd_ipc4").id(), ipc_id);
    assert_eq!(info(&dir.0, "fqdnd_ct").max_entries(), 300_000);
}

/// Time to migrate 100 000 conntrack entries and 100 000 ipcache prefixes
/// (`--ignored --nocapture`).
#[test]
#[ignore = "measurement"]
fn migrate_cost() {
    if !privileged("cost") {
        return;
    }
    let dir = PinDir::new("mig-cost");
    let l = Loaded::load(&dir.0).unwrap();
    let mut dp = KernelDatapath::open(&dir.0).unwrap();
    fill_ct(&dir.0, 100_000);
    let changes: Vec<_> = (0..100_000u32)
        .map(|i| DatapathChange::IpcacheUpsert {
            prefix: ipnet::IpNet::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)), 32).unwrap(),
            identity: Identity(FQDN_ID + i),
        })
        .collect();
    dp.apply(&changes).unwrap();
    drop((l, dp));
    let t = Instant::now();
    let (_l, m) = Loaded::load_with(
        &dir.0,
        &MapSizes {
            conntrack: 524_288,
            ..MapSizes::default()
        },
    )
    .unwrap();
    let ct = t.elapsed();
    assert_eq!(m[0].entries_after, 100_000);
    let t = Instant::now();
    let (_l2, m) = Loaded::load_with(
        &dir.0,
        &MapSizes {
            conntrack: 524_288,
            ipcache: 1_000_000,
            ..MapSizes::default()
        },
    )
    .unwrap();
    let ipc = t.elapsed();
    assert_eq!(m.len(), 2);
    let t = Instant::now();
    let _same = Loaded::load_with(
        &dir.0,
        &MapSizes {
            conntrack: 524_288,
            ipcache: 1_000_000,
            ..MapSizes::default()
        },
    )
    .unwrap();
    let none = t.elapsed();
    eprintln!(
        "load_with migrating 100k conntrack entries: {ct:?}; 100k ipc4 prefixes (+ empty ipc6): \
         {ipc:?}; load with nothing to migrate: {none:?}"
    );
}
