//! Cluster mode of `fqdnd gateway` (no root: the in-memory datapath), end to end against a
//! real 3-member etcd on loopback and a real `fqdnd operator`: the client group waits on a
//! temporary identity until the allocator runs; a policy applied once with `fqdnd policy
//! apply` decides what the group may ask, beside the gateway's own policy file; a restart while
//! etcd is down keeps the global identity and the shared policy; a refused shared policy leaves
//! the previous one in force. An HA gateway group (two gateways, `gatewayGroup`): the peer
//! takes in only what its own policy and breakers allow.
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
    Gateway, PATIENCE, documents, fqdnd, fqdnd_command, gateway_doc, policy_doc, poll_until, rcode,
    run, settings_doc, stdout_of, text,
};

/// One etcd cluster at a time in this binary: each is three processes on a busy machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
        .find(|r| {
            r["labels"]
                .as_array()
                .is_some_and(|l| l.iter().any(|l| l.as_str() == Some("k8s:app=lan")))
        })
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

/// An egress rule of the client group: DNS to the gateway, for `name` only.
fn dns_for(name: &str) -> String {
    dns_rule(&format!("matchName: {name}"))
}

/// An egress rule of the client group: DNS to the gateway, for what `rule` (one DNS rule's
/// fields) matches.
fn dns_rule(rule: &str) -> String {
    format!(
        "  - toCIDR: [127.0.0.1/32]
    toPorts:
    - ports: [{{port: \"53\", protocol: UDP}}]
      rules:
        dns: [{{{rule}}}]
"
    )
}

/// What the group may ask: (api, local, other) answered (`true`) or refused.
fn asks(gw: &Gateway) -> (bool, bool, bool) {
    let answered = |name: &str| match rcode(gw.dns, name) {
        Some(ResponseCode::NoError) => true,
        Some(ResponseCode::Refused) => false,
        other => panic!("{name}: {other:?}"),
    };
    (
        answered("api.example.test"),
        answered("local.example.test"),
        answered("other.example.test"),
    )
}

#[test]
fn a_gateway_in_cluster_mode() {
    if !etcd::available("cluster_gateway") {
        return;
    }
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
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
      local IN A 192.0.2.3
",
                    state.display()
                ),
            ),
            "apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: lan}
spec: {id: 1, addresses: [\"127.0.0.0/8\"], labels: {app: lan}}
",
            // The gateway's own policy: the group may ask local.example.test.
            &policy_doc(
                "CiliumClusterwideNetworkPolicy",
                "local-dns",
                "app: lan",
                &dns_for("local.example.test"),
            ),
        ]),
    );
    let mut gw = setup.start();
    let cfg = cluster_yaml.to_str().unwrap();
    until("connected, the group on a temporary identity", || {
        connected(&gw) && temporaries(&gw) == Some(1)
    });
    // No shared policy yet: the gateway's own file decides.
    assert_eq!(asks(&gw), (false, true, false));
    // A shared policy: the group may ask api too, beside what its file allows.
    let policy = gw.join("policy.yaml");
    std::fs::write(
        &policy,
        policy_doc(
            "CiliumClusterwideNetworkPolicy",
            "lan-dns",
            "app: lan",
            &dns_for("api.example.test"),
        ),
    )
    .unwrap();
    stdout_of(&fqdnd(&[
        "policy",
        "apply",
        "--config",
        cfg,
        policy.to_str().unwrap(),
    ]));
    until("the shared policy enforced", || {
        rcode(gw.dns, "api.example.test") == Some(ResponseCode::NoError)
    });
    assert_eq!(asks(&gw), (true, true, false));
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
    let text_status = stdout_of(&gw.cli(&["status"]));
    for line in [
        "cluster:          node gw-1 on http://127.0.0.1:",
        "  etcd:           connected for ",
        "  allocator:      op-1",
        "  temporary:      0 pending",
    ] {
        assert!(text_status.contains(line), "{line:?} in {text_status}");
    }
    // etcd down, the gateway restarted: same identity, same policy.
    cluster.stop_all();
    until("the gateway notices", || !connected(&gw));
    gw.restart();
    assert_eq!(
        lan_identity(&gw),
        Some(global),
        "a restart during the outage keeps the global identity"
    );
    assert_eq!(asks(&gw), (true, true, false), "and the shared policy");
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
        asks(&gw),
        (true, true, false),
        "the valid shared policy stays"
    );
    let refused = cluster_status(&gw)["shared_policy_errors"][0]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        refused.starts_with("etcd:/gw-test/policies/ccnp/broken:"),
        "{refused}"
    );
    assert_eq!(
        cluster_status(&gw)["rejected"]["policy_document"].as_u64(),
        Some(1)
    );
    assert!(
        stdout_of(&gw.cli(&["status"]))
            .contains("  shared policy refused: etcd:/gw-test/policies/ccnp/broken:"),
    );
    // A fresh start (an empty state directory) with the broken document in etcd: every
    // other shared document applies (it used to apply none: fail open).
    gw.kill();
    std::fs::remove_dir_all(&state).unwrap();
    gw.restart();
    until("the shared policy read again", || {
        cluster_status(&gw)["shared_policy_known"].as_bool() == Some(true)
    });
    assert_eq!(
        asks(&gw),
        (true, true, false),
        "the valid shared policy applies"
    );
    // A deletion takes effect whatever the broken document holds.
    stdout_of(&fqdnd(&[
        "policy",
        "delete",
        "--config",
        cfg,
        "ccnp/lan-dns",
    ]));
    until("the deletion enforced", || {
        rcode(gw.dns, "api.example.test") == Some(ResponseCode::Refused)
    });
    assert_eq!(asks(&gw), (false, true, false));
    stdout_of(&fqdnd(&[
        "policy",
        "delete",
        "--config",
        cfg,
        "ccnp/broken",
    ]));
    until("no refusal left", || {
        cluster_status(&gw)["shared_policy_errors"]
            .as_array()
            .is_some_and(Vec::is_empty)
    });
    assert_eq!(asks(&gw), (false, true, false));
    let missing = fqdnd(&["policy", "delete", "--config", cfg, "ccnp/nothing"]);
    assert!(!missing.status.success());
    drop(operator);
}

/// An HA gateway group without root (in-memory datapaths; docs/ha-gateway.md): what gw-a
/// learns reaches gw-b only as gw-b's own policy and breakers allow — a name its policy
/// refuses and a client group it does not have are skipped, and its names-per-group breaker
/// (3) stops the rest, as it would for its own clients' answers.
#[test]
fn an_ha_group_imports_only_what_the_peer_allows() {
    if !etcd::available("cluster_gateway") {
        return;
    }
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cluster = EtcdCluster::start("ha-group", 3, None, "127.0.0.1");
    let endpoints: Vec<String> = cluster
        .endpoints()
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect();
    let gateway = |name: &str, groups: &str, lan_names: &str, settings: &str| {
        let mut setup = Gateway::setup(&format!("ha-{name}"));
        setup.config(
            "gateway.yaml",
            &documents(&[
                &gateway_doc(
                    "127.0.0.1:0",
                    "  staticZones:
  - origin: example.test
    records: |
      $TTL 300
      @ IN SOA ns.example.test. admin.example.test. 1 3600 600 86400 60
      @ IN NS ns.example.test.
      a1 IN A 192.0.2.1
      a2 IN A 192.0.2.2
      a3 IN A 192.0.2.3
      a4 IN A 192.0.2.4
      a5 IN A 192.0.2.5
      secret IN A 192.0.2.9
      x IN A 192.0.2.10
",
                ),
                &format!(
                    "apiVersion: fqdnd.io/v1\nkind: Cluster\nspec:\n  endpoints: [{}]\n  prefix: /ha-group\n  nodeName: {name}\n  gatewayGroup: edge\n",
                    endpoints.join(", ")
                ),
                groups,
                &policy_doc(
                    "CiliumClusterwideNetworkPolicy",
                    "lan-dns",
                    "app: lan",
                    &dns_rule(&format!("matchPattern: {lan_names}")),
                ),
                &settings_doc(settings),
            ]),
        );
        setup.start()
    };
    let lan = "apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: lan}
spec: {id: 1, addresses: [\"127.0.0.1/32\"], labels: {app: lan}}
";
    let other = "---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: other}
spec: {id: 2, addresses: [\"127.0.0.2/32\"], labels: {app: other}}
";
    let gw_a = gateway(
        "gw-a",
        &format!("{lan}{other}"),
        "\"*.example.test\"",
        "  gcInterval: 1s\n",
    );
    let gw_b = gateway(
        "gw-b",
        lan,
        "\"a*.example.test\"",
        "  breakers:\n    maxNamesPerEndpoint: 3\n",
    );
    let ha = |gw: &Gateway| cluster_status(gw)["ha"].clone();
    // gw-a learns five names and a secret for `lan`, one for `other`.
    for name in ["a1", "a2", "a3", "a4", "a5", "secret"] {
        assert_eq!(
            rcode(gw_a.dns, &format!("{name}.example.test")),
            Some(ResponseCode::NoError)
        );
    }
    let (reply, _) = common::udp_from(
        "127.0.0.2".parse().unwrap(),
        gw_a.dns,
        &common::question(7, "x.example.test", hickory_proto::rr::RecordType::A),
    )
    .unwrap();
    assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
    until("gw-a to publish seven records", || {
        ha(&gw_a)["published"].as_u64() == Some(7)
    });
    until("gw-b to take in or refuse all seven", || {
        let h = ha(&gw_b);
        h["imported"].as_u64().unwrap_or(0) + h["import_refused"].as_u64().unwrap_or(0) == 7
    });
    let h = ha(&gw_b);
    // a1-a3 in; a4 and a5 past its breaker, the secret refused by its policy, `other` unknown.
    assert_eq!(
        (h["imported"].as_u64(), h["import_refused"].as_u64()),
        (Some(3), Some(4)),
        "{h}"
    );
    let cache = gw_b.admin(&["cache", "list"]).to_string();
    for name in ["a1", "a2", "a3"] {
        assert!(cache.contains(&format!("{name}.example.test")), "{cache}");
    }
    for name in ["a4", "a5", "secret", "x"] {
        assert!(
            !cache.contains(&format!("{name}.example.test")),
            "{name}: {cache}"
        );
    }
    // gw-b learned nothing itself, so it published nothing.
    assert_eq!(ha(&gw_b)["published"].as_u64(), Some(0));
}

/// `etcdctl` against `cluster` as `user` (`name:password`, or none).
fn etcdctl(cluster: &EtcdCluster, user: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut command = Command::new("etcdctl");
    command
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &cluster.endpoints().join(",")]);
    if let Some(user) = user {
        command.args(["--user", user]);
    }
    run(command.args(args))
}

/// etcd with authentication on and the least-privilege roles of docs/manual/cluster-and-ha.md ("Who is
/// trusted"): the gateway's user may read the prefix and write only its endpoints and its
/// registration; the operator's, identities and its own keys; the policy administrator's,
/// policies. The cluster works with those users, and a member's credentials cannot write
/// policy or identities — through etcdctl or through `fqdnd policy apply`.
#[test]
fn least_privilege_etcd_users_run_the_cluster_and_cannot_write_what_they_do_not_own() {
    if !etcd::available("cluster_gateway") {
        return;
    }
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cluster = EtcdCluster::start("auth", 1, None, "127.0.0.1");
    let p = "/auth-test";
    // The layout of docs/manual/cluster-and-ha.md, as an administrator would set it up.
    let setup_commands: Vec<Vec<String>> = [
        "role add fqdnd-member",
        &format!("role grant-permission fqdnd-member read {p}/ --prefix=true"),
        &format!("role grant-permission fqdnd-member readwrite {p}/endpoints/ --prefix=true"),
        "role add fqdnd-member-gw-1",
        &format!("role grant-permission fqdnd-member-gw-1 readwrite {p}/nodes/gw-1"),
        "role add fqdnd-operator",
        &format!("role grant-permission fqdnd-operator read {p}/ --prefix=true"),
        &format!("role grant-permission fqdnd-operator readwrite {p}/identities/ --prefix=true"),
        &format!("role grant-permission fqdnd-operator readwrite {p}/operator/ --prefix=true"),
        "role add fqdnd-policy",
        &format!("role grant-permission fqdnd-policy readwrite {p}/policies/ --prefix=true"),
        "user add gw-1:gw-1-secret",
        "user grant-role gw-1 fqdnd-member",
        "user grant-role gw-1 fqdnd-member-gw-1",
        "user add op-1:op-1-secret",
        "user grant-role op-1 fqdnd-operator",
        "user add admin:admin-secret",
        "user grant-role admin fqdnd-policy",
    ]
    .iter()
    .map(|c| c.split(' ').map(str::to_owned).collect())
    .collect();
    for args in [
        vec!["user", "add", "root:root-secret"],
        vec!["user", "grant-role", "root", "root"],
        vec!["auth", "enable"],
    ] {
        let out = etcdctl(&cluster, None, &args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
    for args in &setup_commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = etcdctl(&cluster, Some("root:root-secret"), &args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
    let mut setup = Gateway::setup("cluster-auth");
    let dir = setup.dir().to_path_buf();
    let cluster_doc = |user: &str| {
        let password = setup_password(&dir, user);
        format!(
            "apiVersion: fqdnd.io/v1\nkind: Cluster\nspec:\n  endpoints: [\"{}\"]\n  prefix: {p}\n  nodeName: {user}\n  leaseTTL: 4s\n  auth: {{user: {user}, passwordFile: {}}}\n",
            cluster.endpoints()[0],
            password.display()
        )
    };
    let member_yaml = setup.config("cluster.yaml", &cluster_doc("gw-1"));
    let operator_yaml = setup.file("operator/cluster.yaml", cluster_doc("op-1"));
    let admin_yaml = setup.file("admin/cluster.yaml", cluster_doc("admin"));
    setup.config(
        "gateway.yaml",
        &documents(&[
            &gateway_doc(
                "127.0.0.1:0",
                "  staticZones:
  - origin: example.test
    records: |
      $TTL 300
      @ IN SOA ns.example.test. admin.example.test. 1 3600 600 86400 60
      @ IN NS ns.example.test.
      api IN A 192.0.2.1
      other IN A 192.0.2.2
      local IN A 192.0.2.3
",
            ),
            "apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: lan}
spec: {id: 1, addresses: [\"127.0.0.0/8\"], labels: {app: lan}}
",
            &policy_doc(
                "CiliumClusterwideNetworkPolicy",
                "local-dns",
                "app: lan",
                &dns_for("local.example.test"),
            ),
        ]),
    );
    let gw = setup.start();
    until("connected as gw-1, on a temporary identity", || {
        connected(&gw) && temporaries(&gw) == Some(1)
    });
    let operator = Operator::start(gw.dir(), operator_yaml.to_str().unwrap(), "op-1");
    until("the global identity, made by op-1", || {
        temporaries(&gw) == Some(0)
    });
    // The policy administrator applies a shared policy; the gateway enforces it.
    let policy = gw.join("policy.yaml");
    std::fs::write(
        &policy,
        policy_doc(
            "CiliumClusterwideNetworkPolicy",
            "lan-dns",
            "app: lan",
            &dns_for("api.example.test"),
        ),
    )
    .unwrap();
    stdout_of(&fqdnd(&[
        "policy",
        "apply",
        "--config",
        admin_yaml.to_str().unwrap(),
        policy.to_str().unwrap(),
    ]));
    until("the shared policy enforced", || {
        rcode(gw.dns, "api.example.test") == Some(ResponseCode::NoError)
    });
    // A member's credentials write neither policy nor identities nor another's registration.
    for (user, key) in [
        (
            "gw-1:gw-1-secret",
            format!("{p}/policies/ccnp/open-everything"),
        ),
        ("gw-1:gw-1-secret", format!("{p}/identities/id/00999")),
        (
            "gw-1:gw-1-secret",
            format!("{p}/identities/labels/k8s:app=lan"),
        ),
        ("gw-1:gw-1-secret", format!("{p}/nodes/gw-2")),
        ("gw-1:gw-1-secret", format!("{p}/operator/leader")),
        (
            "op-1:op-1-secret",
            format!("{p}/policies/ccnp/open-everything"),
        ),
        ("admin:admin-secret", format!("{p}/identities/id/00999")),
    ] {
        let out = etcdctl(&cluster, Some(user), &["put", &key, "forged"]);
        assert!(
            !out.status.success() && text(&out.stderr).contains("permission denied"),
            "{user} wrote {key}: {}",
            text(&out.stderr)
        );
    }
    let refused = fqdnd(&[
        "policy",
        "apply",
        "--config",
        member_yaml.to_str().unwrap(),
        policy.to_str().unwrap(),
    ]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("permission denied"),
        "{}",
        text(&refused.stderr)
    );
    // A wrong password: the member says etcd refuses it, not that etcd is unreachable.
    std::fs::write(setup_password(gw.dir(), "admin"), "wrong\n").unwrap();
    let wrong = fqdnd(&["policy", "list", "--config", admin_yaml.to_str().unwrap()]);
    assert!(!wrong.status.success());
    assert!(
        text(&wrong.stderr).contains("etcd refused the request"),
        "{}",
        text(&wrong.stderr)
    );
    drop(operator);
}

/// Writes `<dir>/<user>.password` (mode 0600) and returns its path.
fn setup_password(dir: &Path, user: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(format!("{user}.password"));
    std::fs::write(&path, format!("{user}-secret\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// `etcdctl` against `cluster`: `args`, with `stdin` as the value if given; its stdout.
fn etcdctl_in(cluster: &EtcdCluster, args: &[&str], stdin: Option<&[u8]>) -> String {
    use std::io::Write as _;
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Issue 35 against a real etcd (no root): what a hostile hand writes under the group's
/// keys — a TTL of 300 with an expiry in 2100, a record under one client group's key naming
/// another, garbage, binary, a key outside the layout — is refused, counted (`fqdnd status`,
/// `fqdnd_cluster_records_rejected_total{kind="learned"}`) and logged once per key; a forged
/// record with a century's TTL is held a day at most; a key deleted with `etcdctl del` is
/// forgotten on both gateways (its writer's included); `fqdnd cache forget` on one gateway
/// reaches the other; a restart reads the group again without reporting the records' age as
/// import lag.
#[test]
#[allow(
    clippy::disallowed_types,
    reason = "the records forged here carry the wall clock's milliseconds, as a gateway's do"
)]
fn an_ha_group_checks_what_etcd_holds_and_revokes_what_is_deleted() {
    if !etcd::available("cluster_gateway") {
        return;
    }
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cluster = EtcdCluster::start("ha-hostile", 3, None, "127.0.0.1");
    let endpoints: Vec<String> = cluster
        .endpoints()
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect();
    let gateway = |name: &str| {
        let mut setup = Gateway::setup(&format!("hostile-{name}"));
        let metrics = setup.metrics_port();
        setup.config(
            "gateway.yaml",
            &documents(&[
                &gateway_doc(
                    "127.0.0.1:0",
                    &format!(
                        "  stateDir: state
  metrics: 127.0.0.1:{metrics}
  staticZones:
  - origin: example.test
    records: |
      $TTL 300
      @ IN SOA ns.example.test. admin.example.test. 1 3600 600 86400 60
      @ IN NS ns.example.test.
      a1 IN A 192.0.2.1
      a2 IN A 192.0.2.2
"
                    ),
                ),
                &format!(
                    "apiVersion: fqdnd.io/v1\nkind: Cluster\nspec:\n  endpoints: [{}]\n  prefix: /ha-hostile\n  nodeName: {name}\n  gatewayGroup: edge\n",
                    endpoints.join(", ")
                ),
                "apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: lan}
spec: {id: 1, addresses: [\"127.0.0.1/32\"], labels: {app: lan}}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {name: other}
spec: {id: 2, addresses: [\"127.0.0.2/32\"], labels: {app: other}}
",
                &policy_doc(
                    "CiliumClusterwideNetworkPolicy",
                    "lan-dns",
                    "app: lan",
                    &dns_rule("matchPattern: \"*.example.test\""),
                ),
            ]),
        );
        setup
    };
    let gw_a = gateway("gw-a").start();
    let mut gw_b = gateway("gw-b").start();
    let ha = |gw: &Gateway| cluster_status(gw)["ha"].clone();
    let cache = |gw: &Gateway| gw.admin(&["cache", "list"]).to_string();
    for name in ["a1", "a2"] {
        assert_eq!(
            rcode(gw_a.dns, &format!("{name}.example.test")),
            Some(ResponseCode::NoError)
        );
    }
    until("gw-b to import a1 and a2", || {
        let c = cache(&gw_b);
        c.contains("a1.example.test") && c.contains("a2.example.test")
    });
    // The hostile writes.
    let prefix = "/ha-hostile-learned/edge";
    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let record = |gateway: &str, client: &str, name: &str, ttl: u64, expires: u64| {
        format!(
            "{{\"name\":\"{name}\",\"client\":\"{client}\",\"addrs\":[\"192.0.2.77\"],\"ttl\":{ttl},\"learned_ms\":{now_ms},\"expires_ms\":{expires},\"gateway\":\"{gateway}\"}}"
        )
    };
    let bad: Vec<(String, Vec<u8>)> = vec![
        (
            format!("{prefix}/gw-x/lan/y2100.example.test."),
            record("gw-x", "lan", "y2100.example.test.", 300, 4_102_444_800_000).into_bytes(),
        ),
        (
            format!("{prefix}/gw-x/other/beta.example.test."),
            record("gw-x", "lan", "beta.example.test.", 300, now_ms + 300_000).into_bytes(),
        ),
        (
            format!("{prefix}/gw-x/lan/garbage.example.test."),
            b"{not json".to_vec(),
        ),
        (
            format!("{prefix}/gw-x/lan/binary.example.test."),
            vec![0xff, 0xfe, 0x00, 0x80],
        ),
        (format!("{prefix}/gw-x/lan"), b"{}".to_vec()),
    ];
    for (key, value) in &bad {
        etcdctl_in(&cluster, &["put", key], Some(value));
    }
    let century = u64::from(u32::MAX);
    etcdctl_in(
        &cluster,
        &[
            "put",
            &format!("{prefix}/gw-x/lan/forged.example.test."),
            &record(
                "gw-x",
                "lan",
                "forged.example.test.",
                century,
                now_ms + century * 1000,
            ),
        ],
        None,
    );
    until("gw-b to refuse the five bad values", || {
        ha(&gw_b)["rejected"].as_u64() == Some(5)
    });
    until("gw-b to import the forged record", || {
        cache(&gw_b).contains("forged.example.test")
    });
    // The same bad values written again: counted, not logged again.
    for (key, value) in &bad {
        etcdctl_in(&cluster, &["put", key], Some(value));
    }
    until("gw-b to count them again", || {
        ha(&gw_b)["rejected"].as_u64() == Some(10)
    });
    let c = cache(&gw_b);
    for name in ["y2100", "beta", "garbage", "binary"] {
        assert!(!c.contains(&format!("{name}.example.test")), "{name}: {c}");
    }
    // The forged record: a day at most.
    let rows = gw_b.admin(&["cache", "list"]);
    let forged = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["fqdn"] == "forged.example.test.")
        .unwrap();
    assert!(forged["ttl"].as_u64().unwrap() <= 86_400, "{forged}");
    let status = stdout_of(&gw_b.cli(&["status"]));
    assert!(status.contains("10 records rejected"), "{status}");
    assert!(status.contains("refused records: learned 10"), "{status}");
    gw_b.wait_metric(
        "fqdnd_cluster_records_rejected_total{kind=\"learned\"}",
        "the rejections counted",
        |v| v == 10.0,
    );
    let log = gw_b.log();
    let lines = log
        .lines()
        .filter(|l| l.contains("a record in the cluster store is refused") && l.contains("learned"))
        .count();
    assert_eq!(lines, 5, "one line per bad key:\n{log}");
    // A key deleted with etcdctl: both gateways forget what it alone carried.
    etcdctl_in(
        &cluster,
        &["del", &format!("{prefix}/gw-a/lan/a1.example.test.")],
        None,
    );
    until("gw-b to forget a1", || {
        !cache(&gw_b).contains("a1.example.test")
    });
    until("gw-a to forget a1", || {
        !cache(&gw_a).contains("a1.example.test")
    });
    // `cache forget` on gw-a: gw-b forgets it too.
    let done = gw_a.admin(&["cache", "forget", "a2.example.test"]);
    assert_eq!(done["group"]["deleted"], 1, "{done}");
    until("gw-b to forget a2", || {
        !cache(&gw_b).contains("a2.example.test")
    });
    assert!(ha(&gw_b)["revoked"].as_u64().unwrap() >= 2);
    // Asked again on gw-a: learned, published, imported again.
    assert_eq!(
        rcode(gw_a.dns, "a2.example.test"),
        Some(ResponseCode::NoError)
    );
    until("gw-b to import a2 again", || {
        cache(&gw_b).contains("a2.example.test")
    });
    // A restart of gw-b: the group read again at start, reported apart; no lag from it, and
    // a1 does not come back.
    gw_b.kill();
    gw_b.spawn();
    gw_b.wait_ready();
    let h = ha(&gw_b);
    assert!(h["startup_records"].as_u64().unwrap() >= 2, "{h}");
    assert_eq!(h["import_lag_ms"], 0, "{h}");
    assert_eq!(h["rejected"], 5, "{h}");
    let c = cache(&gw_b);
    assert!(!c.contains("a1.example.test"), "{c}");
    assert!(c.contains("a2.example.test"), "{c}");
}
