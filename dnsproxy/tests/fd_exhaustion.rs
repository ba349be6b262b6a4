//! Running out of file descriptors: new TCP clients are closed at once (not left hanging in
//! the backlog) and counted, UDP goes on being served, and TCP works again once descriptors
//! are free. A binary of its own: the descriptor limit is the whole process's.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

#[allow(
    dead_code,
    reason = "shared with the proxy tests; this test uses part of it"
)]
#[path = "proxy/harness.rs"]
mod harness;
#[allow(
    dead_code,
    reason = "shared with the proxy tests; this test uses part of it"
)]
#[path = "proxy/upstream.rs"]
mod upstream;

use std::fs::File;
use std::net::Ipv4Addr;

use hickory_proto::rr::RecordType;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, UdpSocket};

use crate::harness::{
    Harness, Mode, TcpClient, eventually, ips, parse_reply, patiently, query, udp_recv,
};
use crate::upstream::answer;

const REAL: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

/// Asks over an existing UDP socket (no new descriptor needed).
async fn ask_on(socket: &UdpSocket, server: std::net::SocketAddr) -> hickory_proto::op::Message {
    let q = query("fd.example.", RecordType::A, None);
    socket.send_to(&q, server).await.unwrap();
    let r = udp_recv(socket).await;
    parse_reply(&q, &r)
}

/// Opens `/dev/null` until the process has no descriptor left.
fn exhaust() -> Vec<File> {
    let mut files = Vec::new();
    loop {
        match File::open("/dev/null") {
            Ok(f) => files.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(nix::libc::EMFILE), "{e}");
                return files;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_tcp_clients_are_closed_udp_is_served_and_tcp_comes_back() {
    let h = Harness::start(Mode::Done, |_| {}).await;
    h.upstream
        .rule("fd.example.", answer("fd.example.", [REAL]));
    // Everything the test itself needs while exhausted is opened first.
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let refused: Vec<TcpSocket> = (0..3).map(|_| TcpSocket::new_v4().unwrap()).collect();
    assert_eq!(ips(&ask_on(&udp, h.udp).await), [REAL].into());

    // A low limit keeps the filling quick.
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    setrlimit(Resource::RLIMIT_NOFILE, open + 64, hard).unwrap();
    let files = exhaust();
    assert!(!files.is_empty());

    // The refused clients' own descriptors stay open until the end: closing one would give
    // the proxy a descriptor back.
    let mut closed = Vec::new();
    for socket in refused {
        let mut stream = socket.connect(h.tcp).await.unwrap();
        let q = query("fd.example.", RecordType::A, None);
        let mut framed = u16::try_from(q.len()).unwrap().to_be_bytes().to_vec();
        framed.extend_from_slice(&q);
        // The write may already meet the reset; what matters is the read below.
        let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, &framed).await;
        let mut buf = [0u8; 64];
        // Closed at once, not left hanging in the backlog (where the read would wait forever).
        let read = patiently(stream.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "no reply, a close: {read:?}"
        );
        closed.push(stream);
        // UDP is still served.
        assert_eq!(ips(&ask_on(&udp, h.udp).await), [REAL].into());
    }
    let stats = h.stats();
    assert_eq!(stats.tcp_refused_fd_exhausted, 3, "{stats:?}");
    assert_eq!(stats.tcp_refused, 0, "not the connection limit");

    // Descriptors free again: TCP is served.
    drop(files);
    drop(closed);
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    let mut client = TcpClient::connect(h.tcp).await;
    let q = query("fd.example.", RecordType::A, None);
    client.send_all(&[&q]).await;
    let r = client.recv().await.expect("TCP is back");
    assert_eq!(ips(&parse_reply(&q, &r)), [REAL].into());
    assert!(eventually(|| h.stats().tcp_connections == 1).await);
    h.stop().await;
}
