//! Issue 15 on `BPF_PROG_TEST_RUN`: policy on established flows (plain and load-balanced),
//! TCP state in conntrack, ICMP/ICMPv6, fragments, IPv6 extension headers, source
//! validation, port ranges as LPM prefixes, and the undo log of refused batches.
//!
//! They need root; without it they skip with a message, or fail when
//! `FQDND_REQUIRE_PRIVILEGED=1`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "tests; waiting for conntrack entries to expire polls the real clock"
)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use aya::programs::{TestRun, TestRunOptions};
use common::packets::{
    ACK, AH, DSTOPTS, ESP, FIN, FRAGMENT, HOPOPTS, ROUTING, RST, SYN, eth, frag6, frame, icmp,
    icmp_error, ip4, ip6, tcp, udp,
};
use common::{PinDir, privileged};
use fqdnd_ebpf::sys::{self, DropEvent};
use fqdnd_ebpf::{
    CtLifetimes, CtState, EndpointFlags, Events, FROM_ENDPOINT, KernelDatapath, Loaded, MapSizes,
    TO_ENDPOINT,
};
use fqdnd_ipcache::policy::Protocol;
use fqdnd_ipcache::{Datapath, DatapathChange, DatapathError, EndpointId, Identity, PolicyKey};

const OK: u32 = 0;
const SHOT: u32 = 2;
/// BPF_PROG_TEST_RUN runs tc programs on the loopback device of the caller's netns.
const LO: u32 = 1;
const EP: EndpointId = EndpointId(7);
const ENFORCE: EndpointFlags = EndpointFlags {
    enforce_egress: true,
    redirect_dns: false,
    check_source: false,
    enforce_ingress: false,
};
/// Allowed at L3 (every protocol and port).
const L3_ID: u32 = (1 << 24) + 1;
/// Allowed on TCP 443 only.
const L4_ID: u32 = (1 << 24) + 2;
const TCP: u8 = sys::PROTO_TCP;
const UDP: u8 = sys::PROTO_UDP;

fn v4(a: [u8; 4]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(a))
}
fn v6(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The endpoint's addresses, an L3-allowed destination and an L4-allowed one per family.
struct Addrs {
    ep: IpAddr,
    l3: IpAddr,
    l4: IpAddr,
    world: IpAddr,
}
const A4: fn() -> Addrs = || Addrs {
    ep: v4([10, 0, 0, 7]),
    l3: v4([192, 0, 2, 10]),
    l4: v4([198, 51, 100, 10]),
    world: v4([203, 0, 113, 1]),
};
const A6: fn() -> Addrs = || Addrs {
    ep: v6("fd00::7"),
    l3: v6("2001:db8:1::10"),
    l4: v6("2001:db8:2::10"),
    world: v6("2001:db8:9::1"),
};

fn key(identity: u32, protocol: Protocol, port: u16, end_port: u16) -> PolicyKey {
    PolicyKey {
        identity: Identity(identity),
        protocol,
        port,
        end_port,
        ..Default::default()
    }
}

struct T {
    dir: PinDir,
    loaded: Loaded,
    dp: KernelDatapath,
    events: Events,
}

impl T {
    fn new(test: &str) -> Option<Self> {
        Self::with_sizes(test, &MapSizes::default())
    }

    fn with_sizes(test: &str, sizes: &MapSizes) -> Option<Self> {
        if !privileged(test) {
            return None;
        }
        let dir = PinDir::new(&format!("enf-{test}"));
        let (loaded, _) = Loaded::load_with(&dir.0, sizes).expect("load");
        let dp = KernelDatapath::open(&dir.0).expect("open pinned maps");
        let events = Events::open(&dir.0).unwrap();
        Some(T {
            dir,
            loaded,
            dp,
            events,
        })
    }

    /// Endpoint 7 on lo, enforcing: L3_ID allowed at L3, L4_ID on TCP 443.
    fn base_policy(&mut self) {
        self.dp.set_endpoint(LO, EP, ENFORCE).unwrap();
        self.dp
            .apply(&[
                DatapathChange::PolicyUpsert {
                    endpoint: EP,
                    key: key(L3_ID, Protocol::Any, 0, 0),
                },
                DatapathChange::PolicyUpsert {
                    endpoint: EP,
                    key: key(L4_ID, Protocol::Tcp, 443, 443),
                },
                ipc("192.0.2.0/24", L3_ID),
                ipc("198.51.100.0/24", L4_ID),
                ipc("2001:db8:1::/64", L3_ID),
                ipc("2001:db8:2::/64", L4_ID),
            ])
            .unwrap();
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

    /// (reason, proto, sport, dport) of the events since the last call.
    fn drops(&mut self) -> Vec<(u8, u8, u16, u16)> {
        self.events
            .drain()
            .iter()
            .map(|e: &DropEvent| (e.reason, e.proto, e.sport, e.dport))
            .collect()
    }

    /// The conntrack entry of (sport, dport, proto).
    fn ct(&self, sport: u16, dport: u16, proto: u8) -> Option<fqdnd_ebpf::CtEntry> {
        self.dp
            .ct_entries()
            .unwrap()
            .into_iter()
            .find(|e| e.sport == sport && e.dport == dport && e.proto == proto)
    }
}

fn ipc(prefix: &str, id: u32) -> DatapathChange {
    DatapathChange::IpcacheUpsert {
        prefix: prefix.parse().unwrap(),
        identity: Identity(id),
    }
}

/// Established flows are checked on every packet of their opening direction: a removed rule
/// or a destination whose identity went cuts them; replies to inbound flows skip policy.
#[test]
fn established_flows_are_checked_on_every_packet() {
    let Some(mut t) = T::new("est") else { return };
    t.base_policy();
    for a in [A4(), A6()] {
        let syn = frame(a.ep, a.l4, TCP, &tcp(40000, 443, SYN));
        let ack = frame(a.ep, a.l4, TCP, &tcp(40000, 443, ACK));
        assert_eq!(t.out(&syn), OK);
        assert_eq!(t.out(&ack), OK);
        t.dp.apply(&[DatapathChange::PolicyDelete {
            endpoint: EP,
            key: key(L4_ID, Protocol::Tcp, 443, 443),
        }])
        .unwrap();
        let before = t.ct(40000, 443, TCP).unwrap();
        assert_eq!(t.out(&ack), SHOT);
        assert_eq!(t.drops(), [(sys::DROP_POLICY, TCP, 40000, 443)]);
        // a dropped packet does not refresh its flow
        assert_eq!(
            t.ct(40000, 443, TCP).unwrap().last_seen_ns,
            before.last_seen_ns
        );
        t.dp.apply(&[DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: key(L4_ID, Protocol::Tcp, 443, 443),
        }])
        .unwrap();
        assert_eq!(t.out(&ack), OK);
        // the endpoint's replies in a flow opened towards it skip policy (the world is not
        // allowed)
        let inbound = frame(a.world, a.ep, TCP, &tcp(50000, 22, SYN));
        let reply = frame(a.ep, a.world, TCP, &tcp(22, 50000, SYN | ACK));
        assert_eq!(t.out(&reply), SHOT);
        assert_eq!(t.inb(&inbound), OK);
        assert_eq!(t.out(&reply), OK);
        t.drops();
        // a non-enforcing endpoint: everything passes, flows are still tracked
        t.dp.set_endpoint(LO, EP, EndpointFlags::default()).unwrap();
        let other = frame(a.ep, a.world, UDP, &udp(40001, 9999, 0));
        assert_eq!(t.out(&other), OK);
        assert!(t.ct(40001, 9999, UDP).is_some());
        t.dp.set_endpoint(LO, EP, ENFORCE).unwrap();
        assert_eq!(t.out(&other), SHOT);
        t.drops();
    }
}

/// A load-balanced flow is checked against its backend on every packet.
#[test]
fn established_service_flows_are_checked_against_their_backend() {
    let Some(mut t) = T::new("lb") else { return };
    t.base_policy();
    let mut lb = fqdnd_lb::LoadBalancer::new();
    let service = fqdnd_lb::ServiceKey {
        vip: "10.96.0.10".parse().unwrap(),
        port: 80,
        proto: fqdnd_lb::Protocol::Tcp,
    };
    // one backend, allowed by the L4 rule (its identity, port 443)
    let backends: Vec<std::net::SocketAddr> = vec!["198.51.100.20:443".parse().unwrap()];
    let mut lb_maps = fqdnd_ebpf::LbMaps::open(&t.dir.0).unwrap();
    lb_maps
        .apply(&lb.set_service(service, &backends).unwrap())
        .unwrap();
    let ep = v4([10, 0, 0, 7]);
    let vip = v4([10, 96, 0, 10]);
    let ack = frame(ep, vip, TCP, &tcp(41000, 80, ACK));
    assert_eq!(t.out(&ack), OK);
    let e = t.ct(41000, 80, TCP).unwrap();
    assert_ne!(e.backend, 0);
    assert_eq!(t.out(&ack), OK);
    t.dp.apply(&[DatapathChange::PolicyDelete {
        endpoint: EP,
        key: key(L4_ID, Protocol::Tcp, 443, 443),
    }])
    .unwrap();
    assert_eq!(t.out(&ack), SHOT);
    let ev = t.events.drain();
    assert_eq!(ev.len(), 1, "{ev:?}");
    // the event names the backend, what policy was checked against
    assert_eq!(
        (ev[0].reason, ev[0].identity, ev[0].dport, &ev[0].daddr[..4]),
        (sys::DROP_POLICY, L4_ID, 443, &[198, 51, 100, 20][..])
    );
}

/// TCP state: SYN, established after a packet without SYN, half-closed stays established,
/// closing after FIN both ways or RST; a new SYN on a closing tuple starts over; lifetimes by
/// state; an inbound TCP flow is opened only by a SYN.
#[test]
fn tcp_state_sets_the_lifetime() {
    let Some(mut t) = T::new("tcp") else { return };
    t.base_policy();
    let l = CtLifetimes {
        tcp_syn: Duration::from_secs(1100),
        tcp_established: Duration::from_secs(2200),
        tcp_closing: Duration::from_secs(330),
        other: Duration::from_secs(4400),
    };
    t.dp.set_ct_lifetimes(&l).unwrap();
    let a = A4();
    let state = |t: &T, sport, dport, proto| {
        let e = t.ct(sport, dport, proto).unwrap();
        let now = fqdnd_ebpf::monotonic_ns().unwrap();
        // the lifetime left, in hundreds of seconds (the test takes less than that)
        (e.state(), e.remaining(now).as_secs().div_ceil(100))
    };
    let out = |f| frame(a.ep, a.l4, TCP, &tcp(40000, 443, f));
    let back = |f| frame(a.l4, a.ep, TCP, &tcp(443, 40000, f));
    assert_eq!(t.out(&out(SYN)), OK);
    assert_eq!(state(&t, 40000, 443, TCP), (CtState::TcpSyn, 11));
    assert_eq!(t.inb(&back(SYN | ACK)), OK);
    assert_eq!(state(&t, 40000, 443, TCP), (CtState::TcpSyn, 11));
    assert_eq!(t.out(&out(ACK)), OK);
    assert_eq!(state(&t, 40000, 443, TCP), (CtState::TcpEstablished, 22));
    // half-closed: the other side may go on sending
    assert_eq!(t.out(&out(FIN | ACK)), OK);
    assert_eq!(state(&t, 40000, 443, TCP), (CtState::TcpEstablished, 22));
    assert_eq!(t.inb(&back(FIN | ACK)), OK);
    assert_eq!(state(&t, 40000, 443, TCP), (CtState::TcpClosing, 4));
    assert_eq!(t.out(&out(ACK)), OK);
    assert_eq!(state(&t, 40000, 443, TCP), (CtState::TcpClosing, 4));
    // the tuple reused by a new connection
    let created = t.ct(40000, 443, TCP).unwrap().created_ns;
    assert_eq!(t.out(&out(SYN)), OK);
    let e = t.ct(40000, 443, TCP).unwrap();
    assert_eq!(e.state(), CtState::TcpSyn);
    assert!(e.created_ns > created);
    assert_eq!(t.out(&out(ACK)), OK);
    // RST either way closes
    assert_eq!(t.inb(&back(RST)), OK);
    assert_eq!(state(&t, 40000, 443, TCP), (CtState::TcpClosing, 4));
    assert!(t.ct(40000, 443, TCP).unwrap().flags & sys::CT_TCP_RST != 0);
    // not TCP: the other lifetime
    assert_eq!(t.out(&frame(a.ep, a.l3, UDP, &udp(40001, 53, 0))), OK);
    assert_eq!(state(&t, 40001, 53, UDP), (CtState::Other, 44));
    // inbound: a stray segment opens nothing, a SYN opens a flow whose replies pass
    let stray = frame(a.world, a.ep, TCP, &tcp(50001, 8080, ACK));
    assert_eq!(t.inb(&stray), OK);
    assert!(t.ct(50001, 8080, TCP).is_none());
    let reply = frame(a.ep, a.world, TCP, &tcp(8080, 50001, ACK));
    assert_eq!(t.out(&reply), SHOT);
    let syn_in = frame(a.world, a.ep, TCP, &tcp(50001, 8080, SYN));
    assert_eq!(t.inb(&syn_in), OK);
    assert!(t.ct(50001, 8080, TCP).unwrap().flags & sys::CT_INGRESS != 0);
    assert_eq!(t.out(&reply), OK);
    // an entry past its lifetime is dead: the programs treat it as absent (a reply to a
    // dead inbound flow is judged by policy again) and the GC removes it
    t.dp.set_ct_lifetimes(&CtLifetimes {
        tcp_established: Duration::from_millis(1),
        ..l
    })
    .unwrap();
    assert_eq!(t.out(&reply), OK);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while t
        .ct(50001, 8080, TCP)
        .is_some_and(|e| e.alive(fqdnd_ebpf::monotonic_ns().unwrap()))
    {
        assert!(std::time::Instant::now() < deadline, "never expired");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(t.out(&reply), SHOT);
    assert!(t.dp.gc_conntrack().unwrap() >= 1);
    assert!(t.ct(50001, 8080, TCP).is_none());
}

/// ICMP and ICMPv6: echo to an L3-allowed destination (and its reply) passes, to an
/// L4-only one drops; errors embedding a tracked flow pass both ways; neighbour discovery
/// passes; the rest drops with its type and code in the event.
#[test]
fn icmp_echo_errors_and_the_rest() {
    let Some(mut t) = T::new("icmp") else { return };
    t.base_policy();
    for (a, proto, req, rep, unreach, extra) in [
        (A4(), sys::PROTO_ICMP, 8u8, 0u8, 3u8, 11u8),
        (A6(), sys::PROTO_ICMPV6, 128, 129, 1, 2),
    ] {
        // echo: a flow keyed by the identifier
        let ping = frame(a.ep, a.l3, proto, &icmp(req, 0, 777, b"x"));
        let pong = frame(a.l3, a.ep, proto, &icmp(rep, 0, 777, b"x"));
        assert_eq!(t.out(&ping), OK);
        let e = t.ct(777, 0, proto).unwrap();
        assert_eq!((e.flags & sys::CT_EGRESS, e.dst), (sys::CT_EGRESS, a.l3));
        assert_eq!(t.inb(&pong), OK);
        assert_eq!(t.out(&ping), OK);
        // an L4 rule does not allow ICMP
        let ping4 = frame(a.ep, a.l4, proto, &icmp(req, 0, 778, b"x"));
        assert_eq!(t.out(&ping4), SHOT);
        assert_eq!(t.drops(), [(sys::DROP_POLICY, proto, u16::from(req), 0)]);
        // a reply to no request; then an inbound ping the endpoint answers
        let unasked = frame(a.ep, a.world, proto, &icmp(rep, 0, 779, b""));
        assert_eq!(t.out(&unasked), SHOT);
        assert_eq!(t.drops(), [(sys::DROP_ICMP, proto, u16::from(rep), 0)]);
        assert_eq!(
            t.inb(&frame(a.world, a.ep, proto, &icmp(req, 0, 779, b""))),
            OK
        );
        assert_eq!(t.out(&unasked), OK);

        // errors from the endpoint about a packet it received
        let (udp_in, udp_in_other) = if a.ep.is_ipv4() {
            (
                ip4(a.world, a.ep, UDP, &udp(5000, 6000, 4), None),
                ip4(a.world, a.ep, UDP, &udp(5001, 6000, 4), None),
            )
        } else {
            (
                ip6(a.world, a.ep, &[], UDP, &udp(5000, 6000, 4)),
                ip6(a.world, a.ep, &[], UDP, &udp(5001, 6000, 4)),
            )
        };
        // an inbound UDP flow, then the endpoint's port unreachable about it
        assert_eq!(t.inb(&frame(a.world, a.ep, UDP, &udp(5000, 6000, 4))), OK);
        let err = frame(a.ep, a.world, proto, &icmp_error(unreach, 4, &udp_in));
        assert_eq!(t.out(&err), OK);
        // about a flow conntrack does not know
        let err = frame(a.ep, a.world, proto, &icmp_error(unreach, 4, &udp_in_other));
        assert_eq!(t.out(&err), SHOT);
        assert_eq!(t.drops(), [(sys::DROP_ICMP, proto, u16::from(unreach), 4)]);
        // about the reply of the endpoint's own flow (its socket went away): the embedded
        // packet is the flow's reverse
        assert_eq!(t.out(&frame(a.ep, a.l3, UDP, &udp(6001, 53, 0))), OK);
        let late_reply = if a.ep.is_ipv4() {
            ip4(a.l3, a.ep, UDP, &udp(53, 6001, 4), None)
        } else {
            ip6(a.l3, a.ep, &[], UDP, &udp(53, 6001, 4))
        };
        let err = frame(a.ep, a.l3, proto, &icmp_error(unreach, 3, &late_reply));
        assert_eq!(t.out(&err), OK);
        // sent to another host than the embedded packet's source: not related
        let err = frame(a.ep, a.world, proto, &icmp_error(unreach, 3, &late_reply));
        assert_eq!(t.out(&err), SHOT);
        // time exceeded (v4) / packet too big (v6) about the inbound flow
        let err = frame(a.ep, a.world, proto, &icmp_error(extra, 0, &udp_in));
        assert_eq!(t.out(&err), OK);
        // errors towards the endpoint always pass (no ingress policy)
        assert_eq!(
            t.inb(&frame(
                a.world,
                a.ep,
                proto,
                &icmp_error(unreach, 4, &udp_in_other)
            )),
            OK
        );
        t.drops();
    }
    let a = A6();
    // neighbour solicitation to a unicast address: passes
    assert_eq!(
        t.out(&frame(
            a.ep,
            a.world,
            sys::PROTO_ICMPV6,
            &icmp(135, 0, 0, &[0; 16])
        )),
        OK
    );
    // a multicast listener query to a unicast address, an ICMP timestamp request: dropped
    // towards an L4-only destination; an L3 rule allows every protocol, ICMP types included
    // (Cilium's semantics), so towards the L3 one they pass
    assert_eq!(
        t.out(&frame(a.ep, a.l4, sys::PROTO_ICMPV6, &icmp(130, 0, 0, b""))),
        SHOT
    );
    let a4 = A4();
    assert_eq!(
        t.out(&frame(a4.ep, a4.l4, sys::PROTO_ICMP, &icmp(13, 0, 1, b""))),
        SHOT
    );
    assert_eq!(
        t.out(&frame(a.ep, a.l3, sys::PROTO_ICMPV6, &icmp(130, 0, 0, b""))),
        OK
    );
    assert_eq!(
        t.out(&frame(a4.ep, a4.l3, sys::PROTO_ICMP, &icmp(13, 0, 1, b""))),
        OK
    );
    assert_eq!(
        t.drops(),
        [
            (sys::DROP_ICMP, sys::PROTO_ICMPV6, 130, 0),
            (sys::DROP_ICMP, sys::PROTO_ICMP, 13, 0)
        ]
    );
    // a non-enforcing endpoint: any ICMP passes
    t.dp.set_endpoint(LO, EP, EndpointFlags::default()).unwrap();
    assert_eq!(
        t.out(&frame(a4.ep, a4.l3, sys::PROTO_ICMP, &icmp(13, 0, 1, b""))),
        OK
    );
}

/// IPv4 and IPv6 fragments: the first is classified, later ones follow an allowed first;
/// a denied first fragment takes its id's entry with it.
#[test]
fn fragments_follow_their_first() {
    let Some(mut t) = T::new("frag") else { return };
    t.base_policy();
    let a = A4();
    let first = |dport, id| {
        eth(&ip4(
            a.ep,
            a.l3,
            UDP,
            &udp(40000, dport, 1472),
            Some((id, 0, true)),
        ))
    };
    let later = |id, mf| eth(&ip4(a.ep, a.l3, UDP, &[0u8; 800], Some((id, 185, mf))));
    assert_eq!(t.out(&first(8053, 7)), OK);
    assert_eq!(t.out(&later(7, true)), OK);
    assert_eq!(t.out(&later(7, false)), OK);
    // a later fragment of a datagram whose first was never seen
    assert_eq!(t.out(&later(8, false)), SHOT);
    assert_eq!(t.drops(), [(sys::DROP_FRAGMENT, UDP, 0, 0)]);
    // the L4 rule's identity: a first fragment to a denied port drops, and so do its later
    // ones; the same id reused after an allowed datagram drops too
    let first4 = |dport, id| {
        eth(&ip4(
            a.ep,
            a.l4,
            UDP,
            &udp(40001, dport, 1472),
            Some((id, 0, true)),
        ))
    };
    let later4 = |id| eth(&ip4(a.ep, a.l4, UDP, &[0u8; 800], Some((id, 185, false))));
    assert_eq!(t.out(&first4(9999, 9)), SHOT);
    assert_eq!(t.out(&later4(9)), SHOT);
    t.dp.apply(&[DatapathChange::PolicyUpsert {
        endpoint: EP,
        key: key(L4_ID, Protocol::Udp, 9999, 9999),
    }])
    .unwrap();
    assert_eq!(t.out(&first4(9999, 10)), OK);
    assert_eq!(t.out(&later4(10)), OK);
    t.dp.apply(&[DatapathChange::PolicyDelete {
        endpoint: EP,
        key: key(L4_ID, Protocol::Udp, 9999, 9999),
    }])
    .unwrap();
    assert_eq!(t.out(&first4(9999, 10)), SHOT);
    assert_eq!(t.out(&later4(10)), SHOT);
    t.drops();

    // IPv6: fragment headers
    let a = A6();
    let first6 = |dport, id| {
        eth(&ip6(
            a.ep,
            a.l4,
            &[(FRAGMENT, frag6(0, true, id))],
            TCP,
            &tcp(40002, dport, ACK),
        ))
    };
    let later6 = |id| {
        eth(&ip6(
            a.ep,
            a.l4,
            &[(FRAGMENT, frag6(181, false, id))],
            TCP,
            &[0; 64],
        ))
    };
    assert_eq!(t.out(&first6(443, 70_000)), OK);
    assert_eq!(t.out(&later6(70_000)), OK);
    assert_eq!(t.out(&later6(70_001)), SHOT);
    assert_eq!(t.out(&first6(444, 70_002)), SHOT);
    assert_eq!(t.out(&later6(70_002)), SHOT);
    // the event of a later fragment names the datagram's protocol
    let d = t.drops();
    assert_eq!(d[0], (sys::DROP_FRAGMENT, TCP, 0, 0));
    assert_eq!(d[1].0, sys::DROP_POLICY);
    // not enforcing: later fragments pass regardless
    t.dp.set_endpoint(LO, EP, EndpointFlags::default()).unwrap();
    assert_eq!(t.out(&later6(70_003)), OK);
}

/// IPv6 extension headers are walked to the upper-layer header (policy sees the port), up
/// to a bound.
#[test]
fn ipv6_extension_headers_are_walked() {
    let Some(mut t) = T::new("ext") else { return };
    t.base_policy();
    let a = A6();
    let with =
        |ext: &[(u8, Vec<u8>)], dport| eth(&ip6(a.ep, a.l4, ext, TCP, &tcp(40000, dport, SYN)));
    let dst = (DSTOPTS, vec![1, 4, 0, 0, 0, 0]);
    assert_eq!(t.out(&with(std::slice::from_ref(&dst), 443)), OK);
    assert_eq!(t.out(&with(std::slice::from_ref(&dst), 444)), SHOT);
    assert_eq!(t.drops(), [(sys::DROP_POLICY, TCP, 40000, 444)]);
    // several kinds, a long one (40 bytes of options)
    let chain = [
        (HOPOPTS, vec![1, 4, 0, 0, 0, 0]),
        (ROUTING, vec![0, 0, 0, 0, 0, 0]),
        (
            DSTOPTS,
            vec![
                1, 36, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
        ),
        (AH, vec![0; 10]),
    ];
    assert_eq!(t.out(&with(&chain, 443)), OK);
    assert_eq!(t.out(&with(&chain, 8443)), SHOT);
    // eight are walked, nine are too many
    let eight = vec![dst.clone(); 8];
    assert_eq!(t.out(&with(&eight, 443)), OK);
    let nine = vec![dst.clone(); 9];
    assert_eq!(t.out(&with(&nine, 443)), SHOT);
    let d = t.drops();
    assert_eq!(d.len(), 2);
    assert_eq!(d[1].0, sys::DROP_EXT_HEADERS);
    // ESP hides the upper layer: unhandled
    assert_eq!(t.out(&eth(&ip6(a.ep, a.l3, &[], ESP, &[0; 16]))), SHOT);
    assert_eq!(t.drops()[0].0, sys::DROP_UNHANDLED);
}

/// Source validation: a packet whose source is not one of the interface's addresses drops
/// with its own reason before the DNS redirect, enforcing or not.
#[test]
fn spoofed_sources_drop_before_the_redirect() {
    let Some(mut t) = T::new("spoof") else { return };
    t.base_policy();
    let flags = EndpointFlags {
        enforce_egress: true,
        redirect_dns: true,
        check_source: true,
        ..Default::default()
    };
    let (ep4, ep6) = (v4([10, 0, 0, 7]), v6("fd00::7"));
    t.dp.set_endpoint_addresses(LO, EP, &[ep4, ep6]).unwrap();
    t.dp.set_endpoint(LO, EP, flags).unwrap();
    let resolver = v4([10, 99, 0, 53]);
    let neighbour = v4([10, 0, 0, 8]);
    // DNS with the neighbour's source: spoofed (not "no proxy": it never reaches the redirect)
    assert_eq!(
        t.out(&frame(neighbour, resolver, UDP, &udp(5353, 53, 0))),
        SHOT
    );
    assert_eq!(
        t.out(&frame(
            neighbour,
            v4([198, 51, 100, 10]),
            TCP,
            &tcp(40000, 443, SYN)
        )),
        SHOT
    );
    assert_eq!(
        t.out(&frame(
            v6("fd00::8"),
            v6("2001:db8:2::10"),
            TCP,
            &tcp(40000, 443, SYN)
        )),
        SHOT
    );
    assert_eq!(
        t.drops(),
        [
            (sys::DROP_SPOOFED, UDP, 5353, 53),
            (sys::DROP_SPOOFED, TCP, 40000, 443),
            (sys::DROP_SPOOFED, TCP, 40000, 443)
        ]
    );
    // its own source: DNS meets the redirect (no proxy here: dropped as such), TCP the policy
    assert_eq!(t.out(&frame(ep4, resolver, UDP, &udp(5353, 53, 0))), SHOT);
    assert_eq!(t.drops(), [(sys::DROP_NO_PROXY, UDP, 5353, 53)]);
    assert_eq!(
        t.out(&frame(
            ep4,
            v4([198, 51, 100, 10]),
            TCP,
            &tcp(40000, 443, SYN)
        )),
        OK
    );
    assert_eq!(
        t.out(&frame(
            ep6,
            v6("2001:db8:2::10"),
            TCP,
            &tcp(40000, 443, SYN)
        )),
        OK
    );
    // not enforcing: still validated
    t.dp.set_endpoint(
        LO,
        EP,
        EndpointFlags {
            enforce_egress: false,
            ..flags
        },
    )
    .unwrap();
    assert_eq!(
        t.out(&frame(neighbour, v4([203, 0, 113, 1]), UDP, &udp(1, 2, 0))),
        SHOT
    );
    assert_eq!(t.drops()[0].0, sys::DROP_SPOOFED);
    // the addresses change: the v4 one goes
    t.dp.set_endpoint_addresses(LO, EP, &[ep6]).unwrap();
    assert_eq!(t.dp.endpoint_addresses().unwrap(), vec![(LO, EP, ep6)]);
    assert_eq!(
        t.out(&frame(ep4, v4([203, 0, 113, 1]), UDP, &udp(1, 2, 0))),
        SHOT
    );
    // removing the endpoint removes its addresses; its packets pass untouched
    t.dp.remove_endpoint(LO).unwrap();
    assert!(t.dp.endpoint_addresses().unwrap().is_empty());
    assert_eq!(
        t.out(&frame(neighbour, v4([203, 0, 113, 1]), UDP, &udp(1, 2, 0))),
        OK
    );
}

/// Wide port ranges enforce exactly: first, last, one past each end.
#[test]
fn port_ranges_enforce_exactly() {
    let Some(mut t) = T::new("ranges") else {
        return;
    };
    t.dp.set_endpoint(LO, EP, ENFORCE).unwrap();
    t.dp.apply(&[
        ipc("192.0.2.0/24", L3_ID),
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: key(L3_ID, Protocol::Tcp, 1024, 65535),
        },
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: key(L3_ID, Protocol::Udp, 1, 65535),
        },
    ])
    .unwrap();
    let (ep, dst) = (v4([10, 0, 0, 7]), v4([192, 0, 2, 10]));
    let mut sport = 10_000;
    let mut verdict = |t: &mut T, proto: u8, dport: u16| {
        sport += 1;
        let l4 = if proto == TCP {
            tcp(sport, dport, SYN)
        } else {
            udp(sport, dport, 0)
        };
        t.out(&frame(ep, dst, proto, &l4))
    };
    for (dport, want) in [
        (1023, SHOT),
        (1024, OK),
        (1025, OK),
        (32768, OK),
        (65534, OK),
        (65535, OK),
    ] {
        assert_eq!(verdict(&mut t, TCP, dport), want, "tcp {dport}");
    }
    for (dport, want) in [(0, SHOT), (1, OK), (2, OK), (65535, OK)] {
        assert_eq!(verdict(&mut t, UDP, dport), want, "udp {dport}");
    }
    // UDP 1-65535 does not allow TCP below 1024
    assert_eq!(verdict(&mut t, TCP, 80), SHOT);

    // random ranges: each one alone, its ends and one past them
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for _ in 0..40 {
        let a = (next() % 65535 + 1) as u16;
        let b = (next() % 65535 + 1) as u16;
        let (lo, hi) = (a.min(b), a.max(b));
        let k = key(L3_ID + 5, Protocol::Tcp, lo, hi);
        t.dp.apply(&[
            ipc("192.0.2.0/24", L3_ID + 5),
            DatapathChange::PolicyUpsert {
                endpoint: EP,
                key: k,
            },
        ])
        .unwrap();
        for (port, want) in [
            (lo, OK),
            (hi, OK),
            (lo.wrapping_sub(1), SHOT),
            (hi.wrapping_add(1), SHOT),
        ] {
            // (one past 65535 wraps to 0, one before 1 is 0: outside every range)
            let want = if (lo..=hi).contains(&port) { OK } else { want };
            assert_eq!(
                verdict(&mut t, TCP, port),
                want,
                "range {lo}-{hi}, port {port}"
            );
        }
        t.dp.apply(&[DatapathChange::PolicyDelete {
            endpoint: EP,
            key: k,
        }])
        .unwrap();
    }
    t.drops();
}

/// A batch the kernel refuses part-way is undone: ipcache identities replaced or deleted
/// come back, new prefixes and policy entries go, reference counts are as before.
#[test]
fn a_refused_batch_is_undone() {
    let sizes = MapSizes {
        policy: 8,
        ipcache: 4,
        ..MapSizes::default()
    };
    let Some(mut t) = T::with_sizes("undo", &sizes) else {
        return;
    };
    let dump = |t: &T| {
        let mut ipc = t.dp.ipcache_entries().unwrap();
        ipc.sort();
        (ipc, t.dp.policy_entries().unwrap())
    };
    let x = key(L3_ID, Protocol::Tcp, 443, 443);
    t.dp.apply(&[
        ipc("10.0.0.1/32", 100),
        ipc("10.0.0.2/32", 200),
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: x,
        },
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: x,
        },
    ])
    .unwrap();
    let before = dump(&t);
    assert_eq!((before.0.len(), before.1.len()), (2, 1));

    // the policy map fills up at the last change (1-65535 UDP: 16 entries)
    let batch = [
        ipc("10.0.0.1/32", 300),
        DatapathChange::IpcacheDelete {
            prefix: "10.0.0.2/32".parse().unwrap(),
        },
        ipc("10.0.0.3/32", 400),
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: x,
        },
        DatapathChange::PolicyDelete {
            endpoint: EP,
            key: x,
        },
        DatapathChange::PolicyDelete {
            endpoint: EP,
            key: x,
        },
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: key(L3_ID, Protocol::Udp, 1, 65535),
        },
    ];
    match t.dp.apply(&batch) {
        Err(DatapathError::MapFull { map }) => assert_eq!(map, "fqdnd_policy"),
        other => panic!("{other:?}"),
    }
    assert_eq!(dump(&t), before);
    // the counts too: x was written twice, so one delete keeps it and the second removes it
    let del = DatapathChange::PolicyDelete {
        endpoint: EP,
        key: x,
    };
    t.dp.apply(std::slice::from_ref(&del)).unwrap();
    assert_eq!(t.dp.policy_entries().unwrap().len(), 1);
    t.dp.apply(&[del]).unwrap();
    assert!(t.dp.policy_entries().unwrap().is_empty());

    // the ipcache fills up (4 IPv4 prefixes) after policy entries were written
    let batch = [
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: x,
        },
        ipc("10.0.1.1/32", 1),
        ipc("10.0.1.2/32", 1),
        ipc("10.0.1.3/32", 1),
    ];
    match t.dp.apply(&batch) {
        Err(DatapathError::MapFull { map }) => assert_eq!(map, "fqdnd_ipc4"),
        other => panic!("{other:?}"),
    }
    let (ipc_now, policy_now) = dump(&t);
    assert_eq!(ipc_now, before.0);
    assert!(policy_now.is_empty());

    // during a resync: a refused batch leaves what it confirmed unconfirmed
    t.dp.begin_resync().unwrap();
    assert!(
        t.dp.apply(&[
            ipc("10.0.0.1/32", 100),
            ipc("10.0.2.1/32", 1),
            ipc("10.0.2.2/32", 1),
            ipc("10.0.2.3/32", 1)
        ])
        .is_err()
    );
    t.dp.apply(&[ipc("10.0.0.2/32", 200)]).unwrap();
    let stats = t.dp.finish_resync().unwrap();
    assert_eq!((stats.kept, stats.added, stats.removed), (1, 0, 1));
    let mut ipc_now = t.dp.ipcache_entries().unwrap();
    ipc_now.sort();
    assert_eq!(
        ipc_now,
        vec![("10.0.0.2/32".parse().unwrap(), Identity(200))]
    );
}

/// The cost of ipcache upserts through the undo log, one change per batch as a DNS answer
/// brings them (run with `--ignored --nocapture`; use a release build): a new prefix is one
/// `BPF_NOEXIST` write; an existing one a failed write and a lookup (plus the write when its
/// identity changes).
#[test]
#[ignore = "measurement"]
fn ipcache_upsert_cost() {
    let Some(mut t) = T::new("upcost") else {
        return;
    };
    let n = 20_000u32;
    let prefix =
        |i: u32| ipnet::IpNet::new(IpAddr::V4(Ipv4Addr::from(0x0a80_0000 + i)), 32).unwrap();
    let time = |t: &mut T, id: u32| {
        let start = std::time::Instant::now();
        for i in 0..n {
            t.dp.apply(&[DatapathChange::IpcacheUpsert {
                prefix: prefix(i),
                identity: Identity(id),
            }])
            .unwrap();
        }
        start.elapsed() / n
    };
    let new = time(&mut t, 1000);
    let same = time(&mut t, 1000);
    let changed = time(&mut t, 1001);
    // the bare kernel write, for comparison: an LPM insert of other prefixes
    let mut trie: aya::maps::LpmTrie<aya::maps::MapData, [u8; 4], sys::IpcacheValue> =
        aya::maps::Map::from_map_data(
            aya::maps::MapData::from_pin(t.dir.0.join("fqdnd_ipc4")).unwrap(),
        )
        .unwrap()
        .try_into()
        .unwrap();
    let start = std::time::Instant::now();
    for i in 0..n {
        let key = aya::maps::lpm_trie::Key::new(32, (0x0b80_0000 + i).to_be_bytes());
        trie.insert(&key, sys::IpcacheValue { identity: 7 }, 0)
            .unwrap();
    }
    let bare = start.elapsed() / n;
    eprintln!(
        "ipcache upsert, one per batch (mean over {n}): new prefix {new:?}, existing with the \
         same identity {same:?}, existing with another identity {changed:?}; a bare LPM \
         insert {bare:?}"
    );
}
