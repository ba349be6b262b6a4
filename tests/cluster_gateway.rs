//! Cluster mode of `fqdnd gateway` (no root: the in-memory datapath), end to end against a
//! real 3-member etcd on loopback and a real `fqdnd operator`: the client group waits on a
//! temporary identity until the allocator runs; a policy applied once with `fqdnd policy
//! apply` decides what the group may ask; a restart while etcd is down keeps the global
//! identity and the shared policy; a refused shared policy leaves the previous one in force.
//!
//! Skipped without etcd, unless `FQDND_REQUIRE_PRIVILEGED=1` (CI), where it fails.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

mod common;

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

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command};

use etcd::EtcdCluster;
use hickory_proto::op::ResponseCode;

use common::{
    Gateway, PATIENCE, documents, fqdnd, fqdnd_command, gateway_doc, poll_until, rcode, run,
    stdout_of, text,
};

/// An `fqdnd operator`, killed when dropped.
struct Operator(Child);

impl Operator {
    fn start(dir: &Path, config: &str, name: &str) -> Self {
        let log = File::create(dir.join(format!("{name}.log"))).unwrap();
        Self(
            fqdnd_command()
                .args(["operator", "--config", config, "--name", name])
                .env("FQDND_LOG", "info")
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The gateway's number for the client group's label set.
fn lan_identity(gw: &Gateway) -> Option<u64> {
    gw.admin(&["identity", "list"])
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["labels"][0].as_str() == Some("k8s:app=lan"))
        .and_then(|r| r["identity"].as_u64())
}

fn cluster_status(gw: &Gateway) -> serde_json::Value {
    gw.status()["cluster"].clone()
}

fn temporaries(gw: &Gateway) -> Option<usize> {
    cluster_status(gw)["temporary_identities"]
        .as_array()
        .map(Vec::len)
}

fn connected(gw: &Gateway) -> bool {
    cluster_status(gw)["connected"].as_bool() == Some(true)
}

/// Waits until `check` holds; panics naming `what`.
fn until(what: &str, mut check: impl FnMut() -> bool) {
    poll_until(2 * PATIENCE, what, || check().then_some(()));
}

const POLICY: &str = "apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: lan-dns}
spec:
  endpointSelector: {matchLabels: {app: lan}}
  egress:
  - toCIDR: [127.0.0.1/32]
    toPorts:
    - ports: [{port: \"53\", protocol: UDP}]
      rules:
        dns: [{matchName: api.example.test}]
";

#[test]
fn a_gateway_in_cluster_mode() {
    if !etcd::available("cluster_gateway") {
        return;
    }
    let mut cluster = EtcdCluster::start("cluster-gw", 3, None, "127.0.0.1");
    let mut setup = Gateway::setup("cluster-gw");
    let endpoints: Vec<String> = cluster
        .endpoints()
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect();
    let cluster_yaml = setup.config(
        "cluster.yaml",
        &format!(
            "apiVersion: fqdnd.io/v1\nkind: Cluster\nspec:\n  endpoints: [{}]\n  prefix: /gw-test\n  nodeName: gw-1\n  leaseTTL: 4s\n",
            endpoints.join(", ")
        ),
    );
    let state = setup.dir().join("state");
    setup.config(
        "gateway.yaml",
        &documents(&[
            &gateway_doc(
                "127.0.0.1:0",
                &format!(
                    "  stateDir: {}
  staticZones:
  - origin: example.test
    records: |
      $TTL 300
      @ IN SOA ns.example.test. admin.example.test. 1 3600 600 86400 60
      @ IN NS ns.example.test.
      api IN A 192.0.2.1
      other IN A 192.0.2.2
",
                    state.display()
                ),
            ),
            "apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: lan}
spec: {id: 1, addresses: [\"127.0.0.0/8\"], labels: {app: lan}}
",
        ]),
    );
    let mut gw = setup.start();
    let cfg = cluster_yaml.to_str().unwrap();
    until("connected, the group on a temporary identity", || {
        connected(&gw) && temporaries(&gw) == Some(1)
    });
    // No policy yet: the group asks anything.
    assert_eq!(
        rcode(gw.dns, "other.example.test"),
        Some(ResponseCode::NoError)
    );
    // A shared policy: the group may ask api only.
    let policy = gw.join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    stdout_of(&fqdnd(&[
        "policy",
        "apply",
        "--config",
        cfg,
        policy.to_str().unwrap(),
    ]));
    until("the shared policy enforced", || {
        rcode(gw.dns, "other.example.test") == Some(ResponseCode::Refused)
    });
    assert_eq!(
        rcode(gw.dns, "api.example.test"),
        Some(ResponseCode::NoError)
    );
    let listed = stdout_of(&fqdnd(&["policy", "list", "--config", cfg]));
    assert!(listed.contains("ccnp/lan-dns"), "{listed}");
    // The allocator: the group's label set gets its global identity.
    let operator = Operator::start(gw.dir(), cfg, "op-1");
    until("the global identity", || temporaries(&gw) == Some(0));
    let global = lan_identity(&gw).unwrap();
    assert!((256..=65_535).contains(&global));
    assert_eq!(
        cluster_status(&gw)["leader"].as_str(),
        Some("op-1"),
        "status names the allocator leader"
    );
    // etcd down, the gateway restarted: same identity, same policy.
    cluster.stop_all();
    until("the gateway notices", || !connected(&gw));
    gw.restart();
    assert_eq!(
        lan_identity(&gw),
        Some(global),
        "a restart during the outage keeps the global identity"
    );
    assert_eq!(
        rcode(gw.dns, "other.example.test"),
        Some(ResponseCode::Refused),
        "and the shared policy"
    );
    assert_eq!(
        rcode(gw.dns, "api.example.test"),
        Some(ResponseCode::NoError)
    );
    cluster.start_all();
    until("reconnected", || connected(&gw));
    // A shared policy this node refuses (written to etcd directly: `fqdnd policy apply`
    // would refuse it) leaves the previous policy in force.
    let put = run(Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &cluster.endpoints().join(",")])
        .args(["put", "/gw-test/policies/ccnp/broken", "kind: [oops"]));
    assert!(put.status.success(), "{}", text(&put.stderr));
    until("the refusal is reported", || {
        cluster_status(&gw)["shared_policy_errors"]
            .as_array()
            .is_some_and(|e| !e.is_empty())
    });
    assert_eq!(
        rcode(gw.dns, "other.example.test"),
        Some(ResponseCode::Refused),
        "the previous policy stays"
    );
    assert_eq!(
        rcode(gw.dns, "api.example.test"),
        Some(ResponseCode::NoError)
    );
    // Deleting the broken one and the policy: the group asks anything again.
    stdout_of(&fqdnd(&[
        "policy",
        "delete",
        "--config",
        cfg,
        "ccnp/broken",
        "ccnp/lan-dns",
    ]));
    until("no shared policy", || {
        rcode(gw.dns, "other.example.test") == Some(ResponseCode::NoError)
    });
    let missing = fqdnd(&["policy", "delete", "--config", cfg, "ccnp/nothing"]);
    assert!(!missing.status.success());
    drop(operator);
}
