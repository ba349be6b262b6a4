//! Cluster mode end to end, as root: a real 3-member etcd cluster (on loopback addresses of a
//! "core" network namespace, which also routes between the nodes), two identity allocators
//! (`fqdnd operator`), and three `fqdnd node` agents, each in its own network namespace with
//! its endpoints behind veth pairs (tests/node/topology.rs, one topology per node: own pin
//! directory, admin socket, proxy port).
//!
//! One scenario, in order: endpoints run on temporary identities before any allocator runs
//! (policy applies at once; a policy applied once reaches every node); the allocators give
//! one global identity per label set and established flows survive the switch; cross-node
//! `toEndpoints` is allowed and denied by labels; new labels registered on every node at the
//! same moment get one identity (repeated); the etcd leader, the allocator leader and a node
//! are killed (-9) without any identity changing or being duplicated, and the dead node's
//! endpoints go with its lease; then etcd is stopped entirely for `FQDND_CLUSTER_OUTAGE_SECS`
//! (default 15): flows keep working, a node restarted meanwhile changes nothing, a new
//! endpoint runs on a temporary identity, and everything converges once etcd is back.
//!
//! Needs root (netns, eBPF) and etcd; skipped without them unless `FQDND_REQUIRE_PRIVILEGED=1`
//! (CI), where it fails.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "test code: real clocks and sleeps, a failed step should panic"
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
    reason = "the cluster crate's etcd launcher, shared: not every helper is used here"
)]
mod etcd;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd::EtcdCluster;
use serde_json::Value;
use topology::{Topology, echo, in_netns, privileged, sh, tcp_open, tcp_reaches};

/// How long a dropped SYN takes to show as a failure.
const DROPPED: Duration = Duration::from_millis(700);
/// How long an allowed connection may take on a loaded machine.
const REACHES: Duration = Duration::from_secs(5);
/// The nodes' lease TTL: a dead node's endpoints, a dead allocator's leadership.
const TTL: Duration = Duration::from_secs(4);
/// Convergence deadlines (generous: other builds share the cores).
const CONVERGE: Duration = Duration::from_secs(60);

const PREFIX: &str = "/fqdnd-e2e";

/// The core namespace: etcd, the allocators, and the routes between nodes.
struct Core {
    ns: String,
    dir: PathBuf,
    operators: Vec<(String, Child)>,
}

impl Core {
    fn new(dir: &Path) -> Self {
        let ns = format!("fqc{}-core", std::process::id() % 100_000);
        let _ = Command::new("ip")
            .args(["netns", "del", &ns])
            .stderr(Stdio::null())
            .status();
        sh(&format!("ip netns add {ns} && ip -n {ns} link set lo up"));
        sh(&format!(
            "ip netns exec {ns} sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'"
        ));
        std::fs::create_dir_all(dir).unwrap();
        Self {
            ns,
            dir: dir.to_path_buf(),
            operators: Vec::new(),
        }
    }

    /// `fqdnd ARGS` inside the core namespace; stdout, panicking on failure.
    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, env!("CARGO_BIN_EXE_fqdnd")])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "fqdnd {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn start_operator(&mut self, name: &str, config: &Path) {
        let log = File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, env!("CARGO_BIN_EXE_fqdnd")])
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
}

impl Drop for Core {
    fn drop(&mut self) {
        for (_, mut child) in self.operators.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        if std::thread::panicking() {
            eprintln!("operator logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A TCP echo server on `addr` inside namespace `ns`.
fn serve_echo(ns: &str, addr: SocketAddr) {
    in_netns(ns, move || {
        let listener = TcpListener::bind(addr).unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 || stream.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
    });
}

/// Polls `check` every 200 ms for at most `limit`; panics with `what` and `context()`.
fn until(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let start = Instant::now();
    loop {
        if check() {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "never happened within {limit:?}: {what}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One node: its topology and how it is configured.
struct Node {
    t: Topology,
    name: String,
    config: PathBuf,
}

impl Node {
    fn admin(&self) -> String {
        self.t.admin().to_str().unwrap().to_owned()
    }

    fn status(&self) -> Value {
        serde_json::from_str(
            &self
                .t
                .cli(&["status", "--json", "--admin-socket", &self.admin()]),
        )
        .unwrap()
    }

    /// The node's identities: labels → number.
    fn identities(&self) -> BTreeMap<String, u32> {
        let rows: Value = serde_json::from_str(&self.t.cli(&[
            "identity",
            "list",
            "--json",
            "--admin-socket",
            &self.admin(),
        ]))
        .unwrap();
        rows.as_array()
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
                    labels.join(","),
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

    fn logs(&self) -> String {
        self.t.logs()
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
  conntrackIdleTimeout: 60s
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
        endpoints = etcd
            .iter()
            .map(|e| format!("\"{e}\""))
            .collect::<Vec<_>>()
            .join(", "),
        ttl = TTL.as_secs(),
        if_a = t.if_a,
        if_b = t.if_b,
    )
}

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

/// Every identity in etcd: labels (as the nodes render them) → numbers. More than one number
/// for a label set is a duplicate.
fn etcd_identities(core: &Core, cluster: &EtcdCluster) -> BTreeMap<String, Vec<u32>> {
    let out = Command::new("ip")
        .args(["netns", "exec", &core.ns, "etcdctl"])
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &cluster.endpoints().join(","),
            "--command-timeout=5s",
        ])
        .args(["get", "--prefix", &format!("{PREFIX}/identities/id/")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let mut table: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for pair in lines.chunks(2) {
        let value: Value = serde_json::from_str(pair[1]).unwrap();
        let mut labels: Vec<String> = value["labels"]
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
        labels.sort();
        table
            .entry(labels.join(","))
            .or_default()
            .push(u32::try_from(value["id"].as_u64().unwrap()).unwrap());
    }
    table
}

/// The node's identity for a label set given as sorted text, if global.
fn global_of(identities: &BTreeMap<String, u32>, labels: &str) -> Option<u32> {
    let mut wanted: Vec<&str> = labels.split(',').collect();
    wanted.sort_unstable();
    identities.iter().find_map(|(l, id)| {
        let mut have: Vec<&str> = l.split(',').collect();
        have.sort_unstable();
        (have == wanted && (256..=65_535).contains(id)).then_some(*id)
    })
}

/// The leading allocator's name, from etcd.
fn allocator_leader(core: &Core, cluster: &EtcdCluster) -> Option<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", &core.ns, "etcdctl"])
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &cluster.endpoints().join(","),
            "--command-timeout=5s",
        ])
        .args([
            "get",
            "--print-value-only",
            &format!("{PREFIX}/operator/leader"),
        ])
        .output()
        .ok()?;
    let name = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!name.is_empty()).then_some(name)
}

/// On every node at the same moment: an endpoint with labels `app=<app>` that no node had.
fn burst(nodes: &[Node], round: u16, app: &str) {
    for node in nodes {
        sh(&format!(
            "ip -n {h} link add fqb{round} type veth peer name fqb{round}p && ip -n {h} link set fqb{round} up",
            h = node.t.host
        ));
    }
    std::thread::scope(|s| {
        for node in nodes {
            let address = format!("10.{}.{}.2", node.t.n, 60 + round);
            let id = (100 + round).to_string();
            let interface = format!("fqb{round}");
            let admin = node.admin();
            let label = format!("app={app}");
            let host = node.t.host.clone();
            s.spawn(move || {
                let out = Command::new("nsenter")
                    .arg(format!("--net=/run/netns/{host}"))
                    .arg(env!("CARGO_BIN_EXE_fqdnd"))
                    .args([
                        "endpoint",
                        "add",
                        "--id",
                        &id,
                        "--name",
                        app,
                        "--interface",
                        &interface,
                    ])
                    .args([
                        "--address",
                        &address,
                        "--label",
                        &label,
                        "--admin-socket",
                        &admin,
                    ])
                    .stdout(Stdio::null())
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            });
        }
    });
}

/// Every label set in etcd has one number, and every node holds the etcd number for every
/// global label set it has.
fn assert_agreement(core: &Core, cluster: &EtcdCluster, nodes: &[&Node]) -> BTreeMap<String, u32> {
    let table = etcd_identities(core, cluster);
    for (labels, ids) in &table {
        assert_eq!(ids.len(), 1, "duplicate identities for {labels}: {ids:?}");
    }
    let table: BTreeMap<String, u32> = table.into_iter().map(|(l, ids)| (l, ids[0])).collect();
    for node in nodes {
        for (labels, id) in node.identities() {
            if (256..=65_535).contains(&id) {
                assert_eq!(
                    table.get(&sorted(&labels)),
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
    let pid = std::process::id();
    let scratch = std::env::temp_dir().join(format!("fqdnd-cluster-e2e-{pid}"));
    let mut core = Core::new(&scratch);
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
    let op_config = scratch.join("cluster.yaml");
    std::fs::write(
        &op_config,
        format!(
            "apiVersion: fqdnd.io/v1\nkind: Cluster\nspec:\n  endpoints: [{}]\n  prefix: {PREFIX}\n  leaseTTL: {}s\n",
            cluster
                .endpoints()
                .iter()
                .map(|e| format!("\"{e}\""))
                .collect::<Vec<_>>()
                .join(", "),
            TTL.as_secs()
        ),
    )
    .unwrap();
    let tiers = ["web", "db", "web"];
    let mut nodes: Vec<Node> = topologies
        .into_iter()
        .enumerate()
        .map(|(k, t)| {
            let name = format!("node{k}");
            let config = t.write_node_config(&node_config(
                &t,
                &name,
                u16::try_from(k).unwrap(),
                tiers[k],
                &cluster.endpoints(),
            ));
            serve_echo(&t.ep_b, SocketAddr::new(t.v4(2, 2), 8080));
            Node { t, name, config }
        })
        .collect();
    for node in &mut nodes {
        let config = node.config.clone();
        node.t.start_node(&config);
    }
    let all_logs =
        |nodes: &[Node]| -> String { nodes.iter().map(Node::logs).collect::<Vec<_>>().join("\n") };
    until(
        "every node reaches etcd",
        CONVERGE,
        || nodes.iter().all(Node::connected),
        || all_logs(&nodes),
    );

    // 1. No allocator yet: each node's endpoints are on temporary identities.
    for node in &nodes {
        assert_eq!(
            node.temporaries(),
            2,
            "{}: client and server wait",
            node.name
        );
    }
    // A policy applied once reaches every node, and applies at once to temporary identities.
    let policy = scratch.join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: clients}
spec:
  endpointSelector: {matchLabels: {role: client}}
  egress:
  - toEndpoints: [{matchLabels: {tier: web}}]
    toPorts: [{ports: [{port: \"8080\", protocol: TCP}]}]
",
    )
    .unwrap();
    // A broken policy is refused before anything is stored.
    let broken = scratch.join("broken.yaml");
    std::fs::write(
        &broken,
        std::fs::read_to_string(&policy)
            .unwrap()
            .replace("toPorts", "toPort"),
    )
    .unwrap();
    let refused = Command::new("ip")
        .args(["netns", "exec", &core.ns, env!("CARGO_BIN_EXE_fqdnd")])
        .args([
            "policy",
            "apply",
            "--config",
            op_config.to_str().unwrap(),
            broken.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("broken.yaml:8:"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    core.cli(&[
        "policy",
        "apply",
        "--config",
        op_config.to_str().unwrap(),
        policy.to_str().unwrap(),
    ]);
    until(
        "the shared policy on every node",
        CONVERGE,
        || {
            nodes
                .iter()
                .all(|n| n.status()["cluster"]["shared_policies"].as_u64() == Some(1))
        },
        || all_logs(&nodes),
    );
    // Node 0's client may reach its web server (both on temporary identities); node 1's client
    // may not reach its db server.
    until(
        "node0 client → node0 web on temporary identities",
        CONVERGE,
        || tcp_reaches(nodes[0].client(), nodes[0].server(), REACHES),
        || all_logs(&nodes),
    );
    assert!(
        !tcp_reaches(nodes[1].client(), nodes[1].server(), DROPPED),
        "db is denied"
    );
    // A remote endpoint without a global identity is not known yet: denied.
    assert!(!tcp_reaches(nodes[0].client(), nodes[2].server(), DROPPED));
    let mut established = tcp_open(nodes[0].client(), nodes[0].server()).expect("connects");
    assert!(echo(&mut established, b"before"));

    // 2. The allocators: one global identity per label set, the switch keeps the flow.
    core.start_operator("op-a", &op_config);
    core.start_operator("op-b", &op_config);
    until(
        "no temporary identity left",
        CONVERGE,
        || nodes.iter().all(|n| n.temporaries() == 0),
        || all_logs(&nodes),
    );
    assert!(
        echo(&mut established, b"after the switch"),
        "the established flow survives"
    );
    let node_refs: Vec<&Node> = nodes.iter().collect();
    let mut known = assert_agreement(&core, &cluster, &node_refs);
    assert!(global_of(&nodes[0].identities(), "k8s:role=server,k8s:tier=web").is_some());
    // Cross-node toEndpoints, by labels.
    until(
        "node0 client → node2 web (cross-node)",
        CONVERGE,
        || tcp_reaches(nodes[0].client(), nodes[2].server(), REACHES),
        || all_logs(&nodes),
    );
    assert!(tcp_reaches(nodes[1].client(), nodes[0].server(), REACHES));
    assert!(
        !tcp_reaches(nodes[0].client(), nodes[1].server(), DROPPED),
        "db is denied across nodes too"
    );

    // 3. The same new labels on every node at the same moment: one identity (three rounds).
    for round in 0..3u16 {
        let app = format!("burst{round}");
        burst(&nodes, round, &app);
        let wanted = format!("k8s:app={app}");
        until(
            &format!("{app} global on every node"),
            CONVERGE,
            || {
                nodes
                    .iter()
                    .all(|n| global_of(&n.identities(), &wanted).is_some())
            },
            || all_logs(&nodes),
        );
        let table = assert_agreement(&core, &cluster, &node_refs);
        assert_unchanged(&known, &table);
        known = table;
    }

    // 4. Kill -9 the etcd leader: nothing changes, new label sets still get one identity.
    let leader = cluster.leader().expect("an etcd leader");
    cluster.kill(leader);
    cluster.wait_healthy(CONVERGE);
    burst(&nodes, 3, "after-etcd-leader");
    until(
        "identities after the etcd leader died",
        CONVERGE,
        || {
            nodes
                .iter()
                .all(|n| global_of(&n.identities(), "k8s:app=after-etcd-leader").is_some())
        },
        || all_logs(&nodes),
    );
    let table = assert_agreement(&core, &cluster, &node_refs);
    assert_unchanged(&known, &table);
    known = table;
    cluster.restart(leader);
    cluster.wait_healthy(CONVERGE);

    // 5. Kill -9 the allocator leader: the other takes over within its lease.
    let op_leader = allocator_leader(&core, &cluster).expect("an allocator leads");
    core.kill_operator(&op_leader);
    let killed = Instant::now();
    burst(&nodes, 4, "after-allocator-leader");
    until(
        "identities after the allocator leader died",
        CONVERGE,
        || {
            nodes
                .iter()
                .all(|n| global_of(&n.identities(), "k8s:app=after-allocator-leader").is_some())
        },
        || all_logs(&nodes),
    );
    eprintln!(
        "allocator take-over: identities created {:?} after the kill",
        killed.elapsed()
    );
    assert_ne!(allocator_leader(&core, &cluster), Some(op_leader));
    let table = assert_agreement(&core, &cluster, &node_refs);
    assert_unchanged(&known, &table);
    known = table;
    drop(node_refs);

    // 6. Kill -9 a node: its endpoints go with its lease; the others stop reaching them.
    let dead = nodes.pop().unwrap();
    let mut dead_topology = dead.t;
    dead_topology.kill_node();
    let dead_server = SocketAddr::new(dead_topology.v4(2, 2), 8080);
    until(
        "node2's endpoints gone from node0's ipcache",
        CONVERGE,
        // Each node has its client, its server and five burst endpoints.
        || nodes[0].status()["cluster"]["remote_endpoints"].as_u64() == Some(7),
        || all_logs(&nodes),
    );
    assert!(
        !tcp_reaches(nodes[0].client(), dead_server, DROPPED),
        "a dead node's endpoint is world"
    );
    let node_refs: Vec<&Node> = nodes.iter().collect();
    let table = assert_agreement(&core, &cluster, &node_refs);
    assert_unchanged(&known, &table);
    drop(node_refs);
    drop(dead_topology);

    // 7. etcd entirely down for `outage`: enforcement goes on, a restart changes nothing, a new
    // endpoint runs on a temporary identity; everything converges when etcd is back.
    let before_outage: Vec<BTreeMap<String, u32>> = nodes.iter().map(Node::identities).collect();
    cluster.stop_all();
    until(
        "the nodes notice",
        CONVERGE,
        || nodes.iter().all(|n| !n.connected()),
        || all_logs(&nodes),
    );
    let down = Instant::now();
    sh(&format!(
        "ip -n {h} link add fqout type veth peer name fqoutp && ip -n {h} link set fqout up",
        h = nodes[0].t.host
    ));
    nodes[0].t.cli(&[
        "endpoint",
        "add",
        "--id",
        "200",
        "--name",
        "late",
        "--interface",
        "fqout",
        "--address",
        &format!("10.{}.70.2", nodes[0].t.n),
        "--label",
        "app=late",
        "--admin-socket",
        &nodes[0].admin(),
    ]);
    assert_eq!(
        nodes[0].temporaries(),
        1,
        "the new endpoint runs on a temporary identity"
    );
    // Node 1 restarts in the middle of the outage: same numbers, same remote endpoints, same
    // policy.
    {
        let n1 = &mut nodes[1];
        let config = n1.config.clone();
        n1.t.kill_node();
        n1.t.start_node(&config);
    }
    assert_eq!(
        nodes[1].identities(),
        before_outage[1],
        "a restart during the outage changes nothing"
    );
    while down.elapsed() < outage {
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
        std::thread::sleep(Duration::from_millis(500));
    }
    cluster.start_all();
    until(
        "everything converges after the outage",
        CONVERGE,
        || {
            nodes.iter().all(|n| n.connected() && n.temporaries() == 0)
                && global_of(&nodes[1].identities(), "k8s:app=late").is_some()
        },
        || all_logs(&nodes),
    );
    let node_refs: Vec<&Node> = nodes.iter().collect();
    let after = assert_agreement(&core, &cluster, &node_refs);
    assert_unchanged(&known, &after);
    assert!(echo(&mut established, b"after the outage"));
    assert!(tcp_reaches(nodes[1].client(), nodes[0].server(), REACHES));
}
