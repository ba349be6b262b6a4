//! Host processes as endpoints, end to end: `fqdnd node` with an Endpoint naming a cgroup v2
//! directory the test creates under the hierarchy's root; client processes join it (or a
//! cgroup below it) through `cgroup.procs` and run in the topology's host namespace (the
//! "host" whose processes share its addresses), so everything stays inside the namespaces
//! the topology creates.
//!
//! A client process is this test binary run again (a process joins a cgroup as a whole: a
//! test's thread cannot), with `FQDND_CGROUP_CLIENT` naming one operation: the ignored
//! [`client_process`] entry point joins the cgroup, runs it and prints the result as JSON.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use serde_json::{Value, json};

use super::topology::Topology;
use super::{DROPPED, NODE_CAPS, REACHES, dns_to, sa, zone};
use crate::common::{
    ANSWER_WAIT, PATIENCE, addrs, documents, policy_doc, poll, question, settings_doc, text,
};

/// The operation a client process runs (set: this binary is a client process).
const CLIENT: &str = "FQDND_CGROUP_CLIENT";
/// The cgroup directory a client process joins before anything else.
const JOIN: &str = "FQDND_CGROUP_JOIN";
/// The prefix of a client process's result line.
const RESULT: &str = "cgroup-client-result: ";

/// The zone: api is allowed (and resolves to 10.N.10.1), evil is another name at another
/// address.
const ZONE: &str = "\
api 300 IN A 10.N.10.1
api 300 IN AAAA fd00:N:10::1
evil 300 IN A 10.N.10.3
evil 300 IN AAAA fd00:N:10::3
";

/// The runner endpoint's id.
const RUNNER: u16 = 7;

/// Not a test: the body of the client processes the cgroup tests start. Without
/// `FQDND_CGROUP_CLIENT` it returns at once.
#[test]
#[ignore = "the client process of the cgroup tests, which run this binary again with FQDND_CGROUP_CLIENT"]
fn client_process() {
    let Ok(op) = std::env::var(CLIENT) else {
        return;
    };
    if let Ok(dir) = std::env::var(JOIN) {
        // Before any socket: a socket stays in the cgroup it was created in.
        std::fs::write(
            Path::new(&dir).join("cgroup.procs"),
            std::process::id().to_string(),
        )
        .unwrap();
    }
    println!("{RESULT}{}", run_op(&op));
}

/// One operation (`udp-connected|udp|tcp-dns SERVER NAME QTYPE`, `connect ADDR MILLIS`,
/// `child DIR OP…`, `serve ADDR…`), its result as JSON.
fn run_op(op: &str) -> Value {
    let words: Vec<&str> = op.split_whitespace().collect();
    match words.as_slice() {
        ["serve", addrs @ ..] => {
            // TCP echo listeners, created in this process's cgroup; the result says they
            // listen, then they serve until the process is killed.
            for a in addrs {
                let listener = std::net::TcpListener::bind(a.parse::<SocketAddr>().unwrap())
                    .unwrap_or_else(|e| panic!("listening on {a}: {e}"));
                std::thread::spawn(move || super::topology::tcp_echo(&listener));
            }
            println!("{RESULT}{}", json!({ "listening": addrs }));
            std::io::stdout().flush().unwrap();
            loop {
                std::thread::park();
            }
        }
        ["child", dir, rest @ ..] => {
            // A child process of this one (so it starts in this cgroup) that moves itself into
            // `dir` before it runs `rest`.
            let out = client_command(None, &rest.join(" "), Some(Path::new(dir)))
                .output()
                .unwrap();
            result_of(&out.stdout)
        }
        ["connect", to, millis] => {
            let to: SocketAddr = to.parse().unwrap();
            let timeout = Duration::from_millis(millis.parse().unwrap());
            let reached = (|| {
                let mut c = TcpStream::connect_timeout(&to, timeout)?;
                c.set_read_timeout(Some(timeout))?;
                c.write_all(b"ping")?;
                let mut buf = [0u8; 4];
                c.read_exact(&mut buf)?;
                Ok::<_, std::io::Error>(buf == *b"ping")
            })();
            match reached {
                Ok(echoed) => json!({ "reached": echoed }),
                Err(e) => json!({
                    "reached": false,
                    "error": e.to_string(),
                    "refused": e.kind() == std::io::ErrorKind::PermissionDenied,
                }),
            }
        }
        [how, server, name, qtype] => {
            let server: SocketAddr = server.parse().unwrap();
            let q = question(0x5151, name, RecordType::from_str(qtype).unwrap());
            let got = match *how {
                "udp-connected" => udp_connected(server, &q),
                "udp" => crate::common::udp(server, &q).map(|(m, from)| (m, from, None)),
                "tcp-dns" => crate::common::tcp(server, &q).map(|(m, peer)| (m, peer, Some(peer))),
                other => panic!("unknown operation {other}"),
            };
            match got {
                Some((m, from, peer)) => json!({
                    "from": from.to_string(),
                    "peer": peer.map(|p| p.to_string()),
                    "rcode": u16::from(m.metadata.response_code),
                    "addrs": addrs(&m).iter().map(ToString::to_string).collect::<Vec<_>>(),
                }),
                None => json!({ "error": "no answer" }),
            }
        }
        _ => panic!("unknown operation {op:?}"),
    }
}

/// A stub resolver's query: a connected UDP socket (`connect`, `send`, `recv_from`). The
/// reply, where it came from, and what `getpeername` said.
fn udp_connected(
    server: SocketAddr,
    q: &Message,
) -> Option<(Message, SocketAddr, Option<SocketAddr>)> {
    let socket = UdpSocket::bind((crate::common::any_of(server), 0)).ok()?;
    socket.set_read_timeout(Some(ANSWER_WAIT)).ok()?;
    socket.connect(server).ok()?;
    let peer = socket.peer_addr().ok()?;
    socket.send(&q.to_vec().ok()?).ok()?;
    let mut buf = [0u8; 4096];
    let (n, from) = socket.recv_from(&mut buf).ok()?;
    Some((Message::from_vec(&buf[..n]).ok()?, from, Some(peer)))
}

/// This binary as a client process running `op`, in `netns` (`nsenter`: only the network
/// namespace) when given, after joining `cgroup` when given.
fn client_command(netns: Option<&str>, op: &str, cgroup: Option<&Path>) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{ns}")).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    c.args([
        "--exact",
        "cgroup::client_process",
        "--ignored",
        "--nocapture",
        "--test-threads",
        "1",
        "-q",
    ])
    .env(CLIENT, op)
    .env_remove(JOIN);
    if let Some(dir) = cgroup {
        c.env(JOIN, dir);
    }
    c
}

/// The result line of a client process's output.
fn result_of(stdout: &[u8]) -> Value {
    let out = text(stdout);
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(RESULT))
        .unwrap_or_else(|| panic!("no result from the client process:\n{out}"));
    serde_json::from_str(line).unwrap()
}

/// A cgroup v2 directory under the hierarchy's root for the test's clients, with the cgroups
/// below it; on drop, their processes are killed (`cgroup.kill`) and the directories removed.
struct TestCgroup {
    dir: PathBuf,
    /// Below the hierarchy's root, as an Endpoint names it (`/…`).
    below: String,
}

impl TestCgroup {
    fn new(test: &str) -> Self {
        let root = fqdnd_ebpf::cgroup::v2_root().unwrap();
        let below = format!("/fqdnd-e2e-{}-{test}", std::process::id());
        let dir = root.join(below.trim_start_matches('/'));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap();
        TestCgroup { dir, below }
    }

    /// A cgroup below this one, created now.
    fn nested(&self, name: &str) -> PathBuf {
        let dir = self.dir.join(name);
        std::fs::create_dir(&dir).unwrap();
        dir
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // (Kills the processes of the cgroup and every cgroup below it.)
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
        for _ in 0..100 {
            let mut dirs = vec![self.dir.clone()];
            if let Ok(entries) = std::fs::read_dir(&self.dir) {
                dirs.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
            for d in dirs.iter().rev() {
                let _ = std::fs::remove_dir(d);
            }
            if !self.dir.exists() {
                return;
            }
            #[allow(
                clippy::disallowed_methods,
                reason = "cleanup pacing: killed processes leave their cgroup asynchronously"
            )]
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The topology with the zone served, the test cgroup, and the node started from `config`.
fn setup(
    test: &str,
    config: impl FnOnce(&Topology, &TestCgroup) -> String,
) -> Option<(Topology, TestCgroup)> {
    if !super::topology::privileged(test) {
        return None;
    }
    let cgroup = TestCgroup::new(test);
    let mut t = Topology::new(test);
    t.start_dns(&zone(&t, ZONE));
    t.write_node_config(&config(&t, &cgroup));
    t.start_node(&t.config_dir());
    // Attached (for the files' cgroup endpoint) before the capabilities were dropped; an
    // endpoint added later attaches without any.
    t.expect_caps(NODE_CAPS);
    Some((t, cgroup))
}

/// The node's documents: the Node (with `node_extra` spec lines), the runner endpoint of
/// `cgroup` when given, and the policy of `app: runner`: DNS to the resolver for
/// api.example.test only, then api's addresses on TCP 8080.
fn config(t: &Topology, cgroup: Option<&str>, node_extra: &str) -> String {
    config_with_ingress(t, cgroup, node_extra, "")
}

/// [`config`] with `ingress` (the policy's `ingress:` section, if any) added to the runner's
/// policy.
fn config_with_ingress(
    t: &Topology,
    cgroup: Option<&str>,
    node_extra: &str,
    ingress: &str,
) -> String {
    let n = t.n;
    let resolver = format!("10.{n}.9.53/32, \"fd00:{n}:9::53/128\"");
    let egress = format!(
        "{}  - toFQDNs:\n    - matchName: api.example.test\n    toPorts:\n    - ports: [{{port: \"8080\", protocol: TCP}}]\n{ingress}",
        dns_to(&resolver, "{matchName: api.example.test}")
    );
    let node = format!(
        "apiVersion: fqdnd.io/v1\nkind: Node\nspec:\n  pinDir: {}\n  upstreamTimeout: 2s\n{node_extra}",
        t.pin_dir.display()
    );
    let runner = cgroup.map(|c| {
        format!(
            "apiVersion: fqdnd.io/v1\nkind: Endpoint\nmetadata: {{name: runner}}\nspec:\n  id: {RUNNER}\n  cgroup: {c}\n  labels: {{app: runner}}\n"
        )
    });
    let policy = policy_doc(
        "CiliumNetworkPolicy",
        "runner-egress",
        "app: runner",
        &egress,
    );
    let settings = settings_doc("  gcInterval: 1s\n");
    let mut docs = vec![node.as_str(), settings.as_str(), policy.as_str()];
    if let Some(r) = &runner {
        docs.push(r);
    }
    documents(&docs)
}

/// Runs `op` in a client process in the host namespace, in `cgroup` (none: the test's own).
fn client(t: &Topology, cgroup: Option<&Path>, op: &str) -> Value {
    let out = client_command(Some(&t.host), op, cgroup).output().unwrap();
    assert!(
        out.status.success(),
        "client {op:?} failed: {}{}\n{}",
        text(&out.stdout),
        text(&out.stderr),
        t.logs()
    );
    result_of(&out.stdout)
}

/// A DNS exchange of a client process: `how` is `udp-connected`, `udp` or `tcp-dns`.
fn ask(
    t: &Topology,
    cgroup: Option<&Path>,
    how: &str,
    server: SocketAddr,
    name: &str,
    qtype: &str,
) -> Value {
    let r = client(t, cgroup, &format!("{how} {server} {name} {qtype}"));
    assert!(
        r.get("error").is_none(),
        "{how} {name} {qtype}: {r}\n{}",
        t.logs()
    );
    r
}

/// Whether a client process (in `cgroup`) gets a TCP echo from `to` within `timeout`.
fn reaches(t: &Topology, cgroup: Option<&Path>, to: SocketAddr, timeout: Duration) -> bool {
    client(t, cgroup, &format!("connect {to} {}", timeout.as_millis()))["reached"] == json!(true)
}

/// The response code a client process in `cgroup` gets for evil.example.test (A) from the
/// resolver, over `how`.
fn evil_rcode(t: &Topology, cgroup: Option<&Path>, how: &str) -> Value {
    let resolver = sa(t.v4(9, 53), 53);
    ask(t, cgroup, how, resolver, "evil.example.test.", "A")["rcode"].clone()
}

/// The latest drop `fqdnd monitor` shows, once it is the runner's (JSON).
fn runner_drop(t: &Topology) -> Value {
    poll(PATIENCE, "a drop of the runner in `fqdnd monitor`", || {
        let out = t.admin_cli(&["monitor", "--count", "1", "--json", "--recent"]);
        let drop: Value = serde_json::from_str(out.lines().next().unwrap_or("{}")).unwrap();
        if drop["endpoint"] == json!(RUNNER) {
            Ok(drop)
        } else {
            Err(out)
        }
    })
}

/// A response code as the client's JSON has it.
fn rcode(code: ResponseCode) -> Value {
    json!(u16::from(code))
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn host_processes_of_a_cgroup_are_an_endpoint() {
    let Some((t, cgroup)) = setup("cgroup", |t, c| config(t, Some(&c.below), "")) else {
        return;
    };
    let inside = Some(cgroup.dir.as_path());
    for v6 in [false, true] {
        let ip = |net, host| if v6 { t.v6(net, host) } else { t.v4(net, host) };
        let qtype = if v6 { "AAAA" } else { "A" };
        let resolver = sa(ip(9, 53), 53);
        let (api, evil) = (sa(ip(10, 1), 8080), sa(ip(10, 3), 8080));

        // Before DNS: the endpoint reaches nothing.
        assert!(
            !reaches(&t, inside, api, DROPPED),
            "v6={v6}: reached before DNS\n{}",
            t.logs()
        );

        // DNS over a connected UDP socket, an unconnected one and TCP: through the proxy, the
        // answer from the resolver's address (getpeername says the resolver too).
        for how in ["udp-connected", "udp", "tcp-dns"] {
            let r = ask(&t, inside, how, resolver, "api.example.test.", qtype);
            assert_eq!(
                r["rcode"],
                rcode(ResponseCode::NoError),
                "v6={v6} {how}: {r}"
            );
            assert_eq!(
                strs(&r["addrs"]),
                vec![ip(10, 1).to_string()],
                "v6={v6} {how}"
            );
            assert_eq!(
                r["from"],
                resolver.to_string(),
                "v6={v6} {how}: reply from elsewhere"
            );
            if how != "udp" {
                assert_eq!(
                    r["peer"],
                    resolver.to_string(),
                    "v6={v6} {how}: getpeername"
                );
            }
            // A name the endpoint may not ask: the proxy refuses it, still as the resolver.
            let r = ask(&t, inside, how, resolver, "evil.example.test.", qtype);
            assert_eq!(
                r["rcode"],
                rcode(ResponseCode::Refused),
                "v6={v6} {how}: {r}"
            );
            assert_eq!(r["from"], resolver.to_string(), "v6={v6} {how}");
        }

        // The answer opened api's address, on the allowed port only; evil's stays closed.
        assert!(
            reaches(&t, inside, api, REACHES),
            "v6={v6}: api dropped\n{}",
            t.logs()
        );
        assert!(
            !reaches(&t, inside, sa(ip(10, 1), 9090), DROPPED),
            "v6={v6}: another port reached"
        );
        assert!(!reaches(&t, inside, evil, DROPPED), "v6={v6}: evil reached");
        // Refused at `connect` (EPERM), not left to time out: given all the patience an
        // allowed connection gets, the client still reports a refusal.
        let r = client(
            &t,
            inside,
            &format!("connect {evil} {}", REACHES.as_millis()),
        );
        assert_eq!(r["refused"], json!(true), "v6={v6}: {r}");

        // A process outside the cgroup: its DNS goes straight to the resolver (which answers
        // any name), and it reaches what it likes.
        let r = ask(
            &t,
            None,
            "udp-connected",
            resolver,
            "evil.example.test.",
            qtype,
        );
        assert_eq!(r["rcode"], rcode(ResponseCode::NoError), "v6={v6}: {r}");
        assert_eq!(strs(&r["addrs"]), vec![ip(10, 3).to_string()]);
        assert!(
            reaches(&t, None, evil, REACHES),
            "v6={v6}: outside process dropped\n{}",
            t.logs()
        );
    }

    // An IPv6 socket asking the resolver's v4-mapped address — connected, unconnected
    // (`sendto`, as Java's DatagramSocket and Netty's resolver do), and TCP: the answer comes
    // from the mapped resolver, as the socket wrote it, not from the proxy.
    let v4_mapped = |ip: std::net::IpAddr| match ip {
        std::net::IpAddr::V4(a) => std::net::IpAddr::V6(a.to_ipv6_mapped()),
        v6 => v6,
    };
    let mapped = SocketAddr::new(v4_mapped(t.v4(9, 53)), 53);
    for how in ["udp-connected", "udp", "tcp-dns"] {
        let r = ask(&t, inside, how, mapped, "api.example.test.", "A");
        assert_eq!(
            r["rcode"],
            rcode(ResponseCode::NoError),
            "mapped {how}: {r}"
        );
        assert_eq!(
            r["from"],
            mapped.to_string(),
            "mapped {how}: reply from elsewhere"
        );
        if how != "udp" {
            assert_eq!(r["peer"], mapped.to_string(), "mapped {how}: getpeername");
        }
    }
    let mapped_evil = SocketAddr::new(v4_mapped(t.v4(10, 3)), 8080);
    let r = client(
        &t,
        inside,
        &format!("connect {mapped_evil} {}", REACHES.as_millis()),
    );
    assert_eq!(r["refused"], json!(true), "mapped: {r}");

    // The proxy attributed the answers to the runner endpoint (learned for it; the cache
    // lists endpoints by name or id as text).
    let cache = t.admin_json(&["cache", "list"]);
    let rows = cache.as_array().unwrap();
    assert!(
        rows.iter()
            .any(|r| r["fqdn"] == "api.example.test." && r["endpoint"] == json!(RUNNER.to_string())),
        "{cache}"
    );
    assert!(
        !rows.iter().any(|r| r["fqdn"] == "evil.example.test."),
        "the outside process's answer was learned: {cache}"
    );

    // A child process forked into a cgroup created below the endpoint's now: covered.
    let nested = cgroup.nested("jobs");
    let child = |op: &str| client(&t, inside, &format!("child {} {op}", nested.display()));
    let resolver = sa(t.v4(9, 53), 53);
    let r = child(&format!("udp-connected {resolver} api.example.test. A"));
    assert_eq!(r["from"], resolver.to_string(), "{r}");
    assert_eq!(strs(&r["addrs"]), vec![t.v4(10, 1).to_string()], "{r}");
    let r = child(&format!("udp {resolver} evil.example.test. A"));
    assert_eq!(r["rcode"], rcode(ResponseCode::Refused), "{r}");
    let r = child(&format!(
        "connect {} {}",
        sa(t.v4(10, 3), 8080),
        DROPPED.as_millis()
    ));
    assert_eq!(r["reached"], json!(false), "{r}");
    let r = child(&format!(
        "connect {} {}",
        sa(t.v4(10, 1), 8080),
        REACHES.as_millis()
    ));
    assert_eq!(r["reached"], json!(true), "{r}\n{}", t.logs());

    // The drops name the endpoint, seen at the socket.
    let drops = runner_drop(&t);
    assert_eq!(drops["endpoint_name"], "runner", "{drops}");
    assert_eq!(drops["seen"], "socket", "{drops}");

    // The listing shows the cgroup and its id.
    let rows = t.admin_json(&["endpoint", "list"]);
    let runner = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == json!(RUNNER))
        .unwrap_or_else(|| panic!("{rows}"));
    assert_eq!(runner["cgroup"], cgroup.below.as_str());
    let id = fqdnd_ebpf::cgroup::cgroup_id(&cgroup.dir).unwrap();
    assert_eq!(runner["cgroup_id"], json!(id));
    let bpf = t.bpf_list("endpoint");
    assert!(
        bpf.contains(&format!("cgroup {id} → endpoint {RUNNER}")),
        "{bpf}"
    );
}

#[test]
fn cgroup_endpoints_added_at_run_time_persist_and_go() {
    let state = |t: &Topology| format!("  stateDir: {}\n", t.dir.join("state").display());
    let Some((mut t, cgroup)) = setup("cgroupcli", |t, _| config(t, None, &state(t))) else {
        return;
    };
    let inside = Some(cgroup.dir.as_path());
    let resolver = sa(t.v4(9, 53), 53);
    let evil = sa(t.v4(10, 3), 8080);
    let add = [
        "endpoint",
        "add",
        "--id",
        "8",
        "--name",
        "added",
        "--cgroup",
        &cgroup.below,
        "--label",
        "app=runner",
    ];
    let admin = t.admin();
    let try_cli = |t: &Topology, args: &[&str]| {
        let mut args = args.to_vec();
        args.extend(["--admin-socket", admin.to_str().unwrap()]);
        t.cli_in(&t.host, &args)
    };
    // No cgroup endpoint at start-up and no `hostProcesses`: the socket programs were not
    // attached, and the node (without capabilities by now) cannot attach them: refused, with
    // the way out. The cgroup's processes are left alone.
    assert!(!t.pin_dir.join("cgroup").exists());
    let refused = try_cli(&t, &add);
    assert!(!refused.status.success());
    let why = text(&refused.stderr);
    assert!(why.contains("hostProcesses: true"), "{why}");
    // Each cause once (it said "`bpf_link_create` failed: `bpf_link_create` failed").
    assert!(why.contains("`bpf_link_create` failed"), "{why}");
    crate::common::assert_each_cause_once(&why);
    assert!(reaches(&t, inside, evil, REACHES), "{}", t.logs());

    // With `hostProcesses: true` the programs are attached at start-up, doing nothing yet.
    t.write_node_config(&config(
        &t,
        None,
        &format!("{}  hostProcesses: true\n", state(&t)),
    ));
    t.kill_node();
    t.start_node(&t.config_dir());
    t.expect_caps(NODE_CAPS);
    assert!(t.pin_dir.join("cgroup").exists(), "{}", t.logs());
    assert!(reaches(&t, inside, evil, REACHES), "{}", t.logs());

    // Added through the CLI (the node holds no capability by now).
    let out = t.admin_cli(&add);
    assert!(out.contains(&format!("cgroup:{}", cgroup.below)), "{out}");
    assert_eq!(
        evil_rcode(&t, inside, "udp-connected"),
        rcode(ResponseCode::Refused),
        "\n{}",
        t.logs()
    );
    assert!(!reaches(&t, inside, evil, DROPPED));
    let r = ask(&t, inside, "tcp-dns", resolver, "api.example.test.", "A");
    assert_eq!(r["rcode"], rcode(ResponseCode::NoError), "{r}");
    assert!(
        reaches(&t, inside, sa(t.v4(10, 1), 8080), REACHES),
        "{}",
        t.logs()
    );

    // The listing: the endpoint's identity is `-` (host processes share the host's
    // addresses), its labels sorted.
    let list = t.admin_cli(&["endpoint", "list"]);
    let header = list.lines().next().unwrap_or_default();
    assert!(header.contains(" IDENTITY "), "{list}");
    let row = list.lines().find(|l| l.contains("added")).unwrap_or("");
    assert!(
        row.contains("k8s:app=runner,k8s:io.kubernetes.pod.namespace=default"),
        "{list}"
    );

    // Paths that can never match are refused, each saying what to write (exit 1); nothing is
    // added.
    let root = fqdnd_ebpf::cgroup::v2_root().unwrap();
    let v1_mount = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.contains(" - cgroup cgroup "))
        .and_then(|l| l.split(' ').nth(4).map(str::to_owned));
    let mut never = vec![
        (
            format!("{}/x", root.display()),
            "the path of the cgroup v2 mount".to_owned(),
        ),
        (
            format!("{}/cgroup.procs", cgroup.below),
            "is a file, not a cgroup directory".to_owned(),
        ),
        ("/".to_owned(), "the root cgroup".to_owned()),
    ];
    if let Some(v1) = &v1_mount {
        // (a hybrid host, as this one: v1 controllers mounted beside v2)
        never.push((
            format!("{v1}/x"),
            "this is a cgroup v1 hierarchy".to_owned(),
        ));
    }
    for (path, why) in &never {
        let refused = try_cli(
            &t,
            &[
                "endpoint", "add", "--id", "11", "--name", "never", "--cgroup", path,
            ],
        );
        let stderr = text(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{path}: {stderr}");
        assert!(stderr.contains(why.as_str()), "{path}: {stderr}");
        crate::common::assert_each_cause_once(&stderr);
    }
    assert!(
        !t.admin_cli(&["endpoint", "list"]).contains("never"),
        "a refused endpoint was added"
    );

    // A cgroup that does not exist yet: the endpoint is added (the command says it waits,
    // the listing shows `waiting`), its cgroup matched once the directory appears, and again
    // (a new id) when it is removed and created again, as a restarted systemd unit's is.
    let later = TestCgroup::new("cgroupcli2");
    std::fs::remove_dir(&later.dir).unwrap();
    let added = try_cli(
        &t,
        &[
            "endpoint",
            "add",
            "--id",
            "10",
            "--name",
            "later",
            "--cgroup",
            &later.below,
            "--label",
            "app=runner",
        ],
    );
    assert!(added.status.success(), "{}", text(&added.stderr));
    let says = text(&added.stderr);
    assert!(
        says.contains("endpoint 10 waits for its cgroup")
            && says.contains(&later.dir.display().to_string()),
        "{says}"
    );
    let waiting_row = |t: &Topology| {
        t.admin_cli(&["endpoint", "list"])
            .lines()
            .find(|l| l.contains("later"))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(waiting_row(&t).contains(" waiting "), "{}", waiting_row(&t));
    let cgroup_id = |t: &Topology| {
        let rows = t.admin_json(&["endpoint", "list"]);
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == json!(10))
            .and_then(|r| r["cgroup_id"].as_u64())
    };
    assert_eq!(cgroup_id(&t), None);
    let row = t
        .admin_json(&["endpoint", "list"])
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == json!(10))
        .cloned()
        .unwrap();
    assert_eq!(
        (&row["waiting"], &row["enforcing"]),
        (&json!(true), &json!(false)),
        "{row}"
    );
    for round in 0..2 {
        std::fs::create_dir(&later.dir).unwrap();
        let id = fqdnd_ebpf::cgroup::cgroup_id(&later.dir).unwrap();
        poll(PATIENCE, "the new cgroup's id in the endpoint list", || {
            if cgroup_id(&t) == Some(id) {
                Ok(())
            } else {
                Err(format!("{:?}", cgroup_id(&t)))
            }
        });
        assert!(waiting_row(&t).contains(" true "), "{}", waiting_row(&t));
        assert_eq!(
            evil_rcode(&t, Some(&later.dir), "udp"),
            rcode(ResponseCode::Refused),
            "round {round}"
        );
        // (the client process is gone; its cgroup empties as it is released)
        poll(PATIENCE, "the cgroup removed", || {
            std::fs::remove_dir(&later.dir)
        });
    }
    t.admin_cli(&["endpoint", "remove", "10"]);

    // A systemd unit on a host without systemd: refused with the reason.
    let refused = try_cli(
        &t,
        &[
            "endpoint",
            "add",
            "--id",
            "9",
            "--name",
            "unit",
            "--unit",
            "ci-runner.service",
        ],
    );
    assert!(!refused.status.success());
    let why = text(&refused.stderr);
    assert!(why.contains("systemd does not run on this host"), "{why}");

    // Persisted: after a restart the endpoint is back, in force.
    t.kill_node();
    t.start_node(&t.config_dir());
    t.expect_caps(NODE_CAPS);
    let list = t.admin_cli(&["endpoint", "list"]);
    assert!(
        list.lines()
            .any(|l| l.contains("added") && l.contains("api")),
        "{list}"
    );
    assert_eq!(
        evil_rcode(&t, inside, "udp"),
        rcode(ResponseCode::Refused),
        "\n{}",
        t.logs()
    );

    // Removed: its entry goes (the programs stay attached, for the next one), and the
    // processes are left alone again.
    t.admin_cli(&["endpoint", "remove", "8"]);
    let bpf = t.bpf_list("endpoint");
    assert!(!bpf.contains("cgroup "), "{bpf}");
    assert_eq!(evil_rcode(&t, inside, "udp"), rcode(ResponseCode::NoError));
    assert!(reaches(&t, inside, evil, REACHES), "{}", t.logs());
    assert!(t.pin_dir.join("cgroup").exists());

    // A start without cgroup endpoints and without `hostProcesses` detaches what an earlier
    // run left attached.
    t.write_node_config(&config(&t, None, &state(&t)));
    t.kill_node();
    t.start_node(&t.config_dir());
    assert!(!t.pin_dir.join("cgroup").exists(), "{}", t.logs());
}

/// Ingress policy on host processes: the socket ingress program checks what reaches an
/// endpoint's listeners against its ingress rules (here `fromEntities: [world]` on one port),
/// while the endpoint's own flows and its DNS through the proxy (answers from loopback) go on.
#[test]
fn ingress_policy_of_a_cgroup_endpoint_is_enforced_at_its_sockets() {
    let ingress = "  ingress:\n  - fromEntities: [world]\n    toPorts:\n    - ports: [{port: \"9101\", protocol: TCP}]\n";
    let Some((t, cgroup)) = setup("cgroupin", |t, c| {
        config_with_ingress(t, Some(&c.below), "", ingress)
    }) else {
        return;
    };
    let inside = Some(cgroup.dir.as_path());
    let id = fqdnd_ebpf::cgroup::cgroup_id(&cgroup.dir).unwrap();
    let bpf = t.bpf_list("endpoint");
    let line = bpf
        .lines()
        .find(|l| l.contains(&format!("cgroup {id} → endpoint {RUNNER}")))
        .unwrap_or_else(|| panic!("{bpf}"));
    assert!(
        line.contains("enforce-ingress") && line.contains("enforce-egress"),
        "{line}"
    );

    // The runner's listeners on the host's address towards the external host (created in
    // its cgroup by a client process that serves until the cgroup is killed).
    let (allowed, other) = (sa(t.v4(9, 1), 9101), sa(t.v4(9, 1), 9102));
    let mut server = client_command(Some(&t.host), &format!("serve {allowed} {other}"), inside)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(server.stdout.take().unwrap()));
    let listening = lines
        .find_map(|l| l.ok()?.strip_prefix(RESULT).map(str::to_owned))
        .expect("the server's listeners");
    assert!(listening.contains("listening"), "{listening}");

    // The world (the external host) reaches the allowed port only; the host itself (a process
    // outside the cgroup, with the host identity) is no world.
    assert!(
        super::topology::tcp_reaches(&t.ext, allowed, REACHES),
        "the world dropped on the allowed port\n{}",
        t.logs()
    );
    assert!(
        !super::topology::tcp_reaches(&t.ext, other, DROPPED),
        "the world reached another port"
    );
    assert!(!reaches(&t, None, allowed, DROPPED), "the host reached it");
    let drops = runner_drop(&t);
    assert_eq!(drops["seen"], "socket", "{drops}");

    // Under ingress policy, the runner's DNS (the proxy's answers come from loopback) and
    // the replies in its own flows pass.
    let resolver = sa(t.v4(9, 53), 53);
    for how in ["udp-connected", "tcp-dns"] {
        let r = ask(&t, inside, how, resolver, "api.example.test.", "A");
        assert_eq!(r["rcode"], rcode(ResponseCode::NoError), "{how}: {r}");
    }
    assert!(
        reaches(&t, inside, sa(t.v4(10, 1), 8080), REACHES),
        "{}",
        t.logs()
    );
    let _ = server.kill();
    let _ = server.wait();
}

/// A node's recording of host processes' DNS: every query and reply, refused ones included,
/// names the endpoint of the processes' cgroup as the kernel named it for their socket (they
/// all come from the host's loopback address), so `fqdnd replay --endpoints` attributes them
/// to it (issue 36, items 8 and 10).
#[test]
fn a_recording_names_host_processes_endpoint_and_replay_attributes_them() {
    let Some((t, cgroup)) = setup("cgrouprec", |t, c| config(t, Some(&c.below), "")) else {
        return;
    };
    let inside = Some(cgroup.dir.as_path());
    let resolver = sa(t.v4(9, 53), 53);
    let rec = t.dir.join("rec");
    t.admin_cli(&["record", "start", "--dir", rec.to_str().unwrap()]);
    for how in ["udp-connected", "tcp-dns"] {
        let r = ask(&t, inside, how, resolver, "api.example.test.", "A");
        assert_eq!(r["rcode"], rcode(ResponseCode::NoError), "{how}: {r}");
    }
    assert_eq!(
        evil_rcode(&t, inside, "udp-connected"),
        rcode(ResponseCode::Refused)
    );
    t.admin_cli(&["record", "stop"]);
    let files: Vec<PathBuf> = std::fs::read_dir(&rec)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = files[0].to_str().unwrap();

    // Each message names the runner, by socket, from the loopback address.
    let mut seen = Vec::new();
    let (_, error) = fqdnd_replay::extract_bytes(&std::fs::read(file).unwrap(), &[53], &mut |p| {
        let note = p.note.unwrap();
        let client = if note.way == fqdnd_replay::record::Way::Query {
            p.src
        } else {
            p.dst
        };
        assert!(client.ip().is_loopback(), "{p:?}");
        assert_eq!(
            (note.endpoint, note.by_socket),
            (Some(RUNNER), true),
            "{p:?}"
        );
        seen.push((p.transport, note.verdict.to_owned()));
    });
    assert!(error.is_none(), "{error:?}");
    let udp = fqdnd_replay::Transport::Udp;
    let tcp = fqdnd_replay::Transport::Tcp;
    assert_eq!(
        seen,
        [
            (udp, "allow".to_owned()),
            (udp, "answered".to_owned()),
            (tcp, "allow".to_owned()),
            (tcp, "answered".to_owned()),
            (udp, "deny".to_owned()),
            (udp, "denied".to_owned()),
        ]
    );

    // The preview of the node's policy (api only) against one that lets the runner ask
    // anything: evil is newly refused, for the runner.
    let n = t.n;
    let baseline = t.dir.join("baseline.yaml");
    let anything = dns_to(
        &format!("10.{n}.9.53/32, \"fd00:{n}:9::53/128\""),
        "{matchPattern: \"*\"}",
    );
    std::fs::write(
        &baseline,
        policy_doc(
            "CiliumNetworkPolicy",
            "runner-egress",
            "app: runner",
            &anything,
        ),
    )
    .unwrap();
    let node = t.config_dir().join("node.yaml");
    let node = node.to_str().unwrap();
    let out = crate::common::fqdnd(&[
        "replay",
        file,
        "--policy",
        node,
        "--baseline",
        baseline.to_str().unwrap(),
        "--endpoints",
        node,
        "--json",
    ]);
    let report = crate::common::json_of(&out);
    assert_eq!(report["baseline"]["queries_unknown_client"], 0, "{report}");
    assert_eq!(report["policy"]["queries_allowed"], 2, "{report}");
    assert_eq!(report["policy"]["queries_refused"], 1, "{report}");
    let runner = &report["endpoints"][0];
    assert_eq!(runner["endpoint"], json!(RUNNER), "{report}");
    assert_eq!(runner["name"], "runner", "{report}");
    assert_eq!(
        runner["names_now_refused"],
        json!(["evil.example.test."]),
        "{report}"
    );
}
