//! A throw-away network for the node agent: a "host" namespace running `fqdnd node`, two
//! endpoint namespaces behind veth pairs, and an "external" namespace with an authoritative
//! DNS server (`fqdnd gateway` serving a static zone) and TCP/UDP echo servers on several
//! IPv4 and IPv6 addresses. Everything (namespaces, processes, pins) goes when the value
//! drops, even after a failed assertion.
//!
//! Addresses (`N` = the topology's number):
//! - endpoint A: 10.N.1.2 / fd00:N:1::2, host side .1; endpoint B: 10.N.2.2 / fd00:N:2::2
//! - external: 10.N.9.2 / fd00:N:9::2, resolver 10.N.9.53 / fd00:N:9::53,
//!   servers 10.N.10.{1,2,3} / fd00:N:10::{1,2,3}, echo on TCP 8080 + 9090 and UDP 8053,
//!   "who am I" (the address asked) on TCP 7070 and UDP 7053; a second resolver address
//!   10.N.9.54 / fd00:N:9::54 for a second DNS server.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::common::{PATIENCE, poll, run, text, wait_serving};

/// Whether this process may build the topology; without root the test is skipped, unless
/// `FQDND_REQUIRE_PRIVILEGED=1` (CI), where it fails.
pub(crate) fn privileged(test: &str) -> bool {
    crate::common::privileged(test, "for netns and eBPF")
}

/// Runs a shell command; panics with its output when it fails.
pub(crate) fn sh(cmd: &str) {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` on a thread inside network namespace `ns`.
pub(crate) fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = File::open(&path).unwrap();
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The network and the processes in it.
pub(crate) struct Topology {
    /// Second octet of every IPv4 address, and the v6 prefix's second group.
    pub(crate) n: u32,
    prefix: String,
    /// Namespace names.
    pub(crate) host: String,
    pub(crate) ep_a: String,
    pub(crate) ep_b: String,
    pub(crate) ext: String,
    /// Host-side interfaces of the endpoints.
    pub(crate) if_a: String,
    pub(crate) if_b: String,
    /// Scratch directory (configs, admin sockets, logs).
    pub(crate) dir: PathBuf,
    /// The node's pin directory.
    pub(crate) pin_dir: PathBuf,
    children: Vec<(String, Child)>,
    node: Option<Child>,
}

impl Topology {
    /// Builds namespaces, links, addresses and routes, and starts the external servers.
    pub(crate) fn new(test: &str) -> Self {
        let pid = std::process::id();
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        // 10.200-249.x.y: one block per topology of this process.
        let n = 200 + (pid + k * 7) % 50;
        let prefix = format!("fq{}{k}", pid % 10_000);
        let dir = std::env::temp_dir().join(format!("fqdnd-e2e-{pid}-{test}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let t = Self {
            n,
            host: format!("{prefix}-host"),
            ep_a: format!("{prefix}-a"),
            ep_b: format!("{prefix}-b"),
            ext: format!("{prefix}-ext"),
            if_a: format!("{prefix}ah"),
            if_b: format!("{prefix}bh"),
            pin_dir: PathBuf::from(format!("/sys/fs/bpf/fqdnd-e2e-{pid}-{test}")),
            prefix,
            dir,
            children: Vec::new(),
            node: None,
        };
        t.build();
        t
    }

    fn build(&self) {
        let (n, p) = (self.n, &self.prefix);
        for ns in [&self.host, &self.ep_a, &self.ep_b, &self.ext] {
            sh(&format!("ip netns add {ns}"));
            sh(&format!("ip -n {ns} link set lo up"));
        }
        let host = &self.host;
        // (`/proc/sys` through `sh`: procps may not be installed.)
        sh(&format!(
            "ip netns exec {host} sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward && \
             echo 1 > /proc/sys/net/ipv6/conf/all/forwarding'"
        ));
        // Endpoints: veth pairs, host side in the host namespace.
        for (ns, hif, inner, net) in [
            (&self.ep_a, &self.if_a, format!("{p}a"), 1),
            (&self.ep_b, &self.if_b, format!("{p}b"), 2),
        ] {
            sh(&format!(
                "ip -n {host} link add {hif} type veth peer name {inner} netns {ns}"
            ));
            sh(&format!(
                "ip -n {host} addr add 10.{n}.{net}.1/24 dev {hif} && \
                 ip -n {host} addr add fd00:{n}:{net}::1/64 dev {hif} nodad && \
                 ip -n {host} link set {hif} up && \
                 ip -n {ns} addr add 10.{n}.{net}.2/24 dev {inner} && \
                 ip -n {ns} addr add fd00:{n}:{net}::2/64 dev {inner} nodad && \
                 ip -n {ns} link set {inner} up && \
                 ip -n {ns} route add default via 10.{n}.{net}.1 && \
                 ip -n {ns} -6 route add default via fd00:{n}:{net}::1"
            ));
        }
        // The external network.
        let ext = &self.ext;
        sh(&format!(
            "ip -n {host} link add {p}xh type veth peer name {p}x netns {ext} && \
             ip -n {host} addr add 10.{n}.9.1/24 dev {p}xh && \
             ip -n {host} addr add fd00:{n}:9::1/64 dev {p}xh nodad && \
             ip -n {host} link set {p}xh up && \
             ip -n {ext} addr add 10.{n}.9.2/24 dev {p}x && \
             ip -n {ext} addr add 10.{n}.9.53/32 dev {p}x && \
             ip -n {ext} addr add fd00:{n}:9::2/64 dev {p}x nodad && \
             ip -n {ext} addr add fd00:{n}:9::53/128 dev {p}x nodad && \
             ip -n {ext} addr add 10.{n}.9.54/32 dev {p}x && \
             ip -n {ext} addr add fd00:{n}:9::54/128 dev {p}x nodad && \
             ip -n {ext} link set {p}x up && \
             ip -n {ext} route add default via 10.{n}.9.1 && \
             ip -n {ext} -6 route add default via fd00:{n}:9::1 && \
             ip -n {host} route add 10.{n}.10.0/24 via 10.{n}.9.2 && \
             ip -n {host} -6 route add fd00:{n}:10::/64 via fd00:{n}:9::2"
        ));
        for i in 1..=3 {
            sh(&format!(
                "ip -n {ext} addr add 10.{n}.10.{i}/32 dev lo && \
                 ip -n {ext} addr add fd00:{n}:10::{i}/128 dev lo nodad"
            ));
        }
        for (port, serve) in [
            (8080, tcp_echo as fn(&TcpListener)),
            (9090, tcp_echo),
            // Load-balancer backends say who they are: TCP 7070 writes its address first,
            // then echoes; UDP 7053 answers any datagram with its address.
            (7070, whoami_tcp),
        ] {
            in_netns(ext, move || {
                let listener = TcpListener::bind(("::", port)).unwrap();
                std::thread::spawn(move || serve(&listener));
            });
        }
        // UDP replies must leave from the address asked: one socket per server address.
        for (port, serve) in [(7053, whoami_udp as fn(&UdpSocket)), (8053, udp_echo)] {
            for i in 1..=3 {
                let addrs: [SocketAddr; 2] = [
                    format!("10.{n}.10.{i}:{port}").parse().unwrap(),
                    format!("[fd00:{n}:10::{i}]:{port}").parse().unwrap(),
                ];
                in_netns(ext, move || {
                    for addr in addrs {
                        let socket = UdpSocket::bind(addr).unwrap();
                        std::thread::spawn(move || serve(&socket));
                    }
                });
            }
        }
    }

    /// Starts the authoritative DNS server in the external namespace: `zone` (zone-file
    /// records for `example.test`) served on the resolver addresses.
    pub(crate) fn start_dns(&mut self, zone: &str) {
        self.start_dns_on(53, zone);
    }

    /// An authoritative server for `zone` on 10.N.9.HOST and fd00:N:9::HOST (53 or 54), port
    /// 53; its log is `ext-dns` (53) or `ext-dns54`.
    pub(crate) fn start_dns_on(&mut self, host: u32, zone: &str) {
        let n = self.n;
        let name = if host == 53 {
            "ext-dns".to_owned()
        } else {
            format!("ext-dns{host}")
        };
        let config = self.dir.join(format!("{name}.yaml"));
        let admin = self.dir.join(format!("{name}-admin.sock"));
        let records: String = zone.lines().map(|l| format!("      {l}\n")).collect();
        std::fs::write(
            &config,
            format!(
                "apiVersion: fqdnd.io/v1\nkind: Gateway\nspec:\n  listen: [\"10.{n}.9.{host}:53\", \"[fd00:{n}:9::{host}]:53\"]\n  adminSocket: {admin}\n  staticZones:\n  - origin: example.test\n    records: |\n      $TTL 300\n      @ IN SOA ns.example.test. admin.example.test. 1 3600 600 86400 60\n      @ IN NS ns.example.test.\n{records}---\napiVersion: fqdnd.io/v1\nkind: ClientGroup\nmetadata: {{name: everyone}}\nspec:\n  id: 1\n  addresses: [\"0.0.0.0/0\", \"::/0\"]\n",
                admin = admin.display(),
            ),
        )
        .unwrap();
        let child = self.spawn_in(
            &self.ext.clone(),
            &["gateway", "--config", config.to_str().unwrap()],
            &name,
        );
        self.children.push((name.clone(), child));
        // (Killed by Drop if it never answers.)
        let (_, child) = self.children.last_mut().unwrap();
        wait_serving(child, &admin, &name);
    }

    /// `fqdnd ARGS` inside namespace `ns` (nsenter switches only the network namespace, so
    /// bpffs stays visible), output into `<dir>/<log>.log`.
    fn spawn_in(&self, ns: &str, args: &[&str], log: &str) -> Child {
        let log = File::create(self.dir.join(format!("{log}.log"))).unwrap();
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{ns}"))
            .arg(env!("CARGO_BIN_EXE_fqdnd"))
            .args(args)
            .env("FQDND_LOG", "info,fqdnd=debug")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// Writes the node's configuration file (`config/node.yaml`) and returns its path.
    pub(crate) fn write_node_config(&self, documents: &str) -> PathBuf {
        self.write_config_file("node.yaml", documents)
    }

    /// The node's configuration directory: `config/` (`node.yaml` and any other file).
    pub(crate) fn config_dir(&self) -> PathBuf {
        self.dir.join("config")
    }

    /// Writes `config/NAME` and returns its path.
    pub(crate) fn write_config_file(&self, name: &str, documents: &str) -> PathBuf {
        let path = self.config_dir().join(name);
        std::fs::create_dir_all(self.config_dir()).unwrap();
        std::fs::write(&path, documents).unwrap();
        path
    }

    /// The node's admin socket.
    pub(crate) fn admin(&self) -> PathBuf {
        self.dir.join("node-admin.sock")
    }

    /// Starts `fqdnd node` in the host namespace and waits for its admin API.
    pub(crate) fn start_node(&mut self, config: &Path) {
        self.start_daemon("node", config);
    }

    /// Starts `fqdnd MODE` (node or gateway) in the host namespace and waits for its admin
    /// API; its log is `node.log` either way.
    pub(crate) fn start_daemon(&mut self, mode: &str, config: &Path) {
        let admin = self.admin();
        let _ = std::fs::remove_file(&admin);
        let child = self.spawn_in(
            &self.host.clone(),
            &[
                mode,
                "--config",
                config.to_str().unwrap(),
                "--admin-socket",
                admin.to_str().unwrap(),
            ],
            "node",
        );
        // (Killed by Drop, its log printed, if it never answers.)
        let child = self.node.insert(child);
        wait_serving(child, &admin, &format!("fqdnd {mode}"));
    }

    /// The daemon's process id (nsenter execs it: the same process).
    pub(crate) fn node_pid(&self) -> Option<u32> {
        self.node.as_ref().map(Child::id)
    }

    /// Waits until every thread of the daemon holds exactly `expected` as its effective and
    /// permitted capabilities (it drops the others after start-up); panics with the threads'
    /// sets if it never does.
    pub(crate) fn expect_caps(&self, expected: u64) {
        let pid = self.node_pid().unwrap();
        let read = || -> Vec<(u64, u64)> {
            std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|dir| {
                    dir.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("status")).ok())
                        .map(|s| {
                            let cap = |key: &str| {
                                s.lines()
                                    .find_map(|l| l.strip_prefix(key))
                                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                                    .unwrap_or(u64::MAX)
                            };
                            (cap("CapEff:"), cap("CapPrm:"))
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let what = format!("every thread's capabilities (effective, permitted) to be {expected:x}");
        poll(PATIENCE, &what, || {
            let threads = read();
            if !threads.is_empty() && threads.iter().all(|&(e, p)| e == expected && p == expected) {
                Ok(())
            } else {
                Err(format!("{threads:x?}"))
            }
        });
    }

    /// Kills the node agent (SIGKILL) and waits for it.
    pub(crate) fn kill_node(&mut self) {
        if let Some(mut child) = self.node.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs `fqdnd ARGS` against the node (host namespace), returns stdout; panics on failure.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        let out = self.cli_in(&self.host, args);
        assert!(
            out.status.success(),
            "fqdnd {args:?} failed: {}{}\n{}",
            text(&out.stdout),
            text(&out.stderr),
            self.logs()
        );
        text(&out.stdout)
    }

    /// `fqdnd ARGS --admin-socket <the node's>` (host namespace), returns stdout; panics on
    /// failure.
    pub(crate) fn admin_cli(&self, args: &[&str]) -> String {
        let admin = self.admin();
        let mut args = args.to_vec();
        args.extend(["--admin-socket", admin.to_str().unwrap()]);
        self.cli(&args)
    }

    /// `fqdnd ARGS --json` against the node's admin socket, decoded; panics if it fails.
    pub(crate) fn admin_json(&self, args: &[&str]) -> serde_json::Value {
        crate::common::admin(&self.admin(), args)
    }

    /// `fqdnd bpf WHAT list` of the node's pinned maps.
    pub(crate) fn bpf_list(&self, what: &str) -> String {
        self.cli(&[
            "bpf",
            what,
            "list",
            "--pin-dir",
            self.pin_dir.to_str().unwrap(),
        ])
    }

    /// `fqdnd ARGS` in network namespace `ns` only (nsenter: the mount namespace stays, so
    /// bpffs stays visible — `ip netns exec` would mount a fresh /sys over it), run to the end.
    pub(crate) fn cli_in(&self, ns: &str, args: &[&str]) -> Output {
        run(Command::new("nsenter")
            .arg(format!("--net=/run/netns/{ns}"))
            .arg(env!("CARGO_BIN_EXE_fqdnd"))
            .args(args)
            .env_remove("FQDND_ADMIN_SOCKET"))
    }

    /// The node's and the DNS server's logs, for failure messages.
    pub(crate) fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["node", "ext-dns", "ext-dns54"] {
            let text =
                std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            out += &format!("--- {name}.log (last lines) ---\n");
            for line in tail.into_iter().rev() {
                out += line;
                out += "\n";
            }
        }
        out
    }

    /// An IPv4 or IPv6 address of the topology: `v4(1, 2)` is 10.N.1.2.
    pub(crate) fn v4(&self, net: u32, host: u32) -> IpAddr {
        format!("10.{}.{net}.{host}", self.n).parse().unwrap()
    }

    /// `v6(1, 2)` is fd00:N:1::2.
    pub(crate) fn v6(&self, net: u32, host: u32) -> IpAddr {
        format!("fd00:{}:{net}::{host}", self.n).parse().unwrap()
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.kill_node();
        for (_, mut child) in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in [&self.host, &self.ep_a, &self.ep_b, &self.ext] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(&self.pin_dir);
        // The endpoints the node kept for these pins without a `stateDir`.
        if let Some(dir) = fqdnd_config::default_endpoints_file(&self.pin_dir).parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("{}logs kept in {}", self.logs(), self.dir.display());
        }
    }
}

/// A TCP echo server on `port` (every address) in namespace `ns`.
pub(crate) fn serve_tcp_echo(ns: &str, port: u16) {
    in_netns(ns, move || {
        let listener = TcpListener::bind(("::", port)).unwrap();
        std::thread::spawn(move || tcp_echo(&listener));
    });
}

pub(crate) fn tcp_echo(listener: &TcpListener) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        std::thread::spawn(move || {
            let mut buf = [0u8; 16384];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 || stream.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
    }
}

/// The address a connection was accepted on (an IPv4 one as itself, not v4-mapped).
fn local_ip(stream: &TcpStream) -> Option<IpAddr> {
    let ip = stream.local_addr().ok()?.ip();
    Some(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    })
}

fn whoami_tcp(listener: &TcpListener) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        std::thread::spawn(move || {
            let Some(ip) = local_ip(&stream) else { return };
            if stream.write_all(format!("{ip}\n").as_bytes()).is_err() {
                return;
            }
            let mut buf = [0u8; 1024];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 || stream.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
    }
}

fn whoami_udp(socket: &UdpSocket) {
    let Ok(me) = socket.local_addr() else { return };
    let mut buf = [0u8; 1500];
    while let Ok((_, from)) = socket.recv_from(&mut buf) {
        let _ = socket.send_to(me.ip().to_string().as_bytes(), from);
    }
}

/// From namespace `ns`: a TCP connection to `to` (kept open) and the backend address the
/// server wrote first; `None` if it did not connect within `timeout`.
pub(crate) fn whoami_tcp_open(
    ns: &str,
    to: SocketAddr,
    timeout: Duration,
) -> Option<(TcpStream, IpAddr)> {
    in_netns(ns, move || {
        let stream = TcpStream::connect_timeout(&to, timeout).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
        let mut line = String::new();
        let mut reader = std::io::BufReader::new(stream.try_clone().ok()?);
        std::io::BufRead::read_line(&mut reader, &mut line).ok()?;
        Some((stream, line.trim().parse().ok()?))
    })
}

/// From namespace `ns`: one datagram to `to` on a connected socket (so only a reply from
/// `to` itself is read); the backend address it answered with.
pub(crate) fn whoami_udp_ask(ns: &str, to: SocketAddr, timeout: Duration) -> Option<IpAddr> {
    in_netns(ns, move || {
        let bind: SocketAddr = if to.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        let socket = UdpSocket::bind(bind).ok()?;
        socket.connect(to).ok()?;
        socket.set_read_timeout(Some(timeout)).ok()?;
        socket.send(b"who").ok()?;
        let mut buf = [0u8; 64];
        let n = socket.recv(&mut buf).ok()?;
        std::str::from_utf8(&buf[..n]).ok()?.parse().ok()
    })
}

fn udp_echo(socket: &UdpSocket) {
    let mut buf = [0u8; 1500];
    while let Ok((n, from)) = socket.recv_from(&mut buf) {
        let _ = socket.send_to(&buf[..n], from);
    }
}

/// Whether a TCP connection from namespace `ns` to `to` gets through within `timeout`
/// (connect, then one echoed message).
pub(crate) fn tcp_reaches(ns: &str, to: SocketAddr, timeout: Duration) -> bool {
    in_netns(ns, move || {
        let Ok(mut stream) = TcpStream::connect_timeout(&to, timeout) else {
            return false;
        };
        stream.set_read_timeout(Some(timeout)).unwrap();
        if stream.write_all(b"ping").is_err() {
            return false;
        }
        let mut buf = [0u8; 4];
        stream.read_exact(&mut buf).is_ok() && &buf == b"ping"
    })
}

/// Whether a UDP datagram from namespace `ns` to `to` is echoed within `timeout`.
pub(crate) fn udp_reaches(ns: &str, to: SocketAddr, timeout: Duration) -> bool {
    in_netns(ns, move || {
        let bind: SocketAddr = if to.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        let socket = UdpSocket::bind(bind).unwrap();
        socket.set_read_timeout(Some(timeout)).unwrap();
        socket.send_to(b"ping", to).unwrap();
        let mut buf = [0u8; 16];
        matches!(socket.recv_from(&mut buf), Ok((4, from)) if from == to)
    })
}

/// A TCP connection opened from inside a namespace, kept for later use.
pub(crate) fn tcp_open(ns: &str, to: SocketAddr) -> Option<TcpStream> {
    in_netns(ns, move || {
        let stream = TcpStream::connect_timeout(&to, Duration::from_secs(5)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        Some(stream)
    })
}

/// Sends and reads back one message on an open connection.
pub(crate) fn echo(stream: &mut TcpStream, message: &[u8]) -> bool {
    if stream.write_all(message).is_err() {
        return false;
    }
    let mut buf = vec![0u8; message.len()];
    stream.read_exact(&mut buf).is_ok() && buf == message
}
