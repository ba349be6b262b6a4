//! Kernel tests: load + pin + reopen, BPF_PROG_TEST_RUN verdicts, KernelDatapath batches.
//!
//! They need root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN to mount bpffs). Without it they
//! skip with a message, or fail when `FQDND_REQUIRE_PRIVILEGED=1` (CI sets it).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use aya::programs::{TestRun, TestRunOptions};
use fqdnd_ebpf::sys::{self, PolicyKey};
use fqdnd_ebpf::{Events, FROM_ENDPOINT, KernelDatapath, Loaded, TO_ENDPOINT, map_names};
use fqdnd_ipcache::policy::Protocol;
use fqdnd_ipcache::{Datapath, DatapathChange, EndpointId, Identity};

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
/// BPF_PROG_TEST_RUN runs tc programs on the loopback device of the caller's netns.
const LO_IFINDEX: u32 = 1;
const EP: EndpointId = EndpointId(7);

/// A unique pin dir under bpffs, removed on drop.
struct PinDir(PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn privileged(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let msg = format!("{test}: needs root for eBPF (skipped)");
    assert!(
        std::env::var("FQDND_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
        "{msg}, and FQDND_REQUIRE_PRIVILEGED=1"
    );
    eprintln!("{msg}");
    false
}

fn setup(test: &str) -> Option<(PinDir, Loaded, KernelDatapath)> {
    if !privileged(test) {
        return None;
    }
    let dir = PinDir(PathBuf::from(format!(
        "/sys/fs/bpf/fqdnd-test-{}-{test}",
        std::process::id()
    )));
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
    }
}

/// Ethernet + IPv4/IPv6 + TCP (20-byte header) or UDP (8-byte header).
fn packet(src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport: u16) -> Vec<u8> {
    let mut p = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    let l4_len = if proto == sys::PROTO_TCP { 20 } else { 8 };
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            p.extend([0x08, 0x00]);
            let total = (20 + l4_len) as u16;
            p.extend([0x45, 0]);
            p.extend(total.to_be_bytes());
            p.extend([0, 0, 0x40, 0, 64, proto, 0, 0]);
            p.extend(s.octets());
            p.extend(d.octets());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            p.extend([0x86, 0xdd]);
            p.extend([0x60, 0, 0, 0]);
            p.extend((l4_len as u16).to_be_bytes());
            p.extend([proto, 64]);
            p.extend(s.octets());
            p.extend(d.octets());
        }
        _ => panic!("mixed families"),
    }
    p.extend(sport.to_be_bytes());
    p.extend(dport.to_be_bytes());
    if proto == sys::PROTO_TCP {
        p.extend([0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    } else {
        p.extend((8u16).to_be_bytes());
        p.extend([0, 0]);
    }
    p
}

fn run(loaded: &mut Loaded, prog: &str, pkt: &[u8], repeat: u32) -> (u32, std::time::Duration) {
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
    dp.set_endpoint(LO_IFINDEX, EP, true).unwrap();
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

    // conntrack: an established flow passes after its policy is gone
    dp.apply(&[DatapathChange::PolicyDelete {
        endpoint: EP,
        key: key(FQDN_ID, Protocol::Tcp, 443, 443),
    }])
    .unwrap();
    assert!(dp.policy_entries().unwrap().is_empty());
    let p = packet(ep, ok, sys::PROTO_TCP, 40000, 443);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_OK);
    let p = packet(ep, ok, sys::PROTO_TCP, 40004, 443);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &p, 1).0, TC_ACT_SHOT);

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
    dp.set_endpoint(LO_IFINDEX, EP, false).unwrap();
    let other = packet(ep, world, sys::PROTO_TCP, 1005, 22);
    assert_eq!(run(&mut loaded, FROM_ENDPOINT, &other, 1).0, TC_ACT_OK);
    // unknown interface: passes
    dp.set_endpoint(LO_IFINDEX, EP, true).unwrap();
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
    let pk = |endpoint: u16, identity: u32, proto: u8, dport: u16| PolicyKey {
        identity,
        endpoint,
        dport,
        proto,
        pad: [0; 3],
    };
    assert_eq!(
        dp.policy_entries().unwrap(),
        vec![
            pk(8, 0, 0, 0),
            pk(7, FQDN_ID, 6, 80),
            pk(7, FQDN_ID, 6, 81),
            pk(7, FQDN_ID, 6, 82)
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

    // overlapping keys share entries: deleting the 81..81 key keeps port 81 for 80..82
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
    assert_eq!(dp.policy_entries().unwrap().len(), 4);
    assert_eq!(
        dp.identity_of("10.1.2.3".parse().unwrap()).unwrap(),
        Identity(400)
    );
    dp.apply(&[DatapathChange::PolicyDelete {
        endpoint: EP,
        key: k80,
    }])
    .unwrap();
    assert_eq!(dp.policy_entries().unwrap(), vec![pk(8, 0, 0, 0)]);

    // too wide a range is refused, nothing written
    let wide = key(FQDN_ID, Protocol::Tcp, 1024, 65535);
    assert!(
        dp.apply(&[DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: wide
        }])
        .is_err()
    );
    assert_eq!(dp.policy_entries().unwrap().len(), 1);
}

/// Per-packet cost of the policy program, printed (run with --nocapture to see it).
#[test]
fn per_packet_cost() {
    let Some((_dir, mut loaded, mut dp)) = setup("cost") else {
        return;
    };
    base_policy(&mut dp);
    let ep = IpAddr::V4(EP_V4);
    let n = 100_000;
    // conntrack hit
    let est = packet(ep, IpAddr::V4(ALLOWED_V4), 6, 40000, 443);
    run(&mut loaded, FROM_ENDPOINT, &est, 1);
    let (_, hit) = run(&mut loaded, FROM_ENDPOINT, &est, n);
    // policy miss → full lookup chain + drop event
    let deny = packet(ep, IpAddr::V4(ALLOWED_V4), 6, 40001, 80);
    let (v, miss) = run(&mut loaded, FROM_ENDPOINT, &deny, n);
    assert_eq!(v, TC_ACT_SHOT);
    eprintln!(
        "per packet (mean over {n}): conntrack hit {hit:?}, full policy miss + event {miss:?}"
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
