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
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "test code: real clocks and sleeps, a failed step should panic"
)]

#[path = "../cluster/tests/support/etcd.rs"]
#[allow(
    dead_code,
    unreachable_pub,
    reason = "the cluster crate's etcd launcher, shared: not every helper is used here"
)]
mod etcd;

use std::fs::File;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use etcd::EtcdCluster;
use serde_json::Value;

const CONVERGE: Duration = Duration::from_secs(60);

/// A scratch directory, removed at the end unless the test failed (then its logs stay).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("fqdnd-cluster-gw-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("logs kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The processes this test started; killed when it ends, whatever happens.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn fqdnd(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fqdnd"))
        .args(args)
        .output()
        .unwrap()
}

fn spawn(dir: &Path, log: &str, args: &[&str]) -> Child {
    let log = File::create(dir.join(log)).unwrap();
    Command::new(env!("CARGO_BIN_EXE_fqdnd"))
        .args(args)
        .env("FQDND_LOG", "info")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn until(what: &str, mut check: impl FnMut() -> bool, logs: &Path) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < CONVERGE,
            "never happened: {what}\n{}",
            std::fs::read_to_string(logs).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The response code of an A query for `name`, or `None` without an answer.
fn rcode(server: &str, name: &str) -> Option<u8> {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut query = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        query.push(u8::try_from(label.len()).unwrap());
        query.extend(label.as_bytes());
    }
    query.extend([0, 0, 1, 0, 1]);
    socket.send_to(&query, server).unwrap();
    let mut buf = [0u8; 512];
    let (n, _) = socket.recv_from(&mut buf).ok()?;
    (n >= 4).then(|| buf[3] & 0x0f)
}

struct Gateway {
    dir: PathBuf,
    configs: Vec<String>,
    admin: String,
    listen: String,
}

impl Gateway {
    fn start(&self, procs: &mut Procs) {
        let _ = std::fs::remove_file(&self.admin);
        let mut args = vec!["gateway"];
        for c in &self.configs {
            args.extend(["--config", c.as_str()]);
        }
        procs.0.push(spawn(&self.dir, "gateway.log", &args));
        let admin = PathBuf::from(&self.admin);
        until(
            "the gateway's admin socket",
            || std::os::unix::net::UnixStream::connect(&admin).is_ok(),
            &self.dir.join("gateway.log"),
        );
    }

    fn status(&self) -> Value {
        let out = fqdnd(&["status", "--json", "--admin-socket", &self.admin]);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn identities(&self) -> Vec<(u64, String)> {
        let out = fqdnd(&["identity", "list", "--json", "--admin-socket", &self.admin]);
        let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["identity"].as_u64().unwrap(),
                    r["labels"][0].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }

    fn logs(&self) -> PathBuf {
        self.dir.join("gateway.log")
    }
}

#[test]
fn a_gateway_in_cluster_mode() {
    if !etcd::available("cluster_gateway") {
        return;
    }
    let mut cluster = EtcdCluster::start("cluster-gw", 3, None, "127.0.0.1");
    let dir = Scratch::new();
    let mut procs = Procs(Vec::new());
    let cluster_yaml = dir.path().join("cluster.yaml");
    std::fs::write(
        &cluster_yaml,
        format!(
            "apiVersion: fqdnd.io/v1\nkind: Cluster\nspec:\n  endpoints: [{}]\n  prefix: /gw-test\n  nodeName: gw-1\n  leaseTTL: 4s\n",
            cluster
                .endpoints()
                .iter()
                .map(|e| format!("\"{e}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .unwrap();
    let port = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let listen = format!("127.0.0.1:{port}");
    let gateway_yaml = dir.path().join("gateway.yaml");
    std::fs::write(
        &gateway_yaml,
        format!(
            "apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: [\"{listen}\"]
  adminSocket: {admin}
  stateDir: {state}
  staticZones:
  - origin: example.test
    records: |
      $TTL 300
      @ IN SOA ns.example.test. admin.example.test. 1 3600 600 86400 60
      @ IN NS ns.example.test.
      api IN A 192.0.2.1
      other IN A 192.0.2.2
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {{name: lan}}
spec: {{id: 1, addresses: [\"127.0.0.0/8\"], labels: {{app: lan}}}}
",
            admin = dir.path().join("admin.sock").display(),
            state = dir.path().join("state").display(),
        ),
    )
    .unwrap();
    let gw = Gateway {
        dir: dir.path().to_path_buf(),
        configs: vec![
            gateway_yaml.to_str().unwrap().to_owned(),
            cluster_yaml.to_str().unwrap().to_owned(),
        ],
        admin: dir.path().join("admin.sock").to_str().unwrap().to_owned(),
        listen,
    };
    gw.start(&mut procs);
    until(
        "connected, the group on a temporary identity",
        || {
            let s = gw.status();
            s["cluster"]["connected"].as_bool() == Some(true)
                && s["cluster"]["temporary_identities"]
                    .as_array()
                    .map(Vec::len)
                    == Some(1)
        },
        &gw.logs(),
    );
    // No policy yet: the group asks anything.
    assert_eq!(rcode(&gw.listen, "other.example.test"), Some(0));
    // A shared policy: the group may ask api only.
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: cilium.io/v2
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
",
    )
    .unwrap();
    let cfg = cluster_yaml.to_str().unwrap();
    let applied = fqdnd(&["policy", "apply", "--config", cfg, policy.to_str().unwrap()]);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    until(
        "the shared policy enforced",
        || rcode(&gw.listen, "other.example.test") == Some(5),
        &gw.logs(),
    );
    assert_eq!(rcode(&gw.listen, "api.example.test"), Some(0));
    let listed = fqdnd(&["policy", "list", "--config", cfg]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("ccnp/lan-dns"));
    // The allocator: the group's label set gets its global identity.
    procs.0.push(spawn(
        dir.path(),
        "operator.log",
        &["operator", "--config", cfg, "--name", "op-1"],
    ));
    until(
        "the global identity",
        || {
            gw.status()["cluster"]["temporary_identities"]
                .as_array()
                .map(Vec::len)
                == Some(0)
        },
        &gw.logs(),
    );
    let global = gw
        .identities()
        .into_iter()
        .find(|(_, l)| l == "k8s:app=lan")
        .map(|(id, _)| id)
        .unwrap();
    assert!((256..=65_535).contains(&global));
    assert_eq!(
        gw.status()["cluster"]["leader"].as_str(),
        Some("op-1"),
        "status names the allocator leader"
    );
    // etcd down, the gateway restarted: same identity, same policy.
    cluster.stop_all();
    until(
        "the gateway notices",
        || gw.status()["cluster"]["connected"].as_bool() == Some(false),
        &gw.logs(),
    );
    let gateway = procs.0.remove(0);
    drop(Procs(vec![gateway]));
    gw.start(&mut procs);
    assert_eq!(
        gw.identities()
            .into_iter()
            .find(|(_, l)| l == "k8s:app=lan")
            .map(|(id, _)| id),
        Some(global),
        "a restart during the outage keeps the global identity"
    );
    assert_eq!(
        rcode(&gw.listen, "other.example.test"),
        Some(5),
        "and the shared policy"
    );
    assert_eq!(rcode(&gw.listen, "api.example.test"), Some(0));
    cluster.start_all();
    until(
        "reconnected",
        || gw.status()["cluster"]["connected"].as_bool() == Some(true),
        &gw.logs(),
    );
    // A shared policy this node refuses (valid YAML that another version might accept is
    // simulated by writing the key directly) leaves the previous policy in force.
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &cluster.endpoints().join(",")])
        .args(["put", "/gw-test/policies/ccnp/broken", "kind: [oops"])
        .output()
        .unwrap();
    assert!(out.status.success());
    until(
        "the refusal is reported",
        || {
            gw.status()["cluster"]["shared_policy_errors"]
                .as_array()
                .is_some_and(|e| !e.is_empty())
        },
        &gw.logs(),
    );
    assert_eq!(
        rcode(&gw.listen, "other.example.test"),
        Some(5),
        "the previous policy stays"
    );
    assert_eq!(rcode(&gw.listen, "api.example.test"), Some(0));
    // Deleting the broken one and the policy: the group asks anything again.
    let deleted = fqdnd(&[
        "policy",
        "delete",
        "--config",
        cfg,
        "ccnp/broken",
        "ccnp/lan-dns",
    ]);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    until(
        "no shared policy",
        || rcode(&gw.listen, "other.example.test") == Some(0),
        &gw.logs(),
    );
    let missing = fqdnd(&["policy", "delete", "--config", cfg, "ccnp/nothing"]);
    assert!(!missing.status.success());
}
