//! `fqdnd node` end to end, as root: real namespaces, veth pairs, the eBPF redirect and
//! policy programs, the transparent proxy, and a real authoritative server.
//!
//! Without root these tests print a skip message, unless `FQDND_REQUIRE_PRIVILEGED=1` (CI),
//! where they fail.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed step should panic"
)]

mod bridge;
mod cgroup;
#[path = "../common/mod.rs"]
mod common;
mod dashboard;
mod dns;
mod enforcement;
mod ingress;
mod lb;
mod regressions;
pub(crate) mod topology;

use std::net::SocketAddr;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use common::{PATIENCE, documents, metric, policy_doc, poll, poll_until, scrape, settings_doc};
use dns::Over;
use topology::{Topology, echo, privileged, tcp_open, tcp_reaches, udp_reaches};

pub(crate) use common::{DROPPED, REACHES};

const ZONE: &str = "\
api 300 IN A 10.N.10.1
api 300 IN AAAA fd00:N:10::1
short 2 IN A 10.N.10.2
short 2 IN A 10.N.10.3
short 2 IN AAAA fd00:N:10::2
short 2 IN AAAA fd00:N:10::3
evil 300 IN A 10.N.10.3
";

/// Endpoint A may resolve api/short.example.test and reach their IPs on TCP 8080 and UDP
/// 8053; endpoint B may resolve anything and reach nothing.
fn node_config(t: &Topology, a_ports: &str) -> String {
    node_config_with(t, a_ports, "")
}

/// [`node_config`] with more lines for the Node document's spec (indented two spaces).
fn node_config_with(t: &Topology, a_ports: &str, node_extra: &str) -> String {
    let n = t.n;
    let resolver = format!("10.{n}.9.53/32, \"fd00:{n}:9::53/128\"");
    let a_egress = format!(
        "{}  - toFQDNs:
    - matchName: api.example.test
    - matchName: short.example.test
    toPorts:
    - ports: [{a_ports}]
",
        dns_to(
            &resolver,
            "{matchName: api.example.test}, {matchPattern: \"short.example.test\"}"
        )
    );
    documents(&[
        &format!(
            "apiVersion: fqdnd.io/v1
kind: Node
spec:
  pinDir: {pin}
  conntrackIdleTimeout: 2s
  upstreamTimeout: 2s
{node_extra}",
            pin = t.pin_dir.display()
        ),
        &settings_doc("  gcInterval: 1s\n"),
        &format!(
            "apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {{name: a}}
spec:
  id: 1
  interface: {if_a}
  addresses: [10.{n}.1.2, \"fd00:{n}:1::2\"]
  labels: {{app: a}}
",
            if_a = t.if_a
        ),
        &policy_doc("CiliumNetworkPolicy", "a-egress", "app: a", &a_egress),
        &policy_doc(
            "CiliumNetworkPolicy",
            "b-egress",
            "app: b",
            &dns_to(&resolver, "{matchPattern: \"*\"}"),
        ),
    ])
}

/// An egress rule: DNS (port 53) to `cidrs`, for the names `rules` allow (a flow list's
/// items).
fn dns_to(cidrs: &str, rules: &str) -> String {
    format!(
        "  - toCIDR: [{cidrs}]
    toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns: [{rules}]
"
    )
}

const A_PORTS: &str = "{port: \"8080\", protocol: TCP}, {port: \"8053\", protocol: UDP}";

fn sa(ip: std::net::IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// Builds the topology, starts the DNS server and the node with endpoint A from the file and
/// endpoint B added through the admin API.
/// What the node keeps after start-up: nothing (src/privileges.rs says why).
const NODE_CAPS: u64 = 0;

fn setup(test: &str) -> Option<Topology> {
    setup_with(test, |t| node_config(t, A_PORTS))
}

/// [`ZONE`] with the topology's number.
fn zone(t: &Topology, zone: &str) -> String {
    zone.replace(".N.", &format!(".{}.", t.n))
        .replace(":N:", &format!(":{}:", t.n))
}

/// Kills the node (SIGKILL) and starts it again from `config`; it holds no capability after.
fn restart_node(t: &mut Topology, config: &std::path::Path) {
    t.kill_node();
    t.start_node(config);
    t.expect_caps(NODE_CAPS);
}

/// The network with its DNS server serving [`ZONE`], if this process may build it.
fn topology(test: &str) -> Option<Topology> {
    if !privileged(test) {
        return None;
    }
    let mut t = Topology::new(test);
    t.start_dns(&zone(&t, ZONE));
    Some(t)
}

/// [`setup`] with the node configuration `config` writes.
fn setup_with(test: &str, config: impl FnOnce(&Topology) -> String) -> Option<Topology> {
    let mut t = topology(test)?;
    // The directory: a reload reads every file in it.
    t.write_node_config(&config(&t));
    t.start_node(&t.config_dir());
    // After start-up the node holds no capability in any thread; the endpoint below is added
    // (programs attached to its interface) without any.
    t.expect_caps(NODE_CAPS);
    add_endpoint_b(&t, &[t.v4(2, 2), t.v6(2, 2)]);
    Some(t)
}

/// Endpoint A reaches `allowed` (TCP), but neither another port of its address nor
/// `unresolved`.
fn reaches_only(t: &Topology, allowed: SocketAddr, unresolved: std::net::IpAddr) {
    assert!(
        tcp_reaches(&t.ep_a, allowed, REACHES),
        "allowed {allowed} dropped\n{}",
        t.logs()
    );
    let other_port = sa(allowed.ip(), 9090);
    assert!(
        !tcp_reaches(&t.ep_a, other_port, DROPPED),
        "{other_port} reached"
    );
    let unresolved = sa(unresolved, 8080);
    assert!(
        !tcp_reaches(&t.ep_a, unresolved, DROPPED),
        "unresolved {unresolved} reached"
    );
}

/// Endpoint A asks its resolver over UDP (10.N.9.53 for A, fd00:N:9::53 for AAAA); panics
/// without an answer.
fn resolve(t: &Topology, name: &str, qtype: RecordType) -> dns::Reply {
    let resolver = if qtype == RecordType::AAAA {
        t.v6(9, 53)
    } else {
        t.v4(9, 53)
    };
    dns::ask(t, Over::Udp, &t.ep_a, sa(resolver, 53), name, qtype)
}

/// `fqdnd endpoint add` of endpoint B (id 2, `app: b`) with `addresses`.
fn add_endpoint_b(t: &Topology, addresses: &[std::net::IpAddr]) {
    let addresses: Vec<String> = addresses.iter().map(ToString::to_string).collect();
    let mut args = vec!["endpoint", "add", "--id", "2", "--name", "b"];
    args.extend(["--interface", &t.if_b, "--label", "app=b"]);
    args.extend(addresses.iter().flat_map(|a| ["--address", a.as_str()]));
    t.admin_cli(&args);
}

#[test]
fn dns_is_redirected_and_answers_open_exactly_the_allowed_ips() {
    let Some(t) = setup("redirect") else { return };
    let logs = || t.logs();
    let admin = t.admin();
    let admin = admin.to_str().unwrap();
    for v6 in [false, true] {
        let ip = |net, host| if v6 { t.v6(net, host) } else { t.v4(net, host) };
        let qtype = if v6 { RecordType::AAAA } else { RecordType::A };
        let resolver = sa(ip(9, 53), 53);
        let api = sa(ip(10, 1), 8080);

        // Before DNS: dropped.
        assert!(
            !tcp_reaches(&t.ep_a, api, DROPPED),
            "v6={v6}: reached before DNS\n{}",
            logs()
        );

        // A resolves an allowed name over UDP: the reply comes from its resolver's address.
        let reply = resolve(&t, "api.example.test.", qtype);
        assert_eq!(
            reply.from, resolver,
            "v6={v6}: reply from the wrong address"
        );
        assert_eq!(reply.rcode, ResponseCode::NoError);
        assert_eq!(reply.addrs, vec![ip(10, 1)]);

        // Then reaches the answer's IP on the allowed port and protocols only, and not an
        // IP no allowed answer named.
        reaches_only(&t, api, ip(10, 3));
        assert!(
            udp_reaches(&t.ep_a, sa(ip(10, 1), 8053), REACHES),
            "v6={v6}: allowed UDP dropped"
        );
        // Endpoint B has no FQDN egress: it may ask, but not connect.
        let reply = dns::ask(&t, Over::Udp, &t.ep_b, resolver, "api.example.test.", qtype);
        assert_eq!(reply.addrs, vec![ip(10, 1)]);
        assert!(
            !tcp_reaches(&t.ep_b, api, DROPPED),
            "v6={v6}: endpoint B reached the IP"
        );

        // A denied name: REFUSED, from the resolver's address.
        let reply = resolve(&t, "evil.example.test.", qtype);
        assert_eq!(reply.rcode, ResponseCode::Refused);
        assert_eq!(reply.from, resolver);
        assert!(reply.addrs.is_empty());

        // TCP DNS goes through the proxy too, to the same resolver address.
        let reply = dns::ask(&t, Over::Tcp, &t.ep_a, resolver, "api.example.test.", qtype);
        assert_eq!(reply.from, resolver);
        assert_eq!(reply.addrs, vec![ip(10, 1)]);
        let reply = dns::ask(
            &t,
            Over::Tcp,
            &t.ep_a,
            resolver,
            "evil.example.test.",
            qtype,
        );
        assert_eq!(reply.rcode, ResponseCode::Refused);
    }

    // What the operator sees.
    let ipcache = t.bpf_list("ipcache");
    assert!(
        ipcache.contains(&format!("{}/32", t.v4(10, 1))),
        "{ipcache}"
    );
    let policy = t.bpf_list("policy");
    assert!(policy.contains("8080"), "{policy}");
    // A fresh v6 flow, then the listing (entries idle for 2 s are collected every second:
    // on a loaded machine the listing may come too late, so a fresh flow each try).
    let wanted = format!("[{}]:8080", t.v6(10, 1));
    poll(PATIENCE, &format!("{wanted} in `bpf ct list`"), || {
        assert!(tcp_reaches(&t.ep_a, sa(t.v6(10, 1), 8080), REACHES));
        let ct = t.bpf_list("ct");
        if ct.contains(&wanted) {
            Ok(())
        } else {
            Err(ct)
        }
    });
    let endpoints = t.cli(&["endpoint", "list", "--admin-socket", admin]);
    assert!(
        endpoints.contains("api") && endpoints.contains("config"),
        "{endpoints}"
    );
    // Each endpoint's identity is the one its addresses have in the ipcache (no need to
    // cross-read `ipcache list`).
    let ipcache_rows = t.admin_json(&["ipcache", "list"]);
    let rows = t.admin_json(&["endpoint", "list"]);
    for row in rows.as_array().unwrap() {
        let address = row["addresses"][0].as_str().unwrap();
        let held = ipcache_rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["prefix"] == address)
            .map(|r| r["identity"].clone());
        assert_eq!(Some(row["identity"].clone()), held, "{row}\n{ipcache_rows}");
        let id = row["identity"].as_u64().unwrap();
        assert!(
            endpoints
                .lines()
                .any(|l| l.starts_with(&format!("{:<6} ", row["id"]))
                    && l.contains(&format!(" {id} "))),
            "{endpoints}"
        );
    }
    let cache = t.cli(&["cache", "list", "--admin-socket", admin]);
    assert!(cache.contains("api.example.test."), "{cache}");
    // Drops were reported to the monitor.
    assert!(!tcp_reaches(&t.ep_b, sa(t.v4(10, 2), 9090), DROPPED));
    let monitor = t.cli(&[
        "monitor",
        "--admin-socket",
        admin,
        "--count",
        "1",
        "--json",
        "--recent",
    ]);
    assert!(monitor.contains("policy-denied"), "{monitor}");
}

/// A container's queries are recorded with its endpoint, found by its address — the refused
/// one and its reply included (issue 36, item 8).
#[test]
fn a_containers_refused_query_is_recorded_with_its_endpoint() {
    let Some(t) = setup("recordep") else {
        return;
    };
    let rec = t.dir.join("rec");
    t.admin_cli(&["record", "start", "--dir", rec.to_str().unwrap()]);
    let api = resolve(&t, "api.example.test.", RecordType::A);
    assert_eq!(api.rcode, ResponseCode::NoError);
    let evil = resolve(&t, "evil.example.test.", RecordType::A);
    assert_eq!(evil.rcode, ResponseCode::Refused);
    t.admin_cli(&["record", "stop"]);
    let files: Vec<_> = std::fs::read_dir(&rec)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let mut seen = Vec::new();
    let bytes = std::fs::read(&files[0]).unwrap();
    let (_, error) = fqdnd_replay::extract_bytes(&bytes, &[53], &mut |p| {
        let note = p.note.unwrap();
        let client = match note.way {
            fqdnd_replay::record::Way::Query => p.src,
            fqdnd_replay::record::Way::Reply => p.dst,
        };
        assert_eq!(client.ip(), t.v4(1, 2), "{p:?}");
        assert_eq!((note.endpoint, note.by_socket), (Some(1), false), "{p:?}");
        seen.push(note.verdict.to_owned());
    });
    assert!(error.is_none(), "{error:?}");
    assert_eq!(seen, ["allow", "answered", "deny", "denied"]);
}

#[test]
fn expired_ips_close_to_new_connections_while_established_ones_live_on() {
    let Some(t) = setup("expiry") else { return };
    // IPv4 and IPv6 side by side: one address of each family is used, the other is not.
    let reply = resolve(&t, "short.example.test.", RecordType::A);
    assert_eq!(reply.addrs.len(), 2);
    let reply = resolve(&t, "short.example.test.", RecordType::AAAA);
    assert_eq!(reply.addrs.len(), 2);
    let mut streams: Vec<_> = [sa(t.v4(10, 2), 8080), sa(t.v6(10, 2), 8080)]
        .into_iter()
        .map(|kept| {
            tcp_open(&t.ep_a, kept)
                .unwrap_or_else(|| panic!("allowed connection to {kept} failed\n{}", t.logs()))
        })
        .collect();
    // TTL 2 s, GC every 1 s, conntrack idle 2 s: the connections stay busy (an echo each
    // round) until the unused IPs have expired and been collected, out of the kernel ipcache.
    let unused_ips = [t.v4(10, 3), t.v6(10, 3)];
    poll_until(
        PATIENCE,
        "the unused IPs to leave the kernel ipcache",
        || {
            for stream in &mut streams {
                assert!(
                    echo(stream, b"still there"),
                    "established connection broke\n{}",
                    t.logs()
                );
            }
            let ipcache = t.bpf_list("ipcache");
            (!unused_ips
                .iter()
                .any(|ip| ipcache.contains(&format!("{ip}/"))))
            .then_some(())
        },
    );
    // The unused IPs expired and were collected: new connections to them are dropped.
    for unused in [sa(t.v4(10, 3), 8080), sa(t.v6(10, 3), 8080)] {
        assert!(
            !tcp_reaches(&t.ep_a, unused, DROPPED),
            "expired {unused} still reachable\n{}",
            t.logs()
        );
    }
    // The used ones are zombies (kept because conntrack shows the connections).
    let cache = t.cli(&[
        "cache",
        "list",
        "--admin-socket",
        t.admin().to_str().unwrap(),
    ]);
    let zombie = cache
        .lines()
        .find(|l| l.contains("short.example.test.") && l.contains("connection"))
        .unwrap_or_else(|| panic!("no zombie row:\n{cache}"));
    for (kept, gone) in [(t.v4(10, 2), t.v4(10, 3)), (t.v6(10, 2), t.v6(10, 3))] {
        assert!(zombie.contains(&kept.to_string()), "{cache}");
        assert!(!cache.contains(&gone.to_string()), "{cache}");
    }
    for stream in &mut streams {
        assert!(echo(stream, b"bye"));
    }
}

#[test]
fn a_policy_reload_that_removes_a_rule_removes_access() {
    let Some(t) = setup("reload") else { return };
    let api = sa(t.v4(10, 1), 8080);
    resolve(&t, "api.example.test.", RecordType::A);
    assert!(tcp_reaches(&t.ep_a, api, REACHES), "{}", t.logs());
    resolve(&t, "api.example.test.", RecordType::AAAA);
    assert!(
        tcp_reaches(&t.ep_a, sa(t.v6(10, 1), 8080), REACHES),
        "{}",
        t.logs()
    );
    // Port 8080 leaves the rule; UDP 8053 stays.
    t.write_node_config(&node_config(&t, "{port: \"8053\", protocol: UDP}"));
    let out = t.cli(&[
        "policy",
        "reload",
        "--admin-socket",
        t.admin().to_str().unwrap(),
    ]);
    assert!(out.contains("reloaded") || out.contains("ok"), "{out}");
    assert!(
        !tcp_reaches(&t.ep_a, api, DROPPED),
        "access survived the reload\n{}",
        t.logs()
    );
    assert!(udp_reaches(&t.ep_a, sa(t.v4(10, 1), 8053), REACHES));
    // IPv6 the same.
    assert!(
        !tcp_reaches(&t.ep_a, sa(t.v6(10, 1), 8080), DROPPED),
        "v6 access survived the reload"
    );
    assert!(udp_reaches(&t.ep_a, sa(t.v6(10, 1), 8053), REACHES));
    // Removing endpoint B through the API detaches its interface: its traffic is no longer
    // redirected (the proxy would have answered REFUSED for nothing; now the resolver answers).
    t.cli(&[
        "endpoint",
        "remove",
        "2",
        "--admin-socket",
        t.admin().to_str().unwrap(),
    ]);
    let endpoints = t.bpf_list("endpoint");
    assert!(!endpoints.contains(&t.if_b), "{endpoints}");
    assert!(
        tcp_reaches(&t.ep_b, api, REACHES),
        "unenforced endpoint dropped"
    );
}

/// The gateway (`enforceInterfaces`): clients ask the gateway itself; the programs on its LAN
/// interfaces find each packet's client group by source address and let it reach only what
/// the group's allowed answers resolved to.
#[test]
fn an_enforcing_gateway_lets_each_client_group_reach_only_its_answers() {
    let Some(mut t) = topology("gateway") else {
        return;
    };
    let n = t.n;
    let group = |name: &str, id: u32, net: u32| {
        format!(
            "apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {{name: {name}}}
spec:
  id: {id}
  addresses: [10.{n}.{net}.0/24, \"fd00:{n}:{net}::/64\"]
  labels: {{group: {name}}}
"
        )
    };
    let a_egress = format!(
        "{}  - toFQDNs: [{{matchName: api.example.test}}]
    toPorts:
    - ports: [{{port: \"8080\", protocol: TCP}}]
",
        dns_to(
            &format!("10.{n}.1.1/32, \"fd00:{n}:1::1/128\""),
            "{matchName: api.example.test}"
        )
    );
    let config = t.write_node_config(&documents(&[
        &format!(
            "apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: [\"10.{n}.1.1:53\", \"10.{n}.2.1:53\", \"[fd00:{n}:1::1]:53\"]
  upstreams: [\"10.{n}.9.53:53\"]
  enforceInterfaces: [{if_a}, {if_b}]
  pinDir: {pin}
",
            if_a = t.if_a,
            if_b = t.if_b,
            pin = t.pin_dir.display(),
        ),
        &group("a", 10, 1),
        &group("b", 11, 2),
        &policy_doc("CiliumClusterwideNetworkPolicy", "a", "group: a", &a_egress),
        &policy_doc(
            "CiliumClusterwideNetworkPolicy",
            "b",
            "group: b",
            &dns_to(&format!("10.{n}.2.1/32"), "{matchPattern: \"*\"}"),
        ),
    ]));
    t.start_daemon("gateway", &config);
    t.expect_caps(0);
    // IPv4, then IPv6 asked over IPv6.
    for v6 in [false, true] {
        let ip = |net, host| if v6 { t.v6(net, host) } else { t.v4(net, host) };
        let qtype = if v6 { RecordType::AAAA } else { RecordType::A };
        let api = sa(ip(10, 1), 8080);
        assert!(
            !tcp_reaches(&t.ep_a, api, DROPPED),
            "v6={v6}: reached before DNS\n{}",
            t.logs()
        );
        let gateway = sa(ip(1, 1), 53);
        let reply = dns::ask(&t, Over::Udp, &t.ep_a, gateway, "api.example.test.", qtype);
        assert_eq!(reply.addrs, vec![ip(10, 1)]);
        reaches_only(&t, api, ip(10, 2));
    }
    let api = sa(t.v4(10, 1), 8080);
    // Group B resolves the same name through the gateway but may not connect.
    let reply = dns::ask(
        &t,
        Over::Udp,
        &t.ep_b,
        sa(t.v4(2, 1), 53),
        "api.example.test.",
        RecordType::A,
    );
    assert_eq!(reply.addrs, vec![t.v4(10, 1)]);
    assert!(
        !tcp_reaches(&t.ep_b, api, DROPPED),
        "group B reached A's answer"
    );
    let endpoints = t.bpf_list("endpoint");
    assert!(
        endpoints.contains("by-source") && endpoints.contains(&format!("10.{n}.1.0/24")),
        "{endpoints}"
    );
}

/// Issue 5: the node is killed (SIGKILL) while an endpoint has an established connection to
/// an FQDN-allowed IP; the connection keeps exchanging data throughout (pinned programs and
/// maps), and after the restart a new connection to that IP succeeds without a new DNS query
/// (the state directory restored the name, its IP and its identity before the maps were
/// reconciled). Then map sizes change across a restart: every entry is migrated.
#[test]
fn a_killed_node_restarts_without_breaking_flows_or_forgetting_answers() {
    let Some(mut t) = setup("restart") else {
        return;
    };
    let state = t.dir.join("state");
    let extra = format!("  stateDir: {}\n", state.display());
    let config = t.write_node_config(&node_config_with(&t, A_PORTS, &extra));
    // Restart the agent with the state directory (setup started it without), and add
    // endpoint B again through the API: with a state directory it is saved.
    restart_node(&mut t, &config);
    add_endpoint_b(&t, &[t.v4(2, 2)]);
    let api = sa(t.v4(10, 1), 8080);
    let api6 = sa(t.v6(10, 1), 8080);
    resolve(&t, "api.example.test.", RecordType::A);
    resolve(&t, "api.example.test.", RecordType::AAAA);
    let mut stream = tcp_open(&t.ep_a, api).unwrap_or_else(|| panic!("{}", t.logs()));
    assert!(echo(&mut stream, b"before"));
    let identities_before = t.admin_json(&["identity", "list"]);

    t.kill_node();
    // Nothing runs in user space now: the pinned programs keep the flow going.
    assert!(
        echo(&mut stream, b"while down"),
        "flow broke while the agent was down"
    );
    t.start_node(&config);
    t.expect_caps(NODE_CAPS);
    assert!(
        echo(&mut stream, b"after"),
        "flow broke across the restart\n{}",
        t.logs()
    );
    // No DNS query since the restart: the restored state allows new connections at once.
    assert!(
        tcp_reaches(&t.ep_a, api, REACHES),
        "restored IP not allowed\n{}",
        t.logs()
    );
    assert!(
        tcp_reaches(&t.ep_a, api6, REACHES),
        "restored v6 IP not allowed\n{}",
        t.logs()
    );
    let identities_after = t.admin_json(&["identity", "list"]);
    let numbers = |rows: &serde_json::Value| -> Vec<(u64, String)> {
        let mut out: Vec<(u64, String)> = rows
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["identity"].as_u64().unwrap(), r["labels"].to_string()))
            .collect();
        out.sort();
        out
    };
    assert_eq!(
        numbers(&identities_before),
        numbers(&identities_after),
        "identity numbers changed"
    );
    // The endpoint added through the API came back with the restart.
    let endpoints = t.admin_cli(&["endpoint", "list"]);
    assert!(
        endpoints
            .lines()
            .any(|l| l.contains(&t.if_b) && l.contains("api")),
        "{endpoints}"
    );

    // Bigger conntrack and ipcache maps: migrated, not flushed.
    let ct_before = t.bpf_list("ct");
    let ipcache_before = t.bpf_list("ipcache");
    let extra = format!(
        "  stateDir: {}\n  mapSizes: {{conntrack: 300000, ipcache: 600000}}\n",
        state.display()
    );
    let config = t.write_node_config(&node_config_with(&t, A_PORTS, &extra));
    restart_node(&mut t, &config);
    assert!(
        echo(&mut stream, b"after resize"),
        "flow broke across the resize\n{}",
        t.logs()
    );
    let ipcache_after = t.bpf_list("ipcache");
    assert_eq!(ipcache_before, ipcache_after);
    let ct_after = t.bpf_list("ct");
    // The busy flow's entry was carried over (idle ones may have been collected meanwhile).
    let flow = format!("{}", stream.local_addr().unwrap());
    assert!(
        ct_before.contains(&flow) && ct_after.contains(&flow),
        "{ct_before}\n{ct_after}"
    );
    let log = std::fs::read_to_string(t.dir.join("node.log")).unwrap();
    assert!(log.contains("map migrated"), "no migration logged");
    assert!(tcp_reaches(&t.ep_a, api, REACHES));
}

/// Issue 7: the kernel ipcache is full (`mapSizes.ipcache: 3`: endpoint A and the resolver's
/// CIDR take two entries per family, api.example.test the third). An answer that needs a new
/// entry fails closed — SERVFAIL (`onHoldTimeout: servfail`), every time it is asked, and its
/// IPs stay unreachable — with `fqdnd_datapath_map_full_total` counting it; the known name
/// keeps being answered and its connections keep working.
#[test]
fn a_full_ipcache_fails_new_answers_closed_and_keeps_serving_known_names() {
    let Some(mut t) = topology("mapfull") else {
        return;
    };
    let metrics_port = 19_000 + t.n as u16;
    // Room for the policy's and endpoints' entries, the node's three addresses of each
    // family (the host identity) and api's address; not for short's two.
    let extra = format!(
        "  mapSizes: {{ipcache: 6}}\n  onHoldTimeout: servfail\n  metrics: 127.0.0.1:{metrics_port}\n"
    );
    let config = t.write_node_config(&node_config_with(&t, A_PORTS, &extra));
    t.start_node(&config);
    t.expect_caps(NODE_CAPS);
    let api = sa(t.v4(10, 1), 8080);

    let reply = resolve(&t, "api.example.test.", RecordType::A);
    assert_eq!(reply.rcode, ResponseCode::NoError, "{}", t.logs());
    assert!(tcp_reaches(&t.ep_a, api, REACHES), "{}", t.logs());
    // No room for short.example.test's two IPs: not released as allowed, now or later.
    for _ in 0..2 {
        let reply = resolve(&t, "short.example.test.", RecordType::A);
        assert_eq!(reply.rcode, ResponseCode::ServFail, "{}", t.logs());
        assert!(reply.addrs.is_empty());
    }
    assert!(!tcp_reaches(&t.ep_a, sa(t.v4(10, 2), 8080), DROPPED));
    let ipcache = t.bpf_list("ipcache");
    assert!(
        !ipcache.contains(&format!("{}/32", t.v4(10, 2))),
        "{ipcache}"
    );
    // The known name is still answered, and its connections still pass.
    let reply = resolve(&t, "api.example.test.", RecordType::A);
    assert_eq!(reply.rcode, ResponseCode::NoError);
    assert!(tcp_reaches(&t.ep_a, api, REACHES));
    // Metrics: the refusals, and the occupancy against the size (sampled once a second: the
    // page is read until a sample shows them, then judged).
    let metrics = SocketAddr::from(([127, 0, 0, 1], metrics_port));
    let text = poll(PATIENCE, "the datapath gauges on the metrics page", || {
        let page =
            topology::in_netns(&t.host, move || scrape(metrics)).map_err(|e| e.to_string())?;
        let has = |series: &str, wanted: fn(f64) -> bool| metric(&page, series).is_some_and(wanted);
        if has("fqdnd_datapath_map_full_total{map=\"ipcache\"}", |v| {
            v >= 2.0
        }) && has("fqdnd_datapath_map_entries{map=\"ipcache4\"}", |v| v == 6.0)
            && has("fqdnd_datapath_map_capacity{map=\"ipcache4\"}", |v| {
                v == 6.0
            })
            && has("fqdnd_datapath_map_entries{map=\"conntrack\"}", |v| {
                v >= 0.0
            })
            && has("fqdnd_datapath_map_capacity{map=\"conntrack\"}", |v| {
                v > 0.0
            })
        {
            Ok(page)
        } else {
            Err(page)
        }
    });
    let value = |series: &str| -> f64 {
        metric(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    assert!(value("fqdnd_datapath_map_full_total{map=\"ipcache\"}") >= 2.0);
    assert_eq!(value("fqdnd_datapath_map_entries{map=\"ipcache4\"}"), 6.0);
    assert_eq!(value("fqdnd_datapath_map_capacity{map=\"ipcache4\"}"), 6.0);
    // Conntrack occupancy is sampled every 10 s (a walk of the map): present from the start.
    assert!(value("fqdnd_datapath_map_entries{map=\"conntrack\"}") >= 0.0);
    assert_eq!(
        value("fqdnd_datapath_map_capacity{map=\"conntrack\"}"),
        262_144.0
    );
}
