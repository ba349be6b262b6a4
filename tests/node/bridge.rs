//! Endpoints behind a Linux bridge (what the CNI `bridge` plugin builds): the endpoint's
//! host-side veth is a port of a bridge that holds the gateway addresses.

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::dns::{self, Over};
use crate::topology::{Topology, sh};
use crate::{A_PORTS, node_config, reaches_only, resolve, sa, topology};

/// Moves endpoint A's host-side addresses from its veth to a new bridge and makes the veth
/// a port of it; returns the bridge's name.
fn bridge_endpoint_a(t: &Topology) -> String {
    let (n, host, hif) = (t.n, &t.host, &t.if_a);
    let br = format!("{hif}br");
    sh(&format!(
        "ip -n {host} addr flush dev {hif} && \
         ip -n {host} link add {br} type bridge && \
         ip -n {host} link set {hif} master {br} && \
         ip -n {host} addr add 10.{n}.1.1/24 dev {br} && \
         ip -n {host} addr add fd00:{n}:1::1/64 dev {br} nodad && \
         ip -n {host} link set {br} up"
    ));
    br
}

/// Guards DNS and policy for an endpoint whose interface is a bridge's port. The redirect at
/// the port assigns the query to the proxy's socket, but the bridge passes the frame up as a
/// packet of the bridge device without that assignment: before, every query of a bridged
/// endpoint was dropped (UDP: no socket on the resolver's address). The agent now redirects
/// the bridged endpoints' DNS at the bridge's ingress too; policy stays at the port.
#[test]
fn a_bridged_endpoint_resolves_through_the_proxy_and_is_enforced() {
    let Some(mut t) = topology("bridge") else {
        return;
    };
    let br = bridge_endpoint_a(&t);
    t.write_node_config(&node_config(&t, A_PORTS));
    t.start_node(&t.config_dir());

    let listing = t.bpf_list("endpoint");
    assert!(
        listing
            .lines()
            .any(|l| l.contains(&br) && l.contains("bridge")),
        "{listing}"
    );
    for qtype in [RecordType::A, RecordType::AAAA] {
        let reply = resolve(&t, "api.example.test.", qtype);
        assert_eq!(reply.rcode, ResponseCode::NoError, "{}", t.logs());
        let reply = resolve(&t, "evil.example.test.", qtype);
        assert_eq!(reply.rcode, ResponseCode::Refused, "{}", t.logs());
    }
    // Over TCP (the port's redirect finds the proxy's connection socket; the bridge's does
    // again).
    let reply = dns::ask(
        &t,
        Over::Tcp,
        &t.ep_a,
        sa(t.v4(9, 53), 53),
        "api.example.test.",
        RecordType::A,
    );
    assert_eq!(reply.rcode, ResponseCode::NoError, "{}", t.logs());
    reaches_only(&t, sa(t.v4(10, 1), 8080), t.v4(10, 3));
    reaches_only(&t, sa(t.v6(10, 1), 8080), t.v6(10, 3));
}
