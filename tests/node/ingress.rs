//! Issue 18 end to end, IPv4 and IPv6: ingress policy towards an endpoint (another endpoint
//! allowed on one port, dropped on another; echo allowed by `icmps` and dropped without
//! it), a deny of one FQDN-learned address winning over `toFQDNs`, replies to the
//! endpoint's own egress flows (DNS answers from the transparent proxy included) passing
//! while its ingress is in default deny; the entities a node has (`host`: its own addresses,
//! `cluster`: its endpoints and itself, `world`: the rest) in both directions, an
//! `ingressDeny` winning over them, and `fqdnd policy explain` telling why, from the running
//! agent.

use std::net::{IpAddr, TcpListener};
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::dns;
use crate::enforcement::{ping, sa, wait_drop};
use crate::topology::{Topology, in_netns, privileged, tcp_echo, tcp_reaches, udp_reaches};

const DROPPED: Duration = Duration::from_millis(700);
const REACHES: Duration = Duration::from_secs(5);

const ZONE: &str = "\
api 300 IN A 10.N.10.1
api 300 IN AAAA fd00:N:10::1
short 300 IN A 10.N.10.2
short 300 IN AAAA fd00:N:10::2
short 300 IN A 10.N.10.3
short 300 IN AAAA fd00:N:10::3
";

/// Endpoint A (id 1): egress to api and short on TCP 8080 and UDP 8053, with one of short's
/// addresses denied; ingress from B on TCP 8080 and, when `icmps`, echo requests. Endpoint B
/// (id 2): DNS, and every port of A.
fn config(t: &Topology, icmps: bool) -> String {
    let n = t.n;
    let icmp_rule = if icmps {
        "  - fromEndpoints: [{matchLabels: {app: b}}]\n    icmps:\n    - fields:\n      - {type: EchoRequest}\n      - {type: 128, family: IPv6}\n"
    } else {
        ""
    };
    format!(
        "apiVersion: fqdnd.io/v1
kind: Node
spec:
  pinDir: {pin}
  upstreamTimeout: 2s
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
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {{name: b}}
spec:
  id: 2
  interface: {if_b}
  addresses: [10.{n}.2.2, \"fd00:{n}:2::2\"]
  labels: {{app: b}}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {{name: a}}
spec:
  endpointSelector: {{matchLabels: {{app: a}}}}
  egress:
  - toCIDR: [10.{n}.9.53/32, \"fd00:{n}:9::53/128\"]
    toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns: [{{matchName: api.example.test}}, {{matchName: short.example.test}}]
  - toFQDNs: [{{matchName: api.example.test}}, {{matchName: short.example.test}}]
    toPorts:
    - ports: [{{port: \"8080\", protocol: TCP}}, {{port: \"8053\", protocol: UDP}}]
  egressDeny:
  - toCIDR: [10.{n}.10.3/32, \"fd00:{n}:10::3/128\"]
  ingress:
  - fromEndpoints: [{{matchLabels: {{app: b}}}}]
    toPorts:
    - ports: [{{port: \"8080\", protocol: TCP}}]
{icmp_rule}---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {{name: b}}
spec:
  endpointSelector: {{matchLabels: {{app: b}}}}
  egress:
  - toCIDR: [10.{n}.9.53/32, \"fd00:{n}:9::53/128\"]
    toPorts:
    - ports: [{{port: \"53\", protocol: ANY}}]
      rules:
        dns: [{{matchPattern: \"*\"}}]
  - toEndpoints: [{{matchLabels: {{app: a}}}}]
",
        pin = t.pin_dir.display(),
        if_a = t.if_a,
        if_b = t.if_b,
    )
}

fn start(test: &str, icmps: bool) -> Option<Topology> {
    if !privileged(test) {
        return None;
    }
    let mut t = Topology::new(test);
    let zone = ZONE
        .replace(".N.", &format!(".{}.", t.n))
        .replace(":N:", &format!(":{}:", t.n));
    t.start_dns(&zone);
    let path = t.write_node_config(&config(&t, icmps));
    t.start_node(&path);
    // TCP echo servers inside endpoint A on 8080 and 9090 (both families).
    for port in [8080u16, 9090] {
        in_netns(&t.ep_a, move || {
            let listener = TcpListener::bind(("::", port)).unwrap();
            std::thread::spawn(move || tcp_echo(&listener));
        });
    }
    Some(t)
}

fn a_addrs(t: &Topology) -> [IpAddr; 2] {
    [t.v4(1, 2), t.v6(1, 2)]
}

/// Endpoint A resolves `name` (A and AAAA) through its resolver: the proxy's answers reach it
/// although its ingress is in default deny.
fn resolve(t: &Topology, name: &str) {
    for (resolver, qtype) in [
        (sa(t.v4(9, 53), 53), RecordType::A),
        (sa(t.v6(9, 53), 53), RecordType::AAAA),
    ] {
        for over in [dns::Over::Udp, dns::Over::Tcp] {
            let reply = dns::ask(t, over, &t.ep_a, resolver, name, qtype);
            assert_eq!(
                reply.rcode,
                ResponseCode::NoError,
                "{name} {qtype} {over:?}"
            );
            assert!(
                !reply.addrs.is_empty(),
                "{name} {qtype} {over:?}: no address"
            );
        }
    }
}

/// Another endpoint reaches A on the allowed port and not on another; an external host
/// (the world) reaches neither; the drop log says which source identity was refused.
#[test]
fn ingress_from_another_endpoint_on_one_port() {
    let Some(t) = start("ingress-ports", false) else {
        return;
    };
    for (a, b) in a_addrs(&t).into_iter().zip([t.v4(2, 2), t.v6(2, 2)]) {
        assert!(
            tcp_reaches(&t.ep_b, sa(a, 8080), REACHES),
            "B -> {a}:8080 is allowed\n{}",
            t.logs()
        );
        assert!(!tcp_reaches(&t.ep_b, sa(a, 9090), DROPPED), "B -> {a}:9090");
        let src = b.to_string();
        wait_drop(&t, "policy-denied", &[("src", &src), ("dst", ":9090")]);
        assert!(
            !tcp_reaches(&t.ext, sa(a, 8080), DROPPED),
            "world -> {a}:8080"
        );
    }
    // B is not under ingress policy: A may not reach it (A's egress has no rule for B) but the
    // external host's traffic to B is not A's business — B has no ingress rule, so it passes.
    let b = t.v4(2, 2);
    in_netns(&t.ep_b, move || {
        let listener = TcpListener::bind(("::", 8081)).unwrap();
        std::thread::spawn(move || tcp_echo(&listener));
    });
    assert!(tcp_reaches(&t.ext, sa(b, 8081), REACHES), "{}", t.logs());
}

/// Echo requests from B reach A only while an `icmps` rule allows them; the external host's
/// never do. Reloading the policy without the rule drops B's too.
#[test]
fn icmp_echo_follows_icmps() {
    let Some(t) = start("ingress-icmp", true) else {
        return;
    };
    for a in a_addrs(&t) {
        assert!(ping(&t.ep_b, a, REACHES), "B pings {a}\n{}", t.logs());
        assert!(!ping(&t.ext, a, DROPPED), "the world may not ping {a}");
    }
    t.write_node_config(&config(&t, false));
    let out = t.cli(&[
        "policy",
        "reload",
        "--admin-socket",
        t.admin().to_str().unwrap(),
    ]);
    assert!(out.contains("reloaded") || out.contains("ok"), "{out}");
    for a in a_addrs(&t) {
        assert!(
            !ping(&t.ep_b, a, DROPPED),
            "B's ping to {a} after the reload"
        );
    }
    wait_drop(&t, "policy-denied", &[("proto", "icmp")]);
}

/// A's own flows get their replies under ingress default deny (DNS answers through the
/// proxy, TCP and UDP to the learned names), and a deny of one learned address wins over
/// `toFQDNs`: of short's two addresses only the one not denied is reached.
#[test]
fn replies_pass_and_a_deny_wins_over_to_fqdns() {
    let Some(t) = start("ingress-replies", false) else {
        return;
    };
    resolve(&t, "api.example.test.");
    resolve(&t, "short.example.test.");
    for (ok, denied) in [(t.v4(10, 2), t.v4(10, 3)), (t.v6(10, 2), t.v6(10, 3))] {
        assert!(
            tcp_reaches(&t.ep_a, sa(ok, 8080), REACHES),
            "A -> {ok}:8080 (a reply under ingress default deny)\n{}",
            t.logs()
        );
        assert!(
            udp_reaches(&t.ep_a, sa(ok, 8053), REACHES),
            "A -> {ok}:8053"
        );
        assert!(
            !tcp_reaches(&t.ep_a, sa(denied, 8080), DROPPED),
            "A -> {denied}:8080 is denied"
        );
        assert!(!udp_reaches(&t.ep_a, sa(denied, 8053), DROPPED));
        wait_drop(&t, "policy-denied", &[("dst", &format!("{denied}"))]);
    }
    for api in [t.v4(10, 1), t.v6(10, 1)] {
        assert!(
            tcp_reaches(&t.ep_a, sa(api, 8080), REACHES),
            "A -> {api}:8080"
        );
    }
}

/// Endpoint A's policy by entities: ingress from the host on 8080, from the cluster (its
/// endpoints and the host) on 8081 but B denied there, from the world on 8082; egress to the
/// host on any port and to the world on TCP 8080. B has no policy.
fn entities_config(t: &Topology) -> String {
    format!(
        "apiVersion: fqdnd.io/v1
kind: Node
spec:
  pinDir: {pin}
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
apiVersion: fqdnd.io/v1
kind: Endpoint
metadata: {{name: b}}
spec:
  id: 2
  interface: {if_b}
  addresses: [10.{n}.2.2, \"fd00:{n}:2::2\"]
  labels: {{app: b}}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {{name: a-entities}}
spec:
  endpointSelector: {{matchLabels: {{app: a}}}}
  ingress:
  - fromEntities: [host]
    toPorts: [{{ports: [{{port: \"8080\", protocol: TCP}}]}}]
  - fromEntities: [cluster]
    toPorts: [{{ports: [{{port: \"8081\", protocol: TCP}}]}}]
  - fromEntities: [world]
    toPorts: [{{ports: [{{port: \"8082\", protocol: TCP}}]}}]
  ingressDeny:
  - fromEndpoints: [{{matchLabels: {{app: b}}}}]
    toPorts: [{{ports: [{{port: \"8081\", protocol: TCP}}]}}]
  egress:
  - toEntities: [host]
  - toEntities: [world]
    toPorts: [{{ports: [{{port: \"8080\", protocol: TCP}}]}}]
",
        n = t.n,
        pin = t.pin_dir.display(),
        if_a = t.if_a,
        if_b = t.if_b,
    )
}

/// `fqdnd policy explain ARGS` against the running node: its exit status and output.
fn explain(t: &Topology, args: &[&str]) -> (bool, String) {
    let admin = t.admin();
    let mut all = vec![
        "policy",
        "explain",
        "--admin-socket",
        admin.to_str().unwrap(),
    ];
    all.extend(args);
    let out = t.cli_in(&t.host, &all);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "fqdnd {all:?}: {text}"
    );
    (out.status.success(), text)
}

/// The entities on a node: `host` is the node's own addresses (the agent's namespace), so the
/// host reaches A where `fromEntities: [host]` allows it and the world (the external host
/// behind the node) does not; `cluster` admits the node's endpoints and the host, but B is
/// denied on that port (a deny wins over the allow); `world` admits the external host and
/// neither the host nor B. Egress the same way: A reaches every port of the host (any of its
/// addresses) and only TCP 8080 of the world. `fqdnd policy explain` says the same.
#[test]
fn entities_host_cluster_world_and_a_deny_over_them() {
    if !privileged("ingress-entities") {
        return;
    }
    let mut t = Topology::new("ingress-entities");
    let path = t.write_node_config(&entities_config(&t));
    t.start_node(&path);
    for port in [8080u16, 8081, 8082] {
        in_netns(&t.ep_a, move || {
            let listener = TcpListener::bind(("::", port)).unwrap();
            std::thread::spawn(move || tcp_echo(&listener));
        });
    }
    in_netns(&t.host, || {
        let listener = TcpListener::bind(("::", 9000)).unwrap();
        std::thread::spawn(move || tcp_echo(&listener));
    });
    let families = [
        (
            t.v4(1, 2),
            t.v4(2, 2),
            t.v4(9, 2),
            t.v4(1, 1),
            t.v4(9, 1),
            t.v4(10, 1),
        ),
        (
            t.v6(1, 2),
            t.v6(2, 2),
            t.v6(9, 2),
            t.v6(1, 1),
            t.v6(9, 1),
            t.v6(10, 1),
        ),
    ];
    for (a, b, ext, host, host_far, world) in families {
        // ingress
        for (ns, who, port, allowed) in [
            (&t.host, "host", 8080, true),
            (&t.ep_b, "B", 8080, false),
            (&t.ext, "world", 8080, false),
            (&t.host, "host", 8081, true),
            (&t.ep_b, "B (denied)", 8081, false),
            (&t.ext, "world", 8081, false),
            (&t.ext, "world", 8082, true),
            (&t.host, "host", 8082, false),
            (&t.ep_b, "B", 8082, false),
        ] {
            let timeout = if allowed { REACHES } else { DROPPED };
            assert_eq!(
                tcp_reaches(ns, sa(a, port), timeout),
                allowed,
                "{who} -> {a}:{port}\n{}",
                t.logs()
            );
        }
        wait_drop(
            &t,
            "policy-denied",
            &[("src", &b.to_string()), ("dst", ":8081")],
        );
        // egress
        for (to, port, allowed) in [
            (host, 9000, true),
            (host_far, 9000, true),
            (world, 8080, true),
            (world, 9090, false),
        ] {
            let timeout = if allowed { REACHES } else { DROPPED };
            assert_eq!(
                tcp_reaches(&t.ep_a, sa(to, port), timeout),
                allowed,
                "A -> {to}:{port}\n{}",
                t.logs()
            );
        }
        // why, from the running agent
        let bracket = |ip: IpAddr, port: u16| match ip {
            IpAddr::V4(_) => format!("{ip}:{port}/tcp"),
            IpAddr::V6(_) => format!("[{ip}]:{port}/tcp"),
        };
        let (ok, text) = explain(&t, &["--endpoint", "1", "--from", &bracket(host, 8080)]);
        assert!(ok && text.contains("ALLOWED"), "{text}");
        assert!(
            text.contains("peer identity 1 (reserved:host)") && text.contains("entity host"),
            "{text}"
        );
        let (ok, text) = explain(&t, &["--endpoint", "1", "--from", &bracket(b, 8081)]);
        assert!(!ok && text.contains("DENIED"), "{text}");
        assert!(
            text.contains("ingressDeny[0]") && text.contains("shadows 1 matching allow"),
            "{text}"
        );
        let (ok, text) = explain(&t, &["--endpoint", "1", "--from", &bracket(ext, 8082)]);
        assert!(ok && text.contains("entity world"), "{text}");
        let (ok, text) = explain(&t, &["--endpoint", "1", &bracket(host_far, 9000)]);
        assert!(ok && text.contains("egress endpoint 1"), "{text}");
        let (ok, text) = explain(&t, &["--endpoint", "1", "--to", &bracket(world, 9090)]);
        assert!(!ok && text.contains("default deny"), "{text}");
        assert!(
            !text.contains("WARNING"),
            "the datapath's entries agree: {text}"
        );
    }
    // JSON, as a script reads it.
    let (_, text) = explain(
        &t,
        &[
            "--endpoint",
            "1",
            "--from",
            &t.v4(1, 1).to_string(),
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["identity"], 1, "{v}");
    assert_eq!(v["flow"]["direction"], "ingress", "{v}");
}

/// Gateway mode with `enforceInterfaces`: ingress policy of a client group is enforced on
/// traffic towards it (the group found by the destination's prefix): the external host
/// reaches group A on the port its `fromEntities: [world]` rule allows and not on another;
/// group B, without ingress rules, takes anything.
#[test]
fn a_gateway_enforces_a_client_groups_ingress() {
    if !privileged("ingress-gateway") {
        return;
    }
    let mut t = Topology::new("ingress-gateway");
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
    let config = t.write_node_config(&format!(
        "apiVersion: fqdnd.io/v1
kind: Gateway
spec:
  listen: [\"10.{n}.1.1:53\"]
  upstreams: [\"10.{n}.9.53:53\"]
  enforceInterfaces: [{if_a}, {if_b}]
  pinDir: {pin}
---
{a}---
{b}---
apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {{name: a-in}}
spec:
  endpointSelector: {{matchLabels: {{group: a}}}}
  ingress:
  - fromEntities: [world]
    toPorts: [{{ports: [{{port: \"8080\", protocol: TCP}}]}}]
",
        if_a = t.if_a,
        if_b = t.if_b,
        pin = t.pin_dir.display(),
        a = group("a", 10, 1),
        b = group("b", 11, 2),
    ));
    t.start_daemon("gateway", &config);
    for ns in [t.ep_a.clone(), t.ep_b.clone()] {
        for port in [8080u16, 9090] {
            in_netns(&ns, move || {
                let listener = TcpListener::bind(("::", port)).unwrap();
                std::thread::spawn(move || tcp_echo(&listener));
            });
        }
    }
    for (a, b) in [(t.v4(1, 2), t.v4(2, 2)), (t.v6(1, 2), t.v6(2, 2))] {
        assert!(
            tcp_reaches(&t.ext, sa(a, 8080), REACHES),
            "world -> {a}:8080\n{}",
            t.logs()
        );
        assert!(
            !tcp_reaches(&t.ext, sa(a, 9090), DROPPED),
            "world -> {a}:9090"
        );
        assert!(
            tcp_reaches(&t.ext, sa(b, 9090), REACHES),
            "world -> {b}:9090"
        );
    }
}
