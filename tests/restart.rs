//! Crash safety of the gateway's state: a gateway with a `stateDir` answers clients under
//! load, is killed with SIGKILL at random moments and restarted, many times. Every (name, IP)
//! a client received before a kill must be in the ipcache afterwards, and no label set may
//! change its identity number. Iterations: `FQDND_KILL_ITERATIONS` (default 20); the last line
//! printed is `kill-restart: N kills, lost acknowledged mappings: L, identity changes: C`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "test code: real processes, clocks and sleeps; a failed step should panic"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

const NAMES: u32 = 3000;

/// xorshift: enough randomness for kill moments and query order, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn addr_of(i: u32) -> IpAddr {
    IpAddr::from([100, 64, (i / 250) as u8, (i % 250 + 1) as u8])
}

fn write_config(dir: &Path, port: u16) -> PathBuf {
    let mut zone = String::from(
        "$TTL 3600\n@ IN SOA ns.corp.test. admin.corp.test. 1 3600 600 86400 60\n@ IN NS ns.corp.test.\n",
    );
    for i in 0..NAMES {
        zone += &format!("h{i:04} IN A {}\n", addr_of(i));
    }
    std::fs::write(dir.join("corp.zone"), zone).unwrap();
    let config = dir.join("gateway.yaml");
    // Overlapping selectors: several label sets ({*.corp.test}, {*.corp.test, h1*},
    // {*.corp.test, h2*}, {*.corp.test, h2*, h22*}), so identity numbers can be told apart.
    std::fs::write(
        &config,
        format!(
            "apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: [\"127.0.0.1:{port}\"]
  staticZones: [{{origin: corp.test, file: corp.zone}}]
  stateDir: state
  stateCompactAfter: 700
  onHoldTimeout: servfail
---
apiVersion: fqdnd.io/v1
kind: Settings
spec:
  gcInterval: 1s
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
  - toFQDNs:
    - matchPattern: \"*.corp.test\"
    - matchPattern: \"h1*.corp.test\"
    - matchPattern: \"h2*.corp.test\"
    - matchPattern: \"h22*.corp.test\"
    toPorts: [{{ports: [{{port: \"443\", protocol: TCP}}]}}]
"
        ),
    )
    .unwrap();
    config
}

fn start(config: &Path, socket: &Path, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_fqdnd"))
        .args(["gateway", "--config"])
        .arg(config)
        .arg("--admin-socket")
        .arg(socket)
        .env("FQDND_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "the gateway did not come back");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn admin(socket: &Path, what: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_fqdnd"))
        .args([what, "list", "--json", "--admin-socket"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Label set → identity number, as the gateway lists them.
fn identities(socket: &Path) -> BTreeMap<String, u64> {
    admin(socket, "identity")
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let labels: Vec<&str> = row["labels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l.as_str().unwrap())
                .collect();
            let mut labels = labels;
            labels.sort_unstable();
            (labels.join(","), row["identity"].as_u64().unwrap())
        })
        .collect()
}

fn ipcache(socket: &Path) -> BTreeSet<String> {
    admin(socket, "ipcache")
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["prefix"].as_str().unwrap().to_owned())
        .collect()
}

/// Asks names until `stop`; every answer received is recorded (it was durable before it was
/// released: `onHoldTimeout: servfail`).
fn load(server: SocketAddr, seed: u64, stop: &AtomicBool, acked: &Mutex<Vec<(u32, IpAddr)>>) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut rng = Rng(seed | 1);
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        let i = (rng.next() % u64::from(NAMES)) as u32;
        let id = (rng.next() & 0xffff) as u16;
        let mut q = Message::new(id, MessageType::Query, OpCode::Query);
        q.metadata.recursion_desired = true;
        q.queries.push(Query::query(
            Name::from_ascii(format!("h{i:04}.corp.test.")).unwrap(),
            RecordType::A,
        ));
        if socket.send_to(&q.to_vec().unwrap(), server).is_err() {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let Ok((n, _)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let Ok(reply) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        if reply.metadata.id != id || reply.metadata.response_code != ResponseCode::NoError {
            continue;
        }
        for rr in &reply.answers {
            if let RData::A(a) = &rr.data {
                acked.lock().unwrap().push((i, IpAddr::V4(a.0)));
            }
        }
    }
}

/// After a restart: every acknowledged mapping is in the ipcache, every known label set has
/// its old number.
fn check(
    socket: &Path,
    round: u32,
    acked_all: &BTreeSet<(u32, IpAddr)>,
    numbers: &mut BTreeMap<String, u64>,
    lost: &mut usize,
    changed: &mut usize,
) {
    let prefixes = ipcache(socket);
    for (i, ip) in acked_all {
        if !prefixes.contains(&format!("{ip}/32")) {
            eprintln!("round {round}: h{i:04} → {ip} acknowledged before a kill, missing now");
            *lost += 1;
        }
    }
    for (labels, id) in identities(socket) {
        match numbers.get(&labels) {
            Some(old) if *old != id => {
                eprintln!("round {round}: {labels} was {old}, now {id}");
                *changed += 1;
            }
            Some(_) => {}
            None => {
                numbers.insert(labels, id);
            }
        }
    }
}

#[test]
fn acknowledged_answers_and_identity_numbers_survive_kill_9() {
    let iterations: u32 = std::env::var("FQDND_KILL_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = std::env::temp_dir().join(format!("fqdnd-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let port = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let server: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let config = write_config(&dir, port);
    let socket = dir.join("admin.sock");
    let log = dir.join("gateway.log");
    let mut rng = Rng(u64::from(std::process::id()) * 0x9e37_79b9 + 7);

    let mut acked_all: BTreeSet<(u32, IpAddr)> = BTreeSet::new();
    let mut numbers: BTreeMap<String, u64> = BTreeMap::new();
    let (mut lost, mut changed) = (0usize, 0usize);
    let mut child = start(&config, &socket, &log);
    // benchmarks/kill-restart.sh adds dnsperf as background load (FQDND_KILL_DNSPERF=QPS).
    let mut dnsperf = std::env::var("FQDND_KILL_DNSPERF").ok().map(|qps| {
        let queries = dir.join("queries.txt");
        let text: String = (0..NAMES)
            .map(|i| format!("h{i:04}.corp.test A\n"))
            .collect();
        std::fs::write(&queries, text).unwrap();
        Command::new("dnsperf")
            .args([
                "-s",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-l",
                "3600",
                "-Q",
                &qps,
                "-d",
            ])
            .arg(&queries)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsperf (apt-get install dnsperf)")
    });
    for round in 0..iterations {
        check(
            &socket,
            round,
            &acked_all,
            &mut numbers,
            &mut lost,
            &mut changed,
        );

        // Load for a random time, then SIGKILL.
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let (stop, acked) = (Arc::clone(&stop), Arc::clone(&acked));
                let seed = rng.next() + w;
                std::thread::spawn(move || load(server, seed, &stop, &acked))
            })
            .collect();
        // Some rounds run past a GC tick (1 s), where compactions happen (every 700 records).
        std::thread::sleep(Duration::from_millis(150 + rng.next() % 1500));
        // Identity numbers seen under load count too (some label sets appear only now).
        for (labels, id) in identities(&socket) {
            if let Some(old) = numbers.get(&labels)
                && *old != id
            {
                eprintln!("round {round} (live): {labels} was {old}, now {id}");
                changed += 1;
            }
            numbers.entry(labels).or_insert(id);
        }
        std::thread::sleep(Duration::from_millis(rng.next() % 200));
        child.kill().unwrap();
        child.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        acked_all.extend(acked.lock().unwrap().iter().copied());
        child = start(&config, &socket, &log);
    }
    check(
        &socket,
        iterations,
        &acked_all,
        &mut numbers,
        &mut lost,
        &mut changed,
    );
    if let Some(d) = dnsperf.as_mut() {
        let _ = d.kill();
        let _ = d.wait();
    }
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "kill-restart: {iterations} kills, lost acknowledged mappings: {lost}, identity changes: {changed} ({} mappings, {} label sets checked)",
        acked_all.len(),
        numbers.len()
    );
    assert!(acked_all.len() > 100, "too little load to show anything");
    if iterations >= 10 {
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains("state compacted"),
            "no compaction happened under load"
        );
    }
    assert_eq!((lost, changed), (0, 0), "log: {}", log.display());

    // What an operator sees afterwards.
    let state = dir.join("state");
    let out = Command::new(env!("CARGO_BIN_EXE_fqdnd"))
        .args(["checkpoint", "inspect"])
        .arg(&state)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("answers") && text.contains("identit"),
        "{text}"
    );

    // A torn tail (a crash mid-write): inspect reports it; --strict-restore refuses to start
    // and names the file and offset; a normal start cuts it off and serves the known names.
    let journal = std::fs::read_dir(&state)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("journal.")
        })
        .max()
        .unwrap();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)
        .unwrap();
    std::io::Write::write_all(&mut file, &[0x40, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3])
        .unwrap();
    drop(file);
    let out = Command::new(env!("CARGO_BIN_EXE_fqdnd"))
        .args(["checkpoint", "inspect"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a torn tail must be reported");
    let strict = Command::new(env!("CARGO_BIN_EXE_fqdnd"))
        .args(["gateway", "--strict-restore", "--config"])
        .arg(&config)
        .arg("--admin-socket")
        .arg(&socket)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&strict.stderr);
    assert!(
        !strict.status.success(),
        "--strict-restore started on a torn tail"
    );
    assert!(
        err.contains(&*journal.to_string_lossy()) && err.contains("offset"),
        "{err}"
    );
    let mut child = start(&config, &socket, &log);
    let before = ipcache(&socket);
    assert!(
        acked_all
            .iter()
            .all(|(_, ip)| before.contains(&format!("{ip}/32")))
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(std::fs::read_to_string(&log).unwrap().contains("cut off"));
    let _ = std::fs::remove_dir_all(&dir);
}
