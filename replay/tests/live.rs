//! Live replay against a small UDP responder started here, on the loopback.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed step should panic"
)]

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use fqdnd_replay::dns::Decoder;
use fqdnd_replay::synth::{self, PcapWriter, SynthRr};
use fqdnd_replay::{LiveOptions, live};

fn a(name: &str, ip: &str) -> Vec<SynthRr> {
    vec![SynthRr::Addr(name.into(), 60, ip.parse().unwrap())]
}

/// Answers `a.example.` as captured, `b.example.` with another address, `d.example.` with
/// NXDOMAIN, and never `c.example.`. Stops after `expect` queries or a second of silence.
fn responder(expect: usize) -> (SocketAddr, std::thread::JoinHandle<usize>) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let addr = socket.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let mut buf = vec![0u8; 2048];
        let mut served = 0;
        let mut decoder = Decoder::new();
        while served < expect {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                break;
            };
            served += 1;
            let Ok(msg) = decoder.decode(&buf[..n]) else {
                continue;
            };
            let (id, qname) = (msg.header.id, msg.qname().to_owned());
            let reply = match qname.as_str() {
                "a.example." => synth::dns_message(id, &qname, 1, 0, Some(&a(&qname, "192.0.2.1"))),
                "b.example." => {
                    synth::dns_message(id, &qname, 1, 0, Some(&a(&qname, "192.0.2.99")))
                }
                "d.example." => synth::dns_message(id, &qname, 1, 3, Some(&[])),
                _ => continue,
            };
            socket.send_to(&reply, from).unwrap();
        }
        served
    });
    (addr, handle)
}

#[test]
fn live_replay_reports_matches_mismatches_and_timeouts() {
    let dir = std::env::temp_dir().join(format!("fqdnd-replay-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("live.pcap");
    let client: SocketAddr = "10.0.0.1:5353".parse().unwrap();
    let server: SocketAddr = "10.0.0.53:53".parse().unwrap();
    let mut w = PcapWriter::new(std::fs::File::create(&trace).unwrap(), 1).unwrap();
    let mut t = Duration::from_secs(1_000);
    for (i, (name, ip)) in [
        ("a.example.", "192.0.2.1"),
        ("b.example.", "192.0.2.2"),
        ("c.example.", "192.0.2.3"),
        ("d.example.", "192.0.2.4"),
    ]
    .into_iter()
    .enumerate()
    {
        let id = 100 + i as u16;
        w.packet(
            t,
            &synth::udp_frame(client, server, &synth::dns_message(id, name, 1, 0, None)),
        )
        .unwrap();
        t += Duration::from_millis(2);
        let answer = synth::dns_message(id, name, 1, 0, Some(&a(name, ip)));
        w.packet(t, &synth::udp_frame(server, client, &answer))
            .unwrap();
        t += Duration::from_millis(10);
    }
    drop(w);
    let (addr, handle) = responder(4);
    let report = live(&LiveOptions {
        server: addr,
        traces: vec![trace],
        ports: vec![53],
        speed: 1.0,
        timeout: Duration::from_millis(300),
        max_outstanding: 10,
        limit: None,
    })
    .unwrap();
    assert_eq!(handle.join().unwrap(), 4);
    assert_eq!(report.queries_in_trace, 4);
    assert_eq!(report.sent, 4);
    assert_eq!(report.received, 3);
    assert_eq!(report.timeouts, 1);
    assert_eq!(report.compared, 3);
    assert_eq!(report.matched, 1);
    assert_eq!(report.mismatched, 2);
    assert_eq!(report.mismatched_rcode, 1);
    assert_eq!(report.mismatched_answers, 1);
    assert!(report.latency_ns_p50 > 0 && report.latency_ns_max < 300_000_000);
    // Original timing: the four queries span 36 ms of capture time.
    assert!(report.wall_seconds >= 0.036, "{}", report.wall_seconds);
    assert!(report.summary().contains("Timeouts:              1"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn live_replay_as_fast_as_possible_is_bounded_by_the_outstanding_cap() {
    let dir = std::env::temp_dir().join(format!("fqdnd-replay-fast-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("fast.pcap");
    let client: SocketAddr = "10.0.0.1:5353".parse().unwrap();
    let server: SocketAddr = "10.0.0.53:53".parse().unwrap();
    let mut w = PcapWriter::new(std::fs::File::create(&trace).unwrap(), 1).unwrap();
    let n = 500u16;
    for i in 0..n {
        // An hour of capture time: at speed 0 it must not matter.
        let t = Duration::from_secs(1_000 + u64::from(i) * 7);
        let q = synth::dns_message(i, "a.example.", 1, 0, None);
        w.packet(t, &synth::udp_frame(client, server, &q)).unwrap();
        let r = synth::dns_message(i, "a.example.", 1, 0, Some(&a("a.example.", "192.0.2.1")));
        w.packet(t, &synth::udp_frame(server, client, &r)).unwrap();
    }
    drop(w);
    let (addr, handle) = responder(usize::from(n));
    let report = live(&LiveOptions {
        server: addr,
        traces: vec![trace],
        ports: vec![53],
        speed: 0.0,
        timeout: Duration::from_secs(2),
        max_outstanding: 8,
        limit: Some(400),
    })
    .unwrap();
    assert_eq!(report.sent, 400);
    assert_eq!(report.received, 400);
    assert_eq!(report.matched, 400);
    assert!(report.wall_seconds < 10.0);
    assert!(report.qps_received > 0.0);
    handle.join().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
