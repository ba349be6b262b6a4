//! A gateway whose state directory fills up (a 64 KiB tmpfs): answers that would teach new
//! state fail closed (SERVFAIL with `onHoldTimeout: servfail`), an error log and
//! `fqdnd_checkpoint_errors_total` say so, and names already known keep being answered.
//! Needs root (mount); skipped without it unless `FQDND_REQUIRE_PRIVILEGED=1`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "test code: real processes and clocks; a failed step should panic"
)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};

struct Cleanup {
    dir: PathBuf,
    mount: PathBuf,
    child: Option<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("umount").arg(&self.mount).status();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ask(server: SocketAddr, name: &str) -> Option<ResponseCode> {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut q = Message::new(0x1234, MessageType::Query, OpCode::Query);
    q.metadata.recursion_desired = true;
    q.queries
        .push(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    socket.send_to(&q.to_vec().unwrap(), server).unwrap();
    let mut buf = [0u8; 1500];
    let (n, _) = socket.recv_from(&mut buf).ok()?;
    Some(Message::from_vec(&buf[..n]).ok()?.metadata.response_code)
}

fn metric(port: u16, name: &str) -> f64 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or(0.0)
}

fn wait_for(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "the gateway did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_full_state_disk_fails_new_learning_closed_and_keeps_known_names() {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var("FQDND_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
            "needs root to mount a small tmpfs, and FQDND_REQUIRE_PRIVILEGED=1"
        );
        eprintln!("disk_full: needs root (skipped)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("fqdnd-diskfull-{}", std::process::id()));
    let mount = dir.join("state");
    std::fs::create_dir_all(&mount).unwrap();
    let mut guard = Cleanup {
        dir: dir.clone(),
        mount: mount.clone(),
        child: None,
    };
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "fqdnd-test"])
        .arg(&mount)
        .status()
        .unwrap();
    assert!(status.success(), "mount tmpfs failed");

    let mut zone = String::from(
        "$TTL 3600\n@ IN SOA ns.corp.test. admin.corp.test. 1 3600 600 86400 60\n@ IN NS ns.corp.test.\n",
    );
    for i in 0..5000u32 {
        zone += &format!("h{i:04} IN A 100.64.{}.{}\n", i / 250, i % 250 + 1);
    }
    std::fs::write(dir.join("corp.zone"), zone).unwrap();
    let (dns, metrics) = (free_port(), free_port());
    std::fs::write(
        dir.join("gateway.yaml"),
        format!(
            "apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: [\"127.0.0.1:{dns}\"]
  staticZones: [{{origin: corp.test, file: corp.zone}}]
  stateDir: state
  onHoldTimeout: servfail
  metrics: 127.0.0.1:{metrics}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {{name: lan}}
spec: {{id: 7, addresses: [\"127.0.0.0/8\"], labels: {{site: lan}}}}
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {{name: lan}}
spec:
  endpointSelector: {{matchLabels: {{site: lan}}}}
  egress:
  - toPorts: [{{ports: [{{port: \"53\", protocol: ANY}}]}}]
  - toFQDNs: [{{matchPattern: \"*.corp.test\"}}]
    toPorts: [{{ports: [{{port: \"443\", protocol: TCP}}]}}]
"
        ),
    )
    .unwrap();
    let socket = dir.join("admin.sock");
    let log = dir.join("gateway.log");
    let child = Command::new(env!("CARGO_BIN_EXE_fqdnd"))
        .args(["gateway", "--config"])
        .arg(dir.join("gateway.yaml"))
        .arg("--admin-socket")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    guard.child = Some(child);
    wait_for(&socket);
    let server: SocketAddr = format!("127.0.0.1:{dns}").parse().unwrap();

    // Learn names until the journal no longer takes records.
    let known = "h0000.corp.test.";
    assert_eq!(ask(server, known), Some(ResponseCode::NoError));
    let mut refused_at = None;
    for i in 1..5000u32 {
        match ask(server, &format!("h{i:04}.corp.test.")) {
            Some(ResponseCode::NoError) => {}
            Some(ResponseCode::ServFail) => {
                refused_at = Some(i);
                break;
            }
            other => panic!("h{i:04}: {other:?}"),
        }
    }
    let first_refused = refused_at.expect("64 KiB never filled up");
    assert!(first_refused > 100, "failed too early: {first_refused}");
    // Still full: new names keep failing closed; known names are answered.
    assert_eq!(
        ask(server, "h4999.corp.test."),
        Some(ResponseCode::ServFail)
    );
    assert_eq!(ask(server, known), Some(ResponseCode::NoError));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(metric(metrics, "fqdnd_checkpoint_errors_total") >= 1.0);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("journal write failed"), "{text}");
}
