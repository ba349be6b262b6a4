//! A UDP DNS forwarder with nothing else to do, as a yardstick for `benchmarks/vs-peers.sh`
//! (`BARE=1`): what moving a query and its answer through the kernel costs. No policy, no
//! parsing beyond the ID, no engine, no TCP; its only work in user space is the ID table and
//! two small vectors of slices per batch (tens of nanoseconds against microseconds of system
//! calls per query).
//!
//! `bare_forwarder LISTEN UPSTREAM [THREADS]` (default 2 threads, as dnsdist's two listeners in
//! vs-peers). Built the way dnsdist is: per thread one listener socket (`SO_REUSEPORT`, so the
//! kernel spreads clients over them) and one connected upstream socket; a listener thread reads
//! a batch of queries (`recvmmsg`, blocking), rewrites each ID through its upstream socket's
//! in-flight table and sends the batch upstream in one `sendmmsg`; a responder thread per
//! upstream socket reads a batch of answers, puts each client's ID back and sends the batch to
//! the clients in one `sendmmsg` from the listener socket. Blocking system calls, no runtime:
//! a thread sleeps in the kernel until its socket has data, as dnsdist's do.
//!
//! Its QPS in vs-peers is an upper bound for any forwarder with this I/O on this harness (the
//! server's CPU shares two vCPUs with NSD and dnsperf). Runs until killed.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;

use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
use socket2::{Domain, Protocol, Socket, Type};

/// Datagrams per `recvmmsg`/`sendmmsg`.
const BATCH: usize = 32;
/// Room per datagram (the benchmark's queries and answers are a few hundred bytes at most; a
/// longer datagram is cut and its client sees a malformed answer, which dnsperf counts).
const ROOM: usize = 4096;

/// Queries in flight on one upstream socket, by the ID they were sent with. IDs are given in
/// turn, so a slot is reused 65,536 queries later: an answer later than that would go to the
/// newer client, which a benchmark with a few hundred queries in flight never sees. An answer
/// whose slot is empty is dropped.
struct InFlight {
    slots: Vec<Option<(SocketAddr, [u8; 2])>>,
    next: u16,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [listen, upstream] => parse(listen, upstream, "2"),
        [listen, upstream, threads] => parse(listen, upstream, threads),
        _ => Err("usage: bare_forwarder LISTEN UPSTREAM [THREADS]".to_owned()),
    };
    let (listen, upstream, threads) = match parsed {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bare_forwarder: {e}");
            std::process::exit(2);
        }
    };
    let mut handles = Vec::new();
    for _ in 0..threads {
        let (listener, up) = match sockets(listen, upstream) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("bare_forwarder: sockets for {listen} → {upstream}: {e}");
                std::process::exit(1);
            }
        };
        let table = Arc::new(Mutex::new(InFlight {
            slots: vec![None; 65_536],
            next: 0,
        }));
        let (l, u, t) = (Arc::clone(&listener), Arc::clone(&up), Arc::clone(&table));
        handles.push(thread::spawn(move || queries(&l, &u, &t)));
        handles.push(thread::spawn(move || answers(&up, &listener, &table)));
    }
    eprintln!("bare_forwarder: {listen} → {upstream}, {threads} listener threads");
    for h in handles {
        if let Ok(Err(e)) = h.join() {
            eprintln!("bare_forwarder: {e}");
            std::process::exit(1);
        }
    }
}

fn parse(
    listen: &str,
    upstream: &str,
    threads: &str,
) -> Result<(SocketAddr, SocketAddr, usize), String> {
    let listen = listen
        .parse()
        .map_err(|e| format!("LISTEN {listen:?}: {e}"))?;
    let upstream = upstream
        .parse()
        .map_err(|e| format!("UPSTREAM {upstream:?}: {e}"))?;
    let threads = threads
        .parse()
        .ok()
        .filter(|&n: &usize| (1..=64).contains(&n))
        .ok_or_else(|| format!("THREADS {threads:?}: a number from 1 to 64"))?;
    Ok((listen, upstream, threads))
}

fn sockets(
    listen: SocketAddr,
    upstream: SocketAddr,
) -> io::Result<(Arc<UdpSocket>, Arc<UdpSocket>)> {
    let s = Socket::new(
        Domain::for_address(listen),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    s.set_reuse_port(true)?;
    s.bind(&listen.into())?;
    let up = UdpSocket::bind(if upstream.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    })?;
    up.connect(upstream)?;
    Ok((Arc::new(s.into()), Arc::new(up)))
}

/// Clients → upstream.
fn queries(listener: &UdpSocket, up: &UdpSocket, table: &Mutex<InFlight>) -> io::Result<()> {
    let mut bufs = vec![0u8; BATCH * ROOM];
    let mut got = Vec::with_capacity(BATCH);
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let mut send_headers = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let no_addrs = [None::<SockaddrStorage>; BATCH];
    loop {
        receive(listener, &mut bufs, &mut headers, &mut got)?;
        {
            let mut t = table.lock().unwrap_or_else(PoisonError::into_inner);
            for (i, &(len, from)) in got.iter().enumerate() {
                let q = &mut bufs[i * ROOM..i * ROOM + len];
                if q.len() < 12 {
                    continue;
                }
                let id = t.next;
                t.next = t.next.wrapping_add(1);
                t.slots[usize::from(id)] = Some((from, [q[0], q[1]]));
                q[..2].copy_from_slice(&id.to_be_bytes());
            }
        }
        let slices: Vec<[IoSlice<'_>; 1]> = got
            .iter()
            .enumerate()
            .filter(|(_, (len, _))| *len >= 12)
            .map(|(i, &(len, _))| [IoSlice::new(&bufs[i * ROOM..i * ROOM + len])])
            .collect();
        send(up, &mut send_headers, &slices, &no_addrs[..slices.len()]);
    }
}

/// Upstream → clients.
fn answers(up: &UdpSocket, listener: &UdpSocket, table: &Mutex<InFlight>) -> io::Result<()> {
    let mut bufs = vec![0u8; BATCH * ROOM];
    let mut got = Vec::with_capacity(BATCH);
    let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let mut send_headers = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let mut out = Vec::with_capacity(BATCH);
    let mut addrs = Vec::with_capacity(BATCH);
    loop {
        match receive(up, &mut bufs, &mut headers, &mut got) {
            // A connected socket reports the upstream's ICMP errors here: go on.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
            other => other?,
        }
        out.clear();
        addrs.clear();
        {
            let mut t = table.lock().unwrap_or_else(PoisonError::into_inner);
            for (i, &(len, _)) in got.iter().enumerate() {
                let a = &mut bufs[i * ROOM..i * ROOM + len];
                if a.len() < 12 {
                    continue;
                }
                let id = u16::from_be_bytes([a[0], a[1]]);
                if let Some((client, orig)) = t.slots[usize::from(id)].take() {
                    a[..2].copy_from_slice(&orig);
                    out.push(i);
                    addrs.push(Some(SockaddrStorage::from(client)));
                }
            }
        }
        let slices: Vec<[IoSlice<'_>; 1]> = out
            .iter()
            .map(|&i| [IoSlice::new(&bufs[i * ROOM..i * ROOM + got[i].0])])
            .collect();
        send(listener, &mut send_headers, &slices, &addrs);
    }
}

/// Waits for at least one datagram, then takes what else is queued (up to [`BATCH`]).
fn receive(
    socket: &UdpSocket,
    bufs: &mut [u8],
    headers: &mut MultiHeaders<SockaddrStorage>,
    got: &mut Vec<(usize, SocketAddr)>,
) -> io::Result<()> {
    got.clear();
    let mut slices: Vec<[IoSliceMut<'_>; 1]> = bufs
        .chunks_exact_mut(ROOM)
        .map(|c| [IoSliceMut::new(c)])
        .collect();
    let results = recvmmsg(
        socket.as_raw_fd(),
        headers,
        slices.iter_mut(),
        MsgFlags::MSG_WAITFORONE,
        None,
    )?;
    for msg in results {
        let from = msg.address.as_ref().and_then(|a| {
            a.as_sockaddr_in()
                .map(|v4| SocketAddr::from(*v4))
                .or_else(|| a.as_sockaddr_in6().map(|v6| SocketAddr::from(*v6)))
        });
        // A connected socket's datagrams come without an address: the upstream's.
        got.push((
            msg.bytes.min(ROOM),
            from.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
        ));
    }
    Ok(())
}

/// Sends every datagram, blocking while the socket is full; one that the kernel refuses is
/// dropped (its client times out, which dnsperf counts).
fn send(
    socket: &UdpSocket,
    headers: &mut MultiHeaders<SockaddrStorage>,
    slices: &[[IoSlice<'_>; 1]],
    addrs: &[Option<SockaddrStorage>],
) {
    let mut next = 0;
    while next < slices.len() {
        match sendmmsg(
            socket.as_raw_fd(),
            headers,
            &slices[next..],
            &addrs[next..],
            [],
            MsgFlags::empty(),
        ) {
            Ok(r) => next += r.count().max(1),
            Err(_) => next += 1,
        }
    }
}
