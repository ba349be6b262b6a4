//! An HA gateway pair (issue 17, docs/ha-gateway.md), as root: two `fqdnd gateway`s, each in
//! its own namespace, enforcing on their LAN side, sharing learned answers through a 3-member
//! etcd; keepalived moves a virtual address on each side (LAN: the clients' router and DNS
//! server; WAN: where the servers route the clients' prefix) from the active gateway to the
//! standby. A client namespace resolves and connects through the LAN address; an external
//! namespace runs the authoritative server (nsd) and the TCP servers.
//!
//! Shown: the client resolves through the active gateway and reaches the allowed addresses;
//! the standby imports them (a burst of 500 answers in a few transactions); with every etcd
//! member stopped the active gateway answers and enforces on its own (a refused name stays
//! refused) and publishes what it learned meanwhile once etcd is back; the active gateway is
//! killed (-9); keepalived moves the addresses; a TCP transfer that was
//! running continues through the survivor; new connections to addresses only the dead gateway
//! had learned are allowed without new DNS; a name the policy refuses is still refused; the
//! dead gateway comes back, imports the group's state before it serves (an answer only the
//! survivor learned included; the records' age is not reported as import lag) and enforces
//! it. Issue 35: the active gateway learns an answer while etcd is down and dies before etcd
//! is back; restarted after, it publishes what its journal kept and the survivor enforces it;
//! the key deleted with `etcdctl del` is revoked on both gateways (the connection is dropped).
//!
//! `benchmarks/gateway-failover.sh` runs this test and reports its last line:
//! `failover: address moved in X s, transfer survived: yes|no, learned-only connections
//! allowed: N/M` (printed before the assertions, so a failed run still reports).
//!
//! Without root, keepalived, nsd or etcd the test is skipped, unless
//! `FQDND_REQUIRE_PRIVILEGED=1` (CI), where it fails.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "test code: real processes and clocks (the failover time is measured); a failed step should panic"
)]

mod common;

#[path = "../cluster/tests/support/etcd.rs"]
#[allow(
    dead_code,
    unreachable_pub,
    reason = "the cluster crate's etcd launcher, shared: not every helper is used here"
)]
mod etcd;

#[path = "node/topology.rs"]
#[allow(
    dead_code,
    reason = "the node tests' namespace helpers, shared: only the free functions are used here"
)]
mod topology;

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd::EtcdCluster;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use common::{DROPPED, PATIENCE, REACHES, documents, policy_doc, poll, question, text};
use topology::{in_netns, sh, tcp_reaches};

/// The names the client group may ask and connect to (TCP 8080), and one it may not.
const ZONE: &str = "\
api 300 IN A 10.N.10.1
data 300 IN A 10.N.10.2
only1 300 IN A 10.N.10.3
only2 300 IN A 10.N.10.4
evil 300 IN A 10.N.10.5
late 300 IN A 10.N.10.6
crash 300 IN A 10.N.10.7
";

/// Names asked in a burst through the active gateway (`hNNN.bulk.example.test`), to measure
/// the state lag under load.
const BURST: usize = 500;

/// The burst's zone lines: `hI.bulk` → 10.N.(11 + I / 250).(I % 250 + 1).
fn burst_zone(n: u32) -> String {
    (0..BURST)
        .map(|i| {
            format!(
                "h{i}.bulk 300 IN A 10.{n}.{}.{}\n",
                11 + i / 250,
                i % 250 + 1
            )
        })
        .collect()
}

/// What [`burst`] saw: questions answered with an address, and how many were sent again.
struct Burst {
    answered: usize,
    resent: usize,
    /// From the first question to the last answer (or to giving up).
    took: Duration,
}

/// Asks the burst's names from the client namespace, all at once from one socket, a thread
/// reading the replies as they come into a 4 MiB receive buffer (with the default ~200 KiB a
/// busy machine that left the reader unscheduled dropped replies: `RcvbufErrors` in `c`).
/// Like a stub resolver, it asks again what has no answer once replies stop coming for
/// [`RETRY_AFTER`] (a datagram lost to a full buffer on a loaded machine is not what this test
/// is about), at most twice.
fn burst(net: &Net) -> Burst {
    const RETRY_AFTER: Duration = Duration::from_secs(3);
    let server = SocketAddr::new(net.ip(1, 1), 53);
    in_netns(&net.ns("c"), move || {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        // Past net.core.rmem_max: the test runs as root.
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBufForce, &(4 << 20))
            .unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let reader = socket.try_clone().unwrap();
        let answered = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let replies = std::thread::spawn({
            let (answered, stop) = (answered.clone(), stop.clone());
            move || {
                let mut buf = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((len, _)) = reader.recv_from(&mut buf) else {
                        continue;
                    };
                    if let Ok(m) = hickory_proto::op::Message::from_vec(&buf[..len])
                        && common::addrs(&m).len() == 1
                    {
                        answered.lock().unwrap().insert(m.metadata.id);
                    }
                }
            }
        });
        let ask = |ids: &[u16]| {
            for &id in ids {
                let q = question(id, &format!("h{id}.bulk.example.test."), RecordType::A);
                socket.send_to(&q.to_vec().unwrap(), server).unwrap();
            }
        };
        let all: Vec<u16> = (0..u16::try_from(BURST).unwrap()).collect();
        let began = Instant::now();
        ask(&all);
        let mut resent = 0;
        for round in 0..3 {
            // Until everything is answered or nothing new came for RETRY_AFTER.
            let (mut seen, mut progress) = (0, Instant::now());
            loop {
                let now = answered.lock().unwrap().len();
                if now == BURST || progress.elapsed() >= RETRY_AFTER {
                    break;
                }
                if now > seen {
                    (seen, progress) = (now, Instant::now());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let missing: Vec<u16> = {
                let answered = answered.lock().unwrap();
                all.iter()
                    .filter(|id| !answered.contains(id))
                    .copied()
                    .collect()
            };
            if missing.is_empty() || round == 2 {
                break;
            }
            resent += missing.len();
            ask(&missing);
        }
        let took = began.elapsed();
        stop.store(true, Ordering::Relaxed);
        replies.join().unwrap();
        let answered = answered.lock().unwrap().len();
        Burst {
            answered,
            resent,
            took,
        }
    })
}

/// Whether a program is installed (`prog --version` or `-v` runs).
fn installed(prog: &str, arg: &str) -> bool {
    Command::new(prog)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Root, keepalived, nsd and etcd; else skipped (or failed under FQDND_REQUIRE_PRIVILEGED=1).
fn prerequisites(test: &str) -> bool {
    if !common::privileged(test, "for netns, eBPF and keepalived") || !etcd::available(test) {
        return false;
    }
    common::runnable(
        test,
        installed("keepalived", "--version") && installed("nsd", "-v"),
        "keepalived and nsd (scripts/install-deps.sh)",
    )
}

/// A process killed (SIGTERM, then SIGKILL) when dropped.
struct Proc {
    child: Option<Child>,
}

impl Proc {
    fn spawn(ns: &str, program: &str, args: &[&str], log: &Path, env: &[(&str, &str)]) -> Self {
        let log = File::create(log).unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{ns}"))
            .arg(program)
            .args(args)
            .envs(env.iter().copied())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Self { child: Some(child) }
    }

    /// SIGKILL, at once.
    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn term(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.term();
    }
}

/// keepalived in one namespace (foreground, its own pid files); on drop, stopped, and its
/// VRRP child too (from its pid file) in case it outlived the parent.
struct Keepalived {
    proc: Proc,
    vrrp_pid: PathBuf,
}

impl Drop for Keepalived {
    fn drop(&mut self) {
        self.proc.term();
        if let Some(pid) = std::fs::read_to_string(&self.vrrp_pid)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Namespaces, pins and the scratch directory, removed when dropped (logs kept on failure).
struct Net {
    n: u32,
    prefix: String,
    dir: PathBuf,
    namespaces: Vec<String>,
    pins: Vec<PathBuf>,
}

impl Net {
    fn ns(&self, which: &str) -> String {
        format!("{}{which}", self.prefix)
    }

    fn ip(&self, net: u32, host: u32) -> IpAddr {
        format!("10.{}.{net}.{host}", self.n).parse().unwrap()
    }

    /// Each namespace's UDP receive errors (`/proc/net/snmp`): where a lost datagram was
    /// dropped (a full receive buffer counts in `RcvbufErrors`).
    fn udp_errors(&self) -> String {
        let mut out = String::from("UDP receive errors:");
        for which in ["c", "g1", "g2", "x"] {
            let snmp = ip(&["netns", "exec", &self.ns(which), "cat", "/proc/net/snmp"]);
            let udp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Udp:")).collect();
            let [names, values] = udp[..] else {
                out += &format!(" {which}: unreadable;");
                continue;
            };
            let counts: Vec<String> = names
                .split_whitespace()
                .zip(values.split_whitespace())
                .filter(|(name, _)| name.ends_with("Errors"))
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            out += &format!(" {which}: {};", counts.join(" "));
        }
        out
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["gw1", "gw2", "ka1", "ka2", "nsd"] {
            let text =
                std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
            out += &format!("--- {name}.log (last lines) ---\n");
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            for line in tail.into_iter().rev() {
                out += line;
                out += "\n";
            }
        }
        out
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        for pin in &self.pins {
            let _ = std::fs::remove_dir_all(pin);
        }
        if std::thread::panicking() {
            eprintln!("{}logs kept in {}", self.logs(), self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Builds the namespaces and links:
/// - client `c`: bridge `br0` 10.N.1.100/24 (the LAN), default route via the LAN VIP 10.N.1.1;
/// - gateways `g1`, `g2`: `lan` 10.N.1.{2,3}, `wan` 10.N.2.{2,3}, forwarding, non-local bind
///   (the proxy listens on the VIP it may not hold yet), routes to the servers via 10.N.2.100;
/// - external `x`: bridge `br0` 10.N.2.100/24 (the WAN; etcd listens there), the client prefix
///   via the WAN VIP 10.N.2.1, the DNS server 10.N.9.53 and the TCP servers 10.N.10.1-5 on lo.
fn build(net: &Net) {
    let n = net.n;
    let (c, g1, g2, x) = (net.ns("c"), net.ns("g1"), net.ns("g2"), net.ns("x"));
    for ns in [&c, &g1, &g2, &x] {
        sh(&format!("ip netns add {ns} && ip -n {ns} link set lo up"));
    }
    sh(&format!(
        "ip -n {c} link add br0 type bridge && ip -n {c} link set br0 up && \
         ip -n {c} addr add 10.{n}.1.100/24 dev br0 && \
         ip -n {x} link add br0 type bridge && ip -n {x} link set br0 up && \
         ip -n {x} addr add 10.{n}.2.100/24 dev br0"
    ));
    for (i, g) in [(1, &g1), (2, &g2)] {
        let host = i + 1;
        sh(&format!(
            "ip -n {g} link add lan type veth peer name p{i} netns {c} && \
             ip -n {c} link set p{i} master br0 && ip -n {c} link set p{i} up && \
             ip -n {g} link add wan type veth peer name p{i} netns {x} && \
             ip -n {x} link set p{i} master br0 && ip -n {x} link set p{i} up && \
             ip -n {g} addr add 10.{n}.1.{host}/24 dev lan && ip -n {g} link set lan up && \
             ip -n {g} addr add 10.{n}.2.{host}/24 dev wan && ip -n {g} link set wan up && \
             ip -n {g} route add 10.{n}.9.0/24 via 10.{n}.2.100 && \
             ip -n {g} route add 10.{n}.10.0/24 via 10.{n}.2.100 && \
             ip netns exec {g} sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward && \
               echo 1 > /proc/sys/net/ipv4/ip_nonlocal_bind'"
        ));
    }
    sh(&format!(
        "ip -n {c} route add default via 10.{n}.1.1 && \
         ip -n {x} route add 10.{n}.1.0/24 via 10.{n}.2.1 && \
         ip -n {x} addr add 10.{n}.9.53/32 dev lo"
    ));
    for i in 1..=7 {
        sh(&format!("ip -n {x} addr add 10.{n}.10.{i}/32 dev lo"));
    }
    topology::serve_tcp_echo(&x, 8080);
}

/// nsd in the external namespace, authoritative for example.test on 10.N.9.53.
fn start_nsd(net: &Net) -> Proc {
    let dir = &net.dir;
    let zone = format!(
        "$TTL 300\n@ IN SOA ns.example.test. admin.example.test. 1 3600 600 86400 60\n@ IN NS ns.example.test.\nns IN A 10.{n}.9.53\n{records}{bulk}",
        n = net.n,
        records = ZONE.replace("10.N.", &format!("10.{}.", net.n)),
        bulk = burst_zone(net.n),
    );
    std::fs::write(dir.join("example.test.zone"), zone).unwrap();
    let d = dir.display();
    std::fs::write(
        dir.join("nsd.conf"),
        format!(
            "server:\n    ip-address: 10.{n}.9.53\n    port: 53\n    do-ip6: no\n    server-count: 1\n    username: \"\"\n    chroot: \"\"\n    zonesdir: \"{d}\"\n    database: \"\"\n    zonelistfile: \"{d}/nsd.zonelist\"\n    xfrdfile: \"{d}/nsd.xfrd.state\"\n    pidfile: \"{d}/nsd.pid\"\n    verbosity: 1\nremote-control:\n    control-enable: no\nzone:\n    name: \"example.test\"\n    zonefile: \"{d}/example.test.zone\"\n",
            n = net.n
        ),
    )
    .unwrap();
    let conf = dir.join("nsd.conf");
    Proc::spawn(
        &net.ns("x"),
        "nsd",
        &["-d", "-c", conf.to_str().unwrap()],
        &dir.join("nsd.log"),
        &[],
    )
}

/// One gateway of the pair.
struct Gw {
    name: String,
    ns: String,
    config: PathBuf,
    admin: PathBuf,
    log: PathBuf,
    proc: Option<Proc>,
}

impl Gw {
    fn start(&mut self) {
        let _ = std::fs::remove_file(&self.admin);
        let mut proc = Proc::spawn(
            &self.ns,
            env!("CARGO_BIN_EXE_fqdnd"),
            &[
                "gateway",
                "--config",
                self.config.to_str().unwrap(),
                "--admin-socket",
                self.admin.to_str().unwrap(),
            ],
            &self.log,
            &[("FQDND_LOG", "info,fqdnd=debug")],
        );
        common::wait_serving(proc.child.as_mut().unwrap(), &self.admin, &self.name);
        self.proc = Some(proc);
    }

    fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
    }

    fn ha(&self) -> serde_json::Value {
        common::admin(&self.admin, &["status"])["cluster"]["ha"].clone()
    }

    fn counter(&self, key: &str) -> u64 {
        self.ha()[key].as_u64().unwrap_or(0)
    }

    /// The names in its DNS cache.
    fn names(&self) -> String {
        common::admin(&self.admin, &["cache", "list"]).to_string()
    }
}

fn gateway_config(net: &Net, name: &str, pin: &Path, etcd: &[String]) -> String {
    let n = net.n;
    let endpoints: Vec<String> = etcd.iter().map(|e| format!("\"{e}\"")).collect();
    let allowed = "[{matchName: api.example.test}, {matchName: data.example.test}, {matchName: only1.example.test}, {matchName: only2.example.test}, {matchName: late.example.test}, {matchName: crash.example.test}, {matchPattern: \"*.bulk.example.test\"}]";
    documents(&[
        &format!(
            "apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: [\"10.{n}.1.1:53\"]
  upstreams: [\"10.{n}.9.53:53\"]
  upstreamTimeout: 2s
  enforceInterfaces: [lan]
  pinDir: {pin}
  stateDir: {state}
",
            pin = pin.display(),
            state = net.dir.join(format!("state-{name}")).display(),
        ),
        &format!(
            "apiVersion: fqdnd.io/v1
kind: Cluster
spec:
  endpoints: [{endpoints}]
  prefix: /ha-test
  nodeName: {name}
  leaseTTL: 4s
  gatewayGroup: edge
",
            endpoints = endpoints.join(", ")
        ),
        &format!(
            "apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {{name: lan}}
spec:
  id: 10
  addresses: [10.{n}.1.0/24]
  labels: {{group: lan}}
"
        ),
        &policy_doc(
            "CiliumClusterwideNetworkPolicy",
            "lan",
            "group: lan",
            &format!(
                "  - toCIDR: [10.{n}.1.1/32]
    toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns: {allowed}
  - toFQDNs: {allowed}
    toPorts:
    - ports: [{{port: \"8080\", protocol: TCP}}]
"
            ),
        ),
    ])
}

/// keepalived of gateway `i`: VRRP over multicast (224.0.0.18 is link-local multicast, which
/// the LAN programs always pass; a unicast advertisement from the peer would be judged as a
/// client's packet).
fn keepalived_config(net: &Net, i: u32, check: &Path) -> String {
    let n = net.n;
    let priority = if i == 1 { 150 } else { 100 };
    format!(
        "global_defs {{
  router_id {prefix}g{i}
  script_user root
  enable_script_security
}}
vrrp_script fqdnd_alive {{
  script \"{check}\"
  interval 1
  timeout 2
  fall 1
  rise 2
}}
vrrp_instance edge {{
  state BACKUP
  nopreempt
  interface lan
  virtual_router_id 51
  priority {priority}
  advert_int 1
  virtual_ipaddress {{
    10.{n}.1.1/24 dev lan
    10.{n}.2.1/24 dev wan
  }}
  track_script {{
    fqdnd_alive
  }}
}}
",
        prefix = net.prefix,
        check = check.display()
    )
}

fn start_keepalived(net: &Net, i: u32, admin: &Path) -> Keepalived {
    let dir = &net.dir;
    let check = dir.join(format!("check{i}.sh"));
    std::fs::write(
        &check,
        format!(
            "#!/bin/sh\nexec {} status --admin-socket {} >/dev/null 2>&1\n",
            env!("CARGO_BIN_EXE_fqdnd"),
            admin.display()
        ),
    )
    .unwrap();
    sh(&format!("chmod 755 {}", check.display()));
    let conf = dir.join(format!("keepalived{i}.conf"));
    std::fs::write(&conf, keepalived_config(net, i, &check)).unwrap();
    let pid = |what: &str| {
        dir.join(format!("ka{i}.{what}.pid"))
            .to_str()
            .unwrap()
            .to_owned()
    };
    let vrrp_pid = pid("vrrp");
    let proc = Proc::spawn(
        &net.ns(&format!("g{i}")),
        "keepalived",
        &[
            "-n",
            "-l",
            "-D",
            "--vrrp",
            "-f",
            conf.to_str().unwrap(),
            "-p",
            &pid("main"),
            "-r",
            &vrrp_pid,
            "-c",
            &pid("checker"),
        ],
        &dir.join(format!("ka{i}.log")),
        &[],
    );
    Keepalived {
        proc,
        vrrp_pid: PathBuf::from(vrrp_pid),
    }
}

/// `ip ARGS`' output.
fn ip(args: &[&str]) -> String {
    text(&Command::new("ip").args(args).output().unwrap().stdout)
}

/// The MAC address of `dev` in namespace `ns`.
fn mac(ns: &str, dev: &str) -> String {
    ip(&["-n", ns, "-br", "link", "show", "dev", dev])
        .split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .to_owned()
}

/// Whether namespace `ns` holds the LAN VIP.
fn holds_vip(net: &Net, ns: &str) -> bool {
    ip(&["-n", ns, "-br", "addr", "show", "dev", "lan"]).contains(&format!("10.{}.1.1/24", net.n))
}

/// A DNS question from the client namespace to the LAN VIP: (rcode, addresses).
fn ask(net: &Net, name: &str) -> Option<(ResponseCode, Vec<IpAddr>)> {
    let server = SocketAddr::new(net.ip(1, 1), 53);
    let name = name.to_owned();
    in_netns(&net.ns("c"), move || {
        common::udp(server, &question(0x4242, &name, RecordType::A))
            .map(|(m, _)| (m.metadata.response_code, common::addrs(&m)))
    })
}

/// A running transfer: a thread sends a chunk every 20 ms on a connection from the client to
/// `to` and reads it back; it counts the bytes echoed and the longest wait for one chunk.
struct Transfer {
    /// The client's end (how the flow shows in a conntrack listing).
    local: SocketAddr,
    echoed: Arc<AtomicU64>,
    failed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    longest_gap: Arc<Mutex<Duration>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Transfer {
    fn start(net: &Net, to: SocketAddr) -> Self {
        let stream: TcpStream =
            topology::tcp_open(&net.ns("c"), to).unwrap_or_else(|| panic!("{}", net.logs()));
        // Generous: TCP retransmits back off while the address moves.
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let local = stream.local_addr().unwrap();
        let echoed = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let longest_gap = Arc::new(Mutex::new(Duration::ZERO));
        let thread = {
            let (echoed, failed, stop, gap) = (
                Arc::clone(&echoed),
                Arc::clone(&failed),
                Arc::clone(&stop),
                Arc::clone(&longest_gap),
            );
            let mut stream = stream;
            std::thread::spawn(move || {
                let chunk = [0x5au8; 4096];
                let mut back = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    let began = Instant::now();
                    if stream.write_all(&chunk).is_err() || stream.read_exact(&mut back).is_err() {
                        failed.store(true, Ordering::Relaxed);
                        return;
                    }
                    let took = began.elapsed();
                    let mut g = gap.lock().unwrap();
                    *g = (*g).max(took);
                    drop(g);
                    echoed.fetch_add(4096, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        Self {
            local,
            echoed,
            failed,
            stop,
            longest_gap,
            thread: Some(thread),
        }
    }

    fn echoed(&self) -> u64 {
        self.echoed.load(Ordering::Relaxed)
    }

    fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Whether it moves on (more bytes echoed) within `within`.
    fn moves_on(&self, within: Duration) -> bool {
        let from = self.echoed();
        let end = Instant::now() + within;
        while Instant::now() < end {
            if self.failed() {
                return false;
            }
            if self.echoed() > from + 3 * 4096 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_gateway_pair_fails_over_without_forgetting_what_it_learned() {
    if !prerequisites("gateway_ha") {
        return;
    }
    let pid = std::process::id();
    // Second octet of every address, from the process id (tests/node uses 200-249).
    let n = 150 + pid % 50;
    let prefix = format!("ha{}", pid % 100_000);
    let dir = std::env::temp_dir().join(format!("fqdnd-ha-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pins: Vec<PathBuf> = (1..=2)
        .map(|i| PathBuf::from(format!("/sys/fs/bpf/fqdnd-test-ha-{pid}-g{i}")))
        .collect();
    let net = Net {
        n,
        namespaces: ["c", "g1", "g2", "x"]
            .iter()
            .map(|w| format!("{prefix}{w}"))
            .collect(),
        prefix,
        dir: dir.clone(),
        pins: pins.clone(),
    };
    build(&net);
    let _nsd = start_nsd(&net);
    let mut etcd = EtcdCluster::start(
        "gateway-ha",
        3,
        Some(&net.ns("x")),
        &format!("10.{n}.2.100"),
    );
    let mut gws: Vec<Gw> = (1..=2)
        .map(|i| {
            let name = format!("gw-{i}");
            let config = dir.join(format!("gw{i}.yaml"));
            std::fs::write(
                &config,
                gateway_config(&net, &name, &pins[i - 1], &etcd.endpoints()),
            )
            .unwrap();
            Gw {
                name,
                ns: net.ns(&format!("g{i}")),
                config,
                admin: dir.join(format!("gw{i}.sock")),
                log: dir.join(format!("gw{i}.log")),
                proc: None,
            }
        })
        .collect();
    for gw in &mut gws {
        gw.start();
    }
    let _ka1 = start_keepalived(&net, 1, &gws[0].admin);
    let _ka2 = start_keepalived(&net, 2, &gws[1].admin);
    poll(PATIENCE, "gw-1 to hold the VIP", || {
        if holds_vip(&net, &net.ns("g1")) && !holds_vip(&net, &net.ns("g2")) {
            Ok(())
        } else {
            Err(net.logs())
        }
    });

    let port = |host| SocketAddr::new(net.ip(10, host), 8080);
    let (api, data, only1, only2, evil, late, crash) = (
        port(1),
        port(2),
        port(3),
        port(4),
        port(5),
        port(6),
        port(7),
    );
    let c = net.ns("c");
    // Nothing is reachable before DNS.
    assert!(!tcp_reaches(&c, api, DROPPED), "reached before DNS");
    // Through the active gateway: the names resolve, their addresses are reached.
    for (name, addr) in [
        ("api.example.test.", api),
        ("data.example.test.", data),
        ("only1.example.test.", only1),
    ] {
        let (code, addrs) = poll(PATIENCE, &format!("{name} through gw-1"), || {
            ask(&net, name).ok_or_else(|| net.logs())
        });
        assert_eq!((code, addrs), (ResponseCode::NoError, vec![addr.ip()]));
    }
    assert!(
        tcp_reaches(&c, api, REACHES),
        "api not reached\n{}",
        net.logs()
    );
    // The refused name: refused, and its address unreachable.
    assert_eq!(
        ask(&net, "evil.example.test.").map(|r| r.0),
        Some(ResponseCode::Refused)
    );
    assert!(!tcp_reaches(&c, evil, DROPPED));
    // The standby imports what the active learned (state lag: from the answer to the import).
    poll(PATIENCE, "gw-2 to import gw-1's three answers", || {
        let imported = gws[1].counter("imported");
        if imported >= 3 {
            Ok(())
        } else {
            Err(format!("{} imported: {}", imported, gws[1].ha()))
        }
    });
    let status = common::stdout_of(&common::fqdnd(&[
        "status",
        "--admin-socket",
        gws[1].admin.to_str().unwrap(),
    ]));
    assert!(
        status.contains(
            "HA group:       edge (publishing ok, importing ok, imported before serving: yes)"
        ),
        "{status}"
    );
    let lag_ms = gws[1].counter("import_lag_max_ms");
    let publish_lag_ms = gws[0].counter("publish_lag_max_ms");
    assert!(gws[0].counter("transactions") >= 1);
    // A burst of answers through gw-1: batched (fewer transactions than answers), imported.
    let transactions = gws[0].counter("transactions");
    let asked = burst(&net);
    let took = asked.took;
    assert_eq!(
        asked.answered,
        BURST,
        "{} asked again\n{}\n{}",
        asked.resent,
        net.udp_errors(),
        net.logs()
    );
    poll(PATIENCE, "gw-2 to import the burst", || {
        let imported = gws[1].counter("imported");
        if imported >= 3 + BURST as u64 {
            Ok(())
        } else {
            Err(format!("{} imported: {}", imported, gws[1].ha()))
        }
    });
    let burst_transactions = gws[0].counter("transactions") - transactions;
    println!(
        "after the burst: {} asked again; {}",
        asked.resent,
        net.udp_errors()
    );
    println!(
        "state lag: {BURST} answers in {:.2} s ({:.0}/s) through gw-1: {burst_transactions} transactions; publish lag max {} ms, import lag max {} ms",
        took.as_secs_f64(),
        BURST as f64 / took.as_secs_f64(),
        gws[0].counter("publish_lag_max_ms"),
        gws[1].counter("import_lag_max_ms"),
    );
    assert!(
        burst_transactions < BURST as u64,
        "one transaction per answer: {burst_transactions}"
    );
    assert!(gws[1].names().contains("only1.example.test"));
    assert_eq!(
        gws[1].counter("published"),
        0,
        "the standby learned nothing itself"
    );

    // etcd goes away: the gateways go on independently — gw-1 answers and enforces what it
    // learns (a refused name stays refused: nothing fails open) and keeps it for the group.
    etcd.stop_all();
    assert_eq!(
        ask(&net, "late.example.test."),
        Some((ResponseCode::NoError, vec![late.ip()]))
    );
    assert!(tcp_reaches(&c, late, REACHES), "{}", net.logs());
    assert_eq!(
        ask(&net, "evil.example.test.").map(|r| r.0),
        Some(ResponseCode::Refused)
    );
    assert!(!tcp_reaches(&c, evil, DROPPED));
    poll(PATIENCE, "gw-1 to keep the late answer waiting", || {
        let ha = gws[0].ha();
        if ha["publishing"] == false && ha["pending"].as_u64() == Some(1) {
            Ok(())
        } else {
            Err(ha.to_string())
        }
    });
    assert!(!gws[1].names().contains("late.example.test"));
    // etcd is back: it is written, and gw-2 reads the group again and imports it.
    etcd.start_all();
    poll(2 * PATIENCE, "gw-2 to import the late answer", || {
        if gws[1].names().contains("late.example.test") {
            Ok(())
        } else {
            Err(format!("{} / {}", gws[0].ha(), gws[1].ha()))
        }
    });

    // A transfer runs through gw-1; gw-1 dies.
    let transfer = Transfer::start(&net, data);
    assert!(
        transfer.moves_on(REACHES),
        "transfer never ran\n{}",
        net.logs()
    );
    let killed = Instant::now();
    gws[0].kill9();
    let moved = poll(2 * PATIENCE, "the VIP to move to gw-2", || {
        if holds_vip(&net, &net.ns("g2")) {
            Ok(killed.elapsed())
        } else {
            Err(net.logs())
        }
    });
    // The flow goes through gw-2 now (gw-1's kernel would still forward it: only fqdnd
    // died): the client's neighbour for the LAN VIP and the servers' for the WAN VIP are
    // gw-2's, after keepalived's gratuitous ARPs.
    let (g2, x) = (net.ns("g2"), net.ns("x"));
    poll(PATIENCE, "the VIPs' neighbours to be gw-2's", || {
        let c_neigh = ip(&["-n", &c, "neigh", "show", &net.ip(1, 1).to_string()]);
        let x_neigh = ip(&["-n", &x, "neigh", "show", &net.ip(2, 1).to_string()]);
        if c_neigh.contains(&mac(&g2, "lan")) && x_neigh.contains(&mac(&g2, "wan")) {
            Ok(())
        } else {
            Err(format!("{c_neigh} / {x_neigh}"))
        }
    });
    let survived = transfer.moves_on(Duration::from_secs(30));
    // gw-2 tracks it: an entry created mid-stream (no SYN of it went through gw-2).
    let ct = common::stdout_of(&common::fqdnd(&[
        "bpf",
        "ct",
        "list",
        "--pin-dir",
        pins[1].to_str().unwrap(),
    ]));
    let tracked = ct.contains(&transfer.local.to_string());
    let gap = *transfer.longest_gap.lock().unwrap();
    // Addresses only gw-1 learned, without new DNS: through gw-2.
    let learned_only = [api, only1, late];
    let allowed = learned_only
        .iter()
        .filter(|a| tcp_reaches(&c, **a, REACHES))
        .count();
    println!(
        "state lag: publish {publish_lag_ms} ms, import (answer to peer's import) {lag_ms} ms; longest transfer stall {:.2} s",
        gap.as_secs_f64()
    );
    println!(
        "failover: address moved in {:.2} s, transfer survived: {}, learned-only connections allowed: {allowed}/{}",
        moved.as_secs_f64(),
        if survived { "yes" } else { "no" },
        learned_only.len()
    );
    assert!(survived, "the transfer broke\n{}", net.logs());
    assert!(tracked, "gw-2 does not track {}: {ct}", transfer.local);
    assert_eq!(allowed, learned_only.len(), "{}", net.logs());
    drop(transfer);
    // The refused name stays refused through the survivor; its address stays unreachable;
    // an allowed name not asked before is still unreachable before DNS.
    assert!(holds_vip(&net, &net.ns("g2")));
    assert_eq!(
        ask(&net, "evil.example.test.").map(|r| r.0),
        Some(ResponseCode::Refused)
    );
    assert!(!tcp_reaches(&c, evil, DROPPED));
    assert!(!tcp_reaches(&c, only2, DROPPED));
    // The survivor learns a name on its own.
    assert_eq!(
        ask(&net, "only2.example.test."),
        Some((ResponseCode::NoError, vec![only2.ip()]))
    );
    assert!(tcp_reaches(&c, only2, REACHES));
    poll(PATIENCE, "gw-2 to publish only2", || {
        if gws[1].counter("published") >= 1 {
            Ok(())
        } else {
            Err(gws[1].ha().to_string())
        }
    });

    // gw-1 comes back: it imports the group's state (its own earlier answers and gw-2's)
    // before it serves.
    gws[0].start();
    let ha = gws[0].ha();
    assert_eq!(ha["initial_import_done"], true, "{ha}");
    assert!(ha["imported"].as_u64().unwrap() >= 4, "{ha}");
    // The start-up import is reported apart: the records' age is no import lag (issue 35).
    assert!(ha["startup_records"].as_u64().unwrap() >= 4, "{ha}");
    assert_eq!(ha["import_lag_ms"], 0, "{ha}");
    let names = gws[0].names();
    for name in ["api", "data", "only1", "only2"] {
        assert!(
            names.contains(&format!("{name}.example.test")),
            "{name}: {names}"
        );
    }
    assert!(!names.contains("evil.example.test"), "{names}");
    // It stays the standby (nopreempt) until gw-2 dies; then it enforces what it imported.
    assert!(holds_vip(&net, &net.ns("g2")));
    gws[1].kill9();
    poll(2 * PATIENCE, "the VIP to move back to gw-1", || {
        if holds_vip(&net, &net.ns("g1")) {
            Ok(())
        } else {
            Err(net.logs())
        }
    });
    assert!(
        tcp_reaches(&c, only2, REACHES),
        "gw-1 does not enforce what gw-2 learned\n{}",
        net.logs()
    );
    assert!(!tcp_reaches(&c, evil, DROPPED));

    // Issue 35, item 8: gw-1 (active) learns an answer while etcd is down and dies before
    // etcd is back; gw-2 takes over without it. gw-1 restarts after etcd is back: its journal
    // kept the answer, the group lacks it, so gw-1 publishes it and gw-2 enforces it.
    gws[1].start();
    etcd.stop_all();
    assert_eq!(
        ask(&net, "crash.example.test."),
        Some((ResponseCode::NoError, vec![crash.ip()]))
    );
    assert!(tcp_reaches(&c, crash, REACHES), "{}", net.logs());
    gws[0].kill9();
    poll(2 * PATIENCE, "the VIP to move to gw-2 again", || {
        if holds_vip(&net, &net.ns("g2")) {
            Ok(())
        } else {
            Err(net.logs())
        }
    });
    assert!(
        !tcp_reaches(&c, crash, DROPPED),
        "gw-2 cannot know what gw-1 learned while etcd was down"
    );
    etcd.start_all();
    gws[0].start();
    poll(
        2 * PATIENCE,
        "gw-2 to import what gw-1 published again",
        || {
            if gws[1].names().contains("crash.example.test") {
                Ok(())
            } else {
                Err(format!("{} / {}", gws[0].ha(), gws[1].ha()))
            }
        },
    );
    assert!(gws[0].counter("republished") >= 1, "{}", gws[0].ha());
    assert!(
        tcp_reaches(&c, crash, REACHES),
        "gw-2 does not enforce the answer gw-1 published again\n{}",
        net.logs()
    );
    // Issue 35, item 11: the key deleted in etcd revokes it on both gateways — gw-2 (active)
    // drops the connection it allowed.
    let out = Command::new("ip")
        .args(["netns", "exec", &net.ns("x"), "etcdctl", "--endpoints"])
        .arg(etcd.endpoints().join(","))
        .args(["del", "/ha-test-learned/edge/gw-1/lan/crash.example.test."])
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout).trim(), "1", "{}", text(&out.stderr));
    poll(
        PATIENCE,
        "both gateways to forget the revoked answer",
        || {
            if gws
                .iter()
                .any(|gw| gw.names().contains("crash.example.test"))
            {
                Err(format!("{} / {}", gws[0].ha(), gws[1].ha()))
            } else {
                Ok(())
            }
        },
    );
    assert!(!tcp_reaches(&c, crash, DROPPED), "{}", net.logs());
    assert!(gws[1].counter("revoked") >= 1);
    drop(etcd);
}

/// The documented example of one gateway of a pair loads (no root needed).
#[test]
fn the_example_gateway_configuration_loads() {
    let out = common::fqdnd(&[
        "policy",
        "check",
        &common::repo_path("examples/ha-gateway/fqdnd.yaml"),
    ]);
    assert!(out.status.success(), "{}", common::stdout_of(&out));
}
