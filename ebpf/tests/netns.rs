//! Real-traffic tests: a network namespace plays the endpoint behind a veth pair whose host
//! side carries the programs; a transparent "proxy" (UDP socket + TCP listener) runs in the
//! test's own namespace. The client side runs on a thread that `setns`-es into the namespace.
//!
//! Root only (skip otherwise, fail with `FQDND_REQUIRE_PRIVILEGED=1`). They install the
//! local-delivery routes for their duration (and remove them only if they added them).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    reason = "tests; polling the ring buffer for asynchronous drops sleeps"
)]

mod common;

use std::io::{IoSliceMut, Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpStream, UdpSocket,
};
use std::os::fd::AsRawFd;
use std::time::Duration;

use aya::programs::{SchedClassifier, TcAttachType};
use common::{BpfStats, Netns, PinDir, Routes, ip, privileged};
use fqdnd_ebpf::sys::{self, DropEvent};
use fqdnd_ebpf::{
    EndpointFlags, Events, FROM_ENDPOINT, KernelDatapath, Loaded, MapSizes, TO_ENDPOINT,
    attached_interfaces, links_dir,
};
use fqdnd_ipcache::policy::Protocol;
use fqdnd_ipcache::{Datapath, DatapathChange, EndpointId, Identity};
use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg, setsockopt, sockopt,
};
use socket2::{Domain, Socket, Type};

const EP: EndpointId = EndpointId(3);
const REDIRECT: EndpointFlags = EndpointFlags {
    enforce_egress: true,
    redirect_dns: true,
    check_source: false,
    enforce_ingress: false,
};
const RESOLVER_V4: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 53);
const RESOLVER_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 0x53);

/// A transparent DNS proxy stand-in: a UDP socket reporting original destinations and a TCP
/// listener, both on `addr` (same port).
struct Proxy {
    udp: Socket,
    tcp: Socket,
    addr: SocketAddr,
}

impl Proxy {
    fn new(ip: IpAddr) -> Self {
        let domain = if ip.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        for _ in 0..20 {
            let tcp = Socket::new(domain, Type::STREAM, None).unwrap();
            let udp = Socket::new(domain, Type::DGRAM, None).unwrap();
            for s in [&tcp, &udp] {
                if ip.is_ipv4() {
                    s.set_ip_transparent_v4(true).unwrap();
                } else {
                    s.set_only_v6(true).unwrap();
                    s.set_ip_transparent_v6(true).unwrap();
                }
                s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            }
            if ip.is_ipv4() {
                setsockopt(&udp, sockopt::Ipv4OrigDstAddr, &true).unwrap();
            } else {
                setsockopt(&udp, sockopt::Ipv6OrigDstAddr, &true).unwrap();
            }
            tcp.bind(&SocketAddr::new(ip, 0).into()).unwrap();
            tcp.listen(16).unwrap();
            let addr = tcp.local_addr().unwrap().as_socket().unwrap();
            if udp.bind(&addr.into()).is_ok() {
                return Proxy { udp, tcp, addr };
            }
        }
        panic!("no port free for both UDP and TCP");
    }

    /// One datagram: (payload, original destination, sender), or None on timeout.
    fn recv_udp(&self, timeout: Duration) -> Option<(Vec<u8>, SocketAddr, SocketAddr)> {
        self.udp.set_read_timeout(Some(timeout)).unwrap();
        let mut buf = [0u8; 512];
        let mut iov = [IoSliceMut::new(&mut buf)];
        let mut cmsg = nix::cmsg_space!(libc::sockaddr_in6);
        let msg = match recvmsg::<SockaddrStorage>(
            self.udp.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::empty(),
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EAGAIN) => return None,
            Err(e) => panic!("recvmsg: {e}"),
        };
        let from = msg.address.unwrap();
        let from = from
            .as_sockaddr_in()
            .map(|a| SocketAddr::from(SocketAddrV4::from(*a)))
            .or_else(|| {
                from.as_sockaddr_in6()
                    .map(|a| SocketAddrV6::from(*a).into())
            })
            .unwrap();
        let mut orig = None;
        for c in msg.cmsgs().unwrap() {
            match c {
                ControlMessageOwned::Ipv4OrigDstAddr(a) => {
                    orig = Some(SocketAddr::from(SocketAddrV4::new(
                        Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                        u16::from_be(a.sin_port),
                    )));
                }
                ControlMessageOwned::Ipv6OrigDstAddr(a) => {
                    orig = Some(SocketAddr::from(SocketAddrV6::new(
                        Ipv6Addr::from(a.sin6_addr.s6_addr),
                        u16::from_be(a.sin6_port),
                        0,
                        0,
                    )));
                }
                _ => {}
            }
        }
        let n = msg.bytes;
        Some((
            buf[..n].to_vec(),
            orig.expect("original destination cmsg"),
            from,
        ))
    }

    /// Accepts one connection, reads "ping", answers "pong"; (local address, peer).
    fn accept_echo(&self) -> (SocketAddr, SocketAddr) {
        let (conn, peer) = self
            .tcp
            .accept()
            .expect("accept (timeout: nothing arrived)");
        conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut conn: TcpStream = conn.into();
        let mut b = [0u8; 4];
        conn.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        conn.write_all(b"pong").unwrap();
        (conn.local_addr().unwrap(), peer.as_socket().unwrap())
    }
}

/// From inside the namespace: one UDP datagram to `dst`, then a TCP connection that sends
/// "ping" and returns what comes back (or the error).
fn client(
    ns: &Netns,
    dst: SocketAddr,
    tcp_timeout: Duration,
) -> std::thread::JoinHandle<Result<Vec<u8>, String>> {
    ns.spawn(move || {
        let any: SocketAddr = if dst.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        let u = UdpSocket::bind(any).unwrap();
        u.send_to(b"query", dst).unwrap();
        let mut t = TcpStream::connect_timeout(&dst, tcp_timeout).map_err(|e| e.to_string())?;
        t.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        t.write_all(b"ping").map_err(|e| e.to_string())?;
        let mut b = vec![0u8; 4];
        t.read_exact(&mut b).map_err(|e| e.to_string())?;
        Ok(b)
    })
}

/// One UDP datagram from inside the namespace.
fn send_udp(ns: &Netns, dst: SocketAddr) {
    ns.run(move || {
        let any: SocketAddr = if dst.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        UdpSocket::bind(any).unwrap().send_to(b"x", dst).unwrap();
    });
}

/// The DNS query and connection from the namespace reach `proxy` with their original
/// destination `dst`, and the TCP connection carries bytes both ways.
fn assert_redirected(ns: &Netns, proxy: &Proxy, dst: SocketAddr, client_ip: IpAddr) {
    let c = client(ns, dst, Duration::from_secs(3));
    let (data, orig, from) = proxy
        .recv_udp(Duration::from_secs(3))
        .unwrap_or_else(|| panic!("no UDP query reached the proxy at {}", proxy.addr));
    assert_eq!(
        (data.as_slice(), orig, from.ip()),
        (&b"query"[..], dst, client_ip)
    );
    let (local, peer) = proxy.accept_echo();
    assert_eq!((local, peer.ip()), (dst, client_ip));
    assert_eq!(c.join().unwrap().expect("TCP exchange"), b"pong");
}

/// Waits up to a second for the ring buffer to hold an event matching `pred`; returns all
/// events read.
fn wait_event(events: &mut Events, pred: impl Fn(&DropEvent) -> bool) -> Vec<DropEvent> {
    let mut all = Vec::new();
    for _ in 0..100 {
        all.extend(events.drain());
        if all.iter().any(&pred) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    all
}

struct Setup {
    dir: PinDir,
    loaded: Option<Loaded>,
    dp: KernelDatapath,
    events: Events,
    ns: Netns,
    _routes: Routes,
}

fn setup(test: &str, n: u8) -> Option<Setup> {
    if !privileged(test) {
        return None;
    }
    let dir = PinDir::new(test);
    let ns = Netns::new(n);
    let mut loaded = Loaded::load(&dir.0).expect("load");
    loaded.attach(&ns.host).expect("attach");
    let mut dp = KernelDatapath::open(&dir.0).unwrap();
    dp.set_endpoint(ns.ifindex(), EP, REDIRECT).unwrap();
    let events = Events::open(&dir.0).unwrap();
    Some(Setup {
        dir,
        loaded: Some(loaded),
        dp,
        events,
        ns,
        _routes: Routes::new(),
    })
}

/// IPv4: redirect to a wildcard and to a 127.0.0.1-bound proxy, non-DNS policy in the same
/// topology, and no proxy socket → nothing arrives, DROP_NO_PROXY events.
#[test]
fn dns_redirect_v4_in_netns() {
    let Some(mut s) = setup("redir4", 1) else {
        return;
    };
    let client_ip = IpAddr::V4(s.ns.client_v4());
    let dst = SocketAddr::from((RESOLVER_V4, 53));

    for bind in [Ipv4Addr::UNSPECIFIED, Ipv4Addr::LOCALHOST] {
        let proxy = Proxy::new(bind.into());
        let SocketAddr::V4(a) = proxy.addr else {
            unreachable!()
        };
        s.dp.set_dns_proxy(Some(a), None).unwrap();
        assert_redirected(&s.ns, &proxy, dst, client_ip);
    }
    assert!(s.events.drain().is_empty());
    assert!(
        s.dp.ct_entries().unwrap().is_empty(),
        "redirected DNS makes no conntrack entry"
    );

    // non-DNS traffic follows the policy: UDP 9998 allowed, 9999 denied
    s.dp.apply(&[DatapathChange::PolicyUpsert {
        endpoint: EP,
        key: fqdnd_ipcache::PolicyKey {
            identity: Identity(sys::ID_ANY),
            protocol: Protocol::Udp,
            port: 9998,
            end_port: 9998,
            ..Default::default()
        },
    }])
    .unwrap();
    let other = Ipv4Addr::new(10, 99, 0, 80);
    send_udp(&s.ns, (other, 9998).into());
    send_udp(&s.ns, (other, 9999).into());
    let ev: Vec<_> = wait_event(&mut s.events, |e| e.dport == 9999)
        .into_iter()
        .filter(|e| e.dport >= 9998)
        .collect();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(
        (ev[0].reason, ev[0].identity, ev[0].endpoint),
        (sys::DROP_POLICY, sys::ID_WORLD_IPV4, EP.0)
    );
    assert_eq!(
        s.dp.live_destinations().unwrap(),
        [IpAddr::V4(other)].into_iter().collect()
    );

    // a proxy socket exists, but the map points elsewhere: nothing reaches it, DNS drops
    let proxy = Proxy::new(Ipv4Addr::UNSPECIFIED.into());
    s.dp.set_dns_proxy(Some("127.0.0.1:1".parse().unwrap()), None)
        .unwrap();
    let c = client(&s.ns, dst, Duration::from_secs(1));
    assert!(proxy.recv_udp(Duration::from_millis(500)).is_none());
    assert!(c.join().unwrap().is_err(), "TCP must not connect");
    let ev = wait_event(&mut s.events, |e| e.proto == sys::PROTO_TCP);
    assert!(
        ev.iter()
            .all(|e| e.reason == sys::DROP_NO_PROXY && e.dport == 53),
        "{ev:?}"
    );
    assert!(ev.iter().any(|e| e.proto == sys::PROTO_UDP));
    assert!(ev.iter().any(|e| e.proto == sys::PROTO_TCP));
    drop(s.loaded.take());
}

/// IPv6: wildcard ([::]:P, v6only) and ::1-bound proxies.
#[test]
fn dns_redirect_v6_in_netns() {
    let Some(mut s) = setup("redir6", 2) else {
        return;
    };
    let client_ip: IpAddr = format!("fd00:98:{}::2", s.ns.n).parse().unwrap();
    let dst = SocketAddr::from((RESOLVER_V6, 53));
    for bind in [Ipv6Addr::UNSPECIFIED, Ipv6Addr::LOCALHOST] {
        let proxy = Proxy::new(bind.into());
        let SocketAddr::V6(a) = proxy.addr else {
            unreachable!()
        };
        s.dp.set_dns_proxy(None, Some(a)).unwrap();
        assert_redirected(&s.ns, &proxy, dst, client_ip);
    }
    assert!(s.events.drain().is_empty());
    // no v6 proxy configured: dropped
    s.dp.set_dns_proxy(Some("127.0.0.1:1".parse().unwrap()), None)
        .unwrap();
    send_udp(&s.ns, dst);
    let ev = wait_event(&mut s.events, |e| e.reason == sys::DROP_NO_PROXY);
    assert!(
        ev.iter()
            .any(|e| e.family == 6 && e.reason == sys::DROP_NO_PROXY)
    );
}

fn tcx_ids(iface: &str, ty: TcAttachType) -> Vec<u32> {
    SchedClassifier::query_tcx(iface, ty)
        .unwrap()
        .1
        .iter()
        .map(|p| p.id())
        .collect()
}

/// The links are pinned: the programs keep redirecting and enforcing after the loader is
/// dropped; a second load + attach replaces the program in the same links; detach removes
/// them.
#[test]
fn pinned_links_survive_and_are_replaced() {
    let Some(mut s) = setup("links", 3) else {
        return;
    };
    let host = s.ns.host.clone();
    let client_ip = IpAddr::V4(s.ns.client_v4());
    let dst = SocketAddr::from((RESOLVER_V4, 53));
    let proxy = Proxy::new(Ipv4Addr::UNSPECIFIED.into());
    let SocketAddr::V4(a) = proxy.addr else {
        unreachable!()
    };
    s.dp.set_dns_proxy(Some(a), None).unwrap();
    assert_eq!(attached_interfaces(&s.dir.0), vec![host.clone()]);
    for d in ["ingress", "egress"] {
        assert!(links_dir(&s.dir.0).join(format!("{host}-{d}")).exists());
    }
    let mut first = s.loaded.take().unwrap();
    let first_ids = (
        first
            .classifier(FROM_ENDPOINT)
            .unwrap()
            .info()
            .unwrap()
            .id(),
        first.classifier(TO_ENDPOINT).unwrap().info().unwrap().id(),
    );
    assert_eq!(tcx_ids(&host, TcAttachType::Ingress), vec![first_ids.0]);
    assert_eq!(tcx_ids(&host, TcAttachType::Egress), vec![first_ids.1]);

    // "daemon stopped": still attached, still redirecting and enforcing
    drop(first);
    assert_eq!(tcx_ids(&host, TcAttachType::Ingress), vec![first_ids.0]);
    assert_redirected(&s.ns, &proxy, dst, client_ip);
    send_udp(&s.ns, (Ipv4Addr::new(10, 99, 0, 80), 9999).into());
    let ev = wait_event(&mut s.events, |e| e.dport == 9999);
    assert!(ev.iter().any(|e| e.reason == sys::DROP_POLICY), "{ev:?}");

    // "daemon restarted": the new programs replace the old ones in the same links
    let mut second = Loaded::load(&s.dir.0).unwrap();
    second.attach(&host).expect("attach over pinned links");
    let second_ids = (
        second
            .classifier(FROM_ENDPOINT)
            .unwrap()
            .info()
            .unwrap()
            .id(),
        second.classifier(TO_ENDPOINT).unwrap().info().unwrap().id(),
    );
    assert_ne!(second_ids, first_ids);
    assert_eq!(tcx_ids(&host, TcAttachType::Ingress), vec![second_ids.0]);
    assert_eq!(tcx_ids(&host, TcAttachType::Egress), vec![second_ids.1]);
    assert_redirected(&s.ns, &proxy, dst, client_ip);
    // attaching again is a replace too
    second.attach(&host).unwrap();
    assert_eq!(tcx_ids(&host, TcAttachType::Ingress), vec![second_ids.0]);

    // detach: pins gone, programs off the interface (link release is asynchronous)
    second.detach(&host).unwrap();
    assert!(attached_interfaces(&s.dir.0).is_empty());
    let mut gone = false;
    for _ in 0..100 {
        if tcx_ids(&host, TcAttachType::Ingress).is_empty()
            && tcx_ids(&host, TcAttachType::Egress).is_empty()
        {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(gone, "programs still attached after detach");
    second.detach(&host).unwrap();
}

/// One UDP datagram from inside the namespace, from source port `sport`.
fn send_udp_from(ns: &Netns, sport: u16, dst: SocketAddr) {
    ns.run(move || {
        UdpSocket::bind(("0.0.0.0", sport))
            .unwrap()
            .send_to(b"x", dst)
            .unwrap();
    });
}

/// The conntrack entry of the UDP flow from `sport` to `dport`, waiting up to a second for
/// one seen after `after_ns`.
fn wait_ct(
    dp: &KernelDatapath,
    sport: u16,
    dport: u16,
    after_ns: u64,
) -> Option<fqdnd_ebpf::CtEntry> {
    for _ in 0..100 {
        let hit = dp
            .ct_entries()
            .unwrap()
            .into_iter()
            .find(|e| e.sport == sport && e.dport == dport && e.proto == sys::PROTO_UDP);
        if let Some(e) = hit.filter(|e| e.last_seen_ns > after_ns) {
            return Some(e);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Maps migrated under programs attached to a veth through pinned links: `load_with`
/// replaces the programs in the links itself (a later `attach` is a no-op replace), the
/// flow established before the migration keeps passing on its migrated conntrack entry
/// through the daemon's resync, a flow the (migrated) policy does not allow is dropped, the
/// established flow too once its rule is gone, and the old conntrack map is released.
#[test]
fn migration_keeps_enforcing_on_veth() {
    let Some(mut s) = setup("migrate", 5) else {
        return;
    };
    let host = s.ns.host.clone();
    let dst = SocketAddr::from((Ipv4Addr::new(10, 99, 0, 80), 9998));
    s.dp.apply(&[DatapathChange::PolicyUpsert {
        endpoint: EP,
        key: fqdnd_ipcache::PolicyKey {
            identity: Identity(sys::ID_ANY),
            protocol: Protocol::Udp,
            port: 9998,
            end_port: 9998,
            ..Default::default()
        },
    }])
    .unwrap();
    send_udp_from(&s.ns, 40123, dst);
    let first = wait_ct(&s.dp, 40123, 9998, 0).expect("conntrack entry of the allowed flow");
    let old_ct = aya::maps::MapData::from_pin(s.dir.0.join("fqdnd_ct"))
        .unwrap()
        .info()
        .unwrap()
        .id();
    let old_prog = tcx_ids(&host, TcAttachType::Ingress);
    drop(s.loaded.take());

    let sizes = MapSizes {
        conntrack: 300_000,
        ..MapSizes::default()
    };
    let (mut loaded, migrations) = Loaded::load_with(&s.dir.0, &sizes).unwrap();
    assert_eq!(migrations.len(), 1, "{migrations:?}");
    assert_eq!(
        (migrations[0].map.as_str(), migrations[0].to_max),
        ("fqdnd_ct", 300_000)
    );
    assert!(migrations[0].entries_after >= 1);
    let new_ids = (
        loaded
            .classifier(FROM_ENDPOINT)
            .unwrap()
            .info()
            .unwrap()
            .id(),
        loaded.classifier(TO_ENDPOINT).unwrap().info().unwrap().id(),
    );
    assert_ne!(vec![new_ids.0], old_prog);
    assert_eq!(tcx_ids(&host, TcAttachType::Ingress), vec![new_ids.0]);
    assert_eq!(tcx_ids(&host, TcAttachType::Egress), vec![new_ids.1]);
    // what the daemon does next: attach every interface (a replace, same program)
    loaded.attach(&host).unwrap();
    assert_eq!(tcx_ids(&host, TcAttachType::Ingress), vec![new_ids.0]);

    // the maps of the new programs: the daemon's restart resyncs the same rule
    s.dp = KernelDatapath::open(&s.dir.0).unwrap();
    let migrated = wait_ct(&s.dp, 40123, 9998, 0).expect("migrated conntrack entry");
    assert_eq!(migrated, first);
    let rule = DatapathChange::PolicyUpsert {
        endpoint: EP,
        key: fqdnd_ipcache::PolicyKey {
            identity: Identity(sys::ID_ANY),
            protocol: Protocol::Udp,
            port: 9998,
            end_port: 9998,
            ..Default::default()
        },
    };
    s.dp.begin_resync().unwrap();
    s.dp.apply(std::slice::from_ref(&rule)).unwrap();
    let stats = s.dp.finish_resync().unwrap();
    assert_eq!((stats.kept, stats.removed), (1, 0), "{stats:?}");
    // the established flow passes (its entry in the new map is refreshed, no drop event)
    send_udp_from(&s.ns, 40123, dst);
    let refreshed = wait_ct(&s.dp, 40123, 9998, first.last_seen_ns)
        .expect("established flow not seen by the new program");
    // a flow the policy does not allow is denied
    let denied = SocketAddr::from((Ipv4Addr::new(10, 99, 0, 80), 9999));
    send_udp_from(&s.ns, 40124, denied);
    let ev = wait_event(&mut s.events, |e| e.sport == 40124);
    assert!(
        ev.iter()
            .any(|e| e.sport == 40124 && e.reason == sys::DROP_POLICY),
        "{ev:?}"
    );
    assert!(ev.iter().all(|e| e.sport != 40123), "{ev:?}");
    // the rule goes: the established flow's next packet is dropped, its entry not refreshed
    let DatapathChange::PolicyUpsert { endpoint, key } = rule else {
        unreachable!()
    };
    s.dp.apply(&[DatapathChange::PolicyDelete { endpoint, key }])
        .unwrap();
    send_udp_from(&s.ns, 40123, dst);
    let ev = wait_event(&mut s.events, |e| e.sport == 40123);
    assert!(
        ev.iter()
            .any(|e| e.sport == 40123 && e.reason == sys::DROP_POLICY),
        "{ev:?}"
    );
    assert_eq!(
        wait_ct(&s.dp, 40123, 9998, 0).map(|e| e.last_seen_ns),
        Some(refreshed.last_seen_ns)
    );
    // nothing holds the old conntrack map any more
    let mut released = false;
    for _ in 0..200 {
        if aya::maps::MapInfo::from_id(old_ct).is_err() {
            released = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(released, "old conntrack map still referenced");
    loaded.detach(&host).unwrap();
}

/// A link pinned for an interface that was deleted and re-created (same name, new ifindex)
/// is stale (ENOLINK on update): attach replaces the pin with a new link.
#[test]
fn stale_link_pin_is_replaced() {
    if !privileged("stale") {
        return;
    }
    let dir = PinDir::new("stale");
    let host = format!("fqs{}", std::process::id() % 100_000);
    struct Veth(String);
    impl Drop for Veth {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["link", "del", &self.0])
                .output();
        }
    }
    let mk = |name: &str| {
        ip(&[
            "link",
            "add",
            name,
            "type",
            "veth",
            "peer",
            "name",
            &format!("{name}p"),
        ]);
        Veth(name.to_owned())
    };
    let v = mk(&host);
    let mut loaded = Loaded::load(&dir.0).unwrap();
    loaded.attach(&host).unwrap();
    drop(v);
    let _v = mk(&host);
    assert!(tcx_ids(&host, TcAttachType::Ingress).is_empty());
    loaded.attach(&host).expect("attach over a stale pin");
    let id = loaded
        .classifier(FROM_ENDPOINT)
        .unwrap()
        .info()
        .unwrap()
        .id();
    assert_eq!(tcx_ids(&host, TcAttachType::Ingress), vec![id]);
    assert_eq!(attached_interfaces(&dir.0), vec![host.clone()]);
}

/// Mean run time of `fqdnd_from_ep` per packet on real traffic (kernel BPF stats), for the
/// redirect path (UDP and TCP) and, for comparison, a conntrack hit. Prints the figures; run
/// with `--ignored --nocapture` (it flips the global `kernel.bpf_stats_enabled` meanwhile).
#[test]
#[ignore = "measurement; flips kernel.bpf_stats_enabled"]
fn redirect_cost_in_netns() {
    let Some(mut s) = setup("cost", 4) else {
        return;
    };
    let _stats = BpfStats::enable();
    let proxy = Proxy::new(Ipv4Addr::UNSPECIFIED.into());
    let SocketAddr::V4(a) = proxy.addr else {
        unreachable!()
    };
    s.dp.set_dns_proxy(Some(a), None).unwrap();
    s.dp.apply(&[DatapathChange::PolicyUpsert {
        endpoint: EP,
        key: fqdnd_ipcache::PolicyKey {
            identity: Identity(sys::ID_ANY),
            protocol: Protocol::Udp,
            port: 9998,
            end_port: 9998,
            ..Default::default()
        },
    }])
    .unwrap();
    let loaded = s.loaded.as_mut().unwrap();
    let mut stats = || {
        let i = loaded.classifier(FROM_ENDPOINT).unwrap().info().unwrap();
        (i.run_time(), i.run_count())
    };
    let n = 3000;
    let mut phase = |name: &str, f: &dyn Fn()| {
        let (t0, c0) = stats();
        f();
        let (t1, c1) = stats();
        let per = (t1 - t0) / u32::try_from((c1 - c0).max(1)).unwrap();
        eprintln!("{name}: {} packets, mean {per:?} per packet", c1 - c0);
    };
    let dst = SocketAddr::from((RESOLVER_V4, 53));
    phase("UDP DNS redirect (listener lookup + sk_assign)", &|| {
        s.ns.run(move || {
            let u = UdpSocket::bind("0.0.0.0:0").unwrap();
            for _ in 0..n {
                u.send_to(b"query", dst).unwrap();
            }
        });
    });
    let other = SocketAddr::from((Ipv4Addr::new(10, 99, 0, 80), 9998));
    phase("UDP allowed, conntrack hit", &|| {
        s.ns.run(move || {
            let u = UdpSocket::bind("0.0.0.0:0").unwrap();
            for _ in 0..n {
                u.send_to(b"x", other).unwrap();
            }
        });
    });
    phase("TCP DNS redirect (connect, ping/pong, close)", &|| {
        for _ in 0..100 {
            let c = client(&s.ns, dst, Duration::from_secs(3));
            while proxy.recv_udp(Duration::from_millis(1)).is_some() {}
            proxy.accept_echo();
            c.join().unwrap().unwrap();
        }
    });
}

/// A fragmented DNS query: its first fragment is assigned to the proxy; its later fragments
/// do not follow it to the original destination (past the proxy) — they are dropped as
/// fragments of no allowed datagram. The later fragments of an allowed datagram pass.
#[test]
fn fragmented_dns_query_never_bypasses_the_proxy() {
    let Some(mut s) = setup("fragdns", 9) else {
        return;
    };
    let proxy = Proxy::new(Ipv4Addr::UNSPECIFIED.into());
    s.dp.set_dns_proxy(
        Some(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, proxy.addr.port())),
        None,
    )
    .unwrap();
    s.dp.apply(&[DatapathChange::PolicyUpsert {
        endpoint: EP,
        key: fqdnd_ipcache::PolicyKey {
            identity: Identity(sys::ID_ANY),
            protocol: Protocol::Udp,
            port: 9998,
            end_port: 9998,
            ..Default::default()
        },
    }])
    .unwrap();
    let big = |sport: u16, dst: SocketAddr| {
        s.ns.run(move || {
            let u = UdpSocket::bind(("0.0.0.0", sport)).unwrap();
            u.send_to(&[7u8; 3000], dst).unwrap();
        });
    };
    let resolver = SocketAddr::from((RESOLVER_V4, 53));
    big(40998, resolver);
    let ev = wait_event(&mut s.events, |e| e.reason == sys::DROP_FRAGMENT);
    let frags: Vec<_> = ev
        .iter()
        .filter(|e| e.reason == sys::DROP_FRAGMENT)
        .collect();
    assert!(!frags.is_empty(), "{ev:?}");
    assert!(
        frags
            .iter()
            .all(|e| e.daddr[..4] == RESOLVER_V4.octets() && e.proto == sys::PROTO_UDP),
        "{ev:?}"
    );
    // nothing whole reached the proxy (its first fragment waits for the rest in vain)
    assert!(proxy.recv_udp(Duration::from_millis(300)).is_none());
    // an allowed datagram of the same size: its first fragment passed (its flow is in
    // conntrack) and none of its fragments is dropped
    big(
        40999,
        SocketAddr::from((Ipv4Addr::new(10, 99, 0, 80), 9998)),
    );
    assert!(wait_ct(&s.dp, 40999, 9998, 0).is_some());
    let ev = wait_event(&mut s.events, |e| e.reason == sys::DROP_FRAGMENT);
    assert!(ev.is_empty(), "{ev:?}");
}
