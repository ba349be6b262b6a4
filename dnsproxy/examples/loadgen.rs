//! Measures the proxy's CPU cost per query on loopback: a fast built-in upstream, the proxy on
//! its own tokio runtime, and a closed-loop UDP load generator, in one process. CPU time is read
//! per thread from `/proc/self/task/*/schedstat`, so the proxy's share is its own.
//!
//! ```sh
//! cargo run --release -p fqdnd-dnsproxy --example loadgen -- --queries 500000 --outstanding 200
//! # or serve for an external load generator (dnsperf) on 127.0.0.1:5353:
//! cargo run --release -p fqdnd-dnsproxy --example loadgen -- serve --listen 127.0.0.1:5353
//! ```
//!
//! Options: `--queries N` (default 300000), `--outstanding N` (200), `--clients N` (client
//! sockets/threads, 2), `--proxy-threads N` (the proxy's runtime workers and UDP shard threads, 1), `--udp-sockets N` (listener sockets, 1),
//! `--upstream-sockets N` (2), `--seconds S` (hard stop, 30), `--upstream ADDR` (use a real
//! server instead of the built-in one), `--listen ADDR` (serve mode), `--allow FILE` /
//! `--deny FILE` (suffix lists, one per line; default: allow `example.test`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a measurement program"
)]
#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "measures wall time"
)]
#![allow(missing_docs, unreachable_pub, reason = "an example binary")]

use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fqdnd_dnsproxy::{
    Config, DnsProxy, Observation, QueryInfo, QueryPolicy, QueryResult, ResponseContext,
    ResponseObserver, Taps, Verdict,
};

const NAMES: usize = 10_000;

/// A suffix allowlist and denylist (canonical names), like the peers' benchmark rules: denied
/// if any suffix is on the denylist, else allowed if any suffix is on the allowlist.
struct Suffixes {
    allow: HashSet<String>,
    deny: HashSet<String>,
}

impl Suffixes {
    fn matches(set: &HashSet<String>, name: &str) -> bool {
        let mut rest = name;
        loop {
            if set.contains(rest) {
                return true;
            }
            match rest.find('.') {
                Some(i) if i + 1 < rest.len() => rest = &rest[i + 1..],
                _ => return false,
            }
        }
    }

    fn load(path: &str) -> HashSet<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| format!("{}.", l.trim().trim_end_matches('.').to_ascii_lowercase()))
            .collect()
    }
}

impl QueryPolicy for Suffixes {
    fn check(&self, query: &QueryInfo<'_>) -> Verdict {
        if !self.deny.is_empty() && Self::matches(&self.deny, query.name) {
            Verdict::Deny { tag: 1 }
        } else if Self::matches(&self.allow, query.name) {
            Verdict::Allow { tag: 1 }
        } else {
            Verdict::Deny { tag: 1 }
        }
    }
}

/// Counts answers and returns at once (the fast path: no allocation, no task).
struct Count(AtomicU64);

impl ResponseObserver for Count {
    fn observe(&self, answer: &ResponseContext<'_>) -> Observation {
        self.0
            .fetch_add(answer.response.answers.len() as u64, Ordering::Relaxed);
        Observation::Done(Ok(()))
    }
}

struct Args {
    serve: bool,
    listen: SocketAddr,
    queries: u64,
    outstanding: u64,
    clients: u64,
    proxy_threads: usize,
    udp_sockets: usize,
    upstream_sockets: usize,
    seconds: u64,
    upstream: Option<SocketAddr>,
    allow: Option<String>,
    deny: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        serve: false,
        listen: "127.0.0.1:0".parse().unwrap(),
        queries: 300_000,
        outstanding: 200,
        clients: 2,
        proxy_threads: 1,
        udp_sockets: 1,
        upstream_sockets: 2,
        seconds: 30,
        upstream: None,
        allow: None,
        deny: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().expect("a value");
        match arg.as_str() {
            "serve" => a.serve = true,
            "--listen" => a.listen = value().parse().unwrap(),
            "--queries" => a.queries = value().parse().unwrap(),
            "--outstanding" => a.outstanding = value().parse().unwrap(),
            "--clients" => a.clients = value().parse().unwrap(),
            "--proxy-threads" => a.proxy_threads = value().parse().unwrap(),
            "--udp-sockets" => a.udp_sockets = value().parse().unwrap(),
            "--upstream-sockets" => a.upstream_sockets = value().parse().unwrap(),
            "--seconds" => a.seconds = value().parse().unwrap(),
            "--upstream" => a.upstream = Some(value().parse().unwrap()),
            "--allow" => a.allow = Some(value()),
            "--deny" => a.deny = Some(value()),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// A minimal authoritative: copies the question and adds one A record (name compressed).
fn fast_upstream(stop: Arc<AtomicBool>) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let addr = socket.local_addr().unwrap();
    std::thread::Builder::new()
        .name("upstream".into())
        .spawn(move || {
            let mut buf = [0u8; 4096];
            let mut out = Vec::with_capacity(512);
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                let q = &buf[..n];
                // The question ends after the name's zero byte and 4 bytes of type/class.
                let Some(zero) = q.iter().skip(12).position(|&b| b == 0) else {
                    continue;
                };
                let qend = 12 + zero + 1 + 4;
                if qend > n {
                    continue;
                }
                out.clear();
                out.extend_from_slice(&q[..2]);
                out.extend_from_slice(&[0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0]);
                out.extend_from_slice(&q[12..qend]);
                out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 198, 18, 0, 1]);
                let _ = socket.send_to(&out, from);
            }
        })
        .unwrap();
    addr
}

fn encode_query(id: u16, name: &str) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(u8::try_from(label.len()).unwrap());
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Per thread of this process: name, nanoseconds on CPU (schedstat), and utime+stime in
/// clock ticks (what the peers' benchmark reads per process).
fn cpu_by_thread() -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        out.push(thread_cpu(&entry.path()));
    }
    out
}

fn thread_cpu(path: &std::path::Path) -> (String, u64, u64) {
    let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
    let sched = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
    let ns = sched
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
    let after_comm = stat.rsplit(") ").next().unwrap_or("");
    let fields: Vec<u64> = after_comm
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // After "pid (comm) ": the state is field 0, utime field 11, stime field 12.
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    (comm.trim().to_owned(), ns, ticks)
}

fn cpu_of(prefix: &str, snapshot: &[(String, u64, u64)]) -> (u64, u64) {
    snapshot
        .iter()
        .filter(|(n, _, _)| n.starts_with(prefix))
        .fold((0, 0), |(a, b), (_, ns, t)| (a + ns, b + t))
}

/// One closed-loop client: keeps `window` queries outstanding until `count` are answered.
/// Returns (answered, lost, its own CPU nanoseconds).
fn client(
    proxy: SocketAddr,
    count: u64,
    window: u64,
    seed: u64,
    deadline: Instant,
) -> (u64, u64, u64) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect(proxy).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let names: Vec<Vec<u8>> = (0..NAMES)
        .map(|i| encode_query(0, &format!("h{i:05}.example.test.")))
        .collect();
    let (mut sent, mut answered, mut lost) = (0u64, 0u64, 0u64);
    let mut buf = [0u8; 4096];
    let mut next = usize::try_from(seed).unwrap() * 7919;
    while answered + lost < count && Instant::now() < deadline {
        while sent.saturating_sub(answered + lost) < window && sent < count {
            next = (next + 1) % NAMES;
            let mut q = names[next].clone();
            #[allow(clippy::cast_possible_truncation, reason = "wrapping IDs")]
            q[..2].copy_from_slice(&(sent as u16).to_be_bytes());
            let _ = socket.send(&q);
            sent += 1;
        }
        match socket.recv(&mut buf) {
            Ok(_) => answered += 1,
            Err(_) => lost += sent.saturating_sub(answered + lost),
        }
    }
    let (_, ns, _) = thread_cpu(std::path::Path::new("/proc/thread-self"));
    (answered, lost, ns)
}

fn main() {
    let a = args();
    let stop = Arc::new(AtomicBool::new(false));
    let upstream = a.upstream.unwrap_or_else(|| fast_upstream(stop.clone()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.proxy_threads)
        .thread_name("proxy-worker")
        .enable_all()
        .build()
        .unwrap();
    let config = Config {
        listen_udp: vec![a.listen],
        listen_tcp: if a.serve { vec![a.listen] } else { vec![] },
        udp_sockets_per_address: a.udp_sockets,
        upstreams: vec![upstream.into()],
        upstream_sockets: a.upstream_sockets,
        // The UDP path's shard threads (`fqdnd-dns-N`), as many as the runtime's workers.
        udp_threads: a.proxy_threads,
        ..Config::default()
    };
    let policy = Arc::new(Suffixes {
        allow: a
            .allow
            .as_deref()
            .map_or_else(|| ["example.test.".to_owned()].into(), Suffixes::load),
        deny: a.deny.as_deref().map(Suffixes::load).unwrap_or_default(),
    });
    let observer = Arc::new(Count(AtomicU64::new(0)));
    let proxy = rt
        .block_on(DnsProxy::bind(
            config,
            policy,
            observer.clone(),
            Taps::default(),
        ))
        .expect("bind");
    let addr = proxy.udp_addrs()[0];
    let stats = proxy.stats_handle();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let running = rt.spawn(proxy.run(async move {
        let _ = rx.await;
    }));
    if a.serve {
        eprintln!("serving DNS on {addr} (UDP and TCP), upstream {upstream}; Ctrl-C to stop");
        rt.block_on(async {
            let _ = tokio::signal::ctrl_c().await;
        });
        return;
    }

    // Warm up (sockets, tables, allocator).
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    client(addr, 2_000, 20, 99, deadline);

    let before = cpu_by_thread();
    let start = Instant::now();
    let per_client = a.queries / a.clients;
    let window = (a.outstanding / a.clients).max(1);
    let handles: Vec<_> = (0..a.clients)
        .map(|c| {
            std::thread::Builder::new()
                .name(format!("loadgen-{c}"))
                .spawn(move || client(addr, per_client, window, c, deadline))
                .unwrap()
        })
        .collect();
    let (mut answered, mut lost, mut loadgen_ns) = (0, 0, 0);
    for h in handles {
        let (ok, l, ns) = h.join().unwrap();
        answered += ok;
        lost += l;
        loadgen_ns += ns;
    }
    let elapsed = start.elapsed();
    let after = cpu_by_thread();
    // The proxy's runtime and its UDP path's shard threads.
    let proxy_cpu = |snapshot: &[(String, u64, u64)]| {
        let (runtime, shards) = (
            cpu_of("proxy-worker", snapshot),
            cpu_of("fqdnd-dns-", snapshot),
        );
        (runtime.0 + shards.0, runtime.1 + shards.1)
    };
    let (proxy_ns, proxy_ticks) = {
        let (a, b) = (proxy_cpu(&after), proxy_cpu(&before));
        (a.0 - b.0, a.1 - b.1)
    };
    let upstream_ns = cpu_of("upstream", &after).0 - cpu_of("upstream", &before).0;

    let s = stats.stats();
    #[allow(clippy::cast_precision_loss, reason = "a report")]
    {
        let qps = answered as f64 / elapsed.as_secs_f64();
        println!(
            "answered {answered} lost {lost} in {:.2} s: {qps:.0} qps; proxy CPU {:.2} s = {:.2} µs/query (utime+stime {:.2} µs/query; {:.0}% of a core); upstream {:.2} µs/q, load generator {:.2} µs/q",
            elapsed.as_secs_f64(),
            proxy_ns as f64 / 1e9,
            proxy_ns as f64 / 1e3 / answered as f64,
            proxy_ticks as f64 * 1e4 / answered as f64,
            proxy_ns as f64 / elapsed.as_nanos() as f64 * 100.0,
            upstream_ns as f64 / 1e3 / answered as f64,
            loadgen_ns as f64 / 1e3 / answered as f64,
        );
    }
    println!(
        "proxy: answered {} upstream_timeout {} dropped answers {} in flight {}",
        s.queries(QueryResult::Answered),
        s.queries(QueryResult::UpstreamTimeout),
        s.dropped_total(),
        s.inflight
    );
    let _ = tx.send(());
    stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        let _ = tokio::time::timeout(Duration::from_secs(2), running).await;
    });
}
