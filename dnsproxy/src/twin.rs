//! Send-only twins of the UDP listener sockets.
//!
//! A listener socket is watched for reads (a shard thread's `epoll` set, or the reactor), and
//! a watched socket hears of every datagram the kernel frees from its send buffer:
//! `sock_wfree` walks the socket's wait queue into `ep_poll_callback` for each reply sent,
//! though nobody waits for write space. So the replies leave through a twin: a second socket
//! bound to the same address and port, in the same `SO_REUSEPORT` group, that nothing watches.
//!
//! The group's classic BPF program (set once the receivers are bound, before any twin is)
//! hands each datagram to one of the first `n` sockets of the group, the receivers, by a hash
//! of its source address and port, so one client socket keeps reaching the same receiver; the
//! twins, bound after the receivers, are never chosen and receive nothing.
//!
//! Twins are made only where that holds: not in transparent mode (replies from an address
//! other than the listener's leave through the raw socket there), and only when no socket
//! held the address before the listeners bound (another process's sockets in the group would
//! move the receivers' places in it). Anywhere else, or if the kernel refuses the program, a
//! listener sends its replies itself, as before.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;

use nix::libc;
use nix::sys::socket::{setsockopt, sockopt};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::proxy::UdpListener;
use crate::udp::{UdpSocket, Watcher};

/// Whether nothing is bound to `addr` now (port 0: a port is picked, so nothing can be). A
/// plain bind, without `SO_REUSEPORT`, fails if any socket holds the address.
pub(crate) fn address_is_free(addr: SocketAddr) -> bool {
    if addr.port() == 0 {
        return true;
    }
    let Ok(probe) = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)) else {
        return false;
    };
    if addr.is_ipv6() && probe.set_only_v6(true).is_err() {
        return false;
    }
    probe.bind(&SockAddr::from(addr)).is_ok()
}

/// Gives each of `listeners` (every socket bound at `addr`, in bind order) a send-only twin,
/// once the group's program keeps datagrams from the twins. If the kernel refuses, the
/// listeners send their own replies.
pub(crate) fn add_twins(listeners: &mut [UdpListener], addr: SocketAddr) {
    let Some(first) = listeners.first() else {
        return;
    };
    if let Err(e) = steer_to_receivers(&first.socket, listeners.len(), addr.is_ipv6()) {
        tracing::debug!(%addr, error = %e, "UDP replies leave through the listeners: no steering program");
        return;
    }
    for listener in listeners.iter_mut() {
        match bind_twin(addr) {
            Ok(socket) => listener.twin = Some(socket),
            Err(e) => {
                tracing::debug!(%addr, error = %e, "a UDP listener sends its own replies: no twin");
                return;
            }
        }
    }
}

/// Sets the program of the `SO_REUSEPORT` group `receiver` belongs to: each datagram goes to
/// one of the group's first `receivers` sockets.
fn steer_to_receivers(receiver: &impl AsFd, receivers: usize, ipv6: bool) -> io::Result<()> {
    let receivers = u32::try_from(receivers)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no receiver to steer to"))?;
    let mut program = steering_program(receivers, ipv6);
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    setsockopt(receiver, sockopt::AttachReusePortCbpf, &fprog).map_err(io::Error::from)
}

/// Binds a send-only twin at `addr` (a receiver's bound address), in its `SO_REUSEPORT` group.
fn bind_twin(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_port(true)?;
    // Broadcasts reach every socket bound to the port, a twin too, and nobody reads it: the
    // least buffer the kernel allows; best effort.
    let _ = socket.set_recv_buffer_size(0);
    socket.bind(&SockAddr::from(addr))?;
    UdpSocket::new(socket.into(), Watcher::Nobody)
}

/// Absolute loads relative to the network header: at the program's run the packet's data
/// starts after the UDP header.
const NET: u32 = libc::SKF_NET_OFF as u32;

fn op(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The classic BPF program: X = the source address (IPv6: its four words xored); A = the
/// source port if the UDP header follows the IP header directly, else 0; then
/// `((A ^ X) * golden) >> 16` modulo `receivers`. A load past the packet's end makes the
/// program return 0: the first receiver.
fn steering_program(receivers: u32, ipv6: bool) -> Vec<libc::sock_filter> {
    use libc::{
        BPF_A, BPF_ABS, BPF_ALU, BPF_B, BPF_H, BPF_IMM, BPF_JA, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD,
        BPF_MISC, BPF_MOD, BPF_MUL, BPF_RET, BPF_RSH, BPF_TAX, BPF_W, BPF_X, BPF_XOR,
    };
    let load_word = |offset: u32| op(BPF_LD | BPF_W | BPF_ABS, 0, 0, NET + offset);
    let tax = op(BPF_MISC | BPF_TAX, 0, 0, 0);
    let xor_x = op(BPF_ALU | BPF_XOR | BPF_X, 0, 0, 0);
    let mut program = Vec::with_capacity(24);
    let (udp_follows, port_at) = if ipv6 {
        // Source address at 8..24; next header at 6 (17: UDP, header at 40).
        program.extend([load_word(8), tax, load_word(12), xor_x, tax]);
        program.extend([load_word(16), xor_x, tax, load_word(20), xor_x, tax]);
        program.push(op(BPF_LD | BPF_B | BPF_ABS, 0, 0, NET + 6));
        (op(BPF_JMP | BPF_JEQ | BPF_K, 0, 2, 17), 40)
    } else {
        // Source address at 12; a header of 5 words (0x45) puts the UDP header at 20.
        program.extend([load_word(12), tax]);
        program.push(op(BPF_LD | BPF_B | BPF_ABS, 0, 0, NET));
        (op(BPF_JMP | BPF_JEQ | BPF_K, 0, 2, 0x45), 20)
    };
    program.extend([
        udp_follows,
        op(BPF_LD | BPF_H | BPF_ABS, 0, 0, NET + port_at),
        op(BPF_JMP | BPF_JA, 0, 0, 1),
        op(BPF_LD | BPF_IMM, 0, 0, 0),
        xor_x,
        op(BPF_ALU | BPF_MUL | BPF_K, 0, 0, 0x9e37_79b1),
        op(BPF_ALU | BPF_RSH | BPF_K, 0, 0, 16),
        op(BPF_ALU | BPF_MOD | BPF_K, 0, 0, receivers),
        op(BPF_RET | BPF_A, 0, 0, 0),
    ]);
    program
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::time::Duration;

    /// Binds `n` listeners at `addr` and gives them twins, as the proxy does.
    fn group(addr: &str, n: usize) -> Vec<UdpListener> {
        let mut local: SocketAddr = addr.parse().unwrap();
        let mut listeners = Vec::new();
        for _ in 0..n {
            let socket = crate::listen::bind_udp(local, false, Watcher::Shard).unwrap();
            local = socket.local_addr().unwrap();
            listeners.push(UdpListener {
                socket,
                twin: None,
                local,
            });
        }
        add_twins(&mut listeners, local);
        assert!(
            listeners.iter().all(|l| l.twin.is_some()),
            "every listener has its twin"
        );
        listeners
    }

    /// Sends from `clients` sockets twice each; returns, per client, the listeners that got
    /// its datagrams, and checks that no twin got any.
    fn deliveries(addr: &str, n: usize, clients: usize) -> Vec<Vec<usize>> {
        use nix::sys::socket::{MsgFlags, SockaddrStorage, recv, recvfrom};
        use std::os::fd::AsRawFd;
        let listeners = group(addr, n);
        let to = listeners[0].local;
        let senders: Vec<_> = (0..clients)
            .map(|_| std::net::UdpSocket::bind(SocketAddr::new(to.ip(), 0)).unwrap())
            .collect();
        for round in 0..2u8 {
            for (i, s) in senders.iter().enumerate() {
                s.send_to(&[round, i as u8], to).unwrap();
            }
        }
        let mut got: HashMap<SocketAddr, Vec<usize>> = HashMap::new();
        let mut buf = [0u8; 8];
        let (mut received, deadline) = (0, tokio::time::Instant::now() + Duration::from_secs(60));
        while received < 2 * clients && tokio::time::Instant::now() < deadline {
            for (r, listener) in listeners.iter().enumerate() {
                // The listeners are non-blocking: each read ends when one is empty.
                while let Ok((_, Some(from))) =
                    recvfrom::<SockaddrStorage>(listener.socket.as_raw_fd(), &mut buf)
                {
                    let from = crate::batch::to_socket_addr(&from).unwrap();
                    got.entry(from).or_default().push(r);
                    received += 1;
                }
            }
            std::thread::yield_now();
        }
        for twin in listeners.iter().filter_map(|l| l.twin.as_ref()) {
            let unread = recv(twin.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT);
            assert_eq!(
                unread,
                Err(nix::errno::Errno::EAGAIN),
                "a twin received a datagram"
            );
        }
        assert_eq!(received, 2 * clients, "datagrams went missing");
        senders
            .iter()
            .map(|s| got.remove(&s.local_addr().unwrap()).unwrap_or_default())
            .collect()
    }

    fn check(addr: &str) {
        let per_client = deliveries(addr, 3, 48);
        let mut used = [0usize; 3];
        for got in &per_client {
            assert_eq!(
                got.len(),
                2,
                "a client's two datagrams were not both received"
            );
            assert_eq!(got[0], got[1], "one client reached two receivers");
            used[got[0]] += 1;
        }
        // 48 clients over 3 receivers: each gets some (all on two would be chance 3·(2/3)^48).
        assert!(used.iter().all(|&n| n > 0), "receivers used: {used:?}");
    }

    #[test]
    fn datagrams_reach_the_receivers_by_client_and_never_a_twin_v4() {
        check("127.0.0.1:0");
    }

    #[test]
    fn datagrams_reach_the_receivers_by_client_and_never_a_twin_v6() {
        check("[::1]:0");
    }

    #[test]
    fn a_held_address_is_not_free() {
        let held = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(!address_is_free(held.local_addr().unwrap()));
        let port = held.local_addr().unwrap().port();
        drop(held);
        assert!(address_is_free(SocketAddr::from(([127, 0, 0, 1], port))));
        assert!(address_is_free("127.0.0.1:0".parse().unwrap()));
    }
}
