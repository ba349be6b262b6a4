//! Cluster mode end to end, as root: a real 3-member etcd cluster (on loopback addresses of a
//! "core" network namespace, which also routes between the nodes), two identity allocators
//! (`fqdnd operator`), and three `fqdnd node` agents, each in its own network namespace with
//! its endpoints behind veth pairs (tests/node/topology.rs, one topology per node: own pin
//! directory, admin socket, proxy port).
//!
//! One scenario, in order: endpoints run on temporary identities before any allocator runs
//! (policy applies at once; a policy applied once reaches every node); the allocators give
//! one global identity per label set and established flows survive the switch; cross-node
//! `toEndpoints` is allowed and denied by labels, and web servers' ingress takes remote clients
//! by their global identity and the other nodes' own addresses as `remote-node`, but not the
//! host or an address outside the cluster; a `toFQDNs` answer's identity stays on its node; new labels registered on every node at the same moment get one identity (repeated);
//! the etcd leader, the allocator leader and a node are killed (-9) without any identity
//! changing or being duplicated, and the dead node's endpoints go with its lease; then etcd is
//! stopped entirely for `FQDND_CLUSTER_OUTAGE_SECS` (default 15; the minute with 60):
//! flows keep working, a node restarted meanwhile changes nothing, a new endpoint runs on a
//! temporary identity, and everything converges once etcd is back.
//!
//! Needs root (netns, eBPF) and etcd; skipped without them unless `FQDND_REQUIRE_PRIVILEGED=1`
//! (CI), where it fails.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

#[path = "common/mod.rs"]
mod common;

#[path = "node/topology.rs"]
#[allow(
    dead_code,
    reason = "the node suite's topology, shared: not every helper is used here"
)]
mod topology;

#[path = "../cluster/tests/support/etcd.rs"]
#[allow(
    dead_code,
    unreachable_pub,
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "the cluster crate's etcd launcher, shared: not every helper is used here; it \
              waits for etcd's leader on the real clock"
)]
mod etcd;

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::Duration;

use etcd::EtcdCluster;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use serde_json::Value;

use common::{
    DROPPED, PATIENCE, REACHES, TestDir, addrs, poll, poll_until, question, run, stdout_of, text,
    throughout,
};
use topology::{Topology, echo, in_netns, privileged, serve_tcp_echo, sh, tcp_open, tcp_reaches};

/// The nodes' lease TTL: a dead node's endpoints, a dead allocator's leadership.
const TTL: Duration = Duration::from_secs(4);
/// Convergence deadlines (generous: other builds share the cores).
const CONVERGE: Duration = Duration::from_secs(60);

const PREFIX: &str = "/fqdnd-e2e";

/// Waits (at most [`CONVERGE`]) until `check` holds; panics naming `what`.
fn converge(what: &str, mut check: impl FnMut() -> bool) {
    poll_until(CONVERGE, what, || check().then_some(()));
}

/// The core namespace: etcd, the allocators, and the routes between nodes.
struct Core {
    ns: String,
    dir: TestDir,
    operators: Vec<(String, Child)>,
}

impl Core {
    fn new() -> Self {
        let ns = format!("fqc{}-core", std::process::id() % 100_000);
        let _ = run(Command::new("ip").args(["netns", "del", &ns]));
        sh(&format!("ip netns add {ns} && ip -n {ns} link set lo up"));
        sh(&format!(
            "ip netns exec {ns} sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'"
        ));
        Self {
            ns,
            dir: TestDir::new("cluster-e2e"),
            operators: Vec::new(),
        }
    }

    /// `PROGRAM` inside the core namespace.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.ns, program]);
        command.env_remove("FQDND_ADMIN_SOCKET");
        command
    }

    /// `fqdnd ARGS` inside the core namespace, run to the end.
    fn fqdnd(&self, args: &[&str]) -> Output {
        run(self.command(env!("CARGO_BIN_EXE_fqdnd")).args(args))
    }

    /// `etcdctl ARGS` against `cluster`, inside the core namespace; stdout.
    fn etcdctl(&self, cluster: &EtcdCluster, args: &[&str]) -> String {
        stdout_of(&run(self
            .command("etcdctl")
            .env("ETCDCTL_API", "3")
            .args([
                "--endpoints",
                &cluster.endpoints().join(","),
                "--command-timeout=5s",
            ])
            .args(args)))
    }

    fn start_operator(&mut self, name: &str, config: &Path) {
        let log = File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let child = self
            .command(env!("CARGO_BIN_EXE_fqdnd"))
            .args([
                "operator",
                "--config",
                config.to_str().unwrap(),
                "--name",
                name,
            ])
            .env("FQDND_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.operators.push((name.to_owned(), child));
    }

    fn kill_operator(&mut self, name: &str) {
        let i = self.operators.iter().position(|(n, _)| n == name).unwrap();
        let (_, mut child) = self.operators.remove(i);
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Every identity in etcd: labels (as the nodes render them) → numbers. More than one
    /// number for a label set is a duplicate.
    fn identities(&self, cluster: &EtcdCluster) -> BTreeMap<String, Vec<u32>> {
        let out = self.etcdctl(
            cluster,
            &["get", "--prefix", &format!("{PREFIX}/identities/id/")],
        );
        let lines: Vec<&str> = out.lines().collect();
        let mut table: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for pair in lines.chunks(2) {
            let value: Value = serde_json::from_str(pair[1]).unwrap();
            let labels: Vec<String> = value["labels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    format!(
                        "{}:{}={}",
                        l["source"].as_str().unwrap(),
                        l["key"].as_str().unwrap(),
                        l["value"].as_str().unwrap_or("")
                    )
                })
                .collect();
            table
                .entry(sorted(&labels.join(",")))
                .or_default()
                .push(u32::try_from(value["id"].as_u64().unwrap()).unwrap());
        }
        table
    }

    /// The identity each published endpoint record carries (`None`: not global yet).
    fn published_identities(&self, cluster: &EtcdCluster) -> Vec<Option<u64>> {
        let out = self.etcdctl(
            cluster,
            &[
                "get",
                "--prefix",
                "--print-value-only",
                &format!("{PREFIX}/endpoints/"),
            ],
        );
        out.lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["identity"].as_u64())
            .collect()
    }

    /// The leading allocator's name, from etcd.
    fn allocator_leader(&self, cluster: &EtcdCluster) -> Option<String> {
        let name = self.etcdctl(
            cluster,
            &[
                "get",
                "--print-value-only",
                &format!("{PREFIX}/operator/leader"),
            ],
        );
        let name = name.trim();
        (!name.is_empty()).then(|| name.to_owned())
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        for (_, mut child) in self.operators.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// One node: its topology and how it is configured.
struct Node {
    t: Topology,
    name: String,
}

impl Node {
    fn status(&self) -> Value {
        self.t.admin_json(&["status"])
    }

    /// The node's identities: labels (sorted, joined with `,`) → number.
    fn identities(&self) -> BTreeMap<String, u32> {
        self.t
            .admin_json(&["identity", "list"])
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let labels: Vec<&str> = r["labels"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| l.as_str().unwrap())
                    .collect();
                (
                    sorted(&labels.join(",")),
                    u32::try_from(r["identity"].as_u64().unwrap()).unwrap(),
                )
            })
            .collect()
    }

    fn temporaries(&self) -> usize {
        self.status()["cluster"]["temporary_identities"]
            .as_array()
            .map_or(usize::MAX, Vec::len)
    }

    fn connected(&self) -> bool {
        self.status()["cluster"]["connected"].as_bool() == Some(true)
    }

    /// The client endpoint's namespace.
    fn client(&self) -> &str {
        &self.t.ep_a
    }

    /// The server endpoint's echo address.
    fn server(&self) -> SocketAddr {
        SocketAddr::new(self.t.v4(2, 2), 8080)
    }

    /// A new endpoint `app=<app>` with id `id` behind a new veth `ifname`, on network
    /// 10.N.`net`.0/24.
    fn add_endpoint(&self, id: u16, app: &str, ifname: &str, net: u32) {
        sh(&format!(
            "ip -n {h} link add {ifname} type veth peer name {ifname}p && ip -n {h} link set {ifname} up",
            h = self.t.host
        ));
        self.t.admin_cli(&[
            "endpoint",
            "add",
            "--id",
            &id.to_string(),
            "--name",
            app,
            "--interface",
            ifname,
            "--address",
            &self.t.v4(net, 2).to_string(),
            "--label",
            &format!("app={app}"),
        ]);
    }
}

fn node_config(t: &Topology, name: &str, k: u16, tier: &str, etcd: &[String]) -> String {
    let n = t.n;
    format!(
        "apiVersion: fqdnd.io/v1
kind: Node
spec:
  pinDir: {pin}
  dnsProxyPort: {port}
  stateDir: {state}
---
apiVersion: fqdnd.io/v1
kind: Cluster
spec:
  endpoints: [{endpoints}]
  prefix: {PREFIX}
  nodeName: {name}
  leaseTTL: {ttl}s
---
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {{name: client}}
spec:
  id: 1
  interface: {if_a}
  addresses: [10.{n}.1.2]
  labels: {{role: client}}
---
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {{name: server}}
spec:
  id: 2
  interface: {if_b}
  addresses: [10.{n}.2.2]
  labels: {{role: server, tier: {tier}}}
",
        pin = t.pin_dir.display(),
        port = 10053 + k,
        state = t.dir.join("state").display(),
        endpoints = quoted(etcd),
        ttl = TTL.as_secs(),
        if_a = t.if_a,
        if_b = t.if_b,
    )
}

/// `["a", "b"]` as YAML flow items: `"a", "b"`.
fn quoted(items: &[String]) -> String {
    items
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The policy every node gets from the cluster: clients may reach web servers on 8080 (on
/// any node), ask any name, and reach what `api.example.test` resolves to on 8080; web
/// servers take connections from clients and from the other nodes (`remote-node`: their own
/// addresses, which each node registers), on 8080 (ingress: a client on another node is known
/// by its global identity).
const SHARED_POLICY: &str = "apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: clients}
spec:
  endpointSelector: {matchLabels: {role: client}}
  egress:
  - toEndpoints: [{matchLabels: {tier: web}}]
    toPorts: [{ports: [{port: \"8080\", protocol: TCP}]}]
  - toCIDR: [10.0.0.0/8]
    toPorts:
    - ports: [{port: \"53\", protocol: ANY}]
      rules:
        dns: [{matchPattern: \"*\"}]
  - toFQDNs: [{matchName: api.example.test}]
    toPorts: [{ports: [{port: \"8080\", protocol: TCP}]}]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: web-ingress}
spec:
  endpointSelector: {matchLabels: {tier: web}}
  ingress:
  - fromEndpoints: [{matchLabels: {role: client}}]
    toPorts: [{ports: [{port: \"8080\", protocol: TCP}]}]
  - fromEntities: [remote-node]
    toPorts: [{ports: [{port: \"8080\", protocol: TCP}]}]
";

/// Joins a node's host namespace to the core: a veth, the route to etcd, and routes to the
/// other nodes' endpoint networks through the core.
fn link(core: &str, t: &Topology, k: usize, etcd_net: &str) {
    let (n, host) = (t.n, &t.host);
    let hif = format!("fqc{}{k}h", std::process::id() % 10_000);
    let cif = format!("fqc{}{k}c", std::process::id() % 10_000);
    sh(&format!(
        "ip -n {host} link add {hif} type veth peer name {cif} netns {core} && \
         ip -n {host} addr add 10.{n}.250.2/24 dev {hif} && ip -n {host} link set {hif} up && \
         ip -n {core} addr add 10.{n}.250.1/24 dev {cif} && ip -n {core} link set {cif} up && \
         ip -n {host} route add {etcd_net} via 10.{n}.250.1 && \
         ip -n {core} route add 10.{n}.1.0/24 via 10.{n}.250.2 && \
         ip -n {core} route add 10.{n}.2.0/24 via 10.{n}.250.2"
    ));
}

/// The node's number for a label set (given as `a,b` text), if global.
/// The global number of the label set `labels` of an endpoint without a namespace (so in
/// `default`: its namespace label is added).
fn global_of(identities: &BTreeMap<String, u32>, labels: &str) -> Option<u32> {
    identities
        .get(&sorted(&format!(
            "{labels},k8s:io.kubernetes.pod.namespace=default"
        )))
        .copied()
        .filter(|id| (256..=65_535).contains(id))
}

/// On every node at the same moment: an endpoint with labels `app=<app>` that no node had.
fn burst(nodes: &[Node], round: u16, app: &str) {
    std::thread::scope(|s| {
        for node in nodes {
            s.spawn(move || {
                node.add_endpoint(
                    100 + round,
                    app,
                    &format!("fqb{round}"),
                    60 + u32::from(round),
                );
            });
        }
    });
}

/// [`burst`] of `app` (round `round`), until every node has its global identity: then etcd
/// holds one number per label set, the nodes agree with it, and no number in `known` changed
/// (`known` takes the new table).
fn one_identity_everywhere(
    core: &Core,
    cluster: &EtcdCluster,
    nodes: &[Node],
    round: u16,
    app: &str,
    known: &mut BTreeMap<String, u32>,
) {
    burst(nodes, round, app);
    let wanted = format!("k8s:app={app}");
    converge(&format!("{app} global on every node"), || {
        nodes
            .iter()
            .all(|n| global_of(&n.identities(), &wanted).is_some())
    });
    let table = assert_agreement(core, cluster, nodes);
    assert_unchanged(known, &table);
    *known = table;
}

/// Every label set in etcd has one number, and every node holds the etcd number for every
/// global label set it has.
fn assert_agreement(core: &Core, cluster: &EtcdCluster, nodes: &[Node]) -> BTreeMap<String, u32> {
    let table = core.identities(cluster);
    for (labels, ids) in &table {
        assert_eq!(ids.len(), 1, "duplicate identities for {labels}: {ids:?}");
    }
    let table: BTreeMap<String, u32> = table.into_iter().map(|(l, ids)| (l, ids[0])).collect();
    for node in nodes {
        for (labels, id) in node.identities() {
            if (256..=65_535).contains(&id) {
                assert_eq!(
                    table.get(&labels),
                    Some(&id),
                    "{} holds {id} for {labels}; etcd: {table:?}",
                    node.name
                );
            }
        }
    }
    table
}

fn sorted(labels: &str) -> String {
    let mut v: Vec<&str> = labels.split(',').collect();
    v.sort_unstable();
    v.join(",")
}

/// The numbers of `before` are still those of `after`.
fn assert_unchanged(before: &BTreeMap<String, u32>, after: &BTreeMap<String, u32>) {
    for (labels, id) in before {
        assert_eq!(after.get(labels), Some(id), "{labels} changed its identity");
    }
}

/// Asks node `t`'s resolver (through the node's transparent proxy) for `name` from its client.
fn resolve(t: &Topology, name: &str) -> Vec<std::net::IpAddr> {
    let q = question(0x4a4a, name, RecordType::A);
    let server = SocketAddr::new(t.v4(9, 53), 53);
    let (reply, _) = in_netns(&t.ep_a, move || common::udp(server, &q))
        .unwrap_or_else(|| panic!("no answer for {name}\n{}", t.logs()));
    assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
    addrs(&reply)
}

#[test]
fn cluster_identities_endpoints_policy_and_failures() {
    if !privileged("cluster_e2e") || !etcd::available("cluster_e2e") {
        return;
    }
    let outage = Duration::from_secs(
        std::env::var("FQDND_CLUSTER_OUTAGE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(15),
    );
    let mut core = Core::new();
    // Three topologies first: their numbers give the etcd address block.
    let topologies: Vec<Topology> = (0..3)
        .map(|k| Topology::new(&format!("cluster{k}")))
        .collect();
    let etcd_host = format!("10.{}.251.1", topologies[0].n);
    sh(&format!("ip -n {} addr add {etcd_host}/32 dev lo", core.ns));
    let mut cluster = EtcdCluster::start("cluster-e2e", 3, Some(&core.ns), &etcd_host);
    let etcd_net = format!("10.{}.251.0/24", topologies[0].n);
    for (k, t) in topologies.iter().enumerate() {
        link(&core.ns, t, k, &etcd_net);
        for (j, other) in topologies.iter().enumerate() {
            if j != k {
                sh(&format!(
                    "ip -n {} route add 10.{}.0.0/16 via 10.{}.250.1",
                    t.host, other.n, t.n
                ));
            }
        }
    }
    let op_config = core.dir.write(
        "cluster.yaml",
        format!(
            "apiVersion: fqdnd.io/v1\nkind: Cluster\nspec:\n  endpoints: [{}]\n  prefix: {PREFIX}\n  leaseTTL: {}s\n",
            quoted(&cluster.endpoints()),
            TTL.as_secs()
        ),
    );
    let op_config = op_config.to_str().unwrap();
    let tiers = ["web", "db", "web"];
    let mut nodes: Vec<Node> = topologies
        .into_iter()
        .enumerate()
        .map(|(k, mut t)| {
            let name = format!("node{k}");
            let config = t.write_node_config(&node_config(
                &t,
                &name,
                u16::try_from(k).unwrap(),
                tiers[k],
                &cluster.endpoints(),
            ));
            serve_tcp_echo(&t.ep_b, 8080);
            t.start_node(&config);
            Node { t, name }
        })
        .collect();
    converge("every node reaches etcd", || {
        nodes.iter().all(Node::connected)
    });

    // 1. No allocator yet: each node's endpoints are on temporary identities, published
    // without a number; no node created a global identity.
    for node in &nodes {
        assert_eq!(
            node.temporaries(),
            2,
            "{}: client and server wait",
            node.name
        );
    }
    converge("every node's endpoints published", || {
        core.published_identities(&cluster).len() == 6
    });
    assert_eq!(
        core.published_identities(&cluster),
        vec![None; 6],
        "a temporary identity never leaves its node"
    );
    assert!(
        core.identities(&cluster).is_empty(),
        "nodes create no identity"
    );
    // A policy applied once reaches every node, and applies at once to temporary identities.
    let policy = core.dir.write("policy.yaml", SHARED_POLICY);
    // A broken policy is refused before anything is stored, its mistake located.
    let broken = core
        .dir
        .write("broken.yaml", SHARED_POLICY.replace("toPorts", "toPort"));
    let refused = core.fqdnd(&[
        "policy",
        "apply",
        "--config",
        op_config,
        broken.to_str().unwrap(),
    ]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("broken.yaml:8:"),
        "{}",
        text(&refused.stderr)
    );
    stdout_of(&core.fqdnd(&[
        "policy",
        "apply",
        "--config",
        op_config,
        policy.to_str().unwrap(),
    ]));
    converge("the shared policy on every node", || {
        nodes
            .iter()
            .all(|n| n.status()["cluster"]["shared_policies"].as_u64() == Some(2))
    });
    // Node 0's client may reach its web server (both on temporary identities); node 1's
    // client may not reach its db server.
    converge("node0 client → node0 web on temporary identities", || {
        tcp_reaches(nodes[0].client(), nodes[0].server(), REACHES)
    });
    assert!(
        !tcp_reaches(nodes[1].client(), nodes[1].server(), DROPPED),
        "db is denied"
    );
    // A remote endpoint without a global identity is not known yet: denied.
    assert!(!tcp_reaches(nodes[0].client(), nodes[2].server(), DROPPED));
    // A document in etcd that does not load (written there by something other than `policy
    // apply`) is refused alone: node 1, restarted with an empty state directory, applies the
    // valid shared policy — its endpoints enforce, db stays denied (it used to apply none and
    // let everything through).
    core.etcdctl(
        &cluster,
        &[
            "put",
            &format!("{PREFIX}/policies/ccnp/broken"),
            "this: [is not",
        ],
    );
    converge("every node reports the broken document", || {
        nodes.iter().all(|n| {
            n.status()["cluster"]["shared_policy_errors"]
                .as_array()
                .is_some_and(|e| !e.is_empty())
        })
    });
    {
        let t = &mut nodes[1].t;
        t.kill_node();
        std::fs::remove_dir_all(t.dir.join("state")).unwrap();
        let config = t.config_dir().join("node.yaml");
        t.start_node(&config);
    }
    converge("node1 applies the valid shared policy", || {
        nodes[1].status()["cluster"]["shared_policies"].as_u64() == Some(2)
    });
    // The client is under the shared `clients` policy (the db server is selected by none).
    let endpoints = nodes[1].t.admin_json(&["endpoint", "list"]);
    assert!(
        endpoints
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "client" && e["enforcing"].as_bool() == Some(true)),
        "{endpoints}"
    );
    assert!(
        !tcp_reaches(nodes[1].client(), nodes[1].server(), DROPPED),
        "db is still denied"
    );
    core.etcdctl(
        &cluster,
        &["del", &format!("{PREFIX}/policies/ccnp/broken")],
    );
    let mut established = tcp_open(nodes[0].client(), nodes[0].server()).expect("connects");
    assert!(echo(&mut established, b"before"));

    // 2. The allocators: one global identity per label set, the switch keeps the flow.
    core.start_operator("op-a", Path::new(op_config));
    core.start_operator("op-b", Path::new(op_config));
    converge("no temporary identity left", || {
        nodes.iter().all(|n| n.temporaries() == 0)
    });
    assert!(
        echo(&mut established, b"after the switch"),
        "the established flow survives"
    );
    let mut known = assert_agreement(&core, &cluster, &nodes);
    converge("every published record carries its global identity", || {
        core.published_identities(&cluster)
            .iter()
            .all(|id| id.is_some_and(|id| (256..=65_535).contains(&id)))
    });
    assert!(global_of(&nodes[0].identities(), "k8s:role=server,k8s:tier=web").is_some());
    // Cross-node toEndpoints, by labels.
    converge("node0 client → node2 web (cross-node)", || {
        tcp_reaches(nodes[0].client(), nodes[2].server(), REACHES)
    });
    assert!(tcp_reaches(nodes[1].client(), nodes[0].server(), REACHES));
    assert!(
        !tcp_reaches(nodes[0].client(), nodes[1].server(), DROPPED),
        "db is denied across nodes too"
    );
    // Web servers' ingress: the remote clients above passed by their global identity; another
    // node's own address (registered with it) is `remote-node` (identity 6) and passes; the
    // host identity stays each node's own and is neither a client nor a remote node, and the
    // core's address (on the same path as node1's, but no node's) is the world: both dropped.
    let node1_addr = format!("{}/32", nodes[1].t.v4(250, 2));
    converge("node1's own address is remote-node on node0", || {
        nodes[0]
            .t
            .admin_json(&["ipcache", "list"])
            .as_array()
            .unwrap()
            .iter()
            .any(|r| {
                r["prefix"].as_str() == Some(node1_addr.as_str())
                    && r["identity"].as_u64() == Some(6)
            })
    });
    converge("node1's host → node0 web (remote-node)", || {
        tcp_reaches(&nodes[1].t.host, nodes[0].server(), REACHES)
    });
    assert!(
        !tcp_reaches(&core.ns, nodes[0].server(), DROPPED),
        "the core's address is world on node0"
    );
    assert!(
        !tcp_reaches(&nodes[0].t.host, nodes[0].server(), DROPPED),
        "node0's host is no client"
    );

    // FQDN identities stay node-local: node 0 resolves a name the shared policy allows; the
    // answer's address joins node 0's ipcache only, every node's identity for the name is a
    // number of its own range, and no FQDN label set reaches etcd.
    let zone = format!("api 300 IN A 10.{}.10.1\n", nodes[0].t.n);
    nodes[0].t.start_dns(&zone);
    let api = nodes[0].t.v4(10, 1);
    assert_eq!(resolve(&nodes[0].t, "api.example.test"), vec![api]);
    converge("node0 client → api.example.test", || {
        tcp_reaches(nodes[0].client(), SocketAddr::new(api, 8080), REACHES)
    });
    let learned = |node: &Node| {
        node.t
            .admin_json(&["ipcache", "list"])
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["prefix"].as_str() == Some(&format!("{api}/32")))
            .map(|r| u32::try_from(r["identity"].as_u64().unwrap()).unwrap())
    };
    let id = learned(&nodes[0]).expect("node0 holds the answer's address");
    assert!(
        (0x0100_0001..0x0101_0000).contains(&id),
        "the answer's identity {id:#x} is not a node-local number"
    );
    for node in &nodes {
        for (labels, id) in node.identities() {
            if labels.contains("fqdn:") {
                assert!(
                    (0x0100_0001..0x0101_0000).contains(&id),
                    "{}: {labels} has {id:#x}, not a node-local number",
                    node.name
                );
            }
        }
    }
    for node in &nodes[1..] {
        assert_eq!(learned(node), None, "{} learned node0's answer", node.name);
    }
    assert!(
        !core.identities(&cluster).keys().any(|l| l.contains("fqdn")),
        "an FQDN label set in etcd"
    );

    // 3. The same new labels on every node at the same moment: one identity (three rounds).
    for round in 0..3u16 {
        one_identity_everywhere(
            &core,
            &cluster,
            &nodes,
            round,
            &format!("burst{round}"),
            &mut known,
        );
    }

    // 4. Kill -9 the etcd leader: nothing changes, new label sets still get one identity.
    let leader = cluster.leader().expect("an etcd leader");
    cluster.kill(leader);
    cluster.wait_healthy(CONVERGE);
    one_identity_everywhere(&core, &cluster, &nodes, 3, "after-etcd-leader", &mut known);
    cluster.restart(leader);
    cluster.wait_healthy(CONVERGE);

    // 5. Kill -9 the allocator leader: the other takes over within seconds (its lease TTL is
    // 4 s) and creates the next identities.
    let op_leader = core.allocator_leader(&cluster).expect("an allocator leads");
    core.kill_operator(&op_leader);
    poll(
        PATIENCE,
        "the other allocator to take over",
        || match core.allocator_leader(&cluster) {
            Some(now) if now != op_leader => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    one_identity_everywhere(
        &core,
        &cluster,
        &nodes,
        4,
        "after-allocator-leader",
        &mut known,
    );

    // 6. Kill -9 a node: its endpoints go with its lease; the others stop reaching them.
    let dead = nodes.pop().unwrap();
    let mut dead_topology = dead.t;
    dead_topology.kill_node();
    let dead_server = SocketAddr::new(dead_topology.v4(2, 2), 8080);
    // Each node has its client, its server and five burst endpoints.
    converge("node2's endpoints gone from node0's ipcache", || {
        nodes[0].status()["cluster"]["remote_endpoints"].as_u64() == Some(7)
    });
    converge("node2's registration gone from node0", || {
        nodes[0].status()["cluster"]["remote_nodes"].as_u64() == Some(1)
    });
    assert!(
        !tcp_reaches(nodes[0].client(), dead_server, DROPPED),
        "a dead node's endpoint is world"
    );
    let table = assert_agreement(&core, &cluster, &nodes);
    assert_unchanged(&known, &table);
    drop(dead_topology);

    // 7. etcd entirely down for `outage`: enforcement goes on, a restart changes nothing, a new
    // endpoint runs on a temporary identity; everything converges when etcd is back.
    let before_outage: Vec<BTreeMap<String, u32>> = nodes.iter().map(Node::identities).collect();
    cluster.stop_all();
    converge("the nodes notice", || nodes.iter().all(|n| !n.connected()));
    nodes[0].add_endpoint(200, "late", "fqout", 70);
    assert_eq!(
        nodes[0].temporaries(),
        1,
        "the new endpoint runs on a temporary identity"
    );
    // Node 1 restarts in the middle of the outage: same numbers, same remote endpoints, same
    // policy.
    {
        let t = &mut nodes[1].t;
        t.kill_node();
        let config = t.config_dir().join("node.yaml");
        t.start_node(&config);
    }
    assert_eq!(
        nodes[1].identities(),
        before_outage[1],
        "a restart during the outage changes nothing"
    );
    throughout(outage, Duration::from_millis(500), || {
        assert!(
            echo(&mut established, b"during the outage"),
            "established flow"
        );
        assert!(
            tcp_reaches(nodes[1].client(), nodes[0].server(), REACHES),
            "cross-node flow"
        );
        assert!(
            !tcp_reaches(nodes[0].client(), nodes[1].server(), DROPPED),
            "still denied"
        );
    });
    cluster.start_all();
    converge("everything converges after the outage", || {
        nodes.iter().all(|n| n.connected() && n.temporaries() == 0)
            && global_of(&nodes[1].identities(), "k8s:app=late").is_some()
    });
    let after = assert_agreement(&core, &cluster, &nodes);
    assert_unchanged(&known, &after);
    assert!(echo(&mut established, b"after the outage"));
    assert!(tcp_reaches(nodes[1].client(), nodes[0].server(), REACHES));
}
