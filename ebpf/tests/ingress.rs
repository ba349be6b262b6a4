//! Issue 18 on `BPF_PROG_TEST_RUN`: ingress policy in `fqdnd_to_ep` (new and established
//! inbound flows, replies to the endpoint's own flows, ICMP by type, fragments, the proxy's
//! DNS answers), deny entries winning over allows in both directions, and the kernel entries
//! of deny and ingress keys (reference counts across allow and deny).
//!
//! They need root; without it they skip with a message, or fail when
//! `FQDND_REQUIRE_PRIVILEGED=1`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: a failed step should panic"
)]

mod common;

use std::net::IpAddr;

use aya::programs::{TestRun, TestRunOptions};
use common::packets::{ACK, SYN, eth, frame, icmp, ip4, tcp, udp};
use common::{PinDir, privileged};
use fqdnd_ebpf::sys::{self, DropEvent};
use fqdnd_ebpf::{EndpointFlags, Events, FROM_ENDPOINT, KernelDatapath, Loaded, TO_ENDPOINT};
use fqdnd_ipcache::policy::{Direction, Protocol};
use fqdnd_ipcache::{Datapath, DatapathChange, EndpointId, Identity, PolicyKey};

const OK: u32 = 0;
const SHOT: u32 = 2;
const LO: u32 = 1;
const EP: EndpointId = EndpointId(9);
const TCP: u8 = sys::PROTO_TCP;
const UDP: u8 = sys::PROTO_UDP;
/// A peer endpoint's identity (cluster range) and a CIDR identity.
const PEER_ID: u32 = 300;
const CIDR_ID: u32 = (1 << 24) + 5;

fn a(s: &str) -> IpAddr {
    s.parse().unwrap()
}

struct T {
    _dir: PinDir,
    loaded: Loaded,
    dp: KernelDatapath,
    events: Events,
}

impl T {
    fn new(test: &str) -> Option<Self> {
        if !privileged(test) {
            return None;
        }
        let dir = PinDir::new(&format!("ing-{test}"));
        let loaded = Loaded::load(&dir.0).expect("load");
        let dp = KernelDatapath::open(&dir.0).expect("open pinned maps");
        let events = Events::open(&dir.0).unwrap();
        Some(T {
            _dir: dir,
            loaded,
            dp,
            events,
        })
    }

    fn run(&mut self, prog: &str, pkt: &[u8]) -> u32 {
        let mut out = vec![0u8; pkt.len() + 256];
        self.loaded
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

    fn out(&mut self, pkt: &[u8]) -> u32 {
        self.run(FROM_ENDPOINT, pkt)
    }

    fn inb(&mut self, pkt: &[u8]) -> u32 {
        self.run(TO_ENDPOINT, pkt)
    }

    fn drops(&mut self) -> Vec<(u8, u32, u16)> {
        self.events
            .drain()
            .iter()
            .map(|e: &DropEvent| (e.reason, e.identity, e.dport))
            .collect()
    }

    fn apply(&mut self, changes: &[DatapathChange]) {
        self.dp.apply(changes).unwrap();
    }
}

fn key(dir: Direction, deny: bool, id: u32, protocol: Protocol, port: u16) -> PolicyKey {
    PolicyKey {
        identity: Identity(id),
        protocol,
        port,
        end_port: port,
        direction: dir,
        deny,
    }
}

fn up(k: PolicyKey) -> DatapathChange {
    DatapathChange::PolicyUpsert {
        endpoint: EP,
        key: k,
    }
}

fn down(k: PolicyKey) -> DatapathChange {
    DatapathChange::PolicyDelete {
        endpoint: EP,
        key: k,
    }
}

fn ipc(prefix: &str, id: u32) -> DatapathChange {
    DatapathChange::IpcacheUpsert {
        prefix: prefix.parse().unwrap(),
        identity: Identity(id),
    }
}

const ME4: &str = "10.0.0.9";
const PEER4: &str = "10.0.0.30";
const CIDR4: &str = "192.0.2.7";
const WORLD4: &str = "198.51.100.1";

/// An endpoint under ingress policy: the peer endpoint may reach TCP 80 (not 81), the CIDR
/// any port; established inbound flows are checked on every packet; replies to the endpoint's
/// own flows pass whatever the ingress policy; echo only with an ICMP entry.
#[test]
fn ingress_is_enforced_towards_the_endpoint() {
    let Some(mut t) = T::new("enf") else { return };
    let flags = EndpointFlags {
        enforce_egress: false,
        enforce_ingress: true,
        ..EndpointFlags::default()
    };
    t.dp.set_endpoint(LO, EP, flags).unwrap();
    let peer80 = key(Direction::Ingress, false, PEER_ID, Protocol::Tcp, 80);
    t.apply(&[
        up(peer80),
        up(key(Direction::Ingress, false, CIDR_ID, Protocol::Any, 0)),
        up(key(Direction::Egress, false, 0, Protocol::Any, 0)),
        ipc("10.0.0.30/32", PEER_ID),
        ipc("192.0.2.0/24", CIDR_ID),
    ]);
    let (me, peer, cidr, world) = (a(ME4), a(PEER4), a(CIDR4), a(WORLD4));
    assert_eq!(t.inb(&frame(peer, me, TCP, &tcp(40000, 80, SYN))), OK);
    assert_eq!(t.inb(&frame(peer, me, TCP, &tcp(40001, 81, SYN))), SHOT);
    assert_eq!(t.drops(), [(sys::DROP_POLICY, PEER_ID, 81)]);
    assert_eq!(t.inb(&frame(cidr, me, UDP, &udp(5000, 9999, 8))), OK);
    assert_eq!(t.inb(&frame(world, me, TCP, &tcp(40002, 80, SYN))), SHOT);
    assert_eq!(t.drops(), [(sys::DROP_POLICY, sys::ID_WORLD_IPV4, 80)]);
    // the endpoint's reply in the allowed inbound flow passes at its egress
    assert_eq!(t.out(&frame(me, peer, TCP, &tcp(80, 40000, SYN | ACK))), OK);
    // an established inbound flow is checked again: the rule goes, the flow is cut
    assert_eq!(t.inb(&frame(peer, me, TCP, &tcp(40000, 80, ACK))), OK);
    t.apply(&[down(peer80)]);
    assert_eq!(t.inb(&frame(peer, me, TCP, &tcp(40000, 80, ACK))), SHOT);
    assert_eq!(t.drops(), [(sys::DROP_POLICY, PEER_ID, 80)]);
    // replies to the endpoint's own flows pass under ingress default deny
    assert_eq!(t.out(&frame(me, world, TCP, &tcp(41000, 443, SYN))), OK);
    assert_eq!(
        t.inb(&frame(world, me, TCP, &tcp(443, 41000, SYN | ACK))),
        OK
    );
    assert_eq!(t.out(&frame(me, world, UDP, &udp(41001, 53, 8))), OK);
    assert_eq!(t.inb(&frame(world, me, UDP, &udp(53, 41001, 8))), OK);
    // echo: only the CIDR (every protocol) or an ICMP entry of the type allows a request
    let ping = |src| frame(src, me, sys::PROTO_ICMP, &icmp(8, 0, 99, b"x"));
    assert_eq!(t.inb(&ping(world)), SHOT);
    assert_eq!(t.inb(&ping(cidr)), OK);
    assert_eq!(t.inb(&ping(peer)), SHOT);
    t.drops();
    t.apply(&[up(key(
        Direction::Ingress,
        false,
        PEER_ID,
        Protocol::Icmp,
        8,
    ))]);
    assert_eq!(t.inb(&ping(peer)), OK);
    // the endpoint's echo reply to it passes (the request opened an inbound flow)
    assert_eq!(
        t.out(&frame(me, peer, sys::PROTO_ICMP, &icmp(0, 0, 99, b"x"))),
        OK
    );
    // timestamp (13) is another type
    assert_eq!(
        t.inb(&frame(peer, me, sys::PROTO_ICMP, &icmp(13, 0, 1, b""))),
        SHOT
    );
    assert_eq!(t.drops(), [(sys::DROP_ICMP, PEER_ID, 0)]);
    // fragments: a later fragment follows a passed first, not a dropped one
    let first = |src, id| {
        eth(&ip4(
            src,
            me,
            UDP,
            &udp(5000, 7000, 1472),
            Some((id, 0, true)),
        ))
    };
    let later = |src, id| eth(&ip4(src, me, UDP, &[0u8; 800], Some((id, 185, false))));
    assert_eq!(t.inb(&first(cidr, 1)), OK);
    assert_eq!(t.inb(&later(cidr, 1)), OK);
    assert_eq!(t.inb(&first(world, 2)), SHOT);
    assert_eq!(t.inb(&later(world, 2)), SHOT);
    assert_eq!(
        t.drops(),
        [
            (sys::DROP_POLICY, sys::ID_WORLD_IPV4, 7000),
            (sys::DROP_FRAGMENT, 0, 0)
        ]
    );
    // not enforcing ingress: everything passes again
    t.dp.set_endpoint(LO, EP, EndpointFlags::default()).unwrap();
    assert_eq!(t.inb(&frame(world, me, TCP, &tcp(40003, 22, SYN))), OK);
}

/// A deny entry wins over an allow in both directions: of the same identity (a longer deny
/// than a shorter allow, and the same key counted as allow and deny), and of any identity
/// (userspace writes the overlap under the allow's identity); removing the deny restores the
/// allow.
#[test]
fn a_deny_wins_in_both_directions() {
    let Some(mut t) = T::new("deny") else { return };
    let flags = EndpointFlags {
        enforce_egress: true,
        enforce_ingress: true,
        ..EndpointFlags::default()
    };
    t.dp.set_endpoint(LO, EP, flags).unwrap();
    let (me, cidr) = (a(ME4), a(CIDR4));
    let allow_all = key(Direction::Egress, false, CIDR_ID, Protocol::Any, 0);
    let deny_22 = key(Direction::Egress, true, CIDR_ID, Protocol::Tcp, 22);
    t.apply(&[ipc("192.0.2.0/24", CIDR_ID), up(allow_all), up(deny_22)]);
    assert_eq!(t.out(&frame(me, cidr, TCP, &tcp(40000, 443, SYN))), OK);
    assert_eq!(t.out(&frame(me, cidr, TCP, &tcp(40001, 22, SYN))), SHOT);
    assert_eq!(t.drops(), [(sys::DROP_POLICY, CIDR_ID, 22)]);
    // the same kernel key as an allow and a deny: the deny holds while it is counted
    let allow_22 = key(Direction::Egress, false, CIDR_ID, Protocol::Tcp, 22);
    t.apply(&[up(allow_22)]);
    assert_eq!(t.out(&frame(me, cidr, TCP, &tcp(40002, 22, SYN))), SHOT);
    t.apply(&[down(deny_22)]);
    assert_eq!(t.out(&frame(me, cidr, TCP, &tcp(40003, 22, SYN))), OK);
    t.apply(&[down(allow_22)]);
    assert_eq!(
        t.out(&frame(me, cidr, TCP, &tcp(40004, 22, SYN))),
        OK,
        "allow-all left"
    );
    t.drops();
    // ingress: an identity's allow, any identity's deny materialised as the identity's deny
    t.apply(&[
        up(key(Direction::Ingress, false, CIDR_ID, Protocol::Tcp, 80)),
        up(key(Direction::Ingress, true, 0, Protocol::Tcp, 80)),
        up(key(Direction::Ingress, true, CIDR_ID, Protocol::Tcp, 80)),
    ]);
    assert_eq!(t.inb(&frame(cidr, me, TCP, &tcp(40000, 80, SYN))), SHOT);
    t.apply(&[
        down(key(Direction::Ingress, true, 0, Protocol::Tcp, 80)),
        down(key(Direction::Ingress, true, CIDR_ID, Protocol::Tcp, 80)),
    ]);
    assert_eq!(t.inb(&frame(cidr, me, TCP, &tcp(40005, 80, SYN))), OK);
    // ingress entries never allow egress and the other way round
    assert_eq!(t.out(&frame(me, a(PEER4), TCP, &tcp(40006, 80, SYN))), SHOT);
    // the kernel holds one entry per key, its value the verdict
    let entries = t.dp.policy_entries().unwrap();
    assert!(
        entries
            .iter()
            .any(|k| k.identity == CIDR_ID | sys::POLICY_ID_INGRESS && k.proto == TCP),
        "{entries:?}"
    );
}

/// The proxy's DNS answers reach an endpoint under ingress policy: its redirected query left
/// a DNS conntrack entry that they answer; a datagram from port 53 that answers no query is
/// judged like any other.
#[test]
fn dns_answers_pass_under_ingress_policy() {
    let Some(mut t) = T::new("dns") else { return };
    let flags = EndpointFlags {
        enforce_egress: true,
        redirect_dns: true,
        enforce_ingress: true,
        ..EndpointFlags::default()
    };
    t.dp.set_endpoint(LO, EP, flags).unwrap();
    let (me, res) = (a(ME4), a("10.99.0.53"));
    // No proxy socket here (BPF_PROG_TEST_RUN cannot assign one), so the query drops and no
    // entry is made: its answer is judged as a new inbound flow, and dropped.
    assert_eq!(t.out(&frame(me, res, UDP, &udp(40000, 53, 20))), SHOT);
    assert_eq!(t.inb(&frame(res, me, UDP, &udp(53, 40000, 20))), SHOT);
    let d = t.drops();
    assert_eq!(d[0].0, sys::DROP_NO_PROXY);
    assert_eq!(d[1], (sys::DROP_POLICY, sys::ID_WORLD_IPV4, 40000));
    assert!(t.dp.ct_entries().unwrap().is_empty());
}
