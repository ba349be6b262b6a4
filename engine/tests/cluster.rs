//! Cluster mode through the engine: a local endpoint runs on a temporary identity until the
//! cluster assigns its label set a number, other nodes' endpoints join the ipcache once their
//! set has one, and what DNS answers teach stays node-local — its identities come from the
//! node's own range whatever the cluster does (issue 16, point 6); ingress, deny sections and
//! entities select other nodes' endpoints and local ones on a temporary identity (issue 18);
//! the other nodes' own addresses are the remote-node identity.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a fixture that does not load is a bug in the test"
)]

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use fqdnd_engine::explain::{Flow, explain};
use fqdnd_engine::{ClusterUpdate, Engine, IdentityMode, RemoteEndpoint, RemoteNode};
use fqdnd_ipcache::policy::{Direction, Protocol};
use fqdnd_ipcache::{EndpointId, EndpointLabel, Identity, MemoryDatapath, host_prefix};

const CONFIG: &str = r#"
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: web}
spec: {id: 100, addresses: ["10.0.0.1/32"], labels: {app: web}}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web}
spec:
  endpointSelector: {matchLabels: {app: web}}
  egress:
  - toFQDNs: [{matchName: api.example.com}]
  - toEndpoints: [{matchLabels: {app: db}}]
"#;

/// Node-local identities (CIDR and FQDN label sets): 2^24+1 … 2^24+2^16−1.
fn node_local(id: Identity) -> bool {
    (0x0100_0001..0x0101_0000).contains(&id.0)
}

fn temporary(id: Identity) -> bool {
    (0x0101_0000..=0x0101_03FF).contains(&id.0)
}

/// The label set of an endpoint `app: value` without a namespace (so in `default`, as the
/// configuration labels it and other nodes publish it).
fn app(value: &str) -> Vec<EndpointLabel> {
    vec![
        EndpointLabel {
            source: "k8s".to_owned(),
            key: "app".to_owned(),
            value: value.to_owned(),
        },
        EndpointLabel {
            source: "k8s".to_owned(),
            key: "io.kubernetes.pod.namespace".to_owned(),
            value: "default".to_owned(),
        },
    ]
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn endpoints_take_cluster_numbers_and_answers_stay_node_local() {
    let config = fqdnd_config::load_str(CONFIG, Path::new("node.yaml")).unwrap();
    let mut engine = Engine::new(
        &config.settings,
        IdentityMode::Selector,
        MemoryDatapath::default(),
    );
    engine.enable_cluster();
    engine
        .apply(
            config.endpoints.clone(),
            config.rules.clone(),
            Duration::ZERO,
        )
        .unwrap();
    let web = host_prefix(ip("10.0.0.1"));
    let before = engine.ipcache.identity_of(&web).unwrap();
    assert!(temporary(before), "{before:?}");

    // A DNS answer: its identity is the node's own, and the cluster never renumbers it.
    engine
        .learn(
            EndpointId(100),
            "api.example.com.",
            &[ip("192.0.2.1")],
            300,
            Duration::ZERO,
        )
        .unwrap();
    let answer = host_prefix(ip("192.0.2.1"));
    let learned = engine.ipcache.identity_of(&answer).unwrap();
    assert!(node_local(learned), "{learned:?}");
    assert!(engine.ipcache.has_fqdn_label(learned));

    // The cluster assigns web's set a number and another node's db endpoint appears.
    engine
        .apply_cluster(ClusterUpdate {
            assigned: vec![(app("web"), Identity(300)), (app("db"), Identity(301))],
            remote_upserted: vec![RemoteEndpoint {
                name: "/p/endpoints/k8s:app=db/node2/7".to_owned(),
                addresses: vec![host_prefix(ip("10.1.0.7"))],
                labels: app("db"),
            }],
            ..ClusterUpdate::default()
        })
        .unwrap();
    assert_eq!(engine.ipcache.identity_of(&web), Some(Identity(300)));
    assert!(engine.ipcache.temporary_identities().is_empty());
    assert_eq!(
        engine.ipcache.identity_of(&host_prefix(ip("10.1.0.7"))),
        Some(Identity(301))
    );
    assert_eq!(engine.ipcache.identity_of(&answer), Some(learned));
    // web's policy allows the remote db endpoint's number and the answer's identity.
    let allowed: Vec<u32> = engine
        .ipcache
        .endpoint_policy(EndpointId(100))
        .unwrap()
        .iter()
        .map(|k| k.identity.0)
        .collect();
    assert!(allowed.contains(&301), "{allowed:?}");
    assert!(allowed.contains(&learned.0), "{allowed:?}");

    // A second answer after the switch: node-local too.
    engine
        .learn(
            EndpointId(100),
            "api.example.com.",
            &[ip("192.0.2.2")],
            300,
            Duration::ZERO,
        )
        .unwrap();
    let second = engine
        .ipcache
        .identity_of(&host_prefix(ip("192.0.2.2")))
        .unwrap();
    assert!(node_local(second), "{second:?}");

    // The cluster takes db's number away: the remote endpoint leaves the ipcache; web goes
    // back to a temporary identity when its number goes.
    engine
        .apply_cluster(ClusterUpdate {
            unassigned: vec![app("db"), app("web")],
            ..ClusterUpdate::default()
        })
        .unwrap();
    assert_eq!(
        engine.ipcache.identity_of(&host_prefix(ip("10.1.0.7"))),
        None
    );
    let after = engine.ipcache.identity_of(&web).unwrap();
    assert!(temporary(after), "{after:?}");
    assert_eq!(engine.ipcache.identity_of(&answer), Some(learned));
}

/// Where cluster mode meets the policy users write (issues 16 and 18): `fromEndpoints` and
/// ingress sections select other nodes' endpoints by the global identity their addresses
/// carry, the `cluster` entity holds every endpoint of the cluster — other nodes' ones, and
/// local ones still on a temporary identity — and the host identity stays this node's own.
const MEET: &str = r#"
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: web}
spec: {id: 100, addresses: ["10.0.0.1/32"], labels: {app: web}}
---
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: batch}
spec: {id: 101, addresses: ["10.0.0.2/32"], labels: {app: batch}}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - fromEntities: [cluster]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
  ingressDeny:
  - fromEndpoints: [{matchLabels: {app: bad}}]
  egress:
  - toEntities: [cluster]
"#;

fn id(engine: &Engine<MemoryDatapath>, addr: &str) -> Option<Identity> {
    engine.ipcache.identity_of(&host_prefix(ip(addr)))
}

fn flow(direction: Direction, peer: &str, port: u16) -> Flow {
    Flow {
        endpoint: EndpointId(100),
        direction,
        peer: ip(peer),
        protocol: Protocol::Tcp,
        port,
    }
}

/// The verdict by the rules, which the datapath's entries must agree with.
fn allowed(engine: &Engine<MemoryDatapath>, flow: Flow) -> bool {
    let answer = explain(&engine.ipcache, flow);
    assert_eq!(answer.allowed, answer.datapath_allowed, "{answer:?}");
    answer.allowed
}

#[test]
fn ingress_and_entities_select_remote_and_temporary_endpoints() {
    let config = fqdnd_config::load_str(MEET, Path::new("node.yaml")).unwrap();
    let mut engine = Engine::new(
        &config.settings,
        IdentityMode::Selector,
        MemoryDatapath::default(),
    );
    engine.enable_cluster();
    engine
        .apply(
            config.endpoints.clone(),
            config.rules.clone(),
            Duration::ZERO,
        )
        .unwrap();
    engine.set_host_addresses(&[ip("10.0.0.10")]).unwrap();
    assert_eq!(id(&engine, "10.0.0.10"), Some(Identity::HOST));
    let batch = id(&engine, "10.0.0.2").unwrap();
    assert!(temporary(batch), "{batch:?}");

    // Before any global number: `cluster` holds the host and the local endpoint on its
    // temporary identity; the rest is the world.
    assert!(allowed(&engine, flow(Direction::Egress, "10.0.0.2", 443)));
    assert!(allowed(&engine, flow(Direction::Egress, "10.0.0.10", 443)));
    assert!(!allowed(&engine, flow(Direction::Egress, "10.1.0.7", 443)));
    assert!(allowed(&engine, flow(Direction::Ingress, "10.0.0.2", 80)));
    assert!(!allowed(&engine, flow(Direction::Ingress, "10.1.0.7", 80)));

    // Another node's client and bad endpoints, and the numbers of every label set.
    engine
        .apply_cluster(ClusterUpdate {
            assigned: vec![
                (app("web"), Identity(300)),
                (app("client"), Identity(301)),
                (app("bad"), Identity(302)),
            ],
            remote_upserted: vec![
                RemoteEndpoint {
                    name: "/p/endpoints/k8s:app=client/node2/7".to_owned(),
                    addresses: vec![host_prefix(ip("10.1.0.7"))],
                    labels: app("client"),
                },
                RemoteEndpoint {
                    name: "/p/endpoints/k8s:app=bad/node2/8".to_owned(),
                    addresses: vec![host_prefix(ip("10.1.0.8"))],
                    labels: app("bad"),
                },
            ],
            ..ClusterUpdate::default()
        })
        .unwrap();
    assert_eq!(id(&engine, "10.1.0.7"), Some(Identity(301)));
    assert_eq!(id(&engine, "10.0.0.1"), Some(Identity(300)));
    // batch's set has no number yet: still temporary, still in `cluster`.
    assert_eq!(id(&engine, "10.0.0.2"), Some(batch));
    assert_eq!(id(&engine, "10.0.0.10"), Some(Identity::HOST));

    // Ingress from the remote client: `cluster` on 80, `fromEndpoints` on 8080, nothing else.
    assert!(allowed(&engine, flow(Direction::Ingress, "10.1.0.7", 80)));
    assert!(allowed(&engine, flow(Direction::Ingress, "10.1.0.7", 8080)));
    assert!(!allowed(&engine, flow(Direction::Ingress, "10.1.0.7", 22)));
    // The remote bad endpoint is in the cluster, but the deny wins.
    assert!(!allowed(&engine, flow(Direction::Ingress, "10.1.0.8", 80)));
    // The local batch endpoint is not a client.
    assert!(allowed(&engine, flow(Direction::Ingress, "10.0.0.2", 80)));
    assert!(!allowed(
        &engine,
        flow(Direction::Ingress, "10.0.0.2", 8080)
    ));
    // Egress to `cluster`: remote, temporary and the host; the world is not.
    for peer in ["10.1.0.7", "10.1.0.8", "10.0.0.2", "10.0.0.10"] {
        assert!(
            allowed(&engine, flow(Direction::Egress, peer, 443)),
            "{peer}"
        );
    }
    assert!(!allowed(&engine, flow(Direction::Egress, "192.0.2.9", 443)));

    // batch's set gets its number: `cluster` follows it.
    engine
        .apply_cluster(ClusterUpdate {
            assigned: vec![(app("batch"), Identity(303))],
            ..ClusterUpdate::default()
        })
        .unwrap();
    assert_eq!(id(&engine, "10.0.0.2"), Some(Identity(303)));
    assert!(engine.ipcache.temporary_identities().is_empty());
    assert!(allowed(&engine, flow(Direction::Egress, "10.0.0.2", 443)));
    assert!(allowed(&engine, flow(Direction::Ingress, "10.0.0.2", 80)));

    // The client's node goes: its address is the world's again.
    engine
        .apply_cluster(ClusterUpdate {
            remote_removed: vec!["/p/endpoints/k8s:app=client/node2/7".to_owned()],
            ..ClusterUpdate::default()
        })
        .unwrap();
    assert_eq!(id(&engine, "10.1.0.7"), None);
    assert!(!allowed(
        &engine,
        flow(Direction::Ingress, "10.1.0.7", 8080)
    ));
    assert!(!allowed(&engine, flow(Direction::Egress, "10.1.0.7", 443)));
}

/// The other nodes' own addresses: `remote-node` (identity 6). Cilium's entities
/// (https://docs.cilium.io/en/latest/security/policy/language/#entities-based): "remote-node:
/// Any node in any of the connected clusters other than the local host", and "cluster: ...
/// all Cilium-managed endpoints of the local cluster, unmanaged endpoints in the local
/// cluster, as well as the host, remote-node, and init identities" — so `cluster` holds them
/// too.
const REMOTE_NODE: &str = r#"
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {name: web}
spec: {id: 100, addresses: ["10.0.0.1/32"], labels: {app: web}}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress:
  - fromEntities: [remote-node]
    toPorts: [{ports: [{port: "9100", protocol: TCP}]}]
  - fromEntities: [cluster]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
  egress:
  - toEntities: [remote-node]
"#;

#[test]
fn remote_node_is_the_other_nodes_own_addresses() {
    let config = fqdnd_config::load_str(REMOTE_NODE, Path::new("node.yaml")).unwrap();
    let mut engine = Engine::new(
        &config.settings,
        IdentityMode::Selector,
        MemoryDatapath::default(),
    );
    engine.enable_cluster();
    engine
        .apply(
            config.endpoints.clone(),
            config.rules.clone(),
            Duration::ZERO,
        )
        .unwrap();
    engine.set_host_addresses(&[ip("10.0.0.10")]).unwrap();
    let client = "/p/endpoints/k8s:app=client/node2/7".to_owned();
    let node2 = |addrs: &[&str]| RemoteNode {
        name: "node2".to_owned(),
        addresses: addrs.iter().map(|a| ip(a)).collect(),
    };
    // node2 registers 10.1.0.1 — and, to check who wins, addresses an endpoint (its own,
    // or this node's) and this node claim too.
    engine
        .apply_cluster(ClusterUpdate {
            assigned: vec![(app("web"), Identity(300)), (app("client"), Identity(301))],
            remote_upserted: vec![RemoteEndpoint {
                name: client.clone(),
                addresses: vec![host_prefix(ip("10.1.0.7"))],
                labels: app("client"),
            }],
            nodes_upserted: vec![node2(&["10.1.0.1", "10.1.0.7", "10.0.0.1", "10.0.0.10"])],
            ..ClusterUpdate::default()
        })
        .unwrap();
    assert_eq!(id(&engine, "10.1.0.1"), Some(Identity::REMOTE_NODE));
    assert_eq!(
        id(&engine, "10.1.0.7"),
        Some(Identity(301)),
        "an endpoint wins"
    );
    assert_eq!(
        id(&engine, "10.0.0.1"),
        Some(Identity(300)),
        "a local endpoint wins"
    );
    assert_eq!(
        id(&engine, "10.0.0.10"),
        Some(Identity::HOST),
        "the host wins"
    );
    // Its datapath entry is 6, and `remote-node` selects it — not endpoints, not the host.
    assert_eq!(
        engine.ipcache.datapath().identity_of(ip("10.1.0.1")),
        Identity::REMOTE_NODE
    );
    assert!(allowed(&engine, flow(Direction::Ingress, "10.1.0.1", 9100)));
    assert!(!allowed(&engine, flow(Direction::Ingress, "10.1.0.1", 22)));
    assert!(!allowed(
        &engine,
        flow(Direction::Ingress, "10.1.0.7", 9100)
    ));
    assert!(!allowed(
        &engine,
        flow(Direction::Ingress, "10.0.0.10", 9100)
    ));
    assert!(allowed(&engine, flow(Direction::Egress, "10.1.0.1", 443)));
    for peer in ["10.1.0.7", "10.0.0.10", "192.0.2.9"] {
        assert!(
            !allowed(&engine, flow(Direction::Egress, peer, 443)),
            "{peer}"
        );
    }
    // `cluster` holds the remote node (as Cilium's), the host and the endpoints.
    for peer in ["10.1.0.1", "10.1.0.7", "10.0.0.10"] {
        assert!(
            allowed(&engine, flow(Direction::Ingress, peer, 80)),
            "{peer}"
        );
    }
    assert!(!allowed(&engine, flow(Direction::Ingress, "192.0.2.9", 80)));

    // The client endpoint goes while node2 still claims its address: the remote node's now.
    engine
        .apply_cluster(ClusterUpdate {
            remote_removed: vec![client],
            ..ClusterUpdate::default()
        })
        .unwrap();
    assert_eq!(id(&engine, "10.1.0.7"), Some(Identity::REMOTE_NODE));
    assert!(allowed(&engine, flow(Direction::Ingress, "10.1.0.7", 9100)));

    // node2's addresses change: the old ones are the world's, the new one the remote node's.
    engine
        .apply_cluster(ClusterUpdate {
            nodes_upserted: vec![node2(&["10.1.0.2"])],
            ..ClusterUpdate::default()
        })
        .unwrap();
    assert_eq!(id(&engine, "10.1.0.1"), None);
    assert_eq!(id(&engine, "10.1.0.7"), None);
    assert_eq!(id(&engine, "10.1.0.2"), Some(Identity::REMOTE_NODE));
    assert_eq!(id(&engine, "10.0.0.10"), Some(Identity::HOST));
    assert_eq!(id(&engine, "10.0.0.1"), Some(Identity(300)));
    assert!(!allowed(
        &engine,
        flow(Direction::Ingress, "10.1.0.1", 9100)
    ));
    assert!(allowed(&engine, flow(Direction::Ingress, "10.1.0.2", 9100)));

    // node2's registration goes (its lease expired): its address is the world's again.
    engine
        .apply_cluster(ClusterUpdate {
            nodes_removed: vec!["node2".to_owned()],
            ..ClusterUpdate::default()
        })
        .unwrap();
    assert_eq!(id(&engine, "10.1.0.2"), None);
    assert_eq!(
        engine.ipcache.datapath().identity_of(ip("10.1.0.2")),
        Identity::world(true)
    );
    assert!(!allowed(
        &engine,
        flow(Direction::Ingress, "10.1.0.2", 9100)
    ));
    assert!(!allowed(&engine, flow(Direction::Egress, "10.1.0.2", 443)));
}
