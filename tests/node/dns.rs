//! A DNS client run from inside an endpoint namespace, as a workload would ask its resolver.

use std::net::{IpAddr, SocketAddr};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;

use super::topology::{Topology, in_netns};
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

/// Which transport a question takes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Over {
    /// An unconnected socket, so the reply's source is whatever the network delivers.
    Udp,
    /// The reply's `from` is the address connected to.
    Tcp,
}

/// Asks `server` for `name` from namespace `ns`; panics (with the daemons' logs) without an
/// answer.
pub(crate) fn ask(
    t: &Topology,
    over: Over,
    ns: &str,
    server: SocketAddr,
    name: &str,
    qtype: RecordType,
) -> Reply {
    let q = question(0x4a4a, name, qtype);
    let exchanged = in_netns(ns, move || match over {
        Over::Udp => crate::common::udp(server, &q),
        Over::Tcp => crate::common::tcp(server, &q),
    });
    let got = exchanged.unwrap_or_else(|| {
        panic!(
            "no answer over {over:?} from {server} for {name}\n{}",
            t.logs()
        )
    });
    reply(got, 0x4a4a)
}
