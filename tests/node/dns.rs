//! A DNS client run from inside an endpoint namespace, as a workload would ask its resolver.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

use super::topology::in_netns;

/// What came back.
#[derive(Debug)]
pub(crate) struct Reply {
    /// Where the UDP reply came from (for TCP: the address connected to).
    pub(crate) from: SocketAddr,
    /// Response code.
    pub(crate) rcode: ResponseCode,
    /// A and AAAA addresses in the answer.
    pub(crate) addrs: Vec<IpAddr>,
}

fn query_bytes(name: &str, qtype: RecordType, id: u16) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.queries
        .push(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m.to_vec().unwrap()
}

fn reply(bytes: &[u8], from: SocketAddr, id: u16) -> Reply {
    let m = Message::from_vec(bytes).unwrap();
    assert_eq!(m.metadata.id, id, "reply to another query");
    Reply {
        from,
        rcode: m.metadata.response_code,
        addrs: m
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                _ => None,
            })
            .collect(),
    }
}

/// Asks `server` over UDP from namespace `ns` (unconnected socket, so the reply's source is
/// whatever the network delivers); `None` on timeout.
pub(crate) fn udp(ns: &str, server: SocketAddr, name: &str, qtype: RecordType) -> Option<Reply> {
    let name = name.to_owned();
    in_netns(ns, move || {
        let bind: SocketAddr = if server.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        let socket = UdpSocket::bind(bind).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let id = 0x4a4a;
        socket
            .send_to(&query_bytes(&name, qtype, id), server)
            .unwrap();
        let mut buf = [0u8; 4096];
        let (n, from) = socket.recv_from(&mut buf).ok()?;
        Some(reply(&buf[..n], from, id))
    })
}

/// Asks `server` over TCP from namespace `ns`; `None` when the connection or read fails.
pub(crate) fn tcp(ns: &str, server: SocketAddr, name: &str, qtype: RecordType) -> Option<Reply> {
    let name = name.to_owned();
    in_netns(ns, move || {
        let mut stream = TcpStream::connect_timeout(&server, Duration::from_secs(3)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let id = 0x5b5b;
        let q = query_bytes(&name, qtype, id);
        let mut framed = u16::try_from(q.len()).unwrap().to_be_bytes().to_vec();
        framed.extend_from_slice(&q);
        stream.write_all(&framed).ok()?;
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).ok()?;
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut buf).ok()?;
        Some(reply(&buf, stream.peer_addr().ok()?, id))
    })
}
