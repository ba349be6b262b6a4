//! `fqdnd gateway` end to end: the binary as a user runs it, a static-zone upstream on
//! loopback, real UDP/TCP clients, the admin API, metrics and hot reload.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "the test waits for a real process"
)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

/// A gateway process, killed when dropped (also when the test fails).
struct Gateway {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    dns: SocketAddr,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fqdnd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fqdnd"))
        .args(args)
        .output()
        .unwrap()
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

const ZONE: &str = "$TTL 300
@ IN SOA ns.corp.test. admin.corp.test. 1 3600 600 86400 60
@ IN NS ns.corp.test.
ns IN A 127.0.0.53
www IN A 192.0.2.10
www IN A 192.0.2.11
app IN CNAME edge.cdn.corp.test.
edge.cdn 30 IN A 198.51.100.5
secret IN A 203.0.113.9
";

fn policy(allowed: &str) -> String {
    format!(
        "apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {{name: lan}}
spec:
  endpointSelector: {{matchLabels: {{site: lan}}}}
  egress:
  - toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns: [{allowed}]
  - toFQDNs: [{{matchPattern: \"*.corp.test\"}}]
    toPorts: [{{ports: [{{port: \"443\", protocol: TCP}}]}}]
"
    )
}

fn start(allowed: &str) -> Gateway {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("fqdnd-gw-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("corp.zone"), ZONE).unwrap();
    let metrics = free_tcp_port();
    std::fs::write(
        dir.join("gateway.yaml"),
        format!(
            "apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: [\"127.0.0.1:0\"]
  staticZones: [{{origin: corp.test, file: corp.zone}}]
  metrics: 127.0.0.1:{metrics}
  queryLog: queries.jsonl
  lists: {{denyNames: [\"secret.corp.test\"]}}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {{name: lan}}
spec: {{id: 7, addresses: [\"127.0.0.0/8\"], labels: {{site: lan}}}}
"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("policy.yaml"), policy(allowed)).unwrap();
    let socket = dir.join("admin.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_fqdnd"))
        .args(["gateway", "--config"])
        .arg(dir.join("gateway.yaml"))
        .arg("--config")
        .arg(dir.join("policy.yaml"))
        .arg("--admin-socket")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut gw = Gateway {
        child,
        dir,
        socket,
        dns: "127.0.0.1:1".parse().unwrap(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = fqdnd(&[
            "status",
            "--json",
            "--admin-socket",
            gw.socket.to_str().unwrap(),
        ]);
        if out.status.success() {
            let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            gw.dns = status["listen"][0].as_str().unwrap().parse().unwrap();
            break;
        }
        assert!(
            gw.child.try_wait().unwrap().is_none(),
            "fqdnd gateway exited"
        );
        assert!(
            Instant::now() < deadline,
            "gateway did not come up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(gw.dir.join("metrics.port"), metrics.to_string()).unwrap();
    gw
}

fn query(name: &str, qtype: RecordType, edns: bool) -> Message {
    let mut q = Message::new(0x1234, MessageType::Query, OpCode::Query);
    q.metadata.recursion_desired = true;
    q.queries
        .push(Query::query(Name::from_ascii(name).unwrap(), qtype));
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        e.set_dnssec_ok(true);
        q.edns = Some(e);
    }
    q
}

fn udp(server: SocketAddr, msg: &Message) -> Message {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    socket.send_to(&msg.to_vec().unwrap(), server).unwrap();
    let mut buf = [0u8; 4096];
    let (n, from) = socket.recv_from(&mut buf).unwrap();
    assert_eq!(from, server, "the reply comes from the address asked");
    Message::from_vec(&buf[..n]).unwrap()
}

fn tcp(server: SocketAddr, msg: &Message) -> Message {
    let mut stream = TcpStream::connect(server).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let bytes = msg.to_vec().unwrap();
    stream
        .write_all(&(bytes.len() as u16).to_be_bytes())
        .unwrap();
    stream.write_all(&bytes).unwrap();
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).unwrap();
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut buf).unwrap();
    Message::from_vec(&buf).unwrap()
}

fn addrs(msg: &Message) -> Vec<String> {
    msg.answers
        .iter()
        .filter_map(|rr| match &rr.data {
            RData::A(a) => Some(a.0.to_string()),
            _ => None,
        })
        .collect()
}

fn list(gw: &Gateway, what: &[&str]) -> serde_json::Value {
    let mut args = what.to_vec();
    args.extend(["--json", "--admin-socket", gw.socket.to_str().unwrap()]);
    let out = fqdnd(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn allowed_refused_nxdomain_cname_tcp_edns_and_listings() {
    let gw = start("{matchPattern: \"*.corp.test\"}, {matchPattern: \"**.cdn.corp.test\"}");
    let www = udp(gw.dns, &query("www.corp.test.", RecordType::A, false));
    assert_eq!(www.metadata.response_code, ResponseCode::NoError);
    assert_eq!(www.metadata.id, 0x1234);
    let mut got = addrs(&www);
    got.sort();
    assert_eq!(got, vec!["192.0.2.10", "192.0.2.11"]);

    // Not allowed by the DNS rules, and a deny-listed name: REFUSED.
    assert_eq!(
        udp(gw.dns, &query("corp.test.", RecordType::A, false))
            .metadata
            .response_code,
        ResponseCode::Refused
    );
    assert_eq!(
        udp(gw.dns, &query("secret.corp.test.", RecordType::A, false))
            .metadata
            .response_code,
        ResponseCode::Refused
    );
    // NXDOMAIN passes through.
    assert_eq!(
        udp(gw.dns, &query("nope.corp.test.", RecordType::A, false))
            .metadata
            .response_code,
        ResponseCode::NXDomain
    );
    // CNAME chain, over TCP.
    let app = tcp(gw.dns, &query("app.corp.test.", RecordType::A, false));
    assert_eq!(addrs(&app), vec!["198.51.100.5"]);
    // EDNS0 and the DO bit come back.
    let edns = udp(gw.dns, &query("www.corp.test.", RecordType::A, true));
    assert!(edns.edns.is_some(), "the OPT record passes through");

    // What the answers taught.
    let identities = list(&gw, &["identity", "list"]);
    let fqdn = identities
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["labels"]
                .as_array()
                .unwrap()
                .iter()
                .any(|l| l == "fqdn:*.corp.test.")
                && r["labels"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|l| l == "reserved:world-ipv4")
        })
        .expect("the *.corp.test identity");
    // 192.0.2.10, .11 and 198.51.100.5 share it, plus the pre-allocation reference.
    assert_eq!(fqdn["refs"], 4, "{identities}");
    let ipcache = list(&gw, &["ipcache", "list"]);
    let prefixes: Vec<&str> = ipcache
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["prefix"].as_str().unwrap())
        .collect();
    for p in ["192.0.2.10/32", "192.0.2.11/32", "198.51.100.5/32"] {
        assert!(prefixes.contains(&p), "{ipcache}");
    }
    assert!(
        !prefixes.contains(&"203.0.113.9/32"),
        "a refused name teaches nothing"
    );
    let cache = list(&gw, &["cache", "list"]);
    let www_row = cache
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["fqdn"] == "www.corp.test.")
        .expect("www in the cache");
    assert_eq!(www_row["endpoint"], "7");
    assert_eq!(www_row["source"], "lookup");

    // Metrics.
    let port = std::fs::read_to_string(gw.dir.join("metrics.port")).unwrap();
    let mut http = TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    http.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    http.read_to_string(&mut text).unwrap();
    assert!(text.contains("fqdnd_dns_queries_total"), "{text}");

    // The query log has a line per query.
    let log = std::fs::read_to_string(gw.dir.join("queries.jsonl")).unwrap_or_default();
    assert!(log.lines().count() >= 6, "{log}");
    let status = list(&gw, &["status"]);
    assert!(status["cache_names"].as_u64().unwrap() >= 2, "{status}");
}

#[test]
fn hot_reload_keeps_the_old_policy_when_the_new_one_is_broken() {
    let gw = start("{matchPattern: \"*.corp.test\"}");
    let socket = gw.socket.to_str().unwrap().to_owned();
    assert_eq!(
        udp(gw.dns, &query("www.corp.test.", RecordType::A, false))
            .metadata
            .response_code,
        ResponseCode::NoError
    );

    // A broken file: rejected with its errors, the old policy stays.
    std::fs::write(
        gw.dir.join("policy.yaml"),
        policy("{matchPattern: \"*.cor!p.test\"}"),
    )
    .unwrap();
    let out = fqdnd(&["policy", "reload", "--admin-socket", &socket]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("policy.yaml:") && stdout.contains("invalid character '!'"),
        "{stdout}"
    );
    assert_eq!(
        udp(gw.dns, &query("www.corp.test.", RecordType::A, false))
            .metadata
            .response_code,
        ResponseCode::NoError
    );

    // SIGHUP with a good file that allows only app.corp.test.
    std::fs::write(
        gw.dir.join("policy.yaml"),
        policy("{matchName: \"app.corp.test\"}"),
    )
    .unwrap();
    let pid = gw.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rcode = udp(gw.dns, &query("www.corp.test.", RecordType::A, false))
            .metadata
            .response_code;
        if rcode == ResponseCode::Refused {
            break;
        }
        assert!(Instant::now() < deadline, "the reload did not take effect");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        udp(gw.dns, &query("app.corp.test.", RecordType::A, false))
            .metadata
            .response_code,
        ResponseCode::NoError
    );
    let status = list(&gw, &["status"]);
    assert_eq!(status["reloads"]["failed"], 1, "{status}");
}

#[test]
fn a_gateway_needs_a_gateway_document() {
    let dir = std::env::temp_dir().join(format!("fqdnd-gw-none-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("p.yaml");
    std::fs::write(&file, policy("{matchPattern: \"*\"}")).unwrap();
    let out = fqdnd(&["gateway", "--config", file.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(Path::new(&dir));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no `kind: Gateway` document"));
}

#[test]
fn the_demo_runs_with_no_network() {
    let out = fqdnd(&["gateway", "--demo"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("www.example.test.")
            && text.contains("NOERROR")
            && text.contains("192.0.2.10"),
        "{text}"
    );
    assert!(
        text.contains("other.example.net.") && text.contains("REFUSED"),
        "{text}"
    );
    assert!(text.contains("fqdn:*.example.test."), "{text}");
}
