//! Privileges of a running `fqdnd gateway`: after start-up no thread holds any capability (as
//! root; the test needs root and is skipped without it unless `FQDND_REQUIRE_PRIVILEGED=1`),
//! the admin socket is the owner's only, and configuration files anyone could change are
//! warned about at start and on every reload.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "test code: real processes, clocks and sleeps; a failed step should panic"
)]

use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};

struct Gateway {
    child: Child,
    dir: PathBuf,
    dns: SocketAddr,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("files kept in {}", self.dir.display());
        } else {
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

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A gateway whose files get the given modes: (gateway.yaml, policy.yaml, deny list).
fn start(test: &str, modes: (u32, u32, u32)) -> Gateway {
    let dir = std::env::temp_dir().join(format!("fqdnd-privs-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    chmod(&dir, 0o755);
    let dns = free_port();
    let gateway = dir.join("gateway.yaml");
    std::fs::write(
        &gateway,
        format!(
            "apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: [\"127.0.0.1:{dns}\"]
  staticZones: [{{origin: corp.test, records: \"$TTL 300\\n@ IN SOA ns.corp.test. a.corp.test. 1 3600 600 86400 60\\nwww IN A 192.0.2.10\\n\"}}]
  adminSocket: admin.sock
  queryLog: queries.jsonl
  stateDir: state
  lists: {{deny: [deny.txt]}}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {{name: lan}}
spec: {{id: 7, addresses: [\"127.0.0.0/8\"], labels: {{site: lan}}}}
"
        ),
    )
    .unwrap();
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: lan}
spec:
  endpointSelector: {matchLabels: {site: lan}}
  egress:
  - toPorts: [{ports: [{port: \"53\", protocol: ANY}]}]
  - toFQDNs: [{matchPattern: \"*.corp.test\"}]
",
    )
    .unwrap();
    let deny = dir.join("deny.txt");
    std::fs::write(&deny, "ads.corp.test\n").unwrap();
    chmod(&gateway, modes.0);
    chmod(&policy, modes.1);
    chmod(&deny, modes.2);
    let log = std::fs::File::create(dir.join("gateway.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_fqdnd"))
        .args(["gateway", "--config"])
        .arg(&gateway)
        .arg("--config")
        .arg(&policy)
        .env("FQDND_LOG", "info")
        .current_dir(&dir)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let gw = Gateway {
        child,
        dir,
        dns: format!("127.0.0.1:{dns}").parse().unwrap(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(gw.dir.join("admin.sock")).is_err() {
        assert!(Instant::now() < deadline, "no start: {}", gw.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    gw
}

impl Gateway {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("gateway.log")).unwrap_or_default()
    }

    fn ask(&self, name: &str) -> Option<ResponseCode> {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let mut q = Message::new(7, MessageType::Query, OpCode::Query);
        q.queries
            .push(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        socket.send_to(&q.to_vec().unwrap(), self.dns).unwrap();
        let mut buf = [0u8; 1500];
        let (n, _) = socket.recv_from(&mut buf).ok()?;
        Some(Message::from_vec(&buf[..n]).ok()?.metadata.response_code)
    }

    fn reload(&self) {
        let admin = self.dir.join("admin.sock");
        let out = Command::new(env!("CARGO_BIN_EXE_fqdnd"))
            .args(["policy", "reload", "--admin-socket"])
            .arg(&admin)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

fn warnings_about(log: &str, file: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("WARN") && l.contains(file))
        .count()
}

#[test]
fn the_admin_socket_is_the_owners_only_and_loose_files_are_warned_about() {
    let gw = start("perms", (0o666, 0o644, 0o664));
    let socket = gw.dir.join("admin.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "admin socket mode {mode:o}");
    // The query log and the state directory, created by the gateway: the owner's only.
    for private in ["queries.jsonl", "state"] {
        let mode = std::fs::metadata(gw.dir.join(private))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{private}: mode {mode:o}");
    }
    assert_eq!(gw.ask("www.corp.test."), Some(ResponseCode::NoError));
    let log = gw.log();
    let gateway_file = gw.dir.join("gateway.yaml").display().to_string();
    let deny_file = gw.dir.join("deny.txt").display().to_string();
    let policy_file = gw.dir.join("policy.yaml").display().to_string();
    assert_eq!(warnings_about(&log, &gateway_file), 1, "{log}");
    assert!(log.contains("writable by everyone"), "{log}");
    assert_eq!(warnings_about(&log, &deny_file), 1, "{log}");
    assert!(log.contains("writable by its group"), "{log}");
    assert_eq!(warnings_about(&log, &policy_file), 0, "{log}");

    // A reload warns again; a state directory others can read is warned about too.
    chmod(&gw.dir.join("state"), 0o755);
    gw.reload();
    let log = gw.log();
    assert_eq!(warnings_about(&log, &gateway_file), 2, "{log}");
    assert_eq!(warnings_about(&log, &deny_file), 2, "{log}");
    assert_eq!(warnings_about(&log, &policy_file), 0, "{log}");
    assert!(
        log.contains("(the state directory) is readable by everyone"),
        "{log}"
    );
}

fn caps_of(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap()
}

#[test]
fn a_running_gateway_holds_no_capability_in_any_thread() {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var("FQDND_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
            "needs root to start with capabilities, and FQDND_REQUIRE_PRIVILEGED=1"
        );
        eprintln!("privileges: needs root (skipped)");
        return;
    }
    let gw = start("caps", (0o644, 0o644, 0o644));
    assert_eq!(gw.ask("www.corp.test."), Some(ResponseCode::NoError));
    // The drop is the last start-up step, just after the admin socket opens.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gw.log().contains("capabilities dropped") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let tasks = format!("/proc/{}/task", gw.child.id());
    let mut threads = 0;
    for task in std::fs::read_dir(&tasks).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        for key in ["CapEff:", "CapPrm:", "CapInh:", "CapAmb:", "CapBnd:"] {
            assert_eq!(caps_of(&status, key), 0, "{key} of a thread:\n{status}");
        }
        threads += 1;
    }
    assert!(threads >= 2, "{threads} threads");
    let log = gw.log();
    assert!(log.contains("kept=none"), "{log}");
    // Everything it does at run time still works without: answers, new names, a reload
    // (files re-read, journal written, query log appended).
    assert_eq!(gw.ask("ads.corp.test."), Some(ResponseCode::Refused));
    gw.reload();
    assert_eq!(gw.ask("www.corp.test."), Some(ResponseCode::NoError));
    assert!(
        !gw.log().contains("ERROR"),
        "errors after the drop: {}",
        gw.log()
    );
}
