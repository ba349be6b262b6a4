//! `fqdnd node` end to end, as root: real namespaces, veth pairs, the eBPF redirect and
//! policy programs, the transparent proxy, and a real authoritative server.
//!
//! Without root these tests print a skip message, unless `FQDND_REQUIRE_PRIVILEGED=1` (CI),
//! where they fail.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "test code: real clocks and sleeps, a failed step should panic"
)]

mod dns;
mod enforcement;
mod lb;
pub(crate) mod topology;

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use topology::{Topology, echo, privileged, tcp_open, tcp_reaches, udp_reaches};

/// Long enough for a dropped SYN to show as a failure, short enough to keep tests quick.
const DROPPED: Duration = Duration::from_millis(700);

/// How long an allowed connection may take (SYN retransmits included) on a loaded machine.
const REACHES: Duration = Duration::from_secs(5);

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
    format!(
        "apiVersion: fqdnd.io/v1
kind: Node
spec:
  pinDir: {pin}
  conntrackIdleTimeout: 2s
  upstreamTimeout: 2s
{node_extra}---
apiVersion: fqdnd.io/v1
kind: Settings
spec:
  gcInterval: 1s
---
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {{name: a}}
spec:
  id: 1
  interface: {if_a}
  addresses: [10.{n}.1.2, \"fd00:{n}:1::2\"]
  labels: {{app: a}}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {{name: a-egress}}
spec:
  endpointSelector: {{matchLabels: {{app: a}}}}
  egress:
  - toCIDR: [10.{n}.9.53/32, \"fd00:{n}:9::53/128\"]
    toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns:
        - matchName: api.example.test
        - matchPattern: \"short.example.test\"
  - toFQDNs:
    - matchName: api.example.test
    - matchName: short.example.test
    toPorts:
    - ports: [{a_ports}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {{name: b-egress}}
spec:
  endpointSelector: {{matchLabels: {{app: b}}}}
  egress:
  - toCIDR: [10.{n}.9.53/32, \"fd00:{n}:9::53/128\"]
    toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns:
        - matchPattern: \"*\"
",
        pin = t.pin_dir.display(),
        if_a = t.if_a,
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

/// [`setup`] with the node configuration `config` writes.
fn setup_with(test: &str, config: impl FnOnce(&Topology) -> String) -> Option<Topology> {
    if !privileged(test) {
        return None;
    }
    let mut t = Topology::new(test);
    t.start_dns(&zone(&t, ZONE));
    let config = t.write_node_config(&config(&t));
    t.start_node(&config);
    // After start-up the node holds no capability in any thread; the endpoint below is added
    // (programs attached to its interface) without any.
    t.expect_caps(NODE_CAPS);
    let admin = t.admin();
    let (b4, b6) = (t.v4(2, 2).to_string(), t.v6(2, 2).to_string());
    t.cli(&[
        "endpoint",
        "add",
        "--admin-socket",
        admin.to_str().unwrap(),
        "--id",
        "2",
        "--name",
        "b",
        "--interface",
        &t.if_b.clone(),
        "--address",
        &b4,
        "--address",
        &b6,
        "--label",
        "app=b",
    ]);
    Some(t)
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
        let reply = dns::udp(&t.ep_a, resolver, "api.example.test.", qtype)
            .unwrap_or_else(|| panic!("v6={v6}: no UDP answer\n{}", logs()));
        assert_eq!(
            reply.from, resolver,
            "v6={v6}: reply from the wrong address"
        );
        assert_eq!(reply.rcode, ResponseCode::NoError);
        assert_eq!(reply.addrs, vec![ip(10, 1)]);

        // Then reaches the answer's IP on the allowed port and protocols only.
        assert!(
            tcp_reaches(&t.ep_a, api, REACHES),
            "v6={v6}: allowed TCP dropped\n{}",
            logs()
        );
        assert!(
            udp_reaches(&t.ep_a, sa(ip(10, 1), 8053), REACHES),
            "v6={v6}: allowed UDP dropped"
        );
        assert!(
            !tcp_reaches(&t.ep_a, sa(ip(10, 1), 9090), DROPPED),
            "v6={v6}: other port reached"
        );
        // An IP no allowed answer named.
        assert!(
            !tcp_reaches(&t.ep_a, sa(ip(10, 3), 8080), DROPPED),
            "v6={v6}: unresolved IP reached"
        );
        // Endpoint B has no FQDN egress: it may ask, but not connect.
        let reply = dns::udp(&t.ep_b, resolver, "api.example.test.", qtype).unwrap();
        assert_eq!(reply.addrs, vec![ip(10, 1)]);
        assert!(
            !tcp_reaches(&t.ep_b, api, DROPPED),
            "v6={v6}: endpoint B reached the IP"
        );

        // A denied name: REFUSED, from the resolver's address.
        let reply = dns::udp(&t.ep_a, resolver, "evil.example.test.", qtype).unwrap();
        assert_eq!(reply.rcode, ResponseCode::Refused);
        assert_eq!(reply.from, resolver);
        assert!(reply.addrs.is_empty());

        // TCP DNS goes through the proxy too, to the same resolver address.
        let reply = dns::tcp(&t.ep_a, resolver, "api.example.test.", qtype)
            .unwrap_or_else(|| panic!("v6={v6}: no TCP answer\n{}", logs()));
        assert_eq!(reply.from, resolver);
        assert_eq!(reply.addrs, vec![ip(10, 1)]);
        let reply = dns::tcp(&t.ep_a, resolver, "evil.example.test.", qtype).unwrap();
        assert_eq!(reply.rcode, ResponseCode::Refused);
    }

    // What the operator sees.
    let ipcache = t.cli(&[
        "bpf",
        "ipcache",
        "list",
        "--pin-dir",
        t.pin_dir.to_str().unwrap(),
    ]);
    assert!(
        ipcache.contains(&format!("{}/32", t.v4(10, 1))),
        "{ipcache}"
    );
    let policy = t.cli(&[
        "bpf",
        "policy",
        "list",
        "--pin-dir",
        t.pin_dir.to_str().unwrap(),
    ]);
    assert!(policy.contains("8080"), "{policy}");
    // A fresh v6 flow, then the listing (entries idle for 2 s are collected every second:
    // on a loaded machine the listing may come too late, so up to three tries).
    let wanted = format!("[{}]:8080", t.v6(10, 1));
    let mut ct = String::new();
    for _ in 0..3 {
        assert!(tcp_reaches(&t.ep_a, sa(t.v6(10, 1), 8080), REACHES));
        ct = t.cli(&[
            "bpf",
            "ct",
            "list",
            "--pin-dir",
            t.pin_dir.to_str().unwrap(),
        ]);
        if ct.contains(&wanted) {
            break;
        }
    }
    assert!(ct.contains(&wanted), "{ct}");
    let endpoints = t.cli(&["endpoint", "list", "--admin-socket", admin]);
    assert!(
        endpoints.contains("api") && endpoints.contains("config"),
        "{endpoints}"
    );
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

#[test]
fn expired_ips_close_to_new_connections_while_established_ones_live_on() {
    let Some(t) = setup("expiry") else { return };
    // IPv4 and IPv6 side by side: one address of each family is used, the other is not.
    let reply = dns::udp(
        &t.ep_a,
        sa(t.v4(9, 53), 53),
        "short.example.test.",
        RecordType::A,
    )
    .unwrap();
    assert_eq!(reply.addrs.len(), 2);
    let reply = dns::udp(
        &t.ep_a,
        sa(t.v6(9, 53), 53),
        "short.example.test.",
        RecordType::AAAA,
    )
    .unwrap();
    assert_eq!(reply.addrs.len(), 2);
    let mut streams: Vec<_> = [sa(t.v4(10, 2), 8080), sa(t.v6(10, 2), 8080)]
        .into_iter()
        .map(|kept| {
            tcp_open(&t.ep_a, kept)
                .unwrap_or_else(|| panic!("allowed connection to {kept} failed\n{}", t.logs()))
        })
        .collect();
    // TTL 2 s, GC every 1 s, conntrack idle 2 s: keep the connections busy for 6 s.
    for _ in 0..12 {
        std::thread::sleep(Duration::from_millis(500));
        for stream in &mut streams {
            assert!(
                echo(stream, b"still there"),
                "established connection broke\n{}",
                t.logs()
            );
        }
    }
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
    let resolver = sa(t.v4(9, 53), 53);
    let api = sa(t.v4(10, 1), 8080);
    dns::udp(&t.ep_a, resolver, "api.example.test.", RecordType::A).unwrap();
    assert!(tcp_reaches(&t.ep_a, api, REACHES), "{}", t.logs());
    dns::udp(
        &t.ep_a,
        sa(t.v6(9, 53), 53),
        "api.example.test.",
        RecordType::AAAA,
    )
    .unwrap();
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
    let endpoints = t.cli(&[
        "bpf",
        "endpoint",
        "list",
        "--pin-dir",
        t.pin_dir.to_str().unwrap(),
    ]);
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
    if !privileged("gateway") {
        return;
    }
    let mut t = Topology::new("gateway");
    t.start_dns(
        &ZONE
            .replace(".N.", &format!(".{}.", t.n))
            .replace(":N:", &format!(":{}:", t.n)),
    );
    let n = t.n;
    let config = t.write_node_config(&format!(
        "apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: [\"10.{n}.1.1:53\", \"10.{n}.2.1:53\", \"[fd00:{n}:1::1]:53\"]
  upstreams: [\"10.{n}.9.53:53\"]
  enforceInterfaces: [{if_a}, {if_b}]
  pinDir: {pin}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {{name: a}}
spec:
  id: 10
  addresses: [10.{n}.1.0/24, \"fd00:{n}:1::/64\"]
  labels: {{group: a}}
---
apiVersion: fqdnd.io/v1
kind: ClientGroup
metadata: {{name: b}}
spec:
  id: 11
  addresses: [10.{n}.2.0/24, \"fd00:{n}:2::/64\"]
  labels: {{group: b}}
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {{name: a}}
spec:
  endpointSelector: {{matchLabels: {{group: a}}}}
  egress:
  - toCIDR: [10.{n}.1.1/32, \"fd00:{n}:1::1/128\"]
    toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns: [{{matchName: api.example.test}}]
  - toFQDNs: [{{matchName: api.example.test}}]
    toPorts:
    - ports: [{{port: \"8080\", protocol: TCP}}]
---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {{name: b}}
spec:
  endpointSelector: {{matchLabels: {{group: b}}}}
  egress:
  - toCIDR: [10.{n}.2.1/32]
    toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns: [{{matchPattern: \"*\"}}]
",
        if_a = t.if_a,
        if_b = t.if_b,
        pin = t.pin_dir.display(),
    ));
    t.start_daemon("gateway", &config);
    t.expect_caps(0);
    let api = sa(t.v4(10, 1), 8080);
    assert!(
        !tcp_reaches(&t.ep_a, api, DROPPED),
        "reached before DNS\n{}",
        t.logs()
    );
    let reply = dns::udp(
        &t.ep_a,
        sa(t.v4(1, 1), 53),
        "api.example.test.",
        RecordType::A,
    )
    .unwrap_or_else(|| panic!("no answer from the gateway\n{}", t.logs()));
    assert_eq!(reply.addrs, vec![t.v4(10, 1)]);
    assert!(
        tcp_reaches(&t.ep_a, api, REACHES),
        "allowed flow dropped\n{}",
        t.logs()
    );
    assert!(
        !tcp_reaches(&t.ep_a, sa(t.v4(10, 1), 9090), DROPPED),
        "other port reached"
    );
    assert!(
        !tcp_reaches(&t.ep_a, sa(t.v4(10, 2), 8080), DROPPED),
        "unresolved IP reached"
    );
    // IPv6, asked over IPv6.
    let reply = dns::udp(
        &t.ep_a,
        sa(t.v6(1, 1), 53),
        "api.example.test.",
        RecordType::AAAA,
    )
    .unwrap_or_else(|| panic!("no v6 answer\n{}", t.logs()));
    assert_eq!(reply.addrs, vec![t.v6(10, 1)]);
    assert!(
        tcp_reaches(&t.ep_a, sa(t.v6(10, 1), 8080), REACHES),
        "allowed v6 flow dropped\n{}",
        t.logs()
    );
    // Group B resolves the same name through the gateway but may not connect.
    let reply = dns::udp(
        &t.ep_b,
        sa(t.v4(2, 1), 53),
        "api.example.test.",
        RecordType::A,
    )
    .unwrap();
    assert_eq!(reply.addrs, vec![t.v4(10, 1)]);
    assert!(
        !tcp_reaches(&t.ep_b, api, DROPPED),
        "group B reached A's answer"
    );
    let endpoints = t.cli(&[
        "bpf",
        "endpoint",
        "list",
        "--pin-dir",
        t.pin_dir.to_str().unwrap(),
    ]);
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
    t.kill_node();
    t.start_node(&config);
    t.expect_caps(NODE_CAPS);
    let admin = t.admin();
    let (b4, if_b) = (t.v4(2, 2).to_string(), t.if_b.clone());
    t.cli(&[
        "endpoint",
        "add",
        "--admin-socket",
        admin.to_str().unwrap(),
        "--id",
        "2",
        "--name",
        "b",
        "--interface",
        &if_b,
        "--address",
        &b4,
        "--label",
        "app=b",
    ]);
    let resolver = sa(t.v4(9, 53), 53);
    let api = sa(t.v4(10, 1), 8080);
    let api6 = sa(t.v6(10, 1), 8080);
    dns::udp(&t.ep_a, resolver, "api.example.test.", RecordType::A).unwrap();
    dns::udp(
        &t.ep_a,
        sa(t.v6(9, 53), 53),
        "api.example.test.",
        RecordType::AAAA,
    )
    .unwrap();
    let mut stream = tcp_open(&t.ep_a, api).unwrap_or_else(|| panic!("{}", t.logs()));
    assert!(echo(&mut stream, b"before"));
    let identities_before = t.cli(&[
        "identity",
        "list",
        "--json",
        "--admin-socket",
        t.admin().to_str().unwrap(),
    ]);

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
    let identities_after = t.cli(&[
        "identity",
        "list",
        "--json",
        "--admin-socket",
        t.admin().to_str().unwrap(),
    ]);
    let numbers = |json: &str| -> Vec<(u64, String)> {
        let rows: serde_json::Value = serde_json::from_str(json).unwrap();
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
    let endpoints = t.cli(&[
        "endpoint",
        "list",
        "--admin-socket",
        t.admin().to_str().unwrap(),
    ]);
    assert!(
        endpoints
            .lines()
            .any(|l| l.contains(&t.if_b) && l.contains("api")),
        "{endpoints}"
    );

    // Bigger conntrack and ipcache maps: migrated, not flushed.
    let pin = t.pin_dir.to_str().unwrap().to_owned();
    let ct_before = t.cli(&["bpf", "ct", "list", "--pin-dir", &pin]);
    let ipcache_before = t.cli(&["bpf", "ipcache", "list", "--pin-dir", &pin]);
    let extra = format!(
        "  stateDir: {}\n  mapSizes: {{conntrack: 300000, ipcache: 600000}}\n",
        state.display()
    );
    let config = t.write_node_config(&node_config_with(&t, A_PORTS, &extra));
    t.kill_node();
    t.start_node(&config);
    t.expect_caps(NODE_CAPS);
    assert!(
        echo(&mut stream, b"after resize"),
        "flow broke across the resize\n{}",
        t.logs()
    );
    let ipcache_after = t.cli(&["bpf", "ipcache", "list", "--pin-dir", &pin]);
    assert_eq!(ipcache_before, ipcache_after);
    let ct_after = t.cli(&["bpf", "ct", "list", "--pin-dir", &pin]);
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
    if !privileged("mapfull") {
        return;
    }
    let mut t = Topology::new("mapfull");
    t.start_dns(
        &ZONE
            .replace(".N.", &format!(".{}.", t.n))
            .replace(":N:", &format!(":{}:", t.n)),
    );
    let metrics_port = 19_000 + t.n as u16;
    let extra = format!(
        "  mapSizes: {{ipcache: 3}}\n  onHoldTimeout: servfail\n  metrics: 127.0.0.1:{metrics_port}\n"
    );
    let config = t.write_node_config(&node_config_with(&t, A_PORTS, &extra));
    t.start_node(&config);
    t.expect_caps(NODE_CAPS);
    let resolver = sa(t.v4(9, 53), 53);
    let api = sa(t.v4(10, 1), 8080);

    let reply = dns::udp(&t.ep_a, resolver, "api.example.test.", RecordType::A).unwrap();
    assert_eq!(reply.rcode, ResponseCode::NoError, "{}", t.logs());
    assert!(tcp_reaches(&t.ep_a, api, REACHES), "{}", t.logs());
    // No room for short.example.test's two IPs: not released as allowed, now or later.
    for _ in 0..2 {
        let reply = dns::udp(&t.ep_a, resolver, "short.example.test.", RecordType::A).unwrap();
        assert_eq!(reply.rcode, ResponseCode::ServFail, "{}", t.logs());
        assert!(reply.addrs.is_empty());
    }
    assert!(!tcp_reaches(&t.ep_a, sa(t.v4(10, 2), 8080), DROPPED));
    let ipcache = t.cli(&[
        "bpf",
        "ipcache",
        "list",
        "--pin-dir",
        t.pin_dir.to_str().unwrap(),
    ]);
    assert!(
        !ipcache.contains(&format!("{}/32", t.v4(10, 2))),
        "{ipcache}"
    );
    // The known name is still answered, and its connections still pass.
    let reply = dns::udp(&t.ep_a, resolver, "api.example.test.", RecordType::A).unwrap();
    assert_eq!(reply.rcode, ResponseCode::NoError);
    assert!(tcp_reaches(&t.ep_a, api, REACHES));
    // Metrics: the refusals, and the occupancy against the size.
    std::thread::sleep(Duration::from_millis(1500));
    let text = topology::in_netns(&t.host, move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", metrics_port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    });
    let value = |series: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    assert!(value("fqdnd_datapath_map_full_total{map=\"ipcache\"}") >= 2.0);
    assert_eq!(value("fqdnd_datapath_map_entries{map=\"ipcache4\"}"), 3.0);
    assert_eq!(value("fqdnd_datapath_map_capacity{map=\"ipcache4\"}"), 3.0);
    // Conntrack occupancy is sampled every 10 s (a walk of the map): present from the start.
    assert!(value("fqdnd_datapath_map_entries{map=\"conntrack\"}") >= 0.0);
    assert_eq!(
        value("fqdnd_datapath_map_capacity{map=\"conntrack\"}"),
        262_144.0
    );
}
