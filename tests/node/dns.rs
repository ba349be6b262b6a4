//! A DNS client run from inside an endpoint namespace, as a workload would ask its resolver.

use std::net::{IpAddr, SocketAddr};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;

use super::topology::in_netns;
use crate::common::{addrs, question};

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

fn reply((m, from): (Message, SocketAddr), id: u16) -> Reply {
    assert_eq!(m.metadata.id, id, "reply to another query");
    Reply {
        from,
        rcode: m.metadata.response_code,
        addrs: addrs(&m),
    }
}

/// Asks `server` over UDP from namespace `ns` (unconnected socket, so the reply's source is
/// whatever the network delivers); `None` on timeout.
pub(crate) fn udp(ns: &str, server: SocketAddr, name: &str, qtype: RecordType) -> Option<Reply> {
    let q = question(0x4a4a, name, qtype);
    in_netns(ns, move || crate::common::udp(server, &q)).map(|r| reply(r, 0x4a4a))
}

/// Asks `server` over TCP from namespace `ns`; `None` when the connection or read fails.
pub(crate) fn tcp(ns: &str, server: SocketAddr, name: &str, qtype: RecordType) -> Option<Reply> {
    let q = question(0x5b5b, name, qtype);
    in_netns(ns, move || crate::common::tcp(server, &q)).map(|r| reply(r, 0x5b5b))
}
