//! Cilium's policy semantics on the corner cases of ingress, deny rules, entities and ICMP,
//! each expectation written from Cilium's documentation (the page is cited per test), checked
//! on what the engine writes to the datapath: [`MemoryDatapath`] decides as the kernel
//! programs do (the peer's identity first, the most specific entry, a deny on a tie).
//!
//! And a property: for random rules, endpoints and packets, the datapath's verdict equals an
//! oracle that reads the rules directly (a matching deny drops; else, under default deny in
//! that direction, a matching allow passes; else everything passes).

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a fixture that does not load is a bug in the test"
)]

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use fqdnd_engine::Engine;
use fqdnd_ipcache::policy::{Direction, Protocol};
use fqdnd_ipcache::{EndpointId, MemoryDatapath};
use proptest::prelude::*;

const ENDPOINTS: &str = r#"
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: server}
spec: {id: 1, addresses: ["10.0.0.1", "fd00::1"], labels: {role: server}}
---
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: client}
spec: {id: 2, addresses: ["10.0.0.2", "fd00::2"], labels: {role: client}}
---
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: other}
spec: {id: 3, addresses: ["10.0.0.3", "fd00::3"], labels: {role: other}}
"#;

const SERVER: EndpointId = EndpointId(1);
const CLIENT: EndpointId = EndpointId(2);

fn engine(policies: &str) -> Engine<MemoryDatapath> {
    let text = format!("{ENDPOINTS}---\n{policies}");
    let config = fqdnd_config::load_str(&text, Path::new("policy.yaml")).unwrap();
    Engine::from_config(&config, MemoryDatapath::default(), Duration::ZERO).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Whether `ep` receives a new flow from `src` on `proto`/`port`.
fn inbound(
    e: &Engine<MemoryDatapath>,
    ep: EndpointId,
    src: &str,
    proto: Protocol,
    port: u16,
) -> bool {
    e.ipcache
        .datapath()
        .allows_dir(ep, Direction::Ingress, ip(src), proto, port)
}

/// Whether `ep` may open a flow to `dst` on `proto`/`port`.
fn outbound(
    e: &Engine<MemoryDatapath>,
    ep: EndpointId,
    dst: &str,
    proto: Protocol,
    port: u16,
) -> bool {
    e.ipcache
        .datapath()
        .allows_dir(ep, Direction::Egress, ip(dst), proto, port)
}

fn cnp(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {{name: {name}}}\nspec:\n{spec}---\n"
    )
}

/// https://docs.cilium.io/en/latest/security/policy/deny/ — "Deny policies take precedence
/// over allow policies": with L3 and L4 (80/TCP, 81/TCP) allows from the client and an L4 deny
/// of 80/TCP, `curl server:81` is allowed, `curl server:80` denied, `ping` allowed; add an L3
/// deny of the client and all three are denied.
#[test]
fn deny_wins_over_allow_on_the_same_peer() {
    let allows = cnp(
        "allow",
        "  endpointSelector: {matchLabels: {role: server}}\n  ingress:\n  - fromEndpoints: [{matchLabels: {role: client}}]\n  - fromEndpoints: [{matchLabels: {role: client}}]\n    toPorts: [{ports: [{port: \"80\", protocol: TCP}, {port: \"81\", protocol: TCP}]}]\n",
    );
    let deny_l4 = cnp(
        "deny-l4",
        "  endpointSelector: {matchLabels: {role: server}}\n  ingressDeny:\n  - fromEndpoints: [{matchLabels: {role: client}}]\n    toPorts: [{ports: [{port: \"80\", protocol: TCP}]}]\n",
    );
    let deny_l3 = cnp(
        "deny-l3",
        "  endpointSelector: {matchLabels: {role: server}}\n  ingressDeny:\n  - fromEndpoints: [{matchLabels: {role: client}}]\n",
    );
    for client in ["10.0.0.2", "fd00::2"] {
        let icmp = if client.contains(':') {
            Protocol::Icmpv6
        } else {
            Protocol::Icmp
        };
        let echo = if client.contains(':') { 128 } else { 8 };
        let e = engine(&allows);
        assert!(inbound(&e, SERVER, client, Protocol::Tcp, 80));
        assert!(inbound(&e, SERVER, client, Protocol::Tcp, 81));
        assert!(inbound(&e, SERVER, client, icmp, echo));
        let e = engine(&format!("{allows}{deny_l4}"));
        assert!(
            inbound(&e, SERVER, client, Protocol::Tcp, 81),
            "81 has no deny"
        );
        assert!(
            !inbound(&e, SERVER, client, Protocol::Tcp, 80),
            "the deny on 80 wins"
        );
        assert!(
            inbound(&e, SERVER, client, icmp, echo),
            "ping is allowed by the L3 rule"
        );
        let e = engine(&format!("{allows}{deny_l4}{deny_l3}"));
        assert!(!inbound(&e, SERVER, client, Protocol::Tcp, 81));
        assert!(!inbound(&e, SERVER, client, Protocol::Tcp, 80));
        assert!(!inbound(&e, SERVER, client, icmp, echo));
        // Another peer is not the denied one, and no allow names it: default deny.
        assert!(!inbound(&e, SERVER, "10.0.0.3", Protocol::Tcp, 81));
    }
}

/// https://docs.cilium.io/en/latest/security/policy/language/#entities-based — `world` is
/// "all endpoints outside of the cluster", CIDR-selected addresses included (Cilium gives CIDR
/// identities the world label), so `ingressDeny: fromEntities: [world]` beats a `fromCIDR`
/// allow; and `fromEntities: [world]` as an allow admits a CIDR's addresses and unknown ones,
/// not the node's endpoints.
#[test]
fn from_entities_world_against_a_cidr_allow() {
    let cidr_allow = cnp(
        "cidr",
        "  endpointSelector: {matchLabels: {role: server}}\n  ingress:\n  - fromCIDR: [\"203.0.113.0/24\", \"2001:db8::/32\"]\n",
    );
    let e = engine(&cidr_allow);
    assert!(inbound(&e, SERVER, "203.0.113.7", Protocol::Tcp, 443));
    assert!(inbound(&e, SERVER, "2001:db8::7", Protocol::Udp, 53));
    assert!(
        !inbound(&e, SERVER, "198.51.100.1", Protocol::Tcp, 443),
        "outside the CIDR"
    );
    let world_deny = cnp(
        "world-deny",
        "  endpointSelector: {matchLabels: {role: server}}\n  ingressDeny:\n  - fromEntities: [world]\n",
    );
    let e = engine(&format!("{cidr_allow}{world_deny}"));
    assert!(
        !inbound(&e, SERVER, "203.0.113.7", Protocol::Tcp, 443),
        "world deny wins"
    );
    assert!(!inbound(&e, SERVER, "2001:db8::7", Protocol::Udp, 53));
    let world_allow = cnp(
        "world-allow",
        "  endpointSelector: {matchLabels: {role: server}}\n  ingress:\n  - fromEntities: [world]\n",
    );
    let e = engine(&format!("{cidr_allow}{world_allow}"));
    assert!(inbound(&e, SERVER, "203.0.113.7", Protocol::Tcp, 443));
    assert!(
        inbound(&e, SERVER, "198.51.100.1", Protocol::Tcp, 443),
        "unknown: world"
    );
    assert!(inbound(&e, SERVER, "2001:db8:ffff::1", Protocol::Tcp, 443));
    assert!(
        !inbound(&e, SERVER, "10.0.0.2", Protocol::Tcp, 443),
        "an endpoint is not world"
    );
    // world-ipv4 is only the IPv4 half.
    let v4 = cnp(
        "world-v4",
        "  endpointSelector: {matchLabels: {role: server}}\n  ingress:\n  - fromEntities: [world-ipv4]\n",
    );
    let e = engine(&v4);
    assert!(inbound(&e, SERVER, "198.51.100.1", Protocol::Tcp, 443));
    assert!(!inbound(&e, SERVER, "2001:db8:ffff::1", Protocol::Tcp, 443));
    // cluster: the node's endpoints, not the world.
    let cluster = cnp(
        "cluster",
        "  endpointSelector: {matchLabels: {role: server}}\n  ingress:\n  - fromEntities: [cluster]\n",
    );
    let e = engine(&cluster);
    assert!(inbound(&e, SERVER, "10.0.0.2", Protocol::Tcp, 443));
    assert!(inbound(&e, SERVER, "fd00::3", Protocol::Tcp, 443));
    assert!(!inbound(&e, SERVER, "198.51.100.1", Protocol::Tcp, 443));
}

/// https://docs.cilium.io/en/latest/security/policy/intro/ — "Upon being selected by a policy,
/// the endpoint permits only allowed traffic. This state is per-direction"; and an explicit
/// empty peer list selects no identity (cilium/cilium#29608): an ingress rule that selects no
/// peer still puts the endpoint's ingress into default deny, and leaves its egress alone.
#[test]
fn an_ingress_rule_selecting_no_peer_still_enables_default_deny() {
    for section in ["  - fromEndpoints: []\n", "  - fromCIDR: []\n", "  - {}\n"] {
        let e = engine(&cnp(
            "nothing",
            &format!(
                "  endpointSelector: {{matchLabels: {{role: server}}}}\n  ingress:\n{section}"
            ),
        ));
        assert!(
            !inbound(&e, SERVER, "10.0.0.2", Protocol::Tcp, 80),
            "{section}"
        );
        assert!(
            !inbound(&e, SERVER, "198.51.100.1", Protocol::Udp, 53),
            "{section}"
        );
        assert!(
            outbound(&e, SERVER, "198.51.100.1", Protocol::Tcp, 443),
            "egress untouched"
        );
        assert!(
            inbound(&e, CLIENT, "10.0.0.1", Protocol::Tcp, 80),
            "not selected"
        );
        assert_eq!(
            e.ipcache.endpoint_under_policy(SERVER, Direction::Ingress),
            Some(true)
        );
        assert_eq!(
            e.ipcache.endpoint_under_policy(SERVER, Direction::Egress),
            Some(false)
        );
    }
}

/// https://docs.cilium.io/en/latest/security/policy/language/#layer-4-examples — a port
/// without `protocol` applies to every protocol (fqdnd: TCP and UDP); with `protocol: TCP`
/// only to TCP.
#[test]
fn to_ports_with_and_without_protocol() {
    let e = engine(&cnp(
        "ports",
        "  endpointSelector: {matchLabels: {role: client}}\n  egress:\n  - toCIDR: [\"192.0.2.0/24\"]\n    toPorts: [{ports: [{port: \"80\"}]}]\n  - toCIDR: [\"192.0.2.0/24\"]\n    toPorts: [{ports: [{port: \"443\", protocol: TCP}]}]\n",
    ));
    assert!(outbound(&e, CLIENT, "192.0.2.1", Protocol::Tcp, 80));
    assert!(outbound(&e, CLIENT, "192.0.2.1", Protocol::Udp, 80));
    assert!(outbound(&e, CLIENT, "192.0.2.1", Protocol::Tcp, 443));
    assert!(!outbound(&e, CLIENT, "192.0.2.1", Protocol::Udp, 443));
    assert!(
        !outbound(&e, CLIENT, "192.0.2.1", Protocol::Icmp, 8),
        "L4 rules do not allow ICMP"
    );
    assert!(!outbound(&e, CLIENT, "198.51.100.1", Protocol::Tcp, 80));
}

/// The CiliumNetworkPolicy API reference (`enableDefaultDeny`, docs.cilium.io/en/latest/
/// network/kubernetes/policy/ and the Rule type): "If multiple policies apply to an
/// endpoint, that endpoint's default deny will be enabled if any policy requests it" — a
/// policy with `enableDefaultDeny: {egress: false}` alone changes nothing; with another policy
/// that enables default deny, its allows add to that one's.
#[test]
fn default_deny_off_only_adds_allows() {
    let additive = cnp(
        "additive",
        "  endpointSelector: {matchLabels: {role: client}}\n  enableDefaultDeny: {egress: false}\n  egress:\n  - toCIDR: [\"192.0.2.0/24\"]\n",
    );
    let e = engine(&additive);
    assert!(outbound(&e, CLIENT, "192.0.2.1", Protocol::Tcp, 80));
    assert!(
        outbound(&e, CLIENT, "198.51.100.1", Protocol::Tcp, 80),
        "not in default deny"
    );
    let strict = cnp(
        "strict",
        "  endpointSelector: {matchLabels: {role: client}}\n  egress:\n  - toCIDR: [\"203.0.113.0/24\"]\n",
    );
    let e = engine(&format!("{additive}{strict}"));
    assert!(
        outbound(&e, CLIENT, "192.0.2.1", Protocol::Tcp, 80),
        "the additive allow"
    );
    assert!(
        outbound(&e, CLIENT, "203.0.113.1", Protocol::Tcp, 80),
        "the strict allow"
    );
    assert!(
        !outbound(&e, CLIENT, "198.51.100.1", Protocol::Tcp, 80),
        "default deny now"
    );
    // A deny in a direction without default deny still applies.
    let deny = cnp(
        "deny",
        "  endpointSelector: {matchLabels: {role: client}}\n  enableDefaultDeny: {egress: false}\n  egressDeny:\n  - toCIDR: [\"198.51.100.0/24\"]\n",
    );
    let e = engine(&deny);
    assert!(!outbound(&e, CLIENT, "198.51.100.1", Protocol::Tcp, 80));
    assert!(outbound(&e, CLIENT, "192.0.2.1", Protocol::Tcp, 80));
    assert_eq!(
        e.ipcache.endpoint_under_policy(CLIENT, Direction::Egress),
        Some(true)
    );
    assert_eq!(e.ipcache.endpoint_enforcing(CLIENT), Some(false));
}

/// https://docs.cilium.io/en/latest/security/policy/language/#icmp-icmpv6 — `icmps` allows the
/// listed types by number or name, per family; an L3 rule allows every protocol, ICMP too.
#[test]
fn icmps_are_precise() {
    let e = engine(&cnp(
        "icmp",
        "  endpointSelector: {matchLabels: {role: server}}\n  ingress:\n  - fromEntities: [world]\n    icmps: [{fields: [{type: 8}, {type: EchoRequest, family: IPv6}]}]\n",
    ));
    assert!(inbound(&e, SERVER, "198.51.100.1", Protocol::Icmp, 8));
    assert!(
        !inbound(&e, SERVER, "198.51.100.1", Protocol::Icmp, 13),
        "timestamp"
    );
    assert!(inbound(&e, SERVER, "2001:db8::1", Protocol::Icmpv6, 128));
    assert!(
        !inbound(&e, SERVER, "2001:db8::1", Protocol::Icmpv6, 8),
        "8 is IPv4's"
    );
    assert!(
        !inbound(&e, SERVER, "198.51.100.1", Protocol::Tcp, 8),
        "not a TCP port"
    );
}

/// A deny of an FQDN-learned address wins over `toFQDNs` (deny rules may not name FQDNs, but
/// a CIDR deny covers the addresses DNS taught): https://docs.cilium.io/en/latest/security/
/// policy/deny/ ("take precedence over allow policies").
#[test]
fn a_cidr_deny_wins_over_to_fqdns() {
    let mut e = engine(&cnp(
        "fqdn",
        "  endpointSelector: {matchLabels: {role: client}}\n  egress:\n  - toFQDNs: [{matchName: api.example.com}]\n  egressDeny:\n  - toCIDR: [\"192.0.2.66/32\"]\n",
    ));
    e.learn(
        CLIENT,
        "api.example.com.",
        &[ip("192.0.2.65"), ip("192.0.2.66")],
        300,
        Duration::ZERO,
    )
    .unwrap();
    assert!(outbound(&e, CLIENT, "192.0.2.65", Protocol::Tcp, 443));
    assert!(
        !outbound(&e, CLIENT, "192.0.2.66", Protocol::Tcp, 443),
        "denied address"
    );
}

/// https://docs.cilium.io/en/latest/security/policy/language/#entities-based — "host: The
/// host entity includes the local host"; "cluster: ... all Cilium-managed endpoints of the
/// local cluster ... as well as the host"; `world` is outside the cluster, so not the host.
/// And .../language/#selecting-nodes-with-cidr-ipblock: "By default, CIDR-based selectors do
/// not match in-cluster entities (pods or nodes)". The node's addresses are what the agent
/// tells the engine; an endpoint's address stays the endpoint's.
#[test]
fn the_host_entity_is_the_nodes_own_addresses() {
    let policy = |peer: &str| {
        cnp(
            "p",
            &format!(
                "  endpointSelector: {{matchLabels: {{role: server}}}}\n  ingress:\n  - {peer}\n  egress:\n  - {}\n",
                peer.replace("from", "to")
            ),
        )
    };
    let host = ["10.0.0.254", "fd00::fe", "192.0.2.1"];
    for (peer, host_ok, world_ok, endpoint_ok) in [
        ("fromEntities: [host]", true, false, false),
        ("fromEntities: [cluster]", true, false, true),
        ("fromEntities: [world]", false, true, false),
        ("fromEntities: [all]", true, true, true),
        (
            "fromCIDR: [\"192.0.2.0/24\", \"10.0.0.0/8\", \"fd00::/64\"]",
            false,
            false,
            false,
        ),
    ] {
        let mut e = engine(&policy(peer));
        // Before the node tells its addresses they are the world's.
        assert_eq!(
            inbound(&e, SERVER, "10.0.0.254", Protocol::Tcp, 22),
            world_ok || peer.contains("CIDR"),
            "{peer}"
        );
        let mut addrs: Vec<IpAddr> = host.iter().map(|a| ip(a)).collect();
        // An endpoint's address listed among the node's stays the endpoint's.
        addrs.push(ip("10.0.0.2"));
        assert!(e.set_host_addresses(&addrs).unwrap());
        assert!(!e.set_host_addresses(&addrs).unwrap(), "no change");
        for a in host {
            assert_eq!(
                inbound(&e, SERVER, a, Protocol::Tcp, 22),
                host_ok,
                "{peer} from {a}"
            );
            assert_eq!(
                outbound(&e, SERVER, a, Protocol::Tcp, 22),
                host_ok,
                "{peer} to {a}"
            );
        }
        assert_eq!(
            inbound(&e, SERVER, "198.51.100.1", Protocol::Tcp, 22),
            world_ok,
            "{peer}"
        );
        assert_eq!(
            inbound(&e, SERVER, "10.0.0.2", Protocol::Tcp, 22),
            endpoint_ok,
            "{peer}: 10.0.0.2 is the client endpoint"
        );
        let x = fqdnd_engine::explain::explain(
            &e.ipcache,
            fqdnd_engine::explain::Flow {
                endpoint: SERVER,
                direction: Direction::Ingress,
                peer: ip("fd00::fe"),
                protocol: Protocol::Tcp,
                port: 22,
            },
        );
        assert_eq!((x.identity, x.labels.as_str()), (1, "reserved:host"));
        assert_eq!((x.allowed, x.datapath_allowed), (host_ok, host_ok), "{x}");
        // An address the node no longer has is the world's again.
        e.set_host_addresses(&[ip("10.0.0.254")]).unwrap();
        assert_eq!(
            inbound(&e, SERVER, "192.0.2.1", Protocol::Tcp, 22),
            world_ok || peer.contains("CIDR"),
            "{peer}"
        );
        assert_eq!(
            inbound(&e, SERVER, "10.0.0.254", Protocol::Tcp, 22),
            host_ok
        );
    }
}

/// The dashboard's Policy page: each endpoint with every section of the rules selecting it,
/// in rule order, peers and ports rendered; an endpoint no rule selects has none.
#[test]
fn policies_list_the_sections_selecting_each_endpoint() {
    use fqdnd_engine::explain::{Section, policies};
    let e = engine(&format!(
        "{}{}",
        cnp(
            "allow",
            "  endpointSelector: {matchLabels: {role: server}}\n  ingress:\n  - fromEndpoints: [{matchLabels: {role: client}}]\n    toPorts: [{ports: [{port: \"80\", endPort: 82, protocol: TCP}, {port: \"53\", protocol: UDP}]}]\n  egress:\n  - toCIDR: [192.0.2.0/24]\n",
        ),
        cnp(
            "deny",
            "  endpointSelector: {matchLabels: {role: server}}\n  ingressDeny:\n  - fromEntities: [world]\n",
        ),
    ));
    let listed = policies(&e.ipcache);
    let ids: Vec<u16> = listed.iter().map(|p| p.endpoint).collect();
    assert_eq!(ids, [1, 2, 3]);
    let server = &listed[0];
    assert_eq!(server.name, "server");
    assert!(
        server.labels.iter().any(|l| l.ends_with(":role=server")),
        "{:?}",
        server.labels
    );
    let shown: Vec<(&str, bool, Vec<&str>, &str)> = server
        .sections
        .iter()
        .map(|s: &Section| {
            (
                s.section.as_str(),
                s.deny,
                s.peers.iter().map(String::as_str).collect(),
                s.ports.as_str(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("egress[0]", false, vec!["CIDR 192.0.2.0/24"], "any"),
            (
                "ingress[0]",
                false,
                vec!["endpoints role=client,k8s:io.kubernetes.pod.namespace=default"],
                "TCP/80-82, UDP/53",
            ),
            ("ingressDeny[0]", true, vec!["entity world"], "any"),
        ]
    );
    assert!(
        server.sections[0].origin.contains("allow"),
        "{}",
        server.sections[0].origin
    );
    assert!(server.sections[2].origin.contains("deny"));
    assert!(listed[1].sections.is_empty() && listed[2].sections.is_empty());
}

/// `fqdnd policy explain`: the deny that wins and the allows it shadows, the allow that
/// decides, and default deny, in both directions.
#[test]
fn explain_names_the_deciding_rule() {
    use fqdnd_engine::explain::{Flow, explain};
    let e = engine(&format!(
        "{}{}",
        cnp(
            "allow",
            "  endpointSelector: {matchLabels: {role: server}}\n  ingress:\n  - fromEndpoints: [{matchLabels: {role: client}}]\n    toPorts: [{ports: [{port: \"80\", protocol: TCP}]}]\n  - fromEntities: [cluster]\n",
        ),
        cnp(
            "deny",
            "  endpointSelector: {matchLabels: {role: server}}\n  ingressDeny:\n  - fromEndpoints: [{matchLabels: {role: other}}]\n",
        ),
    ));
    let flow = |peer: &str, port: u16| Flow {
        endpoint: SERVER,
        direction: Direction::Ingress,
        peer: ip(peer),
        protocol: Protocol::Tcp,
        port,
    };
    let x = explain(&e.ipcache, flow("10.0.0.2", 80));
    assert!(x.allowed && x.datapath_allowed, "{x}");
    assert_eq!(x.matches.len(), 2, "{x}");
    assert!(x.reason.starts_with("allowed by policy.yaml:"), "{x}");
    // (a policy without `metadata.namespace` is in `default`, and so are its peers)
    assert!(
        x.to_string()
            .contains("endpoints role=client,k8s:io.kubernetes.pod.namespace=default on TCP/80"),
        "{x}"
    );
    let x = explain(&e.ipcache, flow("10.0.0.3", 80));
    assert!(!x.allowed && !x.datapath_allowed, "{x}");
    assert!(
        x.reason.contains("deny ingressDeny[0]") && x.reason.contains("shadows 1 matching allow"),
        "{x}"
    );
    assert!(x.matches[0].deny && !x.matches[1].deny, "denies first: {x}");
    let x = explain(&e.ipcache, flow("198.51.100.1", 80));
    assert!(!x.allowed && x.default_deny && x.matches.is_empty(), "{x}");
    assert!(x.reason.contains("default deny"), "{x}");
    // Egress is not under policy for the server.
    let x = explain(
        &e.ipcache,
        Flow {
            direction: Direction::Egress,
            ..flow("198.51.100.1", 443)
        },
    );
    assert!(x.allowed && !x.default_deny, "{x}");
    let x = explain(
        &e.ipcache,
        Flow {
            endpoint: EndpointId(99),
            ..flow("10.0.0.2", 80)
        },
    );
    assert!(!x.allowed && !x.known_endpoint, "{x}");
}

// ---- the property ----

/// A random rule's pieces: peers are drawn from a small pool so that they overlap.
#[derive(Debug, Clone)]
struct Section {
    peer: usize,
    ports: Option<(bool, u16, u16)>,
}

const PEERS: &[&str] = &[
    "fromCIDR: [\"192.0.2.0/24\"]",
    "fromCIDR: [\"192.0.2.128/25\"]",
    "fromCIDRSet: [{cidr: \"192.0.2.0/24\", except: [\"192.0.2.64/26\"]}]",
    "fromEntities: [world]",
    "fromEntities: [cluster]",
    "fromEntities: [all]",
    "fromEndpoints: [{matchLabels: {role: client}}]",
    "",
];

/// The sources packets come from: in and around the peers.
const SOURCES: &[&str] = &[
    "192.0.2.1",
    "192.0.2.65",
    "192.0.2.130",
    "198.51.100.1",
    "10.0.0.2",
    "10.0.0.3",
];

fn peer_matches(peer: usize, src: &str) -> bool {
    let a: IpAddr = ip(src);
    let in_net = |net: &str| net.parse::<ipnet::IpNet>().unwrap().contains(&a);
    let endpoint = ["10.0.0.1", "10.0.0.2", "10.0.0.3"].contains(&src);
    match peer {
        0 => in_net("192.0.2.0/24"),
        1 => in_net("192.0.2.128/25"),
        2 => in_net("192.0.2.0/24") && !in_net("192.0.2.64/26"),
        3 => !endpoint,
        4 => endpoint,
        5 | 7 => true,
        6 => src == "10.0.0.2",
        _ => false,
    }
}

fn section_yaml(s: &Section) -> String {
    let mut out = String::from("  - ");
    let peer = PEERS[s.peer];
    let mut first = true;
    if !peer.is_empty() {
        out.push_str(peer);
        out.push('\n');
        first = false;
    }
    if let Some((tcp, lo, hi)) = s.ports {
        if !first {
            out.push_str("    ");
        }
        let proto = if tcp { "TCP" } else { "UDP" };
        out.push_str(&format!(
            "toPorts: [{{ports: [{{port: \"{lo}\", endPort: {hi}, protocol: {proto}}}]}}]\n"
        ));
        first = false;
    }
    if first {
        out.push_str("fromCIDR: [\"192.0.2.0/24\"]\n");
    }
    out
}

fn section_matches(s: &Section, src: &str, tcp: bool, port: u16) -> bool {
    let peer = if PEERS[s.peer].is_empty() && s.ports.is_none() {
        0
    } else {
        s.peer
    };
    peer_matches(peer, src)
        && s.ports
            .is_none_or(|(t, lo, hi)| t == tcp && (lo..=hi).contains(&port))
}

fn section() -> impl Strategy<Value = Section> {
    (
        0..PEERS.len(),
        proptest::option::of((any::<bool>(), 1u16..8, 0u16..4)),
    )
        .prop_map(|(peer, ports)| Section {
            peer,
            ports: ports.map(|(tcp, lo, len)| (tcp, lo, lo + len)),
        })
}

#[derive(Debug, Clone)]
struct RuleSpec {
    allows: Vec<Section>,
    denies: Vec<Section>,
    default_deny: bool,
}

fn rule() -> impl Strategy<Value = RuleSpec> {
    (
        proptest::collection::vec(section(), 0..3),
        proptest::collection::vec(section(), 0..3),
        any::<bool>(),
    )
        .prop_filter("a rule has a section", |(a, d, _)| {
            !a.is_empty() || !d.is_empty()
        })
        .prop_map(|(allows, denies, default_deny)| RuleSpec {
            allows,
            denies,
            default_deny,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_datapath_decides_as_the_rules_say(rules in proptest::collection::vec(rule(), 1..4)) {
        let mut text = String::new();
        for (i, r) in rules.iter().enumerate() {
            let mut spec = String::from("  endpointSelector: {matchLabels: {role: server}}\n");
            if !r.default_deny {
                spec.push_str("  enableDefaultDeny: {ingress: false}\n");
            }
            if !r.allows.is_empty() {
                spec.push_str("  ingress:\n");
                for s in &r.allows {
                    spec.push_str(&section_yaml(s));
                }
            }
            if !r.denies.is_empty() {
                spec.push_str("  ingressDeny:\n");
                for s in &r.denies {
                    spec.push_str(&section_yaml(s));
                }
            }
            text.push_str(&cnp(&format!("r{i}"), &spec));
        }
        let e = engine(&text);
        let default_deny = rules.iter().any(|r| r.default_deny && !r.allows.is_empty())
            || rules.iter().any(|r| r.default_deny && !r.denies.is_empty());
        for src in SOURCES {
            for tcp in [true, false] {
                for port in 1u16..12 {
                    let denied = rules.iter().flat_map(|r| &r.denies).any(|s| section_matches(s, src, tcp, port));
                    let allowed = rules.iter().flat_map(|r| &r.allows).any(|s| section_matches(s, src, tcp, port));
                    let want = !denied && (!default_deny || allowed);
                    let proto = if tcp { Protocol::Tcp } else { Protocol::Udp };
                    prop_assert_eq!(
                        inbound(&e, SERVER, src, proto, port),
                        want,
                        "{} {:?}/{} with\n{}", src, proto, port, text
                    );
                    // `fqdnd policy explain` reads the rules to the same verdict.
                    let x = fqdnd_engine::explain::explain(&e.ipcache, fqdnd_engine::explain::Flow {
                        endpoint: SERVER,
                        direction: Direction::Ingress,
                        peer: ip(src),
                        protocol: proto,
                        port,
                    });
                    prop_assert_eq!((x.allowed, x.datapath_allowed), (want, want), "{}\nwith\n{}", x, text);
                }
            }
        }
    }
}
