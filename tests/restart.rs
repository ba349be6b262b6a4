//! Crash safety of the gateway's state: a gateway with a `stateDir` answers clients under
//! load, is killed with SIGKILL at random moments and restarted, many times. Every (name, IP)
//! a client received before a kill must be in the ipcache afterwards, and no label set may
//! change its identity number. Iterations: `FQDND_KILL_ITERATIONS` (default 20); the last line
//! printed is `kill-restart: N kills, lost acknowledged mappings: L, identity changes: C`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]
#![allow(
    clippy::disallowed_methods,
    reason = "kills at random moments (sleeps)"
)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    DNS_ANYWHERE, Gateway, LAN_GROUP, PATIENCE, Setup, documents, fqdnd_command, fqdns_on_443,
    free_port, gateway_doc, lan_policy, metric, numbered_zone, poll_every, poll_until, question,
    rcode, run, scrape, settings_doc, text,
};
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{RData, RecordType};

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

/// A gateway with a state directory on `127.0.0.1:port`, serving `h0000…h2999.corp.test`;
/// with a metrics port if `metrics`.
fn setup(test: &str, port: u16, metrics: bool) -> Setup {
    let mut g = Gateway::setup(test);
    let metrics = if metrics {
        format!("  metrics: 127.0.0.1:{}\n", g.metrics_port())
    } else {
        String::new()
    };
    g.file("corp.zone", numbered_zone(NAMES));
    // Overlapping selectors: several label sets ({*.corp.test}, {*.corp.test, h1*},
    // {*.corp.test, h2*}, {*.corp.test, h2*, h22*}), so identity numbers can be told apart.
    let spec = format!(
        "  staticZones: [{{origin: corp.test, file: corp.zone}}]\n  stateDir: state\n  stateCompactAfter: 700\n  onHoldTimeout: servfail\n{metrics}"
    );
    let fqdns = fqdns_on_443(&[
        "matchPattern: \"*.corp.test\"",
        "matchPattern: \"h1*.corp.test\"",
        "matchPattern: \"h2*.corp.test\"",
        "matchPattern: \"h22*.corp.test\"",
    ]);
    g.config(
        "gateway.yaml",
        &documents(&[
            &gateway_doc(&format!("127.0.0.1:{port}"), &spec),
            &settings_doc("  gcInterval: 1s\n"),
            LAN_GROUP,
            &lan_policy(&(DNS_ANYWHERE.to_owned() + &fqdns)),
        ]),
    );
    g.env("FQDND_LOG", "info");
    g
}

/// Label set → identity number, as the gateway lists them.
fn identities(gw: &Gateway) -> BTreeMap<String, u64> {
    gw.admin(&["identity", "list"])
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

fn ipcache(gw: &Gateway) -> BTreeSet<String> {
    gw.admin(&["ipcache", "list"])
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
        let q = question(id, &format!("h{i:04}.corp.test."), RecordType::A);
        if socket.send_to(&q.to_vec().unwrap(), server).is_err() {
            // Pacing: the gateway is down (killed); try again shortly.
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
    gw: &Gateway,
    round: u32,
    acked_all: &BTreeSet<(u32, IpAddr)>,
    numbers: &mut BTreeMap<String, u64>,
    lost: &mut usize,
    changed: &mut usize,
) {
    let prefixes = ipcache(gw);
    for (i, ip) in acked_all {
        if !prefixes.contains(&format!("{ip}/32")) {
            eprintln!("round {round}: h{i:04} → {ip} acknowledged before a kill, missing now");
            *lost += 1;
        }
    }
    for (labels, id) in identities(gw) {
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
    // A fixed port: the clients keep asking it across restarts.
    let port = free_port();
    let server: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut gw = setup("kill", port, false).start();
    let dir = gw.dir().to_path_buf();
    let mut rng = Rng(u64::from(std::process::id()) * 0x9e37_79b9 + 7);

    let mut acked_all: BTreeSet<(u32, IpAddr)> = BTreeSet::new();
    let mut numbers: BTreeMap<String, u64> = BTreeMap::new();
    let (mut lost, mut changed) = (0usize, 0usize);
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
            &gw,
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
        // A random kill moment (not a wait): some rounds run past a GC tick (1 s), where
        // compactions happen (every 700 records).
        std::thread::sleep(Duration::from_millis(150 + rng.next() % 1500));
        // Identity numbers seen under load count too (some label sets appear only now).
        for (labels, id) in identities(&gw) {
            if let Some(old) = numbers.get(&labels)
                && *old != id
            {
                eprintln!("round {round} (live): {labels} was {old}, now {id}");
                changed += 1;
            }
            numbers.entry(labels).or_insert(id);
        }
        // (A random moment again, past the listing.)
        std::thread::sleep(Duration::from_millis(rng.next() % 200));
        gw.kill();
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        acked_all.extend(acked.lock().unwrap().iter().copied());
        gw.restart();
    }
    check(
        &gw,
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
    gw.kill();
    println!(
        "kill-restart: {iterations} kills, lost acknowledged mappings: {lost}, identity changes: {changed} ({} mappings, {} label sets checked)",
        acked_all.len(),
        numbers.len()
    );
    assert!(acked_all.len() > 100, "too little load to show anything");
    let log = gw.log();
    if iterations >= 10 {
        assert!(
            log.contains("state compacted"),
            "no compaction happened under load"
        );
    }
    // `FQDND_LOG=info` without the static zone server's two lines per query.
    assert!(
        !log.contains("hickory_server::server: query:"),
        "hickory's per-query lines at FQDND_LOG=info"
    );
    assert_eq!(
        (lost, changed),
        (0, 0),
        "log: {}",
        gw.join("gateway.log").display()
    );

    // What an operator sees afterwards.
    let state = dir.join("state");
    let out = run(fqdnd_command().args(["checkpoint", "inspect"]).arg(&state));
    let inspected = text(&out.stdout);
    assert!(out.status.success(), "{inspected}{}", text(&out.stderr));
    assert!(
        inspected.contains("answers") && inspected.contains("identit"),
        "{inspected}"
    );

    // A torn tail (a crash mid-write): inspect reports it; --strict-restore refuses to start
    // and names the file and offset; a normal start cuts it off and serves the known names.
    // The last segment, as the checkpoint crate orders them (`journal.10` after `journal.9`).
    let journal = fqdnd_checkpoint::inspect(&state, None, 0)
        .unwrap()
        .generations
        .pop()
        .expect("a journal segment")
        .file;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)
        .unwrap();
    std::io::Write::write_all(&mut file, &[0x40, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3])
        .unwrap();
    drop(file);
    let out = run(fqdnd_command().args(["checkpoint", "inspect"]).arg(&state));
    assert!(!out.status.success(), "a torn tail must be reported");
    let strict = run(fqdnd_command()
        .args(["gateway", "--strict-restore", "--config"])
        .arg(&gw.configs()[0])
        .arg("--admin-socket")
        .arg(&gw.socket));
    let err = text(&strict.stderr);
    assert!(
        !strict.status.success(),
        "--strict-restore started on a torn tail"
    );
    assert!(
        err.contains(&*journal.to_string_lossy()) && err.contains("offset"),
        "{err}"
    );
    gw.restart();
    let before = ipcache(&gw);
    assert!(
        acked_all
            .iter()
            .all(|(_, ip)| before.contains(&format!("{ip}/32")))
    );
    gw.kill();
    assert!(gw.log().contains("cut off"));
}

/// Guards the gauges after a restore: a restarted gateway's first answer on `/metrics` already
/// counts the DNS cache it restored. Before, the gauges were set right after the restore into
/// no recorder (it was installed later), so the page showed no `fqdnd_cache_entries` until
/// the first sampling tick. The page is asked for every millisecond from the moment the
/// process starts, and the very first answer is judged.
/// It also guards the endpoint not answering an empty page while the restore runs (the
/// listener is bound before the restore and serves only once the gauges are set).
#[test]
fn the_first_metrics_after_a_restart_count_the_restored_cache() {
    let mut gw = setup("gauges", free_port(), true).start();
    for i in 0..NAMES {
        let name = format!("h{i:04}.corp.test.");
        // `onHoldTimeout: servfail`: a journal sync slower than the hold (a busy disk) fails
        // the answer closed; it is learned all the same, and the next ask is answered.
        poll_until(PATIENCE, &format!("an answer for {name}"), || {
            (rcode(gw.dns, &name) == Some(ResponseCode::NoError)).then_some(())
        });
    }
    let learned = gw.status()["cache_entries"].as_u64().unwrap();
    assert!(learned >= u64::from(NAMES), "{learned}");

    gw.kill();
    gw.spawn();
    let addr = gw.metrics.unwrap();
    let first = poll_every(
        Duration::from_millis(1),
        2 * PATIENCE,
        "the restarted gateway's metrics page",
        || scrape(addr),
    );
    gw.wait_ready();
    assert_eq!(
        metric(&first, "fqdnd_cache_entries"),
        Some(learned as f64),
        "the first metrics page after the restart:\n{first}"
    );
}

/// `fqdnd cache forget` (issue 35): a name, one address of a name, a name for one client
/// group — out of the DNS cache and the ipcache at once, and a SIGKILL and restart do not
/// bring them back; a name asked again after its forget comes back as usual. Bad input is
/// refused with its reason.
#[test]
fn what_cache_forget_forgets_stays_forgotten_after_a_restart() {
    let mut gw = setup("forget", free_port(), false).start();
    for i in 1..=4 {
        let name = format!("h{i:04}.corp.test.");
        poll_until(PATIENCE, &format!("an answer for {name}"), || {
            (rcode(gw.dns, &name) == Some(ResponseCode::NoError)).then_some(())
        });
    }
    let cached = |gw: &Gateway| gw.admin(&["cache", "list"]).to_string();
    let prefix = |i| format!("{}/32", common::numbered_addr(i));
    assert!(ipcache(&gw).contains(&prefix(1)));
    // A whole name, typed as a person would.
    let done = gw.admin(&["cache", "forget", "H0001.corp.test"]);
    assert_eq!(
        (&done["name"], &done["mappings"], &done["journaled"]),
        (&"h0001.corp.test.".into(), &1.into(), &true.into()),
        "{done}"
    );
    // One address of a name; a name for the one client group that has it.
    let addr = common::numbered_addr(2).to_string();
    let done = gw.admin(&["cache", "forget", "h0002.corp.test.", "--address", &addr]);
    assert_eq!(done["mappings"], 1, "{done}");
    let done = gw.admin(&["cache", "forget", "h0003.corp.test", "--client", "lan"]);
    assert_eq!(
        (&done["mappings"], &done["records"]),
        (&1.into(), &1.into()),
        "{done}"
    );
    let after = cached(&gw);
    for i in 1..=3 {
        assert!(
            !after.contains(&format!("h{i:04}.corp.test")),
            "{i}: {after}"
        );
        assert!(!ipcache(&gw).contains(&prefix(i)));
    }
    assert!(after.contains("h0004.corp.test"));
    // The sentence, and bad input.
    let out = gw.cli(&[
        "cache",
        "forget",
        "h0004.corp.test",
        "--address",
        "192.0.2.99",
    ]);
    assert!(
        text(&out.stdout)
            .contains("h0004.corp.test.: 192.0.2.99 for every client group: 0 cached addresses"),
        "{}",
        text(&out.stdout)
    );
    for (args, says) in [
        (&["cache", "forget", "bad..name"][..], "is not a DNS name"),
        (
            &["cache", "forget", "h0004.corp.test", "--client", "nosuch"],
            "no client group or endpoint named \"nosuch\"",
        ),
    ] {
        let out = gw.cli(args);
        assert!(!out.status.success());
        assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
    }
    let out = gw.cli(&["cache", "forget", "x.test", "--address", "not-an-ip"]);
    assert!(!out.status.success());
    // Asked again after its forget: learned as usual.
    poll_until(PATIENCE, "h0003 again", || {
        (rcode(gw.dns, "h0003.corp.test.") == Some(ResponseCode::NoError)).then_some(())
    });
    gw.kill();
    gw.spawn();
    gw.wait_ready();
    let restored = cached(&gw);
    for (i, kept) in [(1, false), (2, false), (3, true), (4, true)] {
        assert_eq!(
            restored.contains(&format!("h{i:04}.corp.test")),
            kept,
            "h{i:04} after the restart: {restored}"
        );
        assert_eq!(ipcache(&gw).contains(&prefix(i)), kept, "{i}");
    }
}
