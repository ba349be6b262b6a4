//! The forward path allocates nothing per query once warm (issue 19): a counting global
//! allocator counts every allocation made on the proxy's runtime threads while a client sends
//! allowed queries one at a time (so every `recvmmsg`/`sendmmsg` batch holds one datagram: a
//! per-batch allocation shows as a per-query one) through the proxy to a loopback upstream.
//! The client, the upstream and the test itself run on threads that are not counted.
//!
//! A binary of its own: the global allocator is the whole process's.

#![deny(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fqdnd_dnsproxy::{
    CacheConfig, Config, DnsProxy, Observation, QueryInfo, QueryPolicy, ResponseContext,
    ResponseObserver, Taps, Verdict,
};

/// Counts the allocations (and reallocations) made on threads that set [`COUNTED`].
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set on the proxy's runtime threads only.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// The one unsafe item of the test: a GlobalAlloc that forwards to the system allocator.
#[allow(unsafe_code, reason = "a global allocator is an unsafe impl")]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The tests share the counter: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Queries measured per run.
const QUERIES: u64 = 2_000;
/// Queries sent first (sockets, tables, caches and buffers reach their size).
const WARM_UP: u64 = 1_000;
/// Distinct names asked, round robin.
const NAMES: u64 = 50;

/// Allows every query (tag 7).
struct AllowAll;

impl QueryPolicy for AllowAll {
    fn check(&self, _: &QueryInfo<'_>) -> Verdict {
        Verdict::Allow { tag: 7 }
    }
}

/// Done at once, counting what it saw.
#[derive(Default)]
struct Counter(AtomicU64);

impl ResponseObserver for Counter {
    fn observe(&self, _: &ResponseContext<'_>) -> Observation {
        self.0.fetch_add(1, Ordering::Relaxed);
        Observation::Done(Ok(()))
    }
}

/// The question of an A query for `n<i>.example.`, no EDNS.
fn query(id: u16, i: u64) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    let label = format!("n{i}");
    q.push(u8::try_from(label.len()).unwrap());
    q.extend_from_slice(label.as_bytes());
    q.extend_from_slice(b"\x07example\x00\x00\x01\x00\x01");
    q
}

/// A loopback upstream on a thread of its own: answers every query (no EDNS) with one A
/// record, TTL 300, pointing at the question's name.
fn upstream() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                return;
            };
            let mut answer = buf[..n].to_vec();
            answer[2] |= 0x80;
            answer[3] |= 0x80;
            answer[7] = 1;
            answer
                .extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0x01, 0x2c, 0, 4, 192, 0, 2, 1]);
            let _ = socket.send_to(&answer, from);
        }
    });
    addr
}

/// Allocations on the proxy's threads while `QUERIES` allowed queries go through it, after
/// the warm-up; `tweak` changes the configuration.
fn allocations_per_run(tweak: impl FnOnce(&mut Config)) -> u64 {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut config = Config {
        listen_udp: vec!["127.0.0.1:0".parse().unwrap()],
        upstreams: vec![upstream().into()],
        udp_sockets_per_address: 2,
        upstream_sockets: 2,
        // The UDP path on this runtime's (counted) threads: the shard threads it has by
        // default run the same code but are not counted.
        udp_threads: 0,
        ..Config::default()
    };
    tweak(&mut config);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(|| COUNTED.set(true))
        .build()
        .unwrap();
    let observer = Arc::new(Counter::default());
    // Bound on this (uncounted) thread; served on the runtime's.
    let proxy = runtime
        .block_on(DnsProxy::bind(
            config,
            Arc::new(AllowAll),
            observer.clone(),
            Taps::default(),
        ))
        .unwrap();
    let server = proxy.udp_addrs()[0];
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = runtime.spawn(proxy.run(async move {
        let _ = stopped.await;
    }));

    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.connect(server).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reply = [0u8; 512];
    let mut ask = |k: u64| {
        let id = u16::try_from(k % 65_536).unwrap();
        client.send(&query(id, k % NAMES)).unwrap();
        let n = client.recv(&mut reply).expect("the proxy answers");
        assert_eq!(reply[..2], id.to_be_bytes(), "the reply to this query");
        assert_eq!((reply[3] & 0x0f, reply[7]), (0, 1), "NOERROR, one answer");
        assert!(n > 12);
    };
    for k in 0..WARM_UP {
        ask(k);
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for k in WARM_UP..WARM_UP + QUERIES {
        ask(k);
    }
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(observer.0.load(Ordering::Relaxed), WARM_UP + QUERIES);

    stop.send(()).unwrap();
    runtime.block_on(run).unwrap().unwrap();
    allocations
}

/// What a measured run may allocate: a little work that is not per query (the timeout sweep's
/// and health check's timers, an upstream socket rotation), never one per query.
const BOUND: u64 = QUERIES / 20;

#[test]
fn forwarding_allowed_queries_allocates_nothing_per_query() {
    let n = allocations_per_run(|c| {
        // 0x20 (the name as sent is kept per query) and a rate limit (per-client state).
        c.randomize_case = true;
        c.rate_limit_qps = 1_000_000;
    });
    eprintln!("forward path, cache off: {n} allocations for {QUERIES} queries");
    assert!(n < BOUND, "{n} allocations for {QUERIES} queries");
}

#[test]
fn answering_from_the_cache_allocates_nothing_per_query() {
    let n = allocations_per_run(|c| c.cache = Some(CacheConfig::default()));
    eprintln!("cache on: {n} allocations for {QUERIES} queries");
    assert!(n < BOUND, "{n} allocations for {QUERIES} queries");
}
