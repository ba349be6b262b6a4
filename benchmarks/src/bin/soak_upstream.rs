//! The authoritative upstream of `benchmarks/soak.sh`: answers computed from the question, over
//! UDP and TCP on one port (`soak_upstream 127.0.0.1:PORT`).
//!
//! - `kN.corp.test`: 100.64.(N / 250).(N % 250 + 1), TTL 3600 (the names whose verdicts the
//!   soak checks); any other `*.corp.test`: 192.0.2.10
//! - `*.flood.test`: 192.0.2.1, TTL 20 (water torture: every name unique, gone after GC)
//! - `cdn.big.test`: over TCP 2,500 fresh addresses per answer, over UDP TC=1
//! - `aN.multi.test`: 198.51.(100 + N / 250).(N % 250) and 203.0.113.1 shared by all (identity
//!   pressure)
//! - `*.garbage.test`: random bytes after the query's ID; `*.slow.test`: no answer (faults)
//! - anything else: NXDOMAIN
//!
//! Stops by itself after `--seconds` (default 3600).

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "a measurement tool: it reads the wall clock to stop by itself"
)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};

const BIG_PER_ANSWER: u32 = 2500;

enum Reply {
    Message(Box<Message>),
    Garbage(u16),
    Silence,
}

fn answer(query: &Message, tcp: bool, big: &AtomicU32) -> Reply {
    let mut r = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
    r.metadata.authoritative = true;
    r.metadata.recursion_desired = query.metadata.recursion_desired;
    let Some(q) = query.queries.first() else {
        r.metadata.response_code = ResponseCode::FormErr;
        return Reply::Message(Box::new(r));
    };
    r.queries.push(q.clone());
    let name = q.name().to_ascii().to_ascii_lowercase();
    if name.ends_with(".garbage.test.") {
        return Reply::Garbage(query.metadata.id);
    }
    if name.ends_with(".slow.test.") {
        return Reply::Silence;
    }
    let a = |ip: Ipv4Addr, ttl: u32| Record::from_rdata(q.name().clone(), ttl, RData::A(A(ip)));
    let number = |prefix: &str, suffix: &str| -> Option<u32> {
        name.strip_prefix(prefix)?
            .strip_suffix(suffix)?
            .parse()
            .ok()
    };
    if q.query_type() == RecordType::A {
        if name == "cdn.big.test." {
            if !tcp {
                r.metadata.truncation = true;
                return Reply::Message(Box::new(r));
            }
            let first = big.fetch_add(BIG_PER_ANSWER, Ordering::Relaxed);
            for i in first..first + BIG_PER_ANSWER {
                r.answers.push(a(Ipv4Addr::from(0x0a00_0000 + i), 300));
            }
        } else if let Some(n) = number("k", ".corp.test.") {
            let ip = Ipv4Addr::new(
                100,
                64,
                u8::try_from(n / 250).unwrap_or(255),
                u8::try_from(n % 250 + 1).unwrap_or(255),
            );
            r.answers.push(a(ip, 3600));
        } else if let Some(n) = number("a", ".multi.test.") {
            let ip = Ipv4Addr::new(
                198,
                u8::try_from(51 + n / 250).unwrap_or(255),
                100,
                u8::try_from(n % 250).unwrap_or(255),
            );
            r.answers.push(a(ip, 3600));
            r.answers.push(a(Ipv4Addr::new(203, 0, 113, 1), 3600));
        } else if name.ends_with(".flood.test.") {
            r.answers.push(a(Ipv4Addr::new(192, 0, 2, 1), 20));
        } else if name.ends_with(".corp.test.") {
            r.answers.push(a(Ipv4Addr::new(192, 0, 2, 10), 3600));
        } else {
            r.metadata.response_code = ResponseCode::NXDomain;
        }
    }
    Reply::Message(Box::new(r))
}

/// Random-looking bytes (xorshift) behind the query's ID: a reply that matches an outstanding
/// query and is not DNS.
fn garbage(id: u16, seed: &mut u64) -> Vec<u8> {
    let mut out = id.to_be_bytes().to_vec();
    for _ in 0..40 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        out.push(seed.to_le_bytes()[0]);
    }
    out
}

fn encode(reply: Reply, seed: &mut u64) -> Option<Vec<u8>> {
    match reply {
        Reply::Message(m) => m.to_vec().ok(),
        Reply::Garbage(id) => Some(garbage(id, seed)),
        Reply::Silence => None,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let addr: SocketAddr = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 5353)));
    let mut seconds = 3600u64;
    while let Some(a) = args.next() {
        if a == "--seconds" {
            seconds = args.next().and_then(|s| s.parse().ok()).unwrap_or(seconds);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (udp, tcp) = match (UdpSocket::bind(addr), TcpListener::bind(addr)) {
        (Ok(u), Ok(t)) => (u, t),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("soak_upstream: binding {addr}: {e}");
            std::process::exit(1);
        }
    };
    let big = Arc::new(AtomicU32::new(0));
    {
        let big = Arc::clone(&big);
        std::thread::spawn(move || {
            for stream in tcp.incoming() {
                let Ok(mut stream) = stream else { continue };
                let big = Arc::clone(&big);
                std::thread::spawn(move || {
                    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    loop {
                        let mut len = [0u8; 2];
                        if stream.read_exact(&mut len).is_err() {
                            return;
                        }
                        let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
                        if stream.read_exact(&mut msg).is_err() {
                            return;
                        }
                        let Ok(q) = Message::from_vec(&msg) else {
                            return;
                        };
                        let Some(bytes) = encode(answer(&q, true, &big), &mut seed) else {
                            continue;
                        };
                        let Ok(len) = u16::try_from(bytes.len()) else {
                            return;
                        };
                        let mut out = len.to_be_bytes().to_vec();
                        out.extend(bytes);
                        if stream.write_all(&out).is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }
    let _ = udp.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 1500];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    while Instant::now() < deadline {
        let Ok((n, from)) = udp.recv_from(&mut buf) else {
            continue;
        };
        let Ok(q) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        if let Some(bytes) = encode(answer(&q, false, &big), &mut seed) {
            let _ = udp.send_to(&bytes, from);
        }
    }
}
