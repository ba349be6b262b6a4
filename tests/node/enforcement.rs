//! Issue 15 end to end: policy on established flows (a reload cuts them; an expired name's
//! flow lives on as a zombie and is cut when the zombie goes), TCP state in conntrack, ICMP
//! (ping, path MTU discovery, errors from the endpoint), fragments, IPv6 extension headers,
//! source validation, and port ranges up to 1–65535.
//!
//! Each test builds its own [`Topology`] and writes its own configuration; the external
//! servers it needs beyond the topology's are started here, in the external namespace.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::dns;
use crate::topology::{
    Topology, echo, in_netns, privileged, serve_tcp_echo, sh, tcp_open, tcp_reaches, udp_reaches,
};

use crate::{DROPPED, REACHES};

const ZONE: &str = "\
api 300 IN A 10.N.10.1
api 300 IN AAAA fd00:N:10::1
short 2 IN A 10.N.10.2
short 2 IN AAAA fd00:N:10::2
short 2 IN A 10.N.10.3
short 2 IN AAAA fd00:N:10::3
";

pub(crate) fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// The node configuration: endpoint A (id 1) may resolve api and short.example.test and
/// reaches their IPs on `ports` (a `toPorts.ports` list); `a_extra` are more egress rules
/// of A (YAML list items, indented two spaces); endpoint B (id 2) may resolve anything and
/// reach nothing. `node_extra`: more lines of the Node spec (indented two spaces).
fn config(t: &Topology, ports: &str, a_extra: &str, node_extra: &str) -> String {
    let n = t.n;
    format!(
        "apiVersion: fqdnd.io/v1
kind: Node
spec:
  pinDir: {pin}
  upstreamTimeout: 2s
{node_extra}---
apiVersion: fqdnd.io/v1
kind: Settings
spec:
  gcInterval: 1s
---
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {{name: a}}
spec:
  id: 1
  interface: {if_a}
  addresses: [10.{n}.1.2, \"fd00:{n}:1::2\"]
  labels: {{app: a}}
---
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {{name: b}}
spec:
  id: 2
  interface: {if_b}
  addresses: [10.{n}.2.2, \"fd00:{n}:2::2\"]
  labels: {{app: b}}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {{name: a-egress}}
spec:
  endpointSelector: {{matchLabels: {{app: a}}}}
  egress:
  - toCIDR: [10.{n}.9.53/32, \"fd00:{n}:9::53/128\"]
    toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns:
        - matchName: api.example.test
        - matchName: short.example.test
  - toFQDNs:
    - matchName: api.example.test
    - matchName: short.example.test
    toPorts:
    - ports: [{ports}]
{a_extra}---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {{name: b-egress}}
spec:
  endpointSelector: {{matchLabels: {{app: b}}}}
  egress:
  - toCIDR: [10.{n}.9.53/32, \"fd00:{n}:9::53/128\"]
    toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns:
        - matchPattern: \"*\"
",
        pin = t.pin_dir.display(),
        if_a = t.if_a,
        if_b = t.if_b,
    )
}

/// A topology with the zone served and the node started with `config`; `None` when the test
/// is skipped (not root, and not required).
fn start(test: &str, config: impl FnOnce(&Topology) -> String) -> Option<Topology> {
    if !privileged(test) {
        return None;
    }
    let mut t = Topology::new(test);
    let zone = ZONE
        .replace(".N.", &format!(".{}.", t.n))
        .replace(":N:", &format!(":{}:", t.n));
    t.start_dns(&zone);
    let path = t.write_node_config(&config(&t));
    t.start_node(&path);
    Some(t)
}

/// Endpoint A resolves `name` (A and AAAA) through its resolver; panics without an answer.
fn resolve(t: &Topology, name: &str) {
    for (resolver, qtype) in [
        (sa(t.v4(9, 53), 53), RecordType::A),
        (sa(t.v6(9, 53), 53), RecordType::AAAA),
    ] {
        let reply = dns::ask(t, dns::Over::Udp, &t.ep_a, resolver, name, qtype);
        assert_eq!(reply.rcode, ResponseCode::NoError, "{name} {qtype}");
        assert!(!reply.addrs.is_empty(), "{name} {qtype}: no address");
    }
}

/// Polls `f` until it holds; panics naming `what` (the daemons' logs are printed when the
/// topology drops) after `limit`.
fn wait_until(_t: &Topology, limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    crate::common::poll_until(limit, what, || f().then_some(()));
}

/// The node's drop log (`GET /v1/drops?since=0` on the admin socket): one JSON object per
/// drop, oldest first.
pub(crate) fn drops(t: &Topology) -> Vec<serde_json::Value> {
    let mut s = std::os::unix::net::UnixStream::connect(t.admin()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /v1/drops?since=0 HTTP/1.1\r\nHost: fqdnd\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    page["drops"].as_array().cloned().unwrap_or_default()
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Waits until the drop log holds a drop with `reason` whose fields contain each of
/// `fields` (name, text); returns it.
pub(crate) fn wait_drop(t: &Topology, reason: &str, fields: &[(&str, &str)]) -> serde_json::Value {
    let mut found = None;
    wait_until(
        t,
        Duration::from_secs(10),
        &format!("a {reason} drop with {fields:?}"),
        || {
            found = drops(t).into_iter().find(|d| {
                d["reason"] == reason
                    && fields.iter().all(|(k, v)| {
                        let value = &d[*k];
                        value
                            .as_str()
                            .map_or(value.to_string(), str::to_owned)
                            .contains(v)
                    })
            });
            found.is_some()
        },
    );
    found.unwrap()
}

/// `fqdnd bpf <what> list` of the node's pins.
fn bpf(t: &Topology, what: &str) -> String {
    t.cli(&[
        "bpf",
        what,
        "list",
        "--pin-dir",
        t.pin_dir.to_str().unwrap(),
    ])
}

/// `GET /metrics` from the host namespace.
fn metrics(t: &Topology, port: u16) -> String {
    in_netns(&t.host, move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    })
}

/// A UDP echo server for datagrams of any size on `addr` in namespace `ns` (replies leave
/// from the address asked).
fn serve_udp_echo(ns: &str, addr: SocketAddr) {
    in_netns(ns, move || {
        let socket = UdpSocket::bind(addr).unwrap();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                let _ = socket.send_to(&buf[..n], from);
            }
        });
    });
}

/// From `ns`: one datagram of `len` bytes to `to`; whether the same bytes come back from it.
fn udp_roundtrip(ns: &str, to: SocketAddr, len: usize, timeout: Duration) -> bool {
    in_netns(ns, move || {
        let bind: SocketAddr = if to.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        let socket = UdpSocket::bind(bind).unwrap();
        socket.set_read_timeout(Some(timeout)).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        socket.send_to(&data, to).unwrap();
        let mut buf = vec![0u8; 65536];
        matches!(socket.recv_from(&mut buf), Ok((n, from)) if from == to && buf[..n] == data[..])
    })
}

/// From `ns`: `bytes` written to a TCP connection to an echo server at `to` and read back
/// (writer and reader at once); whether all of it came back within `limit`.
fn transfer(ns: &str, to: SocketAddr, bytes: usize, limit: Duration) -> bool {
    in_netns(ns, move || {
        let Ok(stream) = TcpStream::connect_timeout(&to, REACHES) else {
            return false;
        };
        stream.set_read_timeout(Some(limit)).unwrap();
        let mut writer = stream.try_clone().unwrap();
        let data: Vec<u8> = (0..bytes).map(|i| (i % 253) as u8).collect();
        let sent = data.clone();
        let w = std::thread::spawn(move || writer.write_all(&sent).is_ok());
        let mut got = vec![0u8; bytes];
        let mut reader = stream;
        let ok = reader.read_exact(&mut got).is_ok() && got == data;
        let _ = reader.shutdown(std::net::Shutdown::Both);
        w.join().unwrap_or(false) && ok
    })
}

/// The Internet checksum of `data`.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A raw ICMP/ICMPv6 socket as a `UdpSocket` (its send/receive calls work on any datagram
/// socket).
fn icmp_socket(v6: bool) -> UdpSocket {
    let (domain, proto) = if v6 {
        (socket2::Domain::IPV6, socket2::Protocol::ICMPV6)
    } else {
        (socket2::Domain::IPV4, socket2::Protocol::ICMPV4)
    };
    socket2::Socket::new(domain, socket2::Type::RAW, Some(proto))
        .unwrap()
        .into()
}

/// From `ns`: an ICMP/ICMPv6 echo request to `to`; whether its reply arrives in `timeout`.
pub(crate) fn ping(ns: &str, to: IpAddr, timeout: Duration) -> bool {
    in_netns(ns, move || {
        let socket = icmp_socket(to.is_ipv6());
        let id: u16 = 0x4000 | (std::process::id() as u16 & 0x3fff);
        let (req, rep) = if to.is_ipv6() { (128u8, 129u8) } else { (8, 0) };
        let mut msg = vec![req, 0, 0, 0];
        msg.extend(id.to_be_bytes());
        msg.extend([0, 1]);
        msg.extend(b"fqdnd ping");
        if to.is_ipv4() {
            // (the kernel fills in ICMPv6 checksums itself)
            let c = checksum(&msg);
            msg[2..4].copy_from_slice(&c.to_be_bytes());
        }
        socket.send_to(&msg, sa(to, 0)).unwrap();
        socket.set_read_timeout(Some(timeout)).unwrap();
        let mut buf = [0u8; 2048];
        // Other ICMP may arrive first: a bounded number of datagrams, each within `timeout`.
        for _ in 0..64 {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                return false;
            };
            // IPv4 raw sockets get the IP header too
            let icmp = if to.is_ipv4() {
                &buf[usize::from(buf[0] & 0x0f) * 4..n]
            } else {
                &buf[..n]
            };
            if from.ip() == to
                && icmp.len() >= 8
                && icmp[0] == rep
                && icmp[4..6] == id.to_be_bytes()
            {
                return true;
            }
        }
        false
    })
}

/// From `ns`: a UDP datagram from `src`:`sport` to `dst`:`dport` behind an IPv6
/// destination-options header (PadN), sent on a raw socket; whether the echo server's reply
/// comes back to a socket bound to that source.
fn udp_with_dstopts(ns: &str, src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> bool {
    in_netns(ns, move || {
        let (IpAddr::V6(s6), IpAddr::V6(d6)) = (src, dst) else {
            panic!("IPv6 only")
        };
        let receiver = UdpSocket::bind(sa(src, sport)).unwrap();
        receiver
            .set_read_timeout(Some(DROPPED.max(Duration::from_secs(2))))
            .unwrap();
        let payload = b"behind destination options";
        let udp_len = (8 + payload.len()) as u16;
        let mut udp = Vec::new();
        udp.extend(sport.to_be_bytes());
        udp.extend(dport.to_be_bytes());
        udp.extend(udp_len.to_be_bytes());
        udp.extend([0, 0]);
        udp.extend(payload);
        let mut pseudo = Vec::new();
        pseudo.extend(s6.octets());
        pseudo.extend(d6.octets());
        pseudo.extend(u32::from(udp_len).to_be_bytes());
        pseudo.extend([0, 0, 0, 17]);
        pseudo.extend(&udp);
        let c = match checksum(&pseudo) {
            0 => 0xffff,
            c => c,
        };
        udp[6..8].copy_from_slice(&c.to_be_bytes());
        // destination options: next header UDP, length 0 (8 bytes), PadN of 4 bytes
        let dstopts = [17u8, 0, 1, 4, 0, 0, 0, 0];
        let mut packet = vec![0x60, 0, 0, 0];
        packet.extend(((dstopts.len() + udp.len()) as u16).to_be_bytes());
        packet.extend([60, 64]);
        packet.extend(s6.octets());
        packet.extend(d6.octets());
        packet.extend(dstopts);
        packet.extend(&udp);
        let raw: UdpSocket = socket2::Socket::new(
            socket2::Domain::IPV6,
            socket2::Type::RAW,
            Some(socket2::Protocol::from(255)),
        )
        .unwrap()
        .into();
        raw.send_to(&packet, sa(dst, 0)).unwrap();
        let mut buf = [0u8; 256];
        matches!(receiver.recv_from(&mut buf), Ok((n, from)) if from == sa(dst, dport) && &buf[..n] == payload)
    })
}

/// Issue 15: a reload that removes the rule cuts the long-lived flows it allowed at once,
/// IPv4 and IPv6; what the reload keeps keeps working.
#[test]
fn a_reload_that_removes_a_rule_cuts_established_flows() {
    const PORTS: &str = "{port: \"8080\", protocol: TCP}, {port: \"8053\", protocol: UDP}";
    let Some(t) = start("cut", |t| config(t, PORTS, "", "")) else {
        return;
    };
    resolve(&t, "api.example.test.");
    let mut streams: Vec<TcpStream> = [t.v4(10, 1), t.v6(10, 1)]
        .into_iter()
        .map(|ip| tcp_open(&t.ep_a, sa(ip, 8080)).unwrap_or_else(|| panic!("{}", t.logs())))
        .collect();
    for s in &mut streams {
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        assert!(echo(s, b"before"), "{}", t.logs());
    }
    t.write_node_config(&config(&t, "{port: \"8053\", protocol: UDP}", "", ""));
    let out = t.cli(&[
        "policy",
        "reload",
        "--admin-socket",
        t.admin().to_str().unwrap(),
    ]);
    assert!(out.contains("reloaded") || out.contains("ok"), "{out}");
    // the next packet of each flow is dropped: nothing comes back within a second
    for s in &mut streams {
        // `echo` waits for the answer a bounded time: the flow is cut at its next packet.
        assert!(
            !echo(s, b"after"),
            "flow {:?} survived the reload",
            s.peer_addr()
        );
        let port = s.local_addr().unwrap().port().to_string();
        wait_drop(
            &t,
            "policy-denied",
            &[("src", &format!(":{port}")), ("proto", "tcp")],
        );
    }
    // the rule the reload kept still allows
    assert!(udp_reaches(&t.ep_a, sa(t.v4(10, 1), 8053), REACHES));
    assert!(udp_reaches(&t.ep_a, sa(t.v6(10, 1), 8053), REACHES));
}

/// Issue 15: a flow to an IP whose name expired keeps it (a zombie, its identity kept) while
/// conntrack shows the flow alive; when the flow ends — closed (IPv6 here) or idle past its
/// lifetime (IPv4) — the GC releases the zombie and the IP is cut: a new connection, and
/// the idle flow's own next packet, are dropped.
#[test]
fn an_expired_names_flow_lives_as_a_zombie_until_it_ends() {
    const PORTS: &str = "{port: \"8080\", protocol: TCP}";
    let node = "  conntrack: {tcpEstablished: 4s, tcpClosing: 1s}\n";
    let Some(t) = start("zombie", |t| config(t, PORTS, "", node)) else {
        return;
    };
    resolve(&t, "short.example.test.");
    let (kept4, kept6, unused4) = (t.v4(10, 2), t.v6(10, 2), t.v4(10, 3));
    let mut s4 = tcp_open(&t.ep_a, sa(kept4, 8080)).unwrap_or_else(|| panic!("{}", t.logs()));
    let mut s6 = tcp_open(&t.ep_a, sa(kept6, 8080)).unwrap_or_else(|| panic!("{}", t.logs()));
    // TTL 2 s, GC every second: keep both flows busy past the expiry and a few GCs
    for _ in 0..20 {
        for s in [&mut s4, &mut s6] {
            assert!(echo(s, b"busy"), "a live flow broke\n{}", t.logs());
        }
        pace(Duration::from_millis(300));
    }
    // the unused IP was released; the used ones are zombies kept by their flows
    assert!(
        !tcp_reaches(&t.ep_a, sa(unused4, 8080), DROPPED),
        "{}",
        t.logs()
    );
    let cache = t.cli(&[
        "cache",
        "list",
        "--admin-socket",
        t.admin().to_str().unwrap(),
    ]);
    for ip in [kept4, kept6] {
        assert!(
            cache
                .lines()
                .any(|l| l.contains(&ip.to_string()) && l.contains("connection")),
            "{ip} is no zombie:\n{cache}"
        );
    }
    assert!(echo(&mut s4, b"still"), "{}", t.logs());

    // IPv6: the flow closes (FIN both ways: closing, dead a second later); the GC then
    // releases the zombie and a new connection is dropped
    drop(s6);
    let gone6 = format!("{kept6}/128");
    wait_until(
        &t,
        Duration::from_secs(20),
        "the v6 zombie released",
        || !bpf(&t, "ipcache").contains(&gone6),
    );
    assert!(
        !tcp_reaches(&t.ep_a, sa(kept6, 8080), DROPPED),
        "{}",
        t.logs()
    );

    // IPv4: the open flow goes idle past its established lifetime (4 s): conntrack shows it
    // dead, the zombie goes, and the flow's own next packet is dropped
    let gone4 = format!("{kept4}/32");
    wait_until(
        &t,
        Duration::from_secs(30),
        "the v4 zombie released",
        || !bpf(&t, "ipcache").contains(&gone4),
    );
    s4.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    assert!(!echo(&mut s4, b"cut"), "the idle flow survived its zombie");
    let port = s4.local_addr().unwrap().port().to_string();
    let d = wait_drop(&t, "policy-denied", &[("src", &format!(":{port}"))]);
    // its destination is the world now
    assert_eq!(d["identity"], 9, "{d}");
}

/// Issue 15: conntrack keeps TCP state with Cilium's default lifetimes, and FIN or RST cut
/// an entry's lifetime to the closing one (10 s), as `fqdnd bpf ct list` shows.
#[test]
fn fin_and_rst_shorten_conntrack_lifetimes() {
    const PORTS: &str = "{port: \"8080\", protocol: TCP}";
    let Some(t) = start("tcpstate", |t| config(t, PORTS, "", "")) else {
        return;
    };
    resolve(&t, "api.example.test.");
    let api = sa(t.v4(10, 1), 8080);
    // (state, seconds left, flags) of the flow from `local`
    let row = |local: SocketAddr| -> Option<(String, u64, String)> {
        bpf(&t, "ct").lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 7 && f[1] == local.to_string() && f[2] == api.to_string()).then(|| {
                let left = f[4].trim_end_matches('s').parse().unwrap_or(u64::MAX);
                (f[3].to_owned(), left, f[5].to_owned())
            })
        })
    };
    let mut fin = tcp_open(&t.ep_a, api).unwrap_or_else(|| panic!("{}", t.logs()));
    let mut rst = tcp_open(&t.ep_a, api).unwrap_or_else(|| panic!("{}", t.logs()));
    for s in [&mut fin, &mut rst] {
        assert!(echo(s, b"hello"));
    }
    let (fin_local, rst_local) = (fin.local_addr().unwrap(), rst.local_addr().unwrap());
    for local in [fin_local, rst_local] {
        let (state, left, _) = row(local).unwrap_or_else(|| panic!("no entry:\n{}", bpf(&t, "ct")));
        assert_eq!(state, "established");
        // 6 h, less the seconds since the last packet
        assert!((21_500..=21_600).contains(&left), "{left}");
    }
    // FIN (the echo server closes its side in turn)
    drop(fin);
    wait_until(&t, Duration::from_secs(10), "FIN seen both ways", || {
        row(fin_local)
            .is_some_and(|(s, left, flags)| s == "closing" && left <= 10 && flags.contains("fin"))
    });
    // RST: an abortive close
    nix::sys::socket::setsockopt(
        &rst,
        nix::sys::socket::sockopt::Linger,
        &nix::libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    )
    .unwrap();
    drop(rst);
    wait_until(&t, Duration::from_secs(10), "RST seen", || {
        row(rst_local)
            .is_some_and(|(s, left, flags)| s == "closing" && left <= 10 && flags.contains("rst"))
    });
    // a dead entry is gone after the GC (closing lifetime 10 s, GC every second)
    wait_until(
        &t,
        Duration::from_secs(30),
        "closed flows collected",
        || row(fin_local).is_none() && row(rst_local).is_none(),
    );
}

/// Issue 15: ICMP and fragments. Ping to an IP allowed at L3 (a rule without ports) works,
/// to one allowed only on TCP 8080 is dropped; a TCP transfer through a path with a lower
/// MTU completes (the router's frag-needed / packet-too-big reaches the endpoint); UDP
/// datagrams larger than the MTU arrive whole where allowed and are dropped, fragments
/// included, where not; an IPv6 packet with a destination-options header reaches an allowed
/// port and not a denied one; an external host's ping to the endpoint is answered and its
/// UDP to a closed port gets the endpoint's port unreachable.
#[test]
fn icmp_fragments_and_extension_headers() {
    const PORTS: &str = "{port: \"8080\", protocol: TCP}, {port: \"8053\", protocol: UDP}";
    let Some(t) = start("icmp", |t| {
        let n = t.n;
        let l3 = format!("  - toCIDR: [10.{n}.10.3/32, \"fd00:{n}:10::3/128\"]\n");
        config(t, PORTS, &l3, "")
    }) else {
        return;
    };
    let n = t.n;
    resolve(&t, "api.example.test.");
    for ip in [t.v4(10, 1), t.v4(10, 3), t.v6(10, 1), t.v6(10, 3)] {
        serve_udp_echo(&t.ext, sa(ip, 8054));
    }
    for v6 in [false, true] {
        let ip = |host| if v6 { t.v6(10, host) } else { t.v4(10, host) };
        let (l3, l4) = (ip(3), ip(1));
        let icmp = if v6 { "icmpv6" } else { "icmp" };

        // ping
        assert!(
            ping(&t.ep_a, l3, REACHES),
            "v6={v6}: ping to the L3-allowed IP\n{}",
            t.logs()
        );
        assert!(
            !ping(&t.ep_a, l4, DROPPED),
            "v6={v6}: ping to an L4-only IP"
        );
        wait_drop(
            &t,
            "policy-denied",
            &[("proto", icmp), ("dst", &l4.to_string())],
        );

        // datagrams larger than the MTU (fragmented by the endpoint, and by the echo on
        // the way back)
        assert!(
            udp_roundtrip(&t.ep_a, sa(l3, 8054), 4000, REACHES),
            "v6={v6}: a fragmented datagram did not arrive whole\n{}",
            t.logs()
        );
        assert!(!udp_roundtrip(&t.ep_a, sa(l4, 8054), 4000, DROPPED));
        wait_drop(
            &t,
            "policy-denied",
            &[("proto", "udp"), ("dst", &sa(l4, 8054).to_string())],
        );
        wait_drop(&t, "fragment-unknown", &[("dst", &l4.to_string())]);
    }

    // a lower MTU on the path: the host (the router) has a 1280-byte route to the servers
    let host = &t.host;
    sh(&format!(
        "ip -n {host} route replace 10.{n}.10.0/24 via 10.{n}.9.2 mtu 1280 && \
         ip -n {host} -6 route replace fd00:{n}:10::/64 via fd00:{n}:9::2 mtu 1280"
    ));
    for ip in [t.v4(10, 3), t.v6(10, 3)] {
        assert!(
            transfer(&t.ep_a, sa(ip, 8080), 256 * 1024, Duration::from_secs(20)),
            "a transfer to {ip} needing path MTU discovery did not complete\n{}",
            t.logs()
        );
    }

    // IPv6 destination options: walked to the UDP port
    let (ep6, api6) = (t.v6(1, 2), t.v6(10, 1));
    assert!(
        udp_with_dstopts(&t.ep_a, ep6, 40_053, api6, 8053),
        "a destination-options packet to an allowed port\n{}",
        t.logs()
    );
    assert!(!udp_with_dstopts(&t.ep_a, ep6, 40_055, api6, 8055));
    wait_drop(
        &t,
        "policy-denied",
        &[("dst", &sa(api6, 8055).to_string()), ("proto", "udp")],
    );

    // towards the endpoint: an external host's ping is answered, and its datagram to a
    // closed port gets the endpoint's port unreachable (an ICMP error about a tracked flow)
    for (ep, from) in [(t.v4(1, 2), t.v4(9, 2)), (t.v6(1, 2), t.v6(9, 2))] {
        assert!(
            ping(&t.ext, ep, REACHES),
            "ping from outside to {ep}\n{}",
            t.logs()
        );
        let refused = in_netns(&t.ext, move || {
            let socket = UdpSocket::bind(sa(from, 0)).unwrap();
            socket.connect(sa(ep, 9)).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_secs(1)))
                .unwrap();
            (0..5).any(|_| {
                let _ = socket.send(b"anyone?");
                let mut buf = [0u8; 16];
                matches!(socket.recv(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
            })
        });
        assert!(refused, "no port unreachable from {ep}\n{}", t.logs());
    }
}

/// From `ns`: a DNS query for `name` sent from `src` (a socket bound to it) to `server`; the
/// reply's response code, or `None` when nothing comes back within 1.5 s.
fn ask_from(ns: &str, src: IpAddr, server: SocketAddr, name: &str) -> Option<ResponseCode> {
    let name = name.to_owned();
    in_netns(ns, move || {
        let socket = UdpSocket::bind(sa(src, 0)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(1500)))
            .unwrap();
        let qtype = if server.is_ipv4() {
            RecordType::A
        } else {
            RecordType::AAAA
        };
        let mut m = hickory_proto::op::Message::new(
            0x5eed,
            hickory_proto::op::MessageType::Query,
            hickory_proto::op::OpCode::Query,
        );
        m.metadata.recursion_desired = true;
        m.queries.push(hickory_proto::op::Query::query(
            hickory_proto::rr::Name::from_ascii(&name).unwrap(),
            qtype,
        ));
        socket.send_to(&m.to_vec().unwrap(), server).unwrap();
        let mut buf = [0u8; 512];
        let (n, _) = socket.recv_from(&mut buf).ok()?;
        let reply = hickory_proto::op::Message::from_vec(&buf[..n]).ok()?;
        Some(reply.metadata.response_code)
    })
}

/// Issue 15: a DNS query and a TCP SYN from endpoint A with endpoint B's source address are
/// dropped before the proxy (B's rules would let the name through) and reported as
/// `source-spoofed` in the drop log and the metrics.
#[test]
fn spoofed_sources_are_dropped_before_the_proxy() {
    const PORTS: &str = "{port: \"8080\", protocol: TCP}";
    let metrics_port = 19_100 + u16::try_from(std::process::id() % 90).unwrap_or(0) * 10;
    let Some(t) = start("spoof", |t| {
        let port = metrics_port + u16::try_from(t.n % 10).unwrap_or(0);
        config(t, PORTS, "", &format!("  metrics: 127.0.0.1:{port}\n"))
    }) else {
        return;
    };
    let metrics_port = metrics_port + u16::try_from(t.n % 10).unwrap_or(0);
    let n = t.n;
    // endpoint A takes B's addresses too (as a second address on its loopback)
    sh(&format!(
        "ip -n {a} addr add 10.{n}.2.2/32 dev lo && ip -n {a} addr add fd00:{n}:2::2/128 dev lo nodad",
        a = t.ep_a
    ));
    for (own, neighbour, resolver, api) in [
        (t.v4(1, 2), t.v4(2, 2), t.v4(9, 53), t.v4(10, 1)),
        (t.v6(1, 2), t.v6(2, 2), t.v6(9, 53), t.v6(10, 1)),
    ] {
        // a name only B may resolve, asked with B's source: no answer, nothing learned
        let asked = ask_from(&t.ep_a, neighbour, sa(resolver, 53), "short.example.test.");
        assert!(asked.is_none(), "a spoofed query was answered: {asked:?}");
        wait_drop(
            &t,
            "source-spoofed",
            &[
                ("src", &neighbour.to_string()),
                ("dst", &sa(resolver, 53).to_string()),
            ],
        );
        // a TCP SYN with B's source
        let connected = in_netns(&t.ep_a, move || {
            let socket = socket2::Socket::new(
                if neighbour.is_ipv4() {
                    socket2::Domain::IPV4
                } else {
                    socket2::Domain::IPV6
                },
                socket2::Type::STREAM,
                None,
            )
            .unwrap();
            socket.bind(&sa(neighbour, 0).into()).unwrap();
            socket
                .connect_timeout(&sa(api, 8080).into(), DROPPED)
                .is_ok()
        });
        assert!(!connected);
        wait_drop(
            &t,
            "source-spoofed",
            &[
                ("src", &neighbour.to_string()),
                ("dst", &sa(api, 8080).to_string()),
            ],
        );
        // A's own source: answered
        let reply = dns::ask(
            &t,
            dns::Over::Udp,
            &t.ep_a,
            sa(resolver, 53),
            "api.example.test.",
            if own.is_ipv4() {
                RecordType::A
            } else {
                RecordType::AAAA
            },
        );
        assert_eq!(
            reply.rcode,
            ResponseCode::NoError,
            "A's own address is answered"
        );
    }
    let cache = t.cli(&[
        "cache",
        "list",
        "--admin-socket",
        t.admin().to_str().unwrap(),
    ]);
    assert!(
        !cache.contains("short.example.test."),
        "a spoofed query reached the proxy:\n{cache}"
    );
    wait_until(
        &t,
        Duration::from_secs(10),
        "the spoofed drops counted",
        || {
            metrics(&t, metrics_port)
                .lines()
                .find(|l| l.starts_with("fqdnd_policy_drops_total{reason=\"source-spoofed\"}"))
                .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                .is_some_and(|v| v >= 4.0)
        },
    );

    // the addresses follow the configuration: a reload that gives A another address and
    // removes B rewrites them (A's extra address becomes a valid source, B's go)
    let endpoints = bpf(&t, "endpoint");
    for ip in [t.v4(1, 2), t.v6(1, 2), t.v4(2, 2), t.v6(2, 2)] {
        assert!(
            endpoints.contains(&format!("source {ip} ")),
            "{ip}:\n{endpoints}"
        );
    }
    let metrics_line = format!("  metrics: 127.0.0.1:{metrics_port}\n");
    let next = config(&t, PORTS, "", &metrics_line).replace(
        &format!("addresses: [10.{n}.1.2, "),
        &format!("addresses: [10.{n}.1.2, 10.{n}.1.3, "),
    );
    let b = next.find("kind: Endpoint\nmetadata: {name: b}").unwrap();
    let b_end = b + next[b..].find("---\n").unwrap() + 4;
    // the document before B's `kind:` line starts with its apiVersion line
    let b_start = next[..b].rfind("---\n").unwrap() + 4;
    let next = format!("{}{}", &next[..b_start], &next[b_end..]);
    t.write_node_config(&next);
    let out = t.cli(&[
        "policy",
        "reload",
        "--admin-socket",
        t.admin().to_str().unwrap(),
    ]);
    assert!(out.contains("reloaded") || out.contains("ok"), "{out}");
    wait_until(&t, Duration::from_secs(10), "addresses rewritten", || {
        let e = bpf(&t, "endpoint");
        e.contains(&format!("source {} ", t.v4(1, 3)))
            && !e.contains(&format!("source {} ", t.v4(2, 2)))
            && !e.contains(&format!("source {} ", t.v6(2, 2)))
    });
    let extra = t.v4(1, 3);
    sh(&format!("ip -n {} addr add {extra}/32 dev lo", t.ep_a));
    let reply = ask_from(&t.ep_a, extra, sa(t.v4(9, 53), 53), "api.example.test.");
    assert_eq!(reply, Some(ResponseCode::NoError), "{}", t.logs());
}

/// Issue 15: `endPort` ranges 1024–65535 (TCP) and 1–65535 (UDP) pass `fqdnd policy check`,
/// load into the kernel as port prefixes, and enforce exactly: first, last, one past the
/// ends (the port below 1 is 0, which no socket can send to: the BPF tests cover it).
#[test]
fn wide_port_ranges_enforce_exactly() {
    const PORTS: &str = "{port: \"1024\", endPort: 65535, protocol: TCP}, {port: \"1\", endPort: 65535, protocol: UDP}";
    let Some(t) = start("ranges", |t| config(t, PORTS, "", "")) else {
        return;
    };
    let checked = t.cli(&[
        "policy",
        "check",
        t.config_dir().join("node.yaml").to_str().unwrap(),
    ]);
    assert!(!checked.is_empty(), "{checked}");
    resolve(&t, "api.example.test.");
    let policy = bpf(&t, "policy");
    let rows: Vec<(String, String, String)> = policy
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4).then(|| (f[1].to_owned(), f[2].to_owned(), f[3].to_owned()))
        })
        .collect();
    // per FQDN identity, 6 TCP and 16 UDP prefixes: not one entry per port
    let identities: std::collections::BTreeSet<&str> = rows
        .iter()
        .filter(|r| r.1 == "32768-65535")
        .map(|r| r.0.as_str())
        .collect();
    assert!(!identities.is_empty(), "{policy}");
    for id in identities {
        assert_eq!(rows.iter().filter(|r| r.0 == id).count(), 22, "{policy}");
    }
    let rows: Vec<(String, String)> = rows.into_iter().map(|r| (r.1, r.2)).collect();
    for (ports, proto) in [
        ("1024-2047", "tcp"),
        ("32768-65535", "tcp"),
        ("1", "udp"),
        ("2-3", "udp"),
    ] {
        assert!(
            rows.contains(&(ports.to_owned(), proto.to_owned())),
            "no {ports}/{proto} entry:\n{policy}"
        );
    }
    for port in [80, 1023, 1024, 1025, 65534, 65535] {
        serve_tcp_echo(&t.ext, port);
    }
    for ip in [t.v4(10, 1), t.v6(10, 1)] {
        for port in [1, 2, 65534, 65535] {
            serve_udp_echo(&t.ext, sa(ip, port));
        }
        for (port, allowed) in [
            (1023, false),
            (1024, true),
            (1025, true),
            (65534, true),
            (65535, true),
            (80, false),
        ] {
            let wait = if allowed { REACHES } else { DROPPED };
            assert_eq!(
                tcp_reaches(&t.ep_a, sa(ip, port), wait),
                allowed,
                "tcp {ip}:{port}\n{}",
                t.logs()
            );
        }
        for port in [1, 2, 65534, 65535] {
            assert!(
                udp_reaches(&t.ep_a, sa(ip, port), REACHES),
                "udp {ip}:{port}\n{}",
                t.logs()
            );
        }
    }
    wait_drop(&t, "policy-denied", &[("dst", ":1023")]);
}

/// Issue 15 bumped the map layout version: a restart whose pin directory is `…/v3` next to
/// a `…/v2` of an earlier run leaves the old maps as they are (not migrated: the new ones
/// start empty and are filled by the agent), names them and the interfaces their programs
/// still run on in a warning, and `fqdnd bpf unload --pin-dir …/v2` removes them without
/// touching the running agent (its DNS redirect keeps working).
#[test]
fn a_restart_under_a_new_layout_version_leaves_the_old_pins() {
    const PORTS: &str = "{port: \"8080\", protocol: TCP}";
    let Some(mut t) = start("abi", |t| {
        let with_v2 = config(t, PORTS, "", "");
        let pins = t.pin_dir.display().to_string();
        with_v2.replace(
            &format!("pinDir: {pins}\n"),
            &format!("pinDir: {pins}/v2\n"),
        )
    }) else {
        return;
    };
    let (v2, v3) = (t.pin_dir.join("v2"), t.pin_dir.join("v3"));
    let list = |t: &Topology, dir: &std::path::Path, what: &str| {
        t.cli(&["bpf", what, "list", "--pin-dir", dir.to_str().unwrap()])
    };
    resolve(&t, "api.example.test.");
    let api = sa(t.v4(10, 1), 8080);
    assert!(tcp_reaches(&t.ep_a, api, REACHES), "{}", t.logs());
    let api_prefix = format!("{}/32", t.v4(10, 1));
    assert!(list(&t, &v2, "ipcache").contains(&api_prefix));

    t.kill_node();
    let pins = t.pin_dir.display().to_string();
    let next = config(&t, PORTS, "", "").replace(
        &format!("pinDir: {pins}\n"),
        &format!("pinDir: {pins}/v3\n"),
    );
    let path = t.write_node_config(&next);
    t.start_node(&path);
    let log = std::fs::read_to_string(t.dir.join("node.log")).unwrap();
    let warning = log
        .lines()
        .find(|l| l.contains("maps of another layout version"))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    for name in [v2.to_str().unwrap(), "fqdnd_ct", "fqdnd_policy", &t.if_a] {
        assert!(warning.contains(name), "{name} not named: {warning}");
    }
    // not migrated: the old maps keep their entries, the new ones start without them
    assert!(list(&t, &v2, "ipcache").contains(&api_prefix));
    assert!(!list(&t, &v3, "ipcache").contains(&api_prefix));

    // the old layout's programs removed; the agent's redirect and policy work on
    let out = t.cli(&["bpf", "unload", "--pin-dir", v2.to_str().unwrap()]);
    assert!(out.contains("routes stay"), "{out}");
    assert!(!v2.exists());
    resolve(&t, "api.example.test.");
    assert!(tcp_reaches(&t.ep_a, api, REACHES), "{}", t.logs());
    assert!(!tcp_reaches(&t.ep_a, sa(t.v4(10, 1), 9090), DROPPED));
}

/// Waits `d` between the packets of a flow kept busy on purpose (a load's pace, not a wait
/// for something to happen).
#[allow(
    clippy::disallowed_methods,
    reason = "paces a flow that must keep sending past a name's expiry"
)]
fn pace(d: Duration) {
    std::thread::sleep(d);
}
