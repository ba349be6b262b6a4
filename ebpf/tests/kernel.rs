//! Kernel tests: load + pin + reopen, BPF_PROG_TEST_RUN verdicts, KernelDatapath batches.
//!
//! They need root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN to mount bpffs). Without it they
//! skip with a message, or fail when `FQDND_REQUIRE_PRIVILEGED=1` (CI sets it).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "tests; waiting for conntrack entries to expire polls the real clock"
)]

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use common::{PinDir, packet, privileged};

use aya::programs::{TestRun, TestRunOptions};
use fqdnd_ebpf::sys::{self, PolicyKey};
use fqdnd_ebpf::{
    EndpointFlags, Events, FROM_ENDPOINT, KernelDatapath, Loaded, TO_ENDPOINT, map_names,
};
use fqdnd_ipcache::policy::Protocol;
use fqdnd_ipcache::{Datapath, DatapathChange, EndpointId, Identity};

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
/// BPF_PROG_TEST_RUN runs tc programs on the loopback device of the caller's netns.
const LO_IFINDEX: u32 = 1;
const EP: EndpointId = EndpointId(7);
const ENFORCE: EndpointFlags = EndpointFlags {
    enforce_egress: true,
    redirect_dns: false,
    check_source: false,
    enforce_ingress: false,
};

fn setup(test: &str) -> Option<(PinDir, Loaded, KernelDatapath)> {
    if !privileged(test) {
        return None;
    }
    let dir = PinDir::new(test);
    let loaded = Loaded::load(&dir.0).expect("load");
    let dp = KernelDatapath::open(&dir.0).expect("open pinned maps");
    Some((dir, loaded, dp))
}

fn key(identity: u32, protocol: Protocol, port: u16, end_port: u16) -> fqdnd_ipcache::PolicyKey {
    fqdnd_ipcache::PolicyKey {
        identity: Identity(identity),
        protocol,
        port,
        end_port,
        ..Default::default()
    }
}

fn run(loaded: &mut Loaded, prog: &str, pkt: &[u8], repeat: u32) -> (u32, Duration) {
    let mut out = vec![0u8; pkt.len() + 256];
    let r = loaded
        .classifier(prog)
        .unwrap()
        .test_run(TestRunOptions {
            data_in: Some(pkt),
            data_out: Some(&mut out),
            repeat,
            ..Default::default()
        })
        .expect("BPF_PROG_TEST_RUN");
    (r.return_value, r.duration)
}

const EP_V4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 7);
const EP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7);
const ALLOWED_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const ALLOWED_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 10);
const FQDN_ID: u32 = (1 << 24) + 1;

/// Endpoint 7 on lo, enforcing, allowed to FQDN_ID on TCP 443 only.
fn base_policy(dp: &mut KernelDatapath) {
    dp.set_endpoint(LO_IFINDEX, EP, ENFORCE).unwrap();
    dp.apply(&[
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: key(FQDN_ID, Protocol::Tcp, 443, 443),
        },
        DatapathChange::IpcacheUpsert {
            prefix: "192.0.2.0/24".parse().unwrap(),
            identity: Identity(FQDN_ID),
        },
        DatapathChange::IpcacheUpsert {
            prefix: "2001:db8::/64".parse().unwrap(),
            identity: Identity(FQDN_ID),
        },
    ])
    .unwrap();
}

#[test]
fn load_pin_and_reopen() {
    let Some((dir, loaded, mut dp)) = setup("pin") else {
        return;
    };
    for name in map_names() {
        assert!(dir.0.join(name).exists(), "{name} pinned");
    }
    dp.apply(&[DatapathChange::IpcacheUpsert {
        prefix: "198.51.100.0/24".parse().unwrap(),
        identity: Identity(300),
    }])
    .unwrap();
    drop(loaded);
    drop(dp);
    // The pins outlive the loader; a new load reuses the maps with their contents.
    let _again = Loaded::load(&dir.0).unwrap();
    let dp = KernelDatapath::open(&dir.0).unwrap();
    assert_eq!(
        dp.identity_of("198.51.100.3".parse().unwrap()).unwrap(),
        Identity(300)
    );
    assert_eq!(
        dp.identity_of("203.0.113.1".parse().unwrap()).unwrap(),
        Identity(9)
    );
    assert_eq!(
        dp.identity_of("2001:db8::1".parse().unwrap()).unwrap(),
        Identity(10)
    );
}

#[test]
fn verdicts_v4() {
    let Some((dir, mut loaded, mut dp)) = setup("v4") else {
        return;
    };
    base_policy(&mut dp);
    let mut events = Events::open(&dir.0).unwrap();
    let ep = IpAddr::V4(EP_V4);
    let ok = IpAddr::V4(ALLOWED_V4);
    let world = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1));

    // allowed identity and port
    let p = packet(ep, ok, sys::PROTO_TCP, 40000, 443);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_OK);
    // same identity, other port
    let p = packet(ep, ok, sys::PROTO_TCP, 40001, 80);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_SHOT);
    // same port, UDP
    let p = packet(ep, ok, sys::PROTO_UDP, 40002, 443);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_SHOT);
    // unknown destination (world)
    let p = packet(ep, world, sys::PROTO_TCP, 40003, 443);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_SHOT);

    let ev = events.drain();
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert_eq!(
        (ev[0].identity, ev[0].dport, ev[0].proto),
        (FQDN_ID, 80, sys::PROTO_TCP)
    );
    assert_eq!(ev[2].identity, sys::ID_WORLD_IPV4);
    assert!(
        ev.iter()
            .all(|e| e.endpoint == EP.0 && e.reason == sys::DROP_POLICY && e.family == 4)
    );
    assert_eq!(&ev[2].daddr[..4], &[203, 0, 113, 1]);

    // conntrack does not bypass policy: once its rule is gone, an established flow's next
    // packet is dropped like a new flow's (with an event), and passes again when it returns
    dp.apply(&[DatapathChange::PolicyDelete {
        endpoint: EP,
        key: key(FQDN_ID, Protocol::Tcp, 443, 443),
    }])
    .unwrap();
    assert!(dp.policy_entries().unwrap().is_empty());
    let p = packet(ep, ok, sys::PROTO_TCP, 40000, 443);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_SHOT);
    let p4 = packet(ep, ok, sys::PROTO_TCP, 40004, 443);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p4, 1).0, TC_ACT_SHOT);
    let ev = events.drain();
    assert_eq!(
        ev.iter().map(|e| (e.sport, e.reason)).collect::<Vec<_>>(),
        [(40000, sys::DROP_POLICY), (40004, sys::DROP_POLICY)]
    );
    dp.apply(&[DatapathChange::PolicyUpsert {
        endpoint: EP,
        key: key(FQDN_ID, Protocol::Tcp, 443, 443),
    }])
    .unwrap();
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_OK);
    // the destination's identity is checked again too: its prefix gone, it is world
    dp.apply(&[DatapathChange::IpcacheDelete {
        prefix: "192.0.2.0/24".parse().unwrap(),
    }])
    .unwrap();
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_SHOT);
    let ev = events.drain();
    assert_eq!(
        (ev.len(), ev[0].identity, ev[0].reason),
        (1, sys::ID_WORLD_IPV4, sys::DROP_POLICY)
    );

    // conntrack reply: a flow opened towards the endpoint lets its replies out
    let inbound = packet(world, ep, sys::PROTO_TCP, 50000, 8080);
    let reply = packet(ep, world, sys::PROTO_TCP, 8080, 50000);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &reply, 1).0, TC_ACT_SHOT);
    assert_eq!(run(&mut loaded, TO_ENDPOINT, &inbound, 1).0, TC_ACT_OK);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &reply, 1).0, TC_ACT_OK);
}

#[test]
fn verdicts_v6_wildcards_and_non_enforcing() {
    let Some((_dir, mut loaded, mut dp)) = setup("v6") else {
        return;
    };
    base_policy(&mut dp);
    let ep = IpAddr::V6(EP_V6);
    let ok = IpAddr::V6(ALLOWED_V6);
    let world = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb9, 0, 0, 0, 0, 0, 1));
    let udp53 = packet(ep, world, sys::PROTO_UDP, 5353, 53);

    assert_eq!(
        run(&mut loaded, FROM_ENDPOINT, &packet(ep, ok, 6, 1000, 443), 1).0,
        TC_ACT_OK
    );
    assert_eq!(
        run(&mut loaded, FROM_ENDPOINT, &packet(ep, ok, 6, 1001, 444), 1).0,
        TC_ACT_SHOT
    );
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &udp53, 1).0, TC_ACT_SHOT);

    // wildcard identity on a port (any protocol), and a port range
    dp.apply(&[
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: key(0, Protocol::Any, 53, 53),
        },
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: key(FQDN_ID, Protocol::Tcp, 8000, 8010),
        },
    ])
    .unwrap();
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &udp53, 1).0, TC_ACT_OK);
    assert_eq!(
        run(
            &mut loaded,
            FROM_ENDPOINT,
            &packet(ep, ok, 6, 1002, 8005),
            1
        )
        .0,
        TC_ACT_OK
    );
    assert_eq!(
        run(
            &mut loaded,
            FROM_ENDPOINT,
            &packet(ep, ok, 6, 1003, 8011),
            1
        )
        .0,
        TC_ACT_SHOT
    );

    // identity-wide allow, any port
    dp.apply(&[DatapathChange::PolicyUpsert {
        endpoint: EP,
        key: key(FQDN_ID, Protocol::Any, 0, 0),
    }])
    .unwrap();
    assert_eq!(
        run(
            &mut loaded,
            FROM_ENDPOINT,
            &packet(ep, ok, 17, 1004, 9999),
            1
        )
        .0,
        TC_ACT_OK
    );

    // not enforcing: everything passes
    dp.set_endpoint(LO_IFINDEX, EP, EndpointFlags::default())
        .unwrap();
    let other = packet(ep, world, sys::PROTO_TCP, 1005, 22);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &other, 1).0, TC_ACT_OK);
    // unknown interface: passes
    dp.set_endpoint(LO_IFINDEX, EP, ENFORCE).unwrap();
    assert_eq!(
        run(
            &mut loaded,
            FROM_ENDPOINT,
            &packet(ep, world, 6, 1006, 22),
            1
        )
        .0,
        TC_ACT_SHOT
    );
    dp.remove_endpoint(LO_IFINDEX).unwrap();
    assert_eq!(
        run(
            &mut loaded,
            FROM_ENDPOINT,
            &packet(ep, world, 6, 1007, 22),
            1
        )
        .0,
        TC_ACT_OK
    );
}

#[test]
fn batches_read_back() {
    let Some((_dir, _loaded, mut dp)) = setup("batch") else {
        return;
    };
    let k80 = key(FQDN_ID, Protocol::Tcp, 80, 82);
    let k81 = key(FQDN_ID, Protocol::Tcp, 81, 81);
    dp.apply(&[
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: k80,
        },
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: k81,
        },
        DatapathChange::PolicyUpsert {
            endpoint: EndpointId(8),
            key: fqdnd_ipcache::PolicyKey::ALLOW_ALL,
        },
        DatapathChange::IpcacheUpsert {
            prefix: "10.1.0.0/16".parse().unwrap(),
            identity: Identity(400),
        },
        DatapathChange::IpcacheUpsert {
            prefix: "10.1.2.3/32".parse().unwrap(),
            identity: Identity(FQDN_ID),
        },
        DatapathChange::IpcacheUpsert {
            prefix: "fd00::/8".parse().unwrap(),
            identity: Identity(401),
        },
        DatapathChange::IpcacheDelete {
            prefix: "10.9.9.9/32".parse().unwrap(),
        },
    ])
    .unwrap();
    // (endpoint, identity, protocol, first port, last port) of every kernel entry
    let rows = |dp: &KernelDatapath| -> Vec<(u16, u32, Option<u8>, u16, u16)> {
        let mut v: Vec<_> = dp
            .policy_entries()
            .unwrap()
            .iter()
            .map(|k| {
                let (a, b) = k.ports();
                (k.endpoint, k.identity, k.protocol(), a, b)
            })
            .collect();
        v.sort();
        v
    };
    // 80-82: the prefixes 80/15 and 82/16; 81 is an entry of its own; allow-all: every
    // protocol and port
    assert_eq!(
        rows(&dp),
        vec![
            (7, FQDN_ID, Some(6), 80, 81),
            (7, FQDN_ID, Some(6), 81, 81),
            (7, FQDN_ID, Some(6), 82, 82),
            (8, 0, None, 0, 65535),
        ]
    );
    let mut ipc = dp.ipcache_entries().unwrap();
    ipc.sort();
    assert_eq!(ipc.len(), 3);
    assert_eq!(
        dp.identity_of("10.1.2.3".parse().unwrap()).unwrap(),
        Identity(FQDN_ID)
    );
    assert_eq!(
        dp.identity_of("10.1.2.4".parse().unwrap()).unwrap(),
        Identity(400)
    );
    assert_eq!(
        dp.identity_of("fd00::1".parse().unwrap()).unwrap(),
        Identity(401)
    );

    // overlapping keys: deleting the 81..81 key keeps port 81 for 80..82
    dp.apply(&[
        DatapathChange::PolicyDelete {
            endpoint: EP,
            key: k81,
        },
        DatapathChange::IpcacheDelete {
            prefix: "10.1.2.3/32".parse().unwrap(),
        },
    ])
    .unwrap();
    assert_eq!(rows(&dp).len(), 3);
    assert_eq!(
        dp.identity_of("10.1.2.3".parse().unwrap()).unwrap(),
        Identity(400)
    );
    dp.apply(&[DatapathChange::PolicyDelete {
        endpoint: EP,
        key: k80,
    }])
    .unwrap();
    assert_eq!(rows(&dp), vec![(8, 0, None, 0, 65535)]);

    // every range fits: 1024-65535 is 6 prefixes, 1-65535 16, "any" protocol twice that
    let wide = key(FQDN_ID, Protocol::Tcp, 1024, 65535);
    let all = key(FQDN_ID + 1, Protocol::Any, 1, 65535);
    dp.apply(&[
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: wide,
        },
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: all,
        },
    ])
    .unwrap();
    assert_eq!(rows(&dp).len(), 1 + 6 + 2 * 16);
}

/// Per-packet cost of the policy program, printed (run with --nocapture to see it), with
/// maps of a realistic size (2 000 ipcache /32s, 1 000 policy entries besides the flows').
#[test]
fn per_packet_cost() {
    let Some((_dir, mut loaded, mut dp)) = setup("cost") else {
        return;
    };
    base_policy(&mut dp);
    let mut filler = Vec::new();
    for i in 0..2000u32 {
        filler.push(DatapathChange::IpcacheUpsert {
            prefix: ipnet::IpNet::new(IpAddr::V4(Ipv4Addr::from(0x0a40_0000 + i)), 32).unwrap(),
            identity: Identity(FQDN_ID + 10 + i),
        });
    }
    for i in 0..1000u16 {
        filler.push(DatapathChange::PolicyUpsert {
            endpoint: EndpointId(100 + i % 50),
            key: key(
                FQDN_ID + 10 + u32::from(i),
                Protocol::Tcp,
                1000 + i,
                1000 + i,
            ),
        });
    }
    // a wide range for the range lookups: 1-65535 is 16 prefixes per protocol
    filler.push(DatapathChange::PolicyUpsert {
        endpoint: EP,
        key: key(FQDN_ID, Protocol::Udp, 1, 65535),
    });
    dp.apply(&filler).unwrap();
    let ep = IpAddr::V4(EP_V4);
    let ok = IpAddr::V4(ALLOWED_V4);
    let n = 100_000;
    let cost = |loaded: &mut Loaded, pkt: &[u8], want: u32| {
        run(loaded, FROM_ENDPOINT, pkt, 1);
        let (v, d) = run(loaded, FROM_ENDPOINT, pkt, n);
        assert_eq!(v, want);
        d
    };
    // established, enforcing: conntrack hit + ipcache LPM + policy LPM (exact port)
    let est = packet(ep, ok, 6, 40000, 443);
    let enforced = cost(&mut loaded, &est, TC_ACT_OK);
    // established, allowed by a port range (a port prefix of 1-65535)
    let ranged = cost(&mut loaded, &packet(ep, ok, 17, 40001, 40000), TC_ACT_OK);
    // established, with source validation (the node's endpoints): + one hash lookup
    dp.set_endpoint_addresses(LO_IFINDEX, EP, &[ep]).unwrap();
    dp.set_endpoint(
        LO_IFINDEX,
        EP,
        EndpointFlags {
            check_source: true,
            ..ENFORCE
        },
    )
    .unwrap();
    let node = cost(&mut loaded, &est, TC_ACT_OK);
    // established, not enforcing: conntrack only (what an established flow cost before
    // policy was checked on every packet)
    dp.set_endpoint(LO_IFINDEX, EP, EndpointFlags::default())
        .unwrap();
    let ct_only = cost(&mut loaded, &est, TC_ACT_OK);
    dp.set_endpoint(LO_IFINDEX, EP, ENFORCE).unwrap();
    // policy miss → full lookup chain + drop event
    let miss = cost(&mut loaded, &packet(ep, ok, 6, 40002, 80), TC_ACT_SHOT);
    // DNS redirect, no proxy socket: one UDP listener lookup + drop (event while the ring
    // has room). BPF_PROG_TEST_RUN is not at tc ingress, so even a found socket could not be
    // assigned there: the real-traffic figure is in tests/netns.rs (redirect_cost_in_netns).
    dp.set_endpoint(LO_IFINDEX, EP, REDIRECT).unwrap();
    dp.set_dns_proxy(Some("127.0.0.1:1".parse().unwrap()), None)
        .unwrap();
    let no_proxy = cost(&mut loaded, &packet(ep, ok, 17, 40003, 53), TC_ACT_SHOT);
    // Issue 18. Egress with a deny in the endpoint's policy: a deny of the destination's
    // identity on another port (its lookup hits the identity's entries first) and a deny of
    // any identity overlapping nothing here.
    dp.set_endpoint(LO_IFINDEX, EP, ENFORCE).unwrap();
    dp.apply(&[
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: fqdnd_ipcache::PolicyKey {
                deny: true,
                ..key(FQDN_ID, Protocol::Tcp, 22, 22)
            },
        },
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: fqdnd_ipcache::PolicyKey {
                deny: true,
                ..key(0, Protocol::Udp, 9999, 9999)
            },
        },
    ])
    .unwrap();
    let with_deny = cost(&mut loaded, &packet(ep, ok, 6, 40004, 443), TC_ACT_OK);
    let denied = cost(&mut loaded, &packet(ep, ok, 6, 40005, 22), TC_ACT_SHOT);
    // Ingress (fqdnd_to_ep), the endpoint under ingress policy: an allowed inbound flow,
    // established (conntrack + ipcache LPM of the source + policy LPM); a reply in the
    // endpoint's own flow (conntrack only); a denied new inbound flow (lookups + event).
    dp.set_endpoint(
        LO_IFINDEX,
        EP,
        EndpointFlags {
            enforce_ingress: true,
            ..ENFORCE
        },
    )
    .unwrap();
    dp.apply(&[DatapathChange::PolicyUpsert {
        endpoint: EP,
        key: fqdnd_ipcache::PolicyKey {
            direction: fqdnd_ipcache::policy::Direction::Ingress,
            ..key(FQDN_ID, Protocol::Tcp, 8080, 8080)
        },
    }])
    .unwrap();
    let inbound = packet(ok, ep, 6, 50000, 8080);
    run(&mut loaded, TO_ENDPOINT, &inbound, 1);
    let cost_in = |loaded: &mut Loaded, pkt: &[u8], want: u32| {
        run(loaded, TO_ENDPOINT, pkt, 1);
        let (v, d) = run(loaded, TO_ENDPOINT, pkt, n);
        assert_eq!(v, want);
        d
    };
    let in_established = cost_in(&mut loaded, &inbound, TC_ACT_OK);
    // the endpoint's own flow to ok:443 (opened above): its reply
    let reply = cost_in(&mut loaded, &packet(ok, ep, 6, 443, 40000), TC_ACT_OK);
    let in_denied = cost_in(&mut loaded, &packet(ok, ep, 6, 50001, 9090), TC_ACT_SHOT);
    // the same inbound flow with ingress not enforced (what to_ep cost before)
    dp.set_endpoint(LO_IFINDEX, EP, ENFORCE).unwrap();
    let in_unenforced = cost_in(&mut loaded, &inbound, TC_ACT_OK);
    eprintln!(
        "issue 18 (mean over {n}): egress with deny entries, allowed {with_deny:?}, denied \
         {denied:?}; ingress enforced: established inbound flow {in_established:?}, reply to \
         the endpoint's own flow {reply:?}, denied new inbound flow + event {in_denied:?}; \
         established inbound flow, ingress not enforced {in_unenforced:?}"
    );
    eprintln!(
        "per packet (mean over {n}): established flow, policy checked again {enforced:?} \
         (allowed by a port range {ranged:?}; with source validation {node:?}); established \
         flow, conntrack only (not enforcing) {ct_only:?}; full policy miss + event {miss:?}; \
         DNS redirect without proxy (UDP lookup + drop) {no_proxy:?}"
    );
}

/// Both programs attach (TCX) to the host side of a veth pair; the links go with the handle.
#[test]
fn attach_to_veth() {
    let Some((_dir, mut loaded, _dp)) = setup("attach") else {
        return;
    };
    let host = format!("fqt{}", std::process::id() % 100_000);
    let peer = format!("{host}p");
    let ip = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .status()
            .unwrap()
            .success()
    };
    assert!(ip(&[
        "link", "add", &host, "type", "veth", "peer", "name", &peer
    ]));
    let r = loaded.attach(&host);
    drop(loaded);
    ip(&["link", "del", &host]);
    r.expect("attach both classifiers");
}

const REDIRECT: EndpointFlags = EndpointFlags {
    enforce_egress: true,
    redirect_dns: true,
    check_source: false,
    enforce_ingress: false,
};

/// DNS from a redirecting endpoint with no proxy socket: dropped with `DROP_NO_PROXY` (fail
/// closed) whatever the policy says; other traffic still follows the policy.
#[test]
fn dns_redirect_without_proxy_drops() {
    let Some((dir, mut loaded, mut dp)) = setup("noproxy") else {
        return;
    };
    base_policy(&mut dp);
    dp.set_endpoint(LO_IFINDEX, EP, REDIRECT).unwrap();
    let mut events = Events::open(&dir.0).unwrap();
    let (ep4, ep6) = (IpAddr::V4(EP_V4), IpAddr::V6(EP_V6));
    let res4 = IpAddr::V4(Ipv4Addr::new(10, 99, 0, 53));
    let res6: IpAddr = "fd00:99::53".parse().unwrap();
    let dns = [
        packet(ep4, res4, sys::PROTO_UDP, 40000, 53),
        packet(ep4, res4, sys::PROTO_TCP, 40001, 53),
        packet(ep6, res6, sys::PROTO_UDP, 40002, 53),
        packet(ep6, res6, sys::PROTO_TCP, 40003, 53),
    ];
    assert_eq!(dp.dns_proxy().unwrap(), (None, None));
    for p in &dns {
        assert_eq!(run(&mut loaded, FROM_ENDPOINT, p, 1).0, TC_ACT_SHOT);
    }
    // a proxy address where nothing listens; and an allow-all policy changes nothing
    let (v4, v6) = ("127.0.0.1:1".parse().unwrap(), "[::1]:1".parse().unwrap());
    dp.set_dns_proxy(Some(v4), Some(v6)).unwrap();
    assert_eq!(dp.dns_proxy().unwrap(), (Some(v4), Some(v6)));
    dp.apply(&[DatapathChange::PolicyUpsert {
        endpoint: EP,
        key: fqdnd_ipcache::PolicyKey::ALLOW_ALL,
    }])
    .unwrap();
    for p in &dns {
        assert_eq!(run(&mut loaded, FROM_ENDPOINT, p, 1).0, TC_ACT_SHOT);
    }
    let ev = events.drain();
    assert_eq!(ev.len(), 8, "{ev:?}");
    assert!(ev.iter().all(|e| e.reason == sys::DROP_NO_PROXY
        && e.endpoint == EP.0
        && e.dport == 53
        && e.identity == 0));
    assert_eq!(
        ev.iter().map(|e| (e.family, e.proto)).collect::<Vec<_>>()[..4],
        [(4, 17), (4, 6), (6, 17), (6, 6)]
    );
    // other traffic: policy and conntrack as before; DNS made no conntrack entry
    let p = packet(ep4, IpAddr::V4(ALLOWED_V4), sys::PROTO_TCP, 40004, 443);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_OK);
    let ct = dp.ct_entries().unwrap();
    assert_eq!(ct.len(), 1, "{ct:?}");
    assert_eq!(ct[0].dport, 443);
    // the redirect flag off: DNS is ordinary traffic (allowed by ALLOW_ALL)
    dp.set_endpoint(LO_IFINDEX, EP, ENFORCE).unwrap();
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &dns[0], 1).0, TC_ACT_OK);
    // the proxy's answers to a redirecting endpoint make no conntrack entry
    dp.set_endpoint(LO_IFINDEX, EP, REDIRECT).unwrap();
    let answer = packet(res4, ep4, sys::PROTO_UDP, 53, 40005);
    assert_eq!(run(&mut loaded, TO_ENDPOINT, &answer, 1).0, TC_ACT_OK);
    assert!(dp.ct_entries().unwrap().iter().all(|e| e.sport != 53));
}

/// A by-source interface: the endpoint comes from the longest client prefix holding the
/// source; unknown sources drop (enforce_unknown) or pass.
#[test]
fn by_source_endpoints() {
    let Some((dir, mut loaded, mut dp)) = setup("bysrc") else {
        return;
    };
    base_policy(&mut dp);
    dp.set_interface_by_source(LO_IFINDEX, true).unwrap();
    let ep8 = EndpointId(8);
    dp.set_client_prefix("10.0.0.0/24".parse().unwrap(), EP, ENFORCE)
        .unwrap();
    dp.set_client_prefix("10.0.0.128/25".parse().unwrap(), ep8, ENFORCE)
        .unwrap();
    dp.set_client_prefix("fd00::/64".parse().unwrap(), EP, ENFORCE)
        .unwrap();
    let mut events = Events::open(&dir.0).unwrap();
    let v4 = |a: [u8; 4]| IpAddr::V4(Ipv4Addr::from(a));
    let ok4 = IpAddr::V4(ALLOWED_V4);
    let verdict = |loaded: &mut Loaded, src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport| {
        run(
            loaded,
            FROM_ENDPOINT,
            &packet(src, dst, proto, sport, dport),
            1,
        )
        .0
    };

    assert_eq!(
        verdict(&mut loaded, v4([10, 0, 0, 7]), ok4, 6, 1000, 443),
        TC_ACT_OK
    );
    // the /25 is endpoint 8, which has no policy
    assert_eq!(
        verdict(&mut loaded, v4([10, 0, 0, 200]), ok4, 6, 1001, 443),
        TC_ACT_SHOT
    );
    // unknown source
    assert_eq!(
        verdict(&mut loaded, v4([10, 0, 1, 7]), ok4, 6, 1002, 443),
        TC_ACT_SHOT
    );
    let ok6 = IpAddr::V6(ALLOWED_V6);
    assert_eq!(
        verdict(&mut loaded, IpAddr::V6(EP_V6), ok6, 6, 1003, 443),
        TC_ACT_OK
    );
    let ev = events.drain();
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert_eq!((ev[0].endpoint, ev[0].reason), (8, sys::DROP_POLICY));
    assert_eq!((ev[1].endpoint, ev[1].reason), (0, sys::DROP_POLICY));
    assert_eq!(&ev[1].saddr[..4], &[10, 0, 1, 7]);

    // a client prefix with the redirect flag: its DNS needs the proxy
    dp.set_client_prefix("10.0.0.128/25".parse().unwrap(), ep8, REDIRECT)
        .unwrap();
    let res = v4([10, 99, 0, 53]);
    assert_eq!(
        verdict(&mut loaded, v4([10, 0, 0, 200]), res, 17, 1004, 53),
        TC_ACT_SHOT
    );
    let ev = events.drain();
    assert_eq!((ev[0].endpoint, ev[0].reason), (8, sys::DROP_NO_PROXY));

    // unknown sources pass when the interface does not enforce them
    dp.set_interface_by_source(LO_IFINDEX, false).unwrap();
    assert_eq!(
        verdict(&mut loaded, v4([10, 0, 1, 7]), ok4, 6, 1005, 443),
        TC_ACT_OK
    );

    assert_eq!(
        dp.endpoint_entries().unwrap(),
        vec![fqdnd_ebpf::EndpointEntry::BySource {
            ifindex: LO_IFINDEX,
            enforce_unknown: false
        }]
    );
    let clients = dp.client_entries().unwrap();
    assert_eq!(clients.len(), 3);
    assert!(clients.contains(&("10.0.0.128/25".parse().unwrap(), ep8, REDIRECT)));
    // removing the /25 gives its sources back to the /24
    dp.remove_client_prefix("10.0.0.128/25".parse().unwrap())
        .unwrap();
    dp.remove_client_prefix("10.0.0.128/25".parse().unwrap())
        .unwrap();
    assert_eq!(
        verdict(&mut loaded, v4([10, 0, 0, 200]), ok4, 6, 1006, 443),
        TC_ACT_OK
    );
}

/// Conntrack read back, live destinations and idle GC, also from a process that only opens
/// the pins.
#[test]
fn conntrack_listing_and_gc() {
    let Some((dir, mut loaded, mut dp)) = setup("ct") else {
        return;
    };
    base_policy(&mut dp);
    let ep = IpAddr::V4(EP_V4);
    let ok = IpAddr::V4(ALLOWED_V4);
    let world = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1));
    let p = packet(ep, ok, sys::PROTO_TCP, 40000, 443);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_OK);
    let inbound = packet(world, ep, sys::PROTO_TCP, 50000, 8080);
    assert_eq!(run(&mut loaded, TO_ENDPOINT, &inbound, 1).0, TC_ACT_OK);
    drop(loaded);
    drop(dp);

    // a reader with the pins only
    let mut dp = KernelDatapath::open(&dir.0).unwrap();
    let mut ct = dp.ct_entries().unwrap();
    ct.sort_by_key(|e| e.flags);
    assert_eq!(ct.len(), 2, "{ct:?}");
    let e = ct[0];
    assert_eq!(
        (e.src, e.sport, e.dst, e.dport, e.proto, e.flags),
        (ep, 40000, ok, 443, 6, sys::CT_EGRESS)
    );
    assert!(e.created_ns <= e.last_seen_ns && e.created_ns > 0);
    assert_eq!((ct[1].src, ct[1].flags), (world, sys::CT_INGRESS));
    // a SYN: the TCP SYN lifetime (60 s by default)
    let now = fqdnd_ebpf::monotonic_ns().unwrap();
    assert_eq!(e.state(), fqdnd_ebpf::CtState::TcpSyn);
    assert!(
        e.remaining(now) > Duration::from_secs(50) && e.remaining(now) <= Duration::from_secs(60)
    );
    assert_eq!(dp.live_destinations().unwrap(), [ok].into_iter().collect());
    assert_eq!(dp.gc_conntrack().unwrap(), 0);
    // short lifetimes: a new packet of each flow expires it 200 ms later; the GC then
    // removes both (polled: the machine may be slow)
    let short = fqdnd_ebpf::CtLifetimes {
        tcp_syn: Duration::from_millis(200),
        tcp_established: Duration::from_millis(200),
        tcp_closing: Duration::from_millis(200),
        other: Duration::from_millis(200),
    };
    dp.set_ct_lifetimes(&short).unwrap();
    assert_eq!(dp.ct_lifetimes().unwrap(), short);
    let mut loaded = Loaded::load(&dir.0).unwrap();
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_OK);
    assert_eq!(run(&mut loaded, TO_ENDPOINT, &inbound, 1).0, TC_ACT_OK);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut removed = 0;
    while removed < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "entries never expired"
        );
        removed += dp.gc_conntrack().unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(dp.ct_entries().unwrap().is_empty());
    assert!(dp.live_destinations().unwrap().is_empty());
    assert_eq!(dp.endpoint_entries().unwrap().len(), 1);
    assert_eq!(dp.policy_entries().unwrap().len(), 1);
    assert_eq!(dp.ipcache_entries().unwrap().len(), 2);
}

/// A restarted daemon reopens full maps: nothing is flushed; the resync confirms what it
/// writes again, writes what changed and deletes the rest; reference counts are rebuilt.
#[test]
fn resync_keeps_confirms_and_removes() {
    let Some((dir, mut loaded, mut dp)) = setup("resync") else {
        return;
    };
    let k443 = key(FQDN_ID, Protocol::Tcp, 443, 443);
    let k80 = key(FQDN_ID, Protocol::Tcp, 80, 81);
    let up = |key| DatapathChange::PolicyUpsert { endpoint: EP, key };
    let ipc = |prefix: &str, id| DatapathChange::IpcacheUpsert {
        prefix: prefix.parse().unwrap(),
        identity: Identity(id),
    };
    dp.set_endpoint(LO_IFINDEX, EP, ENFORCE).unwrap();
    dp.apply(&[
        up(k443),
        up(k80),
        ipc("192.0.2.0/24", FQDN_ID),
        ipc("198.51.100.0/24", 300),
        ipc("2001:db8::/64", FQDN_ID),
    ])
    .unwrap();
    drop(dp);

    let mut dp = KernelDatapath::open(&dir.0).unwrap();
    // 443, and 80-81 as one prefix (80/15)
    assert_eq!(dp.policy_entries().unwrap().len(), 2, "nothing flushed");
    assert_eq!(dp.ipcache_entries().unwrap().len(), 3);
    dp.begin_resync().unwrap();
    let k8080 = key(FQDN_ID, Protocol::Tcp, 8080, 8080);
    dp.apply(&[
        up(k443),
        up(k443),
        up(k8080),
        ipc("192.0.2.0/24", FQDN_ID),
        ipc("2001:db8::/64", 301),
        ipc("203.0.113.0/24", 302),
    ])
    .unwrap();
    // during the resync, old state still enforces
    let ep = IpAddr::V4(EP_V4);
    let ok = IpAddr::V4(ALLOWED_V4);
    let p = packet(ep, ok, sys::PROTO_TCP, 40000, 443);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_OK);
    let p80 = packet(ep, ok, sys::PROTO_TCP, 40001, 80);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p80, 1).0, TC_ACT_OK);
    let stats = dp.finish_resync().unwrap();
    assert_eq!(
        stats,
        fqdnd_ebpf::ResyncStats {
            kept: 2,
            added: 3,
            removed: 2
        }
    );
    let pk = |dport: u16| PolicyKey {
        prefixlen: sys::POLICY_PREFIX_FULL,
        identity: FQDN_ID,
        endpoint: EP.0,
        proto: 6,
        pad: 0,
        dport: dport.to_be(),
        pad2: 0,
    };
    let mut want = vec![pk(443), pk(8080)];
    want.sort();
    assert_eq!(dp.policy_entries().unwrap(), want);
    let mut ipc_now = dp.ipcache_entries().unwrap();
    ipc_now.sort();
    assert_eq!(
        ipc_now,
        vec![
            ("192.0.2.0/24".parse().unwrap(), Identity(FQDN_ID)),
            ("203.0.113.0/24".parse().unwrap(), Identity(302)),
            ("2001:db8::/64".parse().unwrap(), Identity(301)),
        ]
    );
    let p81 = packet(ep, ok, sys::PROTO_TCP, 40002, 81);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p81, 1).0, TC_ACT_SHOT);
    // 443 was written twice during the resync: two deletes to remove it
    let del = DatapathChange::PolicyDelete {
        endpoint: EP,
        key: k443,
    };
    dp.apply(std::slice::from_ref(&del)).unwrap();
    assert_eq!(dp.policy_entries().unwrap().len(), 2);
    dp.apply(&[del]).unwrap();
    assert_eq!(dp.policy_entries().unwrap(), vec![pk(8080)]);
    // no resync in progress: finish is a no-op
    assert_eq!(dp.finish_resync().unwrap(), Default::default());
}
