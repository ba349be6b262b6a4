//! The cgroup socket programs on real sockets. The programs are attached at the root of the
//! cgroup v2 hierarchy; this test process joins a cgroup it creates (a process joins a
//! cgroup as a whole), which is the endpoint, and its sockets live in a network namespace
//! behind a veth pair (10.98.<n>.2 inside, 10.98.<n>.1 in the test's namespace): nothing
//! reaches a real network. A stand-in proxy (UDP sockets and TCP listeners on 127.0.0.1 and
//! ::1 in that namespace) is created before the process joins the cgroup, so it is no
//! endpoint's. Every resource (namespace, cgroup, pins) goes on drop, the process leaving the
//! cgroup first.
//!
//! Root only (skip otherwise, fail with `FQDND_REQUIRE_PRIVILEGED=1`). The tests of this
//! binary share the process's cgroup: they run one at a time.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_methods,
    reason = "tests; waiting for asynchronous drop events sleeps"
)]

mod common;

use std::io::{Read, Write};
use std::net::{
    Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpListener, TcpStream, UdpSocket,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{BpfStats, Netns, PinDir, privileged};
use fqdnd_ebpf::cgroup::cgroup_id;
use fqdnd_ebpf::sys::{self, DropEvent};
use fqdnd_ebpf::{DnsOrigin, DnsOrigins, EndpointFlags, Events, KernelDatapath, Loaded};
use fqdnd_ipcache::policy::{Direction, Protocol};
use fqdnd_ipcache::{Datapath, DatapathChange, EndpointId, Identity};
use socket2::{Domain, Socket, Type};

const EP: EndpointId = EndpointId(7);
const REDIRECT: EndpointFlags = EndpointFlags {
    enforce_egress: false,
    redirect_dns: true,
    check_source: false,
    enforce_ingress: false,
};
const ENFORCE: EndpointFlags = EndpointFlags {
    enforce_egress: true,
    redirect_dns: true,
    check_source: false,
    enforce_ingress: false,
};
const ENFORCE_INGRESS: EndpointFlags = EndpointFlags {
    enforce_egress: false,
    redirect_dns: true,
    check_source: false,
    enforce_ingress: true,
};
const WAIT: Duration = Duration::from_secs(3);

/// One test at a time: the process's cgroup is shared.
static SERIAL: Mutex<()> = Mutex::new(());

/// A cgroup v2 directory under the hierarchy's root, removed on drop (after this process left
/// it: [`Joined`]).
struct TestCgroup(PathBuf);

impl TestCgroup {
    fn new(parent: &Path, name: &str) -> Self {
        let path = parent.join(name);
        let _ = std::fs::remove_dir(&path);
        std::fs::create_dir(&path).expect("create the test cgroup");
        TestCgroup(path)
    }

    fn id(&self) -> u64 {
        cgroup_id(&self.0).unwrap()
    }

    /// Moves this whole process into the cgroup until the guard drops.
    fn join(&self) -> Joined {
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let back = fqdnd_ebpf::cgroup::v2_path_of(&text).unwrap();
        let root = fqdnd_ebpf::cgroup::v2_root().unwrap();
        let back = root.join(back.trim_start_matches('/'));
        std::fs::write(self.0.join("cgroup.procs"), std::process::id().to_string()).unwrap();
        Joined(back)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // children first (the nested cgroup)
        if let Ok(dir) = std::fs::read_dir(&self.0) {
            for e in dir.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// This process back in the cgroup it came from, on drop.
struct Joined(PathBuf);

impl Drop for Joined {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.procs"), std::process::id().to_string());
    }
}

/// The stand-in proxy: UDP sockets and TCP listeners on 127.0.0.1:P4 and [::1]:P6, in the
/// namespace.
struct Proxy {
    udp4: UdpSocket,
    tcp4: TcpListener,
    udp6: UdpSocket,
    tcp6: TcpListener,
}

impl Proxy {
    fn new(ns: &Netns) -> Arc<Self> {
        Arc::new(ns.run(|| {
            let udp4 = UdpSocket::bind("127.0.0.1:0").unwrap();
            let tcp4 = TcpListener::bind(udp4.local_addr().unwrap()).unwrap();
            let udp6 = UdpSocket::bind("[::1]:0").unwrap();
            let tcp6 = TcpListener::bind(udp6.local_addr().unwrap()).unwrap();
            for u in [&udp4, &udp6] {
                u.set_read_timeout(Some(WAIT)).unwrap();
            }
            Proxy {
                udp4,
                tcp4,
                udp6,
                tcp6,
            }
        }))
    }

    fn port4(&self) -> u16 {
        self.udp4.local_addr().unwrap().port()
    }

    fn port6(&self) -> u16 {
        self.udp6.local_addr().unwrap().port()
    }

    /// Receives one datagram (v4 or v6 socket) and answers it; returns the sender.
    fn answer(&self, v6: bool) -> SocketAddr {
        let s = if v6 { &self.udp6 } else { &self.udp4 };
        let mut buf = [0u8; 64];
        let (_, from) = s.recv_from(&mut buf).expect("the proxy got the query");
        s.send_to(b"answer", from).unwrap();
        from
    }
}

/// What each test needs: pins, the programs attached, the maps, a namespace, the proxy, the
/// cgroup (an endpoint with `flags`).
struct Setup {
    // drop order: the cgroup (left by then), the namespace, the programs, the pins, the lock
    cgroup: TestCgroup,
    ns: Netns,
    proxy: Arc<Proxy>,
    loaded: Loaded,
    dp: KernelDatapath,
    origins: Arc<DnsOrigins>,
    dir: PinDir,
    _guard: std::sync::MutexGuard<'static, ()>,
}

fn setup(test: &str, n: u8, flags: EndpointFlags) -> Option<Setup> {
    if !privileged(test) {
        return None;
    }
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = PinDir::new(test);
    let mut loaded = Loaded::load(&dir.0).expect("load");
    let mut dp = KernelDatapath::open(&dir.0).unwrap();
    let origins = Arc::new(DnsOrigins::open(&dir.0).unwrap());
    let ns = Netns::new(n);
    let proxy = Proxy::new(&ns);
    let cookie = ns.run(|| sys::netns_cookie().unwrap());
    dp.set_dns_proxy(
        Some(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, proxy.port4())),
        Some(SocketAddrV6::new(
            Ipv6Addr::UNSPECIFIED,
            proxy.port6(),
            0,
            0,
        )),
    )
    .unwrap();
    dp.set_sock_settings(cookie, 1).unwrap();
    let root = fqdnd_ebpf::cgroup::v2_root().unwrap();
    let cgroup = TestCgroup::new(&root, &format!("fqdnd-test-{}-{test}", std::process::id()));
    dp.set_cgroup_endpoint(cgroup.id(), EP, flags).unwrap();
    loaded
        .attach_cgroup(&root)
        .expect("attach at the cgroup v2 root");
    assert!(fqdnd_ebpf::cgroup_attached(&dir.0));
    Some(Setup {
        cgroup,
        ns,
        proxy,
        loaded,
        dp,
        origins,
        dir,
        _guard: guard,
    })
}

fn resolver4(n: u8) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::new(10, 98, n, 53), 53))
}

fn resolver6(n: u8) -> SocketAddr {
    format!("[fd00:98:{n}::53]:53").parse().unwrap()
}

/// A connected UDP socket's query, as a stub resolver sends it: `connect`, `send`, `recv_from`.
/// Returns (what `getpeername` said, the reply's source, the proxy's view of the client).
fn connected_udp(
    s: &Setup,
    bind: &'static str,
    to: SocketAddr,
    v6_proxy: bool,
) -> (SocketAddr, SocketAddr, SocketAddr) {
    let proxy = Arc::clone(&s.proxy);
    s.ns.run(move || {
        let c = UdpSocket::bind(bind).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c.connect(to).unwrap();
        let peer = c.peer_addr().unwrap();
        c.send(b"query").unwrap();
        let client = proxy.answer(v6_proxy);
        let mut buf = [0u8; 16];
        let (_, from) = c.recv_from(&mut buf).expect("the answer");
        (peer, from, client)
    })
}

#[test]
fn dns_is_redirected_to_the_proxy_and_the_resolver_shown_back() {
    let Some(mut s) = setup("redirect", 41, REDIRECT) else {
        return;
    };
    let n = 41;
    let joined = s.cgroup.join();
    let origin = |server| {
        Some(DnsOrigin {
            server,
            endpoint: EP,
        })
    };

    // UDP, connected: getpeername and the answer's source are the resolver's; the proxy
    // finds where the query was going under the client's address and port.
    for (bind, to, v6) in [
        ("0.0.0.0:0", resolver4(n), false),
        ("[::]:0", resolver6(n), true),
    ] {
        let (peer, from, client) = connected_udp(&s, bind, to, v6);
        assert_eq!((peer, from), (to, to), "v6={v6}");
        assert!(client.ip().is_loopback(), "{client}");
        assert_eq!(s.origins.lookup(client, false), origin(to), "v6={v6}");
    }

    // UDP, unconnected (sendto): the answer's source is the resolver asked.
    let proxy = Arc::clone(&s.proxy);
    let other = SocketAddr::from((Ipv4Addr::new(10, 98, n, 54), 53));
    let (from, client) = s.ns.run(move || {
        let u = UdpSocket::bind("0.0.0.0:0").unwrap();
        u.set_read_timeout(Some(WAIT)).unwrap();
        u.send_to(b"query", other).unwrap();
        let client = proxy.answer(false);
        let mut buf = [0u8; 16];
        let (_, from) = u.recv_from(&mut buf).expect("the answer");
        (from, client)
    });
    assert_eq!(from, other);
    assert_eq!(s.origins.lookup(client, false), origin(other));

    // An IPv6 socket asking a v4-mapped resolver: the IPv4 proxy, the mapped address back.
    let proxy = Arc::clone(&s.proxy);
    let mapped: SocketAddr = format!("[::ffff:10.98.{n}.53]:53").parse().unwrap();
    let (peer, from, client) = s.ns.run(move || {
        let sock = Socket::new(Domain::IPV6, Type::DGRAM, None).unwrap();
        sock.set_only_v6(false).unwrap();
        sock.bind(&"[::]:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        let c: UdpSocket = sock.into();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c.connect(mapped).unwrap();
        let peer = c.peer_addr().unwrap();
        c.send(b"query").unwrap();
        let client = proxy.answer(false);
        let mut buf = [0u8; 16];
        let (_, from) = c.recv_from(&mut buf).unwrap();
        (peer, from, client)
    });
    assert_eq!((peer, from), (mapped, mapped));
    assert_eq!(s.origins.lookup(client, false), origin(resolver4(n)));

    // The same socket unconnected (`sendto` a v4-mapped resolver, as Java's DatagramSocket
    // and Netty's resolver do): the kernel sends it as IPv4 (sendmsg4 redirects it), and the
    // answer still shows the resolver, v4-mapped, not the proxy.
    let proxy = Arc::clone(&s.proxy);
    let (from, client) = s.ns.run(move || {
        let sock = Socket::new(Domain::IPV6, Type::DGRAM, None).unwrap();
        sock.set_only_v6(false).unwrap();
        sock.bind(&"[::]:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        let u: UdpSocket = sock.into();
        u.set_read_timeout(Some(WAIT)).unwrap();
        u.send_to(b"query", mapped).unwrap();
        let client = proxy.answer(false);
        let mut buf = [0u8; 16];
        let (_, from) = u.recv_from(&mut buf).unwrap();
        (from, client)
    });
    assert_eq!(
        from, mapped,
        "the answer's source, for an unconnected dual-stack socket"
    );
    assert_eq!(s.origins.lookup(client, false), origin(resolver4(n)));

    // TCP: the connection goes to the proxy, getpeername says the resolver.
    for (to, v6) in [(resolver4(n), false), (resolver6(n), true)] {
        let proxy = Arc::clone(&s.proxy);
        let (peer, client) = s.ns.run(move || {
            let c = TcpStream::connect_timeout(&to, WAIT).expect("connected to the proxy");
            let listener = if v6 { &proxy.tcp6 } else { &proxy.tcp4 };
            let (_, client) = listener.accept().unwrap();
            (c.peer_addr().unwrap(), client)
        });
        assert_eq!(peer, to, "v6={v6}");
        assert_eq!(s.origins.lookup(client, true), origin(to), "v6={v6}");
    }

    // A socket of another network namespace (this thread's, not the proxy's): left alone.
    let c = UdpSocket::bind("0.0.0.0:0").unwrap();
    c.connect(resolver4(n)).unwrap();
    assert_eq!(c.peer_addr().unwrap(), resolver4(n));

    // No proxy for a family: the call is refused (DNS fails closed).
    s.dp.set_dns_proxy(None, None).unwrap();
    let refused = s.ns.run(move || {
        let c = UdpSocket::bind("0.0.0.0:0").unwrap();
        c.connect(resolver4(n)).unwrap_err()
    });
    assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied);
    s.dp.set_dns_proxy(
        Some(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, s.proxy.port4())),
        Some(SocketAddrV6::new(
            Ipv6Addr::UNSPECIFIED,
            s.proxy.port6(),
            0,
            0,
        )),
    )
    .unwrap();

    // Another port than 53: left alone.
    let not_dns = SocketAddr::from((Ipv4Addr::new(10, 98, n, 53), 54));
    let peer = s.ns.run(move || {
        let c = UdpSocket::bind("0.0.0.0:0").unwrap();
        c.connect(not_dns).unwrap();
        c.peer_addr().unwrap()
    });
    assert_eq!(peer, not_dns);

    // A cgroup created below the endpoint's after the programs were attached: covered.
    let nested = TestCgroup::new(&s.cgroup.0, "nested");
    let in_nested = nested.join();
    let (peer, from, client) = connected_udp(&s, "0.0.0.0:0", resolver4(n), false);
    assert_eq!((peer, from), (resolver4(n), resolver4(n)));
    assert_eq!(s.origins.lookup(client, false), origin(resolver4(n)));
    drop(in_nested);
    drop(joined);
    // back in the cgroup the process came from (no endpoint's): the same call leaves the
    // destination alone.
    let (peer, local) = s.ns.run(move || {
        let c = UdpSocket::bind("0.0.0.0:0").unwrap();
        c.connect(resolver4(n)).unwrap();
        (c.peer_addr().unwrap(), c.local_addr().unwrap())
    });
    assert_eq!(peer, resolver4(n));
    assert_eq!(s.origins.lookup(local, false), None);
    drop(nested);

    // In the cgroup again, with the settings saying there is no cgroup endpoint (the programs
    // stay attached once the last one goes): left alone.
    let cookie = s.ns.run(|| sys::netns_cookie().unwrap());
    s.dp.set_sock_settings(cookie, 0).unwrap();
    let _joined = s.cgroup.join();
    let peer = s.ns.run(move || {
        let c = UdpSocket::bind("0.0.0.0:0").unwrap();
        c.connect(resolver4(n)).unwrap();
        c.peer_addr().unwrap()
    });
    assert_eq!(peer, resolver4(n));
}

/// An echo server at 10.98.`n`.1 (the test's side of the veth), created in the cgroup this
/// process is in now; its address.
fn outside_server(n: u8) -> SocketAddr {
    let server = TcpListener::bind((Ipv4Addr::new(10, 98, n, 1), 0)).unwrap();
    let at = server.local_addr().unwrap();
    serve_echo(server);
    at
}

/// A TCP connection to `to` within `timeout`, and the echo of 4 bytes sent on it.
fn ping(to: SocketAddr, timeout: Duration) -> std::io::Result<[u8; 4]> {
    let mut c = TcpStream::connect_timeout(&to, timeout)?;
    c.set_read_timeout(Some(WAIT))?;
    c.write_all(b"ping")?;
    let mut buf = [0u8; 4];
    c.read_exact(&mut buf)?;
    Ok(buf)
}

/// Gives `peer` identity `id` in the ipcache and writes the endpoint's policy entry for
/// (`id`, `protocol`, `port`) in `direction`: an allow, or a deny.
fn open_to(
    dp: &mut KernelDatapath,
    peer: std::net::IpAddr,
    id: Identity,
    direction: Direction,
    protocol: Protocol,
    port: u16,
    deny: bool,
) {
    dp.apply(&[
        DatapathChange::IpcacheUpsert {
            prefix: ipnet::IpNet::new(peer, 32).unwrap(),
            identity: id,
        },
        DatapathChange::PolicyUpsert {
            endpoint: EP,
            key: fqdnd_ipcache::PolicyKey {
                identity: id,
                protocol,
                port,
                end_port: port,
                direction,
                deny,
            },
        },
    ])
    .unwrap();
}

/// Waits for the drop event of a TCP packet to `port`, and checks it names the endpoint, at a
/// socket, for its policy.
fn expect_socket_drop(events: &mut Events, port: u16) {
    let e = await_event(events, |e| e.dport == port).expect("a drop event");
    assert_eq!(
        (e.endpoint, e.source, e.reason, e.proto),
        (EP.0, sys::SOURCE_SOCKET, sys::DROP_POLICY, sys::PROTO_TCP)
    );
}

/// Answers each connection to `listener` with the 4 bytes it sent, on a thread of its own.
fn serve_echo(listener: TcpListener) {
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { continue };
            let mut buf = [0u8; 4];
            if c.read_exact(&mut buf).is_ok() {
                let _ = c.write_all(&buf);
            }
        }
    });
}

/// The drop events of the ring buffer, until `want` is among them (or `WAIT` passes).
fn await_event(events: &mut Events, want: impl Fn(&DropEvent) -> bool) -> Option<DropEvent> {
    for _ in 0..30 {
        if let Some(e) = events.drain().into_iter().find(|e| want(e)) {
            return Some(e);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

#[test]
fn egress_of_an_enforcing_cgroup_follows_policy_and_dns_never_bypasses_the_proxy() {
    let Some(mut s) = setup("enforce", 42, ENFORCE) else {
        return;
    };
    let n = 42;
    let mut events = Events::open(s.dir.0.as_path()).unwrap();
    // A server in the test's namespace, and one in the endpoint's (inbound flows).
    let target = outside_server(n);
    // A socket connected to the resolver before the cgroup was an endpoint (no entry now).
    s.dp.remove_cgroup_endpoint(s.cgroup.id()).unwrap();
    let joined = s.cgroup.join();
    let early = s.ns.run(move || {
        let c = UdpSocket::bind("0.0.0.0:0").unwrap();
        c.connect(resolver4(n)).unwrap();
        c
    });
    s.dp.set_cgroup_endpoint(s.cgroup.id(), EP, ENFORCE)
        .unwrap();
    let reach = |ns: &Netns, timeout: Duration| ns.run(move || ping(target, timeout));

    // No policy: the connect is refused at once (EPERM, not a SYN dropped and retried until
    // the caller gives up), with an event naming the endpoint and the destination's identity;
    // from a dual-stack socket to the v4-mapped address too.
    let refused = reach(&s.ns, WAIT).unwrap_err();
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::PermissionDenied,
        "{refused}"
    );
    expect_socket_drop(&mut events, target.port());
    let mapped_target = SocketAddr::new(
        match target.ip() {
            std::net::IpAddr::V4(a) => a.to_ipv6_mapped().into(),
            v6 => v6,
        },
        target.port(),
    );
    let dual_stack = move |to: SocketAddr| {
        let sock = Socket::new(Domain::IPV6, Type::STREAM, None)?;
        sock.set_only_v6(false)?;
        sock.connect_timeout(&to.into(), WAIT)
    };
    let refused = s.ns.run(move || dual_stack(mapped_target)).unwrap_err();
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::PermissionDenied,
        "{refused}"
    );
    let e = await_event(&mut events, |e| e.dport == target.port()).expect("a drop event");
    assert_eq!((e.family, e.identity), (4, sys::ID_WORLD_IPV4), "{e:?}");
    // Loopback is not egress: a connect to the stand-in proxy's TCP listener goes through.
    let local = s.proxy.tcp4.local_addr().unwrap();
    s.ns.run(move || TcpStream::connect_timeout(&local, WAIT))
        .expect("loopback is not refused");
    // UDP is not refused at connect: its datagrams are, at send.
    let udp = s.ns.run(move || {
        let u = UdpSocket::bind("0.0.0.0:0").unwrap();
        u.connect(target).unwrap();
        u.send(b"ping").unwrap_err()
    });
    assert_eq!(udp.kind(), std::io::ErrorKind::PermissionDenied, "{udp}");

    // The destination gets an identity the endpoint may reach on that port: it passes, and
    // the flow is tracked in the socket zone.
    let id = Identity(1 << 24 | 5);
    open_to(
        &mut s.dp,
        target.ip(),
        id,
        Direction::Egress,
        Protocol::Tcp,
        target.port(),
        false,
    );
    assert_eq!(&reach(&s.ns, WAIT).expect("allowed"), b"ping");
    s.ns.run(move || dual_stack(mapped_target))
        .expect("allowed, from a dual-stack socket");
    let ct = s.dp.ct_entries().unwrap();
    assert!(
        ct.iter().any(|c| c.dst == target.ip()
            && c.dport == target.port()
            && c.zone == sys::CT_ZONE_SOCKET
            && c.flags & sys::CT_EGRESS != 0),
        "{ct:?}"
    );

    // Inbound: a connection to a listener of the endpoint is answered (its replies are a
    // flow opened towards it). The listener is the endpoint's (created in its cgroup), the
    // client no endpoint's (created once this process left the cgroup): a socket stays in
    // the cgroup it was created in.
    let listener =
        s.ns.run(move || TcpListener::bind((Ipv4Addr::new(10, 98, n, 2), 0)).unwrap());
    drop(joined);
    let inbound = listener.local_addr().unwrap();
    let accepting = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).unwrap();
        c.write_all(&buf).unwrap();
    });
    let mut c = TcpStream::connect_timeout(&inbound, WAIT).expect("inbound connection");
    c.set_read_timeout(Some(WAIT)).unwrap();
    c.write_all(b"pong").unwrap();
    let mut buf = [0u8; 4];
    c.read_exact(&mut buf).expect("the endpoint's reply passes");
    assert_eq!(&buf, b"pong");
    accepting.join().unwrap();

    // DNS the redirect did not see (the early socket): dropped, never past the proxy.
    let sent = early.send(b"query").unwrap_err();
    assert_eq!(sent.kind(), std::io::ErrorKind::PermissionDenied);
    let e = await_event(&mut events, |e| e.reason == sys::DROP_DNS_BYPASS).expect("an event");
    assert_eq!(
        (e.endpoint, e.source, e.dport),
        (EP.0, sys::SOURCE_SOCKET, 53)
    );

    // The programs go with their pins.
    fqdnd_ebpf::detach_cgroup_pinned(&s.dir.0).unwrap();
    assert!(!fqdnd_ebpf::cgroup_attached(&s.dir.0));
}

#[test]
fn ingress_of_a_cgroup_under_ingress_policy_follows_its_ingress_entries() {
    let Some(mut s) = setup("ingress", 44, ENFORCE_INGRESS) else {
        return;
    };
    let n = 44;
    let mut events = Events::open(s.dir.0.as_path()).unwrap();
    // A server in the test's namespace, for the endpoint's own flows (created before this
    // process joins the cgroup: no endpoint's socket).
    let server_at = outside_server(n);
    // Two listeners of the endpoint (created in its cgroup), in its namespace.
    let joined = s.cgroup.join();
    let (allowed, other) = s.ns.run(move || {
        let l = |_| TcpListener::bind((Ipv4Addr::new(10, 98, n, 2), 0)).unwrap();
        (l(0), l(1))
    });
    let (allowed_at, other_at) = (allowed.local_addr().unwrap(), other.local_addr().unwrap());
    serve_echo(allowed);
    serve_echo(other);
    // Under ingress default deny, the endpoint's own flows get their replies, and its DNS
    // goes through the proxy, whose answers come from loopback.
    let out = s.ns.run(move || ping(server_at, WAIT));
    assert_eq!(&out.expect("a reply in the endpoint's own flow"), b"ping");
    let (peer, from, _) = connected_udp(&s, "0.0.0.0:0", resolver4(n), false);
    assert_eq!((peer, from), (resolver4(n), resolver4(n)));
    drop(joined);

    // No ingress entry: a connection from the test's namespace (no endpoint's socket) is
    // dropped at the listener's socket, with an event naming the endpoint.
    assert!(ping(allowed_at, Duration::from_millis(700)).is_err());
    expect_socket_drop(&mut events, allowed_at.port());

    // The source gets an identity the endpoint's ingress allows on one port: that port is
    // reachable (and the flow tracked in the socket zone), the other still is not.
    let id = Identity(1 << 24 | 7);
    open_to(
        &mut s.dp,
        server_at.ip(),
        id,
        Direction::Ingress,
        Protocol::Tcp,
        allowed_at.port(),
        false,
    );
    assert_eq!(&ping(allowed_at, WAIT).expect("allowed inbound"), b"ping");
    let ct = s.dp.ct_entries().unwrap();
    assert!(
        ct.iter().any(|c| c.dst == allowed_at.ip()
            && c.dport == allowed_at.port()
            && c.zone == sys::CT_ZONE_SOCKET
            && c.flags & sys::CT_INGRESS != 0),
        "{ct:?}"
    );
    assert!(ping(other_at, Duration::from_millis(700)).is_err());
    expect_socket_drop(&mut events, other_at.port());

    // A deny of the same peer and port wins over the allow.
    open_to(
        &mut s.dp,
        server_at.ip(),
        id,
        Direction::Ingress,
        Protocol::Tcp,
        allowed_at.port(),
        true,
    );
    assert!(ping(allowed_at, Duration::from_millis(700)).is_err());
}

/// Mean run time of the socket programs (kernel BPF stats) per call: `connect` of a host
/// process in no endpoint's cgroup (what every host process pays once the programs are
/// attached: UDP to port 53, TCP to any port), of an endpoint's process to another port, to
/// port 53 (the redirect) and a TCP connect its policy refuses, and
/// per packet of the egress program (an endpoint's allowed flow, and a process of no
/// endpoint). Prints the figures; run with `--ignored --nocapture` (it flips the global
/// `kernel.bpf_stats_enabled` meanwhile).
#[test]
#[ignore = "measurement; flips kernel.bpf_stats_enabled"]
fn per_connect_cost() {
    let Some(mut s) = setup("cost", 43, ENFORCE) else {
        return;
    };
    let n = 43;
    let _stats = BpfStats::enable();
    let allowed = SocketAddr::from((Ipv4Addr::new(10, 98, n, 1), 9));
    let id = Identity(1 << 24 | 6);
    open_to(
        &mut s.dp,
        allowed.ip(),
        id,
        Direction::Egress,
        Protocol::Udp,
        9,
        false,
    );
    let calls = 20_000;
    let phase = |s: &mut Setup, prog: &str, name: &str, f: &dyn Fn(&Netns)| {
        let stats = |s: &Setup| {
            let i = s.loaded.ebpf.program(prog).unwrap().info().unwrap();
            (i.run_time(), i.run_count())
        };
        let (t0, c0) = stats(s);
        f(&s.ns);
        let (t1, c1) = stats(s);
        let runs = c1 - c0;
        let per = (t1 - t0) / u32::try_from(runs.max(1)).unwrap();
        eprintln!("{prog}, {name}: {runs} runs, mean {per:?}");
    };
    let connects = move |to: SocketAddr| {
        move |ns: &Netns| {
            ns.run(move || {
                let c = UdpSocket::bind("0.0.0.0:0").unwrap();
                for _ in 0..calls {
                    c.connect(to).unwrap();
                }
            });
        }
    };
    let sends = move |ns: &Netns| {
        ns.run(move || {
            let c = UdpSocket::bind("0.0.0.0:0").unwrap();
            c.connect(allowed).unwrap();
            for _ in 0..calls {
                let _ = c.send(b"x");
            }
        });
    };
    // TCP connects (a fresh socket each; refused by the hook, or by the peer's RST: no
    // listener there) to a port the policy does not open.
    let tcp_connects = move |ns: &Netns| {
        ns.run(move || {
            let to = SocketAddr::from((Ipv4Addr::new(10, 98, n, 1), 10));
            for _ in 0..calls {
                let c = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
                let _ = c.connect(&to.into());
            }
        });
    };
    let port54 = SocketAddr::from((Ipv4Addr::new(10, 98, n, 53), 54));
    let cookie = s.ns.run(|| sys::netns_cookie().unwrap());
    s.dp.set_sock_settings(cookie, 0).unwrap();
    phase(
        &mut s,
        "fqdnd_sock_egress",
        "no cgroup endpoint (programs attached), per packet",
        &sends,
    );
    s.dp.set_sock_settings(cookie, 1).unwrap();
    phase(
        &mut s,
        "fqdnd_connect4",
        "a process of no endpoint, port 53",
        &connects(resolver4(n)),
    );
    phase(
        &mut s,
        "fqdnd_sock_egress",
        "a process of no endpoint, per packet",
        &sends,
    );
    phase(
        &mut s,
        "fqdnd_connect4",
        "a process of no endpoint, TCP to another port",
        &tcp_connects,
    );
    let joined = s.cgroup.join();
    phase(
        &mut s,
        "fqdnd_connect4",
        "an endpoint's process, TCP refused by its policy",
        &tcp_connects,
    );
    phase(
        &mut s,
        "fqdnd_connect4",
        "an endpoint's process, port 54",
        &connects(port54),
    );
    phase(
        &mut s,
        "fqdnd_connect4",
        "an endpoint's process, port 53 (redirect)",
        &connects(resolver4(n)),
    );
    phase(
        &mut s,
        "fqdnd_sock_egress",
        "an endpoint's allowed flow, per packet",
        &sends,
    );
    drop(joined);
}
