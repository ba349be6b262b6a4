//! Regression tests for node-mode defects fixed on main; each says what it guards and how it
//! failed before the fix.

use std::collections::BTreeMap;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::common::{assert_private, fqdnd_command, policy_doc, run, stdout_of, text, usual_umask};
use crate::topology::tcp_reaches;
use crate::{A_PORTS, DROPPED, node_config_with, resolve, sa, setup, setup_with};

/// Guards the privacy of the node's state directory: fqdnd creates it 0700 and every file in
/// it without group or other bits — the lock and the journal, `endpoints.yaml` (endpoints
/// added through the API), `services/` and its snapshot (services set through the API) — and
/// at a restart and a reload it does not warn about its own directory. Before, node mode
/// created the directory with the umask's mode (0755 here; the services' `create_dir_all`),
/// its files 0644, and the next start warned "(the state directory) is readable by
/// everyone". The umask is set to 022 so that a file created without an explicit mode shows.
/// Also: `fqdnd status --json` says `"mode": "node"` (there was no mode).
#[test]
fn the_state_directory_and_its_files_are_private_and_not_warned_about() {
    usual_umask();
    let Some(mut t) = setup_with("state", |t| {
        let state = t.dir.join("state");
        node_config_with(t, A_PORTS, &format!("  stateDir: {}\n", state.display()))
    }) else {
        return;
    };
    let state = t.dir.join("state");
    let admin = t.admin().to_str().unwrap().to_owned();
    // (setup added endpoint B through the API.) A service through the API, and an answer.
    let (frontend, backend) = (sa(t.v4(96, 10), 80), sa(t.v4(10, 1), 7070));
    t.cli(&[
        "service",
        "set",
        "--admin-socket",
        &admin,
        "--name",
        "web",
        "--frontend",
        &frontend.to_string(),
        "--backend",
        &backend.to_string(),
    ]);
    let reply = resolve(&t, "api.example.test.", RecordType::A);
    assert_eq!(reply.rcode, ResponseCode::NoError);
    let files = [
        "lock",
        "journal.*",
        "endpoints.yaml",
        "services",
        "services/snapshot",
    ];
    assert_private(&state, &files);
    let status = t.admin_json(&["status"]);
    assert_eq!(status["mode"], "node", "{status}");

    // The next start finds the directory it created: no warning about it, then or on reload.
    t.kill_node();
    t.start_node(&t.config_dir());
    let out = t.cli(&["policy", "reload", "--admin-socket", &admin]);
    assert!(out.contains("policy reloaded"), "{out}");
    let log = std::fs::read_to_string(t.dir.join("node.log")).unwrap();
    assert!(log.contains("state restored"), "{log}");
    assert!(!log.contains("(the state directory)"), "{log}");
    assert_private(&state, &files);
}

/// The kernel policy map's size in the rollback test: room for what node.yaml gives the two
/// endpoints, not for the 200 ports a later file adds.
const SMALL_POLICY_MAP: usize = 96;

/// Guards the rollback of a reload the datapath refuses (here: more policy entries than the
/// kernel map, sized by `mapSizes.policy`, holds): the reload is rejected with the error and
/// leaves nothing behind — the kernel policy and ipcache are as before — and once the file is
/// removed the next reload succeeds at the first attempt, the endpoint's policy exactly what
/// the remaining files say. Before, the IpCache kept the refused batch pending: the next
/// reload, with the file gone, failed with the same error.
#[test]
fn a_reload_the_datapath_refuses_leaves_nothing_behind() {
    let Some(t) = setup_with("refused", |t| {
        node_config_with(
            t,
            A_PORTS,
            &format!("  mapSizes: {{policy: {SMALL_POLICY_MAP}}}\n"),
        )
    }) else {
        return;
    };
    let n = t.n;
    let admin = t.admin().to_str().unwrap().to_owned();
    let policy = || t.bpf_list("policy");
    let ipcache = || t.bpf_list("ipcache");
    // What node.yaml says (endpoint 1 may use its resolver on 53).
    let (policy_before, ipcache_before) = (policy(), ipcache());
    assert!(
        policy_before.lines().count() < SMALL_POLICY_MAP,
        "{policy_before}"
    );
    assert!(
        policy_before
            .lines()
            .any(|l| l.starts_with("1 ") && l.contains(" 53 ")),
        "{policy_before}"
    );

    let wide = t.write_config_file(
        "wide.yaml",
        &policy_doc(
            "CiliumNetworkPolicy",
            "a-wide",
            "app: a",
            &format!(
                "  - toCIDR: [10.{n}.10.3/32]
    toPorts:
{ports}",
                // 200 ports, 40 to a `toPorts` entry (Cilium's limit).
                ports = (0..5)
                    .map(|e| {
                        let ports: Vec<String> = (0..40)
                            .map(|i| {
                                format!("{{port: \"{}\", protocol: TCP}}", 2000 + 80 * e + 2 * i)
                            })
                            .collect();
                        format!("    - ports: [{}]\n", ports.join(", "))
                    })
                    .collect::<String>()
            ),
        ),
    );
    let out = t.cli_in(&t.host, &["policy", "reload", "--admin-socket", &admin]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("map fqdnd_policy is full"), "{said}");
    assert_eq!(
        policy(),
        policy_before,
        "the rejected reload left policy behind"
    );
    assert_eq!(
        ipcache(),
        ipcache_before,
        "the rejected reload left prefixes behind"
    );

    std::fs::remove_file(&wide).unwrap();
    let out = t.cli(&["policy", "reload", "--admin-socket", &admin]);
    assert!(out.contains("policy reloaded"), "{out}");
    assert_eq!(
        policy(),
        policy_before,
        "the policy is not what the files say"
    );
    assert_eq!(ipcache(), ipcache_before);
    let status = t.admin_json(&["status"]);
    assert_eq!(status["reloads"]["failed"], 1, "{status}");
}

/// Endpoint id → interface name, from a `fqdnd bpf endpoint list`.
fn interfaces(listing: &str) -> BTreeMap<String, String> {
    // The table's rows; the endpoints' source addresses follow them, indented.
    listing
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty() && !l.starts_with(' '))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            Some((cols.get(2)?.to_string(), cols.get(1)?.to_string()))
        })
        .collect()
}

/// Guards `fqdnd bpf endpoint list` run from another network namespace than the agent's: it
/// prints the interfaces the agent attached to (the host-side veths), as it does in the
/// agent's namespace. Before, it named each interface index in the caller's namespace: `?`,
/// or whatever interface has that index there. (`nsenter --net`, not `ip netns exec`, which
/// mounts a fresh /sys over the bpffs holding the pins.)
#[test]
fn bpf_endpoint_list_names_the_agents_interfaces_from_another_namespace() {
    let Some(t) = setup("ifnames") else { return };
    let args = [
        "bpf",
        "endpoint",
        "list",
        "--pin-dir",
        t.pin_dir.to_str().unwrap(),
    ];
    let in_agents = t.cli(&args);
    let expected: BTreeMap<String, String> = [("1", &t.if_a), ("2", &t.if_b)]
        .into_iter()
        .map(|(id, name)| (id.to_owned(), name.clone()))
        .collect();
    assert_eq!(interfaces(&in_agents), expected, "{in_agents}");
    for ns in [&t.ep_a, &t.ext] {
        let listed = stdout_of(&t.cli_in(ns, &args));
        assert_eq!(listed, in_agents, "from namespace {ns}");
    }
    // And from this test's own namespace.
    let listed = stdout_of(&run(fqdnd_command().args(args)));
    assert_eq!(listed, in_agents, "from the test's namespace");
}

/// Guards issue 36's first finding: a node agent without `stateDir` restarted keeps the
/// endpoints added at run time (here B, through the API) attached and enforcing — kept in the
/// file named after its pin directory — and its warning says what a restart does lose. Before,
/// the restarted agent had no record of them: it detached its programs from their interfaces,
/// and B, whose policy allows it DNS and nothing else, reached any address.
#[test]
fn a_restart_without_a_state_dir_keeps_every_endpoint_enforced() {
    let Some(mut t) = setup("nostate") else {
        return;
    };
    let echo = sa(t.v4(10, 1), 8080);
    assert!(!tcp_reaches(&t.ep_b, echo, DROPPED), "B reached {echo}");
    let kept = fqdnd_config::default_endpoints_file(&t.pin_dir);
    assert_private(kept.parent().unwrap(), &["endpoints.yaml"]);

    let config = t.config_dir();
    t.kill_node();
    // While it is down, and after: B stays under its policy.
    assert!(!tcp_reaches(&t.ep_b, echo, DROPPED), "B reached {echo}");
    t.start_node(&config);
    let listing = t.bpf_list("endpoint");
    assert_eq!(
        interfaces(&listing).get("2"),
        Some(&t.if_b),
        "B's interface is no longer an endpoint:\n{listing}\n{}",
        t.logs()
    );
    let endpoints = t.admin_json(&["endpoint", "list"]);
    let b = endpoints
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == 2)
        .unwrap_or_else(|| panic!("B is gone: {endpoints}"));
    assert_eq!(b["source"], "api", "{b}");
    assert_eq!(b["enforcing"], true, "{b}");
    assert!(b["ifindex"].is_u64(), "{b}");
    assert!(
        !tcp_reaches(&t.ep_b, echo, DROPPED),
        "B reached {echo} after the restart\n{}",
        t.logs()
    );
    let log = std::fs::read_to_string(t.dir.join("node.log")).unwrap();
    assert!(
        log.contains("a restart loses the learned names")
            && log.contains(&format!(
                "the endpoints added at run time are kept in {}",
                kept.display()
            )),
        "{log}"
    );
}

/// Guards issue 36's fourth finding: an endpoint whose interface went while the agent was down
/// (a container removed meanwhile; here B's veth deleted) leaves nothing in the kernel maps
/// once the agent is back — neither its endpoint entry, keyed by the gone interface's index
/// (which a new interface may get), nor its source addresses — and a new endpoint may take
/// its id. Before, the restarted agent dropped the saved endpoint ("its interface is gone")
/// but kept `? source 10.N.2.2 → endpoint 2` and the entry in the maps.
#[test]
fn an_endpoint_gone_while_the_agent_was_down_leaves_nothing_in_the_kernel() {
    let Some(mut t) = setup("gonedown") else {
        return;
    };
    let config = t.config_dir();
    let b_source = format!("source {} → endpoint 2", t.v4(2, 2));
    let before = t.bpf_list("endpoint");
    assert!(before.contains(&b_source), "{before}");
    t.kill_node();
    crate::topology::sh(&format!("ip -n {} link del {}", t.host, t.if_b));
    t.start_node(&config);
    let log = std::fs::read_to_string(t.dir.join("node.log")).unwrap();
    assert!(log.contains("its interface is gone"), "{log}");
    let after = t.bpf_list("endpoint");
    let endpoint_ids: Vec<&str> = after
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(endpoint_ids, ["1"], "only A is an endpoint now:\n{after}");
    assert!(
        !after.contains("→ endpoint 2"),
        "B's entries are still in the kernel:\n{after}"
    );
    assert!(
        after.contains(&format!("source {} → endpoint 1", t.v4(1, 2))),
        "A's sources went too:\n{after}"
    );
}
